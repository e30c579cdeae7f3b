"""Google's Gemini models: the Gemini API (``google-generative-ai``, ``POST
{baseUrl}/models/{id}:streamGenerateContent?alt=sse`` with ``x-goog-api-key``) and Vertex AI
(``google-vertex``, `forged._providers.vertex`), which share one request body and one stream.

The stream is server-sent events, each a whole ``GenerateContentResponse``: its first
candidate's parts are text (``thought: true`` marks thinking) and whole function calls, its
last has the ``finishReason`` and ``usageMetadata``. A part may carry a ``thoughtSignature``
(base64), which must be sent back on the same part: forged keeps it as the block's
``textSignature``, ``thinkingSignature`` or the tool call's ``thoughtSignature``, and sends it
only to the model that made it.
"""

from __future__ import annotations

import itertools
import re
import time
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

GOOGLE_LEVELS = w.THINKING_LEVELS[1:w.THINKING_LEVELS.index("xhigh") + 1]
"""Those Gemini names (``minimal`` to ``xhigh``); ``max`` is not one."""
"""The levels Gemini takes (``XHIGH`` only on the models whose map names it)."""
BUDGETS = {  # a Gemini 2.5 model's thinking budget in tokens for each level, by id
    "2.5-pro": {"minimal": 128, "low": 2048, "medium": 8192, "high": 32768},
    "2.5-flash-lite": {"minimal": 512, "low": 2048, "medium": 8192, "high": 24576},
    "2.5-flash": {"minimal": 128, "low": 2048, "medium": 8192, "high": 24576},
}
_STOP_REASONS: dict[str, w.StopReason] = {"STOP": "stop", "MAX_TOKENS": "length",
                                          "CONTINUATION": "length"}
_BAD_ID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")
_LEVEL_MODELS = re.compile(r"gemini-3(?:\.\d+)?-(?:pro|flash)|gemini-(?:[4-9]|[1-9]\d)|gemma-?4")
_GEMINI_VERSION = re.compile(r"^gemini(?:-live)?-(\d+)")
_call_counter = itertools.count(1)


def gemini_version(model_id: str) -> int | None:
    found = _GEMINI_VERSION.match(model_id.lower())
    return int(found[1]) if found else None


def needs_call_ids(model_id: str) -> bool:
    """Whether function calls and responses carry ids: Gemini 3 and later, and the Claude and
    gpt-oss models some Google endpoints serve."""
    version = gemini_version(model_id)
    return (model_id.startswith(("claude-", "gpt-oss-"))
            or (version is not None and version >= 3))


def uses_thinking_level(model: w.Model) -> bool:
    """Whether the model takes ``thinkingLevel`` (Gemini 3 and later) rather than a
    ``thinkingBudget`` in tokens."""
    model_id = model.id.lower()
    return (bool(_LEVEL_MODELS.search(model_id))
            or model_id in ("gemini-flash-latest", "gemini-flash-lite-latest"))


def google_level(model: w.Model, level: str) -> str:
    """`level` as one of Google's, through the model's ``thinkingLevelMap``."""
    mapped = (model.thinking_level_map or {}).get(level)
    resolved = mapped.lower() if isinstance(mapped, str) else level
    if resolved not in GOOGLE_LEVELS:
        raise ProviderError(f"Unsupported Google thinking level mapping for {model.provider}/"
                            f"{model.id}: {level} -> {mapped}")
    return resolved


# --- the request: what forged sends ------------------------------------------------------------

class InlineDataParam(TypedDict):
    mimeType: str
    data: str


class FunctionCallParam(TypedDict):
    name: str
    args: dict[str, object]
    id: NotRequired[str]


class FunctionResponseParam(TypedDict):
    name: str
    response: dict[str, str]
    """``{"output": text}``, or ``{"error": text}``."""
    parts: NotRequired[list[PartParam]]
    id: NotRequired[str]


class PartParam(TypedDict, total=False):
    """A part of a turn: one of text, an image, a function call or its response, as Gemini's
    ``Part`` (``thought`` marks text as thinking)."""

    thought: bool
    text: str
    inlineData: InlineDataParam
    functionCall: FunctionCallParam
    functionResponse: FunctionResponseParam
    thoughtSignature: str


class ContentParam(TypedDict):
    role: Literal["user", "model"]
    parts: list[PartParam]


class FunctionDeclarationParam(TypedDict):
    name: str
    description: str
    parametersJsonSchema: object


class ToolParam(TypedDict):
    functionDeclarations: list[FunctionDeclarationParam]


class ThinkingConfigParam(TypedDict, total=False):
    includeThoughts: bool
    thinkingBudget: int
    thinkingLevel: str


class GenerationConfigParam(TypedDict):
    maxOutputTokens: int
    thinkingConfig: NotRequired[ThinkingConfigParam]


class GenerateContentBody(TypedDict):
    """A ``streamGenerateContent`` request's body, its keys in the order they are sent."""

    contents: list[ContentParam]
    systemInstruction: NotRequired[ContentParam]
    tools: NotRequired[list[ToolParam]]
    generationConfig: NotRequired[GenerationConfigParam]


def thinking_config(model: w.Model, level: str) -> ThinkingConfigParam | None:
    if not model.reasoning:
        return None
    if level == "off":
        if not uses_thinking_level(model):
            return {"thinkingBudget": 0}
        lowest = next((known for known in w.THINKING_LEVELS
                       if known in model.thinking_levels), "off")
        if lowest == "off":
            return {"thinkingBudget": 0}
        return {"thinkingLevel": google_level(model, lowest).upper()}
    resolved = google_level(model, level)
    if uses_thinking_level(model):
        return {"includeThoughts": True, "thinkingLevel": resolved.upper()}
    budget = next((table[resolved] for name, table in BUDGETS.items() if name in model.id), -1)
    return {"includeThoughts": True, "thinkingBudget": budget}


def _signature(same_model: bool, signature: str | None) -> PartParam:
    """A part's ``thoughtSignature``, when the model that made it reads it and it is base64."""
    if (same_model and signature and len(signature) % 4 == 0
            and _BASE64.match(signature)):
        return {"thoughtSignature": signature}
    return {}


def _image(block: w.ImageContent) -> PartParam:
    return {"inlineData": {"mimeType": block.mime_type, "data": block.data}}


def convert_messages(messages: list[LlmMessage], model: w.Model) -> list[ContentParam]:
    contents: list[ContentParam] = []
    with_ids = needs_call_ids(model.id)

    def call_id(value: str) -> str:
        return _BAD_ID_CHARS.sub("_", value)[:64] if with_ids else value

    for message in messages:
        parts: list[PartParam] = []
        if isinstance(message, w.UserMessage):
            parts = [{"text": block.text} if isinstance(block, w.TextContent)
                     else _image(block) for block in message.content]
            if parts:
                contents.append({"role": "user", "parts": parts})
        elif isinstance(message, w.AssistantMessage):
            same = message.provider == model.provider and message.model == model.id
            for block in message.content:
                if isinstance(block, w.TextContent):
                    signature = _signature(same, block.text_signature)
                    if block.text.strip() or signature:
                        parts.append({"text": block.text, **signature})
                elif isinstance(block, w.ThinkingContent):
                    signature = _signature(same, block.thinking_signature)
                    if block.thinking.strip() or signature:
                        parts.append({"thought": True, "text": block.thinking, **signature})
                else:
                    call: FunctionCallParam = {"name": block.name, "args": block.arguments}
                    if with_ids:
                        call["id"] = call_id(block.id)
                    parts.append({"functionCall": call,
                                  **_signature(same, block.thought_signature)})
            if parts:
                contents.append({"role": "model", "parts": parts})
        else:
            contents.extend(_tool_result(message, model, call_id(message.tool_call_id),
                                         with_ids, contents))
    return contents


def _tool_result(message: w.ToolResultMessage, model: w.Model, call_id: str, with_id: bool,
                 contents: list[ContentParam]) -> list[ContentParam]:
    """The turns a tool result adds: its ``functionResponse`` joins the previous user turn of
    function responses (all of one reply's go in one turn); a Gemini before 3 gets its images
    in a user turn of their own."""
    text = "\n".join(block.text for block in message.content if isinstance(block, w.TextContent))
    images = [_image(block) for block in message.content
              if isinstance(block, w.ImageContent)] if "image" in model.input else []
    value = text if text.strip() else "(see attached image)" if images else ""
    version = gemini_version(model.id)
    nested = version is None or version >= 3
    response: FunctionResponseParam = {
        "name": message.tool_name, "response": {"error" if message.is_error else "output": value}}
    if images and nested:
        response["parts"] = images
    if with_id:
        response["id"] = call_id
    added: list[ContentParam] = []
    previous = contents[-1] if contents else None
    if (previous is not None and previous["role"] == "user"
            and any("functionResponse" in part for part in previous["parts"])):
        previous["parts"].append({"functionResponse": response})
    else:
        added.append({"role": "user", "parts": [{"functionResponse": response}]})
    if images and not nested:
        added.append({"role": "user", "parts": [{"text": "Tool result image:"}, *images]})
    return added


_NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
              "dependencies")
_SUBSCHEMAS = ("additionalProperties", "unevaluatedProperties", "propertyNames", "items",
               "prefixItems", "additionalItems", "unevaluatedItems", "contains", "allOf",
               "anyOf", "oneOf", "not", "if", "then", "else", "contentSchema")


def const_as_enum(schema: object, names: bool = False) -> object:
    """`schema` with each string or number ``const`` as a one-value ``enum``: Gemini ignores
    ``const`` in ``parametersJsonSchema`` and honours ``enum``."""
    if isinstance(schema, list):
        return [const_as_enum(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: const_as_enum(value) if names or key in _SUBSCHEMAS
              else const_as_enum(value, names=True) if key in _NAME_MAPS else value
              for key, value in schema.items()}
    if (not names and "const" in result and "enum" not in result
            and isinstance(result["const"], str | int | float)
            and not isinstance(result["const"], bool)):
        result["enum"] = [result.pop("const")]
    return result


def build_body(request: ProviderRequest) -> GenerateContentBody:
    model = request.model
    body: GenerateContentBody = {
        "contents": convert_messages(llm_messages(request.messages, model), model)}
    if request.system_prompt:
        body["systemInstruction"] = {"role": "user", "parts": [{"text": request.system_prompt}]}
    if request.tools:
        body["tools"] = [{"functionDeclarations": [
            {"name": tool.name, "description": tool.description,
             "parametersJsonSchema": const_as_enum(tool.parameters)}
            for tool in request.tools]}]
    config: GenerationConfigParam = {"maxOutputTokens": max_output_tokens(request)}
    thinking = thinking_config(model, request.thinking_level)
    if thinking is not None:
        config["thinkingConfig"] = thinking
    body["generationConfig"] = config
    return body


def error_text(body: object) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


# --- the stream: what the service sends --------------------------------------------------------

class FunctionCallEvent(TypedDict, total=False):
    name: str | None
    id: str | None
    args: dict[str, object] | None


class PartEvent(TypedDict, total=False):
    text: str
    thought: bool
    thoughtSignature: str | None
    functionCall: FunctionCallEvent


class ContentEvent(TypedDict, total=False):
    parts: list[PartEvent] | None


class CandidateEvent(TypedDict, total=False):
    content: ContentEvent | None
    finishReason: str | None


class UsageMetadataEvent(TypedDict, total=False):
    promptTokenCount: int | None
    candidatesTokenCount: int | None
    thoughtsTokenCount: int | None
    cachedContentTokenCount: int | None
    totalTokenCount: int | None


class GenerateContentResponse(TypedDict, total=False):
    """One event of the stream: a whole response (its first candidate's parts, the last one's
    finish reason and usage)."""

    candidates: list[CandidateEvent] | None
    usageMetadata: UsageMetadataEvent | None


def stream_response(data: object) -> GenerateContentResponse:
    """The reader of the stream: a decoded event as a `GenerateContentResponse`."""
    return cast(GenerateContentResponse, json_object(data))


class StreamReader:
    """Turns the stream's responses into builder calls: consecutive text parts of one kind
    (thinking or not) make one block, each function call a block of its own."""

    def __init__(self, out: AssistantBuilder) -> None:
        self.out = out
        self.calls = itertools.count()
        self.finished = False
        self.call_ids: set[str] = set()

    def chunk(self, event: object) -> None:
        """Apply one decoded event of the stream."""
        data = stream_response(event)
        candidates = data.get("candidates") or [{}]
        candidate = candidates[0]
        for part in (candidate.get("content") or {}).get("parts") or []:
            signature = part.get("thoughtSignature")
            if "text" in part:
                thinking = part.get("thought") is True
                key = self.out.run_delta("thinking" if thinking else "text", part["text"])
                if signature:
                    (self.out.set_thinking_signature if thinking
                     else self.out.set_text_signature)(key, signature)
            if "functionCall" in part:
                self.out.end_run()
                self._call(part["functionCall"], signature)
        reason = candidate.get("finishReason")
        if reason:
            stop = _STOP_REASONS.get(reason)
            if stop is None:
                raise ProviderError(f"Provider stopped with: {reason}")
            self.out.set_stop_reason(
                "toolUse" if stop == "stop" and self.out.has_tool_calls() else stop)
            self.finished = True
        usage = data.get("usageMetadata")
        if usage:
            cached = usage.get("cachedContentTokenCount") or 0
            self.out.set_usage(
                input=(usage.get("promptTokenCount") or 0) - cached,
                output=(usage.get("candidatesTokenCount") or 0)
                + (usage.get("thoughtsTokenCount") or 0),
                cache_read=cached, cache_write=0, total=usage.get("totalTokenCount") or 0)

    def _call(self, call: FunctionCallEvent, signature: str | None) -> None:
        name = call.get("name") or ""
        call_id = call.get("id")
        if not call_id or call_id in self.call_ids:
            call_id = f"{name}_{int(time.time() * 1000)}_{next(_call_counter)}"
        self.call_ids.add(call_id)
        key = ("call", next(self.calls))
        self.out.start_tool_call(key, call_id, name, signature)
        self.out.tool_call_delta(key, orjson.dumps(call.get("args") or {}).decode())
        self.out.end(key)

    def finish(self) -> None:
        self.out.end_run()
        if not self.finished:
            raise ProviderStreamError("Google stream ended without a finish reason")


async def stream_events(request: ProviderRequest, url: str, headers: dict[str, str],
                        out: AssistantBuilder) -> None:
    """POST the request body to `url` and read its stream into `out`."""
    reader = StreamReader(out)
    async with open_events(request, url, headers, build_body(request), out,
                           error_text=error_text) as events:
        async for _, data in events:
            reader.chunk(data)
    reader.finish()


async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
    """The Gemini API: the key in ``x-goog-api-key``."""
    model = request.model
    url = f"{model.base_url.rstrip('/')}/models/{model.id}:streamGenerateContent?alt=sse"
    headers = merge_headers({"x-goog-api-key": request.api_key}, request.headers)
    await stream_events(request, url, headers, out)
