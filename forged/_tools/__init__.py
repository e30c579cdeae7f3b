"""The tools the model can call: ``read``, ``write``, ``edit``, ``bash``, ``grep``, ``find``,
``ls``. Each takes an attrs class of parameters, from which its schema is made
(`forged._tools.base.typed_tool`); every tool's arguments, a plugin's too, are checked by
`parse_arguments`. The built-in tools' modules load at their first use (`builtin_tools`): a
session chooses its tools by name."""

from __future__ import annotations

import fnmatch
import functools
import json
from collections.abc import Collection

import attrs

from .. import _wire as w
from .._settings import DEFAULTS
from .base import (
    Arguments as Arguments,
    InvalidArguments as InvalidArguments,
    Tool as Tool,
    ToolContext as ToolContext,
    ToolError as ToolError,
    make_tool as make_tool,
    text_result as text_result,
)

BUILTIN_NAMES = ("read", "bash", "edit", "write", "grep", "find", "ls")


@functools.cache
def builtin_tools() -> dict[str, Tool]:
    """The built-in tools by name, in `BUILTIN_NAMES`' order."""
    from .bash import BASH
    from .files import EDIT, LS, READ, WRITE
    from .search import FIND, GREP

    return {tool.name: tool for tool in (READ, BASH, EDIT, WRITE, GREP, FIND, LS)}


def parse_arguments(tool: Tool, arguments: w.JSONObject) -> Arguments:
    """What the tool's `run` takes from a call's `arguments` (built-in and plugin tools alike),
    or `ToolError` with the problems and the arguments as received."""
    try:
        return tool.parse(arguments)
    except InvalidArguments as exc:
        listed = "\n".join(f"  - {problem}" for problem in exc.problems)
        raise ToolError(f'Validation failed for tool "{tool.name}":\n{listed}\n\n'
                        f"Received arguments:\n{json.dumps(arguments, indent=2)}") from None


DEFAULT_TOOLS = tuple(DEFAULTS["defaultTools"])
"""What the model gets when nothing chooses otherwise, as in the ancestor."""
MCP_RESOURCE_TOOLS = ("list_mcp_resources", "read_mcp_resource")
"""MCP tools as much as the servers' own ``mcp__<server>__<tool>``."""
READING_TOOLS = frozenset({"read", "grep", "find", "ls", *MCP_RESOURCE_TOOLS})
"""Tools that never change a file: calling them takes no checkpoint."""


def is_mcp_tool(name: str) -> bool:
    return name.startswith("mcp__") or name in MCP_RESOURCE_TOOLS


def _matches(patterns: list[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolChoice:
    """Which tools a session's model gets: ``--tools``, ``--no-tools``, ``--no-builtin-tools``,
    ``--exclude-tools`` and the ``defaultTools`` setting."""

    tools: list[str] | None = None
    """Names or ``*`` patterns (the whole set), or only ``+name``/``-name`` entries (changes to
    the default set)."""
    no_tools: bool = False
    no_builtin_tools: bool = False
    exclude: list[str] = attrs.Factory(list)
    default: list[str] | None = None
    """The ``defaultTools`` setting: plain names replace `DEFAULT_TOOLS`, ``+name``/``-name``
    entries change it."""

    def keeps_mcp(self, name: str) -> bool:
        """Whether the MCP tool `name` reaches the model. A ``--tools`` list filters MCP tools
        only once one of its entries starts with ``mcp__`` (or with ``--no-tools``: then only
        the ones it names); ``-name`` entries and ``--exclude-tools`` remove them."""
        entries = self.tools or []
        named = [entry.lstrip("+") for entry in entries if not entry.startswith("-")]
        removed = [entry[1:] for entry in entries if entry.startswith("-")]
        if _matches(self.exclude, name) or _matches(removed, name):
            return False
        if self.no_tools or (not _modifiers_only(entries)
                             and any(entry.startswith("mcp__") for entry in entries)):
            return _matches(named, name)
        return True


def _modifiers_only(names: list[str]) -> bool:
    return bool(names) and all(name[:1] in ("+", "-") for name in names)


def _apply(base: list[str], modifiers: list[str]) -> list[str]:
    names = list(base)
    for entry in modifiers:
        name = entry[1:]
        if entry[0] == "+" and name and name not in names:
            names.append(name)
        elif entry[0] == "-" and name in names:
            names.remove(name)
    return names


def select_tools(plugin_tools: Collection[str], choice: ToolChoice
                 ) -> tuple[list[str], list[str]]:
    """The names of the tools the model gets, built-ins first, and the names `choice` asks
    for that no tool has. Plugin tools (named in `plugin_tools`) are added on top unless a
    plain ``--tools`` list leaves them out or ``--no-tools`` is given."""
    default = list(DEFAULT_TOOLS)
    if choice.default is not None:
        plain = [name for name in choice.default if name[:1] not in ("+", "-")]
        default = _apply(plain if plain or not choice.default else default, choice.default)
    if choice.no_tools or choice.no_builtin_tools:
        default = []
    wanted: list[str]
    allowed: list[str] | None  # for plugin tools; None: all of them
    if choice.tools is not None and _modifiers_only(choice.tools):
        wanted = _apply(default, choice.tools)
        removed = {entry[1:] for entry in choice.tools if entry[0] == "-"}
        allowed = wanted if choice.no_tools else [
            name for name in plugin_tools if name not in removed]
    elif choice.tools is not None:
        wanted = allowed = choice.tools
    else:
        wanted, allowed = default, ([] if choice.no_tools else None)

    chosen = [name for name in BUILTIN_NAMES if _matches(wanted, name)]
    chosen += [name for name in plugin_tools
               if name not in chosen and (allowed is None or _matches(allowed, name))]
    chosen = [name for name in chosen if not _matches(choice.exclude, name)]
    known = {*BUILTIN_NAMES, *plugin_tools}
    asked = [entry.lstrip("+-") for entry in [*(choice.tools or []), *(choice.default or [])]]
    unknown = [name for name in dict.fromkeys(asked)
               if "*" not in name and name not in known and not is_mcp_tool(name)]
    return chosen, unknown
