"""A Python client for forged, on trio: over stdio (a ``forged --mode rpc`` child), the
daemon's Unix socket, or its WebSocket.

::

    async with Client.open_unix() as client:
        await client.new_session(cwd="/home/me/project")
        events = await client.prompt_and_wait("Fix the failing test")
        print(await client.get_last_assistant_text())

Each command has a method that sends it, waits for its response and returns the response's
``data`` (or raises `CommandFailed`). Events arrive on `Client.events` in order; they are
buffered without bound, so a client that does not read them should not ask for many.

Resource handling: the ``open_*`` context managers own the connection (and the child
process, for stdio); leaving the block closes it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import trio

from ._errors import CommandFailed
from ._jsonl import MAX_LINE_BYTES, LineSplitter, LineTooLong, camel

Event = dict[str, Any]
__all__ = ["Client", "CommandFailed", "Event"]


class Client:
    """One connection to forged. Use an ``open_*`` constructor."""

    def __init__(self, send_line: Callable[[bytes], Awaitable[None]]) -> None:
        self._send_line = send_line
        self._ids = itertools.count(1)
        self._waiting: dict[str, trio.MemorySendChannel[Event]] = {}
        self._events_send, self.events = trio.open_memory_channel[Event](math.inf)
        """Every event (and dialog request) forged writes, in order."""
        self.closed = trio.Event()

    # --- constructors ----------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open_unix(cls, path: str | Path | None = None) -> AsyncIterator[Client]:
        """A connection to the daemon's socket (default: where ``forged serve`` puts it),
        once its folder and its process are known to be the user's (`forged.ConfigError`
        otherwise)."""
        from ._paths import default_socket_path, open_daemon_socket

        stream = await open_daemon_socket(Path(path) if path else default_socket_path())
        async with stream, cls._over_stream(stream) as client:
            yield client

    @classmethod
    @asynccontextmanager
    async def open_stdio(cls, args: Sequence[str] = (), *, cwd: str | Path | None = None,
                         env: dict[str, str] | None = None) -> AsyncIterator[Client]:
        """A ``forged --mode rpc`` child process with `args`; it is stopped on exit."""
        command = [sys.executable, "-m", "forged", "--mode", "rpc", *args]
        process = await trio.lowlevel.open_process(
            command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdin is not None and process.stdout is not None
        stream = trio.StapledStream(process.stdin, process.stdout)
        try:
            async with cls._over_stream(stream) as client:
                yield client
        finally:
            await process.stdin.aclose()
            with trio.move_on_after(5) as waited:
                await process.wait()
            if waited.cancelled_caught:
                process.kill()
                await process.wait()

    @classmethod
    @asynccontextmanager
    async def open_websocket(cls, url: str, token: str | None = None) -> AsyncIterator[Client]:
        """A connection to the daemon's WebSocket; `token` defaults to the daemon's
        ``ws-token`` file."""
        from trio_websocket import ConnectionClosed, open_websocket_url

        from ._paths import read_ws_token

        headers = [(b"authorization", f"Bearer {token or read_ws_token()}".encode())]
        async with open_websocket_url(url, extra_headers=headers,
                                      max_message_size=MAX_LINE_BYTES) as socket:
            async def send(line: bytes) -> None:
                await socket.send_message(line.decode())

            async def messages() -> AsyncIterator[bytes]:
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        message = await socket.get_message()
                        yield message.encode() if isinstance(message, str) else message

            async with cls._serving(send, messages()) as client:
                yield client

    @classmethod
    @asynccontextmanager
    async def _over_stream(cls, stream: trio.abc.Stream) -> AsyncIterator[Client]:
        async def lines() -> AsyncIterator[bytes]:
            splitter = LineSplitter()
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while data := await stream.receive_some(1 << 20):
                    for line in splitter.feed(bytes(data)):
                        if not isinstance(line, LineTooLong):
                            yield line

        async with cls._serving(stream.send_all, lines()) as client:
            yield client

    @classmethod
    @asynccontextmanager
    async def _serving(cls, send: Callable[[bytes], Awaitable[None]],
                       lines: AsyncIterator[bytes]) -> AsyncIterator[Client]:
        """A client sending with `send` and fed each line of `lines` (which ends when the
        connection does), read in a task of its own."""
        client = cls(send)

        async def receive() -> None:
            try:
                async for line in lines:
                    client._arrived(line)
            finally:
                client._ended()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            yield client
            nursery.cancel_scope.cancel()

    # --- the wire --------------------------------------------------------------------------

    def _arrived(self, line: bytes) -> None:
        if not line.strip():
            return
        item = orjson.loads(line)
        if item.get("type") == "response" and str(item.get("id")) in self._waiting:
            self._waiting.pop(str(item["id"])).send_nowait(item)
        else:
            self._events_send.send_nowait(item)

    def _ended(self) -> None:
        self.closed.set()
        for waiter in self._waiting.values():
            waiter.close()
        self._waiting.clear()
        self._events_send.close()

    async def send(self, command: dict[str, Any]) -> None:
        """Send a command as it is, without waiting for anything."""
        await self._send_line(orjson.dumps(command) + b"\n")

    async def request(self, command_type: str, **fields: Any) -> Event:
        """Send a command and return its whole response (successful or not)."""
        command_id = f"client-{next(self._ids)}"
        send, receive = trio.open_memory_channel[Event](1)
        self._waiting[command_id] = send
        await self.send({"type": command_type, "id": command_id,
                         **{camel(k): v for k, v in fields.items() if v is not None}})
        try:
            return await receive.receive()
        except trio.EndOfChannel:
            raise ConnectionError(f"forged closed the connection before answering "
                                  f"{command_type}") from None

    async def call(self, command_type: str, **fields: Any) -> Any:
        """Send a command; its response's ``data``, or `CommandFailed`."""
        response = await self.request(command_type, **fields)
        if not response.get("success"):
            raise CommandFailed(command_type, str(response.get("error")))
        return response.get("data")

    async def next_event(self, predicate: Callable[[Event], bool] = lambda _: True) -> Event:
        """The next event `predicate` accepts (those before it are dropped)."""
        async for event in self.events:
            if predicate(event):
                return event
        raise ConnectionError("forged closed the connection")

    async def prompt_and_wait(self, message: str, **fields: Any) -> list[Event]:
        """Send a prompt and collect its events up to ``agent_settled``."""
        await self.prompt(message, **fields)
        collected: list[Event] = []
        async for event in self.events:
            collected.append(event)
            if event.get("type") == "agent_settled":
                return collected
        raise ConnectionError("forged closed the connection before agent_settled")

    # --- one method per command (docs/protocol.md, forged-rpc(7)) ---------------------------

    async def prompt(self, message: str, *, images: list[Event] | None = None,
                     streaming_behavior: str | None = None) -> Any:
        return await self.call("prompt", message=message, images=images,
                               streaming_behavior=streaming_behavior)

    async def steer(self, message: str, *, images: list[Event] | None = None) -> Any:
        return await self.call("steer", message=message, images=images)

    async def follow_up(self, message: str, *, images: list[Event] | None = None) -> Any:
        return await self.call("follow_up", message=message, images=images)

    async def abort(self) -> None:
        await self.call("abort")

    async def clear_queue(self) -> Any:
        return await self.call("clear_queue")

    async def new_session(self, *, parent_session: str | None = None, cwd: str | None = None,
                          provider: str | None = None, model: str | None = None) -> Any:
        return await self.call("new_session", parent_session=parent_session, cwd=cwd,
                               provider=provider, model=model)

    async def get_state(self) -> Any:
        return await self.call("get_state")

    async def get_messages(self) -> list[Event]:
        return list((await self.call("get_messages"))["messages"])

    async def set_model(self, provider: str, model_id: str) -> Any:
        return await self.call("set_model", provider=provider, model_id=model_id)

    async def cycle_model(self) -> Any:
        return await self.call("cycle_model")

    async def get_available_models(self) -> list[Event]:
        return list((await self.call("get_available_models"))["models"])

    async def set_thinking_level(self, level: str) -> None:
        await self.call("set_thinking_level", level=level)

    async def cycle_thinking_level(self) -> Any:
        return await self.call("cycle_thinking_level")

    async def get_available_thinking_levels(self) -> list[str]:
        return list((await self.call("get_available_thinking_levels"))["levels"])

    async def set_steering_mode(self, mode: str) -> None:
        await self.call("set_steering_mode", mode=mode)

    async def set_follow_up_mode(self, mode: str) -> None:
        await self.call("set_follow_up_mode", mode=mode)

    async def compact(self, custom_instructions: str | None = None) -> Any:
        return await self.call("compact", custom_instructions=custom_instructions)

    async def set_auto_compaction(self, enabled: bool) -> None:
        await self.call("set_auto_compaction", enabled=enabled)

    async def set_auto_retry(self, enabled: bool) -> None:
        await self.call("set_auto_retry", enabled=enabled)

    async def abort_retry(self) -> None:
        await self.call("abort_retry")

    async def bash(self, command: str) -> Any:
        return await self.call("bash", command=command)

    async def abort_bash(self) -> None:
        await self.call("abort_bash")

    async def get_session_stats(self) -> Any:
        return await self.call("get_session_stats")

    async def export_html(self, output_path: str | None = None) -> str:
        return str((await self.call("export_html", output_path=output_path))["path"])

    async def switch_session(self, session_path: str) -> Any:
        return await self.call("switch_session", session_path=session_path)

    async def fork(self, entry_id: str) -> Any:
        return await self.call("fork", entry_id=entry_id)

    async def clone(self) -> Any:
        return await self.call("clone")

    async def get_fork_messages(self) -> list[Event]:
        return list((await self.call("get_fork_messages"))["messages"])

    async def get_entries(self, since: str | None = None) -> Any:
        return await self.call("get_entries", since=since)

    async def get_tree(self) -> Any:
        return await self.call("get_tree")

    async def get_last_assistant_text(self) -> str | None:
        text = (await self.call("get_last_assistant_text"))["text"]
        return None if text is None else str(text)

    async def set_session_name(self, name: str) -> None:
        await self.call("set_session_name", name=name)

    async def get_commands(self) -> list[Event]:
        return list((await self.call("get_commands"))["commands"])

    async def answer_dialog(self, dialog_id: str, *, value: str | None = None,
                            confirmed: bool | None = None, cancelled: bool | None = None
                            ) -> None:
        """An ``extension_ui_response`` for the dialog request `dialog_id`."""
        await self.send({"type": "extension_ui_response", "id": dialog_id,
                         **{k: v for k, v in (("value", value), ("confirmed", confirmed),
                                               ("cancelled", cancelled)) if v is not None}})

    # the daemon's own commands

    async def get_mcp_servers(self) -> list[Event]:
        """Each MCP server of the session: name, transport, status, toolCount, lastError."""
        return list((await self.call("get_mcp_servers"))["servers"])

    async def list_sessions(self, cwd: str | None = None) -> Any:
        return await self.call("list_sessions", cwd=cwd)

    async def attach(self, session_id: str, since_seq: int | None = None) -> Any:
        return await self.call("attach", session_id=session_id, since_seq=since_seq)

    async def detach(self) -> None:
        await self.call("detach")


