"""One agent run: stream a response, run its tool calls, deliver steering, repeat.

The run stops when the model stops and no steering or follow-up waits, or when a reply fails,
and returns what happened (`RunOutcome`): the run driver (`forged._run`) decides what follows
(a retry, a compaction) and writes the run's ``agent_end``. Values go down (the context, the
way to ask the model, the tools), events come up (`Events.emit`, which stores a message as its
``message_end`` passes, before anyone hears of it). Every event of the run up to its last
``turn_end`` is emitted here, in the order docs/protocol.md, Events, gives.

Cancellation (abort): the partial assistant message is finished with ``stopReason:"aborted"``,
an interrupted tool call gets an error result saying so, the turn is closed with ``turn_end``,
then `trio.Cancelled` propagates (the driver writes ``agent_end``). Closing events are emitted
synchronously, so cancellation cannot lose them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from . import _telemetry, _wire as w
from ._errors import PersistenceError, ProviderError
from ._log import log_exception
from ._process import is_cancellation
from ._providers import AssistantBuilder, Provider, ProviderRequest
from ._telemetry import Span
from ._time import now_ms
from ._tools import Tool, ToolContext, ToolError, parse_arguments, text_result

ABORTED_MESSAGE = "Request was aborted"


class Events(Protocol):
    """Where a run's events go. `emit` stores a message as its ``message_end`` passes (a
    ``message_start`` of a message that is not streamed waits for it), and raises
    `PersistenceError` when it cannot: then neither is announced."""

    def emit(self, event: w.Event) -> None: ...
    async def wait_for_room(self) -> None: ...


class Requests(Protocol):
    """How the model is asked, for a context (its ``!command`` values run first)."""

    async def __call__(self, context: list[w.AgentMessage]
                       ) -> tuple[Provider, ProviderRequest]: ...


class Toolbox(Protocol):
    """The tools a run may call, and what they are given."""

    async def find(self, name: str) -> Tool | None: ...
    async def gate(self, call: w.ToolCall) -> str | None:
        """Why a plugin blocks `call`, or None to run it."""

    async def prepare(self, call: w.ToolCall) -> None:
        """What must be done before `call` runs (a checkpoint of the files); it fails no
        call."""

    async def end_stopped(self, before_waiting: Callable[[], None]) -> None:
        """Before an aborted run's ``agent_end``: the commands the abort stopped have ended
        (`forged._process.Stopping`); `before_waiting` is called first if one has not."""

    async def settle(self) -> None:
        """What must be done as a busy spell ends, before ``agent_settled``."""

    def context(self, update: Callable[[w.ToolResult], None]) -> ToolContext: ...


class Deliveries(Protocol):
    """The messages queued for the run (steering, then follow-ups)."""

    def take_steering(self) -> list[w.AgentMessage]: ...
    def take_follow_ups(self) -> list[w.AgentMessage]: ...


@attrs.define(kw_only=True, eq=False, repr=False)
class RunOutcome:
    """How a run ended (unless it was aborted: then it raised)."""

    messages: list[w.AgentMessage]
    """Its new messages, as its ``agent_end`` carries them."""
    reply: w.AssistantMessage | None = None
    """Its last reply."""
    error: ProviderError | None = None
    """The provider's error when the last reply failed with one (whether to retry is the
    driver's to decide)."""

    @property
    def failed(self) -> bool:
        return self.reply is not None and self.reply.stop_reason == "error"


def describe_failure(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


class _Turn:
    """What the current turn has emitted, so an abort can close it."""

    def __init__(self) -> None:
        self.assistant: w.AssistantMessage | None = None
        self.results: list[w.ToolResultMessage] = []
        self.error: ProviderError | None = None


async def run_agent(context: list[w.AgentMessage], prompt: list[w.AgentMessage],
                    model: w.Model, requests: Requests, tools: Toolbox, events: Events,
                    queues: Deliveries, new: list[w.AgentMessage], *,
                    poll_steering: bool = True) -> RunOutcome:
    """Run from `context` (its copy grows with the run) with `prompt`, until the model stops
    and nothing is queued, or a reply fails. `new` collects the run's new messages as they
    pass (so that an aborted run's ``agent_end`` can carry them)."""
    context = list(context)
    turn = _Turn()

    def deliver(messages: list[w.AgentMessage]) -> None:
        for message in messages:
            events.emit(w.MessageStart(message=message))
            events.emit(w.MessageEnd(message=message))
            context.append(message)
            new.append(message)

    events.emit(w.AgentStart())
    events.emit(w.TurnStart())
    try:
        deliver(prompt)
        pending = queues.take_steering() if poll_steering else []
        while True:
            for message in pending:  # a queued message's own trace context, linked
                _telemetry.tracing.link(_telemetry.caller_of([message]))
            deliver(pending)
            assistant = await stream_assistant(context, model, requests, events, new, turn)
            if assistant.stop_reason in ("error", "aborted"):
                events.emit(w.TurnEnd(message=assistant, tool_results=[]))
                return RunOutcome(messages=new, reply=assistant, error=turn.error)
            await run_tool_calls(assistant, tools, events, context, new, turn)
            events.emit(w.TurnEnd(message=assistant, tool_results=turn.results))
            had_tools = bool(turn.results)
            turn = _Turn()
            pending = queues.take_steering()
            if not had_tools and not pending:
                pending = queues.take_follow_ups()
                if not pending:
                    return RunOutcome(messages=new, reply=assistant)
            events.emit(w.TurnStart())
    except PersistenceError as exc:
        # What could not be stored is not announced: the run ends with an unstored failure,
        # in agent_end only (as the ancestor ends a run that threw).
        failure = unstored_failure(model, str(exc))
        new.append(failure)
        return RunOutcome(messages=new, reply=failure)
    except BaseException as exc:
        if is_cancellation(exc) and turn.assistant is not None:
            events.emit(w.TurnEnd(message=turn.assistant, tool_results=turn.results))
        raise


def unstored_failure(model: w.Model | None, reason: str) -> w.AssistantMessage:
    return w.AssistantMessage(
        content=[w.TextContent(text="")], api=model.api if model else "",
        provider=model.provider if model else "", model=model.id if model else "",
        stop_reason="error", error_message=reason, timestamp=now_ms())


async def stream_assistant(context: list[w.AgentMessage], model: w.Model, requests: Requests,
                           events: Events, new: list[w.AgentMessage],
                           turn: _Turn) -> w.AssistantMessage:
    with _telemetry.tracing.chat(model) as span:
        return await _stream_reply(context, model, requests, events, new, turn, span)


async def _stream_reply(context: list[w.AgentMessage], model: w.Model, requests: Requests,
                        events: Events, new: list[w.AgentMessage], turn: _Turn,
                        span: Span) -> w.AssistantMessage:
    emit = events.emit
    if _telemetry.tracing.enabled:  # the first update is the reply's first chunk
        def emit(event: w.Event) -> None:
            span.first_chunk()
            events.emit(event)

    builder = AssistantBuilder(model, emit, events.wait_for_room)
    message = builder.message
    message.stop_reason = "pending"  # as the event is written: still streaming
    events.emit(w.MessageStart(message=message))
    message.stop_reason = "stop"

    def finish() -> w.AssistantMessage:
        span.reply(message)
        events.emit(w.MessageEnd(message=message))
        context.append(message)
        new.append(message)
        turn.assistant = message
        return message

    try:
        provider, request = await requests(list(context))  # its !command values run first
        await provider(request, builder)
        builder.end_all()
    except ProviderError as exc:
        builder.settle_partial()
        message.stop_reason = "error"
        message.error_message = str(exc)
        turn.error = exc
        span.fail(type(exc).__name__, str(exc))
    except Exception as exc:
        log_exception(f"the model's stream failed: {exc!r}", exc)
        builder.settle_partial()
        message.stop_reason = "error"
        message.error_message = describe_failure(exc)
        span.fail(type(exc).__name__, message.error_message)
    except BaseException as exc:
        if is_cancellation(exc):
            builder.settle_partial()
            message.stop_reason = "aborted"
            message.error_message = ABORTED_MESSAGE
            finish()
        raise
    return finish()


async def run_tool_calls(assistant: w.AssistantMessage, tools: Toolbox, events: Events,
                         context: list[w.AgentMessage], new: list[w.AgentMessage],
                         turn: _Turn) -> None:
    """Run the turn's tool calls one after another, in the order the model gave them."""
    for call in [block for block in assistant.content if isinstance(block, w.ToolCall)]:
        with _telemetry.tracing.tool(call) as span:
            await _run_tool_call(call, tools, events, context, new, turn, span)


async def _run_tool_call(call: w.ToolCall, tools: Toolbox, events: Events,
                         context: list[w.AgentMessage], new: list[w.AgentMessage],
                         turn: _Turn, span: Span) -> None:
    """One tool call, from its ``tool_execution_start`` to its result's ``message_end``,
    under its span (current: what it runs joins its trace)."""
    events.emit(w.ToolExecutionStart(tool_call_id=call.id, tool_name=call.name,
                                     args=call.arguments))

    def update(partial: w.ToolResult) -> None:
        events.emit(w.ToolExecutionUpdate(tool_call_id=call.id, tool_name=call.name,
                                          args=call.arguments, partial_result=partial))

    tool_context = tools.context(update)  # its commands' environment: under the span
    if tool_context.guard is not None:
        span.set({"forged.permission.mode": tool_context.guard.mode})
    clock = _Clock()

    def finish(result: w.ToolResult, is_error: bool) -> None:
        events.emit(w.ToolExecutionEnd(tool_call_id=call.id, tool_name=call.name,
                                       result=result, is_error=is_error,
                                       duration_ms=clock.elapsed_ms()))
        span.result(result, is_error)
        message = w.ToolResultMessage(tool_call_id=call.id, tool_name=call.name,
                                      content=result.content, details=result.details,
                                      is_error=is_error, timestamp=now_ms())
        events.emit(w.MessageStart(message=message))
        events.emit(w.MessageEnd(message=message))
        context.append(message)
        new.append(message)
        turn.results.append(message)

    try:
        blocked = await tools.gate(call)
        await trio.lowlevel.checkpoint_if_cancelled()  # an abort answered its dialogs
        if blocked is not None:
            raise ToolError(blocked)
        await tools.prepare(call)
        result = await execute(await tools.find(call.name), call, tool_context, clock)
        is_error = False
    except ToolError as exc:
        result, is_error = text_result(exc.text, exc.details, exc.structured), True
    except Exception as exc:
        log_exception(f"tool {call.name} failed: {exc!r}", exc)
        result, is_error = text_result(describe_failure(exc)), True
    except BaseException as exc:
        if is_cancellation(exc):
            finish(tool_context.aborted_result or text_result("Operation aborted"), True)
        raise
    finish(result, is_error)


class _Clock:
    """How long a tool ran, on a monotonic clock; None if it never started."""

    def __init__(self) -> None:
        self._started: float | None = None

    def start(self) -> None:
        self._started = time.perf_counter()

    def elapsed_ms(self) -> int | None:
        if self._started is None:
            return None
        return round((time.perf_counter() - self._started) * 1000)


async def execute(tool: Tool | None, call: w.ToolCall, context: ToolContext,
                  clock: _Clock | None = None) -> w.ToolResult:
    """Run `call` with `tool`; `clock` starts once its arguments were accepted."""
    if tool is None:
        raise ToolError(f"Tool {call.name} not found")
    arguments = parse_arguments(tool, call.arguments)
    if clock is not None:
        clock.start()
    return await tool.run(arguments, context)
