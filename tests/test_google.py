"""Gemini's wire format beyond what the oracle tests cover: what differs between model
generations in the request, and how odd streams end."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from forged import _wire as w
from forged._errors import ProviderError, ProviderStreamError
from forged._providers.base import AssistantBuilder, ProviderRequest
from forged._providers.google import StreamReader, build_body
from forged._providers.scripted import Reply, ScriptToolCall

from .harness import open_client

PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
         "AAAABJRU5ErkJggg==")


def gemini(model_id: str, level_map: dict[str, str | None] | None = None,
           levels: tuple[str, ...] = ("off", "minimal", "low", "medium", "high")) -> w.Model:
    return w.Model(id=model_id, name=model_id, api="google-generative-ai", provider="google",
                   base_url="http://127.0.0.1:9/v1beta", reasoning=True,
                   input=["text", "image"], context_window=1_000_000, max_tokens=65_536,
                   cost=w.ModelCost(), thinking_levels=list(levels),
                   thinking_level_map=level_map)


def request(model: w.Model, messages: list[w.AgentMessage], level: str = "medium"
            ) -> ProviderRequest:
    return ProviderRequest(model=model, system_prompt="", messages=messages, tools=[],
                           thinking_level=level, api_key="k", headers={}, session_id="s")


def looked(model: w.Model, *, from_model: str | None = None) -> list[w.AgentMessage]:
    """A prompt with a picture, a reply (by `from_model`, else `model`) that read one, and
    the tool's result, with a picture too."""
    picture = w.ImageContent(data=PIXEL, mime_type="image/png")
    return [
        w.UserMessage(content=[w.TextContent(text="look"), picture], timestamp=1),
        w.AssistantMessage(
            content=[w.ThinkingContent(thinking="First the file.", thinking_signature="c2ln"),
                     w.ToolCall(id="call/1", name="read", arguments={"path": "a.png"},
                                thought_signature="Y2FsbA==")],
            api="google-generative-ai", provider="google", model=from_model or model.id,
            stop_reason="toolUse", timestamp=2),
        w.ToolResultMessage(tool_call_id="call/1", tool_name="read",
                            content=[w.TextContent(text="a picture"), picture],
                            is_error=False, timestamp=3)]


def test_gemini_3_sends_call_ids_and_nests_a_results_images() -> None:
    model = gemini("gemini-3-pro-preview")
    contents = build_body(request(model, looked(model)))["contents"]
    assert contents[1] == {"role": "model", "parts": [
        {"thought": True, "text": "First the file.", "thoughtSignature": "c2ln"},
        {"functionCall": {"name": "read", "args": {"path": "a.png"}, "id": "call_1"},
         "thoughtSignature": "Y2FsbA=="}]}
    assert contents[2:] == [{"role": "user", "parts": [{"functionResponse": {
        "name": "read", "response": {"output": "a picture"}, "id": "call_1",
        "parts": [{"inlineData": {"mimeType": "image/png", "data": PIXEL}}]}}]}]


def test_gemini_2_sends_no_call_ids_and_a_results_images_in_a_turn_of_their_own() -> None:
    model = gemini("gemini-2.5-flash")
    contents = build_body(request(model, looked(model)))["contents"]
    assert contents[1]["parts"][1] == {"functionCall": {"name": "read",
                                                        "args": {"path": "a.png"}},
                                       "thoughtSignature": "Y2FsbA=="}
    assert contents[2:] == [
        {"role": "user", "parts": [{"functionResponse": {
            "name": "read", "response": {"output": "a picture"}}}]},
        {"role": "user", "parts": [{"text": "Tool result image:"},
                                   {"inlineData": {"mimeType": "image/png", "data": PIXEL}}]}]


def test_another_models_thinking_is_plain_text_and_its_signatures_stay_home() -> None:
    model = gemini("gemini-3-pro-preview")
    contents = build_body(request(model, looked(model, from_model="gemini-2.5-pro")))["contents"]
    assert contents[1] == {"role": "model", "parts": [
        {"text": "First the file."},
        {"functionCall": {"name": "read", "args": {"path": "a.png"}, "id": "call_1"}}]}


@pytest.mark.parametrize(("level", "sent"), [
    ("off", {"thinkingLevel": "LOW"}),  # the lowest level it has: it cannot stop thinking
    ("low", {"includeThoughts": True, "thinkingLevel": "LOW"}),
    ("medium", {"includeThoughts": True, "thinkingLevel": "HIGH"}),
    ("high", {"includeThoughts": True, "thinkingLevel": "HIGH"}),
])
def test_a_thinking_level_map_picks_what_gemini_is_sent(level: str,
                                                        sent: dict[str, Any]) -> None:
    model = gemini("gemini-3-pro-preview", level_map={
        "off": None, "minimal": None, "low": "low", "medium": "high", "high": "high"},
        levels=("low", "medium", "high"))
    body = build_body(request(model, [w.UserMessage(content=[w.TextContent(text="hi")],
                                                    timestamp=1)], level))
    assert body["generationConfig"]["thinkingConfig"] == sent


def test_const_is_sent_as_a_one_value_enum_and_property_names_are_left_alone() -> None:
    from forged._providers.google import const_as_enum

    schema = {"type": "object", "properties": {
        "const": {"type": "string", "const": "x"},
        "mode": {"anyOf": [{"const": "a"}, {"const": 2}, {"const": True}]}}}
    assert const_as_enum(schema) == {"type": "object", "properties": {
        "const": {"type": "string", "enum": ["x"]},
        "mode": {"anyOf": [{"enum": ["a"]}, {"enum": [2]}, {"const": True}]}}}


def read(*chunks: dict[str, Any]) -> AssistantBuilder:
    model = gemini("gemini-2.5-flash")
    out = AssistantBuilder(model, lambda event: None)
    reader = StreamReader(out)
    for chunk in chunks:
        reader.chunk(chunk)
    reader.finish()
    return out


def parts(*items: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(items)}}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate]}


def test_calls_without_an_id_or_with_a_taken_one_get_a_new_one() -> None:
    out = read(parts({"functionCall": {"name": "ls", "args": {}}},
                     {"functionCall": {"name": "read", "args": {"path": "a"}, "id": "c1"}},
                     {"functionCall": {"name": "read", "args": {"path": "b"}, "id": "c1"}},
                     finish="STOP"))
    ids = [block.id for block in out.message.content if isinstance(block, w.ToolCall)]
    assert re.fullmatch(r"ls_\d{13}_\d+", ids[0])
    assert ids[1] == "c1" and re.fullmatch(r"read_\d{13}_\d+", ids[2])
    assert out.message.stop_reason == "toolUse"


def test_a_safety_stop_is_an_error_and_a_stream_without_a_finish_a_retryable_one() -> None:
    with pytest.raises(ProviderError, match="Provider stopped with: SAFETY"):
        read(parts({"text": "I"}), parts(finish="SAFETY"))
    with pytest.raises(ProviderStreamError, match="without a finish reason"):
        read(parts({"text": "cut"}))


async def test_a_call_without_an_id_runs_and_its_result_goes_back(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={"command": "echo hi"})]),
               Reply(content=[])]
    async with open_client(tmp_path, replies, api="google-generative-ai") as client:
        await client.prompt_and_settle("list")
    end = client.events("tool_execution_end")[0]
    assert re.fullmatch(r"bash_\d{13}_\d+", end["toolCallId"]) and not end["isError"]
    sent = client.server.requests[1].body["contents"][-1]
    assert sent["parts"][0]["functionResponse"] == {"name": "bash",
                                                    "response": {"output": "hi\n"}}
