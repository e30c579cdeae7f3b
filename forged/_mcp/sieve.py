"""Between a server's transport and the SDK's session: a ``tools/list`` answer loses the tools
no model API would take before the SDK reads it.

The SDK checks an answer against the negotiated protocol version's types, and one tool whose
``inputSchema`` is not an object's (valid from MCP 2026-07-28 on) fails the whole listing,
and with it the server. Such a tool is skipped with a line on stderr; the others are offered.
"""

from __future__ import annotations

from typing import Any

from .._log import log


def object_schema(schema: Any) -> bool:
    """Whether `schema` is a JSON schema of an object, as model APIs require of a tool's."""
    return isinstance(schema, dict) and schema.get("type", "object") == "object"


class Sieve:
    """The read and write streams of one connection, as the SDK's session uses them (``async
    with``, ``async for`` and ``send``), with the requests' methods noted on the way out and
    the listings sifted on the way in."""

    def __init__(self, name: str, read: Any, write: Any) -> None:
        self._name = name
        self._read = read
        self._write = write
        self._listing: set[Any] = set()
        """The ids of ``tools/list`` requests not answered yet."""
        self.read = _Reading(self)
        self.write = _Writing(self)

    async def send(self, session_message: Any) -> None:
        message = session_message.message
        if getattr(message, "method", None) == "tools/list" and hasattr(message, "id"):
            self._listing.add(message.id)
        await self._write.send(session_message)

    def sift(self, item: Any) -> Any:
        message = getattr(item, "message", None)
        request_id = getattr(message, "id", None)
        if request_id is None or request_id not in self._listing:
            return item
        self._listing.discard(request_id)
        result = getattr(message, "result", None)
        if not isinstance(result, dict):
            return item
        tools = result.get("tools")
        if isinstance(tools, list):
            kept = []
            for tool in tools:
                if isinstance(tool, dict) and object_schema(tool.get("inputSchema")):
                    kept.append(tool)
                else:
                    name = tool.get("name") if isinstance(tool, dict) else None
                    log(f"MCP server {self._name}: tool {name!r} skipped: its inputSchema is "
                        "not a JSON schema of an object")
            result["tools"] = kept
        return item


class _Reading:
    def __init__(self, sieve: Sieve) -> None:
        self._sieve = sieve

    @property
    def last_context(self) -> Any:
        return getattr(self._sieve._read, "last_context", None)

    async def __aenter__(self) -> _Reading:
        await self._sieve._read.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> Any:
        return await self._sieve._read.__aexit__(*exc)

    def __aiter__(self) -> _Reading:
        return self

    async def __anext__(self) -> Any:
        return self._sieve.sift(await self._sieve._read.__anext__())

    async def receive(self) -> Any:
        return self._sieve.sift(await self._sieve._read.receive())

    def close(self) -> None:
        self._sieve._read.close()

    async def aclose(self) -> None:
        await self._sieve._read.aclose()


class _Writing:
    def __init__(self, sieve: Sieve) -> None:
        self._sieve = sieve

    async def __aenter__(self) -> _Writing:
        await self._sieve._write.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> Any:
        return await self._sieve._write.__aexit__(*exc)

    async def send(self, session_message: Any) -> None:
        await self._sieve.send(session_message)

    def close(self) -> None:
        self._sieve._write.close()

    async def aclose(self) -> None:
        await self._sieve._write.aclose()
