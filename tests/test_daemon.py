"""`forged serve`: sessions that outlive their clients, shared by several, over the Unix
socket and WebSocket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import hypothesis
import hypothesis.strategies as st
import orjson
import pytest
import trio
import trio.testing

from forged import _wire as w
from forged._catalogue import ProviderConfig
from forged._errors import ConfigError
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall
from forged._transports.websocket import MAX_UNAUTHENTICATED
from forged.client import Client, Received

from .harness import Daemon, open_daemon

ASKING_PLUGIN = '''
def register(api):
    async def ask(args, ctx):
        ctx.ui.notify(f"answer: {await ctx.ui.confirm('Go on?', args)!r}")
    api.register_command("ask", ask)
'''


PWD = Reply(content=[ScriptToolCall(name="bash", id="pwd", arguments={"command": "pwd"})],
            delay_ms=300)
DONE = Reply(content=[ScriptText(text="done")])


def text(content: list[w.UserContent] | list[w.AssistantContent]) -> str:
    return "".join(block.text for block in content if isinstance(block, w.TextContent))


async def until_sessions(client: Client, done: Callable[[list[w.LiveSessionInfo]], bool],
                         timeout_s: float = 10) -> list[w.LiveSessionInfo]:
    """The daemon's live sessions, asked again (as a client can only ask) until `done`
    accepts them; a hang guard of `timeout_s`."""
    with trio.fail_after(timeout_s):
        while not done(sessions := (await client.list_sessions()).sessions):  # noqa: ASYNC110
            await trio.sleep(0.01)
    return sessions


async def collect_until_settled(client: Client) -> list[Received]:
    events: list[Received] = []
    async for event in client.events:
        events.append(event)
        if event.type == "agent_settled":
            return events
    raise AssertionError("connection closed")


async def test_two_clients_drive_two_sessions_in_different_cwds_at_once(tmp_path: Path) -> None:
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    async with (open_daemon(tmp_path, [PWD, PWD, DONE, DONE]) as daemon,
            daemon.client() as first, daemon.client() as second):
        opened = [await client.new_session(cwd=str(folder))
                  for client, folder in zip((first, second), folders, strict=True)]
        assert [result.cancelled for result in opened] == [False] * 2
        for client in (first, second):
            await client.prompt("where am I?")
        listed = await first.list_sessions()
        assert sorted(s.state for s in listed.sessions) == ["streaming", "streaming"]
        results: dict[int, list[Received]] = {}

        async def gather(index: int, client: Client) -> None:
            results[index] = await collect_until_settled(client)

        async with trio.open_nursery() as nursery:
            for index, client in enumerate((first, second)):
                nursery.start_soon(gather, index, client)
        states = [await client.get_state() for client in (first, second)]
    for index, folder in enumerate(folders):
        events = results[index]
        assert {e.session_id for e in events} == {states[index].session_id}
        seqs = [e.seq or 0 for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # none lost or reordered
        (end,) = [e.event for e in events if isinstance(e.event, w.ToolExecutionEnd)]
        assert text(end.result.content) == f"{folder}\n"
    assert states[0].session_id != states[1].session_id


async def test_reattaching_with_since_seq_replays_exactly_the_missed_events(
        tmp_path: Path) -> None:
    slow = Reply(content=[ScriptText(text="word " * 40, chunks=40, delay_ms=20)])
    async with open_daemon(tmp_path, [slow]) as daemon:
        async with daemon.client() as watcher, daemon.client() as leaver:
            await leaver.new_session()
            session_id = (await leaver.get_state()).session_id
            await watcher.attach(session_id)
            await leaver.prompt("talk")
            seen = [await leaver.next_event(lambda e: e.type == "message_update")]
            await leaver.detach()
            last_seq = seen[-1].seq or 0
            everything = await collect_until_settled(watcher)
            listed = await watcher.list_sessions()
            assert [s.clients for s in listed.sessions] == [1]  # the leaver is gone
        async with daemon.client() as returning:
            result = await returning.attach(session_id, since_seq=last_seq)
            replayed = [await returning.next_event() for _ in range(result.replayed)]
            state = await returning.get_state()
    missed = [e for e in everything if (e.seq or 0) > last_seq]
    assert [(e.seq, e.type) for e in replayed] == [(e.seq, e.type) for e in missed]
    assert replayed[-1].type == "agent_settled"
    assert (result.session_id, result.seq, result.replayed, result.missed) == (
        session_id, missed[-1].seq, len(missed), False)
    assert state.session_id == session_id and state.is_streaming is False


async def test_a_dialog_goes_to_every_client_and_the_first_answer_wins(tmp_path: Path) -> None:
    (tmp_path / "asking.py").write_text(ASKING_PLUGIN)
    async with (open_daemon(tmp_path, plugins=[tmp_path / "asking.py"]) as daemon,
            daemon.client() as asker, daemon.client() as answerer):
        await asker.new_session()
        await answerer.attach((await asker.get_state()).session_id)
        async with trio.open_nursery() as nursery:
            asked: list[Any] = []

            async def ask() -> None:
                asked.append(await asker.prompt("/ask deploy?"))

            nursery.start_soon(ask)
            request = (await answerer.next_event(
                lambda e: e.type == "extension_ui_request")).event
            mirrored = (await asker.next_event(
                lambda e: e.type == "extension_ui_request")).event
            assert isinstance(request, w.ExtensionUiRequest)
            assert isinstance(mirrored, w.ExtensionUiRequest) and mirrored.id == request.id
            await answerer.answer_dialog(request.id, confirmed=True)
            resolved = (await asker.next_event(
                lambda e: e.type == "extension_ui_resolved")).event
            await asker.answer_dialog(request.id, confirmed=False)  # too late
            notify = (await asker.next_event(
                lambda e: getattr(e.event, "method", None) == "notify")).event
            settled = (await answerer.next_event(  # the one that answered hears it too
                lambda e: e.type == "extension_ui_resolved")).event
    assert isinstance(resolved, w.ExtensionUiResolved) and resolved.id == request.id
    assert isinstance(settled, w.ExtensionUiResolved) and settled.id == request.id
    assert isinstance(notify, w.ExtensionUiRequest) and notify.message == "answer: True"
    assert [accepted.disposition for accepted in asked] == ["handled"]


async def test_a_client_that_stops_reading_is_cut_off_without_slowing_the_other(
        tmp_path: Path) -> None:
    flood = Reply(content=[ScriptText(text="x" * 20000, chunks=20000)])
    async with (open_daemon(tmp_path, [flood], queue_limit_bytes=1024 * 1024) as daemon,
            daemon.client() as reader):
        await reader.new_session()
        session_id = (await reader.get_state()).session_id
        stalled = await trio.open_unix_socket(str(daemon.socket_path))
        await stalled.send_all(b'{"type":"attach","sessionId":"%s","id":"s"}\n'
                               % session_id.encode())
        await trio.testing.wait_all_tasks_blocked()  # attached; from now on it reads nothing
        with trio.fail_after(20):
            events = await reader.prompt_and_wait("flood")
        assert sum(e.type == "message_update" for e in events) >= 20000
        listed = await reader.list_sessions()
        assert [s.clients for s in listed.sessions] == [1]  # the stalled one is out
        with trio.fail_after(10):
            while await stalled.receive_some(1 << 20):
                pass  # what was queued before the cut, then EOF
        await stalled.aclose()


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("python3", path="/usr/bin"),
                    reason="needs root to run a child as nobody, and /usr/bin/python3")
async def test_a_connection_from_another_user_is_refused(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        socket_path = folder / "forged.sock"
        async with open_daemon(tmp_path, socket_path=socket_path) as daemon:
            os.chmod(folder, 0o755)  # file modes opened up by mistake: the uid check holds
            os.chmod(socket_path, 0o666)
            code = ("import socket; s = socket.socket(socket.AF_UNIX); "
                    f"s.connect({str(socket_path)!r}); "
                    "print(s.makefile('rb').readline().decode())")
            result = await trio.run_process(["/usr/bin/python3", "-c", code], user="nobody",
                                            capture_stdout=True, capture_stderr=True, check=False)
            assert '"success":false' in result.stdout.decode()
            assert "Permission denied: uid 65534" in result.stdout.decode()
            assert daemon.hub.live == []  # nothing was started for it
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- WebSocket ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def ws_status(port: int, headers: dict[str, str], query: str = "") -> int:
    """The HTTP status a WebSocket upgrade request gets."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    lines = [f"GET /{query} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             "Sec-WebSocket-Version: 13", *(f"{k}: {v}" for k, v in headers.items())]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
    response = b""
    while b"\r\n" not in response:
        response += await stream.receive_some(4096)
    await stream.aclose()
    return int(response.split()[1])


async def test_websocket_needs_the_token_and_refuses_foreign_origins(tmp_path: Path) -> None:
    port = free_port()
    async with open_daemon(tmp_path, [Reply(content=[ScriptText(text="hi")])],
                           ws=("127.0.0.1", port),
                           ws_allow_origins=["https://ide.example"]) as daemon:
        token_file = daemon.runtime / "forged" / "ws-token"
        token = token_file.read_text().strip()
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert await ws_status(port, {}) == 401
        assert await ws_status(port, {"Authorization": "Bearer wrong"}) == 401
        assert await ws_status(port, {}, "?token=wrong") == 401
        assert await ws_status(port, {"Authorization": f"Bearer {token}",
                                      "Origin": "https://evil.example"}) == 403
        assert await ws_status(port, {"Authorization": f"Bearer {token}",
                                      "Origin": "https://ide.example"}) == 101
        assert await ws_status(port, {}, f"?token={token}") == 101
        async with Client.open_websocket(f"ws://127.0.0.1:{port}/", token) as client:
            events = await client.prompt_and_wait("hello")
            assert events[-1].type == "agent_settled"
            assert await client.get_last_assistant_text() == "hi"


async def test_idle_unauthenticated_connections_cannot_lock_the_owner_out(
        tmp_path: Path) -> None:
    """A crowd of TCP connections that never handshake holds at most MAX_UNAUTHENTICATED of
    the daemon's descriptors; the Unix socket and a client with the token are served."""
    port = free_port()
    descriptors = Path("/proc/self/fd")
    async with open_daemon(tmp_path, ws=("127.0.0.1", port)) as daemon:
        token = (daemon.runtime / "forged" / "ws-token").read_text().strip()
        before = len(list(descriptors.iterdir()))
        crowd = [await trio.open_tcp_stream("127.0.0.1", port)
                 for _ in range(MAX_UNAUTHENTICATED + 40)]  # within the listen backlog
        await trio.testing.wait_all_tasks_blocked()
        held = len(list(descriptors.iterdir())) - before - len(crowd)  # the daemon's side
        async with daemon.client() as owner:
            state = await owner.get_state()
        for stream in crowd:
            await stream.aclose()
        async with Client.open_websocket(f"ws://127.0.0.1:{port}/", token) as client:
            remote = await client.get_state()
    assert held <= MAX_UNAUTHENTICATED
    assert state.session_id and remote.session_id


async def test_websocket_refuses_a_remote_address_unless_allowed(tmp_path: Path) -> None:
    from .test_process import BIN, child_env

    env = {**child_env(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    with trio.fail_after(20):
        result = await trio.run_process(
            [str(BIN / "forged"), "serve", "--ws", f"0.0.0.0:{free_port()}"],
            capture_stdout=True, capture_stderr=True, check=False, env=env)
    assert result.returncode == 1
    assert b"not a loopback address; pass --ws-allow-remote" in result.stderr
    assert not (tmp_path / "run" / "forged" / "forged.sock").exists()


async def test_a_session_left_idle_with_no_client_is_unloaded(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """Idle unloading is a deadline from when the session was last left alone, not a poll
    (on the mock clock: an hour attached changes nothing; it goes 30 s after the client
    leaves, to the hundredth of a second)."""
    async with open_daemon(tmp_path, [DONE], idle_unload_s=30) as daemon, \
            daemon.client() as client:
        await client.new_session()
        await client.prompt_and_wait("hello")
        session_id = (await client.get_state()).session_id
        await trio.sleep(3600.5)
        assert [s.session_id for s in (await client.list_sessions()).sessions] == [
            session_id]  # attached: it stays
        await client.detach()
        left = trio.current_time()
        await trio.sleep_until(left + 29.99)
        assert len((await client.list_sessions()).sessions) == 1  # not yet
        await trio.sleep_until(left + 30.01)
        assert (await client.list_sessions()).sessions == []
        stored = (await client.list_sessions()).stored
        assert [s.session_id for s in stored] == [session_id]
        resumed = await client.attach(session_id)  # back from its file
        assert resumed.session_id == session_id
        assert await client.get_last_assistant_text() == "done"


async def test_forged_status_reports_the_daemon_its_sessions_and_clients(
        tmp_path: Path) -> None:
    from .test_process import BIN, child_env

    async def status() -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process(
            [str(BIN / "forged"), "status", "--socket", str(tmp_path / "run" / "f.sock")],
            capture_stdout=True, capture_stderr=True, check=False, env=child_env(tmp_path))

    assert (await status()).returncode == 1  # none runs yet
    async with open_daemon(tmp_path, socket_path=tmp_path / "run" / "f.sock") as daemon, \
            daemon.client() as client:
        await client.new_session()
        await client.set_session_name("review")
        session_id = (await client.get_state()).session_id
        result = await status()
    assert result.returncode == 0
    lines = result.stdout.decode().splitlines()
    assert lines[0] == f"forged daemon on {tmp_path / 'run' / 'f.sock'}: 1 live session(s)"
    assert lines[1].startswith(f"  pid {os.getpid()}, log: ")  # (this test runs the daemon)
    assert lines[2].split() == [session_id, "'review'", "idle", "1", "client(s)",
                                str(tmp_path / "project")]


async def test_a_provider_slow_to_answer_one_session_holds_up_no_other(
        tmp_path: Path) -> None:
    """Requests are built one at a time, but a request waiting for the provider's answer
    does not keep the next session's request from going out."""
    async with (open_daemon(tmp_path, [Reply(silent=True), DONE]) as daemon,
            daemon.client() as first, daemon.client() as second):
        await first.new_session()
        await first.prompt("nobody answers this one")
        with trio.fail_after(10):
            await daemon.server.wait_for_requests(1)
            await second.new_session()
            events = await second.prompt_and_wait("this one is answered")
        await first.abort()
    assert events[-1].type == "agent_settled"
    end = next(e.event for e in events if isinstance(e.event, w.MessageEnd)
               and isinstance(e.event.message, w.AssistantMessage))
    assert isinstance(end, w.MessageEnd) and isinstance(end.message, w.AssistantMessage)
    assert [(c.type, getattr(c, "text", None)) for c in end.message.content] == [
        ("text", "done")]


SLOW_PLUGIN = '''
import trio

def register(api):
    async def slow(args, ctx):
        await trio.sleep(0.4)
    api.register_command("slow", slow)
'''


async def test_a_client_leaving_while_commands_overlap_is_let_go(tmp_path: Path) -> None:
    """A client whose input ended waits for its session's plugin commands, then closes:
    also when another client starts one while it waits."""
    (tmp_path / "slow.py").write_text(SLOW_PLUGIN)
    async with (open_daemon(tmp_path, plugins=[tmp_path / "slow.py"]) as daemon,
            daemon.client() as staying):
        leaving = await trio.open_unix_socket(str(daemon.socket_path))
        await leaving.send_all(b'{"id":"s","type":"get_state"}\n')
        received = b""
        while b'"id":"s"' not in received:
            received += await leaving.receive_some()
        session_id = orjson.loads(received.split(b"\n")[0])["data"]["sessionId"]
        await leaving.send_all(b'{"id":"p","type":"prompt","message":"/slow"}\n')
        await trio.testing.wait_all_tasks_blocked()  # its /slow runs
        await leaving.send_eof()  # it now waits for its /slow
        await trio.testing.wait_all_tasks_blocked()
        await staying.attach(session_id)
        with trio.fail_after(5):
            assert (await staying.prompt("/slow")).disposition == "handled"
            while data := await leaving.receive_some():
                received += data
    assert b'"id":"p"' in received


def error_text(response: dict[str, object]) -> str:
    """A response's error message."""
    error = response["error"]
    assert isinstance(error, str), response
    return error


async def test_no_command_of_one_client_takes_the_daemon_down(tmp_path: Path) -> None:
    """Ids are never patterns, a cwd must be an absolute folder, and a command that fails in
    any way is that command's error; the other client is served throughout."""
    (tmp_path / "a-file").write_text("not a folder")
    async with (open_daemon(tmp_path) as daemon, daemon.client() as hostile,
                daemon.client() as bystander):
        before = await bystander.get_state()
        refused = [await hostile.request("attach", session_id="**"),
                   await hostile.request("attach", session_id="../x"),
                   await hostile.request("new_session", cwd="/tmp/a\0b"),
                   await hostile.request("new_session", cwd="~nosuchuser-forged/x"),
                   await hostile.request("new_session", cwd="relative/path"),
                   await hostile.request("new_session", cwd=str(tmp_path / "missing")),
                   await hostile.request("new_session", cwd=str(tmp_path / "a-file")),
                   await hostile.request("list_sessions", cwd="/tmp/a\0b")]
        stream = await trio.open_unix_socket(str(daemon.socket_path))
        async with stream:
            await stream.send_all(b"[" * 1000 + b"\n" + b"[" * 1025 + b"]" * 1025 + b"\n")
            answers = b""
            while answers.count(b"\n") < 2:
                answers += await stream.receive_some()
        after = await bystander.get_state()
        still = await hostile.get_state()
    assert [r["success"] for r in refused] == [False] * len(refused)
    assert [r["error"] for r in refused[:2]] == ["No session **", "No session ../x"]
    assert "Invalid cwd" in error_text(refused[2]) and "Invalid cwd" in error_text(refused[3])
    assert refused[4]["error"] == "cwd must be an absolute path: relative/path"
    assert error_text(refused[5]).startswith("cwd is not a directory")
    assert error_text(refused[6]).startswith("cwd is not a directory")
    assert "Invalid cwd" in error_text(refused[7])
    assert [orjson.loads(line)["command"] for line in answers.splitlines()] == ["parse"] * 2
    assert after.session_id == before.session_id and still.session_id


async def test_live_sessions_are_bounded_and_dropped_ones_make_room(tmp_path: Path) -> None:
    async with open_daemon(tmp_path, [DONE], max_live_sessions=2) as daemon:
        async with daemon.client() as first, daemon.client() as second:
            await first.new_session()
            await first.prompt_and_wait("keep me")
            kept = (await first.get_state()).session_id
            await second.new_session()
            await second.get_state()  # the first command that needs it opens it
            async with daemon.client() as third:
                refused = await third.request("new_session")
        async with daemon.client() as fourth:  # the first two left: an idle one makes room
            await until_sessions(  # once the daemon has seen them go
                fourth, lambda sessions: not any(s.clients for s in sessions))
            await fourth.new_session()
            fresh = (await fourth.get_state()).session_id
            listed = await fourth.list_sessions()
    assert refused["success"] is False
    assert refused["error"] == "Too many live sessions (2, all in use); end one first"
    live = [s.session_id for s in listed.sessions]
    assert fresh in live and kept in live and len(live) == 2  # the empty one went first


async def test_one_large_message_does_not_cut_off_a_client_that_reads(tmp_path: Path) -> None:
    """A 9 MiB reply appears four times (message_end, turn_end, agent_end...): more than the
    client's 16 MiB queue at once, yet the client reads, so it is served."""
    big = Reply(content=[ScriptText(text="y" * (9 << 20))])
    async with open_daemon(tmp_path, [big]) as daemon, daemon.client() as client:
        events = await client.prompt_and_wait("a big one")
    ends = [e for e in events if e.type in ("message_end", "turn_end", "agent_end")]
    assert len(ends) == 4 and events[-1].type == "agent_settled"
    reply = ends[1].event
    assert isinstance(reply, w.MessageEnd) and isinstance(reply.message, w.AssistantMessage)
    assert len(text(reply.message.content)) == 9 << 20


async def connect_to(daemon: Daemon, tmp_path: Path, first: bytes) -> trio.Process:
    """``forged connect --no-start`` to `daemon`, its stdio piped, `first` written to it."""
    from .test_process import BIN, child_env

    env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(daemon.runtime)}
    bridge = await trio.lowlevel.open_process(
        [str(BIN / "forged"), "connect", "--no-start"], cwd=tmp_path / "project", env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert bridge.stdin is not None and bridge.stdout is not None
    await bridge.stdin.send_all(first)
    return bridge


async def test_connect_cut_off_writes_no_partial_line_and_exits_1(tmp_path: Path) -> None:
    """A `forged connect` whose own reader stops is cut off by the daemon; what it then
    writes ends with a whole line, and it says why on stderr with exit status 1."""
    flood = Reply(content=[ScriptText(text="x" * 40000, chunks=40000)])
    async with open_daemon(tmp_path, [flood], queue_limit_bytes=256 * 1024) as daemon, \
            daemon.client() as watcher:
        bridge = await connect_to(daemon, tmp_path, b'{"type":"prompt","message":"flood"}\n')
        await until_sessions(  # nobody reads the bridge: the daemon cuts it off
            watcher, lambda sessions: [s.clients for s in sessions] == [0], timeout_s=20)
        output = bytearray()
        assert bridge.stdout is not None
        with trio.fail_after(20):
            while data := await bridge.stdout.receive_some(1 << 20):
                output += data
            code = await bridge.wait()
        assert bridge.stderr is not None
        stderr = await bridge.stderr.receive_some(1 << 16)
    assert code == 1
    assert b"the daemon closed the connection" in stderr
    assert output.endswith(b"\n")
    assert all(orjson.loads(line) for line in output.splitlines())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_a_signal_to_connect_on_a_running_daemon_aborts_the_run_and_exits_0(
        tmp_path: Path, signum: signal.Signals) -> None:
    """The thin path, as ``forged --mode rpc`` does: what is queued is dropped, the run
    aborted, its closing events written, then connect exits 0."""
    slow = Reply(content=[ScriptText(text="x" * 500, chunks=500, delay_ms=10)])
    async with open_daemon(tmp_path, [slow]) as daemon:
        bridge = await connect_to(daemon, tmp_path, b'{"type":"prompt","message":"go"}\n')
        assert bridge.stdout is not None
        output = b""
        while b'"message_update"' not in output:
            output += await bridge.stdout.receive_some(1 << 16)
        bridge.send_signal(signum)
        with trio.fail_after(10):  # a hang guard, not a timing
            while data := await bridge.stdout.receive_some(1 << 16):
                output += data
            code = await bridge.wait()
    events = [orjson.loads(line) for line in output.splitlines()]
    assert code == 0
    assert [e["type"] for e in events[-4:]] == [
        "message_end", "turn_end", "agent_end", "agent_settled"]
    assert events[-4]["message"]["stopReason"] == "aborted"
    assert not [e for e in events if e.get("id") == "forged-connect-stop"]


async def test_connect_says_the_daemon_stopped_when_it_did(tmp_path: Path) -> None:
    """A daemon that stops (SIGTERM, then the drain) closes the connection: connect says the
    daemon stopped, not that it cut off a client that stops reading."""
    async with open_daemon(tmp_path, [DONE]) as daemon:
        bridge = await connect_to(daemon, tmp_path, b'{"id":"s","type":"get_state"}\n')
        assert bridge.stdout is not None
        assert b'"id":"s"' in await bridge.stdout.receive_some(1 << 16)
        daemon.stop.set()
        with trio.fail_after(20):  # a hang guard, not a timing
            while await bridge.stdout.receive_some(1 << 16):
                pass
            code = await bridge.wait()
        assert bridge.stderr is not None
        stderr = await bridge.stderr.receive_some(1 << 16)
    assert code == 1
    assert stderr.decode().splitlines()[-1] == (
        "forged: the daemon stopped (its log says why)")


@pytest.mark.parametrize("problem", ["another user's", "open to others", "a symbolic link"])
async def test_a_runtime_folder_that_is_not_safely_the_users_is_refused(
        tmp_path: Path, problem: str) -> None:
    from .test_process import BIN, child_env

    folder = tmp_path / "run" / "forged"
    if problem == "a symbolic link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.parent.mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.mkdir(parents=True, mode=0o700)
        if problem == "another user's":
            if os.getuid() != 0:
                pytest.skip("needs root to give a folder to another user")
            os.chown(folder, 65534, 65534)
        else:
            os.chmod(folder, 0o755)
    socket_path = folder / "forged.sock"
    with trio.fail_after(20):
        served = await trio.run_process(
            [str(BIN / "forged"), "serve", "--socket", str(socket_path)], capture_stdout=True,
            capture_stderr=True, check=False, env=child_env(tmp_path))
    assert served.returncode == 1
    (line,) = served.stderr.decode().splitlines()  # one line, no traceback
    assert line.startswith(f"forged: refusing {folder}")
    assert not socket_path.exists()
    with pytest.raises(ConfigError, match=f"refusing {folder}"):
        async with Client.open_unix(socket_path):
            pass


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("python3", path="/usr/bin"),
                    reason="needs root to run a listener as nobody, and /usr/bin/python3")
async def test_a_client_refuses_a_daemon_of_another_user(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "forged"
    folder.mkdir(parents=True, mode=0o700)
    theirs = Path(tempfile.mkdtemp(dir="/tmp"))
    os.chown(theirs, 65534, 65534)
    try:
        code = ("import socket, sys; s = socket.socket(socket.AF_UNIX); "
                f"s.bind({str(theirs / 'fake.sock')!r}); s.listen(); print('up', flush=True); "
                "c, _ = s.accept(); c.recv(1)")
        async with trio.open_nursery() as nursery:
            fake = await nursery.start(partial(trio.run_process, ["/usr/bin/python3", "-c", code],
                                               user="nobody", stdout=subprocess.PIPE,
                                               check=False))
            assert fake.stdout is not None
            await fake.stdout.receive_some(16)  # it listens
            os.rename(theirs / "fake.sock", folder / "forged.sock")  # planted in our folder
            with pytest.raises(ConfigError, match="it runs as uid 65534"):
                async with Client.open_unix(folder / "forged.sock"):
                    pass
            fake.kill()
    finally:
        shutil.rmtree(theirs, ignore_errors=True)


async def test_connect_passes_every_session_option_to_a_running_daemon(tmp_path: Path) -> None:
    from .test_process import BIN, child_env

    said: list[str] = []

    async def through_connect(daemon: Any, *options: str, status: int = 0) -> dict[str, Any]:
        env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(daemon.runtime)}
        with trio.fail_after(20):
            result = await trio.run_process(
                [str(BIN / "forged"), "connect", "--no-start", *options],
                stdin=b'{"type":"get_state","id":"s"}\n', capture_stdout=True,
                capture_stderr=True, check=False, env=env, cwd=tmp_path / "project")
        assert result.returncode == status, result.stderr
        said.append(result.stderr.decode())
        if status:
            assert result.stdout == b""
            return {}
        (state,) = [orjson.loads(line) for line in result.stdout.splitlines()]
        return dict(state["data"])

    async with open_daemon(tmp_path, [DONE]) as daemon:
        named = await through_connect(daemon, "--name", "demo", "--session", "kept.jsonl")
        memory = await through_connect(daemon, "--no-session")
        async with daemon.client() as client:  # a conversation, so there is one to continue
            await client.new_session(cwd=str(tmp_path / "project"))
            await client.prompt_and_wait("hello")
            recent = (await client.get_state()).session_id
        continued = await through_connect(daemon, "-c")
        mode = await through_connect(daemon, "--permission-mode", "read-only")
        await through_connect(daemon, "--tools", "read", "--thinking", "high", "--name", "x",
                              status=2)
        await through_connect(daemon, "--attach", recent, "--permission-mode", "auto",
                              status=2)
    assert named["sessionName"] == "demo"
    assert named["sessionFile"] == str(tmp_path / "project" / "kept.jsonl")
    assert "sessionFile" not in memory
    assert continued["sessionId"] == recent
    assert mode["permissionMode"] == "read-only"
    assert not any(said[:-2])  # each of those options reached the session
    assert said[-2] == ("forged: --thinking, --tools: the daemon already runs and cannot give "
                        "this connection's session these options (a daemon that connect "
                        "starts takes them, as forged serve does); leave them out, or stop "
                        "the daemon first\n")
    assert said[-1].startswith("forged: --permission-mode: --attach joins a session")


async def test_a_dropped_connections_empty_session_goes_soon_a_conversation_stays(
        tmp_path: Path) -> None:
    async with open_daemon(tmp_path, [DONE], empty_unload_s=0.2) as daemon:
        async with daemon.client() as talker, daemon.client() as dropped:
            await talker.new_session()
            await talker.prompt_and_wait("hello")
            kept = (await talker.get_state()).session_id
            await dropped.new_session()
        async with daemon.client() as watcher:
            remaining = await until_sessions(watcher, lambda sessions: len(sessions) == 1)
    assert [s.session_id for s in remaining] == [kept]  # the empty one went after 0.2 s


async def test_a_key_command_never_holds_up_the_other_clients(tmp_path: Path) -> None:
    """``"apiKey": "!command"`` runs off the loop: while one session waits for it (here
    until the test makes a file), another client is answered within 50 ms; the run then
    goes on with the command's output as its key."""
    gate = tmp_path / "gate"
    async with (open_daemon(tmp_path, [DONE]) as daemon, daemon.client() as first,
                daemon.client() as second):
        scripted = daemon.registry.find("scripted", "anthropic-messages")
        assert scripted is not None
        daemon.registry.add_provider(ProviderConfig(
            name="slow-key", base_url=daemon.server.base_url,
            api_key=f"!while [ ! -e {gate} ]; do sleep 0.01; done; echo the-key"),
            [attrs.evolve(scripted, provider="slow-key")])
        await first.new_session(provider="slow-key", model="anthropic-messages")
        await first.prompt("hi")
        waits = []
        for _ in range(20):
            started = trio.current_time()
            await second.list_sessions()
            waits.append(trio.current_time() - started)
        assert not daemon.server.requests  # still waiting for its key
        gate.touch()
        events = await collect_until_settled(first)
    assert max(waits) < 0.05, waits
    assert [e.type for e in events if e.type == "message_end"] == ["message_end"] * 2
    assert daemon.server.requests[0].headers["x-api-key"] == "the-key"


async def test_simultaneous_sessions_stay_within_the_limit(tmp_path: Path) -> None:
    """The limit is checked where no await can come between it and the count: twelve
    clients asking at once for five places get five sessions."""
    async with open_daemon(tmp_path, max_live_sessions=5) as daemon:
        answers: list[object] = []

        async def open_one() -> None:
            async with daemon.client() as client:
                opened = (await client.request("new_session"))["success"]
                answers.append(opened and (await client.request("get_state"))["success"])
                live.append(len(daemon.hub.live))
                if len(answers) == 12:
                    done.set()  # every client holds what it got: now they may leave
                await done.wait()

        live: list[int] = []
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(open_one)
    assert answers.count(True) == 5 and max(live) <= 5


async def test_a_burst_of_connections_waits_to_be_accepted(tmp_path: Path) -> None:
    """500 connections at once, before the daemon accepts any: none is refused."""
    async with open_daemon(tmp_path) as daemon:
        sockets = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(500)]
        refused = 0
        for sock in sockets:
            sock.setblocking(False)
            try:
                sock.connect(str(daemon.socket_path))
            except BlockingIOError:
                refused += 1
        for sock in sockets:
            sock.close()
    assert refused == 0


async def test_a_busy_daemon_is_tried_again_for_a_moment(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """A connect refused with EAGAIN (the queue of connections full) is tried again until
    the daemon has accepted the ones before it."""
    from forged._paths import open_daemon_socket, runtime_dir

    path = runtime_dir(tmp_path / "run" / "forged" / "forged.sock") / "forged.sock"
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(str(path))
    listener.listen(0)
    queued = []
    while True:  # fill its queue
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(path))
        except BlockingIOError:
            sock.close()
            break
        queued.append(sock)
    connected: list[trio.SocketStream] = []

    async def connect() -> None:
        connected.append(await open_daemon_socket(path))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connect)
        await trio.sleep(0.05)  # on the mock clock: after the first refusal
        assert not connected
        for _ in queued:
            (await listener.accept())[0].close()
        accepted, _ = await listener.accept()  # the retried one
    assert len(connected) == 1
    accepted.close()
    await connected[0].aclose()
    for sock in queued:
        sock.close()
    listener.close()


async def test_a_connection_that_ends_before_a_command_leaves_no_session(
        tmp_path: Path) -> None:
    """forged connect sends new_session at once; a client that then goes away (or a
    connection that sends nothing) must not leave a live session behind."""
    async with open_daemon(tmp_path) as daemon:
        for index in range(20):
            async with daemon.client() as client:
                if index % 2:
                    await client.new_session(cwd=str(tmp_path))
        async with daemon.client() as watcher:
            await until_sessions(watcher, lambda _: len(daemon.hub.peers) == 1)
            listed = await watcher.list_sessions()
    assert listed.sessions == [] and daemon.hub.live == []


async def test_a_plain_connection_reads_what_stdio_would(tmp_path: Path) -> None:
    """``plain`` (what forged connect asks for): no stamps, no extension_ui_resolved; the
    other clients of the session still get both."""
    (tmp_path / "asking.py").write_text(ASKING_PLUGIN)
    async with (open_daemon(tmp_path, plugins=[tmp_path / "asking.py"]) as daemon,
                daemon.client() as stamped):
        plain = await trio.open_unix_socket(str(daemon.socket_path))
        await plain.send_all(b'{"id":"o","type":"new_session","cwd":"%s","plain":true}\n'
                             b'{"id":"s","type":"get_state"}\n' % str(tmp_path).encode())
        lines: list[dict[str, Any]] = []

        async def until(predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
            buffer = b""
            while True:
                for item in lines:
                    if predicate(item):
                        return item
                buffer += await plain.receive_some(1 << 16)
                *complete, buffer = buffer.split(b"\n")
                lines.extend(orjson.loads(line) for line in complete)

        state = await until(lambda item: item.get("id") == "s")
        await stamped.attach(state["data"]["sessionId"])
        await plain.send_all(b'{"type":"prompt","message":"/ask deploy?"}\n')
        request = await until(lambda item: item.get("type") == "extension_ui_request")
        await stamped.answer_dialog(request["id"], confirmed=True)
        notify = await until(lambda item: item.get("method") == "notify")
        resolved = await stamped.next_event(lambda e: e.type == "extension_ui_resolved")
        await plain.aclose()
    assert resolved.seq is not None and resolved.session_id == state["data"]["sessionId"]
    assert notify["message"] == "answer: True"
    events = [item for item in lines if item.get("type") != "response"]
    assert events and not [item for item in events if "sessionId" in item or "seq" in item]
    assert not [item for item in events if item["type"] == "extension_ui_resolved"]


@pytest.mark.parametrize("command", [["connect", "--no-start"], ["status"]])
async def test_connect_and_status_to_a_running_daemon_load_only_the_standard_library(
        tmp_path: Path, command: list[str]) -> None:
    """The thin path (`forged._thin`): no trio, no attrs, nothing of forged beyond it, as
    ``python -X importtime`` lists what a process imports; and connect adds none of the
    costlier parts of the standard library to what the interpreter loads by itself."""
    import sys

    from .test_process import child_env

    def imports(stderr: bytes) -> set[str]:
        return {line.rsplit("|", 1)[-1].strip() for line in stderr.decode().splitlines()
                if line.startswith("import time:")}

    async with open_daemon(tmp_path, [DONE]) as daemon:
        env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(daemon.runtime)}
        with trio.fail_after(20):
            result = await trio.run_process(
                [sys.executable, "-X", "importtime", "-m", "forged", *command],
                stdin=b'{"type":"get_state","id":"s"}\n', capture_stdout=True,
                capture_stderr=True, check=False, env=env, cwd=tmp_path / "project")
            bare = await trio.run_process(
                [sys.executable, "-X", "importtime", "-c", "pass"], capture_stderr=True,
                env=env)
    assert result.returncode == 0, result.stderr
    imported = imports(result.stderr)
    ours = sorted(name for name in imported if name.startswith("forged"))
    assert ours == ["forged", "forged._entry", "forged._errors", "forged._runtime",
                    "forged._thin", "forged._version"]
    assert not {"trio", "attrs", "orjson", "cattrs"} & imported
    if command[0] == "connect":  # the costly parts of the standard library it does without
        assert not {"pathlib", "json", "socket", "signal"} & (imported - imports(bare.stderr))
    assert (b'"id":"s"' in result.stdout if command[0] == "connect"
            else result.stdout.startswith(b"forged daemon on "))


async def test_connect_reads_its_commands_from_a_file(tmp_path: Path) -> None:
    """``forged connect < commands.jsonl``: stdin a regular file (which epoll refuses) is read
    to its end, each command answered, and connect exits 0 when the daemon has answered."""
    from .test_process import BIN, child_env

    commands = tmp_path / "commands.jsonl"
    commands.write_bytes(b'{"type":"get_state","id":"a"}\n{"type":"get_messages","id":"b"}\n')
    async with open_daemon(tmp_path, [DONE]) as daemon:
        env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(daemon.runtime)}
        with commands.open("rb") as stdin, trio.fail_after(20):
            result = await trio.run_process(
                [str(BIN / "forged"), "connect", "--no-start"], stdin=stdin,
                capture_stdout=True, capture_stderr=True, check=False, env=env,
                cwd=tmp_path / "project")
    assert result.returncode == 0, result.stderr
    answers = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [(a["id"], a["command"], a["success"]) for a in answers] == [
        ("a", "get_state", True), ("b", "get_messages", True)]


@hypothesis.given(st.dictionaries(st.text(), st.one_of(st.text(), st.booleans())))
def test_the_thin_path_writes_the_json_the_json_module_reads(
        data: dict[str, str | bool]) -> None:
    from forged._thin import _line

    line = _line(data)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    assert json.loads(line) == data


def test_the_thin_path_knows_connects_options_as_its_parser_does() -> None:
    from forged._cli import CONNECT_PER_SESSION, build_connect_parser
    from forged._thin import CONNECT_OPTIONS, PER_SESSION

    parsed = tuple((tuple(action.option_strings), action.nargs != 0, action.dest)
                   for action in build_connect_parser()._actions
                   if action.option_strings and action.dest != "help")
    assert parsed == CONNECT_OPTIONS
    assert PER_SESSION == CONNECT_PER_SESSION


async def test_attach_takes_the_start_of_an_id_and_joins_a_message_at_its_start(
        tmp_path: Path) -> None:
    """A client attaching (without sinceSeq) while a message streams gets it from its
    `message_start`, right after the answer to `attach`, then what follows; `forged connect
    --attach` with the start of the id too, unstamped. The start of several ids, or of
    none, is refused saying so; `--export` takes the start of an id as well."""
    from .test_process import BIN, child_env

    waiting = Reply(content=[ScriptText(text="first "),
                             ScriptText(text="never", delay_ms=600_000)])
    async with open_daemon(tmp_path, [waiting]) as daemon:
        async with daemon.client() as owner, daemon.client() as joiner:
            await owner.new_session(cwd=str(tmp_path / "project"))
            session_id = (await owner.get_state()).session_id
            await owner.prompt("talk")
            await owner.next_event(lambda e: e.type == "message_update")
            prefix = session_id[:8]
            attached = await joiner.attach(prefix)
            joined = [await joiner.next_event() for _ in range(attached.replayed)]
            env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(daemon.runtime)}
            with trio.fail_after(30):
                connect = await trio.lowlevel.open_process(
                    [str(BIN / "forged"), "connect", "--no-start", "--attach", prefix],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                    cwd=tmp_path / "project")
                assert connect.stdin is not None and connect.stdout is not None
                await connect.stdin.send_all(b'{"type":"get_state","id":"s"}\n')
                heard = b""
                while b'"id":"s"' not in heard:
                    heard += await connect.stdout.receive_some(1 << 16)
                await owner.abort()
                await connect.stdin.aclose()
                while chunk := await connect.stdout.receive_some(1 << 16):
                    heard += chunk
                await connect.wait()
        async with daemon.client() as other:
            await other.new_session(cwd=str(tmp_path / "project"))
            await other.prompt_and_wait("hello")
            refused = [await other.request("attach", session_id="zz"),
                       await other.request("attach", session_id="")]
    assert attached.session_id == session_id and attached.replayed >= 2
    assert [e.type for e in joined][:2] == ["message_start", "message_update"]
    assert {e.type for e in joined} == {"message_start", "message_update"}
    assert all((e.seq or 0) <= attached.seq for e in joined)
    lines = [orjson.loads(line) for line in heard.splitlines()]
    assert [line["type"] for line in lines][:2] == ["message_start", "message_update"]
    assert not [line for line in lines if "seq" in line or "sessionId" in line]
    state = next(line for line in lines if line.get("id") == "s")
    assert state["data"]["sessionId"] == session_id
    assert [line["type"] for line in lines][-1] == "agent_settled"
    assert [r["error"] for r in refused] == ["No session zz", "No session "]
    stored = Path(state["data"]["sessionFile"])
    for twin in ("abc00001-aaaa", "abc00002-bbbb"):  # two ids that start alike
        header, rest = stored.read_text().split("\n", 1)
        (stored.parent / f"2026-01-01T00-00-00-000Z_{twin}.jsonl").write_text(
            header.replace(session_id, twin) + "\n" + rest)
    exports = []
    for n, name in enumerate((session_id[:8], "abc0", "abc00002")):
        with trio.fail_after(60):
            exports.append(await trio.run_process(
                [str(BIN / "forged"), "--export", name, str(tmp_path / f"{n}.html")],
                capture_stdout=True, capture_stderr=True, env=env, cwd=tmp_path,
                check=False))
    assert [done.returncode for done in exports] == [0, 1, 0]
    assert "'abc0' is the start of 2 sessions' ids (abc00001-aaaa, abc00002-bbbb)" in (
        exports[1].stderr.decode())
    assert (tmp_path / "0.html").exists() and (tmp_path / "2.html").exists()


async def test_connect_says_once_which_keys_of_its_environment_the_daemon_lacks(
        tmp_path: Path) -> None:
    """A daemon's sessions use the daemon's keys, never the client's: `forged connect` from an
    environment holding a key the daemon's lacks says so once on stderr."""
    from .test_process import BIN, child_env

    async with open_daemon(tmp_path, [DONE]) as daemon:
        env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(daemon.runtime),
               "FORGED_TEST_ONLY_HERE_API_KEY": "k", "PATH": os.environ["PATH"]}
        with trio.fail_after(30):
            done = await trio.run_process(
                [str(BIN / "forged"), "connect", "--no-start"],
                stdin=b'{"type":"get_state","id":"s"}\n', capture_stdout=True,
                capture_stderr=True, check=False, env=env, cwd=tmp_path / "project")
    said = done.stderr.decode()
    assert done.returncode == 0, said
    assert said.count("\n") == 1 and said.startswith(
        f"forged: FORGED_TEST_ONLY_HERE_API_KEY is set here but not in the daemon's "
        f"environment (pid {os.getpid()}): its sessions use the daemon's own keys and "
        "auth.json"), said
