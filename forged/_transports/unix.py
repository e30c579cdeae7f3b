"""The Unix socket: JSON lines as on stdio, and only for the user the daemon runs as.

The socket lives in a folder only that user may enter (0700) and is itself 0600; beyond the
file modes, each peer's uid is read with ``SO_PEERCRED`` and any other user is refused.

The folder is ``$XDG_RUNTIME_DIR/forged``, else ``/tmp/forged-<uid>/forged``: in ``/tmp``
another user could make the folder first, so a folder (and the fallback's parent) that is not
the user's own, not a real folder, or open to others is refused by the daemon and by every
client alike; a client also checks, with ``SO_PEERCRED``, that the daemon is the user's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from pathlib import Path

import trio

from .. import _codec
from .. import _wire as w
from .._connection import Incoming, serve_reader, write_now_to
from .._errors import ConfigError
from .._hub import Hub, log
from .._jsonl import encode_line


def fallback_runtime() -> Path:
    return Path(f"/tmp/forged-{os.getuid()}")


def default_socket_path() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR") or str(fallback_runtime())
    return Path(runtime) / "forged" / "forged.sock"


def check_folder(folder: Path) -> None:
    """`ConfigError` unless `folder` is a real folder (no symbolic link) of this user that
    no other user may enter; `OSError` when there is none."""
    info = os.lstat(folder)  # FileNotFoundError: no daemon made it (yet)
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"refusing {folder}: not a folder (a symbolic link?)")
    if info.st_uid != os.getuid():
        raise ConfigError(f"refusing {folder}: it belongs to uid {info.st_uid}, not to uid "
                          f"{os.getuid()}; another user may have made it")
    if info.st_mode & 0o077:
        raise ConfigError(f"refusing {folder}: other users may enter it (mode "
                          f"{stat.S_IMODE(info.st_mode):o}); it must be 0700")


def _guarded_folders(socket_path: Path) -> list[Path]:
    folder = socket_path.parent
    return [folder.parent, folder] if folder.parent == fallback_runtime() else [folder]


def runtime_dir(socket_path: Path) -> Path:
    """The socket's folder (the WebSocket token lives there too), made 0700 if needed; a
    `ConfigError` if it, or the ``/tmp`` fallback's parent, is not safely the user's."""
    folders = _guarded_folders(socket_path)
    folders[0].parent.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        check_folder(folder)
    return socket_path.parent


async def open_daemon_socket(socket_path: Path) -> trio.SocketStream:
    """A connection to the daemon at `socket_path`, after checking its folder is the
    user's and that the process listening is the user's (``SO_PEERCRED``); `ConfigError`
    otherwise, `OSError` when nothing listens."""
    for folder in _guarded_folders(socket_path):
        check_folder(folder)
    stream = await trio.open_unix_socket(str(socket_path))
    uid = peer_uid(stream)
    if uid != os.getuid():
        await stream.aclose()
        raise ConfigError(f"refusing the daemon on {socket_path}: it runs as uid {uid}, "
                          f"not uid {os.getuid()}")
    return stream


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
    sock.listen(128)
    return trio.socket.from_stdlib_socket(sock)


def peer_uid(stream: trio.SocketStream) -> int:
    creds = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                     struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return int(uid)


async def serve_stream_peer(hub: Hub, stream: trio.abc.HalfCloseableStream, name: str) -> None:
    """One JSON-lines connection (`Hub.serve_connection`); on a socket, lines are written
    straight to it while it takes them."""
    async def read(commands: trio.MemorySendChannel[Incoming]) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await serve_reader(stream, commands, w.DAEMON_COMMAND_CLASSES)

    async def close() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.aclose()

    await hub.serve_connection(name, stream.send_all, read, close, write_now_to(stream))


def _refusal(error: str) -> bytes:
    return encode_line(_codec.unstructure(w.Response(command="connect", success=False,
                                                     error=error)))


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
                await stream.send_all(_refusal(f"Permission denied: uid {peer} is not the "
                                               f"daemon's user (uid {uid})"))
                await stream.aclose()
            return
        await serve_stream_peer(hub, stream, f"unix client (uid {peer})")

    listener = trio.SocketListener(listener_socket)
    await trio.serve_listeners(handle, [listener], handler_nursery=handler_nursery,
                               task_status=task_status)
