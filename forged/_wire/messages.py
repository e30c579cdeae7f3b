"""Content blocks and messages: what a conversation is made of, in its file and on the wire."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .base import JSONObject, JSONValue, StopReason, Usage, keep_null, share_repr, tag

__all__ = [
    "AgentMessage",
    "AssistantContent",
    "AssistantMessage",
    "BashExecutionMessage",
    "BranchSummaryMessage",
    "CompactionSummaryMessage",
    "CustomMessage",
    "ImageContent",
    "TextContent",
    "ThinkingContent",
    "ToolCall",
    "ToolResult",
    "ToolResultMessage",
    "UserContent",
    "UserMessage",
    "text_of",
]

# --- content blocks ----------------------------------------------------------------------------


@attrs.define(kw_only=True, eq=False, repr=False)
class TextContent:
    type: str = tag("text")
    text: str
    text_signature: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class ThinkingContent:
    type: str = tag("thinking")
    thinking: str
    thinking_signature: str | None = None
    redacted: bool | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class ImageContent:
    type: str = tag("image")
    data: str
    mime_type: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolCall:
    type: str = tag("toolCall")
    id: str
    name: str
    arguments: JSONObject
    thought_signature: str | None = None
    """Gemini's signature of the reasoning behind the call, sent back with it."""


UserContent = TextContent | ImageContent
AssistantContent = TextContent | ThinkingContent | ToolCall


# --- messages ----------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class UserMessage:
    role: str = tag("user")
    content: list[UserContent]
    timestamp: int


@attrs.define(kw_only=True, eq=False, repr=False)
class AssistantMessage:
    role: str = tag("assistant")
    content: list[AssistantContent] = attrs.field(factory=list)
    api: str
    provider: str
    model: str
    usage: Usage = attrs.field(factory=Usage)
    stop_reason: StopReason = "stop"
    error_message: str | None = None
    timestamp: int


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolResultMessage:
    role: str = tag("toolResult")
    tool_call_id: str
    tool_name: str
    content: list[UserContent]
    details: JSONObject | None = None
    is_error: bool
    timestamp: int


@attrs.define(kw_only=True, eq=False, repr=False)
class BashExecutionMessage:
    role: str = tag("bashExecution")
    command: str
    output: str
    exit_code: int | None = keep_null(None)
    cancelled: bool
    truncated: bool
    full_output_path: str | None = keep_null(None)
    timestamp: int
    exclude_from_context: bool | None = None
    """Kept in the session, never shown to the model (``bash`` with ``excludeFromContext``)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class CustomMessage:
    """A message a plugin put in the context (stored as a ``custom_message`` entry)."""

    role: str = tag("custom")
    custom_type: str
    content: list[UserContent]
    display: bool = True
    details: JSONValue = None
    timestamp: int


@attrs.define(kw_only=True, eq=False, repr=False)
class CompactionSummaryMessage:
    """The context's first message after a compaction."""

    role: str = tag("compactionSummary")
    summary: str
    tokens_before: int
    timestamp: int


@attrs.define(kw_only=True, eq=False, repr=False)
class BranchSummaryMessage:
    """What an abandoned branch did, for the branch the conversation came back to."""

    role: str = tag("branchSummary")
    summary: str
    from_id: str
    timestamp: int


AgentMessage = (
    UserMessage | AssistantMessage | ToolResultMessage | BashExecutionMessage | CustomMessage
    | CompactionSummaryMessage | BranchSummaryMessage
)


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolResult:
    content: list[UserContent]
    details: JSONObject | None = None
    structured_content: JSONObject | None = None
    """The result as data, for programs (``bash``: output, exit code, ...)."""


def text_of(blocks: Sequence[object], separator: str = "\n") -> str:
    """The text blocks of `blocks` (a message's content), joined by `separator`."""
    return separator.join(block.text for block in blocks if isinstance(block, TextContent))


share_repr(globals())
