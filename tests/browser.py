"""The daemon's page in a real browser: headless Debian Chromium driven by Playwright for
Python (its sync API, in a worker thread, while the daemon serves in the test's trio run),
a TCP proxy that can drop every connection (a phone going to sleep), and axe-core."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from forged._providers.script import Reply

from .chromium import FLAGS, find_chromium
from .harness import Daemon, open_daemon
from .test_daemon import free_port

T = TypeVar("T")
SHOTS = Path(__file__).parent.parent / "docs" / "images"
PHONE: Any = {"width": 390, "height": 844}
DESKTOP: Any = {"width": 1280, "height": 860}
"""Viewports (Playwright's ``ViewportSize``)."""


def has_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return find_chromium() is not None


class Proxy:
    """127.0.0.1:`port` forwarding to the daemon's listener; `cut` drops every connection
    through it, and while `down` new ones are closed at once."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.down = False
        self.connections = 0
        self._scopes: list[trio.CancelScope] = []
        self._flowing = trio.Event()
        self._flowing.set()

    def freeze(self) -> None:
        """Nothing passes, and nothing is closed: a connection open on one side only (a
        phone asleep), until `thaw`."""
        self._flowing = trio.Event()

    def thaw(self) -> None:
        self._flowing.set()

    def cut(self, *, stay_down: bool) -> None:
        self.down = stay_down
        for scope in self._scopes:
            scope.cancel()

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        task_status.started()
        await trio.serve_listeners(self._forward, listeners)

    async def _forward(self, client: trio.SocketStream) -> None:
        if self.down:
            await client.aclose()
            return
        self.connections += 1
        with trio.CancelScope() as scope:
            self._scopes.append(scope)
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target)
            async with client, upstream, trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
                nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)
        self._scopes.remove(scope)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream,
                    done: trio.CancelScope) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await source.receive_some(65536):
                await self._flowing.wait()
                await sink.send_all(data)
        done.cancel()


@attrs.define
class Web:
    """A daemon with its page on 127.0.0.1 (through `proxy`), and the owner on its socket."""

    daemon: Daemon
    base: str
    proxy: Proxy
    project: Path

    async def link(self, name: str, role: str) -> str:
        """A pairing link (through the proxy) that signs a browser in and opens the page."""
        async with self.daemon.client() as owner:
            pairing = await owner.pair_device(name, role)
        return f"{self.base}/pair?open#{pairing.link.rpartition('#')[2]}"


@asynccontextmanager
async def open_web(tmp_path: Path, replies: list[Reply] | None = None, **serve: Any
                   ) -> AsyncIterator[Web]:
    port = free_port()
    proxy = Proxy(port)
    base = f"http://127.0.0.1:{proxy.port}"
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        async with open_daemon(tmp_path, replies, ws=("127.0.0.1", port),
                               ws_allow_origins=[base], **serve) as daemon:
            yield Web(daemon, base, proxy, tmp_path / "project")
        nursery.cancel_scope.cancel()


def on_trio(work: Callable[..., Any], *args: Any) -> Any:
    """From the browser's thread: `work(*args)` (a coroutine function) run in the test's
    trio run."""
    return trio.from_thread.run(work, *args)


@contextlib.contextmanager
def browser_page(profile: Path, viewport: Any) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    binary = find_chromium()
    assert binary is not None
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=binary, headless=True, viewport=viewport,
            args=[flag for flag in FLAGS if not flag.startswith("--remote-")
                  and flag != "--headless"],
            env={**os.environ, "HOME": str(profile)})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(20_000)  # a hang guard; nothing waits on it
            yield page
        finally:
            context.close()


async def in_browser(profile: Path, scenario: Callable[[Any], T], *,
                     viewport: Any = None) -> T:
    """`scenario(page)` run in a browser of its own, in a worker thread."""
    def run() -> T:
        with browser_page(profile, viewport or DESKTOP) as page:
            return scenario(page)

    return await trio.to_thread.run_sync(run)


AXE: str | None = None


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's violations of serious or critical impact on the page as it is."""
    global AXE
    if AXE is None:
        import axe_playwright_python  # (its copy of axe-core only)

        AXE = (Path(axe_playwright_python.__file__).parent / "axe.min.js").read_text()
    page.evaluate(AXE)
    found = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [violation for violation in found["violations"]
            if violation["impact"] in ("serious", "critical")]


def screenshot(page: Any, name: str) -> None:
    """A picture of the page for README.md and docs/web.md, written where they show it."""
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))
