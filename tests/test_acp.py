"""``forged --mode acp``, driven by the official ACP Python SDK (``agent-client-protocol``) as
an editor drives it: initialize, a session, a prompt with a tool call streamed as
``session/update`` notifications, cancel, and the framing errors."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from .acp_editor import Editor, acp
from .test_process import BIN, stop_daemon


def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"api": "anthropic-messages", "replies": [
        {"content": [{"type": "toolCall", "name": "read", "arguments": {"path": "notes.txt"}}]},
        {"content": [{"type": "thinking", "thinking": "It is short."},
                     {"type": "text", "text": "It says hello.", "chunks": 3}]},
        {"content": [{"type": "text", "text": "slow " * 400, "chunks": 400,
                      "delayMs": 20}]}]}))
    return path


def forged_acp(tmp_path: Path, how: str = "acp") -> tuple[list[str], dict[str, str]]:
    """``forged --mode acp``, or ``forged connect --acp`` (its daemon in `tmp_path/run`)."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "notes.txt").write_text("hello\n")
    env = {**os.environ, "AGENT_FORGE_DIR": str(tmp_path / "agent"),
           "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    front = ["--mode", "acp"] if how == "acp" else ["connect", "--acp"]
    return [str(BIN / "forged"), *front, "--provider", "scripted", "--script",
            str(script(tmp_path)), "--cwd", str(project)], env


@pytest.fixture(params=["acp", "connect"])
def how(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Sessions of the ACP process, or of the daemon through ``forged connect --acp``."""
    yield request.param
    stop_daemon(tmp_path / "run")


def test_an_editor_prompts_and_cancels(tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = str(tmp_path / "project")

    async def drive() -> dict[str, Any]:
        editor = Editor()
        seen: dict[str, Any] = {}
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            seen["version"] = init.protocol_version
            seen["agent"] = init.agent_info.name
            seen["mcp"] = init.agent_capabilities.mcp_capabilities
            session = await conn.new_session(cwd=project)
            sid = session.session_id
            read = await conn.prompt(session_id=sid, prompt=[
                acp.text_block("What does notes.txt say?")])
            seen["stop"] = read.stop_reason
            seen["kinds"] = editor.kinds()
            seen["said"] = editor.said()
            seen["tool"] = [u for u in editor.updates if type(u).__name__ in (
                "ToolCallStart", "ToolCallProgress")]
            editor.updates.clear()
            slow = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[
                acp.text_block("Talk slowly")]))
            await editor.streaming.wait()
            await conn.cancel(session_id=sid)
            seen["cancelled"] = (await slow).stop_reason
        return seen

    seen = asyncio.run(asyncio.wait_for(drive(), 60))  # a hang guard, not a timing
    assert seen["version"] == 1 and seen["agent"] == "forged"
    assert (seen["mcp"].http, seen["mcp"].sse) == (True, False)  # session/new connects HTTP
    assert seen["stop"] == "end_turn"
    assert seen["said"] == "It says hello."
    assert "AgentThoughtChunk" in seen["kinds"]
    start, end = seen["tool"]
    assert (start.kind, start.status, start.title) == ("read", "in_progress",
                                                        "read notes.txt")
    assert start.locations[0].path == str(Path(project) / "notes.txt")
    assert (end.status, end.tool_call_id) == ("completed", start.tool_call_id)
    assert end.content[0].content.text == "hello\n"
    assert seen["cancelled"] == "cancelled"


def test_framing_errors_are_answered_and_notifications_never(tmp_path: Path) -> None:
    command, env = forged_acp(tmp_path)
    lines = [b"{not json", b'{"jsonrpc":"2.0","id":1,"method":"no/such"}',
             b'{"id":2,"method":"initialize"}', b'{"jsonrpc":"2.0","method":"no/such"}',
             b'{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"protocolVersion":1}}']
    done = subprocess.run(command, input=b"\n".join(lines) + b"\n", capture_output=True,
                          env=env, timeout=60, check=False)
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(a.get("id"), a.get("error", {}).get("code")) for a in answers] == [
        (None, -32700), (1, -32601), (2, -32600), (3, None)]
    assert answers[-1]["result"]["protocolVersion"] == 1
    assert all(a["jsonrpc"] == "2.0" for a in answers)


def test_a_session_is_listed_and_loaded_in_a_new_process(tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = str(tmp_path / "project")

    async def first() -> str:
        async with acp.spawn_agent_process(Editor(), command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=project)).session_id
            await conn.set_session_mode(session_id=sid, mode_id="read-only")
            await conn.prompt(session_id=sid, prompt=[acp.text_block(
                "What does notes.txt say?")])
            return str(sid)

    async def second(sid: str) -> dict[str, Any]:
        editor = Editor()
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            listed = await conn.list_sessions(cwd=project)
            loaded = await conn.load_session(cwd=project, session_id=sid)
            replayed = list(editor.updates)
            again = await conn.prompt(session_id=sid, prompt=[acp.text_block("Once more")])
            return {"load": init.agent_capabilities.load_session, "listed": listed.sessions,
                    "replayed": replayed, "again": again.stop_reason,
                    "mode": loaded.modes.current_mode_id if loaded.modes else None}

    sid = asyncio.run(asyncio.wait_for(first(), 60))
    seen = asyncio.run(asyncio.wait_for(second(sid), 60))
    assert seen["load"] is True
    (listed,) = seen["listed"]
    assert (listed.session_id, listed.title, listed.cwd) == (
        sid, "What does notes.txt say?", project)
    kinds = [type(update).__name__ for update in seen["replayed"]]
    assert kinds == ["UserMessageChunk", "ToolCallStart", "ToolCallProgress",
                     "AgentThoughtChunk", "AgentMessageChunk"]
    assert seen["replayed"][0].content.text == "What does notes.txt say?"
    assert seen["replayed"][-1].content.text == "It says hello."
    assert seen["again"] == "end_turn"
    assert seen["mode"] == "read-only"  # kept with the session


def test_permission_modes_are_modes_and_thinking_and_model_config_options(
        tmp_path: Path) -> None:
    command, env = forged_acp(tmp_path)
    project = str(tmp_path / "project")
    prompts = tmp_path / "agent" / "prompts"
    prompts.mkdir(parents=True)
    (prompts / "review.md").write_text("---\ndescription: Review the change\n---\nReview $1")

    async def drive() -> dict[str, Any]:
        editor = Editor()
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            session = await conn.new_session(cwd=project)
            sid = session.session_id
            await conn.set_session_mode(session_id=sid, mode_id="read-only")
            thought = await conn.set_config_option(config_id="thought", session_id=sid,
                                                   value="high")
            chosen = await conn.set_config_option(config_id="model", session_id=sid,
                                                  value="scripted/openai-completions")
            try:
                await conn.set_config_option(config_id="model", session_id=sid,
                                             value="nowhere/nothing")
                refused = ""
            except acp.RequestError as exc:
                refused = str(exc)
            await editor.commands.wait()
            commands = next(u.available_commands for u in editor.updates
                            if type(u).__name__ == "AvailableCommandsUpdate")
            return {"session": session, "chosen": chosen, "thought": thought,
                    "kinds": editor.kinds(),
                    "mode": [u for u in editor.updates
                             if type(u).__name__ == "CurrentModeUpdate"],
                    "commands": commands, "refused": refused}

    seen = asyncio.run(asyncio.wait_for(drive(), 60))
    modes = seen["session"].modes
    assert modes.current_mode_id == "full-access"
    assert [mode.id for mode in modes.available_modes] == [
        "full-access", "ask", "auto", "read-only"]
    assert [option.id for option in seen["session"].config_options] == [
        "model", "mode", "thought"]
    assert [u.current_mode_id for u in seen["mode"]] == ["read-only"]
    options = {option.id: option for option in seen["thought"].config_options}
    assert options["mode"].current_value == "read-only"
    assert options["thought"].current_value == "high"
    assert [o.value for o in options["thought"].options] == [
        "off", "minimal", "low", "medium", "high"]
    model = seen["chosen"].config_options[0]
    assert model.current_value == "scripted/openai-completions"
    assert "Model not found" in seen["refused"]
    assert [c.name for c in seen["commands"]] == [
        "compact", "export", "name", "session", "fork", "model", "undo", "checkpoints",
        "review"]
    assert seen["commands"][-1].description == "Review the change"


def test_edits_show_as_diffs_and_usage_is_reported(tmp_path: Path) -> None:
    command, env = forged_acp(tmp_path)
    project = tmp_path / "project"
    use_script(command, tmp_path, replies=[
        {"content": [
            {"type": "toolCall", "name": "edit", "arguments": {
                "path": "notes.txt", "oldText": "hello", "newText": "goodbye"}},
            {"type": "toolCall", "name": "write", "arguments": {
                "path": "new.txt", "content": "fresh\n"}}]},
        {"content": [{"type": "text", "text": "Done."}],
         "usage": {"input": 1200, "output": 30}}])

    async def drive() -> list[Any]:
        editor = Editor()
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Change it")])
        return editor.updates

    updates = asyncio.run(asyncio.wait_for(drive(), 60))
    ends = [u for u in updates if type(u).__name__ == "ToolCallProgress"]
    edit_diff, write_diff = (end.content[-1] for end in ends)
    assert (edit_diff.type, edit_diff.path, edit_diff.old_text, edit_diff.new_text) == (
        "diff", str(project / "notes.txt"), "hello", "goodbye")
    assert (write_diff.path, write_diff.old_text, write_diff.new_text) == (
        str(project / "new.txt"), None, "fresh\n")
    assert (project / "notes.txt").read_text() == "goodbye\n"
    usage = [u for u in updates if type(u).__name__ == "UsageUpdate"]
    assert usage[-1].used == 1230 and usage[-1].size == 200_000
    assert usage[-1].cost.currency == "USD" and usage[-1].cost.amount > 0


GATE_PLUGIN = '''
def register(api):
    async def gate(call, ctx):
        if call.tool_name in ("bash", "write"):
            if not await ctx.ui.confirm(f"Allow {call.tool_name}?", str(call.args)):
                return api.block("The user said no")

    api.on("before_tool_call", gate)
'''


def use_script(command: list[str], tmp_path: Path, *, replies: list[Any],
               gated: bool = False) -> None:
    """Make `command` run these scripted `replies`, with the gate plugin when `gated`."""
    path = tmp_path / f"script-{len(list(tmp_path.glob('script-*.json')))}.json"
    path.write_text(json.dumps({"api": "anthropic-messages", "replies": replies}))
    command[command.index("--script") + 1] = str(path)
    if gated:
        (tmp_path / "gate.py").write_text(GATE_PLUGIN)
        command += ["--plugin", str(tmp_path / "gate.py")]


def test_a_plugin_gate_asks_the_editor_for_permission(tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    use_script(command, tmp_path, gated=True, replies=[
        {"content": [
            {"type": "toolCall", "name": "bash", "arguments": {"command": "echo one"}},
            {"type": "toolCall", "name": "bash", "arguments": {"command": "echo two"}},
            {"type": "toolCall", "name": "write", "arguments": {
                "path": "new.txt", "content": "x"}}]},
        {"content": [{"type": "text", "text": "Done."}]}])
    answers = iter(["always", "reject"])

    async def drive() -> Editor:
        editor = Editor(choose=lambda options: next(answers))
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Go")])
        return editor

    editor = asyncio.run(asyncio.wait_for(drive(), 60))
    starts = [u for u in editor.updates if type(u).__name__ == "ToolCallStart"]
    ends = [u for u in editor.updates if type(u).__name__ == "ToolCallProgress"]
    (bash_call, bash_options), (write_call, _) = editor.permissions  # "echo two": remembered
    assert [option.kind for option in bash_options] == [
        "allow_once", "allow_always", "reject_once"]
    assert bash_call.tool_call_id == starts[0].tool_call_id
    assert bash_call.content[0].content.text.startswith("Allow bash?")
    assert write_call.tool_call_id == starts[2].tool_call_id
    assert [end.status for end in ends] == ["completed", "completed", "failed"]
    assert ends[1].content[0].content.text == "two\n"
    assert ends[2].content[0].content.text == "The user said no"
    assert not (project / "new.txt").exists()


def test_the_permission_modes_ask_the_editor(tmp_path: Path, how: str) -> None:
    """In ask, a command is asked on its tool call: allow always (the same command is not
    asked again), then reject. (An escalation out of auto's sandbox is never allowed
    always: tests/test_escapes.py.)"""
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    outside = tmp_path / "outside"
    outside.mkdir()
    append = f"echo x >> {outside / 'log'}"

    def escalated(line: str) -> dict[str, Any]:
        return {"content": [{"type": "toolCall", "name": "bash", "arguments": {
            "command": line}}]}

    use_script(command, tmp_path, replies=[
        escalated(append), escalated(append), escalated(f"touch {outside / 'no'}"),
        {"content": [{"type": "text", "text": "Done."}]}])
    kinds = iter(["allow_always", "reject_once"])

    def choose(options: list[Any]) -> str:
        wanted = next(kinds)
        return next(str(option.option_id) for option in options if option.kind == wanted)

    async def drive() -> Editor:
        editor = Editor(choose=choose)
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.set_session_mode(session_id=sid, mode_id="ask")
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Go")])
        return editor

    editor = asyncio.run(asyncio.wait_for(drive(), 60))
    starts = [u for u in editor.updates if type(u).__name__ == "ToolCallStart"]
    ends = [u for u in editor.updates if type(u).__name__ == "ToolCallProgress"]
    (first, options), (third, _) = editor.permissions
    assert [(o.name, o.kind) for o in options] == [
        ("Allow once", "allow_once"), ("Allow for this session", "allow_always"),
        ("Deny", "reject_once")]
    assert first.tool_call_id == starts[0].tool_call_id
    assert third.tool_call_id == starts[2].tool_call_id
    assert append in first.content[0].content.text
    assert [end.status for end in ends] == ["completed", "completed", "failed"]
    assert "the user denied it" in ends[2].content[0].content.text
    assert (outside / "log").read_text() == "x\nx\n" and not (outside / "no").exists()


def test_undo_puts_the_files_back_and_asks_about_drift(tmp_path: Path, how: str) -> None:
    """/undo after a run that changed files: with an edit of the user's since, the editor
    is asked first; rejected, nothing changes; allowed, the files are as before the run."""
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    use_script(command, tmp_path, replies=[
        {"content": [{"type": "toolCall", "name": "bash", "arguments": {
            "command": "rm notes.txt && echo made > made.txt"}}]},
        {"content": [{"type": "text", "text": "Done."}]}])
    answers = iter(["keep", "undo"])

    async def drive() -> tuple[Editor, list[str]]:
        editor = Editor(choose=lambda options: next(answers))
        stops: list[str] = []
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Change things")])
            (project / "mine.txt").write_text("the user's own file\n")
            for _ in range(2):
                answered = await conn.prompt(session_id=sid, prompt=[acp.text_block("/undo")])
                stops.append(answered.stop_reason)
            listed = await conn.prompt(session_id=sid,
                                       prompt=[acp.text_block("/checkpoints")])
            stops.append(listed.stop_reason)
        return editor, stops

    editor, stops = asyncio.run(asyncio.wait_for(drive(), 60))
    assert stops == ["end_turn"] * 3
    assert [call.title for call, _ in editor.permissions] == ["Undo the last run"] * 2
    assert "mine.txt" in editor.permissions[0][0].content[0].content.text
    assert (project / "notes.txt").read_text() == "hello\n"
    assert not (project / "made.txt").exists() and not (project / "mine.txt").exists()
    assert "Not undone" in editor.said() and "Undone: the files are back" in editor.said()
    listing = editor.said().split("Checkpoints, oldest first:\n")[1].splitlines()
    assert listing[0].endswith(" before the run of “Change things”")
    assert listing[1].endswith(" after the run: 2 files changed (made.txt, notes.txt)")
    assert listing[2].endswith(" a restore (the files just before it): 3 files changed by "
                               "the restore (made.txt, mine.txt, notes.txt)")


def test_the_tools_read_and_edit_the_editors_buffers(tmp_path: Path) -> None:
    command, env = forged_acp(tmp_path)
    project = tmp_path / "project"
    notes, new = str(project / "notes.txt"), str(project / "new.txt")
    use_script(command, tmp_path, replies=[
        {"content": [
            {"type": "toolCall", "name": "read", "arguments": {"path": "notes.txt"}},
            {"type": "toolCall", "name": "edit", "arguments": {
                "path": "notes.txt", "oldText": "unsaved", "newText": "edited"}},
            {"type": "toolCall", "name": "write", "arguments": {
                "path": "new.txt", "content": "fresh\n"}},
            {"type": "toolCall", "name": "read", "arguments": {"path": "gone.txt"}}]},
        {"content": [{"type": "text", "text": "Done."}]}])

    async def drive() -> Editor:
        editor = Editor(buffers={notes: "unsaved hello\n"})
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                  client_capabilities=editor.capabilities())
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Go")])
        return editor

    editor = asyncio.run(asyncio.wait_for(drive(), 60))
    ends = [u for u in editor.updates if type(u).__name__ == "ToolCallProgress"]
    assert ends[0].content[0].content.text == "unsaved hello\n"
    assert [end.status for end in ends] == ["completed", "completed", "completed", "failed"]
    assert "gone.txt" in ends[3].content[0].content.text
    assert editor.buffers == {notes: "edited hello\n", new: "fresh\n"}
    assert editor.file_calls == [("read", notes), ("read", notes), ("write", notes),
                                 ("write", new), ("read", str(project / "gone.txt"))]
    assert (project / "notes.txt").read_text() == "hello\n"  # the disk is the editor's
    assert not (project / "new.txt").exists()


def test_a_queued_prompt_is_answered_when_its_own_turn_ends(tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = str(tmp_path / "project")
    use_script(command, tmp_path, replies=[
        {"content": [{"type": "text", "text": "First " * 50, "chunks": 50, "delayMs": 20}]},
        {"content": [{"type": "text", "text": "Second."}]}])

    async def drive() -> list[dict[str, Any]]:
        process = await asyncio.create_subprocess_exec(
            *command, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert process.stdin is not None and process.stdout is not None

        def line(message: dict[str, Any]) -> bytes:
            return json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n"

        async def until(request_id: int) -> list[dict[str, Any]]:
            seen = []
            while True:
                seen.append(json.loads(await process.stdout.readline()))  # type: ignore[union-attr]
                if seen[-1].get("id") == request_id and "method" not in seen[-1]:
                    return seen

        process.stdin.write(line({"id": 0, "method": "initialize",
                                  "params": {"protocolVersion": 1}})
                            + line({"id": 1, "method": "session/new",
                                    "params": {"cwd": project, "mcpServers": []}}))
        sid = (await until(1))[-1]["result"]["sessionId"]
        process.stdin.write(  # one write: the second arrives while the first runs
            line({"id": 2, "method": "session/prompt",
                  "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "A"}]}})
            + line({"id": 3, "method": "session/prompt",
                    "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "B"}]}}))
        seen = await until(2)
        seen += await until(3)
        process.stdin.close()
        await process.wait()
        return seen

    seen = asyncio.run(asyncio.wait_for(drive(), 60))
    answers = [index for index, message in enumerate(seen) if "result" in message]
    second = next(index for index, message in enumerate(seen)
                  if "Second." in json.dumps(message.get("params")))
    first_answer, second_answer = answers[-2:]
    assert seen[first_answer]["id"] == 2 and seen[second_answer]["id"] == 3
    assert first_answer < second < second_answer
    assert seen[first_answer]["result"] == seen[second_answer]["result"] == {
        "stopReason": "end_turn"}


# --- every line against the schema -------------------------------------------------------------

RESULTS = {"initialize": "InitializeResponse", "session/new": "NewSessionResponse",
           "session/load": "LoadSessionResponse", "session/list": "ListSessionsResponse",
           "session/prompt": "PromptResponse", "session/set_mode": "SetSessionModeResponse",
           "session/set_config_option": "SetSessionConfigOptionResponse",
           "session/resume": "ResumeSessionResponse", "session/fork": "ForkSessionResponse",
           "session/close": "CloseSessionResponse", "session/delete": "DeleteSessionResponse",
           "authenticate": "AuthenticateResponse", "logout": "LogoutResponse"}
PARAMS = {"session/update": "SessionNotification",
          "session/request_permission": "RequestPermissionRequest",
          "fs/read_text_file": "ReadTextFileRequest", "fs/write_text_file": "WriteTextFileRequest",
          "elicitation/create": "CreateFormSessionElicitationRequest",
          "$/cancel_request": "CancelRequestNotification"}


def closed(schema: Any) -> Any:
    """`schema` with no room for fields it does not name: a misspelt field fails."""
    if isinstance(schema, dict):
        schema = {key: closed(value) for key, value in schema.items()}
        if schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
    elif isinstance(schema, list):
        schema = [closed(item) for item in schema]
    return schema


def schema_problems(sent: list[dict[str, Any]], written: list[dict[str, Any]]) -> list[str]:
    """Each line forged wrote that is not what the SDK's schema (ACP v1) allows, with the
    method of the request it answers, from the lines the client `sent`."""
    import jsonschema

    validators = {name: jsonschema.Draft202012Validator(closed(
        getattr(acp.schema, name).model_json_schema())) for name in {
        *RESULTS.values(), *PARAMS.values(), "Error"}}
    asked = {message["id"]: message["method"] for message in sent
             if "method" in message and "id" in message}
    problems = []
    for message in written:
        if message.pop("jsonrpc", None) != "2.0":
            problems.append(f"not JSON-RPC 2.0: {message}")
        if "method" in message:
            model, body = PARAMS.get(message["method"]), message.get("params")
        elif "error" in message:
            model, body = "Error", message["error"]
        else:
            model, body = RESULTS.get(asked.get(message.get("id"), "")), message.get("result")
            if asked.get(message.get("id")) == "session/cancel":
                problems.append(f"a notification was answered: {message}")
        if model is None:
            problems.append(f"no schema for {message}")
            continue
        problems += [f"{model}: {error.message} at {list(error.absolute_path)}"
                     for error in validators[model].iter_errors(body)]
    return problems


def teed(command: list[str], tmp_path: Path, name: str) -> list[str]:
    """`command` with what goes in and out of it copied to `name`.in and `name`.out."""
    return ["sh", "-c", f'tee {tmp_path / name}.in | "$@" | tee {tmp_path / name}.out',
            "sh", *command]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_every_message_forged_writes_fits_the_acp_schema(tmp_path: Path) -> None:
    command, env = forged_acp(tmp_path)
    project = tmp_path / "project"
    use_script(command, tmp_path, gated=True, replies=[
        {"content": [
            {"type": "toolCall", "name": "read", "arguments": {"path": "notes.txt"}},
            {"type": "toolCall", "name": "edit", "arguments": {
                "path": "notes.txt", "oldText": "hello", "newText": "bye"}},
            {"type": "toolCall", "name": "bash", "arguments": {"command": "echo hi"}},
            {"type": "toolCall", "name": "write", "arguments": {
                "path": "new.txt", "content": "x"}}]},
        {"content": [{"type": "thinking", "thinking": "Done thinking."},
                     {"type": "text", "text": "Done."}], "usage": {"input": 10, "output": 5}},
        {"content": [{"type": "text", "text": "slow " * 400, "chunks": 400,
                      "delayMs": 20}]}])
    notes = str(project / "notes.txt")
    answers = iter(["allow", "reject"])

    async def first() -> str:
        editor = Editor(choose=lambda options: next(answers), buffers={notes: "hello\n"})
        async with acp.spawn_agent_process(editor, *teed(command, tmp_path, "first"), env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                  client_capabilities=editor.capabilities())
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.set_session_mode(session_id=sid, mode_id="ask")
            await conn.set_session_mode(session_id=sid, mode_id="full-access")
            await conn.set_config_option(config_id="thought", session_id=sid, value="low")
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Go")])
            slow = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[
                acp.text_block("Talk slowly"),
                acp.image_block("iVBORw0KGgo=", "image/png"),
                acp.resource_link_block("spec", "file:///spec.md"),
                acp.resource_block(acp.embedded_text_resource("file:///a.py", "print(1)"))]))
            await editor.streaming.wait()
            await conn.cancel(session_id=sid)
            await slow
            await conn.list_sessions(cwd=str(project))
            try:
                await conn.set_session_mode(session_id=sid, mode_id="ultra")
            except acp.RequestError:
                pass
            return str(sid)

    async def second(sid: str) -> None:
        async with acp.spawn_agent_process(Editor(), *teed(command, tmp_path, "second"),
                                           env=env, cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            await conn.load_session(cwd=str(project), session_id=sid)

    asyncio.run(asyncio.wait_for(second(asyncio.run(asyncio.wait_for(first(), 60))), 60))
    problems: list[str] = []
    kinds: set[str] = set()
    for name in ("first", "second"):
        written = lines(tmp_path / f"{name}.out")
        kinds |= {m["params"]["update"]["sessionUpdate"] for m in written
                  if m.get("method") == "session/update"}
        kinds |= {m["method"] for m in written if "id" in m and "method" in m}
        problems += schema_problems(lines(tmp_path / f"{name}.in"), written)
    assert problems == []
    assert kinds >= {"agent_message_chunk", "agent_thought_chunk", "tool_call",
                     "tool_call_update", "user_message_chunk", "usage_update",
                     "current_mode_update", "available_commands_update",
                     "session/request_permission", "fs/read_text_file", "fs/write_text_file"}


def test_a_failed_run_is_an_error_and_a_cut_reply_max_tokens(tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = str(tmp_path / "project")
    use_script(command, tmp_path, replies=[
        {"status": 400, "errorType": "invalid_request_error",
         "errorMessage": "the prompt is too odd"},
        {"content": [{"type": "text", "text": "Cut"}], "stopReason": "length"}])

    async def drive() -> tuple[str, str]:
        async with acp.spawn_agent_process(Editor(), command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=project)).session_id
            try:
                await conn.prompt(session_id=sid, prompt=[acp.text_block("Odd")])
                failed = ""
            except acp.RequestError as exc:
                failed = str(exc)
            cut = await conn.prompt(session_id=sid, prompt=[acp.text_block("Long")])
            return failed, cut.stop_reason

    failed, cut = asyncio.run(asyncio.wait_for(drive(), 60))
    assert "the prompt is too odd" in failed
    assert cut == "max_tokens"


def test_a_prompt_while_busy_steers_when_the_setting_says_so(tmp_path: Path) -> None:
    command, env = forged_acp(tmp_path)
    project = str(tmp_path / "project")
    (tmp_path / "agent").mkdir(exist_ok=True)
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"acpPromptWhileBusy": "steer"}))
    use_script(command, tmp_path, replies=[
        {"content": [{"type": "text", "text": "slow " * 50, "chunks": 50, "delayMs": 20},
                     {"type": "toolCall", "name": "bash", "arguments": {"command": "true"}}]},
        {"content": [{"type": "text", "text": "Second."}]}])

    async def drive() -> list[str]:
        editor = Editor()
        async with acp.spawn_agent_process(editor, command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=project)).session_id
            first = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[
                acp.text_block("A")]))
            await editor.streaming.wait()
            second = await conn.prompt(session_id=sid, prompt=[acp.text_block("B")])
            return [(await first).stop_reason, second.stop_reason, editor.said()]

    first, second, said = asyncio.run(asyncio.wait_for(drive(), 60))
    assert (first, second) == ("end_turn", "end_turn")
    assert said.endswith("Second.")  # B steered: no third reply was needed
    (stored,) = (tmp_path / "agent" / "sessions").glob("*/*.jsonl")
    roles = [entry["message"]["role"] for entry in map(json.loads, stored.read_text().split(
        "\n")[1:-1]) if entry["type"] == "message"]
    assert roles == ["user", "assistant", "toolResult", "user", "assistant"]


def test_a_run_that_cannot_be_stored_answers_its_prompt_with_an_error(
        tmp_path: Path, how: str, read_only_folder: Path) -> None:
    """The session file cannot be written: the prompt is not answered end_turn (the editor
    would show a turn that is gone on reload) but with the run's error, said once on
    stderr."""
    command, env = forged_acp(tmp_path, how)
    command += ["--session-dir", str(read_only_folder)]
    project = str(tmp_path / "project")
    use_script(command, tmp_path, replies=[{"content": [{"type": "text", "text": "Lost"}]}])
    stderr = tmp_path / "stderr.txt"

    async def drive() -> str:
        with stderr.open("wb") as errors:
            async with acp.spawn_agent_process(Editor(), command[0], *command[1:], env=env,
                                               cwd=project,
                                               transport_kwargs={"stderr": errors}) as (conn, _):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                sid = (await conn.new_session(cwd=project)).session_id
                try:
                    answer = await conn.prompt(session_id=sid, prompt=[acp.text_block("Hi")])
                except acp.RequestError as exc:
                    return str(exc)
                return f"answered {answer.stop_reason}"

    failed = asyncio.run(asyncio.wait_for(drive(), 60))
    assert "Cannot write the session file" in failed and "Read-only file system" in failed
    said = [line for line in stderr.read_text().splitlines() if "the run failed" in line]
    assert len(said) == 1 and "Read-only file system" in said[0]
    assert list(read_only_folder.iterdir()) == []


async def test_a_malformed_or_missing_file_answer_fails_the_tool_never_hangs(
        tmp_path: Path) -> None:
    """An editor that answers fs/read_text_file with what cannot be read (a lone surrogate),
    with no text, with an error that is not an object, or not at all: each read fails with
    a tool error saying what was wrong, and the prompt is answered."""
    command, env = forged_acp(tmp_path)
    (tmp_path / "agent").mkdir(exist_ok=True)
    (tmp_path / "agent" / "settings.json").write_text(json.dumps({"acpFsTimeoutSeconds": 0.5}))
    project = str(tmp_path / "project")
    reads = [{"type": "toolCall", "name": "read", "arguments": {"path": "notes.txt"}}] * 5
    use_script(command, tmp_path, replies=[
        {"content": reads}, {"content": [{"type": "text", "text": "Read them."}]}])
    answers = [
        b'{"jsonrpc":"2.0","id":%d,"result":{"content":"\\ud800 half a character"}}',
        b'{"jsonrpc":"2.0","id":%d,"result":42}',
        b'{"jsonrpc":"2.0","id":%d,"result":null}',
        b'{"jsonrpc":"2.0","id":%d,"error":"boom"}',
        None]  # never answered
    process = await trio.lowlevel.open_process(command, env=env, cwd=project,
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    seen: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        assert process.stdin is not None
        await process.stdin.send_all(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    with trio.fail_after(60):  # a hang guard, not a timing
        await send({"id": "i", "method": "initialize", "params": {
            "protocolVersion": 1, "clientCapabilities": {"fs": {
                "readTextFile": True, "writeTextFile": True}}}})
        await send({"id": "n", "method": "session/new", "params": {"cwd": project,
                                                                   "mcpServers": []}})
        buffer = b""
        while not any(m.get("id") == "p" for m in seen):
            data = await process.stdout.receive_some(1 << 16)
            assert data, "forged closed its output"
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                seen.append(message)
                if message.get("id") == "n":
                    await send({"id": "p", "method": "session/prompt", "params": {
                        "sessionId": message["result"]["sessionId"],
                        "prompt": [{"type": "text", "text": "read it five times"}]}})
                if message.get("method") == "fs/read_text_file":
                    answer = answers.pop(0)
                    if answer is not None:
                        await process.stdin.send_all(answer % message["id"] + b"\n")
        await process.stdin.aclose()
        await process.wait()
    (answered,) = [m for m in seen if m.get("id") == "p"]
    assert answered["result"] == {"stopReason": "end_turn"}
    failed = [m["params"]["update"] for m in seen if m.get("method") == "session/update"
              and m["params"]["update"].get("status") == "failed"]
    said = [update["content"][0]["content"]["text"] for update in failed]
    assert len(said) == 5
    assert said[0].startswith("fs/read_text_file ") and "the editor's answer could not be " \
        "read: " in said[0] and "surrogate" in said[0]
    assert said[1].endswith("the editor's answer holds no text (its result: 42)")
    assert said[2].endswith("the editor's answer holds no text (its result: None)")
    assert said[3].endswith("the editor answered with an error that is not a JSON-RPC error "
                            "object: 'boom'")
    assert said[4].endswith("the editor did not answer within 0.5 s")
    assert not [m for m in seen if m.get("error", {}).get("code") == -32700]


def test_session_load_finds_only_an_exact_id_of_its_own_folder(tmp_path: Path, how: str) -> None:
    """An unknown id, an empty one, a path, or the id of another folder's session is refused
    as --mode acp refuses it (-32602 No session <id> in <cwd>), editor's servers or not."""
    command, env = forged_acp(tmp_path, how)
    project = str(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    use_script(command, tmp_path, replies=[{"content": [{"type": "text", "text": "Hi."}]}])
    server = acp.schema.McpServerStdio(name="none", command="true", args=[], env=[])

    async def drive() -> list[tuple[int, str]]:
        refused = []
        async with acp.spawn_agent_process(Editor(), command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            other = (await conn.new_session(cwd=str(elsewhere))).session_id
            await conn.prompt(session_id=other, prompt=[acp.text_block("Hi")])
        stored = next((tmp_path / "agent" / "sessions").glob("*elsewhere*/*.jsonl"))
        async with acp.spawn_agent_process(Editor(), command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            for session_id, servers in [
                    ("0123abcd-no-such-session", []), ("", []), ("/etc/passwd", []),
                    ("../../x", []), (str(stored), [server]), (other, []), (other, [server])]:
                try:
                    await conn.load_session(cwd=project, session_id=session_id,
                                            mcp_servers=servers)
                    refused.append((0, session_id))
                except acp.RequestError as exc:
                    refused.append((exc.code, str(exc)))
        return refused

    refused = asyncio.run(asyncio.wait_for(drive(), 60))
    assert [code for code, _ in refused] == [-32602] * 7
    assert all(f" in {project}" in text and "No session" in text for _, text in refused), refused


def test_connect_acp_to_a_running_daemon_is_a_thin_byte_copier(tmp_path: Path) -> None:
    """Once a daemon runs, ``forged connect --acp`` loads only the standard library and the
    daemon runs the ACP front: an editor's session there is one of the daemon's."""
    import sys

    command, env = forged_acp(tmp_path, "connect")
    project = tmp_path / "project"
    initialize = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                             "params": {"protocolVersion": 1}})
    new = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                      "params": {"cwd": str(project), "mcpServers": []}})
    try:
        first = subprocess.run(command, input=f"{initialize}\n{new}\n".encode(),
                               capture_output=True, env=env, cwd=project, timeout=60,
                               check=False)  # its first session starts the daemon
        assert first.returncode == 0, first.stderr
        thin = subprocess.run([sys.executable, "-X", "importtime", "-m", "forged",
                               *command[1:]], input=f"{initialize}\n{new}\n".encode(),
                              capture_output=True, env=env, cwd=project, timeout=60,
                              check=False)
        status = subprocess.run([str(BIN / "forged"), "status"], capture_output=True,
                                env=env, timeout=60, check=False)
    finally:
        stop_daemon(tmp_path / "run")
    assert thin.returncode == 0, thin.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in thin.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert not {"trio", "attrs", "orjson", "forged._cli"} & imported
    answers = [json.loads(line) for line in thin.stdout.splitlines()]
    assert [answer.get("id") for answer in answers if "id" in answer] == [1, 2]
    assert answers[0]["result"]["agentInfo"]["name"] == "forged"
    session_id = next(a for a in answers if a.get("id") == 2)["result"]["sessionId"]
    assert session_id.encode() in status.stdout  # a session of the daemon


def without_bubblewrap(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """`env` with a PATH that has git but no bwrap: the sandbox cannot work."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for name in ("git", "sh", "bash"):
        found = shutil.which(name)
        assert found is not None
        (tools / name).symlink_to(found)
    return {**env, "PATH": f"{BIN}:{tools}"}


def test_without_a_sandbox_only_the_modes_that_work_are_offered(tmp_path: Path,
                                                                how: str) -> None:
    """No bubblewrap: `session/new` offers full-access and ask, the mode option too;
    `session/set_mode auto` is refused saying why; forged said so once, at start."""
    command, env = forged_acp(tmp_path, how)
    env = without_bubblewrap(tmp_path, env)
    project = str(tmp_path / "project")

    async def drive() -> tuple[Any, str]:
        async with acp.spawn_agent_process(Editor(), command[0], *command[1:], env=env,
                                           cwd=project) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            session = await conn.new_session(cwd=project)
            try:
                await conn.set_session_mode(session_id=session.session_id, mode_id="auto")
                refused = ""
            except acp.RequestError as exc:
                refused = str(exc.data or exc)
            return session, refused

    session, refused = asyncio.run(asyncio.wait_for(drive(), 60))
    assert [mode.id for mode in session.modes.available_modes] == ["full-access", "ask"]
    (option,) = [o for o in session.config_options if o.id == "mode"]
    assert [choice.value for choice in option.options] == ["full-access", "ask"]
    assert "cannot work here" in refused and "bubblewrap" in refused


def test_with_no_key_the_auth_method_says_every_way_to_one(tmp_path: Path) -> None:
    """No model has a key: `initialize`'s auth method names the environment, `forged login`,
    models.json, the scripted provider to try forged without a key, and pi's keys where pi
    has some forged does not read."""
    home = tmp_path / "home"
    (home / ".pi" / "agent").mkdir(parents=True)
    (home / ".pi" / "agent" / "auth.json").write_text("{}")
    env = {name: value for name, value in os.environ.items()
           if not name.endswith("_API_KEY") and not name.startswith(("AWS_", "GOOGLE_"))}
    env |= {"HOME": str(home), "AGENT_FORGE_DIR": str(tmp_path / "agent")}

    async def drive() -> Any:
        async with acp.spawn_agent_process(Editor(), str(BIN / "forged"), "--mode", "acp",
                                           env=env, cwd=str(tmp_path)) as (conn, _):
            return await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)

    init = asyncio.run(asyncio.wait_for(drive(), 60))
    (method,) = init.auth_methods
    said = method.description
    assert "ANTHROPIC_API_KEY" in said and "forged login PROVIDER" in said
    assert "--provider scripted --script FILE" in said
    assert f"Pi's keys and models are in {home}/.pi/agent" in said
    assert "PI_CODING_AGENT_DIR" in said
