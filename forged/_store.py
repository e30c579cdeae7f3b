"""Session files: the version 3 JSONL tree of the TypeScript ancestor, written crash-safely.

A file is a header line (``{"type":"session","version":3,"id",...}``) and then one entry per
line, ``{type, id, parentId, timestamp, ...}``; the leaf is the last entry in file order.
Entries are kept as the JSON objects they were read or written as, so files written by the
ancestor round-trip unchanged.

Durability: the file is created with the first ``message`` entry (entries before it wait in
memory); each entry is one ``write`` of a whole line, and user and assistant messages are
fsynced. A torn last line (no newline, or not JSON) is left out and cut off before the next
append. One process writes a file at a time: an advisory lock on ``<file>.lock``, which also
names the holder.

Resource handling: `SessionFile.close` releases the lock and the file; a process that dies
releases both with it.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import uuid
from pathlib import Path
from typing import Any

import orjson

from . import _wire as w
from ._errors import CommandError
from ._jsonl import encode_line

SESSION_VERSION = 3
FSYNCED_ROLES = ("user", "assistant")

Entry = dict[str, Any]


class SessionLockedError(CommandError):
    """Another process holds the session file."""


def iso_now() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def session_dir_for(agent_dir: Path, cwd: Path) -> Path:
    """``<agentDir>/sessions/--<cwd with / as ->--`` (DECISIONS.md §5)."""
    encoded = str(cwd).lstrip("/").replace("/", "-").replace(":", "-")
    return agent_dir / "sessions" / f"--{encoded}--"


def new_file_name(timestamp: str, session_id: str) -> str:
    return f"{timestamp.replace(':', '-').replace('.', '-')}_{session_id}.jsonl"


class SessionFile:
    """One session's entries, in memory and (unless `path` is None) on disk."""

    def __init__(self, path: Path | None, header: Entry, entries: list[Entry]) -> None:
        self.path = path
        self.header = header
        self.entries = entries
        self.index = {entry["id"]: position for position, entry in enumerate(entries)
                      if isinstance(entry.get("id"), str)}
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._truncate_to: int | None = None

    # --- creating and opening ------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path | None, cwd: Path,
               parent_session: str | None = None) -> SessionFile:
        """A new session; nothing is written until its first message entry."""
        header: Entry = {"type": "session", "version": SESSION_VERSION,
                         "id": str(uuid.uuid4()), "timestamp": iso_now(), "cwd": str(cwd)}
        if parent_session is not None:
            header["parentSession"] = parent_session
        path = None if directory is None else directory / new_file_name(header["timestamp"],
                                                                        header["id"])
        return cls(path, header, [])

    @classmethod
    def open(cls, path: Path) -> SessionFile:
        """Open an existing file for writing: lock it, read it, note a torn tail to cut."""
        path = path.resolve()
        lock_fd = _lock(path)
        try:
            data = path.read_bytes()
        except BaseException:
            os.close(lock_fd)
            raise
        header, entries, good_length = parse(data)
        session = cls(path, header, entries)
        session._lock_fd = lock_fd
        if good_length < len(data):
            session._truncate_to = good_length
        session._open_for_append()
        return session

    # --- reading -------------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return str(self.header["id"])

    @property
    def leaf_id(self) -> str | None:
        return self.entries[-1]["id"] if self.entries else None

    @property
    def written(self) -> bool:
        """Whether the file exists on disk (it is created with the first message)."""
        return self._fd is not None

    def entries_since(self, entry_id: str | None) -> list[Entry]:
        """Entries strictly after `entry_id` in file order; all of them for None."""
        if entry_id is None:
            return list(self.entries)
        position = self.index.get(entry_id)
        if position is None:
            raise CommandError(f"Unknown entry id: {entry_id}")
        return self.entries[position + 1:]

    # --- writing -------------------------------------------------------------------------------

    def new_id(self) -> str:
        while True:
            candidate = uuid.uuid4().hex[:8]
            if candidate not in self.index:
                return candidate

    def append(self, entry_type: str, **fields: Any) -> Entry:
        """Append an entry as a child of the current leaf and return it."""
        entry: Entry = {"type": entry_type, "id": self.new_id(), "parentId": self.leaf_id,
                        "timestamp": iso_now(), **fields}
        self.index[entry["id"]] = len(self.entries)
        self.entries.append(entry)
        if self.path is None:
            return entry
        if self._fd is None:
            if entry_type != "message":
                return entry  # a new file: written with the header and the first message
            self._open_for_append()
        else:
            self._write(encode_line(entry))
        if entry_type == "message" and entry["message"].get("role") in FSYNCED_ROLES:
            assert self._fd is not None
            os.fsync(self._fd)
        return entry

    def _open_for_append(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._lock_fd is None:
            self._lock_fd = _lock(self.path)
        existed = self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if self._truncate_to is not None:
            os.ftruncate(self._fd, self._truncate_to)
            self._truncate_to = None
        if not existed:
            # A new file: the header and every entry so far, the first message last.
            self._write(b"".join(encode_line(line) for line in [self.header, *self.entries]))
            _fsync_directory(self.path.parent)

    def _write(self, line: bytes) -> None:
        assert self._fd is not None
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view):]

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock_fd = None


def parse(data: bytes) -> tuple[Entry, list[Entry], int]:
    """Header, entries, and the length of the part of `data` that is whole, valid lines."""
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # bytes after the last newline: a torn write
    header: Entry | None = None
    entries: list[Entry] = []
    good_length = 0
    offset = 0
    for index, line in enumerate(complete):
        offset += len(line) + 1
        try:
            value = orjson.loads(line) if line.strip() else None
        except orjson.JSONDecodeError:
            if index == len(complete) - 1 and not tail:
                break  # a torn last line: dropped, and cut before the next append
            continue  # a bad line in the middle is skipped, as the ancestor does
        good_length = offset
        if not isinstance(value, dict):
            continue
        if header is None:
            if value.get("type") != "session" or not isinstance(value.get("id"), str):
                raise CommandError("Not a session file: the first line is not a session header")
            header = value
        else:
            entries.append(value)
    if header is None:
        raise CommandError("Not a session file: no session header")
    return header, entries, good_length


def _lock(path: Path) -> int:
    lock_path = path.with_name(path.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise SessionLockedError(
            f"Session file {path} is in use by another forged process (pid {holder})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def entry_tree(entries: list[Entry]) -> list[w.TreeNode]:
    """Every entry as a node, children in file order; entries whose parent is missing are
    roots too. A node's label is the latest ``label`` entry that targets it."""
    labels: dict[str, Entry] = {}
    for entry in entries:
        if entry.get("type") == "label" and isinstance(entry.get("targetId"), str):
            labels[entry["targetId"]] = entry
    nodes: dict[str, w.TreeNode] = {}
    roots: list[w.TreeNode] = []
    for entry in entries:
        label = labels.get(entry.get("id", ""))
        node = w.TreeNode(entry=entry, children=[],
                          label=(label.get("label") or None) if label else None,
                          label_timestamp=label.get("timestamp") if label and label.get("label")
                          else None)
        if isinstance(entry.get("id"), str):
            nodes[entry["id"]] = node
        parent = nodes.get(entry.get("parentId") or "")
        (parent.children if parent is not None else roots).append(node)
    return roots
