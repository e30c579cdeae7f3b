"""ChatGPT's Codex backend: reached with a ChatGPT sign-in saved in auth.json, its account in
a header, the system prompt as a developer item; an expired sign-in refreshed first."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio.testing

from forged._catalogue import catalogue_providers
from forged._providers.scripted import (
    Reply,
    ScriptText,
    ScriptThinking,
    ScriptToolCall,
    ScriptUsage,
)

from .harness import Client, open_client
from .test_auth import TokenEndpoint, jwt, write_auth

PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
         "AAAABJRU5ErkJggg==")
TOKEN = jwt({"https://api.openai.com/auth": {"chatgpt_account_id": "account-7"}})


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in {"OPENAI_API_KEY", *catalogue_providers().values()} - {""}:
        monkeypatch.delenv(key, raising=False)


def signed_in(tmp_path: Path, expires_ms: int) -> Path:
    return write_auth(tmp_path / "agent", {"openai-codex": {
        "type": "oauth", "access": TOKEN, "refresh": "refresh-0", "expires": expires_ms,
        "accountId": "account-7"}})


async def use_codex(client: Client, level: str = "medium") -> None:
    await client.use_redirected("openai-codex", "gpt-5.6-luna", "/backend-api")
    await client.request({"type": "set_thinking_level", "level": level})


def test_without_a_sign_in_codex_says_how_to_sign_in(tmp_path: Path) -> None:
    from forged._models import ModelRegistry

    registry = ModelRegistry()
    assert not registry.has_auth("openai-codex")
    assert registry.key_problem("openai-codex") == (
        "No sign-in for openai-codex: sign in with `forged login openai-codex` (or pi's /login)")


async def test_a_chatgpt_sign_in_reaches_codex(tmp_path: Path) -> None:
    signed_in(tmp_path, int(time.time() * 1000) + 3_600_000)
    replies = [Reply(content=[ScriptThinking(thinking="Look first.", signature="enc-1"),
                              ScriptToolCall(name="bash", arguments={"command": "echo hi"})]),
               Reply(content=[ScriptText(text="done")])]
    async with open_client(tmp_path, replies) as client:
        await use_codex(client)
        await client.prompt_and_settle("hello")
        session = (await client.request({"type": "get_state"}))["data"]["sessionId"]
    first, second = client.server.requests  # each body checked against the OpenAI SDK's type
    assert first.path == "/backend-api/codex/responses"
    headers = first.headers
    assert (headers["authorization"], headers["chatgpt-account-id"]) == (
        f"Bearer {TOKEN}", "account-7")
    assert headers["openai-beta"] == "responses=experimental"
    assert headers["session-id"] == session and headers["originator"] == "pi"
    body: dict[str, Any] = first.body
    assert body["input"][0]["role"] == "developer" and "instructions" not in body
    assert body["input"][0]["content"].startswith("You are")
    assert (body["reasoning"], body["text"], body["store"]) == (
        {"effort": "medium", "summary": "auto"}, {"verbosity": "low"}, False)
    assert body["prompt_cache_key"] == session and body["parallel_tool_calls"] is True
    assert any(item.get("type") == "reasoning" and item["encrypted_content"] == "enc-1"
               for item in second.body["input"])
    assert client.events("message_end")[-1]["message"]["content"][0]["text"] == "done"


async def test_thinking_off_is_effort_none(tmp_path: Path) -> None:
    signed_in(tmp_path, int(time.time() * 1000) + 3_600_000)
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="ok")])]) as client:
        await use_codex(client, level="off")
        await client.prompt_and_settle("hello")
    assert client.server.requests[0].body["reasoning"] == {"effort": "none"}


async def test_an_expired_sign_in_is_refreshed_and_a_usage_limit_said_plainly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = signed_in(tmp_path, int(time.time() * 1000) - 1000)
    limit = Reply(status=400, error_type="usage_limit_reached", error_message="limit")
    with TokenEndpoint().running() as tokens:
        monkeypatch.setenv("FORGED_OAUTH_ORIGINS", json.dumps(
            {"https://auth.openai.com": tokens.origin}))
        async with open_client(tmp_path, [limit]) as client:
            await use_codex(client)
            await client.prompt_and_settle("hello")
    ((where, kind, body),) = tokens.posts
    assert (where, kind) == ("/oauth/token", "application/x-www-form-urlencoded")
    assert body.decode() == ("grant_type=refresh_token&refresh_token=refresh-0"
                             "&client_id=app_EMoamEEZ73f0CkXaXp7hrann")
    saved = json.loads(path.read_text())["openai-codex"]
    assert saved["refresh"] == "refresh-1" and saved["accountId"] == "account-1"
    assert client.server.requests[0].headers["chatgpt-account-id"] == "account-1"
    message = client.events("message_end")[-1]["message"]
    assert message["errorMessage"] == "400 You have hit your ChatGPT usage limit."


async def test_an_image_goes_as_input_and_an_error_status_is_retried_with_usage_after(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    signed_in(tmp_path, int(time.time() * 1000) + 3_600_000)
    busy = Reply(status=503, error_type="server_error", error_message="Try again later")
    replies = [busy, Reply(content=[ScriptText(text="a red pixel")],
                           usage=ScriptUsage(input=200, output=10, cache_read=50))]
    async with open_client(tmp_path, replies) as client:
        await use_codex(client)
        await client.send({"type": "prompt", "message": "what is it?", "images": [
            {"type": "image", "data": PIXEL, "mimeType": "image/png"}]})
        started = await client.wait_for(lambda e: e.get("type") == "auto_retry_start")
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(started["delayMs"] / 1000)
        await client.settled()
    assert started["errorMessage"] == "503 Try again later"
    content = client.server.requests[1].body["input"][1]["content"]
    assert {"type": "input_image", "detail": "auto",
            "image_url": f"data:image/png;base64,{PIXEL}"} in content
    usage = client.events("message_end")[-1]["message"]["usage"]
    assert (usage["input"], usage["output"], usage["cacheRead"]) == (200, 10, 50)
    assert usage["cost"]["total"] == pytest.approx((200 * 0.2 + 10 * 1.2 + 50 * 0.02) / 1e6)
