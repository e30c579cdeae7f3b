"""One peer: a reader that turns lines into commands, and one writer that owns the output.

Everything a peer sees (responses, events) goes through its `Outbox` as encoded lines, in the
order it was produced; only the outbox writes to the peer's stream (straight away while the
peer keeps up, else from its writer task). A `Connection` is that skeleton, the same for every
front and transport; a front says what a command does, what the end of input waits for, and
what a peer that went away means.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Protocol, cast

import attrs
import trio

from . import _codec, _wire as w
from ._errors import WireError
from ._jsonl import LineSplitter, LineTooLong, decode_json

SHUTDOWN_GRACE_S = 2.5
"""Once a front is told to stop (a signal, a client gone), how long the run has to write its
closing events, and the prompts to be answered."""
FLUSH_S = 2.0
"""How long a stopping daemon waits for each client to take what is left for it."""
READ_CHUNK_BYTES = 256 * 1024
COMMAND_QUEUE_SIZE = 256
"""Parsed commands waiting for their handler; past it the reader stops reading."""
OUTBOX_HIGH_WATER_BYTES = 4 * 1024 * 1024
"""A producer that checks for room (the agent loop does) waits while more than this is unread."""


class Outbox:
    """The single ordered output channel of one peer.

    Lines are appended to one buffer, which the writer takes whole: batching comes free, and
    no per-line object stays alive while the peer is slow. `put` never blocks (closing events
    must be written even while cancelled); producers that can wait call `wait_for_room`, so
    memory stays bounded when the peer reads slowly.

    With `write_now` (a non-blocking write to the peer's descriptor, see `write_now_to`), a
    line put while nothing is pending or being written goes straight to the kernel: the
    writer task wakes only when the peer's buffer is full. Order holds, since a line is
    written directly only when no earlier byte waits.
    """

    def __init__(self, high_water_bytes: int = OUTBOX_HIGH_WATER_BYTES,
                 write_now: Callable[[bytes], int] | None = None) -> None:
        self._pending = bytearray()
        self._high_water = high_water_bytes
        self._wakeup = trio.Event()
        self._room = trio.Event()
        self._room.set()
        self._closed = False
        self._broken = False
        self._write_now = write_now
        self._writing = False
        self._progress_at = 0.0
        self.flushed = trio.Event()
        """Set when the writer stopped: all was written, or the peer is gone."""

    def put(self, line: bytes) -> None:
        if self._closed or self._broken:
            return  # closed, or the peer is gone: nobody will read it
        if self._write_now is not None and not self._writing:
            if _coalescing is not None and (not self._pending or self in _coalescing):
                if not self._pending:  # written as the burst ends (`coalesced`)
                    _coalescing.append(self)
                self._pending += line
                return
            if not self._pending:
                self._write_now_or_queue(line)
                return
        self._queue(line)

    def _queue(self, data: bytes) -> None:
        """`data` after what is pending, for the writer."""
        self._pending += data
        self._wakeup.set()
        if len(self._pending) > self._high_water and self._room.is_set():
            self._room = trio.Event()

    def _write_now_or_queue(self, line: bytes) -> None:
        """`line`, nothing pending before it, to the peer now, as much as it takes; the
        rest is queued for the writer."""
        assert self._write_now is not None
        try:
            written = self._write_now(line)
        except OSError:  # the peer is gone; the writer reports it
            self._broken = True
            self._wakeup.set()
            return
        if written < len(line):
            self._queue(line[written:])

    def _release(self) -> None:
        """What `coalesced` held, written now as one (or left to the writer)."""
        if not self._pending:
            return
        if self._write_now is None or self._writing:
            self._wakeup.set()
            return
        held, self._pending = bytes(self._pending), bytearray()
        self._write_now_or_queue(held)

    async def wait_for_room(self) -> None:
        while len(self._pending) > self._high_water and not self._broken:
            await self._room.wait()

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    @property
    def stalled_s(self) -> float:
        """How long the batch being written has waited for the peer to take it (0 when
        nothing is being written)."""
        return trio.current_time() - self._progress_at if self._writing else 0.0

    def close(self) -> None:
        """No more lines: the writer finishes once what is pending is written."""
        self._closed = True
        self._wakeup.set()

    async def serve_writer(self, stream: trio.abc.SendStream) -> bool:
        """Write until the outbox is closed and drained.

        Returns False if the peer stopped reading (a broken pipe): what is left is dropped.
        """
        return await self.serve(stream.send_all)

    async def serve(self, write: Callable[[bytearray], Awaitable[None]]) -> bool:
        """`serve_writer` with `write` taking each batch of whole lines."""
        try:
            while not self._broken:
                if not self._pending:
                    if self._closed:
                        return True
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    continue
                data, self._pending = self._pending, bytearray()
                self._room.set()
                self._writing = True
                self._progress_at = trio.current_time()
                try:
                    await write(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._broken = True
                finally:
                    self._writing = False
            self._pending.clear()
            self._room.set()
            return False
        finally:
            # Once the writer is gone the descriptor may be closed, and its number reused.
            self._write_now = None
            self.flushed.set()


_coalescing: list[Outbox] | None = None
"""The outboxes lines were put in during `coalesced` (else None)."""


@contextlib.contextmanager
def coalesced() -> Iterator[None]:
    """Lines put meanwhile reach each peer in one write as the block ends, not one write a
    line: a burst of events (an aborted run's closing) wakes a client once. For a stretch
    that does not wait: nothing else runs while the lines are held."""
    global _coalescing
    if _coalescing is not None:  # an outer block writes them
        yield
        return
    _coalescing = []
    try:
        yield
    finally:
        held, _coalescing = _coalescing, None
        for outbox in held:
            outbox._release()


def write_now_to(stream: object) -> Callable[[bytes], int] | None:
    """For `Outbox`: a write of what the kernel takes now of a line, if `stream` is a pipe
    or a socket (trio made its descriptor non-blocking)."""
    if isinstance(stream, trio.lowlevel.FdStream):
        fd = stream.fileno()
    elif isinstance(stream, trio.SocketStream):
        fd = stream.socket.fileno()
    else:
        return None

    def write(line: bytes) -> int:
        try:
            return os.write(fd, line)
        except BlockingIOError:
            return 0

    return write


# --- reading commands --------------------------------------------------------------------------

def response(command: str, command_id: str | int | None = None, *,
              data: object = w.ABSENT, error: str | None = None) -> w.Response:
    """A response: a success with its `data`, or a failure saying `error`. Every response
    forged writes is built here."""
    return w.Response(id=command_id, command=command, success=error is None,
                      data=data if error is None else w.ABSENT, error=error)


@attrs.define(kw_only=True, eq=False, repr=False)
class Incoming:
    """One input line: a command, or the response that refuses it."""

    command: w.Command | w.DaemonCommand | None = None
    command_id: str | int | None = None
    refusal: w.Response | None = None


def _refuse(command: str, error: str, command_id: str | int | None = None) -> Incoming:
    return Incoming(refusal=response(command, command_id, error=error), command_id=command_id)


def parse_line(line: bytes, classes: Mapping[str, type[object]] = w.COMMAND_CLASSES
               ) -> Incoming | None:
    """Read one line as one of `classes`' commands; None for a blank line (ignored)."""
    if not line.strip():
        return None
    try:
        raw = decode_json(line)
    except (ValueError, RecursionError) as exc:
        return _refuse("parse", f"Failed to parse command: {exc}")
    if not isinstance(raw, dict):
        return _refuse("parse", "Failed to parse command: expected a JSON object")
    command_id = raw.get("id")
    if type(command_id) not in (str, int):
        command_id = None
    kind = raw.get("type")
    if not isinstance(kind, str):
        return _refuse("parse", "Failed to parse command: missing string field 'type'",
                       command_id)
    cls = classes.get(kind)
    if cls is None:
        return _refuse(kind, f"Unknown command: {kind}", command_id)
    try:
        command = cast("w.Command | w.DaemonCommand", _codec.structure(raw, cls))
    except WireError as exc:
        return _refuse(kind, f"Invalid {kind} command: {exc}", command_id)
    except Exception as exc:  # whatever the input, the reader goes on
        return _refuse(kind, f"Invalid {kind} command: {exc!r}", command_id)
    return Incoming(command=command, command_id=command_id)


async def read_lines(stream: trio.abc.ReceiveStream,
                     take: Callable[[bytes | LineTooLong], Awaitable[None]]) -> None:
    """Give `take` every line of `stream` until EOF, in order (a last line without LF too),
    or `LineTooLong` in place of one past the limit."""
    splitter = LineSplitter()
    while True:
        data = await stream.receive_some(READ_CHUNK_BYTES)
        for piece in list(splitter.feed(bytes(data))) if data else list(splitter.close()):
            await take(piece)
        if not data:
            return


async def serve_reader(stream: trio.abc.ReceiveStream,
                       commands: trio.MemorySendChannel[Incoming],
                       classes: Mapping[str, type[object]] = w.COMMAND_CLASSES) -> None:
    """Read lines until EOF and pass each on, in order; the channel is closed at EOF."""
    async def take(piece: bytes | LineTooLong) -> None:
        if isinstance(piece, LineTooLong):
            incoming: Incoming | None = _refuse(
                "parse", f"Failed to parse command: line of {piece.size} bytes exceeds "
                "the 64 MiB limit")
        else:
            incoming = parse_line(piece, classes)
        if incoming is not None:
            await commands.send(incoming)

    async with commands:
        await read_lines(stream, take)


class Transport(Protocol):
    """What carries one connection's lines, both ways."""

    write_now: Callable[[bytes], int] | None
    """`Outbox`'s non-blocking write, where the transport has one."""

    async def read(self, commands: trio.MemorySendChannel[Incoming]) -> None:
        """The peer's lines as commands into `commands` until its input ends; then close
        the channel."""

    async def write(self, batch: bytearray) -> None:
        """Send whole lines; `trio.BrokenResourceError` when the peer is gone."""

    async def aclose(self) -> None: ...


class Prefixed(trio.abc.ReceiveStream):
    """`stream`, after `prefix` (bytes already read from it)."""

    def __init__(self, stream: trio.abc.ReceiveStream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return data
        return bytes(await self._stream.receive_some(max_bytes))

    async def aclose(self) -> None:
        await self._stream.aclose()


class StreamTransport:
    """JSON lines over a pair of trio streams (stdio's pipes, a Unix socket)."""

    def __init__(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream,
                 classes: Mapping[str, type[object]] = w.COMMAND_CLASSES) -> None:
        self._receive = receive
        self._send = send
        self._classes = classes
        self.write_now = write_now_to(send)

    async def read(self, commands: trio.MemorySendChannel[Incoming]) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await serve_reader(self._receive, commands, self._classes)

    async def write(self, batch: bytearray) -> None:
        await self._send.send_all(batch)

    async def aclose(self) -> None:
        for stream in {id(self._send): self._send, id(self._receive): self._receive}.values():
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.aclose()


class Connection:
    """One peer of a front, whatever its transport (stdio, a Unix socket, a WebSocket)::

        connection_nursery
        ├── the writer        the outbox -> the transport, in order; `broken` when the peer
        │                     is gone
        └── input_scope       cancelling it stops the input, as its end would
            ├── read          the transport's lines -> commands, into a channel
            └── dispatch      each command, in order, to `handle`

    The end of input means one thing everywhere: `end_of_input` waits for what runs to
    finish, then what is left in the outbox is written and `serve` returns. A front subclasses
    it for `handle`, `end_of_input` and `broken`.

    With `hold_back`, a command waits while the peer has not read what was already answered:
    the command channel fills, the reader stops reading, and a client that writes without
    reading is held back instead of filling memory."""

    def __init__(self, transport: Transport, *, hold_back: bool = False) -> None:
        self.transport = transport
        self.outbox = Outbox(write_now=transport.write_now)
        self.input_scope = trio.CancelScope()
        self._hold_back = hold_back

    def send(self, item: w.Event | w.Response) -> None:
        """`item` to the peer, encoded here, at the edge."""
        self.put_line(_codec.encode(item))

    def put_line(self, line: bytes) -> None:
        self.outbox.put(line)

    async def serve(self) -> None:
        async with trio.open_nursery() as connection_nursery:
            async def writer() -> None:
                if not await self.outbox.serve(self.transport.write):
                    self.broken()

            connection_nursery.start_soon(writer)
            commands_send, commands_receive = trio.open_memory_channel[Incoming](
                COMMAND_QUEUE_SIZE)
            with self.input_scope:
                async with trio.open_nursery() as input_nursery:
                    input_nursery.start_soon(self.transport.read, commands_send)
                    input_nursery.start_soon(self._dispatch, commands_receive)
            await self.end_of_input()
            self.outbox.close()

    async def _dispatch(self, commands: trio.MemoryReceiveChannel[Incoming]) -> None:
        async with commands:
            async for incoming in commands:
                if self._hold_back:
                    await self.outbox.wait_for_room()
                if incoming.refusal is not None:
                    self.send(incoming.refusal)
                elif incoming.command is not None:
                    await self.handle(incoming.command, incoming.command_id)

    async def handle(self, command: w.Command | w.DaemonCommand,
                     command_id: str | int | None) -> None:
        """One command, in arrival order."""
        raise NotImplementedError

    async def end_of_input(self) -> None:
        """What the end of the peer's input waits for."""

    def broken(self) -> None:
        """The peer is gone (it stopped reading, or closed)."""


# --- file descriptors --------------------------------------------------------------------------

class _ThreadedFd(trio.abc.HalfCloseableStream):
    """A regular file as a stream (epoll cannot wait on regular files): I/O in a thread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await trio.to_thread.run_sync(os.read, self._fd, max_bytes or READ_CHUNK_BYTES)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = await trio.to_thread.run_sync(os.write, self._fd, view)
            view = view[written:]

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        os.close(self._fd)
        await trio.lowlevel.checkpoint()


def open_fd_stream(fd: int) -> trio.abc.Stream:
    """A trio stream on its own duplicate of `fd`."""
    duplicate = os.dup(fd)
    if stat.S_ISREG(os.fstat(duplicate).st_mode):
        return _ThreadedFd(duplicate)
    return trio.lowlevel.FdStream(duplicate)
