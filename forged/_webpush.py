"""Web Push from the daemon to the browsers of paired devices: "a run needs you" on a phone
whose page is closed (docs/web.md).

A page subscribes its browser (``push_subscribe``, with the daemon's VAPID public key from
``get_push_key``); the subscription belongs to the paired device whose connection sent it,
and ends with it (``revoke_device``, or a device no longer in ``devices.json``). Each nudge
(`forged._notify.Nudge`) goes to every subscription as a push message: encrypted to the
browser (RFC 8291, aes128gcm, by ``http_ece``), signed for the push service with the
daemon's VAPID key (RFC 8292, by ``py_vapid``), posted with httpx. The payload names the
event and the session, never the nudge's text (a command, a prompt, an error): a push
service sees only ciphertext, but a phone's lock screen shows what it is given.

The keys are made by the daemon at the first ``get_push_key``, in
``<agentDir>/web-push-key.pem`` (0600), and the subscriptions kept in
``<agentDir>/web-push.json`` (0600). An endpoint must be ``https://`` (the push service's
certificate verified): a device cannot make the daemon post to a plain-HTTP service of its
network. A device keeps at most `MAX_PER_DEVICE` subscriptions (its oldest dropped).

Resource handling: `WebPush.run` holds one worker, with one ``httpx.AsyncClient``, until
cancelled; `send` only queues. Neither the crypto libraries nor httpx are imported until a
key or a push is needed, so a daemon no browser subscribes to holds none of it.

Error handling: `send` never raises; a nudge goes to every subscription at once (a slow push
service holds up no other); a delivery that fails with a connection's error, 429 or 5xx is
tried once more; 404 or 410 (the browser unsubscribed) forgets the subscription, and so do
`MAX_FAILURES` failed deliveries in a row; every failure is one log line, never the
endpoint's path (a capability) or a key.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
import trio

from . import _wire as w
from ._devices import Principal
from ._errors import CommandError
from ._log import log, log_exception
from ._notify import Nudge, message, shown_url
from ._paths import rewrite
from ._tls import tls_context

if TYPE_CHECKING:
    import httpx

KEY_FILE = "web-push-key.pem"
SUBSCRIPTIONS_FILE = "web-push.json"
MAX_PER_DEVICE = 8
MAX_ENDPOINT_CHARS = 2048
TTL_S = 12 * 3600
"""How long a push service keeps a message for a phone that is off."""
RETRY_DELAY_S = 3.0
MAX_FAILURES = 5
"""Deliveries failed in a row (each tried twice) after which a subscription is forgotten."""
_TITLES = {"permission": "Permission needed", "dialog": "A question waits",
           "run_end": "Run finished", "run_error": "Run failed"}


def _unbase64(text: object, size: int, name: str) -> bytes:
    """`text`, URL-safe base64 (padding optional) of `size` bytes; `CommandError` else."""
    try:
        if not isinstance(text, str):
            raise ValueError(name)
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, binascii.Error):
        data = b""
    if len(data) != size:
        raise CommandError(f"push_subscribe: keys.{name} must be {size} bytes in URL-safe "
                           "base64")
    return data


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def subscription_of(data: w.JSONObject) -> dict[str, str]:
    """A browser's ``PushSubscription.toJSON()``, checked: its endpoint and keys."""
    endpoint = data.get("endpoint")
    keys = data.get("keys")
    if not isinstance(endpoint, str) or not isinstance(keys, dict):
        raise CommandError('push_subscribe: expected {"endpoint", "keys": {"p256dh", "auth"}}')
    try:
        parts = urlsplit(endpoint)
        valid = parts.scheme == "https" and bool(parts.hostname) and (
            len(endpoint) <= MAX_ENDPOINT_CHARS) and not parts.username and endpoint.isprintable()
    except ValueError:
        valid = False
    if not valid:
        raise CommandError("push_subscribe: the endpoint must be an https URL (a browser's "
                           f"push service), of {MAX_ENDPOINT_CHARS} characters at most")
    _unbase64(keys.get("p256dh"), 65, "p256dh")
    _unbase64(keys.get("auth"), 16, "auth")
    return {"endpoint": endpoint, "p256dh": str(keys["p256dh"]), "auth": str(keys["auth"])}


class WebPush:
    """The daemon's VAPID key, the subscriptions of paired devices, and their deliveries."""

    def __init__(self, folder: Path, *, paired: Callable[[str, str], bool],
                 subject: str = "mailto:forged@localhost", timeout_s: float = 10.0,
                 queue: int = 64) -> None:
        self.folder = folder
        self.paired = paired
        """Whether a device (by name, and its credential's digest) is still paired: the
        subscriptions of one revoked (paired again under its name or not) are dead."""
        self.subject = subject
        self.timeout_s = timeout_s
        self._vapid: Any = None
        self._failures: dict[str, int] = {}
        """Deliveries failed in a row, by endpoint."""
        self._send, self._queued = trio.open_memory_channel[tuple[Nudge, float]](queue)

    # --- keys and subscriptions ----------------------------------------------------------------

    def _key(self) -> Any:
        """The VAPID key (``py_vapid.Vapid02``), made and saved (0600) the first time."""
        if self._vapid is None:
            from py_vapid import Vapid02

            path = self.folder / KEY_FILE
            if path.exists():
                self._vapid = Vapid02.from_file(str(path))
            else:
                vapid = Vapid02()
                vapid.generate_keys()
                self.folder.mkdir(parents=True, exist_ok=True)
                rewrite(path, vapid.private_pem())
                self._vapid = vapid
        return self._vapid

    def public_key(self) -> str:
        """The key's public point, as a page hands it to ``pushManager.subscribe``."""
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return _b64(self._key().public_key.public_bytes(Encoding.X962,
                                                        PublicFormat.UncompressedPoint))

    def _read(self) -> list[dict[str, Any]]:
        try:
            data = orjson.loads((self.folder / SUBSCRIPTIONS_FILE).read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, orjson.JSONDecodeError) as exc:
            log(f"{self.folder / SUBSCRIPTIONS_FILE}: cannot be read ({exc!r}): no push is "
                "sent until a browser subscribes again")
            return []
        listed = data.get("subscriptions") if isinstance(data, dict) else None
        return [s for s in listed or [] if isinstance(s, dict)]

    def _write(self, subscriptions: list[dict[str, Any]]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        rewrite(self.folder / SUBSCRIPTIONS_FILE,
                orjson.dumps({"subscriptions": subscriptions}, option=orjson.OPT_INDENT_2))

    def subscribe(self, device: Principal, data: w.JSONObject) -> int:
        """`data` (a ``PushSubscription``) kept for `device`; how many it now has."""
        new: dict[str, Any] = {**subscription_of(data), "device": device.device,
                               "digest": device.digest, "created": int(time.time())}
        listed = self._read()
        if any(s.get("endpoint") == new["endpoint"] and s.get("device") != device.device
               for s in listed):
            raise CommandError("push_subscribe: another device subscribed this endpoint")
        kept = [s for s in listed if s.get("endpoint") != new["endpoint"]]
        own = [s for s in kept if s.get("device") == device.device]
        if len(own) >= MAX_PER_DEVICE:
            kept.remove(own[0])
        kept.append(new)
        self._write(kept)
        log(f"web push: device {device.device} subscribed ({shown_host(new['endpoint'])})")
        return sum(1 for s in kept if s.get("device") == device.device)

    def unsubscribe(self, device: str, endpoint: str) -> bool:
        listed = self._read()
        kept = [s for s in listed if not (s.get("endpoint") == endpoint
                                          and s.get("device") == device)]
        if len(kept) != len(listed):
            self._write(kept)
        return len(kept) != len(listed)

    def forget_device(self, device: str) -> None:
        """Every subscription of `device` gone (it was revoked)."""
        listed = self._read()
        kept = [s for s in listed if s.get("device") != device]
        if len(kept) != len(listed):
            self._write(kept)
            log(f"web push: {len(listed) - len(kept)} subscription(s) of {device} forgotten")

    async def handle(self, device: Principal, command: w.PushCommand) -> object:
        """A device's push command, answered (its files read and written in a thread)."""
        name = device.device
        if name is None:
            raise CommandError(f"{command.type} needs a paired device: a subscription ends "
                               "with its device (pair this browser: docs/web.md)")
        if isinstance(command, w.GetPushKey):
            return w.PushKey(public_key=await trio.to_thread.run_sync(self.public_key))
        if isinstance(command, w.PushSubscribe):
            subscription = command.subscription
            return w.PushSubscribed(subscriptions=await trio.to_thread.run_sync(
                lambda: self.subscribe(device, subscription)))
        endpoint = command.endpoint
        return w.PushUnsubscribed(removed=await trio.to_thread.run_sync(
            lambda: self.unsubscribe(name, endpoint)))

    # --- deliveries ----------------------------------------------------------------------------

    def send(self, nudge: Nudge) -> None:
        """Queue `nudge` for every subscription; never blocks nor raises."""
        try:
            self._send.send_nowait((nudge, time.time()))
        except trio.WouldBlock:
            log(f"web push: dropped the {nudge.event} nudge of session {nudge.session_id}: "
                "earlier ones still wait to be delivered")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the worker has ended: the daemon is shutting down

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        client: httpx.AsyncClient | None = None
        try:
            async for nudge, sent_at in self._queued:
                listed = await trio.to_thread.run_sync(self._read)
                subscriptions = [s for s in listed if self.paired(
                    str(s.get("device")), str(s.get("digest")))]
                if not subscriptions:
                    continue
                if client is None:
                    import httpx

                    client = httpx.AsyncClient(verify=tls_context(), timeout=self.timeout_s)
                async with trio.open_nursery() as deliveries:  # at once: one slow service
                    for subscription in subscriptions:  # holds up no other
                        deliveries.start_soon(self._deliver_one, client, subscription, nudge,
                                              sent_at)
        finally:
            if client is not None:
                with trio.CancelScope(shield=True):
                    await client.aclose()

    def body(self, subscription: dict[str, Any], nudge: Nudge) -> bytes:
        """`nudge` as a push message's body, encrypted to `subscription`'s browser."""
        import http_ece
        from cryptography.hazmat.primitives.asymmetric import ec

        payload = orjson.dumps({"title": f"forged: {_TITLES.get(nudge.event, nudge.event)}",
                                "body": message(nudge), "event": nudge.event,
                                "sessionId": nudge.session_id})
        return bytes(http_ece.encrypt(
            payload, private_key=ec.generate_private_key(ec.SECP256R1()),
            dh=_unbase64(subscription["p256dh"], 65, "p256dh"),
            auth_secret=_unbase64(subscription["auth"], 16, "auth"), version="aes128gcm"))

    async def _deliver_one(self, client: httpx.AsyncClient, subscription: dict[str, Any],
                           nudge: Nudge, sent_at: float) -> None:
        endpoint = str(subscription["endpoint"])
        try:
            delivered = await self._deliver(client, subscription, nudge, sent_at)
        except Exception as exc:  # a bug: the other pushes still go
            log_exception(f"web push to {shown_host(endpoint)} failed", exc)
            delivered = False
        failures = 0 if delivered else self._failures.get(endpoint, 0) + 1
        self._failures[endpoint] = failures
        if failures >= MAX_FAILURES:
            del self._failures[endpoint]
            device = str(subscription["device"])
            await trio.to_thread.run_sync(self.unsubscribe, device, endpoint)
            log(f"web push: the subscription of {device} at {shown_host(endpoint)} failed "
                f"{MAX_FAILURES} times in a row: forgotten")

    async def _deliver(self, client: httpx.AsyncClient, subscription: dict[str, Any],
                       nudge: Nudge, sent_at: float) -> bool:
        """Whether it was delivered (or is gone, and forgotten)."""
        import httpx

        endpoint = str(subscription["endpoint"])
        parts = urlsplit(endpoint)
        audience = f"{parts.scheme}://{parts.netloc}"
        headers = {**self._key().sign({"aud": audience, "sub": self.subject,
                                       "exp": int(sent_at) + TTL_S}),
                   "TTL": str(TTL_S), "Content-Encoding": "aes128gcm",
                   "Content-Type": "application/octet-stream",
                   "Urgency": "high" if nudge.event in ("permission", "dialog") else "normal"}
        body = self.body(subscription, nudge)
        for attempt in (1, 2):
            try:
                answer = await client.post(endpoint, content=body, headers=headers)
            except httpx.HTTPError as exc:
                problem = type(exc).__name__
            else:
                if answer.status_code in (404, 410):
                    await trio.to_thread.run_sync(self.unsubscribe,
                                                  str(subscription["device"]), endpoint)
                    log(f"web push: {shown_host(endpoint)} says the subscription of "
                        f"{subscription['device']} is gone (HTTP {answer.status_code}): "
                        "forgotten")
                    return True
                if answer.is_success:
                    return True
                problem = f"HTTP {answer.status_code}"
                if answer.status_code != 429 and answer.status_code < 500:
                    break
            if attempt == 1:
                await trio.sleep(RETRY_DELAY_S)
        log(f"web push: the {nudge.event} nudge to {subscription['device']} "
            f"({shown_host(endpoint)}) was not delivered: {problem}")
        return False


def shown_host(endpoint: str) -> str:
    """What a log line shows of an endpoint: its host (its path is the capability)."""
    return shown_url(endpoint).split("/", 3)[2] if "://" in endpoint else "?"
