"""One agent session: its state, its queues, its event stream, and what it is doing.

Many sessions can live in one process: each has its own cwd, its own nursery and its own event
sink. A session is opened with ``async with open_session(config, sink) as session:`` (its
files are read in a worker thread) and lives while the block runs. It never writes to a stream
itself: it gives its sink each event, a wire object, in the order it produces them; each front
encodes them at its own edge.

What a session does is owned by three parts, each with its own cancel scope: the run driver
(`forged._run.Runner`: prompts, retries, compaction, ``abort``), the direct bash slot
(`DirectBash`, ``abort_bash``) and the plugin commands (`forged._plugins.Plugins`). `Session.idle`
is the one answer to "is this session doing something".

A run is given values: the context, the way to ask the model (`Session.model_request`), the
tools (`Toolbox`) and the queues; its events come back through `Session.emit`, which stores a
message as its ``message_end`` passes (and holds a ``message_start`` that is not streamed
until then), so nothing is announced that is not stored.
"""

from __future__ import annotations

import contextlib
from collections import ChainMap
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import attrs
import trio

from . import _codec, _wire as w
from ._context import build_context, context_size, stored_name
from ._errors import CommandError, ProviderError
from ._log import log
from ._mcp import (
    CACHE_DIR as MCP_CACHE_DIR,
    MCP_FILE,
    Listing,
    ListingCache,
    McpConfig,
    McpServers,
    ServerSpec,
    startup_timeout,
)
from ._model_choice import ModelChoice
from ._models import ModelRegistry, clamp_level
from ._paths import session_dir_for
from ._plugins import Plugins, PluginSource
from ._providers import Provider, ProviderRequest, ToolSpec, provider_for
from ._queues import Queues, user_message
from ._resources import ExtraPaths, Origin, Resources
from ._retry import RetrySettings
from ._settings import PROJECT_DIR, CompactionSettings, Settings
from ._stats import UsageTotals, session_stats
from ._store import SessionFile
from ._switching import Maker, open_store
from ._tools import BUILTIN_NAMES, READING_TOOLS, Tool, ToolChoice, builtin_tools, select_tools
from ._tools.base import ClientFiles, ScratchDir, Shell, ToolContext
from ._tools.environment import ShellEnvironment
from ._tools.guard import (
    SERVER_CACHE,
    Guard,
    SandboxSettings,
    check_mode,
    record_mode,
    recorded_mode,
    starting_mode,
    unusable_modes_problem,
)
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


@attrs.define(kw_only=True, eq=False, repr=False)
class SessionConfig:
    cwd: Path
    agent_dir: Path
    registry: ModelRegistry
    model: w.Model | None = None
    thinking_level: str = "medium"
    session_name: str | None = None
    persist: bool = True
    """False for --no-session: the session's entries live in memory only."""
    session_dir: Path | None = None
    """Where new session files go (default: per cwd under <agentDir>/sessions)."""
    session_path: Path | None = None
    """An existing session file to continue."""
    keep_model: bool = False
    """The model and level were asked for (--model): a continued session does not restore
    its own."""
    settings: Settings | None = None
    """Read from the agent dir and the cwd when not given."""
    model_scope: list[str] | None = None
    """``--models``: the patterns `cycle_model` cycles through (else ``enabledModels``)."""
    extra: ExtraPaths = attrs.Factory(ExtraPaths)
    """Skills, templates and system prompt text the command line adds."""
    plugins: list[PluginSource] = attrs.Factory(list)
    interactive: bool = True
    """A client can answer dialogs (False in print mode: they resolve as cancelled)."""
    tools: ToolChoice = attrs.Factory(ToolChoice)
    new_session_id: str | None = None
    """The id a new session file gets (``--session-id``; else a fresh one)."""
    fork_from: Path | None = None
    """A session file whose whole branch the new session starts with (``--fork``)."""
    mcp: McpConfig = attrs.Factory(McpConfig)
    """MCP servers beyond the user's and the trusted project's ``mcp.json``."""
    permission_mode: str | None = None
    """``--permission-mode`` (else the settings' ``permissionMode``)."""

    @property
    def new_files_dir(self) -> Path | None:
        """Where new session files go; None keeps new sessions in memory."""
        if not self.persist:
            return None
        return self.session_dir or session_dir_for(self.agent_dir, self.cwd)


@attrs.frozen
class _Files:
    """What a session reads from disk before it opens."""

    settings: Settings
    resources: Resources
    store: SessionFile
    mcp_servers: list[ServerSpec]
    mcp_cache: ListingCache
    mcp_listings: dict[str, Listing]
    """The servers' tools as they last listed them."""

    @classmethod
    def read(cls, config: SessionConfig) -> _Files:
        settings = config.settings or Settings(config.agent_dir, config.cwd)
        mcp = attrs.evolve(
            config.mcp, user_file=config.agent_dir / MCP_FILE,
            project_file=config.cwd / PROJECT_DIR / MCP_FILE if settings.project_trusted
            else None)
        servers = mcp.load()
        cache = ListingCache(config.agent_dir / MCP_CACHE_DIR)
        return cls(settings=settings,
                   resources=Resources.load(config.cwd, config.agent_dir, settings, config.extra),
                   store=open_store(config.session_path, config.new_files_dir, config.cwd,
                                    session_id=config.new_session_id,
                                    fork_from=config.fork_from),
                   mcp_servers=servers, mcp_cache=cache,
                   mcp_listings={spec.name: listing for spec in servers
                                 if spec.enabled and (listing := cache.read(spec))})


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
        files = await trio.to_thread.run_sync(_Files.read, config)
    else:
        files = _Files.read(config)
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


class DirectBash:
    """The session's one direct ``bash`` command slot (docs/protocol.md, Direct bash)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.scope: trio.CancelScope | None = None
        self._done = trio.Event()
        self._done.set()

    @property
    def running(self) -> bool:
        return self.scope is not None

    async def wait(self) -> None:
        await self._done.wait()

    def abort(self) -> None:
        if self.scope is not None:
            self.scope.cancel()

    def start(self, command: str, command_id: str | int | None, *,
              exclude_from_context: bool = False) -> Callable[[], Awaitable[w.BashResult]]:
        """Take the slot now (a second command fails at once, in arrival order) and return
        what runs it: output streamed as ``bash_execution_update`` events, the result
        entering the context (when a run is active, once it settles); with
        `exclude_from_context` it is kept in the session but never shown to the model."""
        if self.scope is not None:
            raise CommandError("A bash command is already running")
        scope = self.scope = trio.CancelScope()
        self._done = trio.Event()
        session = self._session

        async def run() -> w.BashResult:
            from ._tools.bash import run_direct

            try:
                await session.checkpoints.capture("before", f"!{command}")
                message = await run_direct(
                    command, session.cwd,
                    lambda delta: session.emit(w.BashExecutionUpdate(id=command_id,
                                                                     delta=delta)),
                    scope, session.shell, session.wait_for_room, session.scratch,
                    env=session.guard.direct_environment())
                await session.checkpoints.capture("after")
            finally:
                self.scope = None
                self._done.set()
            if exclude_from_context:
                message.exclude_from_context = True
            session.run.record(message)
            return w.BashResult(output=message.output, exit_code=message.exit_code,
                                cancelled=message.cancelled, truncated=message.truncated,
                                full_output_path=message.full_output_path)

        return run


class Toolbox:
    """A session's tools as its runs call them (`forged._loop.Toolbox`)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    async def find(self, name: str) -> Tool | None:
        return await self._session.tool(name)

    async def gate(self, call: w.ToolCall) -> str | None:
        return await self._session.plugins.before_tool_call(call.id, call.name,
                                                            call.arguments)

    async def prepare(self, call: w.ToolCall) -> None:
        if call.name not in READING_TOOLS:
            session = self._session
            await session.checkpoints.before_change(session.last_prompt())

    async def settle(self) -> None:
        if self._session.has_checkpoints:
            await self._session.checkpoints.settle()

    def context(self, update: Callable[[w.ToolResult], None]) -> ToolContext:
        session = self._session
        return ToolContext(cwd=session.cwd, update=update, shell=session.shell,
                           scratch=session.scratch, env=session.command_env(),
                           files=session.files, guard=session.guard)


class Session:
    """One conversation, its file, and what runs in it; made by `open_session`."""

    store: SessionFile

    def __init__(self, config: SessionConfig, files: _Files, sink: Sink,
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
        self.plugins = Plugins([], self)  # `emit` tells them; the real ones register last
        self.queues = Queues(self.emit, settings)
        self.scratch = ScratchDir()
        self.ui = Dialogs(self.emit, interactive=config.interactive)
        self._checkpoints: Checkpoints | None = None
        self._mode_chosen = config.permission_mode is not None
        """``--permission-mode`` (or a daemon client's) was given: it wins over the mode a
        session file records."""
        mode = starting_mode(config.permission_mode, settings)
        self._default_mode = starting_mode(None, settings) if self._mode_chosen else mode
        """The mode a session starts in when nothing chooses one: a branch that records no
        mode is in it."""
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
                                  argv, cwd, network=spec.network, sandbox=spec.sandbox))
        self._own_tools: dict[str, Tool] | None = {}  # none until they are chosen, below
        self.files: ClientFiles | None = None
        """The client's files, for the file tools (an ACP editor's), else the disk."""
        self.shell = Shell.from_settings(settings.get("shellPath"),
                                         settings.get("shellCommandPrefix"))
        self.retry = RetrySettings.from_settings(settings.get("retry"))
        self.compaction = CompactionSettings.from_settings(settings.get("compaction"))
        self._held: w.MessageStart | None = None
        """A ``message_start`` that waits for its ``message_end`` (`emit`)."""
        self._runner: Runner | None = None
        self.bash = DirectBash(self)
        self.store = files.store
        self.choice = ModelChoice(config.registry, settings, config.model,
                                  config.thinking_level, config.model_scope,
                                  lambda: self.store, self.emit)
        self._install(files.store, restore=not config.keep_model)
        if config.session_name:
            self.set_session_name(config.session_name, announce=False)
        self.plugins = Plugins(config.plugins, self)
        plugin_tools: dict[str, Tool] = {}
        for name, tool in self.plugins.tools.items():
            if name in BUILTIN_NAMES:
                log(f"a plugin's tool {name} is a built-in tool's name; skipped")
            else:
                plugin_tools[name] = tool
        self._plugin_tools = plugin_tools
        self._tool_names, unknown = select_tools(
            plugin_tools, attrs.evolve(config.tools, default=settings.default_tools()))
        self._own_tools = None
        if unknown:
            log(f"no tool is called {', '.join(unknown)}; ignored")
        self._arm(self.guard.mode)

    def set_permission_mode(self, mode: str) -> None:
        """Apply `mode` from the next tool call on (`forged._tools.guard`), and record it in
        the session file; running stdio MCP servers start again when it changes whether they
        are confined."""
        try:
            check_mode(mode)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self._take_mode(mode)
        record_mode(self.store, mode)
        if self.guard.sandboxed:
            self._nursery.start_soon(unusable_modes_problem)

    def _take_mode(self, mode: str) -> None:
        was = self.guard.sandboxed
        self._arm(mode)
        if self.guard.sandboxed != was:
            self.mcp.restart_stdio(f"the permission mode became {mode}")

    def _install_mode(self, store: SessionFile) -> None:
        """The mode `store`'s branch records, unless one was chosen at start (a trusted
        project's settings may still lower it, as at start); then the mode is recorded where
        it is not what the branch says (nor, in a branch that says nothing, the mode a
        session starts in)."""
        recorded = recorded_mode(store)
        if recorded is not None and not self._mode_chosen:
            self._take_mode(starting_mode(recorded, self.settings))
        if self.guard.mode != (recorded or self._default_mode):
            record_mode(store, self.guard.mode)

    @property
    def own_tools(self) -> dict[str, Tool]:
        """The built-in and plugin tools the model gets, made at their first use (the
        built-in tools' modules load then, off start-up)."""
        if self._own_tools is None:
            builtin = builtin_tools()
            self._own_tools = {name: builtin[name] if name in builtin
                               else self._plugin_tools[name] for name in self._tool_names}
            self._arm_bash(self._own_tools)
        return self._own_tools

    @property
    def tools(self) -> Mapping[str, Tool]:
        """`own_tools`, and the MCP servers' as they connect."""
        return ChainMap(self.own_tools, self.mcp.tools)

    def _arm(self, mode: str) -> None:
        self.guard.mode = mode
        if self._own_tools is not None:
            self._arm_bash(self._own_tools)

    def _arm_bash(self, tools: dict[str, Tool]) -> None:
        from ._tools.bash import BASH, SANDBOXED_BASH

        if tools.get("bash") in (BASH, SANDBOXED_BASH):  # the model sees escalate
            tools["bash"] = SANDBOXED_BASH if self.guard.sandboxed else BASH

    def _install(self, store: SessionFile, *, restore: bool) -> None:
        """Make `store` the session's file: its context, its name, and (when `restore`) the
        model and level its branch last used; a choice the branch does not record is
        appended."""
        self.store = store
        self._messages: list[w.AgentMessage] | None = None  # read from the file when needed
        self.totals = UsageTotals()
        self.session_name = stored_name(store)
        self.choice.restore(store, restore=restore)
        self._install_mode(store)

    @property
    def messages(self) -> list[w.AgentMessage]:
        """The context: the active branch's messages, read back on first use."""
        if self._messages is None:
            self._messages = build_context(self.store)
        return self._messages

    @messages.setter
    def messages(self, messages: list[w.AgentMessage]) -> None:
        self._messages = messages

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
            self.remember(event.message)
            if held is not None:
                self._send(held)
        self._send(event)

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

            self._runner = Runner(
                self, self._nursery, events=self, requests=self.model_request,
                tools=Toolbox(self), queues=self.queues, settings=self.settings,
                context=lambda: self.messages, check_can_prompt=self.check_can_prompt,
                remember=self.remember)
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
    def compacting(self) -> bool:
        return self._runner is not None and self._runner.compacting

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
        return w.SessionState(
            model=self.model, thinking_level=self.thinking_level,
            is_streaming=self.busy and not self.compacting,
            is_compacting=self.compacting, steering_mode=self.queues.steering_mode,
            follow_up_mode=self.queues.follow_up_mode,
            session_file=str(self.store.path) if self.store.path else None,
            session_id=self.session_id,
            session_name=self.session_name,
            auto_compaction_enabled=self.compaction.enabled,
            message_count=(len(self._messages) if self._messages is not None
                           else context_size(self.store)),
            pending_message_count=len(self.queues), permission_mode=self.guard.mode,
            session_file_error=self.store.write_error,
        )

    def last_assistant_text(self) -> str | None:
        for message in reversed(self.messages):
            if not isinstance(message, w.AssistantMessage):
                continue
            text = "".join(b.text for b in message.content if isinstance(b, w.TextContent))
            if message.stop_reason == "aborted" and not text.strip():
                continue
            return text.strip() or None
        return None

    def stats(self) -> w.SessionStats:
        self.totals.count(self.store)
        return session_stats(self.store, self.totals, self.messages, self.model)

    def commands(self) -> list[w.CommandInfo]:
        """What ``/name`` runs: plugin commands, prompt templates, then skills
        (get_commands)."""
        found = self.plugins.command_infos()
        for template in self.resources.templates:
            found.append(w.CommandInfo(
                name=template.name, description=template.description, source="prompt",
                source_info=_source_info(template.path, template.origin)))
        for skill in self.resources.skills:
            found.append(w.CommandInfo(
                name=f"skill:{skill.name}", description=skill.description, source="skill",
                source_info=_source_info(skill.path, skill.origin)))
        return found

    # --- prompting -----------------------------------------------------------------------------

    def check_can_prompt(self) -> None:
        if self.model is None:
            raise CommandError(self.registry.no_model_reason())
        problem = self.registry.key_problem(self.model.provider)
        if problem is not None:
            raise CommandError(problem)

    def disposition(self, streaming_behavior: str | None) -> Literal["started", "queued"]:
        """What a prompt sent now becomes: ``queued`` while busy (which needs a
        `streaming_behavior`), else ``started``; `CommandError` when it cannot be taken."""
        if self.busy:
            if streaming_behavior is None:
                raise CommandError(BUSY_PROMPT_ERROR)
            return "queued"
        self.check_can_prompt()
        return "started"

    def start_prompt(self, text: str, images: list[w.ImageContent] | None) -> None:
        self.run.start([user_message(text, images)], poll_steering=True)

    def send_user_message(self, text: str) -> None:
        """A plugin's message to the agent: a run when idle, else a follow-up."""
        if self.disposition("followUp") == "queued":
            self.queues.add("follow_up", text, None)
        else:
            self.start_prompt(text, None)

    def remember(self, message: w.AgentMessage) -> None:
        """A message into the session file, then the context; `PersistenceError` (and in
        neither) when the file cannot be written."""
        self.store.append("message", message=_codec.unstructure(message))
        self.messages.append(message)

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

    @property
    def has_checkpoints(self) -> bool:
        return self._checkpoints is not None

    def last_prompt(self) -> w.UserMessage | None:
        """The context's last user message: the prompt (or steering) a run works on."""
        for message in reversed(self.messages):
            if isinstance(message, w.UserMessage):
                return message
        return None

    def command_env(self) -> dict[str, str | None]:
        """What the ``bash`` tool's commands are told of the session, as the ancestor tells
        them (read when each command starts)."""
        model = self.model
        return {"PI_SESSION_ID": self.session_id,
                "PI_SESSION_FILE": str(self.store.path) if self.store.path else None,
                "PI_PROVIDER": model.provider if model else None,
                "PI_MODEL": model.id if model else None,
                "PI_REASONING_LEVEL": self.thinking_level}

    async def tool(self, name: str) -> Tool | None:
        """The tool called `name`, connecting its MCP server first if need be."""
        return self.own_tools.get(name) or await self.mcp.tool(name)

    async def model_request(self, context: list[w.AgentMessage]
                            ) -> tuple[Provider, ProviderRequest]:
        """The model's request for `context`, with the session's system prompt and tools
        (MCP servers never listed before are waited for first)."""
        await self.mcp.first_listings()
        own = list(self.own_tools.values())
        return await self._request(self.resources.system_prompt(own, self.plugins.guidelines),
                                   context, [*own, *self.mcp.tools.values()],
                                   self.thinking_level)

    async def summary_request(self, text: str, *, max_tokens: int, reasoning: bool
                              ) -> tuple[Provider, ProviderRequest]:
        """A request for a compaction summary of `text`, to the session's model."""
        from ._compaction import SYSTEM_PROMPT

        level = clamp_level(self.model, "high") if reasoning else "off"
        return await self._request(SYSTEM_PROMPT, [user_message(text, None)], [], level, max_tokens)

    async def _request(self, system_prompt: str, messages: list[w.AgentMessage],
                       tools: list[Tool], thinking_level: str, max_tokens: int | None = None
                       ) -> tuple[Provider, ProviderRequest]:
        """The request, its key and headers resolved (``!command`` values run off the loop);
        `ProviderError` when the provider has no key."""
        model = self.model
        if model is None:
            raise CommandError(self.registry.no_model_reason())
        await self.registry.resolve(model)
        key = self.registry.api_key(model.provider)
        if key is None:
            raise ProviderError(self.registry.key_problem(model.provider)
                                or f"No API key for {model.provider}")
        request = ProviderRequest(
            model=model, system_prompt=system_prompt, messages=messages,
            tools=[ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
                   for t in tools],
            thinking_level=thinking_level,
            api_key=key,
            headers=self.registry.request_headers(model),
            session_id=self.session_id,
            idle_timeout_s=self.retry.idle_timeout_ms / 1000,
            max_tokens=max_tokens,
        )
        return provider_for(model.api), request

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


def _source_info(path: Path, origin: Origin) -> w.SourceInfo:
    return w.SourceInfo(path=str(path), source="local", scope=origin.scope, origin="top-level",
                        base_dir=str(origin.path if origin.path.is_dir() else path.parent))
