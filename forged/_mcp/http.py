"""The HTTP transport of MCP's streamable-HTTP servers: httpx2's, retrying what is likely to
pass a moment later, as the ancestor does, and refusing a message past ``maxResultBytes``
as it arrives (a JSON answer, or one event of a stream), never holding more of it.

Imported by a streamable-HTTP server's connection only (``httpx2`` with it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx2
import trio

from .._errors import ForgedError
from .._log import log

RETRIES = 2
RETRIED_STATUSES = frozenset({408, 429, *range(500, 600)})
FIRST_BACKOFF_S = 0.25
SSE_SLACK_BYTES = 64 * 1024
"""The SDK's own bound on an event is set this much above the limit: ours cuts first, with
the error that names it."""


class MessageTooLarge(httpx2.StreamError, ForgedError):
    """A JSON answer past the limit (the SDK answers its request with this error)."""


class EventTooLarge(httpx2.SSEError, ForgedError):
    """An event of a stream past the limit (the SDK ends the request it answers)."""


class _Bounded(httpx2.AsyncByteStream):
    """A response body read no further than one message past `max_bytes`: the whole body
    for JSON, each event (up to a blank line) for an event stream."""

    def __init__(self, inner: httpx2.AsyncByteStream, *, events: bool, max_bytes: int,
                 cut: Callable[[str], str]) -> None:
        self._inner = inner
        self._events = events
        self._max_bytes = max_bytes
        self._cut = cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        tail = b""  # the end of what came, to find an event's end across chunks
        async for chunk in self._inner:
            if self._events:
                seen = tail + chunk
                end = max(seen.rfind(b"\n\n"), seen.rfind(b"\r\n\r\n"))
                size = len(seen) - end - 2 if end >= 0 else size + len(chunk)
                tail = seen[-3:]
            else:
                size += len(chunk)
            if size > self._max_bytes:
                what = "an event the server sent" if self._events else "the server's answer"
                raise (EventTooLarge if self._events else MessageTooLarge)(self._cut(what))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class RetryingTransport(httpx2.AsyncBaseTransport):
    """Sends a request again, at most `RETRIES` times with a doubling pause, when it fails on
    the network or is answered 408, 429 or 5xx; the last answer or error is the caller's."""

    def __init__(self, name: str, max_bytes: int, cut: Callable[[str], str]) -> None:
        self._name = name
        self._max_bytes = max_bytes
        self._cut = cut
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._send(request)
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind in ("application/json", "text/event-stream"):
            stream = response.stream
            assert isinstance(stream, httpx2.AsyncByteStream)
            response.stream = _Bounded(stream, events=kind == "text/event-stream",
                                       max_bytes=self._max_bytes, cut=self._cut)
        return response

    async def _send(self, request: httpx2.Request) -> httpx2.Response:
        for attempt in range(RETRIES + 1):
            last = attempt == RETRIES
            try:
                response = await self._inner.handle_async_request(request)
            except httpx2.TransportError as exc:
                if last:
                    raise
                why = repr(exc)
            else:
                if last or response.status_code not in RETRIED_STATUSES:
                    return response
                await response.aclose()
                why = f"HTTP {response.status_code}"
            pause = FIRST_BACKOFF_S * 2 ** attempt
            log(f"MCP server {self._name}: {request.method} {request.url} failed ({why}); "
                f"again in {pause:g} s")
            await trio.sleep(pause)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._inner.aclose()
