"""The run driver: what a session does from an accepted prompt until ``agent_settled``.

A session is *busy* for one such spell. One task (`Runner._drive`) runs the prompt (or a
manual compaction), then each automatic retry, overflow recovery and queued message that
follows, every run inside `Runner.run_scope`, so an abort is one ``run_scope.cancel()``::

    Runner._drive                      one task per busy spell, in the session's nursery
    ├── compaction before the prompt   when the context is already past the threshold
    ├── run_agent                      the run (`forged._loop`)
    └── after its agent_end, one of:
        ├── the retry wait             retry_scope (abort_retry); then the run again
        ├── overflow compaction        then the run again, once per prompt
        ├── threshold compaction       when the reply's usage is past the threshold
        └── the next queued message    steering first, then follow-ups

Automatic retries and compaction's summary calls share one policy (`RetrySettings`). What
the driver carries from one run to the next is one `RunState`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio

from . import _wire as w
from ._compaction import CompactionHost, NothingToCompact, Reason, check_compactable, compact
from ._errors import CommandError, PersistenceError, ProviderError
from ._log import log, log_exception
from ._loop import AgentHost, describe_failure, is_cancellation, run_agent
from ._retry import is_context_overflow
from ._settings import Settings
from ._stats import compacted_at, estimate_context_tokens, usage_tokens

OVERFLOW_RECOVERY_FAILED = (
    "Context overflow recovery failed after one compact-and-retry attempt. Try reducing "
    "context or switching to a larger-context model.")
FAILURE_PREFIX: dict[Reason, str] = {
    "manual": "", "threshold": "Auto-compaction failed: ",
    "overflow": "Context overflow recovery failed: "}


class RunHost(AgentHost, CompactionHost, Protocol):
    """What the driver needs from its session."""

    messages: list[w.AgentMessage]
    settings: Settings

    def check_can_prompt(self) -> None: ...
    def remember(self, message: w.AgentMessage) -> None: ...
    def start_task(self, task: Callable[[], Awaitable[None]]) -> None: ...


class Answer(Protocol):
    """Where a manual compaction's outcome goes (the dispatcher's reply)."""

    def ok(self, data: Any) -> None: ...
    def fail(self, error: str) -> None: ...


@attrs.define(kw_only=True)
class RetryPlan:
    message: w.AssistantMessage
    attempt: int
    delay_ms: int


@attrs.define
class RunState:
    """What the driver carries from one run of a busy spell to the next."""

    retry_attempt: int = 0
    """The automatic retry the current run is (0: none)."""
    retry_next: RetryPlan | None = None
    """The retry to wait for once the failed run's ``agent_end`` is written."""
    retry_failed: w.AutoRetryEnd | None = None
    """The retries gave up: written after the failed run's ``agent_end``."""
    overflow_next: bool = False
    """The run overflowed the context: compact, then run it again."""
    overflow_failed: w.CompactionEnd | None = None
    overflow_tried: bool = False
    """An overflow compaction was made for the current prompt (one per prompt)."""


class Runner:
    """Runs a session's prompts, one busy spell at a time."""

    def __init__(self, host: RunHost) -> None:
        self._host = host
        self.busy = False
        self.compacting = False
        self.state = RunState()
        self.run_scope: trio.CancelScope | None = None
        self.retry_scope: trio.CancelScope | None = None
        """The wait before an automatic retry (abort_retry), while one runs."""
        self._settled = trio.Event()
        self._settled.set()
        self._after_run: list[Callable[[], None]] = []
        self._after_retry: list[Callable[[], None]] = []
        self._deferred: list[w.AgentMessage] = []

    def start(self, prompt: list[w.AgentMessage], *, poll_steering: bool,
              manual: Callable[[], Awaitable[None]] | None = None) -> None:
        """Become busy now, and run `prompt` (or the `manual` compaction) in a task."""
        self.busy = True
        self._settled = trio.Event()
        self.run_scope = trio.CancelScope()

        async def drive() -> None:
            await self._drive(prompt, poll_steering, manual)

        self._host.start_task(drive)

    async def wait_settled(self) -> None:
        await self._settled.wait()

    def record(self, message: w.AgentMessage) -> None:
        """Into the session now, or when the spell settles if one is under way (a direct
        bash command's result)."""
        if self.busy:
            self._deferred.append(message)
        else:
            self._host.remember(message)

    def abort(self, done: Callable[[], None]) -> None:
        """Cancel the current run; `done` is called right after its ``agent_end``."""
        _cancel(self.run_scope, self._after_run, done)

    def abort_retry(self, done: Callable[[], None]) -> None:
        """Cancel a retry wait; `done` is called once its ``auto_retry_end`` is written."""
        _cancel(self.retry_scope, self._after_retry, done)

    def set_auto_retry(self, enabled: bool) -> None:
        self._host.retry.enabled = enabled
        self._host.settings.remember_in("retry", enabled=enabled)

    def set_auto_compaction(self, enabled: bool) -> None:
        self._host.compaction.enabled = enabled
        self._host.settings.remember_in("compaction", enabled=enabled)

    def message_ended(self, message: w.AgentMessage) -> None:
        """A message of the run was stored and announced: a reply that did not fail ends
        the retries, and it or a new prompt allows an overflow compaction again."""
        replied = isinstance(message, w.AssistantMessage) and message.stop_reason != "error"
        if replied and self.state.retry_attempt:
            self._host.emit(w.AutoRetryEnd(success=True, attempt=self.state.retry_attempt))
            self.state.retry_attempt = 0
        if replied or isinstance(message, w.UserMessage):
            self.state.overflow_tried = False

    # --- the spell -----------------------------------------------------------------------------

    async def _drive(self, prompt: list[w.AgentMessage], poll_steering: bool,
                     manual: Callable[[], Awaitable[None]] | None) -> None:
        """Run `prompt` (or the `manual` compaction), then every retry, overflow recovery
        and queued message that follows; ``agent_settled`` ends it when a run took place."""
        retrying = False
        ran = aborted = False
        try:
            if manual is not None:
                assert self.run_scope is not None
                with self.run_scope as scope:
                    await manual()
                aborted = scope.cancelled_caught
                self._close_run()
                prompt = self._continuation()
            while prompt or retrying:
                assert self.run_scope is not None
                with self.run_scope as scope:
                    if not ran and manual is None:
                        await self._compact_before_prompt()
                    ran = True
                    new: list[w.AgentMessage] = []
                    try:
                        new = await run_agent(self._host, prompt, poll_steering=poll_steering)
                    except Exception as exc:
                        # A bug, not a provider or tool failure (those end the turn): the run
                        # was closed with agent_end; the session lives on.
                        log_exception(f"the run failed: {exc!r}", exc)
                    retrying = await self._after_agent_end(new)
                aborted = scope.cancelled_caught
                self._close_run()
                prompt, poll_steering = ([] if retrying else self._continuation()), False
        except BaseException as exc:
            aborted = aborted or is_cancellation(exc)  # the session is closing
            raise
        finally:
            self.run_scope = None
            self.busy = False
            self.state.retry_attempt = 0
            self.state.retry_next = None
            self.state.overflow_next = False
            for message in self._deferred:
                try:
                    self._host.remember(message)
                except PersistenceError as exc:  # its command was answered: say it here
                    log(f"a bash command's output is not in the session: {exc}")
            self._deferred.clear()
            if ran:
                self._host.emit(w.AgentSettled(aborted=aborted))
            self._settled.set()

    def _continuation(self) -> list[w.AgentMessage]:
        """What the session goes on with after a run: queued steering, else follow-ups."""
        return self._host.take_steering() or self._host.take_follow_ups()

    def _close_run(self) -> None:
        for callback in self._after_run:
            callback()
        self._after_run.clear()
        self.run_scope = trio.CancelScope()

    async def _after_agent_end(self, new: list[w.AgentMessage]) -> bool:
        """What follows a run's ``agent_end``: True when the run is to be tried again (after
        a retry wait or an overflow compaction)."""
        state = self.state
        for failed in (state.retry_failed, state.overflow_failed):
            if failed is not None:
                self._host.emit(failed)
        state.retry_failed = state.overflow_failed = None
        if state.retry_next is not None:
            return await self._wait_to_retry(state.retry_next)
        if state.overflow_next:
            return await self._recover_overflow()
        replies = [m for m in new if isinstance(m, w.AssistantMessage)]
        if replies and replies[-1].stop_reason != "aborted" and self._needs_compaction(
                replies[-1]):
            await self._auto_compact("threshold")
        return False

    # --- automatic retry -----------------------------------------------------------------------

    def plan_retry(self, message: w.AssistantMessage, error: ProviderError | None) -> bool:
        """Called when a turn failed, before its ``agent_end``: True if a retry or an
        overflow compaction follows."""
        attempt = self.state.retry_attempt + 1
        text = message.error_message or ""
        model = self._host.model
        if is_context_overflow(text) and model is not None and (
                message.provider, message.model) == (model.provider, model.id):
            self._end_retries(text)
            return self._plan_overflow()
        delay = self._host.retry.retry_delay_ms(attempt, error)
        if delay is None:
            self._end_retries(text)
            return False
        self.state.retry_attempt = attempt
        self.state.retry_next = RetryPlan(message=message, attempt=attempt, delay_ms=delay)
        return True

    def _end_retries(self, final_error: str) -> None:
        if self.state.retry_attempt:
            self.state.retry_failed = w.AutoRetryEnd(
                success=False, attempt=self.state.retry_attempt, final_error=final_error)
            self.state.retry_attempt = 0

    async def _wait_to_retry(self, plan: RetryPlan) -> bool:
        """Announce the retry and wait for it; False when `abort_retry` cancelled the wait
        (an ``abort`` cancels it too, and propagates)."""
        self.state.retry_next = None
        self._host.emit(w.AutoRetryStart(
            attempt=plan.attempt, max_attempts=self._host.retry.max_retries,
            delay_ms=plan.delay_ms, error_message=plan.message.error_message or ""))
        messages = self._host.messages
        if messages and messages[-1] is plan.message:
            messages.pop()  # the failed reply stays in the file, out of the context
        waited = False
        self.retry_scope = trio.CancelScope()
        try:
            with self.retry_scope:
                await trio.sleep(plan.delay_ms / 1000)
                waited = True
        finally:
            self.retry_scope = None
            if not waited:
                self._host.emit(w.AutoRetryEnd(success=False, attempt=plan.attempt,
                                               final_error="Retry cancelled"))
                self.state.retry_attempt = 0
            for callback in self._after_retry:
                callback()
            self._after_retry.clear()
        return waited

    # --- compaction ----------------------------------------------------------------------------

    def compact(self, custom_instructions: str | None, answer: Answer) -> None:
        """Start a manual compaction (docs/protocol.md, Retries and compaction); `answer` gets
        its result or error right after its ``compaction_end``, before any queued message
        runs. `CommandError` when the session is busy or there is nothing to compact."""
        if self.busy:
            raise CommandError("Agent is busy")
        self._host.check_can_prompt()
        check_compactable(self._host.store)

        async def manual() -> None:
            try:
                result = await self._compact("manual", instructions=custom_instructions)
            except CommandError as exc:
                answer.fail(str(exc))
            except BaseException as exc:
                if is_cancellation(exc):
                    answer.fail("Compaction cancelled")
                raise
            else:
                answer.ok(result)

        self.start([], poll_steering=False, manual=manual)

    def _needs_compaction(self, reply: w.AssistantMessage | None) -> bool:
        """Whether the context has grown past the threshold (docs/protocol.md, Retries
        and compaction), judged by `reply`'s usage; usage from before the latest compaction is
        stale."""
        model, messages, settings = self._host.model, self._host.messages, self._host.compaction
        if reply is None or model is None or not settings.enabled:
            return False
        compacted = compacted_at(messages)
        if compacted is not None and reply.timestamp <= compacted:
            return False
        if reply.stop_reason == "error":  # no usage of its own: the last valid one's
            tokens, anchor = estimate_context_tokens(messages)
            if anchor is None or (compacted is not None and anchor.timestamp <= compacted):
                return False
        else:
            tokens = usage_tokens(reply.usage)
        return settings.should_compact(tokens, model.context_window)

    async def _compact_before_prompt(self) -> None:
        """Compact before a prompt from idle when the context is already too full. An abort
        during it aborts the prompt's run, which still records the prompt."""
        replies = [m for m in reversed(self._host.messages) if isinstance(m, w.AssistantMessage)]
        if not self._needs_compaction(replies[0] if replies else None):
            return
        try:
            await self._auto_compact("threshold")
        except BaseException as exc:
            if not is_cancellation(exc):
                raise  # cancelled: the run starts cancelled and ends at once, aborted

    def _plan_overflow(self) -> bool:
        if not self._host.compaction.enabled:
            return False
        if self.state.overflow_tried:
            self.state.overflow_failed = w.CompactionEnd(
                reason="overflow", result=None, aborted=False, will_retry=False,
                error_message=OVERFLOW_RECOVERY_FAILED)
            return False
        self.state.overflow_tried = self.state.overflow_next = True
        return True

    async def _recover_overflow(self) -> bool:
        """Compact after a context overflow; True when the prompt is to be retried."""
        self.state.overflow_next = False
        if not await self._auto_compact("overflow", will_retry=True):
            return False
        messages = self._host.messages
        last = messages[-1] if messages else None
        if isinstance(last, w.AssistantMessage) and last.stop_reason == "error":
            messages.pop()  # the overflow stays in the file, out of the retry
        return True

    async def _auto_compact(self, reason: Reason, *, will_retry: bool = False) -> bool:
        try:
            await self._compact(reason, will_retry=will_retry)
        except CommandError:
            return False
        return True

    async def _compact(self, reason: Reason, *, will_retry: bool = False,
                       instructions: str | None = None) -> w.CompactionResult:
        """One compaction between its ``compaction_start`` and ``compaction_end``; failures
        raise `CommandError`. Nothing to compact is an error only when asked for."""
        host = self._host
        host.emit(w.CompactionStart(reason=reason))
        end = w.CompactionEnd(reason=reason, result=None, aborted=False, will_retry=False)
        self.compacting = True
        try:
            host.check_can_prompt()
            end.result, host.messages = await compact(host, reason, instructions)
            end.will_retry = will_retry
            return end.result
        except BaseException as exc:
            if is_cancellation(exc):
                end.aborted = True
                raise
            if not isinstance(exc, Exception):
                raise
            failure = exc if isinstance(exc, CommandError) else CommandError(
                describe_failure(exc))
            if failure is not exc:
                log_exception(f"compaction failed: {exc!r}", exc)
            if reason == "manual" or not isinstance(exc, NothingToCompact):
                end.error_message = FAILURE_PREFIX[reason] + str(failure)
            raise failure from exc
        finally:
            self.compacting = False
            host.emit(end)


def _cancel(scope: trio.CancelScope | None, callbacks: list[Callable[[], None]],
            done: Callable[[], None]) -> None:
    """Cancel `scope` and have `done` called (by whoever runs `callbacks`) once it has
    closed; at once when nothing runs."""
    if scope is None:
        done()
        return
    callbacks.append(done)
    scope.cancel()
