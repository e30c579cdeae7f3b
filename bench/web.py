"""The daemon's page (docs/web.md): what a first load costs over loopback, and what the page
costs a daemon no browser visits. Run by hand:

    .venv/bin/python bench/web.py [--loads 20] [--rss-only]

Starts ``forged serve --ws 127.0.0.1:PORT`` (the scripted provider, a temporary agent folder)
and reads its resident memory once it has been idle for 2 s (``--rss-only`` stops there: run
it alternately with ``PYTHONPATH=<a checkout of the base commit>`` for an A/B). Then pairs a
headless Chromium (Debian's, driven by Playwright) and loads ``/`` `--loads` times with the
browser's cache off: the time from the navigation's start until the sessions are listed (the
page loaded, bought a ticket, connected and drew the answer to ``list_sessions``: the page's
own ``forged:drawn`` mark, so the driver's round trips are not counted), and the
bytes the browser took in (every response's transfer size, headers included).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORGED = str(Path(sys.executable).parent / "forged")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ask(socket_path: Path, command: dict[str, object]) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(socket_path))
        client.sendall(json.dumps({**command, "id": "b"}).encode() + b"\n")
        got = b""
        while b'"id":"b"' not in got:
            got += client.recv(65536)
    return dict(json.loads(next(line for line in got.splitlines() if b'"id":"b"' in line)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--rss-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "agent").mkdir()
        script = root / "script.json"
        script.write_text(json.dumps({"replies": []}))
        env = {**os.environ, "AGENT_FORGE_DIR": str(root / "agent"),
               "XDG_RUNTIME_DIR": str(root / "run")}
        port = free_port()
        daemon = subprocess.Popen(
            [FORGED, "serve", "--ws", f"127.0.0.1:{port}", "--provider", "scripted", "--script",
             str(script)], env=env, cwd=root, stderr=subprocess.PIPE)
        try:
            assert daemon.stderr is not None
            while b"listening on ws://" not in daemon.stderr.readline():
                assert daemon.poll() is None, "the daemon did not start"
            time.sleep(2)
            print(f"idle RSS of forged serve --ws: {rss_kb(daemon.pid)} kB")
            if not args.rss_only:
                loads(root, port, args.loads)
                print(f"RSS after the loads: {rss_kb(daemon.pid)} kB")
        finally:
            daemon.terminate()
            daemon.communicate(timeout=30)


def loads(root: Path, port: int, count: int) -> None:
    from playwright.sync_api import sync_playwright

    socket_path = root / "run" / "forged" / "forged.sock"
    pairing = ask(socket_path, {"type": "pair_device", "name": "bench", "role": "owner"})
    link = str(pairing["data"]["link"]).replace("/pair#", "/pair?open#")  # type: ignore[index]
    base = f"http://127.0.0.1:{port}/"
    times, sizes = [], []
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(root / "profile"), executable_path="/usr/bin/chromium", headless=True,
            args=FLAGS, service_workers="block")  # each load a first visit's
        page = context.pages[0]
        page.goto(link)
        page.wait_for_selector("text=No session is live.")
        for _ in range(count):
            fresh = context.new_page()
            cdp = context.new_cdp_session(fresh)
            cdp.send("Network.enable")
            cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
            fresh.goto(base)
            fresh.wait_for_selector("text=No session is live.")
            shown_ms = fresh.evaluate(  # the page's own mark, as it drew the list
                "performance.getEntriesByName('forged:drawn')[0].startTime")
            taken = fresh.evaluate("""[...performance.getEntriesByType('navigation'),
                ...performance.getEntriesByType('resource')]
                .reduce((sum, entry) => sum + entry.transferSize, 0)""")
            times.append(float(shown_ms))
            if os.environ.get("BENCH_WEB_DETAIL"):
                print(fresh.evaluate("""JSON.stringify(performance.getEntriesByType('mark')
                  .map((m) => [m.name, Math.round(m.startTime)]))"""))
                print(fresh.evaluate("""JSON.stringify([
                  ...performance.getEntriesByType('navigation'),
                  ...performance.getEntriesByType('resource')].map((e) => [
                    e.name.replace(location.origin, ''), Math.round(e.startTime),
                    Math.round(e.responseEnd), e.transferSize]))"""))
            sizes.append(int(taken))
            fresh.close()
        context.close()
    print(f"first load to the sessions listed, {count} loads, cache off: "
          f"min {min(times):.0f} ms, median {statistics.median(times):.0f} ms, "
          f"max {max(times):.0f} ms")
    print(f"bytes transferred per load: median {statistics.median(sizes) / 1024:.1f} KiB "
          f"(max {max(sizes) / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
