"""A session's files: which one it starts with, the ones ``new_session``, ``switch_session``,
``fork`` and ``clone`` switch it to, and the page ``export_html`` writes.

Each switch is described by a *maker*: a function from the current file to the next one,
which `Session.switch` runs in a worker thread (a file may be large) once the session has
settled. A maker that fails leaves the session on its file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import trio

from . import _wire as w
from ._context import user_text
from ._errors import CommandError
from ._paths import rewrite
from ._stats import UsageTotals
from ._store import LEAF, SessionFile, looks_like_session

Maker = Callable[[SessionFile], SessionFile]


def open_store(session_path: Path | None, session_dir: Path | None, cwd: Path, *,
               session_id: str | None = None, fork_from: Path | None = None) -> SessionFile:
    """The file a session starts with: `session_path` to continue, else a new one in
    `session_dir` (None: in memory) with `session_id` (else a fresh one), holding a copy of
    `fork_from`'s active branch if given."""
    if session_path is not None:
        return open_or_create(session_path, cwd)
    if fork_from is not None:
        source = SessionFile.snapshot(fork_from)
        try:
            entries = source.branch(LEAF)
        finally:
            source.close()
        return SessionFile.branched(session_dir, cwd, str(fork_from), entries,
                                    session_id=session_id)
    return SessionFile.create(session_dir, cwd, session_id=session_id)


def open_or_create(path: Path, cwd: Path) -> SessionFile:
    """The session file at `path`; a path that does not exist yet is a new session there,
    locked at once (a second forged naming it is refused before either writes)."""
    path = path.expanduser().resolve()
    if path.exists():
        return SessionFile.open(path, cwd)
    store = SessionFile.create(path.parent, cwd)
    store.path = path
    store.lock()
    return store


def new_store(session_dir: Path | None, cwd: Path, parent_session: str | None) -> Maker:
    """An empty session, written (with `parent_session` in its header) once it has a
    message."""
    return lambda _: SessionFile.create(session_dir, cwd, parent_session)


def file_store(cwd: Path, path: Path) -> Maker:
    """The session file at `path` (relative to `cwd`), or a new one there."""
    path = (cwd / path.expanduser()).resolve()

    def make(current: SessionFile) -> SessionFile:
        if current.path == path:
            current.close()  # the same file again: let go of the lock first
        return open_or_create(path, cwd)

    return make


def branch_store(cwd: Path, leaf: int | None) -> Maker:
    """A new session holding the active branch up to position `leaf` (`LEAF`: all of it;
    None: none of it), beside the current file, which its header names as
    ``parentSession``."""
    def make(current: SessionFile) -> SessionFile:
        parent = current.path
        return SessionFile.branched(parent.parent if parent else None, cwd,
                                    str(parent) if parent else None, current.branch(leaf))

    return make


def fork_point(store: SessionFile, entry_id: str) -> tuple[str, int | None]:
    """The text of a user message on the active branch, and its parent's position."""
    position = store.index.get(entry_id)
    entry = (store.entry(position)
             if position is not None and position in set(store.path_to_leaf()) else {})
    message = entry.get("message") if entry.get("type") == "message" else None
    if not isinstance(message, dict) or message.get("role") != "user":
        raise CommandError("Invalid entry ID for forking")
    parent = entry.get("parentId")
    return user_text(message), store.index.get(parent) if parent else None


def entry_position(store: SessionFile, entry_id: str) -> int:
    """Where the entry `entry_id` is in the file, on any branch."""
    position = store.index.get(entry_id)
    if position is None:
        raise CommandError(f"Unknown entry id: {entry_id}")
    return position


def fork_messages(store: SessionFile) -> list[w.ForkMessage]:
    """The user messages of the active branch that have text."""
    out: list[w.ForkMessage] = []
    for position in store.path_to_leaf():
        if store.kind(position) != "message":
            continue
        entry = store.entry(position)
        message = entry.get("message")
        if isinstance(message, dict) and message.get("role") == "user":
            text = user_text(message)
            if text.strip():
                out.append(w.ForkMessage(entry_id=entry["id"], text=text))
    return out


async def export_html(store: SessionFile, cwd: Path, output_path: str | None, *,
                      name: str | None, model: w.Model | None) -> str:
    """Write the session as HTML (`forged._export`), in a thread; return the path."""
    count = len(store)

    def write() -> str:
        from ._export import render  # markdown-it: loaded only to export

        if store.path is None:
            raise CommandError("Cannot export in-memory session to HTML")
        if not store.path.exists():
            raise CommandError("Nothing to export yet - start a conversation first")
        target = export_target(cwd, output_path or f"forged-session-{store.path.stem}.html",
                               store.path)
        totals = UsageTotals()
        totals.count(store)
        page = render(store, count, name=name, model=model, totals=totals)
        target.parent.mkdir(parents=True, exist_ok=True)
        rewrite(target, page.encode(), 0o644)
        return str(target)

    return await trio.to_thread.run_sync(write)


def export_target(cwd: Path, output_path: str, session_path: Path) -> Path:
    """Where `export_html` may write: never a session file or its lock (the page would
    replace the conversation), never a folder, device or symbolic link; relative to `cwd`.
    `CommandError` naming the path otherwise."""
    named = cwd / Path(output_path).expanduser()
    try:
        target = named.parent.resolve() / named.name
        info = target.lstat() if target.exists() or target.is_symlink() else None
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise CommandError(f"Not exporting to {target}: it is a symbolic link (to "
                               f"{os.readlink(target)}); name the file itself")
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise CommandError(f"Not exporting to {target}: it is not a regular file")
        is_session = target == session_path.resolve() or target.name.endswith(".lock")
        if info is not None and not is_session:
            with target.open("rb") as existing:
                is_session = looks_like_session(existing.read(4096).lstrip())
    except OSError as exc:
        raise CommandError(f"Cannot export to {named}: {exc.strerror}") from None
    if is_session:
        raise CommandError(f"Not exporting to {target}: it is a session file")
    return target
