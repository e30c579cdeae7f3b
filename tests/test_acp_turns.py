"""Which turn answers which ACP ``session/prompt``, and with what (acp/turns.py), with no
session and no process: the state machine is fed what the session would say."""

from __future__ import annotations

import trio

from forged._fronts.acp.turns import PromptId, Turns


class Book:
    def __init__(self) -> None:
        self.answers: list[tuple[PromptId, str | None, str | None]] = []
        self.failures: list[str] = []
        self.turns = Turns(lambda p, stop, error: self.answers.append((p, stop, error)),
                           self.failures.append)

    def prompt(self, prompt: PromptId, disposition: str) -> None:
        self.turns.prompted()
        self.turns.accepted(prompt, disposition)


def test_a_started_prompt_is_answered_by_its_turns_end() -> None:
    book = Book()
    book.prompt(1, "started")
    book.turns.replied("toolUse", None)
    book.turns.replied("stop", None)
    assert book.answers == []
    book.turns.settled(aborted=False)
    assert book.answers == [(1, "end_turn", None)]
    assert book.turns.unanswered == 0


def test_a_reply_cut_by_its_length_answers_max_tokens() -> None:
    book = Book()
    book.prompt(1, "started")
    book.turns.replied("length", None)
    book.turns.settled(aborted=False)
    assert book.answers == [(1, "max_tokens", None)]


def test_a_queued_prompt_is_answered_by_the_turn_its_entry_starts() -> None:
    book = Book()
    book.prompt(1, "started")
    book.prompt(2, "queued")
    book.turns.queue_changed(steering=0, follow_up=1)  # 2's entry waits
    book.turns.replied("stop", None)
    book.turns.queue_changed(steering=0, follow_up=0)  # taken: 1's turn ends, 2's starts
    assert book.answers == [(1, "end_turn", None)]
    book.turns.replied("stop", None)
    book.turns.settled(aborted=False)
    assert book.answers == [(1, "end_turn", None), (2, "end_turn", None)]


def test_an_entry_not_from_acp_does_not_answer_a_prompt() -> None:
    book = Book()
    book.prompt(1, "started")
    book.turns.queue_changed(steering=1, follow_up=0)  # someone else's steer
    book.prompt(2, "queued")
    book.turns.queue_changed(steering=1, follow_up=1)
    book.turns.queue_changed(steering=0, follow_up=1)  # the steer is taken: 1's turn ends
    assert book.answers == [(1, "end_turn", None)]
    book.turns.queue_changed(steering=0, follow_up=0)
    book.turns.settled(aborted=False)
    assert [a[0] for a in book.answers] == [1, 2]


def test_a_plugin_command_is_handled_at_once() -> None:
    book = Book()
    book.prompt("p", "handled")
    assert book.answers == [("p", "end_turn", None)]
    assert book.turns.unanswered == 0


def test_a_refused_prompt_answers_its_error() -> None:
    book = Book()
    book.turns.prompted()
    book.turns.refused(3, "No API key for anthropic")
    assert book.answers == [(3, None, "No API key for anthropic")]
    assert book.failures == []


def test_a_failed_turn_answers_its_error_and_says_it_once() -> None:
    book = Book()
    book.prompt(1, "started")
    book.prompt(2, "queued")
    book.turns.replied("error", "503 overloaded")
    book.turns.settled(aborted=False)
    assert book.answers == [(1, None, "503 overloaded"), (2, None, "503 overloaded")]
    assert book.failures == ["503 overloaded"]


def test_a_declined_reply_answers_refusal() -> None:
    book = Book()
    book.prompt(1, "started")
    book.turns.replied("error", "The model stopped: refusal")
    book.turns.settled(aborted=False)
    assert book.answers == [(1, "refusal", None)]
    assert book.failures == []


def test_cancel_answers_every_waiting_prompt_cancelled_at_the_settling() -> None:
    book = Book()
    book.prompt(1, "started")
    book.prompt(2, "queued")
    book.turns.queue_changed(steering=0, follow_up=1)
    book.turns.cancelling()
    book.turns.replied("aborted", None)
    book.turns.queue_changed(steering=0, follow_up=0)  # abort empties the queues
    assert book.answers == []  # nothing answers before the settling
    book.turns.settled(aborted=True)
    assert book.answers == [(1, "cancelled", None), (2, "cancelled", None)]


async def test_wait_answered_returns_once_every_prompt_is() -> None:
    book = Book()
    book.prompt(1, "started")
    with trio.move_on_after(0) as waiting:  # not yet: the prompt waits
        await book.turns.wait_answered()
    assert waiting.cancelled_caught
    book.turns.settled(aborted=False)
    with trio.fail_after(1):
        await book.turns.wait_answered()
