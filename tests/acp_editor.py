"""The editor's side of the Agent Client Protocol in the tests: the official Python SDK's
`Client`, recording every session update and permission request, answering permissions as
told, and (when given buffers) serving file reads and writes from memory, as an editor serves
its unsaved buffers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

# Any, as importorskip returns it: the SDK stays untyped here (typed, its Client protocol asks
# for terminal, elicitation and extension methods an editor in a test never offers).
acp: Any = pytest.importorskip("acp")

Choose = Callable[[list[Any]], "str | None"]


def first_option(options: list[Any]) -> str | None:
    return str(options[0].option_id)


class Editor(acp.Client):  # type: ignore[misc]  # subclasses Any: acp is untyped here
    def __init__(self, streaming_marker: str = "slow slow", *, choose: Choose = first_option,
                 buffers: dict[str, str] | None = None) -> None:
        self.updates: list[Any] = []
        self.streaming = asyncio.Event()
        """Set once the reply text holds `streaming_marker`: a run is under way."""
        self._marker = streaming_marker
        self.commands = asyncio.Event()
        """Set once the agent listed its commands."""
        self._choose = choose
        self.permissions: list[Any] = []
        """Each permission request's tool call and options."""
        self.buffers = buffers
        """Open files by path; None: the editor offers no file system."""
        self.file_calls: list[tuple[str, str]] = []

    def capabilities(self) -> Any:
        offered = self.buffers is not None
        return acp.schema.ClientCapabilities(fs=acp.schema.FileSystemCapabilities(
            read_text_file=offered, write_text_file=offered))

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update)
        if self._marker in self.said():
            self.streaming.set()
        if type(update).__name__ == "AvailableCommandsUpdate":
            self.commands.set()

    async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                 **_: Any) -> Any:
        self.permissions.append((tool_call, options))
        chosen = self._choose(options)
        outcome = ({"outcome": "cancelled"} if chosen is None else
                   {"outcome": "selected", "optionId": chosen})
        return acp.RequestPermissionResponse(outcome=outcome)

    async def read_text_file(self, session_id: str, path: str, line: int | None = None,
                             limit: int | None = None, **_: Any) -> Any:
        assert self.buffers is not None
        self.file_calls.append(("read", path))
        if path not in self.buffers:
            raise acp.RequestError.resource_not_found(path)
        return acp.ReadTextFileResponse(content=self.buffers[path])

    async def write_text_file(self, session_id: str, path: str, content: str,
                              **_: Any) -> Any:
        assert self.buffers is not None
        self.file_calls.append(("write", path))
        self.buffers[path] = content
        return acp.WriteTextFileResponse()

    def kinds(self) -> list[str]:
        return [type(update).__name__ for update in self.updates]

    def said(self) -> str:
        """The agent's message text so far (a resource's URI where it sent one)."""
        return "".join(getattr(u.content, "text", "") or getattr(u.content, "uri", "")
                       for u in self.updates if type(u).__name__ == "AgentMessageChunk")
