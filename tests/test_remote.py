"""The daemon reached from elsewhere: its WebSocket over real TLS (a certificate made here by
openssl), the refusals that keep a remote listener safe, and SIGHUP loading a new certificate
while the sessions go on."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from trio_websocket import HandshakeError, open_websocket_url

from forged._fronts.acp import serve_in_daemon
from forged._paths import read_ws_token
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall

from .harness import Daemon, open_daemon
from .test_daemon import free_port, until_sessions
from .test_process import BIN, child_env


def certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made by openssl."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def trusting(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


async def get_state(url: str, token: str, context: ssl.SSLContext | None) -> dict[str, object]:
    """One connection's ``get_state`` response."""
    async with open_websocket_url(url, ssl_context=context, extra_headers=[
            (b"authorization", f"Bearer {token}".encode())]) as ws:
        await ws.send_message('{"id": "s", "type": "get_state"}')
        while True:
            message: dict[str, object] = orjson.loads(await ws.get_message())
            if message.get("id") == "s":
                return message


async def test_the_websocket_speaks_tls_and_sighup_loads_a_new_certificate(
        tmp_path: Path) -> None:
    first, first_key = certificate(tmp_path, "first")
    second, second_key = certificate(tmp_path, "second")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(first.read_bytes())
    key.write_bytes(first_key.read_bytes())
    port = free_port()
    url = f"wss://127.0.0.1:{port}/"
    async with open_daemon(tmp_path, ws=("127.0.0.1", port), tls_cert=cert, tls_key=key):
        token = read_ws_token()
        assert (await get_state(url, token, trusting(first)))["success"] is True
        async with open_websocket_url(url, ssl_context=trusting(first), extra_headers=[
                (b"authorization", f"Bearer {token}".encode())]) as kept:
            await kept.send_message('{"id": "a", "type": "get_state"}')
            before = orjson.loads(await kept.get_message())
            cert.write_bytes(second.read_bytes())
            key.write_bytes(second_key.read_bytes())
            os.kill(os.getpid(), signal.SIGHUP)  # the daemon runs in this process
            with trio.fail_after(10):  # a hang guard: until the new certificate is served
                while True:  # (the reload runs in a thread: nothing else says it is done)
                    with trio.move_on_after(1):
                        try:
                            await get_state(url, token, trusting(second))
                            break
                        except (HandshakeError, OSError, trio.BrokenResourceError):
                            pass
                    await trio.sleep(0.05)
            with pytest.raises((HandshakeError, OSError, trio.BrokenResourceError)):
                await get_state(url, token, trusting(first))
            await kept.send_message('{"id": "b", "type": "get_state"}')
            after = orjson.loads(await kept.get_message())
    assert before["data"]["sessionId"] == after["data"]["sessionId"]  # the same session


async def test_a_token_in_the_url_is_refused_off_loopback(tmp_path: Path) -> None:
    """A listener on every address (behind a TLS proxy, say): the token only in the
    Authorization header, even from this machine."""
    port = free_port()
    async with open_daemon(tmp_path, ws=("0.0.0.0", port), ws_allow_remote=True,
                           insecure=True):
        token = read_ws_token()
        here = socket.gethostbyname(socket.gethostname())
        address = here if not here.startswith("127.") else "127.0.0.1"
        assert (await get_state(f"ws://{address}:{port}/", token, None))["success"] is True
        with pytest.raises(HandshakeError) as refused:
            async with open_websocket_url(f"ws://{address}:{port}/?token={token}"):
                pass
    assert "401" in str(refused.value) or getattr(refused.value, "status_code", 0) == 401


@pytest.mark.parametrize(("extra", "refused"), [
    ([], "pass --ws-allow-remote"),
    (["--ws-allow-remote"], "needs TLS: pass --tls-cert FILE and --tls-key FILE"),
    (["--ws-allow-remote", "--tls-cert", "/nonexistent.pem"], "both a certificate and"),
])
async def test_a_remote_listener_without_tls_refuses_to_start(
        tmp_path: Path, extra: list[str], refused: str) -> None:
    env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    with trio.fail_after(20):
        result = await trio.run_process(
            [str(BIN / "forged"), "serve", "--ws", f"0.0.0.0:{free_port()}", *extra],
            capture_stdout=True, capture_stderr=True, check=False, env=env)
    assert result.returncode == 1
    assert refused.encode() in result.stderr
    assert not (tmp_path / "run" / "forged" / "forged.sock").exists()


# --- over SSH: the remote command's pipes closing, as when SSH drops --------------------------

WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.02; done; echo went"
"""A command that runs until the test makes the file ``go`` in the project."""


class Lines:
    """The JSON lines a process writes, read as they come."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdout is not None
        self.stdout = process.stdout
        self.buffer = b""
        self.seen: list[dict[str, Any]] = []

    async def until(self, found: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        with trio.fail_after(20):  # a hang guard
            while True:
                while b"\n" in self.buffer:
                    line, self.buffer = self.buffer.split(b"\n", 1)
                    item: dict[str, Any] = orjson.loads(line)
                    self.seen.append(item)
                    if found(item):
                        return item
                data = await self.stdout.receive_some(1 << 16)
                assert data, "the process closed its output"
                self.buffer += data


async def connect(daemon: Daemon, tmp_path: Path, *args: str) -> trio.Process:
    """``forged connect --no-start`` with `args`, its stdio piped, as SSH runs it."""
    env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(daemon.runtime)}
    return await trio.lowlevel.open_process(
        [str(BIN / "forged"), "connect", "--no-start", *args], cwd=tmp_path / "project",
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


async def drop(process: trio.Process) -> None:
    """What SSH does to the remote command when the connection drops: its input ends and
    its output goes nowhere."""
    assert process.stdin is not None and process.stdout is not None
    await process.stdin.aclose()
    await process.stdout.aclose()


async def test_an_ssh_drop_keeps_the_session_and_its_run_and_attach_takes_it_up(
        tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="bash", id="w",
                                             arguments={"command": WAIT_FOR_GO})]),
               Reply(content=[ScriptText(text="finished after the drop")])]
    async with open_daemon(tmp_path, replies) as daemon, daemon.client() as watcher:
        first = await connect(daemon, tmp_path)
        assert first.stdin is not None
        await first.stdin.send_all(b'{"type":"prompt","message":"wait for go"}\n')
        await Lines(first).until(lambda e: e.get("type") == "tool_execution_start")
        await drop(first)

        [live] = await until_sessions(watcher, lambda sessions: len(sessions) == 1)
        again = await connect(daemon, tmp_path, "--attach", live.session_id[:8])
        lines = Lines(again)
        assert again.stdin is not None
        await again.stdin.send_all(b'{"id":"s","type":"get_state"}\n')
        state = await lines.until(lambda e: e.get("id") == "s")
        (tmp_path / "project" / "go").touch()
        await lines.until(lambda e: e.get("type") == "agent_settled")
        await again.stdin.send_all(b'{"id":"m","type":"get_messages"}\n')
        messages = (await lines.until(lambda e: e.get("id") == "m"))["data"]["messages"]
        await again.stdin.aclose()
        with trio.fail_after(20):
            await first.wait()  # the dropped connect is gone once its run ended
            await again.wait()
    assert state["data"]["sessionId"] == live.session_id and state["data"]["isStreaming"]
    assert next(e for e in lines.seen if e.get("type") == "tool_execution_end")[
        "result"]["content"][0]["text"].strip() == "went"
    assert messages[0]["content"][0]["text"] == "wait for go"
    assert messages[-1]["content"][0]["text"] == "finished after the drop"


async def test_an_editors_ssh_drop_keeps_the_acp_session_and_session_load_takes_it_up(
        tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="bash", id="w",
                                             arguments={"command": WAIT_FOR_GO})]),
               Reply(content=[ScriptText(text="finished after the drop")])]
    project = str(tmp_path / "project")

    async def call(process: trio.Process, lines: Lines, request_id: int, method: str,
                   params: dict[str, Any], *, answer: bool = True) -> dict[str, Any]:
        assert process.stdin is not None
        await process.stdin.send_all(orjson.dumps({"jsonrpc": "2.0", "id": request_id,
                                                   "method": method, "params": params})
                                     + b"\n")
        return await lines.until(lambda m: m.get("id") == request_id) if answer else {}

    async with (open_daemon(tmp_path, replies, upgrade=serve_in_daemon) as daemon,
                daemon.client() as watcher):
        editor = await connect(daemon, tmp_path, "--acp")
        lines = Lines(editor)
        await call(editor, lines, 1, "initialize", {"protocolVersion": 1})
        opened = await call(editor, lines, 2, "session/new", {"cwd": project, "mcpServers": []})
        session_id = opened["result"]["sessionId"]
        await call(editor, lines, 3, "session/prompt", {"sessionId": session_id, "prompt": [
            {"type": "text", "text": "wait for go"}]}, answer=False)
        await lines.until(lambda m: m.get("params", {}).get("update", {}).get(
            "sessionUpdate") == "tool_call")
        await drop(editor)

        await until_sessions(watcher, lambda sessions: [s.session_id for s in sessions] == [
            session_id] and sessions[0].clients == 0)
        back = await connect(daemon, tmp_path, "--acp")
        back_lines = Lines(back)
        await call(back, back_lines, 1, "initialize", {"protocolVersion": 1})
        loaded = await call(back, back_lines, 2, "session/load", {
            "sessionId": session_id, "cwd": project, "mcpServers": []})
        (tmp_path / "project" / "go").touch()
        [live] = await until_sessions(watcher, lambda sessions: sessions[0].state == "idle")
        await watcher.attach(session_id)
        last = await watcher.get_last_assistant_text()
        assert back.stdin is not None
        await back.stdin.aclose()
        with trio.fail_after(20):
            await editor.wait()
            await back.wait()
    assert "result" in loaded and live.session_id == session_id
    replayed = [m["params"]["update"] for m in back_lines.seen
                if m.get("method") == "session/update"]
    assert {"sessionUpdate": "user_message_chunk",
            "content": {"type": "text", "text": "wait for go"}}.items() <= replayed[0].items()
    assert last == "finished after the drop"
