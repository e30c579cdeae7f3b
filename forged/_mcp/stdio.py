"""The stdio transport of MCP servers: the server as a child process (`forged._process`), one
JSON-RPC message per line each way, with a bound on one message.

Imported by a stdio server's connection only (the SDK with it). It replaces the SDK's
``stdio_client``, whose reader joins each chunk to what it holds (quadratic in a line's
length: a 16 MB line took 12 s), holds a line of any size, and stops the server's process
group only while its leader lives.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import jiter
import mcp_types as types
import trio
from mcp.shared.message import SessionMessage

from .._log import log
from .._process import Child, kill_process_group

READ_CHUNK_BYTES = 1 << 20
EXIT_WAIT_S = 2.0
"""After its stdin closes, how long a server has to exit before its group gets SIGTERM."""


@contextlib.asynccontextmanager
async def stdio_transport(name: str, process: Child, *, max_bytes: int,
                          cut: Callable[[str], str]) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's read and write streams to a server's `process` (started by
    `forged._process.open_process` with pipes for stdin and stdout), which it then owns.

    A line past `max_bytes` is not read: each request waiting for an answer fails with the
    error `cut` makes of it, and the server is stopped (it is started again on next use).

    Resource handling: the server's process group is stopped when the block ends, whatever
    happened (stdin closed, `EXIT_WAIT_S` for it to exit, then SIGTERM to the whole group,
    whether or not its leader still runs, and SIGKILL after the grace)."""
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    waiting: set[types.RequestId] = set()
    """Requests sent and not answered yet."""
    try:
        async with trio.open_nursery() as transport_nursery:
            transport_nursery.start_soon(_write, process, write_receive, waiting)
            transport_nursery.start_soon(_read, name, process, read_send, waiting, max_bytes,
                                         cut)
            try:
                yield read_receive, write_send
            finally:
                transport_nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await _stop(process)
            for stream in (read_send, read_receive, write_send, write_receive):
                stream.close()


async def _write(process: Child, messages: Any, waiting: set[types.RequestId]) -> None:
    assert process.stdin is not None
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                             anyio.ClosedResourceError, anyio.EndOfStream):
        async with messages:
            async for session_message in messages:
                message = session_message.message
                if isinstance(message, types.JSONRPCRequest):
                    waiting.add(message.id)
                data = message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send_all(data.encode() + b"\n")


async def _read(name: str, process: Child, messages: Any, waiting: set[types.RequestId],
                max_bytes: int, cut: Callable[[str], str]) -> None:
    """Lines from the server's stdout to the session. Each chunk is scanned once, and a
    line is joined once, when its end has come: while a line arrives, forged holds it once;
    while it is read, twice at most (its bytes, then its text). Past `max_bytes` the
    connection ends (see `stdio_transport`)."""
    assert process.stdout is not None
    pending: list[bytes] = []
    """The line so far, before `chunk`."""
    size = 0
    async with messages:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                 anyio.BrokenResourceError, anyio.ClosedResourceError):
            while chunk := await process.stdout.receive_some(READ_CHUNK_BYTES):
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0 and size + end - start <= max_bytes:
                    pending.append(chunk[start:end])
                    line = b"".join(pending)
                    pending.clear()
                    size, start = 0, end + 1
                    message = _parse(name, line)
                    del line  # the text holds it now
                    if message is not None:
                        await _deliver(message, messages, waiting)
                if start < len(chunk):
                    pending.append(chunk[start:] if start else chunk)
                    size += len(chunk) - start
                if size > max_bytes or end >= 0:  # past the bound, with or without its end
                    pending.clear()
                    await _cut(name, process, messages, waiting, cut("the server's answer"))
                    return


def _parse(name: str, line: bytes) -> Any:
    """One line as a JSON-RPC message, or None (said on stderr). jiter reads the bytes where
    they lie, and the SDK's types take its objects: a large text is one string, made once
    (the SDK's ``validate_json`` holds four times a line's size, and orjson copies it)."""
    if not line or line.isspace():
        return None
    try:
        return types.jsonrpc_message_adapter.validate_python(jiter.from_json(line),
                                                             by_name=False)
    except ValueError as exc:
        first = next(iter(str(exc).splitlines()), "")
        log(f"MCP server {name}: skipped a line that is not JSON-RPC "
            f"({type(exc).__name__}: {first})")
        return None


async def _deliver(message: Any, messages: Any, waiting: set[types.RequestId]) -> None:
    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
        waiting.discard(message.id)
    await messages.send(SessionMessage(message))


async def _cut(name: str, process: Child, messages: Any, waiting: set[types.RequestId],
               reason: str) -> None:
    """A message past the limit: what waits for an answer fails with `reason`, and the
    server is stopped."""
    log(f"MCP server {name}: {reason}; the server is stopped")
    for request_id in sorted(waiting, key=str):
        await messages.send(SessionMessage(types.JSONRPCError(
            jsonrpc="2.0", id=request_id,
            error=types.ErrorData(code=types.INTERNAL_ERROR, message=reason))))
    waiting.clear()
    await kill_process_group(process)


async def _stop(process: Child) -> None:
    """Close stdin, give the server `EXIT_WAIT_S` to exit, then stop its whole group."""
    if process.stdin is not None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await process.stdin.aclose()
    with trio.move_on_after(EXIT_WAIT_S):
        await process.wait()
    await kill_process_group(process)
    await process.aclose()
