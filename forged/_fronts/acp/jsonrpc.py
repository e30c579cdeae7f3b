"""A JSON-RPC 2.0 peer over lines: requests both ways, ids, errors; nothing of ACP in it.

What comes in is either an answer to one of our requests (it settles that request) or a
request or notification of the other side (`Peer` hands it to its handler, and answers a
request with what the handler returns, or with the error it raised). Lines that are not
JSON are answered ``-32700``, unless they answer a request of ours whose id can still be read:
that request fails instead, so nothing waits for an answer that came unreadable.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Final

import attrs
import trio

from ..._connection import Outbox, read_lines
from ..._errors import AcpError, ClientGone
from ..._jsonl import LineTooLong, decode_json, encode_line

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
AUTH_REQUIRED = -32000
REQUEST_CANCELLED = -32800
"""The answer to a request the other side withdrew with ``$/cancel_request``."""
CANCEL_REQUEST = "$/cancel_request"
WITHDRAWN_KEPT = 1024
WAITING_MESSAGES = 64
"""Messages read ahead of the one being handled: a ``$/cancel_request`` among them is
seen at once."""

RequestId = int | str
JSONObject = dict[str, object]
"""A JSON object as it came: read with ``isinstance``."""
Handler = Callable[[str, JSONObject, RequestId | None], Awaitable[object]]
"""A request's (or a notification's, with no id) method and params to its result."""
Failure = Callable[[str, Exception], tuple[int, str]]
"""What a handler's exception answers: an error code and message."""


class _Later:
    def __repr__(self) -> str:
        return "LATER"


LATER: Final = _Later()
"""A handler's result that says the request is answered later (`Peer.answer`)."""


@attrs.define(eq=False, repr=False)
class _Request:
    """A request of ours to the other side, until its answer comes."""

    done: trio.Event = attrs.Factory(trio.Event)
    response: JSONObject | None = None
    unreadable: str | None = None
    """Why its answer could not be read."""
    withdrawn: bool = False
    """We withdrew it (`Peer.withdraw`)."""


_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')


def is_id(value: object) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def _readable_id(line: bytes) -> RequestId | None:
    """The id of a line that is not valid JSON, when it can still be read: the whole line by
    Python's more lenient parser (which takes lone surrogates), else the first ``"id"``."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # any depth: the id is still looked for
        found = _ID.search(line)
        if found is None:
            return None
        try:
            value = json.loads(found.group(1))
        except ValueError:
            return None
    else:
        value = message.get("id") if isinstance(message, dict) else None
    return value if is_id(value) else None


class Peer:
    """One JSON-RPC 2.0 peer on one outbox: everything it sends goes through it, in order."""

    def __init__(self, outbox: Outbox, handler: Handler, failure: Failure) -> None:
        self._outbox = outbox
        self._handler = handler
        self._failure = failure
        self._ids = itertools.count()
        self._requests: dict[RequestId, _Request] = {}
        self._gone = False
        self._handling: tuple[RequestId, trio.CancelScope] | None = None
        """The other side's request being handled now, and its scope."""
        self._withdrawn: dict[RequestId, None] = {}
        """The other side's requests it withdrew before they were handled (the latest
        `WITHDRAWN_KEPT`: ids it never sent cannot grow it without end)."""
        self._later: dict[RequestId, Callable[[], None]] = {}
        """What withdraws each request answered later (`on_withdrawn`)."""

    def _send(self, message: JSONObject) -> None:
        self._outbox.put(encode_line({"jsonrpc": "2.0", **message}))

    def answer(self, request_id: RequestId, result: object) -> None:
        self._later.pop(request_id, None)
        self._send({"id": request_id, "result": result})

    def fail(self, request_id: RequestId | None, code: int, message: str) -> None:
        if request_id is not None:
            self._later.pop(request_id, None)
        self._send({"id": request_id, "error": {"code": code, "message": message}})

    def on_withdrawn(self, request_id: RequestId, withdraw: Callable[[], None]) -> None:
        """A request answered later (`LATER`): `withdraw` is called if the other side
        withdraws it before its answer (it answers it, as it sees fit)."""
        self._later[request_id] = withdraw

    def notify(self, method: str, params: JSONObject) -> None:
        self._send({"method": method, "params": params})

    async def request(self, method: str, params: JSONObject, *,
                      timeout_s: float = math.inf,
                      issued: Callable[[RequestId], None] | None = None) -> object:
        """Ask the other side; its result, `AcpError` for its error (or an answer that could
        not be read, or none within `timeout_s`, or `withdraw`), `ClientGone` if it closed
        its end first. `issued` learns the request's id as it is sent. A request that ends
        unanswered (the timeout, a cancellation) is withdrawn: the other side is told
        (``$/cancel_request``)."""
        if self._gone:
            raise ClientGone(method)
        request_id = next(self._ids)
        pending = self._requests[request_id] = _Request()
        self._send({"id": request_id, "method": method, "params": params})
        if issued is not None:
            issued(request_id)
        try:
            with trio.move_on_after(timeout_s) as waited:
                await pending.done.wait()
        finally:
            self.withdraw(request_id)
        if waited.cancelled_caught:
            raise AcpError(INTERNAL_ERROR, f"the editor did not answer within {timeout_s:g} s")
        if pending.withdrawn:
            raise AcpError(REQUEST_CANCELLED, f"{method} was withdrawn")
        if pending.unreadable is not None:
            raise AcpError(PARSE_ERROR, f"the editor's answer could not be read: "
                           f"{pending.unreadable}")
        if pending.response is None:
            raise ClientGone(method)
        error = pending.response.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            raise AcpError(code if isinstance(code, int) else INTERNAL_ERROR,
                           str(error.get("message") or error))
        if error is not None:
            raise AcpError(INTERNAL_ERROR, f"the editor answered with an error that is not "
                           f"a JSON-RPC error object: {shown(error)}")
        if "result" not in pending.response:
            raise AcpError(INVALID_REQUEST, "the editor's answer has neither result nor error")
        return pending.response.get("result")

    def withdraw(self, request_id: RequestId) -> None:
        """A request of ours still unanswered is no longer wanted: the other side is told
        (``$/cancel_request``) and the request ends (`AcpError` -32800). Nothing for one
        already answered."""
        pending = self._requests.pop(request_id, None)
        if pending is None:
            return
        pending.withdrawn = True
        pending.done.set()
        if not self._gone:
            self.notify(CANCEL_REQUEST, {"requestId": request_id})

    def _withdrawn_by_them(self, params: object) -> None:
        """The other side's ``$/cancel_request``: the request being handled is cancelled,
        one not handled yet is answered -32800 when its turn comes, one answered later is
        withdrawn as its handler said (`on_withdrawn`); an answered one is left alone."""
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if not is_id(request_id):
            return
        assert isinstance(request_id, int | str)
        if self._handling is not None and self._handling[0] == request_id:
            self._handling[1].cancel()
        elif request_id in self._later:
            self._later.pop(request_id)()
        else:
            self._withdrawn[request_id] = None
            if len(self._withdrawn) > WITHDRAWN_KEPT:
                del self._withdrawn[next(iter(self._withdrawn))]

    def settle_unreadable(self, line: bytes, reason: str) -> bool:
        """A line that is not valid JSON but may answer a request of ours: when its id can
        be read and is waited for, that request fails with `reason`. False when none was."""
        request_id = _readable_id(line)
        pending = self._requests.pop(request_id, None) if request_id is not None else None
        if pending is None:
            return False
        pending.unreadable = reason
        pending.done.set()
        return True

    def gone(self) -> None:
        """The other side closed its end: what we asked it is answered no."""
        self._gone = True
        requests, self._requests = self._requests, {}
        for pending in requests.values():
            pending.done.set()

    def settle(self, message: object) -> bool:
        """An answer to a request of ours settles it; a ``$/cancel_request`` is taken at
        once. False for anything else (for `handle`, in order)."""
        if isinstance(message, dict) and "method" not in message and (
                "result" in message or "error" in message or (
                    is_id(message.get("id")) and message.get("id") in self._requests)):
            answered = message.get("id")
            pending = self._requests.pop(answered, None) if isinstance(
                answered, int | str) else None
            if pending is not None:
                pending.response = message
                pending.done.set()
            return True
        if isinstance(message, dict) and message.get("method") == CANCEL_REQUEST and (
                "id" not in message):
            self._withdrawn_by_them(message.get("params"))
            return True
        return False

    async def handle(self, message: object) -> None:
        """One message: an answer settles our request; a request or notification goes to
        the handler, a request answered with its result or error (-32800 when the other
        side withdrew it first)."""
        if self.settle(message):
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(
                message.get("method"), str):
            self.fail(message.get("id") if isinstance(message, dict) else None,
                      INVALID_REQUEST, "Invalid Request: expected a JSON-RPC 2.0 message")
            return
        request_id = message.get("id")
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):  # every ACP method takes an object
            if request_id is not None:
                self.fail(request_id, INVALID_PARAMS, f"Invalid params: {message['method']} "
                          f"takes an object, not {type(params).__name__}")
            return
        if is_id(request_id) and request_id in self._withdrawn:
            assert isinstance(request_id, int | str)
            del self._withdrawn[request_id]
            self.fail(request_id, REQUEST_CANCELLED, "Request cancelled")
            return
        scope = trio.CancelScope()
        if is_id(request_id):
            assert isinstance(request_id, int | str)
            self._handling = (request_id, scope)
        try:
            with scope:
                result = await self._handler(message["method"], params, request_id)
        except Exception as exc:
            while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # a nursery's wrapping of one error
            code, text = (exc.code, str(exc)) if isinstance(exc, AcpError) else self._failure(
                message["method"], exc)
            if request_id is not None:
                self.fail(request_id, code, text)
            return
        finally:
            self._handling = None
        if scope.cancelled_caught:
            self.fail(request_id, REQUEST_CANCELLED, "Request cancelled")
        elif request_id is not None and result is not LATER:
            self.answer(request_id, result)

    async def serve(self, stream: trio.abc.ReceiveStream) -> None:
        """Take every line of `stream` until its end, then the other side is `gone`. The
        reader settles answers and takes ``$/cancel_request`` as they come; requests and
        notifications are handled in order, one at a time, `WAITING_MESSAGES` read ahead."""
        waiting_send, waiting_receive = trio.open_memory_channel[object](WAITING_MESSAGES)

        async def take(piece: bytes | LineTooLong) -> None:
            if isinstance(piece, LineTooLong):
                await waiting_send.send(_Failure(PARSE_ERROR, "Parse error: line too long"))
            elif piece.strip():
                try:
                    message = decode_json(piece)
                except (ValueError, RecursionError) as exc:
                    if not self.settle_unreadable(piece, str(exc)):
                        await waiting_send.send(_Failure(PARSE_ERROR, f"Parse error: {exc}"))
                else:
                    if not self.settle(message):
                        await waiting_send.send(message)

        async def read() -> None:
            async with waiting_send:
                await read_lines(stream, take)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            async with waiting_receive:
                async for message in waiting_receive:
                    if isinstance(message, _Failure):
                        self.fail(None, message.code, message.text)
                    else:
                        await self.handle(message)
        self.gone()


@attrs.frozen
class _Failure:
    """A line that is not a message, answered in its turn."""

    code: int
    text: str


def shown(value: object) -> str:
    """`value` in a message: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."
