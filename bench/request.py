"""The event loop's time spent sending one long request: in the daemon, every other session
waits while a step of the loop builds and sends one. Run by hand:

    .venv/bin/python bench/request.py [--kb 400] [--messages 199] [--repeat 20]

A context of `--messages` messages, `--kb` kilobytes in all, is sent to the scripted server
(in a thread with a trio run of its own) through each wire API. A trio instrument adds up the
CPU time (`time.thread_time`, so waiting for the GIL does not count) of every step the
requesting task takes from the call until the provider answered, and keeps the longest step.
Prints the medians over `--repeat` requests.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import trio

from forged import _wire as w
from forged._models import ModelRegistry, register_scripted
from forged._providers import APIS, AssistantBuilder, ProviderRequest, provider_for
from forged._providers.scripted import Reply, ScriptedServer, ScriptText


class StepClock(trio.abc.Instrument):
    """CPU time of each step of one task, while `watching` is set."""

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.steps: list[float] = []
        self._started = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self._started = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps.append(time.thread_time() - self._started)


def context(messages: int, kilobytes: int) -> list[w.AgentMessage]:
    size = kilobytes * 1024 // messages
    words = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    out: list[w.AgentMessage] = []
    for index in range(messages):
        text = w.TextContent(text=f"{index}: {words}")
        if index % 2:
            out.append(w.AssistantMessage(content=[text], api="a", provider="scripted",
                                          model="m", stop_reason="stop", timestamp=1))
        else:
            out.append(w.UserMessage(content=[text], timestamp=1))
    return out


def serve_in_thread(server: ScriptedServer) -> None:
    started = threading.Event()

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            started.set()

    threading.Thread(target=trio.run, args=(serve,), daemon=True).start()
    started.wait()


async def measure(api: str, messages: list[w.AgentMessage], server: ScriptedServer,
                  repeat: int) -> dict[str, float]:
    registry = ModelRegistry()
    register_scripted(registry, server.base_url)
    model = registry.find("scripted", api)
    assert model is not None
    clock = StepClock()
    trio.lowlevel.add_instrument(clock)
    totals: list[float] = []
    longest: list[float] = []
    stream = provider_for(api)
    for _ in range(repeat + 1):  # the first warms the connection and the hooks
        server.add(Reply(content=[ScriptText(text="ok")]))
        request = ProviderRequest(model=model, system_prompt="You are a bench.",
                                  messages=messages, tools=[], thinking_level="off",
                                  api_key="k", headers={}, session_id="bench")
        out = AssistantBuilder(model, lambda _: None)
        clock.task, clock.steps = trio.lowlevel.current_task(), []
        await stream(request, out)
        clock.task = None
        totals.append(sum(clock.steps) * 1000)
        longest.append(max(clock.steps) * 1000)
    trio.lowlevel.remove_instrument(clock)
    body = len(server.requests[-1].body.__repr__())
    return {"total_ms": statistics.median(totals[1:]), "longest_ms": statistics.median(
        longest[1:]), "body_kb": body / 1024}


async def main(kilobytes: int, count: int, repeat: int) -> None:
    server = ScriptedServer()
    serve_in_thread(server)
    messages = context(count, kilobytes)
    results: dict[str, dict[str, Any]] = {}
    for api in APIS:
        results[api] = await measure(api, messages, server, repeat)
    print(f"{count} messages, about {kilobytes} KB: loop time of the requesting task, "
          f"call to answer (median of {repeat}); target < 2 ms")
    for api, result in results.items():
        print(f"  {api:<20} {result['total_ms']:6.2f} ms in all, longest step "
              f"{result['longest_ms']:5.2f} ms  (body ~{result['body_kb']:.0f} KB)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=int, default=400)
    parser.add_argument("--messages", type=int, default=199)
    parser.add_argument("--repeat", type=int, default=20)
    arguments = parser.parse_args()
    trio.run(main, arguments.kb, arguments.messages, arguments.repeat)
