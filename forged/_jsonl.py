"""LF-only JSON-lines framing.

Input is split on ``\\n`` only (never on U+2028, U+2029 or other Unicode line breaks), one
trailing ``\\r`` is stripped, and a final line without ``\\n`` is still a line. Output escapes
U+2028 and U+2029 so clients that split on them keep working; everything else non-ASCII is raw
UTF-8. A field's wire name is its Python name in camelCase (`camel`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import orjson

_CAMEL = re.compile(r"_([a-z0-9])")


def camel(name: str) -> str:
    """``first_kept_entry_id`` -> ``firstKeptEntryId``."""
    return _CAMEL.sub(lambda m: m.group(1).upper(), name)


MAX_LINE_BYTES = 64 * 1024 * 1024 + 64 * 1024
"""Longest accepted input line: 64 MiB of payload plus room for the JSON around it."""


class LineTooLong:
    """Marks a line that exceeded `MAX_LINE_BYTES`; its bytes were discarded."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


class LineSplitter:
    """Turns a byte stream into lines, holding at most `max_line_bytes` of one line."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._parts: list[bytes] = []
        self._held = 0
        self._discarding = 0  # bytes dropped so far of an over-long line, 0 when not dropping

    def feed(self, data: bytes) -> Iterator[bytes | LineTooLong]:
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._hold(data[start:])
                return
            yield from self._finish(data[start:end])
            start = end + 1

    @property
    def holding(self) -> bool:
        """Part of a line has come, its newline not yet."""
        return bool(self._held or self._discarding)

    def close(self) -> Iterator[bytes | LineTooLong]:
        """The stream ended: a final line without a newline is still a line."""
        if self._held or self._discarding:
            yield from self._finish(b"")

    def _hold(self, piece: bytes) -> None:
        if not piece:
            return
        if self._discarding:
            self._discarding += len(piece)
            return
        self._held += len(piece)
        if self._held > self._max:
            self._discarding = self._held
            self._parts.clear()
            self._held = 0
        else:
            self._parts.append(piece)

    def _finish(self, tail: bytes) -> Iterator[bytes | LineTooLong]:
        if self._discarding:
            size = self._discarding + len(tail)
            self._discarding = 0
            yield LineTooLong(size)
            return
        if self._held + len(tail) > self._max:
            size = self._held + len(tail)
            self._parts.clear()
            self._held = 0
            yield LineTooLong(size)
            return
        if self._parts:
            self._parts.append(tail)
            line = b"".join(self._parts)
            self._parts.clear()
            self._held = 0
        else:
            line = tail
        if line.endswith(b"\r"):
            line = line[:-1]
        yield line


_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False)


def encode_line(value: Any) -> bytes:
    """One JSON value as one protocol line, newline included."""
    try:
        data = orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        # orjson refuses lone surrogates (legal as JSON escapes) and integers beyond 64 bits:
        # the standard library writes both, escaped.
        return _ASCII_ENCODER.encode(value).encode("ascii") + b"\n"
    return separators_escaped(data)


def separators_escaped(data: bytes) -> bytes:
    """orjson's output with U+2028 and U+2029 escaped, as a line of the protocol has them
    (JavaScript's line separators: a reader splitting on them would cut the line)."""
    if not data.isascii() and (b"\xe2\x80\xa8" in data or b"\xe2\x80\xa9" in data):
        data = data.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
    return data


MAX_DEPTH = 254
"""The deepest nesting of arrays and objects read: as deep as orjson writes. Deeper input is
refused before anything recurses over it (the standard library's JSON and cattrs recurse on
the interpreter's stack)."""
_LONG_INTEGER = re.compile(rb"\d{20}")


def decode_json(data: bytes) -> Any:
    """Parse one JSON document, UTF-8 and nested at most `MAX_DEPTH` deep; raises
    `ValueError` with the reason. Lone surrogate escapes are refused (no provider would take
    the text); integers past 64 bits keep every digit."""
    try:
        value = orjson.loads(data)  # its own depth limit (1024) never recurses in Python
    except orjson.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH:
        try:
            orjson.dumps(value)  # how deep, measured in C: it refuses past MAX_DEPTH
        except orjson.JSONEncodeError:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    if _LONG_INTEGER.search(data):
        value = json.loads(data)  # orjson reads integers past 64 bits as floats
    return value
