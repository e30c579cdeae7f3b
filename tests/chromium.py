"""Headless Chromium driven over the DevTools protocol (a WebSocket, via trio-websocket)."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--remote-allow-origins=*",
]


def find_chromium() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)


class Page:
    """One tab: commands answered by id, every event kept in `events`."""

    def __init__(self, socket: WebSocketConnection) -> None:
        self.socket = socket
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        await self.socket.send_message(orjson.dumps(
            {"id": call_id, "method": method, "params": params}).decode())
        while True:
            message = orjson.loads(await self.socket.get_message())
            if message.get("id") == call_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    async def wait_event(self, method: str) -> dict[str, Any]:
        while True:
            for event in self.events:
                if event.get("method") == method:
                    self.events.remove(event)
                    return event
            self.events.append(orjson.loads(await self.socket.get_message()))

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression,
                                 returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(result["exceptionDetails"])
        return result["result"].get("value")

    def console_errors(self) -> list[dict[str, Any]]:
        errors = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if (method == "Runtime.exceptionThrown"
                    or (method == "Runtime.consoleAPICalled" and params.get("type") == "error")
                    or (method == "Log.entryAdded"
                        and params.get("entry", {}).get("level") == "error")):
                errors.append(event)
        return errors


@asynccontextmanager
async def open_page(binary: str, profile: Path) -> AsyncIterator[Page]:
    """A fresh headless Chromium with one blank tab, closed on exit."""
    process = await trio.lowlevel.open_process(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        with trio.fail_after(30):
            # Chromium's own file, the only sign it listens: polled.
            while not port_file.exists() or not port_file.read_text().strip():  # noqa: ASYNC110
                await trio.sleep(0.05)
            port = port_file.read_text().split()[0]
            async with httpx.AsyncClient() as http:
                while True:
                    targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
                    pages = [t for t in targets if t.get("type") == "page"]
                    if pages:
                        break
                    await trio.sleep(0.05)
        async with open_websocket_url(pages[0]["webSocketDebuggerUrl"],
                                      max_message_size=64 << 20) as socket:
            page = Page(socket)
            for domain in ("Runtime", "Log", "Page"):
                await page.call(f"{domain}.enable")
            yield page
    finally:
        process.terminate()
        with trio.move_on_after(5) as waited:
            await process.wait()
        if waited.cancelled_caught:
            process.kill()
            await process.wait()
