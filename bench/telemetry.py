"""What telemetry (docs/observability.md) costs a run: the time from a prompt to its
``agent_settled`` in ``forged --mode rpc`` (the scripted provider; each run a command and a
reply), with telemetry off (``off``), on with a collector that answers (``on``: spans sent
every 5 s, the SDK's default; ``busy``: every 10 ms), and on with a collector that takes every
request and never answers (``dead``, every 10 ms); and the time to the first answer
(start-up). Run by
hand:

    .venv/bin/python bench/telemetry.py [--rounds 5] [--prompts 20] [--modes off,on,dead]

Rounds alternate the modes so noise spreads over all of them. For an A/B against another
checkout, run with ``PYTHONPATH=<that checkout>`` and ``--modes off``.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FORGED = str(Path(sys.executable).parent / "forged")


class _Collector(http.server.BaseHTTPRequestHandler):
    silent = False

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.silent:
            threading.Event().wait()  # never answers
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def collector(silent: bool) -> str:
    handler = type("Handler", (_Collector,), {"silent": silent})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def script(folder: Path, prompts: int) -> Path:
    replies = []
    for _ in range(prompts):
        replies.append({"content": [{"type": "toolCall", "name": "bash",
                                     "arguments": {"command": "echo hi"}}]})
        replies.append({"content": [{"type": "text", "text": "done", "chunks": 4}]})
    path = folder / "script.json"
    path.write_text(json.dumps({"replies": replies}))
    return path


def one_round(mode: str, endpoints: dict[str, str], prompts: int, folder: Path
              ) -> tuple[float, list[float]]:
    """Start-up (ms to the first answer) and each prompt's ms to its agent_settled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACE"))}
    env["AGENT_FORGE_DIR"] = str(folder / "agent")
    if mode != "off":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoints["dead" if mode == "dead" else "on"]
    if mode == "spans":  # made, not exported: what making them costs
        env["OTEL_TRACES_EXPORTER"] = env["OTEL_METRICS_EXPORTER"] = "none"
    if mode == "traces":
        env["OTEL_METRICS_EXPORTER"] = "none"
    if mode == "metrics":
        env["OTEL_TRACES_EXPORTER"] = "none"
    if mode in ("busy", "dead"):
        env["OTEL_BSP_SCHEDULE_DELAY"] = "10"  # export as often as it can: the worst case
    started = time.perf_counter()
    child = subprocess.Popen(
        [FORGED, "--mode", "rpc", "--provider", "scripted", "--script",
         str(script(folder, prompts)), "--no-session", "--permission-mode", "full-access"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        cwd=folder, env=env)
    assert child.stdin is not None and child.stdout is not None

    def send(command: dict[str, object]) -> None:
        assert child.stdin is not None
        child.stdin.write(json.dumps(command).encode() + b"\n")
        child.stdin.flush()

    def until(kind: str) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if json.loads(line).get("type") == kind:
                return
        raise RuntimeError(f"forged ended before {kind}")

    send({"type": "get_state"})
    until("response")
    startup = (time.perf_counter() - started) * 1000
    runs = []
    for _ in range(prompts):
        began = time.perf_counter()
        send({"type": "prompt", "message": "go"})
        until("agent_settled")
        runs.append((time.perf_counter() - began) * 1000)
    child.stdin.close()
    child.wait(timeout=30)
    return startup, runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--modes", default="off,on,busy,dead")
    args = parser.parse_args()
    modes = args.modes.split(",")
    endpoints = {"on": collector(False), "dead": collector(True)}
    startups: dict[str, list[float]] = {mode: [] for mode in modes}
    runs: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "agent").mkdir()
        for _ in range(args.rounds):
            for mode in modes:
                startup, timed = one_round(mode, endpoints, args.prompts, folder)
                startups[mode].append(startup)
                runs[mode].extend(timed[1:])  # the first run loads the run's modules
    for mode in modes:
        timed = sorted(runs[mode])
        print(f"{mode:5} start-up median {statistics.median(startups[mode]):6.1f} ms | run "
              f"min {timed[0]:5.1f} median {statistics.median(timed):5.1f} "
              f"p90 {timed[int(len(timed) * 0.9)]:5.1f} max {timed[-1]:5.1f} ms "
              f"({len(timed)} runs)")


if __name__ == "__main__":
    main()
