"""The tools the model can call: ``read``, ``write``, ``edit``, ``bash``, ``grep``, ``find``,
``ls``. Each takes attrs-typed parameters, converted (and coerced, as JSON-schema validators
do: ``"5"`` is 5) by a second converter configured like the wire one."""

from __future__ import annotations

import json
from typing import Any

import cattrs

from .. import _codec
from .base import Tool as Tool
from .base import ToolContext as ToolContext
from .base import ToolError as ToolError
from .base import text_result as text_result
from .bash import BASH
from .files import EDIT, LS, READ, WRITE
from .search import FIND, GREP

BUILTIN_TOOLS: dict[str, Tool] = {tool.name: tool for tool in (READ, BASH, EDIT, WRITE, GREP,
                                                               FIND, LS)}


def _coerce_int(value: Any, _: Any) -> int:
    if type(value) is bool:
        raise ValueError("expected an integer")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, int):
        return value
    raise ValueError("expected an integer")


def _coerce_float(value: Any, _: Any) -> float:
    if type(value) is bool:
        raise ValueError("expected a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number") from None


def _coerce_bool(value: Any, _: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return bool(value == "true")
    raise ValueError("expected a boolean")


_converter = _codec.new_converter()
_converter.register_structure_hook(int, _coerce_int)
_converter.register_structure_hook(float, _coerce_float)
_converter.register_structure_hook(bool, _coerce_bool)


def parse_arguments(tool: Tool, arguments: dict[str, Any]) -> Any:
    """The tool's parameters, or `ToolError` with the validation failures and the arguments."""
    try:
        return _converter.structure(arguments, tool.params_type)
    except cattrs.BaseValidationError as exc:
        problems = _codec.describe_error(exc).split("; ")
    except (TypeError, ValueError) as exc:
        problems = [str(exc)]
    listed = "\n".join(f"  - {problem}" for problem in problems)
    raise ToolError(f'Validation failed for tool "{tool.name}":\n{listed}\n\n'
                    f"Received arguments:\n{json.dumps(arguments, indent=2)}")

