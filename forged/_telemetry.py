"""Telemetry: what forged tells an OpenTelemetry collector of its runs (docs/observability.md).

Off by default, and free when off: `tracing` is then a `Tracing`, whose every hook returns
at once (a span is `NULL_SPAN`), and nothing of OpenTelemetry is imported. `wanted` reads
whether the user turned it on (the standard ``OTEL_*`` variables, or the ``telemetry`` block
of their own settings file); `forged._otel.observed` then installs its `Tracing`, on the
official SDK, for the whole process, once the SDK has loaded in a thread: what makes spans
first awaits `ready`. The hooks forged's code calls::

    start_run      invoke_agent: a prompt, with its retries and overflow recovery
    chat           chat {model}: one model request
    tool           execute_tool {name}: one tool call
    span           compaction, checkpoint capture and restore, a direct bash, an MCP
                   server's start
    note           attributes on the span current in the task (an approval asked, a
                   command confined)
    env, headers   the current span's context, for a command's environment and a request
    tag, caller_of the caller's context a prompt or a queued message came with (kept
                   here, whoever traces)
    count          the daemon's live sessions and attached clients

A span is current in the task that made it (OpenTelemetry's context is a context variable,
and a trio task starts with a copy of its spawner's), so what runs under it joins it: the
provider's request, the MCP SDK's call, the command's ``TRACEPARENT``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from ._log import log
from ._paths import agent_dir

if TYPE_CHECKING:
    from . import _wire as w

Value = str | bool | int | float | Sequence[str]
Caller = tuple[str, str | None]
"""A caller's trace context: its ``traceparent`` and ``tracestate``."""

SEMCONV_VERSION = "1.44.0"
"""The OpenTelemetry semantic conventions forged follows (GenAI: "Development")."""
EXPORT_PROTOCOLS = ("http/protobuf", "grpc")


@attrs.frozen
class TelemetryConfig:
    """What the user asked for: the SDK reads the ``OTEL_*`` variables itself; these are the
    settings file's values, which the variables override."""

    endpoint: str | None = None
    protocol: str = "http/protobuf"
    headers: Mapping[str, str] = attrs.Factory(dict)
    service_name: str = "forged"
    log_content: bool = False
    traces: bool = True
    metrics: bool = True


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def configured(block: object, environ: Mapping[str, str] = os.environ
               ) -> TelemetryConfig | str | None:
    """The telemetry `block` (``<agentDir>/settings.json``'s ``telemetry``) and `environ`
    ask for: None when off, a string saying why it cannot be on when it was asked for and
    cannot (one line for stderr). ``OTEL_SDK_DISABLED=true`` and ``enabled: false`` win."""
    settings = block if isinstance(block, dict) else {}
    if _true(environ.get("OTEL_SDK_DISABLED")) or settings.get("enabled") is False:
        return None
    exporters = {kind: environ.get(f"OTEL_{kind.upper()}_EXPORTER", "").strip().lower()
                 for kind in ("traces", "metrics")}
    asked = settings.get("enabled") is True or bool(settings.get("endpoint")) or any(
        environ.get(f"OTEL_EXPORTER_OTLP{suffix}_ENDPOINT")
        for suffix in ("", "_TRACES", "_METRICS")) or any(
        value not in ("", "none") for value in exporters.values())
    if not asked:
        return None
    for kind, exporter in exporters.items():
        if exporter not in ("", "none", "otlp"):
            return (f"telemetry: OTEL_{kind.upper()}_EXPORTER={exporter} is not one forged "
                    "exports to (otlp or none)")
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or str(settings.get("protocol") or "http/protobuf")).strip()
    if protocol not in EXPORT_PROTOCOLS:
        return (f"telemetry off: OTLP protocol {protocol!r} is not one forged speaks "
                f"({' or '.join(EXPORT_PROTOCOLS)})")
    headers = settings.get("headers")
    return TelemetryConfig(
        endpoint=str(settings["endpoint"]) if settings.get("endpoint") else None,
        protocol=protocol,
        headers={str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict)
        else {},
        service_name=str(settings.get("serviceName") or "forged"),
        log_content=settings.get("logContent") is True,
        traces=exporters["traces"] != "none", metrics=exporters["metrics"] != "none")


def wanted(environ: Mapping[str, str] = os.environ) -> TelemetryConfig | None:
    """What this process is asked for, from ``<agentDir>/settings.json`` (the user's own file:
    a project's settings cannot turn telemetry on, nor send it elsewhere) and `environ`; a
    request that cannot be met is said on stderr, and is off."""
    try:
        block = orjson.loads((agent_dir() / "settings.json").read_bytes()).get("telemetry")
    except (OSError, ValueError, AttributeError):
        block = None
    found = configured(block, environ)
    if isinstance(found, str):
        log(found)
        return None
    return found


def caller_in(fields: Mapping[str, str], traceparent: str = "traceparent",
              tracestate: str = "tracestate") -> Caller | None:
    """The caller's context in `fields` (a request's headers), under those names."""
    parent = fields.get(traceparent)
    return (parent, fields.get(tracestate)) if parent else None


def caller_from_env(environ: Mapping[str, str] = os.environ) -> Caller | None:
    """``TRACEPARENT`` and ``TRACESTATE``: how a program that starts forged names its span."""
    return caller_in(environ, "TRACEPARENT", "TRACESTATE")


class Span:
    """One operation, as forged's code tells of it; this one, `NULL_SPAN`, hears nothing.
    As a context manager it is current in the task until it ends, and it ends with the
    block (an exception fails it, a cancellation marks it aborted)."""

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, attributes: Mapping[str, Value]) -> None:
        """Attributes the operation found out as it went."""

    def event(self, name: str, attributes: Mapping[str, Value]) -> None:
        """Something that happened during it."""

    def fail(self, error_type: str, message: str = "") -> None:
        """It failed (a model's error reply, a tool's error result)."""

    def passed(self) -> None:
        """It ended as it should, though an exception ends its block (nothing to compact)."""

    def first_chunk(self) -> None:
        """A model request's first streamed chunk came."""

    def reply(self, message: w.AssistantMessage) -> None:
        """A model request's reply, as it ended: its usage, cost, stop reason, text."""

    def result(self, result: w.ToolResult, is_error: bool) -> None:
        """A tool call's result."""

    @contextmanager
    def current(self) -> Iterator[None]:
        """Make it current in the task for the block, without ending it."""
        yield

    def end(self, *, aborted: bool = False) -> None:
        """End it (a span made by `start_run`)."""


NULL_SPAN = Span()


class Tracing:
    """The hooks, as they are when telemetry is off: each returns at once."""

    enabled = False

    def start_run(self, conversation: str, caller: Caller | None, model: w.Model | None,
                  prompt: Sequence[w.AgentMessage]) -> Span:
        """The span of a prompt's run (`forged._run`): made current by its `Span.current`,
        ended by its `Span.end`."""
        return NULL_SPAN

    def chat(self, model: w.Model) -> Span:
        return NULL_SPAN

    def tool(self, call: w.ToolCall) -> Span:
        return NULL_SPAN

    def span(self, name: str, attributes: Mapping[str, Value], *,
             conversation: str | None = None, caller: Caller | None = None) -> Span:
        return NULL_SPAN

    def note(self, attributes: Mapping[str, Value]) -> None:
        """Attributes on the span current in this task, if any."""

    def link(self, caller: Caller | None) -> None:
        """A message that came with `caller`'s context joined the current run (steering)."""

    def env(self) -> dict[str, str]:
        """``TRACEPARENT`` (and ``TRACESTATE``) of the current span, for a command."""
        return {}

    def headers(self) -> dict[str, str]:
        """``traceparent`` (and ``tracestate``) of the current span, for a request."""
        return {}

    def count(self, what: str, delta: int) -> None:
        """``sessions`` or ``clients``: one more (1) or one fewer (-1) in the daemon."""


tracing: Tracing = Tracing()
starting: trio.Event | None = None
"""While telemetry that is on starts (the SDK loads in a thread as forged starts): set, and
gone, once it has."""


def install(active: Tracing) -> None:
    global tracing
    tracing = active


_callers: weakref.WeakKeyDictionary[object, Caller] = weakref.WeakKeyDictionary()


def tag(message: object, caller: Caller | None) -> None:
    """`message` (a prompt, a queued message) came with `caller`'s context: kept while
    telemetry is on, or starting (the run it starts waits for it to have started)."""
    if caller is not None and (tracing.enabled or starting is not None):
        _callers[message] = caller


def caller_of(messages: Sequence[object]) -> Caller | None:
    """The context the first of `messages` that came with one came with."""
    for message in messages:
        found = _callers.get(message)
        if found is not None:
            return found
    return None


async def ready() -> None:
    """Until telemetry that is on has started, so that what follows is traced: at once when
    it is off, or has started. What starts a run, a command or a server waits here."""
    if starting is not None:
        await starting.wait()


def caller_of_command(command: Any) -> Caller | None:
    """A command's own ``traceparent`` and ``tracestate`` fields."""
    parent = getattr(command, "traceparent", None)
    return (parent, getattr(command, "tracestate", None)) if parent else None


def default_caller(command: Any, caller: Caller | None) -> None:
    """Give `command` `caller`'s context unless it carries its own (a command's own field wins
    over its connection's header, or the process's ``TRACEPARENT``)."""
    if caller is not None and hasattr(command, "traceparent") and not command.traceparent:
        command.traceparent, command.tracestate = caller
