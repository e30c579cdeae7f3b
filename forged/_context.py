"""The context a session file holds: what the active branch puts before the model
(docs/protocol.md, Sessions), read back from the file's entries; and `Context`, its one owner
while a session runs.

A compaction on the branch replaces what came before it with its summary, except the entries
it kept (from ``firstKeptEntryId``); other entries that carry no message are left out.
"""

from __future__ import annotations

import datetime
from typing import Any

from . import _codec, _wire as w
from ._errors import CommandError
from ._store import SessionFile


def recorded_model_of(store: SessionFile, path: list[int]) -> tuple[str, str] | None:
    """The model the branch last used: its latest ``model_change`` or assistant message."""
    for position in reversed(path):
        kind = store.kind(position)
        if kind == "model_change":
            entry = store.entry(position)
            return str(entry.get("provider")), str(entry.get("modelId"))
        if kind == "message":
            message = store.entry(position).get("message") or {}
            if message.get("role") == "assistant":
                return str(message.get("provider")), str(message.get("model"))
    return None


def content_text(content: Any, separator: str = "\n") -> str:
    """The text of stored content: a string, or the text blocks joined by `separator`."""
    if isinstance(content, str):
        return content
    return separator.join(block.get("text", "") for block in content or []
                          if isinstance(block, dict) and block.get("type") == "text")


def user_text(message: dict[str, Any]) -> str:
    """The text of a stored user message (its content is a string or blocks)."""
    return content_text(message.get("content"), separator="")


CONTEXT_KINDS = ("message", "custom_message", "branch_summary")


def context_positions(store: SessionFile) -> tuple[dict[str, Any] | None, list[int]]:
    """The latest compaction on the active branch (or None), and the positions of the
    message entries the context holds: those the compaction kept, then what came after."""
    positions = store.path_to_leaf()
    latest = latest_compaction(store, positions)
    summary = None
    if latest is not None:
        at, kept_from = latest
        summary = store.entry(positions[at])
        positions = positions[kept_from:at] + positions[at + 1:]
    return summary, [position for position in positions
                     if store.kind(position) in CONTEXT_KINDS]


def latest_compaction(store: SessionFile, path: list[int]) -> tuple[int, int] | None:
    """Where on `path` its latest compaction is, and where the entries it kept begin (the
    compaction's own index when its ``firstKeptEntryId`` is not on the path)."""
    at = max((i for i, position in enumerate(path) if store.kind(position) == "compaction"),
             default=None)
    if at is None:
        return None
    kept = store.entry(path[at]).get("firstKeptEntryId")
    return at, next((i for i in range(at) if store.entry_id(path[i]) == kept), at)


def stored_name(store: SessionFile) -> str | None:
    """The latest non-empty ``session_info`` name in the file (all branches)."""
    for position in reversed(range(len(store))):
        if store.kind(position) == "session_info":
            name = store.entry(position).get("name")
            if name:
                return str(name)
    return None


def context_size(store: SessionFile) -> int:
    summary, positions = context_positions(store)
    return len(positions) + (summary is not None)


def build_context(store: SessionFile) -> list[w.AgentMessage]:
    """The messages of the active branch (docs/protocol.md, Sessions): the latest
    compaction's summary first, then the entries it kept, then what came after. Only those
    entries are read back from the file."""
    summary, positions = context_positions(store)
    messages: list[w.AgentMessage] = []
    if summary is not None:
        messages.append(w.CompactionSummaryMessage(
            summary=str(summary.get("summary", "")),
            tokens_before=int(summary.get("tokensBefore") or 0),
            timestamp=entry_ms(summary)))
    for position in positions:
        message = context_message(store.entry(position))
        if message is not None:
            messages.append(message)
    return messages


def entry_ms(entry: dict[str, Any]) -> int:
    """An entry's ISO timestamp as milliseconds since the epoch (0 when unreadable)."""
    try:
        moment = datetime.datetime.fromisoformat(str(entry.get("timestamp")))
    except ValueError:
        return 0
    return int(moment.timestamp() * 1000)


def context_message(entry: dict[str, Any]) -> w.AgentMessage | None:
    """What an entry puts in the context, if anything; an entry forged cannot read (a message
    kind it does not know) stays in the file but out of the context."""
    value: Any
    if entry.get("type") == "message":
        value = entry.get("message")
    elif entry.get("type") == "custom_message":
        value = {"role": "custom", "timestamp": entry_ms(entry), "display": True,
                 **{k: entry[k] for k in ("customType", "content", "display", "details")
                    if k in entry}}
    elif entry.get("type") == "branch_summary" and entry.get("summary"):
        value = {"role": "branchSummary", "summary": entry["summary"],
                 "fromId": entry.get("fromId", "root"), "timestamp": entry_ms(entry)}
    else:
        return None
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("content"), str):  # the ancestor's short form of one text block
        value = {**value, "content": [{"type": "text", "text": value["content"]}]}
    try:
        return _codec.structure(value, w.AgentMessage)  # type: ignore[arg-type]
    except CommandError:
        return None


class Context:
    """What the model is given: the active branch's messages, read back from the session file
    on first use. The one owner of that list: a message enters the file first, then the list
    (`append`); a failed reply leaves the list but stays in the file (`drop_last_failed`); a
    compaction replaces the list with what its entry leaves (`replace`); another file makes
    it that file's (`rebase`). A run works on a copy (`forged._loop.run_agent`)."""

    def __init__(self, store: SessionFile) -> None:
        self.store = store
        self._messages: list[w.AgentMessage] | None = None

    @property
    def messages(self) -> list[w.AgentMessage]:
        if self._messages is None:
            self._messages = build_context(self.store)
        return self._messages

    def __len__(self) -> int:
        """How many messages, without reading them back if they were not yet."""
        return len(self._messages) if self._messages is not None else context_size(self.store)

    def append(self, message: w.AgentMessage) -> None:
        """`message` into the session file, then the context; `PersistenceError` (and in
        neither) when the file cannot be written."""
        self.store.append("message", message=_codec.unstructure(message))
        if self._messages is not None:  # else read back with it, once, when first needed
            self._messages.append(message)

    def drop_last_failed(self) -> bool:
        """Take the last message out of the context when it is a failed reply (a retry or
        an overflow recovery asks again without it); the file keeps it. True if it was."""
        messages = self.messages
        last = messages[-1] if messages else None
        if isinstance(last, w.AssistantMessage) and last.stop_reason == "error":
            messages.pop()
            return True
        return False

    def replace(self, messages: list[w.AgentMessage]) -> None:
        """After a compaction: the context its entry leaves."""
        self._messages = messages

    def rebase(self, store: SessionFile) -> None:
        """Another session file: its branch's context, read back when first needed."""
        self.store = store
        self._messages = None

    def last_prompt(self) -> w.UserMessage | None:
        """The last user message: the prompt (or steering) a run works on."""
        for message in reversed(self.messages):
            if isinstance(message, w.UserMessage):
                return message
        return None

    def last_assistant_text(self) -> str | None:
        """The text of the last reply that has some (an aborted one without any is
        skipped)."""
        for message in reversed(self.messages):
            if not isinstance(message, w.AssistantMessage):
                continue
            text = "".join(b.text for b in message.content if isinstance(b, w.TextContent))
            if message.stop_reason == "aborted" and not text.strip():
                continue
            return text.strip() or None
        return None
