"""MCP's protocol revisions in forged's client: servers of each era (``mcp_eras_server.py``, on
the official SDK's server side) reached by ``forged --mode rpc`` over stdio and streamable
HTTP; tool lists that change, told or not; and servers' prompts as commands."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from forged._errors import ConfigProblem
from forged._mcp import parse_entry
from forged._providers.scripted import Reply, ScriptToolCall

from .test_mcp import DONE, ends, forged_with, text
from .test_process import child_env

SERVER = str(Path(__file__).parent / "mcp_eras_server.py")
MODERN, HANDSHAKE = "2026-07-28", "2025-11-25"


def stdio(era: str, name: str, *args: str, **more: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [SERVER, "stdio", era, name, *args], **more}


@asynccontextmanager
async def http_servers(*eras: str) -> AsyncIterator[list[str]]:
    """An ``mcp_eras_server.py`` over streamable HTTP on 127.0.0.1 for each of `eras`: their
    URLs."""
    async with trio.open_nursery() as nursery:
        urls: list[str] = []
        servers = []
        try:
            for era in eras:
                server = await trio.lowlevel.open_process(
                    [sys.executable, SERVER, "http", era, f"web-{era}"], stdout=subprocess.PIPE)
                servers.append(server)
                assert server.stdout is not None
                port = int((await server.stdout.receive_some(100)).split()[0])
                urls.append(f"http://127.0.0.1:{port}/mcp")
            yield urls
        finally:
            for server in servers:
                server.kill()
                await server.wait()
            nursery.cancel_scope.cancel()


def calling(*tools: tuple[str, dict[str, Any]]) -> Reply:
    return Reply(content=[ScriptToolCall(name=name, arguments=arguments)
                          for name, arguments in tools])


def offered(request: Any) -> set[str]:
    return {tool["name"] for tool in request.body["tools"]}


def user_text(request: Any) -> str:
    content = request.body["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(
        block.get("text", "") for block in content)


async def test_each_era_is_negotiated_and_its_tools_run(tmp_path: Path) -> None:
    """``auto`` adopts 2026-07-28 where ``server/discover`` offers it, and falls back to the
    handshake where it is a method the server does not know or names older revisions only;
    ``legacy`` and ``2026-07-28`` choose without asking. Over stdio and HTTP alike a call
    runs, the server's log line reaches forged's stderr, and ``get_mcp_servers`` says the
    revision."""
    async with http_servers("dual", "handshake") as (modern_url, handshake_url):
        servers = {
            "modern": stdio("dual", "modern"), "web": {"url": modern_url},
            "legacy": stdio("legacy", "legacy"), "old": stdio("handshake", "old"),
            "oldweb": {"url": handshake_url},
            "asked_legacy": stdio("dual", "asked_legacy", protocol="legacy"),
            "pinned": stdio("dual", "pinned", protocol=MODERN),
            "off": stdio("dual", "off", enabled=False)}
        expected = {"modern": MODERN, "web": MODERN, "legacy": HANDSHAKE, "old": HANDSHAKE,
                    "oldweb": HANDSHAKE, "asked_legacy": HANDSHAKE, "pinned": MODERN}
        replies = [calling(*((f"mcp__{name}__{tool}", {"text": name} if tool == "echo" else {})
                             for name in expected for tool in ("era", "echo"))), DONE]
        async with forged_with(tmp_path, servers, replies) as (forged, _):
            for name in expected:
                await forged.logged(f"MCP server {name} connected: 5 tools")
            events = await forged.prompt("which era?")
            listed = {s["name"]: s for s in (await forged.call("get_mcp_servers"))["servers"]}
    results = [text(end) for end in ends(events)]
    served_as = {"web": "web-dual", "oldweb": "web-handshake"}  # the HTTP servers' own names
    assert results[::2] == [f"{served_as.get(name, name)} speaks {version}"
                            for name, version in expected.items()]
    assert results[1::2] == [f"{served_as.get(name, name)} echo: {name}" for name in expected]
    assert {name: server.get("protocolVersion") for name, server in listed.items()} == {
        **expected, "off": None}
    for name in expected:
        assert f"[mcp {name}] info: echoing {name}" in forged.log


@pytest.mark.parametrize("where", ["modern", "modern-http", "handshake"])
async def test_a_tool_added_at_run_time_is_offered_at_the_next_request(
        tmp_path: Path, where: str) -> None:
    """The server adds a tool and says so: a 2026-07-28 server on the ``subscriptions/listen``
    stream forged keeps open, a handshake-era one with a notification. forged lists the tools
    again before the next request, which offers the new one."""
    async with http_servers("dual") as (url,):
        entry = {"modern": stdio("dual", "s"), "modern-http": {"url": url},
                 "handshake": stdio("handshake", "s")}[where]
        replies = [calling(("mcp__s__grow", {})), DONE, calling(("mcp__s__extra", {})), DONE]
        async with forged_with(tmp_path, {"s": entry}, replies) as (forged, provider):
            await forged.logged("MCP server s connected: 5 tools")
            await forged.prompt("grow")
            await forged.logged("MCP server s changed its tools: 6 tools")  # before asking
            events = await forged.prompt("use the new tool")
            (server,) = (await forged.call("get_mcp_servers"))["servers"]
    assert server["protocolVersion"] == (HANDSHAKE if where == "handshake" else MODERN)
    assert "mcp__s__extra" not in offered(provider.requests[0])
    assert "mcp__s__extra" in offered(provider.requests[2])
    assert text(ends(events)[0]) == "extra!"


async def test_a_listing_is_fresh_for_its_ttl(tmp_path: Path) -> None:
    """Two 2026-07-28 servers without ``subscriptions/listen`` each add a tool and tell
    nobody: the one whose listing is fresh for an hour is not listed again, the one whose
    listing is stale at once (``ttlMs`` 0) is, before the next model request, which offers
    its new tool."""
    servers = {"hour": stdio("dual", "hour", "--tools-ttl-ms", "3600000", "--no-listen"),
               "stale": stdio("dual", "stale", "--tools-ttl-ms", "0", "--no-listen")}
    replies = [calling(("mcp__hour__sneak", {}), ("mcp__stale__sneak", {})), DONE, DONE]
    async with forged_with(tmp_path, servers, replies) as (forged, provider):
        await forged.logged("MCP server hour connected: 5 tools")
        await forged.logged("MCP server stale connected: 5 tools")
        events = await forged.prompt("sneak")
        await forged.prompt("again")
    assert [text(end) for end in ends(events)] == ["sneaked", "sneaked"]
    first, after_the_calls, next_prompt = (offered(request) for request in provider.requests)
    assert not {"mcp__hour__sneaked", "mcp__stale__sneaked"} & first
    assert "mcp__stale__sneaked" in after_the_calls and "mcp__stale__sneaked" in next_prompt
    assert "mcp__hour__sneaked" not in after_the_calls | next_prompt


def test_an_entrys_protocol_is_checked() -> None:
    base = {"command": "srv"}
    assert [parse_entry("s", {**base, "protocol": protocol}, "test").protocol
            for protocol in ("auto", "legacy", MODERN)] == ["auto", "legacy", MODERN]
    assert parse_entry("s", base, "test").protocol == "auto"
    for wrong in (HANDSHAKE, "modern", 2026):
        with pytest.raises(ConfigProblem) as refused:
            parse_entry("s", {**base, "protocol": wrong}, "test")
        assert str(refused.value) == ("server s: protocol must be one of auto, legacy, "
                                      "2026-07-28")


@pytest.mark.parametrize("era", ["dual", "handshake"])
async def test_a_servers_prompts_are_commands(tmp_path: Path, era: str) -> None:
    """``get_commands`` lists each prompt as ``mcp__<server>__<prompt>``; such a command is
    rendered by the server (arguments in the prompt's order, or by name) and its text is
    what the model gets. A prompt the server refuses, or one of a server that fails, fails
    the command, and the model is sent nothing."""
    gone = tmp_path / "gone"
    entry = stdio(era, "srv", "--exit-if", str(gone))
    replies = [DONE, DONE, calling(("mcp__srv__exit", {})), DONE]
    async with forged_with(tmp_path, {"srv": entry}, replies) as (forged, provider):
        await forged.logged("MCP server srv connected: 5 tools")
        commands = (await forged.call("get_commands"))["commands"]
        await forged.prompt('/mcp__srv__review src/app.py the "error handling"')
        await forged.prompt("/mcp__srv__review focus=tests file=a.py")
        refusals = [await refused(forged, "/mcp__srv__broken"),
                    await refused(forged, "/mcp__srv__review"),
                    await refused(forged, "/mcp__srv__nothing")]
        asked = len(provider.requests)
        await forged.prompt("stop the server")
        gone.touch()  # it cannot start again
        gone_error = await refused(forged, "/mcp__srv__review a.py")
        asked_at_end = len(provider.requests)
    mine = [command for command in commands if command["name"].startswith("mcp__")]
    assert mine == [
        {"name": "mcp__srv__review", "description": "Review a file", "source": "prompt",
         "sourceInfo": {"path": "<mcp:srv:review>", "source": "mcp:srv", "scope": "user",
                        "origin": "top-level"}},
        {"name": "mcp__srv__broken", "description": "Always fails", "source": "prompt",
         "sourceInfo": {"path": "<mcp:srv:broken>", "source": "mcp:srv", "scope": "user",
                        "origin": "top-level"}}]
    assert user_text(provider.requests[0]) == (
        "Review src/app.py, looking at the error handling.\n\nI will read it first.")
    assert user_text(provider.requests[1]) == (
        "Review a.py, looking at tests.\n\nI will read it first.")
    assert refusals == [
        "/mcp__srv__broken: MCP server srv refused the prompt: the prompt broke",
        "/mcp__srv__review needs file (it takes file [focus])",
        "MCP server srv has no prompt /mcp__srv__nothing (its prompts: review, broken)"]
    assert gone_error.startswith("/mcp__srv__review: MCP server srv is not available: ")
    assert asked == 2 and asked_at_end == 4  # nothing of a refused prompt reached the model


async def refused(forged: Any, message: str) -> str:
    """The error of a prompt command that fails."""
    await forged.send({"id": message, "type": "prompt", "message": message})
    response = await forged.read_until("response", id=message)
    assert response["success"] is False, response
    return str(response["error"])


def test_forged_mcp_list_says_the_revision(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / "mcp.json").write_text(json.dumps({"mcpServers": {
        "modern": stdio("dual", "modern"), "old": stdio("handshake", "old")}}))
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "forged"), "mcp", "list", "--cwd", str(tmp_path)],
        capture_output=True, text=True, env=child_env(agent_dir), timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    assert f"modern  stdio  ready (MCP {MODERN})" in listed.stdout
    assert f"old  stdio  ready (MCP {HANDSHAKE})" in listed.stdout
