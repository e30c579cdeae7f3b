"""The run driver's decisions, with no provider and no process: what follows each outcome a
run can return (`Runner.decide`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from forged import _wire as w
from forged._context import Context
from forged._errors import ProviderError, ProviderStatusError, ProviderStreamError
from forged._loop import RunOutcome
from forged._retry import RetrySettings, RunSettings
from forged._run import OVERFLOW_RECOVERY_FAILED, Runner
from forged._settings import CompactionSettings
from forged._store import SessionFile

MODEL = w.Model(id="m", name="M", api="anthropic-messages", provider="p", base_url="u",
                reasoning=False, input=["text"], context_window=100_000, max_tokens=1000,
                cost=w.ModelCost(), thinking_levels=["off"])


class Host:
    """The session as the driver reads it: its model, its settings, an empty context."""

    def __init__(self, *, compaction: bool = True) -> None:
        self.model = MODEL
        self.settings = RunSettings(retry=RetrySettings(base_delay_ms=100),
                                    compaction=CompactionSettings(enabled=compaction))

    def check_can_prompt(self) -> None:
        pass

    async def model_request(self, context: list[w.AgentMessage]) -> Any:
        raise AssertionError("no run is made here")

    async def summary_request(self, text: str, *, max_tokens: int, reasoning: bool) -> Any:
        raise AssertionError("no compaction is made here")


def reply(stop: str = "stop", error: str | None = None) -> w.AssistantMessage:
    return w.AssistantMessage(api=MODEL.api, provider=MODEL.provider, model=MODEL.id,
                              stop_reason=stop, error_message=error,  # type: ignore[arg-type]
                              timestamp=1)


def failed(error: ProviderError | None, text: str | None = None) -> RunOutcome:
    message = reply("error", text or (str(error) if error else "Cannot write the file"))
    return RunOutcome(messages=[message], reply=message, error=error)


async def runner(host: Host) -> Runner:
    events: list[w.Event] = []

    class Events:
        def emit(self, event: w.Event) -> None:
            events.append(event)

        async def wait_for_room(self) -> None:
            pass

        def flush(self) -> None:
            pass

    async with trio.open_nursery() as nursery:
        made = Runner(nursery, events=Events(), asking=host, tools=None,  # type: ignore[arg-type]
                      queues=None, context=Context(SessionFile.create(None, Path("/w"))),  # type: ignore[arg-type]
                      settings=host.settings)
    return made


async def test_a_run_that_completed_ends_the_spell() -> None:
    decision = (await runner(Host())).decide(RunOutcome(messages=[], reply=reply()))
    assert (decision.next, decision.ended) == ("end", [])


@pytest.mark.parametrize("error", [ProviderStatusError("503 busy", status=503),
                                   ProviderStreamError("the stream broke"),
                                   ProviderStatusError("529 overloaded_error", status=529)])
async def test_a_passing_failure_is_retried_with_a_doubling_wait(error: ProviderError) -> None:
    driver = await runner(Host())
    first, second = driver.decide(failed(error)), driver.decide(failed(error))
    assert (first.next, first.attempt, first.delay_ms) == ("retry", 1, 100)
    assert (second.next, second.attempt, second.delay_ms) == ("retry", 2, 200)


async def test_retries_run_out_and_say_so_after_the_runs_agent_end() -> None:
    driver = await runner(Host())
    error = ProviderStatusError("503 busy", status=503)
    decisions = [driver.decide(failed(error)) for _ in range(4)]
    assert [d.next for d in decisions] == ["retry", "retry", "retry", "end"]
    (gave_up,) = decisions[-1].ended
    assert isinstance(gave_up, w.AutoRetryEnd)
    assert (gave_up.success, gave_up.attempt, gave_up.final_error) == (False, 3, "503 busy")
    assert driver.retry_attempt == 0


@pytest.mark.parametrize("error", [ProviderStatusError("400 bad request", status=400), None])
async def test_a_failure_that_will_not_pass_ends_the_spell(error: ProviderError | None) -> None:
    decision = (await runner(Host())).decide(failed(error))
    assert (decision.next, decision.ended) == ("end", [])


async def test_an_overflow_is_compacted_once_per_prompt() -> None:
    driver = await runner(Host())
    overflow = ProviderStatusError("400 prompt is too long: 250000 tokens", status=400)
    first, second = driver.decide(failed(overflow)), driver.decide(failed(overflow))
    assert (first.next, first.ended) == ("compact", [])
    assert second.next == "end"
    (gave_up,) = second.ended
    assert isinstance(gave_up, w.CompactionEnd)
    assert (gave_up.reason, gave_up.error_message) == ("overflow", OVERFLOW_RECOVERY_FAILED)
    driver.saw(w.MessageEnd(message=w.UserMessage(content=[], timestamp=1)))  # a new prompt
    assert driver.decide(failed(overflow)).next == "compact"


async def test_an_overflow_without_compaction_ends_and_retries_end_first() -> None:
    driver = await runner(Host(compaction=False))
    busy = ProviderStatusError("503 busy", status=503)
    overflow = ProviderStatusError("400 prompt is too long", status=400)
    assert driver.decide(failed(busy)).next == "retry"
    decision = driver.decide(failed(overflow))
    assert decision.next == "end"
    assert [type(event).__name__ for event in decision.ended] == ["AutoRetryEnd"]


async def test_a_reply_after_a_retry_ends_the_retries_as_it_passes() -> None:
    driver = await runner(Host())
    assert driver.decide(failed(ProviderStatusError("503 busy", status=503))).next == "retry"
    driver.saw(w.MessageEnd(message=reply()))
    assert driver.retry_attempt == 0
