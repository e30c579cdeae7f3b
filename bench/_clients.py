"""The clients of `bench/daemon.py` during the measured run, in a process of their own.

Run by daemon.py, never by hand: ``_clients.py SPREAD_MS FIRST,SECOND ...`` with the two
connected socket descriptors of each session (passed open). Each first descriptor is sent
its session's prompt, at a random moment within SPREAD_MS; then every descriptor is read,
each chunk stamped with the moment it arrived, until all have seen ``agent_settled``. The
chunks go to stdout (marshal) with this process's CPU seconds.

Doing nothing else keeps the stamps close to the moment the daemon's bytes arrived: in the
process that also runs the scripted server, the clients waited their turn behind it.
"""

from __future__ import annotations

import marshal
import os
import random
import selectors
import sys
import time

SETTLED = b'"type":"agent_settled"'


def main() -> None:
    spread_s = float(sys.argv[1]) / 1000
    pairs = [tuple(int(fd) for fd in arg.split(",")) for arg in sys.argv[2:]]
    starts = random.Random(6)
    now = time.perf_counter()
    prompts = sorted((now + starts.uniform(0, spread_s), index, first)
                     for index, (first, _) in enumerate(pairs))
    selector = selectors.DefaultSelector()
    chunks: dict[int, list[tuple[float, bytes]]] = {}
    tails: dict[int, bytes] = {}
    for pair in pairs:
        for fd in pair:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
            chunks[fd], tails[fd] = [], b""
    unsettled = len(chunks)
    while unsettled:
        now = time.perf_counter()
        while prompts and prompts[0][0] <= now:
            _, index, first = prompts.pop(0)
            os.write(first, b'{"id":"p%d","type":"prompt","message":"stream"}\n' % index)
        timeout = max(0.0, prompts[0][0] - now) if prompts else None
        for key, _ in selector.select(timeout):
            fd = int(key.fd)
            data = os.read(fd, 1 << 20)
            arrived = time.perf_counter()
            if not data:
                raise ConnectionError("the daemon closed a connection")
            chunks[fd].append((arrived, data))
            tail = tails[fd][-32:] + data
            tails[fd] = tail
            if SETTLED in tail:
                selector.unregister(fd)
                unsettled -= 1
    marshal.dump((chunks, time.process_time()), sys.stdout.buffer)


if __name__ == "__main__":
    main()
