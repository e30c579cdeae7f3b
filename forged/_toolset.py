"""A session's tools and the permission mode they run under, and the toolbox its runs call.

`Tools` holds what the model may call: the built-in and plugin tools the session chose (made
at their first use: the built-in tools' modules load then, off start-up) and the MCP servers'
as they connect; and the permission mode (`forged._tools.guard`), which decides how each call
runs. A mode recorded in a session file is taken back when the file is, unless one was chosen
at start. `Toolbox` is what a run (`forged._loop`) is given: those tools, the plugins' say
before each call, the checkpoint before the first change and the closing one.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from . import _wire as w
from ._context import Context
from ._mcp import McpServers
from ._process import Stopping
from ._settings import Settings
from ._store import SessionFile
from ._tools import READING_TOOLS, Tool, builtin_tools
from ._tools.base import ClientFiles, ScratchDir, Shell, ToolContext
from ._tools.guard import Guard, record_mode, recorded_mode, starting_mode


class Tools:
    """The session's tools, under its permission mode (`guard`)."""

    def __init__(self, guard: Guard, mcp: McpServers, settings: Settings, *,
                 names: list[str], plugin_tools: dict[str, Tool], mode_chosen: bool,
                 default_mode: str) -> None:
        self.guard = guard
        self.mcp = mcp
        self._settings = settings
        self._names = names
        self._plugin_tools = plugin_tools
        self._own: dict[str, Tool] | None = None
        self._mode_chosen = mode_chosen
        """``--permission-mode`` (or a daemon client's) was given: it wins over the mode a
        session file records."""
        self._default_mode = default_mode
        """The mode a session starts in when nothing chooses one: a branch that records no
        mode is in it."""

    @property
    def own(self) -> dict[str, Tool]:
        """The built-in and plugin tools the model gets, made at their first use."""
        if self._own is None:
            builtin = builtin_tools()
            self._own = {name: builtin[name] if name in builtin else self._plugin_tools[name]
                         for name in self._names}
            self._arm_bash(self._own)
        return self._own

    @property
    def all(self) -> Mapping[str, Tool]:
        """`own`, and the MCP servers' as they connect."""
        return ChainMap(self.own, self.mcp.tools)

    async def find(self, name: str) -> Tool | None:
        """The tool called `name`, connecting its MCP server first if need be."""
        return self.own.get(name) or await self.mcp.tool(name)

    def take_mode(self, mode: str) -> None:
        """Apply `mode` from the next tool call on; running stdio MCP servers start again
        when it changes whether they are confined."""
        was = self.guard.sandboxed
        self.guard.mode = mode
        if self._own is not None:
            self._arm_bash(self._own)
        if self.guard.sandboxed != was:
            self.mcp.restart_stdio(f"the permission mode became {mode}")

    def install_mode(self, store: SessionFile) -> None:
        """The mode `store`'s branch records, unless one was chosen at start (a trusted
        project's settings may still lower it, as at start); then the mode is recorded where
        it is not what the branch says (nor, in a branch that says nothing, the mode a
        session starts in)."""
        recorded = recorded_mode(store)
        if recorded is not None and not self._mode_chosen:
            self.take_mode(starting_mode(recorded, self._settings))
        if self.guard.mode != (recorded or self._default_mode):
            record_mode(store, self.guard.mode)

    def _arm_bash(self, tools: dict[str, Tool]) -> None:
        from ._tools.bash import BASH, SANDBOXED_BASH

        if tools.get("bash") in (BASH, SANDBOXED_BASH):  # the model sees escalate
            tools["bash"] = SANDBOXED_BASH if self.guard.sandboxed else BASH


class Checkpoints(Protocol):
    """What a run's tool calls take of the session's checkpoints
    (`forged._checkpointing.Checkpoints`)."""

    async def before_change(self, prompt: w.UserMessage | None) -> None: ...
    async def settle(self) -> None: ...


class Toolbox:
    """A session's tools as its runs call them (`forged._loop.Toolbox`): `gate` is the
    plugins' say on a call; `checkpoints` makes the session's checkpoints (at the first call
    that may change files) and `made_checkpoints` gives them if they were (the closing one,
    as a busy spell ends); a call runs in `cwd` with `shell`, `scratch`, the client's
    `files` and `guard`, its commands told `command_env`."""

    def __init__(self, tools: Tools, context: Context, *,
                 gate: Callable[[str, str, dict[str, Any]], Awaitable[str | None]],
                 checkpoints: Callable[[], Checkpoints],
                 made_checkpoints: Callable[[], Checkpoints | None],
                 cwd: Path, shell: Shell, scratch: ScratchDir,
                 files: Callable[[], ClientFiles | None],
                 command_env: Callable[[], dict[str, str | None]]) -> None:
        self._tools = tools
        self._context = context
        self._gate = gate
        self._checkpoints = checkpoints
        self._made_checkpoints = made_checkpoints
        self._cwd = cwd
        self._shell = shell
        self._scratch = scratch
        self._files = files
        self._command_env = command_env
        self._stopping = Stopping()

    async def find(self, name: str) -> Tool | None:
        return await self._tools.find(name)

    async def gate(self, call: w.ToolCall) -> str | None:
        return await self._gate(call.id, call.name, call.arguments)

    async def prepare(self, call: w.ToolCall) -> None:
        if call.name not in READING_TOOLS:
            await self._checkpoints().before_change(self._context.last_prompt())

    async def end_stopped(self, before_waiting: Callable[[], None]) -> None:
        await self._stopping.ended(before_waiting)

    async def settle(self) -> None:
        await self._stopping.ended()  # (those a run that did not end by the abort stopped)
        await self._stopping.gone()  # before the closing checkpoint
        checkpoints = self._made_checkpoints()
        if checkpoints is not None:
            await checkpoints.settle()

    def context(self, update: Callable[[w.ToolResult], None]) -> ToolContext:
        return ToolContext(cwd=self._cwd, update=update, shell=self._shell,
                           scratch=self._scratch, env=self._command_env(),
                           files=self._files(), guard=self._tools.guard,
                           stopping=self._stopping)
