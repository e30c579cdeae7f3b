"""Configured values: an API key, a header or an MCP server's setting as written in
models.json or mcp.json, read as the ancestor reads it (``$NAME``, ``${NAME}``, a variable's
bare name, ``!command``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from functools import partial

import trio

from ._errors import ValueCommandFailed
from ._log import log
from ._process import run_value_command

_command_values: dict[str, str | None] = {}
"""Each ``!command`` value's output (None: it failed), run once per process."""
_commands_running: dict[str, tuple[trio.lowlevel.TrioToken, trio.Event]] = {}


def resolve_value(value: str | None) -> str | None:
    """An API key or header value, as the ancestor resolves it: ``!command`` is the trimmed
    output of the command (run once per process, 10 s at most; None if it fails);
    ``$NAME`` and ``${NAME}`` in a value are environment variables (``$$`` is ``$``, ``$!``
    is ``!``; None if one is unset); a value that names a set environment variable is its
    value; anything else is the value itself.

    A ``!command`` not run yet is run here, blocking: call it in a worker thread, or call
    `resolve_commands` first (`value_now` never runs one)."""
    if value and value.startswith("!") and value not in _command_values:
        _command_values[value] = _run_command(value[1:])
    return value_now(value)


def not_run_yet(value: str | None) -> bool:
    """`value` is a ``!command`` whose command has not run in this process."""
    return value is not None and value.startswith("!") and value not in _command_values


def value_now(value: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """`resolve_value` without running a command: a ``!command`` not run yet is None. `env`
    adds variables (before the process's) for ``$NAME`` references."""
    if not value:
        return None
    if value.startswith("!"):
        return _command_values.get(value)
    if "$" in value:
        return _interpolate(value, env or {})
    return os.environ.get(value, value)


async def resolve_commands(values: Iterable[str | None]) -> None:
    """Run the ``!command`` values among `values` not run yet, in worker threads: the loop
    goes on meanwhile. One run per command, whoever else waits for it; a caller cancelled
    while waiting leaves the command to finish (its value is kept)."""
    token = trio.lowlevel.current_trio_token()
    for value in values:
        if not value or not value.startswith("!") or value in _command_values:
            continue
        running = _commands_running.get(value)
        if running is None or running[0] is not token:  # none, or one of an ended trio run
            done = trio.Event()
            _commands_running[value] = (token, done)

            def finished(_: object, value: str = value, done: trio.Event = done) -> None:
                def settle() -> None:
                    if _commands_running.get(value, (None, None))[1] is done:
                        del _commands_running[value]
                    done.set()

                try:
                    token.run_sync_soon(settle)
                except trio.RunFinishedError:
                    pass

            trio.lowlevel.start_thread_soon(partial(resolve_value, value), finished,
                                            name="forged !command")
            running = (token, done)
        await running[1].wait()


def _run_command(command: str) -> str | None:
    try:
        return run_value_command(command)
    except (OSError, ValueCommandFailed) as exc:
        log(f"the command !{command} gave no value: {exc}")
        return None


_REFERENCE = re.compile(r"\$(?:([$!])|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _interpolate(value: str, env: Mapping[str, str]) -> str | None:
    missing = False

    def replace(match: re.Match[str]) -> str:
        nonlocal missing
        if match.group(1):
            return match.group(1)
        name = match.group(2) or match.group(3)
        found = env.get(name) or os.environ.get(name)
        missing = missing or not found
        return found or ""

    resolved = _REFERENCE.sub(replace, value)
    return None if missing else resolved
