"""MCP servers as tool sources: a stdio and a streamable-HTTP server written with the official
SDK's server side (``mcp_server.py``), reached by ``forged --mode rpc`` and by ACP's
``mcpServers``; and the configuration rules."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from forged._errors import ConfigProblem
from forged._mcp import McpConfig, exposed, parse_entry, tool_name
from forged._providers.scripted import Reply, ScriptedServer, ScriptText, ScriptToolCall

from .test_process import RPC, Child, child_env, running

SERVER = str(Path(__file__).parent / "mcp_server.py")
DONE = Reply(content=[ScriptText(text="done")])
TOOLS = 13
"""How many tools ``mcp_server.py`` offers."""


def stdio_entry(name: str, mode: str = "stdio", *args: str, **more: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [SERVER, mode, name, *args], **more}


class Forged(Child):
    """``forged --mode rpc`` with MCP servers; what it writes on stderr gathers in `log`."""

    def __init__(self, process: trio.Process) -> None:
        super().__init__(process)
        self.log = ""
        self._logged = trio.Event()
        self.stderr_closed = trio.Event()

    async def read_stderr(self) -> None:
        assert self.process.stderr is not None
        async for data in self.process.stderr:
            self.log += data.decode(errors="replace")
            self._logged.set()
            self._logged = trio.Event()
        self.stderr_closed.set()

    async def logged(self, text: str) -> None:
        """Until `text` is in forged's stderr."""
        with trio.move_on_after(30):  # a hang guard, not a timing
            while text not in self.log:
                await self._logged.wait()
        assert text in self.log, f"forged's stderr:\n{self.log}"

    async def call(self, command: str, **fields: Any) -> Any:
        await self.send({"id": command, "type": command, **fields})
        response = await self.read_until("response", id=command)
        assert response["success"], response
        return response.get("data")

    async def prompt(self, message: str) -> list[dict[str, Any]]:
        start = len(self.output)
        await self.send({"type": "prompt", "message": message})
        await self.read_until("agent_settled")
        return self.output[start:]


@asynccontextmanager
async def provider_for(agent_dir: Path, replies: list[Reply]) -> AsyncIterator[ScriptedServer]:
    """The scripted model API in this trio run, as ``local/m`` in `agent_dir`'s models.json."""
    provider = ScriptedServer(replies)
    async with trio.open_nursery() as nursery:
        await nursery.start(provider.serve)
        (agent_dir / "models.json").write_text(json.dumps({"providers": {"local": {
            "baseUrl": provider.base_url, "api": "anthropic-messages", "apiKey": "k",
            "models": [{"id": "m"}]}}}))
        yield provider
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def forged_with(tmp_path: Path, servers: dict[str, Any], replies: list[Reply],
                      *args: str, read_stderr: bool = True, env: dict[str, str] | None = None
                      ) -> AsyncIterator[tuple[Forged, ScriptedServer]]:
    """forged on these MCP `servers`, the model's `replies` scripted; its stderr is read as it
    comes unless not `read_stderr` (then from when `Forged.read_stderr` is started)."""
    agent_dir, project = tmp_path / "agent", tmp_path / "project"
    agent_dir.mkdir(exist_ok=True)
    project.mkdir(exist_ok=True)
    (agent_dir / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    async with provider_for(agent_dir, replies) as provider, trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            [*RPC, "--model", "local/m", "--cwd", str(project), *args],
            env={**child_env(agent_dir), **(env or {})}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        child = Forged(process)
        if read_stderr:
            nursery.start_soon(child.read_stderr)
        try:
            yield child, provider
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            if not read_stderr:
                nursery.start_soon(child.read_stderr)
            with trio.fail_after(20):  # a hang guard, not a timing
                await process.wait()
                await child.stderr_closed.wait()
            nursery.cancel_scope.cancel()


def ends(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == "tool_execution_end"]


def text(end: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in end["result"]["content"])


async def test_a_servers_tools_reach_the_model_and_run(tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("echo", {"text": "hi"}), ("picture", {}), ("count", {"n": 3}), ("fail", {}),
        ("flood", {"size": 100_000})]
    replies = [Reply(content=[
        *(ScriptToolCall(name=f"mcp__local__{tool}", arguments=arguments)
          for tool, arguments in calls),
        ScriptToolCall(name="list_mcp_resources", arguments={}),
        ScriptToolCall(name="read_mcp_resource", arguments={"server": "local",
                                                            "uri": "note://hello"})]), DONE]
    async with forged_with(tmp_path, {"local": stdio_entry("local")}, replies) as (
            forged, provider):
        state = await forged.call("get_state")  # answered while the server starts
        await forged.logged(f"MCP server local connected: {TOOLS} tools")
        events = await forged.prompt("use the tools")
        servers = (await forged.call("get_mcp_servers"))["servers"]
        flooded = text(ends(events)[4])
        kept = Path(flooded.rsplit("[The whole result is in ", 1)[1].rstrip("]"))
        whole = kept.read_text()  # the session's scratch folder, gone with it
    assert state["sessionId"]
    offered = {tool["name"]: tool for tool in provider.requests[0].body["tools"]}
    echo = offered["mcp__local__echo"]
    assert echo["input_schema"]["properties"]["text"]["type"] == "string"
    assert echo["description"].startswith("Echo the text back")
    dashed = sorted(name for name in offered if name.startswith("mcp__local__echo_text"))
    assert len(dashed) == 2 and all(len(name) == len("mcp__local__echo_text") + 7
                                    for name in dashed)  # the collision: hash suffixes
    assert {"read", "bash", "list_mcp_resources", "read_mcp_resource"} <= offered.keys()
    echoed, picture, counted, failed, _, listed, read = ends(events)
    assert json.loads(text(listed))["resources"][0] == {
        "server": "local", "uri": "note://hello", "name": "hello", "mimeType": "text/plain",
        "description": "A note"}
    assert text(read) == "hello from a resource"
    assert (text(echoed), echoed["isError"]) == ("local echo: hi", False)
    assert picture["result"]["content"][0]["type"] == "image"
    assert picture["result"]["content"][0]["mimeType"] == "image/png"
    assert text(counted) == "counted to 3"
    updates = [text({"result": e["partialResult"]}) for e in events
               if e["type"] == "tool_execution_update"]
    assert updates == ["step 1 (1/3)", "step 2 (2/3)", "step 3 (3/3)"]
    assert failed["isError"] is True and text(failed) == "Error executing tool fail"
    assert len(whole) == 100_000 and whole.startswith("0000000\n0000001\n")
    assert len(flooded) < 21_000  # its middle left out
    assert flooded.startswith("0000000\n") and "\n…79520 chars truncated…\n" in flooded
    assert not kept.exists()
    (server,) = servers
    assert (server["name"], server["transport"], server["status"], server["toolCount"],
            server["description"]) == ("local", "stdio", "ready", TOOLS, "The local test server.")
    assert "[mcp local] info: echoing hi" in forged.log  # a logging notification
    assert "[mcp local] local started" in forged.log


async def test_a_crashed_server_is_an_error_result_and_restarts_on_the_next_call(
        tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="mcp__local__crash", arguments={})]),
               Reply(content=[ScriptToolCall(name="mcp__local__echo",
                                             arguments={"text": "again"})]), DONE]
    async with forged_with(tmp_path, {"local": stdio_entry("local")}, replies) as (
            forged, _):
        events = await forged.prompt("crash it")
        servers = (await forged.call("get_mcp_servers"))["servers"]
    crashed, echoed = ends(events)
    assert crashed["isError"] is True
    assert "stopped during the call" in text(crashed)
    assert text(echoed) == "local echo: again" and echoed["isError"] is False
    assert servers[0]["status"] == "ready"
    log = forged.log
    assert "[mcp local] local is crashing" in log
    assert log.count("local started (pid") == 2


async def test_servers_that_lie_in_their_tool_lists(tmp_path: Path) -> None:
    def liar(how: str) -> dict[str, Any]:
        return {"command": sys.executable, "args": [str(Path(__file__).parent / "mcp_liar.py"),
                                                    how]}

    replies = [Reply(content=[
        ScriptToolCall(name="mcp__endless__echo", arguments={"text": "hi"}),
        ScriptToolCall(name="mcp__noisy__echo", arguments={"text": "there"})]), DONE]
    servers = {"endless": liar("endless"), "array": liar("array"), "noisy": liar("noisy")}
    async with forged_with(tmp_path, servers, replies) as (forged, provider):
        await forged.logged("MCP server endless connected: 1 tools")
        await forged.logged("MCP server noisy connected: 1 tools")
        await forged.logged("MCP server array connected: 1 tools")
        events = await forged.prompt("echo")
        listed = {s["name"]: s for s in (await forged.call("get_mcp_servers"))["servers"]}
    offered = [tool["name"] for tool in provider.requests[0].body["tools"]]
    assert [name for name in offered if name.startswith("mcp__")] == [
        "mcp__endless__echo", "mcp__array__echo", "mcp__noisy__echo"]  # odd alone skipped
    assert [text(end) for end in ends(events)] == ["liar echo: hi", "liar echo: there"]
    assert "forged: MCP server noisy: skipped a line that is not JSON-RPC" in forged.log
    assert "Traceback" not in forged.log  # one line each, through forged's log
    assert listed["array"]["status"] == "ready" and listed["array"]["toolCount"] == 1
    assert ("MCP server array: tool 'odd' skipped: its inputSchema is not a JSON schema of an "
            "object") in forged.log


async def test_a_server_that_changes_its_tools_is_listed_again(tmp_path: Path) -> None:
    def calling(tool: str) -> Reply:
        return Reply(content=[ScriptToolCall(name=f"mcp__local__{tool}", arguments={})])

    async with forged_with(tmp_path, {"local": stdio_entry("local")},
                           [calling("grow"), DONE, calling("extra"), DONE]) as (
            forged, provider):
        await forged.prompt("grow")
        await forged.logged(f"MCP server local changed its tools: {TOOLS + 1} tools")
        events = await forged.prompt("use the new tool")
    offered = [{tool["name"] for tool in request.body["tools"]} for request in provider.requests]
    assert "mcp__local__extra" not in offered[0] and "mcp__local__extra" in offered[2]
    assert text(ends(events)[0]) == "extra!"
    cached = next((tmp_path / "agent" / "mcp-cache").glob("*.json")).read_text()
    assert '"name":"extra"' in cached  # the next session starts with it


async def test_a_server_that_floods_holds_nothing_up(tmp_path: Path) -> None:
    """Nobody reads forged's stderr (a 64 KiB pipe) while a server writes 2 MB there; then the
    server sends 5,000 progress notifications in a burst."""
    flood = Reply(content=[
        ScriptToolCall(name="mcp__loud__shout", arguments={"n": 50_000}),
        ScriptToolCall(name="mcp__loud__count", arguments={"n": 5_000})])
    async with forged_with(tmp_path, {"loud": stdio_entry("loud")}, [flood, DONE],
                           read_stderr=False) as (forged, _):
        with trio.fail_after(60):  # a hang guard: forged blocked on its stderr would stop here
            events = await forged.prompt("shout")
            assert (await forged.call("get_state"))["isStreaming"] is False
    shouted, counted = ends(events)
    assert text(shouted) == "shouted 50000 lines"
    assert text(counted) == "counted to 5000"
    updates = [e for e in events if e["type"] == "tool_execution_update"]
    assert 20 <= len(updates) < 1_000  # a burst, then 20 a second
    kept = forged.log.count("[mcp loud] shouting, line")
    assert 10_000 < kept < 50_000  # what the pipe held, and the lines that waited
    (dropped,) = re.findall(r"forged: (\d+) log lines dropped: stderr was not being read",
                            forged.log)
    assert int(dropped) >= 50_000 - kept  # and any other line logged while the queue was full


async def test_a_hanging_call_is_aborted_or_times_out(tmp_path: Path) -> None:
    hang = Reply(content=[ScriptToolCall(name="mcp__slow__hang", arguments={})])
    ticking = Reply(content=[ScriptToolCall(name="mcp__ticking__count_slowly",
                                            arguments={"n": 6, "every": 0.5})])
    servers = {"slow": stdio_entry("slow", timeout=5),
               "ticking": stdio_entry("ticking", timeout=2)}
    async with forged_with(tmp_path, servers, [hang, hang, DONE, ticking, DONE]) as (
            forged, _):
        await forged.send({"type": "prompt", "message": "hang"})
        await forged.logged("[mcp slow] hang started")  # the call reached the server
        await forged.send({"id": "a", "type": "abort"})
        aborted = await forged.read_until("tool_execution_end")
        await forged.read_until("agent_settled")
        await forged.logged("[mcp slow] hang cancelled")  # notifications/cancelled reached it
        timed_out = ends(await forged.prompt("hang until the timeout"))
        listed = (await forged.call("get_mcp_servers"))["servers"]
        (slowly,) = ends(await forged.prompt("3 s, with progress every 0.5 s"))
    assert aborted["isError"] is True
    (late,) = timed_out
    assert late["isError"] is True and "did not answer within 5 s" in text(late)
    assert listed[0]["status"] in ("failed", "starting", "ready")
    assert text(slowly) == "counted slowly to 6"  # progress restarts its 2 s timeout


async def test_a_server_that_never_answers_delays_only_the_calls_to_it(
        tmp_path: Path) -> None:
    """A first request waits for servers never listed before, each until its startup
    timeout at most; then only calls to a server wait for it."""
    servers = {"mute": stdio_entry("mute", "silent", startupTimeout=0.5),  # 60 s to answer
               "brief": stdio_entry("brief", "silent", timeout=1),
               "local": stdio_entry("local")}
    replies = [Reply(content=[ScriptToolCall(name="mcp__local__echo", arguments={"text": "hi"}),
                              ScriptToolCall(name="mcp__brief__echo", arguments={})]), DONE]
    async with forged_with(tmp_path, servers, replies) as (forged, _):
        await forged.call("get_state")
        events = await forged.prompt("hello")
        listed = {s["name"]: s for s in (await forged.call("get_mcp_servers"))["servers"]}
    assert events[-1] == {"type": "agent_settled", "aborted": False}
    echoed, brief = ends(events)
    assert text(echoed) == "local echo: hi"  # the call waited for its own server only
    assert brief["isError"] and text(brief) == (
        "MCP server brief is not available: it did not answer initialize in time")
    assert listed["mute"]["status"] == "starting"  # the turn waited 0.5 s for it, no more
    assert listed["brief"]["status"] == "failed" and listed["brief"]["lastError"]
    assert listed["local"]["status"] == "ready"


async def test_servers_that_cannot_start_or_exit_at_once_hold_up_no_prompt(
        tmp_path: Path) -> None:
    """A server whose command does not exist and one that exits at once: each is failed as
    soon as that is so, and the first prompt goes to the model without waiting for the MCP
    SDK to load (here held for as long as the test likes), nor for their startup timeouts."""
    gate = tmp_path / "sdk-may-load"
    servers = {"missing": {"command": str(tmp_path / "no-such-server"),
                           "startupTimeout": 600},
               "quits": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"],
                         "startupTimeout": 600}}
    env = {"PYTHONPATH": str(Path(__file__).with_name("gated_sdk")),
           "FORGED_TEST_SDK_GATE": str(gate)}
    async with forged_with(tmp_path, servers, [DONE], env=env) as (forged, provider):
        await forged.send({"type": "prompt", "message": "hello"})
        with trio.fail_after(30):  # the SDK is held until after the model's request
            await provider.wait_for_requests(1)
            await forged.read_until("agent_settled")
        listed = {s["name"]: s for s in (await forged.call("get_mcp_servers"))["servers"]}
        gate.touch()
    assert listed["quits"]["status"] == "failed"
    assert listed["quits"]["lastError"].startswith("it exited with status 3 before it answered")
    assert listed["missing"]["status"] == "failed"
    assert "No such file or directory" in listed["missing"]["lastError"]


async def test_a_server_is_offered_with_the_tools_it_listed_last_time(tmp_path: Path) -> None:
    hold = tmp_path / "hold"  # once it exists, the server never answers initialize
    entry = stdio_entry("local", "stdio", str(hold))
    async with forged_with(tmp_path, {"local": entry}, []) as (forged, _):
        await forged.logged(f"MCP server local connected: {TOOLS} tools")
    assert len(list((tmp_path / "agent" / "mcp-cache").glob("*.json"))) == 1
    hold.touch()
    replies = [Reply(content=[ScriptToolCall(name="mcp__local__echo",
                                             arguments={"text": "hi"})]), DONE]
    async with forged_with(tmp_path, {"local": {**entry, "timeout": 1}}, replies,
                           "--tools", "read,mcp__local__echo") as (forged, provider):
        events = await forged.prompt("echo")
    offered = {tool["name"]: tool for tool in provider.requests[0].body["tools"]}
    assert offered.keys() == {"read", "mcp__local__echo"}  # kept, then chosen by --tools
    assert "no tool is called" not in forged.log
    assert offered["mcp__local__echo"]["input_schema"]["required"] == ["text"]
    (echoed,) = ends(events)
    assert echoed["isError"] and "not available" in text(echoed)  # it waited, then failed
    slow = {**entry, "timeout": 60, "startupTimeout": 60}
    async with forged_with(tmp_path, {"local": slow}, [DONE]) as (forged, provider):
        with trio.fail_after(20):  # a hang guard: a kept listing never delays a request
            await forged.prompt("hello")
        listed = (await forged.call("get_mcp_servers"))["servers"]
    assert "mcp__local__echo" in {tool["name"] for tool in provider.requests[0].body["tools"]}
    assert listed[0]["status"] == "starting"


@asynccontextmanager
async def http_server(mode: str, name: str = "remote") -> AsyncIterator[str]:
    """``mcp_server.py`` over streamable HTTP in `mode`; its URL."""
    server = await trio.lowlevel.open_process([sys.executable, SERVER, mode, name],
                                              stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int((await server.stdout.receive_some(100)).split()[0])
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        await server.wait()


async def test_a_streamable_http_server_that_fails_every_other_request(
        tmp_path: Path) -> None:
    async with http_server("flaky-http", "web") as url:
        os.environ["MCP_TEST_PATH"] = "mcp"
        entry = {"url": url.replace("/mcp", "/${MCP_TEST_PATH}"),
                 "headers": {"X-Test": "yes"}, "toolExposure": ["echo", "count"]}
        replies = [Reply(content=[ScriptToolCall(name="mcp__web__echo",
                                                 arguments={"text": "over http"})]), DONE]
        async with forged_with(tmp_path, {"web": entry}, replies) as (forged, provider):
            await forged.logged("MCP server web connected")
            events = await forged.prompt("echo")
            listed = (await forged.call("get_mcp_servers"))["servers"]
        os.environ.pop("MCP_TEST_PATH", None)
    assert text(ends(events)[0]) == "web echo: over http"  # each request sent twice
    assert "failed (HTTP 503); again in 0.25 s" in forged.log
    assert listed[0]["transport"] == "http"
    offered = {tool["name"] for tool in provider.requests[0].body["tools"]}
    assert {"mcp__web__echo", "mcp__web__count"} <= offered
    assert "mcp__web__hang" not in offered  # toolExposure


# --- configuration -----------------------------------------------------------------------------

def test_an_entry_is_checked_and_legacy_sse_refused() -> None:
    spec = parse_entry("docs", {"url": "https://example.com/mcp", "timeout": 5}, "user")
    assert (spec.transport, spec.timeout_s) == ("http", 5.0)
    for entry, problem in [
            ({"type": "sse", "url": "https://example.com/sse"}, "SSE transport is not"),
            ({"command": "x", "url": "y"}, "either command"),
            ({"command": "x", "timeout": 0}, "timeout"),
            ({"command": "x", "type": "http"}, "does not match"),
            ({"command": "x", "args": "not a list"}, "args"),
            ({"command": "x", "exposure": "visible"}, "exposure must be"),
            ({"command": "x", "toolExposure": {"a": "shown"}}, "toolExposure.a must be")]:
        with pytest.raises(ConfigProblem, match=problem):
            parse_entry("s", entry, "user")
    with pytest.raises(ConfigProblem, match="letters, digits"):
        parse_entry("bad name", {"command": "x"}, "user")


def test_a_project_entry_replaces_or_adjusts_the_users(tmp_path: Path) -> None:
    user, project = tmp_path / "user.json", tmp_path / "project.json"
    user.write_text(json.dumps({"mcpServers": {
        "a": {"command": "a-server"}, "b": {"command": "b-server", "env": {"K": "v"}},
        "broken": {"type": "sse", "url": "x"}}}))
    project.write_text(json.dumps({"mcpServers": {
        "a": {"command": "project-a"}, "b": {"enabled": False, "exposure": "hidden"},
        "a_b": {"command": "one"}, "a-b": {"command": "two"}}}))
    specs = {spec.name: spec for spec in McpConfig(
        user_file=user, project_file=project, handed={"c": {"url": "http://c"}}).load()}
    assert specs["a"].command == "project-a"
    assert (specs["b"].command, specs["b"].env, specs["b"].enabled, specs["b"].exposure) == (
        "b-server", {"K": "v"}, False, "hidden")
    assert specs["a_b"].command == "one" and "a-b" not in specs  # one server's names
    assert specs["c"].source == "client"
    assert "broken" not in specs
    assert McpConfig(user_file=user, disabled=True).load() == []


def test_tool_names_and_exposure() -> None:
    assert tool_name("my-server", "get.thing") == "mcp__my_server__get_thing"
    assert exposed("anything", [])
    assert exposed("get_x", ["get_*"]) and not exposed("delete_x", ["get_*"])
    assert not exposed("delete_x", ["!delete_*"]) and exposed("get_x", ["!delete_*"])
    assert not exposed("get_x", [], "hidden") and exposed("get_x", ["get_x"], "hidden")
    ancestors = {"search_code": "direct", "get_*": "codemode", "*": "hidden",
                 "delete_*": "direct"}  # an exact name first, then the first pattern
    assert [exposed(tool, ancestors, "deferred") for tool in (
        "search_code", "get_x", "delete_x", "other")] == [True, True, False, False]
    assert exposed("x", {"y": "hidden"}, "codemode")  # the ancestor's default: offered
    assert not exposed("x", {"y": "direct"}, "hidden")


@pytest.mark.parametrize(("argv", "kept"), [
    ([], {"mcp__a__x", "mcp__b__y", "list_mcp_resources"}),
    (["--tools", "read,bash"], {"mcp__a__x", "mcp__b__y", "list_mcp_resources"}),
    (["--tools", "read,mcp__a__*"], {"mcp__a__x"}),
    (["--tools", "-mcp__b__y"], {"mcp__a__x", "list_mcp_resources"}),
    (["--exclude-tools", "mcp__*"], {"list_mcp_resources"}),
    (["--no-tools"], set()),
    (["--no-tools", "--tools", "+mcp__b__y"], {"mcp__b__y"}),
    (["--no-builtin-tools"], {"mcp__a__x", "mcp__b__y", "list_mcp_resources"})])
def test_tool_flags_filter_mcp_tools_once_they_name_one(argv: list[str],
                                                         kept: set[str]) -> None:
    from forged._cli import options_from, parse_command_line

    choice = options_from(parse_command_line(argv)).tools
    names = {"mcp__a__x", "mcp__b__y", "list_mcp_resources"}
    assert {name for name in names if choice.keeps_mcp(name)} == kept


@pytest.mark.parametrize("how", ["acp", "connect"])
def test_an_editor_hands_the_session_its_mcp_servers(tmp_path: Path, how: str) -> None:
    import asyncio

    from .acp_editor import Editor, acp
    from .test_acp import forged_acp, use_script
    from .test_process import stop_daemon

    command, env = forged_acp(tmp_path, how)
    project = str(tmp_path / "project")
    echo = {"content": [{"type": "toolCall", "name": "mcp__editor__echo",
                         "arguments": {"text": "from the editor"}}]}
    done = {"content": [{"type": "text", "text": "Done."}]}
    use_script(command, tmp_path, replies=[echo, done, echo, done])
    servers = [acp.schema.McpServerStdio(
        name="editor", command=sys.executable, args=[SERVER, "stdio", "editor"],
        env=[acp.schema.EnvVariable(name="UNUSED", value="1")])]

    async def drive(session_id: str | None) -> tuple[str, list[Any]]:
        editor = Editor()
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            if session_id is None:
                session_id = (await conn.new_session(cwd=project, mcp_servers=servers)
                              ).session_id
            else:
                await conn.load_session(cwd=project, session_id=session_id,
                                        mcp_servers=servers)
                editor.updates.clear()  # the replayed ones
            await conn.prompt(session_id=session_id, prompt=[acp.text_block("Echo")])
        return session_id, editor.updates

    try:
        session_id, new = asyncio.run(asyncio.wait_for(drive(None), 60))
        _, loaded = asyncio.run(asyncio.wait_for(drive(session_id), 60))
    finally:
        stop_daemon(tmp_path / "run")
    for updates in (new, loaded):
        (end,) = [u for u in updates if type(u).__name__ == "ToolCallProgress"]
        assert (end.status, end.content[0].content.text) == (
            "completed", "editor echo: from the editor")


def test_forged_mcp_adds_lists_and_removes(tmp_path: Path) -> None:
    forged = [str(Path(sys.executable).parent / "forged"), "mcp"]
    env = child_env(tmp_path / "agent")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*forged, args[0], "--cwd", str(tmp_path), *args[1:]],
                              capture_output=True, text=True, env=env, timeout=60, check=False)

    assert run("add", "local", "--", sys.executable, SERVER, "stdio", "local").returncode == 0
    config = tmp_path / "agent" / "mcp.json"
    saved = json.loads(config.read_text())
    saved["mcpServers"]["local"]["toolExposure"] = {"crash": "hidden"}  # as the ancestor writes
    config.write_text(json.dumps(saved))
    assert run("add", "old", "--url", "https://example.com/sse").returncode == 0
    assert run("add", "bad name", "--url", "https://x").returncode == 2
    saved = json.loads(config.read_text())["mcpServers"]
    assert saved["local"] == {"command": sys.executable, "args": [SERVER, "stdio", "local"],
                              "toolExposure": {"crash": "hidden"}}
    assert run("remove", "old").returncode == 0
    assert run("remove", "old").returncode == 1
    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    assert "local  stdio  ready" in listed.stdout
    assert (f"{TOOLS} tools: echo, picture, count, count_slowly, hang, crash (hidden), flood"
            in listed.stdout)
    assert run("add", "proj", "--local", "--url", "https://x/mcp").returncode == 0
    assert (tmp_path / ".agent-forge" / "mcp.json").exists()
    # the documented form: options after the name, the command after --, its own options too
    documented = run("add", "tool", "--env", "K=V", "--local", "--", "srv", "--port", "1")
    local = json.loads((tmp_path / ".agent-forge" / "mcp.json").read_text())["mcpServers"]
    assert local["tool"] == {"command": "srv", "args": ["--port", "1"], "env": {"K": "V"}}
    again = run("add", "tool", "--local", "--", "srv2")
    assert documented.returncode == 0, documented.stderr
    assert documented.stdout.startswith("added tool in ")
    assert again.stdout.startswith("replaced tool in ")
    local = json.loads((tmp_path / ".agent-forge" / "mcp.json").read_text())["mcpServers"]
    assert local["tool"] == {"command": "srv2", "args": []}
    assert run("remove", "tool", "--", "x").returncode == 2


def liar(how: str, *args: str, **more: Any) -> dict[str, Any]:
    return {"command": sys.executable,
            "args": [str(Path(__file__).parent / "mcp_liar.py"), how, *args], **more}


def echo(server: str, text: str = "hi") -> ScriptToolCall:
    return ScriptToolCall(name=f"mcp__{server}__echo", arguments={"text": text})


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def test_an_answer_past_max_result_bytes_fails_its_call_and_is_never_held(
        tmp_path: Path) -> None:
    """A line that goes past the server's maxResultBytes (here 1 MiB, and never ends) fails
    the call at once, naming the limit; the server is started again for the next call."""
    servers = {"big": liar("endless-line", str(3 << 20), maxResultBytes=1 << 20),
               "fine": liar("huge", str(900 << 10), maxResultBytes=1 << 20)}
    replies = [Reply(content=[echo("big"), echo("fine")]), DONE]
    async with forged_with(tmp_path, servers, replies) as (forged, _):
        await forged.logged("MCP server big connected: 1 tools")
        events = await forged.prompt("echo")
        servers_now = {s["name"]: s for s in (await forged.call("get_mcp_servers"))["servers"]}
    cut, fine = ends(events)
    assert cut["isError"] is True
    assert text(cut) == (
        "MCP server big: the server's answer is larger than 1 MiB, the most one message may "
        "hold (maxResultBytes); it was not read")
    assert cut["durationMs"] < 2000  # the server never ends its line: no waiting for it
    assert fine["isError"] is False and len(text(fine)) < 21_000  # 900 KiB: under the bound
    assert servers_now["big"]["status"] in ("stopped", "failed", "starting")
    assert "MCP server big: the server's answer is larger than 1 MiB" in forged.log


@pytest.mark.parametrize("size", [16 << 20, 200 << 20])
async def test_a_large_answer_is_read_in_linear_time_and_bounded_memory(
        tmp_path: Path, size: int) -> None:
    """A 16 MB line arrives whole (the SDK's reader took 12 s), a 200 MB one is cut at the
    default bound of 32 MiB; forged never holds more than twice the bound meanwhile."""
    async with forged_with(tmp_path, {"big": liar("huge", str(size))},
                           [Reply(content=[echo("big")]), DONE]) as (forged, _):
        await forged.logged("MCP server big connected: 1 tools")
        before = peak_rss_bytes(forged.process.pid)
        (end,) = ends(await forged.prompt("echo"))
        peak = peak_rss_bytes(forged.process.pid)
    assert peak - before < 2 * (32 << 20), (before, peak)
    assert end["durationMs"] < 5000
    if size < 32 << 20:
        left_out = size + len("liar echo: ") - 20 * 1024
        assert end["isError"] is False and f"…{left_out} chars truncated…" in text(end)
    else:
        assert end["isError"] is True and "larger than 32 MiB" in text(end)


@pytest.mark.parametrize("answers", ["sse", "json"])
async def test_an_http_answer_past_max_result_bytes_fails_its_call_only(
        tmp_path: Path, answers: str) -> None:
    mode = "http" if answers == "sse" else "json-http"
    async with http_server(mode) as url:
        servers = {"remote": {"url": url, "maxResultBytes": 1 << 20}}
        replies = [Reply(content=[
            ScriptToolCall(name="mcp__remote__flood", arguments={"size": 3 << 20}),
            ScriptToolCall(name="mcp__remote__echo", arguments={"text": "after"})]), DONE]
        async with forged_with(tmp_path, servers, replies) as (forged, _):
            await forged.logged("MCP server remote connected")
            events = await forged.prompt("flood")
    flooded, echoed = ends(events)
    assert flooded["isError"] is True
    what = "an event the server sent" if answers == "sse" else "the server's answer"
    assert text(flooded) == (f"MCP server remote: {what} is larger than 1 MiB, the most one "
                             "message may hold (maxResultBytes); it was not read")
    assert (text(echoed), echoed["isError"]) == ("remote echo: after", False)


async def test_a_servers_children_end_with_it_even_after_it_exits(tmp_path: Path) -> None:
    """The server exits at the end of its stdin and leaves a child in its process group:
    the group is stopped all the same when the session ends."""
    pid_file = tmp_path / "orphan.pid"
    async with forged_with(tmp_path, {"parent": liar("orphan", str(pid_file))}, []) as (
            forged, _):
        await forged.logged("MCP server parent connected: 1 tools")
        orphan = int(pid_file.read_text())
        assert running(orphan)
    assert not running(orphan)


async def test_the_first_request_waits_for_servers_never_listed_before(tmp_path: Path) -> None:
    """With nothing kept from an earlier session (a fresh agent dir), the very first model
    request offers the server's tools: it waits for the server to list them."""
    async with forged_with(tmp_path, {"local": stdio_entry("local")}, [DONE]) as (
            forged, provider):
        await forged.prompt("use the local tools")  # sent at once, before it connected
    offered = {tool["name"] for tool in provider.requests[0].body["tools"]}
    assert "mcp__local__echo" in offered
