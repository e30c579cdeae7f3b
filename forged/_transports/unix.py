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
from pathlib import Path

import trio

from .. import _wire as w
from .._codec import encode
from .._connection import StreamTransport, response
from .._errors import ConfigError
from .._hub import Hub
from .._log import log
from .._paths import peer_uid, runtime_dir


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


async def serve_stream_peer(hub: Hub, stream: trio.abc.HalfCloseableStream, name: str) -> None:
    """One JSON-lines connection (`Hub.serve_connection`); on a socket, lines are written
    straight to it while it takes them."""
    await hub.serve_connection(name, StreamTransport(stream, stream, w.DAEMON_COMMAND_CLASSES))


async def serve_unix(hub: Hub, listener_socket: trio.socket.SocketType, *,
                     handler_nursery: trio.Nursery | None = None,
                     task_status: trio.TaskStatus[list[trio.SocketListener]] = (
                         trio.TASK_STATUS_IGNORED)) -> None:
    """Accept connections on `listener_socket` until cancelled; connections run in
    `handler_nursery` (so they can outlive the listening, while a daemon drains)."""
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
        await serve_stream_peer(hub, stream, f"unix client (uid {peer})")

    listener = trio.SocketListener(listener_socket)
    await trio.serve_listeners(handle, [listener], handler_nursery=handler_nursery,
                               task_status=task_status)
