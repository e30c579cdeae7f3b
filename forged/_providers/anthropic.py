"""Anthropic Messages: ``POST {baseUrl}/v1/messages``, streamed as server-sent events."""

from __future__ import annotations

import re
from typing import Literal, NotRequired, TypedDict, cast

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

THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
ADAPTIVE_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high",
                   "xhigh": "max", "max": "max"}
_BAD_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_STOP_REASONS: dict[str, w.StopReason] = {
    "end_turn": "stop", "max_tokens": "length", "tool_use": "toolUse",
    "pause_turn": "stop", "stop_sequence": "stop", "model_context_window_exceeded": "length",
}
API_VERSION = "2023-06-01"
CLAUDE_CODE_IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."
"""What the Messages API expects first in the system prompt of a request with an OAuth token."""


# --- the request: what forged sends ------------------------------------------------------------

class CacheControlParam(TypedDict):
    type: Literal["ephemeral"]


EPHEMERAL: CacheControlParam = {"type": "ephemeral"}


class TextBlockParam(TypedDict):
    type: Literal["text"]
    text: str
    cache_control: NotRequired[CacheControlParam]


class ImageSourceParam(TypedDict):
    type: Literal["base64"]
    media_type: str
    data: str


class ImageBlockParam(TypedDict):
    type: Literal["image"]
    source: ImageSourceParam
    cache_control: NotRequired[CacheControlParam]


class ToolResultBlockParam(TypedDict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: list[TextBlockParam | ImageBlockParam]
    is_error: bool
    cache_control: NotRequired[CacheControlParam]


class ThinkingBlockParam(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlockParam(TypedDict):
    type: Literal["redacted_thinking"]
    data: str | None


class ToolUseBlockParam(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, object]


UserBlockParam = TextBlockParam | ImageBlockParam | ToolResultBlockParam
AssistantBlockParam = (TextBlockParam | ThinkingBlockParam | RedactedThinkingBlockParam
                       | ToolUseBlockParam)


class UserMessageParam(TypedDict):
    role: Literal["user"]
    content: list[UserBlockParam]


class AssistantMessageParam(TypedDict):
    role: Literal["assistant"]
    content: list[AssistantBlockParam]


MessageParam = UserMessageParam | AssistantMessageParam


class ToolParam(TypedDict):
    name: str
    description: str
    input_schema: dict[str, object]


class AdaptiveThinkingParam(TypedDict):
    type: Literal["adaptive"]


class EnabledThinkingParam(TypedDict):
    type: Literal["enabled"]
    budget_tokens: int


class OutputConfigParam(TypedDict):
    effort: str


class MessagesBody(TypedDict):
    """A Messages request's body, its keys in the order they are sent."""

    model: str
    max_tokens: int
    messages: list[MessageParam]
    stream: bool
    system: NotRequired[list[TextBlockParam]]
    tools: NotRequired[list[ToolParam]]
    thinking: NotRequired[AdaptiveThinkingParam | EnabledThinkingParam]
    output_config: NotRequired[OutputConfigParam]


def is_adaptive(model_id: str) -> bool:
    return any(tag in model_id for tag in ("opus-4-6", "opus-4.6", "sonnet-4-6", "sonnet-4.6"))


def tool_id(call_id: str) -> str:
    return _BAD_ID_CHARS.sub("_", call_id)[:64]


def _user_blocks(content: list[w.UserContent]) -> list[TextBlockParam | ImageBlockParam]:
    blocks: list[TextBlockParam | ImageBlockParam] = []
    for block in content:
        if isinstance(block, w.TextContent):
            if block.text:
                blocks.append({"type": "text", "text": block.text})
        else:
            blocks.append({"type": "image", "source": {
                "type": "base64", "media_type": block.mime_type, "data": block.data}})
    return blocks


def _assistant_blocks(message: w.AssistantMessage) -> list[AssistantBlockParam]:
    blocks: list[AssistantBlockParam] = []
    for block in message.content:
        if isinstance(block, w.TextContent):
            if block.text:
                blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, w.ThinkingContent):
            if block.redacted:
                blocks.append({"type": "redacted_thinking", "data": block.thinking_signature})
            elif block.thinking_signature:
                blocks.append({"type": "thinking", "thinking": block.thinking,
                               "signature": block.thinking_signature})
            elif block.thinking:
                blocks.append({"type": "text", "text": block.thinking})
        else:
            blocks.append({"type": "tool_use", "id": tool_id(block.id), "name": block.name,
                           "input": block.arguments})
    return blocks


def convert_messages(messages: list[LlmMessage]) -> list[MessageParam]:
    out: list[MessageParam] = []
    for message in messages:
        if isinstance(message, w.UserMessage):
            user_blocks = _user_blocks(message.content)
            if user_blocks:
                out.append({"role": "user", "content": list(user_blocks)})
        elif isinstance(message, w.AssistantMessage):
            assistant_blocks = _assistant_blocks(message)
            if assistant_blocks:
                out.append({"role": "assistant", "content": assistant_blocks})
        else:
            result: ToolResultBlockParam = {
                "type": "tool_result", "tool_use_id": tool_id(message.tool_call_id),
                "content": _user_blocks(message.content) or [{"type": "text", "text": "(empty)"}],
                "is_error": message.is_error,
            }
            previous = out[-1] if out else None
            if (previous is not None and previous["role"] == "user"
                    and previous["content"] and previous["content"][-1]["type"] == "tool_result"):
                previous["content"].append(result)
            else:
                out.append({"role": "user", "content": [result]})
    # Prompt caching: the last block of the last user message is the cache breakpoint.
    for param in reversed(out):
        if param["role"] == "user":
            last = param["content"][-1].copy()
            last["cache_control"] = EPHEMERAL
            param["content"][-1] = last
            break
    return out


def build_body(request: ProviderRequest) -> MessagesBody:
    model = request.model
    body: MessagesBody = {
        "model": model.id,
        "max_tokens": max_output_tokens(request),
        "messages": convert_messages(llm_messages(request.messages, model)),
        "stream": True,
    }
    system: list[TextBlockParam] = []
    if is_oauth_token(request.api_key):
        system.append({"type": "text", "text": CLAUDE_CODE_IDENTITY})
    if request.system_prompt:
        system.append({"type": "text", "text": request.system_prompt,
                       "cache_control": EPHEMERAL})
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [{"name": tool.name, "description": tool.description,
                          "input_schema": tool.parameters} for tool in request.tools]
    level = request.thinking_level
    if model.reasoning and level != "off":
        if is_adaptive(model.id):
            body["thinking"] = {"type": "adaptive"}
            effort = ADAPTIVE_EFFORT.get(level, "high")
            if effort == "max" and "opus" not in model.id:
                effort = "high"
            body["output_config"] = {"effort": effort}
        else:
            budget = THINKING_BUDGETS.get(level, THINKING_BUDGETS["high"])
            body["max_tokens"] = min(body["max_tokens"] + budget, model.max_tokens)
            if body["max_tokens"] <= budget:
                budget = max(0, body["max_tokens"] - 1024)
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    return body


def is_oauth_token(api_key: str) -> bool:
    return "sk-ant-oat" in api_key


def build_headers(request: ProviderRequest) -> dict[str, str]:
    """The Messages API's headers: the key as ``x-api-key``, or as a bearer token when it is
    an OAuth token or models.json's ``authHeader`` put it in ``authorization``; configured
    headers win, an ``anthropic-beta`` among them replacing forged's list."""
    beta = ["fine-grained-tool-streaming-2025-05-14"]
    if not is_adaptive(request.model.id):
        beta.append("interleaved-thinking-2025-05-14")
    headers = {"anthropic-version": API_VERSION, "accept": "application/json"}
    if is_oauth_token(request.api_key):
        beta[:0] = ["claude-code-20250219", "oauth-2025-04-20"]
        headers["authorization"] = f"Bearer {request.api_key}"
    elif not any(name.lower() == "authorization" for name in request.headers):
        headers["x-api-key"] = request.api_key
    headers["anthropic-beta"] = ",".join(beta)
    return merge_headers(headers, request.headers)


async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
    url = f"{request.model.base_url.rstrip('/')}/v1/messages"
    # An error status's message is the whole body, as Anthropic's SDKs report it: the error's
    # type (``overloaded_error``) is in it.
    async with open_events(request, url, build_headers(request), build_body(request),
                           out) as events:
        async for _, data in events:
            if handle_event(data, out):
                return
    raise ProviderStreamError("terminated: the stream ended before the message was complete")


# --- the stream: what the service sends --------------------------------------------------------

class UsageEvent(TypedDict, total=False):
    input_tokens: int | None
    output_tokens: int | None
    cache_read_input_tokens: int | None
    cache_creation_input_tokens: int | None


class DeltaEvent(TypedDict, total=False):
    type: str
    text: str
    partial_json: str
    thinking: str
    signature: str
    stop_reason: str | None


class ContentBlockEvent(TypedDict, total=False):
    type: str
    id: str
    name: str
    data: str


class MessageEvent(TypedDict, total=False):
    usage: UsageEvent | None


class ErrorEvent(TypedDict, total=False):
    type: str
    message: str


class StreamEvent(TypedDict, total=False):
    """One stream event, all its kinds' fields (``content_block_delta``: ``index`` and
    ``delta``; ``message_start``: ``message``; ...)."""

    type: str
    index: int
    delta: DeltaEvent
    content_block: ContentBlockEvent
    message: MessageEvent
    usage: UsageEvent | None
    error: ErrorEvent | None


def stream_event(data: object) -> StreamEvent:
    """The reader of the Messages stream: a decoded event as a `StreamEvent`."""
    return cast(StreamEvent, json_object(data))


def handle_event(event: object, out: AssistantBuilder) -> bool:
    """Apply one stream event; True once the message is complete."""
    data = stream_event(event)
    kind = data.get("type")
    if kind == "content_block_delta":
        delta = data["delta"]
        index = data["index"]
        delta_kind = delta.get("type")
        if delta_kind == "text_delta":
            out.text_delta(index, delta["text"])
        elif delta_kind == "input_json_delta":
            out.tool_call_delta(index, delta["partial_json"])
        elif delta_kind == "thinking_delta":
            out.thinking_delta(index, delta["thinking"])
        elif delta_kind == "signature_delta":
            out.set_thinking_signature(index, delta["signature"], append=True)
    elif kind == "content_block_start":
        block = data["content_block"]
        index = data["index"]
        block_kind = block.get("type")
        if block_kind == "text":
            out.start_text(index)
        elif block_kind == "thinking":
            out.start_thinking(index)
        elif block_kind == "redacted_thinking":
            out.redacted_thinking(index, block.get("data", ""))
        elif block_kind in ("tool_use", "server_tool_use"):
            out.start_tool_call(index, block["id"], block["name"])
    elif kind == "content_block_stop":
        out.end(data["index"])
    elif kind == "message_start":
        usage = data["message"].get("usage") or {}
        out.set_usage(input=usage.get("input_tokens"), output=usage.get("output_tokens"),
                      cache_read=usage.get("cache_read_input_tokens"),
                      cache_write=usage.get("cache_creation_input_tokens"))
    elif kind == "message_delta":
        reason = (data.get("delta") or {}).get("stop_reason")
        if reason is not None:
            mapped = _STOP_REASONS.get(reason)
            if mapped is None:
                raise ProviderError(f"The model stopped: {reason}")
            out.set_stop_reason(mapped)
        usage = data.get("usage") or {}
        out.set_usage(input=usage.get("input_tokens"), output=usage.get("output_tokens"),
                      cache_read=usage.get("cache_read_input_tokens"),
                      cache_write=usage.get("cache_creation_input_tokens"))
    elif kind == "message_stop":
        out.end_all()
        return True
    elif kind == "error":
        error = data.get("error") or {}
        raise ProviderError(f"{error.get('type', 'error')}: {error.get('message', '')}")
    return False
