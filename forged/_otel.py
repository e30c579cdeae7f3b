"""Telemetry on: forged's hooks (`forged._telemetry`) on OpenTelemetry's API, the official
SDK behind it.

Loaded only when the user turned telemetry on: `observed` starts the SDK's tracer and meter
providers for the process in a thread (`forged._otel_export`), exporting over OTLP in the
SDK's own worker threads, so a slow or dead collector never holds up a run: spans wait in
a bounded queue (past it they are dropped), metrics are read every
``OTEL_METRIC_EXPORT_INTERVAL``. When the process's main function returns, what waits is
sent for at most `EXIT_FLUSH_S`, and the rest dropped.

Spans and attributes follow the GenAI semantic conventions of `SEMCONV_VERSION`; what the
conventions have no name for is under ``forged.``. Text (prompts, replies, tool arguments
and results) is exported only with ``logContent``.
"""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import orjson
import trio
from opentelemetry import context as otel_context, metrics, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import _telemetry, _wire as w
from ._log import log
from ._process import is_cancellation
from ._telemetry import Caller, TelemetryConfig, Value

if TYPE_CHECKING:
    from ._otel_export import Exporting

EXIT_FLUSH_S = 3.0
"""How long an ending process waits for its spans and metrics to reach the collector."""
PROVIDER_NAMES = {
    # forged's provider ids to the conventions' gen_ai.provider.name (others as they are)
    "anthropic": "anthropic", "openai": "openai", "azure-openai-responses": "azure.ai.openai",
    "google": "gcp.gemini", "google-vertex": "gcp.vertex_ai",
    "amazon-bedrock": "aws.bedrock", "mistral": "mistral_ai", "xai": "x_ai", "groq": "groq",
    "deepseek": "deepseek", "cohere": "cohere", "perplexity": "perplexity"}
_PROPAGATOR = TraceContextTextMapPropagator()
TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
TRACESTATE = re.compile(r"[a-z0-9_\-*/@]{1,256}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,256}"
                        r"(?: *, *[a-z0-9_\-*/@]{1,256}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,256})*")
"""W3C trace context's two fields, as the standard writes them (printable ASCII only)."""


def parent_context(caller: Caller | None) -> otel_context.Context | None:
    """`caller`'s context; None when it is not W3C trace context (ignored, as the standard
    asks, and never logged: it is the client's text)."""
    if caller is None or not TRACEPARENT.fullmatch(caller[0]):
        return None
    state = caller[1] if caller[1] and TRACESTATE.fullmatch(caller[1]) else None
    carrier = {"traceparent": caller[0], **({"tracestate": state} if state else {})}
    context = _PROPAGATOR.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _provider(name: str) -> str:
    return PROVIDER_NAMES.get(name, name)


def _json(value: object) -> str:
    return orjson.dumps(value, default=str).decode()


def _parts(content: Sequence[object]) -> list[dict[str, Any]]:
    """Message content as the conventions' message parts."""
    parts: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, w.TextContent):
            parts.append({"type": "text", "content": block.text})
        elif isinstance(block, w.ThinkingContent):
            parts.append({"type": "reasoning", "content": block.thinking})
        elif isinstance(block, w.ToolCall):
            parts.append({"type": "tool_call", "id": block.id, "name": block.name,
                          "arguments": block.arguments})
        elif isinstance(block, w.ImageContent):
            parts.append({"type": "blob", "modality": "image", "mime_type": block.mime_type})
    return parts


class _Run:
    """The totals a run's span ends with, which its requests' spans add to."""

    def __init__(self) -> None:
        self.input_tokens = self.output_tokens = 0
        self.cost = 0.0


_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("forged_run", default=None)
_CONVERSATION: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "forged_conversation", default=None)
"""The session of the span current in the task: the spans made under it are its too."""


class _Instruments:
    def __init__(self, meter: metrics.Meter) -> None:
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used.")
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration.")
        self.first_chunk = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk", unit="s",
            description="Time to receive the first chunk of a streamed reply.")
        self.cost = meter.create_counter(
            "forged.cost", unit="USD", description="What the model requests cost, by the "
            "model's prices.")
        self.tool_duration = meter.create_histogram(
            "forged.tool.duration", unit="s", description="How long a tool call took.")
        self.tool_errors = meter.create_counter(
            "forged.tool.errors", unit="{call}", description="Tool calls that failed.")
        self.sessions = meter.create_up_down_counter(
            "forged.sessions", unit="{session}", description="The daemon's live sessions.")
        self.clients = meter.create_up_down_counter(
            "forged.clients", unit="{client}",
            description="Clients attached to the daemon's sessions.")


class OtelSpan(_telemetry.Span):
    def __init__(self, tracing: OtelTracing, span: trace.Span, conversation: str | None
                 ) -> None:
        self._tracing = tracing
        self._span = span
        self._conversation = conversation
        self._started = time.perf_counter()
        self._current: list[Callable[[], None]] = []
        self.failed: str | None = None

    def _make_current(self) -> Callable[[], None]:
        """Current in the task: what undoes it."""
        attached = otel_context.attach(trace.set_span_in_context(self._span))
        marked = _CONVERSATION.set(self._conversation or _CONVERSATION.get())

        def undo() -> None:
            _CONVERSATION.reset(marked)
            otel_context.detach(attached)

        return undo

    def __enter__(self) -> OtelSpan:
        self._current.append(self._make_current())
        return self

    def __exit__(self, *raised: object) -> None:
        self._current.pop()()
        exc = raised[1] if len(raised) > 1 else None
        if isinstance(exc, BaseException):
            if is_cancellation(exc):
                self._span.set_attribute("forged.aborted", True)
            elif self.failed is None:
                self.fail(type(exc).__name__, str(exc))
        self.end(aborted=False)

    @contextmanager
    def current(self) -> Iterator[None]:
        undo = self._make_current()
        try:
            yield
        finally:
            undo()

    def set(self, attributes: Mapping[str, Value]) -> None:
        self._span.set_attributes(attributes)

    def event(self, name: str, attributes: Mapping[str, Value]) -> None:
        self._span.add_event(name, attributes)

    def fail(self, error_type: str, message: str = "") -> None:
        self.failed = error_type
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR, message or None))

    def passed(self) -> None:
        self.failed = ""

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._started

    def end(self, *, aborted: bool = False) -> None:
        if aborted:
            self._span.set_attribute("forged.aborted", True)
        self._span.end()


class RunSpan(OtelSpan):
    def __init__(self, tracing: OtelTracing, span: trace.Span, conversation: str) -> None:
        super().__init__(tracing, span, conversation)
        self._run = _Run()

    @contextmanager
    def current(self) -> Iterator[None]:
        marked = _RUN.set(self._run)
        try:
            with super().current():
                yield
        finally:
            _RUN.reset(marked)

    def end(self, *, aborted: bool = False) -> None:
        run = self._run
        self._span.set_attributes({
            "gen_ai.usage.input_tokens": run.input_tokens,
            "gen_ai.usage.output_tokens": run.output_tokens, "forged.cost.usd": run.cost})
        super().end(aborted=aborted)


class ChatSpan(OtelSpan):
    def __init__(self, tracing: OtelTracing, span: trace.Span, model: w.Model) -> None:
        super().__init__(tracing, span, None)
        self._metric: dict[str, Value] = {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": _provider(model.provider),
            "gen_ai.request.model": model.id}
        self._first: float | None = None

    def first_chunk(self) -> None:
        if self._first is None:
            self._first = self.elapsed_s()
            self._span.set_attribute("gen_ai.response.time_to_first_chunk", self._first)

    def reply(self, message: w.AssistantMessage) -> None:
        usage = message.usage
        input_tokens = usage.input + usage.cache_read + usage.cache_write  # the cache's too
        self._span.set_attributes({
            "gen_ai.response.model": message.model,
            "gen_ai.response.finish_reasons": [message.stop_reason],
            "gen_ai.usage.input_tokens": input_tokens,
            "gen_ai.usage.output_tokens": usage.output,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_write,
            "forged.cost.usd": usage.cost.total})
        if self._tracing.config.log_content:
            self._span.set_attribute("gen_ai.output.messages", _json([{
                "role": "assistant", "parts": _parts(message.content),
                "finish_reason": message.stop_reason}]))
        if message.stop_reason == "error" and self.failed is None:
            self.fail("error", message.error_message or "")
        run = _RUN.get()
        if run is not None:
            run.input_tokens += input_tokens
            run.output_tokens += usage.output
            run.cost += usage.cost.total
        instruments, labels = self._tracing.instruments, self._metric
        if instruments is not None:
            for kind, count in (("input", input_tokens), ("output", usage.output)):
                if count:
                    instruments.tokens.record(count, {**labels, "gen_ai.token.type": kind})
            if usage.cost.total:
                instruments.cost.add(usage.cost.total, labels)

    def end(self, *, aborted: bool = False) -> None:
        instruments = self._tracing.instruments
        if instruments is not None:
            labels = {**self._metric, **({"error.type": self.failed} if self.failed else {})}
            instruments.duration.record(self.elapsed_s(), labels)
            if self._first is not None:
                instruments.first_chunk.record(self._first, self._metric)
        super().end(aborted=aborted)


class ToolSpan(OtelSpan):
    def __init__(self, tracing: OtelTracing, span: trace.Span, name: str) -> None:
        super().__init__(tracing, span, None)
        self._name = name

    def result(self, result: w.ToolResult, is_error: bool) -> None:
        if self._tracing.config.log_content:
            self._span.set_attribute("gen_ai.tool.call.result", w.text_of(result.content))
        if is_error:
            self.fail("tool_error", "the tool's result is an error")

    def end(self, *, aborted: bool = False) -> None:
        instruments = self._tracing.instruments
        if instruments is not None:
            labels: dict[str, Value] = {"gen_ai.tool.name": self._name}
            if self.failed:
                labels["error.type"] = self.failed
                instruments.tool_errors.add(1, labels)
            instruments.tool_duration.record(self.elapsed_s(), labels)
        super().end(aborted=aborted)


class OtelTracing(_telemetry.Tracing):
    enabled = True

    def __init__(self, config: TelemetryConfig, tracer: trace.Tracer,
                 instruments: _Instruments | None) -> None:
        self.config = config
        self.tracer = tracer
        self.instruments = instruments

    def _attributes(self, operation: str, conversation: str | None = None
                    ) -> dict[str, Value]:
        """A span's own attributes; the session's id, when not given, is the current span's
        (`forged._otel_export`'s processor gives it to every span)."""
        return {"gen_ai.operation.name": operation,
                **({"gen_ai.conversation.id": conversation} if conversation else {})}

    def start_run(self, conversation: str, caller: Caller | None, model: w.Model | None,
                  prompt: Sequence[w.AgentMessage]) -> _telemetry.Span:
        attributes = {**self._attributes("invoke_agent", conversation),
                      "gen_ai.agent.name": "forged"}
        if model is not None:
            attributes["gen_ai.provider.name"] = _provider(model.provider)
            attributes["gen_ai.request.model"] = model.id
        if self.config.log_content:
            attributes["gen_ai.input.messages"] = _json([
                {"role": message.role, "parts": _parts(message.content)}
                for message in prompt if isinstance(message, w.UserMessage)])
        span = self.tracer.start_span("invoke_agent forged", parent_context(caller),
                                      kind=SpanKind.INTERNAL, attributes=attributes)
        return RunSpan(self, span, conversation)

    def chat(self, model: w.Model) -> _telemetry.Span:
        attributes = {**self._attributes("chat"),
                      "gen_ai.provider.name": _provider(model.provider),
                      "gen_ai.request.model": model.id}
        span = self.tracer.start_span(f"chat {model.id}", kind=SpanKind.CLIENT,
                                      attributes=attributes)
        return ChatSpan(self, span, model)

    def tool(self, call: w.ToolCall) -> _telemetry.Span:
        attributes = {**self._attributes("execute_tool"),
                      "gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id,
                      "gen_ai.tool.type": "function"}
        if self.config.log_content:
            attributes["gen_ai.tool.call.arguments"] = _json(call.arguments)
        span = self.tracer.start_span(f"execute_tool {call.name}", kind=SpanKind.INTERNAL,
                                      attributes=attributes)
        return ToolSpan(self, span, call.name)

    def span(self, name: str, attributes: Mapping[str, Value], *,
             conversation: str | None = None, caller: Caller | None = None
             ) -> _telemetry.Span:
        return OtelSpan(self, self.tracer.start_span(
            name, parent_context(caller), kind=SpanKind.INTERNAL, attributes={
                **({"gen_ai.conversation.id": conversation} if conversation else {}),
                **attributes}), conversation)

    def note(self, attributes: Mapping[str, Value]) -> None:
        trace.get_current_span().set_attributes(attributes)

    def link(self, caller: Caller | None) -> None:
        parent = parent_context(caller)
        if parent is not None:
            trace.get_current_span().add_link(
                trace.get_current_span(parent).get_span_context(),
                {"forged.link": "queued"})

    def _carrier(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # OTEL_PROPAGATORS' (W3C trace context and baggage)
        return carrier

    def env(self) -> dict[str, str]:
        return {name.upper(): value for name, value in self._carrier().items()}

    def headers(self) -> dict[str, str]:
        return self._carrier()

    def count(self, what: str, delta: int) -> None:
        if self.instruments is not None:
            counter = self.instruments.sessions if what == "sessions" else (
                self.instruments.clients)
            counter.add(delta)


def _started(config: TelemetryConfig) -> Exporting | None:
    """In a thread: the SDK's providers, or None (said on stderr)."""
    from ._otel_export import start

    try:
        return start(config, EXIT_FLUSH_S, _CONVERSATION.get)
    except Exception as exc:  # a bad OTEL_* value: the SDK's own error, in a line
        log(f"telemetry off: {exc}")
        return None


def _stopped(stop: Callable[[], None]) -> None:
    try:
        stop()
    except Exception as exc:
        log(f"telemetry: what waited could not be sent: {exc}")


def observed(main: Callable[..., Awaitable[int | None]], config: TelemetryConfig, *,
             caller: Caller | None) -> Callable[..., Awaitable[int | None]]:
    """`main` with telemetry on around it: the SDK started in a thread meanwhile (what
    makes spans waits for it: `forged._telemetry.ready`), `caller` (``TRACEPARENT``) the
    parent of every span the process makes without a parent of its own, and what waits sent
    when it returns, for at most `EXIT_FLUSH_S`."""

    async def run(*args: Any) -> int | None:
        context = parent_context(caller)
        token = otel_context.attach(context) if context is not None else None
        made: list[Exporting] = []
        starting = _telemetry.starting = trio.Event()

        async def start() -> None:
            try:
                exporting = await trio.to_thread.run_sync(_started, config,
                                                          abandon_on_cancel=True)
                if exporting is not None:
                    _telemetry.install(OtelTracing(config, exporting.tracer, None if (
                        exporting.meter is None) else _Instruments(exporting.meter)))
                    made.append(exporting)
            except Exception as exc:
                log(f"telemetry off: {exc}")
            finally:
                starting.set()
                _telemetry.starting = None

        try:
            async with trio.open_nursery() as telemetry_nursery:
                telemetry_nursery.start_soon(start)
                try:
                    return await main(*args)
                finally:  # an SDK still loading is left to the exit
                    telemetry_nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # what main raised, as it raised it
            if len(group.exceptions) != 1:
                raise
            raise group.exceptions[0] from None
        finally:
            if token is not None:
                otel_context.detach(token)
            if made:  # past the deadline its thread is left to the exit
                with trio.CancelScope(shield=True, deadline=trio.current_time() + EXIT_FLUSH_S):
                    await trio.to_thread.run_sync(_stopped, made[0].stop,
                                                  abandon_on_cancel=True)

    return run
