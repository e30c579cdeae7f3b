"""The editor's side of the Agent Client Protocol in the tests: the official Python SDK's
`Client`, recording every session update and allowing what it is asked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

acp = pytest.importorskip("acp")


class Editor(acp.Client):  # type: ignore[misc]
    def __init__(self, streaming_marker: str = "slow slow") -> None:
        self.updates: list[Any] = []
        self.streaming = asyncio.Event()
        """Set once the reply text holds `streaming_marker`: a run is under way."""
        self._marker = streaming_marker
        self.commands = asyncio.Event()
        """Set once the agent listed its commands."""

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update)
        if self._marker in self.said():
            self.streaming.set()
        if type(update).__name__ == "AvailableCommandsUpdate":
            self.commands.set()

    async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                 **_: Any) -> Any:
        return acp.RequestPermissionResponse(
            outcome={"outcome": "selected", "optionId": options[0].option_id})

    def kinds(self) -> list[str]:
        return [type(update).__name__ for update in self.updates]

    def said(self) -> str:
        """The agent's message text so far (a resource's URI where it sent one)."""
        return "".join(getattr(u.content, "text", None) or getattr(u.content, "uri", "")
                       for u in self.updates if type(u).__name__ == "AgentMessageChunk")
