"""Azure OpenAI: where its address and deployments come from, as the ancestor reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forged._catalogue import catalogue_providers
from forged._errors import ProviderError
from forged._providers.azure import base_url, deployment
from forged._providers.scripted import Reply, ScriptText

from .harness import open_client


@pytest.fixture(autouse=True)
def no_azure(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AZURE_OPENAI_BASE_URL", "AZURE_OPENAI_RESOURCE_NAME",
                "AZURE_OPENAI_DEPLOYMENT_NAME_MAP", "AZURE_OPENAI_API_VERSION",
                *catalogue_providers().values()):
        monkeypatch.delenv(key, raising=False)


def test_the_address_comes_from_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProviderError, match="AZURE_OPENAI_BASE_URL or AZURE_OPENAI_RESOURCE"):
        base_url("")
    assert base_url("https://mine.openai.azure.com") == "https://mine.openai.azure.com/openai/v1"
    assert base_url("https://gw.example.com/azure/") == "https://gw.example.com/azure"
    monkeypatch.setenv("AZURE_OPENAI_RESOURCE_NAME", "team")
    assert base_url("https://ignored.example.com") == "https://team.openai.azure.com/openai/v1"
    monkeypatch.setenv("AZURE_OPENAI_BASE_URL", "https://eu.cognitiveservices.azure.com/openai")
    assert base_url("") == "https://eu.cognitiveservices.azure.com/openai/v1"


def test_a_deployment_map_names_a_models_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_OPENAI_DEPLOYMENT_NAME_MAP", "gpt-5.4=prod-54, o3 = reason")
    assert (deployment("gpt-5.4"), deployment("o3"), deployment("gpt-5")) == (
        "prod-54", "reason", "gpt-5")


async def test_a_catalogue_azure_model_is_reached_at_the_resource(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-test")
    monkeypatch.setenv("AZURE_OPENAI_DEPLOYMENT_NAME_MAP", "gpt-5.4=prod-54")
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
        monkeypatch.setenv("AZURE_OPENAI_BASE_URL", f"{client.server.base_url}/openai/v1")
        chosen = await client.request({"type": "set_model", "provider": "azure",
                                       "modelId": "gpt-5.4"})
        assert chosen["success"], chosen
        await client.prompt_and_settle("hello")
    (request,) = client.server.requests
    assert request.path == "/openai/v1/responses"
    assert request.headers["api-key"] == "azure-test"
    assert request.body["model"] == "prod-54"
    assert json.dumps(client.events("message_end")[-1]["message"]["content"][0]["text"]) == (
        '"hi"')


async def test_thinking_off_asks_a_reasoning_model_for_effort_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-test")
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
        monkeypatch.setenv("AZURE_OPENAI_BASE_URL", f"{client.server.base_url}/openai/v1")
        await client.request({"type": "set_model", "provider": "azure", "modelId": "o3"})
        await client.request({"type": "set_thinking_level", "level": "off"})
        await client.prompt_and_settle("hello")
    assert client.server.requests[0].body["reasoning"] == {"effort": "none"}
