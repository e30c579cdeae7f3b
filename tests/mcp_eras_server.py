"""An MCP server of one protocol era, on the official SDK's server side, for the tests::

    python mcp_eras_server.py TRANSPORT ERA NAME [--tools-ttl-ms MS] [--no-listen]
                              [--exit-if FILE]

TRANSPORT is ``stdio`` (on stdin and stdout) or ``http`` (streamable HTTP on 127.0.0.1; it
prints its port first). ERA is what it speaks:

``dual``       the SDK's default: MCP 2026-07-28 (``server/discover``, ``subscriptions/listen``)
               to a client that opens with it, the 2025-11-25 handshake to one that does not
``legacy``     the handshake only; it answers ``server/discover`` naming only 2025-11-25 (a
               legacy advertisement, as go-sdk's stateful servers send)
``handshake``  the handshake only; ``server/discover`` is a method it does not know

``--tools-ttl-ms`` is the ``ttlMs`` its ``tools/list`` answers carry (2026-07-28; 0, the SDK's
default, is "stale at once"); ``--no-listen`` leaves ``subscriptions/listen`` unserved;
``--exit-if FILE`` exits at once (status 3) when FILE exists.

Its tools: ``echo`` (text; logs ``echoing TEXT`` at info), ``era`` (the protocol version of
the request), ``grow`` (offers one more tool, ``extra``, and says so: a list-changed
notification on a handshake connection, a ``subscriptions/listen`` event on a 2026-07-28
one), ``sneak`` (offers one more tool, ``sneaked``, telling nobody), ``exit`` (the process
exits mid-call). Its prompts: ``review``
(``file``, required; ``focus``, optional), rendered as two messages; ``broken``, which fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import AssistantMessage, Message, UserMessage
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


def build(name: str, speaks: str, tools_ttl_ms: int, listen: bool) -> MCPServer:
    server = MCPServer(name, instructions=f"The {name} {speaks} server.",
                       cache_hints={"tools/list": CacheHint(ttl_ms=tools_ttl_ms)},
                       subscriptions=None if listen else False,
                       middleware=[] if speaks == "dual" else [handshake_only(speaks)])

    @server.tool(description="Echo the text back")
    async def echo(text: str, ctx: Context) -> str:
        await ctx.info(f"echoing {text}")
        return f"{name} echo: {text}"

    @server.tool(description="The protocol version of this request")
    def era(ctx: Context) -> str:
        return f"{name} speaks {ctx.protocol_version}"

    @server.tool(description="Offer one more tool, extra, and tell the client")
    async def grow(ctx: Context) -> str:
        server.add_tool(lambda: "extra!", name="extra", description="Added by grow")
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await ctx.notify_tools_changed()
        else:
            await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool(description="Offer one more tool, sneaked, telling nobody")
    def sneak() -> str:
        server.add_tool(lambda: "sneaked!", name="sneaked", description="Added by sneak")
        return "sneaked"

    @server.tool(description="Exit in the middle of the call")
    def exit() -> str:
        os._exit(3)

    @server.prompt(description="Review a file")
    def review(file: str, focus: str = "everything") -> list[Message]:
        return [UserMessage(f"Review {file}, looking at {focus}."),
                AssistantMessage("I will read it first.")]

    @server.prompt(description="Always fails")
    def broken() -> str:
        raise MCPError(code=types.INVALID_PARAMS, message="the prompt broke")

    print(f"{name} started ({speaks}, pid {os.getpid()})", file=sys.stderr, flush=True)
    return server


def handshake_only(era: str) -> Any:
    """A middleware for a server of the handshake alone: ``server/discover`` answered with
    a legacy advertisement (`era` ``legacy``) or as a method it does not know."""
    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext
                         ) -> HandlerResult:
        if ctx.method != "server/discover":
            return await call_next(ctx)
        if era == "legacy":
            return types.DiscoverResult(
                supported_versions=["2025-11-25"], capabilities=types.ServerCapabilities(),
                result_type="complete", ttl_ms=0, cache_scope="private")
        raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found")

    return middleware


async def serve_stdio(server: MCPServer, era: str) -> None:
    if era == "dual":
        await server.run_stdio_async()
        return
    lowlevel = server._lowlevel_server
    async with stdio_server() as (read, write), lowlevel.lifespan(lowlevel) as state:
        await serve_loop(lowlevel, read, write, lifespan_state=state,
                         init_options=lowlevel.create_initialization_options())


async def serve_http(server: MCPServer) -> None:
    import socket

    import uvicorn

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # a client may connect as soon as it reads the port
    print(listener.getsockname()[1], flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    await uvicorn.Server(config).serve(sockets=[listener])


def main() -> None:
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)  # logging, on purpose
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("era", choices=["dual", "legacy", "handshake"])
    parser.add_argument("name")
    parser.add_argument("--tools-ttl-ms", type=int, default=0)
    parser.add_argument("--no-listen", action="store_true")
    parser.add_argument("--exit-if")
    args = parser.parse_args()
    if args.exit_if and os.path.exists(args.exit_if):
        sys.exit(3)
    server = build(args.name, args.era, args.tools_ttl_ms, not args.no_listen)
    if args.transport == "http":
        anyio.run(serve_http, server)
    else:
        anyio.run(serve_stdio, server, args.era)


if __name__ == "__main__":
    main()
