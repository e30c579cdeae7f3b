"""The runtime folder: where the daemon's socket, its WebSocket token and the code cache
live, and the one rule that makes it trusted.

The folder is ``$XDG_RUNTIME_DIR/forged``, else ``/tmp/forged-<uid>/forged`` (``--socket``
moves it: the folder is always the socket's). It is trusted only while it is a real folder of
this user's that no other user may enter, and, for the ``/tmp`` fallback, its parent too: the
socket there is the user's own daemon, the token the user's own, and the code cache holds
code that forged runs unconfined at its next start (`forged._codecache`). The sandbox hides it
from confined commands (`forged._tools.guard`).

On the standard library alone, below everything else: the thin client (`forged._thin`) reads
it before anything of trio or attrs is loaded.
"""

from __future__ import annotations

import os
import stat
import sys

from ._errors import ConfigError


def fallback_runtime() -> str:
    return f"/tmp/forged-{os.getuid()}"


def default_socket_path() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR") or fallback_runtime()
    return os.path.join(runtime, "forged", "forged.sock")


def guarded_folders(socket_path: str) -> list[str]:
    folder = os.path.dirname(os.path.normpath(socket_path))
    parent = os.path.dirname(folder)
    return [parent, folder] if parent == fallback_runtime() else [folder]


def check_folder(folder: str | os.PathLike[str]) -> None:
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


def check_runtime(socket_path: str) -> None:
    """`ConfigError` unless the socket's folder (and the ``/tmp`` fallback's parent) is safely
    the user's; `OSError` when there is none."""
    for folder in guarded_folders(socket_path):
        check_folder(folder)


def runtime_folder(socket_path: str) -> str:
    """The socket's folder, made 0700 if needed (and the ``/tmp`` fallback's parent); a
    `ConfigError` if one is not safely the user's, `OSError` if it cannot be made."""
    folders = guarded_folders(socket_path)
    os.makedirs(os.path.dirname(folders[0]), exist_ok=True)
    for folder in folders:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        check_folder(folder)
    return folders[-1]


def code_cache_path() -> str:
    """The code cache's file (`forged._codecache`), per interpreter build, beside the default
    socket."""
    return os.path.join(os.path.dirname(default_socket_path()),
                        f"code-{sys.implementation.cache_tag}-{sys.hexversion:x}")
