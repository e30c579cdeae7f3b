"""Which turn answers which ``session/prompt``, and with what: a small state machine, fed the
session's events and the prompts' dispositions, that says when each prompt is answered.

A prompt that started a run (``started``) is answered when its turn ends. One that was queued
(``queued``) waits for the ``queue_update`` that holds its entry; when forged takes entries
out of its queues, a new turn starts with them, and the turn before it ends. Whatever is left
is answered at ``agent_settled``. A turn ends with its last reply's stop reason (``end_turn``,
``max_tokens``, ``cancelled`` when aborted), or, when the reply failed, with its error; a
reply the model declined answers ``refusal``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import trio

STOP_REASONS = {"stop": "end_turn", "toolUse": "end_turn", "length": "max_tokens",
                "aborted": "cancelled"}
_REFUSED = re.compile(r"\brefusal\b|content filter", re.IGNORECASE)
"""A failed reply that is the model declining (Anthropic's ``refusal`` stop, OpenAI's content
filter): the prompt answers ``refusal``, not an error."""

PromptId = int | str
Answer = Callable[[PromptId, str | None, str | None], None]
"""A prompt answered: its id, and its stop reason, or (None and) the error it fails with."""


class Turns:
    """The prompts of one session, until each is answered through `answer`."""

    def __init__(self, answer: Answer, failed: Callable[[str], None]) -> None:
        """`failed` is told a turn's error once, however many prompts it answers."""
        self._answer = answer
        self._failed = failed
        self._running: list[PromptId] = []
        """The prompts whose turn runs."""
        self._queued: dict[str, list[PromptId | None]] = {"steering": [], "followUp": []}
        """forged's queues as ``queue_update`` shows them: the prompt of each entry (None for
        an entry that is not an ACP prompt's)."""
        self._expected: list[PromptId] = []
        """Prompts answered ``queued`` whose entry the next growing ``queue_update`` adds."""
        self._unanswered = 0
        self._quiet = trio.Event()
        self._quiet.set()
        self._cancelling = False
        self._stop = "stop"
        self._error: str | None = None
        """The last reply's stop reason and error message, which answer its turn."""

    @property
    def unanswered(self) -> int:
        return self._unanswered

    async def wait_answered(self) -> None:
        """Until every prompt is answered."""
        await self._quiet.wait()

    # --- what happened -------------------------------------------------------------------------

    def prompted(self) -> None:
        """A prompt was sent; its disposition comes next."""
        self._unanswered += 1
        if self._quiet.is_set():
            self._quiet = trio.Event()

    def accepted(self, prompt: PromptId, disposition: str) -> None:
        """The prompt's response: ``started``, ``queued`` or ``handled`` (a plugin command,
        done at once)."""
        if disposition == "handled":
            self._answered(prompt, "end_turn", None)
        elif disposition == "queued":
            self._expected.append(prompt)
        else:
            self._running.append(prompt)

    def refused(self, prompt: PromptId, error: str) -> None:
        self._answered(prompt, None, error)

    def replied(self, stop_reason: str, error: str | None) -> None:
        """A reply of the run ended (or the run failed without one that was stored)."""
        self._stop, self._error = stop_reason, error

    def queue_changed(self, steering: int, follow_up: int) -> None:
        """forged's queues now hold this many entries: entries it took start a turn, which
        ends the turn of the prompts running until then."""
        for key, now in (("steering", steering), ("followUp", follow_up)):
            mirror = self._queued[key]
            if now > len(mirror):
                mirror += [self._expected.pop(0) if self._expected else None
                           for _ in range(now - len(mirror))]
            elif now < len(mirror):
                taken = mirror[:len(mirror) - now]
                del mirror[:len(mirror) - now]
                if not self._cancelling:
                    self._finish()
                self._running += [prompt for prompt in taken if prompt is not None]

    def settled(self, aborted: bool) -> None:
        """The session settled: every prompt still waiting is answered."""
        self._cancelling = False
        self._running += [*(prompt for queue in self._queued.values() for prompt in queue
                            if prompt is not None), *self._expected]
        self._expected.clear()
        for queue in self._queued.values():
            queue[:] = [None] * len(queue)
        self._finish(aborted=aborted)

    def cancelling(self) -> None:
        """``session/cancel``: the prompts that wait answer ``cancelled`` at the settling."""
        self._cancelling = self._unanswered > 0

    # --- answers -------------------------------------------------------------------------------

    def _finish(self, *, aborted: bool = False) -> None:
        running, self._running = self._running, []
        stop: str | None = "cancelled" if aborted else STOP_REASONS.get(self._stop, "end_turn")
        error = None
        if self._stop == "error" and not aborted:
            stop = "refusal" if _REFUSED.search(self._error or "") else None
            error = self._error or "The run failed"
        if running and stop is None:
            self._failed(self._error or "no reason given")
        for prompt in running:
            self._answered(prompt, stop, error if stop is None else None)

    def _answered(self, prompt: PromptId, stop: str | None, error: str | None) -> None:
        self._answer(prompt, stop, error)
        self._unanswered -= 1
        if self._unanswered <= 0:
            self._unanswered = 0
            self._quiet.set()
