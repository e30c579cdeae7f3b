"""An MCP server for the tests, on the official SDK's server side::

    python mcp_server.py stdio [NAME]     on stdin and stdout
    python mcp_server.py http [NAME]      streamable HTTP on 127.0.0.1; prints its port first
    python mcp_server.py flaky-http NAME  as http, answering every other POST with 503
    python mcp_server.py json-http NAME   as http, answering each request with JSON, not SSE
    python mcp_server.py silent           reads stdin and never answers (not even initialize)
    python mcp_server.py stdio NAME FILE  as stdio, or as silent once FILE exists

Its tools: ``echo`` (text), ``picture`` (an image), ``count`` (reports progress),
``count_slowly`` (takes its time, and reports progress as it goes), ``hang``
(never returns; says ``hang started`` on stderr, and ``hang cancelled`` when the client
cancels it), ``crash`` (the process exits mid-call), ``fail`` (an error result), ``flood``
(as much text as asked for), ``shout`` (as many lines on stderr), ``grow`` (offers one more
tool, ``extra``, and says so),
``echo-text`` and ``echo_text`` (names that collide once made tool names), ``traceparent``
(the trace context in the call's ``_meta``, and the server's ``TRACEPARENT``); one resource,
``note://hello``.
"""

from __future__ import annotations

import base64
import os
import socket
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Image

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def build(name: str) -> MCPServer:
    server = MCPServer(name, instructions=f"The {name} test server.\nIts tools are for tests.")

    @server.tool(description="Echo the text back")
    async def echo(text: str, ctx: Context) -> str:
        await ctx.info(f"echoing {text}")
        return f"{name} echo: {text}"

    @server.tool(description="A one-pixel picture")
    def picture() -> Image:
        return Image(data=PNG, format="png")

    @server.tool(description="Count to n, reporting each step")
    async def count(n: int, ctx: Context) -> str:
        for step in range(1, n + 1):
            await ctx.report_progress(step, n, f"step {step}")
        return f"counted to {n}"

    @server.tool(description="Count to n, a step every `every` seconds, reporting each")
    async def count_slowly(n: int, every: float, ctx: Context) -> str:
        for step in range(1, n + 1):
            await anyio.sleep(every)
            await ctx.report_progress(step, n)
        return f"counted slowly to {n}"

    @server.tool(description="Never return")
    async def hang() -> str:
        print("hang started", file=sys.stderr, flush=True)
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            print("hang cancelled", file=sys.stderr, flush=True)
            raise
        return ""

    @server.tool(description="Exit in the middle of the call")
    def crash() -> str:
        print(f"{name} is crashing", file=sys.stderr, flush=True)
        os._exit(3)

    @server.tool(description="Numbered lines, size characters in all")
    async def flood(size: int, ctx: Context) -> str:
        await ctx.debug(f"flooding {size}")  # a 2026-07-28 HTTP answer streams (SSE) after it
        return "".join(f"{n:07d}\n" for n in range(size // 8))

    @server.tool(description="Offer one more tool, extra, and tell the client")
    async def grow(ctx: Context) -> str:
        server.add_tool(lambda: "extra!", name="extra", description="Added by grow")
        await ctx.session.send_tool_list_changed()  # a handshake connection's notification
        await ctx.notify_tools_changed()  # a 2026-07-28 connection's subscriptions/listen event
        return "grown"

    @server.tool(description="Write n lines to stderr")
    def shout(n: int) -> str:
        for line in range(n):
            print(f"shouting, line {line} of {n}", file=sys.stderr)
        sys.stderr.flush()
        return f"shouted {n} lines"

    @server.tool(description="Fail")
    def fail() -> str:
        raise ValueError("it went wrong")

    @server.tool(name="echo-text", description="Echo, dashed")
    def echo_dashed(text: str) -> str:
        return f"dashed: {text}"

    @server.tool(name="echo_text", description="Echo, underscored")
    def echo_underscored(text: str) -> str:
        return f"underscored: {text}"

    @server.tool(description="The W3C trace context the call came with, from its _meta")
    def traceparent(ctx: Context) -> str:
        meta = ctx.request_context.meta or {}
        return (f"traceparent={meta.get('traceparent')} tracestate={meta.get('tracestate')} "
                f"started under={os.environ.get('TRACEPARENT')}")

    @server.resource("note://hello", description="A note")
    def hello() -> str:
        return "hello from a resource"

    print(f"{name} started (pid {os.getpid()})", file=sys.stderr, flush=True)
    return server


async def serve_http(server: MCPServer, flaky: bool, json_response: bool = False) -> None:
    import uvicorn

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    app = server.streamable_http_app(json_response=json_response)
    config = uvicorn.Config(every_other_post_fails(app) if flaky else app, log_level="warning")
    await uvicorn.Server(config).serve(sockets=[listener])


def every_other_post_fails(app: Any) -> Any:
    """`app`, answering 503 to the first POST, the third, and so on."""
    posts = 0

    async def flaky(scope: Any, receive: Any, send: Any) -> None:
        nonlocal posts
        if scope["type"] == "http" and scope["method"] == "POST":
            posts += 1
            if posts % 2:
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"try again"})
                return
        await app(scope, receive, send)

    return flaky


def main() -> None:
    mode = sys.argv[1]
    name = sys.argv[2] if len(sys.argv) > 2 else "tests"
    if mode == "silent" or (len(sys.argv) > 3 and os.path.exists(sys.argv[3])):
        sys.stdin.buffer.read()
    elif mode in ("http", "flaky-http", "json-http"):
        anyio.run(serve_http, build(name), mode == "flaky-http", mode == "json-http")
    else:
        build(name).run("stdio")


if __name__ == "__main__":
    main()
