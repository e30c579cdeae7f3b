"""The HTTP transport of MCP's streamable-HTTP servers: httpx2's, retrying what is likely to
pass a moment later, as the ancestor does.

Imported by a streamable-HTTP server's connection only (``httpx2`` with it).
"""

from __future__ import annotations

import httpx2
import trio

from ._log import log

RETRIES = 2
RETRIED_STATUSES = frozenset({408, 429, *range(500, 600)})
FIRST_BACKOFF_S = 0.25


class RetryingTransport(httpx2.AsyncBaseTransport):
    """Sends a request again, at most `RETRIES` times with a doubling pause, when it fails on
    the network or is answered 408, 429 or 5xx; the last answer or error is the caller's."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
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
