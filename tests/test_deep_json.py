"""Deep and broken JSON at every reader of outside input: each answers with its usual error
and goes on. A line nested past the interpreter's recursion limit once took ``--mode acp``
down (and the daemon with it, through ACP on its socket): the reader that looks for a request
id in a line it could not read recursed."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings, strategies as st

from .test_jsonrpc import open_peer
from .test_process import BIN, child_env, stop_daemon

ISSUES_LINE = ('{"jsonrpc":"2.0","id":1,"method":"initialize","params":' + "[" * 1100 +
               "]" * 1100 + "}")
INITIALIZE = '{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"protocolVersion":1}}'


def nested(depth: int, kind: str, broken: bool) -> str:
    """A value nested `depth` deep, of arrays or objects; `broken`: its end cut off."""
    opening, closing = ("[", "]") if kind == "array" else ('{"a":', "}")
    value = opening * depth + "1" + closing * depth
    return value[: len(value) // 2] if broken else value


deep_values = st.builds(nested, st.integers(0, 30_000), st.sampled_from(["array", "object"]),
                        st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=deep_values, where=st.sampled_from(["params", "id", "result", "whole"]))
def test_an_acp_peer_reads_on_after_any_line(value: str, where: str) -> None:
    line = {"params": f'{{"jsonrpc":"2.0","id":1,"method":"m","params":{value}}}',
            "id": f'{{"jsonrpc":"2.0","id":{value},"method":"m"}}',
            "result": f'{{"jsonrpc":"2.0","id":1,"result":{value}}}',
            "whole": value}[where]

    async def handler(method: str, params: Any, request_id: Any) -> object:
        return {"ok": method}

    async def main() -> None:
        async with open_peer(handler) as (_, raw):
            await raw.write(line.encode())
            await raw.write(b'{"jsonrpc":"2.0","id":"after","method":"next"}')
            with trio.fail_after(10):
                while (answer := await raw.read()).get("id") != "after":
                    assert "error" in answer or "result" in answer
            assert answer["result"] == {"ok": "next"}

    trio.run(main)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(value=deep_values, field=st.sampled_from(["value", "images", "id", "message"]))
def test_an_rpc_session_reads_on_after_any_line(tmp_path: Path, value: str,
                                                field: str) -> None:
    from .harness import open_client

    line = {"value": f'{{"type":"extension_ui_response","id":"x","value":{value}}}',
            "images": f'{{"type":"prompt","message":"hi","images":{value}}}',
            "id": f'{{"type":"get_state","id":{value}}}',
            "message": f'{{"type":"steer","message":{value}}}'}[field]

    async def main() -> None:
        async with open_client(tmp_path) as client:
            await client.send_raw(line.encode() + b"\n")
            state = await client.request({"type": "get_state"})
            assert state["success"]

    trio.run(main)


def run_forged(args: list[str], lines: list[str], env: dict[str, str], cwd: Path
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "forged"), *args],
                          input="".join(f"{line}\n" for line in lines), capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=60, check=False)


def test_the_issues_line_leaves_mode_acp_answering(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    done = run_forged(["--mode", "acp", "--no-session"], [ISSUES_LINE, INITIALIZE],
                      child_env(tmp_path / "agent"), tmp_path)
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert answers[0]["error"]["code"] == -32700 and answers[1]["id"] == 9


def test_the_issues_line_through_acp_on_the_daemons_socket_ends_no_connection(
        tmp_path: Path) -> None:
    """A daemon (a real one) whose ACP front reads the line: it answers, and every other
    client still has its daemon."""
    (tmp_path / "agent").mkdir()
    env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    try:
        first = run_forged(["connect", "--acp"], [ISSUES_LINE, INITIALIZE], env, tmp_path)
        second = run_forged(["connect"], ['{"type":"get_state","id":"s"}'], env, tmp_path)
    finally:
        stop_daemon(tmp_path / "run")
    answers = [json.loads(line) for line in first.stdout.splitlines()]
    assert answers[0]["error"]["code"] == -32700 and answers[1]["id"] == 9, first.stderr
    assert json.loads(second.stdout)["success"], second.stderr
    log = (tmp_path / "run" / "forged" / "forged.log").read_text()
    assert "Traceback" not in log


def test_a_deep_line_on_the_daemons_socket_and_websocket(tmp_path: Path) -> None:
    from .test_daemon import free_port

    (tmp_path / "agent").mkdir()
    env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    port = free_port()
    daemon = subprocess.Popen([str(BIN / "forged"), "serve", "--ws", f"127.0.0.1:{port}"],
                              env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        sock_path = tmp_path / "run" / "forged" / "forged.sock"
        assert daemon.stderr is not None
        while "listening on ws://" not in daemon.stderr.readline():
            assert daemon.poll() is None, "the daemon did not start"
        deep = ISSUES_LINE.replace('"jsonrpc":"2.0","id":1,"method":"initialize"',
                                   '"type":"prompt","message":"hi"')
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sock_path))
            client.sendall(deep.encode() + b'\n{"type":"get_state","id":"s"}\n')
            got = b""
            while b'"id":"s"' not in got:
                got += client.recv(1 << 16)
        token = (tmp_path / "run" / "forged" / "ws-token").read_text().strip()
        answers = trio.run(_over_websocket, port, token, deep)
    finally:
        daemon.terminate()
        _, stderr = daemon.communicate(timeout=30)
    assert b"nested deeper" in got or b"depth limit" in got
    assert answers[-1]["id"] == "s" and "Traceback" not in stderr


async def _over_websocket(port: int, token: str, deep: str) -> list[dict[str, Any]]:
    from trio_websocket import open_websocket_url

    answers: list[dict[str, Any]] = []
    async with open_websocket_url(f"ws://127.0.0.1:{port}/", extra_headers=[
            (b"authorization", f"Bearer {token}".encode())]) as ws:
        await ws.send_message(deep)
        await ws.send_message('{"type":"get_state","id":"s"}')
        with trio.fail_after(10):
            while not answers or answers[-1].get("id") != "s":
                answers.append(json.loads(await ws.get_message()))
    return answers


FILES = {
    "settings": ("agent/settings.json", '{{"retry":{{"x":{v}}}}}'),
    "mcp": ("agent/mcp.json", '{{"mcpServers":{{"a":{{"command":"true","args":{v}}}}}}}'),
    "auth": ("agent/auth.json", '{{"anthropic":{{"type":"api_key","key":{v}}}}}'),
    "models": ("agent/models.json", '{{"providers":{{"x":{{"baseUrl":"http://127.0.0.1:1",'
               '"api":"openai-completions","apiKey":"k","models":[{{"id":"m","x":{v}}}]}}}}}}'),
    "session": ("project/s.jsonl", '{{"type":"session","version":3,"id":'
                '"11111111-1111-1111-1111-111111111111","timestamp":"2026-01-01T00:00:00Z",'
                '"cwd":"."}}\n{{"type":"message","id":"a1","parentId":null,"timestamp":'
                '"2026-01-01T00:00:00Z","message":{{"role":"user","content":[{{"type":"text",'
                '"text":"x"}}],"timestamp":1,"x":{v}}}}}\n'),
    "script": ("script.json", '{{"replies":[{{"content":[{{"type":"text","text":"hi",'
               '"x":{v}}}]}}]}}'),
}


@pytest.mark.parametrize("depth", [300, 1100, 100_000])
@pytest.mark.parametrize("reader", list(FILES))
def test_a_deep_file_is_read_with_its_usual_error(tmp_path: Path, reader: str,
                                                  depth: int) -> None:
    """settings, mcp.json, auth.json, models.json, a session file, a script: deep anywhere,
    forged still answers (a script it cannot read ends the process, as a broken one does)."""
    for folder in ("agent", "project"):
        (tmp_path / folder).mkdir()
    name, template = FILES[reader]
    (tmp_path / name).write_text(template.format(v="[" * depth + "1" + "]" * depth))
    args = ["--mode", "rpc"]
    if reader == "session":
        args += ["--session", str(tmp_path / name)]
    else:
        args += ["--no-session"]
    if reader == "script":
        args += ["--provider", "scripted", "--script", str(tmp_path / name)]
    env = {**child_env(tmp_path / "agent"), "HOME": str(tmp_path)}
    done = run_forged(args, ['{"type":"get_state","id":"s"}', '{"type":"get_messages","id":"m"}',
                             '{"type":"prompt","id":"p","message":"hi"}',
                             '{"type":"get_state","id":"last"}'], env, tmp_path / "project")
    assert "Traceback" not in done.stderr, done.stderr
    if reader == "script" and depth > 1024:
        assert done.returncode == 1 and "Cannot read script" in done.stderr
        return
    assert done.returncode == 0 and '"id":"last"' in done.stdout, done.stderr


def test_ill_typed_params_are_invalid_params_not_an_internal_error(tmp_path: Path) -> None:
    """A list, a string or a number as an ACP request's params: -32602 saying so, no
    traceback, and the next request answered."""
    (tmp_path / "agent").mkdir()
    lines = [json.dumps({"jsonrpc": "2.0", "id": index, "method": method, "params": params})
             for index, (method, params) in enumerate([
                 ("initialize", [1]), ("session/new", "x"), ("session/prompt", 3),
                 ("authenticate", [])], start=1)]
    done = run_forged(["--mode", "acp", "--no-session"], [*lines, INITIALIZE],
                      child_env(tmp_path / "agent"), tmp_path)
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert [answer["error"]["code"] for answer in answers[:4]] == [-32602] * 4, answers
    assert "takes an object, not list" in answers[0]["error"]["message"]
    assert answers[4]["id"] == 9 and "result" in answers[4]
