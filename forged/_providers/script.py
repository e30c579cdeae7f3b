"""A scripted provider's script: the replies it plays, as a script file writes them
(`forged._providers.scripted` serves them, `forged._providers.formats` writes them in each
API's streaming format)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import attrs
import orjson

from .. import _codec
from .._errors import ConfigError
from .._wire import tag


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptText:
    type: str = tag("text")
    text: str
    chunks: int = 1
    delay_ms: float = 0


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptThinking:
    type: str = tag("thinking")
    thinking: str
    signature: str = "scripted-signature"
    chunks: int = 1
    delay_ms: float = 0


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptRedactedThinking:
    type: str = tag("redactedThinking")
    data: str


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptToolCall:
    type: str = tag("toolCall")
    name: str
    arguments: dict[str, object]
    id: str | None = None
    chunks: int = 1
    delay_ms: float = 0


ScriptBlock = ScriptText | ScriptThinking | ScriptRedactedThinking | ScriptToolCall


@attrs.define(kw_only=True, eq=False, repr=False)
class ScriptUsage:
    input: int = 10
    output: int = 5
    cache_read: int = 0
    cache_write: int = 0


@attrs.define(kw_only=True, eq=False, repr=False)
class Reply:
    """One model response, or one failure."""

    content: list[ScriptBlock] = attrs.field(factory=list)
    usage: ScriptUsage = attrs.field(factory=ScriptUsage)
    stop_reason: Literal["stop", "length", "toolUse"] | None = None
    delay_ms: float = 0
    status: int | None = None
    error_type: str = "api_error"
    error_message: str = "Scripted error"
    retry_after: float | None = None
    cut: bool = False
    hang: bool = False
    """Answer 200, then send nothing."""
    silent: bool = False
    """Take the request and never answer it."""


@attrs.define(kw_only=True, eq=False, repr=False)
class Script:
    api: str = "anthropic-messages"
    replies: list[Reply] = attrs.field(factory=list)


def load_script(path: str | Path) -> Script:
    try:
        raw = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"Cannot read script {path}: {exc}") from exc
    try:
        return _codec.structure(raw, Script)
    except Exception as exc:
        raise ConfigError(f"Invalid script {path}: {exc}") from exc
