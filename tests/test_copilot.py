"""GitHub Copilot: signed in with GitHub's device code flow, its models reached at the host its
token names with Copilot's headers, its short-lived token renewed from the GitHub token."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from forged._catalogue import catalogue_providers
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall

from .harness import Client, open_client
from .sign_in_servers import JsonServer
from .test_auth import write_auth
from .test_process import BIN, child_env

TOKEN = "tid=1;exp=9999999999;proxy-ep=proxy.individual.githubcopilot.com;sku=pro"


class GitHub(JsonServer):
    """github.com's device flow and api.github.com's Copilot token, as forged uses them; the
    device code is pending at the first poll."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, Any]]:
        if path == "/login/device/code":
            return 200, {"device_code": "dc-1", "user_code": "WXYZ-9876",
                         "verification_uri": "https://github.com/login/device",
                         "interval": 0, "expires_in": 900}
        if path == "/login/oauth/access_token":
            return 200, ({"error": "authorization_pending"} if self.count(path) == 1
                         else {"access_token": "gho_github", "token_type": "bearer"})
        return 200, {"token": TOKEN, "expires_at": int(time.time()) + 1800}


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in {"ANTHROPIC_API_KEY", *catalogue_providers().values()} - {""}:
        monkeypatch.delenv(key, raising=False)


async def test_login_uses_githubs_device_flow_and_saves_a_copilot_token(
        tmp_path: Path) -> None:
    path = write_auth(tmp_path / "agent", {"groq": {"type": "api_key", "key": "gsk-kept"}})
    with GitHub().running() as github, trio.fail_after(30):
        env = {**child_env(tmp_path / "agent"), "FORGED_OAUTH_ORIGINS": json.dumps(
            {"https://github.com": github.origin, "https://api.github.com": github.origin})}
        done = await trio.run_process([str(BIN / "forged"), "login", "github-copilot"],
                                      capture_stdout=True, capture_stderr=True, stdin=b"",
                                      env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert b"open https://github.com/login/device and enter the code WXYZ-9876" in done.stderr
    assert [(method, path) for method, path, _, _ in github.calls] == [
        ("POST", "/login/device/code"), ("POST", "/login/oauth/access_token"),
        ("POST", "/login/oauth/access_token"), ("GET", "/copilot_internal/v2/token")]
    assert github.calls[-1][2]["authorization"] == "Bearer gho_github"
    saved = json.loads(path.read_text())
    assert saved["github-copilot"]["access"] == TOKEN
    assert saved["github-copilot"]["refresh"] == "gho_github"
    assert saved["groq"] == {"type": "api_key", "key": "gsk-kept"}


async def use_copilot(client: Client, monkeypatch: pytest.MonkeyPatch, origins: dict[str, str]
                      ) -> None:
    monkeypatch.setenv("FORGED_OAUTH_ORIGINS", json.dumps(
        {"https://api.individual.githubcopilot.com": client.server.base_url, **origins}))
    chosen = await client.request({"type": "set_model", "provider": "github-copilot",
                                   "modelId": "claude-sonnet-4.6"})
    assert chosen["success"], chosen


@pytest.mark.parametrize("expired", [False, True])
async def test_a_copilot_model_goes_to_the_tokens_host_with_copilots_headers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, expired: bool) -> None:
    now_ms = int(time.time() * 1000)
    write_auth(tmp_path / "agent", {"github-copilot": {
        "type": "oauth", "access": "tid=0;proxy-ep=proxy.individual.githubcopilot.com;old"
        if expired else TOKEN, "refresh": "gho_github",
        "expires": now_ms - 1000 if expired else now_ms + 3_600_000}})
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={"command": "echo hi"})]),
               Reply(content=[ScriptText(text="done")])]
    with GitHub().running() as github:
        async with open_client(tmp_path, replies) as client:
            await use_copilot(client, monkeypatch, {"https://api.github.com": github.origin})
            await client.prompt_and_settle("hello")
    first, second = client.server.requests
    assert first.path == "/v1/messages"
    assert first.headers["authorization"] == f"Bearer {TOKEN}"
    assert "x-api-key" not in first.headers
    assert (first.headers["x-initiator"], second.headers["x-initiator"]) == ("user", "agent")
    assert first.headers["openai-intent"] == "conversation-edits"
    assert first.headers["copilot-integration-id"] == "vscode-chat"
    assert [path for _, path, _, _ in github.calls] == (
        ["/copilot_internal/v2/token"] if expired else [])
    assert client.events("message_end")[-1]["message"]["content"][0]["text"] == "done"
