"""One agent session: its state, its queues, its event stream, and what it is doing.

Many sessions can live in one process: each has its own cwd, its own nursery and its own event
sink. A session is opened with ``async with open_session(config, sink) as session:`` (its
files are read in a worker thread) and lives while the block runs. It never writes to a stream
itself: it gives its sink each event, a wire object, in the order it produces them; each front
encodes them at its own edge.

What a session does is owned by three parts, each with its own cancel scope: the run driver
(`forged._run.Runner`: prompts, retries, compaction, ``abort``), the direct bash slot
(`forged._direct_bash.DirectBash`, ``abort_bash``) and the plugin commands
(`forged._plugins.Plugins`). `Session.idle` is the one answer to "is this session doing
something".

A run is given values, never the session: the context (`forged._context.Context`, its one
owner), the way to ask the model (`forged._asking.ModelAsker`), the tools
(`forged._toolset.Toolbox`), the queues and the run's settings (`forged._retry.RunSettings`);
its events come back through `Session.emit`, which stores a message as its ``message_end``
passes (and holds a ``message_start`` that is not streamed until then), so nothing is
announced that is not stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import attrs
import trio

from . import _telemetry, _wire as w
from ._asking import ModelAsker
from ._connection import coalesced
from ._context import Context, stored_name
from ._direct_bash import DirectBash
from ._errors import CommandError
from ._log import log
from ._mcp import (
    McpServers,
    startup_timeout,
)
from ._model_choice import ModelChoice
from ._opening import SessionConfig, SessionFiles
from ._plugins import PluginHost, Plugins
from ._queues import Queues, user_message
from ._retry import RunSettings
from ._settings import Settings
from ._stats import UsageTotals, session_stats
from ._store import SessionFile
from ._switching import Maker, entry_position
from ._telemetry import Caller
from ._tools import BUILTIN_NAMES, Tool, select_tools
from ._tools.base import ClientFiles, ScratchDir, Shell
from ._tools.environment import ShellEnvironment
from ._tools.guard import (
    SERVER_CACHE,
    Guard,
    SandboxSettings,
    check_mode,
    record_mode,
    starting_mode,
    unusable_modes_problem,
)
from ._toolset import Toolbox, Tools
from ._ui import Dialogs

if TYPE_CHECKING:
    from ._checkpointing import Checkpoints
    from ._run import Runner

Sink = Callable[["w.Event"], None]
"""Where a session's events go, as wire objects."""

BUSY_PROMPT_ERROR = (
    "Agent is already processing. Specify streamingBehavior ('steer' or 'followUp') to queue "
    "the message."
)


@contextlib.asynccontextmanager
async def open_session(config: SessionConfig, sink: Sink,
                       wait_for_room: Callable[[], Awaitable[None]] | None = None, *,
                       in_thread: bool = True) -> AsyncIterator[Session]:
    """A session that lives while the block runs. Leaving the block aborts what runs (its
    closing events are still emitted), then closes the session file and removes the full
    outputs its commands kept.

    Its files are read `in_thread`, so that other sessions go on meanwhile. A process's only
    session reads them on the loop: nothing else waits yet, and a worker thread would wait
    for the interpreter lock behind the start-up's imports (~40 ms of cold start)."""
    if in_thread:
        files = await trio.to_thread.run_sync(SessionFiles.read, config)
    else:
        files = SessionFiles.read(config)
    session: Session | None = None
    try:
        async with trio.open_nursery() as session_nursery:
            session = Session(config, files, sink, session_nursery, wait_for_room)
            session_nursery.start_soon(session.plugins.serve_observers)
            session_nursery.start_soon(session.mcp.serve)
            if session.guard.sandboxed:  # said at start, not at the first command
                session_nursery.start_soon(unusable_modes_problem)
            yield session
            session_nursery.cancel_scope.cancel()
    finally:
        if session is None:
            files.store.close()
        else:
            session.store.close()
            session.scratch.remove()


class Session:
    """One conversation, its file, and what runs in it; made by `open_session`."""

    def __init__(self, config: SessionConfig, files: SessionFiles, sink: Sink,
                 nursery: trio.Nursery,
                 wait_for_room: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cwd = config.cwd
        self.agent_dir = config.agent_dir
        self.registry = config.registry
        self.settings = settings = files.settings
        self.resources = files.resources
        self.session_dir = config.new_files_dir
        """Where new session files go; None keeps new sessions in memory."""
        self._sink = sink
        self._nursery = nursery
        self._wait_for_room = wait_for_room
        self.ui = Dialogs(self.emit, interactive=config.interactive)
        self.plugins = Plugins(PluginHost(
            cwd=config.cwd, ui=self.ui, settings=settings,
            session_id_of=lambda: self.session_id, session_name_of=lambda: self.session_name,
            set_session_name=self.set_session_name,
            send_user_message=self.send_user_message))  # `emit` tells them: they load last
        self.queues = Queues(self.emit, settings)
        self.scratch = ScratchDir()
        self._checkpoints: Checkpoints | None = None
        mode = starting_mode(config.permission_mode, settings)
        self.guard = Guard(mode,
                           SandboxSettings.from_settings(settings, config.agent_dir),
                           config.cwd, self.scratch, self.ui,
                           environment=ShellEnvironment.from_settings(settings),
                           server_cache=config.agent_dir / SERVER_CACHE)
        self.mcp = McpServers(files.mcp_servers, config.cwd,
                              cache=files.mcp_cache, listings=files.mcp_listings,
                              keep=config.tools.keeps_mcp,
                              startup_timeout_s=startup_timeout(settings.get("mcp")),
                              confine=lambda argv, cwd, spec: self.guard.server(
                                  argv, cwd, network=spec.network, sandbox=spec.sandbox),
                              dialogs=self.ui if config.interactive else None,
                              session_id=lambda: self.session_id)
        self.files: ClientFiles | None = None
        """The client's files, for the file tools (an ACP editor's), else the disk."""
        self.shell = Shell.from_settings(settings.get("shellPath"),
                                         settings.get("shellCommandPrefix"))
        self.run_settings = RunSettings.from_settings(settings)
        self._held: w.MessageStart | None = None
        """A ``message_start`` that waits for its ``message_end`` (`emit`)."""
        self._closing: list[w.Event] = []
        """What an aborted run has emitted of its closing, not sent yet (`_pass`)."""
        self._flushing = False
        self._runner: Runner | None = None
        self.store = files.store
        self.context = Context(files.store)
        self.choice = ModelChoice(config.registry, settings, config.model,
                                  config.thinking_level, config.model_scope,
                                  lambda: self.store, self.emit)
        self.plugins.register(config.plugins)
        plugin_tools = _plugin_tools(self.plugins)
        self.tools = Tools(
            self.guard, self.mcp, settings, plugin_tools=plugin_tools,
            names=_chosen_tools(config, settings, plugin_tools),
            mode_chosen=config.permission_mode is not None,
            default_mode=starting_mode(None, settings))
        self._install(files.store, restore=not config.keep_model)
        if config.session_name:
            self.set_session_name(config.session_name, announce=False)
        self.asking = ModelAsker(config.registry, self.choice, self.resources, self.tools,
                                 self.run_settings.retry,
                                 guidelines=lambda: self.plugins.guidelines,
                                 session_id=lambda: self.session_id)
        self.bash = DirectBash(self.cwd, self.shell, self.scratch, emit=self.emit,
                               wait_for_room=self.wait_for_room,
                               environment=self.guard.direct_environment,
                               checkpoints=lambda: self.checkpoints,
                               record=lambda message: self.run.record(message),
                               session_id=lambda: self.session_id)

    def set_permission_mode(self, mode: str) -> None:
        """Apply `mode` from the next tool call on (`forged._tools.guard`), and record it in
        the session file."""
        try:
            check_mode(mode)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.tools.take_mode(mode)
        record_mode(self.store, mode)
        if self.choice.announce_changes:
            self.emit(w.PermissionModeChanged(mode=mode))
        if self.guard.sandboxed:
            self._nursery.start_soon(unusable_modes_problem)

    def _install(self, store: SessionFile, *, restore: bool) -> None:
        """Make `store` the session's file: its context, its name, its mode, and (when
        `restore`) the model and level its branch last used; a choice the branch does not
        record is appended."""
        self.store = store
        self.context.rebase(store)
        self.totals = UsageTotals()
        self.session_name = stored_name(store)
        self.choice.restore(store, restore=restore)
        self.tools.install_mode(store)

    def move_to(self, entry_id: str) -> None:
        """The leaf moved to the entry `entry_id` (any branch): a ``forged.branch`` custom
        entry is appended under it, naming the leaf it left, and the context is that
        branch's."""
        store = self.store
        entry_position(store, entry_id)
        store.append("custom", under=entry_id, customType="forged.branch",
                     data={"from": store.leaf_id})
        self._install(store, restore=True)

    @property
    def session_id(self) -> str:
        return self.store.session_id

    @property
    def model(self) -> w.Model | None:
        return self.choice.model

    @property
    def thinking_level(self) -> str:
        return self.choice.thinking_level

    def set_session_name(self, name: str, *, announce: bool = True) -> None:
        """Name the session (``session_info_changed`` says so, unless it is opening)."""
        name = name.strip()
        if not name:
            raise CommandError("Session name cannot be empty")
        self.store.append("session_info", name=name)
        self.session_name = name
        if announce:
            self.emit(w.SessionInfoChanged(name=name))

    def start_task(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run `task` in the session's nursery (cancelled when the session closes)."""
        self._nursery.start_soon(task)

    # --- events --------------------------------------------------------------------------------

    def emit(self, event: w.Event) -> None:
        """`event` to the sink, the plugins that observe it and the run driver. A message is
        stored as its ``message_end`` passes, before anyone hears of it; the ``message_start``
        of a message that is not streamed (all but a reply) waits for it. `PersistenceError`
        when the file cannot be written: then neither is announced."""
        if isinstance(event, w.MessageStart) and not isinstance(event.message,
                                                                w.AssistantMessage):
            self._held = event
            return
        if isinstance(event, w.MessageEnd):
            held, self._held = self._held, None
            self.context.append(event.message)
            if held is not None:
                self._pass(held)
        self._pass(event)

    def _pass(self, event: w.Event) -> None:
        """`_send`, unless an abort is closing the run and `event` is the run's own: then
        held until `flush`, so that its closing events reach the client together. Another
        task's event goes after those held before it."""
        runner = self._runner
        if runner is not None and runner.closing and not self._flushing:
            if trio.lowlevel.current_task() is runner.task:
                self._closing.append(event)
                return
            self.flush()
        self._send(event)

    def flush(self) -> None:
        """What the closing run holds (`_pass`), sent now, in one write to each client; an
        event one of them brings about (the run driver's ``auto_retry_end`` after a reply's
        ``message_end``) goes right after it, as it would have."""
        if self._closing:
            events, self._closing = self._closing, []
            self._flushing = True
            try:
                with coalesced():
                    for event in events:
                        self._send(event)
            finally:
                self._flushing = False

    def _send(self, event: w.Event) -> None:
        self._sink(event)
        self.plugins.observe(event)
        if self._runner is not None:  # one not made yet has seen nothing that counts
            self._runner.saw(event)

    async def wait_for_room(self) -> None:
        if self._wait_for_room is not None:
            await self._wait_for_room()

    # --- state ---------------------------------------------------------------------------------

    @property
    def run(self) -> Runner:
        """The session's run driver (`forged._run`), made with its modules at its first use:
        the first prompt, compaction or setting of it."""
        if self._runner is None:
            from ._run import Runner

            toolbox = Toolbox(self.tools, self.context, gate=self.plugins.before_tool_call,
                              checkpoints=lambda: self.checkpoints,
                              made_checkpoints=lambda: self._checkpoints, cwd=self.cwd,
                              shell=self.shell, scratch=self.scratch, files=lambda: self.files,
                              command_env=self.command_env)
            self._runner = Runner(self._nursery, events=self, asking=self.asking,
                                  tools=toolbox, queues=self.queues, context=self.context,
                                  settings=self.run_settings)
        return self._runner

    @property
    def busy(self) -> bool:
        """From an accepted prompt (or compaction) until its last ``agent_end`` (what
        follows it until ``agent_settled`` is `settling`: a prompt is taken meanwhile, and
        runs after it)."""
        return self._runner is not None and self._runner.busy

    @property
    def settling(self) -> bool:
        return self._runner is not None and self._runner.settling

    @property
    def idle(self) -> bool:
        """Nothing runs: no prompt, no direct bash command, no plugin command."""
        return (not self.busy and not self.settling and not self.bash.running
                and not self.plugins.running)

    async def wait_idle(self) -> None:
        while not self.idle:
            await self.plugins.wait_commands()
            if self._runner is not None:
                await self._runner.wait_settled()
            await self.bash.wait()

    def state(self) -> w.SessionState:
        compacting = self._runner is not None and self._runner.compacting
        return w.SessionState(
            model=self.model, thinking_level=self.thinking_level,
            is_streaming=self.busy and not compacting,
            is_compacting=compacting, steering_mode=self.queues.steering_mode,
            follow_up_mode=self.queues.follow_up_mode,
            session_file=str(self.store.path) if self.store.path else None,
            session_id=self.session_id,
            session_name=self.session_name,
            auto_compaction_enabled=self.run_settings.compaction.enabled,
            message_count=len(self.context),
            pending_message_count=len(self.queues), permission_mode=self.guard.mode,
            session_file_error=self.store.write_error,
        )

    def stats(self) -> w.SessionStats:
        self.totals.count(self.store)
        return session_stats(self.store, self.totals, self.context.messages, self.model)

    def commands(self) -> list[w.CommandInfo]:
        """What ``/name`` runs: plugin commands, prompt templates, skills, then the MCP
        servers' prompts (get_commands)."""
        return [*self.plugins.command_infos(), *self.resources.command_infos(),
                *self.mcp.command_infos()]

    # --- prompting -----------------------------------------------------------------------------

    def disposition(self, streaming_behavior: str | None) -> Literal["started", "queued"]:
        """What a prompt sent now becomes: ``queued`` while busy (which needs a
        `streaming_behavior`), else ``started``; `CommandError` when it cannot be taken."""
        if self.busy:
            if streaming_behavior is None:
                raise CommandError(BUSY_PROMPT_ERROR)
            return "queued"
        self.asking.check_can_prompt()
        return "started"

    def start_prompt(self, text: str, images: list[w.ImageContent] | None,
                     caller: Caller | None = None) -> None:
        """Run `text` now; `caller`: the trace context it came with."""
        message = user_message(text, images)
        _telemetry.tag(message, caller)
        self.run.start([message], poll_steering=True)

    def send_user_message(self, text: str) -> None:
        """A plugin's message to the agent: a run when idle, else a follow-up."""
        if self.disposition("followUp") == "queued":
            self.queues.add("follow_up", text, None)
        else:
            self.start_prompt(text, None)

    @property
    def checkpoints(self) -> Checkpoints:
        """The session's checkpoints of its files, made on first use (their module loaded,
        and the workspace's old ones housekept, then): a session that only talks never
        pays for them."""
        if self._checkpoints is None:
            from . import _checkpointing

            self._checkpoints = _checkpointing.Checkpoints(
                _checkpointing.CheckpointSettings.from_settings(self.settings.get("checkpoints")),
                self.agent_dir, self.cwd, lambda: self.store,
                lambda text: self.ui.notify(text, "warning"))
            self.start_task(self._checkpoints.housekeep)
        return self._checkpoints

    def command_env(self) -> dict[str, str | None]:
        """What the ``bash`` tool's commands are told of the session, as the ancestor tells
        them (read when each command starts)."""
        model = self.model
        return {**_telemetry.tracing.env(),  # the current span's context: a tool call's
                "PI_SESSION_ID": self.session_id,
                "PI_SESSION_FILE": str(self.store.path) if self.store.path else None,
                "PI_PROVIDER": model.provider if model else None,
                "PI_MODEL": model.id if model else None,
                "PI_REASONING_LEVEL": self.thinking_level}

    # --- stopping and switching ----------------------------------------------------------------

    def abort(self) -> bool:
        """Cancel what runs and resolve open dialogs as cancelled: True if a run was
        cancelled (its closing events follow)."""
        self.ui.cancel_all()
        return self._runner is not None and self._runner.cancel()

    def stop(self) -> None:
        """Shutting down: drop the queues, abort the run (its closing events follow), the
        direct bash command and open dialogs."""
        self.queues.clear()
        self.abort()
        self.bash.abort()

    async def switch(self, make: Maker, *, restore: bool, restore_files: bool = False,
                     files_at: int | None = None, force: bool = False) -> None:
        """Replace the session's file with what `make` builds from the current one
        (docs/protocol.md, The run lifecycle): queued messages are dropped, a running run is
        aborted and its closing events written, then the new file is opened (in a thread: it
        may be large). With `restore_files` the files are restored as they were at the
        entry `files_at` (a position; None: before the first), into the new file's branch
        (`force`: over drift). If `make` fails, or the restore is refused, the session
        keeps its file."""
        self.queues.clear()
        self.abort()
        if self._runner is not None:
            await self._runner.wait_settled()
        if not restore_files:
            await self._switch_to(make, restore=restore)
            return
        async with self.checkpoints.restoring:
            state = self.checkpoints.state_at(files_at)
            plan = None if state is None else await self.checkpoints.plan_to(*state,
                                                                                force=force)
            await self._switch_to(make, restore=restore)
            if plan is not None:
                await self.checkpoints.apply(plan)

    async def _switch_to(self, make: Maker, *, restore: bool) -> None:
        store = await trio.to_thread.run_sync(make, self.store)
        self.store.close()
        self._install(store, restore=restore)


def _plugin_tools(plugins: Plugins) -> dict[str, Tool]:
    """The plugins' tools, but for one named as a built-in tool (skipped, said once)."""
    tools: dict[str, Tool] = {}
    for name, tool in plugins.tools.items():
        if name in BUILTIN_NAMES:
            log(f"a plugin's tool {name} is a built-in tool's name; skipped")
        else:
            tools[name] = tool
    return tools


def _chosen_tools(config: SessionConfig, settings: Settings,
                  plugin_tools: dict[str, Tool]) -> list[str]:
    names, unknown = select_tools(plugin_tools,
                                  attrs.evolve(config.tools, default=settings.default_tools()))
    if unknown:
        log(f"no tool is called {', '.join(unknown)}; ignored")
    return names
