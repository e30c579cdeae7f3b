"""The exception tree: every exception class forged defines is here.

::

    ForgedError                  anything forged raises on purpose
    ├── CommandError             a command is refused; the message is the response's `error`
    │   ├── WireError            a line or a field could not be read (a `parse` or field error)
    │   ├── PersistenceError     the session file could not be written (nothing was announced)
    │   ├── SessionLockedError   another forged process holds the session file
    │   └── NothingToCompact     the branch has nothing a compaction could replace
    ├── ConfigError              models.json, --model, a script file: bad configuration
    │   ├── ConfigProblem        one mcp.json entry is invalid (it is skipped, the others load)
    │   ├── FrontmatterError     a skill's or a template's frontmatter cannot be read
    │   ├── LockTimeout          auth.json stayed locked by another process
    │   └── Refused              forged connect: the daemon cannot open the session as asked
    ├── ProviderError            a model call failed; `message` becomes the turn's `errorMessage`
    │   ├── ProviderStatusError  the provider answered with an HTTP error status
    │   └── ProviderStreamError  the connection broke or the stream was malformed
    ├── ToolError                a tool failed; `text` becomes its error result
    │   └── InvalidArguments     a call's arguments do not fit the tool's parameters
    ├── ServerExited             an MCP stdio server ended before it answered
    ├── Unprotectable            the sandbox cannot keep a path read-only (a link in a
    │                            writable folder)
    ├── UnknownArchitecture      no seccomp filter for this machine: no sandbox
    ├── ValueCommandFailed       a configuration's ``!command`` gave no value
    ├── CheckpointError          a checkpoint's capture or restore failed (git's message)
    ├── AcpError                 an ACP request fails: a JSON-RPC error `code` and message
    ├── ClientGone               the other side closed before answering a request of ours
    ├── NotPaired                a pairing code, device name or role is refused
    ├── HttpRefused              a plain HTTP request to the daemon's listener: its status
    └── CommandFailed            `forged.client`: forged answered ``success: false``

Two more, in ``forged._mcp.http``, are also httpx2's errors, so that the MCP SDK reads them
as it reads its own: ``MessageTooLarge`` (a StreamError) and ``EventTooLarge`` (an SSEError),
both ForgedErrors.

HTTP and network errors are mapped to `ProviderError` in exactly one place,
`forged._providers.http.provider_errors`. A command that fails becomes an error response in
one place too: `forged._dispatch.failure_text`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: forged connect loads this module, typing costs it ~2 ms
if TYPE_CHECKING:
    from typing import Any


class ForgedError(Exception):
    """Base of every error forged raises on purpose."""


class CommandError(ForgedError):
    """A command is refused; `str(error)` is the response's `error` text."""


class WireError(CommandError):
    """Input could not be read as a command."""


class PersistenceError(CommandError):
    """The session file could not be written (a full disk, a read-only folder): what was to
    be stored was neither stored nor announced."""


class SessionLockedError(CommandError):
    """Another process holds the session file."""


class NothingToCompact(CommandError):
    """The branch has nothing a compaction could replace."""


class ConfigError(ForgedError):
    """Configuration (models.json, --model, a script file) is invalid."""


class ConfigProblem(ConfigError):
    """One ``mcpServers`` entry is invalid: it is skipped, and the others load."""


class FrontmatterError(ConfigError):
    """A skill's or a prompt template's YAML frontmatter cannot be read."""


class ProviderError(ForgedError):
    """A model call failed. The message becomes the assistant message's `errorMessage`."""

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class ProviderStatusError(ProviderError):
    """The provider answered with an HTTP error status."""


class ProviderStreamError(ProviderError):
    """The connection failed, or the stream ended early or was malformed."""


class ToolError(ForgedError):
    """The tool failed; `text` (and `details`, `structured`) become an error result."""

    def __init__(self, text: str, details: dict[str, Any] | None = None,
                 structured: dict[str, Any] | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.details = details
        self.structured = structured


class InvalidArguments(ToolError):
    """A tool call's arguments do not fit the tool's parameters: `problems`, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class LockTimeout(ConfigError):
    """auth.json's lock has been held by another process for too long."""


class Refused(ConfigError):
    """A running daemon cannot open this connection's session as asked: connect exits 2."""


class ServerExited(ForgedError):
    """An MCP stdio server's process ended before it answered anything."""


class Unprotectable(ForgedError):
    """A path the sandbox must keep read-only is a symbolic link in a writable folder: a
    command could replace the link (bubblewrap can only bind what it leads to)."""


class UnknownArchitecture(ForgedError):
    """No seccomp filter is known for this machine's architecture: no sandbox."""


class ValueCommandFailed(ForgedError):
    """Why a configuration's ``!command`` gave no value."""


class CheckpointError(ForgedError):
    """A capture or restore of the workspace's files could not be done, and why (git's own
    words)."""


class AcpError(ForgedError):
    """An ACP request fails with the JSON-RPC error `code` and this message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class ClientGone(ForgedError):
    """The other side closed its end before answering a request of ours."""


class CommandFailed(ForgedError):
    """forged answered a command with ``success: false``."""

    def __init__(self, command: str, error: str) -> None:
        super().__init__(f"{command}: {error}")
        self.command = command
        self.error = error


class NotPaired(ForgedError):
    """A pairing code is unknown, used or expired; a device name or role is invalid, or
    taken (`forged._devices`)."""


class HttpRefused(ForgedError):
    """A plain HTTP request to the daemon's WebSocket listener is refused with `status`
    (`forged._transports.http`)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason
