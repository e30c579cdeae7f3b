"""Capability plugins: Python modules with a ``register(api)`` function.

Where they are found, in this order (the first plugin of an id wins):

- the ``forged.plugins`` entry-point group of installed packages (scope ``user``, origin
  ``package``);
- ``<agentDir>/plugins/``: each ``*.py`` file and each folder with an ``__init__.py`` (``user``);
- ``<cwd>/.agent-forge/agent/plugins/``, only when the user trusts the project: it is listed in
  the global settings' ``trustedProjects`` (a project's own settings cannot trust it), or
  ``--trust-project`` was given (``project``); a plugin runs code;
- ``--plugin PATH`` (``temporary``).

`register(api)` is called once per session with a `PluginAPI` (``api.version`` is
`API_VERSION`). Through it a plugin registers ``/commands``, tools for the model, a
``before_tool_call`` gate and event observers, and asks the user through ``ctx.ui``.

Error handling: a plugin that fails to import or to register, or raises in any hook, is
reported on stderr with its traceback and never takes the session down. A failed command
answers its ``prompt`` with an error; a failed tool gives the model an error result; a
failed ``before_tool_call`` blocks the call (nothing defaults to allowing an action). A
plugin's prints go to stderr: fd 1 carries protocol lines only (docs/protocol.md, Lines).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol

import attrs
import trio

from . import _codec, _wire as w
from ._errors import CommandError
from ._log import log, log_exception
from ._resources import Scope
from ._settings import PROJECT_DIR, Settings
from ._tools import InvalidArguments, Tool, ToolContext, ToolError, make_tool
from ._tools.base import text_result
from ._ui import Dialogs

API_VERSION = 1
ENTRY_POINT_GROUP = "forged.plugins"

Register = Callable[["PluginAPI"], Any]


# --- finding plugins ---------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class PluginSource:
    id: str
    register: Register
    scope: Scope
    origin: Literal["top-level", "package"] = "top-level"
    path: Path | None = None


_modules: dict[Path, ModuleType] = {}
"""Plugin modules already imported, by file: every session of a process shares them."""


def _failed(plugin_id: str, where: str, exc: BaseException) -> None:
    log_exception(f"plugin {plugin_id} failed in {where}: {exc or type(exc).__name__}", exc)


def _import_file(path: Path) -> ModuleType:
    """Import a plugin file (or package folder) under a name of its own."""
    path = path.resolve()
    if path in _modules:
        return _modules[path]
    is_package = path.is_dir()
    location = path / "__init__.py" if is_package else path
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"forged_plugin_{path.stem.replace('-', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(
        name, location, submodule_search_locations=[str(path)] if is_package else None)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _modules[path] = module
    return module


def _register_of(plugin_id: str, loaded: object) -> Register:
    register = getattr(loaded, "register", loaded)
    if not callable(register):
        raise TypeError(f"plugin {plugin_id} has no register(api) function")
    return register


def load_plugin_file(path: Path, scope: Scope) -> PluginSource | None:
    """The plugin in `path` (a ``.py`` file or a package folder); None, reported, when it
    cannot be imported."""
    plugin_id = path.stem if path.is_file() else path.name
    try:
        if not path.exists():
            raise FileNotFoundError(f"no such plugin: {path}")
        register = _register_of(plugin_id, _import_file(path))
    except Exception as exc:
        _failed(plugin_id, "loading", exc)
        return None
    return PluginSource(id=plugin_id, register=register, scope=scope, path=path.resolve())


def _plugin_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(entry for entry in folder.iterdir()
                  if not entry.name.startswith((".", "_"))
                  and ((entry.is_file() and entry.suffix == ".py")
                       or (entry / "__init__.py").is_file()))


_installed: tuple[tuple[tuple[str, int], ...], list[PluginSource]] | None = None


def _declared(folders: Iterable[str]) -> bool:
    """Whether a distribution in `folders` declares a ``forged.plugins`` entry point: its
    ``entry_points.txt`` names the group (read as bytes, before any metadata parser)."""
    marker = f"[{ENTRY_POINT_GROUP}]".encode()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(entry.path, "entry_points.txt"), "rb") as file:
                    if marker in file.read():
                        return True
            except OSError:
                continue
    return False


def _package_plugins() -> list[PluginSource]:
    """The plugins installed as packages (the ``forged.plugins`` entry points).

    Reading every installed distribution's metadata takes milliseconds, which a daemon
    opening sessions would spend each time while other sessions stream; the answer is kept
    until a folder of ``sys.path`` changes (installing a package changes its folder)."""
    global _installed
    key = tuple((folder, os.stat(folder).st_mtime_ns) for folder in sys.path
                if os.path.isdir(folder))
    if _installed is not None and _installed[0] == key:
        return _installed[1]
    found: list[PluginSource] = []
    if not _declared(folder for folder, _ in key):
        _installed = key, found  # (importlib.metadata, ~9 ms to import, is not needed)
        return found
    import importlib.metadata

    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            register = _register_of(entry_point.name, entry_point.load())
        except Exception as exc:
            _failed(entry_point.name, "loading", exc)
            continue
        found.append(PluginSource(id=entry_point.name, register=register, scope="user",
                                  origin="package"))
    _installed = key, found
    return found


def discover_plugins(cwd: Path, agent_dir: Path, settings: Settings, *,
                     extra: Sequence[Path] = ()) -> list[PluginSource]:
    """Every plugin to load for a session in `cwd` (see the module docstring)."""
    found = list(_package_plugins())
    candidates: list[tuple[Path, Scope]] = [
        (path, "user") for path in _plugin_files(agent_dir / "plugins")]
    project_plugins = _plugin_files(cwd / PROJECT_DIR / "agent" / "plugins")
    if project_plugins and settings.project_trusted:
        candidates += [(path, "project") for path in project_plugins]
    elif project_plugins:
        log(f"not loading {len(project_plugins)} plugin(s) of {cwd}: the project "
              "is not trusted (add it to trustedProjects in the global settings.json, or "
              "pass --trust-project)")
    candidates += [(path.expanduser(), "temporary") for path in extra]
    for path, scope in candidates:
        source = load_plugin_file(path, scope)
        if source is not None:
            found.append(source)
    ids: set[str] = set()
    unique: list[PluginSource] = []
    for source in found:
        if source.id in ids:
            log(f"plugin {source.id} from {source.path} is already loaded; skipped")
            continue
        ids.add(source.id)
        unique.append(source)
    return unique


# --- what a plugin sees ------------------------------------------------------------------------

@attrs.define(kw_only=True, frozen=True)
class Block:
    """What `before_tool_call` returns to stop a call; `reason` is the model's error result."""

    reason: str


@attrs.define(kw_only=True, frozen=True)
class ToolCallEvent:
    """A tool call about to run (`before_tool_call`)."""

    tool_call_id: str
    tool_name: str
    args: dict[str, Any]


class SessionView(Protocol):
    """What plugins may use of a session."""

    cwd: Path
    ui: Dialogs
    settings: Settings

    @property
    def session_id(self) -> str: ...
    @property
    def session_name(self) -> str | None: ...
    def set_session_name(self, name: str) -> None: ...
    def send_user_message(self, text: str) -> None: ...


@attrs.define(kw_only=True, eq=False, repr=False)
class PluginHost:
    """A `SessionView` made of values and callables: what a session hands its plugins
    instead of itself."""

    cwd: Path
    ui: Dialogs
    settings: Settings
    session_id_of: Callable[[], str]
    session_name_of: Callable[[], str | None]
    set_session_name: Callable[[str], None]
    send_user_message: Callable[[str], None]

    @property
    def session_id(self) -> str:
        return self.session_id_of()

    @property
    def session_name(self) -> str | None:
        return self.session_name_of()


class _SessionFacing:
    """What both the API and a handler's context show of the session: its cwd, and the
    user's dialogs."""

    def __init__(self, session: SessionView) -> None:
        self._session = session

    @property
    def cwd(self) -> Path:
        return self._session.cwd

    @property
    def ui(self) -> Dialogs:
        return self._session.ui


class PluginContext(_SessionFacing):
    """Handed to every handler: the session's cwd and id, its name, the user's dialogs
    (``ctx.ui.confirm(...)``), and a way to send the agent a message."""

    def __init__(self, session: SessionView, plugin_id: str) -> None:
        super().__init__(session)
        self.plugin_id = plugin_id

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def session_name(self) -> str | None:
        return self._session.session_name

    def set_session_name(self, name: str) -> None:
        self._session.set_session_name(name)

    def send_user_message(self, text: str) -> None:
        """A user message: a new run when the session is idle, else a follow-up."""
        self._session.send_user_message(text)


class ToolRunContext(PluginContext):
    """A plugin tool's context: `update` shows the user partial output."""

    def __init__(self, session: SessionView, plugin_id: str, tool: ToolContext) -> None:
        super().__init__(session, plugin_id)
        self._tool = tool

    def update(self, text: str) -> None:
        self._tool.update(text_result(text))


@attrs.define(kw_only=True, eq=False, repr=False)
class PluginCommand:
    name: str
    description: str | None
    handler: Callable[[str, PluginContext], Any]
    plugin: PluginSource


@attrs.define(kw_only=True, eq=False, repr=False)
class _Registrations:
    commands: dict[str, PluginCommand] = attrs.Factory(dict)
    tools: dict[str, Tool] = attrs.Factory(dict)
    guidelines: list[str] = attrs.Factory(list)
    handlers: dict[str, list[Callable[..., Any]]] = attrs.Factory(dict)


class PluginAPI(_SessionFacing):
    """What ``register(api)`` receives. Registration only: the handlers it takes are called
    later, each with a `PluginContext`."""

    version = API_VERSION

    def __init__(self, source: PluginSource, session: SessionView) -> None:
        super().__init__(session)
        self.id = source.id
        self._source = source
        self._made = _Registrations()

    @property
    def settings(self) -> dict[str, Any]:
        """The merged settings (a copy): a plugin may keep its own options in a key there."""
        return dict(self._session.settings.merged)

    def block(self, reason: str) -> Block:
        return Block(reason=reason)

    def register_command(self, name: str, handler: Callable[[str, PluginContext], Any], *,
                         description: str | None = None) -> None:
        """``/name args`` sent with ``prompt`` calls ``handler(args, ctx)`` at once, even
        while the agent works; the ``prompt`` answers when it returns."""
        name = name.removeprefix("/")
        if not name or " " in name:
            raise ValueError(f"invalid command name: {name!r}")
        self._made.commands[name] = PluginCommand(name=name, description=description,
                                                  handler=handler, plugin=self._source)

    def register_tool(self, name: str, description: str, parameters: Mapping[str, Any],
                      run: Callable[[dict[str, Any], ToolRunContext], Any], *,
                      snippet: str | None = None, guidelines: Sequence[str] = ()) -> None:
        """A tool the model can call: `parameters` is its arguments' JSON schema, `run(args,
        ctx)` returns its text (or raises: an error result). An abort cancels `run`."""
        import jsonschema  # slow to import; only plugin tools need it

        jsonschema.Draft202012Validator.check_schema(dict(parameters))
        validator = jsonschema.Draft202012Validator(dict(parameters))
        plugin_id, session = self.id, self._session

        def parse(args: dict[str, Any]) -> dict[str, Any]:
            problems = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
            if problems:
                raise InvalidArguments([f"{'/'.join(map(str, p.path)) or 'root'}: {p.message}"
                                        for p in problems])
            return args

        async def run_tool(args: dict[str, Any], context: ToolContext) -> w.ToolResult:
            try:
                output = await call(run, args, ToolRunContext(session, plugin_id, context))
            except ToolError:
                raise
            except Exception as exc:
                _failed(plugin_id, f"tool {name}", exc)
                raise ToolError(str(exc) or type(exc).__name__) from exc
            if isinstance(output, w.ToolResult):
                return output
            return text_result("" if output is None else str(output))

        self._made.tools[name] = make_tool(
            name=name, description=description, parameters=dict(parameters),
            snippet=" ".join((snippet or description).split()), parse=parse, run=run_tool)
        self._made.guidelines.extend(guidelines)

    def on(self, event: str, handler: Callable[..., Any]) -> None:
        """``before_tool_call``: ``handler(call, ctx)`` may return ``api.block(reason)``.
        Any event type (``agent_start``, ``tool_execution_end``, ...) or ``*``:
        ``handler(event, ctx)`` with the event as the client sees it, in order, after it
        was written."""
        if event not in w.EVENT_TYPES and event not in ("before_tool_call", "*"):
            log(f"plugin {self.id}: there is no event {event!r} to observe")
        self._made.handlers.setdefault(event, []).append(handler)


async def call(function: Callable[..., Any], *args: Any) -> Any:
    """Call a plugin's function, sync or async."""
    result = function(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


# --- a session's plugins -----------------------------------------------------------------------

class Plugins:
    """The plugins of one session: their commands, tools, gates and observers."""

    def __init__(self, session: SessionView) -> None:
        self._session = session
        self.commands: dict[str, PluginCommand] = {}
        self.tools: dict[str, Tool] = {}
        self.guidelines: list[str] = []
        self._gates: list[tuple[str, Callable[..., Any]]] = []
        self._observers: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        self._events_send, self._events_receive = trio.open_memory_channel[dict[str, Any]](
            math.inf)
        self._running = 0
        self._commands_done = trio.Event()
        self._commands_done.set()

    def register(self, sources: Sequence[PluginSource]) -> None:
        """Load `sources`, each calling its ``register(api)``; one that fails is said and
        left out."""
        for source in sources:
            self._register(source)

    def _register(self, source: PluginSource) -> None:
        api = PluginAPI(source, self._session)
        try:
            result = source.register(api)
            if inspect.isawaitable(result):
                raise TypeError("register(api) must not be async")
        except Exception as exc:
            _failed(source.id, "register", exc)
            return
        made = api._made
        for name, command in made.commands.items():
            if name in self.commands:
                log(f"plugin {source.id}: command /{name} is taken by plugin "
                      f"{self.commands[name].plugin.id}; skipped")
            else:
                self.commands[name] = command
        for name, tool in made.tools.items():
            if name in self.tools:
                log(f"plugin {source.id}: tool {name} is taken; skipped")
            else:
                self.tools[name] = tool
        self.guidelines += made.guidelines
        for event, handlers in made.handlers.items():
            for handler in handlers:
                if event == "before_tool_call":
                    self._gates.append((source.id, handler))
                else:
                    self._observers.setdefault(event, []).append((source.id, handler))

    # --- commands ------------------------------------------------------------------------------

    def command_for(self, text: str) -> tuple[PluginCommand, str] | None:
        """The plugin command `text` invokes (``/name args``), and its args."""
        if not text.startswith("/"):
            return None
        name, _, args = text[1:].partition(" ")
        command = self.commands.get(name)
        return (command, args.strip()) if command is not None else None

    @property
    def running(self) -> bool:
        """A command is running."""
        return self._running > 0

    async def wait_commands(self) -> None:
        await self._commands_done.wait()

    async def run_command(self, command: PluginCommand, args: str) -> w.PromptAccepted:
        """Run a command's handler at once, whatever else runs: it manages its own execution
        (docs/protocol.md, Dialogs). A failure is reported and raised as `CommandError`."""
        if not self._running:  # a waiter keeps the Event it waits on
            self._commands_done = trio.Event()
        self._running += 1
        try:
            await call(command.handler, args, PluginContext(self._session, command.plugin.id))
        except Exception as exc:
            _failed(command.plugin.id, f"command /{command.name}", exc)
            raise CommandError(f"Command /{command.name} failed: "
                               f"{exc or type(exc).__name__}") from exc
        finally:
            self._running -= 1
            if not self._running:
                self._commands_done.set()
        return w.PromptAccepted(disposition="handled")

    def command_infos(self) -> list[w.CommandInfo]:
        return [w.CommandInfo(
            name=command.name, description=command.description, source="capability",
            source_info=w.SourceInfo(path=f"<plugin:{command.plugin.id}:{command.name}>",
                                     source=command.plugin.id, scope=command.plugin.scope,
                                     origin=command.plugin.origin))
            for command in self.commands.values()]

    # --- hooks ---------------------------------------------------------------------------------

    async def before_tool_call(self, call_id: str, tool_name: str, args: dict[str, Any]
                               ) -> str | None:
        """The reason the first gate gives to block the call, or None to let it run. A gate
        that raises blocks it."""
        event = ToolCallEvent(tool_call_id=call_id, tool_name=tool_name, args=args)
        for plugin_id, gate in self._gates:
            try:
                verdict = await call(gate, event, PluginContext(self._session, plugin_id))
            except Exception as exc:
                _failed(plugin_id, "before_tool_call", exc)
                return (f"Blocked: plugin {plugin_id} failed in before_tool_call: "
                        f"{exc or type(exc).__name__}")
            if isinstance(verdict, Block):
                return verdict.reason or f"Blocked by plugin {plugin_id}"
        return None

    def observe(self, event: w.Event) -> None:
        """Pass an event written to the client on to the plugins observing it (as the JSON
        object the client reads)."""
        if self._observers and (event.type in self._observers or "*" in self._observers):
            self._events_send.send_nowait(_codec.unstructure(event))

    async def serve_observers(self) -> None:
        """Call observers with each event, in order, until cancelled."""
        async for event in self._events_receive:
            kind = event.get("type", "")
            for plugin_id, handler in [*self._observers.get(kind, []),
                                       *self._observers.get("*", [])]:
                try:
                    await call(handler, event, PluginContext(self._session, plugin_id))
                except Exception as exc:
                    _failed(plugin_id, f"on({kind!r})", exc)
