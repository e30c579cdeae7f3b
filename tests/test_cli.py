"""`forged -p` and `forged --mode json` as processes, as scripts run them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from .test_process import BIN, child_env


async def run_forged(tmp_path: Path, args: list[str], replies: list[dict[str, Any]], *,
                     stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    (tmp_path / "agent").mkdir(exist_ok=True)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": replies}))
    with trio.fail_after(30):
        return await trio.run_process(
            [str(BIN / "forged"), "--provider", "scripted", "--script", str(script), *args],
            stdin=stdin, capture_stdout=True, capture_stderr=True, check=False,
            env=child_env(tmp_path / "agent"), cwd=tmp_path)


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


def stored_user_texts(tmp_path: Path) -> list[str]:
    (session,) = (tmp_path / "agent" / "sessions").rglob("*.jsonl")
    entries = [json.loads(line) for line in session.read_text().splitlines()]
    return [e["message"]["content"][0]["text"] for e in entries
            if e.get("type") == "message" and e["message"]["role"] == "user"]


async def test_print_mode_prints_the_last_reply_with_piped_input_first(tmp_path: Path) -> None:
    result = await run_forged(tmp_path, ["-p", "Summarize this"],
                              [text("First line.\nSecond line.")], stdin=b"log output\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"First line.\nSecond line.\n"
    assert stored_user_texts(tmp_path) == ["log output\n\nSummarize this"]


async def test_print_mode_sends_each_message_in_turn(tmp_path: Path) -> None:
    result = await run_forged(tmp_path, ["-p", "one", "two"], [text("A"), text("B")])
    assert result.stdout == b"B\n"
    assert stored_user_texts(tmp_path) == ["one", "two"]


async def test_print_mode_exits_1_when_the_model_fails(tmp_path: Path) -> None:
    result = await run_forged(tmp_path, ["-p", "hi"],
                              [{"status": 400, "errorMessage": "bad request"}])
    assert result.returncode == 1
    assert result.stdout == b""
    assert b"bad request" in result.stderr


async def test_print_mode_exits_1_when_the_prompt_is_refused(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    with trio.fail_after(30):
        result = await trio.run_process(
            [str(BIN / "forged"), "-p", "hi"], capture_stdout=True, capture_stderr=True,
            check=False, env=child_env(tmp_path / "agent"), cwd=tmp_path)
    assert result.returncode == 1
    assert b"forged: No model selected" in result.stderr


async def test_a_built_in_model_without_its_key_is_refused_at_once(tmp_path: Path) -> None:
    """Never the variable's name sent as the key, and no retries: the prompt is refused,
    saying which variable to set."""
    (tmp_path / "agent").mkdir()
    with trio.fail_after(30):
        result = await trio.run_process(
            [str(BIN / "forged"), "-p", "--model", "anthropic/claude-sonnet-4-6", "hi"],
            capture_stdout=True, capture_stderr=True, check=False,
            env=child_env(tmp_path / "agent"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [
        "forged: No API key for anthropic: set ANTHROPIC_API_KEY, or apiKey in models.json"]


async def test_json_mode_prints_the_header_then_every_event(tmp_path: Path) -> None:
    result = await run_forged(tmp_path, ["--mode", "json", "one", "two"],
                              [text("A"), text("B")], stdin=b"piped")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0]["type"] == "session" and lines[0]["version"] == 3
    kinds = [line["type"] for line in lines[1:]]
    assert kinds.count("agent_start") == 2 and kinds.count("agent_settled") == 2
    assert kinds[-1] == "agent_settled" and "response" not in kinds
    assert stored_user_texts(tmp_path) == ["piped\n\none", "two"]


async def test_messages_need_a_mode_that_takes_them(tmp_path: Path) -> None:
    result = await run_forged(tmp_path, ["--mode", "rpc", "hello"], [])
    assert result.returncode == 2
    assert b"MESSAGE arguments need -p or --mode json" in result.stderr
    result = await run_forged(tmp_path, ["--mode", "json"], [])
    assert result.returncode == 2


@pytest.mark.parametrize("mode", [["--mode", "json"], ["-p"]])
async def test_ctrl_c_aborts_writes_the_closing_events_and_exits_130(
        tmp_path: Path, mode: list[str]) -> None:
    (tmp_path / "agent").mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [{"content": [
        {"type": "text", "text": "x" * 400, "chunks": 400, "delayMs": 20}]}]}))
    process = await trio.lowlevel.open_process(
        [str(BIN / "forged"), "--provider", "scripted", "--script", str(script), *mode,
         "first", "never sent"], cwd=tmp_path, env=child_env(tmp_path / "agent"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    out = bytearray()
    with trio.fail_after(20):
        if mode[0] == "--mode":
            while b'"text_delta"' not in out:  # streaming: now interrupt it
                out += await process.stdout.receive_some(1 << 16)
        else:
            while not list(  # noqa: ASYNC110 (the prompt is under way in another process)
                    (tmp_path / "agent" / "sessions").rglob("*.jsonl")):
                await trio.sleep(0.01)
        process.send_signal(signal.SIGINT)
        while data := await process.stdout.receive_some(1 << 16):
            out += data
        code = await process.wait()
        err = await process.stderr.receive_some(1 << 16)
    assert code == 130
    assert err == b"forged: SIGINT: shutting down\n"  # one line, no traceback
    if mode[0] == "--mode":
        events = [json.loads(line)["type"] for line in out.splitlines()]
        assert events[-4:] == ["message_end", "turn_end", "agent_end", "agent_settled"]
        assert events.count("agent_start") == 1  # the second message was not sent
    assert stored_user_texts(tmp_path) == ["first"]


@pytest.mark.parametrize("session", ["a-folder/", "*", "./main.py"])
async def test_a_bad_session_option_is_one_line_not_a_traceback(tmp_path: Path,
                                                                session: str) -> None:
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "main.py").write_text("print('hello')\n")
    result = await run_forged(tmp_path, ["--mode", "rpc", "--session", session], [])
    assert result.returncode == 1
    (line,) = result.stderr.decode().splitlines()
    assert line.startswith("forged: ") and "Traceback" not in line
    assert (tmp_path / "main.py").read_text() == "print('hello')\n"


@pytest.mark.parametrize("args", [["config"], ["config", "bogus"], ["-p"]])
def test_a_command_missing_its_part_says_what_it_needs(tmp_path: Path, args: list[str]) -> None:
    """``forged config`` (or a command it does not have) is not a MESSAGE, and -p with no
    message names -p."""
    (tmp_path / "agent").mkdir()
    done = subprocess.run([str(BIN / "forged"), *args], input=b"", capture_output=True,
                          timeout=30, env=child_env(tmp_path / "agent"), check=False)
    said = done.stderr.decode()
    assert done.returncode == 2 and "MESSAGE arguments" not in said
    if args == ["-p"]:
        assert said == "forged: -p needs a MESSAGE argument or piped input\n"
    else:
        assert said.startswith("usage: forged config show")
        assert ("needs a command: show" if len(args) == 1 else "unknown command 'bogus'") in said


def test_a_scripted_daemon_says_it_plays_one_script_for_all(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [text("A")]}))
    daemon = subprocess.Popen(
        [str(BIN / "forged"), "serve", "--socket", str(tmp_path / "run" / "forged.sock"),
         "--provider", "scripted", "--script", str(script)], stderr=subprocess.PIPE,
        env=child_env(tmp_path / "agent"), cwd=tmp_path)
    assert daemon.stderr is not None
    said = []
    try:
        for line in daemon.stderr:  # until it listens (a hang guard: its own start-up)
            said.append(line.decode())
            if "listening on" in line.decode():
                break
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    assert (f"forged: --script {script}: one playback for the whole daemon; its sessions "
            "take the replies in turn, whichever asks\n") in said


COLLECTOR_PLUGIN = """
import gc

def register(api):
    def report(args, ctx):
        raise RuntimeError(f"on={gc.isenabled()} frozen={gc.get_freeze_count() > 10_000}")

    api.register_command("collector", report)
"""


async def test_the_collector_runs_once_started_with_start_ups_objects_frozen(
        tmp_path: Path) -> None:
    """Start-up pauses the cyclic collector while forged's modules load (`forged._startup`);
    a running process has it on again, and what start-up made out of its view."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "collector.py").write_text(COLLECTOR_PLUGIN)
    with trio.fail_after(30):
        done = await trio.run_process(
            [str(BIN / "forged"), "--mode", "rpc", "--plugin", str(tmp_path / "collector.py")],
            stdin=b'{"id": "1", "type": "prompt", "message": "/collector"}\n',
            capture_stdout=True, capture_stderr=True, env=child_env(tmp_path / "agent"),
            cwd=tmp_path)
    answer = json.loads(done.stdout.splitlines()[0])
    assert answer["error"] == "Command /collector failed: on=True frozen=True"


async def test_with_no_model_forged_says_where_pis_keys_are_and_how_to_start(
        tmp_path: Path) -> None:
    """pi keeps auth.json in ~/.pi/agent, forged in its own folder: with no usable model and
    pi's file there, ``-p`` says how to share it, ``forged login`` and the scripted
    provider."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "home" / ".pi" / "agent").mkdir(parents=True)
    (tmp_path / "home" / ".pi" / "agent" / "auth.json").write_text("{}")
    with trio.fail_after(30):
        result = await trio.run_process(
            [str(BIN / "forged"), "-p", "hi"], capture_stdout=True, capture_stderr=True,
            check=False, env={**child_env(tmp_path / "agent"), "HOME": str(tmp_path / "home")},
            cwd=tmp_path)
    said = result.stderr.decode()
    assert result.returncode == 1
    assert (f"pi's keys and models are in {tmp_path / 'home/.pi/agent'}, which forged reads "
            f"only with PI_CODING_AGENT_DIR={tmp_path / 'home/.pi/agent'} set") in said, said
    assert "forged login PROVIDER" in said and "--provider scripted --script FILE" in said


def test_help_prints_the_socket_that_would_be_used() -> None:
    """With no XDG_RUNTIME_DIR, the default the help names is the /tmp folder forged uses."""
    env = {name: value for name, value in os.environ.items() if name != "XDG_RUNTIME_DIR"}
    done = subprocess.run([str(BIN / "forged"), "serve", "--help"], capture_output=True,
                          text=True, env=env, timeout=30, check=True)
    assert f"/tmp/forged-{os.getuid()}/forged/forged.sock" in " ".join(done.stdout.split())
    assert "$XDG_RUNTIME_DIR" not in done.stdout
