"""Dialogs with the client: what a plugin asks the user, carried as ``extension_ui_request``
events and answered by ``extension_ui_response`` commands (docs/protocol.md, Dialogs).

A dialog resolves once: by the first response with its id, by its timeout, or by cancellation
(``abort``, a session switch, the end of input). A response for an id that is not open
(unknown, already answered, timed out) changes nothing. A timed-out or cancelled
``confirm`` is ``False``, a ``select`` or ``input`` is ``None``: nothing defaults to allowing
an action.

A permission request (`Dialogs.permission`, what the permission modes ask) is a ``select``
of `PERMISSION_OPTIONS` that outlives its clients where the session does (the daemon): when
no client can answer it waits, for `Dialogs.client_wait_s` at most, and is sent again, with
the same id, once one can. Only an answer or ``abort`` ends it sooner; anything else is no.
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

ALLOW_ONCE = "Allow once"
ALLOW_SESSION = "Allow for this session"
DENY = "Deny"
PERMISSION_OPTIONS = (ALLOW_ONCE, ALLOW_SESSION, DENY)
"""A permission request's options, in order (pi's clients answer them as any ``select``)."""
NOBODY = "no client can answer a permission request here"


def one_line(text: str) -> str:
    """`text` as one line of a log: its line breaks and runs of white space as one space,
    escape characters shown escaped."""
    return " ".join(text.split()).replace("\x1b", "\\x1b")


class _Pending:
    __slots__ = ("aborted", "answer", "changed", "done")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: w.ExtensionUiResponse | None = None
        self.aborted = False
        self.changed = trio.Event()
        """Set by anything a permission request waits for: an answer, ``abort``, a client
        able to answer coming or going."""

    def stir(self) -> None:
        self.changed.set()


class Dialogs:
    """The open dialogs of one session. `interactive` is False when no client can answer
    (print mode, or input has ended): a dialog then resolves at once, as cancelled."""

    def __init__(self, emit: Callable[[w.Event], None], *, interactive: bool = True) -> None:
        self._emit = emit
        self.interactive = interactive
        self.announce_resolved = False
        """Emit ``extension_ui_resolved`` when a dialog ends (the daemon: every attached
        client saw the request; this tells the ones that did not answer)."""
        self.client_wait_s: float | None = None
        """How long a permission request waits for a client able to answer it (the daemon);
        None: not at all, it is answered no at once."""
        self.on_wait: Callable[[str, str], None] | None = None
        """Told when a question starts to wait for the user: ``permission`` or ``dialog``,
        and its title (the daemon's nudges, `forged._notify`)."""
        self._pending: dict[str, _Pending] = {}
        self._permissions: dict[str, _Pending] = {}

    @property
    def waiting(self) -> bool:
        """A dialog or a permission request waits for an answer."""
        return bool(self._pending or self._permissions)

    def set_interactive(self, interactive: bool) -> None:
        """Whether a client can answer now. When none can, the open dialogs resolve as
        cancelled, and permission requests wait for one (`client_wait_s`) or are denied;
        when one can again, waiting permission requests are sent to it."""
        self.interactive = interactive
        if not interactive:
            self._cancel_dialogs()
        for request in self._permissions.values():
            request.stir()

    async def permission(self, title: str, *, for_session: bool = True
                         ) -> tuple[str | None, str]:
        """Ask the user to allow what `title` describes: the option chosen
        (`ALLOW_ONCE`, or `ALLOW_SESSION` when `for_session` offers it), or None and why
        not. An answer that is none of the options offered is no."""
        options = [option for option in PERMISSION_OPTIONS
                   if for_session or option != ALLOW_SESSION]
        answer, why = await self._waiting("select", title=title, options=options,
                                          kind="permission")
        if answer is None:
            return None, why
        value = _value(answer)
        if value in options and value != DENY:
            return value, value
        return None, "the user denied it"

    async def ask_waiting(self, method: str, **fields: Any) -> w.ExtensionUiResponse | None:
        """A dialog that, as a permission request, waits for a client able to answer it
        (`client_wait_s`); its answer, or None (no client in time, or ``abort``)."""
        return (await self._waiting(method, **fields))[0]

    async def _waiting(self, method: str, *, kind: str = "dialog", **fields: Any
                       ) -> tuple[w.ExtensionUiResponse | None, str]:
        dialog_id = str(uuid.uuid4())
        request = self._permissions[dialog_id] = _Pending()
        sent = announced = False
        deadline = math.inf
        title = str(fields.get("title") or method)
        if self.on_wait is not None:
            self.on_wait(kind, title)
        try:
            while True:
                if request.aborted:
                    return None, "the run was aborted"
                if request.answer is not None:
                    return request.answer, ""
                if self.interactive:
                    deadline = math.inf
                    if not sent:
                        self._emit(w.ExtensionUiRequest(id=dialog_id, method=method, **fields))
                        sent = announced = True
                else:
                    sent = False  # sent again to the next client that can answer
                    if self.client_wait_s is None:
                        log(f"{NOBODY}, so it is denied: {one_line(title)}")
                        return None, NOBODY
                    if deadline == math.inf:
                        deadline = trio.current_time() + self.client_wait_s
                request.changed = trio.Event()
                with trio.move_on_at(deadline):
                    await request.changed.wait()
                    continue
                return None, (f"no client attached to answer a permission request within "
                              f"{self.client_wait_s:g} s")
        finally:
            self._permissions.pop(dialog_id, None)
            if announced and self.announce_resolved:
                self._emit(w.ExtensionUiResolved(id=dialog_id))

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
        if self.on_wait is not None:
            self.on_wait("dialog", str(fields.get("title") or fields.get("message") or method))
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
        if dialog_id is None:
            return False
        request = self._permissions.get(str(dialog_id))
        if request is not None and request.answer is None and not request.aborted:
            request.answer = answer
            request.stir()
            return True
        pending = self._pending.pop(str(dialog_id), None)
        if pending is None:
            return False
        pending.answer = answer
        pending.done.set()
        return True

    def _cancel_dialogs(self) -> None:
        pending, self._pending = self._pending, {}
        for dialog in pending.values():
            dialog.done.set()

    def cancel_all(self) -> None:
        """Resolve every open dialog as cancelled, and deny every permission request
        (``abort``)."""
        self._cancel_dialogs()
        for request in self._permissions.values():
            request.aborted = True
            request.stir()


def _value(answer: w.ExtensionUiResponse | None) -> str | None:
    if answer is None or answer.cancelled:
        return None
    return answer.value


def answer_words(response: w.ExtensionUiResponse) -> str:
    """A dialog's answer as the log says it: a permission's option, else only its kind (an
    answer typed may be a secret)."""
    if response.cancelled:
        return "cancelled"
    if response.confirmed is not None:
        return "confirmed" if response.confirmed else "not confirmed"
    if response.value in PERMISSION_OPTIONS:
        return repr(response.value)
    return "a value" if response.value is not None else "nothing"
