"""Where the ACP front's sessions live: in this process (``forged --mode acp``), or in the
daemon (``forged connect --acp``, a connection of its own per session). Either way an ACP
session reaches its forged session through a `Link`: wire commands in, wire responses and
events out, in the order the session produced them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar, cast

import attrs
import orjson
import trio

from ... import _codec, _wire as w
from ..._config import Models, Options, list_stored, open_models, session_config
from ..._connection import read_lines
from ..._dispatch import Agent, open_agent
from ..._errors import AcpError, CommandError
from ..._hub import Hub
from ..._jsonl import LineTooLong
from ..._log import log
from ..._models import ModelRegistry, first_use_hints
from ..._paths import agent_dir
from ...client import Unknown, read_line
from .jsonrpc import INVALID_PARAMS

T = TypeVar("T")
Answered = Callable[[w.Response], None]


class Host(Protocol):
    """The ACP session a backend serves: what it learns of it and what it tells it."""

    cwd: Path
    mcp_servers: dict[str, object]

    def attach(self, link: Link, session_id: str) -> None: ...
    def on_event(self, event: w.Event) -> None: ...
    def opened(self, agent: Agent) -> None: ...


class Link(Protocol):
    """Wire commands to one forged session. `answered` gets the command's response in the
    order of the session's output: before the events written after it."""

    def send(self, command: object, answered: Answered | None = None, *,
             command_id: str | None = None) -> None: ...


def _ignore_response(_: w.Response) -> None:
    pass


async def call(link: Link, command: object, data: type[T]) -> T:
    """Send `command` and return its response's ``data`` (a `data`); `CommandError` if it
    failed."""
    done = trio.Event()
    answers: list[w.Response] = []

    def answered(response: w.Response) -> None:
        answers.append(response)
        done.set()

    link.send(command, answered)
    await done.wait()
    (response,) = answers
    if not response.success:
        raise CommandError(str(response.error))
    if not isinstance(response.data, data):
        raise CommandError(f"{response.command} answered {response.data!r}")
    return response.data


class LocalLink:
    """A session of this process: commands go straight to its agent."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def send(self, command: object, answered: Answered | None = None, *,
             command_id: str | None = None) -> None:
        self._agent.handle(cast("w.Command", command), command_id,
                           answered or _ignore_response)


class DaemonLink:
    """A session of the daemon, over a connection of its own (`serve` reads and writes it);
    what comes back is read by `forged.client`'s reader."""

    CLOSED = "the daemon closed the connection"

    def __init__(self, stream: trio.abc.Stream, on_event: Callable[[w.Event], None]) -> None:
        self._stream = stream
        self._on_event = on_event
        self._ids = itertools.count(1)
        self._waiting: dict[str, Answered] = {}
        self._lines_send, self._lines_receive = trio.open_memory_channel[bytes](math.inf)
        self.closed = trio.Event()

    def send(self, command: object, answered: Answered | None = None, *,
             command_id: str | None = None) -> None:
        line = _codec.unstructure(command)
        if answered is not None:
            command_id = f"acp-{next(self._ids)}"
            if self.closed.is_set():
                answered(_failed(line["type"], self.CLOSED))
                return
            self._waiting[command_id] = answered
        if command_id is not None:
            line = {"id": command_id, **line}
        self._lines_send.send_nowait(orjson.dumps(line) + b"\n")

    async def serve(self) -> None:
        """Write what is sent and read what comes, until the daemon closes the connection."""
        async def write() -> None:
            async for line in self._lines_receive:
                await self._stream.send_all(line)

        async def take(piece: bytes | LineTooLong) -> None:
            if isinstance(piece, LineTooLong) or not piece.strip():
                return
            received = read_line(piece)
            if isinstance(received, w.Response):
                answered = self._waiting.pop(str(received.id), None)
                if answered is not None:
                    answered(received)
            elif received is not None and not isinstance(received.event, Unknown):
                self._on_event(received.event)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                await read_lines(self._stream, take)
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed.set()
            waiting, self._waiting = self._waiting, {}
            for answered in waiting.values():
                answered(_failed("", self.CLOSED))


def _failed(command: str, error: str) -> w.Response:
    return w.Response(command=command, success=False, error=error)


class Sessions(Protocol):
    """Where the front's sessions run: in this process, or in the daemon."""

    async def serve(self, host: Host, stored_id: str | None, *, fork_of: Path | None = None,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open a new session in ``host.cwd`` (or the stored `stored_id`, or a new one
        holding a copy of `fork_of`'s active branch), `attach` it, report started, and
        serve it until cancelled."""

    async def has_model(self, *, reread: bool = False) -> bool:
        """Whether some model has a key (`reread`: auth.json, models.json and the
        environment read again first)."""

    async def release(self, session_id: str) -> None:
        """Before the stored session `session_id` is deleted: nothing holds it any more;
        `AcpError` when something else still does."""


class InProcess:
    """Sessions of this process, opened as ``forged --mode rpc`` opens its own."""

    def __init__(self, options: Options, nursery: trio.Nursery) -> None:
        self._options = options
        self._nursery = nursery
        self._models: Models | None = None

    async def _registry(self) -> Models:
        if self._models is None:
            self._models = await open_models(self._options, self._nursery)
        return self._models

    async def has_model(self, *, reread: bool = False) -> bool:
        models = await self._registry()
        if reread:
            await reread_models(models)
        return bool(models.registry.available())

    async def release(self, session_id: str) -> None:
        pass  # (a session of this process is closed before it is deleted)

    async def serve(self, host: Host, stored_id: str | None, *, fork_of: Path | None = None,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        models = await self._registry()
        options = attrs.evolve(self._options, cwd=host.cwd, mcp_handed=host.mcp_servers)
        if stored_id is not None:
            path = await stored_path(host.cwd, stored_id)
            options = attrs.evolve(options, session=str(path), continue_=False,
                                   session_id=None, fork=None)
        elif fork_of is not None:
            options = attrs.evolve(options, fork=str(fork_of), session=None,
                                   continue_=False, session_id=None)
        config = session_config(options, models)
        async with open_agent(config, host.on_event, _ignore_response,
                              in_thread=False) as agent:
            host.opened(agent)
            host.attach(LocalLink(agent), agent.session.session_id)
            task_status.started()
            await trio.sleep_forever()


class InDaemon:
    """The daemon's sessions (``forged connect --acp``): each ACP session opens a connection
    with `connect` and a new session there (with `provider` and `model`), or attaches to a
    stored or live one."""

    def __init__(self, connect: Callable[[], Awaitable[trio.abc.Stream]], *,
                 provider: str | None = None, model: str | None = None,
                 permission_mode: str | None = None, hub: Hub | None = None) -> None:
        self._connect = connect
        self._provider = provider
        self._model = model
        self._permission_mode = permission_mode
        """Each new session's (``connect --acp --permission-mode``); None: the daemon's."""
        self._hub = hub
        """The daemon's, when the front runs in it (None: `forged connect --acp` serving
        the editor from its own process while the daemon starts)."""

    async def has_model(self, *, reread: bool = False) -> bool:
        models = self._hub.models if self._hub is not None else None
        if models is None:
            return True  # the daemon's sessions say so themselves
        if reread:
            await reread_models(models)
        return bool(models.registry.available())

    async def release(self, session_id: str) -> None:
        """The daemon unloads the session (``unload_session``), if it holds it."""
        stream = await self._connect()
        async with stream, trio.open_nursery() as nursery:
            link = DaemonLink(stream, lambda _: None)
            nursery.start_soon(link.serve)
            try:
                await call(link, w.UnloadSession(session_id=session_id), object)
            except CommandError as exc:
                refused: str | None = str(exc)
            else:
                refused = None
            nursery.cancel_scope.cancel()
        if refused is not None:
            raise AcpError(INVALID_PARAMS, refused)

    async def serve(self, host: Host, stored_id: str | None, *, fork_of: Path | None = None,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        handed = host.mcp_servers or None
        opening: object
        if stored_id is None:
            opening = w.NewSession(cwd=str(host.cwd), provider=self._provider,
                                   model=self._model, mcp_servers=handed,
                                   permission_mode=self._permission_mode,
                                   fork=str(fork_of) if fork_of is not None else None)
        else:  # a file of this folder, named by its exact id, as --mode acp finds it
            path = await stored_path(host.cwd, stored_id)
            opening = (w.NewSession(cwd=str(host.cwd), session=str(path), mcp_servers=handed)
                       if handed else w.Attach(session_id=stored_id))
        stream = await self._connect()
        refused: str | None = None
        async with stream, trio.open_nursery() as nursery:
            link = DaemonLink(stream, host.on_event)
            nursery.start_soon(link.serve)
            try:
                await call(link, opening, object)
                state = await call(link, w.GetState(), w.SessionState)
            except CommandError as exc:
                refused = str(exc)
            else:
                host.attach(link, state.session_id)
                task_status.started()
                await link.closed.wait()
                log(f"the daemon closed session {state.session_id}")
            nursery.cancel_scope.cancel()
        if refused is not None:  # raised out here: a nursery would wrap it in a group
            raise AcpError(INVALID_PARAMS, refused)


async def stored_path(cwd: Path, session_id: str) -> Path:
    """The file of `cwd`'s stored session whose id is exactly `session_id` (never a prefix,
    a path or another folder's); `AcpError` when there is none."""
    stored = await trio.to_thread.run_sync(list_stored, cwd)
    path = next((Path(item.path) for item in stored if item.session_id == session_id), None)
    if path is None:
        raise AcpError(INVALID_PARAMS, f"No session {session_id} in {cwd}")
    return path


def mcp_entries(servers: object) -> dict[str, object]:
    """ACP's ``mcpServers`` (a list; ``env`` and ``headers`` as name/value lists) as
    mcp.json entries; one that is not an object with a name is reported and skipped."""
    entries: dict[str, object] = {}
    for server in servers if isinstance(servers, list) else []:
        if not isinstance(server, dict) or not isinstance(server.get("name"), str):
            log(f"an MCP server of session/new is skipped: {server!r}")
            continue
        entry = {key: value for key, value in server.items()
                 if key not in ("name", "env", "headers", "_meta")}
        for key in ("env", "headers"):
            pairs = server.get(key)
            if isinstance(pairs, list):
                entry[key] = {pair["name"]: pair["value"] for pair in pairs
                              if isinstance(pair, dict) and isinstance(pair.get("name"), str)
                              and isinstance(pair.get("value"), str)}
        entries[server["name"]] = entry
    return entries


def no_model_text() -> str:
    """How to make a model available, when none is."""
    return ("forged found no model with a key. Set the provider's key in the environment "
            "the editor starts forged in (ANTHROPIC_API_KEY, OPENAI_API_KEY, ...), sign in "
            "or save a key with `forged login PROVIDER` in a terminal, or add the provider "
            "to ~/.agent-forge/agent/models.json; then sign in again here (no restart). To "
            "try forged without a key: --provider scripted --script FILE (docs/keys.md, The "
            "scripted provider)." + _pi_hint())


async def reread_models(models: Models) -> None:
    """A registry read afresh (models.json, auth.json, the environment), off the loop, taken
    for the sessions opened from now on when the one in use has no model with a key (never
    changed under a live session's feet)."""
    def read() -> ModelRegistry:
        fresh = ModelRegistry()
        fresh.load_models_json(agent_dir() / "models.json")
        return fresh

    fresh = await trio.to_thread.run_sync(read)
    if not models.registry.available() and fresh.available():
        models.registry = fresh


def _pi_hint() -> str:
    """Where pi keeps keys forged does not read, when it has some (`first_use_hints`)."""
    hints = first_use_hints().split("; ")
    return "".join(f" {hint[0].upper()}{hint[1:]}." for hint in hints
                   if hint.startswith("pi's keys"))
