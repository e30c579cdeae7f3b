"""Mistral's differences from OpenAI's chat completions: nine-character call ids, thinking
asked by the model's map or by prompt mode, the session as cache key and affinity."""

from __future__ import annotations

from pathlib import Path

import pytest

from forged._catalogue import catalogue_providers
from forged._providers.mistral import CallIds, derive_id
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall

from .harness import open_client


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in catalogue_providers().values():
        monkeypatch.delenv(key, raising=False)


def test_call_ids_become_nine_letters_or_digits_and_stay_apart() -> None:
    ids = CallIds()
    assert ids("abc123XYZ") == "abc123XYZ"  # already one
    made = ids("toolu_01A09q90qw90lq917835lq9")
    assert len(made) == 9 and made.isalnum() and ids("toolu_01A09q90qw90lq917835lq9") == made
    taken = derive_id("other")
    clash = CallIds()
    clash._owners[taken] = "someone"  # the id "other" would get is another call's
    assert clash("other") != taken and len(clash("other")) == 9


@pytest.mark.parametrize(("level", "asked"), [
    ("off", {"reasoning_effort": "none"}), ("high", {"reasoning_effort": "high"})])
async def test_a_catalogue_mistral_model_thinks_as_its_map_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str,
        asked: dict[str, str]) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "mistral-test")
    replies = [Reply(content=[ScriptToolCall(name="bash", id="toolu_long_anthropic_id",
                                             arguments={"command": "echo hi"})]),
               Reply(content=[ScriptText(text="done")])]
    async with open_client(tmp_path, replies) as client:
        chosen = await client.use_redirected("mistral", "magistral-medium-latest", "/mistral")
        assert chosen["data"]["thinkingLevels"] == ["off", "high"]
        await client.request({"type": "set_thinking_level", "level": level})
        await client.prompt_and_settle("hello")
        state = (await client.request({"type": "get_state"}))["data"]
    first, second = client.server.requests
    assert first.path == "/mistral/v1/chat/completions"
    assert first.headers["authorization"] == "Bearer mistral-test"
    assert first.headers["x-affinity"] == state["sessionId"]
    assert {key: first.body.get(key) for key in asked} == asked
    assert "prompt_mode" not in first.body
    assert first.body["prompt_cache_key"] == state["sessionId"]
    call, result = second.body["messages"][2]["tool_calls"][0], second.body["messages"][3]
    assert call["id"] == result["tool_call_id"] == derive_id("toolu_long_anthropic_id")
    assert client.events("tool_execution_end")[0]["result"]["content"][0]["text"] == "hi\n"
