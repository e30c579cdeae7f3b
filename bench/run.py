"""forged's speed and memory, measured against the scripted provider. Run by hand:

    .venv/bin/python bench/run.py [--repeat N]

Each figure comes from a real `forged --mode rpc` child over pipes; the scripted server runs in
this process, so the time a delta left the server and the time its event reached the client
are read from one clock. Prints a table with the targets beside the figures.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import trio

import forged
from forged._providers.scripted import (
    Reply,
    ScriptedServer,
    ScriptText,
    ScriptToolCall,
    ScriptUsage,
)
from forged._tools.bash import live_group_members

FORGED = str(Path(sys.executable).parent / "forged")


def calibration_ms() -> float:
    """How long this machine takes for a fixed piece of pure Python, right now: on a
    shared virtual machine the same run's CPU seconds vary by half from hour to hour."""
    started = time.perf_counter()
    sum(range(5_000_000))
    return (time.perf_counter() - started) * 1000


def memory_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Child:
    """A forged child; `lines` holds (receive time, parsed line) for everything it wrote."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.stdout_bytes = 0
        self._buffer = b""
        self._cursor = 0

    async def send(self, command: dict[str, Any]) -> float:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(orjson.dumps(command) + b"\n")
        return time.perf_counter()

    async def until(self, predicate: Callable[[dict[str, Any]], bool]) -> float:
        """Receive time of the next line, after those already matched, that satisfies
        `predicate`."""
        assert self.process.stdout is not None
        while True:
            while self._cursor < len(self.lines):
                received, event = self.lines[self._cursor]
                self._cursor += 1
                if predicate(event):
                    return received
            data = await self.process.stdout.receive_some(1 << 20)
            if not data:
                raise RuntimeError("forged exited")
            now = time.perf_counter()
            self.stdout_bytes += len(data)
            *complete, self._buffer = (self._buffer + data).split(b"\n")
            self.lines.extend((now, orjson.loads(line)) for line in complete)

    async def close(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        with trio.move_on_after(10):
            await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()


async def spawn(args: list[str], env: dict[str, str], cwd: Path) -> Child:
    process = await trio.lowlevel.open_process(
        [FORGED, "--mode", "rpc", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=None if os.environ.get("BENCH_STDERR") else subprocess.DEVNULL, env=env, cwd=cwd)
    return Child(process)


def is_type(kind: str) -> Callable[[dict[str, Any]], bool]:
    return lambda event: event.get("type") == kind


def is_delta(event: dict[str, Any]) -> bool:
    return (event.get("type") == "message_update"
            and event["assistantMessageEvent"]["type"] == "text_delta")


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.agent_dir = root / "agent"
        self.agent_dir.mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
        self.env["AGENT_FORGE_DIR"] = str(self.agent_dir)

    async def with_server(self, replies: list[Reply], body: Any) -> Any:
        server = ScriptedServer(replies, record_sends=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            (self.agent_dir / "models.json").write_text(json.dumps({"providers": {"bench": {
                "baseUrl": server.base_url, "api": "anthropic-messages", "apiKey": "k",
                "models": [{"id": "m"}]}}}))
            child = await spawn(["--model", "bench/m"], self.env, self.root)
            try:
                return await body(child, server)
            finally:
                await child.close()
                nursery.cancel_scope.cancel()

    async def cold_start(self) -> dict[str, float]:
        (self.agent_dir / "models.json").unlink(missing_ok=True)
        started = time.perf_counter()
        child = await spawn([], self.env, self.root)
        await child.send({"id": "s", "type": "get_state"})
        answered = await child.until(is_type("response"))
        await trio.sleep(0.2)
        rss = memory_kb(child.process.pid, "VmRSS")
        await child.close()
        return {"cold_ms": (answered - started) * 1000, "idle_mb": rss / 1024}

    async def throughput(self) -> dict[str, float]:
        warm_up = Reply(content=[ScriptText(text="warm")])
        reply = Reply(content=[ScriptText(text="abcdefgh" * 20_000, chunks=20_000)])

        async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
            # The first prompt imports the SDK (seconds, once per process): timed apart.
            sent = await child.send({"id": "w", "type": "prompt", "message": "warm up"})
            first_prompt = await child.until(is_type("agent_settled")) - sent
            lines_before, bytes_before = len(child.lines), child.stdout_bytes
            sent = await child.send({"id": "p", "type": "prompt", "message": "go"})
            settled = await child.until(is_type("agent_settled"))
            peak = memory_kb(child.process.pid, "VmHWM")
            deltas = sum(1 for _, e in child.lines[lines_before:] if is_delta(e))
            seconds = settled - sent
            return {"deltas": deltas, "seconds": seconds, "first_prompt_s": first_prompt,
                    "events_per_s": (len(child.lines) - lines_before) / seconds,
                    "bytes_per_delta": (child.stdout_bytes - bytes_before) / deltas,
                    "peak_mb": peak / 1024}

        result: dict[str, float] = await self.with_server([warm_up, reply], body)
        return result

    async def latency(self) -> dict[str, float]:
        reply = Reply(content=[ScriptText(text="abcdefgh" * 200, chunks=200, delay_ms=5)])

        async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            await child.until(is_type("agent_settled"))
            sent = [at for at, data in server.sends if b'"text_delta"' in data
                    for _ in range(data.count(b'"text_delta"'))]
            received = [at for at, event in child.lines if is_delta(event)]
            added = sorted((r - s) * 1000 for s, r in zip(sent, received, strict=True))
            return {"p50_ms": statistics.median(added),
                    "p99_ms": added[min(len(added) - 1, int(len(added) * 0.99))],
                    "samples": len(added)}

        result: dict[str, float] = await self.with_server([reply], body)
        return result

    async def abort_stream(self) -> dict[str, float]:
        reply = Reply(content=[ScriptText(text="x" * 4000, chunks=4000, delay_ms=5)])

        async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            await child.until(is_delta)
            sent = await child.send({"id": "a", "type": "abort"})
            answered = await child.until(lambda e: e.get("id") == "a")
            await child.until(is_type("agent_settled"))
            return {"abort_stream_ms": (answered - sent) * 1000}

        result: dict[str, float] = await self.with_server([reply], body)
        return result

    async def abort_bash(self) -> dict[str, float]:
        reply = Reply(content=[ScriptToolCall(name="bash",
                                              arguments={"command": "echo $$; sleep 60"})])

        async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            await child.until(is_type("tool_execution_update"))
            update = next(e for _, e in child.lines if e["type"] == "tool_execution_update")
            pgid = int(update["partialResult"]["content"][0]["text"].split()[0])
            sent = await child.send({"id": "a", "type": "abort"})
            answered = await child.until(lambda e: e.get("id") == "a")
            survivors = len(live_group_members(pgid))
            await child.until(is_type("agent_settled"))
            return {"abort_bash_ms": (answered - sent) * 1000, "survivors": survivors}

        result: dict[str, float] = await self.with_server([reply], body)
        return result


    async def abort_retry_wait(self) -> dict[str, float]:
        """A 529 starts a 2 s retry wait; abort ends it."""
        reply = Reply(status=529, error_type="overloaded_error", error_message="Overloaded")

        async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            await child.until(is_type("auto_retry_start"))
            sent = await child.send({"id": "a", "type": "abort"})
            answered = await child.until(lambda e: e.get("id") == "a")
            await child.until(is_type("agent_settled"))
            return {"abort_retry_ms": (answered - sent) * 1000}

        result: dict[str, float] = await self.with_server([reply], body)
        return result

    async def abort_compaction(self) -> dict[str, float]:
        """Abort during a manual compaction's summary stream, during an automatic (threshold)
        one's, and during a summarization retry wait."""
        slow = Reply(content=[ScriptText(text="x" * 4000, chunks=4000, delay_ms=5)])
        overloaded = Reply(status=529, error_type="overloaded_error", error_message="Overloaded")
        full = Reply(content=[ScriptText(text="a full context")],
                     usage=ScriptUsage(input=10_000_000))
        result: dict[str, float] = {}

        async def abort(child: Child, key: str, wait_for: str) -> None:
            await child.until(is_type(wait_for))
            await trio.sleep(0.1)
            sent = await child.send({"id": key, "type": "abort"})
            result[key] = (await child.until(lambda e: e.get("id") == key) - sent) * 1000

        async def manual(child: Child, server: ScriptedServer) -> None:
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            await child.until(is_type("agent_settled"))
            await child.send({"id": "c", "type": "compact"})
            await abort(child, "abort_manual_compaction_ms", "compaction_start")

        async def automatic(child: Child, server: ScriptedServer) -> None:
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            await abort(child, "abort_auto_compaction_ms", "compaction_start")
            await child.until(is_type("agent_settled"))

        async def summary_retry(child: Child, server: ScriptedServer) -> None:
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            await child.until(is_type("agent_settled"))
            await child.send({"id": "c", "type": "compact"})
            await abort(child, "abort_summary_retry_ms", "summarization_retry_scheduled")

        await self.with_server([Reply(content=[ScriptText(text="hi")]), slow], manual)
        await self.with_server([full, slow], automatic)
        await self.with_server([Reply(content=[ScriptText(text="hi")]), overloaded],
                               summary_retry)
        return result

    async def direct_bash(self) -> dict[str, float]:
        """``bash`` with `seq 1 2000000` (14 MB streamed as events), then an abort_bash."""
        child = await spawn(["--no-session"], self.env, self.root)
        sent = await child.send({"id": "b", "type": "bash", "command": "seq 1 2000000"})
        answered = await child.until(lambda e: e.get("id") == "b")
        peak = memory_kb(child.process.pid, "VmHWM")
        await child.send({"id": "s", "type": "bash", "command": "sleep 60"})
        await trio.sleep(0.3)
        aborted = await child.send({"id": "a", "type": "abort_bash"})
        stopped = await child.until(lambda e: e.get("id") == "s")
        await child.close()
        return {"bash_s": answered - sent, "bash_peak_mb": peak / 1024,
                "abort_direct_bash_ms": (stopped - aborted) * 1000}

    async def session_open(self) -> dict[str, float]:
        """A 100,000-entry session (about 110 MB): open it, then page it by cursor."""
        path = self.root / "big.jsonl"
        write_big_session(path, 100_000)
        started = time.perf_counter()
        child = await spawn(["--session", str(path)], self.env, self.root)
        await child.send({"id": "s", "type": "get_state"})
        answered = await child.until(lambda e: e.get("id") == "s")
        result = {"open_s": answered - started, "size_mb": path.stat().st_size / 1e6,
                  "open_rss_mb": memory_kb(child.process.pid, "VmRSS") / 1024}
        for name, since in (("since_last_ms", 99_999), ("since_100_ms", 99_899)):
            sent = await child.send({"id": name, "type": "get_entries", "since": f"{since:08x}"})
            result[name] = (await child.until(lambda e, n=name: e.get("id") == n) - sent) * 1000
        other = self.root / "other.jsonl"
        write_big_session(other, 10)
        for name, target in (("switch_away_ms", other), ("switch_back_s", path)):
            sent = await child.send({"id": name, "type": "switch_session",
                                     "sessionPath": str(target)})
            result[name] = await child.until(lambda e, n=name: e.get("id") == n) - sent
        result["switch_away_ms"] *= 1000
        sent = await child.send({"id": "x", "type": "export_html"})
        result["export_s"] = await child.until(lambda e: e.get("id") == "x") - sent
        await child.close()
        return result


def write_big_session(path: Path, count: int) -> None:
    text = "lorem ipsum dolor sit amet " * 36
    usage = {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 2,
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}
    with open(path, "wb") as file:
        file.write(orjson.dumps({"type": "session", "version": 3, "id": "big", "cwd": "/",
                                 "timestamp": "2026-01-01T00:00:00.000Z"}) + b"\n")
        parent = None
        for index in range(count):
            message: dict[str, Any] = {"role": "user", "timestamp": 1,
                                       "content": [{"type": "text", "text": text}]}
            if index % 2:
                message.update(role="assistant", api="a", provider="p", model="m",
                               usage=usage, stopReason="stop")
            entry_id = f"{index:08x}"
            file.write(orjson.dumps({"type": "message", "id": entry_id, "parentId": parent,
                                     "timestamp": "2026-01-01T00:00:00.000Z",
                                     "message": message}) + b"\n")
            parent = entry_id


def best(runs: list[dict[str, float]], key: str, *, highest: bool = False) -> float:
    values = [run[key] for run in runs]
    return max(values) if highest else min(values)


async def main(repeat: int) -> None:
    # As `pip install` does: forged's modules compiled, so no run pays for compiling them.
    compileall.compile_dir(str(Path(forged.__file__).parent), quiet=1)
    rows: list[tuple[str, str, str]] = []
    speeds = [calibration_ms()]
    with tempfile.TemporaryDirectory() as directory:
        runs: dict[str, list[dict[str, float]]] = {}
        for name in ("cold_start", "throughput", "latency", "abort_stream", "abort_bash",
                     "abort_retry_wait", "abort_compaction", "direct_bash", "session_open"):
            for index in range(repeat):
                root = Path(directory) / f"{name}-{index}"
                root.mkdir()
                runs.setdefault(name, []).append(await getattr(Bench(root), name)())
        speeds.append(calibration_ms())
    cold, thr, lat = runs["cold_start"], runs["throughput"], runs["latency"]
    median = statistics.median
    rows += [
        ("cold start to first get_state", f"{median(r['cold_ms'] for r in cold):.0f} ms",
         "< 300 ms"),
        ("idle memory (RSS)", f"{median(r['idle_mb'] for r in cold):.1f} MB", "< 60 MB"),
        ("first prompt (imports the SDK)", f"{median(r['first_prompt_s'] for r in thr):.2f} s",
         ""),
        ("20,000 x 8 B deltas: prompt to settled",
         f"{median(r['seconds'] for r in thr):.2f} s", ""),
        ("  events per second", f"{median(r['events_per_s'] for r in thr):,.0f}", ">= 20,000"),
        ("  stdout bytes per delta", f"{median(r['bytes_per_delta'] for r in thr):.0f}",
         "< 400"),
        ("  peak memory (VmHWM)", f"{median(r['peak_mb'] for r in thr):.1f} MB", "< 150 MB"),
        ("200 deltas 5 ms apart: added latency p50",
         f"{median(r['p50_ms'] for r in lat):.2f} ms", ""),
        ("  added latency p99", f"{median(r['p99_ms'] for r in lat):.2f} ms", "< 1.5 ms"),
        ("abort mid-stream", f"{median(r['abort_stream_ms'] for r in runs['abort_stream']):.1f}"
         " ms", "< 20 ms"),
        ("abort mid-bash (sleep 60)",
         f"{median(r['abort_bash_ms'] for r in runs['abort_bash']):.1f} ms", "< 50 ms"),
        ("  processes left after abort",
         f"{max(r['survivors'] for r in runs['abort_bash']):.0f}", "0"),
        ("abort during a retry wait",
         f"{median(r['abort_retry_ms'] for r in runs['abort_retry_wait']):.1f} ms", "< 50 ms"),
        *[(label, f"{median(r[key] for r in runs['abort_compaction']):.1f} ms", "< 50 ms")
          for label, key in (("abort during a manual compaction", "abort_manual_compaction_ms"),
                             ("abort during an automatic compaction",
                              "abort_auto_compaction_ms"),
                             ("abort during a summarization retry wait",
                              "abort_summary_retry_ms"))],
        ("direct bash seq 1 2000000: to the response",
         f"{median(r['bash_s'] for r in runs['direct_bash']):.2f} s", "< 1 s"),
        ("  peak memory (VmHWM)",
         f"{median(r['bash_peak_mb'] for r in runs['direct_bash']):.1f} MB", "< 80 MB"),
        ("abort_bash (sleep 60) to the bash response",
         f"{median(r['abort_direct_bash_ms'] for r in runs['direct_bash']):.1f} ms", "< 50 ms"),
        (f"open a 100,000-entry session ({runs['session_open'][0]['size_mb']:.0f} MB): "
         "start to get_state", f"{median(r['open_s'] for r in runs['session_open']):.2f} s",
         "< 2 s"),
        ("  memory after opening",
         f"{median(r['open_rss_mb'] for r in runs['session_open']):.1f} MB", ""),
        ("  get_entries since the last entry",
         f"{median(r['since_last_ms'] for r in runs['session_open']):.2f} ms", ""),
        ("  get_entries since 100 from the end",
         f"{median(r['since_100_ms'] for r in runs['session_open']):.2f} ms", ""),
        ("  switch_session to a 10-entry session",
         f"{median(r['switch_away_ms'] for r in runs['session_open']):.1f} ms", ""),
        ("  switch_session back to it",
         f"{median(r['switch_back_s'] for r in runs['session_open']):.2f} s", "< 2 s"),
        ("  export_html of it",
         f"{median(r['export_s'] for r in runs['session_open']):.1f} s", ""),
        ("this machine's speed: sum(range(5_000_000)) took, before / after",
         f"{speeds[0]:.0f} / {speeds[-1]:.0f} ms", ""),
    ]
    width = max(len(row[0]) for row in rows)
    print(f"{'measure':<{width}}  {'forged':>12}  target   (median of {repeat})")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>12}  {target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    trio.run(main, parser.parse_args().repeat)
