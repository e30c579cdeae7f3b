"""``<agentDir>/auth.json``: the credentials a user saved, in the file the ancestor writes
(``pi /login``), so pi and forged share one.

The file is an object keyed by provider: ``{"type": "api_key", "key", "env"?}`` (the key
resolved as models.json values are, `env` adding variables for its ``$NAME`` references) or
``{"type": "oauth", "access", "refresh", "expires" (ms since 1970), ...}`` (a subscription's
tokens, with whatever else its provider keeps: an account id, an enterprise host).

Changes are made under the ancestor's lock, as npm ``proper-lockfile`` takes it: the folder
``<auth.json's real path>.lock``, made with ``mkdir`` (which only one process can do), its
modification time renewed while it is held, and taken over when that time is older than
`STALE_S` (its holder died). The file is then read again, changed and replaced whole (a
temporary file renamed over it, mode 0600), so a crash or a full disk never leaves half a
file, and entries another process wrote in the meantime are kept.

Reading needs no lock: the file is read again only when its size, time or inode changed. A
file caught half-written (the ancestor writes in place) is read again at the next use.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import trio

from ._errors import LockTimeout
from ._log import log
from ._paths import rewrite

STALE_S = 30.0
"""A lock folder not renewed for this long belongs to a process that died (the ancestor's
own waiting limit)."""
RENEW_S = 5.0
WAIT_S = 30.0
"""How long a change waits for another process's lock before it gives up."""

Entry = dict[str, Any]
EARLY_MS = 5 * 60 * 1000
"""How long before it expires a Claude or Copilot token is saved as expired, as the ancestor
saves them (a refresh comes before a request can fail)."""


class AuthFile:
    """One auth.json, read when it changed on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, Entry] = {}
        self._revision: tuple[int, int, int] | None = None
        self._said: tuple[int, int, int] | None = None
        """The revision of the unreadable file last said on stderr."""

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            status = os.stat(self.path)
        except OSError:
            return None
        return (status.st_ino, status.st_size, status.st_mtime_ns)

    def entries(self) -> dict[str, Entry]:
        """Every provider's credential, as the file holds them now; {} without a file. A
        file that is not a JSON object is said once on stderr and read as empty."""
        revision = self._stat()
        if revision is None:
            self._entries, self._revision = {}, None
        elif revision != self._revision:
            try:
                self._entries = parse(self.path.read_bytes())
                self._revision = revision
            except (OSError, ValueError) as exc:
                if self._said != revision:
                    self._said = revision
                    log(f"{self.path}: {exc}; its credentials are not used")
                self._entries = {}
        return self._entries

    def get(self, provider: str) -> Entry | None:
        return self.entries().get(provider)

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[dict[str, Entry]]:
        """Hold the file's lock, yielding its entries as read under it."""
        lock = self._lock_path()
        await _take(lock)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_renew, lock)
                try:
                    yield parse(self.path.read_bytes())
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(lock)

    async def modify(self, provider: str,
                     change: Callable[[Entry | None], Awaitable[Entry | None]]) -> Entry | None:
        """Under the lock: `change` of the provider's entry as the file holds it now; a
        result that is not None replaces it (the others kept as they are on disk)."""
        async with self.locked() as entries:
            new = await change(entries.get(provider))
            if new is not None:
                entries[provider] = new
                self._write(entries)
            return new if new is not None else entries.get(provider)

    async def delete(self, provider: str) -> bool:
        async with self.locked() as entries:
            if entries.pop(provider, None) is None:
                return False
            self._write(entries)
            return True

    def _lock_path(self) -> Path:
        """The lock folder of the file, which is made (``{}``, with its folder) if missing,
        as the ancestor does: the lock is named after the file's real path."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            rewrite(self.path, b"{}")
        return Path(os.path.realpath(self.path) + ".lock")

    def _write(self, entries: dict[str, Entry]) -> None:
        data = orjson.dumps(entries, option=orjson.OPT_INDENT_2)
        rewrite(Path(os.path.realpath(self.path)), data)
        self._revision = None


def parse(data: bytes) -> dict[str, Entry]:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if not data.strip():
        return {}
    parsed = orjson.loads(data)
    if not isinstance(parsed, dict):
        raise ValueError("not a JSON object")
    return {str(name): entry for name, entry in parsed.items() if usable(entry)}


def usable(entry: Any) -> bool:
    """An entry forged can use, as the ancestor checks it."""
    if not isinstance(entry, dict):
        return False
    if entry.get("type") == "api_key":
        env = entry.get("env")
        return (isinstance(entry.get("key"), str | None)
                and (env is None or (isinstance(env, dict)
                                     and all(isinstance(v, str) for v in env.values()))))
    return (entry.get("type") == "oauth" and isinstance(entry.get("access"), str)
            and isinstance(entry.get("refresh"), str)
            and isinstance(entry.get("expires"), int | float)
            and not isinstance(entry.get("expires"), bool))


def expired(entry: Entry, now_ms: float | None = None) -> bool:
    return bool(entry["expires"] <= (time.time() * 1000 if now_ms is None else now_ms))


async def _take(lock: Path) -> None:
    deadline = trio.current_time() + WAIT_S
    delay = 0.01
    while True:
        try:
            os.mkdir(lock)
            return
        except FileExistsError:
            pass
        with contextlib.suppress(FileNotFoundError):
            if time.time() - os.stat(lock).st_mtime > STALE_S:
                with contextlib.suppress(OSError):
                    os.rmdir(lock)
                continue
        if trio.current_time() >= deadline:
            raise LockTimeout(f"{lock} has been held by another process for {WAIT_S:g} s; "
                              "if no pi or forged is running, remove it")
        await trio.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 1.0)


async def _renew(lock: Path) -> None:
    while True:
        await trio.sleep(RENEW_S)
        with contextlib.suppress(OSError):
            os.utime(lock)
