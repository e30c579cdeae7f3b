"""What a connected server offers, as forged lists it: its tools (every page, without those no
model API would take, each name once) and its prompts (each with its arguments in their
declared order), through the SDK's client of the connection (`forged._mcp.eras`).

A 2026-07-28 server says in a listing's ``ttlMs`` how long it stays fresh; the handshake era
has no such hint, its listings stay until the server says they changed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._log import log
from .cache import ListedPrompt, ListedTool, PromptArgument
from .sieve import object_schema

T = TypeVar("T")


async def _pages(fetch: Callable[[str | None], Awaitable[Any]]) -> list[Any]:
    """Every page of a listing: `fetch` given each next cursor (a cursor seen before ends
    it: a server whose pages never end cannot hold a connection)."""
    pages: list[Any] = []
    cursor: str | None = None
    seen: set[str] = set()
    while True:
        page = await fetch(cursor)
        pages.append(page)
        cursor = page.next_cursor
        if not cursor or cursor in seen:
            return pages
        seen.add(cursor)


async def list_tools(client: Any, server: str) -> tuple[list[ListedTool], float | None]:
    """The server's tools, and for how many seconds the listing is fresh (its first page's
    ``ttlMs``; None when the answer has none, as in the handshake era)."""
    pages = await _pages(lambda cursor: client.list_tools(cursor=cursor))
    tools: list[ListedTool] = []
    names: set[str] = set()
    for tool in (tool for page in pages for tool in page.tools):
        if tool.name in names:
            continue
        names.add(tool.name)
        listed = _listed(tool)
        if listed is None:
            log(f"MCP server {server}: tool {tool.name!r} skipped: its inputSchema is not "
                "a JSON schema of an object")
        else:
            tools.append(listed)
    first = pages[0]
    return tools, first.ttl_ms / 1000 if "ttl_ms" in first.model_fields_set else None


def _listed(tool: Any) -> ListedTool | None:
    """The SDK's ``Tool`` as kept; None when its schema is not an object's (valid from MCP
    2026-07-28 on, but a model API would refuse every request that offered it)."""
    schema = tool.input_schema
    if not object_schema(schema) or not tool.name:
        return None
    return ListedTool(name=tool.name, description=tool.description,
                      input_schema={"type": "object", **schema})


async def list_prompts(client: Any) -> list[ListedPrompt]:
    """The server's prompts, each name once."""
    pages = await _pages(lambda cursor: client.list_prompts(cursor=cursor))
    prompts: dict[str, ListedPrompt] = {}
    for prompt in (prompt for page in pages for prompt in page.prompts):
        if prompt.name and prompt.name not in prompts:
            prompts[prompt.name] = ListedPrompt(
                name=prompt.name, description=prompt.description,
                arguments=[PromptArgument(name=argument.name,
                                          description=argument.description,
                                          required=bool(argument.required))
                           for argument in prompt.arguments or []])
    return list(prompts.values())


async def if_offered(offered: bool | None, listing: Callable[[], Awaitable[T]], none: T, *,
                     server: str, what: str) -> T:
    """What `listing` lists unless the server said it offers none (`offered` False; None:
    it was not asked). An error answer, or one that is no listing, is none either way,
    said on stderr where the server had said it offers some: a server is not failed for
    its prompts."""
    if offered is False:
        return none
    from mcp.shared.exceptions import MCPError

    try:
        return await listing()
    except (MCPError, ValueError) as exc:  # an error answer, or one that is no listing
        if offered:
            why = exc.error.message if isinstance(exc, MCPError) else type(exc).__name__
            log(f"MCP server {server}: listing its {what} failed ({why})")
        return none


async def has_resources(client: Any) -> bool:
    """True once ``resources/list`` answers (it raises when the server has none)."""
    await client.list_resources()
    return True
