"""A typed Python client for forged, on trio: over stdio (a ``forged --mode rpc`` child), the
daemon's Unix socket, or its WebSocket. It is the one reader of the protocol in the
repository besides the codec: what it reads, it gives as the protocol's wire classes.

::

    async with Client.open_unix() as client:
        await client.new_session(cwd="/home/me/project")
        events = await client.prompt_and_wait("Fix the failing test")
        print(await client.get_last_assistant_text())

Each command has a method that sends it, waits for its response and returns the response's
``data`` as its wire class (`forged._wire`: `SessionState`, `PromptAccepted`, ...), or raises
`CommandFailed`. Events arrive on `Client.events` in order, each a `Received`: the event as
its wire class (`Unknown` for a type this client does not know) and the daemon's stamps; they
are buffered without bound, so a client that does not read them should not ask for many.

Resource handling: the ``open_*`` context managers own the connection (and the child
process, for stdio); leaving the block closes it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypeVar, cast

import attrs
import orjson
import trio

from . import _wire as w
from ._codec import structure
from ._errors import CommandFailed, WireError
from ._jsonl import MAX_LINE_BYTES, LineSplitter, LineTooLong, camel

if TYPE_CHECKING:
    import ssl

JSON = dict[str, object]
T = TypeVar("T")
__all__ = ["Client", "CommandFailed", "Received", "Unknown"]


@attrs.frozen
class Unknown:
    """An event of a type this client does not know (a newer forged's), as it came."""

    type: str
    data: JSON


Event: TypeAlias = "w.Event | Unknown"


@attrs.frozen
class Received:
    """One event as the client received it, and the daemon's stamps (None over stdio)."""

    event: Event
    session_id: str | None = None
    seq: int | None = None

    @property
    def type(self) -> str:
        return self.event.type


@functools.cache
def data_classes() -> dict[str, object]:
    """Each command's response ``data``, as its wire class (the others answer none); built
    when first used, as `forged._wire` builds most of these classes."""
    return {
        "prompt": w.PromptAccepted, "steer": w.PromptAccepted, "follow_up": w.PromptAccepted,
        "clear_queue": w.QueueContents, "new_session": w.SwitchResult,
        "get_state": w.SessionState, "get_messages": w.MessageList, "set_model": w.Model,
        "cycle_model": w.CycledModel | None, "get_available_models": w.ModelList,
        "cycle_thinking_level": w.ThinkingLevelData | None,
        "get_available_thinking_levels": w.ThinkingLevelList, "compact": w.CompactionResult,
        "bash": w.BashResult, "get_session_stats": w.SessionStats,
        "export_html": w.ExportResult, "switch_session": w.SwitchResult, "fork": w.ForkResult,
        "clone": w.SwitchResult, "get_fork_messages": w.ForkMessageList,
        "get_entries": w.EntryList, "get_tree": w.EntryTree,
        "get_last_assistant_text": w.AssistantText, "get_commands": w.CommandList,
        "get_mcp_servers": w.McpServerList, "list_sessions": w.SessionList,
        "get_checkpoints": w.CheckpointList, "get_checkpoint_diff": w.CheckpointDiff,
        "restore_checkpoint": w.RestoreResult,
        "attach": w.AttachResult, "pair_device": w.Pairing, "list_devices": w.DeviceList,
        "revoke_device": w.Revoked, "navigate_tree": w.EntryTree,
        "delete_session": w.Deleted, "get_push_key": w.PushKey,
        "push_subscribe": w.PushSubscribed, "push_unsubscribe": w.PushUnsubscribed,
    }


def read_response(item: JSON) -> w.Response:
    """A response line, parsed, as `w.Response` whose ``data`` is its command's wire class
    (`data_classes`)."""
    command = str(item.get("command"))
    data = item.get("data", w.ABSENT)
    data_class = data_classes().get(command)
    if data is not w.ABSENT and item.get("success") and data_class is not None:
        data = structure(data, cast("type[object]", data_class))
    command_id, error = item.get("id"), item.get("error")
    return w.Response(id=command_id if isinstance(command_id, str | int) else None,
                      command=command, success=item.get("success") is True, data=data,
                      error=error if isinstance(error, str) else None)


def read_event(item: JSON) -> Received:
    """An event line, parsed, as `Received`."""
    session_id, seq = item.pop("sessionId", None), item.pop("seq", None)
    kind = str(item.get("type"))
    event: Event
    if kind in w.EVENT_TYPES:
        try:
            event = structure(item, cast("type[w.Event]", w.Event))
        except WireError:
            event = Unknown(type=kind, data=item)
    else:
        event = Unknown(type=kind, data=item)
    return Received(event=event, session_id=session_id if isinstance(session_id, str) else None,
                    seq=seq if isinstance(seq, int) else None)


def read_line(line: bytes) -> w.Response | Received | None:
    """A line forged wrote, as objects: a response (`read_response`) or an event
    (`read_event`); None for a blank line. `WireError` for one that is no JSON object."""
    if not line.strip():
        return None
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"Not a JSON line: {exc}") from None
    if not isinstance(item, dict):
        raise WireError("Not a JSON object")
    return read_response(item) if item.get("type") == "response" else read_event(item)


class Client:
    """One connection to forged. Use an ``open_*`` constructor."""

    def __init__(self, send_line: Callable[[bytes], Awaitable[None]]) -> None:
        self._send_line = send_line
        self._ids = itertools.count(1)
        self._waiting: dict[str, trio.MemorySendChannel[JSON]] = {}
        self._events_send, self.events = trio.open_memory_channel[Received](math.inf)
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
    async def open_websocket(cls, url: str, token: str | None = None, *,
                             ssl_context: ssl.SSLContext | None = None
                             ) -> AsyncIterator[Client]:
        """A connection to the daemon's WebSocket (``wss://`` verified with `ssl_context`,
        by default the system's CAs); `token`, a paired device's credential or the owner's,
        defaults to the daemon's ``ws-token`` file."""
        from trio_websocket import ConnectionClosed, open_websocket_url

        from ._paths import read_ws_token

        headers = [(b"authorization", f"Bearer {token or read_ws_token()}".encode())]
        async with open_websocket_url(url, extra_headers=headers, ssl_context=ssl_context,
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
        elif item.get("type") != "response":
            self._events_send.send_nowait(read_event(item))

    def _ended(self) -> None:
        self.closed.set()
        for waiter in self._waiting.values():
            waiter.close()
        self._waiting.clear()
        self._events_send.close()

    async def send(self, command: JSON) -> None:
        """Send a command as it is, without waiting for anything."""
        await self._send_line(orjson.dumps(command) + b"\n")

    async def request(self, command_type: str, **fields: object) -> JSON:
        """Send a command and return its whole response, as it came (successful or not)."""
        command_id = f"client-{next(self._ids)}"
        send, receive = trio.open_memory_channel[JSON](1)
        self._waiting[command_id] = send
        await self.send({"type": command_type, "id": command_id,
                         **{camel(k): v for k, v in fields.items() if v is not None}})
        try:
            return await receive.receive()
        except trio.EndOfChannel:
            raise ConnectionError(f"forged closed the connection before answering "
                                  f"{command_type}") from None

    async def call(self, command_type: str, data: type[T], **fields: object) -> T:
        """Send a command; its response's ``data`` as `data`, or `CommandFailed`
        (`WireError` if the data is not a `data`)."""
        answer = await self._answer(command_type, **fields)
        if not isinstance(answer, data):
            raise WireError(f"{command_type} answered {answer!r}, not a {data.__name__}")
        return answer

    async def _call_or_none(self, command_type: str, data: type[T], **fields: object
                            ) -> T | None:
        """`call` for a command whose ``data`` may be ``null``."""
        answer = await self._answer(command_type, **fields)
        if answer is not None and not isinstance(answer, data):
            raise WireError(f"{command_type} answered {answer!r}, not a {data.__name__}")
        return answer

    async def _answer(self, command_type: str, **fields: object) -> object:
        """A successful response's ``data``, as `read_response` reads it."""
        response = read_response(await self.request(command_type, **fields))
        if not response.success:
            raise CommandFailed(command_type, str(response.error))
        return response.data

    async def run(self, command_type: str, **fields: object) -> None:
        """Send a command that answers no data; `CommandFailed` if it failed."""
        response = await self.request(command_type, **fields)
        if not response.get("success"):
            raise CommandFailed(command_type, str(response.get("error")))

    async def next_event(self, predicate: Callable[[Received], bool] = lambda _: True
                         ) -> Received:
        """The next event `predicate` accepts (those before it are dropped)."""
        async for received in self.events:
            if predicate(received):
                return received
        raise ConnectionError("forged closed the connection")

    async def prompt_and_wait(self, message: str, *, images: list[JSON] | None = None,
                              streaming_behavior: str | None = None) -> list[Received]:
        """Send a prompt and collect its events up to ``agent_settled``."""
        await self.prompt(message, images=images, streaming_behavior=streaming_behavior)
        collected: list[Received] = []
        async for received in self.events:
            collected.append(received)
            if received.type == "agent_settled":
                return collected
        raise ConnectionError("forged closed the connection before agent_settled")

    # --- one method per command (docs/protocol.md, forged-rpc(7)) ---------------------------

    async def prompt(self, message: str, *, images: list[JSON] | None = None,
                     streaming_behavior: str | None = None) -> w.PromptAccepted:
        return await self.call("prompt", w.PromptAccepted, message=message, images=images,
                               streaming_behavior=streaming_behavior)

    async def steer(self, message: str, *, images: list[JSON] | None = None
                    ) -> w.PromptAccepted:
        return await self.call("steer", w.PromptAccepted, message=message, images=images)

    async def follow_up(self, message: str, *, images: list[JSON] | None = None
                        ) -> w.PromptAccepted:
        return await self.call("follow_up", w.PromptAccepted, message=message, images=images)

    async def abort(self) -> None:
        await self.run("abort")

    async def clear_queue(self) -> w.QueueContents:
        return await self.call("clear_queue", w.QueueContents)

    async def new_session(self, *, parent_session: str | None = None, cwd: str | None = None,
                          provider: str | None = None, model: str | None = None,
                          **fields: object) -> w.SwitchResult:
        """`fields`: the daemon's more (``session``, ``mcpServers``, ...), snake_case."""
        return await self.call("new_session", w.SwitchResult, parent_session=parent_session,
                               cwd=cwd, provider=provider, model=model, **fields)

    async def get_state(self) -> w.SessionState:
        return await self.call("get_state", w.SessionState)

    async def get_messages(self) -> list[w.AgentMessage]:
        return (await self.call("get_messages", w.MessageList)).messages

    async def set_model(self, provider: str, model_id: str) -> w.Model:
        return await self.call("set_model", w.Model, provider=provider, model_id=model_id)

    async def cycle_model(self) -> w.CycledModel | None:
        return await self._call_or_none("cycle_model", w.CycledModel)

    async def get_available_models(self) -> list[w.Model]:
        return (await self.call("get_available_models", w.ModelList)).models

    async def set_thinking_level(self, level: str) -> None:
        await self.run("set_thinking_level", level=level)

    async def cycle_thinking_level(self) -> str | None:
        cycled = await self._call_or_none("cycle_thinking_level", w.ThinkingLevelData)
        return cycled.level if cycled is not None else None

    async def get_available_thinking_levels(self) -> list[str]:
        return (await self.call("get_available_thinking_levels", w.ThinkingLevelList)).levels

    async def set_steering_mode(self, mode: str) -> None:
        await self.run("set_steering_mode", mode=mode)

    async def set_follow_up_mode(self, mode: str) -> None:
        await self.run("set_follow_up_mode", mode=mode)

    async def compact(self, custom_instructions: str | None = None) -> w.CompactionResult:
        return await self.call("compact", w.CompactionResult,
                               custom_instructions=custom_instructions)

    async def set_auto_compaction(self, enabled: bool) -> None:
        await self.run("set_auto_compaction", enabled=enabled)

    async def set_auto_retry(self, enabled: bool) -> None:
        await self.run("set_auto_retry", enabled=enabled)

    async def abort_retry(self) -> None:
        await self.run("abort_retry")

    async def bash(self, command: str) -> w.BashResult:
        return await self.call("bash", w.BashResult, command=command)

    async def abort_bash(self) -> None:
        await self.run("abort_bash")

    async def get_session_stats(self) -> w.SessionStats:
        return await self.call("get_session_stats", w.SessionStats)

    async def export_html(self, output_path: str | None = None) -> str:
        return (await self.call("export_html", w.ExportResult, output_path=output_path)).path

    async def switch_session(self, session_path: str) -> w.SwitchResult:
        return await self.call("switch_session", w.SwitchResult, session_path=session_path)

    async def fork(self, entry_id: str) -> w.ForkResult:
        return await self.call("fork", w.ForkResult, entry_id=entry_id)

    async def clone(self, entry_id: str | None = None) -> w.SwitchResult:
        return await self.call("clone", w.SwitchResult, entry_id=entry_id)

    async def navigate_tree(self, entry_id: str) -> w.EntryTree:
        return await self.call("navigate_tree", w.EntryTree, entry_id=entry_id)

    async def delete_session(self, session_id: str) -> w.Deleted:
        return await self.call("delete_session", w.Deleted, session_id=session_id)

    async def get_fork_messages(self) -> list[w.ForkMessage]:
        return (await self.call("get_fork_messages", w.ForkMessageList)).messages

    async def get_entries(self, since: str | None = None) -> w.EntryList:
        return await self.call("get_entries", w.EntryList, since=since)

    async def get_tree(self) -> w.EntryTree:
        return await self.call("get_tree", w.EntryTree)

    async def get_last_assistant_text(self) -> str | None:
        return (await self.call("get_last_assistant_text", w.AssistantText)).text

    async def set_session_name(self, name: str) -> None:
        await self.run("set_session_name", name=name)

    async def get_commands(self) -> list[w.CommandInfo]:
        return (await self.call("get_commands", w.CommandList)).commands

    async def answer_dialog(self, dialog_id: str, *, value: str | None = None,
                            confirmed: bool | None = None, cancelled: bool | None = None
                            ) -> None:
        """An ``extension_ui_response`` for the dialog request `dialog_id`."""
        await self.send({"type": "extension_ui_response", "id": dialog_id,
                         **{k: v for k, v in (("value", value), ("confirmed", confirmed),
                                               ("cancelled", cancelled)) if v is not None}})

    async def get_mcp_servers(self) -> list[w.McpServerInfo]:
        """Each MCP server of the session: name, transport, status, toolCount, lastError."""
        return (await self.call("get_mcp_servers", w.McpServerList)).servers

    # the daemon's own commands

    async def list_sessions(self, cwd: str | None = None) -> w.SessionList:
        return await self.call("list_sessions", w.SessionList, cwd=cwd)

    async def attach(self, session_id: str, since_seq: int | None = None) -> w.AttachResult:
        return await self.call("attach", w.AttachResult, session_id=session_id,
                               since_seq=since_seq)

    async def detach(self) -> None:
        await self.run("detach")

    async def pair_device(self, name: str, role: str) -> w.Pairing:
        """A one-time code pairing a device `name` with `role` (docs/remote.md)."""
        return await self.call("pair_device", w.Pairing, name=name, role=role)

    async def list_devices(self) -> list[w.DeviceInfo]:
        return (await self.call("list_devices", w.DeviceList)).devices

    async def revoke_device(self, name: str) -> w.Revoked:
        return await self.call("revoke_device", w.Revoked, name=name)
