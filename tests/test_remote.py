"""The daemon reached from elsewhere: its WebSocket over real TLS (a certificate made here by
openssl), the refusals that keep a remote listener safe, and SIGHUP loading a new certificate
while the sessions go on."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
from pathlib import Path

import orjson
import pytest
import trio
from trio_websocket import HandshakeError, open_websocket_url

from forged._paths import read_ws_token

from .harness import open_daemon
from .test_daemon import free_port
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
