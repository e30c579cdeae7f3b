"""Automatic retry under a mock clock: waits pass by `jump`, not by sleeping.

With pytest-trio's `mock_clock` time stands still until a test jumps it, so a retry wait ends
exactly when the test says, and no timeout elsewhere can fire on a slow machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio.testing

from forged._providers.scripted import Reply, ScriptText

from .harness import Client, open_client

OVERLOADED = Reply(status=529, error_type="overloaded_error", error_message="Overloaded")
OK = Reply(content=[ScriptText(text="fine now")])


async def retry_started(client: Client, count: int = 1) -> dict[str, Any]:
    await client.wait_for(lambda e: e.get("type") == "auto_retry_start"
                          and e["attempt"] == count)
    return client.events("auto_retry_start")[-1]


async def jump_when_waiting(client: Client, clock: trio.testing.MockClock, seconds: float,
                            attempt: int = 1) -> dict[str, Any]:
    started = await retry_started(client, attempt)
    await trio.testing.wait_all_tasks_blocked()
    clock.jump(seconds)
    return started


async def test_an_overloaded_provider_is_retried(tmp_path: Path,
                                                 mock_clock: trio.testing.MockClock) -> None:
    async with open_client(tmp_path, [OVERLOADED, OK]) as client:
        await client.request({"type": "prompt", "message": "hello"})
        started = await jump_when_waiting(client, mock_clock, 2.0)
        await client.settled()
        messages = (await client.request({"type": "get_messages"}))["data"]["messages"]
        entries = (await client.request({"type": "get_entries"}))["data"]["entries"]
        requests = client.server.requests
    assert started == {"type": "auto_retry_start", "attempt": 1, "maxAttempts": 3,
                       "delayMs": 2000, "errorMessage": started["errorMessage"]}
    assert started["errorMessage"].startswith("529 ") and "overloaded_error" in started[
        "errorMessage"]
    kinds = [e["type"] for e in client.output if e["type"] not in ("message_update", "response")]
    assert kinds[kinds.index("agent_start"):] == [
        "agent_start", "turn_start", "message_start", "message_end", "message_start",
        "message_end", "turn_end", "agent_end", "auto_retry_start",
        "agent_start", "turn_start", "message_start", "message_end", "auto_retry_end",
        "turn_end", "agent_end", "agent_settled"]
    first_end, second_end = client.events("agent_end")
    assert first_end["willRetry"] is True and second_end["willRetry"] is False
    assert client.events("auto_retry_end") == [
        {"type": "auto_retry_end", "success": True, "attempt": 1}]
    assert len(requests) == 2
    assert [m["role"] for m in requests[1].body["messages"]] == ["user"]  # no failed reply
    assert [m["role"] for m in messages] == ["user", "assistant"]
    stored = [e["message"].get("stopReason") for e in entries if e["type"] == "message"]
    assert stored == [None, "error", "stop"]  # the failure stays in the file


async def test_retry_after_is_honoured_when_longer(tmp_path: Path,
                                                   mock_clock: trio.testing.MockClock) -> None:
    limited = Reply(status=429, error_type="rate_limit_error", error_message="Slow down",
                    retry_after=5)
    async with open_client(tmp_path, [limited, OK]) as client:
        await client.request({"type": "prompt", "message": "hello"})
        started = await retry_started(client)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(4.9)
        await trio.testing.wait_all_tasks_blocked()
        assert len(client.server.requests) == 1  # 4.9 s is not yet 5
        mock_clock.jump(0.2)
        await client.settled()
    assert started["delayMs"] == 5000 and len(client.server.requests) == 2


async def test_server_errors_and_cut_streams_until_retries_run_out(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text(json.dumps({"retry": {"maxRetries": 2}}))
    cut = Reply(content=[ScriptText(text="half an ans", chunks=4)], cut=True)
    failing = Reply(status=500, error_message="Internal")
    async with open_client(tmp_path, [failing, cut, failing]) as client:
        await client.request({"type": "prompt", "message": "hello"})
        first = await jump_when_waiting(client, mock_clock, 2.0, attempt=1)
        second = await jump_when_waiting(client, mock_clock, 4.0, attempt=2)
        await client.settled()
    assert (first["delayMs"], second["delayMs"]) == (2000, 4000)
    assert first["maxAttempts"] == 2
    (end,) = client.events("auto_retry_end")
    assert end["success"] is False and end["attempt"] == 2
    assert end["finalError"].startswith("500 ")
    assert len(client.server.requests) == 3
    assert [e["willRetry"] for e in client.events("agent_end")] == [True, True, False]
    assert client.count("agent_settled") == 1


@pytest.mark.parametrize("silence", ["before answering", "after answering"])
async def test_a_silent_provider_times_out_and_is_retried(
        tmp_path: Path, mock_clock: trio.testing.MockClock, silence: str) -> None:
    quiet = Reply(silent=True) if silence == "before answering" else Reply(hang=True)
    async with open_client(tmp_path, [quiet, OK]) as client:
        await client.request({"type": "prompt", "message": "hello"})
        await client.server.wait_for_requests(1)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(119)
        await trio.testing.wait_all_tasks_blocked()
        assert client.events("auto_retry_start") == []
        mock_clock.jump(1)
        started = await jump_when_waiting(client, mock_clock, 2.0)
        await client.settled()
    assert started["errorMessage"] == "The provider sent nothing for 120 seconds"
    assert client.events("auto_retry_end")[0]["success"] is True


async def test_abort_retry_and_abort_cancel_the_wait(tmp_path: Path,
                                                     mock_clock: trio.testing.MockClock) -> None:
    async with open_client(tmp_path, [OVERLOADED, OVERLOADED]) as client:
        await client.request({"type": "prompt", "message": "one"})
        await retry_started(client)
        cancelled = await client.request({"type": "abort_retry"})
        await client.settled()
        after_first = len(client.output)
        await client.request({"type": "prompt", "message": "two"})
        await retry_started(client)
        aborted = await client.request({"type": "abort"})
        await client.settled(2)
    first = client.output[:after_first]
    end = next(e for e in first if e["type"] == "auto_retry_end")
    assert end == {"type": "auto_retry_end", "success": False, "attempt": 1,
                   "finalError": "Retry cancelled"}
    assert first.index(end) < first.index(cancelled) < first.index(
        next(e for e in first if e["type"] == "agent_settled"))
    assert aborted["success"] is True
    assert client.events("auto_retry_end")[-1]["finalError"] == "Retry cancelled"
    assert len(client.server.requests) == 2  # neither wait led to another call


async def test_no_retry_when_disabled_or_not_transient(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    bad_request = Reply(status=400, error_type="invalid_request_error", error_message="Bad")
    overflow = Reply(status=400, error_type="invalid_request_error",
                     error_message="prompt is too long: 300000 tokens > 200000 maximum")
    # An overflow is compacted, never retried as it is (tests/test_compaction.py): with
    # compaction off it just fails.
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text(json.dumps({"compaction": {
        "enabled": False}}))
    async with open_client(tmp_path, [bad_request, overflow, OVERLOADED]) as client:
        await client.prompt_and_settle("bad")
        await client.prompt_and_settle("too long")
        await client.request({"type": "set_auto_retry", "enabled": False})
        await client.prompt_and_settle("overloaded")
    assert client.events("auto_retry_start") == []
    assert [e["willRetry"] for e in client.events("agent_end")] == [False, False, False]
    saved = json.loads((tmp_path / "agent" / "settings.json").read_text())
    assert saved["retry"] == {"enabled": False}
    assert client.count("compaction_start") == 0


@pytest.mark.parametrize("api", ["google-generative-ai", "azure-openai-responses",
                                 "google-vertex", "mistral-conversations",
                                 "bedrock-converse-stream"])
async def test_each_apis_error_status_is_retried_with_the_services_message(
        tmp_path: Path, mock_clock: trio.testing.MockClock, api: str) -> None:
    """An error status of the newer wire APIs: its message is the service's own (from the
    API's error body), it is retried, and the reply that follows has its usage and cost."""
    unavailable = Reply(status=503, error_type="unavailable",
                        error_message="The model is overloaded. Please try again later.")
    async with open_client(tmp_path, [unavailable, OK], api=api) as client:
        await client.request({"type": "prompt", "message": "hello"})
        started = await jump_when_waiting(client, mock_clock, 2.0)
        await client.settled()
    assert started["errorMessage"] == "503 The model is overloaded. Please try again later."
    final = client.events("message_end")[-1]["message"]
    assert final["stopReason"] == "stop"
    assert [(block["type"], block["text"]) for block in final["content"]] == [
        ("text", "fine now")]
    usage = final["usage"]
    assert (usage["input"], usage["output"], usage["totalTokens"]) == (10, 5, 15)
    assert usage["cost"]["total"] == pytest.approx((10 * 3 + 5 * 15) / 1e6)
    assert len(client.server.requests) == 2


async def test_an_abort_during_a_retried_reply_closes_in_order(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    """An abort while the retry's reply streams: the reply's end, then the retries' end (the
    reply came), then the turn's and the run's, as when nothing holds the closing back."""
    slow = Reply(content=[ScriptText(text="ab", chunks=2, delay_ms=1000)])
    async with open_client(tmp_path, [OVERLOADED, slow]) as client:
        await client.request({"type": "prompt", "message": "hello"})
        await jump_when_waiting(client, mock_clock, 2.0)
        await trio.testing.wait_all_tasks_blocked()  # the reply's first frames are in
        await client.request({"type": "abort"})
        await client.settled()
    kinds = [e["type"] for e in client.output if e["type"] not in ("message_update", "response")]
    assert kinds[kinds.index("auto_retry_start"):] == [
        "auto_retry_start", "agent_start", "turn_start", "message_start", "message_end",
        "auto_retry_end", "turn_end", "agent_end", "agent_settled"]
    assert client.events("message_end")[-1]["message"]["stopReason"] == "aborted"
