"""Vertex AI: an API key (express mode), or application default credentials whose token
google-auth gets from a local token endpoint, with the project and location in the path."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from forged._catalogue import catalogue_providers
from forged._models import ModelRegistry
from forged._providers.scripted import Reply, ScriptText

from .harness import open_client
from .test_auth import TokenEndpoint

VERTEX_VARIABLES = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT",
                    "GOOGLE_CLOUD_LOCATION")


@pytest.fixture(autouse=True)
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in (*VERTEX_VARIABLES, *catalogue_providers().values()):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no gcloud credentials of the user's


def service_account(path: Path, token_uri: str) -> Path:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "from-the-key", "private_key_id": "1",
        "private_key": pem, "client_email": "forged@from-the-key.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": token_uri}))
    return path


def test_without_a_key_vertex_needs_credentials_a_project_and_a_location(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ModelRegistry()
    assert not registry.has_auth("google-vertex")
    assert "GOOGLE_CLOUD_LOCATION" in (registry.key_problem("google-vertex") or "")
    credentials = service_account(tmp_path / "key.json", "http://127.0.0.1:9/token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    assert not registry.has_auth("google-vertex")  # no location yet
    monkeypatch.setenv("GOOGLE_CLOUD_LOCATION", "us-central1")
    assert registry.has_auth("google-vertex")
    assert registry.api_key("google-vertex") == "<authenticated>"
    monkeypatch.setenv("GOOGLE_CLOUD_API_KEY", "vertex-key")
    assert registry.api_key("google-vertex") == "vertex-key"


@pytest.mark.parametrize("location", ["us-central1", "global"])
async def test_application_default_credentials_sign_the_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str) -> None:
    with TokenEndpoint().running() as tokens:
        key = service_account(tmp_path / "key.json", f"{tokens.origin}/token")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "my-project")
        monkeypatch.setenv("GOOGLE_CLOUD_LOCATION", location)
        replies = [Reply(content=[ScriptText(text="one")]),
                   Reply(content=[ScriptText(text="two")])]
        async with open_client(tmp_path, replies) as client:
            await client.use_redirected("google-vertex", "gemini-2.5-flash")
            await client.prompt_and_settle("hello")
            await client.prompt_and_settle("again")
    first, second = client.server.requests
    assert first.path == (f"/v1/projects/my-project/locations/{location}/publishers/google/"
                          "models/gemini-2.5-flash:streamGenerateContent")
    assert first.headers["authorization"] == second.headers["authorization"] == (
        "Bearer sk-ant-oat-new-1")  # one token for both: google-auth keeps it until it expires
    assert "x-goog-api-key" not in first.headers
    ((where, kind, body),) = tokens.posts
    form = parse_qs(body.decode())
    assert where == "/token" and kind == "application/x-www-form-urlencoded"
    assert form["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    assert client.events("message_end")[-1]["message"]["content"][0]["text"] == "two"
