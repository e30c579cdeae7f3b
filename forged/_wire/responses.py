"""The bodies of responses (``data``), beyond those in `forged._wire.base`."""

from __future__ import annotations

from typing import Literal

import attrs

from .base import JSONObject, Model, keep_null, share_repr
from .events import ExtensionUiRequest, QueueUpdate
from .messages import AgentMessage

__all__ = [
    "AssistantText",
    "AttachResult",
    "BashResult",
    "ChangedFile",
    "Checkpoint",
    "CheckpointDiff",
    "CheckpointList",
    "CommandInfo",
    "CommandList",
    "ContextUsage",
    "CycledModel",
    "Deleted",
    "DeviceInfo",
    "DeviceList",
    "EntryList",
    "EntryTree",
    "ExportResult",
    "ForkMessage",
    "ForkMessageList",
    "ForkResult",
    "LiveSessionInfo",
    "McpServerInfo",
    "McpServerList",
    "MessageList",
    "ModelList",
    "Pairing",
    "PushKey",
    "PushSubscribed",
    "PushUnsubscribed",
    "RestoreResult",
    "Revoked",
    "SessionList",
    "SessionStats",
    "SourceInfo",
    "StoredSessionInfo",
    "SwitchResult",
    "ThinkingLevelData",
    "ThinkingLevelList",
    "TokenTotals",
    "TreeNode",
]


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
    text: str | None = keep_null(None)


@attrs.define(kw_only=True, eq=False, repr=False)
class EntryList:
    entries: list[JSONObject]
    leaf_id: str | None = keep_null(None)


@attrs.define(kw_only=True, eq=False, repr=False)
class TreeNode:
    entry: JSONObject
    children: list[TreeNode]
    label: str | None = None
    label_timestamp: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class EntryTree:
    tree: list[TreeNode]
    leaf_id: str | None = keep_null(None)


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
    provider: str | None = None
    model_id: str | None = None
    waiting: bool = False
    """A permission request or a dialog waits for an answer."""
    cost: float = 0.0
    """Dollars spent so far (the session file's usage)."""
    last_activity: int | None = None
    """When its last event was written (ms since 1970), or it was opened."""


@attrs.define(kw_only=True, eq=False, repr=False)
class PushKey:
    public_key: str
    """The daemon's VAPID public key: an uncompressed P-256 point, URL-safe base64."""


@attrs.define(kw_only=True, eq=False, repr=False)
class PushSubscribed:
    subscriptions: int
    """How many the device now has."""


@attrs.define(kw_only=True, eq=False, repr=False)
class PushUnsubscribed:
    removed: bool


@attrs.define(kw_only=True, eq=False, repr=False)
class Deleted:
    session_id: str
    path: str


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
class Pairing:
    code: str
    link: str
    """``<scheme>://<host>:<port>/pair#<code>``: the code in the fragment never reaches a
    server's log."""
    device: str
    role: str
    expires_in_seconds: int


@attrs.define(kw_only=True, eq=False, repr=False)
class DeviceInfo:
    name: str
    role: str
    created: str
    last_seen: str | None = None
    address: str | None = None
    connected: int = 0
    """Its connections open now."""


@attrs.define(kw_only=True, eq=False, repr=False)
class DeviceList:
    devices: list[DeviceInfo]


@attrs.define(kw_only=True, eq=False, repr=False)
class Revoked:
    device: str
    disconnected: int
    """Its connections the revocation ended."""


@attrs.define(kw_only=True, eq=False, repr=False)
class AttachResult:
    session_id: str
    seq: int
    """The last event's seq: ``sinceSeq`` for a later reattach."""
    replayed: int
    missed: bool = False
    """Events after ``sinceSeq`` are no longer kept: read the session with ``get_entries``."""
    load_id: str | None = None
    """forged's addition: names this load of the session. ``seq`` counts from 1 again when
    a session is unloaded and loaded again: a client reattaching whose ``loadId`` changed
    missed what it cannot count, and reads the session whole again."""
    dialogs: list[ExtensionUiRequest] | None = None
    """forged's addition: the questions and permission requests still open (a client
    attaching while another can answer them is not sent them again)."""
    queue: QueueUpdate | None = None
    """forged's addition: the messages queued now, as the last ``queue_update`` said."""


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
    protocol_version: str | None = None
    """The MCP revision negotiated when it last connected (``2026-07-28``, ``2025-11-25``,
    ...); None until it has connected."""
    needs_auth: bool | None = None
    """True when the server answers 401 and no stored OAuth sign-in passes (``forged mcp
    login NAME`` signs in); None (not written) otherwise, as the codec omits a None."""


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
    tokens: int | None = keep_null(None)
    context_window: int
    percent: float | None = keep_null(None)


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


share_repr(globals())
