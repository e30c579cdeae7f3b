"""A ``!command`` API key must not stall the daemon: while one session's provider key runs
``sleep``, how long another client waits for ``list_sessions``. Run by hand:

    .venv/bin/python bench/key_command.py [--sleep-s 4]

Starts ``forged serve`` (the ``forged`` beside this Python, or ``python -m forged`` with
``PYTHONPATH`` set, to measure another checkout) with a models.json provider whose
``apiKey`` is ``!sleep N; echo key``; one client prompts a model of it, a second asks
``list_sessions`` over and over meanwhile. Reports the slowest and the median answer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from forged._providers.scripted import Reply, ScriptedServer, ScriptText
from forged.client import Client


async def measure(sleep_s: float) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        agent, project, run = root / "agent", root / "project", root / "run"
        for folder in (agent, project):
            folder.mkdir()
        socket_path = run / "forged" / "forged.sock"
        server = ScriptedServer([Reply(content=[ScriptText(text="done")])])
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            (agent / "models.json").write_text(json.dumps({"providers": {"slow": {
                "baseUrl": server.base_url, "api": "anthropic-messages",
                "apiKey": f"!sleep {sleep_s:g}; echo key", "models": [{"id": "m"}]}}}))
            env = {**os.environ, "AGENT_FORGE_DIR": str(agent), "XDG_RUNTIME_DIR": str(run)}
            daemon = subprocess.Popen(  # noqa: ASYNC220 (once, before the measure)
                [sys.executable, "-m", "forged", "serve", "--socket", str(socket_path)],
                env=env, cwd=project, stderr=subprocess.DEVNULL)
            try:
                while not socket_path.exists():  # noqa: ASYNC110 (another process's socket)
                    await trio.sleep(0.01)
                async with Client.open_unix(socket_path) as first, \
                        Client.open_unix(socket_path) as second:
                    await first.new_session(cwd=str(project), model="slow/m")
                    nursery.start_soon(first.prompt, "hi")  # answered once it has a key
                    await trio.sleep(0.1)  # sent: the key command runs
                    waits = []
                    until = time.perf_counter() + sleep_s
                    while time.perf_counter() < until:
                        started = time.perf_counter()
                        await second.list_sessions()
                        waits.append(time.perf_counter() - started)
                        await trio.sleep(0.01)
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait()
            nursery.cancel_scope.cancel()
    return max(waits), statistics.median(waits), len(waits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sleep-s", type=float, default=4.0)
    args = parser.parse_args()
    slowest, median, count = trio.run(measure, args.sleep_s)
    print(f"key command sleeping {args.sleep_s:g} s: another client's list_sessions, "
          f"{count} asked: slowest {slowest * 1000:.1f} ms, median {median * 1000:.1f} ms")


if __name__ == "__main__":
    main()
