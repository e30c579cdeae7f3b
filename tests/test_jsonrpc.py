"""The JSON-RPC 2.0 peer ACP is built on (acp/jsonrpc.py), alone: requests both ways, ids,
errors, unreadable lines, and the other side going away. Two peers talk over a memory stream
pair, or one peer talks to the test writing raw lines."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from forged._connection import Outbox
from forged._errors import AcpError, ClientGone
from forged._fronts.acp.jsonrpc import (
    INVALID_REQUEST,
    LATER,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    JSONObject,
    Peer,
    RequestId,
)


def failure(method: str, exc: Exception) -> tuple[int, str]:
    return (METHOD_NOT_FOUND, f"no {method}") if isinstance(exc, KeyError) else (-1, str(exc))


class Raw:
    """The test's side of one peer: writes lines to it, reads what it writes."""

    def __init__(self, to_peer: trio.abc.SendStream, from_peer: trio.abc.ReceiveStream) -> None:
        self.to_peer = to_peer
        self.from_peer = from_peer
        self.buffer = b""

    async def write(self, line: bytes) -> None:
        await self.to_peer.send_all(line + b"\n")

    async def read(self) -> JSONObject:
        while b"\n" not in self.buffer:
            self.buffer += await self.from_peer.receive_some()
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: JSONObject = json.loads(line)
        return message


@asynccontextmanager
async def open_peer(handler: object) -> AsyncIterator[tuple[Peer, Raw]]:
    """A peer serving one end of a stream pair, handled by `handler`; the test has the other."""
    to_peer_send, to_peer_receive = trio.testing.memory_stream_one_way_pair()
    from_peer_send, from_peer_receive = trio.testing.memory_stream_one_way_pair()
    outbox = Outbox()
    peer = Peer(outbox, handler, failure)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.serve_writer, from_peer_send)
        nursery.start_soon(peer.serve, to_peer_receive)
        yield peer, Raw(to_peer_send, from_peer_receive)
        nursery.cancel_scope.cancel()


async def test_a_request_is_answered_with_its_handlers_result_under_its_own_id() -> None:
    async def handler(method: str, params: JSONObject, request_id: RequestId | None) -> object:
        return {"echo": params["text"], "method": method}

    with trio.fail_after(5):
        async with open_peer(handler) as (_, raw):
            await raw.write(b'{"jsonrpc":"2.0","id":"a-1","method":"say","params":{"text":"hi"}}')
            assert await raw.read() == {"jsonrpc": "2.0", "id": "a-1",
                                        "result": {"echo": "hi", "method": "say"}}


async def test_a_handlers_error_is_an_error_answer_and_a_notification_gets_none() -> None:
    seen: list[str] = []

    async def handler(method: str, params: JSONObject, request_id: RequestId | None) -> object:
        seen.append(method)
        if method == "refuse":
            raise AcpError(-32002, "not that")
        raise KeyError(method)

    with trio.fail_after(5):
        async with open_peer(handler) as (_, raw):
            await raw.write(b'{"jsonrpc":"2.0","method":"nobody/listens"}')  # a notification
            await raw.write(b'{"jsonrpc":"2.0","id":7,"method":"refuse"}')
            assert await raw.read() == {"jsonrpc": "2.0", "id": 7,
                                        "error": {"code": -32002, "message": "not that"}}
            await raw.write(b'{"jsonrpc":"2.0","id":8,"method":"missing"}')
            assert await raw.read() == {"jsonrpc": "2.0", "id": 8, "error": {
                "code": METHOD_NOT_FOUND, "message": "no missing"}}
            assert seen == ["nobody/listens", "refuse", "missing"]


async def test_bad_lines_are_answered_and_the_peer_goes_on() -> None:
    async def handler(method: str, params: JSONObject, request_id: RequestId | None) -> object:
        return "fine"

    with trio.fail_after(5):
        async with open_peer(handler) as (_, raw):
            await raw.write(b"{not json")
            answer = await raw.read()
            error = answer["error"]
            assert answer["id"] is None and isinstance(error, dict)
            assert error["code"] == PARSE_ERROR
            await raw.write(b'{"id":3,"method":"no-version"}')
            assert (await raw.read())["error"] == {
                "code": INVALID_REQUEST,
                "message": "Invalid Request: expected a JSON-RPC 2.0 message"}
            await raw.write(b'{"jsonrpc":"2.0","id":4,"method":"ok"}')
            assert await raw.read() == {"jsonrpc": "2.0", "id": 4, "result": "fine"}


async def nothing(method: str, params: JSONObject, request_id: RequestId | None) -> object:
    return LATER


async def asked(peer: Peer, method: str, outcomes: list[object],
                timeout_s: float = math.inf) -> None:
    """Ask `method` of the other side; its result, or the exception it raised, joins
    `outcomes`."""
    try:
        outcomes.append(await peer.request(method, {"path": "/x"}, timeout_s=timeout_s))
    except (AcpError, ClientGone) as exc:
        outcomes.append(exc)


async def test_our_request_settles_with_the_other_sides_answer_or_error() -> None:
    outcomes: list[object] = []
    with trio.fail_after(5):
        async with open_peer(nothing) as (peer, raw), trio.open_nursery() as nursery:
            nursery.start_soon(asked, peer, "fs/read_text_file", outcomes)
            first = await raw.read()
            nursery.start_soon(asked, peer, "fs/write_text_file", outcomes)
            second = await raw.read()
            assert first["method"] == "fs/read_text_file" and first["params"] == {"path": "/x"}
            assert first["id"] != second["id"]
            # Answered out of order: each settles its own request.
            await raw.write(json.dumps({"jsonrpc": "2.0", "id": second["id"], "error": {
                "code": -32001, "message": "denied"}}).encode())
            await raw.write(json.dumps({"jsonrpc": "2.0", "id": first["id"],
                                        "result": {"content": "text"}}).encode())
    denied, read = outcomes
    assert isinstance(denied, AcpError) and (denied.code, str(denied)) == (-32001, "denied")
    assert read == {"content": "text"}


async def test_an_unreadable_answer_fails_its_request_instead_of_hanging() -> None:
    outcomes: list[object] = []
    with trio.fail_after(5):
        async with open_peer(nothing) as (peer, raw), trio.open_nursery() as nursery:
            nursery.start_soon(asked, peer, "fs/read_text_file", outcomes)
            request_id = (await raw.read())["id"]
            assert isinstance(request_id, int)
            await raw.write(b'{"jsonrpc":"2.0","id":%d,"result":{"content":"\\ud800' % (
                request_id))
    (failure,) = outcomes
    assert isinstance(failure, AcpError) and failure.code == PARSE_ERROR
    assert "could not be read" in str(failure)


async def test_when_the_other_side_goes_what_we_asked_is_answered_no() -> None:
    outcomes: list[object] = []
    with trio.fail_after(5):
        async with open_peer(nothing) as (peer, raw):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(asked, peer, "session/request_permission", outcomes)
                await raw.read()
                await raw.to_peer.aclose()
            await asked(peer, "fs/read_text_file", outcomes)  # after: not even sent
    assert [type(outcome) for outcome in outcomes] == [ClientGone, ClientGone]


async def test_a_request_not_answered_in_time_fails(
        autojump_clock: trio.testing.MockClock) -> None:
    outcomes: list[object] = []
    with trio.fail_after(60):
        async with open_peer(nothing) as (peer, raw):
            await asked(peer, "fs/read_text_file", outcomes, timeout_s=30)
            await raw.read()  # it was sent
    (failure,) = outcomes
    assert isinstance(failure, AcpError) and "did not answer within 30 s" in str(failure)
