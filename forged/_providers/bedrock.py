"""Amazon Bedrock (``bedrock-converse-stream``): the Converse API's stream, ``POST
{endpoint}/model/{modelId}/converse-stream``, answered in AWS's binary event-stream framing.

Signing: a Bedrock API key (``AWS_BEARER_TOKEN_BEDROCK``, auth.json, models.json) goes as a
bearer token; otherwise the request is signed with SigV4 by botocore, whose credential chain
finds the keys (the environment, ``AWS_PROFILE`` and the config files, SSO's cache, a container
or instance role). botocore loads only for a Bedrock model, and finds credentials in a worker
thread, as they may take a network round trip. ``AWS_BEDROCK_SKIP_AUTH=1`` signs with dummy
keys, for a proxy that needs none.

The region is the one in an inference profile's ARN, else ``AWS_REGION`` or
``AWS_DEFAULT_REGION``, else the model's endpoint's, else the profile's, else us-east-1. The
endpoint is the region's ``bedrock-runtime`` host, or the model's ``baseUrl`` when that is
not a standard Bedrock host (a VPC endpoint, a proxy).

The body maps as the ancestor maps it: tool results of one turn in one user message, images
as bytes (base64 in JSON), thinking as ``reasoningContent`` (its signature only for Claude),
a cache point after the system prompt and the last user message for Claude models that cache,
and thinking asked through ``additionalModelRequestFields`` (Claude's ``thinking``, GPT's
reasoning effort).
"""

from __future__ import annotations

import base64
import os
import re
import struct
import threading
import zlib
from contextlib import aclosing
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict, cast
from urllib.parse import quote, urlsplit

import orjson
import trio

from .. import _wire as w
from .._errors import ProviderError, ProviderStreamError
from .base import AssistantBuilder, LlmMessage, ProviderRequest, llm_messages, max_output_tokens
from .http import merge_headers, open_body
from .sse import json_object, timed_chunks

if TYPE_CHECKING:
    import botocore.session

EMPTY_TEXT = "<empty>"
REDACTED = "[Reasoning redacted]"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_STANDARD_HOST = re.compile(r"^bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
_ARN_REGION = re.compile(r"^arn:aws(?:-[a-z0-9-]+)?:bedrock:([a-z0-9-]+):")
_BAD_ID = re.compile(r"[^a-zA-Z0-9_-]")
_STOP_REASONS: dict[str, w.StopReason] = {
    "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
    "model_context_window_exceeded": "length", "tool_use": "toolUse"}
_ERRORS = {"internalServerException": "Internal server error",
           "modelStreamErrorException": "Model stream error",
           "validationException": "Validation error", "throttlingException": "Throttling error",
           "serviceUnavailableException": "Service unavailable"}
_RETRYABLE = {"internalServerException", "modelStreamErrorException", "throttlingException",
              "serviceUnavailableException"}
_IMAGE_FORMATS = {"image/jpeg": "jpeg", "image/jpg": "jpeg", "image/png": "png",
                  "image/gif": "gif", "image/webp": "webp"}
_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384, "xhigh": 16384,
            "max": 16384}
_GPT_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high",
               "xhigh": "xhigh", "max": "max"}
_GPT_OSS_EFFORT = {**_GPT_EFFORT, "xhigh": "high", "max": "high"}


# --- the model --------------------------------------------------------------------------------

def _names(model: w.Model) -> list[str]:
    return [form for value in (model.id, model.name) for form in (
        value.lower(), re.sub(r"[\s_.:]+", "-", value.lower()))]


def is_claude(model: w.Model) -> bool:
    return any("anthropic.claude" in n or "anthropic/claude" in n for n in _names(model)) or (
        "claude" in model.name.lower())


def adaptive(model: w.Model) -> bool:
    return any(tag in n for n in _names(model) for tag in (
        "opus-4-6", "opus-4-7", "opus-4-8", "opus-5", "sonnet-4-6", "sonnet-5", "haiku-5",
        "fable-5"))


def caches(model: w.Model) -> bool:
    names = _names(model)
    if not any("claude" in n for n in names):
        return os.environ.get("AWS_BEDROCK_FORCE_CACHE") == "1"
    return any(tag in n for n in names for tag in (
        "fable-5", "opus-5", "sonnet-5", "haiku-5", "-4-", "claude-3-7-sonnet",
        "claude-3-5-haiku"))


# --- the request: what forged sends ------------------------------------------------------------

class ImageSourceParam(TypedDict):
    bytes: str
    """The image's base64 (a blob, in JSON)."""


class ImageParam(TypedDict):
    format: str
    source: ImageSourceParam


class ToolUseParam(TypedDict):
    toolUseId: str
    name: str
    input: dict[str, object]


class ReasoningTextParam(TypedDict):
    text: str
    signature: NotRequired[str]


class ReasoningContentParam(TypedDict, total=False):
    reasoningText: ReasoningTextParam
    redactedContent: str


class ToolResultParam(TypedDict):
    toolUseId: str
    content: list[ContentBlockParam]
    status: Literal["error", "success"]


class CachePointParam(TypedDict):
    type: Literal["default"]


class ContentBlockParam(TypedDict, total=False):
    """One block of a message, as Converse's ``ContentBlock``: each has one of these."""

    text: str
    image: ImageParam
    toolUse: ToolUseParam
    toolResult: ToolResultParam
    reasoningContent: ReasoningContentParam
    cachePoint: CachePointParam


class MessageParam(TypedDict):
    role: Literal["user", "assistant"]
    content: list[ContentBlockParam]


class SystemBlockParam(TypedDict, total=False):
    text: str
    cachePoint: CachePointParam


class InputSchemaParam(TypedDict):
    json: dict[str, object]


class ToolSpecParam(TypedDict):
    name: str
    description: str
    inputSchema: InputSchemaParam


class ToolParam(TypedDict):
    toolSpec: ToolSpecParam


class ToolConfigParam(TypedDict):
    tools: list[ToolParam]


class InferenceConfigParam(TypedDict):
    maxTokens: int


class ClaudeThinkingParam(TypedDict):
    type: Literal["adaptive", "enabled"]
    budget_tokens: NotRequired[int]
    display: Literal["summarized"]


class EffortParam(TypedDict):
    effort: str


class ModelFieldsParam(TypedDict, total=False):
    """``additionalModelRequestFields``: how the model is asked to think, in its own words."""

    thinking: ClaudeThinkingParam
    output_config: EffortParam
    anthropic_beta: list[str]
    reasoning_effort: str
    reasoning: EffortParam


class ConverseBody(TypedDict):
    """A ConverseStream request's body, its keys in the order they are sent."""

    messages: list[MessageParam]
    inferenceConfig: InferenceConfigParam
    system: NotRequired[list[SystemBlockParam]]
    toolConfig: NotRequired[ToolConfigParam]
    additionalModelRequestFields: NotRequired[ModelFieldsParam]


def thinking_fields(model: w.Model, level: str) -> ModelFieldsParam | None:
    if level == "off" or not model.reasoning:
        return None
    if is_claude(model):
        if adaptive(model):
            native_xhigh = any(tag in n for n in _names(model) for tag in (
                "opus-4-7", "opus-4-8", "opus-5", "sonnet-5", "haiku-5", "fable-5"))
            mapped = (model.thinking_level_map or {}).get(level)
            effort = ("xhigh" if level == "xhigh" and native_xhigh else mapped
                      if isinstance(mapped, str) else {"minimal": "low", "low": "low",
                                                       "medium": "medium"}.get(level, "high"))
            return {"thinking": {"type": "adaptive", "display": "summarized"},
                    "output_config": {"effort": effort}}
        return {"thinking": {"type": "enabled", "budget_tokens": _BUDGETS[level],
                             "display": "summarized"},
                "anthropic_beta": ["interleaved-thinking-2025-05-14"]}
    names = _names(model)
    if any("gpt-oss" in n for n in names):
        return {"reasoning_effort": _GPT_OSS_EFFORT[level]}
    if any("gpt-" in n for n in names):
        mapped = (model.thinking_level_map or {}).get(level)
        return {"reasoning": {"effort": mapped if isinstance(mapped, str)
                              else _GPT_EFFORT[level]}}
    return None


# --- the request body -------------------------------------------------------------------------

def _text(text: str) -> ContentBlockParam | None:
    return {"text": text} if text.strip() else None


def _image(block: w.ImageContent) -> ContentBlockParam:
    image_format = _IMAGE_FORMATS.get(block.mime_type)
    if image_format is None:
        raise ProviderError(f"Bedrock takes no {block.mime_type} images")
    return {"image": {"format": image_format, "source": {"bytes": block.data}}}


def _call_id(call_id: str) -> str:
    return _BAD_ID.sub("_", call_id)[:64]


def convert_messages(messages: list[LlmMessage], model: w.Model) -> list[MessageParam]:
    out: list[MessageParam] = []
    claude = is_claude(model)
    for message in messages:
        if isinstance(message, w.UserMessage):
            content = [part for block in message.content for part in (
                [_text(block.text)] if isinstance(block, w.TextContent) else [_image(block)])
                if part is not None]
            out.append({"role": "user", "content": content or [{"text": EMPTY_TEXT}]})
        elif isinstance(message, w.AssistantMessage):
            blocks: list[ContentBlockParam] = []
            for block in message.content:
                if isinstance(block, w.TextContent):
                    if (text := _text(block.text)) is not None:
                        blocks.append(text)
                elif isinstance(block, w.ToolCall):
                    blocks.append({"toolUse": {"toolUseId": _call_id(block.id),
                                               "name": block.name, "input": block.arguments}})
                elif block.redacted:
                    if block.thinking_signature:
                        blocks.append({"reasoningContent": {
                            "redactedContent": block.thinking_signature}})
                elif block.thinking.strip():
                    if not claude:
                        blocks.append({"reasoningContent": {
                            "reasoningText": {"text": block.thinking}}})
                    elif block.thinking_signature:
                        blocks.append({"reasoningContent": {"reasoningText": {
                            "text": block.thinking, "signature": block.thinking_signature}}})
                    else:
                        blocks.append({"text": block.thinking})
            if blocks:
                out.append({"role": "assistant", "content": blocks})
        else:
            result: ContentBlockParam = {"toolResult": {
                "toolUseId": _call_id(message.tool_call_id),
                "content": [part for block in message.content for part in (
                    [_text(block.text)] if isinstance(block, w.TextContent)
                    else [_image(block)]) if part is not None] or [{"text": EMPTY_TEXT}],
                "status": "error" if message.is_error else "success"}}
            previous = out[-1] if out else None
            if (previous is not None and previous["role"] == "user"
                    and "toolResult" in previous["content"][-1]):
                previous["content"].append(result)
            else:
                out.append({"role": "user", "content": [result]})
    if caches(model) and out and out[-1]["role"] == "user":
        out[-1]["content"].append({"cachePoint": {"type": "default"}})
    return out


def build_body(request: ProviderRequest) -> ConverseBody:
    model = request.model
    body: ConverseBody = {
        "messages": convert_messages(llm_messages(request.messages, model), model),
        "inferenceConfig": {"maxTokens": max_output_tokens(request)}}
    if request.system_prompt:
        body["system"] = [{"text": request.system_prompt}]
        if caches(model):
            body["system"].append({"cachePoint": {"type": "default"}})
    if request.tools:
        body["toolConfig"] = {"tools": [{"toolSpec": {
            "name": tool.name, "description": tool.description,
            "inputSchema": {"json": tool.parameters}}} for tool in request.tools]}
    fields = thinking_fields(model, request.thinking_level)
    if fields is not None:
        body["additionalModelRequestFields"] = fields
    return body


# --- where and how to send it -----------------------------------------------------------------

def region_and_endpoint(model: w.Model) -> tuple[str, str]:
    """The region to sign for and the endpoint to send to."""
    host = urlsplit(model.base_url).hostname or ""
    standard = _STANDARD_HOST.match(host.lower())
    arn = _ARN_REGION.match(model.id)
    configured = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    region = (arn[1] if arn else configured or (standard[1] if standard else None)
              or _profile_region() or "us-east-1")
    if model.base_url and not standard:
        return region, model.base_url.rstrip("/")
    return region, f"https://bedrock-runtime.{region}.amazonaws.com"


def _profile_region() -> str | None:
    if not os.environ.get("AWS_PROFILE"):
        return None
    region = _session().get_config_variable("region")
    return str(region) if region else None


_lock = threading.Lock()
_sessions: dict[tuple[str | None, ...], botocore.session.Session] = {}


def _session() -> botocore.session.Session:
    """botocore's session (its credential chain, which keeps what it found, and its config)
    for the profile and files the environment names now."""
    import botocore.session

    key = tuple(os.environ.get(name) for name in (
        "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "HOME"))
    with _lock:
        if key not in _sessions:
            _sessions[key] = botocore.session.Session()
        return _sessions[key]


def signed_headers(url: str, content: bytes, region: str, headers: dict[str, str]
                   ) -> dict[str, str]:
    """`headers` with a SigV4 signature of the request; run in a worker thread (finding the
    credentials may ask the network)."""
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
    import botocore.exceptions

    if os.environ.get("AWS_BEDROCK_SKIP_AUTH") == "1":
        credentials = botocore.credentials.Credentials("dummy-access-key", "dummy-secret-key")
    else:
        try:
            credentials = _session().get_credentials()
        except botocore.exceptions.BotoCoreError as exc:
            raise ProviderError(f"Bedrock sign-in failed: {exc}") from exc
        if credentials is None:
            raise ProviderError("No AWS credentials for Bedrock: set AWS_PROFILE, or "
                                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                                "AWS_BEARER_TOKEN_BEDROCK")
    request = botocore.awsrequest.AWSRequest(method="POST", url=url, data=content,
                                             headers=headers)
    botocore.auth.SigV4Auth(credentials.get_frozen_credentials(), "bedrock",
                            region).add_auth(request)
    return dict(request.headers.items())


async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
    model = request.model
    region, endpoint = await trio.to_thread.run_sync(region_and_endpoint, model)
    url = f"{endpoint}/model/{quote(model.id, safe='')}/converse-stream"
    content = orjson.dumps(build_body(request))
    headers = merge_headers({"content-type": "application/json",
                             "accept": "application/vnd.amazon.eventstream"}, request.headers)
    key = "" if request.api_key.startswith("<") else request.api_key  # <authenticated>: AWS's
    token = key or os.environ.get("AWS_BEARER_TOKEN_BEDROCK", "")
    if token and os.environ.get("AWS_BEDROCK_SKIP_AUTH") != "1":
        headers["authorization"] = f"Bearer {token}"
    else:
        headers.pop("authorization", None)
        headers = await trio.to_thread.run_sync(signed_headers, url, content, region, headers,
                                                abandon_on_cancel=True)
    reader = StreamReader(out)
    async with open_body(request, url, headers, content, error_text=error_text) as chunks, \
            aclosing(timed_chunks(chunks, out, request.idle_timeout_s)) as timed:
        decoder = EventStreamDecoder()
        async for chunk in timed:
            for message_headers, payload in decoder.feed(chunk):
                reader.message(message_headers, payload)
    reader.finish()


def error_text(body: object) -> str | None:
    if isinstance(body, dict):
        for key in ("message", "Message"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return None


# --- the answer -------------------------------------------------------------------------------

class EventStreamDecoder:
    """AWS's event-stream framing: each message a 12-byte prelude (total and header lengths,
    their CRC-32), headers, a payload and the whole message's CRC-32."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[dict[str, HeaderValue], bytes]]:
        self._buffer += data
        messages: list[tuple[dict[str, HeaderValue], bytes]] = []
        while len(self._buffer) >= 12:
            total, header_bytes, prelude_crc = struct.unpack(">III", self._buffer[:12])
            if zlib.crc32(self._buffer[:8]) != prelude_crc or not 16 <= total <= MAX_MESSAGE_BYTES:
                raise ProviderStreamError("A corrupt Bedrock stream message")
            if len(self._buffer) < total:
                break
            message = bytes(self._buffer[:total])
            del self._buffer[:total]
            if zlib.crc32(message[:-4]) != struct.unpack(">I", message[-4:])[0]:
                raise ProviderStreamError("A corrupt Bedrock stream message")
            messages.append((parse_headers(message[12:12 + header_bytes]),
                             message[12 + header_bytes:-4]))
        return messages


_FIXED = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}
HeaderValue = bool | int | bytes | str
"""A header's value, by its type: true or false, an integer (a timestamp's milliseconds), bytes
(a UUID's too), a string."""


def parse_headers(data: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    at = 0
    while at < len(data):
        size = data[at]
        name = data[at + 1:at + 1 + size].decode()
        kind = data[at + 1 + size]
        at += 2 + size
        value: HeaderValue
        if kind in (0, 1):
            value = kind == 0
        elif kind in _FIXED:
            width = struct.calcsize(_FIXED[kind])
            value = struct.unpack(_FIXED[kind], data[at:at + width])[0]
            at += width
        elif kind in (6, 7):
            length = struct.unpack(">H", data[at:at + 2])[0]
            raw = data[at + 2:at + 2 + length]
            value = raw.decode() if kind == 7 else raw
            at += 2 + length
        elif kind == 9:
            value, at = data[at:at + 16], at + 16
        else:
            raise ProviderStreamError(f"A Bedrock stream header of unknown type {kind}")
        headers[name] = value
    return headers


class ToolUseStartEvent(TypedDict, total=False):
    toolUseId: str | None
    name: str | None


class BlockStartEvent(TypedDict, total=False):
    toolUse: ToolUseStartEvent | None


class ToolUseDeltaEvent(TypedDict, total=False):
    input: str | None


class ReasoningDeltaEvent(TypedDict, total=False):
    text: str | None
    signature: str | None
    redactedContent: str | None
    """Base64."""


class BlockDeltaEvent(TypedDict, total=False):
    text: str
    toolUse: ToolUseDeltaEvent
    reasoningContent: ReasoningDeltaEvent


class UsageEvent(TypedDict, total=False):
    inputTokens: int | None
    outputTokens: int | None
    cacheReadInputTokens: int | None
    cacheWriteInputTokens: int | None
    totalTokens: int | None


class ConverseEvent(TypedDict, total=False):
    """One event's JSON payload, all its kinds' fields (``contentBlockDelta``:
    ``contentBlockIndex`` and ``delta``; ``messageStop``: ``stopReason``; ...)."""

    contentBlockIndex: int
    start: BlockStartEvent | None
    delta: BlockDeltaEvent | None
    stopReason: object
    usage: UsageEvent | None


def converse_event(data: object) -> ConverseEvent:
    """The reader of the stream: an event's decoded payload as a `ConverseEvent`."""
    return cast(ConverseEvent, json_object(data))


class StreamReader:
    """Converse's events into builder calls, blocks keyed by ``contentBlockIndex``."""

    def __init__(self, out: AssistantBuilder) -> None:
        self.out = out
        self.redacted: dict[int, list[bytes]] = {}
        self.stopped = False

    def message(self, headers: dict[str, HeaderValue], payload: bytes) -> None:
        kind = headers.get(":message-type")
        data: object = orjson.loads(payload) if payload else {}
        if kind == "exception":
            name = str(headers.get(":exception-type", "exception"))
            text = f"{_ERRORS.get(name, name)}: {error_text(data) or payload.decode()}"
            raise (ProviderStreamError if name in _RETRYABLE else ProviderError)(text)
        if kind == "error":
            code, message = headers.get(":error-code"), headers.get(":error-message")
            raise ProviderError(f"{code!s}: {message!s}")
        handle = getattr(self, "_" + str(headers.get(":event-type")), None)
        if handle is not None:  # (``messageStart`` and events forged does not know: nothing)
            handle(converse_event(data))

    def _contentBlockStart(self, data: ConverseEvent) -> None:
        use = (data.get("start") or {}).get("toolUse")
        if use:
            self.out.start_tool_call(data["contentBlockIndex"], use.get("toolUseId") or "",
                                     use.get("name") or "")

    def _contentBlockDelta(self, data: ConverseEvent) -> None:
        index, delta = data["contentBlockIndex"], data.get("delta") or {}
        if "text" in delta:
            if not self.out.is_open(index):
                self.out.start_text(index)
            self.out.text_delta(index, delta["text"])
        elif "toolUse" in delta:
            self.out.tool_call_delta(index, delta["toolUse"].get("input") or "")
        elif "reasoningContent" in delta:
            reasoning = delta["reasoningContent"]
            if not self.out.is_open(index):
                self.out.start_thinking(index)
            redacted, text, signature = (reasoning.get("redactedContent"), reasoning.get("text"),
                                         reasoning.get("signature"))
            if redacted:
                if index not in self.redacted:
                    self.redacted[index] = []
                    self.out.thinking_delta(index, REDACTED)
                self.redacted[index].append(base64.b64decode(redacted))
            elif index not in self.redacted:
                if text:
                    self.out.thinking_delta(index, text)
                if signature:
                    self.out.set_thinking_signature(index, signature, append=True)

    def _contentBlockStop(self, data: ConverseEvent) -> None:
        index = data["contentBlockIndex"]
        if index in self.redacted:
            self.out.redact(index, base64.b64encode(b"".join(self.redacted.pop(index))).decode())
        self.out.end(index)

    def _messageStop(self, data: ConverseEvent) -> None:
        reason = str(data.get("stopReason"))
        stop = _STOP_REASONS.get(reason)
        if stop is None:
            raise ProviderError(f"Provider stopped with: {reason}")
        self.out.set_stop_reason(stop)
        self.stopped = True

    def _metadata(self, data: ConverseEvent) -> None:
        usage = data.get("usage") or {}
        if usage:
            self.out.set_usage(input=usage.get("inputTokens") or 0,
                               output=usage.get("outputTokens") or 0,
                               cache_read=usage.get("cacheReadInputTokens") or 0,
                               cache_write=usage.get("cacheWriteInputTokens") or 0,
                               total=usage.get("totalTokens") or None)

    def finish(self) -> None:
        self.out.end_all()
        if not self.stopped:
            raise ProviderStreamError("Bedrock stream ended without a stop reason")
