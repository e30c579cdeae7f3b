"""An OpenTelemetry collector for the tests: OTLP over HTTP/protobuf on 127.0.0.1, in the test's
trio run, decoding what it is sent with the ``opentelemetry-proto`` classes (the collector's own
wire format). With `silent`, it takes each request and never answers."""

from __future__ import annotations

from typing import Any

import attrs
import h11
import trio
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(item) for item in any_value.array_value.values]
    if kind == "kvlist_value":
        return {item.key: value(item.value) for item in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: value(pair.value) for pair in pairs}


@attrs.define
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]
    status: int
    """1: ok, 2: error (0: unset)."""
    status_message: str
    scope: str
    resource: dict[str, Any]


@attrs.define
class Collector:
    silent: bool = False
    port: int = 0
    spans: list[Span] = attrs.Factory(list)
    metrics: dict[str, list[dict[str, Any]]] = attrs.Factory(dict)
    """Each metric's data points' attributes, and their values (``value``)."""
    requests: int = 0
    _changed: trio.Event = attrs.Factory(trio.Event)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def wait_for(self, found: Any, timeout_s: float = 30) -> None:
        """Until `found()` holds, as exports come."""
        with trio.fail_after(timeout_s):
            while not found():
                await self._changed.wait()

    async def _handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        while True:
            request, body = None, bytearray()
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(1 << 16)
                    if not data:
                        return
                    connection.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
            if request is None:
                return
            self.requests += 1
            self._changed_now()
            if self.silent:
                await trio.sleep_forever()
            answer = self._take(request.target.decode(), bytes(body))
            await stream.send_all(connection.send(h11.Response(status_code=200, headers=[
                ("content-type", "application/x-protobuf"),
                ("content-length", str(len(answer)))])))
            await stream.send_all(connection.send(h11.Data(data=answer)))
            await stream.send_all(connection.send(h11.EndOfMessage()))
            connection.start_next_cycle()

    def _take(self, path: str, body: bytes) -> bytes:
        if path.endswith("/v1/traces"):
            traces = ExportTraceServiceRequest.FromString(body)
            for resource_spans in traces.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(Span(
                            name=span.name, trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(), parent_id=span.parent_span_id.hex(),
                            attributes=attributes(span.attributes),
                            events=[(e.name, attributes(e.attributes)) for e in span.events],
                            links=[(link.trace_id.hex(), link.span_id.hex())
                                   for link in span.links],
                            status=span.status.code, status_message=span.status.message,
                            scope=scope_spans.scope.name,
                            resource=resource))
            answer: bytes = ExportTraceServiceResponse().SerializeToString()
        else:
            exported = ExportMetricsServiceRequest.FromString(body)
            for resource_metrics in exported.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        points = getattr(metric, kind).data_points if kind else []
                        self.metrics.setdefault(metric.name, []).extend(
                            {**attributes(point.attributes),
                             "value": getattr(point, "sum", None) if kind == "histogram"
                             else getattr(point, point.WhichOneof("value"))}
                            for point in points)
            answer = ExportMetricsServiceResponse().SerializeToString()
        self._changed_now()
        return answer

    def _changed_now(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def named(self, prefix: str) -> list[Span]:
        return [span for span in self.spans if span.name.startswith(prefix)]
