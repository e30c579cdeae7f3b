"""What the sandbox costs: a ``true`` through the bash tool, and ``abort`` of a ``sleep`` to
``agent_end``, in ``full-access`` and in ``auto`` (bubblewrap), alternating so noise falls on
both alike. Run by hand:

    .venv/bin/python bench/sandbox.py [--runs 50]

Starts ``forged --mode rpc`` (``python -m forged``: set ``PYTHONPATH`` to measure another
checkout) on the scripted provider. A tool call is timed from its ``tool_execution_start`` to
its ``tool_execution_end`` as the client reads them; an abort from writing ``abort`` to
reading ``agent_end``. Reports min, median and max of each, and the medians' difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

MODES = ("full-access", "auto")


class Rpc:
    """``forged --mode rpc`` as a process: lines in, objects out."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""
        self._counter = 0

    async def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self._counter += 1
        line = json.dumps({"id": f"b{self._counter}", **command}).encode() + b"\n"
        await self.process.stdin.send_all(line)

    async def until(self, kind: str, text: str | None = None) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            while b"\n" not in self._buffer:
                chunk = await self.process.stdout.receive_some(1 << 16)
                if not chunk:
                    raise RuntimeError("forged ended")
                self._buffer += chunk
            line, self._buffer = self._buffer.split(b"\n", 1)
            event = json.loads(line)
            if event.get("type") == kind and (text is None or text in line.decode()):
                return event  # type: ignore[no-any-return]


def call(command: str) -> dict[str, Any]:
    return {"content": [{"type": "toolCall", "name": "bash",
                         "arguments": {"command": command}}]}


async def measure(runs: int) -> dict[str, dict[str, list[float]]]:
    done = {"content": [{"type": "text", "text": "ok"}]}
    replies = [step for _ in range(2 * runs) for step in (call("true"), done)]
    replies += [call("echo started; sleep 100") for _ in range(2 * runs)]
    timings: dict[str, dict[str, list[float]]] = {
        "true": {mode: [] for mode in MODES}, "abort": {mode: [] for mode in MODES}}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "agent").mkdir()
        (root / "project").mkdir()
        script = root / "script.json"
        script.write_text(json.dumps({"api": "anthropic-messages", "replies": replies}))
        env = {**os.environ, "AGENT_FORGE_DIR": str(root / "agent")}
        async with trio.open_nursery() as nursery:
            process = await nursery.start(partial(
                trio.run_process,
                [sys.executable, "-m", "forged", "--mode", "rpc", "--no-session",
                 "--provider", "scripted", "--script", str(script)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=env, cwd=root / "project", check=False))
            rpc = Rpc(process)
            for index in range(2 * runs):
                mode = MODES[index % 2]
                await rpc.send({"type": "set_permission_mode", "mode": mode})
                await rpc.send({"type": "prompt", "message": "go"})
                await rpc.until("tool_execution_start")
                started = time.perf_counter()
                end = await rpc.until("tool_execution_end")
                timings["true"][mode].append((time.perf_counter() - started) * 1000)
                assert not end["isError"], end
                await rpc.until("agent_settled")
            for index in range(2 * runs):
                mode = MODES[index % 2]
                await rpc.send({"type": "set_permission_mode", "mode": mode})
                await rpc.send({"type": "prompt", "message": "go"})
                await rpc.until("tool_execution_update", "started")
                started = time.perf_counter()
                await rpc.send({"type": "abort"})
                await rpc.until("agent_end")
                timings["abort"][mode].append((time.perf_counter() - started) * 1000)
                await rpc.until("agent_settled")
            assert process.stdin is not None
            await process.stdin.aclose()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    timings = trio.run(measure, args.runs)
    for what, by_mode in timings.items():
        medians = {}
        for mode, values in by_mode.items():
            medians[mode] = statistics.median(values)
            print(f"{what:6} {mode:12} n={len(values)} min {min(values):7.2f} ms  "
                  f"median {medians[mode]:7.2f} ms  max {max(values):7.2f} ms")
        print(f"{what:6} auto - full-access: {medians['auto'] - medians['full-access']:+.2f} ms "
              "(median)")


if __name__ == "__main__":
    main()
