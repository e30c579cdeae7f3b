"""Where forged keeps things, how to reach the daemon safely, and the one way it replaces a
file. Low in the house: it imports nothing of forged but the exception tree.

- ``<agentDir>``: ``$AGENT_FORGE_DIR``, else ``~/.agent-forge/agent``; sessions under
  ``<agentDir>/sessions/--<cwd with / as ->--``.
- The daemon's folder: ``$XDG_RUNTIME_DIR/forged``, else ``/tmp/forged-<uid>/forged``. In
  ``/tmp`` another user could make the folder first, so a folder (and the fallback's parent)
  that is not the user's own, not a real folder, or open to others is refused by the daemon
  and by every client alike; a client also checks, with ``SO_PEERCRED``, that the daemon is
  the user's.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

import trio

from . import _runtime
from ._errors import ConfigError
from ._thin import socket_uid

WS_TOKEN_FILE = "ws-token"
BUSY_RETRY_S = 2.0
BUSY_PAUSE_S = 0.005
"""A daemon too busy to accept a connection now (``EAGAIN``) is tried again, from this
pause, doubling, for `BUSY_RETRY_S`."""


def agent_dir() -> Path:
    """``AGENT_FORGE_DIR``, else the ancestor's ``PI_CODING_AGENT_DIR`` (a launcher that sets
    it finds forged's files where it looks), else ``~/.agent-forge/agent``."""
    for variable in ("AGENT_FORGE_DIR", "PI_CODING_AGENT_DIR"):
        configured = os.environ.get(variable)
        if configured:
            return Path(configured).expanduser()
    return Path.home() / ".agent-forge" / "agent"


def session_dir_for(agent_dir: Path, cwd: Path) -> Path:
    """``<agentDir>/sessions/--<cwd with / as ->--``."""
    encoded = str(cwd).lstrip("/").replace("/", "-").replace(":", "-")
    return agent_dir / "sessions" / f"--{encoded}--"


# --- the daemon's folder -----------------------------------------------------------------------

def default_socket_path() -> Path:
    return Path(_runtime.default_socket_path())


def runtime_dir(socket_path: Path) -> Path:
    """The socket's folder (the WebSocket token lives there too), made 0700 if needed; a
    `ConfigError` if it, or the ``/tmp`` fallback's parent, is not safely the user's."""
    return Path(_runtime.runtime_folder(str(socket_path)))


def ws_token_path(folder: Path | None = None) -> Path:
    """The file holding the token a WebSocket client must present (beside the socket)."""
    return (folder or default_socket_path().parent) / WS_TOKEN_FILE


def make_ws_token(folder: Path) -> str:
    """A fresh token in `folder`/ws-token, readable by the user only."""
    runtime_dir(folder / "forged.sock")
    path = ws_token_path(folder)
    token = secrets.token_urlsafe(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def read_ws_token(folder: Path | None = None) -> str:
    return ws_token_path(folder).read_text().strip()


def peer_uid(stream: trio.SocketStream) -> int:
    return socket_uid(stream.socket)  # type: ignore[arg-type]


async def open_daemon_socket(socket_path: Path) -> trio.SocketStream:
    """A connection to the daemon at `socket_path`, after checking its folder is the
    user's and that the process listening is the user's (``SO_PEERCRED``); `ConfigError`
    otherwise, `OSError` when nothing listens (or it stays too busy to take one, for
    `BUSY_RETRY_S`)."""
    _runtime.check_runtime(str(socket_path))
    # Not trio.open_unix_socket: it takes EAGAIN (a full queue of connections waiting to be
    # accepted) for a connect under way, and returns a socket that is not connected.
    retry_until = trio.current_time() + BUSY_RETRY_S
    pause = BUSY_PAUSE_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(socket_path))  # a Unix socket connects at once, or fails
        except BlockingIOError:
            sock.close()
            if trio.current_time() >= retry_until:
                raise
            await trio.sleep(pause)
            pause = min(pause * 2, 0.1)
            continue
        except BaseException:
            sock.close()
            raise
        break
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    uid = peer_uid(stream)
    if uid != os.getuid():
        await stream.aclose()
        raise ConfigError(f"refusing the daemon on {socket_path}: it runs as uid {uid}, "
                          f"not uid {os.getuid()}")
    return stream


# --- replacing a file --------------------------------------------------------------------------

def rewrite(path: Path, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Replace the file at `path` with `data`: a temporary file beside it (its own, so that
    threads replacing one file at once do not share one), fsynced, renamed over it, and the
    directory fsynced (unless not `durable`: a cache, whose loss costs nothing). A failure
    leaves `path` as it was and no temporary file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a failed write leaves nothing behind
        raise
    if durable:
        fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
