"""The context's one owner (`forged._context.Context`) and the run driver's use of it, with
no process and no provider: a message is in the file before it is in the context, a failed
reply leaves the context and stays in the file, a compaction replaces it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import trio
import trio.testing

from forged import _wire as w
from forged._context import Context
from forged._errors import PersistenceError, ProviderStatusError
from forged._loop import RunOutcome
from forged._providers import Provider, ProviderRequest
from forged._queues import user_message
from forged._retry import RetrySettings, RunSettings
from forged._run import Runner
from forged._settings import CompactionSettings
from forged._store import SessionFile

from .conftest import mounted_tmpfs

MODEL = w.Model(id="m", name="M", api="anthropic-messages", provider="p", base_url="u",
                reasoning=False, input=["text"], context_window=100_000, max_tokens=1000,
                cost=w.ModelCost(), thinking_levels=["off"])


def reply(stop: w.StopReason = "stop", error: str | None = None) -> w.AssistantMessage:
    return w.AssistantMessage(api=MODEL.api, provider=MODEL.provider, model=MODEL.id,
                              stop_reason=stop, error_message=error, timestamp=1)


def stored_roles(store: SessionFile) -> list[str]:
    assert store.path is not None
    return [line["message"]["role"] for line in map(orjson.loads,
                                                   store.path.read_bytes().splitlines())
            if line.get("type") == "message"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionFile]:
    store = SessionFile.create(tmp_path / "sessions", Path("/work"))
    yield store
    store.close()


def test_a_message_is_in_the_file_before_it_is_in_the_context(store: SessionFile) -> None:
    context = Context(store)
    prompt = user_message("hi", None)
    context.append(prompt)
    context.append(reply())
    assert stored_roles(store) == ["user", "assistant"]
    assert [m.role for m in context.messages] == ["user", "assistant"] and len(context) == 2
    context.append(reply())  # read back by now: added to the list, not read again
    assert len(context.messages) == 3 and stored_roles(store)[-1] == "assistant"


@pytest.fixture
def full_folder(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "full", "size=16k")


def test_a_message_the_file_cannot_take_is_in_neither(full_folder: Path) -> None:
    store = SessionFile.create(full_folder, Path("/work"))
    context = Context(store)
    context.append(user_message("hi", None))
    with pytest.raises(PersistenceError):
        context.append(user_message("x" * 64_000, None))
    assert [m.role for m in context.messages] == ["user"]
    assert stored_roles(store) == ["user"]
    store.close()


def test_a_failed_reply_leaves_the_context_and_stays_in_the_file(store: SessionFile) -> None:
    context = Context(store)
    context.append(user_message("hi", None))
    context.append(reply("error", "503 busy"))
    assert context.drop_last_failed()
    assert [m.role for m in context.messages] == ["user"]
    assert not context.drop_last_failed()  # a prompt is not a failed reply
    assert stored_roles(store) == ["user", "assistant"]
    assert [m.role for m in Context(store).messages] == ["user", "assistant"]  # as read back


def test_another_file_or_a_compaction_gives_the_context_anew(store: SessionFile,
                                                               tmp_path: Path) -> None:
    context = Context(store)
    context.append(user_message("one", None))
    context.append(reply())
    again = Context(store)  # as a session that reopens the file finds it
    assert len(again) == 2
    assert [m.role for m in again.messages] == ["user", "assistant"]
    other = SessionFile.create(tmp_path / "other", Path("/work"))
    again.rebase(other)
    assert len(again) == 0 and again.messages == []
    again.replace([reply()])
    assert [m.role for m in again.messages] == ["assistant"]
    other.close()


class Asking:
    """The session's model, as the run driver asks it: no request is ever made here."""

    model = MODEL

    def check_can_prompt(self) -> None:
        pass

    async def model_request(self, context: list[w.AgentMessage]
                            ) -> tuple[Provider, ProviderRequest]:
        raise AssertionError("no run is made here")

    async def summary_request(self, text: str, *, max_tokens: int, reasoning: bool
                              ) -> tuple[Provider, ProviderRequest]:
        raise AssertionError("no compaction is made here")


class Events:
    def __init__(self) -> None:
        self.seen: list[w.Event] = []

    def emit(self, event: w.Event) -> None:
        self.seen.append(event)

    async def wait_for_room(self) -> None:
        pass


async def test_a_retry_asks_again_without_the_failed_reply_which_the_file_keeps(
        store: SessionFile, autojump_clock: trio.testing.MockClock) -> None:
    context = Context(store)
    context.append(user_message("hi", None))
    failed = reply("error", "503 busy")
    context.append(failed)
    events = Events()
    async with trio.open_nursery() as nursery:
        runner = Runner(nursery, events=events, asking=Asking(), tools=None,  # type: ignore[arg-type]
                        queues=None, context=context,  # type: ignore[arg-type]
                        settings=RunSettings(retry=RetrySettings(base_delay_ms=100),
                                             compaction=CompactionSettings()))
        outcome = RunOutcome(messages=[failed], reply=failed,
                             error=ProviderStatusError("503 busy", status=503))
        decision = runner.decide(outcome)
        assert decision.next == "retry"
        assert await runner._wait_to_retry(decision, outcome)
    assert [m.role for m in context.messages] == ["user"]
    assert stored_roles(store) == ["user", "assistant"]
    assert [type(e).__name__ for e in events.seen] == ["AutoRetryStart"]


async def test_a_result_recorded_while_idle_enters_file_and_context(store: SessionFile) -> None:
    context = Context(store)
    async with trio.open_nursery() as nursery:
        runner = Runner(nursery, events=Events(), asking=Asking(), tools=None,  # type: ignore[arg-type]
                        queues=None, context=context,  # type: ignore[arg-type]
                        settings=RunSettings(retry=RetrySettings(),
                                             compaction=CompactionSettings()))
        runner.record(user_message("a bash result stands in", None))
    assert stored_roles(store) == ["user"] and len(context) == 1


def test_settings_a_client_changes_are_kept_where_the_settings_are(tmp_path: Path) -> None:
    from forged._settings import Settings

    settings = Settings(tmp_path / "agent", tmp_path)
    run_settings = RunSettings.from_settings(settings)
    run_settings.set_auto_retry(False)
    run_settings.set_auto_compaction(False)
    again = RunSettings.from_settings(Settings(tmp_path / "agent", tmp_path))
    assert (again.retry.enabled, again.compaction.enabled) == (False, False)
