"""Dialogs with the client: what a plugin asks the user, carried as ``extension_ui_request``
events and answered by ``extension_ui_response`` commands (docs/protocol.md, Dialogs).

A dialog resolves once: by the first response with its id, by its timeout, or by cancellation
(``abort``, a session switch, the end of input). A response for an id that is not open
(unknown, already answered, timed out) changes nothing. A timed-out or cancelled
``confirm`` is ``False``, a ``select`` or ``input`` is ``None``: nothing defaults to allowing
an action.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

import trio

from . import _wire as w
from ._log import log

NotifyType = Literal["info", "warning", "error"]


class _Pending:
    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: w.ExtensionUiResponse | None = None


class Dialogs:
    """The open dialogs of one session. `interactive` is False when no client can answer
    (print mode, or input has ended): a dialog then resolves at once, as cancelled."""

    def __init__(self, emit: Callable[[w.Event], None], *, interactive: bool = True) -> None:
        self._emit = emit
        self.interactive = interactive
        self.announce_resolved = False
        """Emit ``extension_ui_resolved`` when a dialog ends (the daemon: every attached
        client saw the request; this tells the ones that did not answer)."""
        self._pending: dict[str, _Pending] = {}

    async def _ask(self, method: str, timeout_s: float | None, **fields: Any
                   ) -> w.ExtensionUiResponse | None:
        """Write the request and wait for its answer; None when it timed out or was
        cancelled. Cancellation of the caller removes the dialog and propagates."""
        if not self.interactive:
            log(f"no client to answer a {method} dialog ({fields.get('title')!r}); "
                  "it is cancelled")
            return None
        dialog_id = str(uuid.uuid4())
        pending = self._pending[dialog_id] = _Pending()
        self._emit(w.ExtensionUiRequest(
            id=dialog_id, method=method,
            timeout=None if timeout_s is None else max(0, round(timeout_s * 1000)), **fields))
        try:
            with trio.move_on_after(math.inf if timeout_s is None else timeout_s):
                await pending.done.wait()
        finally:
            self._pending.pop(dialog_id, None)
            if self.announce_resolved:
                self._emit(w.ExtensionUiResolved(id=dialog_id))
        return pending.answer

    async def select(self, title: str, options: Sequence[str], *,
                     timeout_s: float | None = None) -> str | None:
        """The option chosen, or None."""
        return _value(await self._ask("select", timeout_s, title=title, options=list(options)))

    async def confirm(self, title: str, message: str = "", *,
                      timeout_s: float | None = None) -> bool:
        """True only when the user confirmed."""
        answer = await self._ask("confirm", timeout_s, title=title, message=message)
        return answer is not None and not answer.cancelled and answer.confirmed is True

    async def input(self, title: str, placeholder: str | None = None, *,
                    timeout_s: float | None = None) -> str | None:
        """The text entered, or None."""
        return _value(await self._ask("input", timeout_s, title=title, placeholder=placeholder))

    def notify(self, message: str, notify_type: NotifyType = "info") -> None:
        """Fire and forget: no answer is expected."""
        if notify_type not in ("info", "warning", "error"):
            notify_type = "info"
        self._emit(w.ExtensionUiRequest(id=str(uuid.uuid4()), method="notify", message=message,
                                        notify_type=notify_type))

    def respond(self, dialog_id: str | int | None, answer: w.ExtensionUiResponse) -> bool:
        """Resolve the open dialog `dialog_id`; False (and nothing changes) when none is."""
        pending = self._pending.pop(str(dialog_id), None) if dialog_id is not None else None
        if pending is None:
            return False
        pending.answer = answer
        pending.done.set()
        return True

    def cancel_all(self) -> None:
        """Resolve every open dialog as cancelled."""
        pending, self._pending = self._pending, {}
        for dialog in pending.values():
            dialog.done.set()


def _value(answer: w.ExtensionUiResponse | None) -> str | None:
    if answer is None or answer.cancelled:
        return None
    return answer.value
