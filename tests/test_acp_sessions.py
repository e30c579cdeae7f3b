"""The whole ACP session lifecycle and what editors call beside prompts, driven by the official
SDK through both fronts (``forged --mode acp`` and ``forged connect --acp``): resume, close,
delete, list with cwd and cursor, fork; the built-in commands; a change made by another client
of the daemon; sign-in; a terminal's output; forms; cancellation both ways. Every line forged
writes is checked against the SDK's schema (`tests.test_acp.schema_problems`)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from .acp_editor import Editor, acp
from .test_acp import forged_acp, how, lines, schema_problems, teed, use_script
from .test_process import BIN

__all__ = ["how"]  # the fixture, used by name

SLOW = {"content": [{"type": "text", "text": "slow " * 400, "chunks": 400, "delayMs": 20}]}


def said(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def checked(tmp_path: Path, *names: str) -> list[dict[str, Any]]:
    """What forged wrote in the runs `names`, each line checked against the schema."""
    written: list[dict[str, Any]] = []
    for name in names:
        out = lines(tmp_path / f"{name}.out")
        assert schema_problems(lines(tmp_path / f"{name}.in"), [dict(m) for m in out]) == []
        written += out
    return written


async def raw(conn: Any, method: str, params: dict[str, Any]) -> Any:
    """A request the SDK has no helper for."""
    return await conn._conn.send_request(method, params)


def test_sessions_are_resumed_closed_deleted_and_listed_in_every_folder(
        tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project, other = tmp_path / "project", tmp_path / "other"
    other.mkdir()
    use_script(command, tmp_path, replies=[said("One."), said("Two."), SLOW, said("Three.")])

    async def first() -> dict[str, Any]:
        editor = Editor()
        seen: dict[str, Any] = {}
        async with acp.spawn_agent_process(editor, *teed(command, tmp_path, "first"), env=env,
                                           cwd=str(project)) as (conn, _):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            seen["capabilities"] = init.agent_capabilities.session_capabilities
            a = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=a, prompt=[acp.text_block("In the project")])
            b = (await conn.new_session(cwd=str(other))).session_id
            await conn.prompt(session_id=b, prompt=[acp.text_block("In the other folder")])
            seen["everywhere"] = (await conn.list_sessions()).sessions
            seen["other"] = (await conn.list_sessions(cwd=str(other))).sessions
            slow = asyncio.ensure_future(conn.prompt(session_id=b, prompt=[
                acp.text_block("Talk slowly")]))
            await editor.streaming.wait()
            await conn.close_session(session_id=b)
            seen["closed"] = (await slow).stop_reason
            try:
                await conn.prompt(session_id=b, prompt=[acp.text_block("Still there?")])
            except acp.RequestError as exc:
                seen["after_close"] = exc.code
            if how == "connect":  # the daemon's session goes on for its other clients
                seen["live"] = daemon_sessions(tmp_path)
            await raw(conn, "session/delete", {"sessionId": a})
            seen["after_delete"] = [s.session_id for s in (await conn.list_sessions()).sessions]
            try:
                await conn.load_session(cwd=str(project), session_id=a)
            except acp.RequestError as exc:
                seen["load_deleted"] = exc.code
            seen["ids"] = (a, b)
        return seen

    async def second(b: str) -> str:
        async with acp.spawn_agent_process(Editor(), *teed(command, tmp_path, "second"),
                                           env=env, cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            await conn.resume_session(cwd=str(other), session_id=b)
            again = await conn.prompt(session_id=b, prompt=[acp.text_block("Once more")])
            return str(again.stop_reason)

    seen = asyncio.run(asyncio.wait_for(first(), 60))
    a, b = seen["ids"]
    assert seen["capabilities"].resume is not None and seen["capabilities"].close is not None
    assert seen["capabilities"].delete is not None and seen["capabilities"].fork is not None
    assert {(s.session_id, s.cwd, s.title) for s in seen["everywhere"]} == {
        (a, str(project), "In the project"), (b, str(other), "In the other folder")}
    assert [s.session_id for s in seen["other"]] == [b]
    assert seen["closed"] == "cancelled"
    assert seen["after_close"] == -32602
    if how == "connect":
        assert b in seen["live"]
    assert seen["after_delete"] == [b]
    assert seen["load_deleted"] == -32602
    assert asyncio.run(asyncio.wait_for(second(b), 60)) == "end_turn"
    written = checked(tmp_path, "first", "second")
    resumed = lines(tmp_path / "second.out")
    answer = next(i for i, m in enumerate(resumed) if m.get("id") == 1)  # resume's answer
    assert not [m for m in resumed[:answer] if m.get("method") == "session/update"]
    assert written  # (each checked above)


def daemon_sessions(tmp_path: Path) -> list[str]:
    """The ids of the daemon's live sessions, asked on its socket as any client asks."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(tmp_path / "run" / "forged" / "forged.sock"))
        sock.sendall(b'{"type": "list_sessions", "id": "l"}\n')
        reader = sock.makefile("rb")
        while True:
            message = json.loads(reader.readline())
            if message.get("id") == "l":
                return [live["sessionId"] for live in message["data"]["sessions"]]


def test_a_listing_pages_with_a_cursor_and_yields_each_session_once(
        tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    folder = tmp_path / "agent" / "sessions" / "--elsewhere--"
    folder.mkdir(parents=True)
    ids = [f"0000{n:04d}-aaaa-bbbb-cccc-dddddddddddd" for n in range(120)]
    for n, session_id in enumerate(ids):
        path = folder / f"2026-01-01T00-00-{n:02d}-000Z_{session_id}.jsonl"
        path.write_text(json.dumps({"type": "session", "version": 3, "id": session_id,
                                    "timestamp": "2026-01-01T00:00:00.000Z",
                                    "cwd": "/elsewhere"}) + "\n")
        os.utime(path, (1_700_000_000 + n // 3, 1_700_000_000 + n // 3))  # ties too

    async def drive() -> list[list[str]]:
        pages: list[list[str]] = []
        async with acp.spawn_agent_process(Editor(), *teed(command, tmp_path, "list"),
                                           env=env, cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            cursor = None
            while True:
                listed = await conn.list_sessions(cursor=cursor)
                pages.append([s.session_id for s in listed.sessions])
                cursor = listed.next_cursor
                if cursor is None:
                    return pages

    pages = asyncio.run(asyncio.wait_for(drive(), 60))
    listed = [session_id for page in pages for session_id in page]
    assert len(pages) == 3 and sorted(listed) == sorted(ids) and len(set(listed)) == 120
    assert listed[:3] == ids[-3:] and listed[-3:] == ids[:3]  # newest first, ties by id
    checked(tmp_path, "list")


def test_the_built_in_commands_answer_without_the_model(tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    use_script(command, tmp_path, replies=[
        said("Hello."), said("The summary of it all."), said("After the commands.")])

    async def drive() -> tuple[Editor, dict[str, Any]]:
        editor = Editor()
        seen: dict[str, Any] = {}
        async with acp.spawn_agent_process(editor, *teed(command, tmp_path, "commands"),
                                           env=env, cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Hi")])
            for text in ("/name Refactoring the parser", "/session", "/model",
                         "/model scripted/openai-completions", "/export", "/fork",
                         "/compact keep the names"):
                answered = await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])
                seen.setdefault("stops", []).append(answered.stop_reason)
            seen["listed"] = {s.session_id: s.title for s in (
                await conn.list_sessions(cwd=str(project))).sessions}
            last = await conn.prompt(session_id=sid, prompt=[acp.text_block("Go on")])
            seen["last"] = last.stop_reason
            seen["sid"] = sid
        return editor, seen

    editor, seen = asyncio.run(asyncio.wait_for(drive(), 60))
    text = editor.said()
    assert seen["stops"] == ["end_turn"] * 7
    assert "Named this session “Refactoring the parser”" in text
    assert "Tokens:" in text and "Cost: $" in text and "File: " in text
    assert "* scripted/anthropic-messages" in text and "Model: scripted/openai-completions" in text
    exported = text.split("Exported to ")[1].split("Forked")[0].strip()
    assert Path(exported).read_text().startswith("<!DOCTYPE html>")
    forked = text.split("Forked into session ")[1].split(":")[0]
    assert "Compacted:" in text
    assert text.endswith("After the commands.")  # the commands took no reply of the script
    titles = [u.title for u in editor.updates if type(u).__name__ == "SessionInfoUpdate"]
    assert titles == ["Refactoring the parser"]
    assert seen["listed"][seen["sid"]] == "Refactoring the parser" and forked in seen["listed"]
    options = [u for u in editor.updates if type(u).__name__ == "ConfigOptionUpdate"]
    assert options and options[-1].config_options[0].current_value == (
        "scripted/openai-completions")
    commands = next(u for u in editor.updates if type(u).__name__ == "AvailableCommandsUpdate")
    hints = {c.name: c.input.root.hint if c.input else None for c in commands.available_commands}
    assert list(hints)[:8] == ["compact", "export", "name", "session", "fork", "model", "undo",
                               "checkpoints"]
    assert hints["name"] and hints["compact"] and hints["export"] is None
    checked(tmp_path, "commands")


def test_a_change_by_another_daemon_client_reaches_the_editor(tmp_path: Path) -> None:
    command, env = forged_acp(tmp_path, "connect")
    project = tmp_path / "project"

    class Following(Editor):
        model_changed = asyncio.Event()

        async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
            await super().session_update(session_id, update)
            if type(update).__name__ == "ConfigOptionUpdate" and (
                    update.config_options[0].current_value == "scripted/openai-completions"):
                self.model_changed.set()

    async def drive() -> Editor:
        editor = Following()
        async with acp.spawn_agent_process(editor, *teed(command, tmp_path, "shared"), env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(project))).session_id
            await asyncio.to_thread(other_client, tmp_path, sid)
            await editor.model_changed.wait()
        return editor

    try:
        editor = asyncio.run(asyncio.wait_for(drive(), 60))
    finally:
        from .test_process import stop_daemon

        stop_daemon(tmp_path / "run")
    kinds = {type(u).__name__: u for u in editor.updates}
    assert kinds["SessionInfoUpdate"].title == "Named elsewhere"
    assert kinds["CurrentModeUpdate"].current_mode_id == "ask"
    assert kinds["ConfigOptionUpdate"].config_options[0].current_value == (
        "scripted/openai-completions")
    checked(tmp_path, "shared")


def other_client(tmp_path: Path, session_id: str) -> None:
    """Another client of the daemon attaches to the session and changes its name, its
    permission mode and its model."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(tmp_path / "run" / "forged" / "forged.sock"))
        reader = sock.makefile("rb")
        for n, command in enumerate([
                {"type": "attach", "sessionId": session_id},
                {"type": "set_session_name", "name": "Named elsewhere"},
                {"type": "set_permission_mode", "mode": "ask"},
                {"type": "set_model", "provider": "scripted", "modelId": "openai-completions"}]):
            sock.sendall(json.dumps({"id": f"c{n}", **command}).encode() + b"\n")
            while json.loads(reader.readline()).get("id") != f"c{n}":
                pass


def no_key_env(tmp_path: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if not name.endswith("_API_KEY") and not name.startswith(("AWS_", "GOOGLE_"))}
    return env | {"HOME": str(tmp_path / "home"), "AGENT_FORGE_DIR": str(tmp_path / "agent")}


def test_sign_in_takes_a_new_key_without_a_restart_and_logout_removes_it(
        tmp_path: Path, how: str) -> None:
    env = no_key_env(tmp_path) | {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    agent = tmp_path / "agent"
    agent.mkdir()
    front = ["--mode", "acp"]
    if how == "connect":  # the daemon first: its ACP front, and its keys
        subprocess.run([str(BIN / "forged"), "connect"], input=b"", env=env, cwd=tmp_path,
                       timeout=60, check=True, capture_output=True)
        front = ["connect", "--acp", "--no-start"]

    async def drive() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        editor = Editor()
        async with acp.spawn_agent_process(
                editor, *teed([str(BIN / "forged"), *front], tmp_path, "auth"),
                env=env, cwd=str(tmp_path)) as (conn, _):
            init = await conn.initialize(
                protocol_version=acp.PROTOCOL_VERSION,
                client_capabilities=acp.schema.ClientCapabilities(auth={"terminal": True}))
            seen["methods"] = [(m.id, getattr(m, "type", None), getattr(m, "args", None))
                               for m in init.auth_methods]
            try:
                await conn.new_session(cwd=str(tmp_path))
            except acp.RequestError as exc:
                seen["new_refused"] = exc.code
            try:
                await conn.authenticate(method_id="forged-keys")
            except acp.RequestError as exc:
                seen["auth_refused"] = exc.code
            (agent / "auth.json").write_text(json.dumps(
                {"openai": {"type": "api_key", "key": "sk-signed-in"}}))
            await conn.authenticate(method_id="forged-keys")
            seen["session"] = (await conn.new_session(cwd=str(tmp_path))).session_id
            await raw(conn, "logout", {})
        return seen

    seen = asyncio.run(asyncio.wait_for(drive(), 60))
    assert seen["methods"] == [("forged-keys", None, None),
                               ("forged-login", "terminal", ["--login"])]
    assert seen["new_refused"] == -32000 and seen["auth_refused"] == -32000
    assert seen["session"]
    assert json.loads((agent / "auth.json").read_text()) == {}
    checked(tmp_path, "auth")


def test_no_terminal_method_for_an_editor_that_runs_none(tmp_path: Path) -> None:
    async def drive() -> list[str]:
        async with acp.spawn_agent_process(Editor(), str(BIN / "forged"), "--mode", "acp",
                                           env=no_key_env(tmp_path), cwd=str(tmp_path)) as (
                conn, _):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            return [m.id for m in init.auth_methods]

    assert asyncio.run(asyncio.wait_for(drive(), 60)) == ["forged-keys"]


def test_the_terminal_method_runs_the_login_chooser(tmp_path: Path) -> None:
    """The editor runs its command with the method's args in a terminal: forged login's
    chooser, not ACP."""
    done = subprocess.run(
        [str(BIN / "forged"), "--mode", "acp", "--cwd", str(tmp_path), "--login"],
        input=b"openai\nsk-from-the-terminal\n", capture_output=True,
        env=no_key_env(tmp_path), timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert b"anthropic (an account)" in done.stderr
    saved = json.loads((tmp_path / "agent" / "auth.json").read_text())
    assert saved["openai"] == {"type": "api_key", "key": "sk-from-the-terminal"}
    assert (tmp_path / "agent" / "auth.json").stat().st_mode & 0o077 == 0


def test_a_bash_call_streams_as_the_editors_terminal(tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    use_script(command, tmp_path, replies=[
        {"content": [{"type": "toolCall", "name": "bash", "arguments": {
            "command": "for i in 1 2 3; do echo line $i; sleep 0.3; done; exit 3"}}]},
        said("Ran it.")])

    async def drive() -> Editor:
        editor = Editor()
        async with acp.spawn_agent_process(editor, *teed(command, tmp_path, "term"), env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                  client_capabilities=acp.schema.ClientCapabilities(
                                      field_meta={"terminal_output": True}))
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Run it")])
        return editor

    asyncio.run(asyncio.wait_for(drive(), 60))
    updates = [m["params"]["update"] for m in checked(tmp_path, "term")
               if m.get("method") == "session/update"]
    start = next(u for u in updates if u["sessionUpdate"] == "tool_call")
    call_id = start["toolCallId"]
    assert start["_meta"]["terminal_info"]["terminal_id"] == call_id
    assert start["content"] == [{"type": "terminal", "terminalId": call_id}]
    metas = [u["_meta"] for u in updates
             if u["sessionUpdate"] == "tool_call_update" and "_meta" in u]
    output = "".join(m["terminal_output"]["data"] for m in metas if "terminal_output" in m)
    assert output == "line 1\nline 2\nline 3\n"
    assert metas[-1]["terminal_exit"] == {"terminal_id": call_id, "exit_code": 3,
                                          "signal": None}


INPUT_PLUGIN = '''
def register(api):
    async def ask(args, ctx):
        value = await ctx.ui.input("Your name", "as on the badge")
        ctx.set_session_name(value or "nobody")

    api.register_command("badge", ask, description="Ask for a name")
'''


class FormEditor(Editor):
    """An editor that takes forms (``elicitation.form``), answering them in turn."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        super().__init__()
        self.answers = answers
        self.forms: list[Any] = []

    def capabilities(self) -> Any:
        return acp.schema.ClientCapabilities(elicitation={"form": {}})

    async def create_elicitation(self, message: str, mode: Any, **_: Any) -> Any:
        self.forms.append((message, mode))
        return self.answers.pop(0)


def test_an_input_dialog_is_the_editors_form(tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    (tmp_path / "badge.py").write_text(INPUT_PLUGIN)
    command += ["--plugin", str(tmp_path / "badge.py")]

    async def drive() -> FormEditor:
        editor = FormEditor([{"action": "accept", "content": {"value": "Ada"}},
                             {"action": "decline"}])
        async with acp.spawn_agent_process(editor, *teed(command, tmp_path, "form"), env=env,
                                           cwd=str(project), use_unstable_protocol=True) as (
                conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                  client_capabilities=editor.capabilities())
            sid = (await conn.new_session(cwd=str(project))).session_id
            for _ in range(2):
                await conn.prompt(session_id=sid, prompt=[acp.text_block("/badge")])
        return editor

    editor = asyncio.run(asyncio.wait_for(drive(), 60))
    assert [message for message, _ in editor.forms] == ["Your name"] * 2
    sent = [m for m in checked(tmp_path, "form") if m.get("method") == "elicitation/create"]
    field = sent[0]["params"]["requestedSchema"]["properties"]["value"]
    assert field == {"type": "string", "title": "Your name", "description": "as on the badge"}
    assert sent[0]["params"]["mode"] == "form"
    titles = [u.title for u in editor.updates if type(u).__name__ == "SessionInfoUpdate"]
    assert titles == ["Ada", "nobody"]


def test_cancel_withdraws_an_open_permission_request_and_cancel_request_is_honoured(
        tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    use_script(command, tmp_path, gated=True, replies=[
        {"content": [{"type": "toolCall", "name": "bash", "arguments": {"command": "true"}}]},
        SLOW, said("Never.")])  # (the cancelled run asks the model nothing more)
    editor_asked = asyncio.Event()

    class Waiting(Editor):
        async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                     **_: Any) -> Any:
            editor_asked.set()
            await asyncio.Event().wait()  # the user never answers

    async def drive() -> dict[str, Any]:
        editor = Waiting()
        seen: dict[str, Any] = {}
        async with acp.spawn_agent_process(editor, *teed(command, tmp_path, "cancel"), env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(project))).session_id
            asked = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[
                acp.text_block("Run true")]))
            await editor_asked.wait()
            await conn.cancel(session_id=sid)
            seen["asked"] = (await asked).stop_reason
            slow = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[
                acp.text_block("Talk slowly")]))
            await editor.streaming.wait()
            prompt_id = conn._conn._next_request_id - 1  # the slow prompt's
            await conn._conn.send_notification("$/cancel_request", {"requestId": prompt_id})
            seen["slow"] = (await slow).stop_reason
        return seen

    seen = asyncio.run(asyncio.wait_for(drive(), 60))
    assert seen["asked"] == "cancelled" and seen["slow"] == "cancelled"
    written = checked(tmp_path, "cancel")
    permission = next(m for m in written if m.get("method") == "session/request_permission")
    withdrawn = next(i for i, m in enumerate(written) if m.get("method") == "$/cancel_request")
    assert written[withdrawn]["params"] == {"requestId": permission["id"]}
    first_answer = next(i for i, m in enumerate(written)
                        if m.get("result", {}).get("stopReason") == "cancelled")
    assert withdrawn < first_answer


def write(path: str, content: str) -> dict[str, Any]:
    return {"content": [{"type": "toolCall", "name": "write",
                         "arguments": {"path": path, "content": content}}]}


def test_a_fork_copies_the_branch_and_rewrites_files_only_when_asked(
        tmp_path: Path, how: str) -> None:
    command, env = forged_acp(tmp_path, how)
    project = tmp_path / "project"
    use_script(command, tmp_path, replies=[write("a.txt", "v1\n"), said("Wrote."),
                                           write("a.txt", "v2\n"), said("Again.")])

    async def drive() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with acp.spawn_agent_process(Editor(), *teed(command, tmp_path, "fork"), env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await conn.new_session(cwd=str(project))).session_id
            for text in ("first", "second"):
                await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])
            copy = await raw(conn, "session/fork", {"sessionId": sid, "cwd": str(project),
                                                    "mcpServers": []})
            seen["after_copy"] = (project / "a.txt").read_text()
            (original,) = (tmp_path / "agent" / "sessions").glob(f"*/*_{sid}.jsonl")
            second = next(entry["id"] for entry in map(json.loads, original.read_text(
            ).splitlines()) if entry.get("message", {}).get("content") == [
                {"type": "text", "text": "second"}] or entry.get("message", {}).get(
                "content") == "second")
            back = await raw(conn, "session/fork", {
                "sessionId": sid, "cwd": str(project), "mcpServers": [],
                "_meta": {"forged": {"entryId": second, "restoreFiles": True}}})
            seen["after_restore"] = (project / "a.txt").read_text()
            seen["ids"] = (sid, copy["sessionId"], back["sessionId"])
            seen["listed"] = {s.session_id for s in (
                await conn.list_sessions(cwd=str(project))).sessions}
        return seen

    seen = asyncio.run(asyncio.wait_for(drive(), 60))
    sid, copy, back = seen["ids"]
    assert len({sid, copy, back}) == 3 and {sid, copy, back} <= seen["listed"]
    assert seen["after_copy"] == "v2\n" and seen["after_restore"] == "v1\n"
    sessions = tmp_path / "agent" / "sessions"

    def prompts(session_id: str) -> list[str]:
        (path,) = sessions.glob(f"*/*_{session_id}.jsonl")
        return [str(m["content"] if isinstance(m["content"], str) else m["content"][0]["text"])
                for m in (json.loads(line).get("message") for line in
                          path.read_text().splitlines()) if m and m.get("role") == "user"]

    assert prompts(copy) == ["first", "second"] and prompts(back) == ["first"]
    assert len(list(sessions.glob("*/*.jsonl"))) == 3  # the copy taken for the fork is gone
    checked(tmp_path, "fork")


def test_a_session_closed_at_once_leaves_the_daemon_serving(tmp_path: Path) -> None:
    """Closed before its commands were listed: the daemon's ACP front (and the daemon, which
    hosts it) go on."""
    command, env = forged_acp(tmp_path, "connect")
    project = str(tmp_path / "project")
    subprocess.run([part for part in command if part != "--acp"], input=b"", env=env,
                   cwd=project, timeout=60, check=True, capture_output=True)  # the daemon
    lines = [{"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": 1}}]
    try:
        for attempt in range(5):
            script = b"".join(json.dumps(line).encode() + b"\n" for line in [
                *lines, {"jsonrpc": "2.0", "id": 1, "method": "session/new",
                         "params": {"cwd": project, "mcpServers": []}},
                {"jsonrpc": "2.0", "id": 2, "method": "session/close",
                 "params": {"sessionId": "placeholder"}}])
            process = subprocess.Popen([*command, "--no-start"], env=env, cwd=project,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL)
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(script.split(b"\n")[0] + b"\n" + script.split(b"\n")[1]
                                + b"\n")
            process.stdin.flush()
            while (answer := json.loads(process.stdout.readline())).get("id") != 1:
                pass
            sid = answer["result"]["sessionId"]
            process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 2, "method":
                                            "session/close", "params": {"sessionId": sid}}
                                           ).encode() + b"\n")
            process.stdin.close()
            process.stdout.read()
            process.wait(timeout=60)
            assert daemon_sessions(tmp_path) is not None, f"the daemon died ({attempt})"
    finally:
        from .test_process import stop_daemon

        stop_daemon(tmp_path / "run")
