"""OpenAI Chat Completions (``POST {baseUrl}/chat/completions``) and Responses
(``POST {baseUrl}/responses``), streamed as server-sent events."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Literal, cast

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
from .http import Events, merge_headers, open_events
from .openai_types import (
    AssistantItemParam,
    AssistantMessageParam,
    CacheControlParam,
    ChatMessageParam,
    ChatParams,
    FunctionCallItemParam,
    ImagePartParam,
    InputImageParam,
    InputItemParam,
    ReasoningItemParam,
    ResponsesParams,
    ToolCallParam,
    chat_chunk,
    responses_event,
)

_CHAT_STOP: dict[str, w.StopReason] = {
    "stop": "stop", "end": "stop", "length": "length", "tool_calls": "toolUse",
    "function_call": "toolUse",
}
REASONING_EFFORT = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high",
                    "xhigh": "xhigh", "max": "max"}


def _data_url(image: w.ImageContent) -> str:
    return f"data:{image.mime_type};base64,{image.data}"


def _compat(model: w.Model, key: str, default: object) -> object:
    """A models.json ``compat`` field of `model`, else `default`."""
    return (model.compat or {}).get(key, default)


def _uses_developer_role(model: w.Model) -> bool:
    return model.reasoning and bool(_compat(model, "supportsDeveloperRole",
                                            "api.openai.com" in model.base_url))


def reasoning_effort(model: w.Model, level: str) -> str | None:
    """What `level` is sent as: the model's ``thinkingLevelMap`` value, else the level."""
    if model.thinking_level_map is not None and level in model.thinking_level_map:
        return model.thinking_level_map[level]
    return REASONING_EFFORT.get(level)


def build_headers(request: ProviderRequest) -> dict[str, str]:
    """The key as a bearer token, the organization and project from ``OPENAI_ORG_ID`` and
    ``OPENAI_PROJECT_ID`` when set (as OpenAI's SDKs send them), the session for endpoints
    that route by it (``compat.sendSessionAffinityHeaders``); configured headers win."""
    headers = {"authorization": f"Bearer {request.api_key}", "accept": "application/json"}
    for name, variable in (("openai-organization", "OPENAI_ORG_ID"),
                           ("openai-project", "OPENAI_PROJECT_ID")):
        if value := os.environ.get(variable):
            headers[name] = value
    model = request.model
    if request.session_id and _compat(model, "sendSessionAffinityHeaders",
                                      "openrouter.ai" in model.base_url):
        openrouter = _compat(model, "sessionAffinityFormat", "openrouter" if (
            "openrouter.ai" in model.base_url) else "openai") == "openrouter"
        headers["x-session-id" if openrouter else "x-session-affinity"] = request.session_id
    return merge_headers(headers, request.headers)


def error_text(body: object) -> str | None:
    """``error.message`` of an OpenAI error body."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else None


@asynccontextmanager
async def _open(request: ProviderRequest, path: str, body: Mapping[str, object],
                out: AssistantBuilder) -> AsyncIterator[Events]:
    url = f"{request.model.base_url.rstrip('/')}{path}"
    async with open_events(request, url, build_headers(request), body, out,
                           error_text=error_text) as events:
        yield events


# --- Chat Completions --------------------------------------------------------------------------

def chat_messages(request: ProviderRequest, messages: list[LlmMessage]
                  ) -> list[ChatMessageParam]:
    out: list[ChatMessageParam] = []
    model = request.model
    empty_reasoning = (model.reasoning and request.thinking_level != "off" and _compat(
        model, "requiresReasoningContentOnAssistantMessages", False))
    if request.system_prompt:
        role: Literal["developer", "system"] = (
            "developer" if _uses_developer_role(request.model) else "system")
        out.append({"role": role, "content": request.system_prompt})
    pending_images: list[ImagePartParam] = []
    for message in messages:
        if not isinstance(message, w.ToolResultMessage) and pending_images:
            out.append({"role": "user", "content": [
                {"type": "text", "text": "Attached image(s) from tool result:"}, *pending_images]})
            pending_images = []
        if isinstance(message, w.UserMessage):
            if all(isinstance(block, w.TextContent) for block in message.content):
                out.append({"role": "user", "content": w.text_of(message.content)})
            else:
                out.append({"role": "user", "content": [
                    {"type": "text", "text": block.text} if isinstance(block, w.TextContent)
                    else {"type": "image_url", "image_url": {"url": _data_url(block)}}
                    for block in message.content]})
        elif isinstance(message, w.AssistantMessage):
            text = "".join(b.text for b in message.content if isinstance(b, w.TextContent))
            entry: AssistantMessageParam = {"role": "assistant", "content": text or None}
            if empty_reasoning:
                entry["reasoning_content"] = ""
            calls: list[ToolCallParam] = [
                {"id": b.id, "type": "function",
                 "function": {"name": b.name, "arguments": orjson.dumps(b.arguments).decode()}}
                for b in message.content if isinstance(b, w.ToolCall)]
            if calls:
                entry["tool_calls"] = calls
            if text or calls:
                out.append(entry)
        else:
            out.append({"role": "tool", "tool_call_id": message.tool_call_id,
                        "content": w.text_of(message.content) or "(no text output)"})
            pending_images.extend(
                {"type": "image_url", "image_url": {"url": _data_url(block)}}
                for block in message.content if isinstance(block, w.ImageContent))
    if pending_images:
        out.append({"role": "user", "content": [
            {"type": "text", "text": "Attached image(s) from tool result:"}, *pending_images]})
    return out


def chat_params(request: ProviderRequest) -> ChatParams:
    model = request.model
    params: ChatParams = {
        "model": model.id,
        "messages": chat_messages(request, llm_messages(request.messages, model)),
        "stream": True,
    }
    if _compat(model, "supportsUsageInStreaming", True):
        params["stream_options"] = {"include_usage": True}
    if _compat(model, "maxTokensField", "max_completion_tokens") == "max_tokens":
        params["max_tokens"] = max_output_tokens(request)
    else:
        params["max_completion_tokens"] = max_output_tokens(request)
    if _compat(model, "supportsStore", False):
        params["store"] = False
    if request.tools:
        params["tools"] = [{"type": "function", "function": {
            "name": tool.name, "description": tool.description, "parameters": tool.parameters}}
            for tool in request.tools]
        if _compat(model, "zaiToolStream", False):
            params["tool_stream"] = True
    if model.reasoning:
        thinking_params(params, model, request.thinking_level)
    if _compat(model, "cacheControlFormat", None) == "anthropic":
        mark_cache(params)
    return params


CACHE_CONTROL: CacheControlParam = {"type": "ephemeral"}


def mark_cache(params: ChatParams) -> None:
    """Anthropic's cache markers on an OpenAI-compatible request (``compat.cacheControlFormat``
    ``anthropic``, as OpenRouter takes them for Claude): the system prompt, the last tool and
    the last message with text."""
    messages = params["messages"]
    system = next((m for m in messages if m["role"] in ("system", "developer")), None)
    last = next((m for m in reversed(messages) if m["role"] in ("user", "assistant", "tool")
                 and m.get("content")), None)
    for message in (system, last):
        if message is None:
            continue
        content = message["content"]
        if isinstance(content, str):
            content = message["content"] = [{"type": "text", "text": content}]
        texts = [part for part in content or () if part["type"] == "text"]
        if texts:
            texts[-1]["cache_control"] = CACHE_CONTROL
    if params.get("tools"):
        params["tools"][-1]["cache_control"] = CACHE_CONTROL


def _template_values(template: object, thinking: bool, effort: str | None) -> object:
    """``chatTemplateArgs``/``chatTemplateKwargs`` with their ``{"$var": ...}`` filled in."""
    if isinstance(template, dict):
        if set(template) == {"$var"}:
            return {"thinking.enabled": thinking, "thinking.effort": effort}.get(
                template["$var"])
        return {key: _template_values(value, thinking, effort)
                for key, value in template.items()}
    return template


def thinking_params(params: ChatParams, model: w.Model, level: str) -> None:
    """How a reasoning model is asked to think at `level`, in the form its endpoint reads
    (models.json ``compat.thinkingFormat``), as the ancestor asks."""
    thinking = level != "off"
    level_map = model.thinking_level_map or {}
    mapped = level_map.get(level, level) if thinking else None
    effort = mapped if isinstance(mapped, str) else None
    with_effort = thinking and effort is not None and _compat(model, "supportsReasoningEffort",
                                                              True)
    off_allowed = level_map.get("off", "none") is not None
    match _compat(model, "thinkingFormat", "openai"):
        case "zai":
            params["thinking"] = ({"type": "enabled", "clear_thinking": False} if thinking
                                  else {"type": "disabled"})
        case "qwen":
            params["enable_thinking"] = thinking
        case "qwen-chat-template":
            params["chat_template_kwargs"] = {"enable_thinking": thinking,
                                              "preserve_thinking": True}
            with_effort = False
        case "chat-template" | "baseten" as form:
            key = "chatTemplateKwargs" if form == "chat-template" else "chatTemplateArgs"
            template = _compat(model, key, None)
            if template:
                field: Literal["chat_template_kwargs", "chat_template_args"] = (
                    "chat_template_kwargs" if form == "chat-template" else "chat_template_args")
                params[field] = _template_values(template, thinking, effort)
            with_effort = with_effort and form == "baseten"
            off_effort = level_map.get("off")
            if form == "baseten" and not thinking and isinstance(off_effort, str):
                params["reasoning_effort"] = off_effort  # "none", as the endpoint wants
        case "deepseek":
            if thinking or off_allowed:
                params["thinking"] = {"type": "enabled" if thinking else "disabled"}
        case "openrouter":
            if thinking:
                params["reasoning"] = {"effort": level_map.get(level) or level}
            elif off_allowed:
                params["reasoning"] = {"effort": level_map.get("off") or "none"}
            with_effort = False
        case "ant-ling":
            if thinking and effort is not None and level in level_map:
                params["reasoning"] = {"effort": effort}
            with_effort = False
        case "together":
            params["reasoning"] = {"enabled": thinking}
        case "string-thinking":
            if thinking or off_allowed:
                params["thinking"] = (level_map.get(level) or level) if thinking else (
                    level_map.get("off") or "none")
            with_effort = False
    if with_effort and effort is not None:
        params["reasoning_effort"] = effort


async def stream_chat(request: ProviderRequest, out: AssistantBuilder) -> None:
    finished = False
    # Chat Completions has one open block at a time: a change of kind ends the previous one.
    current: tuple[str, object] | None = None  # (kind, key) of the open block
    tool_keys: dict[int, object] = {}

    def switch(kind: str, key: object) -> object:
        nonlocal current
        if current is not None and current != (kind, key):
            out.end(current[1])
        current = (kind, key)
        return key

    async with _open(request, "/chat/completions", chat_params(request), out) as events:
        async for _, data in events:
            chunk = chat_chunk(data)
            error = chunk.get("error")
            if error:
                raise ProviderError(str(error.get("message") or error))
            usage = chunk.get("usage")
            if usage:
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                out.set_usage(input=(usage.get("prompt_tokens") or 0) - cached,
                              output=usage.get("completion_tokens") or 0,
                              cache_read=cached, cache_write=0)
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                reasoning = (delta.get("reasoning_content") or delta.get("reasoning")
                             or delta.get("reasoning_text"))
                if reasoning:
                    if current is None or current[0] != "thinking":
                        out.start_thinking(switch("thinking", len(out.message.content)))
                    assert current is not None
                    out.thinking_delta(current[1], reasoning)
                text = delta.get("content")
                if text:
                    if current is None or current[0] != "text":
                        out.start_text(switch("text", len(out.message.content)))
                    assert current is not None
                    out.text_delta(current[1], text)
                for call in delta.get("tool_calls") or ():
                    index = call.get("index", 0)
                    function = call.get("function") or {}
                    call_id = call.get("id")
                    if call_id and tool_keys.get(index) != call_id:
                        tool_keys[index] = call_id
                        out.start_tool_call(switch("tool", call_id), call_id,
                                            function.get("name", ""))
                    arguments = function.get("arguments")
                    if arguments and index in tool_keys:
                        out.tool_call_delta(tool_keys[index], arguments)
                reason = choice.get("finish_reason")
                if reason:
                    if reason == "content_filter":
                        raise ProviderError("The response was blocked by the content filter")
                    out.set_stop_reason(_CHAT_STOP.get(reason, "stop"))
                    finished = True
    if not finished:
        raise ProviderStreamError(
            "terminated: the stream ended before the message was complete")
    out.end_all()
    if out.has_tool_calls() and out.message.stop_reason == "stop":
        out.set_stop_reason("toolUse")


# --- Responses ---------------------------------------------------------------------------------

def _reasoning_item(signature: str) -> ReasoningItemParam:
    """A thinking block's signature as the reasoning item it keeps (`handle_responses_event`
    keeps the service's item whole), to send back as it came; `orjson.JSONDecodeError` when
    the signature is not JSON."""
    return cast(ReasoningItemParam, orjson.loads(signature))


def responses_input(request: ProviderRequest, messages: list[LlmMessage]
                    ) -> list[InputItemParam]:
    items: list[InputItemParam] = []
    model = request.model
    for message in messages:
        if isinstance(message, w.UserMessage):
            items.append({"role": "user", "content": [
                {"type": "input_text", "text": block.text} if isinstance(block, w.TextContent)
                else {"type": "input_image", "detail": "auto", "image_url": _data_url(block)}
                for block in message.content]})
        elif isinstance(message, w.AssistantMessage):
            same_model = message.provider == model.provider and message.model == model.id
            for block in message.content:
                if isinstance(block, w.ThinkingContent):
                    if same_model and block.thinking_signature:
                        try:
                            items.append(_reasoning_item(block.thinking_signature))
                        except orjson.JSONDecodeError:
                            pass
                elif isinstance(block, w.TextContent):
                    item: AssistantItemParam = {
                        "type": "message", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": block.text,
                                     "annotations": []}]}
                    if same_model and block.text_signature:
                        item["id"] = block.text_signature
                    items.append(item)
                else:
                    call_id, _, item_id = block.id.partition("|")
                    call: FunctionCallItemParam = {
                        "type": "function_call", "call_id": call_id, "name": block.name,
                        "arguments": orjson.dumps(block.arguments).decode()}
                    if same_model and item_id:
                        call["id"] = item_id
                    items.append(call)
        else:
            items.append({"type": "function_call_output",
                          "call_id": message.tool_call_id.partition("|")[0],
                          "output": w.text_of(message.content) or "(no text output)"})
            images: list[InputImageParam] = [
                {"type": "input_image", "detail": "auto", "image_url": _data_url(block)}
                for block in message.content if isinstance(block, w.ImageContent)]
            if images:
                items.append({"role": "user", "content": [
                    {"type": "input_text", "text": "Attached image(s) from tool result:"},
                    *images]})
    return items


def responses_params(request: ProviderRequest) -> ResponsesParams:
    model = request.model
    params: ResponsesParams = {
        "model": model.id,
        "input": responses_input(request, llm_messages(request.messages, model)),
        "stream": True,
        "store": False,
        "max_output_tokens": max_output_tokens(request),
    }
    if request.system_prompt:
        params["instructions"] = request.system_prompt
    if request.tools:
        params["tools"] = [{"type": "function", "name": tool.name,
                            "description": tool.description, "parameters": tool.parameters,
                            "strict": False} for tool in request.tools]
    effort = reasoning_effort(model, request.thinking_level)
    if model.reasoning and request.thinking_level != "off" and effort is not None:
        params["reasoning"] = {"effort": effort, "summary": "auto"}
        params["include"] = ["reasoning.encrypted_content"]
    elif model.reasoning and request.thinking_level == "off" and model.provider != "github-copilot":
        # Thinking off is asked for (else the model thinks at its default effort), unless the
        # model's map says it cannot stop thinking; Copilot's endpoint takes no "none".
        off = (model.thinking_level_map or {}).get("off", "none")
        if off is not None:
            params["reasoning"] = {"effort": off}
    if request.session_id:
        params["prompt_cache_key"] = request.session_id
    return params


async def stream_responses(request: ProviderRequest, out: AssistantBuilder) -> None:
    async with _open(request, "/responses", responses_params(request), out) as events:
        async for _, event in events:
            if handle_responses_event(event, out):
                return
    raise ProviderStreamError("terminated: the stream ended before the message was complete")


def handle_responses_event(data: object, out: AssistantBuilder) -> bool:
    """Apply one decoded Responses stream event; True once the response is complete."""
    event = responses_event(data)
    kind = event.get("type", "")
    if kind == "response.output_text.delta" or kind == "response.refusal.delta":
        out.text_delta(event["item_id"], event["delta"])
    elif kind == "response.function_call_arguments.delta":
        out.tool_call_delta(event["item_id"], event["delta"])
    elif kind == "response.reasoning_summary_text.delta":
        out.thinking_delta(event["item_id"], event["delta"])
    elif kind == "response.reasoning_summary_part.added":
        if event.get("summary_index", 0) > 0:
            out.thinking_delta(event["item_id"], "\n\n")
    elif kind == "response.output_item.added":
        item = event["item"]
        item_kind = item.get("type")
        if item_kind == "reasoning":
            out.start_thinking(item["id"])
        elif item_kind == "message":
            out.start_text(item["id"], signature=item.get("id"))
        elif item_kind == "function_call":
            out.start_tool_call(item["id"], f"{item['call_id']}|{item['id']}", item["name"])
            if item.get("arguments"):
                out.tool_call_delta(item["id"], item["arguments"])
    elif kind == "response.output_item.done":
        item = event["item"]
        if item.get("type") == "reasoning":
            out.set_thinking_signature(item["id"], orjson.dumps(item).decode())
        out.end(item["id"])
    elif kind in ("response.completed", "response.incomplete", "response.failed"):
        response = event.get("response") or {}
        usage = response.get("usage") or {}
        if usage:
            cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
            out.set_usage(input=(usage.get("input_tokens") or 0) - cached,
                          output=usage.get("output_tokens") or 0, cache_read=cached,
                          cache_write=0, total=usage.get("total_tokens"))
        status = response.get("status")
        if kind == "response.failed" or status in ("failed", "cancelled"):
            error = response.get("error") or {}
            raise ProviderError(str(error.get("message") or f"The response {status}"))
        out.end_all()
        if status == "incomplete":
            out.set_stop_reason("length")
        else:
            out.set_stop_reason("toolUse" if out.has_tool_calls() else "stop")
        return True
    elif kind == "error":
        raise ProviderError(str(event.get("message") or event.get("code") or "error"))
    return False
