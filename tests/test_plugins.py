"""Capability plugins: discovery and trust, commands, tools, gates, observers, failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from forged._plugins import (
    PluginAPI,
    PluginContext,
    PluginSource,
    ToolCallEvent,
    ToolRunContext,
    discover_plugins,
    load_plugin_file,
)
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall
from forged._settings import Settings
from forged._tools import ToolChoice

from .harness import Client, open_client

CONTRIB = Path(__file__).parents[1] / "contrib" / "plugins"


def plugin(register: Any, plugin_id: str = "test") -> PluginSource:
    return PluginSource(id=plugin_id, register=register, scope="temporary")


def bash_call(command: str) -> Reply:
    return Reply(content=[ScriptToolCall(name="bash", id="call_1",
                                         arguments={"command": command})])


DONE = Reply(content=[ScriptText(text="done")])


def tool_end(client: Client) -> dict[str, Any]:
    (end,) = client.events("tool_execution_end")
    return end


# --- the example plugin ------------------------------------------------------------------------

def confirm_dangerous() -> PluginSource:
    source = load_plugin_file(CONTRIB / "confirm_dangerous.py", "temporary")
    assert source is not None
    return source


def doomed_folder(tmp_path: Path) -> Path:
    doomed = tmp_path / "project" / "doomed"
    doomed.mkdir(parents=True)
    return doomed


async def ask_to_clean_up(client: Client) -> dict[str, Any]:
    """Prompt, and return the dialog request the plugin's gate opens."""
    await client.send({"type": "prompt", "message": "clean up"})
    return await client.wait_for(lambda e: e.get("type") == "extension_ui_request")


async def test_the_example_plugin_runs_rm_rf_once_the_client_confirms(tmp_path: Path) -> None:
    doomed = doomed_folder(tmp_path)
    async with open_client(tmp_path, [bash_call("rm -rf doomed"), DONE],
                           plugins=[confirm_dangerous()]) as client:
        request = await ask_to_clean_up(client)
        assert (request["method"], request["title"], request["message"], request["timeout"]) == (
            "confirm", "Allow dangerous command?", "rm -rf doomed", 60000)
        assert doomed.exists()  # not before the answer
        assert client.types().index("tool_execution_start") < client.types().index(
            "extension_ui_request")
        await client.send({"type": "extension_ui_response", "id": request["id"],
                           "confirmed": True})
        await client.settled()
    assert not doomed.exists()
    assert tool_end(client)["isError"] is False


async def test_the_example_plugin_blocks_rm_rf_when_the_client_declines(tmp_path: Path) -> None:
    doomed = doomed_folder(tmp_path)
    async with open_client(tmp_path, [bash_call("rm -fr doomed"), DONE],
                           plugins=[confirm_dangerous()]) as client:
        request = await ask_to_clean_up(client)
        await client.send({"type": "extension_ui_response", "id": request["id"],
                           "confirmed": False})
        await client.settled()
        sent = client.server.requests[1].body["messages"][-1]["content"][0]
    assert doomed.exists()
    end = tool_end(client)
    assert end["isError"] is True
    assert end["result"]["content"][0]["text"] == (
        "The user did not allow this command: rm -fr doomed")
    assert sent["is_error"] is True and "did not allow" in str(sent["content"])
    notify = client.events("extension_ui_request")[-1]
    assert (notify["method"], notify["notifyType"]) == ("notify", "warning")


async def test_the_example_plugin_blocks_rm_rf_when_nobody_answers(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    doomed = doomed_folder(tmp_path)
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"confirmDangerous": {"timeoutSeconds": 30}}))
    async with open_client(tmp_path, [bash_call("rm -rf doomed"), DONE],
                           plugins=[confirm_dangerous()]) as client:
        request = await ask_to_clean_up(client)
        assert request["timeout"] == 30000
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(29)
        await trio.testing.wait_all_tasks_blocked()
        assert not client.events("tool_execution_end")  # still waiting
        mock_clock.jump(1)
        await client.settled()
    assert doomed.exists()
    assert tool_end(client)["isError"] is True


async def test_the_example_plugin_lets_other_commands_through(tmp_path: Path) -> None:
    async with open_client(tmp_path, [bash_call("echo safe"), DONE],
                           plugins=[confirm_dangerous()]) as client:
        await client.prompt_and_settle("go")
    assert not client.events("extension_ui_request")
    assert tool_end(client)["result"]["content"][0]["text"] == "safe\n"


async def test_abort_while_a_gate_asks_aborts_the_call(tmp_path: Path) -> None:
    doomed = doomed_folder(tmp_path)
    async with open_client(tmp_path, [bash_call("rm -rf doomed"), DONE],
                           plugins=[confirm_dangerous()]) as client:
        request = await ask_to_clean_up(client)
        await client.request({"type": "abort"})
        await client.settled()
        await client.send({"type": "extension_ui_response", "id": request["id"],
                           "confirmed": True})  # too late: nothing runs
        await client.request({"type": "get_state"})
    assert doomed.exists()
    assert tool_end(client)["result"]["content"][0]["text"] == "Operation aborted"
    assert client.events("agent_end")[-1]["messages"][-1]["role"] == "toolResult"


# --- what a plugin registers -------------------------------------------------------------------

def toolbox(api: PluginAPI) -> None:
    async def shout(args: dict[str, Any], ctx: ToolRunContext) -> str:
        ctx.update("warming up")
        return f"{args['text'].upper()} in {ctx.cwd.name}"

    async def stall(args: dict[str, Any], ctx: ToolRunContext) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    api.register_tool("shout", "Shout a text", {
        "type": "object", "properties": {"text": {"type": "string"}},
        "required": ["text"], "additionalProperties": False}, shout,
        snippet="Shout a text back", guidelines=["Shout only when asked"])
    api.register_tool("stall", "Never returns", {"type": "object"}, stall)


async def test_a_plugin_tool_is_offered_validated_and_run(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="shout", id="c1", arguments={"text": 5})]),
               Reply(content=[ScriptToolCall(name="shout", id="c2",
                                             arguments={"text": "hi"})]),
               DONE]
    async with open_client(tmp_path, replies, plugins=[plugin(toolbox)]) as client:
        await client.prompt_and_settle("shout")
        body = client.server.requests[0].body
    tools = {tool["name"]: tool for tool in body["tools"]}
    assert tools["shout"]["input_schema"]["required"] == ["text"]
    system = "".join(block["text"] for block in body["system"])
    assert "- shout: Shout a text back" in system and "- Shout only when asked" in system
    bad, good = client.events("tool_execution_end")
    assert bad["isError"] is True
    assert bad["result"]["content"][0]["text"].startswith(
        'Validation failed for tool "shout":\n  - text: 5 is not of type \'string\'')
    assert (good["isError"], good["result"]["content"][0]["text"]) == (False, "HI in project")
    updates = client.events("tool_execution_update")
    assert updates[0]["partialResult"]["content"][0]["text"] == "warming up"


async def test_abort_cancels_a_plugin_tool(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="stall", id="c1", arguments={})]), DONE]
    async with open_client(tmp_path, replies, plugins=[plugin(toolbox)]) as client:
        await client.send({"type": "prompt", "message": "stall"})
        await client.wait_for(lambda e: e.get("type") == "tool_execution_start")
        with trio.fail_after(5):
            await client.request({"type": "abort"})
            await client.settled()
    end = tool_end(client)
    assert end["isError"] is True and end["result"]["content"][0]["text"] == "Operation aborted"


async def test_a_gate_blocks_with_its_reason_and_observers_see_events_in_order(
        tmp_path: Path) -> None:
    seen: list[str] = []
    asked: list[ToolCallEvent] = []

    def register(api: PluginAPI) -> None:
        def gate(call: ToolCallEvent, ctx: PluginContext) -> Any:
            asked.append(call)
            return api.block("No writing today") if call.tool_name == "write" else None

        async def observe(event: dict[str, Any], ctx: PluginContext) -> None:
            await trio.lowlevel.checkpoint()
            seen.append(event["type"])

        api.on("before_tool_call", gate)
        api.on("*", observe)

    replies = [Reply(content=[
        ScriptToolCall(name="write", id="w1", arguments={"path": "a.txt", "content": "x"}),
        ScriptToolCall(name="ls", id="l1", arguments={})]), DONE]
    async with open_client(tmp_path, replies, plugins=[plugin(register)],
                           tools=ToolChoice(tools=["+ls"])) as client:
        await client.prompt_and_settle("write")
        await trio.testing.wait_all_tasks_blocked()
    assert not (tmp_path / "project" / "a.txt").exists()
    write_end, ls_end = client.events("tool_execution_end")
    assert (write_end["isError"], write_end["result"]["content"][0]["text"]) == (
        True, "No writing today")
    assert ls_end["isError"] is False
    assert [(c.tool_name, c.tool_call_id) for c in asked] == [("write", "w1"), ("ls", "l1")]
    assert asked[0].args == {"path": "a.txt", "content": "x"}
    written = [e["type"] for e in client.output if e["type"] != "response"]
    assert seen == written


async def test_plugin_commands_in_get_commands_and_not_queueable(tmp_path: Path) -> None:
    def register(api: PluginAPI) -> None:
        api.register_command("session-name", lambda args, ctx: ctx.set_session_name(args),
                             description="Set the session name")
        api.register_command("/review", lambda args, ctx: ctx.send_user_message(
            f"Review {args}"))

    async with open_client(tmp_path, [DONE], plugins=[plugin(register, "my-plugin")]) as client:
        commands = (await client.request({"type": "get_commands"}))["data"]["commands"]
        named = await client.request({"type": "prompt", "message": "/session-name Sprint"})
        state = (await client.request({"type": "get_state"}))["data"]
        steer = await client.request({"type": "steer", "message": "/review x"})
        follow = await client.request({"type": "follow_up", "message": "/review x"})
        review = await client.request({"type": "prompt", "message": "/review the diff"})
        await client.settled()
        sent = client.server.requests[0].body["messages"]
    assert commands == [
        {"name": "session-name", "description": "Set the session name", "source": "capability",
         "sourceInfo": {"path": "<plugin:my-plugin:session-name>", "source": "my-plugin",
                        "scope": "temporary", "origin": "top-level"}},
        {"name": "review", "source": "capability",
         "sourceInfo": {"path": "<plugin:my-plugin:review>", "source": "my-plugin",
                        "scope": "temporary", "origin": "top-level"}}]
    assert named["data"] == {"disposition": "handled"} and state["sessionName"] == "Sprint"
    for refused in (steer, follow):
        assert refused["success"] is False
        assert refused["error"] == ('Plugin command "/review" cannot be queued; send it with '
                                    "prompt, which runs it at once")
    assert review["data"] == {"disposition": "handled"}
    assert sent[-1]["content"][0]["text"] == "Review the diff"


# --- failures ----------------------------------------------------------------------------------

NOISY_PLUGIN = '''
import os, subprocess

def register(api):
    print("register prints")
    os.write(1, b"register writes to fd 1\\n")

    def fail(*args):
        print("a hook prints")
        subprocess.run(["echo", "a hook's child prints"])
        raise RuntimeError("plugin bug")

    api.register_command("boom", fail)
    api.register_tool("broken", "Always fails", {"type": "object"}, fail)
    api.on("before_tool_call", lambda call, ctx: fail() if call.tool_name == "ls" else None)
    api.on("*", fail)
'''


async def test_a_failing_plugin_is_reported_and_forged_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def broken_register(api: PluginAPI) -> None:
        api.register_command("never", lambda *_: None)
        raise ValueError("cannot register")

    replies = [Reply(content=[ScriptToolCall(name="broken", id="b1", arguments={}),
                              ScriptToolCall(name="ls", id="l1", arguments={}),
                              ScriptToolCall(name="read", id="r1",
                                             arguments={"path": "missing.txt"})]), DONE]
    (tmp_path / "noisy.py").write_text(NOISY_PLUGIN)
    noisy = load_plugin_file(tmp_path / "noisy.py", "temporary")
    assert noisy is not None
    async with open_client(tmp_path, replies, plugins=[
            noisy, plugin(broken_register, "broken")]) as client:
        boom = await client.request({"type": "prompt", "message": "/boom now"})
        await client.prompt_and_settle("go")
        commands = (await client.request({"type": "get_commands"}))["data"]["commands"]
    assert boom["success"] is False and boom["error"] == "Command /boom failed: plugin bug"
    broken, ls, read = client.events("tool_execution_end")
    assert (broken["isError"], broken["result"]["content"][0]["text"]) == (True, "plugin bug")
    assert ls["isError"] is True and ls["result"]["content"][0]["text"] == (
        "Blocked: plugin noisy failed in before_tool_call: plugin bug")
    assert read["isError"] is True and "missing.txt" in read["result"]["content"][0]["text"]
    assert [c["name"] for c in commands] == ["boom"]  # the broken plugin registered nothing
    err = capsys.readouterr().err
    assert "forged: plugin broken failed in register: cannot register" in err
    assert "forged: plugin noisy failed in on('agent_start'): plugin bug" in err


# --- discovery and trust -----------------------------------------------------------------------

PLUGIN_FILE = '''
def register(api):
    api.register_command("{name}", lambda args, ctx: None, description="from {name}")
'''


def test_discovery_and_trust(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    agent_dir, cwd = tmp_path / "agent", tmp_path / "project"
    (agent_dir / "plugins" / "pkg").mkdir(parents=True)
    (agent_dir / "plugins" / "mine.py").write_text(PLUGIN_FILE.format(name="mine"))
    (agent_dir / "plugins" / "pkg" / "__init__.py").write_text(PLUGIN_FILE.format(name="pkg"))
    (agent_dir / "plugins" / "notes.txt").write_text("not a plugin")
    project_plugins = cwd / ".agent-forge" / "agent" / "plugins"
    project_plugins.mkdir(parents=True)
    (project_plugins / "ours.py").write_text(PLUGIN_FILE.format(name="ours"))
    (cwd / ".agent-forge" / "settings.json").write_text(json.dumps(
        {"trustedProjects": [str(cwd)]}))  # a project cannot trust itself
    extra = tmp_path / "extra.py"
    extra.write_text(PLUGIN_FILE.format(name="extra"))
    site = tmp_path / "site"
    (site / "fancy-1.0.dist-info").mkdir(parents=True)
    (site / "fancy-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fancy\nVersion: 1.0\n")
    (site / "fancy-1.0.dist-info" / "entry_points.txt").write_text(
        "[forged.plugins]\nfancy = fancy_plugin\n")
    (site / "fancy_plugin.py").write_text(PLUGIN_FILE.format(name="fancy"))
    monkeypatch.syspath_prepend(str(site))

    def found(trust_project: bool = False, **kwargs: Any) -> list[tuple[str, str, str]]:
        settings = Settings(agent_dir, cwd, trust_project=trust_project)
        return [(s.id, s.scope, s.origin)
                for s in discover_plugins(cwd, agent_dir, settings, **kwargs)]

    assert found(extra=[extra]) == [("fancy", "user", "package"), ("mine", "user", "top-level"),
                                    ("pkg", "user", "top-level"),
                                    ("extra", "temporary", "top-level")]
    assert "not loading 1 plugin(s)" in capsys.readouterr().err
    assert ("ours", "project", "top-level") in found(trust_project=True)
    (agent_dir / "settings.json").write_text(json.dumps({"trustedProjects": [str(tmp_path)]}))
    assert ("ours", "project", "top-level") in found()  # a trusted parent folder counts

    # A package installed while forged runs (a daemon) is found by the next session.
    (site / "later-1.0.dist-info").mkdir()
    (site / "later-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: later\nVersion: 1.0\n")
    (site / "later-1.0.dist-info" / "entry_points.txt").write_text(
        "[forged.plugins]\nlater = later_plugin\n")
    (site / "later_plugin.py").write_text(PLUGIN_FILE.format(name="later"))
    assert [p for p in found() if p[2] == "package"] == [("fancy", "user", "package"),
                                                         ("later", "user", "package")]


def test_a_plugin_that_cannot_be_imported_is_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.py").write_text("raise ImportError('missing dependency')\n")
    (tmp_path / "empty.py").write_text("x = 1\n")
    assert load_plugin_file(tmp_path / "bad.py", "temporary") is None
    assert load_plugin_file(tmp_path / "empty.py", "temporary") is None
    assert load_plugin_file(tmp_path / "absent.py", "temporary") is None
    err = capsys.readouterr().err
    assert "plugin bad failed in loading: missing dependency" in err
    assert "plugin empty failed in loading: plugin empty has no register(api) function" in err
    assert "no such plugin" in err
    assert "bad" not in " ".join(m for m in sys.modules if m.startswith("forged_plugin_bad"))


async def test_a_noisy_failing_plugin_cannot_touch_the_protocol_stream(tmp_path: Path) -> None:
    from .test_process import BIN, child_env

    (tmp_path / "agent").mkdir()
    (tmp_path / "noisy.py").write_text(NOISY_PLUGIN)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [
        {"content": [{"type": "toolCall", "name": "broken", "id": "b1", "arguments": {}},
                     {"type": "toolCall", "name": "ls", "id": "l1", "arguments": {}},
                     {"type": "toolCall", "name": "bash", "id": "c1",
                      "arguments": {"command": "echo still working"}}]},
        {"content": [{"type": "text", "text": "done"}]}]}))
    commands = [{"id": "1", "type": "prompt", "message": "/boom"},
                {"id": "2", "type": "prompt", "message": "go"},
                {"id": "3", "type": "get_state"}]
    with trio.fail_after(30):
        result = await trio.run_process(
            [str(BIN / "forged"), "--mode", "rpc", "--provider", "scripted", "--script",
             str(script), "--plugin", str(tmp_path / "noisy.py")],
            stdin=b"".join(json.dumps(c).encode() + b"\n" for c in commands),
            capture_stdout=True, capture_stderr=True, env=child_env(tmp_path / "agent"),
            cwd=tmp_path)
    assert result.returncode == 0
    events = [json.loads(line) for line in result.stdout.splitlines()]  # every line is JSON
    responses = {e["id"]: e for e in events if e["type"] == "response"}
    assert responses["1"]["error"] == "Command /boom failed: plugin bug"
    assert responses["2"]["success"] is True and responses["3"]["success"] is True
    ends = [e for e in events if e["type"] == "tool_execution_end"]
    assert [e["isError"] for e in ends] == [True, True, False]
    assert ends[2]["result"]["content"][0]["text"] == "still working\n"
    assert events[-1] == {"type": "agent_settled", "aborted": False}
    err = result.stderr.decode()
    for noise in ("register prints", "register writes to fd 1", "a hook prints",
                  "a hook's child prints", "plugin noisy failed in before_tool_call"):
        assert noise in err


async def test_the_docs_plugin_example_works(tmp_path: Path) -> None:
    section = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    start = section.index("```python\n") + len("```python\n")
    code = section[start:section.index("\n```", start)]
    (tmp_path / "example.py").write_text(code)
    example = load_plugin_file(tmp_path / "example.py", "temporary")
    assert example is not None
    replies = [Reply(content=[
        ScriptToolCall(name="word_count", id="c1", arguments={"text": "two words"}),
        ScriptToolCall(name="write", id="c2", arguments={"path": "x.lock", "content": ""})]),
        DONE]
    async with open_client(tmp_path, replies, plugins=[example]) as client:
        prompt_id = await client.send({"type": "prompt", "message": "/stats src"})
        request = await client.wait_for(lambda e: e.get("type") == "extension_ui_request")
        assert (request["title"], request["message"], request["timeout"]) == (
            "Count lines?", "in src", 30000)
        await client.send({"type": "extension_ui_response", "id": request["id"],
                           "confirmed": True})
        assert (await client.response(prompt_id))["data"] == {"disposition": "handled"}
        await client.settled()
        sent = client.server.requests[0].body["messages"][0]["content"][0]["text"]
    assert sent == "Count the lines of code in src"
    count, lock = client.events("tool_execution_end")
    assert count["result"]["content"][0]["text"] == "2"
    assert lock["result"]["content"][0]["text"] == "Lock files are generated; do not write them"
    assert not (tmp_path / "project" / "x.lock").exists()


def test_with_no_plugin_package_installed_no_metadata_is_parsed() -> None:
    """Start-up reads no distribution's metadata when none declares a ``forged.plugins``
    entry point (importlib.metadata costs ~9 ms to import): a byte search of the
    ``entry_points.txt`` files says so first."""
    code = ("import sys\nfrom forged._plugins import _package_plugins\n"
            "print(_package_plugins(), 'importlib.metadata' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["[]", "False"]
