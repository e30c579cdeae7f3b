"""The tools the model can call: ``read``, ``write``, ``edit``, ``bash``, ``grep``, ``find``,
``ls``. Each takes an attrs class of parameters, from which its schema is made
(`forged._tools.base.typed_tool`); every tool's arguments, a plugin's too, are checked by
`parse_arguments`."""

from __future__ import annotations

import json
from typing import Any

from .base import InvalidArguments as InvalidArguments
from .base import Tool as Tool
from .base import ToolContext as ToolContext
from .base import ToolError as ToolError
from .base import text_result as text_result
from .bash import BASH
from .files import EDIT, LS, READ, WRITE
from .search import FIND, GREP

BUILTIN_TOOLS: dict[str, Tool] = {tool.name: tool for tool in (READ, BASH, EDIT, WRITE, GREP,
                                                               FIND, LS)}


def parse_arguments(tool: Tool, arguments: dict[str, Any]) -> Any:
    """What the tool's `run` takes from a call's `arguments` (built-in and plugin tools alike),
    or `ToolError` with the problems and the arguments as received."""
    try:
        return tool.parse(arguments)
    except InvalidArguments as exc:
        listed = "\n".join(f"  - {problem}" for problem in exc.problems)
        raise ToolError(f'Validation failed for tool "{tool.name}":\n{listed}\n\n'
                        f"Received arguments:\n{json.dumps(arguments, indent=2)}") from None
