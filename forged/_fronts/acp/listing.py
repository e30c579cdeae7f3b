"""``session/list``'s pages: the stored sessions of one folder, or of every folder, newest
first, `PAGE_SIZE` a page. A cursor names the last session of its page (its time and id),
so that each session is listed once however the files change between pages; and where a
session's file is.
"""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import orjson

from ..._config import every_stored, list_stored, stored_title
from ..._errors import AcpError
from .jsonrpc import INVALID_PARAMS, JSONObject

PAGE_SIZE = 50
Key = tuple[str, str]
"""A session's place in the listing: its last change (ISO 8601, UTC) and its id."""


def page(folder: Path | None, cursor: object) -> JSONObject:
    """The page after `cursor` (None: the first) of `folder`'s sessions (None: every
    folder's), with ``nextCursor`` when more follow."""
    after = _read_cursor(cursor) if cursor is not None else None
    found: list[tuple[Key, Path, Path]] = []
    if folder is not None:
        found = [((item.modified, item.session_id), Path(item.path), folder)
                 for item in list_stored(folder)]
    else:
        for session_id, (path, cwd) in every_stored().items():
            try:
                found.append(((_modified(path), session_id), path, cwd))
            except OSError:  # deleted meanwhile
                continue
    found.sort(key=lambda item: (_reversed(item[0][0]), item[0][1]))
    if after is not None:
        found = [item for item in found
                 if (_reversed(item[0][0]), item[0][1]) > (_reversed(after[0]), after[1])]
    shown = found[:PAGE_SIZE]
    listed: JSONObject = {"sessions": [
        {"sessionId": key[1], "cwd": str(cwd), "title": stored_title(path),
         "updatedAt": key[0]} for key, path, cwd in shown]}
    if len(found) > PAGE_SIZE:
        listed["nextCursor"] = _cursor(shown[-1][0])
    return listed


def find(session_id: str, cwd: Path | None = None) -> tuple[Path, Path] | None:
    """The file of the stored session whose id is exactly `session_id`, and its cwd: first
    among `cwd`'s (its own ``sessionDir`` setting included), else of any folder."""
    if not session_id:
        return None
    if cwd is not None:
        for item in list_stored(cwd):
            if item.session_id == session_id:
                return Path(item.path), cwd
    return every_stored().get(session_id)


def _modified(path: Path) -> str:
    stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _reversed(stamp: str) -> tuple[int, ...]:
    """Newest first: a stamp's characters as a key that sorts the other way."""
    return tuple(-ord(char) for char in stamp)


def _cursor(key: Key) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).decode()


def _read_cursor(cursor: object) -> Key:
    try:
        stamp, session_id = orjson.loads(base64.urlsafe_b64decode(str(cursor)))
        if isinstance(stamp, str) and isinstance(session_id, str):
            return stamp, session_id
    except (ValueError, TypeError, orjson.JSONDecodeError):
        pass
    raise AcpError(INVALID_PARAMS, f"Not a cursor of session/list: {str(cursor)[:80]}")
