"""`forged --mode rpc` as a child process over pipes, as a client spawns it."""

from __future__ import annotations

import json
import mmap
import os
import pty
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

import forged
from forged._process import live_group_members, open_process, tied
from forged._providers.scripted import Reply, ScriptedServer, ScriptText, ScriptToolCall

from .oracles import check_requests

BIN = Path(sys.executable).parent
EXAMPLE = Path(forged.__file__).parent / "examples" / "fix-greeting.json"


def child_env(agent_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    env["AGENT_FORGE_DIR"] = str(agent_dir)
    return env


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, which no init here may reap, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


async def wait_gone(pid: int) -> None:
    """Until process `pid` has ended (its pidfd turns readable): no polling."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(descriptor)
    finally:
        os.close(descriptor)


class Child:
    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buffer = b""
        self.output: list[dict[str, Any]] = []

    async def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(orjson.dumps(command) + b"\n")

    async def read_until(self, kind: str, **fields: Any) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                event: dict[str, Any] = orjson.loads(line)
                self.output.append(event)
                if event.get("type") == kind and all(event.get(k) == v
                                                     for k, v in fields.items()):
                    return event
            data = await self.process.stdout.receive_some(1 << 16)
            assert data, f"forged exited early; got {[e['type'] for e in self.output]}"
            self.buffer += data


RPC = [str(BIN / "forged"), "--mode", "rpc"]


@pytest.fixture(params=["rpc", "connect"])
def forged_rpc(request: pytest.FixtureRequest, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The command a client spawns: ``forged --mode rpc``, or ``forged connect`` (which
    starts a daemon in `tmp_path/run`, stopped when the test ends)."""
    if request.param == "rpc":
        yield RPC
        return
    runtime = tmp_path / "run"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield [str(BIN / "forged"), "connect"]
    stop_daemon(runtime)


def stop_daemon(runtime: Path) -> None:
    """SIGTERM the daemon whose pid file is in `runtime`, if one was started, and wait (10 s
    at most) until it has gone."""
    pid_file = runtime / "forged" / "forged.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
        for _ in range(200):
            if not Path(f"/proc/{pid}").exists() or "zombie" in Path(
                    f"/proc/{pid}/status").read_text():
                break
            time.sleep(0.05)


async def spawn(args: list[str], cwd: Path, env: dict[str, str],
                command: list[str] = RPC) -> Child:
    process = await trio.lowlevel.open_process(
        [*command, *args], cwd=cwd, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return Child(process)


async def test_forged_over_pipes_against_a_custom_provider(tmp_path: Path,
                                                           forged_rpc: list[str]) -> None:
    project, agent_dir = tmp_path / "project", tmp_path / "agent"
    project.mkdir()
    agent_dir.mkdir()
    server = ScriptedServer([
        Reply(content=[ScriptToolCall(name="bash", arguments={
            "command": "echo to-stdout; echo to-stderr >&2"})]),
        Reply(content=[ScriptText(text="finished", chunks=4, delay_ms=5)]),
    ])
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        (agent_dir / "models.json").write_text(json.dumps({"providers": {"local": {
            "baseUrl": server.base_url, "api": "anthropic-messages", "apiKey": "LOCAL_KEY",
            "models": [{"id": "m1", "reasoning": True}]}}}))
        (agent_dir / "AGENTS.md").write_text("Always answer in English.")
        child = await spawn(["--model", "local/m1:low", "--cwd", str(project), "-n", "demo"],
                            tmp_path, child_env(agent_dir), forged_rpc)
        await child.send({"id": "s", "type": "get_state"})
        state = await child.read_until("response", id="s")
        await child.send({"id": "p", "type": "prompt", "message": "run it"})
        await child.read_until("agent_settled")
        assert child.process.stdin is not None
        await child.process.stdin.aclose()
        with trio.fail_after(10):
            code = await child.process.wait()
        nursery.cancel_scope.cancel()
    assert code == 0
    assert state["data"]["model"]["id"] == "m1"
    assert state["data"]["thinkingLevel"] == "low"
    assert state["data"]["sessionName"] == "demo"
    types = [e["type"] for e in child.output]
    assert types[:3] == ["response", "response", "agent_start"]
    end = next(e for e in child.output if e["type"] == "tool_execution_end")
    assert end["result"]["content"][0]["text"] == "to-stdout\nto-stderr\n"
    system = server.requests[0].body["system"][0]["text"]
    assert "Always answer in English." in system
    assert f"Current working directory: {project}" in system
    assert server.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert server.requests[0].headers["x-api-key"] == "LOCAL_KEY"
    check_requests(server.requests)


async def test_the_scripted_example_runs_the_readme_scenario(tmp_path: Path,
                                                            forged_rpc: list[str]) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    prompt = b'{"type":"prompt","message":"Write a greeting program and run it"}\n'
    result = await trio.run_process(
        [*forged_rpc, "--provider", "scripted", "--script", str(EXAMPLE), "--cwd",
         str(tmp_path)],
        stdin=prompt, capture_stdout=True, capture_stderr=True, env=child_env(agent_dir))
    events = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert events[0]["type"] == "response" and events[0]["success"] is True
    assert events[-1]["type"] == "agent_settled"
    tools = [e["toolName"] for e in events if e["type"] == "tool_execution_end"]
    assert tools == ["write", "read", "edit", "bash"]
    assert (tmp_path / "greet.py").read_text() == "print('Hello, world!')\n"
    bash = [e for e in events if e["type"] == "tool_execution_end"][-1]
    assert bash["result"]["content"][0]["text"] == "Hello, world!\n"


def on_a_terminal(command: list[str], tmp_path: Path, env: dict[str, str] | None = None
                  ) -> tuple[subprocess.CompletedProcess[bytes], list[str]]:
    """`command` run with stderr on a terminal: what it did, and the terminal's lines."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=follower, timeout=60,
                              env=env or child_env(tmp_path / "agent"), check=False)
        os.close(follower)
        follower = -1
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    return done, shown.decode().replace("\r\n", "\n").splitlines()


def test_the_readme_first_command_shows_a_trace_on_a_terminal(tmp_path: Path) -> None:
    """``forged -p`` with stderr on a terminal: each tool call in a line or two, then the
    reply on stdout; piped, stderr stays quiet."""
    (tmp_path / "agent").mkdir()
    command = [str(BIN / "forged"), "-p", "--provider", "scripted", "--script", str(EXAMPLE),
               "--cwd", str(tmp_path), "Write a greeting program and run it"]
    done, shown = on_a_terminal(command, tmp_path)
    assert done.returncode == 0
    assert shown == [
        "[write] greet.py", "[read] greet.py", "[edit] greet.py", "[bash] python3 greet.py",
        "    Hello, world!"]
    assert done.stdout == b"Done: `greet.py` now prints **Hello, world!**\n"
    piped = subprocess.run(command, capture_output=True, timeout=60,
                           env=child_env(tmp_path / "agent"), check=False)
    assert piped.stderr == b"" and piped.stdout == done.stdout


async def test_help_version_and_the_agent_forge_alias(tmp_path: Path) -> None:
    help_text = (await trio.run_process([str(BIN / "forged"), "--help"],
                                        capture_stdout=True)).stdout.decode()
    for option in ("--mode", "--provider", "--model", "--name", "-n", "--no-session",
                   "--session-dir", "--cwd", "--version", "--script"):
        assert option in help_text
    assert f"--script {EXAMPLE} " in help_text  # where it is installed, not a checkout's
    version = await trio.run_process([str(BIN / "agent-forge"), "--version"],
                                     capture_stdout=True)
    assert version.stdout.decode().splitlines()[0] == forged.__version__  # bare, as pi's
    module = await trio.run_process([sys.executable, "-m", "forged", "--version"],
                                    capture_stdout=True)
    assert module.stdout == version.stdout


async def test_bad_model_exits_with_a_message(tmp_path: Path) -> None:
    result = await trio.run_process(
        [str(BIN / "forged"), "--mode", "rpc", "--model", "no-such-model"], stdin=b"",
        capture_stdout=True, capture_stderr=True, check=False, env=child_env(tmp_path))
    assert result.returncode == 1
    assert result.stdout == b""
    assert b"Model not found: no-such-model" in result.stderr


async def test_stray_output_cannot_reach_the_protocol_stream(tmp_path: Path) -> None:
    code = ("import os, subprocess; from forged._log import reserve_stdout\n"
            "fd = reserve_stdout()\n"
            "print('stray print')\n"
            "os.write(1, b'stray fd write\\n')\n"
            "subprocess.run(['echo', 'stray child'])\n"
            "os.write(fd, b'{\"protocol\":true}\\n')\n")
    result = await trio.run_process([sys.executable, "-c", code], capture_stdout=True,
                                    capture_stderr=True)
    assert result.stdout == b'{"protocol":true}\n'
    assert b"stray print" in result.stderr and b"stray child" in result.stderr


async def test_stdin_eof_lets_the_run_finish(tmp_path: Path, forged_rpc: list[str]) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [
        {"content": [{"type": "text", "text": "slow answer", "chunks": 10, "delayMs": 30}]}]}))
    with trio.fail_after(20):
        result = await trio.run_process(
            [*forged_rpc, "--provider", "scripted", "--script", str(script)],
            stdin=b'{"type":"prompt","message":"hi"}', capture_stdout=True,
            capture_stderr=True, env=child_env(agent_dir), cwd=tmp_path)
    events = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert events[-1] == {"type": "agent_settled", "aborted": False}
    assert events[-3]["type"] == "turn_end"
    assert events[-3]["message"]["content"][0]["text"] == "slow answer"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_a_signal_aborts_writes_the_closing_events_and_exits_0(
        tmp_path: Path, signum: signal.Signals, forged_rpc: list[str]) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [
        {"content": [{"type": "text", "text": "x" * 500, "chunks": 500, "delayMs": 10}]}]}))
    child = await spawn(["--provider", "scripted", "--script", str(script)], tmp_path,
                        child_env(agent_dir), forged_rpc)
    await child.send({"id": "p", "type": "prompt", "message": "go"})
    await child.read_until("message_update")
    child.process.send_signal(signum)
    with trio.fail_after(3):
        await child.read_until("agent_settled")
        code = await child.process.wait()
    assert code == 0
    tail = [e["type"] for e in child.output[-4:]]
    assert tail == ["message_end", "turn_end", "agent_end", "agent_settled"]
    assert child.output[-4]["message"]["stopReason"] == "aborted"


async def test_no_child_of_a_command_outlives_a_killed_forged(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [{"content": [{
        "type": "toolCall", "name": "bash",
        "arguments": {"command": "echo $$; sleep 60 & (sleep 61; echo) | cat"}}]}]}))
    child = await spawn(["--provider", "scripted", "--script", str(script)], tmp_path,
                        child_env(agent_dir))
    await child.send({"id": "p", "type": "prompt", "message": "go"})
    update = await child.read_until("tool_execution_update")
    pgid = int(update["partialResult"]["content"][0]["text"].split()[0])
    with trio.fail_after(10):  # the shell, two sleeps, a subshell, cat: all started
        while len(live_group_members(pgid)) < 5:  # noqa: ASYNC110 (processes outside)
            await trio.sleep(0.001)
    child.process.kill()
    await child.process.wait()
    with trio.fail_after(5):  # the shell hears of it and kills its group
        while live_group_members(pgid):  # noqa: ASYNC110 (processes outside this run)
            await trio.sleep(0.01)


STARTER = """
import trio
from forged._process import open_process, tied

async def main() -> None:
    child = await open_process(["/bin/sh", "-c", "echo running; exec sleep 60"])
    assert child.stdout is not None
    await child.stdout.receive_some()  # past setpriv and the check: the program runs
    print(child.pid, tied(["true"])[1] is None, flush=True)
    await trio.sleep_forever()

trio.run(main)
"""


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "no-setpriv"])
async def test_a_started_program_dies_with_the_forged_that_started_it(tmp_path: Path,
                                                                      setpriv: bool) -> None:
    """Killed as no handler can see it: the program still gets its signal, whether util-linux's
    setpriv ties it (vfork) or, where there is none, the forked child ties itself."""
    env = dict(os.environ)
    if not setpriv:
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "sleep").symlink_to(shutil.which("sleep") or "/bin/sleep")
        env["PATH"] = str(tmp_path / "bin")
    starter = await trio.lowlevel.open_process([sys.executable, "-c", STARTER],
                                               stdout=subprocess.PIPE, env=env)
    try:
        assert starter.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                line += await starter.stdout.receive_some()
        pid, by_setpriv = line.split()
        assert by_setpriv == str(setpriv).encode()
        assert running(int(pid))
    finally:
        starter.kill()
        await starter.wait()
        if starter.stdout is not None:
            await starter.stdout.aclose()
    with trio.fail_after(5):  # the program outlived the process that started it
        await wait_gone(int(pid))


def test_a_program_tied_after_its_forged_ended_never_runs(tmp_path: Path) -> None:
    """Had forged ended before setpriv asked for the parent-death signal, nothing would send
    it: the program must not start then. Here what starts it is not the process that tied it,
    as an orphan's parent is not."""
    ran = tmp_path / "ran"
    argv, preexec = tied(["touch", str(ran)])
    assert preexec is None, "setpriv is missing here: .ci/run installs util-linux"
    orphaned = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *argv], check=False)
    assert orphaned.returncode == 126 and not ran.exists()
    assert subprocess.run(argv, check=False).returncode == 0 and ran.exists()


def test_a_tied_program_gets_the_environment_it_was_given(tmp_path: Path) -> None:
    """Not the shell's between setpriv and it: no PWD where there was none, and the given
    one where there was (the shell would set it to the folder it runs in)."""
    for given in ({"PATH": os.defpath}, {"PATH": os.defpath, "PWD": "/elsewhere"}):
        argv, _ = tied(["env"], cwd=tmp_path, env=given)
        done = subprocess.run(argv, cwd=tmp_path, env=given, capture_output=True, text=True,
                              check=True)
        assert dict(line.split("=", 1) for line in done.stdout.splitlines()) == given


def touched_pages(ballast: mmap.mmap) -> int:
    """Minor faults this thread takes writing a byte to each of `ballast`'s pages."""
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for offset in range(0, len(ballast), 4096):
        ballast[offset] = 2
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


async def test_starting_a_program_leaves_forgeds_memory_unshared() -> None:
    """A fork would leave each page of forged copy-on-write: the next write to every one of
    them faults (an abort's closing paid ~140 such faults between the command's SIGTERM and
    agent_end). The control, a fork, shows the count sees them here (small pages: a huge
    page would fault once for 512)."""
    ballast = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE)  # (a shared one is not copied)
    ballast.madvise(mmap.MADV_NOHUGEPAGE)
    touched_pages(ballast)
    await trio.run_process(["true"], preexec_fn=lambda: None)  # a fork, as before
    assert touched_pages(ballast) > 4096
    child = await open_process(["true"])
    await child.wait()
    child.close()
    faults = touched_pages(ballast)
    assert faults < 256, f"{faults} of {len(ballast) // 4096} pages were copied on write"


async def test_a_program_that_cannot_be_run_is_refused_as_popen_refuses_it(
        tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await open_process(["no-such-program-here"])
    with pytest.raises(FileNotFoundError):
        await open_process(["./missing"], cwd=tmp_path)
    with pytest.raises(PermissionError):
        await open_process(["./"], cwd=tmp_path)  # a folder
    (tmp_path / "script").write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(PermissionError):
        await open_process(["./script"], cwd=tmp_path)
    (tmp_path / "script").chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "named").symlink_to(tmp_path / "script")
    for argv, env in ((["./script"], None), (["named"], {"PATH": "bin"})):  # (from `cwd`)
        child = await open_process(argv, cwd=tmp_path, env=env)
        assert child.stdout is not None
        assert await child.stdout.receive_some() == b"hi\n"
        await child.wait()
        await child.aclose()


def peak_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


async def test_a_huge_direct_bash_output_keeps_memory_flat(tmp_path: Path) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    child = await spawn(["--no-session"], tmp_path, child_env(agent_dir))
    await child.send({"id": "warm", "type": "bash", "command": "seq 1 100000"})
    await child.read_until("response", id="warm")
    before = peak_kb(child.process.pid)
    await child.send({"id": "big", "type": "bash", "command": "seq 1 5000000"})  # 38 MB
    response = await child.read_until("response", id="big")
    grown = peak_kb(child.process.pid) - before
    kept = Path(response["data"]["fullOutputPath"]).stat().st_size  # while forged runs
    assert child.process.stdin is not None
    await child.process.stdin.aclose()
    await child.process.wait()
    assert response["data"]["truncated"] is True
    assert response["data"]["output"].endswith("4999999\n5000000\n")
    assert kept == 38_888_896
    assert not Path(response["data"]["fullOutputPath"]).exists()  # gone with the session
    assert grown < 20 * 1024, f"peak memory grew by {grown} kB"


def test_a_word_where_a_command_goes_is_an_unknown_command() -> None:
    done = subprocess.run([str(BIN / "forged"), "stats"], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 2
    assert "unknown command 'stats' (did you mean status or stop?)" in done.stderr, done.stderr


async def test_stop_drains_the_daemon_and_status_says_where_it_logs(tmp_path: Path) -> None:
    """A daemon `forged connect` started, a run under way: `forged status` names its pid,
    socket and log file; `forged stop` lets the run finish (a drain, not an abort), waits
    until the process has ended and says so; a second `forged stop` finds none (exit 1)."""
    project, agent_dir, runtime = tmp_path / "project", tmp_path / "agent", tmp_path / "run"
    project.mkdir()
    agent_dir.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [
        {"content": [{"type": "toolCall", "name": "bash", "arguments": {
            "command": "echo started; while [ ! -e go ]; do sleep 0.01; done; echo finished"}}]},
        {"content": [{"type": "text", "text": "Done."}]}]}))
    env = {**child_env(agent_dir), "XDG_RUNTIME_DIR": str(runtime)}
    forged = str(BIN / "forged")
    client = await spawn(["--provider", "scripted", "--script", str(script)], project, env,
                         command=[forged, "connect"])
    try:
        with trio.fail_after(60):
            await client.send({"id": "p", "type": "prompt", "message": "go"})
            await client.read_until("tool_execution_update")
            pid = int((runtime / "forged" / "forged.pid").read_text())
            status = await trio.run_process([forged, "status"], capture_stdout=True, env=env)
            said = status.stdout.decode()
            assert said.startswith(f"forged daemon on {runtime}/forged/forged.sock: 1 live "
                                   "session(s)\n"), said
            assert f"  pid {pid}, log: {runtime}/forged/forged.log\n" in said
            assert "streaming  1 client(s)" in said
            stopper = await trio.lowlevel.open_process([forged, "stop"], env=env,
                                                       stdout=subprocess.PIPE)
            assert stopper.stdout is not None
            heard = b""
            while b"\n" not in heard:
                heard += await stopper.stdout.receive_some(1 << 16)
            assert heard.decode().startswith(
                f"stopping the forged daemon on {runtime}/forged/forged.sock (pid {pid}): 1 "
                "live session(s), 1 running; runs under way get daemon.drainSeconds")
            (project / "go").touch()
            end = await client.read_until("tool_execution_end")
            await client.read_until("agent_settled")
            while chunk := await stopper.stdout.receive_some(1 << 16):
                heard += chunk
            assert await stopper.wait() == 0
    finally:
        client.process.kill()
        await client.process.wait()
    assert heard.decode().endswith("\nstopped\n")
    assert end["isError"] is False and "finished" in end["result"]["content"][0]["text"]
    assert not running(pid) and not (runtime / "forged" / "forged.sock").exists()
    with trio.fail_after(30):
        again = await trio.run_process([forged, "stop"], capture_stdout=True, env=env,
                                       check=False)
    assert (again.returncode, again.stdout.decode()) == (
        1, f"no forged daemon on {runtime}/forged/forged.sock\n")


def test_plain_forged_on_a_terminal_says_what_it_waits_for(tmp_path: Path) -> None:
    """stdin a terminal: one line on stderr saying forged reads JSON commands, and how to try
    -p; then it reads on as ever (the terminal's end ends it)."""
    leader, follower = pty.openpty()
    (tmp_path / "agent").mkdir()
    with subprocess.Popen([str(BIN / "forged"), "--no-session"], stdin=follower,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=child_env(tmp_path / "agent"), cwd=tmp_path) as process:
        os.close(follower)
        os.write(leader, b'{"type": "get_state", "id": "s"}\n')
        os.write(leader, b"\x04")  # Ctrl-D: the end of input
        out, err = process.communicate(timeout=30)
    os.close(leader)
    assert process.returncode == 0, err
    assert "reading JSON commands, one per line, on stdin" in err and "forged -p" in err, err
    answer = json.loads(out.splitlines()[0])
    assert answer["id"] == "s" and answer["success"] is True


def test_the_trace_says_how_much_of_a_commands_output_it_left_out(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [
        {"content": [{"type": "toolCall", "name": "bash", "arguments": {"command": "seq 10"}}]},
        {"content": [{"type": "text", "text": "Counted."}]}]}))
    done, shown = on_a_terminal([str(BIN / "forged"), "-p", "--provider", "scripted",
                                 "--script", str(script), "--cwd", str(tmp_path), "Count"],
                                tmp_path)
    assert done.returncode == 0
    assert shown == ["[bash] seq 10", "    1", "    2", "    3", "    … 7 more lines"]


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (it was just let go)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("through", ["direct", "proxy"])
def test_a_connection_that_cannot_be_made_is_said_with_each_retry(tmp_path: Path,
                                                                 through: str) -> None:
    """`-p` on a terminal, its provider unreachable: each retry is shown as it starts (what
    failed, when the next try is, which of how many), and every message names the provider,
    the host, why in words and the proxy it went through; `auto_retry_start` says the
    same."""
    agent = tmp_path / "agent"
    agent.mkdir()
    port = closed_port()
    url = f"http://127.0.0.1:{port}" if through == "direct" else "https://models.example"
    (agent / "models.json").write_text(json.dumps({"providers": {"local": {
        "baseUrl": url, "api": "anthropic-messages", "apiKey": "k",
        "models": [{"id": "m"}]}}}))
    (agent / "settings.json").write_text(json.dumps({"retry": {"baseDelayMs": 1,
                                                               "maxRetries": 2}}))
    env = {k: v for k, v in child_env(agent).items() if not k.lower().endswith("_proxy")}
    if through == "proxy":
        env["HTTPS_PROXY"] = f"http://127.0.0.1:{port}"
    done, shown = on_a_terminal([str(BIN / "forged"), "-p", "--model", "local/m", "hi"],
                                tmp_path, env)
    why = ("cannot reach local at 127.0.0.1:" + str(port) +
           ": the connection was refused (nothing listens there)" if through == "direct" else
           "cannot reach local at models.example: the connection was refused by the proxy; "
           f"through the proxy http://127.0.0.1:{port} (HTTPS_PROXY)")
    assert done.returncode == 1
    assert shown == [f"[retry 1/2] Connection error: {why}; trying again in 0.001 s",
                     f"[retry 2/2] Connection error: {why}; trying again in 0.002 s",
                     f"forged: Connection error: {why}"]
    rpc = subprocess.run([str(BIN / "forged"), "--model", "local/m", "--no-session"],
                         input=b'{"type":"prompt","message":"hi"}\n', capture_output=True,
                         env=env, timeout=60, check=False)
    retries = [json.loads(line) for line in rpc.stdout.splitlines()
               if b'"auto_retry_start"' in line]
    assert [r["errorMessage"] for r in retries] == [f"Connection error: {why}"] * 2


def test_a_name_that_cannot_be_resolved_hints_at_a_proxy() -> None:
    import socket

    import httpx

    from forged._errors import ProviderStreamError
    from forged._providers.http import provider_errors

    with pytest.raises(ProviderStreamError) as raised, provider_errors(
            "https://api.example.com/v1", "example"):
        try:
            raise socket.gaierror(-2, "Name or service not known")
        except socket.gaierror as exc:
            raise httpx.ConnectError("[Errno -2] Name or service not known") from exc
    assert str(raised.value) == (
        "Connection error: cannot reach example at api.example.com: the name api.example.com "
        "could not be resolved (no network, or no DNS); if this network reaches it through a "
        "proxy, set HTTPS_PROXY or ALL_PROXY")
