"""The commands a client sends, and the daemon's own."""

from __future__ import annotations

from typing import Literal, get_args

import attrs

from .base import GetState, JSONObject, QueueMode, share_repr, tag
from .messages import ImageContent

__all__ = [
    "COMMAND_CLASSES",
    "DAEMON_COMMAND_CLASSES",
    "PUSH_COMMANDS",
    "Abort",
    "AbortBash",
    "AbortRetry",
    "Attach",
    "Bash",
    "ClearQueue",
    "Clone",
    "Command",
    "Compact",
    "CycleModel",
    "CycleThinkingLevel",
    "DaemonCommand",
    "DeleteSession",
    "Detach",
    "ExportHtml",
    "ExtensionUiResponse",
    "FollowUp",
    "Fork",
    "GetAvailableModels",
    "GetAvailableThinkingLevels",
    "GetCheckpointDiff",
    "GetCheckpoints",
    "GetCommands",
    "GetEntries",
    "GetForkMessages",
    "GetLastAssistantText",
    "GetMcpServers",
    "GetMessages",
    "GetPushKey",
    "GetSessionStats",
    "GetTree",
    "ListDevices",
    "ListSessions",
    "NavigateTree",
    "NewSession",
    "PairDevice",
    "Prompt",
    "PushCommand",
    "PushSubscribe",
    "PushUnsubscribe",
    "RestoreCheckpoint",
    "RevokeDevice",
    "SetAutoCompaction",
    "SetAutoRetry",
    "SetFollowUpMode",
    "SetModel",
    "SetPermissionMode",
    "SetSessionName",
    "SetSteeringMode",
    "SetThinkingLevel",
    "Steer",
    "SwitchSession",
    "UnloadSession",
]

# --- commands ----------------------------------------------------------------------------------
# The command's `id` is read from the raw object before the command is converted (so that even
# a malformed command's response can carry it); it is not an attribute here.


@attrs.define(kw_only=True, eq=False, repr=False)
class Prompt:
    type: str = tag("prompt")
    message: str
    images: list[ImageContent] | None = None
    streaming_behavior: Literal["steer", "followUp"] | None = None
    traceparent: str | None = None
    """The caller's W3C trace context, the parent of what it starts (docs/observability.md)."""
    tracestate: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class Steer:
    type: str = tag("steer")
    message: str
    images: list[ImageContent] | None = None
    traceparent: str | None = None
    """The caller's W3C trace context, the parent of what it starts (docs/observability.md)."""
    tracestate: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class FollowUp:
    type: str = tag("follow_up")
    message: str
    images: list[ImageContent] | None = None
    traceparent: str | None = None
    """The caller's W3C trace context, the parent of what it starts (docs/observability.md)."""
    tracestate: str | None = None


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
    permission_mode: str | None = None
    """The new session's permission mode (as ``--permission-mode``; default: the daemon's)."""
    mcp_servers: JSONObject | None = None
    """MCP servers for this session beside the configured ones, as mcp.json's
    ``mcpServers`` (an ACP editor's, through ``forged connect --acp``)."""
    fork: str | None = None
    """A session file: the new session holds a copy of its active branch (as ``--fork``)."""
    plain: bool = False
    """The daemon only: from now on the connection reads what ``forged --mode rpc`` writes
    (events without ``sessionId``/``seq``, no ``extension_ui_resolved``)."""


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
    traceparent: str | None = None
    """The caller's W3C trace context, the parent of what it starts (docs/observability.md)."""
    tracestate: str | None = None


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
    entry_id: str | None = None
    """forged's addition: the branch from the root to this entry (any entry of the tree),
    not the active one."""


@attrs.define(kw_only=True, eq=False, repr=False)
class NavigateTree:
    """forged's addition: the session's leaf moved to an entry of its tree (any branch):
    the next message continues from there."""
    type: str = tag("navigate_tree")
    entry_id: str


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
    | NavigateTree
)

COMMAND_CLASSES: dict[str, type[Command]] = {
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


@attrs.define(kw_only=True, eq=False, repr=False)
class UnloadSession:
    """The daemon only: the live session `session_id` is unloaded (its file closed), once
    its leaving clients are gone; refused while another client holds it or it runs."""

    type: str = tag("unload_session")
    session_id: str


@attrs.define(kw_only=True, eq=False, repr=False)
class PairDevice:
    """The daemon only (owner): a one-time code and link pairing a device named `name` with
    `role` (docs/remote.md)."""

    type: str = tag("pair_device")
    name: str
    role: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ListDevices:
    type: str = tag("list_devices")


@attrs.define(kw_only=True, eq=False, repr=False)
class RevokeDevice:
    """The daemon only (owner): the device `name` is forgotten, its connections ended."""

    type: str = tag("revoke_device")
    name: str


@attrs.define(kw_only=True, eq=False, repr=False)
class DeleteSession:
    """The daemon: a session's file deleted (unloaded first; refused while another client
    holds it or it runs)."""
    type: str = tag("delete_session")
    session_id: str


@attrs.define(kw_only=True, eq=False, repr=False)
class GetPushKey:
    """The daemon: its VAPID public key, for a page's push subscription (docs/web.md)."""
    type: str = tag("get_push_key")


@attrs.define(kw_only=True, eq=False, repr=False)
class PushSubscribe:
    """The daemon: a browser's ``PushSubscription`` kept for this connection's device."""
    type: str = tag("push_subscribe")
    subscription: JSONObject


@attrs.define(kw_only=True, eq=False, repr=False)
class PushUnsubscribe:
    type: str = tag("push_unsubscribe")
    endpoint: str


PushCommand = GetPushKey | PushSubscribe | PushUnsubscribe
PUSH_COMMANDS = (GetPushKey, PushSubscribe, PushUnsubscribe)

DaemonCommand = (ListSessions | Attach | Detach | UnloadSession | PairDevice | ListDevices
                 | RevokeDevice | DeleteSession | PushCommand)

DAEMON_COMMAND_CLASSES: dict[str, type[Command | DaemonCommand]] = {
    **COMMAND_CLASSES,
    **{attrs.fields(cls).type.default: cls for cls in get_args(DaemonCommand)},
}


share_repr(globals())
