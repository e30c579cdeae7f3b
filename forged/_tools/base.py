"""What every tool shares: its shape, its context, path resolution and output truncation."""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import tempfile
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar, overload

import attrs
import cattrs

from .. import _codec, _wire as w
from .._errors import InvalidArguments as InvalidArguments, ToolError as ToolError
from .._process import Stopping

MAX_LINES = 2000
MAX_BYTES = 50 * 1024

P = TypeVar("P")
"""A tool's parameters, as its `run` takes them."""
A = TypeVar("A", bound=attrs.AttrsInstance)
"""A built-in tool's parameters: an attrs class (`typed_tool`)."""
T = TypeVar("T")


@attrs.define(kw_only=True, frozen=True)
class Shell:
    """How commands are run (settings ``shellPath`` and ``shellCommandPrefix``): `path` (default
    bash, else sh) with ``-c``, `prefix` and a newline before every command."""

    path: str | None = None
    prefix: str | None = None

    @classmethod
    def from_settings(cls, path: object, prefix: object) -> Shell:
        return cls(path=path if isinstance(path, str) and path else None,
                   prefix=prefix if isinstance(prefix, str) and prefix else None)

    def argv(self, command: str) -> list[str]:
        shell = self.path or ("/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh")
        return [shell, "-c", f"{self.prefix}\n{command}" if self.prefix else command]


class ScratchDir:
    """A private temporary folder, made on first use (`path`), for files a session's tools
    keep for it (a command's full output).

    Resource handling: whoever owns it calls `remove`, which deletes the folder and what it
    holds (a session, when it ends)."""

    def __init__(self) -> None:
        self._path: Path | None = None

    def path(self) -> Path:
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix="forged-"))
        return self._path

    def remove(self) -> None:
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


class ClientFiles(Protocol):
    """The client's view of the files (an editor's, over ACP): ``read``, ``write`` and ``edit``
    go through it instead of the disk, so the model sees and edits the unsaved buffers.
    Failures are raised as `ToolError`."""

    async def read_text(self, path: Path) -> str: ...
    async def write_text(self, path: Path, text: str) -> None: ...


class Permissions(Protocol):
    """What the session's permission mode lets a tool do (`forged._tools.guard.Guard`):
    each answers how, or raises `ToolError` saying why not."""

    mode: str
    """The permission mode's name."""

    @property
    def sandboxed(self) -> bool:
        """Whether the mode confines what runs (`after_command` then looks at what it left)."""

    async def command(self, argv: Sequence[str], command: str,
                      escalate: str | None = None) -> list[str]: ...
    async def search(self, argv: Sequence[str], cwd: Path) -> list[str]: ...
    def environment(self) -> dict[str, str] | None: ...
    async def after_command(self, start_ns: int) -> str: ...
    async def read(self, path: Path) -> Path: ...
    async def write(self, path: Path) -> Path: ...


@attrs.define(kw_only=True, eq=False, repr=False)
class ToolContext:
    cwd: Path
    update: Callable[[w.ToolResult], None]
    shell: Shell = Shell()
    scratch: ScratchDir | None = None
    """Where kept files go (else the system's temporary folder, never removed)."""
    aborted_result: w.ToolResult | None = None
    """Set by a tool before it lets an abort through: the result the interrupted call gets."""
    env: Mapping[str, str | None] = attrs.Factory(dict)
    """What a command the tool runs sees of the session (``PI_SESSION_ID``, ...; None:
    unset), over forged's own environment."""
    files: ClientFiles | None = None
    """Where text files are read and written, when not on the disk."""
    guard: Permissions | None = None
    """The session's permission mode, which every tool the model calls obeys (None: full
    access, as a tool run alone has)."""
    stopping: Stopping | None = None
    """Where an aborted call's command goes to end, waited for before the run's
    ``agent_end`` instead of before the call's result (None: the tool waits itself)."""


@attrs.define(kw_only=True, eq=False, repr=False)
class Arguments:
    """A call's arguments as its tool takes them, bound to the tool's run."""

    params: object
    """The tool's parameters: a built-in tool's attrs class, a plugin's or an MCP server's
    JSON object."""
    run: Callable[[ToolContext], Awaitable[w.ToolResult]]


@attrs.define(kw_only=True, eq=False, repr=False)
class Tool:
    """A tool the model can call. `parameters` is the JSON schema the model is shown; `parse`
    turns a call's arguments into the `Arguments` `run` takes, or raises `InvalidArguments`.
    Made by `make_tool`, where the tool's parameters have their type."""

    name: str
    description: str
    snippet: str  # the one line the system prompt lists the tool with
    parameters: w.JSONObject
    parse: Callable[[w.JSONObject], Arguments]

    async def run(self, arguments: Arguments, context: ToolContext) -> w.ToolResult:
        return await arguments.run(context)


def make_tool(*, name: str, description: str, snippet: str, parameters: w.JSONObject,
              parse: Callable[[w.JSONObject], P],
              run: Callable[[P, ToolContext], Awaitable[w.ToolResult]]) -> Tool:
    """A tool whose `parse` gives the parameters its `run` takes."""
    def bind(arguments: w.JSONObject) -> Arguments:
        params = parse(arguments)
        return Arguments(params=params, run=functools.partial(run, params))

    return Tool(name=name, description=description, snippet=snippet, parameters=parameters,
                parse=bind)


def text_result(text: str, details: w.JSONObject | None = None,
                structured: w.JSONObject | None = None) -> w.ToolResult:
    return w.ToolResult(content=[w.TextContent(text=text)], details=details,
                        structured_content=structured)


# --- typed parameters --------------------------------------------------------------------------

@overload
def param(description: str) -> str: ...
@overload
def param(description: str, default: T) -> T: ...
def param(description: str, default: object = attrs.NOTHING) -> object:
    """A field of a tool's parameter class, with the description the model reads; without a
    default, a required one (text: every required parameter is)."""
    return attrs.field(default=default, metadata={"description": description})


_JSON_TYPES: dict[object, str] = {str: "string", int: "number", float: "number",
                                  bool: "boolean"}


def typed_tool(*, name: str, snippet: str, description: str, params: type[A],
               run: Callable[[A, ToolContext], Awaitable[w.ToolResult]]) -> Tool:
    """A built-in tool whose parameters are the attrs class `params`: the schema the model
    sees is made from it (camelCase names, its descriptions, required when without default)
    and its arguments are converted into it, coerced as JSON-schema validators coerce
    (``"5"`` is 5)."""
    properties: w.JSONObject = {}
    required: list[str] = []
    for field in attrs.fields(attrs.resolve_types(params)):
        kinds = [kind for kind in typing.get_args(field.type) if kind is not type(None)]
        json_name = _codec.camel(field.name)
        properties[json_name] = {"type": _JSON_TYPES[kinds[0] if kinds else field.type],
                                 "description": field.metadata["description"]}
        if field.default is attrs.NOTHING:
            required.append(json_name)
    schema: w.JSONObject = {"type": "object", "properties": properties, "required": required,
                            "additionalProperties": False}
    return make_tool(name=name, snippet=snippet, description=description, parameters=schema,
                     parse=functools.partial(_structure, params), run=run)


def _structure(params: type[A], arguments: w.JSONObject) -> A:
    try:
        return _params_converter().structure(arguments, params)
    except cattrs.BaseValidationError as exc:
        raise InvalidArguments(_codec.describe_error(exc).split("; ")) from None
    except (TypeError, ValueError) as exc:
        raise InvalidArguments([str(exc)]) from None


def _coerce_int(value: object, _: object) -> int:
    if type(value) is bool:
        raise ValueError("expected an integer")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, int):
        return value
    raise ValueError("expected an integer")


def _coerce_float(value: object, _: object) -> float:
    if type(value) is bool or not isinstance(value, str | int | float):
        raise ValueError("expected a number")
    try:
        return float(value)
    except ValueError:
        raise ValueError("expected a number") from None


def _coerce_bool(value: object, _: object) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return bool(value == "true")
    raise ValueError("expected a boolean")


@functools.cache
def _params_converter() -> cattrs.Converter:
    """The wire converter, lenient with numbers and booleans as models write them; made at
    the first tool call, off start-up."""
    converter = _codec.new_converter()
    converter.register_structure_hook(int, _coerce_int)
    converter.register_structure_hook(float, _coerce_float)
    converter.register_structure_hook(bool, _coerce_bool)
    return converter


_UNICODE_SPACES = "[\u00a0\u2000-\u200a\u202f\u205f\u3000]"  # compiled at its first use


def resolve_path(path: str, cwd: Path) -> Path:
    """A tool's path argument: ``@`` and odd spaces stripped, ``~`` expanded, relative to cwd."""
    path = re.sub(_UNICODE_SPACES, " ", path.removeprefix("@"))
    if path == "~" or path.startswith("~/"):
        path = os.path.expanduser(path)
    resolved = Path(path)
    return resolved if resolved.is_absolute() else cwd / resolved


# --- truncation --------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class Truncation:
    truncated: bool
    truncated_by: str | None = w.keep_null(None)
    total_lines: int
    total_bytes: int
    output_lines: int
    output_bytes: int
    last_line_partial: bool = False
    first_line_exceeds_limit: bool = False
    max_lines: int = MAX_LINES
    max_bytes: int = MAX_BYTES

    def details(self) -> w.JSONObject:
        details: w.JSONObject = _codec.unstructure(self)
        return details


def format_size(size: int) -> str:
    if size < 1024:
        return f"{size}B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f}KB"
    return f"{size / (1024 * 1024):.1f}MB"


def _take_lines(lines: Iterable[str], max_lines: int, max_bytes: int) -> tuple[list[str], str]:
    """Whole lines, in the order given, while both limits hold; and which limit stopped it."""
    kept: list[str] = []
    size = 0
    for line in lines:
        if len(kept) >= max_lines:
            return kept, "lines"
        cost = len(line.encode()) + (1 if kept else 0)
        if size + cost > max_bytes:
            return kept, "bytes"
        kept.append(line)
        size += cost
    return kept, "lines"


def listing_result(entries: list[str], notices: list[str], details: w.JSONObject,
                   last_notice: str | None = None) -> w.ToolResult:
    """A list of lines (ls, grep, find) cut at `MAX_BYTES`, the notices in one bracket after:
    `notices`, then the size limit's, then `last_notice`."""
    text, truncation = truncate_head("\n".join(entries), max_lines=sys.maxsize)
    if truncation.truncated:
        details["truncation"] = truncation.details()
        notices.append(f"{format_size(MAX_BYTES)} limit reached")
    if last_notice:
        notices.append(last_notice)
    if notices:
        text += f"\n\n[{'. '.join(notices)}]"
    return text_result(text, details or None)


def truncate_head(text: str, max_lines: int = MAX_LINES,
                  max_bytes: int = MAX_BYTES) -> tuple[str, Truncation]:
    """Keep whole leading lines within both limits."""
    total_bytes = len(text.encode())
    lines = text.split("\n")
    if len(lines) <= max_lines and total_bytes <= max_bytes:
        return text, Truncation(truncated=False, total_lines=len(lines), total_bytes=total_bytes,
                                output_lines=len(lines), output_bytes=total_bytes)
    if len(lines[0].encode()) > max_bytes:
        return "", Truncation(truncated=True, truncated_by="bytes", total_lines=len(lines),
                              total_bytes=total_bytes, output_lines=0, output_bytes=0,
                              first_line_exceeds_limit=True)
    kept, by = _take_lines(lines, max_lines, max_bytes)
    out = "\n".join(kept)
    return out, Truncation(truncated=True, truncated_by=by, total_lines=len(lines),
                           total_bytes=total_bytes, output_lines=len(kept),
                           output_bytes=len(out.encode()))


def truncate_tail(text: str, max_lines: int = MAX_LINES,
                  max_bytes: int = MAX_BYTES) -> tuple[str, Truncation]:
    """Keep whole trailing lines within both limits (or the end of an over-long last line)."""
    encoded = text.encode()
    total_bytes = len(encoded)
    lines = text.split("\n")
    if len(lines) <= max_lines and total_bytes <= max_bytes:
        return text, Truncation(truncated=False, total_lines=len(lines), total_bytes=total_bytes,
                                output_lines=len(lines), output_bytes=total_bytes)
    last = lines[-1].encode()
    if len(last) > max_bytes:
        tail = last[-max_bytes:].decode("utf-8", "ignore")
        return tail, Truncation(truncated=True, truncated_by="bytes", total_lines=len(lines),
                                total_bytes=total_bytes, output_lines=1,
                                output_bytes=len(tail.encode()), last_line_partial=True)
    kept, by = _take_lines(reversed(lines), max_lines, max_bytes)
    kept.reverse()
    out = "\n".join(kept)
    return out, Truncation(truncated=True, truncated_by=by, total_lines=len(lines),
                           total_bytes=total_bytes, output_lines=len(kept),
                           output_bytes=len(out.encode()))
