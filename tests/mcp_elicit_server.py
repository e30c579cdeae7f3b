"""An MCP server that asks the user, on the official SDK's server side, for the tests::

    python mcp_elicit_server.py ERA

on stdin and stdout. ERA is ``dual`` (2026-07-28 to a client that opens with it: its
questions ride input-required results) or ``handshake`` (the 2025-11-25 handshake only: its
questions are ``elicitation/create`` requests).

Its tools: ``sign_up`` asks a form (``name``, ``age``, ``color`` of red or blue, ``subscribe``
yes or no) and says what came back; ``link`` asks the user to open a page and says what they
answered.
"""

from __future__ import annotations

import sys
from typing import Annotated, Literal

import anyio
import mcp_types as types
from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp_eras_server import handshake_only, serve_stdio  # type: ignore[import-not-found]
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

PAGE = "https://accounts.example.test/link?code=4711"


class SignUp(BaseModel):
    name: str = Field(description="as on your badge")
    age: int
    color: Literal["red", "blue"]
    subscribe: bool


def ask_sign_up() -> Elicit[SignUp]:
    return Elicit("Sign up for the build notices", SignUp)


def build(era: str) -> MCPServer:
    server = MCPServer("asker", middleware=[] if era == "dual" else [handshake_only(era)])

    @server.tool(description="Sign the user up")
    async def sign_up(answer: Annotated[ElicitationResult[SignUp], Resolve(ask_sign_up)],
                      ctx: Context) -> str:
        if answer.action == "accept":
            data = answer.data
            return (f"{ctx.protocol_version}: accepted {data.name}, {data.age}, {data.color}, "
                    f"{'subscribed' if data.subscribe else 'not subscribed'}")
        return f"{ctx.protocol_version}: {answer.action}"

    @server.tool(description="Link the user's account")
    async def link(ctx: Context) -> str | types.InputRequiredResult:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            given = ctx.input_responses or {}
            if "page" not in given:
                return types.InputRequiredResult(input_requests={"page": types.ElicitRequest(
                    params=types.ElicitRequestURLParams(
                        message="Open the page to link your account", url=PAGE))},
                    request_state="asked")
            action = given["page"].action  # type: ignore[union-attr]
        else:
            answered = await ctx.elicit_url("Open the page to link your account", PAGE, "e1")
            action = answered.action
        return f"{ctx.protocol_version}: page {action}"

    return server


def main() -> None:
    era = sys.argv[1]
    anyio.run(serve_stdio, build(era), era)


if __name__ == "__main__":
    main()
