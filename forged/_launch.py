"""How a mode's main function runs: under `trio.run`, with telemetry around it when the user
turned it on (`forged._otel`), and its exit code from how it ended."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ._errors import ForgedError
from ._log import log


def mark_process() -> None:
    """What every process forged starts inherits, as the ancestor's do: ``AI_AGENT`` names
    the agent, ``PI_CODING_AGENT`` says a pi-compatible agent runs it."""
    os.environ["AI_AGENT"] = "forged"
    os.environ["PI_CODING_AGENT"] = "true"


def run_reporting(main: Callable[..., Awaitable[int | None]], *args: Any,
                  caller: bool = False) -> int:
    """`trio.run(main, *args)`: its exit code (0 when it returns none), or 1 with the errors
    on stderr when it failed on purpose (a bad --model, a locked session...). With telemetry
    on, observed (`caller`: under ``TRACEPARENT``)."""
    from . import _telemetry

    if (telemetry := _telemetry.wanted()) is not None:
        from ._otel import observed

        main = observed(main, telemetry, caller=_telemetry.caller_from_env() if caller else None)
    try:
        return trio.run(main, *args) or 0
    except (ForgedError, BaseExceptionGroup) as exc:
        problems = _startup_errors(exc)
        if not problems:
            raise
        for problem in problems:
            log(str(problem))
        return 1


def _startup_errors(exc: BaseException) -> list[ForgedError]:
    """The errors forged raised on purpose that `exc` is made of (a bad --model, a locked
    session...), or [] if it holds anything else (a bug: the traceback is shown)."""
    if isinstance(exc, ForgedError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        found = [_startup_errors(inner) for inner in exc.exceptions]
        if all(found):
            return [error for errors in found for error in errors]
    return []
