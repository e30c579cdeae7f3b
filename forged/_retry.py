"""Which provider failures are retried, and after how long (docs/protocol.md, Retries and
compaction).

Retryable: HTTP 408, 429, 500, 502, 503, 504 and 529, Anthropic's ``overloaded_error``, and
every broken or silent stream (connection errors, read timeouts, streams cut short). A
context-overflow error is never retried here: it is compaction's to handle.
"""

from __future__ import annotations

import re

import attrs

from ._errors import ProviderError, ProviderStreamError
from ._settings import CompactionSettings, Settings, apply_section

RETRY_CANCELLED = "Retry cancelled"
"""An aborted retry's ``auto_retry_end`` ``finalError``."""

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})

_OVERFLOW = "|".join([  # compiled by `re` at its first use, not at start-up
    r"prompt is too long", r"input is too long for requested model",
    r"exceeds the context window", r"input token count.*exceeds the maximum",
    r"maximum prompt length is \d+", r"reduce the length of the messages",
    r"maximum context length is \d+ tokens", r"exceeds the limit of \d+",
    r"exceeds the available context size", r"greater than the context length",
    r"context window exceeds limit", r"exceeded model token limit",
    r"too large for model with \d+ maximum context length", r"model_context_window_exceeded",
    r"context[_ ]length[_ ]exceeded", r"too many tokens", r"token limit exceeded",
    r"^4(00|13)\s*(status code)?\s*\(no body\)",
])


def is_context_overflow(message: str) -> bool:
    return re.search(_OVERFLOW, message, re.IGNORECASE) is not None


def is_retryable(error: ProviderError) -> bool:
    if is_context_overflow(str(error)):
        return False
    return (error.status in RETRY_STATUSES or "overloaded_error" in str(error)
            or isinstance(error, ProviderStreamError))


@attrs.define(kw_only=True, eq=False, repr=False)
class RetrySettings:
    enabled: bool = True
    max_retries: int = 3
    base_delay_ms: int = 2000
    max_delay_ms: int = 60000
    idle_timeout_ms: int = 120000
    """A stream silent this long fails as a retryable error."""

    @classmethod
    def from_settings(cls, section: object) -> RetrySettings:
        """From settings.json's ``retry`` object; values of the wrong type are ignored."""
        found = cls()
        apply_section(found, section, {
            "enabled": "enabled", "maxRetries": "max_retries", "baseDelayMs": "base_delay_ms",
            "maxDelayMs": "max_delay_ms", "idleTimeoutMs": "idle_timeout_ms"})
        return found

    def retry_delay_ms(self, attempt: int, error: ProviderError | None) -> int | None:
        """The wait before retry `attempt` after `error`, or None when it is not to be
        retried (retries off, not transient, out of attempts, or too long a wait)."""
        if (not self.enabled or error is None or not is_retryable(error)
                or attempt > self.max_retries):
            return None
        return self.delay_ms(attempt, error)

    def delay_ms(self, attempt: int, error: ProviderError) -> int | None:
        """The wait before retry `attempt` (1-based), or None when the server asks for longer
        than `max_delay_ms`."""
        delay: int = self.base_delay_ms * 2 ** (attempt - 1)
        if error.retry_after_s is not None:
            asked = int(error.retry_after_s * 1000)
            if asked > self.max_delay_ms:
                return None
            delay = max(delay, asked)
        return delay


@attrs.define(kw_only=True, eq=False, repr=False)
class RunSettings:
    """What the run driver reads of the session's settings (automatic retry and compaction),
    and where it keeps a client's change of them (None: nowhere)."""

    retry: RetrySettings
    compaction: CompactionSettings
    settings: Settings | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> RunSettings:
        return cls(retry=RetrySettings.from_settings(settings.get("retry")),
                   compaction=CompactionSettings.from_settings(settings.get("compaction")),
                   settings=settings)

    def set_auto_retry(self, enabled: bool) -> None:
        self.retry.enabled = enabled
        if self.settings is not None:
            self.settings.remember_in("retry", enabled=enabled)

    def set_auto_compaction(self, enabled: bool) -> None:
        self.compaction.enabled = enabled
        if self.settings is not None:
            self.settings.remember_in("compaction", enabled=enabled)
