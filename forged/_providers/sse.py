"""Server-sent events on bytes: the decoder every wire API's stream goes through."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

import orjson
import trio

from .._errors import ProviderStreamError
from .base import AssistantBuilder


class SseDecoder:
    """Server-sent events split on bytes: only LF (or CRLF) ends a line, never U+2028."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """The events completed by `chunk`, as (event name, data) pairs."""
        buffer = self._buffer + chunk if self._buffer else chunk
        if not self._data and not self._event and b"\r" not in buffer:
            return self._whole_events(buffer)
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        events: list[tuple[bytes, bytes]] = []
        data = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    events.append((self._event, data[0] if len(data) == 1 else b"\n".join(data)))
                    data = self._data = []
                self._event = b""
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"event:"):
                self._event = line[6:].strip()
        return events

    def _whole_events(self, buffer: bytes) -> list[tuple[bytes, bytes]]:
        """`feed` where no event is half read and no line ends in CR (every stream the
        services send): the events whole, each split on its own; the last, incomplete one
        kept as it came."""
        blocks = buffer.split(b"\n\n")
        self._buffer = blocks.pop()
        events: list[tuple[bytes, bytes]] = []
        for block in blocks:
            name = b""
            data: list[bytes] = []
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    data.append(line[6:] if line[5:6] == b" " else line[5:])
                elif line.startswith(b"event:"):
                    name = line[6:].strip()
                elif not line:  # (an empty line in the block: the block's first was empty)
                    if data:
                        events.append((name, data[0] if len(data) == 1 else b"\n".join(data)))
                        data = []
                    name = b""
            if data:
                events.append((name, data[0] if len(data) == 1 else b"\n".join(data)))
        return events


def silent(seconds: float) -> ProviderStreamError:
    return ProviderStreamError(f"The provider sent nothing for {seconds:g} seconds")


async def timed_chunks(chunks: AsyncIterator[bytes], out: AssistantBuilder,
                       idle_timeout_s: float) -> AsyncGenerator[bytes, None]:
    """`chunks`, each once the client has room for more (`AssistantBuilder.wait_for_room`);
    a stream that sends nothing for `idle_timeout_s` fails with `ProviderStreamError`."""
    received = aiter(chunks)
    while True:
        with trio.move_on_after(idle_timeout_s) as idle:
            chunk = await anext(received, None)
        if idle.cancelled_caught:
            raise silent(idle_timeout_s)
        if chunk is None:
            return
        await out.wait_for_room()
        yield chunk


async def sse_events(chunks: AsyncIterator[bytes], out: AssistantBuilder,
                     idle_timeout_s: float) -> AsyncGenerator[tuple[bytes, object], None]:
    """(event name, parsed JSON data) pairs; ``[DONE]`` ends the stream. A stream that
    sends nothing for `idle_timeout_s` fails with `ProviderStreamError`. The data is the
    service's JSON, unchecked: each wire API reads it through its own reader (`json_object`)."""
    decoder = SseDecoder()
    async with aclosing(timed_chunks(chunks, out, idle_timeout_s)) as timed:
        async for chunk in timed:
            for event, data in decoder.feed(chunk):
                if data == b"[DONE]":
                    return
                try:
                    yield event, orjson.loads(data)
                except orjson.JSONDecodeError as exc:
                    raise ProviderStreamError(f"Malformed stream event: {exc}") from exc


def json_object(data: object) -> dict[str, object]:
    """A decoded stream event as the JSON object every wire API's events are; a
    `ProviderStreamError` when it is some other JSON value. Each wire API's event reader
    starts here and casts the object to its format's event type."""
    if not isinstance(data, dict):
        raise ProviderStreamError(f"Malformed stream event: not a JSON object: {data!r:.100}")
    return data
