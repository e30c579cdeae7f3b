"""A session's events as ACP ``session/update`` notifications, dispatched on the events' wire
classes; and a stored branch replayed as the editor saw it arrive.

- the reply's text and thinking deltas: ``agent_message_chunk``, ``agent_thought_chunk``;
- a tool's start: ``tool_call`` (a kind, a title, the raw input, a path's location);
- its end: ``tool_call_update``, ``completed`` or ``failed``, the result's text and, for an
  edit or a write, a ``diff``;
- a reply's usage: ``usage_update``, the context against the model's window and the cost so
  far.

When the editor reads terminals from ``_meta`` (its ``_meta.terminal_output`` capability),
a ``bash`` call is a terminal of the editor's: ``terminal_info`` on its ``tool_call``, its
output's new bytes in order as ``terminal_output`` on each update, and ``terminal_exit``
with the exit code at its end. forged runs the command itself, under its own policy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ... import _wire as w

TAIL_MATCH_CHARS = 256
"""How much of the output last shown finds its place in a newer tail of the output."""
TOOL_KINDS = {"read": "read", "edit": "edit", "write": "edit", "bash": "execute",
              "grep": "search", "find": "search", "ls": "search"}

Update = dict[str, object]
Arguments = dict[str, object]


def title(tool: str, arguments: Arguments) -> str:
    detail = arguments.get("path") or arguments.get("command") or arguments.get("pattern")
    return f"{tool} {detail}" if isinstance(detail, str) else tool


class Translator:
    """One session's updates, sent through `update`."""

    def __init__(self, update: Callable[[Update], None], cwd: Path, *,
                 terminal_output: bool = False) -> None:
        self._update = update
        self._cwd = cwd
        self._terminal_output = terminal_output
        self._shown: dict[str, str] = {}
        """Each running terminal's output as last shown (a tail of it)."""
        self.window: int | None = None
        """The model's context window, for ``usage_update`` (None: none is sent)."""
        self._cost = 0.0
        self._arguments: dict[str, Arguments] = {}
        """Each running tool call's arguments, for the diff its end shows."""

    def event(self, event: w.Event) -> None:
        if isinstance(event, w.MessageUpdate):
            inner = event.assistant_message_event
            if isinstance(inner, w.TextDelta):
                self._chunk("agent_message_chunk", inner.delta)
            elif isinstance(inner, w.ThinkingDelta):
                self._chunk("agent_thought_chunk", inner.delta)
        elif isinstance(event, w.ToolExecutionStart):
            self.tool_started(event.tool_call_id, event.tool_name, dict(event.args))
        elif isinstance(event, w.ToolExecutionUpdate) and event.tool_call_id in self._shown:
            self._terminal(event.tool_call_id, w.text_of(event.partial_result.content, ""))
        elif isinstance(event, w.ToolExecutionEnd):
            self.tool_ended(event.tool_call_id, event.tool_name, event.is_error,
                            w.text_of(event.result.content, ""), event.result.structured_content)
        elif isinstance(event, w.MessageEnd) and isinstance(event.message, w.AssistantMessage):
            self._usage(event.message.usage)

    def _chunk(self, kind: str, text: str) -> None:
        self._update({"sessionUpdate": kind, "content": {"type": "text", "text": text}})

    def tool_started(self, call_id: str, tool: str, arguments: Arguments, *,
                     live: bool = True) -> None:
        self._arguments[call_id] = arguments
        update: Update = {
            "sessionUpdate": "tool_call", "toolCallId": call_id,
            "title": title(tool, arguments), "kind": TOOL_KINDS.get(tool, "other"),
            "status": "in_progress", "rawInput": arguments}
        path = arguments.get("path")
        if isinstance(path, str):
            update["locations"] = [{"path": str(self._cwd / path)}]
        if live and self._terminal_output and tool == "bash":
            self._shown[call_id] = ""
            update["content"] = [{"type": "terminal", "terminalId": call_id}]
            update["_meta"] = {"terminal_info": {"terminal_id": call_id,
                                                 "cwd": str(self._cwd)}}
        self._update(update)

    def _terminal(self, call_id: str, tail: str) -> None:
        """A running terminal's output grew: its new bytes."""
        added = self._added(call_id, tail)
        if added:
            self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                          "_meta": {"terminal_output": {"terminal_id": call_id,
                                                        "data": added}}})

    def _added(self, call_id: str, tail: str) -> str:
        """What `tail` (the output's end now) holds past what was shown: the editor appends
        it. A tail that moved past all of it is shown whole."""
        shown, self._shown[call_id] = self._shown.get(call_id, ""), tail
        if tail.startswith(shown):
            return tail[len(shown):]
        mark = shown[-TAIL_MATCH_CHARS:]
        found = tail.rfind(mark)
        return tail[found + len(mark):] if found >= 0 else tail

    def tool_ended(self, call_id: str, tool: str, failed: bool, text: str,
                   structured: dict[str, object] | None = None) -> None:
        content: list[Update] = [{"type": "content",
                                  "content": {"type": "text", "text": text}}]
        arguments = self._arguments.pop(call_id, {})
        if not failed:
            content += self._diff(tool, arguments)
        update: Update = {"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                          "status": "failed" if failed else "completed", "content": content}
        if call_id in self._shown:
            output = (structured or {}).get("output")
            code = (structured or {}).get("exit_code")
            added = self._added(call_id, output if isinstance(output, str) else text)
            del self._shown[call_id]
            meta: Update = {"terminal_exit": {
                "terminal_id": call_id, "signal": None,
                "exit_code": code if isinstance(code, int) else None}}
            if added:
                meta["terminal_output"] = {"terminal_id": call_id, "data": added}
            update["_meta"] = meta
            update["content"] = [{"type": "terminal", "terminalId": call_id},
                                 *(content if failed else [])]
        self._update(update)

    def _diff(self, tool: str, arguments: Arguments) -> list[Update]:
        """What an edit or a write changed, as the editor shows it: the replaced text and
        its replacement, or a new file's whole content."""
        path = arguments.get("path")
        if not isinstance(path, str):
            return []
        where = str(self._cwd / path)
        new_text, content = arguments.get("newText"), arguments.get("content")
        if tool == "edit" and isinstance(new_text, str):
            return [{"type": "diff", "path": where, "oldText": arguments.get("oldText"),
                     "newText": new_text}]
        if tool == "write" and isinstance(content, str):
            return [{"type": "diff", "path": where, "oldText": None, "newText": content}]
        return []

    def _usage(self, usage: w.Usage) -> None:
        """The context's size after a reply, against the model's window, and the session's
        cost so far."""
        self._cost += usage.cost.total
        if self.window is None:
            return
        used = usage.total_tokens or (usage.input + usage.output + usage.cache_read
                                      + usage.cache_write)
        self._update({"sessionUpdate": "usage_update", "used": used, "size": self.window,
                      "cost": {"amount": self._cost, "currency": "USD"}})

    def replay(self, messages: list[w.AgentMessage]) -> None:
        """The active branch as the editor saw it arrive (``session/load``): the same
        updates, tool calls with their locations and diffs; and the cost spent so far."""
        for message in messages:
            if isinstance(message, w.UserMessage):
                said = w.text_of(message.content, "")
                if said:
                    self._update({"sessionUpdate": "user_message_chunk",
                                  "content": {"type": "text", "text": said}})
            elif isinstance(message, w.AssistantMessage):
                self._cost += message.usage.cost.total
                for part in message.content:
                    if isinstance(part, w.ThinkingContent) and part.thinking:
                        self._chunk("agent_thought_chunk", part.thinking)
                    elif isinstance(part, w.TextContent) and part.text:
                        self._chunk("agent_message_chunk", part.text)
                    elif isinstance(part, w.ToolCall):
                        self.tool_started(part.id, part.name, dict(part.arguments),
                                          live=False)
            elif isinstance(message, w.ToolResultMessage):
                self.tool_ended(message.tool_call_id, message.tool_name, message.is_error,
                                w.text_of(message.content, ""))
