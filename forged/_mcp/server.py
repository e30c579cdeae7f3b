"""One MCP server of a session: its connection, its tools, and how it is doing.

Its task is one `McpServer.serve`, whose body is this tree, one connection at a time::

    McpServer.serve                    the SDK's imports (a worker thread), then per connection:
    └── _connect                       until the connection is lost or the session ends
        ├── the transport              stdio: the server's process group (`.stdio`);
        │                              HTTP: one client, retrying (`.http`)
        ├── _read_stderr               a stdio server's stderr -> forged's log, as [mcp NAME];
        │                              its end is the server's
        ├── the SDK's client           its protocol revision negotiated (`.eras`)
        ├── _follow_changes            while up: the tools or prompts listed again when
        │                              they changed (a notification, a listen event)
        ├── keep_listening             while up, in 2026-07-28: the subscriptions/listen
        │                              stream that tells so (`.eras`)
        └── _keep_listing              while up: the listing to <agentDir>/mcp-cache
        then, while lost: the next use (a call), and the back-off (0.25 s doubling to 30 s)

Its `State` says where that is: ``disabled``, ``starting``, ``up``, ``lost`` or ``broken``
(forged's own client failed: no attempt comes any more). A call waits for the attempt under
way, or asks for one; every change of state wakes whoever waits. The ``mcp`` SDK is imported
by this task only: a session without servers never loads it.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import trio

from .. import _telemetry, _wire as w
from .._errors import ServerExited, ToolError
from .._log import log, log_exception
from .._process import PIPE, kill_process_group, open_process
from .._telemetry import Span
from .._tools import ToolContext, text_result
from .._ui import Dialogs
from . import sdk
from .cache import ListedPrompt, ListedTool, Listing, ListingCache
from .config import DEFAULT_STARTUP_TIMEOUT_S, ServerSpec, expand
from .listing import has_resources, if_offered, list_prompts, list_tools
from .results import bounded_result, tool_result
from .sieve import Sieve

MAX_BACKOFF_S = 30.0
PROGRESS_BURST = 20
PROGRESS_PER_S = 20.0
"""A call's progress notifications become ``tool_execution_update`` events at this rate at
most (after a burst): a server that floods them does not flood the client."""
STDERR_TAIL_LINES = 5
Confine = Callable[[list[str], Path, ServerSpec],
                   Awaitable[tuple[list[str], dict[str, str] | None, str | None]]]
"""A stdio server's command as it runs (in the sandbox, say), given its cwd and entry; the
environment it starts with before its entry's ``env`` (None: the SDK's default one); and
the permission mode whose sandbox it runs in (None: unconfined)."""
_READ_ONLY = r"read-only file system"
_QUOTED_PATH = r"""['"](/[^'"]*)['"]|(/\S+?):? [Rr]ead-only"""
_OFFLINE = (r"EAI_AGAIN|ENOTFOUND|ENETUNREACH|getaddrinfo|Network is unreachable|"
            r"Temporary failure in name resolution")


def sandbox_trouble(line: str) -> str | None:
    """What a confined server's stderr `line` says the sandbox refused it, or None."""
    import re

    if re.search(_READ_ONLY, line, re.IGNORECASE):
        found = re.search(_QUOTED_PATH, line)
        path = next((group for group in found.groups() if group), None) if found else None
        return (f"it tried to write {path}, which the sandbox keeps read-only" if path
                else "it tried to write where the sandbox keeps things read-only")
    if re.search(_OFFLINE, line):
        return "it tried to reach the network, which its sandbox has not"
    return None


class State(enum.Enum):
    DISABLED = "disabled"
    """Configured off: never connected."""
    STARTING = "starting"
    """A connection attempt is under way (or the first one is due)."""
    UP = "up"
    """Connected: `McpServer.session` answers."""
    LOST = "lost"
    """The last connection ended, or never came up; the next use connects again."""
    BROKEN = "broken"
    """forged's own client failed (a bug, a broken SDK): no attempt comes any more."""


class McpServer:
    """One server of a session (made by `forged._mcp.servers.McpServers`)."""

    def __init__(self, spec: ServerSpec, cwd: Path, changed: Callable[[], None],
                 cache: ListingCache, listing: Listing | None = None, *,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 confine: Confine | None = None, dialogs: Dialogs | None = None,
                 session_id: Callable[[], str | None] = lambda: None) -> None:
        self.spec = spec
        self._session_id = session_id  # for the spans of its starts
        self._confine = confine
        """How a stdio server's command runs under the session's permission mode."""
        self._dialogs = dialogs
        """Where the server's questions are asked (`forged._mcp.elicit`); None: elicitation
        is not offered to it (nobody could ever answer: print mode)."""
        self.answering: set[trio.CancelScope] = set()
        """The deadlines of the requests waiting for this server's answer (calls, prompts
        rendered): put off while the user answers one of its questions."""
        self.first_listing_by = trio.current_time() + (
            spec.startup_timeout_s or startup_timeout_s)
        """Until when a model request waits for it while it has never listed its tools."""
        self._cwd = cwd
        self._changed = changed
        """Told when the tools it offers may have changed."""
        self._cache = cache
        self._kept = listing
        self.state = State.STARTING if spec.enabled else State.DISABLED
        self._state_changed = trio.Event()
        self.last_error: str | None = None
        self.listed: list[ListedTool] = listing.tools if listing else []
        """The server's tools as last listed (kept from an earlier session until it connects)."""
        self.resources = listing.resources if listing else False
        """The server offers resources."""
        self.prompts: list[ListedPrompt] = listing.prompts if listing else []
        """The server's prompts as last listed (the commands ``mcp__<server>__<prompt>``)."""
        self.summary: str | None = None
        """The first line of the server's instructions, once connected."""
        self.protocol_version: str | None = None
        """The protocol revision negotiated when it last connected."""
        self.session: Any = None
        """The SDK's ``Client`` (`forged._mcp.eras`) while up."""
        self._tools_ttl_s: float | None = None
        """How long its tools listing stays fresh (2026-07-28's ``ttlMs``; None: until it
        says they changed)."""
        self._tools_listed_at = -math.inf
        self._listen_for: frozenset[str] = frozenset()
        """What changes to ask a ``subscriptions/listen`` stream for (none: no stream)."""
        self._listen_kinds: frozenset[str] = frozenset()
        """What the open ``subscriptions/listen`` stream tells the changes of."""
        self._changes: set[str] = set()
        """What it said changed (``tools``, ``prompts``) and is not listed again yet."""
        self._listing = trio.Lock()
        self._wanted = trio.Event()
        """Set by a use that wants a connection: a lost server connects again."""
        self._lost = trio.Event()
        """Set when the connection that is up ends (the server exited, or `lose`)."""
        self._change = trio.Event()
        self._stderr_tail: list[str] = []
        self._sandbox: str | None = None
        """The permission mode whose sandbox the server runs in (None: unconfined)."""
        self._trouble: str | None = None
        """What its stderr said the sandbox refused it (`sandbox_trouble`), first."""
        self.started_at = math.inf
        self._cut: str | None = None
        """Why the transport last refused a message past ``maxResultBytes``, until a call
        that failed takes it."""
        self._oauth: Any = None
        """An HTTP server's OAuth sign-in (`forged._mcp.oauth.SessionAuth`) on its last
        connection; None when its headers sign in."""

    @property
    def status(self) -> str:
        """The state as ``get_mcp_servers`` says it: ``starting``, ``ready``, ``failed``,
        ``stopped`` or ``disabled``."""
        if self.state is State.UP:
            return "ready"
        if self.state is State.LOST:
            return "failed" if self.last_error else "stopped"
        if self.state is State.BROKEN:
            return "failed"
        return str(self.state.value)

    def _enter(self, state: State) -> None:
        self.state = state
        changed, self._state_changed = self._state_changed, trio.Event()
        changed.set()
        self._changed()

    async def _next_state(self) -> None:
        await self._state_changed.wait()

    # --- its task ------------------------------------------------------------------------------

    async def serve(self) -> None:
        """Connect, and connect again on the next use after the connection is lost (the tree
        above). A failure of forged's own ends this server only, never the session."""
        if self.state is State.DISABLED:
            return
        failures = 0
        try:
            while True:
                self._wanted = trio.Event()
                await _telemetry.ready()
                self.started_at = trio.current_time()
                if self.state is not State.STARTING:
                    self._enter(State.STARTING)
                failures = 0 if await self._connect() else failures
                failures += 1
                retry_at = trio.current_time() + min(MAX_BACKOFF_S, 0.25 * 2 ** (failures - 1))
                await self._wanted.wait()
                await trio.sleep_until(retry_at)
        except Exception as exc:
            log_exception(f"MCP server {self.spec.name} stopped: {exc!r}", exc)
            self.session = None
            self.last_error = f"forged's client failed: {exc!r}"
            self._enter(State.BROKEN)

    async def _connect(self) -> bool:
        """One connection, from its start until it is lost or the session ends; whether it
        came up. It ends `LOST` either way, its process stopped."""
        self._lost, self._change = trio.Event(), trio.Event()
        self._changes.clear()
        self._listen_kinds = frozenset()
        self._stderr_tail.clear()
        self._trouble = None
        up = False
        try:
            async with contextlib.AsyncExitStack() as stack:
                connecting = _telemetry.tracing.span(  # not current: the SDK's tasks keep it
                    f"mcp connect {self.spec.name}", {"forged.mcp.server": self.spec.name},
                    conversation=self._session_id())
                try:
                    self.session = await self._open(stack, connecting)
                except Exception as exc:  # whatever the server does, the session goes on
                    connecting.fail(type(exc).__name__, str(exc))
                    self._failed("failed", exc)  # its process is stopped as the stack unwinds
                    return False
                finally:
                    connecting.end()
                up = True
                self.last_error = None
                log(f"MCP server {self.spec.name} connected: {len(self.listed)} tools")
                self._enter(State.UP)
                async with trio.open_nursery() as connected:
                    connected.start_soon(self._follow_changes)
                    connected.start_soon(self._keep_listing)
                    if self._listen_for:
                        connected.start_soon(self._keep_listening)
                    await self._lost.wait()
                    connected.cancel_scope.cancel()
                self.session = None
            self._enter(State.LOST)
        except Exception as exc:  # a transport that fails in the background ends up here
            self._failed("lost its connection" if up else "failed", exc)
        finally:
            self.session = None
        return up

    def _failed(self, what: str, exc: BaseException) -> None:
        self.session = None
        self.last_error = self._why(exc)
        log(f"MCP server {self.spec.name} {what}: {self.last_error}")
        self._enter(State.LOST)

    async def _open(self, stack: contextlib.AsyncExitStack, span: Span) -> Any:
        if self.spec.transport == "stdio":
            streams = await self._stdio(stack, span)
        else:
            await sdk.loaded()
            streams = await self._http(stack)
        from .eras import offer, open_client

        sieve = Sieve(self.spec.name, *streams)
        answer_by = self.started_at + self.spec.timeout_s
        client = await open_client(stack, self.spec, sieve.read, sieve.write,
                                   negotiated_by=answer_by, on_log=self._on_log,
                                   on_message=self._on_message,
                                   on_elicit=self._on_elicit if self._dialogs else None)
        with trio.fail_at(answer_by):
            offered = offer(client, self.spec)
            await self._list_tools(client)
            name = self.spec.name
            self.prompts = await if_offered(offered.prompts, lambda: list_prompts(client), [],
                                            server=name, what="prompts")
            self.resources = bool(offered.resources) or await if_offered(
                offered.resources, lambda: has_resources(client), False, server=name,
                what="resources")
        self._listen_for = offered.listen
        self.protocol_version = client.protocol_version
        self.summary = next(iter((client.instructions or "").strip().splitlines()), None)
        return client

    async def _list_tools(self, client: Any) -> None:
        self.listed, self._tools_ttl_s = await list_tools(client, self.spec.name)
        self._tools_listed_at = trio.current_time()

    async def _keep_listing(self) -> None:
        """Remember the tools and prompts just listed, for the next session, when they
        changed."""
        listing = Listing(tools=self.listed, resources=self.resources, prompts=self.prompts)
        if listing != self._kept:
            self._kept = listing
            await trio.to_thread.run_sync(self._cache.write, self.spec, listing)

    async def _on_message(self, message: Any) -> None:
        """A notification: in either era, a list that changed is listed again (a
        2026-07-28 listen stream's events come here too)."""
        from mcp.types import PromptListChangedNotification, ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._note_changes({"tools"})
        elif isinstance(message, PromptListChangedNotification):
            self._note_changes({"prompts"})

    def _note_changes(self, kinds: set[str] | frozenset[str]) -> None:
        if kinds:
            self._changes |= kinds
            self._change.set()

    async def _keep_listening(self) -> None:
        from .eras import keep_listening

        def listened(kinds: frozenset[str]) -> None:
            self._listen_kinds = kinds
            self._note_changes(kinds)  # no replay: what changed meanwhile is listed again

        await keep_listening(self.session, self.spec.name, kinds=self._listen_for,
                             listened=listened)

    async def _follow_changes(self) -> None:
        """List the tools (or prompts) again each time the server says they changed: new
        ones are offered from the next model request, withdrawn ones no more."""
        while True:
            await self._change.wait()
            self._change = trio.Event()
            kinds, self._changes = self._changes, set()
            if "tools" in kinds:
                await self.relist_tools()
            if "prompts" in kinds:
                await self._relist_prompts()

    def tools_stale(self) -> bool:
        """Whether its tools listing has outlived its ``ttlMs`` (2026-07-28). A ``ttlMs`` of
        0 (stale at once) is no deadline while a listen stream tells the tools' changes."""
        ttl = self._tools_ttl_s
        if ttl is None or (ttl == 0 and "tools" in self._listen_kinds):
            return False
        return trio.current_time() >= self._tools_listed_at + ttl

    async def relist_tools(self, *, if_stale: bool = False) -> None:
        """List its tools again (only if they are stale, with `if_stale`), within its
        ``timeout``; a listing that fails keeps the old one. Says whoever offers them when
        they changed. At once when it is not connected."""
        async with self._listing:
            session = self.session
            if session is None or self._lost.is_set() or (if_stale and not self.tools_stale()):
                return
            before = self.listed
            try:
                with trio.fail_after(self.spec.timeout_s):
                    await self._list_tools(session)
            except Exception as exc:  # the old list stays
                self._relisting_failed("tools", exc)
                return
        if self.listed != before:
            log(f"MCP server {self.spec.name} changed its tools: {len(self.listed)} tools")
            self._changed()
            await self._keep_listing()

    async def _relist_prompts(self) -> None:
        before, session = self.prompts, self.session
        if session is None:
            return
        try:
            with trio.fail_after(self.spec.timeout_s):
                self.prompts = await list_prompts(session)
        except Exception as exc:  # the old list stays
            self._relisting_failed("prompts", exc)
            return
        if self.prompts != before:
            log(f"MCP server {self.spec.name} changed its prompts: {len(self.prompts)} prompts")
            await self._keep_listing()

    def _relisting_failed(self, what: str, exc: Exception) -> None:
        why = (f"no answer within {self.spec.timeout_s:g} s" if isinstance(exc, trio.TooSlowError)
               else _describe(exc, []))
        log(f"MCP server {self.spec.name}: listing its {what} again failed: {why}")

    async def _on_elicit(self, context: Any, params: Any) -> Any:
        """The server asks the user something (either era): the session's dialogs."""
        from .elicit import answer

        assert self._dialogs is not None
        waiting = list(self.answering)
        for scope in waiting:  # the user's time is not the server's
            scope.deadline = math.inf
        try:
            return await answer(self.spec.name, params, self._dialogs)
        finally:
            for scope in waiting:
                scope.deadline = trio.current_time() + self.spec.timeout_s

    async def _on_log(self, params: Any) -> None:
        """A logging notification, to forged's log as ``[mcp NAME] level logger: message``."""
        data = params.data if isinstance(params.data, str) else orjson.dumps(
            params.data, default=str).decode()
        log(f"[mcp {self.spec.name}] {params.level}"
            f"{f' {params.logger}' if params.logger else ''}: {data}")

    def _cut_message(self, what: str) -> str:
        """Record, and say, that `what` went past ``maxResultBytes``."""
        size = self.spec.max_result_bytes
        shown = f"{size / (1 << 20):g} MiB" if size >= 1 << 20 else f"{size:,} bytes"
        self._cut = (f"{what} is larger than {shown}, the most one message may hold "
                     "(maxResultBytes); it was not read")
        return self._cut

    async def _stdio(self, stack: contextlib.AsyncExitStack, span: Span) -> Any:
        """The server's process, started while the SDK loads (0.6 s of imports the first
        time, in a thread): one that exits, or cannot start, fails at once, without waiting
        for them. Its environment names `span` (``TRACEPARENT``)."""
        spec = self.spec
        # In a thread: a ``!command`` value runs a command, and ``~`` reads the home folder.
        values = await trio.to_thread.run_sync(_stdio_values, spec, self._cwd)
        argv = [values["command"], *values["args"]]
        base: dict[str, str] | None = None
        self._sandbox = None
        if self._confine is not None:
            argv, base, self._sandbox = await self._confine(argv, values["cwd"], spec)
        with span.current():
            traced = _telemetry.tracing.env()
        read_fd, write_fd = os.pipe()
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)  # after the server has stopped
        nursery.start_soon(self._read_stderr, read_fd)
        try:
            process = await open_process(
                argv, cwd=values["cwd"], env={**(sdk.default_environment() if base is None
                                                 else base), **traced, **values["env"]},
                stdin=PIPE, stdout=PIPE, stderr=write_fd)
        finally:
            os.close(write_fd)  # the server has its own copy
        try:
            async with trio.open_nursery() as race:
                async def exits() -> None:
                    await process.wait()
                    race.cancel_scope.cancel()

                race.start_soon(exits)
                await sdk.loaded()
                race.cancel_scope.cancel()
            if process.returncode is not None:
                raise ServerExited(f"it exited with status {process.returncode} before it "
                                   "answered")
            from .stdio import stdio_transport
        except BaseException:
            with trio.CancelScope(shield=True):
                await kill_process_group(process)
                await process.aclose()
            raise
        return await stack.enter_async_context(stdio_transport(
            spec.name, process, max_bytes=spec.max_result_bytes, cut=self._cut_message))

    async def _http(self, stack: contextlib.AsyncExitStack) -> Any:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        from .http import SSE_SLACK_BYTES, RetryingTransport
        from .oauth import session_auth

        url, headers = await trio.to_thread.run_sync(
            lambda: (expand(self.spec.url or ""),
                     {k: expand(v) for k, v in self.spec.headers.items()}))
        self._oauth = await session_auth(self.spec.name, url, headers)
        transport = RetryingTransport(self.spec.name, self.spec.max_result_bytes,
                                      self._cut_message)
        client = await stack.enter_async_context(httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(self.spec.timeout_s), auth=self._oauth,
            transport=self._oauth.answers(transport) if self._oauth else transport))
        # The transport cuts an event at the limit; the SDK's own bound is only a backstop.
        return await stack.enter_async_context(streamable_http_client(
            url, http_client=client,
            max_sse_event_size=self.spec.max_result_bytes + SSE_SLACK_BYTES))

    async def _read_stderr(self, fd: int) -> None:
        """The server's stderr, a line at a time, to forged's log; its end is the server's."""
        stream = trio.lowlevel.FdStream(fd)
        pending = b""
        async with stream:
            while data := await stream.receive_some(1 << 16):
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    self._note_stderr(line)
            if pending:
                self._note_stderr(pending)
        if self.session is not None:
            self.last_error = self._why(None)
            log(f"MCP server {self.spec.name} exited")
        self._lost.set()

    def _note_stderr(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip()
        log(f"[mcp {self.spec.name}] {text}")
        self._stderr_tail = [*self._stderr_tail, text][-STDERR_TAIL_LINES:]
        if self._sandbox is not None and self._trouble is None:
            self._trouble = sandbox_trouble(text)

    def _why(self, exc: BaseException | None) -> str:
        """Why it failed or exited: in the sandbox, what the sandbox refused it when its
        stderr said (not a package runner's last line)."""
        if self._sandbox is not None and self._trouble is not None:
            return f"failed in the sandbox ({self._sandbox}): {self._trouble}"
        return _describe(exc, self._stderr_tail)

    # --- its uses ------------------------------------------------------------------------------

    async def connected(self) -> Any:
        """The SDK session, connecting (or again) first if need be: a use waits for the
        attempt under way, or asks for one; `ToolError` when that attempt did not come up."""
        attempted = False
        while True:
            if self.state is State.UP and not self._lost.is_set():
                return self.session
            if self.state is State.DISABLED:
                raise ToolError(f"MCP server {self.spec.name} is disabled")
            if self.state is State.BROKEN or (self.state is State.LOST and attempted):
                raise ToolError(f"MCP server {self.spec.name} is not available: "
                                f"{self.last_error or self.status}")
            if self.state is not State.UP:  # (up: a lost connection winding down)
                attempted = True
                self._wanted.set()
            await self._next_state()

    def lose(self, reason: str) -> None:
        """Drop the connection (the server is stopped); the next use connects again."""
        self.last_error = reason
        self._lost.set()

    async def attempted(self) -> None:
        """Until the connection attempt under way has ended, however long it takes."""
        while self.state is State.STARTING:
            await self._next_state()

    async def first_listed(self) -> None:
        """Until a server that has never listed its tools (none kept from an earlier
        session) has listed them or failed, until its startup timeout at most; at once for
        any other."""
        if self._kept is None:
            with trio.move_on_at(self.first_listing_by):
                await self.attempted()

    async def call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext
                   ) -> w.ToolResult:
        """Call `tool`. It has the server's ``timeout`` to answer, counted again from each
        progress notification; past it, the call is cancelled and the server restarted."""
        _telemetry.tracing.note({"forged.mcp.server": self.spec.name,
                                 "gen_ai.tool.type": "extension"})
        session = await self.connected()  # once connected, the SDK is imported
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        timeout = self.spec.timeout_s
        answer_by = trio.CancelScope(deadline=trio.current_time() + timeout)
        self.answering.add(answer_by)
        shown = _RateLimit(PROGRESS_BURST, PROGRESS_PER_S)
        self._cut = None

        async def progress(done: float, total: float | None, message: str | None) -> None:
            answer_by.deadline = trio.current_time() + timeout
            if shown.allows():
                counted = f"{done:g}/{total:g}" if total else f"{done:g}"
                ctx.update(text_result(f"{message} ({counted})" if message else counted))

        try:
            with answer_by:  # the SDK's own timeout would not count from the last progress
                try:
                    result = await session.call_tool(
                        tool, arguments, read_timeout_seconds=math.inf,
                        progress_callback=progress)
                finally:
                    self.answering.discard(answer_by)
            if answer_by.cancelled_caught:
                self.lose(f"{tool} did not answer within {timeout:g} s")
                raise ToolError(f"MCP server {self.spec.name}: {tool} did not answer within "
                                f"{timeout:g} s; the server is restarted on the next call")
        except MCPError as exc:
            cut, self._cut = self._cut, None
            if cut is not None:
                raise ToolError(f"MCP server {self.spec.name}: {cut}") from None
            if exc.code == CONNECTION_CLOSED:
                self.lose("the connection closed during a call")
                raise ToolError(f"MCP server {self.spec.name} stopped during the call "
                                f"({_describe(None, self._stderr_tail)}); it is restarted "
                                "on the next call") from None
            raise ToolError(f"MCP server {self.spec.name}: {exc.error.message}") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.lose(str(exc))
            raise ToolError(f"MCP server {self.spec.name}: {exc}") from None
        bounded = await bounded_result(tool_result(result), ctx)
        if result.is_error:
            raise ToolError("\n".join(block.text for block in bounded.content
                                      if isinstance(block, w.TextContent)) or "The tool failed",
                            structured=bounded.structured_content)
        return bounded

    def info(self) -> w.McpServerInfo:
        return w.McpServerInfo(
            name=self.spec.name, transport=self.spec.transport, status=self.status,
            tool_count=len(self.listed), last_error=self.last_error,
            description=self.spec.description or self.summary, source=self.spec.source or None,
            protocol_version=self.protocol_version,
            needs_auth=True if self._oauth is not None and self._oauth.needs_auth else None)


def _stdio_values(spec: ServerSpec, session_cwd: Path) -> dict[str, Any]:
    """How a stdio server is started: its values expanded, ``~/`` made the home folder, a
    relative cwd taken from the session's."""
    def home(value: str) -> str:
        return str(Path(value).expanduser()) if value.startswith("~/") else value

    return {"command": home(expand(spec.command or "")),
            "args": [home(expand(arg)) for arg in spec.args],
            "env": {"AI_AGENT": "forged", **{k: expand(v) for k, v in spec.env.items()}},
            "cwd": session_cwd / home(expand(spec.cwd)) if spec.cwd else session_cwd}


def _describe(exc: BaseException | None, stderr: list[str]) -> str:
    if isinstance(exc, trio.TooSlowError):
        text = "it did not answer initialize in time"
    elif exc is None:
        text = "it exited"
    else:
        inner = exc.exceptions[0] if isinstance(exc, BaseExceptionGroup) and len(
            exc.exceptions) == 1 else exc
        error = getattr(inner, "error", None)  # the SDK's MCPError
        text = str(getattr(error, "message", None) or inner) or type(inner).__name__
    return f"{text}; its stderr ended: {stderr[-1]}" if stderr else text


class _RateLimit:
    """A token bucket: `burst` at once, then `per_s` a second."""

    def __init__(self, burst: int, per_s: float) -> None:
        self._burst, self._per_s = burst, per_s
        self._tokens = float(burst)
        self._at = trio.current_time()

    def allows(self) -> bool:
        now = trio.current_time()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._per_s)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
