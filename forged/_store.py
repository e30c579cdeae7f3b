"""Session files: the version 3 JSONL tree of the TypeScript ancestor, written crash-safely.

A file is a header line (``{"type":"session","version":3,"id",...}``) and then one entry per
line, ``{type, id, parentId, timestamp, ...}``; the leaf is the last entry in file order.
Entries are kept as the JSON objects they were read or written as, so files written by the
ancestor round-trip unchanged.

Durability: the file is created with the first ``message`` entry (entries before it wait in
memory); each entry is one ``write`` of a whole line, and user and assistant messages are
fsynced. A torn last line (no newline, or not JSON) is left out and cut off before the next
append; a write that fails (a full disk) is cut back to the last whole line and raised as
`PersistenceError`, the entry neither indexed nor stored. A line in the middle that is not an
entry is skipped with a warning. One process writes a file at a time: an advisory lock on
``<file>.lock``, which also names the holder, taken before the first write (at once for a
path the user named).

Only a session file is ever opened for writing: a file that does not start like one (a
project's ``main.py`` named by mistake), or is not a regular file, is refused, never rewritten.

Resource handling: `SessionFile.close` releases the lock and the file and removes the lock
file; a process that dies releases both with it.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from . import _wire as w
from ._errors import CommandError, PersistenceError, SessionLockedError as SessionLockedError
from ._jsonl import encode_line
from ._log import log
from ._paths import fsync_directory, rewrite

SESSION_VERSION = 3
FSYNCED_ROLES = ("user", "assistant")

Entry = dict[str, Any]
LEAF = -1
"""The position of the current leaf, whatever it is when asked."""


def iso_now() -> str:
    return iso_time(time.time_ns())


def iso_time(ns: int) -> str:
    """A time (nanoseconds since the epoch) as ``2026-01-02T03:04:05.678Z``, JavaScript's
    ``toISOString``; the time of every entry, so without ``strftime``'s locale machinery."""
    seconds, ms = divmod(ns // 1_000_000, 1000)
    t = time.gmtime(seconds)
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:"
            f"{t.tm_sec:02d}.{ms:03d}Z")


def new_file_name(timestamp: str, session_id: str) -> str:
    return f"{timestamp.replace(':', '-').replace('.', '-')}_{session_id}.jsonl"


# A line written by forged or its ancestor starts with these keys, in this order; the index is
# read from that prefix, and the rest of the line is parsed only when the entry is asked for.
_PREFIX = re.compile(rb'\{"type":"([^"\\]*)","id":"([^"\\]*)","parentId":(?:null|"([^"\\]*)")')


class _Indexed:
    """One entry as the index knows it; `value` is parsed on demand (or was written here)."""

    __slots__ = ("entry_id", "kind", "length", "offset", "parent_id", "value")

    def __init__(self, entry_id: str | None, parent_id: str | None, kind: str, offset: int,
                 length: int, value: Entry | None) -> None:
        self.entry_id = entry_id
        self.parent_id = parent_id
        self.kind = kind
        self.offset = offset
        self.length = length
        self.value = value


class SessionFile:
    """One session's entries, indexed in memory and (unless `path` is None) kept on disk.

    Opening reads only each line's type, id and parent; an entry's body is read back from the
    file when asked for, so opening is proportional to the number of lines and `entries_since`
    to what it returns.
    """

    def __init__(self, path: Path | None, header: Entry) -> None:
        self.path = path
        self.header = header
        self._entries: list[_Indexed] = []
        self.index: dict[str, int] = {}
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._size = 0
        self.write_error: str | None = None
        """Why the last write failed, until one succeeds."""
        self.message_entries = 0

    # --- creating and opening ------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path | None, cwd: Path, parent_session: str | None = None, *,
               session_id: str | None = None) -> SessionFile:
        """A new session (with `session_id`, else a fresh one); nothing is written until its
        first message entry."""
        header: Entry = {"type": "session", "version": SESSION_VERSION,
                         "id": session_id or str(uuid.uuid4()), "timestamp": iso_now(),
                         "cwd": str(cwd)}
        if parent_session is not None:
            header["parentSession"] = parent_session
        path = None if directory is None else directory / new_file_name(header["timestamp"],
                                                                        header["id"])
        return cls(path, header)

    @classmethod
    def branched(cls, directory: Path | None, cwd: Path, parent_session: str | None,
                 entries: list[Entry], *, session_id: str | None = None) -> SessionFile:
        """A new session holding copies of `entries` (a branch of another session); written at
        once when they include a message, like any session with a message."""
        session = cls.create(directory, cwd, parent_session, session_id=session_id)
        for entry in entries:
            session._add(_Indexed(entry.get("id"), entry.get("parentId"), str(entry["type"]),
                                  -1, -1, entry))
        if session.path is not None and session._entries and any(
                e["type"] == "message" for e in entries):
            last = session._entries.pop()
            assert last.value is not None
            try:
                session._create_file(last, encode_line(last.value))
                assert session._fd is not None
                os.fsync(session._fd)
            except OSError as exc:
                session.close()
                raise PersistenceError(
                    f"Cannot write the session file {session.path}: {exc.strerror}") from exc
            session._add(last)
        return session

    @classmethod
    def open(cls, path: Path, cwd: Path | None = None) -> SessionFile:
        """Open an existing file for writing: lock it, migrate or repair it, index it, cut a
        torn tail.

        A file of an older version is migrated to version 3, and an empty file or one whose
        header line is torn becomes a new session (in `cwd`) at the same path, the unreadable
        content kept beside it as ``<name>.corrupt-<time>``. Both are rewritten
        through a temporary file, so a crash leaves the old file or the new one, never half of
        each. Anything else that is not a session file is refused with `CommandError`.
        """
        path = path.resolve()
        _read_session_bytes(path, 4096)  # before anything is created beside it
        try:
            lock_fd = _lock(path)
        except OSError as exc:  # a read-only folder, say: one line, not a traceback
            raise CommandError(f"Cannot lock session file {path} (its folder must be "
                               f"writable): {exc.strerror}") from None
        try:
            data = _read_session_bytes(path)  # again: what it holds now that it is ours
            header = _read_header(data)
            if header is None:
                if data.strip():  # a torn header: not ours to destroy, kept beside
                    rewrite(path.with_name(f"{path.name}.corrupt-{int(time.time())}"), data)
                header = cls.create(None, cwd or Path.cwd()).header
                data = encode_line(header)
                rewrite(path, data)
            elif b"\n" not in data:
                data += b"\n"  # a header alone, its newline lost
                rewrite(path, data)
            if header.get("version", 1) in (1, 2):
                data = migrate(data)
                header = orjson.loads(data[:data.index(b"\n")])
                rewrite(path, data)
            entries, good_length = _index(data)
        except BaseException:
            os.close(lock_fd)
            raise
        session = cls(path, header)
        session._lock_fd = lock_fd
        for entry in entries:
            session._add(entry)
        session._fd = os.open(path, os.O_RDWR | os.O_APPEND)
        if good_length < len(data):
            os.ftruncate(session._fd, good_length)
        session._size = good_length
        return session

    @classmethod
    def snapshot(cls, path: Path) -> SessionFile:
        """Read the session file at `path` as it is now, for reading only (a fork's source,
        an export): no lock, so a file another forged holds can be read, and nothing on disk
        is changed; a file of an older version is migrated in memory only."""
        path = path.resolve()
        data = _read_session_bytes(path)
        header = _read_header(data)
        if header is None or b"\n" not in data:
            raise CommandError(f"{path} has no complete session header")
        migrated = header.get("version", 1) in (1, 2)
        if migrated:
            data = migrate(data)
            header = orjson.loads(data[:data.index(b"\n")])
        entries, _ = _index(data)
        session = cls(path, header)
        for item in entries:
            if migrated:  # its offsets are the migrated text's, not the file's
                value = orjson.loads(data[item.offset:item.offset + item.length])
                item.value = value if isinstance(value, dict) else {}
            session._add(item)
        if not migrated:
            session._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return session

    # --- reading -------------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return str(self.header["id"])

    @property
    def leaf_id(self) -> str | None:
        return self._entries[-1].entry_id if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, position: int) -> Entry:
        item = self._entries[position]
        if item.value is not None:
            return item.value
        assert self._fd is not None
        value = orjson.loads(os.pread(self._fd, item.length, item.offset))
        return value if isinstance(value, dict) else {}

    def entries(self, start: int = 0) -> list[Entry]:
        return [self.entry(position) for position in range(start, len(self._entries))]

    def entry_id(self, position: int) -> str | None:
        return self._entries[position].entry_id

    def kind(self, position: int) -> str:
        return self._entries[position].kind

    def parent_id(self, position: int) -> str | None:
        return self._entries[position].parent_id

    def latest(self, kind: str, positions: list[int]) -> Entry | None:
        """The last entry of `kind` among `positions`, or None."""
        for position in reversed(positions):
            if self._entries[position].kind == kind:
                return self.entry(position)
        return None

    def entries_since(self, entry_id: str | None) -> list[Entry]:
        """Entries strictly after `entry_id` in file order; all of them for None."""
        if entry_id is None:
            return self.entries()
        position = self.index.get(entry_id)
        if position is None:
            raise CommandError(f"Unknown entry id: {entry_id}")
        return self.entries(position + 1)

    def path_to_leaf(self) -> list[int]:
        """Positions of the active branch, root first (an orphan's missing parent ends it)."""
        return self.path_to(len(self._entries) - 1 if self._entries else None)

    def path_to(self, position: int | None) -> list[int]:
        """Positions from the root to `position`, root first; [] for None."""
        positions: list[int] = []
        seen: set[int] = set()
        while position is not None and position not in seen:
            seen.add(position)
            positions.append(position)
            parent = self._entries[position].parent_id
            position = self.index.get(parent) if parent is not None else None
        positions.reverse()
        return positions

    def branch(self, leaf: int | None) -> list[Entry]:
        """Copies of the entries from the root to `leaf` (a position, or `LEAF`) for a new
        session: labels left out (what followed one is re-linked to the entry before it), then
        the latest label of each entry kept re-created after the last one."""
        if leaf == LEAF:
            leaf = len(self._entries) - 1 if self._entries else None
        path: list[Entry] = []
        for position in self.path_to(leaf):
            entry = self.entry(position)
            if entry.get("type") == "label":
                continue  # an entry after it hangs from the kept entry before it
            if path and entry.get("parentId") != path[-1]["id"]:
                entry = {**entry, "parentId": path[-1]["id"]}
            path.append(entry)
        kept = {entry["id"] for entry in path}
        labels: dict[str, Any] = {}
        for position, item in enumerate(self._entries):
            if item.kind == "label":
                label = self.entry(position)
                if label.get("targetId") in kept:
                    labels[label["targetId"]] = label.get("label")
        parent = path[-1]["id"] if path else None
        for target, label in labels.items():
            if label:
                entry_id = self.new_id()
                path.append({"type": "label", "id": entry_id, "parentId": parent,
                             "timestamp": iso_now(), "targetId": target, "label": label})
                parent = entry_id
        return path

    # --- writing -------------------------------------------------------------------------------

    def new_id(self) -> str:
        while True:
            candidate = f"{random.getrandbits(32):08x}"  # as random as uuid4's first 8 digits
            if candidate not in self.index:
                return candidate

    def _add(self, item: _Indexed) -> None:
        if item.entry_id is not None:
            self.index[item.entry_id] = len(self._entries)
        self._entries.append(item)
        if item.kind == "message":
            self.message_entries += 1

    def append(self, entry_type: str, *, under: str | None = None, **fields: Any) -> Entry:
        """Append an entry as a child of the current leaf (or of the entry `under`: it
        becomes the leaf, on that entry's branch) and return it; `PersistenceError` (and
        nothing appended) when the file cannot be written."""
        entry: Entry = {"type": entry_type, "id": self.new_id(),
                        "parentId": under or self.leaf_id, "timestamp": iso_now(), **fields}
        line = encode_line(entry)
        item = _Indexed(entry["id"], entry["parentId"], entry_type, -1, len(line) - 1, entry)
        if self.path is not None and (self._fd is not None or entry_type == "message"):
            # Else a new file: written with the header and the first message.
            synced = entry_type == "message" and entry["message"].get("role") in FSYNCED_ROLES
            try:
                if self._fd is None:
                    self._create_file(item, line)
                else:
                    item.offset = self._size
                    self._write(line)
                if synced:
                    assert self._fd is not None
                    os.fsync(self._fd)
            except OSError as exc:
                self._cut_back(item.offset)
                self.write_error = f"Cannot write the session file {self.path}: {exc.strerror}"
                raise PersistenceError(self.write_error) from exc
            self.write_error = None
        self._add(item)
        return entry

    def _create_file(self, first: _Indexed, first_line: bytes) -> None:
        """The header, every entry so far and `first` (the first message, last), in one
        write; the lock first, if it is not held yet. A failure leaves no file."""
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._lock_fd is None:
            self._lock_fd = _lock(self.path)
        lines = [encode_line(self.header)]
        offset = len(lines[0])
        for item in [*self._entries, first]:
            line = first_line if item is first else encode_line(item.value)
            item.offset, item.length = offset, len(line) - 1
            offset += len(line)
            lines.append(line)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
        try:
            self._write(b"".join(lines))
            fsync_directory(self.path.parent)
        except OSError:
            os.close(self._fd)
            self._fd, self._size = None, 0
            self.path.unlink(missing_ok=True)
            raise

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self._size += len(data)

    def _cut_back(self, offset: int) -> None:
        """After a failed write: the file back to its whole lines (what `_size` counts)."""
        if self._fd is not None and offset >= 0:
            self._size = offset
            try:
                os.ftruncate(self._fd, offset)
            except OSError:
                pass  # the next write's failure says so; `_index` cuts a torn tail on open

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        if self._lock_fd is not None:
            assert self.path is not None
            _unlock(self.path, self._lock_fd)
        self._fd = self._lock_fd = None

    def lock(self) -> None:
        """Take the file's lock now, before anything is written (a path the user named):
        `SessionLockedError` if another process holds it. A folder that cannot be written is
        reported by `write_error`, and by the first write."""
        if self.path is None or self._lock_fd is not None:
            return
        try:
            self._lock_fd = _lock(self.path)
        except OSError as exc:
            self.write_error = f"Cannot write the session file {self.path}: {exc.strerror}"


def _read_header(data: bytes) -> Entry | None:
    """The header line, or None when the first line is not a session header."""
    end = data.find(b"\n")
    try:
        header = orjson.loads(data[:end] if end >= 0 else data)
    except orjson.JSONDecodeError:
        return None
    if isinstance(header, dict) and header.get("type") == "session" and isinstance(
            header.get("id"), str):
        return header
    return None


def _index(data: bytes) -> tuple[list[_Indexed], int]:
    """The index of the entries after the header, and the length of `data` that is whole
    lines.

    A line after the last newline is a torn write; so is a last line that is not JSON. Both
    are left out (and cut off by the caller). A bad line elsewhere is skipped, as the
    ancestor does.
    """
    end_of_header = data.index(b"\n")
    entries: list[_Indexed] = []
    offset = end_of_header + 1
    good_length = offset
    size = len(data)
    while offset < size:
        end = data.find(b"\n", offset)
        if end < 0:
            break  # torn: no newline
        match = _PREFIX.match(data, offset, end)
        if match is not None and _is_json(data[offset:end]):
            kind, entry_id, parent = (group.decode() if group is not None else None
                                      for group in match.groups())
            entries.append(_Indexed(entry_id, parent, kind or "", offset, end - offset, None))
        else:
            try:
                value = orjson.loads(data[offset:end]) if data[offset:end].strip() else None
            except orjson.JSONDecodeError:
                if end == size - 1:
                    break  # the last line is torn
                value = None
                number = data.count(b"\n", 0, offset) + 1
                log(f"skipping line {number} of a session file: not JSON")
            if isinstance(value, dict):
                entries.append(_Indexed(
                    value.get("id") if isinstance(value.get("id"), str) else None,
                    value.get("parentId") if isinstance(value.get("parentId"), str) else None,
                    str(value.get("type", "")), offset, end - offset, None))
        offset = end + 1
        good_length = offset
    return entries, good_length


def migrate(data: bytes) -> bytes:
    """A version 1 or 2 file as version 3: old files are upgraded when opened.

    Version 1 entries get fresh ids chained in file order, and a compaction's
    ``firstKeptEntryIndex`` (counting the header as 0) becomes ``firstKeptEntryId``;
    version 2's ``hookMessage`` role is now ``custom``. Lines that are not JSON objects go.
    """
    lines: list[Entry] = []
    for line in data.splitlines():
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            lines.append(value)
    header, entries = lines[0], lines[1:]
    if header.get("version", 1) < 2:
        ids: set[str] = set()
        parent: str | None = None
        for position, entry in enumerate(entries):
            entry_id = uuid.uuid4().hex[:8]
            while entry_id in ids:
                entry_id = uuid.uuid4().hex[:8]
            ids.add(entry_id)
            entry.pop("id", None)
            entry.pop("parentId", None)
            entries[position] = {"type": entry.pop("type", "message"), "id": entry_id,
                                 "parentId": parent, **entry}
            parent = entry_id
        for entry in entries:
            index = entry.pop("firstKeptEntryIndex", None)
            if entry["type"] == "compaction" and isinstance(index, int) and 0 < index <= len(
                    entries):
                entry["firstKeptEntryId"] = entries[index - 1]["id"]
    for entry in entries:
        message = entry.get("message")
        if isinstance(message, dict) and message.get("role") == "hookMessage":
            message["role"] = "custom"
    header["version"] = SESSION_VERSION
    return b"".join(encode_line(line) for line in [header, *entries])


def _is_json(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


_TORN_HEADER = re.compile(rb'\A\s*\{\s*"type"\s*:\s*"session"\s*[,}]')
"""How a session header starts when written with its ``type`` first, as every writer does:
what tells a header torn before its end (not JSON) from a file that is not a session."""


def looks_like_session(data: bytes) -> bool:
    """Whether `data` (a file's start) is a session file's: its first line parsed as JSON is
    a ``session`` header, however it is spaced or its keys ordered; or that line is not whole
    JSON (torn) but starts as a header does."""
    end = data.find(b"\n")
    first = data[:end] if end >= 0 else data
    try:
        header = orjson.loads(first)
    except orjson.JSONDecodeError:
        return _TORN_HEADER.match(first) is not None
    return isinstance(header, dict) and header.get("type") == "session"


def _read_session_bytes(path: Path, limit: int = -1) -> bytes:
    """The content of the session file at `path` (its first `limit` bytes, if given);
    `CommandError` when it is not a regular file (a folder, a FIFO, a device: reading one
    could block or never end) or, not being empty, does not start like a session file."""
    try:  # non-blocking: a FIFO opens at once, and is then refused
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CommandError(f"Cannot open session file {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CommandError(f"{path} is not a regular file, not a session")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(limit)
    finally:
        os.close(fd)
    if data.strip() and not looks_like_session(data.lstrip()):
        raise CommandError(f"{path} is not a session file (it does not start with a session "
                           "header); it was left as it is")
    return data


def _lock(path: Path) -> int:
    """Hold ``<path>.lock`` (naming this pid) or raise `SessionLockedError`. A lock file
    another process removed while we opened it is not ours: taken again."""
    lock_path = path.with_name(path.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SessionLockedError(f"Session file {path} is in use by another forged "
                                     f"process (pid {holder})") from None
        try:
            current = os.stat(lock_path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _unlock(path: Path, fd: int) -> None:
    """Remove ``<path>.lock`` while holding it, then let it go."""
    try:
        path.with_name(path.name + ".lock").unlink(missing_ok=True)
    except OSError:
        pass
    os.close(fd)


def entry_tree(store: SessionFile) -> list[w.TreeNode]:
    """Every entry as a node, children in file order; entries whose parent is missing are
    roots too. A node's label is the latest ``label`` entry that targets it."""
    entries = store.entries()
    labels: dict[str, Entry] = {}
    for entry in entries:
        if entry.get("type") == "label" and isinstance(entry.get("targetId"), str):
            labels[entry["targetId"]] = entry
    nodes: dict[str, w.TreeNode] = {}
    roots: list[w.TreeNode] = []
    for entry in entries:
        label = labels.get(entry.get("id", ""))
        named = label is not None and bool(label.get("label"))
        node = w.TreeNode(entry=entry, children=[],
                          label=label.get("label") if named and label else None,
                          label_timestamp=label.get("timestamp") if named and label else None)
        if isinstance(entry.get("id"), str):
            nodes[entry["id"]] = node
        parent = nodes.get(entry.get("parentId") or "")
        (parent.children if parent is not None else roots).append(node)
    return roots
