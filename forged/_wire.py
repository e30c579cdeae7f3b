"""Every command, event, message and response body of the agent-forge RPC protocol.

Each class is named after its wire ``type`` (or ``role``) and carries it as its first field, so a
converted object reads like the protocol. Attributes are snake_case; `forged._codec` renames them
to camelCase in one hook. A field whose default is ``None`` is omitted when unset, unless it is
marked `keep_null`, which writes ``null`` as the protocol requires.

Equality is identity (``eq=False``): two messages with the same fields are still two messages
(two identical replies are two entries), and identity keeps every object hashable. One shared
``__repr__``, set at the end of this module, shows the fields: attrs would compile a repr per
class, ~30 ms of start-up for ~110 classes.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import attrs

KEEP_NULL = "forged.keep_null"


def tag(value: str) -> Any:
    return attrs.field(default=value, init=False)


def keep_null(default: Any = None) -> Any:
    """A field written as ``null`` instead of being omitted when it is None."""
    return attrs.field(default=default, metadata={KEEP_NULL: True})


def _list() -> Any:
    return attrs.field(factory=list)


ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"]
THINKING_LEVELS: tuple[ThinkingLevel, ...] = (
    "off", "minimal", "low", "medium", "high", "xhigh", "max",
)
QueueMode = Literal["all", "one-at-a-time"]
StopReason = Literal["pending", "stop", "length", "toolUse", "error", "aborted"]
"""``pending`` only in an assistant ``message_start``: the message is still streaming."""


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
    arguments: dict[str, Any]
    thought_signature: str | None = None
    """Gemini's signature of the reasoning behind the call, sent back with it."""


UserContent = TextContent | ImageContent
AssistantContent = TextContent | ThinkingContent | ToolCall


# --- usage and models --------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class UsageCost:
    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    total: float = 0.0


@attrs.define(kw_only=True, eq=False, repr=False)
class Usage:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total_tokens: int = 0
    cost: UsageCost = attrs.field(factory=UsageCost)


@attrs.define(kw_only=True, eq=False, repr=False)
class ModelCost:
    """USD per million tokens."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0


@attrs.define(kw_only=True, eq=False, repr=False)
class Model:
    id: str
    name: str
    api: str
    provider: str
    base_url: str
    reasoning: bool
    input: list[str]
    context_window: int
    max_tokens: int
    cost: ModelCost
    thinking_levels: list[str]
    thinking_level_map: dict[str, str | None] | None = None
    """models.json ``thinkingLevelMap``: the value the provider is sent for a level."""
    compat: dict[str, Any] | None = None
    """models.json ``compat``: how the provider differs from its API's standard."""


# --- messages ----------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class UserMessage:
    role: str = tag("user")
    content: list[UserContent]
    timestamp: int


@attrs.define(kw_only=True, eq=False, repr=False)
class AssistantMessage:
    role: str = tag("assistant")
    content: list[AssistantContent] = _list()
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
    details: dict[str, Any] | None = None
    is_error: bool
    timestamp: int


@attrs.define(kw_only=True, eq=False, repr=False)
class BashExecutionMessage:
    role: str = tag("bashExecution")
    command: str
    output: str
    exit_code: int | None = keep_null()
    cancelled: bool
    truncated: bool
    full_output_path: str | None = keep_null()
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
    details: Any = None
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
    details: dict[str, Any] | None = None
    structured_content: dict[str, Any] | None = None
    """The result as data, for programs (``bash``: output, exit code, ...)."""


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
    args: dict[str, Any]


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolExecutionUpdate:
    type: str = tag("tool_execution_update")
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
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
    details: dict[str, Any] | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class CompactionStart:
    type: str = tag("compaction_start")
    reason: Literal["manual", "threshold", "overflow"]


@attrs.define(kw_only=True, eq=False, repr=False)
class CompactionEnd:
    type: str = tag("compaction_end")
    reason: Literal["manual", "threshold", "overflow"]
    result: CompactionResult | None = keep_null()
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
)

EVENT_TYPES: frozenset[str] = frozenset(attrs.fields(cls).type.default for cls in get_args(Event))


# --- commands ----------------------------------------------------------------------------------
# The command's `id` is read from the raw object before the command is converted (so that even
# a malformed command's response can carry it); it is not an attribute here.

@attrs.define(kw_only=True, eq=False, repr=False)
class Prompt:
    type: str = tag("prompt")
    message: str
    images: list[ImageContent] | None = None
    streaming_behavior: Literal["steer", "followUp"] | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class Steer:
    type: str = tag("steer")
    message: str
    images: list[ImageContent] | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class FollowUp:
    type: str = tag("follow_up")
    message: str
    images: list[ImageContent] | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class Abort:
    type: str = tag("abort")


@attrs.define(kw_only=True, eq=False, repr=False)
class ClearQueue:
    type: str = tag("clear_queue")


@attrs.define(kw_only=True, eq=False, repr=False)
class NewSession:
    type: str = tag("new_session")
    parent_session: str | None = None
    cwd: str | None = None
    """The daemon only (as the fields below): a new live session there."""
    provider: str | None = None
    model: str | None = None
    session_name: str | None = None
    no_session: bool = False
    """Kept in memory only (as ``--no-session``)."""
    session: str | None = None
    """A session file's path or an id prefix to continue (as ``--session``)."""
    continue_recent: bool = False
    """Continue the cwd's most recent session (as ``--continue``)."""
    mcp_servers: dict[str, Any] | None = None
    """MCP servers for this session beside the configured ones, as mcp.json's
    ``mcpServers`` (an ACP editor's, through ``forged connect --acp``)."""
    plain: bool = False
    """The daemon only: from now on the connection reads what ``forged --mode rpc`` writes
    (events without ``sessionId``/``seq``, no ``extension_ui_resolved``)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class GetState:
    type: str = tag("get_state")


@attrs.define(kw_only=True, eq=False, repr=False)
class GetMessages:
    type: str = tag("get_messages")


@attrs.define(kw_only=True, eq=False, repr=False)
class SetModel:
    type: str = tag("set_model")
    provider: str
    model_id: str


@attrs.define(kw_only=True, eq=False, repr=False)
class CycleModel:
    type: str = tag("cycle_model")


@attrs.define(kw_only=True, eq=False, repr=False)
class GetAvailableModels:
    type: str = tag("get_available_models")


@attrs.define(kw_only=True, eq=False, repr=False)
class SetThinkingLevel:
    type: str = tag("set_thinking_level")
    level: str


@attrs.define(kw_only=True, eq=False, repr=False)
class SetPermissionMode:
    """forged's addition: the session's permission mode (docs/security.md)."""

    type: str = tag("set_permission_mode")
    mode: str


@attrs.define(kw_only=True, eq=False, repr=False)
class CycleThinkingLevel:
    type: str = tag("cycle_thinking_level")


@attrs.define(kw_only=True, eq=False, repr=False)
class GetAvailableThinkingLevels:
    type: str = tag("get_available_thinking_levels")


@attrs.define(kw_only=True, eq=False, repr=False)
class SetSteeringMode:
    type: str = tag("set_steering_mode")
    mode: QueueMode


@attrs.define(kw_only=True, eq=False, repr=False)
class SetFollowUpMode:
    type: str = tag("set_follow_up_mode")
    mode: QueueMode


@attrs.define(kw_only=True, eq=False, repr=False)
class Compact:
    type: str = tag("compact")
    custom_instructions: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class SetAutoCompaction:
    type: str = tag("set_auto_compaction")
    enabled: bool


@attrs.define(kw_only=True, eq=False, repr=False)
class SetAutoRetry:
    type: str = tag("set_auto_retry")
    enabled: bool


@attrs.define(kw_only=True, eq=False, repr=False)
class AbortRetry:
    type: str = tag("abort_retry")


@attrs.define(kw_only=True, eq=False, repr=False)
class Bash:
    type: str = tag("bash")
    command: str
    exclude_from_context: bool | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class AbortBash:
    type: str = tag("abort_bash")


@attrs.define(kw_only=True, eq=False, repr=False)
class GetSessionStats:
    type: str = tag("get_session_stats")


@attrs.define(kw_only=True, eq=False, repr=False)
class ExportHtml:
    type: str = tag("export_html")
    output_path: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class SwitchSession:
    type: str = tag("switch_session")
    session_path: str


@attrs.define(kw_only=True, eq=False, repr=False)
class Fork:
    type: str = tag("fork")
    entry_id: str
    restore_files: bool = False
    """forged's addition: the files back as they were at the fork point."""
    force: bool = False


@attrs.define(kw_only=True, eq=False, repr=False)
class Clone:
    type: str = tag("clone")
    restore_files: bool = False
    """forged's addition: the files back as they were at the end of the branch."""
    force: bool = False


@attrs.define(kw_only=True, eq=False, repr=False)
class GetCheckpoints:
    """forged's addition (docs/protocol.md, Checkpoints)."""

    type: str = tag("get_checkpoints")


@attrs.define(kw_only=True, eq=False, repr=False)
class GetCheckpointDiff:
    type: str = tag("get_checkpoint_diff")
    entry_id: str
    to_entry_id: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class RestoreCheckpoint:
    type: str = tag("restore_checkpoint")
    entry_id: str
    dry_run: bool = False
    force: bool = False


@attrs.define(kw_only=True, eq=False, repr=False)
class GetForkMessages:
    type: str = tag("get_fork_messages")


@attrs.define(kw_only=True, eq=False, repr=False)
class GetEntries:
    type: str = tag("get_entries")
    since: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class GetTree:
    type: str = tag("get_tree")


@attrs.define(kw_only=True, eq=False, repr=False)
class GetLastAssistantText:
    type: str = tag("get_last_assistant_text")


@attrs.define(kw_only=True, eq=False, repr=False)
class SetSessionName:
    type: str = tag("set_session_name")
    name: str


@attrs.define(kw_only=True, eq=False, repr=False)
class GetCommands:
    type: str = tag("get_commands")


@attrs.define(kw_only=True, eq=False, repr=False)
class ExtensionUiResponse:
    type: str = tag("extension_ui_response")
    value: str | None = None
    confirmed: bool | None = None
    cancelled: bool | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class GetMcpServers:
    type: str = tag("get_mcp_servers")


Command = (
    Prompt | Steer | FollowUp | Abort | ClearQueue | NewSession | GetState | GetMessages
    | SetModel | CycleModel | GetAvailableModels | SetThinkingLevel | CycleThinkingLevel
    | SetPermissionMode | GetCheckpoints | GetCheckpointDiff | RestoreCheckpoint
    | GetAvailableThinkingLevels | SetSteeringMode | SetFollowUpMode | Compact
    | SetAutoCompaction | SetAutoRetry | AbortRetry | Bash | AbortBash | GetSessionStats
    | ExportHtml | SwitchSession | Fork | Clone | GetForkMessages | GetEntries | GetTree
    | GetLastAssistantText | SetSessionName | GetCommands | ExtensionUiResponse | GetMcpServers
)

COMMAND_CLASSES: dict[str, type[Any]] = {
    attrs.fields(cls).type.default: cls for cls in get_args(Command)
}


# --- the daemon's own commands (forged-rpc(7)) -------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class ListSessions:
    type: str = tag("list_sessions")
    cwd: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class Attach:
    type: str = tag("attach")
    session_id: str
    since_seq: int | None = None
    plain: bool = False
    """As `NewSession.plain` (no events are replayed to a plain connection)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class Detach:
    type: str = tag("detach")


DaemonCommand = ListSessions | Attach | Detach

DAEMON_COMMAND_CLASSES: dict[str, type[Any]] = {
    **COMMAND_CLASSES,
    **{attrs.fields(cls).type.default: cls for cls in get_args(DaemonCommand)},
}


# --- responses ---------------------------------------------------------------------------------

class _Absent:
    """`Response.data` when the response has no `data` key (unlike a `null` data)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@attrs.define(kw_only=True, eq=False, repr=False)
class Response:
    id: str | int | None = None
    type: str = tag("response")
    command: str
    success: bool
    data: Any = ABSENT
    error: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class PromptAccepted:
    disposition: Literal["started", "queued", "handled"]


@attrs.define(kw_only=True, eq=False, repr=False)
class QueueContents:
    steering: list[str]
    follow_up: list[str]


@attrs.define(kw_only=True, eq=False, repr=False)
class SessionState:
    model: Model | None = keep_null()
    thinking_level: str
    is_streaming: bool
    is_compacting: bool
    steering_mode: QueueMode
    follow_up_mode: QueueMode
    session_file: str | None = None
    session_id: str
    session_name: str | None = None
    auto_compaction_enabled: bool
    message_count: int
    pending_message_count: int
    permission_mode: str = "full-access"
    """What the model's tools may do (forged's addition: docs/security.md)."""
    session_file_error: str | None = None
    """Why the session file cannot be written, while it cannot (forged's addition)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class ChangedFile:
    path: str
    status: str
    """``A`` added, ``M`` modified, ``D`` deleted, ``T`` its kind changed."""


@attrs.define(kw_only=True, eq=False, repr=False)
class Checkpoint:
    entry_id: str
    timestamp: str
    kind: str
    """``before`` (a run's first change), ``after`` (the run's end), ``restore`` (the files
    just before a restore)."""
    prompt: str | None = None
    files: list[ChangedFile]
    """What changed since the session's previous checkpoint."""
    skipped: list[str] | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class CheckpointList:
    checkpoints: list[Checkpoint]


@attrs.define(kw_only=True, eq=False, repr=False)
class CheckpointDiff:
    files: list[ChangedFile]
    diff: str


@attrs.define(kw_only=True, eq=False, repr=False)
class RestoreResult:
    files: list[ChangedFile]
    """What the restore did: ``A`` recreated, ``D`` removed, ``M``/``T`` written back; for a
    dry run, what it would do."""
    entry_id: str | None = None
    """The checkpoint of the files just before the restore (restore it to undo)."""
    dry_run: bool | None = None
    drift: list[ChangedFile] | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class MessageList:
    messages: list[AgentMessage]


@attrs.define(kw_only=True, eq=False, repr=False)
class ModelList:
    models: list[Model]


@attrs.define(kw_only=True, eq=False, repr=False)
class CycledModel:
    model: Model
    thinking_level: str
    is_scoped: bool


@attrs.define(kw_only=True, eq=False, repr=False)
class ThinkingLevelData:
    level: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ThinkingLevelList:
    levels: list[str]


@attrs.define(kw_only=True, eq=False, repr=False)
class AssistantText:
    text: str | None = keep_null()


@attrs.define(kw_only=True, eq=False, repr=False)
class EntryList:
    entries: list[dict[str, Any]]
    leaf_id: str | None = keep_null()


@attrs.define(kw_only=True, eq=False, repr=False)
class TreeNode:
    entry: dict[str, Any]
    children: list[TreeNode]
    label: str | None = None
    label_timestamp: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class EntryTree:
    tree: list[TreeNode]
    leaf_id: str | None = keep_null()


@attrs.define(kw_only=True, eq=False, repr=False)
class SwitchResult:
    cancelled: bool = False


@attrs.define(kw_only=True, eq=False, repr=False)
class ForkResult:
    text: str
    cancelled: bool = False


@attrs.define(kw_only=True, eq=False, repr=False)
class ForkMessage:
    entry_id: str
    text: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ForkMessageList:
    messages: list[ForkMessage]


@attrs.define(kw_only=True, eq=False, repr=False)
class LiveSessionInfo:
    session_id: str
    cwd: str
    session_name: str | None = None
    session_file: str | None = None
    state: Literal["streaming", "idle"]
    clients: int


@attrs.define(kw_only=True, eq=False, repr=False)
class StoredSessionInfo:
    session_id: str
    path: str
    modified: str


@attrs.define(kw_only=True, eq=False, repr=False)
class SessionList:
    sessions: list[LiveSessionInfo]
    stored: list[StoredSessionInfo]
    cwd: str


@attrs.define(kw_only=True, eq=False, repr=False)
class AttachResult:
    session_id: str
    seq: int
    """The last event's seq: ``sinceSeq`` for a later reattach."""
    replayed: int
    missed: bool = False
    """Events after ``sinceSeq`` are no longer kept: read the session with ``get_entries``."""


@attrs.define(kw_only=True, eq=False, repr=False)
class SourceInfo:
    path: str
    """A file, or ``<plugin:<plugin>:<command>>`` for a plugin's command."""
    source: str
    """``local`` for what was found in a folder, else the plugin's id."""
    scope: Literal["user", "project", "temporary"]
    origin: Literal["top-level", "package"]
    base_dir: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class CommandInfo:
    name: str
    description: str | None = None
    source: Literal["capability", "prompt", "skill"]
    source_info: SourceInfo


@attrs.define(kw_only=True, eq=False, repr=False)
class CommandList:
    commands: list[CommandInfo]
    untrusted_project: str | None = None
    """Why the project's own prompts, skills and plugins are not among them, when they
    are not."""


@attrs.define(kw_only=True, eq=False, repr=False)
class McpServerInfo:
    name: str
    transport: str
    """``stdio`` or ``http``."""
    status: str
    """``starting``, ``ready``, ``failed``, ``stopped`` or ``disabled``."""
    tool_count: int
    last_error: str | None = None
    description: str | None = None
    source: str | None = None
    """The file that configures it, or ``client`` (handed by the client, as ACP's
    ``mcpServers``)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class McpServerList:
    servers: list[McpServerInfo]


@attrs.define(kw_only=True, eq=False, repr=False)
class TokenTotals:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total: int = 0


@attrs.define(kw_only=True, eq=False, repr=False)
class ContextUsage:
    tokens: int | None = keep_null()
    context_window: int
    percent: float | None = keep_null()


@attrs.define(kw_only=True, eq=False, repr=False)
class SessionStats:
    session_file: str | None = None
    session_id: str
    user_messages: int
    assistant_messages: int
    tool_calls: int
    tool_results: int
    total_messages: int
    tokens: TokenTotals
    cost: float
    context_usage: ContextUsage | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class ExportResult:
    path: str


@attrs.define(kw_only=True, eq=False, repr=False)
class BashResult:
    """The ``bash`` response; unlike the message, a killed command's exitCode is omitted
    (the protocol names only the message's as null)."""

    output: str
    exit_code: int | None = None
    cancelled: bool
    truncated: bool
    full_output_path: str | None = None


def _repr(self: Any) -> str:
    fields = ", ".join(f"{field.name}={getattr(self, field.name)!r}"
                       for field in attrs.fields(type(self)) if field.init)
    return f"{type(self).__name__}({fields})"


for _class in [value for value in list(globals().values())
               if isinstance(value, type) and attrs.has(value)]:
    _class.__repr__ = _repr  # type: ignore[method-assign]  # one function for ~110 classes
