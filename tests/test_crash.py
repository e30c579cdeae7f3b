"""kill -9 at random moments: nothing announced is lost, and the file takes the next append."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import orjson
import trio

from forged._store import SessionFile

from .test_process import BIN, Child, child_env, spawn

KILLS = int(os.environ.get("FORGED_KILLS", "50"))
AT_ONCE = 2
RESUMED = 4  # kills after which a real forged continues the session with a prompt

SCRIPT = {"replies": [
    {"content": [{"type": "text", "text": "Looking. " * 8, "chunks": 16, "delayMs": 3},
                 {"type": "toolCall", "name": "bash",
                  "arguments": {"command": "for i in 1 2 3 4 5; do echo $i; sleep 0.05; done"}}]},
    {"content": [{"type": "thinking", "thinking": "now write", "signature": "s"},
                 {"type": "toolCall", "name": "write",
                  "arguments": {"path": "out.txt", "content": "x" * 5000}}]},
    {"content": [{"type": "text", "text": "All done here. " * 20, "chunks": 60,
                  "delayMs": 2}]},
]}


def announced(child: Child) -> list[dict[str, Any]]:
    return [e["message"] for e in child.output if e["type"] == "message_end"]


async def read_some(child: Child, lines: int) -> None:
    """Read until `lines` more output lines arrived, the run settled, or the output ended."""
    assert child.process.stdout is not None
    target = len(child.output) + lines
    while len(child.output) < target and not any(
            e["type"] == "agent_settled" for e in child.output):
        while b"\n" in child.buffer:
            line, child.buffer = child.buffer.split(b"\n", 1)
            child.output.append(orjson.loads(line))
        if len(child.output) >= target or any(e["type"] == "agent_settled"
                                              for e in child.output):
            return
        data = await child.process.stdout.receive_some(1 << 16)
        if not data:
            return
        child.buffer += data


async def one_kill(trial: int, root: Path, rng: random.Random,
                   failures: list[str]) -> Path | None:
    work = root / f"trial-{trial}"
    (work / "agent").mkdir(parents=True)
    script = work / "script.json"
    script.write_text(json.dumps(SCRIPT))
    child = await spawn(["--provider", "scripted", "--script", str(script), "--session-dir",
                         str(work / "sessions"), "--cwd", str(work)], work,
                        child_env(work / "agent"))
    await child.send({"id": "s", "type": "get_state"})
    state = await child.read_until("response", id="s")
    await child.send({"id": "p", "type": "prompt", "message": "go"})
    await read_some(child, rng.randint(1, 130))
    if rng.random() < 0.5:
        await trio.sleep(rng.random() * 0.02)  # between lines: mid-write, mid-delta
    child.process.send_signal(signal.SIGKILL)
    await child.process.wait()
    await read_some(child, 10**9)  # whatever was written before it died
    for pipe in (child.process.stdin, child.process.stdout, child.process.stderr):
        if pipe is not None:  # closed now, not when collected: the fd numbers get reused
            await pipe.aclose()
    path = Path(state["data"]["sessionFile"])
    messages = announced(child)
    if not path.exists():
        if messages:
            failures.append(f"trial {trial}: {len(messages)} announced, no file")
        return None
    session = SessionFile.open(path)  # the lock died with the process
    stored = [e["message"] for e in session.entries() if e["type"] == "message"]
    missing = [m for m in messages if m not in stored]
    if missing:
        failures.append(f"trial {trial}: {len(missing)} announced messages not in the file")
    entry = session.append("message", message={"role": "user", "timestamp": 1,
                                               "content": [{"type": "text", "text": "next"}]})
    session.close()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]  # all whole JSON
    if lines[-1] != entry or entry["parentId"] != (lines[-2].get("id") if len(lines) > 2
                                                   else None):
        failures.append(f"trial {trial}: the append after the crash did not chain")
    return path


async def test_kill_9_at_random_moments_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(20261202)
    failures: list[str] = []
    paths: list[Path] = []
    limiter = trio.CapacityLimiter(AT_ONCE)

    async def trial(number: int) -> None:
        async with limiter:
            path = await one_kill(number, tmp_path, random.Random(rng.random()), failures)
            if path is not None:
                paths.append(path)

    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            for number in range(KILLS):
                nursery.start_soon(trial, number)
    assert failures == []
    assert len(paths) >= KILLS // 3  # most kills landed after the first message

    for path in paths[:RESUMED]:
        work = path.parent.parent
        script = work / "again.json"
        script.write_text(json.dumps({"replies": [{"content": [
            {"type": "text", "text": "resumed"}]}]}))
        before = path.read_bytes().count(b"\n")
        result = await trio.run_process(
            [str(BIN / "forged"), "--mode", "rpc", "--provider",
             "scripted", "--script", str(script), "--session", str(path), "--cwd", str(work)],
            stdin=b'{"type":"prompt","message":"again"}\n', capture_stdout=True,
            capture_stderr=True, env=child_env(work / "agent"))
        events = [orjson.loads(line) for line in result.stdout.splitlines()]
        assert events[-1] == {"type": "agent_settled", "aborted": False}
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        assert len(lines) == before + 2
        assert [line["message"]["role"] for line in lines[-2:]] == ["user", "assistant"]
        assert lines[-2]["parentId"] == lines[-3]["id"]
