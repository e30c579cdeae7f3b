"""One agent run: stream a response, run its tool calls, deliver steering, repeat.

The run stops when the model stops and no steering or follow-up waits. Every event of the run
is emitted here, in the order docs/protocol.md, Events, gives.

Cancellation (abort): the partial assistant message is finished with ``stopReason:"aborted"``,
an interrupted tool call gets an error result saying so, the turn and the run are closed with
``turn_end`` and ``agent_end``, then `trio.Cancelled` propagates. Closing events are emitted
synchronously, so cancellation cannot lose them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import trio

from . import _wire as w
from ._errors import PersistenceError, ProviderError
from ._log import log_exception
from ._providers import AssistantBuilder, Provider, ProviderRequest
from ._time import now_ms
from ._tools import Tool, ToolContext, ToolError, parse_arguments, text_result
from ._tools.base import ClientFiles, ScratchDir, Shell

ABORTED_MESSAGE = "Request was aborted"


class AgentHost(Protocol):
    """What a run needs from its session."""

    cwd: Path
    shell: Shell
    scratch: ScratchDir
    files: ClientFiles | None

    @property
    def model(self) -> w.Model | None: ...

    def emit(self, event: w.Event) -> None: ...
    def end_message(self, message: w.AgentMessage, *, started: bool = True) -> None: ...
    def take_steering(self) -> list[w.AgentMessage]: ...
    def take_follow_ups(self) -> list[w.AgentMessage]: ...
    async def model_request(self) -> tuple[Provider, ProviderRequest]: ...
    async def before_tool_call(self, call: w.ToolCall) -> str | None: ...
    def plan_retry(self, message: w.AssistantMessage, error: ProviderError | None) -> bool: ...
    async def wait_for_room(self) -> None: ...
    async def tool(self, name: str) -> Tool | None: ...
    def command_env(self) -> dict[str, str | None]: ...


def is_cancellation(exc: BaseException) -> bool:
    """True for `trio.Cancelled`, or a group made only of them."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(inner) for inner in exc.exceptions)
    return False


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


async def run_agent(host: AgentHost, prompt: list[w.AgentMessage], *,
                    poll_steering: bool = True) -> list[w.AgentMessage]:
    """Run until the model stops and nothing is queued; return the run's new messages."""
    new: list[w.AgentMessage] = []
    turn = _Turn()
    will_retry = False

    def deliver(messages: list[w.AgentMessage]) -> None:
        for message in messages:
            host.end_message(message, started=False)
            new.append(message)

    host.emit(w.AgentStart())
    host.emit(w.TurnStart())
    try:
        deliver(prompt)
        pending = host.take_steering() if poll_steering else []
        while True:
            deliver(pending)
            assistant = await stream_assistant(host, new, turn)
            if assistant.stop_reason in ("error", "aborted"):
                host.emit(w.TurnEnd(message=assistant, tool_results=[]))
                will_retry = assistant.stop_reason == "error" and host.plan_retry(
                    assistant, turn.error)
                return new
            await run_tool_calls(host, assistant, new, turn)
            host.emit(w.TurnEnd(message=assistant, tool_results=turn.results))
            had_tools = bool(turn.results)
            turn = _Turn()
            pending = host.take_steering()
            if not had_tools and not pending:
                pending = host.take_follow_ups()
                if not pending:
                    return new
            host.emit(w.TurnStart())
    except PersistenceError as exc:
        # What could not be stored is not announced: the run ends with an unstored failure,
        # in agent_end only (as the ancestor ends a run that threw).
        new.append(unstored_failure(host.model, str(exc)))
        return new
    except BaseException as exc:
        if is_cancellation(exc) and turn.assistant is not None:
            host.emit(w.TurnEnd(message=turn.assistant, tool_results=turn.results))
        raise
    finally:
        host.emit(w.AgentEnd(messages=new, will_retry=will_retry))


def unstored_failure(model: w.Model | None, reason: str) -> w.AssistantMessage:
    return w.AssistantMessage(
        content=[w.TextContent(text="")], api=model.api if model else "",
        provider=model.provider if model else "", model=model.id if model else "",
        stop_reason="error", error_message=reason, timestamp=now_ms())


async def stream_assistant(host: AgentHost, new: list[w.AgentMessage],
                           turn: _Turn) -> w.AssistantMessage:
    model = host.model
    if model is None:
        raise ProviderError("No model selected")
    builder = AssistantBuilder(model, host.emit, host.wait_for_room)
    message = builder.message
    message.stop_reason = "pending"  # as the event is written: still streaming
    host.emit(w.MessageStart(message=message))
    message.stop_reason = "stop"

    def finish() -> w.AssistantMessage:
        host.end_message(message)
        new.append(message)
        turn.assistant = message
        return message

    try:
        provider, request = await host.model_request()  # its !command values run first
        await provider(request, builder)
        builder.end_all()
    except ProviderError as exc:
        builder.settle_partial()
        message.stop_reason = "error"
        message.error_message = str(exc)
        turn.error = exc
    except Exception as exc:
        log_exception(f"the model's stream failed: {exc!r}", exc)
        builder.settle_partial()
        message.stop_reason = "error"
        message.error_message = describe_failure(exc)
    except BaseException as exc:
        if is_cancellation(exc):
            builder.settle_partial()
            message.stop_reason = "aborted"
            message.error_message = ABORTED_MESSAGE
            finish()
        raise
    return finish()


async def run_tool_calls(host: AgentHost, assistant: w.AssistantMessage,
                         new: list[w.AgentMessage], turn: _Turn) -> None:
    """Run the turn's tool calls one after another, in the order the model gave them."""
    for call in [block for block in assistant.content if isinstance(block, w.ToolCall)]:
        host.emit(w.ToolExecutionStart(tool_call_id=call.id, tool_name=call.name,
                                       args=call.arguments))

        def update(partial: w.ToolResult, call: w.ToolCall = call) -> None:
            host.emit(w.ToolExecutionUpdate(tool_call_id=call.id, tool_name=call.name,
                                            args=call.arguments, partial_result=partial))

        context = ToolContext(cwd=host.cwd, update=update, shell=host.shell,
                              scratch=host.scratch, env=host.command_env(), files=host.files)
        clock = _Clock()
        try:
            blocked = await host.before_tool_call(call)
            await trio.lowlevel.checkpoint_if_cancelled()  # an abort answered its dialogs
            if blocked is not None:
                raise ToolError(blocked)
            result = await execute(await host.tool(call.name), call, context, clock)
            is_error = False
        except ToolError as exc:
            result, is_error = text_result(exc.text, exc.details, exc.structured), True
        except Exception as exc:
            log_exception(f"tool {call.name} failed: {exc!r}", exc)
            result, is_error = text_result(describe_failure(exc)), True
        except BaseException as exc:
            if is_cancellation(exc):
                aborted = context.aborted_result or text_result("Operation aborted")
                _finish_tool(host, call, aborted, True, new, turn, clock.elapsed_ms())
            raise
        _finish_tool(host, call, result, is_error, new, turn, clock.elapsed_ms())


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


def _finish_tool(host: AgentHost, call: w.ToolCall, result: w.ToolResult, is_error: bool,
                 new: list[w.AgentMessage], turn: _Turn, duration_ms: int | None) -> None:
    host.emit(w.ToolExecutionEnd(tool_call_id=call.id, tool_name=call.name, result=result,
                                 is_error=is_error, duration_ms=duration_ms))
    message = w.ToolResultMessage(tool_call_id=call.id, tool_name=call.name,
                                  content=result.content, details=result.details,
                                  is_error=is_error, timestamp=now_ms())
    host.end_message(message, started=False)
    new.append(message)
    turn.results.append(message)

