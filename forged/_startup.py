"""Start-up's one trick with the interpreter: the cyclic collector paused while forged's
modules load.

Importing trio and forged makes ~40,000 objects that live as long as the process; with the
collector on, the allocations run a dozen collections over them, ~13 ms of a ~200 ms start.
`collector_paused` turns it off for an import and, after it, moves what the import made into
the collector's permanent generation (`gc.freeze`) before turning it on again, so later
collections never scan them either. A few cycles an import leaves behind stay with them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()
