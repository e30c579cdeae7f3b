"""The dispatcher on its own, with no provider and no process: what it holds during a session
switch, and when it answers an abort, an abort_retry and a compact (as the events of what they
asked for pass). The session is a stand-in whose switch, run and abort the test drives."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import trio

from forged import _wire as w
from forged._dispatch import Dispatcher
from forged._errors import CommandError
from forged._session import Session


class Run:
    def __init__(self) -> None:
        self.compactions: list[str | None] = []
        self.retrying = False

    def compact(self, instructions: str | None) -> None:
        self.compactions.append(instructions)

    def cancel_retry(self) -> bool:
        was, self.retrying = self.retrying, False
        return was


class Queues:
    def __init__(self) -> None:
        self.queued: list[tuple[str, str]] = []

    def add(self, kind: str, text: str, images: object, caller: object = None) -> None:
        self.queued.append((kind, text))


class NoPlugins:
    def command_for(self, text: str) -> None:
        return None


class Resources:
    def expand(self, text: str) -> str:
        return text


class Mcp:
    """The session's MCP servers, as the dispatcher reads them: ``/mcp__…`` names a server's
    prompt, rendered once `rendered` is set (``/mcp__s__broken`` fails)."""

    def __init__(self) -> None:
        self.rendered = trio.Event()

    def names_prompt(self, text: str) -> bool:
        return text.startswith("/mcp__")

    async def render(self, text: str) -> str:
        await self.rendered.wait()
        if text == "/mcp__s__broken":
            raise CommandError("/mcp__s__broken: MCP server s refused the prompt: broke")
        return f"rendered {text}"


class Stand:
    """What the dispatcher reads of a session: `name` says which session a command landed in,
    `busy` whether a run (or compaction) is under way, and a switch waits for `switch_done`."""

    def __init__(self, nursery: trio.Nursery, name: str = "old") -> None:
        self.nursery = nursery
        self.name = name
        self.busy = False
        self.prompts: list[tuple[str, str]] = []
        self.run = Run()
        self.queues = Queues()
        self.plugins = NoPlugins()
        self.resources = Resources()
        self.mcp = Mcp()
        self.session_dir: Path | None = None
        self.cwd = Path("/")
        self.switch_done = trio.Event()
        self.switch_fails: Exception | None = None
        self.idle = True

    def start_task(self, task: Any) -> None:
        self.nursery.start_soon(task)

    async def switch(self, make: object, *, restore: bool, **_: object) -> None:
        await self.switch_done.wait()
        self.switch_done = trio.Event()
        if self.switch_fails is not None:
            raise self.switch_fails
        self.name = "new"

    def state(self) -> str:
        return self.name

    def abort(self) -> bool:
        return self.busy

    def disposition(self, streaming_behavior: str | None) -> str:
        return "queued" if self.busy else "started"

    def start_prompt(self, text: str, images: object, caller: object = None) -> None:
        self.prompts.append((self.name, text))
        self.busy = True


class Harness:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.session = Stand(nursery)
        self.answers: list[w.Response] = []
        self.dispatcher = Dispatcher(cast(Session, self.session), self.answers.append)
        self.next_id = 0

    def send(self, command: w.Command) -> str:
        self.next_id += 1
        self.dispatcher.handle(command, f"c{self.next_id}")
        return f"c{self.next_id}"

    def answered(self) -> list[tuple[str | int | None, str, object]]:
        """(id, command, data or error) of each response so far, in order."""
        return [(r.id, r.command, r.data if r.success else f"error: {r.error}")
                for r in self.answers]


async def test_commands_sent_during_a_switch_land_in_the_new_session_in_order() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.send(w.NewSession())
        h.send(w.Prompt(message="one"))
        h.send(w.GetState())
        h.send(w.FollowUp(message="two"))
        await trio.testing.wait_all_tasks_blocked()
        # Reads are answered at once, about the session being left; the prompt waits.
        assert h.answered() == [("c3", "get_state", "old")]
        assert h.session.prompts == []

        h.session.switch_done.set()
        await trio.testing.wait_all_tasks_blocked()
        assert h.answered()[1:] == [
            ("c1", "new_session", h.answers[1].data),
            ("c2", "prompt", h.answers[2].data),
            ("c4", "follow_up", h.answers[3].data),
        ]
        assert isinstance(h.answers[1].data, w.SwitchResult)
        assert h.session.prompts == [("new", "one")]
        assert h.session.queues.queued == [("follow_up", "two")]


async def test_a_held_switch_holds_what_came_after_it() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.send(w.NewSession())
        h.send(w.Clone())
        h.send(w.Prompt(message="after both"))
        h.session.switch_done.set()
        await trio.testing.wait_all_tasks_blocked()
        assert [a[1] for a in h.answered()] == ["new_session"]
        assert h.session.prompts == []  # the clone runs: the prompt still waits

        h.session.switch_done.set()
        await trio.testing.wait_all_tasks_blocked()
        assert [a[1] for a in h.answered()] == ["new_session", "clone", "prompt"]
        assert h.session.prompts == [("new", "after both")]


async def test_a_switch_that_fails_says_why_and_lets_the_held_commands_run() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.session.switch_fails = CommandError("Session file not found: /nope")
        h.send(w.SwitchSession(session_path="/nope"))
        h.send(w.Prompt(message="still here"))
        h.session.switch_done.set()
        await trio.testing.wait_all_tasks_blocked()
        assert h.answered()[0] == ("c1", "switch_session",
                                   "error: Session file not found: /nope")
        assert h.session.prompts == [("old", "still here")]


async def test_an_mcp_prompt_holds_what_came_after_it_until_its_server_renders_it() -> None:
    """A prompt naming an MCP server's prompt: its rendered text is what starts (or is
    queued); reads are answered meanwhile, everything else waits, in order. One that cannot
    be rendered fails, and nothing starts."""
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.send(w.Prompt(message="/mcp__s__review a.py"))
        h.send(w.FollowUp(message="/mcp__s__review b.py"))
        h.send(w.GetState())
        h.send(w.Prompt(message="/mcp__s__broken"))
        await trio.testing.wait_all_tasks_blocked()
        assert h.answered() == [("c3", "get_state", "old")]
        assert h.session.prompts == []

        h.session.mcp.rendered.set()
        await trio.testing.wait_all_tasks_blocked()
        assert [(answer[0], answer[1]) for answer in h.answered()[1:]] == [
            ("c1", "prompt"), ("c2", "follow_up"), ("c4", "prompt")]
        assert h.answered()[-1][2] == (
            "error: /mcp__s__broken: MCP server s refused the prompt: broke")
        assert h.session.prompts == [("old", "rendered /mcp__s__review a.py")]
        assert h.session.queues.queued == [("follow_up", "rendered /mcp__s__review b.py")]


async def test_an_abort_is_answered_after_the_runs_agent_end_not_before() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.send(w.Prompt(message="go"))
        h.send(w.Abort())
        assert [a[1] for a in h.answered()] == ["prompt"]
        h.dispatcher.saw(w.AgentEnd(messages=[]))
        assert [a[1] for a in h.answered()] == ["prompt", "abort"]


async def test_an_abort_with_nothing_running_is_answered_at_once() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.send(w.Abort())
        assert h.answered() == [("c1", "abort", w.ABSENT)]


async def test_an_abort_while_compacting_answers_the_compact_first() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.session.busy = True  # the manual compaction runs
        h.send(w.Compact(custom_instructions="keep the plan"))
        h.send(w.Abort())
        assert h.session.run.compactions == ["keep the plan"]
        assert h.answered() == []
        h.dispatcher.saw(w.CompactionEnd(reason="manual", result=None, aborted=True,
                                         will_retry=False))
        assert h.answered() == [("c1", "compact", "error: Compaction cancelled"),
                                ("c2", "abort", w.ABSENT)]


async def test_an_abort_during_a_compaction_before_the_first_run_waits_for_its_end() -> None:
    """A threshold compaction before a prompt's first run: the abort ends the prompt too, so
    it is answered by that prompt's agent_end, not by the compaction's end."""
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.send(w.Prompt(message="go"))
        h.send(w.Abort())
        h.dispatcher.saw(w.CompactionEnd(reason="threshold", result=None, aborted=True,
                                         will_retry=False))
        assert [a[1] for a in h.answered()] == ["prompt"]
        h.dispatcher.saw(w.AgentEnd(messages=[]))
        assert [a[1] for a in h.answered()] == ["prompt", "abort"]


async def test_an_abort_of_an_overflow_compaction_after_a_run_is_answered_by_its_end() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.send(w.Prompt(message="go"))
        h.dispatcher.saw(w.AgentEnd(messages=[]))  # the run overflowed; compaction follows
        h.send(w.Abort())
        h.dispatcher.saw(w.CompactionEnd(reason="overflow", result=None, aborted=True,
                                         will_retry=False))
        assert [a[1] for a in h.answered()] == ["prompt", "abort"]


async def test_abort_retry_is_answered_after_auto_retry_end() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.session.run.retrying = True
        h.send(w.AbortRetry())
        assert h.answered() == []
        h.dispatcher.saw(w.AutoRetryEnd(success=False, attempt=1,
                                        final_error="Retry cancelled"))
        assert h.answered() == [("c1", "abort_retry", w.ABSENT)]
        h.send(w.AbortRetry())  # nothing waits now: answered at once
        assert [a[1] for a in h.answered()] == ["abort_retry", "abort_retry"]


async def test_a_refusal_is_an_error_response_and_the_dispatcher_goes_on() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        h.session.plugins = cast(Any, type("P", (), {"command_for": lambda s, t: ("x", "")})())
        h.send(w.Steer(message="/deploy now"))
        h.send(w.GetState())
        assert h.answered() == [
            ("c1", "steer", 'error: Plugin command "/deploy" cannot be queued; send it '
                            "with prompt, which runs it at once"),
            ("c2", "get_state", "old"),
        ]
