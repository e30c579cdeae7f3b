"""Every command, event, message and response body of the agent-forge RPC protocol.

Each class is named after its wire ``type`` (or ``role``) and carries it as its first field, so a
converted object reads like the protocol. Attributes are snake_case; `forged._codec` renames them
to camelCase in one hook. A field whose default is ``None`` is omitted when unset, unless it is
marked `keep_null`, which writes ``null`` as the protocol requires.

Equality is identity (``eq=False``): two messages with the same fields are still two messages
(two identical replies are two entries), and identity keeps every object hashable. One shared
``__repr__`` shows the fields (`base.share_repr`).

In five modules: `base` (what a session's first exchange needs: models, the response, the
state, ``get_state``) loads with this package; `messages`, `commands`, `events` and
`responses` load when one of their names is first used, as ``w.TextDelta`` (this package's
``__getattr__``), or in the warm-up. A process answers its first ``get_state``
without building the ~120 classes it does not need for it; attrs spends ~100 us on each.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from .base import (
    ABSENT as ABSENT,
    KEEP_NULL as KEEP_NULL,
    THINKING_LEVELS as THINKING_LEVELS,
    Absent as Absent,
    GetState as GetState,
    JSONObject as JSONObject,
    JSONValue as JSONValue,
    Model as Model,
    ModelCost as ModelCost,
    PromptAccepted as PromptAccepted,
    QueueContents as QueueContents,
    QueueMode as QueueMode,
    Response as Response,
    SessionState as SessionState,
    StopReason as StopReason,
    ThinkingLevel as ThinkingLevel,
    Usage as Usage,
    UsageCost as UsageCost,
    keep_null as keep_null,
    share_repr as share_repr,
    tag as tag,
)

if TYPE_CHECKING:
    from .commands import (
        PUSH_COMMANDS as PUSH_COMMANDS,
        Abort as Abort,
        AbortBash as AbortBash,
        AbortRetry as AbortRetry,
        Attach as Attach,
        Bash as Bash,
        ClearQueue as ClearQueue,
        Clone as Clone,
        Command as Command,
        Compact as Compact,
        CycleModel as CycleModel,
        CycleThinkingLevel as CycleThinkingLevel,
        DaemonCommand as DaemonCommand,
        DeleteSession as DeleteSession,
        Detach as Detach,
        ExportHtml as ExportHtml,
        ExtensionUiResponse as ExtensionUiResponse,
        FollowUp as FollowUp,
        Fork as Fork,
        GetAvailableModels as GetAvailableModels,
        GetAvailableThinkingLevels as GetAvailableThinkingLevels,
        GetCheckpointDiff as GetCheckpointDiff,
        GetCheckpoints as GetCheckpoints,
        GetCommands as GetCommands,
        GetEntries as GetEntries,
        GetForkMessages as GetForkMessages,
        GetLastAssistantText as GetLastAssistantText,
        GetMcpServers as GetMcpServers,
        GetMessages as GetMessages,
        GetPushKey as GetPushKey,
        GetSessionStats as GetSessionStats,
        GetTree as GetTree,
        ListDevices as ListDevices,
        ListSessions as ListSessions,
        NavigateTree as NavigateTree,
        NewSession as NewSession,
        PairDevice as PairDevice,
        Prompt as Prompt,
        PushCommand as PushCommand,
        PushSubscribe as PushSubscribe,
        PushUnsubscribe as PushUnsubscribe,
        RestoreCheckpoint as RestoreCheckpoint,
        RevokeDevice as RevokeDevice,
        SetAutoCompaction as SetAutoCompaction,
        SetAutoRetry as SetAutoRetry,
        SetFollowUpMode as SetFollowUpMode,
        SetModel as SetModel,
        SetPermissionMode as SetPermissionMode,
        SetSessionName as SetSessionName,
        SetSteeringMode as SetSteeringMode,
        SetThinkingLevel as SetThinkingLevel,
        Steer as Steer,
        SwitchSession as SwitchSession,
        UnloadSession as UnloadSession,
    )
    from .events import (
        EVENT_TYPES as EVENT_TYPES,
        AgentEnd as AgentEnd,
        AgentSettled as AgentSettled,
        AgentStart as AgentStart,
        AssistantMessageEvent as AssistantMessageEvent,
        AutoRetryEnd as AutoRetryEnd,
        AutoRetryStart as AutoRetryStart,
        BashExecutionUpdate as BashExecutionUpdate,
        CompactionEnd as CompactionEnd,
        CompactionResult as CompactionResult,
        CompactionStart as CompactionStart,
        Event as Event,
        ExtensionUiRequest as ExtensionUiRequest,
        ExtensionUiResolved as ExtensionUiResolved,
        MessageEnd as MessageEnd,
        MessageStart as MessageStart,
        MessageUpdate as MessageUpdate,
        ModelChanged as ModelChanged,
        PermissionModeChanged as PermissionModeChanged,
        QueueUpdate as QueueUpdate,
        SessionInfoChanged as SessionInfoChanged,
        SummarizationRetryAttemptStart as SummarizationRetryAttemptStart,
        SummarizationRetryFinished as SummarizationRetryFinished,
        SummarizationRetryScheduled as SummarizationRetryScheduled,
        TextDelta as TextDelta,
        TextEnd as TextEnd,
        TextStart as TextStart,
        ThinkingDelta as ThinkingDelta,
        ThinkingEnd as ThinkingEnd,
        ThinkingLevelChanged as ThinkingLevelChanged,
        ThinkingStart as ThinkingStart,
        ToolcallDelta as ToolcallDelta,
        ToolcallEnd as ToolcallEnd,
        ToolcallStart as ToolcallStart,
        ToolExecutionEnd as ToolExecutionEnd,
        ToolExecutionStart as ToolExecutionStart,
        ToolExecutionUpdate as ToolExecutionUpdate,
        TurnEnd as TurnEnd,
        TurnStart as TurnStart,
    )
    from .messages import (
        AgentMessage as AgentMessage,
        AssistantContent as AssistantContent,
        AssistantMessage as AssistantMessage,
        BashExecutionMessage as BashExecutionMessage,
        BranchSummaryMessage as BranchSummaryMessage,
        CompactionSummaryMessage as CompactionSummaryMessage,
        CustomMessage as CustomMessage,
        ImageContent as ImageContent,
        TextContent as TextContent,
        ThinkingContent as ThinkingContent,
        ToolCall as ToolCall,
        ToolResult as ToolResult,
        ToolResultMessage as ToolResultMessage,
        UserContent as UserContent,
        UserMessage as UserMessage,
        text_of as text_of,
    )
    from .responses import (
        AssistantText as AssistantText,
        AttachResult as AttachResult,
        BashResult as BashResult,
        ChangedFile as ChangedFile,
        Checkpoint as Checkpoint,
        CheckpointDiff as CheckpointDiff,
        CheckpointList as CheckpointList,
        CommandInfo as CommandInfo,
        CommandList as CommandList,
        ContextUsage as ContextUsage,
        CycledModel as CycledModel,
        Deleted as Deleted,
        DeviceInfo as DeviceInfo,
        DeviceList as DeviceList,
        EntryList as EntryList,
        EntryTree as EntryTree,
        ExportResult as ExportResult,
        ForkMessage as ForkMessage,
        ForkMessageList as ForkMessageList,
        ForkResult as ForkResult,
        LiveSessionInfo as LiveSessionInfo,
        McpServerInfo as McpServerInfo,
        McpServerList as McpServerList,
        MessageList as MessageList,
        ModelList as ModelList,
        Pairing as Pairing,
        PushKey as PushKey,
        PushSubscribed as PushSubscribed,
        PushUnsubscribed as PushUnsubscribed,
        RestoreResult as RestoreResult,
        Revoked as Revoked,
        SessionList as SessionList,
        SessionStats as SessionStats,
        SourceInfo as SourceInfo,
        StoredSessionInfo as StoredSessionInfo,
        SwitchResult as SwitchResult,
        ThinkingLevelData as ThinkingLevelData,
        ThinkingLevelList as ThinkingLevelList,
        TokenTotals as TokenTotals,
        TreeNode as TreeNode,
    )

LAZY_MODULES = ("messages", "commands", "events", "responses")


class _CommandTable(Mapping[str, "type[Command | DaemonCommand]"]):
    """`commands.COMMAND_CLASSES` (or the daemon's), by a command's ``type``: ``get_state``
    is found in `base`, any other loads `commands`."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _table(self) -> dict[str, type[Command | DaemonCommand]]:
        table: dict[str, type[Command | DaemonCommand]] = getattr(
            importlib.import_module(f"{__name__}.commands"), self._name)
        return table

    def __getitem__(self, kind: str) -> type[Command | DaemonCommand]:
        return GetState if kind == "get_state" else self._table()[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


COMMAND_CLASSES: Mapping[str, type[Command | DaemonCommand]] = _CommandTable("COMMAND_CLASSES")
"""Every command's class by its ``type``."""
DAEMON_COMMAND_CLASSES: Mapping[str, type[Command | DaemonCommand]] = _CommandTable(
    "DAEMON_COMMAND_CLASSES")
"""As `COMMAND_CLASSES`, and the daemon's own commands."""


def __getattr__(name: str) -> object:
    for module_name in LAZY_MODULES:
        module = importlib.import_module(f"{__name__}.{module_name}")
        if name in module.__all__:
            value = getattr(module, name)
            globals()[name] = value
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
