"""`forged serve` under systemd: a socket passed by the manager (LISTEN_FDS), READY/STOPPING
and watchdog pings on NOTIFY_SOCKET, and the SIGTERM drain."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from forged import _wire as w
from forged.client import Client, Received

from .test_process import BIN, child_env


def slow_script(tmp_path: Path, chunks: int) -> Path:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [{"content": [
        {"type": "text", "text": "word " * chunks, "chunks": chunks, "delayMs": 50}]}]}))
    return script


STARTED: list[trio.Process] = []
"""The daemons a test started: killed when it ends, whether it passed or not."""


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test() -> Iterator[None]:
    yield
    while STARTED:
        process = STARTED.pop()
        if process.returncode is None:
            process.kill()


async def start_activated(tmp_path: Path, *args: str) -> tuple[trio.Process, Path, Any]:
    """`forged serve` as systemd starts it: its socket already listening on fd 3, and a
    notification socket to talk to."""
    socket_path = tmp_path / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen()
    notify = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await notify.bind(str(tmp_path / "notify.sock"))
    env = {**child_env(tmp_path / "agent"), "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
           "WATCHDOG_USEC": "200000", "XDG_RUNTIME_DIR": str(tmp_path / "run"),
           "LISTEN_FDS": "1"}
    fd = os.dup(listener.fileno())  # not 3 itself: dup2 onto 3 makes it inheritable
    process = await trio.lowlevel.open_process(
        ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', str(BIN / "forged"), "serve", *args],
        env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
        close_fds=False, preexec_fn=lambda: os.dup2(fd, 3))
    STARTED.append(process)
    listener.close()
    os.close(fd)
    return process, socket_path, notify


async def notified(notify: Any, wanted: str) -> list[str]:
    """The notifications up to and including one that holds `wanted`."""
    seen: list[str] = []
    with trio.fail_after(15):
        while True:
            message = (await notify.recv(4096)).decode()
            seen.append(message)
            if wanted in message.split("\n"):
                return seen


async def test_socket_activation_notify_watchdog_and_a_drain_that_lets_the_run_finish(
        tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    script = slow_script(tmp_path, 20)
    process, socket_path, notify = await start_activated(
        tmp_path, "--provider", "scripted", "--script", str(script), "--drain-grace", "10")
    ready = await notified(notify, "READY=1")
    assert any(line.startswith("STATUS=0 sessions") for line in ready[-1].split("\n"))
    assert not (tmp_path / "run" / "forged" / "forged.sock").exists()  # it bound nothing
    pings = await notified(notify, "WATCHDOG=1")
    assert pings
    events: list[Received] = []
    async with Client.open_unix(socket_path) as client:
        await client.prompt("talk slowly")
        events.append(await client.next_event(lambda e: e.type == "message_update"))
        process.send_signal(signal.SIGTERM)
        stopping = await notified(notify, "STOPPING=1")
        async for event in client.events:
            events.append(event)
    with trio.fail_after(15):
        code = await process.wait()
    assert code == 0
    assert stopping
    assert events[-1].type == "agent_settled"
    end = next(e.event for e in events if isinstance(e.event, w.AgentEnd))
    last = end.messages[-1]
    assert isinstance(last, w.AssistantMessage) and last.stop_reason == "stop"  # let finish
    assert [getattr(block, "text", None) for block in last.content] == ["word " * 20]
    assert socket_path.exists()  # the manager's socket is left to the manager


async def test_a_drain_aborts_what_outlasts_the_grace_period(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    script = slow_script(tmp_path, 400)  # 20 s of streaming
    process, socket_path, notify = await start_activated(
        tmp_path, "--provider", "scripted", "--script", str(script), "--drain-grace", "0.5")
    await notified(notify, "READY=1")
    events: list[Received] = []
    async with Client.open_unix(socket_path) as client:
        await client.prompt("talk slowly")
        await client.next_event(lambda e: e.type == "message_update")
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(8):
            async for event in client.events:
                events.append(event)
            code = await process.wait()
    assert code == 0
    assert [e.type for e in events[-4:]] == [
        "message_end", "turn_end", "agent_end", "agent_settled"]
    ended = events[-4].event
    assert isinstance(ended, w.MessageEnd) and isinstance(ended.message, w.AssistantMessage)
    assert ended.message.stop_reason == "aborted"
    assert process.stderr is not None
    log = (await process.stderr.receive_some(1 << 16)).decode()
    assert "SIGTERM: draining" in log and "aborting session" in log


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed")
def test_the_contrib_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """The user units as a user would install them: ExecStart's ``~/.local/bin/forged``
    exists; systemd reports nothing (a bad key or value is reported on stderr)."""
    home, runtime = tmp_path / "home", tmp_path / "run"
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "forged").symlink_to(BIN / "forged")
    runtime.mkdir(mode=0o700)
    units = Path(__file__).parents[1] / "contrib" / "systemd"
    result = subprocess.run(
        ["systemd-analyze", "--user", "--man=no", "verify",
         str(units / "forged.socket"), str(units / "forged.service")],
        env={**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)},
        capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr) == (0, "")
