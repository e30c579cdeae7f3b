"""The permission modes against a scripted model that tries to escape: real ``forged``
processes, the real bubblewrap, real files and a real server on the host's loopback. Each
escape works in ``full-access`` and fails in the modes that confine it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from forged import _codec, _wire as w
from forged._process import KILL_GRACE_S
from forged._providers.scripted import Reply

from .harness import Client, Event, open_client, open_daemon
from .test_process import BIN, child_env, running, spawn, wait_gone

MODES = ("full-access", "ask", "auto", "read-only")
SECRET = "SECRET KEY MATERIAL"
MCP_SERVER = Path(__file__).with_name("mcp_server.py")


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"content": [{"type": "toolCall", "name": name, "arguments": arguments}]}


def scripted(*replies: dict[str, Any]) -> list[Reply]:
    """Replies for the in-process harness, as a script file writes them; "Done." last."""
    return [_codec.structure(reply, Reply) for reply in
            [*replies, {"content": [{"type": "text", "text": "Done."}]}]]


def places(tmp_path: Path) -> dict[str, Path]:
    """A project that is a git checkout, a home with a key, a folder outside both, and a link
    from the project to it."""
    project = tmp_path / "project"
    (project / ".git" / "hooks").mkdir(parents=True)
    (project / ".git" / "config").write_text("[core]\n")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(SECRET)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "edit-me.txt").write_text("old\n")
    (outside / "edit-link.txt").write_text("old\n")
    (project / "link").symlink_to(outside)
    (tmp_path / "agent").mkdir()
    return {"project": project, "home": home, "outside": outside, "agent": tmp_path / "agent"}


async def run_mode(tmp_path: Path, mode: str, replies: list[dict[str, Any]],
                   settings: dict[str, Any] | None = None,
                   env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``forged -p --mode json`` in the project with `mode`, the home `tmp_path/home` (and
    `env` added to its environment): the tool_execution_end events."""
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(settings or {}))
    script = tmp_path / f"script-{mode}.json"
    script.write_text(json.dumps({"replies": [*replies, {"content": [
        {"type": "text", "text": "Done."}]}]}))
    env = child_env(tmp_path / "agent") | {"HOME": str(tmp_path / "home")} | (env or {})
    with trio.fail_after(60):
        done = await trio.run_process(
            [str(BIN / "forged"), "--provider", "scripted", "--script", str(script),
             "--mode", "json", "--permission-mode", mode, "-p", "Go"],
            capture_stdout=True, capture_stderr=True, check=False, env=env,
            cwd=tmp_path / "project")
    assert done.returncode == 0, done.stderr.decode()
    events = [json.loads(line) for line in done.stdout.splitlines()]
    return [event for event in events if event["type"] == "tool_execution_end"]


def result_text(event: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in event["result"]["content"])


@pytest.mark.parametrize("mode", MODES)
async def test_escapes_work_in_full_access_only(tmp_path: Path, mode: str) -> None:
    where = places(tmp_path)
    project, home, outside = where["project"], where["home"], where["outside"]
    etc = Path(f"/etc/forged-escape-{uuid.uuid4().hex[:8]}")
    attempts = {  # what each call would make, when it gets out
        "bash ~/x": (call("bash", command="echo x > ~/x"), home / "x"),
        "bash /etc": (call("bash", command=f"echo x > {etc}"), etc),
        "bash through a link": (call("bash", command="echo x > link/bash.txt"),
                                outside / "bash.txt"),
        "write outside": (call("write", path=str(outside / "write.txt"), content="x"),
                          outside / "write.txt"),
        "write through a link": (call("write", path="link/write-link.txt", content="x"),
                                 outside / "write-link.txt"),
        "edit outside": (call("edit", path=str(outside / "edit-me.txt"), oldText="old",
                              newText="new"), None),
        "edit through a link": (call("edit", path="link/edit-link.txt", oldText="old",
                                     newText="new"), None),
        "bash a hook": (call("bash", command="mkdir -p .git/hooks && echo evil > "
                             ".git/hooks/pre-commit"), project / ".git/hooks/pre-commit"),
        "write a hook": (call("write", path=".git/hooks/post-checkout", content="evil"),
                         project / ".git/hooks/post-checkout"),
        "bash the settings": (call("bash", command="mkdir -p .agent-forge && echo '{}' > "
                                   ".agent-forge/settings.json"),
                              project / ".agent-forge/settings.json"),
        "write the settings": (call("write", path=".agent-forge/settings.json",
                                    content='{"permissionMode": "full-access"}'),
                               project / ".agent-forge/settings.json"),
        "bash reads a key": (call("bash", command="cat ~/.ssh/id_ed25519"), None),
        "read reads a key": (call("read", path="~/.ssh/id_ed25519"), None),
    }
    inside = {"bash inside": (call("bash", command="echo x > inside-bash.txt"),
                              project / "inside-bash.txt"),
              "write inside": (call("write", path="inside-write.txt", content="x"),
                               project / "inside-write.txt")}
    names = [*attempts, *inside]
    try:
        ends = await run_mode(tmp_path, mode, [step for step, _ in
                                               [*attempts.values(), *inside.values()]])
        escaped = {name for name, (_, made) in {**attempts, **inside}.items()
                   if made is not None and made.exists()}
    finally:
        etc.unlink(missing_ok=True)
    outcome = dict(zip(names, ends, strict=True))
    escaped |= {name for name, edited in (("edit outside", "edit-me.txt"),
                                          ("edit through a link", "edit-link.txt"))
                if (outside / edited).read_text() == "new\n"}
    escaped |= {name for name in ("bash reads a key", "read reads a key")
                if SECRET in result_text(outcome[name])}
    if mode == "full-access":
        expected = set(names) - ({"bash /etc"} if not os.access("/etc", os.W_OK) else set())
        assert escaped == expected
        return
    assert escaped == ({"bash inside", "write inside"} if mode == "auto" else set())
    for name in attempts:
        assert outcome[name]["isError"], name
    if mode == "ask":  # every command and write asks, and no one can answer -p
        assert "no client can answer" in result_text(outcome["bash ~/x"])
    if mode in ("auto", "read-only"):
        assert "Read-only file system" in result_text(outcome["bash ~/x"])
        assert "sandbox.denyRead" in result_text(outcome["read reads a key"])
        assert "no client can answer" in result_text(outcome["write outside"])


@pytest.mark.parametrize(("mode", "network", "reached"), [
    ("full-access", False, True), ("ask", False, False), ("auto", False, False),
    ("read-only", False, False), ("auto", True, True), ("read-only", True, True)])
async def test_the_hosts_loopback_is_reached_only_with_the_network(
        tmp_path: Path, mode: str, network: bool, reached: bool) -> None:
    places(tmp_path)
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    command = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo reached"
    with listener:  # (the kernel completes the connection: nothing needs to accept it)
        ends = await run_mode(tmp_path, mode, [call("bash", command=command)],
                              settings={"sandbox": {"network": network}})
    assert ("reached" in result_text(ends[0])) is reached, result_text(ends[0])


@pytest.mark.parametrize(("mode", "entry", "escaped"), [
    ("full-access", {}, True), ("ask", {}, True), ("auto", {}, False),
    ("read-only", {}, False), ("auto", {"sandbox": False}, True)])
async def test_an_mcp_stdio_server_starts_in_the_sandbox(
        tmp_path: Path, mode: str, entry: dict[str, Any], escaped: bool) -> None:
    """A server that writes outside the project as it starts: confined in the sandboxed
    modes, unless its entry opts out; it starts (and lists its tools) either way."""
    where = places(tmp_path)
    made = where["outside"] / "from-mcp.txt"
    launcher = f"echo x > {made}; exec {sys.executable} {MCP_SERVER} stdio notes"
    (where["agent"] / "mcp.json").write_text(json.dumps({"mcpServers": {"notes": {
        "command": "sh", "args": ["-c", launcher], **entry}}}))
    ends = await run_mode(tmp_path, mode, [call("mcp__notes__echo", text="hello")])
    assert made.exists() is escaped
    assert result_text(ends[0]) == "notes echo: hello"


# --- asking over RPC -------------------------------------------------------------------------

def escalated(command: str) -> dict[str, Any]:
    return call("bash", command=command, escalate="it writes outside the project")


async def answer_next(client: Client, start: int, value: str) -> tuple[Event, int]:
    """Answer the next permission request after output line `start` with `value`."""
    request = await client.wait_for(lambda e: e.get("type") == "extension_ui_request",
                                    start=start)
    await client.send({"type": "extension_ui_response", "id": request["id"], "value": value})
    return request, client.output.index(request) + 1


async def test_allow_once_allow_for_the_session_and_deny(tmp_path: Path) -> None:
    """In ``ask``: "for this session" covers the same command text again (an escalation is
    never allowed for the session: tests/test_escapes.py)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    append = f"echo x >> {outside / 'log'}"
    steps = [call("bash", command=append)] * 3 + [
        call("bash", command=f"touch {outside / 'denied'}")]
    async with open_client(tmp_path, scripted(*steps)) as client:
        assert (await client.request({"type": "set_permission_mode", "mode": "ask"}))[
            "success"]
        state = await client.request({"type": "get_state"})
        assert state["data"]["permissionMode"] == "ask"
        await client.send({"type": "prompt", "message": "Go"})
        first, start = await answer_next(client, 0, "Allow once")
        second, start = await answer_next(client, start, "Allow for this session")
        denied, _ = await answer_next(client, start, "Deny")  # the third was not asked
        await client.settled()
    assert first["method"] == "select" and first["options"] == [
        "Allow once", "Allow for this session", "Deny"]
    assert append in first["title"]
    assert second["title"] == first["title"] and "denied" in denied["title"]
    assert len(client.events("extension_ui_request")) == 3
    assert (outside / "log").read_text() == "x\nx\nx\n" and not (outside / "denied").exists()
    ends = client.events("tool_execution_end")
    assert [end["isError"] for end in ends] == [False, False, False, True]
    assert "the user denied it" in result_text(ends[-1])


async def test_abort_frees_a_waiting_permission_request(tmp_path: Path) -> None:
    async with open_client(tmp_path, scripted(escalated("true"))) as client:
        await client.request({"type": "set_permission_mode", "mode": "read-only"})
        await client.send({"type": "prompt", "message": "Go"})
        await client.wait_for(lambda e: e.get("type") == "extension_ui_request")
        await client.request({"type": "abort"})
        await client.settled()
    (end,) = client.events("tool_execution_end")
    assert end["isError"] and client.events("agent_end")


async def test_a_mode_the_session_does_not_know_is_refused(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        refused = await client.request({"type": "set_permission_mode", "mode": "yolo"})
        state = await client.request({"type": "get_state"})
    assert not refused["success"] and "yolo" in refused["error"]
    assert state["data"]["permissionMode"] == "full-access"


async def started(name: str, count: int) -> dict[int, bytes]:
    """The `count` processes named `name` once they all run, each with its first argument."""
    with trio.fail_after(10):
        while True:
            found = await trio.run_process(["pgrep", "-x", name], capture_stdout=True,
                                           check=False)
            pids = {int(pid): Path(f"/proc/{pid.decode()}/cmdline").read_bytes().split(
                b"\0")[1] for pid in found.stdout.split()}
            if len(pids) >= count:
                return pids
            await trio.sleep(0.001)


@pytest.mark.parametrize("mode", ["full-access", "auto", "read-only"])
async def test_abort_mid_command_leaves_no_process(tmp_path: Path, mode: str) -> None:
    """A command forks one child in its process group and one in a session of its own:
    abort ends both in the sandbox (its PID namespace), only the first in full-access."""
    name = f"fpm{os.getpid() % 10000}{MODES.index(mode)}"
    sleeper = tmp_path / name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    command = f"{sleeper} 61 & setsid {sleeper} 62 & echo started; wait"
    async with open_client(tmp_path, scripted(call("bash", command=command))) as client:
        await client.request({"type": "set_permission_mode", "mode": mode})
        await client.send({"type": "prompt", "message": "Go"})
        await client.wait_for(lambda e: e.get("type") == "tool_execution_update"
                              and "started" in result_text({"result": e["partialResult"]}))
        pids = await started(name, 2)  # (forked before "started", not yet run)
        assert sorted(pids.values()) == [b"61", b"62"]
        await client.request({"type": "abort"})
        await client.settled()
    try:
        with trio.fail_after(10):
            for pid, seconds in pids.items():
                if mode != "full-access" or seconds == b"61":
                    await wait_gone(pid)
        survivors = [seconds for pid, seconds in pids.items() if running(pid)]
        assert survivors == ([b"62"] if mode == "full-access" else [])
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_an_abort_kills_at_once_what_a_command_left_ignoring_sigterm(
        tmp_path: Path) -> None:
    """A command whose shell has ended, leaving a child that ignores SIGTERM (its output is
    still being read): an abort ends the run at once, not after the grace SIGTERM is given,
    and nothing of the command runs when the session settles."""
    name = f"fpt{os.getpid() % 10000}"
    sleeper = tmp_path / name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    # `$$` is the shell forged started: the child speaks once forged has reaped it.
    command = (f"(trap '' TERM; while kill -0 $$ 2>/dev/null; do sleep 0.01; done; "
               f"echo started; exec {sleeper} 63) &")
    async with open_client(tmp_path, scripted(call("bash", command=command))) as client:
        await client.send({"type": "prompt", "message": "Go"})
        await client.wait_for(lambda e: e.get("type") == "tool_execution_update"
                              and "started" in result_text({"result": e["partialResult"]}))
        (pid,) = await started(name, 1)
        try:
            await client.send({"type": "abort"})
            with trio.fail_after(KILL_GRACE_S * 0.75):  # the grace is not waited out
                await client.wait_for(lambda e: e.get("type") == "agent_end")
            await client.settled()
            assert not running(pid)  # at agent_settled, without waiting for it
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_an_aborted_runs_closing_events_reach_the_client_in_one_write(
        tmp_path: Path) -> None:
    """Over stdio's pipes (in packet mode here: a read takes one write), an abort during a
    command ends its call, its turn and its run in one write: a client wakes once for them,
    not once a line while forged is still busy closing. (The command's shell has ended, its
    child holds the output: nothing is waited for, whatever this machine's speed; where
    forged must wait for a shell, what it closed goes out first, then ``agent_end``.)"""
    name = f"fpw{os.getpid() % 10000}"
    sleeper = tmp_path / name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    async with open_client(tmp_path, scripted(call("bash", command=f"{sleeper} 64 & echo on")),
                           packets=True) as client:
        await client.send({"type": "prompt", "message": "Go"})
        await client.wait_for(lambda e: e.get("type") == "tool_execution_update")
        (pid,) = await started(name, 1)
        try:
            await client.request({"type": "abort"})
            await client.settled()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    (closing,) = [read for read in client.reads if b'"tool_execution_end"' in read]
    kinds = [orjson.loads(line)["type"] for line in closing.splitlines()]
    assert kinds[kinds.index("tool_execution_end"):kinds.index("agent_end") + 1] == [
        "tool_execution_end", "message_start", "message_end", "turn_end", "agent_end"]


async def test_the_daemon_sends_a_waiting_request_to_a_client_that_attaches(
        tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    replies = scripted(escalated(f"touch {outside / 'made'}"))
    async with open_daemon(tmp_path, replies) as daemon:
        async with daemon.client() as first:
            await first.new_session()
            session_id = (await first.get_state()).session_id
            await first.run("set_permission_mode", mode="auto")
            await first.prompt("Go")
            asked = (await first.next_event(
                lambda e: e.type == "extension_ui_request")).event
        async with daemon.client() as second:  # the first has gone: the request waits
            await second.attach(session_id)
            again = (await second.next_event(
                lambda e: e.type == "extension_ui_request")).event
            assert isinstance(asked, w.ExtensionUiRequest)
            assert isinstance(again, w.ExtensionUiRequest) and again.id == asked.id
            await second.answer_dialog(again.id, value="Allow once")
            await second.next_event(lambda e: e.type == "agent_settled")
    assert (outside / "made").exists()


@pytest.mark.parametrize("bwrap", ["missing", "refused"])
async def test_a_sandboxed_mode_fails_closed_without_a_working_bubblewrap(
        tmp_path: Path, bwrap: str) -> None:
    """No bwrap on PATH, or one that cannot make namespaces: the command is refused with
    why and what to do, and nothing runs unconfined instead."""
    where = places(tmp_path)
    tools = tmp_path / "bin"
    tools.mkdir()
    if bwrap == "refused":
        fake = tools / "bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\n"
                        "exit 1\n")
        fake.chmod(0o755)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [
        call("bash", command="echo x > ran.txt"), {"content": [{"type": "text", "text": "ok"}]}]}))
    env = child_env(where["agent"]) | {"HOME": str(where["home"]), "PATH": str(tools)}
    with trio.fail_after(60):
        done = await trio.run_process(
            [str(BIN / "forged"), "--provider", "scripted", "--script", str(script),
             "--mode", "json", "--permission-mode", "auto", "-p", "Go"],
            capture_stdout=True, capture_stderr=True, check=False, env=env,
            cwd=where["project"])
    (end,) = [event for event in map(json.loads, done.stdout.splitlines())
              if event["type"] == "tool_execution_end"]
    said = result_text(end)
    assert end["isError"] and "Nothing ran unconfined" in said
    assert ("install the bubblewrap package" in said if bwrap == "missing"
            else "cannot make the sandbox's namespaces" in said and "AppArmor" in said)
    assert not (where["project"] / "ran.txt").exists()


@pytest.mark.parametrize(("mine", "project", "chosen"), [
    (None, "auto", "auto"), ("full-access", "read-only", "read-only"),
    ("auto", "read-only", "read-only"), ("auto", "full-access", "auto"),
    ("ask", "auto", "ask"), ("read-only", "ask", "read-only"), ("auto", None, "auto"),
    ("yolo", None, "full-access")])
def test_a_trusted_project_may_lower_the_mode_never_raise_it(
        tmp_path: Path, mine: str | None, project: str | None, chosen: str) -> None:
    from forged._settings import Settings
    from forged._tools.guard import starting_mode

    agent, cwd = tmp_path / "agent", tmp_path / "project"
    (cwd / ".agent-forge").mkdir(parents=True)
    agent.mkdir()
    (agent / "settings.json").write_text(json.dumps(
        {"trustedProjects": [str(cwd)], **({"permissionMode": mine} if mine else {})}))
    (cwd / ".agent-forge" / "settings.json").write_text(json.dumps(
        {"permissionMode": project} if project else {}))
    assert starting_mode(None, Settings(agent, cwd)) == chosen
    assert starting_mode("read-only", Settings(agent, cwd)) == "read-only"


async def test_print_mode_says_a_denial_on_one_line(tmp_path: Path) -> None:
    """``-p`` in ``ask``: nobody can answer, and stderr says what was denied on one line,
    not a title's line breaks as ``\\n``."""
    places(tmp_path)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [call("bash", command="echo hi"), {
        "content": [{"type": "text", "text": "Done."}]}]}))
    with trio.fail_after(60):
        done = await trio.run_process(
            [str(BIN / "forged"), "--provider", "scripted", "--script", str(script),
             "--permission-mode", "ask", "-p", "Go"], capture_stdout=True,
            capture_stderr=True, check=False, env=child_env(tmp_path / "agent"),
            cwd=tmp_path / "project")
    said = done.stderr.decode()
    assert ("no client can answer a permission request here, so it is denied: Allow the "
            "model to run this command? echo hi\n") in said, said
    assert "\\n" not in said


async def test_the_permission_mode_is_kept_with_the_session(tmp_path: Path) -> None:
    """`set_permission_mode ask`, then the session continued (`-c`) in a new process: it is
    still in `ask`, as its model is; `--permission-mode` given again wins (and is what the
    session keeps from then on); a session switched to takes the mode it recorded."""
    project, agent_dir = tmp_path / "project", tmp_path / "agent"
    project.mkdir()
    agent_dir.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [{"content": [{"type": "text", "text": "Hi."}]}]
                                  * 4}))
    base = ["--provider", "scripted", "--script", str(script)]

    async def mode_of(*args: str, commands: tuple[dict[str, Any], ...] = ()) -> str:
        child = await spawn([*base, *args], project, child_env(agent_dir))
        try:
            with trio.fail_after(30):
                for command in commands:
                    await child.send(command)
                    if command["type"] == "prompt":
                        await child.read_until("agent_settled")
                    else:
                        await child.read_until("response", id=command["id"])
                await child.send({"id": "state", "type": "get_state"})
                state = await child.read_until("response", id="state")
        finally:
            assert child.process.stdin is not None
            await child.process.stdin.aclose()
            await child.process.wait()
        return str(state["data"]["permissionMode"])

    assert await mode_of(commands=(
        {"id": "m", "type": "set_permission_mode", "mode": "ask"},
        {"id": "p", "type": "prompt", "message": "hello"})) == "ask"
    assert await mode_of("-c") == "ask"
    assert await mode_of("-c", "--permission-mode", "auto") == "auto"
    assert await mode_of("-c") == "auto"
    (first,) = (agent_dir / "sessions").rglob("*.jsonl")
    assert await mode_of("--permission-mode", "read-only", commands=(
        {"id": "p", "type": "prompt", "message": "another"},)) == "read-only"
    assert await mode_of(commands=(
        {"id": "s", "type": "switch_session", "sessionPath": str(first)},)) == "auto"


@pytest.mark.parametrize("mode", ["auto", "ask"])
def test_p_says_at_start_what_its_mode_cannot_do(tmp_path: Path, mode: str) -> None:
    """`-p` in auto without bubblewrap: said once, before the run, that the sandboxed modes
    cannot work here (and the command is refused, nothing unconfined); in ask: that nobody
    can answer, so what it would ask about is refused."""
    from .test_acp import without_bubblewrap

    (tmp_path / "agent").mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [call("bash", command="echo ran > ran.txt"),
                                              {"content": [{"type": "text", "text": "Ok."}]}]}))
    env = without_bubblewrap(tmp_path, child_env(tmp_path / "agent"))
    done = subprocess.run([str(BIN / "forged"), "-p", "--provider", "scripted", "--script",
                           str(script), "--cwd", str(tmp_path), "--permission-mode", mode,
                           "go"], capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    said = done.stderr.splitlines()
    expected = ("forged: the auto and read-only permission modes cannot work here: the "
                "sandbox needs bubblewrap" if mode == "auto" else
                "forged: the ask permission mode asks before every command and file change, "
                "and under -p nobody can answer: each is refused")
    assert said[0].startswith(expected), done.stderr
    assert sum(line.startswith(expected) for line in said) == 1
    assert not (tmp_path / "ran.txt").exists()
