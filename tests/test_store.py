"""Session files: lazy creation, append, reopen, torn tails and the single-writer lock."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from forged._errors import CommandError
from forged._store import SessionFile, SessionLockedError, session_dir_for


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


def test_not_a_session_file(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"type":"message"}\n')
    with pytest.raises(CommandError, match="Not a session file"):
        SessionFile.open(path)
