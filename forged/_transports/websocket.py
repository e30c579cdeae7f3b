"""The WebSocket listener: one JSON object per text message, for holders of the token only.

A connection must present the token of ``<runtime dir>/ws-token`` (made 0600 when the daemon
starts), as ``Authorization: Bearer <token>``, or as a ``token`` query parameter between
loopback addresses only (a URL ends up in logs and histories); a request that carries an
``Origin`` header (a browser page) is refused unless that origin was allowed
(``--ws-allow-origin``), so no web page can drive the agent by itself. The listener binds to
loopback unless ``--ws-allow-remote`` is given, and then only with TLS (`Tls`: the
certificate and key of ``--tls-cert``/``--tls-key`` or ``daemon.tls``, loaded again on
SIGHUP for the connections that follow) or ``--insecure`` (behind a proxy that terminates
TLS). Every refusal is logged and answered with its HTTP status (401 without a valid token,
403 for a foreign origin).

Connections that have not shown the token yet are few and short-lived: at most
`MAX_UNAUTHENTICATED` at once (further ones wait in the kernel's backlog, holding no file
descriptor of the daemon), each given `HANDSHAKE_TIMEOUT_S` to complete its handshake. So no
crowd of idle connections can exhaust the daemon's descriptors and lock the owner out.
"""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import parse_qs

import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    wrap_server_stream,
)

from .. import _wire as w
from .._connection import Incoming, parse_line
from .._devices import OWNER, Access, Principal
from .._errors import ConfigError
from .._hub import Hub
from .._jsonl import MAX_LINE_BYTES
from .._log import log
from .._telemetry import Caller, caller_in, default_caller
from .http import MAX_HEAD_BYTES, Head, Replayed, bearer, origin_refused, read_head, serve_plain

MAX_UNAUTHENTICATED = 64
HANDSHAKE_TIMEOUT_S = 5.0


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_address(host: str, allow_remote: bool, *, tls: bool = False,
                  insecure: bool = False) -> None:
    """Refuse (`ConfigError`) to listen on `host` unless it is loopback, or the user allowed
    a remote address and it has TLS (or the user said `insecure`: a proxy terminates it)."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ConfigError(f"--ws {host}: not a loopback address; pass --ws-allow-remote to "
                          "listen there")
    if not tls and not insecure:
        raise ConfigError(f"--ws {host}: a listener other than loopback needs TLS: pass "
                          "--tls-cert FILE and --tls-key FILE (or set daemon.tls), or "
                          "--insecure when a proxy in front of it terminates TLS")


class Tls:
    """The listener's TLS: a server context of a certificate and key, made again by
    `reload` (SIGHUP) for the connections that follow; those open keep theirs."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.context = self._load()

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS: cannot load the certificate {self.cert} and key "
                              f"{self.key}: {exc}") from None
        return context

    def reload(self) -> None:
        """Load the files again; a failure keeps the context in use, and says why."""
        try:
            self.context = self._load()
        except ConfigError as exc:
            log(f"{exc}; the certificate loaded before stays in use")
            return
        log(f"TLS: reloaded {self.cert}")


def admit(head: Head, access: Access, allowed_origins: Sequence[str], *,
          url_token: bool = True) -> Principal | tuple[int, str]:
    """Whom an upgrade request stands for, or why it is refused (HTTP status and reason).
    A credential in ``Authorization: Bearer``; else a single-use ``ticket`` in the URL;
    else, only where `url_token` (a listener and a client on loopback), the owner's token
    as ``token``."""
    refused = origin_refused(head, allowed_origins, access.links)
    if refused is not None:
        return 403, refused
    query = parse_qs(head.query)
    offered = bearer(head)
    if offered is None and query.get("ticket"):
        principal = access.tickets.redeem(query["ticket"][0], trio.current_time())
        if principal is None or not access.current(principal):
            return 401, "unknown, used or expired ticket"
        return principal
    if offered is None and query.get("token"):
        if not url_token:
            return 401, ("a token in the URL is refused off loopback: send it as "
                         "Authorization: Bearer, or trade it for a ticket (POST /ticket)")
        offered = query["token"][0]
    if offered is None:
        return 401, "no token"
    principal = access.authenticate(offered)
    if principal is None:
        return 401, "wrong token"
    return principal


class WebSocketTransport:
    """A JSON object per text message, both ways."""

    def __init__(self, socket: WebSocketConnection, caller: Caller | None = None) -> None:
        self._socket = socket
        self._caller = caller
        """The upgrade's ``traceparent``: the parent of what a command without its own starts."""
        self.write_now: Callable[[bytes], int] | None = None

    async def write(self, batch: bytearray) -> None:
        try:
            for line in bytes(batch).split(b"\n")[:-1]:
                await self._socket.send_message(line.decode())
        except ConnectionClosed as exc:
            raise trio.BrokenResourceError("the WebSocket closed") from exc

    async def read(self, commands: trio.MemorySendChannel[Incoming]) -> None:
        async with commands:
            with contextlib.suppress(ConnectionClosed):
                while True:
                    message = await self._socket.get_message()
                    incoming = parse_line(message.encode() if isinstance(message, str)
                                          else message, w.DAEMON_COMMAND_CLASSES)
                    if incoming is not None:
                        default_caller(incoming.command, self._caller)
                        await commands.send(incoming)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._socket.aclose()


async def serve_websocket_peer(hub: Hub, socket: WebSocketConnection, name: str,
                               principal: Principal = OWNER, caller: Caller | None = None
                               ) -> None:
    """One WebSocket connection (`Hub.serve_connection`); `caller`, its upgrade's trace
    context."""
    await hub.serve_connection(name, WebSocketTransport(socket, caller), principal)


class GatedListener(trio.abc.Listener[trio.SocketStream]):
    """Accepts a connection only while a slot is free; whoever handles the connection
    releases its slot (once it has authenticated, or when it ends)."""

    def __init__(self, listener: trio.SocketListener, slots: trio.Semaphore) -> None:
        self.listener = listener
        self.slots = slots

    async def accept(self) -> trio.SocketStream:
        await self.slots.acquire()
        try:
            return await self.listener.accept()
        except BaseException:
            self.slots.release()
            raise

    async def aclose(self) -> None:
        await self.listener.aclose()


async def serve_websocket(hub: Hub, listeners: Sequence[trio.SocketListener], access: Access, *,
                          allowed_origins: Sequence[str] = (), tls: Tls | None = None,
                          handler_nursery: trio.Nursery | None = None,
                          task_status: trio.TaskStatus[list[GatedListener]] = (
                              trio.TASK_STATUS_IGNORED)) -> None:
    """Serve WebSocket connections on `listeners` until cancelled."""
    slots = trio.Semaphore(MAX_UNAUTHENTICATED)
    # Only when every listener is bound to loopback may a token come in a URL.
    loopback_only = all(is_loopback(listener.socket.getsockname()[0]) for listener in listeners)

    async def handle(stream: trio.SocketStream) -> None:
        host, port, *_ = stream.socket.getpeername()
        name = f"websocket client {host}:{port}"
        url_token = loopback_only and is_loopback(host)
        waiting = True
        channel: trio.abc.Stream = stream

        def authenticated() -> None:
            nonlocal waiting
            if waiting:
                waiting = False
                slots.release()

        try:
            async with trio.open_nursery() as connection_nursery:
                head: Head | None = None
                read = b""
                request: WebSocketRequest | None = None
                with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                    if tls is not None:
                        channel = trio.SSLStream(stream, tls.context, server_side=True,
                                                  https_compatible=True)
                        try:
                            await channel.do_handshake()
                        except trio.BrokenResourceError as exc:
                            log(f"dropped {name}: no TLS handshake ({exc.__cause__ or exc})")
                            return
                    head, read = await read_head(channel)
                    if head is not None and head.upgrade:
                        request = await wrap_server_stream(
                            connection_nursery, Replayed(channel, read),
                            max_message_size=MAX_LINE_BYTES)
                if head is None:
                    log(f"dropped {name}: no HTTP request it could read (within "
                        f"{HANDSHAKE_TIMEOUT_S:g} s, at most {MAX_HEAD_BYTES} bytes, no bare "
                        "CR or LF)")
                elif not head.upgrade:
                    with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                        await serve_plain(channel, head, read, access, name=name,
                                          address=host, allowed_origins=allowed_origins)
                elif request is None:
                    log(f"dropped {name}: no WebSocket handshake within "
                        f"{HANDSHAKE_TIMEOUT_S:g} s")
                elif isinstance(admitted := admit(head, access, allowed_origins,
                                                  url_token=url_token), tuple):
                    status, reason = admitted
                    log(f"refused {name}: {reason} (HTTP {status})")
                    with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                        await request.reject(status, body=reason.encode())
                else:
                    socket = await request.accept()
                    authenticated()
                    if admitted.device is not None:
                        device = access.devices.devices.get(admitted.device)
                        if device is not None:
                            access.devices.seen(device, host)
                    await serve_websocket_peer(hub, socket, name, admitted,
                                               caller_in(head.headers))
                connection_nursery.cancel_scope.cancel()
        finally:
            authenticated()
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await channel.aclose()

    await trio.serve_listeners(handle, [GatedListener(listener, slots) for listener in listeners],
                               handler_nursery=handler_nursery, task_status=task_status)
