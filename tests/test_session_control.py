"""Steering, follow-ups, the queue, abort and busy prompts, while a run streams or a tool runs."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import trio

from forged._process import live_group_members
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall
from forged._session import BUSY_PROMPT_ERROR

from .harness import open_client
from .test_loop import shapes


def slow_text(text: str = "x" * 200, chunks: int = 200, delay_ms: float = 10) -> Reply:
    return Reply(content=[ScriptText(text=text, chunks=chunks, delay_ms=delay_ms)])


def user_texts(body: dict[str, object]) -> list[str]:
    """The text of every user message an Anthropic request carried."""
    texts = []
    for message in body["messages"]:  # type: ignore[attr-defined]
        if message["role"] == "user":
            texts += [b["text"] for b in message["content"] if b.get("type") == "text"]
    return texts


async def test_state_and_queue_are_answered_while_a_tool_runs(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={
        "command": "echo started; sleep 1; echo finished"})]),
        Reply(content=[ScriptText(text="hi")]), Reply(content=[ScriptText(text="summary")])]
    async with open_client(tmp_path, replies) as client:
        await client.request({"type": "prompt", "message": "run it"})
        await client.wait_for(lambda e: e["type"] == "tool_execution_update")
        state = await client.request({"type": "get_state"})
        steer = await client.request({"type": "steer", "message": "then say hi"})
        follow = await client.request({"type": "follow_up", "message": "and summarize"})
        state_after = await client.request({"type": "get_state"})
        # Answered while the tool still runs: nothing waited for it.
        assert client.count("tool_execution_end") == 0
        await client.settled()
    assert len(client.server.requests) == 3  # the prompt's, the steering's, the follow-up's
    assert state["data"]["isStreaming"] is True
    assert steer["data"] == {"disposition": "queued"}
    assert follow["data"] == {"disposition": "queued"}
    assert state_after["data"]["pendingMessageCount"] == 2
    updates = client.events("queue_update")
    assert updates[0] == {"type": "queue_update", "steering": ["then say hi"], "followUp": []}
    assert updates[1] == {"type": "queue_update", "steering": ["then say hi"],
                          "followUp": ["and summarize"]}


async def test_steering_is_delivered_after_the_tool_calls_finish(tmp_path: Path) -> None:
    replies = [
        Reply(content=[
            ScriptToolCall(name="bash", arguments={"command": "sleep 0.3; echo one"}),
            ScriptToolCall(name="bash", arguments={"command": "echo two"})]),
        Reply(content=[ScriptText(text="steered")]),
    ]
    async with open_client(tmp_path, replies) as client:
        await client.request({"type": "prompt", "message": "go"})
        await client.wait_for(lambda e: e["type"] == "tool_execution_start")
        await client.request({"type": "steer", "message": "change of plan"})
        await client.settled()
    ends = client.events("tool_execution_end")
    assert [e["result"]["content"][0]["text"] for e in ends] == ["one\n", "two\n"]
    assert not any(e["isError"] for e in ends)  # no tool call skipped
    sequence = shapes(client)
    first_turn_end = sequence.index("turn_end")
    assert sequence[first_turn_end + 1: first_turn_end + 5] == [
        "queue_update", "turn_start", "message_start:user", "message_end:user"]
    steer_message = client.events("message_start")[-2]["message"]
    assert steer_message["content"] == [{"type": "text", "text": "change of plan"}]
    assert user_texts(client.server.requests[1].body) == ["go", "change of plan"]
    assert client.count("agent_start") == 1


async def test_steering_after_a_final_answer_starts_another_turn(tmp_path: Path) -> None:
    async with open_client(tmp_path, [slow_text(), Reply(content=[ScriptText(text="ok")])]
                           ) as client:
        await client.request({"type": "prompt", "message": "go"})
        await client.wait_for(lambda e: e["type"] == "message_update")
        await client.request({"type": "steer", "message": "more"})
        await client.settled()
    assert len(client.server.requests) == 2
    assert client.count("agent_start") == 1 and client.count("turn_start") == 2


@pytest.mark.parametrize(("mode", "requests"), [("one-at-a-time", 3), ("all", 2)])
async def test_follow_ups_in_both_modes(tmp_path: Path, mode: str, requests: int) -> None:
    replies = [slow_text(), Reply(content=[ScriptText(text="a")]),
               Reply(content=[ScriptText(text="b")])]
    async with open_client(tmp_path, replies) as client:
        await client.request({"type": "set_follow_up_mode", "mode": mode})
        await client.request({"type": "prompt", "message": "go"})
        await client.wait_for(lambda e: e["type"] == "message_update")
        await client.request({"type": "follow_up", "message": "first"})
        await client.request({"type": "prompt", "message": "second",
                              "streamingBehavior": "followUp"})
        await client.settled()
        state = await client.request({"type": "get_state"})
    assert state["data"]["followUpMode"] == mode
    assert len(client.server.requests) == requests
    last = client.server.requests[-1].body
    assert user_texts(last) == ["go", "first", "second"]
    assert client.count("agent_start") == 1 and client.count("agent_settled") == 1
    assert client.events("queue_update")[-1] == {"type": "queue_update", "steering": [],
                                                 "followUp": []}


async def test_steering_one_at_a_time_and_all(tmp_path: Path) -> None:
    for mode, calls in (("one-at-a-time", 3), ("all", 2)):
        replies = [slow_text(), Reply(content=[ScriptText(text="a")]),
                   Reply(content=[ScriptText(text="b")])]
        async with open_client(tmp_path, replies) as client:
            await client.request({"type": "set_steering_mode", "mode": mode})
            await client.request({"type": "prompt", "message": "go"})
            await client.wait_for(lambda e: e["type"] == "message_update")
            await client.request({"type": "steer", "message": "s1"})
            await client.request({"type": "steer", "message": "s2"})
            await client.settled()
        assert len(client.server.requests) == calls, mode


async def test_queued_while_idle_is_delivered_in_the_next_run(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptText(text="a")]), Reply(content=[ScriptText(text="b")])]
    async with open_client(tmp_path, replies) as client:
        await client.request({"type": "follow_up", "message": "later"})
        await client.request({"type": "steer", "message": "now"})
        await client.prompt_and_settle("start")
    assert user_texts(client.server.requests[0].body) == ["start", "now"]
    assert user_texts(client.server.requests[1].body) == ["start", "now", "later"]


async def test_clear_queue_returns_and_drops_the_texts(tmp_path: Path) -> None:
    async with open_client(tmp_path, [slow_text()]) as client:
        await client.request({"type": "prompt", "message": "go"})
        await client.wait_for(lambda e: e["type"] == "message_update")
        await client.request({"type": "steer", "message": "Change direction"})
        await client.request({"type": "follow_up", "message": "Summarize when finished"})
        cleared = await client.request({"type": "clear_queue"})
        await client.settled()
        state = await client.request({"type": "get_state"})
    assert cleared["data"] == {"steering": ["Change direction"],
                               "followUp": ["Summarize when finished"]}
    assert client.events("queue_update")[-1] == {"type": "queue_update", "steering": [],
                                                 "followUp": []}
    assert len(client.server.requests) == 1
    assert state["data"]["pendingMessageCount"] == 0


async def test_prompt_while_streaming_needs_streaming_behavior(tmp_path: Path) -> None:
    async with open_client(tmp_path, [slow_text(), Reply(content=[ScriptText(text="ok")])]
                           ) as client:
        await client.request({"type": "prompt", "message": "go"})
        await client.wait_for(lambda e: e["type"] == "message_update")
        refused = await client.request({"type": "prompt", "message": "again"})
        queued = await client.request({"type": "prompt", "message": "again",
                                       "streamingBehavior": "steer"})
        await client.request({"type": "abort"})
        await client.settled()
    assert refused["success"] is False and refused["error"] == BUSY_PROMPT_ERROR
    assert queued["success"] is True and queued["data"] == {"disposition": "queued"}


async def test_abort_mid_stream_keeps_the_partial_message(tmp_path: Path) -> None:
    async with open_client(tmp_path, [slow_text(), Reply(content=[ScriptText(text="ok")])]
                           ) as client:
        await client.request({"type": "prompt", "message": "go"})
        await client.wait_for(lambda e: e.get("assistantMessageEvent", {}).get("type")
                              == "text_delta")
        with trio.fail_after(10):  # a hang guard, not a timing
            abort = await client.request({"type": "abort"})
        await client.settled()
        messages = await client.request({"type": "get_messages"})
        await client.prompt_and_settle("next")
    assert abort["success"] is True
    tail = shapes(client)
    end = tail.index("response:abort")
    assert tail[end - 3: end + 2] == ["message_end:assistant", "turn_end", "agent_end",
                                      "response:abort", "agent_settled"]
    aborted = client.events("message_end")[1]["message"]
    assert aborted["stopReason"] == "aborted"
    assert aborted["errorMessage"] == "Request was aborted"
    assert aborted["content"][0]["type"] == "text"
    assert 0 < len(aborted["content"][0]["text"]) < 200
    assert [m["role"] for m in messages["data"]["messages"]] == ["user", "assistant"]
    # The aborted reply stays in the session but out of the next request.
    assert [m["role"] for m in client.server.requests[1].body["messages"]] == ["user", "user"]


async def test_abort_mid_tool_kills_the_process_group(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={
        "command": "echo $$; sleep 60 & sleep 60; echo never"})])]
    async with open_client(tmp_path, replies) as client:
        await client.request({"type": "prompt", "message": "run"})
        update = await client.wait_for(lambda e: e["type"] == "tool_execution_update")
        pgid = int(update["partialResult"]["content"][0]["text"].split()[0])
        assert pgid in live_group_members(pgid)  # the group is alive while the tool runs
        with trio.fail_after(10):  # a hang guard, not a timing
            abort = await client.request({"type": "abort"})
        await client.settled()
    assert abort["success"] is True
    assert live_group_members(pgid) == []
    end = client.events("tool_execution_end")[0]
    assert end["isError"] is True
    assert end["result"]["content"][0]["text"] == f"{pgid}\n\nCommand aborted"
    result = client.events("message_end")[-1]["message"]
    assert result["role"] == "toolResult" and result["isError"] is True
    assert shapes(client)[-6:] == ["message_start:toolResult", "message_end:toolResult",
                                   "turn_end", "agent_end", "response:abort", "agent_settled"]


async def test_abort_with_queued_messages_continues_with_them(tmp_path: Path) -> None:
    async with open_client(tmp_path, [slow_text(), Reply(content=[ScriptText(text="b")])]
                           ) as client:
        await client.request({"type": "prompt", "message": "go"})
        await client.wait_for(lambda e: e["type"] == "message_update")
        await client.request({"type": "follow_up", "message": "after abort"})
        await client.request({"type": "abort"})
        await client.settled()
    sequence = shapes(client)
    assert sequence.count("agent_start") == 2 and sequence.count("agent_settled") == 1
    abort_at = sequence.index("response:abort")
    assert sequence[abort_at - 1] == "agent_end"
    assert sequence[abort_at + 1: abort_at + 3] == ["queue_update", "agent_start"]
    assert user_texts(client.server.requests[1].body) == ["go", "after abort"]


async def test_abort_when_idle_answers_at_once(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        response = await client.request({"type": "abort"})
    assert response["success"] is True
    assert client.types() == ["response"]


async def test_payload_round_trips_exactly(tmp_path: Path) -> None:
    text = "line\u2028sep\u2029para 😀 naïve \\ \" end"
    image = base64.b64encode(os.urandom(7_500_000)).decode()  # 10 MB of base64
    assert len(image) == 10_000_000
    async with open_client(tmp_path, [Reply(content=[ScriptText(text=text)])]) as client:
        await client.prompt_and_settle(text, images=[
            {"type": "image", "data": image, "mimeType": "image/png"}])
    user = client.events("message_start")[0]["message"]
    assert user["content"] == [{"type": "text", "text": text},
                               {"type": "image", "data": image, "mimeType": "image/png"}]
    sent = client.server.requests[0].body["messages"][0]["content"]
    assert sent[0]["text"] == text
    assert sent[1]["source"] == {"type": "base64", "media_type": "image/png", "data": image}
    answer = client.events("message_end")[-1]["message"]
    assert answer["content"][0]["text"] == text
    assert all(b"\xe2\x80\xa8" not in line for line in client.lines)


async def test_a_run_that_fails_inside_forged_still_settles(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        registry = client.config.registry
        broken = registry.models[-1]
        broken.api = "carrier-pigeon"  # no provider speaks it: the run cannot even start
        await client.request({"type": "set_model", "provider": broken.provider,
                              "modelId": broken.id})
        await client.prompt_and_settle("hi")
        state = await client.request({"type": "get_state"})
    sequence = client.types()
    assert sequence[-3:] == ["agent_end", "agent_settled", "response"]
    assert state["data"]["isStreaming"] is False
