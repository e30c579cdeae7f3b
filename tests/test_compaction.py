"""Compaction (docs/protocol.md, Retries and compaction): manual, after a turn past the
threshold, and after a context overflow, checked by what the provider was asked and what the
client saw. Under `mock_clock` nothing waits unless a test jumps the clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
import trio.testing

from forged._catalogue import ModelDefinition, ProviderConfig
from forged._compaction import (
    SPLIT_TURN_SEPARATOR,
    SUMMARY_PROMPT,
    SYSTEM_PROMPT,
    TURN_PREFIX_PROMPT,
    UPDATE_PROMPT,
)
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall, ScriptUsage
from forged._run import OVERFLOW_RECOVERY_FAILED

from .harness import Client, open_client

SUMMARY_PREFIX = ("The conversation history before this point was compacted into the "
                  "following summary:\n\n<summary>\n")
FULL = ScriptUsage(input=190_000, output=100)
"""Past the default threshold of a 200k window: 200,000 - 16,384."""
OVERFLOW = Reply(status=400, error_type="invalid_request_error",
                 error_message="prompt is too long: 213000 tokens > 200000 maximum")


def text(reply: str, **extra: Any) -> Reply:
    return Reply(content=[ScriptText(text=reply)], **extra)


def summary(reply: str = "## Goal\nShip it", **extra: Any) -> Reply:
    return Reply(content=[ScriptText(text=reply)], usage=ScriptUsage(input=300, output=40),
                 **extra)


def settings(tmp_path: Path, **sections: Any) -> Path:
    path = tmp_path / "agent" / "settings.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(sections))
    return path


def asked(request: Any) -> str:
    """The one user text a summary request carries."""
    (message,) = request.body["messages"]
    (block,) = message["content"]
    return str(block["text"])


def sent_texts(request: Any) -> list[str]:
    return [block.get("text", "") for message in request.body["messages"]
            for block in message["content"]]


async def entries(client: Client) -> list[dict[str, Any]]:
    return list((await client.request({"type": "get_entries"}))["data"]["entries"])


async def test_manual_compaction_summarizes_the_older_part_and_keeps_the_rest(
        tmp_path: Path) -> None:
    settings(tmp_path, compaction={"keepRecentTokens": 80})
    replies = [Reply(content=[ScriptToolCall(name="read", arguments={"path": "a.txt"})]),
               Reply(content=[ScriptToolCall(name="write",
                                             arguments={"path": "b.txt", "content": "b\n"})]),
               text("I read a.txt and wrote b.txt"),
               text("second answer " * 20),
               summary(),
               text("carrying on")]
    async with open_client(tmp_path, replies) as client:
        (client.cwd / "a.txt").write_text("hello\n")
        await client.prompt_and_settle("read a.txt, write b.txt")
        await client.prompt_and_settle("now more " * 10)
        start = len(client.output)
        response = await client.request({"type": "compact",
                                         "customInstructions": "Focus on a.txt"})
        seen = client.output[start:]
        stored = await entries(client)
        await client.prompt_and_settle("after")
        requests = client.server.requests
    assert [e["type"] for e in seen] == ["compaction_start", "compaction_end", "response"]
    assert seen[0] == {"type": "compaction_start", "reason": "manual"}
    result = response["data"]
    assert seen[1] == {"type": "compaction_end", "reason": "manual", "result": result,
                       "aborted": False, "willRetry": False}
    assert result["summary"] == ("## Goal\nShip it\n\n<read-files>\na.txt\n</read-files>"
                                 "\n\n<modified-files>\nb.txt\n</modified-files>")
    assert result["details"] == {"readFiles": ["a.txt"], "modifiedFiles": ["b.txt"]}
    assert result["usage"]["input"] == 300 and result["usage"]["output"] == 40
    assert result["usage"]["cost"]["total"] > 0
    assert result["tokensBefore"] == 15  # the last reply's usage (10 in, 5 out): nothing after
    assert result["estimatedTokensAfter"] > 0
    compactions = [e for e in stored if e["type"] == "compaction"]
    assert len(compactions) == 1 and compactions[0]["summary"] == result["summary"]
    first_kept = next(i for i, e in enumerate(stored) if e["id"] == result["firstKeptEntryId"])
    # (widened back over entries that hold no message: the run's checkpoint, say)
    kept = next(e for e in stored[first_kept:] if e["type"] == "message")
    assert kept["message"]["content"][0]["text"] == "now more " * 10

    ask = requests[4]
    assert ask.body["system"][0]["text"] == SYSTEM_PROMPT
    assert "tools" not in ask.body
    # 80% of the reserve, raised by the thinking budget within the model's limit as the
    # ancestor's Anthropic provider does.
    assert ask.body["max_tokens"] == 16_384 and ask.body["thinking"]["type"] == "enabled"
    assert asked(ask) == (
        "<conversation>\n[User]: read a.txt, write b.txt\n\n"
        "[Assistant tool calls]: read(path=\"a.txt\")\n\n[Tool result]: hello\n\n\n"
        "[Assistant tool calls]: write(path=\"b.txt\", content=\"b\\n\")\n\n"
        "[Tool result]: Successfully wrote 2 bytes to b.txt\n\n"
        "[Assistant]: I read a.txt and wrote b.txt\n</conversation>\n\n"
        f"{SUMMARY_PROMPT}\n\nAdditional focus: Focus on a.txt")
    assert sent_texts(requests[5]) == [
        SUMMARY_PREFIX + result["summary"] + "\n</summary>", "now more " * 10,
        "second answer " * 20, "after"]


async def test_a_second_compaction_updates_the_first_summary(tmp_path: Path) -> None:
    settings(tmp_path, compaction={"keepRecentTokens": 5})  # the newest turn (10 tokens)
    replies = [Reply(content=[ScriptToolCall(name="read", arguments={"path": "a.txt"})]),
               text("read it"), text("ok"), summary("first summary"), text("ok"),
               summary("second summary")]
    async with open_client(tmp_path, replies) as client:
        (client.cwd / "a.txt").write_text("hello\n")
        await client.prompt_and_settle("one")
        await client.prompt_and_settle("two " * 8)
        first = await client.request({"type": "compact"})
        again = await client.request({"type": "compact"})
        await client.prompt_and_settle("three " * 7)
        second = await client.request({"type": "compact"})
        requests = client.server.requests
    assert first["success"] and again == {
        "id": again["id"], "type": "response", "command": "compact", "success": False,
        "error": "Already compacted"}
    assert asked(requests[3]).startswith("<conversation>\n[User]: one\n\n")
    # What the first compaction kept is summarized by the second, with the first summary.
    assert asked(requests[5]) == (
        f"<conversation>\n[User]: {'two ' * 8}\n\n[Assistant]: ok\n</conversation>\n\n"
        "<previous-summary>\nfirst summary\n\n<read-files>\na.txt\n</read-files>\n"
        f"</previous-summary>\n\n{UPDATE_PROMPT}")
    # The files the first compaction recorded carry over into the second.
    assert second["data"]["details"] == {"readFiles": ["a.txt"], "modifiedFiles": []}
    assert second["data"]["summary"].startswith("second summary\n\n<read-files>")


async def test_a_turn_cut_in_the_middle_gets_a_prefix_summary(tmp_path: Path) -> None:
    settings(tmp_path, compaction={"keepRecentTokens": 40})
    replies = [text("first answer"),
               Reply(content=[ScriptText(text="looking " * 30),
                              ScriptToolCall(name="ls", arguments={})]),
               text("the listing " * 15),
               summary("history"), summary("prefix")]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("first")
        await client.prompt_and_settle("list the files")
        response = await client.request({"type": "compact"})
        stored = await entries(client)
        history, prefix = client.server.requests[3:]
    result = response["data"]
    assert result["summary"] == "history" + SPLIT_TURN_SEPARATOR + "prefix"
    kept = next(e for e in stored if e["id"] == result["firstKeptEntryId"])
    assert kept["message"]["content"][0]["text"] == "the listing " * 15  # inside the turn
    assert asked(history) == ("<conversation>\n[User]: first\n\n[Assistant]: first answer\n"
                              f"</conversation>\n\n{SUMMARY_PROMPT}")
    assert asked(prefix).startswith("<conversation>\n[User]: list the files\n\n[Assistant]: "
                                    "looking ")
    assert asked(prefix).endswith(f"</conversation>\n\n{TURN_PREFIX_PROMPT}")
    assert prefix.body["max_tokens"] == 8_192 and "thinking" not in prefix.body


async def test_compaction_past_the_threshold_then_queued_messages_go_on(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    replies = [text("a full context", usage=FULL), summary(delay_ms=1000),
               text("followed up")]
    async with open_client(tmp_path, replies) as client:
        await client.request({"type": "prompt", "message": "fill it"})
        await client.wait_for(lambda e: e.get("type") == "compaction_start")
        state = (await client.request({"type": "get_state"}))["data"]
        queued = await client.request({"type": "follow_up", "message": "and then?"})
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1)
        await client.settled()
        requests = client.server.requests
    assert state["isCompacting"] is True and state["isStreaming"] is False
    assert queued["data"] == {"disposition": "queued"}
    kinds = [e["type"] for e in client.output if e["type"] in (
        "agent_start", "agent_end", "compaction_start", "compaction_end", "agent_settled")]
    assert kinds == ["agent_start", "agent_end", "compaction_start", "compaction_end",
                     "agent_start", "agent_end", "agent_settled"]
    (end,) = client.events("compaction_end")
    assert end["reason"] == "threshold" and end["willRetry"] is False
    assert end["result"]["tokensBefore"] == 190_100
    assert client.events("agent_end")[0]["willRetry"] is False
    assert sent_texts(requests[2])[0].startswith(SUMMARY_PREFIX + "## Goal")
    assert sent_texts(requests[2])[-1] == "and then?"


async def test_an_overflow_is_compacted_and_the_prompt_retried_once(
        tmp_path: Path) -> None:
    settings(tmp_path, compaction={"keepRecentTokens": 1})
    replies = [text("earlier answer"), OVERFLOW, summary(), text("fits now")]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("earlier")
        start = len(client.output)
        await client.prompt_and_settle("too big")
        stored = await entries(client)
        requests = client.server.requests
    kinds = [e["type"] for e in client.output[start:] if e["type"] in (
        "agent_start", "agent_end", "compaction_start", "compaction_end", "agent_settled")]
    assert kinds == ["agent_start", "agent_end", "compaction_start", "compaction_end",
                     "agent_start", "agent_end", "agent_settled"]
    first_end, second_end = client.events("agent_end")[1:]
    assert first_end["willRetry"] is True and second_end["willRetry"] is False
    (end,) = client.events("compaction_end")
    assert end["reason"] == "overflow" and end["willRetry"] is True and end["result"]
    assert asked(requests[2]).startswith("<conversation>\n[User]: earlier\n\n"
                                         "[Assistant]: earlier answer\n</conversation>")
    # The retry: the summary, the kept prompt, and not the failed reply.
    assert sent_texts(requests[3]) == [SUMMARY_PREFIX + "## Goal\nShip it\n</summary>",
                                       "too big"]
    stops = [e["message"].get("stopReason") for e in stored if e["type"] == "message"]
    assert stops == [None, "stop", None, "error", "stop"]  # the overflow stays in the file


async def test_a_second_overflow_for_the_same_prompt_gives_up(tmp_path: Path) -> None:
    replies = [OVERFLOW, summary(), OVERFLOW]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("too big")
        requests = client.server.requests
    assert len(requests) == 3
    assert [e["willRetry"] for e in client.events("agent_end")] == [True, False]
    first, second = client.events("compaction_end")
    assert first["willRetry"] is True
    assert second == {"type": "compaction_end", "reason": "overflow", "result": None,
                      "aborted": False, "willRetry": False,
                      "errorMessage": OVERFLOW_RECOVERY_FAILED}
    assert client.types()[-3:] == ["agent_end", "compaction_end", "agent_settled"]


async def test_summarization_retries_a_transient_error(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    overloaded = Reply(status=529, error_type="overloaded_error", error_message="Overloaded")
    async with open_client(tmp_path, [text("hi"), overloaded, summary()]) as client:
        await client.prompt_and_settle("hello")
        start = len(client.output)
        compact_id = await client.send({"type": "compact"})
        await client.wait_for(lambda e: e.get("type") == "summarization_retry_scheduled")
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(2)
        response = await client.response(compact_id)
        seen = client.output[start:]
    assert [e["type"] for e in seen] == [
        "compaction_start", "summarization_retry_scheduled", "summarization_retry_attempt_start",
        "summarization_retry_finished", "compaction_end", "response"]
    scheduled = seen[1]
    assert scheduled == {"type": "summarization_retry_scheduled", "attempt": 1,
                         "maxAttempts": 3, "delayMs": 2000,
                         "errorMessage": scheduled["errorMessage"]}
    assert "overloaded_error" in scheduled["errorMessage"]
    assert seen[2] == {"type": "summarization_retry_attempt_start", "source": "compaction",
                       "reason": "manual"}
    assert response["success"] is True


async def test_a_failed_summary_fails_the_compaction(tmp_path: Path) -> None:
    refused = Reply(status=400, error_type="invalid_request_error", error_message="No")
    async with open_client(tmp_path, [text("hi"), refused]) as client:
        await client.prompt_and_settle("hello")
        response = await client.request({"type": "compact"})
        stored = await entries(client)
    (end,) = client.events("compaction_end")
    assert end["result"] is None and end["aborted"] is False
    assert end["errorMessage"].startswith("Summarization failed: 400 ")
    assert response["success"] is False and response["error"] == end["errorMessage"]
    assert not any(e["type"] == "compaction" for e in stored)


async def test_abort_stops_a_manual_compaction(tmp_path: Path) -> None:
    async with open_client(tmp_path, [text("hi"), Reply(silent=True), text("still here")]
                           ) as client:
        await client.prompt_and_settle("hello")
        start = len(client.output)
        compact_id = await client.send({"type": "compact"})
        await client.server.wait_for_requests(2)
        with trio.fail_after(5):
            aborted = await client.request({"type": "abort"})
        response = await client.response(compact_id)
        seen = [e for e in client.output[start:] if e is not response and e is not aborted]
        await client.prompt_and_settle("are you there?")
        stored = await entries(client)
    assert seen == [{"type": "compaction_start", "reason": "manual"},
                    {"type": "compaction_end", "reason": "manual", "result": None,
                     "aborted": True, "willRetry": False}]
    assert response["success"] is False and response["error"] == "Compaction cancelled"
    assert aborted["success"] is True
    assert not any(e["type"] == "compaction" for e in stored)
    assert client.events("message_end")[-1]["message"]["content"][0]["text"] == "still here"


async def test_abort_stops_an_automatic_compaction(tmp_path: Path) -> None:
    async with open_client(tmp_path, [text("full", usage=FULL), Reply(silent=True)]
                           ) as client:
        await client.request({"type": "prompt", "message": "fill it"})
        await client.server.wait_for_requests(2)
        with trio.fail_after(5):
            aborted = await client.request({"type": "abort"})
        await client.settled()
    assert aborted["success"] is True
    (end,) = client.events("compaction_end")
    assert end == {"type": "compaction_end", "reason": "threshold", "result": None,
                   "aborted": True, "willRetry": False}
    assert client.count("agent_settled") == 1
    assert client.output.index(end) < client.output.index(client.events("agent_settled")[0])


async def test_abort_stops_a_summarization_retry_wait(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    overloaded = Reply(status=529, error_type="overloaded_error", error_message="Overloaded")
    async with open_client(tmp_path, [text("hi"), overloaded]) as client:
        await client.prompt_and_settle("hello")
        compact_id = await client.send({"type": "compact"})
        await client.wait_for(lambda e: e.get("type") == "summarization_retry_scheduled")
        aborted = await client.request({"type": "abort"})
        response = await client.response(compact_id)
    assert aborted["success"] is True and response["error"] == "Compaction cancelled"
    assert client.types()[-4:] == ["summarization_retry_finished", "compaction_end",
                                   "response", "response"]
    assert client.events("compaction_end")[0]["aborted"] is True
    assert len(client.server.requests) == 2  # the retry never went out


async def test_compact_refuses_while_busy_and_when_there_is_nothing(tmp_path: Path) -> None:
    async with open_client(tmp_path, [Reply(silent=True)]) as client:
        empty = await client.request({"type": "compact"})
        await client.request({"type": "prompt", "message": "hello"})
        await client.server.wait_for_requests(1)
        busy = await client.request({"type": "compact"})
        await client.request({"type": "abort"})
    assert empty["error"] == "Nothing to compact (session too small)"
    assert busy["error"] == "Agent is busy"
    assert client.count("compaction_start") == 0


async def test_auto_compaction_can_be_switched_off_and_it_is_remembered(
        tmp_path: Path) -> None:
    path = settings(tmp_path, theme="dark")
    async with open_client(tmp_path, [text("full", usage=FULL)]) as client:
        switched = await client.request({"type": "set_auto_compaction", "enabled": False})
        await client.prompt_and_settle("fill it")
        state = (await client.request({"type": "get_state"}))["data"]
    assert switched == {"id": switched["id"], "type": "response",
                        "command": "set_auto_compaction", "success": True}
    assert client.count("compaction_start") == 0
    assert state["autoCompactionEnabled"] is False
    assert json.loads(path.read_text()) == {"theme": "dark", "compaction": {"enabled": False}}


async def test_a_small_window_does_not_compact_a_short_chat(tmp_path: Path) -> None:
    """An 8K model from models.json: the reserve and the default output cap are a quarter of
    its window, so a 17-token chat is never compacted and the model is not asked for more
    than it can give."""
    replies = [Reply(content=[ScriptText(text="Hi.")], usage=ScriptUsage(input=12, output=5))
               for _ in range(3)]
    async with open_client(tmp_path, replies) as client:
        small = ModelDefinition(id="small", context_window=8192).model(
            "small", "anthropic-messages", client.server.base_url)
        client.config.registry.add_provider(
            ProviderConfig(name="small", base_url=client.server.base_url, api_key="k"), [small])
        chosen = await client.request({"type": "set_model", "provider": "small",
                                       "modelId": "small"})
        for text in ("one", "two", "three"):
            await client.prompt_and_settle(text)
    assert chosen["success"] is True and small.max_tokens == 2048
    assert client.count("compaction_start") == 0
    assert len(client.server.requests) == 3  # no summary calls
    assert client.server.requests[-1].body["max_tokens"] == 2048
