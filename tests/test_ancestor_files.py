"""Session files written by the TypeScript ancestor, by hand: they
load, migrate, rebuild the right context and continue."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson

from forged._providers.scripted import Reply, ScriptText

from .harness import open_client


def write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def read(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def user(text: str, ms: int) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": ms}


def assistant(text: str, ms: int, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}],
            "api": "anthropic-messages", "provider": "scripted", "model": "anthropic-messages",
            "usage": {"input": 50, "output": 10, "cacheRead": 0, "cacheWrite": 0,
                      "totalTokens": 60, "cost": {"input": 0, "output": 0, "cacheRead": 0,
                                                  "cacheWrite": 0, "total": 0}},
            "stopReason": "stop", "timestamp": ms, **extra}


def sent_texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of each message an Anthropic request carried."""
    out = []
    for message in body["messages"]:
        content = message["content"]
        text = content if isinstance(content, str) else "".join(
            block.get("text", "") for block in content)
        out.append((message["role"], text))
    return out


async def test_a_version_1_file_with_a_compaction_migrates_and_continues(
        tmp_path: Path) -> None:
    path = tmp_path / "2025-06-01T10-00-00-000Z_v1.jsonl"
    write(path, [
        {"type": "session", "id": "v1-session", "timestamp": "2025-06-01T10:00:00.000Z",
         "cwd": "/old/project"},
        {"type": "message", "timestamp": "2025-06-01T10:00:01.000Z",
         "message": user("old question", 1748772001000)},
        {"type": "message", "timestamp": "2025-06-01T10:00:02.000Z",
         "message": assistant("old answer", 1748772002000)},
        {"type": "message", "timestamp": "2025-06-01T10:00:03.000Z",
         "message": user("kept question", 1748772003000)},
        {"type": "message", "timestamp": "2025-06-01T10:00:04.000Z",
         "message": assistant("kept answer", 1748772004000)},
        # firstKeptEntryIndex counts the header as line 0: line 3 is "kept question".
        {"type": "compaction", "timestamp": "2025-06-01T10:00:05.000Z",
         "summary": "The user asked an old question.", "firstKeptEntryIndex": 3,
         "tokensBefore": 1234},
        {"type": "message", "timestamp": "2025-06-01T10:00:06.000Z",
         "message": user("after compaction", 1748772006000)},
        {"type": "message", "timestamp": "2025-06-01T10:00:07.000Z",
         "message": assistant("latest answer", 1748772007000)},
    ])
    reply = Reply(content=[ScriptText(text="continued")])
    async with open_client(tmp_path, [reply], session_path=path) as client:
        state = (await client.request({"type": "get_state"}))["data"]
        messages = (await client.request({"type": "get_messages"}))["data"]["messages"]
        await client.prompt_and_settle("new question")
        body = client.server.requests[0].body
    lines = read(path)
    assert lines[0]["version"] == 3 and lines[0]["id"] == "v1-session"
    assert state["sessionId"] == "v1-session" and state["messageCount"] == 5
    compaction = lines[5]
    assert compaction["firstKeptEntryId"] == lines[3]["id"]
    assert [m["role"] for m in messages] == [
        "compactionSummary", "user", "assistant", "user", "assistant"]
    assert messages[0]["summary"] == "The user asked an old question."
    assert messages[0]["tokensBefore"] == 1234
    assert sent_texts(body) == [
        ("user", "The conversation history before this point was compacted into the following "
                 "summary:\n\n<summary>\nThe user asked an old question.\n</summary>"),
        ("user", "kept question"), ("assistant", "kept answer"),
        ("user", "after compaction"), ("assistant", "latest answer"),
        ("user", "new question")]
    new = lines[8:]
    assert [e.get("message", {}).get("role") for e in new if e["type"] == "message"] == [
        "user", "assistant"]
    for previous, entry in itertools.pairwise(lines[1:]):
        assert entry["parentId"] == previous["id"]  # one chain, old and new


async def test_a_version_3_file_with_branches_and_plugin_messages(tmp_path: Path) -> None:
    path = tmp_path / "v3.jsonl"
    original: list[dict[str, Any]] = [
        {"type": "session", "version": 3, "id": "v3-session",
         "timestamp": "2026-02-01T09:00:00.000Z", "cwd": "/p"},
        {"type": "model_change", "id": "00000001", "parentId": None,
         "timestamp": "2026-02-01T09:00:00.100Z", "provider": "scripted",
         "modelId": "anthropic-messages"},
        {"type": "thinking_level_change", "id": "00000002", "parentId": "00000001",
         "timestamp": "2026-02-01T09:00:00.200Z", "thinkingLevel": "low"},
        {"type": "message", "id": "00000003", "parentId": "00000002",
         "timestamp": "2026-02-01T09:00:01.000Z",
         "message": {"role": "user", "content": "short form", "timestamp": 1769936401000}},
        {"type": "message", "id": "00000004", "parentId": "00000003",
         "timestamp": "2026-02-01T09:00:02.000Z",
         "message": assistant("", 1769936402000, stopReason="error",
                              errorMessage="overloaded")},
        {"type": "message", "id": "00000005", "parentId": "00000003",
         "timestamp": "2026-02-01T09:00:03.000Z",
         "message": assistant("abandoned", 1769936403000)},
        {"type": "branch_summary", "id": "00000006", "parentId": "00000004",
         "timestamp": "2026-02-01T09:00:04.000Z", "fromId": "00000003",
         "summary": "Tried another way."},
        {"type": "custom_message", "id": "00000007", "parentId": "00000006",
         "timestamp": "2026-02-01T09:00:05.000Z", "customType": "note",
         "content": "from a plugin", "display": True},
        {"type": "custom", "id": "00000008", "parentId": "00000007",
         "timestamp": "2026-02-01T09:00:06.000Z", "customType": "state", "data": {"k": 1}},
        {"type": "session_info", "id": "00000009", "parentId": "00000008",
         "timestamp": "2026-02-01T09:00:07.000Z", "name": "ancestor work"},
    ]
    write(path, original)
    reply = Reply(content=[ScriptText(text="ok")])
    async with open_client(tmp_path, [reply], session_path=path) as client:
        state = (await client.request({"type": "get_state"}))["data"]
        messages = (await client.request({"type": "get_messages"}))["data"]["messages"]
        entries = (await client.request({"type": "get_entries"}))["data"]
        await client.prompt_and_settle("go on")
        body = client.server.requests[0].body
    lines = read(path)
    assert lines[:len(original)] == original  # opened and continued, never rewritten
    assert state["sessionName"] == "ancestor work" and state["thinkingLevel"] == "low"
    assert entries["entries"] == original[1:] and entries["leafId"] == "00000009"
    assert [m["role"] for m in messages] == ["user", "assistant", "branchSummary", "custom"]
    assert messages[0]["content"] == [{"type": "text", "text": "short form"}]
    assert sent_texts(body) == [
        ("user", "short form"),  # the failed reply is not sent
        ("user", "The following is a summary of a branch that this conversation came back "
                 "from:\n\n<summary>\nTried another way.</summary>"),
        ("user", "from a plugin"), ("user", "go on")]
    assert lines[len(original)]["parentId"] == "00000009"
