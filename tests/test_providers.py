"""Provider details: redacted thinking, cache usage, the scripted server's HTTP, hangs, errors."""

from __future__ import annotations

import datetime
import json
import re
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

import forged
import forged.client
from forged import _wire as w
from forged._catalogue import ProviderConfig
from forged._providers.anthropic import CLAUDE_CODE_IDENTITY
from forged._providers.base import AssistantBuilder
from forged._providers.http import status_error
from forged._providers.openai import handle_responses_event
from forged._providers.scripted import (
    Reply,
    ScriptedServer,
    ScriptRedactedThinking,
    ScriptText,
    ScriptToolCall,
    ScriptUsage,
)
from forged._resources import build_system_prompt, find_context_files
from forged._tools import builtin_tools

from .harness import Client, open_client


async def test_redacted_thinking_is_kept_and_sent_back(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptRedactedThinking(data="opaque-bytes"),
                              ScriptText(text="hello")]),
               Reply(content=[ScriptText(text="again")])]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("one")
        await client.prompt_and_settle("two")
    message = client.events("message_end")[1]["message"]
    assert message["content"][0] == {"type": "thinking", "thinking": "[Reasoning redacted]",
                                     "thinkingSignature": "opaque-bytes", "redacted": True}
    sent = client.server.requests[1].body["messages"][1]["content"][0]
    assert sent == {"type": "redacted_thinking", "data": "opaque-bytes"}


async def test_cache_usage_and_cost_are_reported(tmp_path: Path) -> None:
    usage = ScriptUsage(input=1000, output=200, cache_read=5000, cache_write=300)
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi", chunks=2)],
                                            usage=usage)]) as client:
        await client.prompt_and_settle("hi")
    updates = client.events("message_update")
    assert updates[0]["usage"]["input"] == 1000  # reported from message_start on
    final = client.events("message_end")[1]["message"]["usage"]
    assert final == {"input": 1000, "output": 200, "cacheRead": 5000, "cacheWrite": 300,
                     "totalTokens": 6500, "cost": {
                         "input": pytest.approx(0.003), "output": pytest.approx(0.003),
                         "cacheRead": pytest.approx(0.0015),
                         "cacheWrite": pytest.approx(0.001125),
                         "total": pytest.approx(0.008625)}}


async def test_the_scripted_server_speaks_http_with_retry_after() -> None:
    server = ScriptedServer([Reply(status=429, error_type="rate_limit_error",
                                   error_message="slow down", retry_after=7)])
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{server.base_url}/v1/messages",
                                       json={"model": "m", "messages": []})
            exhausted = await http.post(f"{server.base_url}/v1/chat/completions", json={})
            unknown = await http.post(f"{server.base_url}/v2/other", json={})
        nursery.cancel_scope.cancel()
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json() == {"type": "error", "error": {"type": "rate_limit_error",
                                                          "message": "slow down"}}
    assert exhausted.status_code == 400 and "script exhausted" in exhausted.text
    assert unknown.status_code == 404
    assert [r.path for r in server.requests] == ["/v1/messages", "/v1/chat/completions",
                                                 "/v2/other"]
    assert server.requests[0].body == {"model": "m", "messages": []}


async def test_status_errors_carry_status_and_retry_after(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text('{"retry": {"enabled": false}}')
    async with open_client(tmp_path, [Reply(status=529, error_type="overloaded_error",
                                            error_message="Overloaded", retry_after=2)]
                           ) as client:
        await client.prompt_and_settle("hi")
    assert len(client.server.requests) == 1
    message = client.events("message_end")[1]["message"]
    assert message["errorMessage"] == (
        '529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}')


def openai_error(body: dict[str, Any]) -> str | None:
    return str(body["error"]["message"])


@pytest.mark.parametrize(("response", "error_text", "message", "retry_after_s"), [
    (httpx.Response(429, headers={"retry-after": "3"}, text="limited"), None, "429 limited", 3.0),
    (httpx.Response(503, headers={"retry-after-ms": "1500", "retry-after": "9"}), None,
     "503 status code (no body)", 1.5),
    (httpx.Response(400, json={"error": {"message": "Bad tool schema", "type": "invalid"}}),
     openai_error, "400 Bad tool schema", None),
    (httpx.Response(502, text="<html>bad gateway</html>"), openai_error,
     "502 <html>bad gateway</html>", None),
    (httpx.Response(429, headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}), None,
     "429 status code (no body)", 0.0),
])
async def test_an_error_status_becomes_a_status_error(
        response: httpx.Response, error_text: Any, message: str, retry_after_s: float | None
        ) -> None:
    error = await status_error(response, error_text)
    assert str(error) == message
    assert error.status == response.status_code and error.retry_after_s == retry_after_s


async def test_openai_errors_give_the_services_message(tmp_path: Path) -> None:
    replies = [Reply(status=400, error_type="invalid_request_error",
                     error_message="Invalid 'tools[0].name'")]
    async with open_client(tmp_path, replies, api="openai-completions") as client:
        await client.prompt_and_settle("hi")
    message = client.events("message_end")[1]["message"]
    assert message["stopReason"] == "error"
    assert message["errorMessage"] == "400 Invalid 'tools[0].name'"


async def test_a_hanging_provider_can_be_aborted(tmp_path: Path) -> None:
    async with open_client(tmp_path, [Reply(hang=True)]) as client:
        await client.request({"type": "prompt", "message": "hi"})
        await client.server.wait_for_requests(1)
        await trio.testing.wait_all_tasks_blocked()  # answered, and silent
        with trio.fail_after(2):
            await client.request({"type": "abort"})
            await client.settled()
    message = client.events("message_end")[1]["message"]
    assert message["stopReason"] == "aborted" and message["content"] == []


def test_responses_reasoning_item_becomes_the_signature() -> None:
    model = w.Model(id="m", name="m", api="openai-responses", provider="p", base_url="u",
                    reasoning=True, input=["text"], context_window=1, max_tokens=1,
                    cost=w.ModelCost(), thinking_levels=["off"])
    events: list[w.Event] = []
    out = AssistantBuilder(model, events.append)
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc"}
    handle_responses_event({"type": "response.output_item.added", "item": item}, out)
    handle_responses_event({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1",
                            "delta": "think"}, out)
    handle_responses_event({"type": "response.output_item.done", "item": item}, out)
    block = out.message.content[0]
    assert isinstance(block, w.ThinkingContent) and block.thinking == "think"
    assert block.thinking_signature is not None and '"encrypted_content":"enc"' in (
        block.thinking_signature)


def test_context_files_run_from_the_agent_dir_then_root_down(tmp_path: Path) -> None:
    agent_dir, project = tmp_path / "agent", tmp_path / "a" / "b"
    project.mkdir(parents=True)
    agent_dir.mkdir()
    (agent_dir / "AGENTS.md").write_text("global")
    (tmp_path / "a" / "CLAUDE.md").write_text("from a")
    (project / "AGENTS.md").write_text("from b")
    (project / "CLAUDE.md").write_text("ignored: AGENTS.md wins")
    found = find_context_files(project, agent_dir)
    assert [f.content for f in found] == ["global", "from a", "from b"]
    prompt = build_system_prompt(list(builtin_tools().values()), project, found,
                                 today=datetime.date(2026, 12, 2))
    assert "- read: Read file contents" in prompt and "- grep:" in prompt
    assert prompt.index("global") < prompt.index("from a") < prompt.index("from b")
    assert prompt.endswith(f"Current date: 2026-12-02\nCurrent working directory: {project}")
    assert "Available tools:\n(none)" in build_system_prompt([], project, [])


async def test_last_assistant_text_is_null_before_any_reply(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        response = await client.request({"type": "get_last_assistant_text"})
    assert response["data"] == {"text": None}


def test_startup_imports_only_what_it_needs() -> None:
    """No provider SDK ever, the MCP SDK only for a session with an MCP server; markdown-it
    only to export, the scripted server only for its provider, httpx (and h11 under it) only
    in the providers' worker thread; google-auth only to reach Vertex AI."""
    code = ("import sys, forged._cli, forged._fronts.stdio, forged._fronts.print\n"
            "import forged._daemon, forged._session, forged._fronts.acp, forged._mcp\n"
            "print(' '.join(sorted(m for m in ('anthropic', 'openai', 'markdown_it', 'h11',\n"
            "    'httpx', 'forged._providers.scripted', 'forged._providers.http', 'mcp',\n"
            "    'anyio', 'httpx2', 'google', 'google.auth', 'mistralai', 'botocore',\n"
            "    'cryptography', 'forged._providers.oauth')\n"
            "    if m in sys.modules)))\n")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True).stdout.split()
    assert loaded == []
    sources = Path(forged.__file__).parent.rglob("*.py")
    assert not [path for path in sources if re.search(
        r"^\s*(import|from) (anthropic|openai|google\.genai|mistralai)\b", path.read_text(), re.M)]


DEFERRED = ("forged._wire.", "forged._run", "forged._loop", "forged._compaction",
            "forged._tools.bash", "forged._tools.files", "forged._tools.search",
            "forged._fronts.print", "forged._providers.http")


@pytest.mark.parametrize("provider", [False, True])
def test_the_first_get_state_is_answered_before_what_a_prompt_needs_loads(
        provider: bool) -> None:
    """The warm-up (the providers' HTTP stack, the other commands', messages', events' and
    responses' classes, the tools, the run driver, converter hooks) waits while a command is
    waiting: a real process (with a provider to load, or none), its first line answered,
    reports which of those it had loaded then."""
    code = ("import os, sys\n"
            "write = os.write\n"
            "def noting(fd, data):\n"
            "    if fd != 2 and not os.environ.get('NOTED'):\n"
            "        os.environ['NOTED'] = ' '.join(sorted(\n"
            f"            m for m in sys.modules if m.startswith({DEFERRED!r})\n"
            f"            and (m in {DEFERRED!r} or m.startswith('forged._wire.'))))\n"
            "        sys.stderr.write('first answer: ' + os.environ['NOTED'] + '\\n')\n"
            "    return write(fd, data)\n"
            "os.write = noting\n"
            "from forged._entry import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    script = Path(forged.__file__).parent / "examples" / "fix-greeting.json"
    argv = ["--provider", "scripted", "--script", str(script)] if provider else []
    done = subprocess.run([sys.executable, "-c", code, *argv],
                          input=b'{"type":"get_state"}\n', capture_output=True, check=True)
    assert json.loads(done.stdout)["command"] == "get_state"
    assert b"first answer: forged._wire.base\n" in done.stderr


def test_the_warm_up_keeps_out_of_a_run_and_of_a_streaming_reply() -> None:
    """The warm-up (loading its provider first) takes no step while a run keeps the event
    loop busy, as one reading a fast stream does, nor while a reply streams in, however idle
    the loop is between its bytes (each step, ~10 ms for a module of classes, would be the
    run's to wait out); it does them all once the process has nothing to do: a real process,
    its run a task that checkpoints without waiting, then a reply's stream held open over
    50 ms of idleness."""
    code = ("import sys, trio\n"
            "from forged import _config, _providers\n"
            "from trio.testing import wait_all_tasks_blocked\n"
            "LATER = ('forged._wire.responses', 'forged._run')\n"
            "def later(): return [m for m in LATER if m in sys.modules]\n"
            "async def main():\n"
            "    async with trio.open_nursery() as nursery:\n"
            "        nursery.start_soon(_config.warm_up, ['anthropic-messages'])\n"
            "        await wait_all_tasks_blocked()  # the provider loads in its thread\n"
            "        while not _providers._loaded:\n"
            "            await trio.lowlevel.checkpoint()\n"
            "        for _ in range(500):\n"
            "            await trio.lowlevel.checkpoint()\n"
            "        print('during the run:', *later())\n"
            "        with _providers.reply_streaming():\n"
            "            await wait_all_tasks_blocked(0.05)\n"
            "            print('while a reply streams:', *later())\n"
            "    print('after it:', *later())\n"
            "trio.run(main)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.splitlines() == [
        "during the run:", "while a reply streams:",
        "after it: forged._wire.responses forged._run"]


def test_public_api() -> None:
    public = sorted(name for name in dir(forged)
                    if not name.startswith("_")
                    and not isinstance(getattr(forged, name), types.ModuleType))
    assert public == ["CommandError", "ConfigError", "ForgedError", "ProviderError", "Session",
                      "SessionConfig"]
    assert forged.client.__all__ == ["Client", "CommandFailed", "Received", "Unknown"]


async def test_turns_share_one_kept_alive_connection(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="ls", arguments={})]),
               Reply(content=[ScriptText(text="listed")]), Reply(content=[ScriptText(text="2")])]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("one")
        await client.prompt_and_settle("two")
    assert len(client.server.requests) == 3
    assert client.server.connections == 1


async def use_custom_provider(client: Client, tmp_path: Path, provider: dict[str, Any]) -> None:
    """models.json's provider `custom` (model `m`) on the client's scripted server, chosen."""
    path = tmp_path / "custom-models.json"
    path.write_text(json.dumps({"providers": {"custom": {
        "baseUrl": client.server.base_url, "api": "anthropic-messages",
        "models": [{"id": "m", "reasoning": True}], **provider}}}))
    client.config.registry.load_models_json(path)
    assert client.config.registry.error is None
    chosen = await client.request({"type": "set_model", "provider": "custom", "modelId": "m"})
    assert chosen["success"], chosen


@pytest.mark.parametrize(("provider", "expected", "absent"), [
    ({"apiKey": "sk-ant-api03-plain"}, {"x-api-key": "sk-ant-api03-plain"}, ["authorization"]),
    ({"apiKey": "sk-ant-oat01-token"},
     {"authorization": "Bearer sk-ant-oat01-token",
      "anthropic-beta": "claude-code-20250219,oauth-2025-04-20,"
                        "fine-grained-tool-streaming-2025-05-14,interleaved-thinking-2025-05-14"},
     ["x-api-key"]),
    ({"apiKey": "gateway-key", "authHeader": True},
     {"authorization": "Bearer gateway-key"}, ["x-api-key"]),
    ({"apiKey": "k", "headers": {"X-Team": "forge", "Anthropic-Beta": "only-this"}},
     {"x-api-key": "k", "x-team": "forge", "anthropic-beta": "only-this"}, []),
])
async def test_anthropic_keys_and_configured_headers(tmp_path: Path, provider: dict[str, Any],
                                                     expected: dict[str, str],
                                                     absent: list[str]) -> None:
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
        await use_custom_provider(client, tmp_path, provider)
        await client.prompt_and_settle("hi")
    (request,) = client.server.requests
    assert request.path == "/v1/messages"
    assert {name: request.headers.get(name) for name in expected} == expected
    assert [name for name in absent if name in request.headers] == []
    system = [block["text"] for block in request.body["system"]]
    oauth = provider["apiKey"].startswith("sk-ant-oat")
    assert (system[0] == CLAUDE_CODE_IDENTITY) is oauth and len(system) == 1 + oauth


async def test_a_refused_connection_is_a_retryable_error(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    async with open_client(tmp_path) as client:
        model = client.config.model
        assert model is not None
        client.config.registry.add_provider(
            ProviderConfig(name="gone", base_url=f"http://127.0.0.1:{closed_port}",
                           api_key="k"), [attrs.evolve(model, provider="gone",
                                                       base_url=f"http://127.0.0.1:{closed_port}")])
        await client.request({"type": "set_model", "provider": "gone", "modelId": model.id})
        await client.request({"type": "prompt", "message": "hi"})
        started = await client.wait_for(lambda e: e.get("type") == "auto_retry_start")
        await client.request({"type": "abort"})
        await client.settled()
    assert started["errorMessage"].startswith("Connection error: ")


def test_the_client_loads_no_server_module() -> None:
    code = ("import sys, forged.client, forged._paths\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('forged'))))\n")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True).stdout.split()
    assert loaded == ["forged", "forged._codec", "forged._errors", "forged._jsonl",
                      "forged._paths", "forged._runtime", "forged._thin", "forged._version",
                      "forged._vocabulary", "forged._wire", "forged._wire.base",
                      "forged.client"]  # the protocol's classes: the others when first used


MODULES_PLUGIN = """
import sys

WATCH = ("anthropic", "openai", "google", "google.auth", "google.genai", "mistralai",
         "botocore", "cryptography", "click", "pygments", "forged._providers.anthropic")


def register(api):
    def report(args, ctx):
        raise RuntimeError("loaded: " + " ".join(m for m in WATCH if m in sys.modules))

    api.register_command("modules", report)
"""


async def test_a_session_with_an_anthropic_model_loads_none_of_the_cloud_libraries(
        tmp_path: Path) -> None:
    """After a whole turn with an Anthropic model, neither google-auth, botocore, nor any
    SDK is in the process, nor httpx's command line (click, pygments): only forged's own
    modules for the APIs."""
    from .test_process import BIN, child_env

    (tmp_path / "modules.py").write_text(MODULES_PLUGIN)
    (tmp_path / "script.json").write_text(json.dumps(
        {"api": "anthropic-messages", "replies": [{"content": [{"type": "text",
                                                                "text": "hi"}]}]}))
    with trio.fail_after(30):
        done = await trio.run_process(
            [str(BIN / "forged"), "-p", "--provider", "scripted", "--script",
             str(tmp_path / "script.json"), "--plugin", str(tmp_path / "modules.py"), "hello",
             "/modules"], capture_stdout=True, capture_stderr=True, check=False,
            env=child_env(tmp_path / "agent"), cwd=tmp_path)
    assert b"Command /modules failed: loaded: forged._providers.anthropic\n" in done.stderr


@pytest.mark.parametrize("record_sends", [False, True])
async def test_a_client_gone_mid_reply_leaves_the_scripted_server_serving(
        record_sends: bool) -> None:
    """A client that closes its connection while a reply streams (an abort) ends that
    connection only: the next request is answered (and, recording, the close is noted)."""
    long = Reply(content=[ScriptText(text="x" * 400, chunks=400, delay_ms=1)])
    server = ScriptedServer([long, Reply(content=[ScriptText(text="next")])],
                            record_sends=record_sends)
    body = {"model": "m", "max_tokens": 10, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            async with client.stream("POST", "/v1/messages", json=body) as response:
                async for _ in response.aiter_bytes():
                    break  # and the connection closes with the response, mid-reply
            with trio.fail_after(10):
                answered = await client.post("/v1/messages", json=body)
        nursery.cancel_scope.cancel()
    assert answered.status_code == 200 and '"next"' in answered.text
    assert len(server.closes) == (1 if record_sends else 0)
