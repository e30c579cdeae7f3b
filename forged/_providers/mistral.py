"""Mistral (``mistral-conversations``): Mistral's own chat completions, ``POST
{baseUrl}/v1/chat/completions``, as the ancestor speaks it.

It looks like OpenAI's and is not: a reply's content may be a list of chunks, thinking
among them (``{"type": "thinking", "thinking": [{"type": "text", ...}]}``); a tool call's id
must be nine letters or digits, so ids from other providers are replaced by a short hash
(the same one wherever the id appears); a reasoning model is asked to think with
``prompt_mode: "reasoning"``, or with ``reasoning_effort`` where its ``thinkingLevelMap`` names
one; the session id is the prompt cache key and the ``x-affinity`` header.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal, NotRequired, TypedDict, cast

import orjson

from .. import _wire as w
from .._errors import ProviderError, ProviderStreamError
from .base import (
    AssistantBuilder,
    LlmMessage,
    ProviderRequest,
    llm_messages,
    max_output_tokens,
)
from .http import merge_headers, open_events
from .sse import json_object

ID_LENGTH = 9
_NOT_ALNUM = re.compile(r"[^a-zA-Z0-9]")
_STOP_REASONS: dict[str, w.StopReason] = {"stop": "stop", "length": "length",
                                          "model_length": "length", "tool_calls": "toolUse"}


class CallIds:
    """Tool call ids as Mistral takes them: nine letters or digits, one per id."""

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}
        self._owners: dict[str, str] = {}

    def __call__(self, call_id: str) -> str:
        if call_id in self._ids:
            return self._ids[call_id]
        attempt = 0
        while True:
            candidate = derive_id(call_id, attempt)
            if self._owners.setdefault(candidate, call_id) == call_id:
                self._ids[call_id] = candidate
                return candidate
            attempt += 1


def derive_id(call_id: str, attempt: int = 0) -> str:
    plain = _NOT_ALNUM.sub("", call_id)
    if attempt == 0 and len(plain) == ID_LENGTH:
        return plain
    seed = (plain or call_id) + (f":{attempt}" if attempt else "")
    return hashlib.sha256(seed.encode()).hexdigest()[:ID_LENGTH]


# --- the request: what forged sends ------------------------------------------------------------

class TextChunkParam(TypedDict):
    type: Literal["text"]
    text: str


class ImageChunkParam(TypedDict):
    type: Literal["image_url"]
    image_url: str


class ThinkingChunkParam(TypedDict):
    type: Literal["thinking"]
    thinking: list[TextChunkParam]


class FunctionParam(TypedDict):
    name: str
    arguments: str


class ToolCallParam(TypedDict):
    id: str
    type: Literal["function"]
    index: int
    function: FunctionParam


class SystemMessageParam(TypedDict):
    role: Literal["system"]
    content: str


class UserMessageParam(TypedDict):
    role: Literal["user"]
    content: str | list[TextChunkParam | ImageChunkParam]


class AssistantMessageParam(TypedDict):
    role: Literal["assistant"]
    prefix: bool
    content: NotRequired[list[TextChunkParam | ThinkingChunkParam]]
    tool_calls: NotRequired[list[ToolCallParam]]


class ToolMessageParam(TypedDict):
    role: Literal["tool"]
    tool_call_id: str
    name: str
    content: list[TextChunkParam | ImageChunkParam]


MessageParam = SystemMessageParam | UserMessageParam | AssistantMessageParam | ToolMessageParam


class FunctionSpecParam(TypedDict):
    name: str
    description: str
    parameters: dict[str, object]
    strict: bool


class ToolParam(TypedDict):
    type: Literal["function"]
    function: FunctionSpecParam


class ChatBody(TypedDict):
    """A chat completions request's body, its keys in the order they are sent."""

    model: str
    stream: bool
    messages: list[MessageParam]
    max_tokens: int
    tools: NotRequired[list[ToolParam]]
    prompt_mode: NotRequired[Literal["reasoning"]]
    reasoning_effort: NotRequired[str]
    prompt_cache_key: NotRequired[str]


def _image(block: w.ImageContent) -> ImageChunkParam:
    return {"type": "image_url", "image_url": f"data:{block.mime_type};base64,{block.data}"}


def convert_messages(request: ProviderRequest, messages: list[LlmMessage]
                     ) -> list[MessageParam]:
    images = "image" in request.model.input
    ids = CallIds()
    out: list[MessageParam] = []
    if request.system_prompt:
        out.append({"role": "system", "content": request.system_prompt})
    for message in messages:
        if isinstance(message, w.UserMessage):
            content: list[TextChunkParam | ImageChunkParam] = [
                {"type": "text", "text": block.text} if isinstance(block, w.TextContent)
                else _image(block) for block in message.content
                if isinstance(block, w.TextContent) or images]
            if content:
                out.append({"role": "user", "content": content})
            elif any(isinstance(block, w.ImageContent) for block in message.content):
                out.append({"role": "user",
                            "content": "(image omitted: model does not support images)"})
        elif isinstance(message, w.AssistantMessage):
            parts: list[TextChunkParam | ThinkingChunkParam] = []
            calls: list[ToolCallParam] = []
            for block in message.content:
                if isinstance(block, w.TextContent):
                    if block.text.strip():
                        parts.append({"type": "text", "text": block.text})
                elif isinstance(block, w.ThinkingContent):
                    if block.thinking.strip():
                        parts.append({"type": "thinking",
                                      "thinking": [{"type": "text", "text": block.thinking}]})
                else:
                    calls.append({"id": ids(block.id), "type": "function", "index": 0,
                                  "function": {"name": block.name,
                                               "arguments": orjson.dumps(
                                                   block.arguments).decode()}})
            if parts or calls:
                assistant: AssistantMessageParam = {"role": "assistant", "prefix": False}
                if parts:
                    assistant["content"] = parts
                if calls:
                    assistant["tool_calls"] = calls
                out.append(assistant)
        else:
            text = "\n".join(block.text for block in message.content
                             if isinstance(block, w.TextContent))
            pictures = [block for block in message.content if isinstance(block, w.ImageContent)]
            out.append({"role": "tool", "tool_call_id": ids(message.tool_call_id),
                        "name": message.tool_name,
                        "content": [{"type": "text", "text": _result_text(
                            text, bool(pictures), images, message.is_error)},
                            *(_image(block) for block in pictures if images)]})
    return out


def _result_text(text: str, pictures: bool, images: bool, error: bool) -> str:
    prefix = "[tool error] " if error else ""
    if text.strip():
        omitted = ("\n[tool image omitted: model does not support images]"
                   if pictures and not images else "")
        return f"{prefix}{text.strip()}{omitted}"
    if pictures:
        return prefix + ("(see attached image)" if images
                         else "(image omitted: model does not support images)")
    return prefix + "(no tool output)"


def build_body(request: ProviderRequest) -> ChatBody:
    model = request.model
    body: ChatBody = {
        "model": model.id, "stream": True,
        "messages": convert_messages(request, llm_messages(request.messages, model)),
        "max_tokens": max_output_tokens(request)}
    if request.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": tool.name, "description": tool.description, "parameters": tool.parameters,
            "strict": False}} for tool in request.tools]
    level = request.thinking_level
    if model.reasoning:
        levels = model.thinking_level_map
        if levels is None:
            if level != "off":
                body["prompt_mode"] = "reasoning"
        elif level != "off":
            body["reasoning_effort"] = levels.get(level) or "high"
        elif off := levels.get("off"):
            body["reasoning_effort"] = off
    if request.session_id:
        body["prompt_cache_key"] = request.session_id
    return body


def error_text(body: object) -> str | None:
    if not isinstance(body, dict):
        return None
    for key in ("message", "detail"):
        if isinstance(body.get(key), str) and body[key]:
            return str(body[key])
    return None


# --- the stream: what the service sends --------------------------------------------------------

class UsageDetailsEvent(TypedDict, total=False):
    cached_tokens: int | None


class UsageEvent(TypedDict, total=False):
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None
    num_cached_tokens: int | None
    prompt_tokens_details: UsageDetailsEvent | None


class TextChunkEvent(TypedDict, total=False):
    text: str | None


class ContentChunkEvent(TypedDict, total=False):
    type: str
    text: str | None
    thinking: list[TextChunkEvent] | None


class FunctionEvent(TypedDict, total=False):
    name: str | None
    arguments: object
    """A string of JSON, or the arguments themselves."""


class ToolCallEvent(TypedDict, total=False):
    id: str | None
    index: int | None
    function: FunctionEvent | None


class DeltaEvent(TypedDict, total=False):
    content: str | list[str | ContentChunkEvent] | None
    tool_calls: list[ToolCallEvent] | None


class ChoiceEvent(TypedDict, total=False):
    delta: DeltaEvent | None
    finish_reason: str | None


class ChatChunk(TypedDict, total=False):
    usage: UsageEvent | None
    choices: list[ChoiceEvent] | None


def chat_chunk(data: object) -> ChatChunk:
    """The reader of the stream: a decoded chunk as a `ChatChunk`."""
    return cast(ChatChunk, json_object(data))


class StreamReader:
    """One chunk at a time: text and thinking make a block per run of one kind; tool calls
    open as they come (by their index) and end with the stream."""

    def __init__(self, out: AssistantBuilder) -> None:
        self.out = out
        self.calls: dict[object, object] = {}
        self.finished = False

    def _text(self, kind: Literal["text", "thinking"], delta: str) -> None:
        if delta:  # an empty delta opens no block
            self.out.run_delta(kind, delta)

    def chunk(self, event: object) -> None:
        """Apply one decoded chunk of the stream."""
        data = chat_chunk(event)
        usage = data.get("usage")
        if usage:
            prompt = usage.get("prompt_tokens") or 0
            details = usage.get("prompt_tokens_details") or {}
            cached = min(prompt, max(0, details.get("cached_tokens")
                                     or usage.get("num_cached_tokens") or 0))
            self.out.set_usage(input=prompt - cached, output=usage.get("completion_tokens") or 0,
                               cache_read=cached, cache_write=0,
                               total=usage.get("total_tokens") or None)
        choices = data.get("choices") or []
        if not choices:
            return
        choice = choices[0]
        reason = choice.get("finish_reason")
        if reason:
            stop = _STOP_REASONS.get(reason)
            if stop is None:
                raise ProviderError("Provider stopped with: error (server error)"
                                    if reason == "error" else f"Provider stopped with: {reason}")
            self.out.set_stop_reason(stop)
            self.finished = True
        delta = choice.get("delta") or {}
        content = delta.get("content")
        for item in [content] if isinstance(content, str) else content or []:
            if isinstance(item, str):
                self._text("text", item)
            elif item.get("type") == "thinking":
                self._text("thinking", "".join(part.get("text") or ""
                                               for part in item.get("thinking") or []))
            elif item.get("type") == "text":
                self._text("text", item.get("text") or "")
        for call in delta.get("tool_calls") or []:
            self.out.end_run()
            function = call.get("function") or {}
            given = call.get("id")
            call_id = given if given is not None and given != "null" else derive_id(
                f"toolcall:{call.get('index') or 0}")
            key = ("call", call.get("index") if call.get("index") is not None else call_id)
            if key not in self.calls:
                self.calls[key] = call_id
                self.out.start_tool_call(key, call_id, function.get("name") or "")
            arguments = function.get("arguments")
            self.out.tool_call_delta(key, arguments if isinstance(arguments, str)
                                     else orjson.dumps(arguments or {}).decode())

    def finish(self) -> None:
        self.out.end_run()
        self.out.end_all()
        if not self.finished:
            raise ProviderStreamError("Mistral stream ended without a finish reason")


async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
    url = f"{request.model.base_url.rstrip('/')}/v1/chat/completions"
    headers = {"authorization": f"Bearer {request.api_key}", "accept": "text/event-stream"}
    if request.session_id:
        headers["x-affinity"] = request.session_id
    reader = StreamReader(out)
    async with open_events(request, url, merge_headers(headers, request.headers),
                           build_body(request), out, error_text=error_text) as events:
        async for _, data in events:
            reader.chunk(data)
    reader.finish()
