"""What a process serves: the command line's `Options`, the models it loads, each session's
`SessionConfig`, and the stored sessions on disk (one lookup for ``--session``,
``--continue``, ``attach`` and ``list_sessions``)."""

from __future__ import annotations

import datetime
import gc
import glob
import importlib
import os
import time
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

# `trio.testing.wait_all_tasks_blocked`, from where it is defined: trio.testing imports pytest.
from trio._core._generated_run import wait_all_tasks_blocked

from . import _codec, _codecache, _wire as w
from ._errors import CommandError, ConfigError
from ._log import log
from ._mcp import McpConfig
from ._models import SCRIPTED_PROVIDER, ModelRegistry, clamp_level, register_scripted
from ._opening import SessionConfig
from ._paths import agent_dir, session_dir_for
from ._plugins import discover_plugins
from ._providers import load_providers, streaming, wait_replies_ended
from ._resources import ExtraPaths
from ._settings import Settings
from ._tools import ToolChoice, builtin_tools


@attrs.define(kw_only=True, eq=False, repr=False)
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
    approve: bool | None = None
    """``--approve`` (True), ``--no-approve`` (False), or neither: ``trustedProjects``."""
    interactive: bool = True
    thinking: str | None = None
    api_key: str | None = None
    tools: ToolChoice = attrs.Factory(ToolChoice)
    session_id: str | None = None
    fork: str | None = None
    mcp_files: list[Path] = attrs.Factory(list)
    """``--mcp-config``."""
    mcp_handed: dict[str, Any] = attrs.Factory(dict)
    """MCP servers a client hands the session (ACP's ``mcpServers``), as mcp.json entries."""
    no_mcp: bool = False
    permission_mode: str | None = None
    """``--permission-mode`` (else the settings' ``permissionMode``)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class ServeOptions:
    """What ``forged serve`` was asked for; None leaves it to the settings' ``daemon``
    section, else the daemon's default."""

    socket_path: Path | None = None
    ws: tuple[str, int] | None = None
    ws_allow_remote: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    """The WebSocket listener's certificate and key (else the settings' ``daemon.tls``)."""
    insecure: bool = False
    """A listener other than loopback without TLS (a proxy in front terminates it)."""
    ws_allow_origins: list[str] = attrs.Factory(list)
    public_url: str | None = None
    """Where devices reach the WebSocket listener (a proxy's https:// address), for the
    links ``forged pair`` prints; else the settings' ``daemon.publicUrl``, else the
    listener's own address."""
    idle_unload_s: float | None = None
    drain_grace_s: float | None = None
    queue_limit_bytes: int | None = None
    max_live_sessions: int | None = None
    empty_unload_s: float | None = None
    upgrade: Any = None
    """Serves a socket connection that asks for ACP (`forged._transports.unix.Upgrade`);
    None: the daemon speaks RPC only."""


def daemon_setting(key: str, default: float, section: object = None) -> float:
    """A number (not negative) of a ``daemon`` settings section: `section`, else the global
    settings'; else `default`."""
    if section is None:
        section = Settings(agent_dir()).get("daemon")
    value = section.get(key) if isinstance(section, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return default


@attrs.define(kw_only=True, eq=False, repr=False)
class Models:
    """The model registry a process serves sessions from, and what the command line asked
    of it."""

    registry: ModelRegistry
    provider: str | None = None
    pattern: str | None = None


WARM_UP_IDLE_S = 0.005
"""How long the process has done nothing before the warm-up takes a step, once something
else ran (`_idle`)."""
WARM_UP_GAP_S = 0.0003
"""More time than this between two steps of the warm-up: something else ran (`_idle`)."""


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
    nursery.start_soon(warm_up, sorted({model.api for model in registry.available()}))
    return models


async def warm_up(apis: list[str]) -> None:
    """What a first prompt or abort would otherwise pay for, done while the process waits:
    the providers of `apis` (those of the models it has keys for) load in a worker thread;
    the converter builds the hooks of the events every run ends with and of the commands
    that stop a run, and the ~40,000 objects start-up made leave the collector's view (a
    full collection over them stalled the loop ~8 ms); then the protocol's classes
    `forged._wire` leaves to first use, the built-in tools and the run driver's modules are
    made, and the hooks of every class forged writes.

    Until the collector's view is cleared, each step waits until every other task waits:
    commands already waiting (a client's first ``get_state``) are answered before the load
    takes the interpreter, and every run needs the closing hooks (an abort at once). The
    rest waits for the process to have nothing to do (`_idle`)."""
    await wait_all_tasks_blocked()
    if apis:
        await load_providers(apis)
    await wait_all_tasks_blocked()
    for event in _codec.rehearsals():  # and the hooks nested in them: see `rehearsals`
        _codec.encode(event)
        await wait_all_tasks_blocked()
    for name in _codec.URGENT_COMMANDS:
        _codec.prepare_command(name)
        await wait_all_tasks_blocked()
    gc.freeze()
    for module in [*(f"{w.__name__}.{name}" for name in w.LAZY_MODULES), f"{__package__}._run"]:
        await _idle()
        importlib.import_module(module)
    await _idle()
    builtin_tools()
    for cls in _codec.sent_classes() * 2:  # twice: see `prepare`
        await _idle()
        _codec.prepare(cls)
    _codecache.save()
    gc.freeze()


async def _idle() -> None:
    """Return once every other task waits, no model's reply is streaming in, and nothing
    else did more than `WARM_UP_GAP_S` of work since the last step (else nothing has run for
    `WARM_UP_IDLE_S`). A step (an import of a module of classes takes ~10 ms) would hold up
    the bytes of a reply that come next, and one taken between a run's steps would slow it:
    so the steps go where the process has nothing to do (while a request waits for its
    answer, a command runs, or no prompt has come)."""
    started = time.perf_counter()
    await wait_all_tasks_blocked()
    busy = time.perf_counter() - started > WARM_UP_GAP_S
    while busy or streaming():
        await wait_replies_ended()
        await wait_all_tasks_blocked(WARM_UP_IDLE_S)
        busy = False


async def open_session_config(options: Options, nursery: trio.Nursery) -> SessionConfig:
    """Load models (starting the scripted server if asked) and choose the starting model."""
    return session_config(options, await open_models(options, nursery))


def session_config(options: Options, models: Models) -> SessionConfig:
    """A session's configuration: its settings, plugins, model and file, for `options.cwd`."""
    directory = agent_dir()
    registry = models.registry
    registry.check_provider(models.provider)
    settings = Settings(directory, options.cwd, trust_project=options.approve is True,
                        distrust_project=options.approve is False)
    if settings.project_untrusted_note:
        log(settings.project_untrusted_note)
    level = str(settings.get("defaultThinkingLevel", "medium"))
    if level not in w.THINKING_LEVELS:
        level = "medium"
    if options.api_key is not None:
        use_key(registry, options, models.provider)
    model: w.Model | None
    if models.pattern is not None:
        model, suffix = registry.resolve_pattern(models.pattern, models.provider)
        level = suffix or level
    else:
        model = (saved_default(registry, settings, models.provider)
                 or registry.initial_model(models.provider))
    level = options.thinking or level
    session_dir = sessions_folder(options.cwd, settings, options.session_dir)
    session_path, fork_from = find_session(options, session_dir), None
    if options.fork is not None:
        fork_from = find_stored_session(options.fork, session_dir)
    elif options.session_id is not None and session_path is None:
        found = [path for path in stored_files(session_dir, options.session_id)
                 if path.stem.endswith(f"_{options.session_id}")]
        session_path = found[0] if found else None
    return SessionConfig(cwd=options.cwd, agent_dir=directory, registry=registry, model=model,
                         thinking_level=clamp_level(model, level) if model else level,
                         session_name=options.session_name, persist=not options.no_session,
                         session_dir=session_dir, session_path=session_path,
                         new_session_id=options.session_id, fork_from=fork_from,
                         keep_model=options.model is not None or options.thinking is not None,
                         settings=settings, model_scope=options.models, extra=options.extra,
                         plugins=discover_plugins(options.cwd, directory, settings,
                                                  extra=options.plugins),
                         interactive=options.interactive, tools=options.tools,
                         permission_mode=options.permission_mode,
                         mcp=McpConfig(files=options.mcp_files, handed=options.mcp_handed,
                                       disabled=options.no_mcp))


def use_key(registry: ModelRegistry, options: Options, provider: str | None) -> None:
    """``--api-key``: the key of the provider of the model ``--model`` (else the first of
    ``--models``) names."""
    pattern = options.model or (options.models[0] if options.models else None)
    if pattern is None:
        raise ConfigError("--api-key needs --model (or --models): it is the key of that "
                          "model's provider")
    model, _ = registry.resolve_pattern(pattern, provider)
    registry.use_key(model.provider, options.api_key or "")


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


# --- stored sessions ---------------------------------------------------------------------------

def sessions_folder(cwd: Path, settings: Settings, asked: Path | None = None) -> Path:
    """Where `cwd`'s session files are: `asked` (``--session-dir``), else
    ``PI_CODING_AGENT_SESSION_DIR``, else the ``sessionDir`` setting (relative to `cwd`), else
    ``<agentDir>/sessions/--<cwd>--``."""
    if asked is not None:
        return asked
    configured = os.environ.get("PI_CODING_AGENT_SESSION_DIR") or settings.get("sessionDir")
    if isinstance(configured, str) and configured:
        return (cwd / Path(configured).expanduser()).resolve()
    return session_dir_for(agent_dir(), cwd)


def stored_files(folder: Path, id_prefix: str = "") -> list[Path]:
    """The session files in `folder` whose session id starts with `id_prefix` (taken
    literally, never as a pattern), newest name first."""
    if not folder.is_dir():
        return []
    return sorted((path for path in folder.glob(f"*_{glob.escape(id_prefix)}*.jsonl")
                   if path.is_file()), reverse=True)


def find_stored_session(arg: str, session_dir: Path) -> Path:
    """The session file `arg` names: a path, or a session id prefix in `session_dir`."""
    if "/" in arg or arg.endswith(".jsonl"):
        return Path(arg).expanduser().resolve()
    matches = stored_files(session_dir, arg)
    if not matches:
        raise ConfigError(f"No session found matching {arg!r} in {session_dir}")
    return matches[-1]


def find_session(options: Options, session_dir: Path) -> Path | None:
    """The file --session or --continue asks to continue, if any."""
    if options.session is not None:
        return find_stored_session(options.session, session_dir)
    if options.continue_:
        candidates = stored_files(session_dir)
        if candidates:
            return max(candidates, key=lambda path: path.stat().st_mtime)
    return None


def list_stored(cwd: Path) -> list[w.StoredSessionInfo]:
    """The stored sessions of `cwd`, newest first."""
    found: list[w.StoredSessionInfo] = []
    for path in stored_files(sessions_folder(cwd, Settings(agent_dir(), cwd))):
        session_id = path.stem.rpartition("_")[2]
        modified = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
        found.append(w.StoredSessionInfo(
            session_id=session_id, path=str(path),
            modified=modified.isoformat(timespec="milliseconds").replace("+00:00", "Z")))
    return found


def stored_title(path: Path) -> str:
    """A stored session's name, else the start of its first prompt (read from its first
    64 KB: listing stays quick whatever the files hold)."""
    try:
        with path.open("rb") as file:
            head = file.read(64 * 1024)
    except OSError:
        return path.stem
    name = first = None
    for line in head.splitlines()[1:]:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if entry.get("type") == "session_info" and isinstance(entry.get("name"), str):
            name = entry["name"]
        message = entry.get("message") if entry.get("type") == "message" else None
        if first is None and isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            first = content if isinstance(content, str) else " ".join(
                block.get("text", "") for block in content or [] if isinstance(block, dict))
    return name or (first or path.stem).strip()[:80]


def find_stored(id_prefix: str) -> dict[str, tuple[Path, Path]]:
    """The stored sessions of any cwd whose id starts with `id_prefix` (taken literally:
    never a pattern, never a path): each id's file, and the cwd its header names."""
    if not id_prefix or "/" in id_prefix or "\0" in id_prefix:
        return {}
    return _stored_named(id_prefix)


def every_stored() -> dict[str, tuple[Path, Path]]:
    """The stored sessions of every cwd (the configured folder's, and each cwd's under the
    agent dir): each id's file, and the cwd its header names."""
    return _stored_named("")


def _stored_named(id_prefix: str) -> dict[str, tuple[Path, Path]]:
    found: dict[str, tuple[Path, Path]] = {}
    name = f"*_{glob.escape(id_prefix)}*.jsonl"
    configured = sessions_folder(Path.cwd(), Settings(agent_dir()))
    for path in [*configured.glob(name), *(agent_dir() / "sessions").glob(f"*/{name}")]:
        session_id = path.stem.rpartition("_")[2]
        if not session_id.startswith(id_prefix) or session_id in found:
            continue
        try:
            with open(path, "rb") as file:
                header = orjson.loads(file.readline())
            found[session_id] = (path, Path(header["cwd"]))
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            continue
    return found


def one_session(id_prefix: str, ids: set[str]) -> str:
    """The one of `ids` (those `id_prefix` matched); `CommandError` for none or several."""
    if len(ids) == 1:
        return next(iter(ids))
    if not ids:
        raise CommandError(f"No session {id_prefix}")
    listed = ", ".join(sorted(ids)[:5]) + (", …" if len(ids) > 5 else "")
    raise CommandError(f"{id_prefix!r} is the start of {len(ids)} sessions' ids ({listed}); "
                       "give more of it")


def command_folder(text: str, *, existing: bool = True) -> Path:
    """A command's ``cwd``: an absolute path (``~`` expanded) to a folder, which must exist
    unless `existing` is false; `CommandError` saying why not."""
    try:
        path = Path(text).expanduser()
        if not path.is_absolute():
            raise CommandError(f"cwd must be an absolute path: {text}")
        path = path.resolve()
        if existing and not path.is_dir():
            raise CommandError(f"cwd is not a directory: {text}")
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL, ~nosuchuser, a loop
        raise CommandError(f"Invalid cwd {text!r}: {exc}") from None
    return path
