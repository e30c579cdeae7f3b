"""A session's MCP servers, and the tools (and prompt commands) they give it.

Each server of a session is a task of that session; nothing is shared between sessions but
the listings kept on disk::

    session_nursery
    └── McpServers.serve
        └── McpServer.serve           one per enabled server (`forged._mcp.server`)

``get_state`` never waits for a server. Each server's tools as it last listed them are kept
in ``<agentDir>/mcp-cache/``, so a session offers them from its first request, which never
waits for such a server; a server never listed before is waited for by a model request,
until its startup timeout at most (`McpServers.first_listings`), and so is a listing past its
``ttlMs`` (2026-07-28), listed again. A call to a tool of a server still connecting waits for
that server. A call that hangs past the server's ``timeout`` fails and restarts the server;
``abort`` cancels the call (the SDK sends ``notifications/cancelled``) and the tool ends at
once. The servers' prompts are commands (`forged._mcp.prompts`).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import trio

from .. import _wire as w
from .._errors import CommandError, ToolError
from .._tools import MCP_RESOURCE_TOOLS, Tool, ToolContext, make_tool, text_result
from .._ui import Dialogs
from .cache import ListedTool, Listing, ListingCache
from .config import (
    DEFAULT_STARTUP_TIMEOUT_S,
    MAX_TOOL_NAME,
    ServerSpec,
    exposed,
    suffixed,
    tool_name,
)
from .prompts import command_infos, render, server_named
from .results import bounded_result
from .server import Confine, McpServer


class McpServers:
    """A session's servers and the tools they give the model (`tools`, kept up to date)."""

    def __init__(self, specs: list[ServerSpec], cwd: Path, *,
                 cache: ListingCache | None = None, listings: dict[str, Listing] | None = None,
                 keep: Callable[[str], bool] = lambda _: True,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 confine: Confine | None = None, dialogs: Dialogs | None = None,
                 session_id: Callable[[], str | None] = lambda: None) -> None:
        cache = cache or ListingCache(None)
        listings = listings or {}
        self.servers = {spec.name: McpServer(spec, cwd, self._retool, cache,
                                             listings.get(spec.name),
                                             startup_timeout_s=startup_timeout_s,
                                             confine=confine, dialogs=dialogs,
                                             session_id=session_id)
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
        """Until each server's tools are as a model request should offer them: a server that
        has never listed its tools has listed them (or failed), each at most until its
        startup timeout, so a first request offers them (a server with a listing kept from
        an earlier session never delays a request); a connected server whose listing has
        outlived its ``ttlMs`` (2026-07-28) has listed them again, within its timeout."""
        for server in self.servers.values():  # their deadlines run side by side
            await server.first_listed()
        stale = [server for server in self.servers.values() if server.tools_stale()]
        if stale:
            async with trio.open_nursery() as nursery:
                for server in stale:
                    nursery.start_soon(functools.partial(server.relist_tools, if_stale=True))

    def command_infos(self) -> list[w.CommandInfo]:
        """The servers' prompts, as ``get_commands`` lists them (`forged._mcp.prompts`)."""
        return command_infos(self.servers.values())

    def names_prompt(self, text: str) -> bool:
        """Whether `text` is a command naming a server's prompt (``/mcp__<server>__…``),
        which `render` renders."""
        return server_named(self.servers.values(), text) is not None

    async def render(self, text: str) -> str:
        """The text of the server's prompt `text` names, as the model gets it;
        `CommandError` when it cannot be had."""
        server = server_named(self.servers.values(), text)
        if server is None:
            raise CommandError(f"No MCP server has the prompt {text.split()[0]}")
        return await render(server, text)

    def restart_stdio(self, reason: str) -> None:
        """Stop the stdio servers that run (the permission mode changed how they start):
        each starts again, as the mode now says, on its next use."""
        for server in self.servers.values():
            if server.spec.transport == "stdio" and server.session is not None:
                server.lose(reason)

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
                name = suffixed(name, f"{server.spec.name}/{listed.name}")
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
            return await bounded_result(w.ToolResult(
                content=content or [w.TextContent(text="(empty resource)")]), ctx)

        return [
            make_tool(name="list_mcp_resources", snippet="List MCP servers' resources",
                      description="List the resources MCP servers offer, as JSON (server, uri, "
                      "name, mimeType). Give server to list one server's only.",
                      parameters={"type": "object", "properties": {"server": {
                          "type": "string", "description": "One server's name"}}},
                      parse=dict, run=list_resources),
            make_tool(name="read_mcp_resource", snippet="Read an MCP server's resource",
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

    return make_tool(name=name, snippet=description.splitlines()[0] if description else name,
                     description=f"{description}\n\n(MCP server {server.spec.name}, tool "
                     f"{listed.name})", parameters=listed.input_schema, parse=dict, run=run)
