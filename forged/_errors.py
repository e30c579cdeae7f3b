"""The exception tree.

::

    ForgedError                  anything forged raises on purpose
    ├── CommandError             a command is refused; the message is the response's `error`
    │   ├── WireError            a line or a field could not be read (a `parse` or field error)
    │   └── PersistenceError     the session file could not be written (nothing was announced)
    ├── ConfigError              models.json, --model, a script file: bad configuration
    └── ProviderError            a model call failed; `message` becomes the turn's `errorMessage`
        ├── ProviderStatusError  the provider answered with an HTTP error status
        └── ProviderStreamError  the connection broke or the stream was malformed

HTTP and network errors are mapped to `ProviderError` in exactly one place,
`forged._providers.http.provider_errors`.
"""

from __future__ import annotations


class ForgedError(Exception):
    """Base of every error forged raises on purpose."""


class CommandError(ForgedError):
    """A command is refused; `str(error)` is the response's `error` text."""


class WireError(CommandError):
    """Input could not be read as a command."""


class PersistenceError(CommandError):
    """The session file could not be written (a full disk, a read-only folder): what was to
    be stored was neither stored nor announced."""


class ConfigError(ForgedError):
    """Configuration (models.json, --model, a script file) is invalid."""


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
