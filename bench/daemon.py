"""The daemon under load: many sessions streaming at once through one `forged serve`, two
clients attached to each. Run by hand:

    .venv/bin/python bench/daemon.py [--sessions 50] [--deltas 200] [--interval-ms 20]
                                     [--spread-ms 0]

The scripted server runs in this process and records when it wrote each delta; during the
run the clients read in a process of their own (`_clients.py`), so their clocks do not wait
for the server's work. Every reply carries its own marker, so each delta a client receives
is matched to the moment it left the server, on one clock (the monotonic clock is the
machine's). Reports events per second over all clients, the added latency per delta
(p50 and p99 over all clients, and the p99 of the worst client), the daemon's memory per idle
session, and whether any client lost or reordered an event (by ``seq``, and by comparing the
two clients of each session).
"""

from __future__ import annotations

import argparse
import gc
import json
import marshal
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import trio
from run import calibration_ms  # this folder is the script's, so first on sys.path

from forged._providers.scripted import Reply, ScriptedServer, ScriptText

FORGED = str(Path(sys.executable).parent / "forged")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


class Peer:
    """A raw socket client that stamps each line with the time its bytes arrived."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""
        self.received: list[tuple[float, dict[str, Any]]] = []

    @classmethod
    async def open(cls, path: Path) -> Peer:
        return cls(await trio.open_unix_socket(str(path)))

    async def send(self, command: dict[str, Any]) -> None:
        await self.stream.send_all(orjson.dumps(command) + b"\n")

    async def until(self, kind: str, **fields: Any) -> dict[str, Any]:
        start = 0
        while True:
            for _, item in self.received[start:]:
                if item.get("type") == kind and all(item.get(k) == v for k, v in fields.items()):
                    return item
            start = len(self.received)
            data = await self.stream.receive_some(1 << 20)
            if not data:
                raise ConnectionError("the daemon closed the connection")
            at = time.perf_counter()
            self.buffer += data
            *lines, self.buffer = self.buffer.split(b"\n")
            self.received += [(at, orjson.loads(line)) for line in lines]

    async def request(self, command: dict[str, Any]) -> dict[str, Any]:
        await self.send(command)
        return await self.until("response", id=command["id"])

    def take(self, chunks: list[tuple[float, bytes]]) -> None:
        """Chunks read for this peer elsewhere, each with the moment it arrived."""
        for at, data in chunks:
            self.buffer += data
            *lines, self.buffer = self.buffer.split(b"\n")
            self.received += [(at, orjson.loads(line)) for line in lines]


async def run(sessions: int, deltas: int, interval_ms: float, spread_ms: float
              ) -> dict[str, Any]:
    replies = [Reply(content=[ScriptText(text="warm")])] + [
        Reply(content=[ScriptText(text=f"<{index:03d}>" * deltas, chunks=deltas,
                                  delay_ms=interval_ms)])
        for index in range(sessions)]
    server = ScriptedServer(replies, record_sends=True)
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        agent_dir = root / "agent"
        agent_dir.mkdir()
        socket_path = root / "run" / "forged.sock"
        env = {**os.environ, "AGENT_FORGE_DIR": str(agent_dir), "XDG_RUNTIME_DIR": str(root)}
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            (agent_dir / "models.json").write_text(json.dumps({"providers": {"bench": {
                "baseUrl": server.base_url, "api": "anthropic-messages", "apiKey": "k",
                "models": [{"id": "m"}]}}}))
            daemon = await trio.lowlevel.open_process(
                [FORGED, "serve", "--socket", str(socket_path), "--model", "bench/m",
                 "--no-session", "--cwd", str(root)], env=env, stdin=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            try:
                return await _measure(daemon, socket_path, server, sessions, spread_ms)
            finally:
                daemon.terminate()
                await daemon.wait()
                nursery.cancel_scope.cancel()
    raise AssertionError("unreachable")


async def _measure(daemon: trio.Process, socket_path: Path, server: ScriptedServer,
                   sessions: int, spread_ms: float) -> dict[str, Any]:
    with trio.fail_after(20):
        while not socket_path.exists():  # noqa: ASYNC110 (another process makes it)
            await trio.sleep(0.05)
    warm = await Peer.open(socket_path)
    await warm.request({"id": "n", "type": "new_session"})
    await warm.send({"id": "p", "type": "prompt", "message": "warm up"})
    await warm.until("agent_settled")  # the SDK is imported once per process
    await trio.sleep(0.5)
    before = rss_kb(daemon.pid)
    pairs: list[tuple[Peer, Peer]] = []
    for index in range(sessions):
        first, second = await Peer.open(socket_path), await Peer.open(socket_path)
        await first.request({"id": f"n{index}", "type": "new_session"})
        state = await first.request({"id": f"s{index}", "type": "get_state"})
        await second.request({"id": f"a{index}", "type": "attach",
                              "sessionId": state["data"]["sessionId"]})
        pairs.append((first, second))
    await trio.sleep(0.5)
    per_idle_kb = (rss_kb(daemon.pid) - before) / sessions
    server.sends.clear()
    calibration = calibration_ms()
    started, daemon_cpu, own_cpu = time.perf_counter(), cpu_s(daemon.pid), time.process_time()
    # A collection here would pause the scripted server (tens of ms with this process's
    # heap); the run is short, so none is made.
    gc.freeze()
    gc.disable()
    fds = [(first.stream.socket.fileno(), second.stream.socket.fileno())
           for first, second in pairs]
    clients = await trio.run_process(
        [sys.executable, str(Path(__file__).with_name("_clients.py")), str(spread_ms),
         *(f"{a},{b}" for a, b in fds)], pass_fds=[fd for pair in fds for fd in pair],
        capture_stdout=True)
    elapsed = time.perf_counter() - started
    gc.enable()
    chunks, clients_cpu_s = marshal.loads(clients.stdout)
    for (first, second), (a, b) in zip(pairs, fds, strict=True):
        first.take(chunks[a])
        second.take(chunks[b])
    result = _report(pairs, server, elapsed, per_idle_kb)
    result["daemon_cpu_s"] = cpu_s(daemon.pid) - daemon_cpu
    result["server_cpu_s"] = time.process_time() - own_cpu
    result["clients_cpu_s"] = clients_cpu_s
    result["calibration_ms"] = calibration
    return result


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _report(pairs: list[tuple[Peer, Peer]], server: ScriptedServer, elapsed: float,
            per_idle_kb: float) -> dict[str, Any]:
    sent: dict[str, list[float]] = {}
    for at, data in server.sends:
        for marker in data.split(b'"text":"<')[1:]:  # one per delta written
            sent.setdefault(marker[:3].decode(), []).append(at)
    added: list[float] = []
    per_client_p99: list[float] = []
    lost_or_reordered = 0
    events = 0
    for first, second in pairs:
        streams = []
        for peer in (first, second):
            stamped = [(at, e) for at, e in peer.received if "seq" in e]
            events += len(stamped)
            seqs = [e["seq"] for _, e in stamped]
            lost_or_reordered += seqs != list(range(seqs[0], seqs[0] + len(seqs)))
            streams.append([e for _, e in stamped])
            deltas = [(at, e["assistantMessageEvent"]["delta"]) for at, e in stamped
                      if e["type"] == "message_update"
                      and e["assistantMessageEvent"]["type"] == "text_delta"]
            if deltas:
                marker = deltas[0][1][1:4]
                mine = sorted((received - left) * 1000 for (received, _), left
                              in zip(deltas, sent.get(marker, []), strict=False))
                added += mine
                per_client_p99.append(percentile(mine, 0.99))
        first_seqs = {e["seq"] for e in streams[0]}
        lost_or_reordered += [e for e in streams[1] if e["seq"] in first_seqs] != [
            e for e in streams[0] if e["seq"] in {x["seq"] for x in streams[1]}]
    added.sort()
    return {"sessions": len(pairs), "clients": 2 * len(pairs), "events": events,
            "seconds": elapsed, "events_per_s": events / elapsed,
            "p50_ms": statistics.median(added),
            "p99_ms": percentile(added, 0.99),
            "worst_client_p99_ms": max(per_client_p99),
            "deltas_matched": len(added), "idle_session_kb": per_idle_kb,
            "lost_or_reordered": lost_or_reordered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=20.0,
                        help="between one session's deltas (20: a fast provider's pace)")
    parser.add_argument("--spread-ms", type=float, default=0.0,
                        help="send each session's prompt at a random moment within this "
                             "long of the first (default 0: all at once, so every "
                             "session's deltas leave the server in the same instant, the "
                             "hardest case)")
    args = parser.parse_args()
    result = trio.run(run, args.sessions, args.deltas, args.interval_ms, args.spread_ms)
    rows = [
        (f"{result['sessions']} sessions x 2 clients, {args.deltas} deltas "
         f"{args.interval_ms:g} ms apart each, started within {args.spread_ms:g} ms", "", ""),
        ("  events delivered, all clients", f"{result['events']:,}", ""),
        ("  events per second, all clients", f"{result['events_per_s']:,.0f}", ""),
        ("  added latency per delta p50", f"{result['p50_ms']:.2f} ms", ""),
        ("  added latency per delta p99, all clients", f"{result['p99_ms']:.2f} ms", "< 20 ms"),
        ("  added latency p99 of the worst client", f"{result['worst_client_p99_ms']:.2f} ms",
         "< 20 ms"),
        ("  events lost or reordered", str(result["lost_or_reordered"]), "0"),
        ("  CPU seconds: the daemon / the scripted server / the clients",
         f"{result['daemon_cpu_s']:.2f} / {result['server_cpu_s']:.2f} / "
         f"{result['clients_cpu_s']:.2f}", f"of {result['seconds']:.2f} s"),
        ("  this machine's speed: sum(range(5_000_000)) took",
         f"{result['calibration_ms']:.0f} ms", ""),
        ("memory per idle session", f"{result['idle_session_kb'] / 1024:.2f} MB", "< 2 MB"),
    ]
    for name, value, target in rows:
        print(f"{name:<64}{value:>12}  {target}")


if __name__ == "__main__":
    main()
