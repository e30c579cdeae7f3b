"""What a session needs from its first exchange: content blocks, usage and models, messages,
the response and the session's state (``get_state``'s answer); and the helpers every wire class
is declared with."""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeAlias, TypeVar

import attrs

from .._vocabulary import THINKING_LEVELS as THINKING_LEVELS, ThinkingLevel as ThinkingLevel

KEEP_NULL = "forged.keep_null"
T = TypeVar("T")

JSONValue: TypeAlias = object
"""JSON that is someone else's, as it came: a tool call's arguments, a result's ``details``,
models.json's ``compat``. Read it with ``isinstance``; the converter passes it through as it
is (`forged._codec`)."""
JSONObject: TypeAlias = dict[str, JSONValue]


def tag(value: str) -> str:
    """The first field of a class, its wire ``type`` (or ``role``): not an argument."""
    return attrs.field(default=value, init=False)


def keep_null(default: T) -> T:
    """A field written as ``null`` instead of being omitted when it is None."""
    return attrs.field(default=default, metadata={KEEP_NULL: True})


QueueMode = Literal["all", "one-at-a-time"]
StopReason = Literal["pending", "stop", "length", "toolUse", "error", "aborted"]
"""``pending`` only in an assistant ``message_start``: the message is still streaming."""


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
    compat: JSONObject | None = None
    """models.json ``compat``: how the provider differs from its API's standard."""


# --- the response, and the state a session starts with ---------------------------------------

class Absent(enum.Enum):
    """The type of `ABSENT`, its one value: ``data is ABSENT`` and ``isinstance(data,
    Absent)`` both narrow ``X | Absent`` to X."""

    ABSENT = "ABSENT"

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = Absent.ABSENT
"""`Response.data` when the response has no ``data`` key (unlike a ``null`` data)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class Response:
    id: str | int | None = None
    type: str = tag("response")
    command: str
    success: bool
    data: object = ABSENT
    """The command's answer: its wire class (`forged.client.data_classes` names each
    command's), None, or `ABSENT`. A reader checks it is what it asked for (``isinstance``),
    as `forged.client.Client.call` does."""
    error: str | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class PromptAccepted:
    disposition: Literal["started", "queued", "handled"]


@attrs.define(kw_only=True, eq=False, repr=False)
class QueueContents:
    steering: list[str]
    follow_up: list[str]


@attrs.define(kw_only=True, eq=False, repr=False)
class GetState:
    """A client's first command, as a rule: here, so that answering it needs no other
    command's class (`forged._wire.commands` loads with the first of those)."""

    type: str = tag("get_state")


@attrs.define(kw_only=True, eq=False, repr=False)
class SessionState:
    model: Model | None = keep_null(None)
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


def _repr(self: object) -> str:
    cls = type(self)
    fields = ", ".join(f"{field.name}={getattr(self, field.name)!r}"
                       for field in (attrs.fields(cls) if attrs.has(cls) else ()) if field.init)
    return f"{cls.__name__}({fields})"


def share_repr(namespace: dict[str, object]) -> None:
    """Give the wire classes a module defines the one shared ``__repr__`` (attrs would compile
    one per class)."""
    for value in list(namespace.values()):
        if (isinstance(value, type) and attrs.has(value)
                and value.__module__ == namespace["__name__"]):
            value.__repr__ = _repr  # type: ignore[method-assign]


share_repr(globals())
