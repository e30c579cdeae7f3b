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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11  # noqa: F401 (the scripted server's first connection would import it: ~8 ms)
import orjson
import trio

import forged
from forged._process import live_group_members
from forged._providers.scripted import (
    Reply,
    ScriptedServer,
    ScriptText,
    ScriptToolCall,
    ScriptUsage,
)

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
    """A forged child; `lines` holds (receive time, parsed line) for everything it wrote.

    Lines are parsed when looked at, and `until` looks only at those holding its predicate's
    `marker`: parsing each of 20,000 events here, in the process that also serves the
    provider, cost ~3 us an event, and forged waited for it about a third of the time."""

    def __init__(self, process: trio.Process, spawned: float) -> None:
        self.process = process
        self.spawned = spawned
        self.stdout_bytes = 0
        self._raw: list[tuple[float, bytes]] = []
        self._parsed: list[dict[str, Any]] = []
        self._buffer = b""
        self._cursor = 0

    @property
    def lines(self) -> list[tuple[float, dict[str, Any]]]:
        self._parsed.extend(orjson.loads(raw) for _, raw in self._raw[len(self._parsed):])
        return [(at, event) for (at, _), event in zip(self._raw, self._parsed, strict=True)]

    async def send(self, command: dict[str, Any]) -> float:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(orjson.dumps(command) + b"\n")
        return time.perf_counter()

    async def until(self, predicate: Callable[[dict[str, Any]], bool]) -> float:
        """Receive time of the next line, after those already matched, that satisfies
        `predicate`."""
        assert self.process.stdout is not None
        marker: bytes | None = getattr(predicate, "marker", None)
        while True:
            while self._cursor < len(self._raw):
                received, raw = self._raw[self._cursor]
                self._cursor += 1
                if (marker is None or marker in raw) and predicate(orjson.loads(raw)):
                    return received
            data = await self.process.stdout.receive_some(1 << 20)
            if not data:
                raise RuntimeError("forged exited")
            now = time.perf_counter()
            self.stdout_bytes += len(data)
            *complete, self._buffer = (self._buffer + data).split(b"\n")
            self._raw.extend((now, line) for line in complete)

    async def close(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        with trio.move_on_after(10):
            await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()


async def spawn(args: list[str], env: dict[str, str], cwd: Path, mode: str = "rpc") -> Child:
    spawned = time.perf_counter()
    process = await trio.lowlevel.open_process(
        [FORGED, "--mode", mode, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=None if os.environ.get("BENCH_STDERR") else subprocess.DEVNULL, env=env, cwd=cwd)
    return Child(process, spawned)


@asynccontextmanager
async def child_on_server(replies: list[Reply], agent_dir: Path,
                          start: Callable[[], Awaitable[Child]]
                          ) -> AsyncIterator[tuple[Child, ScriptedServer]]:
    """A scripted server playing `replies`, models.json's provider ``bench`` (model ``m``)
    pointing at it, and the child `start` spawns; both stopped after the block."""
    server = ScriptedServer(replies, record_sends=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        (agent_dir / "models.json").write_text(json.dumps({"providers": {"bench": {
            "baseUrl": server.base_url, "api": "anthropic-messages", "apiKey": "k",
            "models": [{"id": "m"}]}}}))
        child = await start()
        try:
            yield child, server
        finally:
            await child.close()
            nursery.cancel_scope.cancel()


class Kind:
    """Whether a line's ``type`` is `kind`; `marker` is in every line that is (`until`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.marker = orjson.dumps(kind)

    def __call__(self, event: dict[str, Any]) -> bool:
        return event.get("type") == self.kind


def is_type(kind: str) -> Kind:
    return Kind(kind)


class _Delta:
    """Whether a line is a reply's ``text_delta``."""

    marker = b'"text_delta"'

    def __call__(self, event: dict[str, Any]) -> bool:
        return (event.get("type") == "message_update"
                and event["assistantMessageEvent"]["type"] == "text_delta")


is_delta = _Delta()


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.agent_dir = root / "agent"
        self.agent_dir.mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
        self.env["AGENT_FORGE_DIR"] = str(self.agent_dir)

    async def with_server(self, replies: list[Reply], body: Any, mode: str = "rpc") -> Any:
        async with child_on_server(replies, self.agent_dir, lambda: spawn(
                ["--model", "bench/m"], self.env, self.root, mode)) as (child, server):
            return await body(child, server)

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

    async def first_token(self) -> dict[str, float]:
        """A fresh process: once it answers get_state, a prompt to its first text_delta; in
        another, the same prompt half a second later (its warm-up done, as when a person
        types the prompt); and, in a third, a prompt sent as it starts, to its first
        text_delta."""
        reply = Reply(content=[ScriptText(text="hello there", chunks=2)])

        async def after_get_state(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "s", "type": "get_state"})
            await child.until(is_type("response"))
            sent = await child.send({"id": "p", "type": "prompt", "message": "hi"})
            first = await child.until(is_delta)
            await child.until(is_type("agent_settled"))
            return {"first_token_ms": (first - sent) * 1000}

        async def after_a_pause(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "s", "type": "get_state"})
            await child.until(is_type("response"))
            await trio.sleep(0.5)
            sent = await child.send({"id": "p", "type": "prompt", "message": "hi"})
            first = await child.until(is_delta)
            await child.until(is_type("agent_settled"))
            return {"warm_first_token_ms": (first - sent) * 1000}

        async def at_once(child: Child, server: ScriptedServer) -> dict[str, float]:
            sent = await child.send({"id": "p", "type": "prompt", "message": "hi"})
            first = await child.until(is_delta)
            await child.until(is_type("agent_settled"))
            return {"spawn_to_first_token_ms": (first - child.spawned) * 1000,
                    "at_once_first_token_ms": (first - sent) * 1000}

        result: dict[str, float] = await self.with_server([reply], after_get_state)
        result |= await self.with_server([reply], after_a_pause)
        result |= await self.with_server([reply], at_once)
        return result

    async def throughput(self) -> dict[str, float]:
        """A fresh process's first prompt: 20,000 deltas of 1 byte each."""
        reply = Reply(content=[ScriptText(text="x" * 20_000, chunks=20_000)])

        async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "s", "type": "get_state"})
            await child.until(is_type("response"))
            sent = await child.send({"id": "p", "type": "prompt", "message": "go"})
            ended = await child.until(is_type("agent_end"))
            await child.until(is_type("agent_settled"))
            peak = memory_kb(child.process.pid, "VmHWM")
            lines = [event for _, event in child.lines]
            deltas = sum(1 for event in lines if is_delta(event))
            seconds = ended - sent
            return {"deltas": deltas, "seconds": seconds,
                    "events_per_s": len(lines) / seconds,
                    "bytes_per_delta": child.stdout_bytes / deltas, "peak_mb": peak / 1024}

        result: dict[str, float] = await self.with_server([reply], body)
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
        """Once the process answered get_state, a prompt; abort at its tenth delta."""
        reply = Reply(content=[ScriptText(text="x" * 4000, chunks=4000, delay_ms=5)])

        async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "s", "type": "get_state"})
            await child.until(is_type("response"))
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            for _ in range(10):
                await child.until(is_delta)
            sent = await child.send({"id": "a", "type": "abort"})
            ended = await child.until(is_type("agent_end"))
            answered = await child.until(lambda e: e.get("id") == "a")
            await child.until(is_type("agent_settled"))
            with trio.fail_after(10):
                while not server.closes:  # noqa: ASYNC110 (the server's own record)
                    await trio.sleep(0.001)
            return {"abort_stream_ms": (answered - sent) * 1000,
                    "abort_stream_end_ms": (ended - sent) * 1000,
                    "abort_stream_close_ms": (server.closes[0] - sent) * 1000}

        result: dict[str, float] = await self.with_server([reply], body)
        return result

    async def abort_bash(self) -> dict[str, float]:
        """Once the process answered get_state, a prompt whose bash tool call sleeps; abort
        once the command printed."""
        reply = Reply(content=[ScriptToolCall(name="bash",
                                              arguments={"command": "echo $$; sleep 60"})])

        async def body(child: Child, server: ScriptedServer) -> dict[str, float]:
            await child.send({"id": "s", "type": "get_state"})
            await child.until(is_type("response"))
            await child.send({"id": "p", "type": "prompt", "message": "go"})
            await child.until(is_type("tool_execution_update"))
            update = next(e for _, e in child.lines if e["type"] == "tool_execution_update")
            pgid = int(update["partialResult"]["content"][0]["text"].split()[0])
            while len(members := live_group_members(pgid)) < 2:  # noqa: ASYNC110 (shell, sleep)
                await trio.sleep(0.001)
            ends = [os.pidfd_open(pid) for pid in members]
            gone: list[float] = []

            async def watch() -> None:
                for fd in ends:
                    await trio.lowlevel.wait_readable(fd)
                gone.append(time.perf_counter())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                sent = await child.send({"id": "a", "type": "abort"})
                ended = await child.until(is_type("agent_end"))
            for fd in ends:
                os.close(fd)
            survivors = len(live_group_members(pgid))
            answered = await child.until(lambda e: e.get("id") == "a")
            await child.until(is_type("agent_settled"))
            return {"abort_bash_ms": (answered - sent) * 1000,
                    "abort_bash_end_ms": (ended - sent) * 1000, "survivors": survivors,
                    "abort_bash_group_ms": (gone[0] - sent) * 1000,
                    "abort_bash_after_group_ms": (ended - gone[0]) * 1000}

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

    async def acp(self) -> dict[str, float]:
        """``forged --mode acp``: a fresh process's first chunk after session/prompt,
        session/cancel to the prompt's answer, and session/load of a 10,000-entry session."""
        import forged._paths

        result: dict[str, float] = {}

        async def start(child: Child) -> str:
            await child.send(_rpc(0, "initialize", {"protocolVersion": 1}))
            await child.send(_rpc(1, "session/new", {"cwd": str(self.root), "mcpServers": []}))
            await child.until(lambda e: e.get("id") == 1)
            return str(child.lines[child._cursor - 1][1]["result"]["sessionId"])

        async def first_chunk(child: Child, server: ScriptedServer) -> None:
            sid = await start(child)
            sent = await child.send(_rpc(2, "session/prompt", {
                "sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}))
            first = await child.until(is_chunk)
            await child.until(lambda e: e.get("id") == 2)
            result["acp_first_chunk_ms"] = (first - sent) * 1000

        async def cancel(child: Child, server: ScriptedServer) -> None:
            sid = await start(child)
            await child.send(_rpc(2, "session/prompt", {
                "sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}))
            for _ in range(10):
                await child.until(is_chunk)
            sent = await child.send({"jsonrpc": "2.0", "method": "session/cancel",
                                     "params": {"sessionId": sid}})
            answered = await child.until(lambda e: e.get("id") == 2)
            result["acp_cancel_ms"] = (answered - sent) * 1000

        async def load(child: Child, server: ScriptedServer) -> None:
            await child.send(_rpc(0, "initialize", {"protocolVersion": 1}))
            sent = await child.send(_rpc(1, "session/load", {
                "sessionId": "big10k", "cwd": str(self.root), "mcpServers": []}))
            answered = await child.until(lambda e: e.get("id") == 1)
            result["acp_load_s"] = answered - sent
            result["acp_load_updates"] = sum(1 for _, e in child.lines
                                             if e.get("method") == "session/update")

        folder = forged._paths.session_dir_for(self.agent_dir, self.root)
        folder.mkdir(parents=True)
        write_big_session(folder / "2026-01-01T00-00-00-000Z_big10k.jsonl", 10_000,
                          session_id="big10k", cwd=str(self.root))
        await self.with_server([Reply(content=[ScriptText(text="hello there", chunks=2)])],
                               first_chunk, "acp")
        await self.with_server([Reply(content=[ScriptText(text="x" * 4000, chunks=4000,
                                                          delay_ms=5)])], cancel, "acp")
        await self.with_server([], load, "acp")
        return result

    async def mcp(self) -> dict[str, float]:
        """MCP servers (the tests' stdio server): the first get_state of a process with three
        configured against one with none; a warm server's tool call through forged against
        the same call from the SDK in this process; what 100 sequential calls leave behind."""
        server = [sys.executable, str(Path(__file__).parents[1] / "tests" / "mcp_server.py"),
                  "stdio"]
        config = self.agent_dir / "mcp.json"

        async def first_state(servers: int) -> float:
            config.write_text(json.dumps({"mcpServers": {
                f"s{n}": {"command": server[0], "args": [*server[1:], f"s{n}"]}
                for n in range(servers)}}))
            child = await spawn(["--no-session"], self.env, self.root)
            await child.send({"id": "s", "type": "get_state"})
            answered = await child.until(is_type("response"))
            await child.close()
            return (answered - child.spawned) * 1000

        pairs = [(await first_state(0), await first_state(3)) for _ in range(5)]
        result = {"mcp_state_none_ms": statistics.median(a for a, _ in pairs),
                  "mcp_state_three_ms": statistics.median(b for _, b in pairs)}
        config.write_text(json.dumps({"mcpServers": {"b": {"command": server[0],
                                                           "args": [*server[1:], "b"]}}}))
        calls = 100
        echo = [Reply(content=[ScriptToolCall(name="mcp__b__echo", arguments={"text": "x"})])
                for _ in range(calls)]

        async def body(child: Child, _: ScriptedServer) -> None:
            await child.send({"id": "m", "type": "get_mcp_servers"})
            await child.until(lambda e: e.get("id") == "m")
            pid = child.process.pid
            await child.send({"id": "p", "type": "prompt", "message": "warm"})
            await child.until(is_type("tool_execution_end"))
            fds, children = len(os.listdir(f"/proc/{pid}/fd")), _children(pid)
            times = []
            for _ in range(calls - 1):
                started = await child.until(is_type("tool_execution_start"))
                times.append((await child.until(is_type("tool_execution_end")) - started) * 1000)
            await child.until(is_type("agent_settled"))
            result["mcp_call_ms"] = statistics.median(times)
            result["mcp_fds_added"] = len(os.listdir(f"/proc/{pid}/fd")) - fds
            result["mcp_children_added"] = _children(pid) - children

        await self.with_server([*echo, Reply(content=[ScriptText(text="done")])], body)
        result["mcp_sdk_call_ms"] = await _sdk_call_ms(server)
        result["mcp_overhead_ms"] = result["mcp_call_ms"] - result["mcp_sdk_call_ms"]

        config.write_text(json.dumps({"mcpServers": {"mute": {
            "command": server[0], "args": [server[1], "silent", "mute"]}}}))
        reply = Reply(content=[ScriptText(text="hello there", chunks=2)])

        async def prompt_at_once(child: Child, _: ScriptedServer) -> float:
            await child.send({"id": "s", "type": "get_state"})
            await child.until(is_type("response"))
            sent = await child.send({"id": "p", "type": "prompt", "message": "hi"})
            first = await child.until(is_delta)
            await child.until(is_type("agent_settled"))
            return (first - sent) * 1000

        result["mcp_mute_first_token_ms"] = await self.with_server([reply], prompt_at_once)
        config.unlink()
        return result


def _children(pid: int) -> int:
    return sum(1 for entry in Path("/proc").iterdir() if entry.name.isdigit()
               and _parent(entry) == pid)


def _parent(entry: Path) -> int | None:
    try:
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


async def _sdk_call_ms(server: list[str]) -> float:
    """The same echo call from the SDK's own client in this process: the server's time."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    parameters = StdioServerParameters(command=server[0], args=[*server[1:], "sdk"])
    with open(os.devnull, "w") as quiet:
        async with stdio_client(parameters, errlog=quiet) as (read, write), ClientSession(
                read, write) as session:
            await session.initialize()
            await session.list_tools()
            times = []
            for _ in range(100):
                started = time.perf_counter()
                await session.call_tool("echo", {"text": "x"})
                times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _rpc(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def is_chunk(message: dict[str, Any]) -> bool:
    return message.get("method") == "session/update" and message["params"]["update"][
        "sessionUpdate"] == "agent_message_chunk"


def write_big_session(path: Path, count: int, *, session_id: str = "big",
                      cwd: str = "/") -> None:
    text = "lorem ipsum dolor sit amet " * 36
    usage = {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 2,
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}
    with open(path, "wb") as file:
        file.write(orjson.dumps({"type": "session", "version": 3, "id": session_id, "cwd": cwd,
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


BENCHES = ("cold_start", "first_token", "throughput", "latency", "abort_stream", "abort_bash",
           "abort_retry_wait", "abort_compaction", "direct_bash", "session_open", "acp", "mcp")


async def main(repeat: int, only: list[str]) -> None:
    # As `pip install` does: forged's modules compiled, so no run pays for compiling them.
    compileall.compile_dir(str(Path(forged.__file__).parent), quiet=1)
    speeds = [calibration_ms()]
    with tempfile.TemporaryDirectory() as directory:
        runs: dict[str, list[dict[str, float]]] = {}
        for name in only or BENCHES:
            for index in range(repeat):
                root = Path(directory) / f"{name}-{index}"
                root.mkdir()
                runs.setdefault(name, []).append(await getattr(Bench(root), name)())
        speeds.append(calibration_ms())
    # bench, label, key, unit, target, the ancestor's figure (pi 1.6.0: `bench/peers.py`, its
    # median of 5 runs alternating with forged's on this two-core machine, 2026-12-07; abort
    # mid-bash from an earlier harness); values are medians over the runs, in `unit` (ms keys
    # from seconds are scaled). Compare with pi side by side (`bench/peers.py`), not with these.
    table: list[tuple[str, str, str, str, str, str]] = [
        ("cold_start", "cold start to first get_state", "cold_ms", "ms", "< 300 ms", ""),
        ("cold_start", "idle memory (RSS)", "idle_mb", "MB", "< 40 MB", ""),
        ("first_token", "fresh process: prompt to first text_delta", "first_token_ms", "ms",
         "< 150 ms", "86 ms"),
        ("first_token", "  the same, 0.5 s after get_state (warmed up)", "warm_first_token_ms",
         "ms", "", ""),
        ("first_token", "  prompt sent as it starts: to first text_delta",
         "at_once_first_token_ms", "ms", "", ""),
        ("first_token", "  spawn to first text_delta", "spawn_to_first_token_ms", "ms", "", ""),
        ("throughput", "20,000 x 1 B deltas (first prompt): prompt to agent_end", "seconds",
         "s", "< 0.8 s", "0.47 s"),
        ("throughput", "  events per second", "events_per_s", "", "", ""),
        ("throughput", "  stdout bytes per delta", "bytes_per_delta", "", "< 400", ""),
        ("throughput", "  peak memory (VmHWM)", "peak_mb", "MB", "< 60 MB", "165 MB"),
        ("latency", "200 deltas 5 ms apart: added latency p50", "p50_ms", "ms", "", ""),
        ("latency", "  added latency p99", "p99_ms", "ms", "< 1.5 ms", ""),
        ("abort_stream", "abort mid-stream: to agent_end", "abort_stream_end_ms", "ms",
         "< 3 ms", "4.8 ms"),
        ("abort_stream", "  to the abort response", "abort_stream_ms", "ms", "", ""),
        ("abort_stream", "  to the provider's connection closed", "abort_stream_close_ms",
         "ms", "< 5.8 ms", ""),
        ("abort_bash", "abort mid-bash (sleep 60): to agent_end", "abort_bash_end_ms", "ms",
         "< 8 ms", "16 ms"),
        ("abort_bash", "  to the abort response", "abort_bash_ms", "ms", "", ""),
        ("abort_bash", "  to the process group gone", "abort_bash_group_ms", "ms", "", ""),
        ("abort_bash", "  agent_end after the group is gone", "abort_bash_after_group_ms",
         "ms", "< 0.5 ms", ""),
        ("abort_bash", "  processes left after abort (the most)", "survivors", "", "0", ""),
        ("abort_retry_wait", "abort during a retry wait", "abort_retry_ms", "ms", "< 50 ms",
         ""),
        ("abort_compaction", "abort during a manual compaction", "abort_manual_compaction_ms",
         "ms", "< 50 ms", ""),
        ("abort_compaction", "abort during an automatic compaction",
         "abort_auto_compaction_ms", "ms", "< 50 ms", ""),
        ("abort_compaction", "abort during a summarization retry wait",
         "abort_summary_retry_ms", "ms", "< 50 ms", ""),
        ("direct_bash", "direct bash seq 1 2000000: to the response", "bash_s", "s", "< 1 s",
         ""),
        ("direct_bash", "  peak memory (VmHWM)", "bash_peak_mb", "MB", "< 80 MB", ""),
        ("direct_bash", "abort_bash (sleep 60) to the bash response", "abort_direct_bash_ms",
         "ms", "< 50 ms", ""),
        ("session_open", "open a 100,000-entry session (110 MB): start to get_state", "open_s",
         "s", "< 2 s", ""),
        ("session_open", "  memory after opening", "open_rss_mb", "MB", "", ""),
        ("session_open", "  get_entries since the last entry", "since_last_ms", "ms", "", ""),
        ("session_open", "  get_entries since 100 from the end", "since_100_ms", "ms", "", ""),
        ("session_open", "  switch_session to a 10-entry session", "switch_away_ms", "ms", "",
         ""),
        ("session_open", "  switch_session back to it", "switch_back_s", "s", "< 2 s", ""),
        ("session_open", "  export_html of it", "export_s", "s", "", ""),
        ("acp", "--mode acp, fresh process: session/prompt to first chunk",
         "acp_first_chunk_ms", "ms", "< 200 ms", ""),
        ("acp", "  session/cancel to the prompt's answer", "acp_cancel_ms", "ms", "< 20 ms", ""),
        ("acp", "  session/load of a 10,000-entry session", "acp_load_s", "s", "< 1 s", ""),
        ("acp", "  updates it replayed", "acp_load_updates", "", "", ""),
        ("mcp", "first get_state (spawn to response), no MCP server", "mcp_state_none_ms",
         "ms", "", ""),
        ("mcp", "  with three stdio servers configured", "mcp_state_three_ms", "ms",
         "< +5 ms", ""),
        ("mcp", "a warm server's echo: start to end through forged", "mcp_call_ms", "ms", "",
         ""),
        ("mcp", "  the same call from the SDK in-process", "mcp_sdk_call_ms", "ms", "", ""),
        ("mcp", "  forged's overhead", "mcp_overhead_ms", "ms", "< 5 ms", ""),
        ("mcp", "fresh process, a server that never answers: prompt to first text_delta",
         "mcp_mute_first_token_ms", "ms", "", ""),
        ("mcp", "  file descriptors added by 99 more calls", "mcp_fds_added", "", "0", ""),
        ("mcp", "  child processes added by 99 more calls", "mcp_children_added", "", "0", ""),
    ]

    def figure(bench: str, key: str, unit: str) -> str:
        values = [run[key] for run in runs[bench]]
        value = max(values) if key == "survivors" else statistics.median(values)
        digits = {"ms": 2 if abs(value) < 1 else 1, "MB": 1, "s": 2}.get(unit, 0)
        return f"{value:,.{digits}f} {unit}".strip()

    rows = [(label, figure(bench, key, unit), target, ancestor)
            for bench, label, key, unit, target, ancestor in table if bench in runs]
    rows.append(("this machine's speed: sum(range(5_000_000)) took, before / after",
                 f"{speeds[0]:.0f} / {speeds[-1]:.0f} ms", "", ""))
    width = max(len(row[0]) for row in rows)
    print(f"{'measure':<{width}}  {'forged':>12}  {'target':<9}  pi 1.6.0   (median of {repeat})")
    for label, value, target, ancestor in rows:
        print(f"{label:<{width}}  {value:>12}  {target:<9}  {ancestor}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help=f"comma-separated, of: {', '.join(BENCHES)}")
    arguments = parser.parse_args()
    trio.run(main, arguments.repeat, [name for name in arguments.only.split(",") if name])
