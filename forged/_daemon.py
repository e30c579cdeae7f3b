"""The supervision tree, and the shutdown policy.

::

    run_stdio
    └── daemon_nursery
        ├── ScriptedServer.serve          the scripted provider (--provider scripted only)
        ├── watch_signals                 SIGTERM / SIGINT / SIGHUP: stop reading, abort,
        │                                 flush, exit 0
        ├── Session.serve → session_nursery
        │   └── Session._drive            one task per accepted prompt and its continuations,
        │       └── run_agent             each run inside the session's run_scope (abort);
        │           └── tool processes    bash and rg, each in its own process group
        └── connection_nursery
            ├── Outbox.serve_writer       fd 1 is written only through the one Outbox, in
            │                             order: at once while the pipe takes it, else here
            └── input_nursery             cancelled by a signal
                ├── serve_reader          stdin -> lines -> commands, in order
                └── serve_dispatcher      commands -> handlers, which never wait

Shutdown: at stdin EOF the reader ends, the dispatcher drains, the current run and its queued
messages finish, the outbox is flushed and the process exits 0. A signal aborts the run first
and allows `SHUTDOWN_GRACE_S` for the closing events.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import os
import signal
import socket
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from . import _codec
from . import _systemd as systemd
from . import _wire as w
from ._connection import (
    Incoming,
    Outbox,
    open_fd_stream,
    serve_dispatcher,
    serve_reader,
    write_now_to,
)
from ._dispatch import Dispatcher
from ._errors import ConfigError
from ._hub import (
    COMMAND_QUEUE_SIZE,
    EMPTY_IDLE_UNLOAD_S,
    IDLE_UNLOAD_S,
    MAX_LIVE_SESSIONS,
    PEER_QUEUE_BYTES,
    Hub,
    SessionRequest,
)
from ._jsonl import encode_line
from ._log import log
from ._models import SCRIPTED_PROVIDER, ModelRegistry, clamp_level, register_scripted
from ._paths import agent_dir, default_socket_path, runtime_dir, session_dir_for
from ._plugins import discover_plugins
from ._providers import load_providers
from ._resources import ExtraPaths
from ._session import Session, SessionConfig, open_session
from ._settings import Settings

SHUTDOWN_GRACE_S = 2.5


@attrs.define(kw_only=True)
class Options:
    """What the command line asked for."""

    cwd: Path
    provider: str | None = None
    model: str | None = None
    script: Path | None = None
    session_name: str | None = None
    no_session: bool = False
    session_dir: Path | None = None
    session: str | None = None
    continue_: bool = False
    models: list[str] | None = None
    extra: ExtraPaths = attrs.Factory(ExtraPaths)
    plugins: list[Path] = attrs.Factory(list)
    trust_project: bool = False
    interactive: bool = True


@attrs.define(kw_only=True)
class Models:
    """The model registry a process serves sessions from, and what the command line asked
    of it."""

    registry: ModelRegistry
    provider: str | None = None
    pattern: str | None = None


async def open_models(options: Options, nursery: trio.Nursery) -> Models:
    """Load models.json, and start the scripted provider's server in `nursery` if asked, and
    the `warm_up` of what the first prompt needs."""
    registry = ModelRegistry()
    registry.load_models_json(agent_dir() / "models.json")
    models = Models(registry=registry, provider=options.provider, pattern=options.model)
    if options.script is not None or options.provider == SCRIPTED_PROVIDER:
        if options.script is None:
            raise ConfigError("--provider scripted needs --script FILE")
        from ._providers.scripted import ScriptedServer, load_script

        script = load_script(options.script)
        server = ScriptedServer(script.replies)
        await nursery.start(server.serve)
        register_scripted(registry, server.base_url)
        models.provider = models.provider or SCRIPTED_PROVIDER
        models.pattern = models.pattern or f"{SCRIPTED_PROVIDER}/{script.api}"
    nursery.start_soon(warm_up, bool(registry.available()))
    return models


async def warm_up(providers: bool) -> None:
    """What a first prompt or abort would otherwise pay for, done while the process waits
    for input: the providers load in a worker thread (when a model could use them), then
    the converter builds the hooks of every class forged writes, one class per step of the
    event loop. Last, the ~40,000 objects start-up made leave the collector's view: a full
    collection over them stalled the loop ~8 ms."""
    if providers:
        await load_providers()
    for cls in _codec.SENT_CLASSES * 2:  # twice: see `prepare`
        _codec.prepare(cls)
        await trio.lowlevel.checkpoint()
    gc.freeze()


async def open_session_config(options: Options, nursery: trio.Nursery) -> SessionConfig:
    """Load models (starting the scripted server if asked) and choose the starting model."""
    return session_config(options, await open_models(options, nursery))


def session_config(options: Options, models: Models) -> SessionConfig:
    """A session's configuration: its settings, plugins, model and file, for `options.cwd`."""
    directory = agent_dir()
    registry = models.registry
    registry.check_provider(models.provider)
    settings = Settings(directory, options.cwd, trust_project=options.trust_project)
    if settings.project_untrusted_note:
        print(f"forged: {settings.project_untrusted_note}", file=sys.stderr)
    level = str(settings.get("defaultThinkingLevel", "medium"))
    if level not in w.THINKING_LEVELS:
        level = "medium"
    model: w.Model | None
    if models.pattern is not None:
        model, suffix = registry.resolve_pattern(models.pattern, models.provider)
        level = suffix or level
    else:
        model = (saved_default(registry, settings, models.provider)
                 or registry.initial_model(models.provider))
    session_dir = options.session_dir or session_dir_for(directory, options.cwd)
    return SessionConfig(cwd=options.cwd, agent_dir=directory, registry=registry, model=model,
                         thinking_level=clamp_level(model, level) if model else level,
                         session_name=options.session_name, persist=not options.no_session,
                         session_dir=session_dir,
                         session_path=find_session(options, session_dir),
                         keep_model=options.model is not None, settings=settings,
                         model_scope=options.models, extra=options.extra,
                         plugins=discover_plugins(options.cwd, directory, settings,
                                                  extra=options.plugins),
                         interactive=options.interactive)


def saved_default(registry: ModelRegistry, settings: Settings,
                  provider: str | None) -> w.Model | None:
    """The model settings.json names as the default, if it is usable (and of `provider`)."""
    saved_provider, saved_id = settings.get("defaultProvider"), settings.get("defaultModel")
    if not isinstance(saved_provider, str) or not isinstance(saved_id, str):
        return None
    if provider is not None and saved_provider != provider:
        return None
    model = registry.find(saved_provider, saved_id)
    return model if model is not None and registry.has_auth(model.provider) else None


def find_session(options: Options, session_dir: Path) -> Path | None:
    """The file --session or --continue asks to continue, if any."""
    if options.session is not None:
        arg = options.session
        if "/" in arg or arg.endswith(".jsonl"):
            return Path(arg).expanduser().resolve()
        matches = sorted(session_dir.glob(f"*_{glob.escape(arg)}*.jsonl"))  # a literal prefix
        if not matches:
            raise ConfigError(f"No session found matching {arg!r} in {session_dir}")
        return matches[0]
    if options.continue_:
        candidates = [path for path in session_dir.glob("*.jsonl") if path.is_file()]
        if candidates:
            return max(candidates, key=lambda path: path.stat().st_mtime)
    return None


async def run_stdio(options: Options, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """Serve one session over the process's stdin and stdout until EOF or a signal."""
    stdin, stdout = open_fd_stream(stdin_fd), open_fd_stream(stdout_fd)
    async with trio.open_nursery() as daemon_nursery:
        config = await open_session_config(options, daemon_nursery)
        await serve_connection(config, stdin, stdout, daemon_nursery, watch_signals=True)
        daemon_nursery.cancel_scope.cancel()


async def run_prompts(options: Options, messages: list[str], stdout_fd: int, *,
                      events: bool) -> int:
    """``-p`` and ``--mode json``: send `messages` one after another, each until the session
    settles, and return the exit code. With `events`, the session header and then every event
    are written to `stdout_fd` as JSON lines (exit 0 even when the model failed, as the
    ancestor does); without, the last reply's text is printed, or its error on stderr with
    exit 1. No client can answer dialogs: they resolve as cancelled.

    A signal (SIGINT, SIGTERM, SIGHUP) aborts the run (its closing events are written) and
    sends no further message: the exit status is 128 plus the signal's number."""
    stdout = open_fd_stream(stdout_fd)
    outbox = Outbox()
    responses: list[dict[str, Any]] = []
    signalled: list[int] = []
    async with trio.open_nursery() as daemon_nursery:
        config = await open_session_config(attrs.evolve(options, interactive=False),
                                           daemon_nursery)
        async with open_session(config, outbox.put if events else lambda _: None,
                                outbox.wait_for_room if events else None) as session:
            dispatcher = Dispatcher(session, lambda line: responses.append(orjson.loads(line)))

            def stop(signum: int) -> None:
                signalled.append(signum)
                session.stop()

            await daemon_nursery.start(_watch_signals, stop)
            code = 0
            async with trio.open_nursery() as output_nursery:
                output_nursery.start_soon(outbox.serve_writer, stdout)
                if events:
                    outbox.put(encode_line(session.store.header))
                for text in messages:
                    if signalled:
                        break
                    dispatcher.handle(w.Prompt(message=text), None)
                    await dispatcher.wait_idle()
                    if not responses[-1]["success"]:
                        log(responses[-1]["error"])
                        code = 1
                        break
                if signalled:
                    code = 128 + signalled[0]
                elif not events and code == 0:
                    code = _print_last_reply(session, outbox)
                outbox.close()
        daemon_nursery.cancel_scope.cancel()
    return code


def _print_last_reply(session: Session, outbox: Outbox) -> int:
    last = session.messages[-1] if session.messages else None
    if not isinstance(last, w.AssistantMessage):
        return 0
    if last.stop_reason in ("error", "aborted"):
        print(f"forged: {last.error_message or f'Request {last.stop_reason}'}", file=sys.stderr)
        return 1
    for block in last.content:
        if isinstance(block, w.TextContent):
            outbox.put(block.text.encode() + b"\n")
    return 0


async def serve_connection(config: SessionConfig, stdin: Any, stdout: Any,
                           daemon_nursery: trio.Nursery, *, watch_signals: bool) -> None:
    """One session on one pair of streams: returns once input ended and output is flushed."""
    outbox = Outbox(write_now=write_now_to(stdout))
    async with open_session(config, outbox.put, outbox.wait_for_room) as session:
        dispatcher = Dispatcher(session, outbox.put)
        input_scope = trio.CancelScope()
        settle_scope = trio.CancelScope()  # waits for the last run; bounded once stopping

        def stop(_: int = 0) -> None:
            """Stop reading, drop what is queued and abort the run; its closing events
            follow."""
            settle_scope.deadline = min(settle_scope.deadline,
                                        trio.current_time() + SHUTDOWN_GRACE_S)
            session.stop()
            input_scope.cancel()

        if watch_signals:
            await daemon_nursery.start(_watch_signals, stop)

        async def write() -> None:
            if not await outbox.serve_writer(stdout):
                log("the client stopped reading; shutting down")
                stop()

        async with trio.open_nursery() as connection_nursery:
            connection_nursery.start_soon(write)
            commands_send, commands_receive = trio.open_memory_channel[Incoming](
                COMMAND_QUEUE_SIZE)
            with input_scope:
                async with trio.open_nursery() as input_nursery:
                    input_nursery.start_soon(serve_reader, stdin, commands_send)
                    input_nursery.start_soon(serve_dispatcher, commands_receive,
                                             dispatcher.handle, outbox.put,
                                             outbox.wait_for_room)
            session.ui.interactive = False  # no more answers can come
            session.ui.cancel_all()
            with settle_scope:
                await dispatcher.wait_idle()
            outbox.close()
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stdout.aclose()


async def _watch_signals(stop: Callable[[int], None], *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The first SIGTERM, SIGINT or SIGHUP calls `stop`; later ones are only noted (the
    shutdown under way writes the closing events), until the process ends."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        stopping = False
        async for signum in signals:
            name = signal.Signals(signum).name
            print(f"forged: {name}: {'already ' if stopping else ''}shutting down",
                  file=sys.stderr)
            if not stopping:
                stopping = True
                stop(signum)


# --- the daemon --------------------------------------------------------------------------------

DRAIN_GRACE_S = 30.0
FLUSH_S = 2.0


@attrs.define(kw_only=True)
class ServeOptions:
    """What ``forged serve`` was asked for (settings fill what the command line leaves)."""

    socket_path: Path | None = None
    ws: tuple[str, int] | None = None
    ws_allow_remote: bool = False
    ws_allow_origins: list[str] = attrs.Factory(list)
    idle_unload_s: float | None = None
    drain_grace_s: float | None = None
    queue_limit_bytes: int = PEER_QUEUE_BYTES
    max_live_sessions: int | None = None
    empty_unload_s: float = EMPTY_IDLE_UNLOAD_S


def _daemon_setting(key: str, default: float) -> float:
    section = Settings(agent_dir()).get("daemon")
    value = section.get(key) if isinstance(section, dict) else None
    return float(value) if isinstance(value, int | float) and value >= 0 else default


async def run_daemon(options: Options, serve: ServeOptions, *, models: Models | None = None,
                     stop: trio.Event | None = None,
                     task_status: trio.TaskStatus[Hub] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve sessions on the Unix socket (and WebSocket) until SIGTERM or SIGINT (or `stop`),
    then drain: stop accepting, let runs finish for the grace period, abort the rest (their
    closing events are written), flush every client and session file, and return. `models`
    replaces loading them from the options."""
    from ._transports.unix import bind_unix

    idle_unload_s = serve.idle_unload_s if serve.idle_unload_s is not None else (
        _daemon_setting("idleUnloadSeconds", IDLE_UNLOAD_S))
    drain_grace_s = serve.drain_grace_s if serve.drain_grace_s is not None else (
        _daemon_setting("drainSeconds", DRAIN_GRACE_S))
    max_live_sessions = serve.max_live_sessions or max(1, int(
        _daemon_setting("maxSessions", MAX_LIVE_SESSIONS)))
    passed = systemd.listen_sockets()
    unix_sockets = [trio.socket.from_stdlib_socket(s) for s in passed
                    if s.family == socket.AF_UNIX]
    tcp_sockets = [trio.socket.from_stdlib_socket(s) for s in passed
                   if s.family != socket.AF_UNIX]
    socket_path = serve.socket_path or default_socket_path()
    bound = not unix_sockets
    if bound:
        unix_sockets = [bind_unix(socket_path)]
    pid_path = runtime_dir(socket_path) / "forged.pid"
    pid_path.write_text(f"{os.getpid()}\n")
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as daemon_nursery:
                models = models or await open_models(options, daemon_nursery)

                def make_config(request: SessionRequest) -> SessionConfig:
                    asked = Models(registry=models.registry,
                                   provider=request.provider or models.provider,
                                   pattern=request.model or (
                                       None if request.provider else models.pattern))
                    return session_config(attrs.evolve(
                        options, cwd=request.cwd or options.cwd,
                        model=request.model or options.model,
                        session=(str(request.session_path) if request.session_path
                                 else request.session),
                        continue_=request.continue_recent,
                        session_name=request.session_name or options.session_name,
                        no_session=request.no_session or options.no_session), asked)

                async with trio.open_nursery() as sessions_nursery:
                    hub = Hub(make_config, sessions_nursery, idle_unload_s=idle_unload_s,
                              queue_limit_bytes=serve.queue_limit_bytes,
                              max_live_sessions=max_live_sessions,
                              empty_unload_s=serve.empty_unload_s)
                    hub.default_cwd = options.cwd
                    async with trio.open_nursery() as peers_nursery:
                        async with trio.open_nursery() as listen_nursery:
                            await _listen(hub, serve, unix_sockets, tcp_sockets, socket_path,
                                          listen_nursery, peers_nursery)
                            daemon_nursery.start_soon(_keep_watchdog_fed, hub)
                            systemd.notify("READY=1", f"STATUS={_status(hub)}")
                            task_status.started(hub)
                            await _wait_for_stop(signals, stop)
                            systemd.notify("STOPPING=1")
                            listen_nursery.cancel_scope.cancel()
                        await _drain(hub, drain_grace_s)
                        await _flush_peers(hub)
                        peers_nursery.cancel_scope.cancel()
                    for live in list(hub.live):
                        live.unload_scope.cancel()
                daemon_nursery.cancel_scope.cancel()
    finally:
        with contextlib.suppress(OSError):
            pid_path.unlink()
        if bound:
            with contextlib.suppress(OSError):
                socket_path.unlink()
    log("stopped")


async def _wait_for_stop(signals: Any, stop: trio.Event | None) -> None:
    async with trio.open_nursery() as nursery:
        async def signalled() -> None:
            async for signum in signals:
                log(f"{signal.Signals(signum).name}: draining")
                break
            nursery.cancel_scope.cancel()

        async def asked() -> None:
            if stop is not None:
                await stop.wait()
                log("asked to stop: draining")
                nursery.cancel_scope.cancel()

        nursery.start_soon(signalled)
        nursery.start_soon(asked)


async def _listen(hub: Hub, serve: ServeOptions, unix_sockets: list[Any],
                  tcp_sockets: list[Any], socket_path: Path, listen_nursery: trio.Nursery,
                  peers_nursery: trio.Nursery) -> None:
    from ._transports.unix import serve_unix
    from ._transports.websocket import check_address, make_token, serve_websocket

    for listener in unix_sockets:
        await listen_nursery.start(partial(serve_unix, hub, listener,
                                           handler_nursery=peers_nursery))
    for listener in unix_sockets:
        log(f"listening on {listener.getsockname()}")
    if serve.ws is None and not tcp_sockets:
        return
    listeners = [trio.SocketListener(s) for s in tcp_sockets]
    if serve.ws is not None:
        host, port = serve.ws
        check_address(host, serve.ws_allow_remote)
        listeners += await trio.open_tcp_listeners(port, host=host)
    token = make_token(socket_path.parent)
    await listen_nursery.start(partial(serve_websocket, hub, listeners, token,
                                       allowed_origins=serve.ws_allow_origins,
                                       handler_nursery=peers_nursery))
    for listener in listeners:
        host, port, *_ = listener.socket.getsockname()
        log(f"listening on ws://{host}:{port} (token in {socket_path.parent / 'ws-token'})")


def _status(hub: Hub) -> str:
    streaming = sum(1 for live in hub.live if live.session.busy)
    return (f"{len(hub.live)} sessions ({streaming} streaming), {len(hub.peers)} clients")


async def _keep_watchdog_fed(hub: Hub) -> None:
    interval = systemd.watchdog_interval_s()
    while interval is not None:
        systemd.notify("WATCHDOG=1", f"STATUS={_status(hub)}")
        await trio.sleep(interval)


async def _drain(hub: Hub, grace_s: float) -> None:
    """Let the runs finish for `grace_s`; then abort what still runs, and wait (a little)
    for the closing events."""
    with trio.move_on_after(grace_s):
        for live in list(hub.live):
            await live.dispatcher.wait_idle()
    busy = [live for live in hub.live if live.session.busy]
    for live in busy:
        log(f"aborting session {live.id}")
        live.session.stop()
    with trio.move_on_after(SHUTDOWN_GRACE_S):
        for live in busy:
            await live.session.run.wait_settled()


async def _flush_peers(hub: Hub) -> None:
    for peer in hub.peers:
        peer.outbox.close()
    with trio.move_on_after(FLUSH_S):
        for peer in list(hub.peers):
            await peer.flushed.wait()
