"""The Unix socket: JSON lines as on stdio, and only for the user the daemon runs as.

The socket lives in a folder only that user may enter (0700) and is itself 0600; beyond the
file modes, each peer's uid is read with ``SO_PEERCRED`` and any other user is refused.

Where the socket lives, and how its folder is kept safe, is `forged._paths`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import trio

from .. import _wire as w
from .._codec import encode
from .._connection import Prefixed, StreamTransport, response
from .._errors import ConfigError
from .._hub import Hub
from .._log import log, log_exception
from .._paths import peer_uid, runtime_dir
from .._sandbox import confined_peer


def bind_unix(path: Path) -> trio.socket.SocketType:
    """A listening socket at `path` (0600, in a 0700 folder). A stale socket file is
    replaced; a socket a daemon still answers on is a `ConfigError`."""
    runtime_dir(path)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ConfigError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody listens: left by a daemon that died
        else:
            raise ConfigError(f"a forged daemon already listens on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # never, even for an instant, a socket others may open
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(listen_backlog())
    return trio.socket.from_stdlib_socket(sock)


def listen_backlog() -> int:
    """The system's most pending connections a socket may hold (``net.core.somaxconn``):
    a burst of clients waits to be accepted instead of being refused."""
    try:
        return max(socket.SOMAXCONN, int(Path("/proc/sys/net/core/somaxconn").read_text()))
    except (OSError, ValueError):
        return socket.SOMAXCONN


Upgrade = Callable[[Hub, dict[str, Any], trio.abc.HalfCloseableStream, bytes], Awaitable[None]]
"""Serves a connection whose first line asks for another protocol (``{"type": "acp", ...}``):
the request, the stream, and what was read after that line."""
UPGRADE_PREFIX = b'{"type":"acp"'


async def serve_stream_peer(hub: Hub, stream: trio.abc.HalfCloseableStream, name: str,
                            prefix: bytes = b"") -> None:
    """One JSON-lines connection (`Hub.serve_connection`); on a socket, lines are written
    straight to it while it takes them. `prefix`: what was read of it already."""
    receive = Prefixed(stream, prefix) if prefix else stream
    await hub.serve_connection(name, StreamTransport(receive, stream,
                                                     w.DAEMON_COMMAND_CLASSES))


async def _opening(stream: trio.abc.ReceiveStream) -> tuple[dict[str, Any] | None, bytes]:
    """The request of a connection that asks for another protocol, and what came after it;
    else None and what was read (at most until it cannot be such a request)."""
    read = b""
    while len(read) < len(UPGRADE_PREFIX) and UPGRADE_PREFIX.startswith(read):
        data = await stream.receive_some(1 << 16)
        if not data:
            return None, read
        read += data
    if not read.startswith(UPGRADE_PREFIX):
        return None, read
    while b"\n" not in read:
        data = await stream.receive_some(1 << 16)
        if not data or len(read) > 1 << 16:
            return None, read
        read += data
    line, _, rest = read.partition(b"\n")
    try:
        request = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, read
    return (request, rest) if isinstance(request, dict) else (None, read)


async def serve_unix(hub: Hub, listener_socket: trio.socket.SocketType, *,
                     handler_nursery: trio.Nursery | None = None,
                     upgrade: Upgrade | None = None,
                     task_status: trio.TaskStatus[list[trio.SocketListener]] = (
                         trio.TASK_STATUS_IGNORED)) -> None:
    """Accept connections on `listener_socket` until cancelled; connections run in
    `handler_nursery` (so they can outlive the listening, while a daemon drains). One whose
    first line asks for ACP is served by `upgrade`, when given."""
    uid = os.getuid()

    async def handle(stream: trio.SocketStream) -> None:
        peer = peer_uid(stream)
        if peer != uid:
            log(f"refused a connection from uid {peer}: only uid {uid} may connect")
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(encode(response(
                    "connect", error=f"Permission denied: uid {peer} is not the daemon's "
                    f"user (uid {uid})")))
                await stream.aclose()
            return
        confined = await trio.to_thread.run_sync(confined_peer, stream.socket.fileno())
        if confined is not None:
            log(f"refused a connection on the socket: {confined}")
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(encode(response(
                    "connect", error=f"Permission denied: {confined}, and the daemon takes "
                    "no command from a confined process")))
                await stream.aclose()
            return
        name = f"unix client (uid {peer})"
        if upgrade is None:
            await serve_stream_peer(hub, stream, name)
            return
        request, read = await _opening(stream)
        if request is None:
            await serve_stream_peer(hub, stream, name, read)
        else:
            log(f"{name} connected, speaking ACP")
            try:
                await upgrade(hub, request, stream, read)
            except Exception as exc:  # this connection's failure, never the daemon's
                log_exception(f"{name}: its ACP front failed: {exc!r}", exc)

    listener = trio.SocketListener(listener_socket)
    await trio.serve_listeners(handle, [listener], handler_nursery=handler_nursery,
                               task_status=task_status)
