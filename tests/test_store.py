"""Session files: lazy creation, append, reopen, torn tails and the single-writer lock."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import given, strategies as st

from forged._errors import CommandError, PersistenceError
from forged._paths import session_dir_for
from forged._store import SessionFile, SessionLockedError, iso_time
from forged._switching import open_or_create

from .conftest import mounted_tmpfs


def lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def user(text: str) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}


def test_location_follows_the_cwd(tmp_path: Path) -> None:
    assert session_dir_for(tmp_path, Path("/home/u/proj")) == (
        tmp_path / "sessions" / "--home-u-proj--")


def test_the_file_is_created_with_the_first_message(tmp_path: Path) -> None:
    session = SessionFile.create(tmp_path, Path("/work"))
    assert session.path is not None
    assert session.path.name.endswith(f"_{session.session_id}.jsonl")
    model = session.append("model_change", provider="p", modelId="m")
    assert not session.path.exists()
    message = session.append("message", message=user("hi"))
    written = lines(session.path)
    assert written[0] == {"type": "session", "version": 3, "id": session.session_id,
                          "timestamp": session.header["timestamp"], "cwd": "/work"}
    assert written[1:] == [model, message]
    assert message["parentId"] == model["id"] and model["parentId"] is None
    assert len(str(message["id"])) == 8 and int(str(message["id"]), 16) >= 0
    assert oct(os.stat(session.path).st_mode & 0o777) == "0o600"
    session.close()


def test_reopen_continues_the_chain(tmp_path: Path) -> None:
    first = SessionFile.create(tmp_path, Path("/work"))
    a = first.append("message", message=user("a"))
    b = first.append("session_info", name="named")
    first.close()
    assert first.path is not None
    again = SessionFile.open(first.path)
    assert again.session_id == first.session_id
    assert again.leaf_id == b["id"]
    c = again.append("message", message=user("c"))
    assert c["parentId"] == b["id"]
    assert [e["id"] for e in lines(first.path)[1:]] == [a["id"], b["id"], c["id"]]
    assert again.entries_since(a["id"]) == [b, c]
    assert again.entries_since(c["id"]) == []
    with pytest.raises(CommandError, match="Unknown entry id: nope"):
        again.entries_since("nope")
    again.close()


@pytest.mark.parametrize("torn", [b'{"type":"message","id":"dead', b'{"type": not json}\n'])
def test_a_torn_last_line_is_dropped_and_cut(tmp_path: Path, torn: bytes) -> None:
    session = SessionFile.create(tmp_path, Path("/work"))
    kept = session.append("message", message=user("kept"))
    session.close()
    assert session.path is not None
    with open(session.path, "ab") as file:
        file.write(torn)
    reopened = SessionFile.open(session.path)
    assert [e["id"] for e in reopened.entries()] == [kept["id"]]
    after = reopened.append("message", message=user("after"))
    reopened.close()
    assert [e.get("id") for e in lines(session.path)[1:]] == [kept["id"], after["id"]]
    assert after["parentId"] == kept["id"]


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path: Path) -> None:
    session = SessionFile.create(tmp_path, Path("/work"))
    session.append("message", message=user("x"))
    assert session.path is not None
    with pytest.raises(SessionLockedError, match=f"pid {os.getpid()}"):
        SessionFile.open(session.path)
    session.close()
    SessionFile.open(session.path).close()  # released with the first


def test_a_torn_header_becomes_a_new_session_and_its_content_is_kept(
        tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"type":"session","version":3,"id":"ab')
    session = SessionFile.open(path, Path("/work"))
    assert session.path == path and len(session) == 0
    assert lines(path) == [session.header] and session.header["cwd"] == "/work"
    (kept,) = tmp_path.glob("x.jsonl.corrupt-*")
    assert kept.read_text() == '{"type":"session","version":3,"id":"ab'
    session.append("message", message=user("again"))
    session.close()
    reopened = SessionFile.open(path)
    assert reopened.session_id == session.session_id and len(reopened) == 1
    assert not list(tmp_path.glob(".*.tmp"))  # the rewrite left no temporary file


def test_an_empty_file_becomes_a_new_session(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.touch()
    session = SessionFile.open(path, Path("/work"))
    assert lines(path) == [session.header]
    assert not list(tmp_path.glob("*.corrupt-*"))  # nothing to keep


def test_a_version_1_file_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    old_lines = [orjson.dumps(line) for line in [
        {"type": "session", "id": "s-1", "timestamp": "2025-01-01T00:00:00.000Z", "cwd": "/w"},
        {"type": "message", "timestamp": "2025-01-01T00:00:01.000Z", "message": user("one")},
        {"type": "message", "timestamp": "2025-01-01T00:00:02.000Z",
         "message": {"role": "hookMessage", "customType": "x", "content": "hi",
                     "display": True, "timestamp": 2}},
        {"type": "compaction", "timestamp": "2025-01-01T00:00:03.000Z", "summary": "s",
         "firstKeptEntryIndex": 2, "tokensBefore": 10},
    ]]
    old_lines.insert(2, b"not json")
    path.write_bytes(b"".join(line + b"\n" for line in old_lines))
    session = SessionFile.open(path)
    migrated = lines(path)
    assert migrated[0]["version"] == 3 and migrated[0]["id"] == "s-1"
    entries = migrated[1:]
    assert [e["type"] for e in entries] == ["message", "message", "compaction"]
    assert entries[0]["parentId"] is None
    assert [e["parentId"] for e in entries[1:]] == [e["id"] for e in entries[:-1]]
    assert entries[1]["message"]["role"] == "custom"  # type: ignore[index]
    assert entries[2]["firstKeptEntryId"] == entries[1]["id"]
    assert "firstKeptEntryIndex" not in entries[2]
    assert session.entries() == entries and session.leaf_id == entries[2]["id"]
    session.close()
    SessionFile.open(path).close()
    assert lines(path) == migrated  # migrating again changes nothing


def test_a_snapshot_reads_without_a_lock_or_a_change(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in [
        {"type": "session", "id": "s-1", "timestamp": "2025-01-01T00:00:00.000Z", "cwd": "/w"},
        {"type": "message", "timestamp": "2025-01-01T00:00:01.000Z", "message": user("one")},
        {"type": "message", "timestamp": "2025-01-01T00:00:02.000Z", "message": user("two")}]))
    before = path.read_bytes()
    old = SessionFile.snapshot(path)  # version 1: migrated in memory only
    assert [e["message"]["content"][0]["text"] for e in old.entries()] == ["one", "two"]
    assert path.read_bytes() == before
    held = SessionFile.open(path)  # migrated on disk now, and locked
    held.append("message", message=user("three"))
    current = SessionFile.snapshot(path)
    assert current.entries() == held.entries()
    assert not list(tmp_path.glob("*.corrupt-*"))
    old.close()
    current.close()
    held.close()


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, to fill up for real."""
    yield from mounted_tmpfs(tmp_path / "tiny", "size=64k")


def test_a_full_disk_mid_line_is_cut_back_and_nothing_is_lost(tiny_filesystem: Path) -> None:
    session = SessionFile.create(tiny_filesystem, Path("/work"))
    assert session.path is not None
    filler = tiny_filesystem / "filler"
    filler.write_bytes(b"x" * 40_000)
    stored = [session.append("message", message=user("first"))]
    with pytest.raises(PersistenceError, match="No space left on device"):
        while True:
            stored.append(session.append("message", message=user("y" * 3000)))
    assert session.write_error is not None and "No space left" in session.write_error
    assert session.path.read_bytes().endswith(b"\n")  # no partial line left behind
    assert len(session) == len(stored)
    filler.unlink()  # space again: the next entry is whole, after the last stored one
    stored.append(session.append("message", message=user("after")))
    assert session.write_error is None
    session.close()
    reopened = SessionFile.open(session.path)
    assert reopened.entries() == stored
    assert stored[-1]["parentId"] == stored[-2]["id"]


def test_a_corrupt_middle_line_is_skipped_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session = SessionFile.create(tmp_path, Path("/work"))
    first = session.append("message", message=user("one"))
    session.close()
    assert session.path is not None
    with open(session.path, "ab") as file:  # a partial entry with the next glued to it
        file.write(b'{"type":"message","id":"0badline","parentId":null,"mess')
        file.write(orjson.dumps({"type": "message", "id": "deadbeef",
                                 "parentId": first["id"], "message": user("two")}) + b"\n")
        file.write(orjson.dumps({"type": "message", "id": "cafe0001",
                                 "parentId": first["id"], "message": user("three")}) + b"\n")
    reopened = SessionFile.open(session.path)
    assert [entry["id"] for entry in reopened.entries()] == [first["id"], "cafe0001"]
    assert "skipping line 3 of a session file" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["source file", "json file", "folder", "fifo"])
def test_a_file_that_is_not_a_session_is_refused_and_left_as_it_is(tmp_path: Path,
                                                                     kind: str) -> None:
    path = tmp_path / {"source file": "main.py", "json file": "package.json",
                       "folder": "folder", "fifo": "fifo"}[kind]
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text('print("hello")\n' if kind == "source file" else '{"name": "x"}\n')
        path.chmod(0o755)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(CommandError, match="not a"):
        SessionFile.open(path, Path("/work"))
    assert sorted(tmp_path.iterdir()) == before  # no .corrupt copy, no lock file
    if path.is_file():
        assert path.read_text().startswith(('print("hello")', '{"name": "x"}'))
        assert path.stat().st_mode & 0o777 == 0o755


def test_a_new_session_path_is_locked_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "named.jsonl"
    first = open_or_create(path, Path("/work"))
    with pytest.raises(SessionLockedError, match=f"pid {os.getpid()}"):
        open_or_create(path, Path("/work"))
    assert not path.exists()
    first.close()
    assert not list(tmp_path.iterdir())  # its lock file went with it
    open_or_create(path, Path("/work")).close()


@given(st.integers(min_value=0, max_value=253_402_300_799_999_999_999))  # to 9999-12-31
def test_entry_times_are_written_as_javascripts_iso_strings(ns: int) -> None:
    moment = (datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
              + datetime.timedelta(milliseconds=ns // 1_000_000))
    assert iso_time(ns) == moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_entry_ids_are_eight_hex_digits_and_never_repeat_in_a_file(tmp_path: Path) -> None:
    session = SessionFile.create(tmp_path, Path("/work"))
    ids = [session.append("label", targetId=None, label=str(n))["id"] for n in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 8 and int(i, 16) >= 0 for i in ids)
