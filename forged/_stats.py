"""Token, cost and context accounting (docs/protocol.md, Statistics).

Totals cover the whole file, every branch: each assistant message's usage, usage a tool
reported on its result, and the usage stored on compaction and branch-summary entries. They
are counted once and then only for entries appended since, so asking again costs what is new.
The context estimate is the last valid assistant usage on the active branch plus about a
token per four characters of what came after it.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import orjson

from . import _wire as w
from ._store import SessionFile

IMAGE_TOKENS = 1_200
USAGE_KINDS = ("compaction", "branch_summary")


@attrs.define(eq=False, repr=False)
class UsageTotals:
    counted: int = 0
    """Entries of the file counted so far."""
    user: int = 0
    assistant: int = 0
    tool_calls: int = 0
    tool_results: int = 0
    messages: int = 0
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0

    def count(self, store: SessionFile) -> None:
        """Add the entries appended since the last count."""
        for position in range(self.counted, len(store)):
            kind = store.kind(position)
            if kind == "message":
                message = store.entry(position).get("message")
                if isinstance(message, dict):
                    self._count_message(message)
            elif kind in USAGE_KINDS:
                self._add_usage(store.entry(position).get("usage"))
        self.counted = len(store)

    def _count_message(self, message: dict[str, Any]) -> None:
        self.messages += 1
        role = message.get("role")
        if role == "user":
            self.user += 1
        elif role == "assistant":
            self.assistant += 1
            content = message.get("content")
            if isinstance(content, list):
                self.tool_calls += sum(isinstance(block, dict) and block.get("type") == "toolCall"
                                       for block in content)
            self._add_usage(message.get("usage"))
        elif role == "toolResult":
            self.tool_results += 1
            self._add_usage(message.get("usage"))

    def _add_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.input += _number(usage.get("input"))
        self.output += _number(usage.get("output"))
        self.cache_read += _number(usage.get("cacheRead"))
        self.cache_write += _number(usage.get("cacheWrite"))
        cost = usage.get("cost")
        if isinstance(cost, dict):
            self.cost += float(_number(cost.get("total"), float))


def _number(value: Any, kind: type[Any] = int) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return kind(value)
    return kind(0)


def usage_tokens(usage: w.Usage) -> int:
    return usage.total_tokens or (usage.input + usage.output + usage.cache_read
                                  + usage.cache_write)


def _content_chars(content: list[w.UserContent]) -> tuple[int, int]:
    text = sum(len(block.text) for block in content if isinstance(block, w.TextContent))
    return text, sum(isinstance(block, w.ImageContent) for block in content)


def estimate_tokens(message: w.AgentMessage) -> int:
    """About a token per four characters; an image counts `IMAGE_TOKENS`."""
    images = 0
    match message:
        case w.UserMessage() | w.ToolResultMessage() | w.CustomMessage():
            chars, images = _content_chars(message.content)
        case w.AssistantMessage():
            chars = 0
            for block in message.content:
                if isinstance(block, w.TextContent):
                    chars += len(block.text)
                elif isinstance(block, w.ThinkingContent):
                    chars += len(block.thinking)
                else:
                    chars += len(block.name) + len(orjson.dumps(block.arguments))
        case w.BashExecutionMessage():
            chars = len(message.command) + len(message.output)
        case w.CompactionSummaryMessage() | w.BranchSummaryMessage():
            chars = len(message.summary)
    return math.ceil(chars / 4) + images * IMAGE_TOKENS


def estimate_context_tokens(messages: list[w.AgentMessage]
                            ) -> tuple[int, w.AssistantMessage | None]:
    """The context's size in tokens: the usage the last valid reply reported (returned as
    the anchor) plus an estimate of what came after it; all estimated when no reply has
    usage (anchor None)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, w.AssistantMessage) and message.stop_reason not in (
                "aborted", "error"):
            return usage_tokens(message.usage) + sum(
                estimate_tokens(later) for later in messages[index + 1:]), message
    return sum(estimate_tokens(message) for message in messages), None


def compacted_at(messages: list[w.AgentMessage]) -> int | None:
    """When the context's latest compaction was made (ms), if it has one."""
    if messages and isinstance(messages[0], w.CompactionSummaryMessage):
        return messages[0].timestamp
    return None


def context_tokens(messages: list[w.AgentMessage]) -> int | None:
    """The context's size in tokens, or None right after a compaction (until a reply from
    after it reports usage)."""
    tokens, anchor = estimate_context_tokens(messages)
    compacted = compacted_at(messages)
    if compacted is not None and (anchor is None or anchor.timestamp <= compacted):
        return None
    return tokens


def session_stats(store: SessionFile, totals: UsageTotals, messages: list[w.AgentMessage],
                  model: w.Model | None) -> w.SessionStats:
    context = None
    if model is not None and model.context_window:
        tokens = context_tokens(messages)
        context = w.ContextUsage(
            tokens=tokens, context_window=model.context_window,
            percent=None if tokens is None else tokens / model.context_window * 100)
    return w.SessionStats(
        session_file=str(store.path) if store.path else None,
        session_id=store.session_id,
        user_messages=totals.user, assistant_messages=totals.assistant,
        tool_calls=totals.tool_calls, tool_results=totals.tool_results,
        total_messages=totals.messages,
        tokens=w.TokenTotals(input=totals.input, output=totals.output,
                             cache_read=totals.cache_read, cache_write=totals.cache_write,
                             total=totals.input + totals.output + totals.cache_read
                             + totals.cache_write),
        cost=totals.cost, context_usage=context)
