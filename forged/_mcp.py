"""Model Context Protocol servers as tool sources, in every mode.

Configuration, in this order (a later entry of a name replaces an earlier one):
``<agentDir>/mcp.json``; a trusted project's ``.agent-forge/mcp.json`` (an entry with no
``command``, ``url`` or ``type`` changes only ``enabled``, ``exposure`` and ``toolExposure``
of the user's entry); each ``--mcp-config FILE``; the servers a client hands the session
(ACP's ``mcpServers``). The format is the one other MCP clients share:
``{"mcpServers": {NAME: {...}}}`` (docs/protocol.md, MCP servers).

Each server of a session is a task of that session; nothing is shared between sessions
(but the listings kept on disk)::

    session_nursery
    └── McpServers.serve
        └── McpServer.serve           one per enabled server: connect, list its tools, hold
            │                         the connection until the session ends or it is lost;
            │                         then wait for the next use and reconnect (backoff)
            ├── the SDK's transport   stdio: a process group of its own; HTTP: one client,
            │                         retrying (forged._mcp_http)
            ├── read_stderr           a stdio server's stderr -> forged's log, as [mcp NAME]
            ├── follow_tools          while connected: lists the tools again when the
            │                         server says they changed
            └── keep_listing          while connected: the listing to <agentDir>/mcp-cache

The ``mcp`` SDK (on anyio, so on trio) is imported by a server's task only: a process or a
session without MCP servers never loads it. ``get_state`` never waits for start-up. Each
server's tools as it last listed them are kept in ``<agentDir>/mcp-cache/`` (`ListingCache`),
so a session offers them from its first request, which never waits for such a server; a
server never listed before is waited for by a model request, until its startup timeout at
most (`McpServers.first_listings`). A call
to a tool of a server still connecting waits for that server. A call that hangs past the
server's ``timeout`` fails and restarts the server; ``abort`` cancels the call (the SDK sends
``notifications/cancelled``) and the tool ends at once.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from . import _wire as w
from ._codec import structure, unstructure
from ._errors import ConfigProblem as ConfigProblem
from ._errors import WireError
from ._log import log, log_exception
from ._mcp_sieve import Sieve, object_schema
from ._models import resolve_value
from ._paths import rewrite
from ._settings import DEFAULTS
from ._tools import MCP_RESOURCE_TOOLS, Tool, ToolContext, ToolError, text_result
from ._tools.base import ScratchDir
from ._version import __version__

MCP_FILE = "mcp.json"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_STARTUP_TIMEOUT_S = float(DEFAULTS["mcp.startupTimeout"])
"""How long a model request waits for a server that has never listed its tools (setting
``mcp.startupTimeout``, per server ``startupTimeout``)."""
DEFAULT_MAX_RESULT_BYTES = 32 * 1024 * 1024
"""The most one message from a server may hold (``maxResultBytes``): past it, the call it
answers fails, naming the limit, and nothing more of it is read."""
CACHE_DIR = "mcp-cache"
RESULT_TEXT_LIMIT = 20 * 1024
"""Characters of a result's text the model gets, as in the ancestor."""
MAX_BACKOFF_S = 30.0
PROGRESS_BURST = 20
PROGRESS_PER_S = 20.0
"""A call's progress notifications become ``tool_execution_update`` events at this rate at
most (after a burst): a server that floods them does not flood the client."""
MAX_TOOL_NAME = 64
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
STDERR_TAIL_LINES = 5


# --- configuration -----------------------------------------------------------------------------

@attrs.define(kw_only=True)
class ServerSpec:
    """One configured server, as written (values are expanded when it connects)."""

    name: str
    transport: str
    """``stdio`` or ``http`` (streamable HTTP)."""
    command: str | None = None
    args: list[str] = attrs.Factory(list)
    env: dict[str, str] = attrs.Factory(dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = attrs.Factory(dict)
    enabled: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_timeout_s: float | None = None
    """How long a model request waits for it while it has never listed its tools (None:
    the session's ``mcp.startupTimeout``)."""
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    description: str | None = None
    exposure: str = "direct"
    """The server's tools: ``hidden``, or offered to the model (the ancestor's ``direct``,
    ``codemode`` and ``deferred`` alike: forged declares every reachable tool)."""
    tool_exposure: list[str] | dict[str, str] = attrs.Factory(list)
    """A list: ``name`` shows only the tools listed so, ``!name`` hides one; or the ancestor's
    object of names or patterns to exposures (an exact name first, else the first pattern
    that matches). ``*`` matches any characters."""
    source: str = ""


def parse_entry(name: str, raw: Any, source: str) -> ServerSpec:
    """One ``mcpServers`` entry; `ConfigProblem` says what is wrong with it."""
    if not _SERVER_NAME.match(name):
        raise ConfigProblem(f"server name {name!r} may hold only letters, digits, _ and -")
    if not isinstance(raw, dict):
        raise ConfigProblem(f"server {name}: expected an object")
    kind = raw.get("type")
    if kind == "sse":
        raise ConfigProblem(
            f"server {name}: the legacy SSE transport is not supported; servers that offer "
            "SSE usually offer streamable HTTP too, often at /mcp instead of /sse")
    if kind not in (None, "stdio", "http", "streamable-http"):
        raise ConfigProblem(f"server {name}: unknown type {kind!r} (stdio, http or "
                            "streamable-http)")
    has_command, has_url = isinstance(raw.get("command"), str), isinstance(raw.get("url"), str)
    if has_command == has_url:
        raise ConfigProblem(f"server {name}: give either command (stdio) or url (HTTP)")
    transport = "stdio" if has_command else "http"
    if kind is not None and (kind == "stdio") != (transport == "stdio"):
        raise ConfigProblem(f"server {name}: type {kind} does not match its "
                            f"{'command' if has_command else 'url'}")
    timeout = raw.get("timeout", DEFAULT_TIMEOUT_S)
    if not seconds(timeout):
        raise ConfigProblem(f"server {name}: timeout must be a positive number of seconds")
    startup = raw.get("startupTimeout")
    if startup is not None and not seconds(startup):
        raise ConfigProblem(f"server {name}: startupTimeout must be a positive number of "
                            "seconds")
    max_bytes = raw.get("maxResultBytes", DEFAULT_MAX_RESULT_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024:
        raise ConfigProblem(f"server {name}: maxResultBytes must be a whole number of bytes, "
                            "1024 at least")
    return ServerSpec(
        name=name, transport=transport, command=raw.get("command"),
        args=_strings(raw.get("args", []), name, "args"),
        env=_string_map(raw.get("env", {}), name, "env"),
        cwd=raw["cwd"] if isinstance(raw.get("cwd"), str) else None,
        url=raw.get("url"), headers=_string_map(raw.get("headers", {}), name, "headers"),
        enabled=raw.get("enabled", True) is not False, timeout_s=float(timeout),
        startup_timeout_s=None if startup is None else float(startup),
        max_result_bytes=max_bytes,
        description=raw["description"] if isinstance(raw.get("description"), str) else None,
        exposure=_exposure(raw.get("exposure", "direct"), name, "exposure"),
        tool_exposure=_tool_exposure(raw.get("toolExposure", []), name),
        source=source)


EXPOSURES = ("direct", "codemode", "codemode-deferred", "deferred", "hidden")


def startup_timeout(section: Any) -> float:
    """The settings' ``mcp.startupTimeout``, else the default."""
    value: Any = section.get("startupTimeout") if isinstance(section, dict) else None
    return float(value) if seconds(value) else DEFAULT_STARTUP_TIMEOUT_S


def seconds(value: Any) -> bool:
    """Whether `value` is a positive number of seconds."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _exposure(value: Any, name: str, key: str) -> str:
    if value not in EXPOSURES:
        raise ConfigProblem(f"server {name}: {key} must be one of {', '.join(EXPOSURES)}")
    return str(value)


def _tool_exposure(value: Any, name: str) -> list[str] | dict[str, str]:
    if isinstance(value, dict):
        return {str(tool): _exposure(exposure, name, f"toolExposure.{tool}")
                for tool, exposure in value.items()}
    return _strings(value, name, "toolExposure")


def _strings(value: Any, name: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigProblem(f"server {name}: {key} must be a list of strings")
    return list(value)


def _string_map(value: Any, name: str, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(item, str)
                                              for item in value.values()):
        raise ConfigProblem(f"server {name}: {key} must map names to strings")
    return dict(value)


def read_file(path: Path) -> dict[str, Any]:
    """A file's ``mcpServers`` object; empty when the file does not exist."""
    try:
        raw = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigProblem(f"{path}: {exc}") from None
    servers = raw.get("mcpServers", {}) if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise ConfigProblem(f"{path}: mcpServers must be an object")
    return servers


@attrs.define(kw_only=True)
class McpConfig:
    """Where a session's servers come from."""

    user_file: Path | None = None
    project_file: Path | None = None
    """Only for a trusted project."""
    files: list[Path] = attrs.Factory(list)
    """``--mcp-config``."""
    handed: dict[str, Any] = attrs.Factory(dict)
    """Entries a client hands the session (ACP's ``mcpServers``)."""
    disabled: bool = False
    """``--no-mcp``."""
    problems: list[str] = attrs.Factory(list)
    """What `load` skipped, and why."""

    def load(self) -> list[ServerSpec]:
        """The servers, each problem reported on stderr and its entry skipped."""
        if self.disabled:
            return []
        raw: dict[str, tuple[Any, str]] = {}
        layers: list[tuple[str, dict[str, Any] | Path | None]] = [
            ("user", self.user_file), ("project", self.project_file),
            *(("file", path) for path in self.files), ("client", self.handed)]
        for layer, where in layers:
            if where is None:
                continue
            try:
                entries = where if isinstance(where, dict) else read_file(where)
            except ConfigProblem as exc:
                self._problem(f"MCP configuration skipped: {exc}")
                continue
            source = "client" if isinstance(where, dict) else str(where)
            for name, entry in entries.items():
                previous = raw.get(name)
                if (layer == "project" and previous is not None and isinstance(entry, dict)
                        and not {"command", "url", "type"} & entry.keys()):
                    entry = {**previous[0], **{key: entry[key] for key in (
                        "enabled", "exposure", "toolExposure") if key in entry}}
                same = next((known for known in raw if _same_server(known, name)), name)
                if same != name:
                    self._problem(f"MCP server skipped ({source}): {name} and {same} name one "
                                  "server (- and _ are alike in tool names)")
                    continue
                raw[name] = (entry, source)
        specs: list[ServerSpec] = []
        for name, (entry, source) in raw.items():
            try:
                specs.append(parse_entry(name, entry, source))
            except ConfigProblem as exc:
                self._problem(f"MCP server skipped ({source}): {exc}")
        return specs

    def _problem(self, text: str) -> None:
        log(text)
        self.problems.append(text)


def _same_server(one: str, other: str) -> bool:
    return one.replace("-", "_") == other.replace("-", "_")


def expand(value: str) -> str:
    """``${VAR}`` from the environment (empty when unset), or ``!command``'s output."""
    if value.startswith("!"):
        return resolve_value(value) or ""
    return _ENV_REFERENCE.sub(lambda match: os.environ.get(match.group(1), ""), value)


def tool_name(server: str, tool: str) -> str:
    return _NOT_NAME.sub("_", f"mcp__{server}__{tool}")


def _suffixed(name: str, key: str) -> str:
    digest = hashlib.sha1(key.encode()).hexdigest()[:6]
    return f"{name[:MAX_TOOL_NAME - 7]}_{digest}"


def exposed(tool: str, tool_exposure: list[str] | dict[str, str],
            exposure: str = "direct") -> bool:
    """Whether `tool` reaches the model under ``exposure`` and ``toolExposure``."""
    import fnmatch

    if isinstance(tool_exposure, dict):
        chosen = tool_exposure.get(tool) or next(
            (value for pattern, value in tool_exposure.items()
             if fnmatch.fnmatchcase(tool, pattern)), exposure)
        return chosen != "hidden"
    if any(fnmatch.fnmatchcase(tool, p[1:]) for p in tool_exposure if p.startswith("!")):
        return False
    shown = [p for p in tool_exposure if not p.startswith("!")]
    if shown:
        return any(fnmatch.fnmatchcase(tool, p) for p in shown)
    return exposure != "hidden"


# --- what a server offered when it last connected ---------------------------------------------

@attrs.frozen(kw_only=True)
class ListedTool:
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = attrs.Factory(lambda: {"type": "object"})


@attrs.frozen(kw_only=True)
class Listing:
    tools: list[ListedTool]
    resources: bool = False


class ListingCache:
    """Each server's `Listing` as it last connected, one file per way of reaching a server
    (its command or URL, arguments, environment and headers, as written: a secret in a
    ``${VAR}`` is not expanded, and the file name is a hash). Read and written in worker
    threads; a missing or unreadable file is no listing."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        """None: nothing is kept (``forged mcp list`` of a bare configuration)."""

    def _path(self, spec: ServerSpec) -> Path | None:
        if self.folder is None:
            return None
        reached = [spec.transport, spec.command, spec.args, spec.env, spec.cwd, spec.url,
                   spec.headers]
        digest = hashlib.sha256(orjson.dumps(reached)).hexdigest()[:32]
        return self.folder / f"{digest}.json"

    def read(self, spec: ServerSpec) -> Listing | None:
        path = self._path(spec)
        if path is None:
            return None
        try:
            return structure(orjson.loads(path.read_bytes()), Listing)
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError, WireError) as exc:
            log(f"MCP server {spec.name}: its cached tool list {path} is unreadable ({exc})")
            return None

    def write(self, spec: ServerSpec, listing: Listing) -> None:
        path = self._path(spec)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            rewrite(path, orjson.dumps(unstructure(listing)), durable=False)
        except OSError as exc:
            log(f"MCP server {spec.name}: cannot keep its tool list in {path} ({exc})")


async def _list_tools(session: Any, server: str) -> list[ListedTool]:
    """Every page of a server's ``tools/list`` (a cursor seen before ends it), without the
    tools no model API would take, and each name once."""
    from mcp.types import PaginatedRequestParams

    tools: list[ListedTool] = []
    cursor: str | None = None
    seen: set[str] = set()
    names: set[str] = set()
    while True:
        page = await session.list_tools(
            params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        cursor = page.next_cursor
        for tool in page.tools:
            if tool.name in names:
                continue
            names.add(tool.name)
            listed = _listed(tool)
            if listed is None:
                log(f"MCP server {server}: tool {tool.name!r} skipped: its inputSchema is not "
                    "a JSON schema of an object")
            else:
                tools.append(listed)
        if not cursor or cursor in seen:
            return tools
        seen.add(cursor)


def _listed(tool: Any) -> ListedTool | None:
    """The SDK's ``Tool`` as kept; None when its schema is not an object's (valid from MCP
    2026-07-28 on, but a model API would refuse every request that offered it)."""
    schema = tool.input_schema
    if not object_schema(schema) or not tool.name:
        return None
    return ListedTool(name=tool.name, description=tool.description,
                      input_schema={"type": "object", **schema})


# --- one server --------------------------------------------------------------------------------

class McpServer:
    """One server of a session: its connection, its tools, and how it is doing."""

    def __init__(self, spec: ServerSpec, cwd: Path, changed: Callable[[], None],
                 cache: ListingCache, listing: Listing | None = None, *,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> None:
        self.spec = spec
        self.first_listing_by = trio.current_time() + (
            spec.startup_timeout_s or startup_timeout_s)
        """Until when a model request waits for it while it has never listed its tools."""
        self._cwd = cwd
        self._changed = changed
        self._cache = cache
        self._kept = listing
        self.status = "starting" if spec.enabled else "disabled"
        """``starting``, ``ready``, ``failed``, ``stopped`` or ``disabled``."""
        self.last_error: str | None = None
        self.listed: list[ListedTool] = listing.tools if listing else []
        """The server's tools as last listed (kept from an earlier session until it connects)."""
        self.resources = listing.resources if listing else False
        """The server offers resources."""
        self.summary: str | None = None
        """The first line of the server's instructions, once connected."""
        self.session: Any = None
        """The SDK's ClientSession while connected."""
        self._failures = 0
        self._attempt = trio.Event()
        """Set when the connection attempt under way (or the next one) has ended."""
        self._wanted = trio.Event()
        self._lost = trio.Event()
        self._tools_changed = trio.Event()
        self._stderr_tail: list[str] = []
        self.started_at = math.inf
        self._broken = False
        """Its task ended on a failure of forged's own: no attempt comes any more."""
        self._cut: str | None = None
        """Why the transport last refused a message past ``maxResultBytes``, until a call
        that failed takes it."""

    async def serve(self) -> None:
        """Connect, and reconnect on the next use after the connection is lost. A failure
        of forged's own (a bug, a broken SDK) ends this server only, never the session."""
        if not self.spec.enabled:
            return
        try:
            await self._serve()
        except Exception as exc:
            log_exception(f"MCP server {self.spec.name} stopped: {exc!r}", exc)
            self.session, self._broken = None, True
            self.status, self.last_error = "failed", f"forged's client failed: {exc!r}"
            self._end_attempt()

    async def _serve(self) -> None:
        await trio.to_thread.run_sync(_load_sdk)  # 0.6 s of imports, off the loop
        while True:
            self._wanted = trio.Event()
            self.started_at = trio.current_time()
            self.status = "starting"
            await self._connect()
            self._failures += 1
            retry_at = trio.current_time() + min(MAX_BACKOFF_S, 0.25 * 2 ** (self._failures - 1))
            await self._wanted.wait()
            await trio.sleep_until(retry_at)

    def _end_attempt(self) -> None:
        ended, self._attempt = self._attempt, trio.Event()
        ended.set()
        self._changed()

    async def _connect(self) -> None:
        """One connection, from start-up until it is lost or the session ends."""
        self._lost, self._tools_changed = trio.Event(), trio.Event()
        self._stderr_tail.clear()
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    self.session = await self._open(stack)
                except Exception as exc:  # whatever the server does, the session goes on
                    self._failed(exc)  # at once; its process is stopped as the stack unwinds
                    return
                self.status, self.last_error = "ready", None
                self._failures = 0
                log(f"MCP server {self.spec.name} connected: {len(self.listed)} tools")
                self._end_attempt()
                async with trio.open_nursery() as connected:
                    connected.start_soon(self._follow_tools)
                    connected.start_soon(self._keep_listing)
                    await self._lost.wait()
                    connected.cancel_scope.cancel()
                self.session = None
                self.status = "failed" if self.last_error else "stopped"
                self._end_attempt()
        except Exception as exc:  # a transport that fails in the background ends up here
            if self.status == "starting":
                self._failed(exc)
            else:
                self.status, self.last_error = "failed", _describe(exc, self._stderr_tail)
                log(f"MCP server {self.spec.name} lost its connection: {self.last_error}")
                self._end_attempt()
        finally:
            self.session = None

    def _failed(self, exc: BaseException) -> None:
        self.status = "failed"
        self.last_error = _describe(exc, self._stderr_tail)
        log(f"MCP server {self.spec.name} failed: {self.last_error}")
        self._end_attempt()

    async def _open(self, stack: contextlib.AsyncExitStack) -> Any:
        from mcp.client.session import ClientSession
        from mcp.types import Implementation

        if self.spec.transport == "stdio":
            streams = await self._stdio(stack)
        else:
            streams = await self._http(stack)
        sieve = Sieve(self.spec.name, *streams)
        session = await stack.enter_async_context(ClientSession(
            sieve.read, sieve.write,
            read_timeout_seconds=self.spec.timeout_s, logging_callback=self._on_log,
            message_handler=self._on_message,
            client_info=Implementation(name="forged", version=__version__)))
        with trio.fail_at(self.started_at + self.spec.timeout_s):
            init = await session.initialize()
            self.listed = await _list_tools(session, self.spec.name)
        self.resources = init.capabilities.resources is not None
        self.summary = next(iter((init.instructions or "").strip().splitlines()), None)
        return session

    async def _keep_listing(self) -> None:
        """Remember the tools just listed, for the next session, when they changed."""
        listing = Listing(tools=self.listed, resources=self.resources)
        if listing != self._kept:
            self._kept = listing
            await trio.to_thread.run_sync(self._cache.write, self.spec, listing)

    async def _on_message(self, message: Any) -> None:
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._tools_changed.set()

    async def _follow_tools(self) -> None:
        """List the tools again each time the server says they changed: new ones are
        offered from the next model request, withdrawn ones no more."""
        while True:
            await self._tools_changed.wait()
            self._tools_changed = trio.Event()
            try:
                with trio.fail_after(self.spec.timeout_s):
                    self.listed = await _list_tools(self.session, self.spec.name)
            except Exception as exc:  # the old list stays
                log(f"MCP server {self.spec.name}: listing its changed tools failed: "
                    f"{_describe(exc, [])}")
                continue
            log(f"MCP server {self.spec.name} changed its tools: {len(self.listed)} tools")
            self._changed()
            await self._keep_listing()

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

    async def _stdio(self, stack: contextlib.AsyncExitStack) -> Any:
        from ._mcp_stdio import stdio_transport

        spec = self.spec
        # In a thread: a ``!command`` value runs a command, and ``~`` reads the home folder.
        values = await trio.to_thread.run_sync(_stdio_values, spec, self._cwd)
        read_fd, write_fd = os.pipe()
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)  # after the server has stopped
        nursery.start_soon(self._read_stderr, read_fd)
        try:
            return await stack.enter_async_context(stdio_transport(
                spec.name, values["command"], values["args"], env=values["env"],
                cwd=values["cwd"], errlog_fd=write_fd, max_bytes=spec.max_result_bytes,
                cut=self._cut_message))
        finally:
            os.close(write_fd)  # the server has its own copy

    async def _http(self, stack: contextlib.AsyncExitStack) -> Any:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        from ._mcp_http import SSE_SLACK_BYTES, RetryingTransport

        url, headers = await trio.to_thread.run_sync(
            lambda: (expand(self.spec.url or ""),
                     {k: expand(v) for k, v in self.spec.headers.items()}))
        client = await stack.enter_async_context(httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(self.spec.timeout_s),
            transport=RetryingTransport(self.spec.name, self.spec.max_result_bytes,
                                        self._cut_message)))
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
            self.last_error = _describe(None, self._stderr_tail)
            log(f"MCP server {self.spec.name} exited")
        self._lost.set()

    def _note_stderr(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip()
        log(f"[mcp {self.spec.name}] {text}")
        self._stderr_tail = [*self._stderr_tail, text][-STDERR_TAIL_LINES:]

    async def connected(self) -> Any:
        """The SDK session, connecting (or reconnecting) first if need be; `ToolError` when
        the server cannot be reached."""
        if self.session is not None and self._lost.is_set():
            await self._attempt.wait()  # a lost connection winding down, then the next one
        if self.session is not None:
            return self.session
        if self.status == "disabled":
            raise ToolError(f"MCP server {self.spec.name} is disabled")
        if self._broken:
            raise ToolError(f"MCP server {self.spec.name} is not available: {self.last_error}")
        attempt = self._attempt
        self._wanted.set()
        await attempt.wait()
        if self.session is None:
            raise ToolError(f"MCP server {self.spec.name} is not available: "
                            f"{self.last_error or self.status}")
        return self.session

    def lose(self, reason: str) -> None:
        """Drop the connection (the server is stopped); the next use reconnects."""
        self.last_error = reason
        self._lost.set()

    async def attempted(self) -> None:
        """Until the connection attempt under way has ended, however long it takes."""
        if self.status == "starting":
            await self._attempt.wait()

    async def first_listed(self) -> None:
        """Until a server that has never listed its tools (none kept from an earlier
        session) has listed them or failed, until its startup timeout at most; at once for
        any other."""
        if self._kept is None and self.status == "starting":
            with trio.move_on_at(self.first_listing_by):
                await self._attempt.wait()

    async def call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext
                   ) -> w.ToolResult:
        """Call `tool`. It has the server's ``timeout`` to answer, counted again from each
        progress notification; past it, the call is cancelled and the server restarted."""
        session = await self.connected()  # once connected, the SDK is imported
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        timeout = self.spec.timeout_s
        answer_by = trio.CancelScope(deadline=trio.current_time() + timeout)
        shown = _RateLimit(PROGRESS_BURST, PROGRESS_PER_S)
        self._cut = None

        async def progress(done: float, total: float | None, message: str | None) -> None:
            answer_by.deadline = trio.current_time() + timeout
            if shown.allows():
                counted = f"{done:g}/{total:g}" if total else f"{done:g}"
                ctx.update(text_result(f"{message} ({counted})" if message else counted))

        try:
            with answer_by:  # the SDK's own timeout would not count from the last progress
                result = await session.call_tool(tool, arguments, read_timeout_seconds=math.inf,
                                                 progress_callback=progress)
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
        bounded = await _bounded(_result(result), ctx)
        if result.is_error:
            raise ToolError("\n".join(block.text for block in bounded.content
                                      if isinstance(block, w.TextContent)) or "The tool failed",
                            structured=bounded.structured_content)
        return bounded

    def info(self) -> w.McpServerInfo:
        return w.McpServerInfo(
            name=self.spec.name, transport=self.spec.transport, status=self.status,
            tool_count=len(self.listed), last_error=self.last_error,
            description=self.spec.description or self.summary, source=self.spec.source or None)


def _load_sdk() -> None:
    """Import the parts of the MCP SDK a connection uses (in a worker thread: the loop goes
    on answering meanwhile)."""
    import httpx2  # noqa: F401
    import mcp.client.session
    import mcp.client.stdio
    import mcp.client.streamable_http  # noqa: F401

    from . import _mcp_http  # noqa: F401

    sdk = logging.getLogger("mcp")
    if not any(isinstance(handler, _SdkLog) for handler in sdk.handlers):
        sdk.addHandler(_SdkLog(logging.WARNING))
        sdk.propagate = False  # not Python's last-resort handler, a blocking write to stderr


class _SdkLog(logging.Handler):
    """The SDK's warnings and errors (a server that writes what is not JSON-RPC, say) as one
    line each in forged's log, which never blocks."""

    def emit(self, record: logging.LogRecord) -> None:
        text = f"MCP SDK {record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f" ({type(error).__name__}: {next(iter(str(error).splitlines()), '')})"
        log(text)


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


def _result(result: Any) -> w.ToolResult:
    """A ``tools/call`` result's text, images and resources as a tool result (the caller
    makes one with ``isError`` a failure)."""
    content: list[w.UserContent] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            content.append(w.TextContent(text=block.text))
        elif kind == "image":
            content.append(w.ImageContent(data=block.data, mime_type=block.mime_type))
        elif kind == "resource":
            inner = block.resource
            text = getattr(inner, "text", None)
            content.append(w.TextContent(
                text=f"<resource uri=\"{inner.uri}\">\n{text}\n</resource>" if text is not None
                else f"[binary resource {inner.uri} ({inner.mime_type or 'unknown type'})]"))
        elif kind == "resource_link":
            content.append(w.TextContent(text=f"[{block.name}]({block.uri})"))
        else:
            content.append(w.TextContent(text=f"[{kind or 'unknown'} content]"))
    structured = result.structured_content if isinstance(result.structured_content,
                                                         dict) else None
    return w.ToolResult(content=content or [w.TextContent(text="(no output)")],
                        structured_content=structured)


async def _bounded(result: w.ToolResult, ctx: ToolContext) -> w.ToolResult:
    """`result` with its text cut to `RESULT_TEXT_LIMIT` characters: the middle of a longer
    text is left out (marked ``…N chars truncated…``), and the whole text is kept in a file
    the result names. Images stay."""
    texts = [block.text for block in result.content if isinstance(block, w.TextContent)]
    whole = "\n".join(texts)
    if len(whole) <= RESULT_TEXT_LIMIT:
        return result
    path = await trio.to_thread.run_sync(_keep, whole, ctx.scratch)
    half = RESULT_TEXT_LIMIT // 2
    shown = (f"{whole[:half]}\n…{len(whole) - 2 * half} chars truncated…\n{whole[-half:]}"
             f"\n\n[The whole result is in {path}]")
    return attrs.evolve(result, content=[w.TextContent(text=shown), *(
        block for block in result.content if not isinstance(block, w.TextContent))])


def _keep(text: str, scratch: ScratchDir | None) -> Path:
    descriptor, name = tempfile.mkstemp(prefix="forged-mcp-", suffix=".txt",
                                        dir=scratch.path() if scratch is not None else None)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
    return Path(name)


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


# --- a session's servers -----------------------------------------------------------------------

class McpServers:
    """A session's servers and the tools they give the model (`tools`, kept up to date)."""

    def __init__(self, specs: list[ServerSpec], cwd: Path, *,
                 cache: ListingCache | None = None, listings: dict[str, Listing] | None = None,
                 keep: Callable[[str], bool] = lambda _: True,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> None:
        cache = cache or ListingCache(None)
        listings = listings or {}
        self.servers = {spec.name: McpServer(spec, cwd, self._retool, cache,
                                             listings.get(spec.name),
                                             startup_timeout_s=startup_timeout_s)
                        for spec in specs}
        self._keep = keep
        """Which tools reach the model (``--tools`` and ``--exclude-tools``)."""
        self.tools: dict[str, Tool] = {}
        self._retool()

    async def serve(self) -> None:
        if not self.servers:
            return
        async with trio.open_nursery() as nursery:
            for server in self.servers.values():
                nursery.start_soon(server.serve)

    async def tool(self, name: str) -> Tool | None:
        """The tool called `name`. When there is none yet, the server whose tool it would be
        (``mcp__<server>__…``) is connected first, or `ToolError` says why it cannot be; a
        resource tool waits for the servers still connecting."""
        if name not in self.tools:
            for server in self.servers.values():
                if name.startswith(tool_name(server.spec.name, "")):
                    await server.connected()
                elif name in MCP_RESOURCE_TOOLS:
                    await server.attempted()
        return self.tools.get(name)

    async def first_listings(self) -> None:
        """Until each server that has never listed its tools has listed them (or failed),
        each at most until its startup timeout: a first request offers them. A server with
        a listing kept from an earlier session never delays a request."""
        for server in self.servers.values():  # their deadlines run side by side
            await server.first_listed()

    def infos(self) -> list[w.McpServerInfo]:
        return [server.info() for server in self.servers.values()]

    def _retool(self) -> None:
        """Name every listed tool ``mcp__<server>__<tool>`` (a hash suffix for names that
        collide or run long), and add the resource tools when a server has resources."""
        wanted: list[tuple[str, McpServer, ListedTool]] = [
            (tool_name(server.spec.name, listed.name), server, listed)
            for server in self.servers.values() for listed in server.listed
            if exposed(listed.name, server.spec.tool_exposure, server.spec.exposure)]
        counts = collections.Counter(name for name, _, _ in wanted)
        tools: dict[str, Tool] = {}
        for name, server, listed in wanted:
            if counts[name] > 1 or len(name) > MAX_TOOL_NAME:
                name = _suffixed(name, f"{server.spec.name}/{listed.name}")
            tools[name] = _server_tool(name, server, listed)
        if any(server.resources for server in self.servers.values()):
            tools.update({tool.name: tool for tool in self._resource_tools()})
        self.tools.clear()
        self.tools.update((name, tool) for name, tool in tools.items() if self._keep(name))

    def _resource_tools(self) -> list[Tool]:
        servers = self.servers

        async def list_resources(arguments: dict[str, Any], ctx: ToolContext) -> w.ToolResult:
            names = [arguments["server"]] if isinstance(arguments.get("server"), str) else [
                name for name, server in servers.items() if server.resources]
            found: list[dict[str, Any]] = []
            for name in names:
                session = await _server(servers, name).connected()
                listed = await session.list_resources()
                found += [{"server": name, "uri": str(item.uri), "name": item.name,
                           **({"mimeType": item.mime_type} if item.mime_type else {}),
                           **({"description": item.description} if item.description else {})}
                          for item in listed.resources]
            return text_result(orjson.dumps({"resources": found},
                                            option=orjson.OPT_INDENT_2).decode())

        async def read_resource(arguments: dict[str, Any], ctx: ToolContext) -> w.ToolResult:
            server, uri = arguments.get("server"), arguments.get("uri")
            if not isinstance(server, str) or not isinstance(uri, str):
                raise ToolError("read_mcp_resource needs server and uri")
            session = await _server(servers, server).connected()
            read = await session.read_resource(uri)
            content: list[w.UserContent] = []
            for item in read.contents:
                if getattr(item, "text", None) is not None:
                    content.append(w.TextContent(text=item.text))
                elif (item.mime_type or "").startswith("image/"):
                    content.append(w.ImageContent(data=item.blob, mime_type=item.mime_type))
                else:
                    content.append(w.TextContent(
                        text=f"[binary resource {item.uri} ({item.mime_type or 'unknown'})]"))
            return await _bounded(w.ToolResult(
                content=content or [w.TextContent(text="(empty resource)")]), ctx)

        return [
            Tool(name="list_mcp_resources", snippet="List MCP servers' resources",
                 description="List the resources MCP servers offer, as JSON (server, uri, "
                 "name, mimeType). Give server to list one server's only.",
                 parameters={"type": "object", "properties": {"server": {
                     "type": "string", "description": "One server's name"}}},
                 parse=dict, run=list_resources),
            Tool(name="read_mcp_resource", snippet="Read an MCP server's resource",
                 description="Read a resource of an MCP server by its server and uri.",
                 parameters={"type": "object", "properties": {
                     "server": {"type": "string", "description": "The server's name"},
                     "uri": {"type": "string", "description": "The resource's URI"}},
                     "required": ["server", "uri"]},
                 parse=dict, run=read_resource)]


def _server(servers: dict[str, McpServer], name: str) -> McpServer:
    server = servers.get(name)
    if server is None:
        raise ToolError(f"No MCP server {name!r} (servers: {', '.join(servers) or 'none'})")
    return server


def _server_tool(name: str, server: McpServer, listed: ListedTool) -> Tool:
    description = listed.description or listed.name

    async def run(arguments: dict[str, Any], ctx: ToolContext) -> w.ToolResult:
        return await server.call(listed.name, arguments, ctx)

    return Tool(name=name, snippet=description.splitlines()[0] if description else name,
                description=f"{description}\n\n(MCP server {server.spec.name}, tool "
                f"{listed.name})", parameters=listed.input_schema, parse=dict, run=run)
