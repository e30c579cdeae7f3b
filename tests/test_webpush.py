"""Web Push from a real ``forged serve`` to a push service on 127.0.0.1 (HTTPS, a certificate
the daemon is told to trust with SSL_CERT_FILE), subscribed as a browser subscribes: a P-256
key pair and an auth secret of the test's own. What arrives is judged as a browser and a
push service would: the VAPID signature checked, the body decrypted with the browser's key."""

from __future__ import annotations

import base64
import functools
import json
import os
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import attrs
import http_ece
import httpx
import trio
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from py_vapid import Vapid02

from forged import _wire as w
from forged.client import Client

from .test_daemon import free_port
from .test_notify import Received, Receiver
from .test_permissions import escalated
from .test_process import BIN, child_env
from .test_remote import certificate


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@attrs.define
class Browser:
    """What a browser keeps of a push subscription: its key pair and auth secret."""

    endpoint: str
    key: ec.EllipticCurvePrivateKey = attrs.field(
        factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    auth: bytes = attrs.field(factory=lambda: os.urandom(16))

    def subscription(self) -> dict[str, Any]:
        point = self.key.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
        return {"endpoint": self.endpoint, "keys": {"p256dh": b64(point), "auth": b64(self.auth)}}

    def read(self, received: Received) -> dict[str, Any]:
        plain = http_ece.decrypt(received.body, private_key=self.key, auth_secret=self.auth,
                                 version="aes128gcm")
        return dict(json.loads(plain))


class PushService(Receiver):
    """`Receiver` over TLS: a push service's endpoint."""

    async def start_tls(self, nursery: trio.Nursery, context: ssl.SSLContext) -> PushService:
        listeners: list[trio.SSLListener[trio.SocketStream]] = await nursery.start(
            functools.partial(trio.serve_ssl_over_tcp, self._over_tls, 0, context,
                              host="127.0.0.1"))
        transport = cast("trio.SocketListener", listeners[0].transport_listener)
        self.url = f"https://127.0.0.1:{transport.socket.getsockname()[1]}"
        return self

    async def _over_tls(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        await self._handle(cast("trio.SocketStream", stream))  # (h11 needs only a Stream)


@attrs.define
class Daemon:
    port: int
    socket: Path
    runtime: Path

    @asynccontextmanager
    async def device(self, name: str, role: str) -> AsyncIterator[Client]:
        async with Client.open_unix(self.socket) as owner:
            code = (await owner.pair_device(name, role)).link.rpartition("#")[2]
        async with httpx.AsyncClient() as http:
            paired = await http.post(f"http://127.0.0.1:{self.port}/pair",
                                     json={"code": code})
        async with Client.open_websocket(f"ws://127.0.0.1:{self.port}/",
                                         paired.json()["credential"]) as device:
            yield device


@asynccontextmanager
async def open_served(tmp_path: Path, replies: list[dict[str, Any]], cert: Path
                      ) -> AsyncIterator[Daemon]:
    """``forged serve --ws`` in a process of its own, on a script, trusting `cert`."""
    (tmp_path / "agent").mkdir(exist_ok=True)
    (tmp_path / "project").mkdir(exist_ok=True)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": replies}))
    runtime = tmp_path / "run"
    env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(runtime),
           "SSL_CERT_FILE": str(cert)}
    port = free_port()
    daemon = await trio.lowlevel.open_process(
        [str(BIN / "forged"), "serve", "--ws", f"127.0.0.1:{port}", "--provider", "scripted",
         "--script", str(script)], env=env, cwd=tmp_path / "project", stderr=subprocess.PIPE)
    assert daemon.stderr is not None
    said = b""
    try:
        while b"listening on ws://" not in said:
            data = await daemon.stderr.receive_some()
            assert data, f"the daemon did not start: {said.decode()}"
            said += data
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, daemon.stderr, tmp_path / "daemon.log")
            yield Daemon(port, runtime / "forged" / "forged.sock", runtime)
            nursery.cancel_scope.cancel()
    finally:
        daemon.terminate()
        with trio.CancelScope(shield=True):
            await daemon.wait()


async def _drain(stream: trio.abc.ReceiveStream, log: Path) -> None:
    """The daemon's log, kept in `log` (for a failure's reader)."""
    with log.open("ab") as kept:
        while data := await stream.receive_some():
            kept.write(data)


async def nudge_a_permission(daemon: Daemon, command: str) -> None:
    """A run in ``auto`` asks to run `command` outside the project; denied, it ends."""
    async with Client.open_unix(daemon.socket) as owner:
        await owner.new_session()
        await owner.run("set_permission_mode", mode="auto")
        await owner.prompt(f"run {command}")
        asked = (await owner.next_event(lambda e: e.type == "extension_ui_request")).event
        assert isinstance(asked, w.ExtensionUiRequest)
        await owner.answer_dialog(asked.id, value="Deny")
        await owner.next_event(lambda e: e.type == "agent_settled")


async def test_a_paired_browser_gets_a_signed_encrypted_push_and_none_once_revoked(
        tmp_path: Path) -> None:
    cert, key = certificate(tmp_path, "push")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    secret = "SECRET-COMMAND"
    done = {"content": [{"type": "text", "text": "SECRET-ANSWER"}]}
    replies = [escalated(f"touch /tmp/{secret}"), done] * 2
    async with trio.open_nursery() as nursery:
        service = await PushService().start_tls(nursery, context)
        phone = Browser(f"{service.url}/push/phone-capability")
        tablet = Browser(f"{service.url}/push/tablet-capability")
        async with open_served(tmp_path, replies, cert) as daemon, \
                daemon.device("phone", "approve") as on_phone, \
                daemon.device("tablet", "read") as on_tablet:
            key_answer = await on_phone.request("get_push_key")
            for device, browser in ((on_phone, phone), (on_tablet, tablet)):
                answer = await device.request("push_subscribe",
                                              subscription=browser.subscription())
                assert answer["success"], answer
            with trio.fail_after(30):  # a hang guard
                await nudge_a_permission(daemon, "permission")
                first = [await service.received.receive() for _ in range(4)]
            async with Client.open_unix(daemon.socket) as owner:
                await owner.revoke_device("phone")
            stored = json.loads((tmp_path / "agent" / "web-push.json").read_text())
            # The tablet revoked by another process (no daemon answered it), then paired
            # again under its name: its old subscription is dead, the new one lives.
            await trio.run_process(
                [str(BIN / "forged"), "devices", "revoke", "tablet", "--socket",
                 str(tmp_path / "none.sock")], env=child_env(tmp_path / "agent"),
                capture_stdout=True)
            again = Browser(f"{service.url}/push/tablet-again")
            async with daemon.device("tablet", "read") as on_tablet_again:
                answer = await on_tablet_again.request("push_subscribe",
                                                       subscription=again.subscription())
                assert answer["success"], answer
            with trio.fail_after(30):
                await nudge_a_permission(daemon, "again")
                after = [await service.received.receive() for _ in range(2)]
        nursery.cancel_scope.cancel()
    public_key = cast("dict[str, str]", key_answer["data"])["publicKey"]
    assert len(unb64(public_key)) == 65
    assert sorted(r.target for r in first[:2]) == sorted(r.target for r in first[2:]) == [
        "/push/phone-capability", "/push/tablet-capability"]  # each nudge to both at once
    browsers = {"/push/phone-capability": phone, "/push/tablet-capability": tablet}
    payloads = [browsers[r.target].read(r) for r in first]
    assert [p["title"] for p in payloads] == ["forged: Permission needed"] * 2 + [
        "forged: Run finished"] * 2
    assert {p["body"] for p in payloads[:2]} == {"project: a permission request waits"}
    for received in first:
        scheme, _, token = received.headers["authorization"].partition(" ")
        fields = dict(part.split("=", 1) for part in token.split(","))
        assert scheme == "vapid" and fields["k"] == public_key
        assert Vapid02.verify(received.headers["authorization"])
        claims = json.loads(unb64(fields["t"].split(".")[1]))
        assert claims["aud"] == service.url and claims["sub"].startswith("mailto:")
        assert received.headers["content-encoding"] == "aes128gcm"
        assert int(received.headers["ttl"]) > 0
        assert b"SECRET" not in received.body and "SECRET" not in repr(received.headers)
    for payload in payloads:
        assert "SECRET" not in json.dumps(payload)
    assert [s["device"] for s in stored["subscriptions"]] == ["tablet"]
    assert [r.target for r in after] == ["/push/tablet-again"] * 2  # none to the old ones
    assert [again.read(r)["event"] for r in after] == ["permission", "run_end"]


async def test_a_subscription_is_a_paired_devices_and_its_endpoint_https(
        tmp_path: Path) -> None:
    cert, _ = certificate(tmp_path, "push")
    async with open_served(tmp_path, [], cert) as daemon:
        async with daemon.device("phone", "read") as phone:
            plain = await phone.request("push_subscribe", subscription=Browser(
                "http://127.0.0.1:6379/").subscription())
            short = Browser("https://push.example/x").subscription()
            short["keys"]["auth"] = b64(b"short")
            bad_key = await phone.request("push_subscribe", subscription=short)
        async with Client.open_unix(daemon.socket) as owner:
            ownerless = await owner.request("get_push_key")
    assert plain["success"] is False and "must be an https URL" in str(plain["error"])
    assert bad_key["success"] is False and "keys.auth must be 16 bytes" in str(bad_key["error"])
    assert ownerless["success"] is False and "needs a paired device" in str(
        ownerless["error"])
    assert not (tmp_path / "agent" / "web-push.json").exists()
