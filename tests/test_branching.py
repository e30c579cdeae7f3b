"""Session switches through the wire: new_session, switch_session, fork, clone, their files,
and what a switch does to a run that is still going."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import trio

from forged._providers.scripted import Reply, ScriptText
from forged._store import SessionFile

from .harness import Client, open_client, stored_message


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def texts(replies: int) -> list[Reply]:
    return [Reply(content=[ScriptText(text=f"reply {n}")]) for n in range(replies)]


async def session_file(client: Client) -> Path:
    return Path((await client.request({"type": "get_state"}))["data"]["sessionFile"])


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"][0]["text"] for m in messages if m["role"] == "user"]


async def test_fork_starts_a_session_at_an_earlier_prompt(tmp_path: Path) -> None:
    async with open_client(tmp_path, texts(4)) as client:
        for prompt in ("first", "second", "third"):
            await client.prompt_and_settle(prompt)
        original = await session_file(client)
        forks = (await client.request({"type": "get_fork_messages"}))["data"]["messages"]
        assert [m["text"] for m in forks] == ["first", "second", "third"]
        entries = {e["id"]: e for e in read_lines(original)[1:]}
        fork = await client.request({"type": "fork", "entryId": forks[1]["entryId"]})
        forked = await session_file(client)
        messages = (await client.request({"type": "get_messages"}))["data"]["messages"]
        await client.prompt_and_settle("second, again")
        bad = await client.request({"type": "fork", "entryId": forks[2]["entryId"]})
        not_user = await client.request(
            {"type": "fork", "entryId": read_lines(forked)[-1]["id"]})
    assert fork["data"] == {"text": "second", "cancelled": False}
    assert forked != original and forked.parent == original.parent
    header, *copied = read_lines(forked)
    assert header["parentSession"] == str(original)
    # The branch up to the forked prompt's parent, with the same ids, then the new prompt.
    up_to = [entries[i] for i in entries if entries[i]["id"] != forks[1]["entryId"]]
    assert copied[:4] == up_to[:4]
    assert user_texts(messages) == ["first"]
    assert [c.get("message", {}).get("role") for c in copied[4:]] == ["user", "assistant"]
    assert copied[4]["parentId"] == copied[3]["id"]
    assert read_lines(original)[1:] == list(entries.values())  # the original is untouched
    # "third" is not on the forked session's branch; an assistant message is not a prompt.
    assert bad["success"] is False and bad["error"] == "Invalid entry ID for forking"
    assert not_user["error"] == "Invalid entry ID for forking"


async def test_forking_the_first_prompt_gives_an_empty_session(tmp_path: Path) -> None:
    async with open_client(tmp_path, texts(1)) as client:
        await client.prompt_and_settle("only")
        original = await session_file(client)
        (first,) = (await client.request({"type": "get_fork_messages"}))["data"]["messages"]
        fork = await client.request({"type": "fork", "entryId": first["entryId"]})
        state = (await client.request({"type": "get_state"}))["data"]
        entries = await client.request({"type": "get_entries"})
    assert fork["data"]["text"] == "only" and state["messageCount"] == 0
    assert not Path(state["sessionFile"]).exists()  # written with its first message
    assert [e["type"] for e in entries["data"]["entries"]] == [
        "model_change", "thinking_level_change"]
    assert Path(state["sessionFile"]).parent == original.parent


async def test_clone_copies_the_active_branch_with_its_labels(tmp_path: Path) -> None:
    async with open_client(tmp_path, texts(3)) as client:
        await client.prompt_and_settle("one")
        await client.prompt_and_settle("two")
        original = await session_file(client)
        before = read_lines(original)
        clone = await client.request({"type": "clone"})
        cloned = await session_file(client)
        tree = await client.request({"type": "get_tree"})
        await client.prompt_and_settle("three")
    assert clone["data"] == {"cancelled": False}
    header, *entries = read_lines(cloned)
    assert header["parentSession"] == str(original) and header["id"] != before[0]["id"]
    assert entries[:len(before) - 1] == before[1:]
    assert tree["data"]["leafId"] == before[-1]["id"]
    assert [e.get("message", {}).get("role") for e in entries[len(before) - 1:]] == [
        "user", "assistant"]


async def test_clone_keeps_labels_of_entries_it_copies(tmp_path: Path) -> None:
    """Labels are re-created after the copied branch (the ancestor's createBranchedSession)."""
    path = tmp_path / "labelled.jsonl"
    lines = [
        {"type": "session", "version": 3, "id": "labelled", "timestamp": "2026-01-01T00:00:00.000Z",
         "cwd": "/w"},
        stored_message("a0000001", None, "user", "hello"),
        stored_message("a0000002", "a0000001", "assistant", "hi"),
        {"type": "label", "id": "a0000003", "parentId": "a0000002",
         "timestamp": "2026-01-01T00:00:03.000Z", "targetId": "a0000001", "label": "start"},
    ]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    async with open_client(tmp_path, session_path=path) as client:
        await client.request({"type": "clone"})
        tree = (await client.request({"type": "get_tree"}))["data"]["tree"]
        cloned = await session_file(client)
    _, *entries = read_lines(cloned)
    assert [e["id"] for e in entries[:2]] == ["a0000001", "a0000002"]
    # Opening appended the level the file did not record; the old label entry is not copied.
    assert [e["type"] for e in entries[2:]] == ["thinking_level_change", "label"]
    label = entries[3]
    assert label["targetId"] == "a0000001" and label["label"] == "start"
    assert label["id"] != "a0000003" and label["parentId"] == entries[2]["id"]
    assert entries[2]["parentId"] == "a0000002"  # it followed the label that was left out
    assert tree[0]["label"] == "start"


async def test_new_session_and_switch_back(tmp_path: Path) -> None:
    async with open_client(tmp_path, texts(3)) as client:
        await client.prompt_and_settle("in the first")
        await client.request({"type": "set_thinking_level", "level": "low"})
        first = (await client.request({"type": "get_state"}))["data"]
        new = await client.request({"type": "new_session", "parentSession": first["sessionFile"]})
        second = (await client.request({"type": "get_state"}))["data"]
        await client.request({"type": "set_thinking_level", "level": "high"})
        await client.prompt_and_settle("in the second")
        back = await client.request({"type": "switch_session",
                                     "sessionPath": first["sessionFile"]})
        again = (await client.request({"type": "get_state"}))["data"]
        messages = (await client.request({"type": "get_messages"}))["data"]["messages"]
        await client.prompt_and_settle("first, continued")
        fresh = tmp_path / "elsewhere" / "fresh.jsonl"
        await client.request({"type": "switch_session", "sessionPath": str(fresh)})
        empty = (await client.request({"type": "get_state"}))["data"]
    assert new["data"] == {"cancelled": False} and back["data"] == {"cancelled": False}
    assert second["sessionId"] != first["sessionId"] and second["messageCount"] == 0
    assert second["thinkingLevel"] == "low"  # a new session keeps the current choices
    assert read_lines(Path(second["sessionFile"]))[0]["parentSession"] == first["sessionFile"]
    assert again["sessionId"] == first["sessionId"]
    assert again["thinkingLevel"] == "low"  # restored from the file switched to
    assert user_texts(messages) == ["in the first"]
    roles = [e.get("message", {}).get("role") for e in read_lines(Path(first["sessionFile"]))]
    assert roles.count("user") == 2
    assert empty["sessionFile"] == str(fresh) and empty["messageCount"] == 0


async def test_a_switch_during_a_run_closes_it_first(tmp_path: Path) -> None:
    slow = Reply(content=[ScriptText(text="a long answer " * 20, chunks=20, delay_ms=50)])
    async with open_client(tmp_path, [slow, *texts(1)]) as client:
        await client.request({"type": "prompt", "message": "go"})
        await client.wait_for(lambda e: e.get("type") == "message_update")
        await client.send({"type": "follow_up", "message": "queued"})
        start = len(client.output)
        await client.send({"type": "new_session"})
        # Sent before the switch answered: handled in the new session, in order.
        prompt_id = await client.send({"type": "prompt", "message": "after"})
        state_id = await client.send({"type": "get_state"})
        with trio.fail_after(10):
            await client.response(prompt_id)
            await client.settled(2)
        state = await client.response(state_id)
        entries = (await client.request({"type": "get_entries"}))["data"]["entries"]
    order = [e["type"] if e["type"] != "response" else e["command"]
             for e in client.output[start:]]
    assert order.index("agent_end") < order.index("agent_settled") < order.index("new_session")
    assert order.index("new_session") < order.index("prompt")
    assert state["success"] is True
    assert client.events("queue_update")[-1]["followUp"] == []  # the switch dropped the queue
    assert [e["message"]["content"][0]["text"] for e in entries
            if e.get("message", {}).get("role") == "user"] == ["after"]
    aborted = next(e for e in client.events("message_end")
               if e["message"]["role"] == "assistant")
    assert aborted["message"]["stopReason"] == "aborted"


async def test_stats_total_every_branch(tmp_path: Path) -> None:
    """Two branches in one file: totals count both, contextUsage the active one."""
    path = tmp_path / "branched.jsonl"
    lines = [
        {"type": "session", "version": 3, "id": "branched",
         "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/w"},
        stored_message("b0000001", None, "user", "start"),
        stored_message("b0000002", "b0000001", "assistant", "abandoned answer"),
        stored_message("b0000003", "b0000001", "assistant", "kept answer",
                content=[{"type": "text", "text": "kept"},
                         {"type": "toolCall", "id": "t1", "name": "ls", "arguments": {}}],
                stopReason="toolUse"),
        {"type": "message", "id": "b0000004", "parentId": "b0000003",
         "timestamp": "2026-01-01T00:00:02.000Z",
         "message": {"role": "toolResult", "toolCallId": "t1", "toolName": "ls",
                     "content": [{"type": "text", "text": "x" * 400}], "isError": False,
                     "timestamp": 1767225602000}},
    ]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    reply = Reply(content=[ScriptText(text="done")])
    async with open_client(tmp_path, [reply], session_path=path) as client:
        before = (await client.request({"type": "get_session_stats"}))["data"]
        await client.prompt_and_settle("more")
        after = (await client.request({"type": "get_session_stats"}))["data"]
    assert before["assistantMessages"] == 2 and before["userMessages"] == 1
    assert before["toolCalls"] == 1 and before["toolResults"] == 1
    assert before["totalMessages"] == 4
    assert before["tokens"] == {"input": 200, "output": 40, "cacheRead": 0, "cacheWrite": 0,
                                "total": 240}
    assert before["cost"] == 1.0
    # The kept answer's 120 tokens, then 400 characters of tool output (100 tokens).
    assert before["contextUsage"]["tokens"] == 220
    assert before["contextUsage"]["contextWindow"] > 0
    assert before["sessionFile"] == str(path) and before["sessionId"] == "branched"
    assert after["assistantMessages"] == 3 and after["userMessages"] == 2
    assert after["tokens"]["input"] == 210 and after["tokens"]["output"] == 45
    assert after["contextUsage"]["tokens"] == 15  # the scripted reply's 10 in + 5 out
    window = after["contextUsage"]["contextWindow"]
    assert after["contextUsage"]["percent"] == 15 / window * 100


async def test_a_switch_to_a_file_in_use_keeps_the_current_session(tmp_path: Path) -> None:
    held = SessionFile.create(tmp_path / "elsewhere", Path("/w"))
    held.append("message", message={"role": "user", "content": [], "timestamp": 1})
    assert held.path is not None
    async with open_client(tmp_path) as client:
        before = (await client.request({"type": "get_state"}))["data"]
        refused = await client.request({"type": "switch_session",
                                        "sessionPath": str(held.path)})
        after = (await client.request({"type": "get_state"}))["data"]
    held.close()
    assert refused["success"] is False and "in use by another forged process" in refused["error"]
    assert after["sessionId"] == before["sessionId"]


async def test_a_long_sessions_tree_and_a_move_in_it_are_answered(tmp_path: Path) -> None:
    """A tree nests as deep as the session is long (a node per entry): 400 entries nest
    deeper than a recursive encoder goes, and are answered all the same, moves included."""
    path = tmp_path / "long.jsonl"
    header = {"type": "session", "version": 3, "id": "long", "cwd": str(tmp_path),
              "timestamp": "2026-01-01T00:00:00.000Z"}
    entries = [stored_message(f"c{n:07d}", f"c{n - 1:07d}" if n else None,
                              "user" if n % 2 == 0 else "assistant", f"entry {n}")
               for n in range(400)]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in [header, *entries]))
    async with open_client(tmp_path, session_path=path) as client:
        with trio.fail_after(30):  # a hang guard: an answer that fails to encode is none
            tree = await client.request({"type": "get_tree"})
            moved = await client.request({"type": "navigate_tree", "entryId": "c0000199"})
            messages = (await client.request({"type": "get_messages"}))["data"]["messages"]
    depth, node = 1, tree["data"]["tree"][0]
    while node["children"]:
        depth, node = depth + 1, node["children"][0]
    assert tree["success"] and depth >= 400 and node["entry"]["id"] != "c0000000"
    assert moved["success"] and moved["data"]["leafId"] != tree["data"]["leafId"]
    assert len(messages) == 200 and messages[-1]["content"][0]["text"] == "entry 199"
