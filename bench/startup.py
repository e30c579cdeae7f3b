"""Start-up, side by side: spawn to the first answer, and the CPU a process burns from spawn
to exit, for forged's fronts and Codex's app-server, alternating runs so noise falls on all
alike. Run by hand (never a timed test):

    .venv/bin/python bench/startup.py [--runs 20] [--codex PATH]

Measured: ``forged --mode rpc`` (``get_state``), ``forged --mode acp`` (``initialize``),
``forged connect`` and ``forged connect --acp`` to a daemon this script starts (the thin
path), Codex's ``codex app-server`` (``initialize``; its ``CODEX_HOME`` a temporary folder
whose config.toml points a ``wire_api = "responses"`` provider at 127.0.0.1, which start-up
never calls), and the floors: ``python -c 'import trio'`` from the same environment (the
direct path's) and ``python -c pass`` (the thin path's: the interpreter alone). Each
process gets its request on stdin, is timed until the answer's line, then its stdin is closed
and its CPU (user + system, ``wait4``) read when it exits. ``--codex`` names the native
binary (``npm install @openai/codex``: node_modules/@openai/codex-linux-x64/vendor/
x86_64-unknown-linux-musl/bin/codex); without it Codex is left out.

The ``forged`` measured is the one beside the Python running this script. Run it from a
regular install (``python3 -m venv /tmp/v && /tmp/v/bin/pip install . && /tmp/v/bin/python
bench/startup.py``), as users have it: an editable install (``pip install -e``) adds
setuptools' import hook to every start of that Python, ~10 ms here, on every row.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORGED = str(Path(sys.executable).parent / "forged")
GET_STATE = b'{"type":"get_state","id":"s"}\n'
ACP_INITIALIZE = (b'{"jsonrpc":"2.0","id":1,"method":"initialize",'
                  b'"params":{"protocolVersion":1}}\n')
CODEX_INITIALIZE = (b'{"jsonrpc":"2.0","id":1,"method":"initialize",'
                    b'"params":{"clientInfo":{"name":"bench","version":"1"}}}\n')


def one(argv: list[str], request: bytes | None, env: dict[str, str], cwd: Path
        ) -> tuple[float, float]:
    """Spawn to the first line of output (or to exit, with no request) in ms, and the CPU
    seconds to exit."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    assert process.stdin is not None and process.stdout is not None
    answered = float("nan")
    if request is not None:
        process.stdin.write(request)
        process.stdin.flush()
        buffered = b""
        while b"\n" not in buffered:
            ready, _, _ = select.select([process.stdout], [], [], 30)
            if not ready:
                raise RuntimeError(f"{argv[:3]} did not answer in 30 s")
            chunk = os.read(process.stdout.fileno(), 1 << 16)
            if not chunk:
                raise RuntimeError(f"{argv[:3]} ended without answering")
            buffered += chunk
        answered = (time.perf_counter() - started) * 1000
    process.stdin.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        os.read(process.stdout.fileno(), 1 << 16) if select.select(
            [process.stdout], [], [], 0.01)[0] else None
    else:
        process.kill()
        pid, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    process.stdout.close()
    if request is None:
        answered = (time.perf_counter() - started) * 1000
    return answered, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--codex", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        project, agent, run, codex_home = (root / "project", root / "agent", root / "run",
                                           root / "codex")
        for folder in (project, agent, codex_home):
            folder.mkdir()
        (codex_home / "config.toml").write_text(
            'model = "mock-model"\nmodel_provider = "mock"\n\n[model_providers.mock]\n'
            'name = "mock"\nbase_url = "http://127.0.0.1:9/v1"\nwire_api = "responses"\n'
            'env_key = "MOCK_API_KEY"\n')
        env = {**os.environ, "AGENT_FORGE_DIR": str(agent), "XDG_RUNTIME_DIR": str(run),
               "CODEX_HOME": str(codex_home), "MOCK_API_KEY": "mock"}
        daemon = subprocess.Popen([FORGED, "serve"], env=env, cwd=project,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            socket_path = run / "forged" / "forged.sock"
            while not socket_path.exists():
                time.sleep(0.01)
            contenders: dict[str, tuple[list[str], bytes | None]] = {
                "python -c 'import trio' (the floor)": (
                    [sys.executable, "-c", "import trio"], None),
                "python -c pass (the thin path's floor)": (
                    [sys.executable, "-c", "pass"], None),
                "forged --mode rpc: get_state": ([FORGED, "--mode", "rpc", "--no-session"],
                                                 GET_STATE),
                "forged --mode acp: initialize": ([FORGED, "--mode", "acp"], ACP_INITIALIZE),
                "forged connect: get_state": ([FORGED, "connect", "--no-start"], GET_STATE),
                "forged connect --acp: initialize": (
                    [FORGED, "connect", "--acp", "--no-start"], ACP_INITIALIZE)}
            if args.codex is not None:
                contenders["codex app-server: initialize"] = (
                    [str(args.codex), "app-server"], CODEX_INITIALIZE)
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
            for _ in range(args.runs):
                for name, (argv, request) in contenders.items():
                    results[name].append(one(argv, request, env, project))
        finally:
            daemon.terminate()
            daemon.wait()
    floor = statistics.median(ms for ms, _ in results["python -c 'import trio' (the floor)"])
    codex = results.get("codex app-server: initialize")
    codex_ms = statistics.median(ms for ms, _ in codex) if codex else None
    print(f"{args.runs} runs each, alternating; medians (min-max)")
    for name, values in results.items():
        ms = [value for value, _ in values]
        cpu = [value * 1000 for _, value in values]
        over = statistics.median(ms) - floor
        line = (f"  {name:38} {statistics.median(ms):7.1f} ms ({min(ms):.0f}-{max(ms):.0f})"
                f"  cpu {statistics.median(cpu):6.1f} ms  floor {over:+6.1f}")
        if codex_ms is not None:
            line += f"  x codex {statistics.median(ms) / codex_ms:5.2f}"
        print(line)
    print(json.dumps({name: [round(ms, 2) for ms, _ in values]
                      for name, values in results.items()}), file=sys.stderr)


if __name__ == "__main__":
    main()
