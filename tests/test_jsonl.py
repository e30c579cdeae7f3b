"""Framing and the codec: any bytes in, never a crash, exactly one response per line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings, strategies as st

from forged import _wire as w
from forged._connection import (
    COMMAND_QUEUE_SIZE,
    Connection,
    Incoming,
    Outbox,
    parse_line,
    write_now_to,
)
from forged._jsonl import LineSplitter, LineTooLong, decode_json, encode_line
from forged._providers.sse import SseDecoder

from .harness import open_client


def test_split_on_lf_only_and_strip_one_cr() -> None:
    splitter = LineSplitter()
    lines = list(splitter.feed('{"a":"x\u2028y\u2029z"}\r\n{"b":2}\r\r\n'.encode()))
    assert lines == ['{"a":"x\u2028y\u2029z"}'.encode(), b'{"b":2}\r']
    assert list(splitter.feed(b'{"c":')) == []
    assert list(splitter.feed(b"3}")) == []
    assert list(splitter.close()) == [b'{"c":3}']


def test_a_line_over_the_limit_is_refused_and_skipped() -> None:
    splitter = LineSplitter(max_line_bytes=8)
    out = list(splitter.feed(b"0123"))
    out += list(splitter.feed(b"456789abc"))
    out += list(splitter.feed(b"def\nok\n"))
    assert isinstance(out[0], LineTooLong) and out[0].size == 16
    assert out[1:] == [b"ok"]


def test_encode_escapes_only_the_separators() -> None:
    line = encode_line({"t": "a\u2028b\u2029c é 😀", "n": None})
    assert line == '{"t":"a\\u2028b\\u2029c é 😀","n":null}\n'.encode()
    assert orjson.loads(line) == {"t": "a\u2028b\u2029c é 😀", "n": None}
    assert encode_line({"s": "\ud800"}) == b'{"s":"\\ud800"}\n'  # lone surrogate: escaped


def test_sse_splits_on_bytes_not_unicode_line_breaks() -> None:
    decoder = SseDecoder()
    payload = '{"text":"a\u2028b\u0085c\u2029"}'.encode()
    chunks = [b"event: x\r\ndata: " + payload[:5], payload[5:] + b"\n\n", b"data: [DONE]\n\n"]
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    assert events == [(b"x", payload), (b"", b"[DONE]")]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
COMMANDS = sorted(w.COMMAND_CLASSES)


@st.composite
def command_like(draw: st.DrawFn) -> bytes:
    fields = draw(st.dictionaries(st.sampled_from(
        ["id", "message", "mode", "level", "provider", "modelId", "images",
         "streamingBehavior", "enabled", "command", "since", "name"]), JSON, max_size=4))
    fields["type"] = draw(st.sampled_from(COMMANDS) | st.text(max_size=5))
    return encode_line(fields)[:-1]


LINES = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")) | command_like()
                 | JSON.map(lambda v: encode_line(v)[:-1]), max_size=8)


@given(line=st.binary(max_size=200))
def test_parse_line_never_raises(line: bytes) -> None:
    parsed = parse_line(line)
    if not line.strip():
        assert parsed is None
    else:
        assert parsed is not None
        assert (parsed.command is None) != (parsed.refusal is None)


@given(value=JSON)
def test_decode_round_trips_what_encode_writes(value: Any) -> None:
    assert decode_json(encode_line(value)) == value


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES)
async def test_one_response_per_line_whatever_the_input(tmp_path: Path,
                                                        lines: list[bytes]) -> None:
    async with open_client(tmp_path) as client:
        for line in lines:
            await client.send_raw(line + b"\n")
        await client.send_raw(b'{"type":"abort","id":"stop-1"}\n')
        await client.send_raw(b'{"type":"get_state","id":"probe-9"}\n')
        probe = await client.response("probe-9")
        expected = sum(1 for line in lines if line.strip() and not isinstance(
            getattr(parse_line(line), "command", None), w.ExtensionUiResponse)) + 2  # no reply
        with trio.fail_after(10):  # session switches answer when done, maybe after the probe
            while client.count("response") < expected:
                await client.next_line()
        await client.settled(client.count("agent_start") and 1)
    assert client.count("response") == expected
    assert probe["success"] is True


async def test_lines_written_straight_to_a_socket_keep_their_order_when_it_fills() -> None:
    """The outbox writes lines to the socket at once while it takes them; once the reader
    lags (full buffer, partial writes), later lines wait for the writer, in order, even when
    the socket has room again before the writer ran."""
    ours, theirs = trio.socket.socketpair()
    ours.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
    sending, receiving = trio.SocketStream(ours), trio.SocketStream(theirs)
    outbox = Outbox(write_now=write_now_to(sending))
    lines = [encode_line({"n": n, "pad": "x" * (n % 700)}) for n in range(3000)]
    for line in lines[:1500]:
        outbox.put(line)  # nobody reads yet: the socket fills, the rest is pending
    assert outbox.pending_bytes > 0
    received = bytearray(await receiving.receive_some())  # room again, the writer not yet run
    for line in lines[1500:]:
        outbox.put(line)
    outbox.close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.serve_writer, sending)
        while len(received) < sum(map(len, lines)):
            received += await receiving.receive_some()
    assert bytes(received) == b"".join(lines)


async def test_a_closed_peer_ends_the_writer_and_drops_what_is_left() -> None:
    ours, theirs = trio.socket.socketpair()
    sending = trio.SocketStream(ours)
    outbox = Outbox(write_now=write_now_to(sending))
    theirs.close()
    outbox.put(b'{"n":1}\n')
    outbox.put(b'{"n":2}\n')
    with trio.fail_after(5):
        assert await outbox.serve_writer(sending) is False
    assert outbox.pending_bytes == 0


async def test_commands_wait_while_their_answers_are_unread() -> None:
    """A client that writes commands without reading the answers is held back once the
    unread answers pass the outbox's high-water mark: memory stays bounded."""
    handled: list[str | int | None] = []
    reading = trio.Event()
    written: list[bytes] = []
    sent = 0

    class Transport:
        write_now: Callable[[bytes], int] | None = None

        async def read(self, commands: trio.MemorySendChannel[Incoming]) -> None:
            nonlocal sent
            async with commands:
                for number in range(400):
                    await commands.send(Incoming(command=w.GetState(), command_id=number))
                    sent += 1

        async def write(self, batch: bytearray) -> None:
            await reading.wait()  # the client reads at last
            written.append(bytes(batch))

        async def aclose(self) -> None:
            pass

    class Held(Connection):
        async def handle(self, command: Any, command_id: str | int | None) -> None:
            handled.append(command_id)
            self.put_line(b"x" * 999 + b"\n")

    connection = Held(Transport(), hold_back=True)
    connection.outbox = Outbox(high_water_bytes=10_000)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.serve)
        await trio.testing.wait_all_tasks_blocked()
        # answers wait to be written, past the high-water mark: the next command waits
        assert 10_000 < connection.outbox.pending_bytes <= 11_000
        assert len(handled) <= 13
        # one command in hand, the channel full: the reader is held
        assert sent == len(handled) + 1 + COMMAND_QUEUE_SIZE
        reading.set()
    assert handled == list(range(400))
    assert sum(len(batch) for batch in written) == 400_000


@given(deltas=st.lists(st.tuples(st.text(), st.integers(0, 2**70), st.floats(allow_nan=False,
                                                                            allow_infinity=False)),
                       min_size=1, max_size=5))
def test_a_message_update_is_encoded_as_every_other_event(
        deltas: list[tuple[str, int, float]]) -> None:
    """The hot path for deltas (its usage encoded once while it does not change) writes the
    same bytes as the general one, whatever the text (line separators, lone surrogates) and
    the numbers (beyond 64 bits, which orjson refuses)."""
    from forged import _codec

    usage = w.Usage()
    for text, tokens, cost in deltas:
        for event in (w.TextDelta(content_index=0, delta=text),
                      w.ThinkingDelta(content_index=1, delta=text),
                      w.TextEnd(content_index=0, content=text)):
            update = w.MessageUpdate(usage=usage, assistant_message_event=event)
            assert _codec.encode(update) == encode_line(_codec.unstructure(update))
        usage.output, usage.cost.total = tokens, cost


@given(texts=st.lists(st.text(), min_size=1, max_size=4), number=st.integers(0, 2**70),
       will_retry=st.booleans())
def test_events_carrying_ended_messages_are_encoded_as_every_other_event(
        texts: list[str], number: int, will_retry: bool) -> None:
    """``message_start``, ``message_end``, ``turn_end`` and ``agent_end`` are written from
    each message's JSON, made as it ends: the same bytes as the general way, whatever the
    text and numbers (and a reply's ``message_start``, written while it streams, is made
    anew)."""
    from forged import _codec

    def same(event: Any) -> None:
        assert _codec.encode(event) == encode_line(_codec.unstructure(event))

    user = w.UserMessage(content=[w.TextContent(text=text) for text in texts], timestamp=1)
    call = w.ToolCall(id=texts[0], name="bash", arguments={"command": texts[-1], "n": number})
    reply = w.AssistantMessage(content=[w.ThinkingContent(thinking=texts[0]), call], api="a",
                               provider="p", model="m", timestamp=number)
    result = w.ToolResultMessage(tool_call_id=texts[0], tool_name="bash", timestamp=3,
                                 content=[w.TextContent(text=texts[-1])], is_error=will_retry,
                                 details={"output": texts[0]})
    same(w.MessageStart(message=reply))
    reply.content.append(w.TextContent(text=texts[-1]))  # as a reply streams
    for message in (user, reply, result):
        same(w.MessageStart(message=message))
        same(w.MessageEnd(message=message))
    same(w.TurnEnd(message=reply, tool_results=[result, result]))
    same(w.AgentEnd(messages=[user, reply, result], will_retry=will_retry))
    same(w.AgentEnd(messages=[w.UserMessage(content=[], timestamp=0), reply]))
    assert not any(message in _codec._ended for message in (user, reply, result))  # nor kept


@pytest.mark.parametrize("depth", range(248, 256))
def test_a_message_as_deep_as_orjson_goes_is_encoded_as_every_other_event(depth: int) -> None:
    """Near orjson's nesting limit a message alone may be written where the event holding it
    is not (then the whole line is ASCII, the general way): the same bytes either way."""
    from forged import _codec

    nested: w.JSONValue = "é"
    for _ in range(depth):
        nested = [nested]
    result = w.ToolResultMessage(tool_call_id="c", tool_name="t", timestamp=1, is_error=False,
                                 content=[w.TextContent(text="ü")], details={"deep": nested})
    reply = w.AssistantMessage(content=[], api="a", provider="p", model="m", timestamp=2)
    for event in (w.MessageStart(message=result), w.MessageEnd(message=result),
                  w.TurnEnd(message=reply, tool_results=[result]),
                  w.AgentEnd(messages=[result])):
        assert _codec.encode(event) == encode_line(_codec.unstructure(event))


_SSE_LINE = st.binary(max_size=20).filter(lambda b: b"\n" not in b and b"\r" not in b)


@given(events=st.lists(st.tuples(st.sampled_from([b"", b"message", b"content_block_delta"]),
                                 st.lists(_SSE_LINE, min_size=1, max_size=3)), max_size=8),
       cuts=st.lists(st.integers(0, 400), max_size=8), crlf=st.booleans(),
       extra_blank=st.booleans())
def test_sse_events_come_out_whole_however_the_bytes_are_cut(
        events: list[tuple[bytes, list[bytes]]], cuts: list[int], crlf: bool,
        extra_blank: bool) -> None:
    """Each event once, whole, in order, whatever chunks the stream arrives in, with LF or
    CRLF line ends and blank lines between events."""
    end = b"\r\n" if crlf else b"\n"
    stream = b"".join(
        (b"event: " + name + end if name else b"") + b"".join(b"data: " + line + end
                                                            for line in data)
        + end + (end if extra_blank else b"") for name, data in events)
    decoder = SseDecoder()
    found: list[tuple[bytes, bytes]] = []
    start = 0
    for cut in [*sorted(cuts), len(stream)]:
        found += decoder.feed(stream[start:max(start, cut)])
        start = max(start, cut)
    assert found == [(name, b"\n".join(data)) for name, data in events]
