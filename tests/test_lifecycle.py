"""Random sequences of commands against scripted turns with random faults: whatever a client
does, and whatever the provider does, the session keeps the promises of docs/protocol.md,
The run lifecycle (one response per command, runs opened and closed, one ``agent_settled`` at
the end, no process left behind, nothing accepted missing from the session file).

Each example runs in its own `trio.run` with the real clock; retries and idle timeouts are set
short so faults resolve in milliseconds.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings, strategies as st

from forged._providers.scripted import Reply, ScriptText, ScriptToolCall, ScriptUsage

from .harness import Client, open_client

REPLIES: dict[str, Callable[[], Reply]] = {
    "text": lambda: Reply(content=[ScriptText(text="done " * 20, chunks=4)]),
    "read": lambda: Reply(content=[ScriptToolCall(name="read", arguments={"path": "a.txt"})]),
    "slow tool": lambda: Reply(content=[ScriptToolCall(name="bash",
                                                       arguments={"command": "sleep 0.2"})]),
    "full": lambda: Reply(content=[ScriptText(text="full")],
                          usage=ScriptUsage(input=190_000)),
    "overloaded": lambda: Reply(status=529, error_type="overloaded_error",
                                error_message="Overloaded"),
    "overflow": lambda: Reply(status=400, error_type="invalid_request_error",
                              error_message="prompt is too long: 201000 tokens > 200000"),
    "refused": lambda: Reply(status=400, error_message="Bad request"),
    "cut": lambda: Reply(content=[ScriptText(text="half of it", chunks=3)], cut=True),
    "silent": lambda: Reply(silent=True),
}

COMMANDS: dict[str, dict[str, Any]] = {
    "prompt": {"type": "prompt", "message": "go on"},
    "prompt steer": {"type": "prompt", "message": "now this", "streamingBehavior": "steer"},
    "prompt follow": {"type": "prompt", "message": "later", "streamingBehavior": "followUp"},
    "steer": {"type": "steer", "message": "steer here"},
    "follow_up": {"type": "follow_up", "message": "and then"},
    "abort": {"type": "abort"},
    "clear_queue": {"type": "clear_queue"},
    "bash": {"type": "bash", "command": "echo direct"},
    "slow bash": {"type": "bash", "command": "sleep 0.3; echo late"},
    "abort_bash": {"type": "abort_bash"},
    "compact": {"type": "compact"},
    "new_session": {"type": "new_session"},
}

steps = st.lists(st.tuples(st.sampled_from(sorted(COMMANDS)),
                           st.sampled_from([0.0, 0.001, 0.01, 0.05])),
                 min_size=1, max_size=12)
faults = st.lists(st.sampled_from(sorted(REPLIES)), min_size=40, max_size=40)


def surviving_processes(token: str) -> list[int]:
    """Processes other than this one that carry `token` in their environment."""
    needle = f"FORGED_LIFECYCLE={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


async def quiesce(client: Client) -> None:
    """Until nothing runs: no run, retry or compaction, and the last run settled (a run's
    closing checkpoint follows its agent_end while the session already takes prompts;
    messages queued while idle wait for the next prompt)."""
    while True:
        state = (await client.request({"type": "get_state"}))["data"]
        marks = [e["type"] for e in client.output
                 if e.get("type") in ("agent_start", "agent_settled")]
        if not (state["isStreaming"] or state["isCompacting"]) and marks[-1:] != ["agent_start"]:
            return
        await trio.sleep(0.01)


async def drive(root: Path, plan: list[tuple[str, float]], replies: list[str]) -> Client:
    (root / "agent").mkdir()
    (root / "agent" / "settings.json").write_text(json.dumps({
        "retry": {"baseDelayMs": 1, "maxDelayMs": 4, "idleTimeoutMs": 150},
        "compaction": {"keepRecentTokens": 20}}))
    script = [REPLIES[name]() for name in replies] + [REPLIES["text"]() for _ in range(40)]
    async with open_client(root, script) as client:
        (client.cwd / "a.txt").write_text("hello\n")
        sent = []
        for name, pause in plan:
            sent.append(await client.send(dict(COMMANDS[name])))
            await trio.sleep(pause)
        with trio.fail_after(10):
            for command_id in sent:
                await client.response(command_id)
            await quiesce(client)
            await client.request({"type": "get_state"})
            await trio.testing.wait_all_tasks_blocked()  # nothing may follow the end
            await client.request({"type": "get_state"})
        client.sent = sent  # type: ignore[attr-defined]
        return client


def check_runs(events: list[dict[str, Any]]) -> None:
    """Every agent_start is closed by an agent_end before the next; an agent_settled follows
    only closed runs, and exactly one follows the last run."""
    open_run = False
    settled_since_run = True
    for event in events:
        kind = event.get("type")
        if kind == "agent_start":
            assert not open_run, "agent_start inside a run"
            open_run = True
            settled_since_run = False
        elif kind == "agent_end":
            assert open_run, "agent_end without agent_start"
            open_run = False
        elif kind == "agent_settled":
            assert not open_run, "agent_settled inside a run"
            assert not settled_since_run, "agent_settled twice, or with no run before it"
            settled_since_run = True
    assert not open_run, "a run was never closed"
    assert settled_since_run, "the last run never settled"


def stored_messages(sessions: Path) -> list[dict[str, Any]]:
    """Every message entry of every session file; each line must parse, headers first."""
    found = []
    for path in sessions.rglob("*.jsonl"):
        lines = path.read_bytes().splitlines()
        assert orjson.loads(lines[0])["type"] == "session"
        for line in lines[1:]:
            entry = orjson.loads(line)
            if entry["type"] == "message":
                found.append(entry["message"])
    return found


@settings(max_examples=int(os.environ.get("FORGED_LIFECYCLE_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow], derandomize="CI" in os.environ)
@given(plan=steps, replies=faults)
def test_no_sequence_of_commands_breaks_the_lifecycle(plan: list[tuple[str, float]],
                                                       replies: list[str]) -> None:
    token = uuid.uuid4().hex
    os.environ["FORGED_LIFECYCLE"] = token
    try:
        with tempfile.TemporaryDirectory() as scratch:
            client = trio.run(drive, Path(scratch), plan, replies)
            stored = stored_messages(Path(scratch) / "agent" / "sessions")
    finally:
        del os.environ["FORGED_LIFECYCLE"]
    responses = [e for e in client.output if e.get("type") == "response"]
    sent: list[str] = client.sent  # type: ignore[attr-defined]
    for command_id in sent:
        assert [r["id"] for r in responses].count(command_id) == 1, command_id
    check_runs(client.output)
    assert surviving_processes(token) == []
    for event in client.events("message_end"):
        assert event["message"] in stored, event["message"]
