"""One agent session: its state, its queues, its named cancel scopes and its event stream.

Many sessions can live in one process: each has its own cwd, its own nursery (opened by
`Session.serve`) and its own event sink. A session never writes to a stream itself; it emits
encoded lines to the sink it was given, in the order it produces them.

A session is *busy* from an accepted prompt until ``agent_settled``: one task (`_drive`) runs
the prompt and then every queued continuation, each run inside `run_scope`, so an abort is one
``run_scope.cancel()``.
"""

from __future__ import annotations

import os
import stat
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from . import _codec
from . import _wire as w
from ._compaction import (
    SYSTEM_PROMPT,
    CompactionSettings,
    NothingToCompact,
    Reason,
    check_compactable,
    compact,
)
from ._context import build_context, context_size, recorded_model_of, stored_name, user_text
from ._errors import CommandError, PersistenceError, ProviderError
from ._jsonl import encode_line
from ._loop import describe_failure, is_cancellation, run_agent
from ._models import ModelRegistry, clamp_level, supported_levels
from ._paths import rewrite, session_dir_for
from ._plugins import PluginCommand, Plugins, PluginSource
from ._providers import Provider, ProviderRequest, ToolSpec, provider_for
from ._providers.base import now_ms
from ._resources import ExtraPaths, Origin, Resources
from ._retry import RetrySettings, is_context_overflow
from ._settings import Settings
from ._stats import (
    UsageTotals,
    compacted_at,
    estimate_context_tokens,
    session_stats,
    usage_tokens,
)
from ._store import SESSION_START, SessionFile
from ._tools import BUILTIN_TOOLS, Tool
from ._tools.base import ScratchDir, Shell
from ._tools.bash import run_direct
from ._ui import Dialogs

Sink = Callable[[bytes], None]

OVERFLOW_RECOVERY_FAILED = (
    "Context overflow recovery failed after one compact-and-retry attempt. Try reducing "
    "context or switching to a larger-context model.")
FAILURE_PREFIX: dict[Reason, str] = {
    "manual": "", "threshold": "Auto-compaction failed: ",
    "overflow": "Context overflow recovery failed: "}

BUSY_PROMPT_ERROR = (
    "Agent is already processing. Specify streamingBehavior ('steer' or 'followUp') to queue "
    "the message."
)


@attrs.define(kw_only=True)
class SessionConfig:
    cwd: Path
    agent_dir: Path
    registry: ModelRegistry
    model: w.Model | None = None
    thinking_level: str = "medium"
    session_name: str | None = None
    persist: bool = True
    """False for --no-session: the session's entries live in memory only."""
    session_dir: Path | None = None
    """Where new session files go (default: per cwd under <agentDir>/sessions)."""
    session_path: Path | None = None
    """An existing session file to continue."""
    keep_model: bool = False
    """The model and level were asked for (--model): a continued session does not restore
    its own."""
    settings: Settings | None = None
    """Read from the agent dir and the cwd when not given."""
    model_scope: list[str] | None = None
    """``--models``: the patterns `cycle_model` cycles through (else ``enabledModels``)."""
    extra: ExtraPaths = attrs.Factory(ExtraPaths)
    """Skills, templates and system prompt text the command line adds."""
    plugins: list[PluginSource] = attrs.Factory(list)
    interactive: bool = True
    """A client can answer dialogs (False in print mode: they resolve as cancelled)."""


class Answer(Protocol):
    """Where a command's outcome goes (the dispatcher's reply)."""

    def ok(self, data: Any) -> None: ...
    def fail(self, error: str) -> None: ...


@attrs.define(kw_only=True)
class AutoRetryPlan:
    message: w.AssistantMessage
    attempt: int
    delay_ms: int


@attrs.define(kw_only=True)
class Queued:
    """A steering or follow-up message waiting for delivery."""

    text: str
    message: w.UserMessage


def _mode(value: Any) -> w.QueueMode:
    return "all" if value == "all" else "one-at-a-time"


def user_message(text: str, images: list[w.ImageContent] | None) -> w.UserMessage:
    content: list[w.UserContent] = [w.TextContent(text=text)]
    content.extend(images or [])
    return w.UserMessage(content=content, timestamp=now_ms())


class Session:
    def __init__(self, config: SessionConfig, sink: Sink,
                 wait_for_room: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cwd = config.cwd
        self.agent_dir = config.agent_dir
        self.registry = config.registry
        self.settings = config.settings or Settings(config.agent_dir, config.cwd)
        self.model = config.model
        self._preferred_level = config.thinking_level
        self.session_dir = (config.session_dir or session_dir_for(config.agent_dir, config.cwd)
                            if config.persist else None)
        """Where new session files go; None keeps new sessions in memory."""
        self.steering_mode: w.QueueMode = _mode(self.settings.get("steeringMode"))
        self.follow_up_mode: w.QueueMode = _mode(self.settings.get("followUpMode"))
        self.tools: dict[str, Tool] = dict(BUILTIN_TOOLS)
        self.scratch = ScratchDir()
        self.shell = Shell.from_settings(self.settings.get("shellPath"),
                                         self.settings.get("shellCommandPrefix"))
        self.model_scope = config.model_scope
        self.resources = Resources.load(config.cwd, config.agent_dir, self.settings,
                                        config.extra)
        self.steering: list[Queued] = []
        self.follow_ups: list[Queued] = []
        self._sink = sink
        self._wait_for_room = wait_for_room
        self.session_name: str | None = None
        self.ui = Dialogs(self.emit, interactive=config.interactive)
        self.plugins = Plugins([], self)
        self._commands_running = 0
        self._commands_done = trio.Event()
        self._commands_done.set()
        self._nursery: trio.Nursery | None = None
        self.run_scope: trio.CancelScope | None = None
        self._busy = False
        self._settled = trio.Event()
        self._settled.set()
        self._after_run: list[Callable[[], None]] = []
        self._messages: list[w.AgentMessage] | None = None
        self.bash_scope: trio.CancelScope | None = None
        """The running direct ``bash`` command's scope (abort_bash), if one runs."""
        self._bash_done = trio.Event()
        self._bash_done.set()
        self._bash_results: list[w.BashExecutionMessage] = []
        """Direct bash results that finished during a run, recorded when it settles."""
        self.retry = RetrySettings.from_settings(self.settings.get("retry"))
        self.retry_scope: trio.CancelScope | None = None
        """The wait before an automatic retry (abort_retry), while one runs."""
        self._retry_attempt = 0
        self._retry_next: AutoRetryPlan | None = None
        self._retry_failed: w.AutoRetryEnd | None = None
        self._after_retry: list[Callable[[], None]] = []
        self.compaction = CompactionSettings.from_settings(self.settings.get("compaction"))
        self.is_compacting = False
        self._overflow_tried = False
        """An overflow compaction was made for the current prompt (one per prompt)."""
        self._overflow_next = False
        self._overflow_failed: w.CompactionEnd | None = None
        self.store = self._install(open_store(config, self.session_dir),
                                   restore=not config.keep_model)
        if config.session_name:
            self.set_session_name(config.session_name)
        self.plugins = Plugins(config.plugins, self)
        for name, tool in self.plugins.tools.items():
            if name in self.tools:
                print(f"forged: a plugin's tool {name} is a built-in tool's name; skipped",
                      file=sys.stderr)
            else:
                self.tools[name] = tool

    def _install(self, store: SessionFile, *, restore: bool) -> SessionFile:
        """Make `store` the session's file: its context, its name, and (when `restore`) the
        model and level its branch last used; a choice the branch does not record is
        appended."""
        self.store = store
        self._messages = None  # read from the file when needed
        self.totals = UsageTotals()
        self.session_name = stored_name(store)
        path = store.path_to_leaf()
        recorded_model = recorded_model_of(store, path)
        change = store.latest("thinking_level_change", path)
        recorded_level = change.get("thinkingLevel") if change is not None else None
        if restore and recorded_model is not None:
            model = self.registry.find(*recorded_model)
            if model is not None and self.registry.has_auth(model.provider):
                self.model = model
        if restore and recorded_level in w.THINKING_LEVELS:
            self._preferred_level = str(recorded_level)
        if self.model is not None and recorded_model != (self.model.provider, self.model.id):
            store.append("model_change", provider=self.model.provider, modelId=self.model.id)
        if recorded_level != self.thinking_level:
            store.append("thinking_level_change", thinkingLevel=self.thinking_level)
        return store

    @property
    def messages(self) -> list[w.AgentMessage]:
        """The context: the active branch's messages, read back on first use."""
        if self._messages is None:
            self._messages = build_context(self.store)
        return self._messages

    @property
    def session_id(self) -> str:
        return self.store.session_id

    def set_session_name(self, name: str) -> None:
        name = name.strip()
        if not name:
            raise CommandError("Session name cannot be empty")
        self.store.append("session_info", name=name)
        self.session_name = name

    # --- lifetime ------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Own the session's nursery until cancelled; runs are started in it.

        Cancellation aborts any run; its closing events are still emitted.
        """
        try:
            async with trio.open_nursery() as session_nursery:
                self._nursery = session_nursery
                session_nursery.start_soon(self.plugins.serve_observers)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self.store.close()
            self.scratch.remove()  # the full outputs its commands kept

    async def wait_settled(self) -> None:
        await self._settled.wait()

    async def wait_bash(self) -> None:
        await self._bash_done.wait()

    # --- events --------------------------------------------------------------------------------

    def emit(self, event: w.Event) -> None:
        data = _codec.unstructure(event)
        self._sink(encode_line(data))
        self.plugins.observe(data)

    async def wait_for_room(self) -> None:
        if self._wait_for_room is not None:
            await self._wait_for_room()

    def _queue_changed(self) -> None:
        self.emit(w.QueueUpdate(steering=[q.text for q in self.steering],
                                follow_up=[q.text for q in self.follow_ups]))

    # --- state ---------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def thinking_level(self) -> str:
        return clamp_level(self.model, self._preferred_level)

    def state(self) -> w.SessionState:
        return w.SessionState(
            model=self.model, thinking_level=self.thinking_level,
            is_streaming=self._busy and not self.is_compacting,
            is_compacting=self.is_compacting, steering_mode=self.steering_mode,
            follow_up_mode=self.follow_up_mode,
            session_file=str(self.store.path) if self.store.path else None,
            session_id=self.session_id,
            session_name=self.session_name,
            auto_compaction_enabled=self.compaction.enabled,
            message_count=(len(self._messages) if self._messages is not None
                           else context_size(self.store)),
            pending_message_count=len(self.steering) + len(self.follow_ups),
            session_file_error=self.store.write_error,
        )

    def last_assistant_text(self) -> str | None:
        for message in reversed(self.messages):
            if not isinstance(message, w.AssistantMessage):
                continue
            text = "".join(b.text for b in message.content if isinstance(b, w.TextContent))
            if message.stop_reason == "aborted" and not text.strip():
                continue
            return text.strip() or None
        return None

    # --- prompting -----------------------------------------------------------------------------

    def check_can_prompt(self) -> None:
        if self.model is None:
            raise CommandError(self.registry.no_model_reason())
        if self.registry.api_key(self.model.provider) is None:
            raise CommandError(f"No API key found for {self.model.provider}")

    def prompt(self, text: str, images: list[w.ImageContent] | None,
               streaming_behavior: str | None) -> tuple[str, Callable[[], None]]:
        """Validate a prompt; return its disposition and what to do once it is answered."""
        if self._busy:
            if streaming_behavior is None:
                raise CommandError(BUSY_PROMPT_ERROR)
            kind = "steer" if streaming_behavior == "steer" else "follow_up"
            return "queued", lambda: self.enqueue(kind, text, images)
        self.check_can_prompt()
        message = user_message(text, images)
        return "started", lambda: self._start([message], poll_steering=True)

    def send_user_message(self, text: str) -> None:
        """A plugin's message to the agent: a run when idle, else a follow-up."""
        if self._busy:
            self.enqueue("follow_up", text, None)
            return
        self.check_can_prompt()
        self._start([user_message(text, None)], poll_steering=True)

    async def run_plugin_command(self, command: PluginCommand, args: str
                                 ) -> w.PromptAccepted:
        """Run a plugin's ``/command`` at once, whatever else runs. It manages its own
        execution (docs/protocol.md, Dialogs): ``abort`` resolves its open dialogs as cancelled
        and lets it finish."""
        if not self._commands_running:  # a waiter keeps the Event it waits on
            self._commands_done = trio.Event()
        self._commands_running += 1
        try:
            await self.plugins.run_command(command, args)
        except Exception as exc:
            raise CommandError(f"Command /{command.name} failed: "
                               f"{exc or type(exc).__name__}") from exc
        finally:
            self._commands_running -= 1
            if not self._commands_running:
                self._commands_done.set()
        return w.PromptAccepted(disposition="handled")

    @property
    def commands_running(self) -> bool:
        return self._commands_running > 0

    async def wait_commands(self) -> None:
        await self._commands_done.wait()

    def enqueue(self, kind: str, text: str, images: list[w.ImageContent] | None) -> None:
        queue = self.steering if kind == "steer" else self.follow_ups
        queue.append(Queued(text=text, message=user_message(text, images)))
        self._queue_changed()

    def clear_queue(self) -> w.QueueContents:
        contents = w.QueueContents(steering=[q.text for q in self.steering],
                                   follow_up=[q.text for q in self.follow_ups])
        if self.steering or self.follow_ups:
            self.steering.clear()
            self.follow_ups.clear()
            self._queue_changed()
        return contents

    def _take(self, queue: list[Queued], mode: w.QueueMode) -> list[w.AgentMessage]:
        if not queue:
            return []
        count = len(queue) if mode == "all" else 1
        taken = queue[:count]
        del queue[:count]
        self._queue_changed()
        return [q.message for q in taken]

    def take_steering(self) -> list[w.AgentMessage]:
        return self._take(self.steering, self.steering_mode)

    def take_follow_ups(self) -> list[w.AgentMessage]:
        return self._take(self.follow_ups, self.follow_up_mode)

    def remember(self, message: w.AgentMessage) -> None:
        """A message into the session file, then the context; `PersistenceError` (and in
        neither) when the file cannot be written."""
        self.store.append("message", message=_codec.unstructure(message))
        self.messages.append(message)

    def end_message(self, message: w.AgentMessage, *, started: bool = True) -> None:
        """A finished message: into the session file and the context, and only then
        announced with `message_end` (its line may reach the client at once), after its
        `message_start` unless it was `started`."""
        self.remember(message)
        if not started:
            self.emit(w.MessageStart(message=message))
        self.emit(w.MessageEnd(message=message))
        if (isinstance(message, w.AssistantMessage) and message.stop_reason != "error"
                and self._retry_attempt):
            self.emit(w.AutoRetryEnd(success=True, attempt=self._retry_attempt))
            self._retry_attempt = 0
        if isinstance(message, w.UserMessage) or (
                isinstance(message, w.AssistantMessage) and message.stop_reason != "error"):
            self._overflow_tried = False

    def model_request(self) -> tuple[Provider, ProviderRequest]:
        tools = list(self.tools.values())
        return self._request(self.resources.system_prompt(tools, self.plugins.guidelines),
                             list(self.messages), tools, self.thinking_level)

    async def before_tool_call(self, call: w.ToolCall) -> str | None:
        """Why a plugin blocks `call`, or None to run it."""
        return await self.plugins.before_tool_call(call.id, call.name, call.arguments)

    def summary_request(self, text: str, *, max_tokens: int, reasoning: bool
                        ) -> tuple[Provider, ProviderRequest]:
        """A request for a compaction summary of `text`, to the session's model."""
        level = clamp_level(self.model, "high") if reasoning else "off"
        return self._request(SYSTEM_PROMPT, [user_message(text, None)], [], level, max_tokens)

    def _request(self, system_prompt: str, messages: list[w.AgentMessage], tools: list[Tool],
                 thinking_level: str, max_tokens: int | None = None
                 ) -> tuple[Provider, ProviderRequest]:
        model = self.model
        if model is None:
            raise CommandError(self.registry.no_model_reason())
        request = ProviderRequest(
            model=model, system_prompt=system_prompt, messages=messages,
            tools=[ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
                   for t in tools],
            thinking_level=thinking_level,
            api_key=self.registry.api_key(model.provider) or "",
            headers=self.registry.request_headers(model),
            session_id=self.session_id,
            idle_timeout_s=self.retry.idle_timeout_ms / 1000,
            max_tokens=max_tokens,
        )
        return provider_for(model.api), request

    # --- runs ----------------------------------------------------------------------------------

    def _start(self, prompt: list[w.AgentMessage], *, poll_steering: bool,
               manual: Callable[[], Awaitable[None]] | None = None) -> None:
        assert self._nursery is not None, "Session.serve is not running"
        self._busy = True
        self._settled = trio.Event()
        self.run_scope = trio.CancelScope()
        self._nursery.start_soon(self._drive, prompt, poll_steering, manual)

    def _continuation(self) -> list[w.AgentMessage]:
        """What the session goes on with after a run: queued steering, else follow-ups."""
        return self.take_steering() or self.take_follow_ups()

    def _close_run(self) -> None:
        for callback in self._after_run:
            callback()
        self._after_run.clear()
        self.run_scope = trio.CancelScope()

    async def _drive(self, prompt: list[w.AgentMessage], poll_steering: bool,
                     manual: Callable[[], Awaitable[None]] | None) -> None:
        """Run `prompt` (or the `manual` compaction), then every retry, overflow recovery
        and queued message that follows; ``agent_settled`` ends it when a run took place."""
        retrying = False
        ran = False
        try:
            if manual is not None:
                assert self.run_scope is not None
                with self.run_scope:
                    await manual()
                self._close_run()
                prompt = self._continuation()
            while prompt or retrying:
                assert self.run_scope is not None
                with self.run_scope:
                    if not ran and manual is None:
                        await self._compact_before_prompt()
                    ran = True
                    new: list[w.AgentMessage] = []
                    try:
                        new = await run_agent(self, prompt, poll_steering=poll_steering)
                    except Exception:
                        # A bug, not a provider or tool failure (those end the turn): the run
                        # was closed with agent_end; the session lives on.
                        traceback.print_exc(file=sys.stderr)
                    retrying = await self._after_agent_end(new)
                self._close_run()
                prompt, poll_steering = ([] if retrying else self._continuation()), False
        finally:
            self.run_scope = None
            self._busy = False
            self._retry_attempt = 0
            self._retry_next = None
            self._overflow_next = False
            for message in self._bash_results:
                try:
                    self.remember(message)
                except PersistenceError as exc:  # its command was answered: say it here
                    print(f"forged: a bash command's output is not in the session: {exc}",
                          file=sys.stderr)
            self._bash_results.clear()
            if ran:
                self.emit(w.AgentSettled())
            self._settled.set()

    async def _after_agent_end(self, new: list[w.AgentMessage]) -> bool:
        """What follows a run's ``agent_end``: True when the run is to be tried again (after
        a retry wait or an overflow compaction)."""
        for failed in (self._retry_failed, self._overflow_failed):
            if failed is not None:
                self.emit(failed)
        self._retry_failed = self._overflow_failed = None
        if self._retry_next is not None:
            return await self._wait_to_retry(self._retry_next)
        if self._overflow_next:
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
        attempt = self._retry_attempt + 1
        text = message.error_message or ""
        if is_context_overflow(text) and self.model is not None and (
                message.provider, message.model) == (self.model.provider, self.model.id):
            self._end_retries(text)
            return self._plan_overflow()
        delay = self.retry.retry_delay_ms(attempt, error)
        if delay is None:
            self._end_retries(text)
            return False
        self._retry_attempt = attempt
        self._retry_next = AutoRetryPlan(message=message, attempt=attempt, delay_ms=delay)
        return True

    def _end_retries(self, final_error: str) -> None:
        if self._retry_attempt:
            self._retry_failed = w.AutoRetryEnd(success=False, attempt=self._retry_attempt,
                                                final_error=final_error)
            self._retry_attempt = 0

    async def _wait_to_retry(self, plan: AutoRetryPlan) -> bool:
        """Announce the retry and wait for it; False when `abort_retry` cancelled the wait
        (an ``abort`` cancels it too, and propagates)."""
        self._retry_next = None
        self.emit(w.AutoRetryStart(attempt=plan.attempt, max_attempts=self.retry.max_retries,
                                   delay_ms=plan.delay_ms,
                                   error_message=plan.message.error_message or ""))
        if self._messages and self._messages[-1] is plan.message:
            self._messages.pop()  # the failed reply stays in the file, out of the context
        waited = False
        self.retry_scope = trio.CancelScope()
        try:
            with self.retry_scope:
                await trio.sleep(plan.delay_ms / 1000)
                waited = True
        finally:
            self.retry_scope = None
            if not waited:
                self.emit(w.AutoRetryEnd(success=False, attempt=plan.attempt,
                                         final_error="Retry cancelled"))
                self._retry_attempt = 0
            for callback in self._after_retry:
                callback()
            self._after_retry.clear()
        return waited

    def abort_retry(self, done: Callable[[], None]) -> None:
        """Cancel a retry wait; `done` is called once its ``auto_retry_end`` is written."""
        _cancel(self.retry_scope, self._after_retry, done)

    def set_auto_retry(self, enabled: bool) -> None:
        self.retry.enabled = enabled
        self.settings.remember_in("retry", enabled=enabled)

    # --- compaction -----------------------------------------------------------------------------

    def compact(self, custom_instructions: str | None, answer: Answer) -> None:
        """Start a manual compaction (docs/protocol.md, Retries and compaction); `answer` gets
        its result or error right after its ``compaction_end``. Queued messages run once it is
        done."""
        if self._busy:
            raise CommandError("Agent is busy")
        self.check_can_prompt()
        check_compactable(self.store)

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

        self._start([], poll_steering=False, manual=manual)

    def set_auto_compaction(self, enabled: bool) -> None:
        self.compaction.enabled = enabled
        self.settings.remember_in("compaction", enabled=enabled)

    def _needs_compaction(self, reply: w.AssistantMessage | None) -> bool:
        """Whether the context has grown past the threshold (docs/protocol.md, Retries
        and compaction), judged by `reply`'s usage; usage from before the latest compaction is
        stale."""
        if reply is None or self.model is None or not self.compaction.enabled:
            return False
        compacted = compacted_at(self.messages)
        if compacted is not None and reply.timestamp <= compacted:
            return False
        if reply.stop_reason == "error":  # no usage of its own: the last valid one's
            tokens, anchor = estimate_context_tokens(self.messages)
            if anchor is None or (compacted is not None and anchor.timestamp <= compacted):
                return False
        else:
            tokens = usage_tokens(reply.usage)
        return self.compaction.should_compact(tokens, self.model.context_window)

    async def _compact_before_prompt(self) -> None:
        """Compact before a prompt from idle when the context is already too full. An abort
        during it aborts the prompt's run, which still records the prompt."""
        replies = [m for m in reversed(self.messages) if isinstance(m, w.AssistantMessage)]
        if not self._needs_compaction(replies[0] if replies else None):
            return
        try:
            await self._auto_compact("threshold")
        except BaseException as exc:
            if not is_cancellation(exc):
                raise  # cancelled: the run starts cancelled and ends at once, aborted

    def _plan_overflow(self) -> bool:
        if not self.compaction.enabled:
            return False
        if self._overflow_tried:
            self._overflow_failed = w.CompactionEnd(
                reason="overflow", result=None, aborted=False, will_retry=False,
                error_message=OVERFLOW_RECOVERY_FAILED)
            return False
        self._overflow_tried = self._overflow_next = True
        return True

    async def _recover_overflow(self) -> bool:
        """Compact after a context overflow; True when the prompt is to be retried."""
        self._overflow_next = False
        if not await self._auto_compact("overflow", will_retry=True):
            return False
        last = self.messages[-1] if self.messages else None
        if isinstance(last, w.AssistantMessage) and last.stop_reason == "error":
            self.messages.pop()  # the overflow stays in the file, out of the retry
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
        self.emit(w.CompactionStart(reason=reason))
        end = w.CompactionEnd(reason=reason, result=None, aborted=False, will_retry=False)
        self.is_compacting = True
        try:
            self.check_can_prompt()
            end.result, self._messages = await compact(self, reason, instructions)
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
                traceback.print_exc(file=sys.stderr)
            if reason == "manual" or not isinstance(exc, NothingToCompact):
                end.error_message = FAILURE_PREFIX[reason] + str(failure)
            raise failure from exc
        finally:
            self.is_compacting = False
            self.emit(end)

    def abort(self, done: Callable[[], None]) -> None:
        """Cancel the current run and resolve open dialogs as cancelled; `done` is called
        right after the run's ``agent_end``."""
        self.ui.cancel_all()
        _cancel(self.run_scope, self._after_run, done)

    # --- direct bash ---------------------------------------------------------------------------

    def start_bash(self, command: str, command_id: str | int | None
                   ) -> Callable[[], Awaitable[w.BashResult]]:
        """Take the one direct ``bash`` slot now (a second command fails at once, in arrival
        order) and return what runs it (docs/protocol.md, Direct bash): output streamed as
        ``bash_execution_update`` events, the result entering the context (when a run is
        active, once it settles)."""
        if self.bash_scope is not None:
            raise CommandError("A bash command is already running")
        scope = self.bash_scope = trio.CancelScope()
        self._bash_done = trio.Event()

        async def run() -> w.BashResult:
            try:
                message = await run_direct(
                    command, self.cwd,
                    lambda delta: self.emit(w.BashExecutionUpdate(id=command_id, delta=delta)),
                    scope, self.shell, self.wait_for_room, self.scratch)
            finally:
                self.bash_scope = None
                self._bash_done.set()
            if self._busy:
                self._bash_results.append(message)
            else:
                self.remember(message)
            return w.BashResult(output=message.output, exit_code=message.exit_code,
                                cancelled=message.cancelled, truncated=message.truncated,
                                full_output_path=message.full_output_path)

        return run

    def abort_bash(self) -> None:
        if self.bash_scope is not None:
            self.bash_scope.cancel()

    def stop(self) -> None:
        """Shutting down: drop the queues, abort the run (its closing events follow), the
        direct bash command and open dialogs."""
        self.clear_queue()
        self.abort(lambda: None)
        self.abort_bash()

    # --- switching session files ---------------------------------------------------------------

    def start_task(self, task: Callable[[], Awaitable[None]]) -> None:
        assert self._nursery is not None, "Session.serve is not running"
        self._nursery.start_soon(task)

    async def switch(self, make: Callable[[SessionFile], SessionFile], *, restore: bool) -> None:
        """Replace the session's file with what `make` builds from the current one
        (docs/protocol.md, The run lifecycle): queued messages are dropped, a running run is
        aborted and its closing events written, then the new file is opened (in a thread: it
        may be large).
        If `make` fails, the session keeps its file."""
        self.clear_queue()
        self.ui.cancel_all()
        if self.run_scope is not None:
            self.run_scope.cancel()
        await self.wait_settled()
        store = await trio.to_thread.run_sync(make, self.store)
        self.store.close()
        self._install(store, restore=restore)

    def new_store(self, parent_session: str | None) -> Callable[[SessionFile], SessionFile]:
        """Builds an empty session, written (with `parent_session` in its header) once it has
        a message."""
        return lambda _: SessionFile.create(self.session_dir, self.cwd, parent_session)

    def file_store(self, path: Path) -> Callable[[SessionFile], SessionFile]:
        """Opens the session file at `path` (relative to the cwd), or starts one there."""
        path = (self.cwd / path.expanduser()).resolve()

        def make(current: SessionFile) -> SessionFile:
            if current.path == path:
                current.close()  # the same file again: let go of the lock first
            return open_or_create(path, self.cwd)

        return make

    def branch_store(self, leaf: int | None) -> Callable[[SessionFile], SessionFile]:
        """Builds a new session holding the active branch up to position `leaf` (`LEAF`: all
        of it; None: none of it), beside the current file, which its header names as
        ``parentSession``."""
        def make(current: SessionFile) -> SessionFile:
            parent = current.path
            return SessionFile.branched(parent.parent if parent else None, self.cwd,
                                        str(parent) if parent else None, current.branch(leaf))

        return make

    def fork_point(self, entry_id: str) -> tuple[str, int | None]:
        """The text of a user message on the active branch, and its parent's position."""
        position = self.store.index.get(entry_id)
        entry = (self.store.entry(position)
                 if position is not None and position in set(self.store.path_to_leaf()) else {})
        message = entry.get("message") if entry.get("type") == "message" else None
        if not isinstance(message, dict) or message.get("role") != "user":
            raise CommandError("Invalid entry ID for forking")
        parent = entry.get("parentId")
        return user_text(message), self.store.index.get(parent) if parent else None

    def fork_messages(self) -> list[w.ForkMessage]:
        """The user messages of the active branch that have text."""
        out: list[w.ForkMessage] = []
        for position in self.store.path_to_leaf():
            if self.store.kind(position) != "message":
                continue
            entry = self.store.entry(position)
            message = entry.get("message")
            if isinstance(message, dict) and message.get("role") == "user":
                text = user_text(message)
                if text.strip():
                    out.append(w.ForkMessage(entry_id=entry["id"], text=text))
        return out

    async def export_html(self, output_path: str | None) -> str:
        """Write the session as HTML (`forged._export`), in a thread; return the path."""
        store, count, name, model = self.store, len(self.store), self.session_name, self.model

        def write() -> str:
            from ._export import render  # markdown-it: loaded only to export

            if store.path is None:
                raise CommandError("Cannot export in-memory session to HTML")
            if not store.path.exists():
                raise CommandError("Nothing to export yet - start a conversation first")
            target = export_target(self.cwd, output_path or
                                   f"forged-session-{store.path.stem}.html", store.path)
            totals = UsageTotals()
            totals.count(store)
            page = render(store, count, name=name, model=model, totals=totals)
            target.parent.mkdir(parents=True, exist_ok=True)
            rewrite(target, page.encode(), 0o644)
            return str(target)

        return await trio.to_thread.run_sync(write)

    def stats(self) -> w.SessionStats:
        self.totals.count(self.store)
        return session_stats(self.store, self.totals, self.messages, self.model)

    # --- models and thinking -------------------------------------------------------------------

    def set_model(self, provider: str, model_id: str) -> w.Model:
        for model in self.registry.available():
            if model.provider == provider and model.id == model_id:
                self._switch_model(model)
                return model
        raise CommandError(f"Model not found: {provider}/{model_id}")

    def cycle_model(self) -> w.CycledModel | None:
        """The next model of the scope (``--models``, else settings ``enabledModels``), else
        of every available model; a scoped model's ``:<level>`` is switched to with it."""
        patterns = self.model_scope
        if patterns is None:
            enabled = self.settings.get("enabledModels")
            patterns = [p for p in enabled if isinstance(p, str)] if isinstance(
                enabled, list) else []
        candidates = self.registry.scope(patterns) if patterns else []
        scoped = bool(candidates)
        if not scoped:
            candidates = [(model, None) for model in self.registry.available()]
        if len(candidates) <= 1:
            return None
        index = next((i for i, (m, _) in enumerate(candidates) if m == self.model), -1)
        model, level = candidates[(index + 1) % len(candidates)]
        self._switch_model(model, level)
        return w.CycledModel(model=model, thinking_level=self.thinking_level,
                             is_scoped=scoped)

    def _switch_model(self, model: w.Model, level_asked: str | None = None) -> None:
        level = self.thinking_level
        if level_asked is not None:
            self._preferred_level = level_asked
        self.model = model
        self.store.append("model_change", provider=model.provider, modelId=model.id)
        self.settings.remember(defaultProvider=model.provider, defaultModel=model.id)
        self._record_level(level)

    def _record_level(self, previous: str) -> None:
        if self.thinking_level != previous:
            self.store.append("thinking_level_change", thinkingLevel=self.thinking_level)
            self.settings.remember(defaultThinkingLevel=self.thinking_level)

    def set_steering_mode(self, mode: w.QueueMode) -> None:
        self.steering_mode = mode
        self.settings.remember(steeringMode=mode)

    def set_follow_up_mode(self, mode: w.QueueMode) -> None:
        self.follow_up_mode = mode
        self.settings.remember(followUpMode=mode)

    def set_thinking_level(self, level: str) -> None:
        if level not in w.THINKING_LEVELS:
            raise CommandError(
                f"Unknown thinking level: {level}. Expected one of: "
                + ", ".join(w.THINKING_LEVELS))
        previous = self.thinking_level
        self._preferred_level = level
        self._record_level(previous)

    def cycle_thinking_level(self) -> str | None:
        if self.model is None or not self.model.reasoning:
            return None
        levels = supported_levels(self.model)
        current = self.thinking_level
        self._preferred_level = levels[(levels.index(current) + 1) % len(levels)]
        self._record_level(current)
        return self._preferred_level

    def commands(self) -> list[w.CommandInfo]:
        """What ``/name`` runs: plugin commands, prompt templates, then skills
        (get_commands)."""
        found = self.plugins.command_infos()
        for template in self.resources.templates:
            found.append(w.CommandInfo(
                name=template.name, description=template.description, source="prompt",
                source_info=_source_info(template.path, template.origin)))
        for skill in self.resources.skills:
            found.append(w.CommandInfo(
                name=f"skill:{skill.name}", description=skill.description, source="skill",
                source_info=_source_info(skill.path, skill.origin)))
        return found

    def available_thinking_levels(self) -> list[str]:
        return supported_levels(self.model)



def _source_info(path: Path, origin: Origin) -> w.SourceInfo:
    return w.SourceInfo(path=str(path), source="local", scope=origin.scope, origin="top-level",
                        base_dir=str(origin.path if origin.path.is_dir() else path.parent))


def _cancel(scope: trio.CancelScope | None, callbacks: list[Callable[[], None]],
            done: Callable[[], None]) -> None:
    """Cancel `scope` and have `done` called (by whoever runs `callbacks`) once it has
    closed; at once when nothing runs."""
    if scope is None:
        done()
        return
    callbacks.append(done)
    scope.cancel()


def export_target(cwd: Path, output_path: str, session_path: Path) -> Path:
    """Where `export_html` may write: never a session file or its lock (the page would
    replace the conversation), never a folder, device or symbolic link; relative to `cwd`.
    `CommandError` naming the path otherwise."""
    named = cwd / Path(output_path).expanduser()
    try:
        target = named.parent.resolve() / named.name
        info = target.lstat() if target.exists() or target.is_symlink() else None
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise CommandError(f"Not exporting to {target}: it is a symbolic link (to "
                               f"{os.readlink(target)}); name the file itself")
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise CommandError(f"Not exporting to {target}: it is not a regular file")
        is_session = target == session_path.resolve() or target.name.endswith(".lock")
        if info is not None and not is_session:
            with target.open("rb") as existing:
                is_session = existing.read(64).lstrip().startswith(SESSION_START)
    except OSError as exc:
        raise CommandError(f"Cannot export to {named}: {exc.strerror}") from None
    if is_session:
        raise CommandError(f"Not exporting to {target}: it is a session file")
    return target


def open_store(config: SessionConfig, session_dir: Path | None) -> SessionFile:
    if config.session_path is not None:
        return open_or_create(config.session_path, config.cwd)
    return SessionFile.create(session_dir, config.cwd)


def open_or_create(path: Path, cwd: Path) -> SessionFile:
    """The session file at `path`; a path that does not exist yet is a new session there,
    locked at once (a second forged naming it is refused before either writes)."""
    path = path.expanduser().resolve()
    if path.exists():
        return SessionFile.open(path, cwd)
    store = SessionFile.create(path.parent, cwd)
    store.path = path
    store.lock()
    return store
