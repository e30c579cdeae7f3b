"""The one way forged writes a diagnostic line: ``forged: <message>`` on stderr, flushed, one
line per entry (journald keeps each line as one entry)."""

from __future__ import annotations

import sys


def log(message: str) -> None:
    print(f"forged: {message}", file=sys.stderr, flush=True)
