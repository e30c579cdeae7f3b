"""The agent loop end to end: the official SDKs against the scripted provider, per format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from forged._providers.scripted import (
    Reply,
    ScriptText,
    ScriptThinking,
    ScriptToolCall,
    ScriptUsage,
)

from .harness import Client, Event, open_client

APIS = ["anthropic-messages", "openai-completions", "openai-responses", "google-generative-ai",
        "azure-openai-responses", "google-vertex", "mistral-conversations",
        "bedrock-converse-stream"]
APP = "def value():\n    return 1\n\nprint(value())\n"


def shape(event: Event) -> str:
    """An event as the sequence tests compare it: type, role, or the stream delta's type."""
    kind = event["type"]
    if kind in ("message_start", "message_end"):
        return f"{kind}:{event['message']['role']}"
    if kind == "message_update":
        return f"update:{event['assistantMessageEvent']['type']}"
    if kind == "response":
        return f"response:{event['command']}"
    return str(kind)


def shapes(client: Client, start: int = 0) -> list[str]:
    return [shape(event) for event in client.output[start:]]


def coding_replies() -> list[Reply]:
    return [
        Reply(content=[ScriptThinking(thinking="Look at the file first.", signature="sig-read"),
                       ScriptToolCall(name="read", arguments={"path": "app.py"}, id="call_read")]),
        Reply(content=[ScriptToolCall(name="edit", id="call_edit", arguments={
            "path": "app.py", "oldText": "return 1", "newText": "return 2"})]),
        Reply(content=[ScriptToolCall(name="bash", id="call_bash",
                                      arguments={"command": "python3 app.py"})]),
        Reply(content=[ScriptText(text="The value is now 2.", chunks=3)],
              usage=ScriptUsage(input=120, output=7, cache_read=30)),
    ]


TOOL_TURN = ["message_start:assistant", "update:toolcall_start", "update:toolcall_delta",
             "update:toolcall_end", "message_end:assistant", "tool_execution_start",
             "tool_execution_end", "message_start:toolResult", "message_end:toolResult",
             "turn_end", "turn_start"]

CODING_SEQUENCE = [
    "response:prompt", "agent_start", "turn_start", "message_start:user", "message_end:user",
    "message_start:assistant", "update:thinking_start", "update:thinking_delta",
    "update:thinking_end", "update:toolcall_start", "update:toolcall_delta",
    "update:toolcall_end", "message_end:assistant", "tool_execution_start",
    "tool_execution_end", "message_start:toolResult", "message_end:toolResult", "turn_end",
    "turn_start",
    *TOOL_TURN[:6], "tool_execution_update", *TOOL_TURN[6:],
    "message_start:assistant", "update:text_start", "update:text_delta", "update:text_delta",
    "update:text_delta", "update:text_end", "message_end:assistant", "turn_end", "agent_end",
    "agent_settled",
]
# The edit turn has no update; the bash turn has one; the order above is read, edit, bash.
CODING_SEQUENCE[19:19] = TOOL_TURN


def tool_results_sent(api: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(call id, text) of every tool result in a request body."""
    found: list[tuple[str, str]] = []
    if api == "anthropic-messages":
        for message in body["messages"]:
            for block in message["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    found.append((block["tool_use_id"], block["content"][0]["text"]))
    elif api == "openai-completions":
        found += [(m["tool_call_id"], m["content"]) for m in body["messages"]
                  if m["role"] == "tool"]
    elif api == "mistral-conversations":
        found += [(m["tool_call_id"], m["content"][0]["text"]) for m in body["messages"]
                  if m["role"] == "tool"]
    elif api == "bedrock-converse-stream":
        found += [(part["toolResult"]["toolUseId"], part["toolResult"]["content"][0]["text"])
                  for message in body["messages"] for part in message["content"]
                  if "toolResult" in part]
    elif api.startswith("google"):
        found += [(part["functionResponse"]["name"],
                   part["functionResponse"]["response"]["output"])
                  for content in body["contents"] for part in content["parts"]
                  if "functionResponse" in part]
    else:
        found += [(item["call_id"], item["output"]) for item in body["input"]
                  if item.get("type") == "function_call_output"]
    return found


@pytest.mark.parametrize("api", APIS)
async def test_coding_scenario(tmp_path: Path, api: str) -> None:
    async with open_client(tmp_path, coding_replies(), api=api) as client:
        (client.cwd / "app.py").write_text(APP)
        await client.prompt_and_settle("Make value() return 2 and run it")
        state = await client.request({"type": "get_state"})
        text = await client.request({"type": "get_last_assistant_text"})
        messages = await client.request({"type": "get_messages"})

    assert shapes(client)[: len(CODING_SEQUENCE)] == CODING_SEQUENCE
    assert (client.cwd / "app.py").read_text() == APP.replace("return 1", "return 2")
    assert text["data"] == {"text": "The value is now 2."}
    assert state["data"]["messageCount"] == 8
    assert [m["role"] for m in messages["data"]["messages"]] == [
        "user", "assistant", "toolResult", "assistant", "toolResult", "assistant", "toolResult",
        "assistant"]

    ends = client.events("tool_execution_end")
    assert [e["toolName"] for e in ends] == ["read", "edit", "bash"]
    assert ends[0]["result"]["content"] == [{"type": "text", "text": APP}]
    assert ends[1]["result"]["details"]["diff"] == (
        " 1 def value():\n-2     return 1\n+2     return 2\n 3 \n 4 print(value())\n 5 ")
    assert ends[1]["result"]["details"]["firstChangedLine"] == 2
    assert ends[2]["result"]["content"] == [{"type": "text", "text": "2\n"}]
    assert not any(e["isError"] for e in ends)

    final = client.events("message_end")[-1]["message"]
    assert final["stopReason"] == "stop"
    assert [(b["type"], b["text"]) for b in final["content"]] == [
        ("text", "The value is now 2.")]
    assert final["usage"]["input"] == 120 and final["usage"]["cacheRead"] == 30
    assert final["usage"]["output"] == 7
    assert final["usage"]["cost"]["total"] == pytest.approx(
        (120 * 3 + 7 * 15 + 30 * 0.3) / 1e6)
    first = client.events("message_end")[1]["message"]
    assert first["stopReason"] == "toolUse"
    assert first["content"][0]["type"] == "thinking"
    assert first["content"][0]["thinking"] == "Look at the file first."
    agent_end = client.events("agent_end")[0]
    assert agent_end["willRetry"] is False and len(agent_end["messages"]) == 8

    requests = client.server.requests
    assert len(requests) == 4
    headers = requests[0].headers
    if api.startswith("anthropic"):
        assert headers["x-api-key"] == "scripted-key" and "authorization" not in headers
        assert headers["anthropic-version"] == "2023-06-01"
    elif api.startswith("google"):
        assert headers["x-goog-api-key"] == "scripted-key" and "authorization" not in headers
    elif api.startswith("azure"):
        assert headers["api-key"] == "scripted-key" and "authorization" not in headers
    else:
        assert headers["authorization"] == "Bearer scripted-key"
    assert requests[0].path == {
        "anthropic-messages": "/v1/messages", "openai-completions": "/v1/chat/completions",
        "openai-responses": "/v1/responses",
        "google-generative-ai": "/v1beta/models/google-generative-ai:streamGenerateContent",
        "azure-openai-responses": "/openai/v1/responses",
        "google-vertex": "/v1/publishers/google/models/google-vertex:streamGenerateContent",
        "mistral-conversations": "/mistral/v1/chat/completions",
        "bedrock-converse-stream": "/model/bedrock-converse-stream/converse-stream",
    }[api]
    final_body = requests[3].body
    results = [APP, "Successfully replaced text in app.py.", "2\n"]
    if api == "mistral-conversations":  # the ancestor sends them trimmed
        results = [text.strip() for text in results]
    assert [text for _, text in tool_results_sent(api, final_body)] == results
    assert_thinking_sent_back(api, requests[1].body)


def assert_thinking_sent_back(api: str, body: dict[str, Any]) -> None:
    if api == "anthropic-messages":
        assistant = body["messages"][1]
        assert assistant["role"] == "assistant"
        assert assistant["content"][0] == {
            "type": "thinking", "thinking": "Look at the file first.", "signature": "sig-read"}
        assert assistant["content"][1]["type"] == "tool_use"
        assert assistant["content"][1]["id"] == "call_read"
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192}
        assert len(body["tools"]) == 4  # read, bash, edit, write: the default set
    elif api == "bedrock-converse-stream":
        assert body["messages"][1] == {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "Look at the file first."}}},
            {"toolUse": {"toolUseId": "call_read", "name": "read",
                         "input": {"path": "app.py"}}}]}  # not Claude: no signature
        assert body["system"] == [{"text": body["system"][0]["text"]}]
        assert len(body["toolConfig"]["tools"]) == 4
    elif api == "mistral-conversations":
        call_id = body["messages"][2]["tool_calls"][0]["id"]  # call_read, as Mistral takes ids
        assert len(call_id) == 9 and call_id.isalnum()
        assert body["messages"][2] == {
            "role": "assistant", "prefix": False,
            "content": [{"type": "thinking",
                         "thinking": [{"type": "text", "text": "Look at the file first."}]}],
            "tool_calls": [{"id": call_id, "type": "function", "index": 0,
                            "function": {"name": "read", "arguments": '{"path":"app.py"}'}}]}
        assert body["messages"][3]["tool_call_id"] == call_id
        assert body["prompt_mode"] == "reasoning" and len(body["tools"]) == 4
    elif api.startswith("google"):
        assert body["contents"][1] == {"role": "model", "parts": [
            {"thought": True, "text": "Look at the file first.",
             "thoughtSignature": "c2lnLXJlYWQ="},  # sig-read, as the stream sent it
            {"functionCall": {"name": "read", "args": {"path": "app.py"}}}]}
        assert body["systemInstruction"]["parts"][0]["text"].startswith("You are")
        assert body["generationConfig"] == {
            "maxOutputTokens": 16384,
            "thinkingConfig": {"includeThoughts": True, "thinkingBudget": -1}}
        assert len(body["tools"][0]["functionDeclarations"]) == 4
    elif api == "openai-completions":
        assert body["messages"][0]["role"] == "system"
        assert body["messages"][2]["tool_calls"][0]["id"] == "call_read"
        assert body["stream_options"] == {"include_usage": True}
        assert body["reasoning_effort"] == "medium"
        assert len(body["tools"]) == 4  # read, bash, edit, write: the default set
    else:
        reasoning = body["input"][1]
        assert reasoning["type"] == "reasoning"
        assert reasoning["encrypted_content"] == "sig-read"
        assert reasoning["summary"] == [{"type": "summary_text",
                                         "text": "Look at the file first."}]
        call = body["input"][2]
        assert call["type"] == "function_call" and call["call_id"] == "call_read"
        assert body["include"] == ["reasoning.encrypted_content"]
        assert body["reasoning"] == {"effort": "medium", "summary": "auto"}
        assert body["store"] is False


@pytest.mark.parametrize("api", APIS)
async def test_provider_error_ends_the_turn(tmp_path: Path, api: str) -> None:
    replies = [Reply(status=400, error_type="invalid_request_error",
                     error_message="bad things happened")]
    async with open_client(tmp_path, replies, api=api) as client:
        await client.prompt_and_settle("hi")
    assert shapes(client) == [
        "response:prompt", "agent_start", "turn_start", "message_start:user",
        "message_end:user", "message_start:assistant", "message_end:assistant", "turn_end",
        "agent_end", "agent_settled"]
    message = client.events("message_end")[1]["message"]
    assert message["stopReason"] == "error"
    assert message["errorMessage"].startswith("400 ")
    assert "bad things happened" in message["errorMessage"]


@pytest.mark.parametrize("api", APIS)
async def test_stream_cut_mid_response_is_an_error(tmp_path: Path, api: str) -> None:
    replies = [Reply(content=[ScriptText(text="partial answer", chunks=2)], cut=True)]
    async with open_client(tmp_path, replies, api=api) as client:
        await client.request({"type": "set_auto_retry", "enabled": False})  # see test_retry
        await client.prompt_and_settle("hi")
    message = client.events("message_end")[1]["message"]
    assert message["stopReason"] == "error"
    assert message["errorMessage"]
    assert message["content"][0]["text"] == "partial answer"
    assert client.types()[-2:] == ["agent_end", "agent_settled"]


async def test_a_failed_reply_is_left_out_of_the_next_request(tmp_path: Path) -> None:
    replies = [Reply(status=400, error_message="boom"), Reply(content=[ScriptText(text="ok")])]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("first")
        await client.prompt_and_settle("second")
    body = client.server.requests[1].body
    assert [m["role"] for m in body["messages"]] == ["user", "user"]
