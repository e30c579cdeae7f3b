"""A forged connection over memory streams, with the scripted provider in the same trio run."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio
import trio.testing

from forged._config import Models, Options, ServeOptions
from forged._connection import StreamTransport
from forged._daemon import run_daemon
from forged._fronts.stdio import serve_stdio
from forged._hub import Hub
from forged._jsonl import LineSplitter
from forged._models import ModelRegistry, register_scripted
from forged._opening import SessionConfig
from forged._plugins import PluginSource
from forged._providers.scripted import Reply, ScriptedServer
from forged._tools import ToolChoice
from forged.client import Client as ForgedClient

from .oracles import check_requests

Event = dict[str, Any]


class Client:
    """The client end: writes command lines, collects every output line as its JSON object.
    The wire tests read the objects as the process wrote them (key names, nulls, absent
    fields), which `forged.client`'s typed reader would normalise away; it is used where a
    test needs a client, not the bytes."""

    def __init__(self, stream: trio.abc.Stream, server: ScriptedServer, cwd: Path,
                 config: SessionConfig) -> None:
        self.stream = stream
        self.server = server
        self.cwd = cwd
        self.config = config
        self.lines: list[bytes] = []
        self.output: list[Event] = []
        self._arrived = trio.Condition()
        self._eof = False
        self._counter = 0
        self.reads: list[bytes] = []
        """What each read took of forged's output (over packet pipes: each of its writes)."""

    async def pump(self) -> None:
        splitter = LineSplitter(max_line_bytes=sys.maxsize)  # the framing forged.client reads
        while data := await self.stream.receive_some(1 << 20):
            self.reads.append(bytes(data))
            async with self._arrived:
                for line in splitter.feed(bytes(data)):
                    assert isinstance(line, bytes)
                    self.lines.append(line + b"\n")
                    self.output.append(orjson.loads(line))
                self._arrived.notify_all()
        async with self._arrived:
            self._eof = True
            self._arrived.notify_all()

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, command: dict[str, Any]) -> str:
        """Send a command with a fresh id (unless it has one); return the id."""
        if "id" not in command:
            self._counter += 1
            command = {"id": f"req-{self._counter}", **command}
        await self.send_raw(orjson.dumps(command) + b"\n")
        return str(command["id"])

    async def wait_for(self, predicate: Callable[[Event], bool], *, start: int = 0) -> Event:
        async with self._arrived:
            while True:
                for item in self.output[start:]:
                    if predicate(item):
                        return item
                if self._eof:
                    seen = [e.get("type") for e in self.output]
                    raise AssertionError(f"stream ended; got {seen}")
                await self._arrived.wait()

    async def next_line(self) -> None:
        """Until one more line arrives."""
        async with self._arrived:
            seen = len(self.output)
            while len(self.output) == seen and not self._eof:
                await self._arrived.wait()

    async def response(self, command_id: str) -> Event:
        return await self.wait_for(
            lambda e: e.get("type") == "response" and e.get("id") == command_id)

    async def use_redirected(self, provider: str, model_id: str, path: str = "") -> Event:
        """Choose `provider`'s `model_id`, its requests sent to the scripted server (its URL
        and `path`) by models.json, as a proxy is configured; the ``set_model`` response."""
        models_json = self.config.agent_dir / "models.json"
        models_json.write_bytes(orjson.dumps(
            {"providers": {provider: {"baseUrl": self.server.base_url + path}}}))
        self.config.registry.load_models_json(models_json)
        chosen = await self.request({"type": "set_model", "provider": provider,
                                     "modelId": model_id})
        assert chosen["success"], chosen
        return chosen

    async def request(self, command: dict[str, Any]) -> Event:
        return await self.response(await self.send(command))

    async def settled(self, count: int = 1) -> None:
        async with self._arrived:
            while sum(e.get("type") == "agent_settled" for e in self.output) < count:
                if self._eof:
                    raise AssertionError("stream ended before agent_settled")
                await self._arrived.wait()

    async def prompt_and_settle(self, message: str, **extra: Any) -> Event:
        settled_before = self.count("agent_settled")
        response = await self.request({"type": "prompt", "message": message, **extra})
        assert response["success"], response
        await self.settled(settled_before + 1)
        return response

    def count(self, kind: str) -> int:
        return sum(e.get("type") == kind for e in self.output)

    def types(self, start: int = 0) -> list[str]:
        return [e["type"] for e in self.output[start:]]

    def events(self, kind: str) -> list[Event]:
        return [e for e in self.output if e.get("type") == kind]

    async def close_input(self) -> None:
        await self.stream.send_eof()  # type: ignore[attr-defined]

    async def wait_eof(self) -> None:
        async with self._arrived:
            while not self._eof:
                await self._arrived.wait()


@asynccontextmanager
async def open_client(tmp_path: Path, replies: list[Reply] | None = None, *,
                      api: str = "anthropic-messages", model: bool = True,
                      registry: ModelRegistry | None = None, persist: bool = True,
                      session_path: Path | None = None,
                      plugins: list[PluginSource] | None = None,
                      allow_exhausted: bool = False,
                      tools: ToolChoice | None = None,
                      packets: bool = False) -> AsyncIterator[Client]:
    """A session in `tmp_path/project` on the scripted `api`, talked to over memory streams
    (with `packets`, over pipes as stdio's, in packet mode: each read takes one write)."""
    cwd = tmp_path / "project"
    cwd.mkdir(exist_ok=True)
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir(exist_ok=True)
    os.environ["AGENT_FORGE_DIR"] = str(agent_dir)
    server = ScriptedServer(replies)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        registry = registry or ModelRegistry()
        register_scripted(registry, server.base_url)
        chosen = registry.find("scripted", api) if model else None
        config = SessionConfig(cwd=cwd, agent_dir=agent_dir, registry=registry, model=chosen,
                               thinking_level="medium", persist=persist,
                               session_path=session_path, plugins=plugins or [],
                               tools=tools or ToolChoice())
        if packets:
            commands_in, commands_out = os.pipe2(os.O_DIRECT)
            lines_in, lines_out = os.pipe2(os.O_DIRECT)
            client_stream: trio.abc.Stream = trio.StapledStream(
                trio.lowlevel.FdStream(commands_out), trio.lowlevel.FdStream(lines_in))
            transport = StreamTransport(trio.lowlevel.FdStream(commands_in),
                                        trio.lowlevel.FdStream(lines_out))
        else:
            client_stream, forged_stream = trio.testing.memory_stream_pair()
            transport = StreamTransport(forged_stream, forged_stream)
        client = Client(client_stream, server, cwd, config)
        nursery.start_soon(client.pump)

        nursery.start_soon(serve_stdio, config, transport)
        yield client
        nursery.cancel_scope.cancel()
    check_requests(server.requests)
    assert not server.exhausted or allow_exhausted, (
        f"{server.exhausted} request(s) after the script's last reply")


def stored_message(entry_id: str, parent: str | None, role: str, text: str, *,
                   tokens: tuple[int, int] = (100, 20), cost: float = 0.5, **extra: Any
                   ) -> dict[str, Any]:
    """A message entry as a session file holds it (an assistant one by the scripted model,
    with `tokens` in and out costing `cost`), for writing session files by hand."""
    body: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": text}],
                            "timestamp": 1767225600000}
    if role == "assistant":
        body |= {"api": "anthropic-messages", "provider": "scripted",
                 "model": "anthropic-messages", "stopReason": "stop",
                 "usage": {"input": tokens[0], "output": tokens[1], "cacheRead": 0,
                           "cacheWrite": 0, "totalTokens": sum(tokens),
                           "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0,
                                    "total": cost}}}
    body |= extra
    return {"type": "message", "id": entry_id, "parentId": parent,
            "timestamp": "2026-01-01T00:00:01.000Z", "message": body}


@attrs.define
class Daemon:
    hub: Hub
    server: ScriptedServer
    socket_path: Path
    stop: trio.Event
    runtime: Path
    registry: ModelRegistry
    """The daemon's models: a provider added here reaches the sessions opened after."""

    def client(self) -> AbstractAsyncContextManager[ForgedClient]:
        return ForgedClient.open_unix(self.socket_path)


@asynccontextmanager
async def open_daemon(tmp_path: Path, replies: list[Reply] | None = None, *,
                      plugins: list[Path] | None = None, socket_path: Path | None = None,
                      **serve: Any) -> AsyncIterator[Daemon]:
    """`forged serve` in this trio run (sessions in `tmp_path/project` by default), on the
    scripted provider, with its socket under `tmp_path/run`."""
    cwd = tmp_path / "project"
    cwd.mkdir(exist_ok=True)
    (tmp_path / "agent").mkdir(exist_ok=True)
    runtime = tmp_path / "run"
    os.environ["AGENT_FORGE_DIR"] = str(tmp_path / "agent")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    server = ScriptedServer(replies)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        registry = ModelRegistry()
        register_scripted(registry, server.base_url)
        models = Models(registry=registry, provider="scripted",
                        pattern="scripted/anthropic-messages")
        socket_path = socket_path or runtime / "forged" / "forged.sock"
        async with trio.open_nursery() as daemon_nursery:
            hub = await daemon_nursery.start(partial(
                run_daemon, Options(cwd=cwd, plugins=plugins or []),
                ServeOptions(socket_path=socket_path, **serve),
                models=models, stop=stop))
            yield Daemon(hub=hub, server=server, socket_path=socket_path, stop=stop,
                         runtime=runtime, registry=registry)
            stop.set()  # and the daemon drains
        nursery.cancel_scope.cancel()
    check_requests(server.requests)
