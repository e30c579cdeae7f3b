"""Sessions on disk through the wire: the file, get_entries, get_tree, names, restarts."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from forged._config import Options, find_session
from forged._errors import ConfigError
from forged._paths import session_dir_for
from forged._providers.scripted import Reply, ScriptText

from .harness import open_client, stored_message
from .test_process import BIN, child_env


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def test_a_prompt_writes_the_session_file(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptText(text="one")]), Reply(content=[ScriptText(text="two")])]
    async with open_client(tmp_path, replies) as client:
        before = await client.request({"type": "get_state"})
        path = Path(before["data"]["sessionFile"])
        assert not path.exists()  # nothing written before the first message
        await client.prompt_and_settle("first")
        entries = await client.request({"type": "get_entries"})
        await client.request({"type": "set_thinking_level", "level": "low"})
        named = await client.request({"type": "set_session_name", "name": "  my work  "})
        empty = await client.request({"type": "set_session_name", "name": "   "})
        since = await client.request({"type": "get_entries",
                                      "since": entries["data"]["leafId"]})
        unknown = await client.request({"type": "get_entries", "since": "nope"})
        state = await client.request({"type": "get_state"})
        await client.prompt_and_settle("second")
        tree = await client.request({"type": "get_tree"})
    assert path.parent == session_dir_for(tmp_path / "agent", client.cwd)
    assert path.name.endswith(f"_{state['data']['sessionId']}.jsonl")
    lines = read_lines(path)
    assert lines[0]["type"] == "session" and lines[0]["version"] == 3
    assert lines[0]["cwd"] == str(client.cwd)
    types = [(e["type"], e.get("message", {}).get("role")) for e in lines[1:]]
    assert types == [("model_change", None), ("thinking_level_change", None),
                     ("message", "user"), ("message", "assistant"),
                     ("thinking_level_change", None), ("session_info", None),
                     ("message", "user"), ("message", "assistant")]
    assert [e["id"] for e in entries["data"]["entries"]] == [e["id"] for e in lines[1:5]]
    assert entries["data"]["leafId"] == lines[4]["id"]
    assert [e["type"] for e in since["data"]["entries"]] == [
        "thinking_level_change", "session_info"]
    assert unknown["success"] is False and unknown["error"] == "Unknown entry id: nope"
    assert named["success"] is True and empty["error"] == "Session name cannot be empty"
    assert state["data"]["sessionName"] == "my work"
    assert lines[6]["name"] == "my work"
    for previous, entry in itertools.pairwise(lines[1:]):
        assert entry["parentId"] == previous["id"]
    (root,) = tree["data"]["tree"]
    depth, node = 0, root
    while node["children"]:
        (node,) = node["children"]
        depth += 1
    assert depth == 7 and node["entry"]["id"] == tree["data"]["leafId"] == lines[-1]["id"]


async def test_no_session_writes_nothing(tmp_path: Path) -> None:
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="x")])],
                           persist=False) as client:
        await client.prompt_and_settle("hi")
        state = await client.request({"type": "get_state"})
        entries = await client.request({"type": "get_entries"})
    assert "sessionFile" not in state["data"]
    assert [e["type"] for e in entries["data"]["entries"]][-2:] == ["message", "message"]
    assert not (tmp_path / "agent" / "sessions").exists()


async def test_a_session_continues_after_a_restart(tmp_path: Path) -> None:
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="first answer")])]
                           ) as client:
        await client.prompt_and_settle("first")
        await client.request({"type": "set_model", "provider": "scripted",
                              "modelId": "openai-completions"})
        await client.request({"type": "set_thinking_level", "level": "high"})
        state = await client.request({"type": "get_state"})
        last = (await client.request({"type": "get_entries"}))["data"]["leafId"]
    path = Path(state["data"]["sessionFile"])
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="second answer")])],
                           session_path=path) as again:
        resumed = await again.request({"type": "get_state"})
        nothing_new = await again.request({"type": "get_entries", "since": last})
        messages = await again.request({"type": "get_messages"})
        await again.prompt_and_settle("second")
        new = await again.request({"type": "get_entries", "since": last})
    assert resumed["data"]["sessionId"] == state["data"]["sessionId"]
    assert resumed["data"]["sessionFile"] == str(path)
    assert resumed["data"]["model"]["id"] == "openai-completions"
    assert resumed["data"]["thinkingLevel"] == "high"
    assert nothing_new["data"]["entries"] == []
    assert [m["role"] for m in messages["data"]["messages"]] == ["user", "assistant"]
    assert [e["message"]["role"] for e in new["data"]["entries"]] == ["user", "assistant"]
    assert new["data"]["entries"][0]["parentId"] == last
    sent = again.server.requests[0].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert len(read_lines(path)) == 1 + 8


@pytest.mark.parametrize("pattern", ["*", "?", "[0-9]*", "0a1b[*"])
def test_a_session_id_prefix_is_literal_never_a_pattern(tmp_path: Path, pattern: str) -> None:
    (tmp_path / "2026-01-01T00-00-00-000Z_0a1b2c.jsonl").write_text("{}\n")
    literal = tmp_path / "2026-01-02T00-00-00-000Z_0a1b[*x.jsonl"
    literal.write_text("{}\n")
    if pattern == "0a1b[*":
        assert find_session(Options(cwd=tmp_path, session=pattern), tmp_path) == literal
    else:
        with pytest.raises(ConfigError, match="No session found matching"):
            find_session(Options(cwd=tmp_path, session=pattern), tmp_path)


async def test_a_session_that_cannot_be_written_fails_the_run_and_says_why(
        tmp_path: Path) -> None:
    """Nothing is announced that is not stored: the run ends with an unstored failure that
    names the reason, and get_state says the file cannot be written."""
    (tmp_path / "a-file").write_text("not a folder")
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="never sent")])],
                           session_path=tmp_path / "a-file" / "s.jsonl") as client:
        await client.prompt_and_settle("hi")
        state = await client.request({"type": "get_state"})
        messages = await client.request({"type": "get_messages"})
    assert client.types()[1:5] == ["agent_start", "turn_start", "agent_end", "agent_settled"]
    (failed,) = client.events("agent_end")[0]["messages"]
    assert failed["stopReason"] == "error"
    assert failed["errorMessage"].startswith(
        f"Cannot write the session file {tmp_path / 'a-file' / 's.jsonl'}: ")
    assert state["data"]["sessionFileError"] == failed["errorMessage"]
    assert messages["data"]["messages"] == []
    assert client.server.requests == []  # the model was never asked


def test_a_session_file_in_a_read_only_folder_is_one_line_of_error(
        tmp_path: Path, read_only_folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,rw", str(read_only_folder)], check=True)
    stored = read_only_folder / "kept.jsonl"
    stored.write_text(json.dumps({"type": "session", "version": 3, "id": "kept",
                                  "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/"}) + "\n")
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_folder)], check=True)
    (tmp_path / "agent").mkdir()
    result = subprocess.run(
        [str(BIN / "forged"), "--mode", "rpc", "--session", str(stored)], input=b"",
        capture_output=True, check=False, env=child_env(tmp_path / "agent"), cwd=tmp_path,
        timeout=30)  # a hang guard, not a timing
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [
        f"forged: Cannot lock session file {stored} (its folder must be writable): Read-only "
        "file system"]


async def test_a_session_header_is_read_however_it_is_spaced(tmp_path: Path) -> None:
    """A header written by Python's json.dumps (spaces after the colons, keys in another
    order) is a session file; a JSON file that is not one is still refused, untouched."""
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text(json.dumps({"version": 3, "type": "session", "id": "s-spaced",
                                  "timestamp": "2026-01-01T00:00:00.000Z",
                                  "cwd": str(tmp_path)}) + "\n" + orjson.dumps(stored_message(
                                      "00000001", None, "user", "hello")).decode() + "\n")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"type": "sessions", "id": "x"}) + "\n")
    async with open_client(tmp_path) as client:
        switched = await client.request({"type": "switch_session",
                                         "sessionPath": str(spaced)})
        messages = await client.request({"type": "get_messages"})
        refused = await client.request({"type": "switch_session", "sessionPath": str(other)})
    assert switched["success"] is True, switched
    assert [m["content"][0]["text"] for m in messages["data"]["messages"]] == ["hello"]
    assert refused["success"] is False and "is not a session file" in refused["error"]
    assert other.read_text() == json.dumps({"type": "sessions", "id": "x"}) + "\n"
