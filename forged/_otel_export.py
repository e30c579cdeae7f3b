"""The OpenTelemetry SDK's side of telemetry (`forged._otel`): its tracer and meter
providers for the process, and their OTLP exporters (HTTP/protobuf; gRPC with
``forged[grpc]``), which send from the SDK's own worker threads. Made in a thread as forged
starts: importing the SDK and its exporter takes ~150 ms."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import attrs
from opentelemetry import context as otel_context, metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status

from ._log import log
from ._telemetry import SEMCONV_VERSION, TelemetryConfig
from ._version import __version__

SCOPE = "forged"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"


@attrs.frozen
class Exporting:
    tracer: trace.Tracer
    meter: metrics.Meter | None
    """None when metrics are not exported (``OTEL_METRICS_EXPORTER=none``)."""
    stop: Callable[[], None]
    """Send what waits, and stop (in a thread: it waits for the collector)."""


def _exporters(config: TelemetryConfig) -> tuple[Any, Any] | None:
    """The span and metric exporters the protocol asks for; None (said on stderr) when
    gRPC is asked for without its extra."""
    environ = os.environ  # the variables win over the settings file: the SDK reads them
    endpoint = (config.endpoint.rstrip("/") if config.endpoint and not any(
        environ.get(f"OTEL_EXPORTER_OTLP{kind}_ENDPOINT") for kind in ("", "_TRACES"))
        else None)
    headers = None if environ.get("OTEL_EXPORTER_OTLP_HEADERS") else (
        dict(config.headers) or None)
    if config.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[import-not-found, unused-ignore]
                OTLPMetricExporter as GrpcMetrics,
            )
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]
                OTLPSpanExporter as GrpcSpans,
            )
        except ImportError:
            log("telemetry off: OTLP over gRPC needs the grpc extra (pip install "
                "'forged[grpc]'); or export over http/protobuf")
            return None
        grpc_headers = tuple(headers.items()) if headers else None
        return (GrpcSpans(endpoint=endpoint, headers=grpc_headers),
                GrpcMetrics(endpoint=endpoint, headers=grpc_headers))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    metrics_endpoint = None if environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") else (
        f"{endpoint}/v1/metrics" if endpoint else None)
    return (OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces" if endpoint else None,
                             headers=headers),
            OTLPMetricExporter(endpoint=metrics_endpoint, headers=headers))


class _Stripped(ReadableSpan):
    """`span` without its status's description and its exceptions' messages, counting what
    the SDK's limits dropped from it as it does."""

    def __init__(self, span: ReadableSpan) -> None:
        events = [event if event.name != "exception" else Event(
            "exception", {key: value for key, value in (event.attributes or {}).items()
                          if key == "exception.type"}, event.timestamp)
                  for event in span.events]
        super().__init__(
            name=span.name, context=span.context, parent=span.parent, resource=span.resource,
            attributes=span.attributes, events=events, links=span.links, kind=span.kind,
            status=Status(span.status.status_code), start_time=span.start_time,
            end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)
        self._dropped = (span.dropped_attributes, span.dropped_events, span.dropped_links)

    @property
    def dropped_attributes(self) -> int:
        return self._dropped[0]

    @property
    def dropped_events(self) -> int:
        return self._dropped[1]

    @property
    def dropped_links(self) -> int:
        return self._dropped[2]


class _Textless(SpanProcessor):
    """Without ``logContent``, what ends reaches the exporter without the text an error
    carries: a status's description, an exception event's message and traceback (forged's
    spans and the MCP SDK's alike; ``error.type`` and ``exception.type`` say what failed)."""

    def __init__(self, inner: SpanProcessor) -> None:
        self._inner = inner

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        self._inner.on_start(span, parent_context)

    def _on_ending(self, span: Any) -> None:
        self._inner._on_ending(span)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            stripped = _Stripped(span)
        except Exception as exc:  # dropped, never sent as it was
            log(f"telemetry: a span ({span.name}) was dropped: {exc!r}")
            return
        self._inner.on_end(stripped)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _Tracers(TracerProvider):
    """The SDK's tracer provider, but for what it does in a forked child. forged forks only
    to exec at once (each command, each git of a checkpoint), where the SDK's own
    after-fork work (detecting the resource again, in a thread pool) ran every time before
    the exec: ~2 ms of each child's start."""

    def _handle_fork(self) -> None:
        pass


class _Meters(MeterProvider):
    def _handle_fork(self) -> None:
        pass


class _MetricReader(PeriodicExportingMetricReader):
    def _at_fork_reinit(self) -> None:
        pass


class _Conversation(SpanProcessor):
    """Every span made where a session's span is current (the MCP SDK's too) carries its
    ``gen_ai.conversation.id``."""

    def __init__(self, conversation: Callable[[], str | None]) -> None:
        self._conversation = conversation

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        conversation = self._conversation()
        if conversation is not None and "gen_ai.conversation.id" not in (span.attributes or {}):
            span.set_attribute("gen_ai.conversation.id", conversation)


def start(config: TelemetryConfig, flush_s: float,
          conversation: Callable[[], str | None]) -> Exporting | None:
    """The SDK's providers for the process, exporting as `config` and the ``OTEL_*``
    variables say (`Exporting.stop` sends what waits, for at most `flush_s`; `conversation`
    names the session a span starts in); None when they cannot be made (said on stderr)."""
    exporters = _exporters(config)
    if exporters is None:
        return None
    span_exporter, metric_exporter = exporters
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", "")  # the variables' name wins over the settings'
    resource = Resource.create({"service.version": __version__,
                                **({} if named else {"service.name": config.service_name})})
    tracer_provider = _Tracers(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(_Conversation(conversation))
    if config.traces:
        batches = BatchSpanProcessor(span_exporter)
        tracer_provider.add_span_processor(batches if config.log_content else _Textless(batches))
    trace.set_tracer_provider(tracer_provider)
    meter_provider: MeterProvider | None = None
    meter = None
    if config.metrics:
        meter_provider = _Meters(resource=resource, shutdown_on_exit=False,
                                 metric_readers=[_MetricReader(metric_exporter)])
        metrics.set_meter_provider(meter_provider)
        meter = meter_provider.get_meter(SCOPE, __version__, SCHEMA_URL)

    def stop() -> None:
        deadline = time.monotonic() + flush_s
        tracer_provider.force_flush(int(flush_s * 1000))
        if meter_provider is not None:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            meter_provider.shutdown(timeout_millis=left_ms)
        tracer_provider.shutdown()

    return Exporting(tracer_provider.get_tracer(SCOPE, __version__, SCHEMA_URL), meter, stop)
