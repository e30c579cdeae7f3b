"""Where output goes: fd 1 carries protocol lines only, and every diagnostic is one
``forged: <message>`` line on stderr, flushed (journald keeps each line as one entry)."""

from __future__ import annotations

import os
import sys
import traceback


def log(message: str) -> None:
    print(f"forged: {message}", file=sys.stderr, flush=True)


def log_exception(message: str, exc: BaseException) -> None:
    """`message`, then `exc`'s traceback: a bug, or a failure of someone else's code (a
    plugin's)."""
    log(message)
    traceback.print_exception(exc, file=sys.stderr)


def reserve_stdout() -> int:
    """Keep fd 1 for protocol lines only: return a duplicate of it for the writer and point fd 1
    at stderr, so a stray print or a child process cannot corrupt the stream."""
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol_fd
