"""The neutral stream every provider writes to, and the context as a model sees it.

A provider is an async function ``stream(request, out)``: it sends `request` over HTTP in its
wire API's format (`forged._providers.http`) and turns the streamed answer into calls on `out`,
an `AssistantBuilder`. The builder assembles the `AssistantMessage` and emits one
``message_update`` per call, so the agent loop never knows which provider it talks to.

Error handling: a provider raises `ProviderError` (HTTP and network errors are mapped in
`forged._providers.http.provider_errors`) or lets `trio.Cancelled` through on abort; either way
the builder keeps the partial content, and the loop finishes the message with ``stopReason``
``error`` or ``aborted``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Literal, TypeAlias

import attrs
import orjson
import trio

from .. import _wire as w
from .._time import now_ms

Emit = Callable[["w.Event"], None]


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, object]
    """The tool's JSON schema, sent as it is."""


@attrs.define(kw_only=True, eq=False, repr=False)
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


def compute_cost(usage: w.Usage, cost: w.ModelCost) -> None:
    usage.cost.input = cost.input * usage.input / 1e6
    usage.cost.output = cost.output * usage.output / 1e6
    usage.cost.cache_read = cost.cache_read * usage.cache_read / 1e6
    usage.cost.cache_write = cost.cache_write * usage.cache_write / 1e6
    usage.cost.total = (
        usage.cost.input + usage.cost.output + usage.cost.cache_read + usage.cost.cache_write
    )


def parse_tool_arguments(text: str) -> dict[str, object]:
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
        self._run: tuple[str, object] | None = None
        """The kind and key of the block `run_delta` appends to."""

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

    def set_text_signature(self, key: object, signature: str) -> None:
        block = self._open.get(key)
        if block is not None and block.kind == "text":
            content = self.message.content[block.index]
            assert isinstance(content, w.TextContent)
            content.text_signature = signature

    def set_thinking_signature(self, key: object, signature: str, *, append: bool = False) -> None:
        block = self._open.get(key)
        if block is None or block.kind != "thinking":
            return
        content = self.message.content[block.index]
        assert isinstance(content, w.ThinkingContent)
        content.thinking_signature = (
            (content.thinking_signature or "") + signature if append else signature
        )

    def redact(self, key: object, data: str) -> None:
        """Mark the open thinking block `key` as redacted, `data` its opaque payload."""
        block = self._open.get(key)
        if block is not None and block.kind == "thinking":
            content = self.message.content[block.index]
            assert isinstance(content, w.ThinkingContent)
            content.redacted, content.thinking_signature = True, data

    def redacted_thinking(self, key: object, data: str) -> None:
        index = self._start(key, "thinking", w.ThinkingContent(
            thinking="[Reasoning redacted]", thinking_signature=data, redacted=True))
        self._open[key].parts.append("[Reasoning redacted]")
        self._update(w.ThinkingStart(content_index=index))
        self.end(key)

    # tool calls
    def start_tool_call(self, key: object, call_id: str, name: str,
                        thought_signature: str | None = None) -> None:
        index = self._start(key, "toolCall", w.ToolCall(id=call_id, name=name, arguments={},
                                                        thought_signature=thought_signature))
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

    # streams with one text or thinking block open at a time
    def run_delta(self, kind: Literal["text", "thinking"], delta: str) -> object:
        """Append `delta` to the open block of its `kind`: a stream that sends text and
        thinking without block boundaries (Gemini's, Mistral's) starts a block when the kind
        changes, ending the other. The block's key, for its signature."""
        if self._run is None or self._run[0] != kind:
            self.end_run()
            self._run = (kind, ("run", len(self.message.content)))
            (self.start_text if kind == "text" else self.start_thinking)(self._run[1])
        key = self._run[1]
        (self.text_delta if kind == "text" else self.thinking_delta)(key, delta)
        return key

    def end_run(self) -> None:
        """End the block `run_delta` appends to (before a tool call, and at the end)."""
        if self._run is not None:
            self.end(self._run[1])
            self._run = None

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


LlmMessage: TypeAlias = "w.UserMessage | w.AssistantMessage | w.ToolResultMessage"


def llm_messages(messages: list[w.AgentMessage], model: w.Model) -> list[LlmMessage]:
    """The context a provider sends: failed and aborted replies left out, bash runs as user
    text (unless excluded from the context), thinking from another model as plain text, and
    every tool call answered."""
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
        elif not (isinstance(message, w.BashExecutionMessage) and message.exclude_from_context):
            answer_missing()
            out.append(as_user_message(message))
    answer_missing()
    return out


def max_output_tokens(request: ProviderRequest) -> int:
    limit = min(request.model.max_tokens, 32000)
    return limit if request.max_tokens is None else min(request.max_tokens, limit)


# --- replies streaming in ------------------------------------------------------------------

_replies = 0
"""How many replies' bodies are streaming in now (`streaming`)."""
_replies_ended: trio.Event | None = None
"""Set as the last of them ends, for `wait_replies_ended`."""


@contextlib.contextmanager
def reply_streaming() -> Iterator[None]:
    """Held while a reply's body streams in (`http.open_body`)."""
    global _replies, _replies_ended
    _replies += 1
    try:
        yield
    finally:
        _replies -= 1
        if not _replies and _replies_ended is not None:
            _replies_ended.set()
            _replies_ended = None


def streaming() -> bool:
    """Whether a model's reply is streaming in now, in this process: what can wait for it
    to end (`forged._config.warm_up`) does (`wait_replies_ended`)."""
    return _replies > 0


async def wait_replies_ended() -> None:
    """Return once no reply is streaming in."""
    global _replies_ended
    while _replies:
        if _replies_ended is None:
            _replies_ended = trio.Event()
        await _replies_ended.wait()
