"""The run driver: what a session does from an accepted prompt until ``agent_settled``.

A session is *busy* for one such spell. One task (`Runner._drive`) runs the prompt (or a
manual compaction), then each automatic retry, overflow recovery and queued message that
follows, every run inside `Runner.run_scope`, so an abort is one ``run_scope.cancel()``::

    Runner._drive                      one task per busy spell, in the session's nursery
    ├── compaction before the prompt   when the context is already past the threshold
    ├── run_agent                      the run (`forged._loop`): a `RunOutcome`, or aborted
    └── the run's agent_end, then by its outcome one of:
        ├── the retry wait             retry_scope (abort_retry); then the run again
        ├── overflow compaction        then the run again, once per prompt
        ├── threshold compaction       when the reply's usage is past the threshold
        └── the next queued message    steering first, then follow-ups

The driver decides from what a run returns (`decide`), never from inside it. It watches the
events that pass (`saw`): a reply that did not fail ends the retries and allows another
overflow compaction. Automatic retries and compaction's summary calls share one policy
(`RetrySettings`). Who asked for an abort or a compaction hears of its end from the events
too (`forged._dispatch`): nothing is parked here to be called back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal, Protocol

import attrs
import trio

from . import _telemetry, _wire as w
from ._compaction import NothingToCompact, Reason, Summaries, check_compactable, compact
from ._context import Context
from ._errors import CommandError, PersistenceError
from ._log import log, log_exception
from ._loop import (
    Deliveries,
    Events,
    RunOutcome,
    Toolbox,
    describe_failure,
    run_agent,
)
from ._process import is_cancellation
from ._providers import Provider, ProviderRequest
from ._retry import RETRY_CANCELLED, RetrySettings, RunSettings, is_context_overflow
from ._stats import compacted_at, estimate_context_tokens, usage_tokens
from ._telemetry import NULL_SPAN, Span

OVERFLOW_RECOVERY_FAILED = (
    "Context overflow recovery failed after one compact-and-retry attempt. Try reducing "
    "context or switching to a larger-context model.")
SETTLE_S = 10.0
"""How long what ends a spell (`Toolbox.settle`) may hold up its ``agent_settled``, even while
the session closes."""
FAILURE_PREFIX: dict[Reason, str] = {
    "manual": "", "threshold": "Auto-compaction failed: ",
    "overflow": "Context overflow recovery failed: "}


@attrs.define(kw_only=True, eq=False, repr=False)
class Decision:
    """What follows a run, decided from its outcome."""

    next: Literal["end", "retry", "compact"]
    """End the spell (or go on with what is queued), wait and run again, or compact after
    an overflow and run again."""
    delay_ms: int = 0
    attempt: int = 0
    ended: list[w.Event] = attrs.Factory(list)
    """Events written right after the run's ``agent_end``: the retries gave up
    (``auto_retry_end``), an overflow could not be recovered (``compaction_end``)."""


def _error_type(outcome: RunOutcome) -> str:
    """What failed a run, as telemetry's ``error.type``: the provider error's class."""
    return type(outcome.error).__name__ if outcome.error else "error"


class Asking(Summaries, Protocol):
    """How the run driver asks the session's model (`forged._asking.ModelAsker`)."""

    def check_can_prompt(self) -> None:
        """`CommandError` when no model, or no key for it, would answer."""

    async def model_request(self, context: list[w.AgentMessage]
                            ) -> tuple[Provider, ProviderRequest]: ...


class RunEvents(Events, Protocol):
    """Where a run's events go (`forged._session.Session`)."""

    def flush(self) -> None:
        """What an abort's closing held (`Runner.closing`), to the client now."""


class Runner:
    """Runs a session's prompts, one busy spell at a time, in `nursery`. What the runs are
    given comes from the session as values: how to ask its model (`asking`), its tools,
    queues, context and settings; their events go to `events`."""

    def __init__(self, nursery: trio.Nursery, *, events: RunEvents, asking: Asking,
                 tools: Toolbox, queues: Deliveries, context: Context,
                 settings: RunSettings) -> None:
        self._nursery = nursery
        self._events = events
        self._asking = asking
        self._tools = tools
        self._queues = queues
        self._context = context
        self.settings = settings
        self.busy = False
        self.compacting = False
        self.run_scope: trio.CancelScope | None = None
        self.retry_scope: trio.CancelScope | None = None
        """The wait before an automatic retry (abort_retry), while one runs."""
        self.retry_attempt = 0
        """The automatic retry the current run is (0: none)."""
        self.overflow_tried = False
        """An overflow compaction was made for the current prompt (one per prompt)."""
        self._settled = trio.Event()
        self._settled.set()
        self.settling = False
        """The spell's last run has ended (its ``agent_end`` written, nothing follows) and
        what ends the spell (its closing checkpoint) still runs: not busy to a client, whose
        next prompt starts a spell that waits for this one's ``agent_settled``."""
        self._deferred: list[w.AgentMessage] = []
        self.closing = False
        """An abort is closing the run: what `task` emits waits until the run scope ends, to
        reach the client in one write (`forged._session.Session.flush`)."""
        self.task: trio.lowlevel.Task | None = None
        """The task driving the current spell."""
        self._span = NULL_SPAN
        """The running prompt's ``invoke_agent`` span (`forged._telemetry`), for its retries'
        events and its failure."""

    @property
    def retry(self) -> RetrySettings:
        return self.settings.retry

    def start(self, prompt: list[w.AgentMessage], *, poll_steering: bool,
              manual: str | None = None, compact_manually: bool = False) -> None:
        """Become busy now, and run `prompt` (or a manual compaction, with `manual` as its
        instructions) in a task."""
        self.busy = True
        previous, self._settled = self._settled, trio.Event()
        self.run_scope = trio.CancelScope()
        self.task = None  # (the spell's own from its start: not the settling one's)
        self._nursery.start_soon(self._drive, previous, prompt, poll_steering, compact_manually,
                                 manual)

    async def wait_settled(self) -> None:
        await self._settled.wait()

    def record(self, message: w.AgentMessage) -> None:
        """Into the session now, or when the spell settles if one is under way (a direct
        bash command's result)."""
        if self.busy:
            self._deferred.append(message)
        else:
            self._context.append(message)

    def cancel(self) -> bool:
        """Abort what runs: True if something did (its end follows as events, held until
        the run scope ends: `closing`)."""
        if self.run_scope is None:
            return False
        self.closing = True
        self.run_scope.cancel()
        return True

    def cancel_retry(self) -> bool:
        """End a retry wait: True if one ran (its ``auto_retry_end`` follows)."""
        if self.retry_scope is None:
            return False
        self.retry_scope.cancel()
        return True

    def saw(self, event: w.Event) -> None:
        """An event passed: a reply that did not fail ends the retries; it, or a new
        prompt, allows an overflow compaction again."""
        if not isinstance(event, w.MessageEnd):
            return
        message = event.message
        replied = isinstance(message, w.AssistantMessage) and message.stop_reason != "error"
        if replied and self.retry_attempt:
            attempt, self.retry_attempt = self.retry_attempt, 0
            self._events.emit(w.AutoRetryEnd(success=True, attempt=attempt))
        if replied or isinstance(message, w.UserMessage):
            self.overflow_tried = False

    # --- the spell -----------------------------------------------------------------------------

    async def _drive(self, previous: trio.Event, prompt: list[w.AgentMessage],
                     poll_steering: bool, compact_manually: bool, instructions: str | None
                     ) -> None:
        """Run `prompt` (or the manual compaction), then every retry, overflow recovery and
        queued message that follows; ``agent_settled`` ends it when a run took place. It
        starts once the spell before it has settled (`previous`: a prompt may come while
        that one is `settling`)."""
        settled = self._settled
        decision = Decision(next="end")
        ran = aborted = False
        span = NULL_SPAN  # this spell's prompt's (a spell waiting for `previous` has none)
        self.task = trio.lowlevel.current_task()
        try:
            await previous.wait()
            await _telemetry.ready()
            if compact_manually:
                assert self.run_scope is not None
                with self._closing_sent(), self.run_scope as scope:
                    try:
                        await self._compact("manual", instructions=instructions)
                    except CommandError:
                        pass  # its compaction_end says why
                aborted = scope.cancelled_caught
                self.run_scope = trio.CancelScope()
                prompt = self._continuation()
            while prompt or decision.next != "end":
                assert self.run_scope is not None
                if prompt:  # a retry or an overflow's recovery stays in its prompt's span
                    span.end()
                    span = self._span = _telemetry.tracing.start_run(
                        self._context.store.session_id, _telemetry.caller_of(prompt),
                        self._asking.model, prompt)
                with self._closing_sent(), self.run_scope as scope, span.current():
                    if not ran and not compact_manually:
                        await self._compact_before_prompt()
                    ran = True
                    decision = await self._run(prompt, poll_steering)
                aborted = scope.cancelled_caught
                self.run_scope = trio.CancelScope()
                if aborted:
                    decision = Decision(next="end")
                prompt, poll_steering = ([] if decision.next != "end"
                                         else self._continuation()), False
        except BaseException as exc:
            aborted = aborted or is_cancellation(exc)  # the session is closing
            raise
        finally:
            self._end_closing()  # (an abort that came after the last run scope)
            self.run_scope = None
            self.busy = False  # to a client, from its last agent_end (`settling`)
            if ran:  # the spell still ends with its agent_settled
                self.settling = True
                try:
                    with (trio.CancelScope(shield=True), trio.move_on_after(SETTLE_S),
                          span.current()):
                        await self._tools.settle()
                finally:
                    self.settling = False
            span.end(aborted=aborted)
            if self._span is span:
                self._span = NULL_SPAN
            self.retry_attempt = 0
            for message in self._deferred:
                try:
                    self._context.append(message)
                except PersistenceError as exc:  # its command was answered: say it here
                    log(f"a bash command's output is not in the session: {exc}")
            self._deferred.clear()
            if ran:
                self._events.emit(w.AgentSettled(aborted=aborted))
            settled.set()

    @contextlib.contextmanager
    def _closing_sent(self) -> Iterator[None]:
        """As the run scope in it ends, what an abort's closing held goes out."""
        try:
            yield
        finally:
            self._end_closing()

    def _end_closing(self) -> None:
        self.closing = False
        self._events.flush()

    async def _run(self, prompt: list[w.AgentMessage], poll_steering: bool) -> Decision:
        """One run and its ``agent_end``, then what its outcome says follows it (run inside
        `run_scope`: an abort ends it with its closing events)."""
        new: list[w.AgentMessage] = []
        try:
            model = self._asking.model
            if model is None:
                raise CommandError("No model selected")
            outcome = await run_agent(self._context.messages, prompt, model,
                                      self._asking.model_request,
                                      self._tools, self._events, self._queues, new,
                                      poll_steering=poll_steering)
        except BaseException as exc:
            # At once where they have ended; else what the abort closed goes out first: while
            # it waits, other commands are answered, and none may tell of events not sent.
            await self._tools.end_stopped(before_waiting=self._events.flush)
            self._events.emit(w.AgentEnd(messages=new, will_retry=False))
            self._events.flush()  # before the unwound frames are let go
            if not isinstance(exc, Exception):
                raise  # aborted, or the session closes
            # A bug, not a provider or tool failure (those end the turn): the session lives on.
            log_exception(f"the run failed: {exc!r}", exc)
            return Decision(next="end")
        decision = self.decide(outcome)
        if outcome.failed and decision.next == "end":
            self._span.fail(_error_type(outcome),
                            outcome.reply.error_message or "" if outcome.reply else "")
        self._events.emit(w.AgentEnd(messages=new, will_retry=decision.next != "end"))
        for ended in decision.ended:
            self._events.emit(ended)
        if decision.next == "retry":
            return decision if await self._wait_to_retry(decision, outcome) else Decision(
                next="end")
        if decision.next == "compact":
            return decision if await self._recover_overflow() else Decision(next="end")
        if outcome.reply is not None and outcome.reply.stop_reason != "aborted" and (
                self._needs_compaction(outcome.reply)):
            await self._auto_compact("threshold")
        return decision

    def decide(self, outcome: RunOutcome) -> Decision:
        """What follows a run: a retry when its reply failed in a way that passes, an
        overflow compaction when the context was too long for the model (once per prompt),
        else the end; with the event that says the retries or the recovery gave up."""
        if not outcome.failed or outcome.reply is None:
            return Decision(next="end")
        text = outcome.reply.error_message or ""
        model = self._asking.model
        if is_context_overflow(text) and model is not None and (
                outcome.reply.provider, outcome.reply.model) == (model.provider, model.id):
            gave_up = self._end_retries(text)
            if not self.settings.compaction.enabled:
                return Decision(next="end", ended=gave_up)
            if self.overflow_tried:
                return Decision(next="end", ended=[*gave_up, w.CompactionEnd(
                    reason="overflow", result=None, aborted=False, will_retry=False,
                    error_message=OVERFLOW_RECOVERY_FAILED)])
            self.overflow_tried = True
            return Decision(next="compact", ended=gave_up)
        attempt = self.retry_attempt + 1
        delay = self.retry.retry_delay_ms(attempt, outcome.error)
        if delay is None:
            return Decision(next="end", ended=self._end_retries(text))
        self.retry_attempt = attempt
        return Decision(next="retry", delay_ms=delay, attempt=attempt)

    def _end_retries(self, final_error: str) -> list[w.Event]:
        """The retries are over, failed: the ``auto_retry_end`` that says so, if any ran."""
        if not self.retry_attempt:
            return []
        attempt, self.retry_attempt = self.retry_attempt, 0
        return [w.AutoRetryEnd(success=False, attempt=attempt, final_error=final_error)]

    def _continuation(self) -> list[w.AgentMessage]:
        """What the session goes on with after a run: queued steering, else follow-ups."""
        return self._queues.take_steering() or self._queues.take_follow_ups()

    # --- automatic retry -----------------------------------------------------------------------

    async def _wait_to_retry(self, decision: Decision, outcome: RunOutcome) -> bool:
        """Announce the retry and wait for it; False when `abort_retry` cancelled the wait
        (an ``abort`` cancels it too, and propagates)."""
        failed = outcome.reply
        assert failed is not None
        self._events.emit(w.AutoRetryStart(
            attempt=decision.attempt, max_attempts=self.retry.max_retries,
            delay_ms=decision.delay_ms, error_message=failed.error_message or ""))
        self._span.event("forged.retry", {
            "forged.retry.attempt": decision.attempt, "forged.retry.delay_ms": decision.delay_ms,
            "error.type": _error_type(outcome)})
        self._context.drop_last_failed()  # it stays in the file, out of the next run
        waited = False
        self.retry_scope = trio.CancelScope()
        try:
            with self.retry_scope:
                await trio.sleep(decision.delay_ms / 1000)
                waited = True
        finally:
            self.retry_scope = None
            if not waited:
                self._events.emit(w.AutoRetryEnd(success=False, attempt=decision.attempt,
                                                 final_error=RETRY_CANCELLED))
                self.retry_attempt = 0
        return waited

    # --- compaction ----------------------------------------------------------------------------

    def compact(self, custom_instructions: str | None) -> None:
        """Start a manual compaction (docs/protocol.md, Retries and compaction); its
        ``compaction_end`` says how it went. `CommandError` when the session is busy or
        there is nothing to compact."""
        if self.busy:
            raise CommandError("Agent is busy")
        self._asking.check_can_prompt()
        check_compactable(self._context.store)
        self.start([], poll_steering=False, manual=custom_instructions, compact_manually=True)

    def _needs_compaction(self, reply: w.AssistantMessage | None) -> bool:
        """Whether the context has grown past the threshold (docs/protocol.md, Retries
        and compaction), judged by `reply`'s usage; usage from before the latest compaction is
        stale."""
        model, messages = self._asking.model, self._context.messages
        settings = self.settings.compaction
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
        replies = [m for m in reversed(self._context.messages)
                   if isinstance(m, w.AssistantMessage)]
        if not self._needs_compaction(replies[0] if replies else None):
            return
        try:
            await self._auto_compact("threshold")
        except BaseException as exc:
            if not is_cancellation(exc):
                raise  # cancelled: the run starts cancelled and ends at once, aborted

    async def _recover_overflow(self) -> bool:
        """Compact after a context overflow; True when the prompt is to be retried."""
        if not await self._auto_compact("overflow", will_retry=True):
            return False
        self._context.drop_last_failed()  # the overflow stays in the file, out of the retry
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
        self._events.emit(w.CompactionStart(reason=reason))
        end = w.CompactionEnd(reason=reason, result=None, aborted=False, will_retry=False)
        self.compacting = True
        with _telemetry.tracing.span("compaction", {"forged.compaction.reason": reason},
                                     conversation=self._context.store.session_id) as span:
            try:
                return await self._compacted(reason, end, will_retry, instructions, span)
            finally:
                self.compacting = False
                self._events.emit(end)

    async def _compacted(self, reason: Reason, end: w.CompactionEnd, will_retry: bool,
                         instructions: str | None, span: Span) -> w.CompactionResult:
        try:
            self._asking.check_can_prompt()
            end.result, messages = await compact(
                self._context.store, self._asking, self.settings.compaction, self.retry,
                self._events.emit, reason, instructions)
            self._context.replace(messages)
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
                span.fail(type(exc).__name__, str(failure))
            else:
                span.passed()
            raise failure from exc
