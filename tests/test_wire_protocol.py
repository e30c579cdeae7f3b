"""Byte-level protocol tests: bytes in, JSON lines out, over memory streams."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from forged import _wire as w

from .harness import open_client


async def test_get_state_of_a_fresh_session(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        response = await client.request({"type": "get_state"})
    assert response["type"] == "response" and response["command"] == "get_state"
    assert response["success"] is True
    state = response["data"]
    assert state["model"]["provider"] == "scripted"
    assert state["model"]["id"] == "anthropic-messages"
    assert "apiKey" not in state["model"] and "headers" not in state["model"]
    assert state["thinkingLevel"] == "medium"
    assert state["isStreaming"] is False and state["isCompacting"] is False
    assert state["steeringMode"] == "one-at-a-time"
    assert state["followUpMode"] == "one-at-a-time"
    assert state["messageCount"] == 0 and state["pendingMessageCount"] == 0
    assert state["autoCompactionEnabled"] is True
    assert isinstance(state["sessionId"], str)
    assert "sessionName" not in state


async def test_no_model_is_null_and_prompt_is_refused(tmp_path: Path) -> None:
    async with open_client(tmp_path, model=False) as client:
        state = await client.request({"type": "get_state"})
        prompt = await client.request({"type": "prompt", "message": "hi"})
        after = len(client.output)
        probe = await client.request({"type": "get_state"})
    assert state["data"]["model"] is None
    assert prompt == {"id": prompt["id"], "type": "response", "command": "prompt",
                      "success": False, "error": (
                          "No model selected: set ANTHROPIC_API_KEY or OPENAI_API_KEY, or add "
                          f"a provider to {tmp_path / 'agent' / 'models.json'}; `forged login "
                          "PROVIDER` signs in or saves a key; to try forged without a key: "
                          "--provider scripted --script FILE (docs/keys.md, The scripted "
                          "provider)")}
    assert client.output[after:] == [probe]  # a refused prompt has no events


@pytest.mark.parametrize(
    ("line", "command", "error"),
    [
        (b"not json", "parse", "Failed to parse command: "),
        (b"[1, 2]", "parse", "Failed to parse command: expected a JSON object"),
        (b'{"id": "x"}', "parse", "Failed to parse command: missing string field 'type'"),
        (b'{"type": 5}', "parse", "Failed to parse command: missing string field 'type'"),
        (b'{"type": "dance", "id": "d"}', "dance", "Unknown command: dance"),
        (b'{"type": "prompt"}', "prompt",
         "Invalid prompt command: missing required field 'message'"),
        (b'{"type": "prompt", "message": 5}', "prompt",
         "Invalid prompt command: invalid field 'message': expected a string"),
        (b'{"type": "set_steering_mode", "mode": "sometimes"}', "set_steering_mode",
         "Invalid set_steering_mode command: invalid field 'mode': expected one of 'all', "
         "'one-at-a-time'"),
        (b'{"type": "prompt", "message": "x", "images": [{"data": 1}]}', "prompt",
         "Invalid prompt command: invalid field 'images[0].data': expected a string; "
         "missing required field 'images[0].mimeType'"),
        (b'\xff\xfe{"type": "get_state"}', "parse", "Failed to parse command: "),
        ('{"type": "get_state"}'.encode("utf-16"), "parse", "Failed to parse command: "),
        # Deep nesting, which recursed until the process died: unclosed, closed past orjson's
        # limit, and inside a valid command's field and a prompt's images.
        (b"[" * 1000, "parse", "Failed to parse command: "),
        (b"[" * 1025 + b"]" * 1025, "parse", "Failed to parse command: "),
        (b'{"type": "extension_ui_response", "id": "u", "value": ' + b"[" * 600 + b"]" * 600
         + b"}", "parse", "Failed to parse command: nested deeper than 254 levels"),
        (b'{"type": "prompt", "message": "x", "images": ' + b"[" * 990 + b"]" * 990 + b"}",
         "parse", "Failed to parse command: nested deeper than 254 levels"),
        # A lone surrogate (a JavaScript client slicing an emoji): no provider takes the text.
        (b'{"type": "prompt", "message": "a\\udfffb"}', "parse",
         "Failed to parse command: invalid high surrogate"),
    ],
)
async def test_bad_input_gets_one_error_response(tmp_path: Path, line: bytes, command: str,
                                                 error: str) -> None:
    async with open_client(tmp_path) as client:
        await client.send_raw(line + b"\n")
        await client.send_raw(b'{"type": "get_state", "id": "after"}\n')
        await client.response("after")
    refusal, state = client.output
    assert refusal["type"] == "response" and refusal["success"] is False
    assert refusal["command"] == command
    assert refusal["error"].startswith(error)
    assert state["success"] is True  # and the process goes on


async def test_ids_are_echoed_and_missing_ids_omitted(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        await client.send_raw(b'{"type": "get_state"}\n{"type": "get_state", "id": 7}\n'
                              b'{"type": "nope", "id": "n"}\n{"id": "p"}\n')
        await client.wait_for(lambda e: e.get("id") == "p")
    first, second, unknown, parse = client.output
    assert "id" not in first
    assert second["id"] == 7
    assert unknown["id"] == "n" and unknown["command"] == "nope"
    assert parse["id"] == "p" and parse["command"] == "parse"


async def test_ids_past_64_bits_come_back_exactly(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        await client.send_raw(b'{"type": "get_state", "id": 18446744073709551616}\n'
                              b'{"type": "get_state", "id": "after"}\n')
        await client.response("after")
    assert client.lines[0].startswith(b'{"id":18446744073709551616,')


async def test_framing_crlf_blank_lines_and_final_line_without_newline(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        await client.send_raw(b'{"type":"get_state","id":"a"}\r\n\n   \n\t\r\n'
                              b'{"type":"get_state","id":"b"}')
        await client.close_input()
        await client.wait_eof()
    assert [e["id"] for e in client.output] == ["a", "b"]


async def test_unicode_separators_are_escaped_and_not_split(tmp_path: Path) -> None:
    text = "a\u2028b\u2029c 😀 é"
    async with open_client(tmp_path, model=False) as client:
        await client.send_raw(orjson.dumps({"type": "dance\u2028", "id": text}) + b"\n")
        await client.wait_for(lambda e: e.get("id") == text)
    (line,) = client.lines
    assert b"\\u2028" in line and b"\\u2029" in line
    assert "😀 é".encode() in line  # other non-ASCII stays raw UTF-8
    assert orjson.loads(line)["command"] == "dance\u2028"


def test_a_wire_object_shows_its_fields() -> None:
    """What a failing assertion prints: the class and its fields, not an address."""
    command = w.Prompt(message="hi", streaming_behavior="steer")
    assert repr(command) == ("Prompt(message='hi', images=None, streaming_behavior='steer', "
                             "traceparent=None, tracestate=None)")
    assert repr(w.GetState()) == "GetState()"
