"""The events forged streams: a run's, the assistant message's (inside ``message_update``),
the queues', compaction's, retries', dialogs'."""

from __future__ import annotations

from typing import Literal, get_args

import attrs

from .base import JSONObject, Usage, keep_null, share_repr, tag
from .messages import AgentMessage, ToolCall, ToolResult, ToolResultMessage

__all__ = [
    "EVENT_TYPES",
    "AgentEnd",
    "AgentSettled",
    "AgentStart",
    "AssistantMessageEvent",
    "AutoRetryEnd",
    "AutoRetryStart",
    "BashExecutionUpdate",
    "CompactionEnd",
    "CompactionResult",
    "CompactionStart",
    "Event",
    "ExtensionUiRequest",
    "ExtensionUiResolved",
    "MessageEnd",
    "MessageStart",
    "MessageUpdate",
    "ModelChanged",
    "PermissionModeChanged",
    "QueueUpdate",
    "SessionInfoChanged",
    "SummarizationRetryAttemptStart",
    "SummarizationRetryFinished",
    "SummarizationRetryScheduled",
    "TextDelta",
    "TextEnd",
    "TextStart",
    "ThinkingDelta",
    "ThinkingEnd",
    "ThinkingLevelChanged",
    "ThinkingStart",
    "ToolExecutionEnd",
    "ToolExecutionStart",
    "ToolExecutionUpdate",
    "ToolcallDelta",
    "ToolcallEnd",
    "ToolcallStart",
    "TurnEnd",
    "TurnStart",
]

# --- assistant message events (inside message_update) ------------------------------------------


@attrs.define(kw_only=True, eq=False, repr=False)
class TextStart:
    type: str = tag("text_start")
    content_index: int


@attrs.define(kw_only=True, eq=False, repr=False)
class TextDelta:
    type: str = tag("text_delta")
    content_index: int
    delta: str


@attrs.define(kw_only=True, eq=False, repr=False)
class TextEnd:
    type: str = tag("text_end")
    content_index: int
    content: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ThinkingStart:
    type: str = tag("thinking_start")
    content_index: int


@attrs.define(kw_only=True, eq=False, repr=False)
class ThinkingDelta:
    type: str = tag("thinking_delta")
    content_index: int
    delta: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ThinkingEnd:
    type: str = tag("thinking_end")
    content_index: int
    content: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolcallStart:
    type: str = tag("toolcall_start")
    content_index: int
    id: str
    tool_name: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolcallDelta:
    type: str = tag("toolcall_delta")
    content_index: int
    delta: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolcallEnd:
    type: str = tag("toolcall_end")
    content_index: int
    tool_call: ToolCall


AssistantMessageEvent = (
    TextStart | TextDelta | TextEnd | ThinkingStart | ThinkingDelta | ThinkingEnd
    | ToolcallStart | ToolcallDelta | ToolcallEnd
)


# --- events ------------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class AgentStart:
    type: str = tag("agent_start")


@attrs.define(kw_only=True, eq=False, repr=False)
class AgentEnd:
    type: str = tag("agent_end")
    messages: list[AgentMessage]
    will_retry: bool = False


@attrs.define(kw_only=True, eq=False, repr=False)
class AgentSettled:
    type: str = tag("agent_settled")
    aborted: bool = False
    """The last run ended because it was aborted."""


@attrs.define(kw_only=True, eq=False, repr=False)
class TurnStart:
    type: str = tag("turn_start")


@attrs.define(kw_only=True, eq=False, repr=False)
class TurnEnd:
    type: str = tag("turn_end")
    message: AgentMessage
    tool_results: list[ToolResultMessage]


@attrs.define(kw_only=True, eq=False, repr=False)
class MessageStart:
    type: str = tag("message_start")
    message: AgentMessage


@attrs.define(kw_only=True, eq=False, repr=False)
class MessageUpdate:
    type: str = tag("message_update")
    usage: Usage
    assistant_message_event: AssistantMessageEvent


@attrs.define(kw_only=True, eq=False, repr=False)
class MessageEnd:
    type: str = tag("message_end")
    message: AgentMessage


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolExecutionStart:
    type: str = tag("tool_execution_start")
    tool_call_id: str
    tool_name: str
    args: JSONObject


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolExecutionUpdate:
    type: str = tag("tool_execution_update")
    tool_call_id: str
    tool_name: str
    args: JSONObject
    partial_result: ToolResult


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolExecutionEnd:
    type: str = tag("tool_execution_end")
    tool_call_id: str
    tool_name: str
    result: ToolResult
    is_error: bool
    duration_ms: int | None = None
    """How long the tool ran (absent when it did not: unknown, refused or blocked)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class SessionInfoChanged:
    type: str = tag("session_info_changed")
    name: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class ThinkingLevelChanged:
    type: str = tag("thinking_level_changed")
    level: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ModelChanged:
    """forged's addition: the session's model changed (``set_model``, ``cycle_model``, a
    plugin), so that every client of a shared session follows it."""

    type: str = tag("model_changed")
    provider: str
    model_id: str


@attrs.define(kw_only=True, eq=False, repr=False)
class PermissionModeChanged:
    """forged's addition, as `ModelChanged`: the session's permission mode changed."""

    type: str = tag("permission_mode_changed")
    mode: str


@attrs.define(kw_only=True, eq=False, repr=False)
class QueueUpdate:
    type: str = tag("queue_update")
    steering: list[str]
    follow_up: list[str]


@attrs.define(kw_only=True, eq=False, repr=False)
class BashExecutionUpdate:
    type: str = tag("bash_execution_update")
    id: str | int | None = None
    delta: str


@attrs.define(kw_only=True, eq=False, repr=False)
class CompactionResult:
    summary: str
    first_kept_entry_id: str
    tokens_before: int
    estimated_tokens_after: int | None = None
    usage: Usage | None = None
    details: dict[str, list[str]] | None = None
    """The files the summarized part read and the ones it changed: ``readFiles``,
    ``modifiedFiles``."""


@attrs.define(kw_only=True, eq=False, repr=False)
class CompactionStart:
    type: str = tag("compaction_start")
    reason: Literal["manual", "threshold", "overflow"]


@attrs.define(kw_only=True, eq=False, repr=False)
class CompactionEnd:
    type: str = tag("compaction_end")
    reason: Literal["manual", "threshold", "overflow"]
    result: CompactionResult | None = keep_null(None)
    aborted: bool
    will_retry: bool
    error_message: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class AutoRetryStart:
    type: str = tag("auto_retry_start")
    attempt: int
    max_attempts: int
    delay_ms: int
    error_message: str


@attrs.define(kw_only=True, eq=False, repr=False)
class AutoRetryEnd:
    type: str = tag("auto_retry_end")
    success: bool
    attempt: int
    final_error: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class SummarizationRetryScheduled:
    type: str = tag("summarization_retry_scheduled")
    attempt: int
    max_attempts: int
    delay_ms: int
    error_message: str


@attrs.define(kw_only=True, eq=False, repr=False)
class SummarizationRetryAttemptStart:
    type: str = tag("summarization_retry_attempt_start")
    source: Literal["compaction", "branchSummary"]
    reason: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class SummarizationRetryFinished:
    type: str = tag("summarization_retry_finished")


@attrs.define(kw_only=True, eq=False, repr=False)
class ExtensionUiRequest:
    type: str = tag("extension_ui_request")
    id: str
    method: str
    title: str | None = None
    message: str | None = None
    options: list[str] | None = None
    placeholder: str | None = None
    notify_type: str | None = None
    timeout: int | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class ExtensionUiResolved:
    """The daemon only: a dialog every attached client saw was answered (or timed out)."""

    type: str = tag("extension_ui_resolved")
    id: str


Event = (
    AgentStart | AgentEnd | AgentSettled | TurnStart | TurnEnd | MessageStart | MessageUpdate
    | MessageEnd | ToolExecutionStart | ToolExecutionUpdate | ToolExecutionEnd | QueueUpdate
    | BashExecutionUpdate | CompactionStart | CompactionEnd | AutoRetryStart | AutoRetryEnd
    | SummarizationRetryScheduled | SummarizationRetryAttemptStart | SummarizationRetryFinished
    | ExtensionUiRequest | ExtensionUiResolved | SessionInfoChanged | ThinkingLevelChanged
    | ModelChanged | PermissionModeChanged
)

EVENT_TYPES: frozenset[str] = frozenset(attrs.fields(cls).type.default for cls in get_args(Event))


share_repr(globals())
