"""A server's answers as the model gets them: a ``tools/call`` result's content as a tool
result, its text bounded (the whole of a longer one kept in a file)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import attrs
import trio

from .. import _wire as w
from .._tools import ToolContext
from .._tools.base import ScratchDir

RESULT_TEXT_LIMIT = 20 * 1024
"""Characters of a result's text the model gets, as in the ancestor."""


def tool_result(result: Any) -> w.ToolResult:
    """A ``tools/call`` result's text, images and resources as a tool result (the caller
    makes one with ``isError`` a failure)."""
    content = [content_of(block) for block in result.content]
    structured = result.structured_content if isinstance(result.structured_content,
                                                         dict) else None
    return w.ToolResult(content=content or [w.TextContent(text="(no output)")],
                        structured_content=structured)


def content_of(block: Any) -> w.UserContent:
    """One content block of a server's (a tool result's, a prompt message's): text and
    images as they are, an embedded resource's text in a ``<resource>`` element, a link
    as a Markdown link, anything else named in brackets."""
    kind = getattr(block, "type", "")
    if kind == "text":
        return w.TextContent(text=block.text)
    if kind == "image":
        return w.ImageContent(data=block.data, mime_type=block.mime_type)
    if kind == "resource":
        inner = block.resource
        text = getattr(inner, "text", None)
        return w.TextContent(
            text=f"<resource uri=\"{inner.uri}\">\n{text}\n</resource>" if text is not None
            else f"[binary resource {inner.uri} ({inner.mime_type or 'unknown type'})]")
    if kind == "resource_link":
        return w.TextContent(text=f"[{block.name}]({block.uri})")
    return w.TextContent(text=f"[{kind or 'unknown'} content]")


async def bounded_result(result: w.ToolResult, ctx: ToolContext) -> w.ToolResult:
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
