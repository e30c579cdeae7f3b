"""The scripted provider: a real local HTTP server that plays model replies from a script.

It speaks the Anthropic Messages (``POST /v1/messages``), OpenAI Chat Completions
(``POST .../chat/completions``), OpenAI Responses (``POST .../responses``: OpenAI's, Azure's),
Gemini (``POST .../models/{id}:streamGenerateContent``: the Gemini API's, Vertex AI's) and
Mistral (``POST /mistral/v1/chat/completions``) streaming formats, so one script drives any of
the wire APIs (the tests check with the official SDKs that it streams as the real services
do). Each request takes the next reply of the script and is recorded (method, path, headers,
JSON body).

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

import base64
import itertools
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import attrs
import orjson
import trio

from .. import _codec
from .._errors import ConfigError
from .._wire import tag

SSE_FLUSH_BYTES = 32 * 1024


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptText:
    type: str = tag("text")
    text: str
    chunks: int = 1
    delay_ms: float = 0


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptThinking:
    type: str = tag("thinking")
    thinking: str
    signature: str = "scripted-signature"
    chunks: int = 1
    delay_ms: float = 0


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptRedactedThinking:
    type: str = tag("redactedThinking")
    data: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptToolCall:
    type: str = tag("toolCall")
    name: str
    arguments: dict[str, Any]
    id: str | None = None
    chunks: int = 1
    delay_ms: float = 0


ScriptBlock = ScriptText | ScriptThinking | ScriptRedactedThinking | ScriptToolCall


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptUsage:
    input: int = 10
    output: int = 5
    cache_read: int = 0
    cache_write: int = 0


@attrs.define(kw_only=True, eq=False, repr=False)
class Reply:
    """One model response, or one failure."""

    content: list[ScriptBlock] = attrs.field(factory=list)
    usage: ScriptUsage = attrs.field(factory=ScriptUsage)
    stop_reason: Literal["stop", "length", "toolUse"] | None = None
    delay_ms: float = 0
    status: int | None = None
    error_type: str = "api_error"
    error_message: str = "Scripted error"
    retry_after: float | None = None
    cut: bool = False
    hang: bool = False
    """Answer 200, then send nothing."""
    silent: bool = False
    """Take the request and never answer it."""


@attrs.define(kw_only=True, eq=False, repr=False)
class Script:
    api: str = "anthropic-messages"
    replies: list[Reply] = attrs.field(factory=list)


_codec.register_tagged_union(_codec.converter, ScriptBlock, "type")


def load_script(path: str | Path) -> Script:
    try:
        raw = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"Cannot read script {path}: {exc}") from exc
    try:
        return _codec.structure(raw, Script)
    except Exception as exc:
        raise ConfigError(f"Invalid script {path}: {exc}") from exc


@attrs.define(kw_only=True, eq=False, repr=False)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def _split(text: str, chunks: int) -> list[str]:
    chunks = max(1, min(chunks, len(text) or 1))
    size, extra = divmod(len(text), chunks)
    pieces, start = [], 0
    for index in range(chunks):
        end = start + size + (1 if index < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def _stop_reason(reply: Reply) -> str:
    if reply.stop_reason is not None:
        return reply.stop_reason
    return "toolUse" if any(isinstance(b, ScriptToolCall) for b in reply.content) else "stop"


Frame = tuple[bytes, float]  # bytes to send, seconds to wait before sending them


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


class _Ids:
    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def next(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter):06d}"


def render_anthropic(reply: Reply, model: str, ids: _Ids) -> Iterator[Frame]:
    usage = reply.usage
    yield _sse("message_start", {"type": "message_start", "message": {
        "id": ids.next("msg"), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": usage.input, "output_tokens": 1,
                  "cache_read_input_tokens": usage.cache_read,
                  "cache_creation_input_tokens": usage.cache_write}}}), reply.delay_ms / 1000
    for index, block in enumerate(reply.content):
        def delta(body: dict[str, Any], index: int = index) -> bytes:
            return _sse("content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": body})

        start: dict[str, Any]
        if isinstance(block, ScriptText):
            start = {"type": "text", "text": ""}
        elif isinstance(block, ScriptThinking):
            start = {"type": "thinking", "thinking": "", "signature": ""}
        elif isinstance(block, ScriptRedactedThinking):
            start = {"type": "redacted_thinking", "data": block.data}
        else:
            start = {"type": "tool_use", "id": block.id or ids.next("toolu"),
                     "name": block.name, "input": {}}
        yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                                           "content_block": start}), 0
        if isinstance(block, ScriptText):
            for piece in _split(block.text, block.chunks):
                yield delta({"type": "text_delta", "text": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptThinking):
            for piece in _split(block.thinking, block.chunks):
                yield delta({"type": "thinking_delta", "thinking": piece}), block.delay_ms / 1000
            yield delta({"type": "signature_delta", "signature": block.signature}), 0
        elif isinstance(block, ScriptToolCall):
            arguments = orjson.dumps(block.arguments).decode()
            for piece in _split(arguments, block.chunks):
                yield delta({"type": "input_json_delta", "partial_json": piece}), \
                    block.delay_ms / 1000
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index}), 0
    if reply.cut:
        return
    stop = {"stop": "end_turn", "length": "max_tokens", "toolUse": "tool_use"}[_stop_reason(reply)]
    yield _sse("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": usage.output}}), 0
    yield _sse("message_stop", {"type": "message_stop"}), 0


def render_chat(reply: Reply, model: str, ids: _Ids) -> Iterator[Frame]:
    chunk_id = ids.next("chatcmpl")

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse(None, {"id": chunk_id, "object": "chat.completion.chunk", "created": 0,
                           "model": model, "choices": [
                               {"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""}), reply.delay_ms / 1000
    tool_index = 0
    for block in reply.content:
        if isinstance(block, ScriptText):
            for piece in _split(block.text, block.chunks):
                yield chunk({"content": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptThinking):
            for piece in _split(block.thinking, block.chunks):
                yield chunk({"reasoning_content": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptToolCall):
            arguments = orjson.dumps(block.arguments).decode()
            yield chunk({"tool_calls": [{"index": tool_index, "id": block.id or ids.next("call"),
                                         "type": "function",
                                         "function": {"name": block.name, "arguments": ""}}]}), 0
            for piece in _split(arguments, block.chunks):
                yield chunk({"tool_calls": [{"index": tool_index,
                                             "function": {"arguments": piece}}]}), \
                    block.delay_ms / 1000
            tool_index += 1
    if reply.cut:
        return
    finish = {"stop": "stop", "length": "length", "toolUse": "tool_calls"}[_stop_reason(reply)]
    yield chunk({}, finish), 0
    usage = reply.usage
    yield _sse(None, {"id": chunk_id, "object": "chat.completion.chunk", "created": 0,
                      "model": model, "choices": [], "usage": {
                          "prompt_tokens": usage.input + usage.cache_read,
                          "completion_tokens": usage.output,
                          "total_tokens": usage.input + usage.cache_read + usage.output,
                          "prompt_tokens_details": {"cached_tokens": usage.cache_read},
                          "completion_tokens_details": {"reasoning_tokens": 0}}}), 0
    yield b"data: [DONE]\n\n", 0


def render_responses(reply: Reply, model: str, ids: _Ids) -> Iterator[Frame]:
    sequence = itertools.count()
    response_id = ids.next("resp")

    def event(kind: str, **body: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(sequence), **body})

    def response(status: str, output: list[Any], usage: Any = None) -> dict[str, Any]:
        return {"id": response_id, "object": "response", "created_at": 0, "model": model,
                "status": status, "output": output, "usage": usage}

    yield event("response.created", response=response("in_progress", [])), reply.delay_ms / 1000
    output: list[Any] = []
    for index, block in enumerate(reply.content):
        item: dict[str, Any]
        if isinstance(block, ScriptThinking | ScriptRedactedThinking):
            item_id = ids.next("rs")
            text = block.thinking if isinstance(block, ScriptThinking) else ""
            yield event("response.output_item.added", output_index=index,
                        item={"type": "reasoning", "id": item_id, "summary": []}), 0
            if isinstance(block, ScriptThinking):
                yield event("response.reasoning_summary_part.added", item_id=item_id,
                            output_index=index, summary_index=0,
                            part={"type": "summary_text", "text": ""}), 0
                for piece in _split(block.thinking, block.chunks):
                    yield event("response.reasoning_summary_text.delta", item_id=item_id,
                                output_index=index, summary_index=0, delta=piece), \
                        block.delay_ms / 1000
                yield event("response.reasoning_summary_text.done", item_id=item_id,
                            output_index=index, summary_index=0, text=text), 0
            signature = block.signature if isinstance(block, ScriptThinking) else block.data
            item = {"type": "reasoning", "id": item_id,
                    "summary": [{"type": "summary_text", "text": text}] if text else [],
                    "encrypted_content": signature}
        elif isinstance(block, ScriptText):
            item_id = ids.next("msg")
            yield event("response.output_item.added", output_index=index, item={
                "type": "message", "id": item_id, "role": "assistant",
                "status": "in_progress", "content": []}), 0
            yield event("response.content_part.added", item_id=item_id, output_index=index,
                        content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []}), 0
            for piece in _split(block.text, block.chunks):
                yield event("response.output_text.delta", item_id=item_id, output_index=index,
                            content_index=0, delta=piece, logprobs=[]), block.delay_ms / 1000
            part = {"type": "output_text", "text": block.text, "annotations": []}
            yield event("response.output_text.done", item_id=item_id, output_index=index,
                        content_index=0, text=block.text, logprobs=[]), 0
            yield event("response.content_part.done", item_id=item_id, output_index=index,
                        content_index=0, part=part), 0
            item = {"type": "message", "id": item_id, "role": "assistant",
                    "status": "completed", "content": [part]}
        else:
            item_id = ids.next("fc")
            call_id = block.id or ids.next("call")
            arguments = orjson.dumps(block.arguments).decode()
            yield event("response.output_item.added", output_index=index, item={
                "type": "function_call", "id": item_id, "call_id": call_id,
                "name": block.name, "arguments": "", "status": "in_progress"}), 0
            for piece in _split(arguments, block.chunks):
                yield event("response.function_call_arguments.delta", item_id=item_id,
                            output_index=index, delta=piece), block.delay_ms / 1000
            yield event("response.function_call_arguments.done", item_id=item_id,
                        output_index=index, arguments=arguments), 0
            item = {"type": "function_call", "id": item_id, "call_id": call_id,
                    "name": block.name, "arguments": arguments, "status": "completed"}
        output.append(item)
        yield event("response.output_item.done", output_index=index, item=item), 0
    if reply.cut:
        return
    usage = reply.usage
    status = "incomplete" if _stop_reason(reply) == "length" else "completed"
    yield event(f"response.{status}", response=response(status, output, {
        "input_tokens": usage.input + usage.cache_read,
        "input_tokens_details": {"cached_tokens": usage.cache_read},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input + usage.cache_read + usage.output})), 0


def render_gemini(reply: Reply, model: str, ids: _Ids) -> Iterator[Frame]:
    """Gemini's ``streamGenerateContent?alt=sse``: each event a whole response, thinking as
    parts marked ``thought``, a signature (base64) on a thinking block's last part, each
    function call whole in one part; the last event has the finish reason and the usage (a
    cut reply sends its parts and no finish)."""
    response_id = ids.next("gemini")
    parts: list[tuple[dict[str, Any], float]] = []
    for block in reply.content:
        if isinstance(block, ScriptText | ScriptThinking):
            text = block.text if isinstance(block, ScriptText) else block.thinking
            pieces = _split(text, block.chunks)
            for index, piece in enumerate(pieces):
                part: dict[str, Any] = {"text": piece}
                if isinstance(block, ScriptThinking):
                    part["thought"] = True
                    if index == len(pieces) - 1:
                        part["thoughtSignature"] = base64.b64encode(
                            block.signature.encode()).decode()
                parts.append((part, block.delay_ms / 1000))
        elif isinstance(block, ScriptToolCall):
            call: dict[str, Any] = {"name": block.name, "args": block.arguments}
            if block.id is not None:
                call["id"] = block.id
            parts.append(({"functionCall": call}, block.delay_ms / 1000))
    if not parts:
        parts.append(({"text": ""}, 0))
    usage = reply.usage
    prompt = usage.input + usage.cache_read
    metadata: dict[str, Any] = {"promptTokenCount": prompt,
                                "candidatesTokenCount": usage.output,
                                "totalTokenCount": prompt + usage.output}
    if usage.cache_read:
        metadata["cachedContentTokenCount"] = usage.cache_read
    for index, (part, delay_s) in enumerate(parts):
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        response: dict[str, Any] = {"candidates": [candidate]}
        if index == len(parts) - 1 and not reply.cut:
            candidate["finishReason"] = ("MAX_TOKENS" if _stop_reason(reply) == "length"
                                         else "STOP")
            response["usageMetadata"] = metadata
        response |= {"modelVersion": model, "responseId": response_id}
        yield _sse(None, response), reply.delay_ms / 1000 if index == 0 else delay_s


def render_mistral(reply: Reply, model: str, ids: _Ids) -> Iterator[Frame]:
    """Mistral's chat completions: text as strings, thinking as a chunk list, each tool call
    whole (a nine-character id), the finish reason and usage in the last chunk, then
    ``[DONE]``."""
    chunk_id = ids.next("cmpl")

    def chunk(delta: dict[str, Any], finish: str | None = None,
              usage: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {"id": chunk_id, "object": "chat.completion.chunk",
                                "created": 0, "model": model, "choices": [
                                    {"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage is not None:
            body["usage"] = usage
        return _sse(None, body)

    yield chunk({"role": "assistant", "content": ""}), reply.delay_ms / 1000
    for index, block in enumerate(reply.content):
        if isinstance(block, ScriptText):
            for piece in _split(block.text, block.chunks):
                yield chunk({"content": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptThinking):
            for piece in _split(block.thinking, block.chunks):
                yield chunk({"content": [{"type": "thinking", "thinking": [
                    {"type": "text", "text": piece}]}]}), block.delay_ms / 1000
        elif isinstance(block, ScriptToolCall):
            call_id = block.id or ids.next("c").replace("_", "")[-9:].rjust(9, "0")
            yield chunk({"tool_calls": [{"id": call_id, "index": index, "function": {
                "name": block.name, "arguments": orjson.dumps(block.arguments).decode()}}]}), \
                block.delay_ms / 1000
    if reply.cut:
        return
    finish = {"stop": "stop", "length": "length", "toolUse": "tool_calls"}[_stop_reason(reply)]
    usage = reply.usage
    prompt = usage.input + usage.cache_read
    yield chunk({"content": ""}, finish, {
        "prompt_tokens": prompt, "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read}}), 0
    yield b"data: [DONE]\n\n", 0


GEMINI_METHOD = ":streamGenerateContent"
MISTRAL_PATH = "/mistral/v1/chat/completions"
"""Mistral's path shares OpenAI's: its scripted models live under ``/mistral``."""
_FORMATS = (("/v1/messages", "anthropic"), (MISTRAL_PATH, "mistral"), ("/chat/completions", "chat"),
            ("/responses", "responses"), (GEMINI_METHOD, "gemini"))
_RENDERERS = {"anthropic": render_anthropic, "chat": render_chat,
              "responses": render_responses, "gemini": render_gemini,
              "mistral": render_mistral}


def format_of(path: str) -> str | None:
    """The streaming format a request's path asks for, by how it ends (an API's path under
    any base: Azure's ``/openai/v1/responses``, Vertex AI's model paths); None if unknown."""
    return next((name for suffix, name in _FORMATS if path.endswith(suffix)), None)


def _error_body(path: str, reply: Reply) -> bytes:
    kind = format_of(path)
    if kind == "anthropic":
        return orjson.dumps({"type": "error", "error": {"type": reply.error_type,
                                                        "message": reply.error_message}})
    if kind == "gemini":
        return orjson.dumps({"error": {"code": reply.status, "message": reply.error_message,
                                       "status": reply.error_type.upper()}})
    if kind == "mistral":
        return orjson.dumps({"object": "error", "message": reply.error_message,
                             "type": reply.error_type, "param": None, "code": None})
    return orjson.dumps({"error": {"message": reply.error_message, "type": reply.error_type,
                                   "code": None, "param": None}})


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
        self.port = 0
        self.connections = 0
        """How many connections clients opened."""
        self.exhausted = 0
        """How many requests came after the last reply (answered 400)."""
        self._ids = _Ids()
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
                while await self._handle_one(stream, connection, h11):
                    connection.start_next_cycle()
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                pass

    async def _handle_one(self, stream: trio.SocketStream, connection: Any, h11: Any) -> bool:
        """Answer one request; whether the connection may carry another."""
        request: Any = None
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
            parsed: Any = orjson.loads(bytes(body)) if body else None
        except orjson.JSONDecodeError:
            parsed = bytes(body).decode(errors="replace")
        self.requests.append(RecordedRequest(method=request.method.decode(), path=path,
                                             headers=headers, body=parsed))
        async with self._request_arrived:
            self._request_arrived.notify_all()

        async def send(event: Any) -> None:
            data = connection.send(event)
            if data:
                await stream.send_all(data)

        kind = format_of(path)
        renderer = _RENDERERS[kind] if kind is not None else render_anthropic
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
            payload = _error_body(path, reply)
            response_headers = [("content-type", "application/json"),
                                ("content-length", str(len(payload)))]
            if reply.retry_after is not None:
                response_headers.append(("retry-after", f"{reply.retry_after:g}"))
            await send(h11.Response(status_code=reply.status, headers=response_headers))
            await send(h11.Data(data=payload))
            await send(h11.EndOfMessage())
            return connection.our_state is h11.DONE and connection.their_state is h11.DONE
        await send(h11.Response(status_code=200, headers=[
            ("content-type", "text/event-stream"), ("cache-control", "no-cache"),
            ("transfer-encoding", "chunked")]))
        if reply.hang:
            while await stream.receive_some(65536):
                pass
            return False
        model = parsed.get("model", "scripted") if isinstance(parsed, dict) else "scripted"
        if kind == "gemini":
            model = path.rsplit("/", 1)[-1].removesuffix(GEMINI_METHOD)
        pending: list[bytes] = []
        pending_bytes = 0

        async def flush() -> None:
            data = b"".join(pending)
            await send(h11.Data(data=data))
            if self.record_sends:
                self.sends.append((time.perf_counter(), data))
            pending.clear()

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
        if reply.cut:
            # Close without the terminating chunk: the client sees a broken stream.
            return False
        await send(h11.EndOfMessage())
        return connection.our_state is h11.DONE and connection.their_state is h11.DONE
