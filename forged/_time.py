"""The protocol's clock: timestamps are milliseconds since the Unix epoch."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
