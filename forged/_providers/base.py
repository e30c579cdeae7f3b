"""The neutral stream every provider writes to, and the one place provider errors are mapped.

A provider is an async function ``stream(request, out)``: it sends `request` through its official
SDK and turns the provider's streaming format into calls on `out`, an `AssistantBuilder`. The
builder assembles the `AssistantMessage` and emits one ``message_update`` per call, so the agent
loop never knows which provider it talks to.

Error handling: a provider raises `ProviderError` (mapped from SDK and httpx errors by
`provider_errors`) or lets `trio.Cancelled` through on abort; either way the builder keeps the
partial content, and the loop finishes the message with ``stopReason`` ``error`` or ``aborted``.
"""

from __future__ import annotations

import gc
import importlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
)
from typing import Any

import attrs
import orjson
import trio

from .. import _wire as w
from .._errors import ProviderError, ProviderStatusError, ProviderStreamError

Emit = Callable[[w.Event], None]


@attrs.define(kw_only=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@attrs.define(kw_only=True)
class ProviderRequest:
    """Everything one model call needs; `messages` is the context as the model should see it."""

    model: w.Model
    system_prompt: str
    messages: list[w.AgentMessage]
    tools: list[ToolSpec]
    thinking_level: str
    api_key: str
    headers: dict[str, str]
    session_id: str
    idle_timeout_s: float = 120.0
    """How long the stream may send nothing before the attempt fails (a retryable error)."""
    max_tokens: int | None = None
    """The reply's token limit, when not the model's own (a summary's)."""


Provider = Callable[[ProviderRequest, "AssistantBuilder"], Awaitable[None]]


def now_ms() -> int:
    return int(time.time() * 1000)


def compute_cost(usage: w.Usage, cost: w.ModelCost) -> None:
    usage.cost.input = cost.input * usage.input / 1e6
    usage.cost.output = cost.output * usage.output / 1e6
    usage.cost.cache_read = cost.cache_read * usage.cache_read / 1e6
    usage.cost.cache_write = cost.cache_write * usage.cache_write / 1e6
    usage.cost.total = (
        usage.cost.input + usage.cost.output + usage.cost.cache_read + usage.cost.cache_write
    )


def parse_tool_arguments(text: str) -> dict[str, Any]:
    """Arguments of a finished tool call: the JSON object, or the best partial reading of it."""
    if not text.strip():
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        import jiter

        try:
            value = jiter.from_json(text.encode(), partial_mode="trailing-strings")
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


class _Block:
    __slots__ = ("index", "kind", "parts")

    def __init__(self, index: int, kind: str) -> None:
        self.index = index
        self.kind = kind
        self.parts: list[str] = []


class AssistantBuilder:
    """Assembles one assistant message from neutral stream calls and emits its events.

    Blocks are addressed by a provider-chosen `key` (a stream index, an item id); content indexes
    follow the order blocks were started in, as the protocol requires.
    """

    def __init__(self, model: w.Model, emit: Emit,
                 wait_for_room: Callable[[], Awaitable[None]] | None = None) -> None:
        self.message = w.AssistantMessage(
            api=model.api, provider=model.provider, model=model.id, timestamp=now_ms()
        )
        self._cost = model.cost
        self._emit = emit
        self._wait_for_room = wait_for_room
        self._open: dict[object, _Block] = {}

    async def wait_for_room(self) -> None:
        """Backpressure: wait while the client has not read what was already emitted."""
        if self._wait_for_room is not None:
            await self._wait_for_room()

    @property
    def usage(self) -> w.Usage:
        return self.message.usage

    def _update(self, event: w.AssistantMessageEvent) -> None:
        self._emit(w.MessageUpdate(usage=self.message.usage, assistant_message_event=event))

    def _start(self, key: object, kind: str, block: w.AssistantContent) -> int:
        if key in self._open:
            self._finish_block(key)
        index = len(self.message.content)
        self.message.content.append(block)
        self._open[key] = _Block(index, kind)
        return index

    def is_open(self, key: object) -> bool:
        return key in self._open

    # text
    def start_text(self, key: object, signature: str | None = None) -> None:
        index = self._start(key, "text", w.TextContent(text="", text_signature=signature))
        self._update(w.TextStart(content_index=index))

    def text_delta(self, key: object, delta: str) -> None:
        if not delta:
            return
        block = self._open.get(key) or self._open_implicit(key, "text")
        block.parts.append(delta)
        self._update(w.TextDelta(content_index=block.index, delta=delta))

    # thinking
    def start_thinking(self, key: object) -> None:
        index = self._start(key, "thinking", w.ThinkingContent(thinking=""))
        self._update(w.ThinkingStart(content_index=index))

    def thinking_delta(self, key: object, delta: str) -> None:
        if not delta:
            return
        block = self._open.get(key) or self._open_implicit(key, "thinking")
        block.parts.append(delta)
        self._update(w.ThinkingDelta(content_index=block.index, delta=delta))

    def set_thinking_signature(self, key: object, signature: str, *, append: bool = False) -> None:
        block = self._open.get(key)
        if block is None or block.kind != "thinking":
            return
        content = self.message.content[block.index]
        assert isinstance(content, w.ThinkingContent)
        content.thinking_signature = (
            (content.thinking_signature or "") + signature if append else signature
        )

    def redacted_thinking(self, key: object, data: str) -> None:
        index = self._start(key, "thinking", w.ThinkingContent(
            thinking="[Reasoning redacted]", thinking_signature=data, redacted=True))
        self._open[key].parts.append("[Reasoning redacted]")
        self._update(w.ThinkingStart(content_index=index))
        self.end(key)

    # tool calls
    def start_tool_call(self, key: object, call_id: str, name: str) -> None:
        index = self._start(key, "toolCall", w.ToolCall(id=call_id, name=name, arguments={}))
        self._update(w.ToolcallStart(content_index=index, id=call_id, tool_name=name))

    def tool_call_delta(self, key: object, delta: str) -> None:
        block = self._open.get(key)
        if block is None or not delta:
            return
        block.parts.append(delta)
        self._update(w.ToolcallDelta(content_index=block.index, delta=delta))

    def tool_call_id(self, key: object) -> str | None:
        block = self._open.get(key)
        if block is None:
            return None
        content = self.message.content[block.index]
        return content.id if isinstance(content, w.ToolCall) else None

    # any block
    def end(self, key: object) -> None:
        if key in self._open:
            self._finish_block(key, announce=True)

    def end_all(self) -> None:
        for key in list(self._open):
            self._finish_block(key, announce=True)

    def _open_implicit(self, key: object, kind: str) -> _Block:
        if kind == "text":
            self.start_text(key)
        else:
            self.start_thinking(key)
        return self._open[key]

    def _finish_block(self, key: object, *, announce: bool = False) -> None:
        block = self._open.pop(key)
        content = self.message.content[block.index]
        text = "".join(block.parts)
        if isinstance(content, w.TextContent):
            content.text = text
            if announce:
                self._update(w.TextEnd(content_index=block.index, content=text))
        elif isinstance(content, w.ThinkingContent):
            content.thinking = text
            if announce:
                self._update(w.ThinkingEnd(content_index=block.index, content=text))
        elif isinstance(content, w.ToolCall):
            content.arguments = parse_tool_arguments(text)
            if announce:
                self._update(w.ToolcallEnd(content_index=block.index, tool_call=content))

    def settle_partial(self) -> None:
        """Fold open blocks into the message without events (the stream broke or was aborted)."""
        for key in list(self._open):
            self._finish_block(key)

    # usage and stop
    def set_usage(self, *, input: int | None = None, output: int | None = None,
                  cache_read: int | None = None, cache_write: int | None = None,
                  total: int | None = None) -> None:
        usage = self.message.usage
        if input is not None:
            usage.input = input
        if output is not None:
            usage.output = output
        if cache_read is not None:
            usage.cache_read = cache_read
        if cache_write is not None:
            usage.cache_write = cache_write
        usage.total_tokens = (
            total if total is not None
            else usage.input + usage.output + usage.cache_read + usage.cache_write
        )
        compute_cost(usage, self._cost)

    def set_stop_reason(self, reason: w.StopReason) -> None:
        self.message.stop_reason = reason

    def has_tool_calls(self) -> bool:
        return any(isinstance(block, w.ToolCall) for block in self.message.content)


# --- SSE on bytes ------------------------------------------------------------------------------

class SseDecoder:
    """Server-sent events split on bytes: only LF (or CRLF) ends a line, never U+2028."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """The events completed by `chunk`, as (event name, data) pairs."""
        lines = (self._buffer + chunk if self._buffer else chunk).split(b"\n")
        self._buffer = lines.pop()
        events: list[tuple[bytes, bytes]] = []
        data = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    events.append((self._event, data[0] if len(data) == 1 else b"\n".join(data)))
                    data = self._data = []
                self._event = b""
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"event:"):
                self._event = line[6:].strip()
        return events


def _silent(seconds: float) -> ProviderStreamError:
    return ProviderStreamError(f"The provider sent nothing for {seconds:g} seconds")


_request_gate: trio.lowlevel.RunVar[trio.Lock] = trio.lowlevel.RunVar("forged_request_gate")


def _gate() -> trio.Lock:
    try:
        return _request_gate.get()
    except LookupError:
        gate = trio.Lock()
        _request_gate.set(gate)
        return gate


def _open_gate() -> None:
    gate = _gate()
    if gate.statistics().owner is trio.lowlevel.current_task():
        gate.release()


async def _request_built(_: object) -> None:
    """httpx's request hook: the SDK has built the request, the next may start building."""
    _open_gate()


@asynccontextmanager
async def answered(request: ProviderRequest,
                   opening: Callable[[], AbstractAsyncContextManager[Any]]
                   ) -> AsyncIterator[Any]:
    """The SDK's streaming response (`opening` makes its context manager), once the
    provider answers; one that sends nothing for `request.idle_timeout_s` fails as a silent
    stream does.

    The SDK builds a request (copies and encodes its whole body) in one step of the event
    loop, milliseconds long; requests are built one at a time, so when many sessions start
    at once the deltas of those already streaming are handled between the builds instead of
    after all of them. The gate opens as the request is handed to httpx (`_request_built`),
    before connecting and sending."""
    async with AsyncExitStack() as stack:
        with trio.move_on_after(request.idle_timeout_s) as waiting:
            await _gate().acquire()
            try:
                # Made only now: a request cancelled at the gate leaves no coroutine behind.
                response = await stack.enter_async_context(opening())
            finally:
                _open_gate()
        if waiting.cancelled_caught:
            raise _silent(request.idle_timeout_s)
        yield response


async def sse_events(chunks: AsyncIterator[bytes], out: AssistantBuilder,
                     idle_timeout_s: float) -> AsyncIterator[tuple[bytes, Any]]:
    """(event name, parsed JSON data) pairs; ``[DONE]`` ends the stream. A stream that
    sends nothing for `idle_timeout_s` fails with `ProviderStreamError`."""
    decoder = SseDecoder()
    received = aiter(chunks)
    while True:
        with trio.move_on_after(idle_timeout_s) as idle:
            chunk = await anext(received, None)
        if idle.cancelled_caught:
            raise _silent(idle_timeout_s)
        if chunk is None:
            return
        await out.wait_for_room()
        for event, data in decoder.feed(chunk):
            if data == b"[DONE]":
                return
            try:
                yield event, orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                raise ProviderStreamError(f"Malformed stream event: {exc}") from exc


# --- SDK loading and error mapping -------------------------------------------------------------

_sdk_lock = trio.Lock()
_loaded_sdks: dict[str, Any] = {}
"""SDK modules whose import has finished (``sys.modules`` holds one from its start: a
second session must not use it half-made)."""


async def load_sdk(name: str) -> Any:
    """Import an SDK module in a worker thread (it takes seconds), once per process."""
    if name in _loaded_sdks:
        return _loaded_sdks[name]
    async with _sdk_lock:
        if name in _loaded_sdks:
            return _loaded_sdks[name]
        # Abandoned on abort: the import finishes in its thread and the module stays cached.
        module = await trio.to_thread.run_sync(importlib.import_module, name,
                                               abandon_on_cancel=True)
        _loaded_sdks[name] = module
    # The SDK's thousands of long-lived objects leave the collector's view, so collections
    # while streaming stay short.
    gc.freeze()
    return module


_clients: trio.lowlevel.RunVar[dict[tuple[Any, ...], Any]] = trio.lowlevel.RunVar("forged_clients")
CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 600.0


async def sdk_client(sdk: str, request: ProviderRequest) -> Any:
    """The SDK client for a request's provider, one per base URL, key and headers in a trio
    run: connections and the TLS context (about 100 ms to build) are reused across turns.
    The SDK's own retries are off; forged decides what to retry."""
    module = await load_sdk(sdk)
    try:
        clients = _clients.get()
    except LookupError:
        clients = {}
        _clients.set(clients)
    key = (sdk, request.model.base_url, request.api_key, tuple(sorted(request.headers.items())))
    client = clients.get(key)
    if client is None:
        factory = module.AsyncAnthropic if sdk == "anthropic" else module.AsyncOpenAI
        client = clients[key] = factory(
            api_key=request.api_key, base_url=request.model.base_url, max_retries=0,
            timeout=module.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            default_headers=request.headers or None,
            http_client=module.DefaultAsyncHttpxClient(
                event_hooks={"request": [_request_built]}))
    return client


def _retry_after_s(headers: Any) -> float | None:
    if headers is None:
        return None
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return float(milliseconds) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        import email.utils  # rare, and slow to import at startup

        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def _status_error(exc: Any) -> ProviderStatusError:
    response = exc.response
    try:
        body = response.text
    except Exception:
        body = ""
    status = int(exc.status_code)
    message = f"{status} {body}".strip() if body else f"{status} {exc.message}"
    return ProviderStatusError(message, status=status,
                               retry_after_s=_retry_after_s(response.headers))


@contextmanager
def provider_errors() -> Iterator[None]:
    """Map SDK and HTTP client errors to `ProviderError`. The only place that knows them."""
    try:
        yield
    except ProviderError:
        raise
    except Exception as exc:
        for sdk in ("anthropic", "openai"):
            module = _loaded_sdks.get(sdk)
            if module is None:
                continue
            if isinstance(exc, module.APIStatusError):
                raise _status_error(exc) from exc
            if isinstance(exc, module.APIError):
                cause = exc.__cause__
                detail = f": {cause}" if cause is not None and str(cause) else ""
                raise ProviderStreamError(f"{exc.message}{detail}") from exc
        httpx2 = sys.modules.get("httpx2")
        if httpx2 is not None and isinstance(exc, httpx2.HTTPError):
            raise ProviderStreamError(str(exc) or type(exc).__name__) from exc
        if isinstance(exc, OSError | trio.BrokenResourceError):
            raise ProviderStreamError(f"Connection error: {exc}") from exc
        raise


# --- the context as a model sees it ------------------------------------------------------------

def bash_execution_text(message: w.BashExecutionMessage) -> str:
    text = f"Ran `{message.command}`\n```\n{message.output or '(no output)'}\n```"
    if message.cancelled:
        text += "\n\n(command cancelled)"
    elif message.exit_code not in (0, None):
        text += f"\n\nCommand exited with code {message.exit_code}"
    if message.truncated and message.full_output_path:
        text += f"\n\n[Output truncated. Full output: {message.full_output_path}]"
    return text


COMPACTION_SUMMARY_PREFIX = (
    "The conversation history before this point was compacted into the following summary:"
    "\n\n<summary>\n")
BRANCH_SUMMARY_PREFIX = (
    "The following is a summary of a branch that this conversation came back from:"
    "\n\n<summary>\n")


def as_user_message(message: w.AgentMessage) -> w.UserMessage:
    """A message that is neither the model's nor a tool's, as the user text a model reads."""
    match message:
        case w.UserMessage():
            return message
        case w.CustomMessage():
            return w.UserMessage(content=message.content, timestamp=message.timestamp)
        case w.BashExecutionMessage():
            text = bash_execution_text(message)
        case w.CompactionSummaryMessage():
            text = f"{COMPACTION_SUMMARY_PREFIX}{message.summary}\n</summary>"
        case w.BranchSummaryMessage():
            text = f"{BRANCH_SUMMARY_PREFIX}{message.summary}</summary>"
        case _:
            raise TypeError(f"not a user-side message: {message.role}")
    return w.UserMessage(content=[w.TextContent(text=text)], timestamp=message.timestamp)


LlmMessage = w.UserMessage | w.AssistantMessage | w.ToolResultMessage


def llm_messages(messages: list[w.AgentMessage], model: w.Model) -> list[LlmMessage]:
    """The context a provider sends: failed and aborted replies left out, bash runs as user
    text, thinking from another model as plain text, and every tool call answered."""
    out: list[LlmMessage] = []
    unanswered: dict[str, str] = {}

    def answer_missing() -> None:
        for call_id, name in unanswered.items():
            out.append(w.ToolResultMessage(
                tool_call_id=call_id, tool_name=name,
                content=[w.TextContent(text="No result provided")], is_error=True,
                timestamp=now_ms()))
        unanswered.clear()

    for message in messages:
        if isinstance(message, w.AssistantMessage):
            if message.stop_reason in ("error", "aborted"):
                continue
            answer_missing()
            same_model = message.provider == model.provider and message.model == model.id
            if not same_model:
                content: list[w.AssistantContent] = []
                for block in message.content:
                    if isinstance(block, w.ThinkingContent):
                        if block.thinking and not block.redacted:
                            content.append(w.TextContent(text=block.thinking))
                    else:
                        content.append(block)
                message = attrs.evolve(message, content=content)
            out.append(message)
            unanswered = {b.id: b.name for b in message.content if isinstance(b, w.ToolCall)}
        elif isinstance(message, w.ToolResultMessage):
            if message.tool_call_id in unanswered:
                del unanswered[message.tool_call_id]
                out.append(message)
        else:
            answer_missing()
            out.append(as_user_message(message))
    answer_missing()
    return out


def max_output_tokens(request: ProviderRequest) -> int:
    limit = min(request.model.max_tokens, 32000)
    return limit if request.max_tokens is None else min(request.max_tokens, limit)
