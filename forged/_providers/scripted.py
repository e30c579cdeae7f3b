"""The scripted provider: a real local HTTP server that plays model replies from a script.

It speaks the Anthropic Messages (``POST /v1/messages``), OpenAI Chat Completions
(``POST .../chat/completions``), OpenAI Responses (``POST .../responses``: OpenAI's, Azure's),
Gemini (``POST .../models/{id}:streamGenerateContent``: the Gemini API's, Vertex AI's),
Mistral (``POST /mistral/v1/chat/completions``) and Bedrock (``POST /model/{id}/converse-
stream``) streaming formats (`forged._providers.formats`), so one script drives any of the wire
APIs (the tests check with the official SDKs that it streams as the real services do). Each
request takes the next reply of the script and is recorded (method, path, headers, JSON body).

A script file::

    {"api": "anthropic-messages",
     "replies": [
       {"content": [{"type": "thinking", "thinking": "Let me look", "signature": "sig-1"},
                    {"type": "toolCall", "name": "read", "arguments": {"path": "a.py"}}]},
       {"content": [{"type": "text", "text": "Done.", "chunks": 5, "delayMs": 10}]},
       {"status": 529, "errorType": "overloaded_error", "errorMessage": "Overloaded",
        "retryAfter": 2},
       {"content": [{"type": "text", "text": "cut here"}], "cut": true},
       {"hang": true},
       {"silent": true}
     ]}

Resource handling: `serve` runs until cancelled; each connection is handled in its own task
and kept alive for the client's next request, as the real services do, except after a reply
that is cut short. A hanging or silent reply holds its connection until the client goes away.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from .formats import (
    CONTENT_TYPES,
    RENDERERS,
    Ids,
    error_body,
    format_of,
    model_in,
    render_anthropic,
)
from .script import (
    Reply as Reply,
    Script as Script,
    ScriptBlock as ScriptBlock,
    ScriptRedactedThinking as ScriptRedactedThinking,
    ScriptText as ScriptText,
    ScriptThinking as ScriptThinking,
    ScriptToolCall as ScriptToolCall,
    ScriptUsage as ScriptUsage,
    load_script as load_script,
)

if TYPE_CHECKING:
    import h11

SSE_FLUSH_BYTES = 32 * 1024


@attrs.define(kw_only=True, eq=False, repr=False)
class RecordedRequest:  # type: ignore[explicit-any]  # its body's (below)
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # type: ignore[explicit-any]  # a client's JSON as it came: read, not made
    """The JSON body as orjson decoded it (its text when it is not JSON), unchecked: the tests
    read deep into it. The one explicit `Any` in forged._providers: someone else's JSON,
    entering (as object, each test would need a reader of its own)."""


class ScriptedServer:
    """Plays `replies` in order, one per request, and records every request.

    Start it with ``port = await nursery.start(server.serve)``; `base_url` is then set.
    """

    def __init__(self, replies: list[Reply] | None = None, *, record_sends: bool = False
                 ) -> None:
        self.replies: deque[Reply] = deque(replies or [])
        self.requests: list[RecordedRequest] = []
        self.record_sends = record_sends
        self.sends: list[tuple[float, bytes]] = []
        """With `record_sends`: (time.perf_counter() after the write, bytes) of each write."""
        self.closes: list[float] = []
        """With `record_sends`: time.perf_counter() when a client closed its connection
        while a reply streamed to it (watched for as it streams, not found at the next
        write)."""
        self.port = 0
        self.connections = 0
        """How many connections clients opened."""
        self.exhausted = 0
        """How many requests came after the last reply (answered 400)."""
        self._ids = Ids()
        self._request_arrived = trio.Condition()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def wait_for_requests(self, count: int) -> None:
        async with self._request_arrived:
            while len(self.requests) < count:
                await self._request_arrived.wait()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        import h11  # only a server needs it: kept out of forged's startup

        self.connections += 1
        async with stream:
            connection = h11.Connection(h11.SERVER)
            try:
                while await self._handle_one(stream, connection):
                    connection.start_next_cycle()
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                pass

    async def _watch_close(self, stream: trio.SocketStream, connection: h11.Connection,
                           streaming: trio.Nursery) -> None:
        """While a reply streams: the moment the client closes the connection (then the
        reply stops). What it sends meanwhile is kept for the next request."""
        while True:
            try:
                data = await stream.receive_some(65536)
                connection.receive_data(data)
            except Exception:  # a broken connection, or bytes h11 refuses: closed all the same
                data = b""
            if not data:
                self.closes.append(time.perf_counter())
                streaming.cancel_scope.cancel()
                return

    async def _handle_one(self, stream: trio.SocketStream, connection: h11.Connection) -> bool:
        """Answer one request; whether the connection may carry another."""
        import h11  # (imported by `_handle`)

        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return False
                connection.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                return False
        assert request is not None
        path = request.target.decode().split("?", 1)[0]
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        try:
            parsed: object = orjson.loads(bytes(body)) if body else None
        except orjson.JSONDecodeError:
            parsed = bytes(body).decode(errors="replace")
        self.requests.append(RecordedRequest(method=request.method.decode(), path=path,
                                             headers=headers, body=parsed))
        async with self._request_arrived:
            self._request_arrived.notify_all()

        async def send(event: h11.Event) -> None:
            data = connection.send(event)
            if data:
                await stream.send_all(data)

        kind = format_of(path)
        renderer = RENDERERS[kind] if kind is not None else render_anthropic
        if kind is None:
            reply = Reply(status=404, error_message="no such endpoint")
        elif not self.replies:
            # A client error, so nobody retries it: a script that ran out is a mistake to see.
            self.exhausted += 1
            reply = Reply(status=400, error_type="script_exhausted",
                          error_message="script exhausted: no reply left for this request")
        else:
            reply = self.replies.popleft()
        if reply.silent:
            while await stream.receive_some(65536):
                pass
            return False
        if reply.status is not None:
            payload = error_body(path, reply)
            response_headers = [("content-type", "application/json"),
                                ("content-length", str(len(payload)))]
            if reply.retry_after is not None:
                response_headers.append(("retry-after", f"{reply.retry_after:g}"))
            if kind == "bedrock":
                response_headers.append(("x-amzn-errortype", reply.error_type))
            await send(h11.Response(status_code=reply.status, headers=response_headers))
            await send(h11.Data(data=payload))
            await send(h11.EndOfMessage())
            return connection.our_state is h11.DONE and connection.their_state is h11.DONE
        await send(h11.Response(status_code=200, headers=[
            ("content-type", CONTENT_TYPES.get(kind or "", "text/event-stream")),
            ("cache-control", "no-cache"), ("transfer-encoding", "chunked")]))
        if reply.hang:
            while await stream.receive_some(65536):
                pass
            return False
        model = model_in(path, kind, parsed)
        pending: list[bytes] = []
        pending_bytes = 0

        async def flush() -> None:
            data = b"".join(pending)
            await send(h11.Data(data=data))
            if self.record_sends:
                self.sends.append((time.perf_counter(), data))
            pending.clear()

        closed = False
        async with trio.open_nursery() as streaming:
            if self.record_sends:
                streaming.start_soon(self._watch_close, stream, connection, streaming)
            try:
                for frame, delay_s in renderer(reply, model, self._ids):
                    if delay_s > 0 or pending_bytes >= SSE_FLUSH_BYTES:
                        if pending:
                            await flush()
                            pending_bytes = 0
                        if delay_s > 0:
                            await trio.sleep(delay_s)
                    pending.append(frame)
                    pending_bytes += len(frame)
                if pending:
                    await flush()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                closed = True  # the client went away mid-reply: this connection is done
            streaming.cancel_scope.cancel()
        if closed or (self.record_sends and self.closes
                      and connection.their_state is h11.CLOSED):
            return False
        if reply.cut:
            # Close without the terminating chunk: the client sees a broken stream.
            return False
        await send(h11.EndOfMessage())
        return connection.our_state is h11.DONE and connection.their_state is h11.DONE
