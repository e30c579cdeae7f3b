"""A scripted reply in each wire API's streaming format, as the real services stream it (the
tests check each with its official SDK): Anthropic Messages, OpenAI Chat Completions and
Responses, Gemini, Mistral and Bedrock's ConverseStream; and which format a request's path
asks for.

A renderer yields frames: the bytes to send, and how long to wait before sending them.
"""

from __future__ import annotations

import base64
import itertools
import struct
import zlib
from collections.abc import Iterator
from urllib.parse import unquote

import orjson

from .script import Reply, ScriptRedactedThinking, ScriptText, ScriptThinking, ScriptToolCall


def split(text: str, chunks: int) -> list[str]:
    chunks = max(1, min(chunks, len(text) or 1))
    size, extra = divmod(len(text), chunks)
    pieces, start = [], 0
    for index in range(chunks):
        end = start + size + (1 if index < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def stop_reason(reply: Reply) -> str:
    if reply.stop_reason is not None:
        return reply.stop_reason
    return "toolUse" if any(isinstance(b, ScriptToolCall) for b in reply.content) else "stop"


Frame = tuple[bytes, float]  # bytes to send, seconds to wait before sending them


def _sse(event: str | None, data: dict[str, object]) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


class Ids:
    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def next(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter):06d}"


def render_anthropic(reply: Reply, model: str, ids: Ids) -> Iterator[Frame]:
    usage = reply.usage
    yield _sse("message_start", {"type": "message_start", "message": {
        "id": ids.next("msg"), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": usage.input, "output_tokens": 1,
                  "cache_read_input_tokens": usage.cache_read,
                  "cache_creation_input_tokens": usage.cache_write}}}), reply.delay_ms / 1000
    for index, block in enumerate(reply.content):
        def delta(body: dict[str, object], index: int = index) -> bytes:
            return _sse("content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": body})

        start: dict[str, object]
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
            for piece in split(block.text, block.chunks):
                yield delta({"type": "text_delta", "text": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptThinking):
            for piece in split(block.thinking, block.chunks):
                yield delta({"type": "thinking_delta", "thinking": piece}), block.delay_ms / 1000
            yield delta({"type": "signature_delta", "signature": block.signature}), 0
        elif isinstance(block, ScriptToolCall):
            arguments = orjson.dumps(block.arguments).decode()
            for piece in split(arguments, block.chunks):
                yield delta({"type": "input_json_delta", "partial_json": piece}), \
                    block.delay_ms / 1000
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index}), 0
    if reply.cut:
        return
    stop = {"stop": "end_turn", "length": "max_tokens", "toolUse": "tool_use"}[stop_reason(reply)]
    yield _sse("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": usage.output}}), 0
    yield _sse("message_stop", {"type": "message_stop"}), 0


def render_chat(reply: Reply, model: str, ids: Ids) -> Iterator[Frame]:
    chunk_id = ids.next("chatcmpl")

    def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
        return _sse(None, {"id": chunk_id, "object": "chat.completion.chunk", "created": 0,
                           "model": model, "choices": [
                               {"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""}), reply.delay_ms / 1000
    tool_index = 0
    for block in reply.content:
        if isinstance(block, ScriptText):
            for piece in split(block.text, block.chunks):
                yield chunk({"content": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptThinking):
            for piece in split(block.thinking, block.chunks):
                yield chunk({"reasoning_content": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptToolCall):
            arguments = orjson.dumps(block.arguments).decode()
            yield chunk({"tool_calls": [{"index": tool_index, "id": block.id or ids.next("call"),
                                         "type": "function",
                                         "function": {"name": block.name, "arguments": ""}}]}), 0
            for piece in split(arguments, block.chunks):
                yield chunk({"tool_calls": [{"index": tool_index,
                                             "function": {"arguments": piece}}]}), \
                    block.delay_ms / 1000
            tool_index += 1
    if reply.cut:
        return
    finish = {"stop": "stop", "length": "length", "toolUse": "tool_calls"}[stop_reason(reply)]
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


def render_responses(reply: Reply, model: str, ids: Ids) -> Iterator[Frame]:
    sequence = itertools.count()
    response_id = ids.next("resp")

    def event(kind: str, **body: object) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(sequence), **body})

    def response(status: str, output: list[object], usage: object = None) -> dict[str, object]:
        return {"id": response_id, "object": "response", "created_at": 0, "model": model,
                "status": status, "output": output, "usage": usage}

    yield event("response.created", response=response("in_progress", [])), reply.delay_ms / 1000
    output: list[object] = []
    for index, block in enumerate(reply.content):
        item: dict[str, object]
        if isinstance(block, ScriptThinking | ScriptRedactedThinking):
            item_id = ids.next("rs")
            text = block.thinking if isinstance(block, ScriptThinking) else ""
            yield event("response.output_item.added", output_index=index,
                        item={"type": "reasoning", "id": item_id, "summary": []}), 0
            if isinstance(block, ScriptThinking):
                yield event("response.reasoning_summary_part.added", item_id=item_id,
                            output_index=index, summary_index=0,
                            part={"type": "summary_text", "text": ""}), 0
                for piece in split(block.thinking, block.chunks):
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
            for piece in split(block.text, block.chunks):
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
            for piece in split(arguments, block.chunks):
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
    status = "incomplete" if stop_reason(reply) == "length" else "completed"
    yield event(f"response.{status}", response=response(status, output, {
        "input_tokens": usage.input + usage.cache_read,
        "input_tokens_details": {"cached_tokens": usage.cache_read},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input + usage.cache_read + usage.output})), 0


def render_gemini(reply: Reply, model: str, ids: Ids) -> Iterator[Frame]:
    """Gemini's ``streamGenerateContent?alt=sse``: each event a whole response, thinking as
    parts marked ``thought``, a signature (base64) on a thinking block's last part, each
    function call whole in one part; the last event has the finish reason and the usage (a
    cut reply sends its parts and no finish)."""
    response_id = ids.next("gemini")
    parts: list[tuple[dict[str, object], float]] = []
    for block in reply.content:
        if isinstance(block, ScriptText | ScriptThinking):
            text = block.text if isinstance(block, ScriptText) else block.thinking
            pieces = split(text, block.chunks)
            for index, piece in enumerate(pieces):
                part: dict[str, object] = {"text": piece}
                if isinstance(block, ScriptThinking):
                    part["thought"] = True
                    if index == len(pieces) - 1:
                        part["thoughtSignature"] = base64.b64encode(
                            block.signature.encode()).decode()
                parts.append((part, block.delay_ms / 1000))
        elif isinstance(block, ScriptToolCall):
            call: dict[str, object] = {"name": block.name, "args": block.arguments}
            if block.id is not None:
                call["id"] = block.id
            parts.append(({"functionCall": call}, block.delay_ms / 1000))
    if not parts:
        parts.append(({"text": ""}, 0))
    usage = reply.usage
    prompt = usage.input + usage.cache_read
    metadata: dict[str, object] = {"promptTokenCount": prompt,
                                "candidatesTokenCount": usage.output,
                                "totalTokenCount": prompt + usage.output}
    if usage.cache_read:
        metadata["cachedContentTokenCount"] = usage.cache_read
    for index, (part, delay_s) in enumerate(parts):
        candidate: dict[str, object] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        response: dict[str, object] = {"candidates": [candidate]}
        if index == len(parts) - 1 and not reply.cut:
            candidate["finishReason"] = ("MAX_TOKENS" if stop_reason(reply) == "length"
                                         else "STOP")
            response["usageMetadata"] = metadata
        response |= {"modelVersion": model, "responseId": response_id}
        yield _sse(None, response), reply.delay_ms / 1000 if index == 0 else delay_s


def render_mistral(reply: Reply, model: str, ids: Ids) -> Iterator[Frame]:
    """Mistral's chat completions: text as strings, thinking as a chunk list, each tool call
    whole (a nine-character id), the finish reason and usage in the last chunk, then
    ``[DONE]``."""
    chunk_id = ids.next("cmpl")

    def chunk(delta: dict[str, object], finish: str | None = None,
              usage: dict[str, object] | None = None) -> bytes:
        body: dict[str, object] = {"id": chunk_id, "object": "chat.completion.chunk",
                                "created": 0, "model": model, "choices": [
                                    {"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage is not None:
            body["usage"] = usage
        return _sse(None, body)

    yield chunk({"role": "assistant", "content": ""}), reply.delay_ms / 1000
    for index, block in enumerate(reply.content):
        if isinstance(block, ScriptText):
            for piece in split(block.text, block.chunks):
                yield chunk({"content": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptThinking):
            for piece in split(block.thinking, block.chunks):
                yield chunk({"content": [{"type": "thinking", "thinking": [
                    {"type": "text", "text": piece}]}]}), block.delay_ms / 1000
        elif isinstance(block, ScriptToolCall):
            call_id = block.id or ids.next("c").replace("_", "")[-9:].rjust(9, "0")
            yield chunk({"tool_calls": [{"id": call_id, "index": index, "function": {
                "name": block.name, "arguments": orjson.dumps(block.arguments).decode()}}]}), \
                block.delay_ms / 1000
    if reply.cut:
        return
    finish = {"stop": "stop", "length": "length", "toolUse": "tool_calls"}[stop_reason(reply)]
    usage = reply.usage
    prompt = usage.input + usage.cache_read
    yield chunk({"content": ""}, finish, {
        "prompt_tokens": prompt, "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read}}), 0
    yield b"data: [DONE]\n\n", 0


def event_message(event_type: str, payload: dict[str, object], *,
                  message_type: str = "event") -> bytes:
    """One message of AWS's event-stream framing: prelude, string headers, JSON payload,
    CRC-32s."""
    kind = ":exception-type" if message_type == "exception" else ":event-type"
    headers = b"".join(
        bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(value))
        + value.encode() for name, value in (
            (kind, event_type), (":content-type", "application/json"),
            (":message-type", message_type)))
    body = orjson.dumps(payload)
    prelude = struct.pack(">II", 12 + len(headers) + len(body) + 4, len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + body
    return message + struct.pack(">I", zlib.crc32(message))


def render_bedrock(reply: Reply, model: str, ids: Ids) -> Iterator[Frame]:
    """Bedrock's ConverseStream: binary event-stream messages; text and thinking deltas with
    no block start, a tool use opened by ``contentBlockStart``, the stop reason, then the
    usage in ``metadata``."""
    yield event_message("messageStart", {"role": "assistant"}), reply.delay_ms / 1000
    for index, block in enumerate(reply.content):
        def delta(body: dict[str, object], index: int = index) -> bytes:
            return event_message("contentBlockDelta", {"contentBlockIndex": index,
                                                       "delta": body})

        if isinstance(block, ScriptText):
            for piece in split(block.text, block.chunks):
                yield delta({"text": piece}), block.delay_ms / 1000
        elif isinstance(block, ScriptThinking):
            for piece in split(block.thinking, block.chunks):
                yield delta({"reasoningContent": {"text": piece}}), block.delay_ms / 1000
            yield delta({"reasoningContent": {"signature": block.signature}}), 0
        elif isinstance(block, ScriptRedactedThinking):
            yield delta({"reasoningContent": {"redactedContent": base64.b64encode(
                block.data.encode()).decode()}}), 0
        else:
            yield event_message("contentBlockStart", {"contentBlockIndex": index, "start": {
                "toolUse": {"toolUseId": block.id or ids.next("tooluse"),
                            "name": block.name}}}), 0
            for piece in split(orjson.dumps(block.arguments).decode(), block.chunks):
                yield delta({"toolUse": {"input": piece}}), block.delay_ms / 1000
        yield event_message("contentBlockStop", {"contentBlockIndex": index}), 0
    if reply.cut:
        return
    stop = {"stop": "end_turn", "length": "max_tokens", "toolUse": "tool_use"}[
        stop_reason(reply)]
    yield event_message("messageStop", {"stopReason": stop}), 0
    usage = reply.usage
    yield event_message("metadata", {"usage": {
        "inputTokens": usage.input, "outputTokens": usage.output,
        "totalTokens": usage.input + usage.output + usage.cache_read + usage.cache_write,
        "cacheReadInputTokens": usage.cache_read, "cacheWriteInputTokens": usage.cache_write},
        "metrics": {"latencyMs": 1}}), 0


GEMINI_METHOD = ":streamGenerateContent"
MISTRAL_PATH = "/mistral/v1/chat/completions"
"""Mistral's path shares OpenAI's: its scripted models live under ``/mistral``."""
BEDROCK_METHOD = "/converse-stream"
_FORMATS = (("/v1/messages", "anthropic"), (MISTRAL_PATH, "mistral"),
            ("/chat/completions", "chat"), ("/responses", "responses"),
            (GEMINI_METHOD, "gemini"), (BEDROCK_METHOD, "bedrock"))
RENDERERS = {"anthropic": render_anthropic, "chat": render_chat,
             "responses": render_responses, "gemini": render_gemini,
             "mistral": render_mistral, "bedrock": render_bedrock}
CONTENT_TYPES = {"bedrock": "application/vnd.amazon.eventstream"}
"""Each format's stream's content type, when not server-sent events."""


def model_in(path: str, kind: str | None, body: object) -> str:
    """The model a request names: in the path for Gemini and Bedrock, else in the body."""
    if kind == "gemini":
        return path.rsplit("/", 1)[-1].removesuffix(GEMINI_METHOD)
    if kind == "bedrock":
        return unquote(path.removesuffix(BEDROCK_METHOD).rsplit("/", 1)[-1])
    return str(body.get("model", "scripted")) if isinstance(body, dict) else "scripted"


def format_of(path: str) -> str | None:
    """The streaming format a request's path asks for, by how it ends (an API's path under
    any base: Azure's ``/openai/v1/responses``, Vertex AI's model paths); None if unknown."""
    return next((name for suffix, name in _FORMATS if path.endswith(suffix)), None)


def error_body(path: str, reply: Reply) -> bytes:
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
    if kind == "bedrock":
        return orjson.dumps({"message": reply.error_message})
    return orjson.dumps({"error": {"message": reply.error_message, "type": reply.error_type,
                                   "code": None, "param": None}})
