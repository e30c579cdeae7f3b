"""The supervision tree, and the shutdown policy.

::

    run_stdio
    └── daemon_nursery
        ├── ScriptedServer.serve          the scripted provider (--provider scripted only)
        ├── watch_signals                 SIGTERM / SIGINT: stop reading, abort, flush, exit 0
        ├── Session.serve → session_nursery
        │   └── Session._drive            one task per accepted prompt and its continuations,
        │       └── run_agent             each run inside the session's run_scope (abort);
        │           └── tool processes    bash and rg, each in its own process group
        └── connection_nursery
            ├── Outbox.serve_writer       the only writer of the protocol stream (fd 1)
            └── input_nursery             cancelled by a signal
                ├── serve_reader          stdin -> lines -> commands, in order
                └── serve_dispatcher      commands -> handlers, which never wait

Shutdown: at stdin EOF the reader ends, the dispatcher drains, the current run and its queued
messages finish, the outbox is flushed and the process exits 0. A signal aborts the run first
and allows `SHUTDOWN_GRACE_S` for the closing events.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from . import _wire as w
from ._connection import Incoming, Outbox, open_fd_stream, serve_dispatcher, serve_reader
from ._dispatch import Dispatcher
from ._errors import ConfigError
from ._jsonl import encode_line
from ._models import SCRIPTED_PROVIDER, ModelRegistry, agent_dir, clamp_level, register_scripted
from ._plugins import discover_plugins
from ._resources import ExtraPaths
from ._session import Session, SessionConfig
from ._settings import Settings
from ._store import session_dir_for

SHUTDOWN_GRACE_S = 2.5
COMMAND_QUEUE_SIZE = 256


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
    """Load models.json, and start the scripted provider's server in `nursery` if asked."""
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
    return models


async def open_session_config(options: Options, nursery: trio.Nursery) -> SessionConfig:
    """Load models (starting the scripted server if asked) and choose the starting model."""
    return session_config(options, await open_models(options, nursery))


def session_config(options: Options, models: Models) -> SessionConfig:
    """A session's configuration: its settings, plugins, model and file, for `options.cwd`."""
    directory = agent_dir()
    registry = models.registry
    settings = Settings(directory, options.cwd)
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
                                                  extra=options.plugins,
                                                  trust_project=options.trust_project),
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
        matches = sorted(session_dir.glob(f"*_{arg}*.jsonl"))
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
    exit 1. No client can answer dialogs: they resolve as cancelled."""
    stdout = open_fd_stream(stdout_fd)
    outbox = Outbox()
    responses: list[dict[str, Any]] = []
    async with trio.open_nursery() as daemon_nursery:
        config = await open_session_config(attrs.evolve(options, interactive=False),
                                           daemon_nursery)
        session = Session(config, outbox.put if events else lambda _: None,
                          outbox.wait_for_room if events else None)
        await daemon_nursery.start(session.serve)
        dispatcher = Dispatcher(session, lambda line: responses.append(orjson.loads(line)))
        code = 0
        async with trio.open_nursery() as output_nursery:
            output_nursery.start_soon(outbox.serve_writer, stdout)
            if events:
                outbox.put(encode_line(session.store.header))
            for text in messages:
                dispatcher.handle(w.Prompt(message=text), None)
                await dispatcher.wait_idle()
                if not responses[-1]["success"]:
                    print(f"forged: {responses[-1]['error']}", file=sys.stderr)
                    code = 1
                    break
            if not events and code == 0:
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
    outbox = Outbox()
    session = Session(config, outbox.put, outbox.wait_for_room)
    await daemon_nursery.start(session.serve)
    dispatcher = Dispatcher(session, outbox.put)
    input_scope = trio.CancelScope()
    settle_scope = trio.CancelScope()  # waits for the last run; bounded once stopping

    def stop() -> None:
        """Stop reading, drop what is queued and abort the run; its closing events follow."""
        settle_scope.deadline = min(settle_scope.deadline,
                                    trio.current_time() + SHUTDOWN_GRACE_S)
        session.clear_queue()
        session.abort(lambda: None)
        session.abort_bash()
        input_scope.cancel()

    if watch_signals:
        daemon_nursery.start_soon(_watch_signals, stop)

    async def write() -> None:
        if not await outbox.serve_writer(stdout):
            print("forged: the client stopped reading; shutting down", file=sys.stderr)
            stop()

    async with trio.open_nursery() as connection_nursery:
        connection_nursery.start_soon(write)
        commands_send, commands_receive = trio.open_memory_channel[Incoming](COMMAND_QUEUE_SIZE)
        with input_scope:
            async with trio.open_nursery() as input_nursery:
                input_nursery.start_soon(serve_reader, stdin, commands_send)
                input_nursery.start_soon(serve_dispatcher, commands_receive, dispatcher.handle,
                                         outbox.put)
        session.ui.interactive = False  # no more answers can come
        session.ui.cancel_all()
        with settle_scope:
            await dispatcher.wait_idle()
        outbox.close()
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stdout.aclose()


async def _watch_signals(stop: Callable[[], None]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            print(f"forged: {signal.Signals(signum).name}: shutting down", file=sys.stderr)
            stop()
            return
