"""forged's requests and the scripted server's streams, checked by the official SDKs.

The harness validates every request body its scripted servers record (`tests/oracles.py`);
these tests make sure that covers every shape forged sends, and that the SDKs' own stream
readers assemble, from the scripted server's streams, the message forged assembles.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import anthropic
import botocore.session
import openai
import orjson
import pytest
import trio
from google import genai
from google.genai import types as genai_types
from mistralai.client import Mistral

from forged import _wire as w
from forged._catalogue import ProviderConfig
from forged._providers import APIS
from forged._providers.scripted import (
    Reply,
    ScriptBlock,
    ScriptedServer,
    ScriptRedactedThinking,
    ScriptText,
    ScriptThinking,
    ScriptToolCall,
    ScriptUsage,
)

from .harness import open_client

# A 1x1 PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
LEVELS = ["off", "minimal", "low", "medium", "high", "xhigh", "max"]


BASE_PATHS = {"anthropic-messages": "", "google-generative-ai": "/v1beta",
              "azure-openai-responses": "/openai/v1", "google-vertex": "",
              "mistral-conversations": "/mistral", "bedrock-converse-stream": ""}


def oracle_model(api: str, model_id: str, base_url: str) -> w.Model:
    return w.Model(id=model_id, name=model_id, api=api, provider="oracle",
                   base_url=base_url + BASE_PATHS.get(api, "/v1"),
                   reasoning=True, input=["text", "image"], context_window=200_000,
                   max_tokens=64_000, cost=w.ModelCost(),
                   thinking_levels=LEVELS[:5] if api.startswith("google") else LEVELS)


MODELS = {"anthropic-messages": ["claude-opus-4-6", "claude-sonnet-4-5"],
          "openai-completions": ["gpt-5.6"], "openai-responses": ["gpt-5.6"],
          "google-generative-ai": ["gemini-3-pro-preview", "gemini-2.5-flash"],
          "azure-openai-responses": ["gpt-5.6"],
          "google-vertex": ["gemini-3-pro-preview", "gemini-2.5-flash"],
          "mistral-conversations": ["magistral-medium-latest"],
          "bedrock-converse-stream": ["us.anthropic.claude-opus-4-6-v1",
                                      "anthropic.claude-sonnet-4-5-20250929-v1:0"]}


def turn(level: str) -> list[Reply]:
    """A reply that reads the picture (thinking first, when thinking is on), then one that
    answers."""
    look: list[ScriptBlock] = [ScriptToolCall(name="read", arguments={"path": "pixel.png"})]
    if level != "off":
        look.insert(0, ScriptThinking(thinking="The picture first.", signature="sig-" + level))
    return [Reply(content=look), Reply(content=[ScriptText(text=f"Seen at {level}.")])]


# ChatGPT's Codex backend takes only a sign-in's token: tests/test_codex.py covers it (the
# harness checks its requests with the same oracle as OpenAI's Responses).
SIGNED_IN_ONLY = ("openai-codex-responses",)


@pytest.mark.parametrize("api", [api for api in APIS if api not in SIGNED_IN_ONLY])
async def test_every_request_shape_is_one_the_sdk_accepts(tmp_path: Path, api: str) -> None:
    """Images in the prompt and in tool results, tool calls and their results, thinking sent
    back (signatures, reasoning items), cache control, and every thinking level of an
    adaptive and a budgeted model: the harness validates each body against the SDK."""
    model_ids = MODELS[api]
    replies = [reply for _ in model_ids for level in LEVELS for reply in turn(level)]
    async with open_client(tmp_path, replies, api=api) as client:
        (client.cwd / "pixel.png").write_bytes(PIXEL)
        client.config.registry.add_provider(
            ProviderConfig(name="oracle", base_url=client.server.base_url,
                           api_key="oracle-key"),
            [oracle_model(api, model_id, client.server.base_url) for model_id in model_ids])
        for model_id in model_ids:
            chosen = await client.request({"type": "set_model", "provider": "oracle",
                                           "modelId": model_id})
            assert chosen["success"], chosen
            for level in LEVELS:
                await client.request({"type": "set_thinking_level", "level": level})
                await client.prompt_and_settle(f"Describe the picture ({level})", images=[
                    {"type": "image", "data": base64.b64encode(PIXEL).decode(),
                     "mimeType": "image/png"}])
    bodies = [request.body for request in client.server.requests]
    assert len(bodies) == 2 * len(LEVELS) * len(model_ids)
    assert all(request.headers.get("authorization") == "Bearer oracle-key"
               or request.headers.get("x-api-key") == "oracle-key"
               or request.headers.get("x-goog-api-key") == "oracle-key"
               or request.headers.get("api-key") == "oracle-key"
               for request in client.server.requests)
    last = bodies[-1]
    text = repr(last)
    assert text.count("iVBORw0KGgo") >= 2  # the prompt's image and the tool result's
    if api == "anthropic-messages":
        assert "'cache_control': {'type': 'ephemeral'}" in text
        assert "'type': 'tool_result'" in text and "'signature': 'sig-max'" in text
        adaptive = [body.get("output_config") for body in bodies[:2 * len(LEVELS):2]]
        assert adaptive == [None, {"effort": "low"}, {"effort": "low"}, {"effort": "medium"},
                            {"effort": "high"}, {"effort": "max"}, {"effort": "max"}]
        budgets = [body.get("thinking") for body in bodies[2 * len(LEVELS)::2]]
        assert budgets[0] is None and budgets[1] == {"type": "enabled", "budget_tokens": 1024}
    elif api.startswith("google"):
        assert "'functionResponse'" in text and "'thought': True" in text
        assert "'thoughtSignature': 'c2lnLWhpZ2g='" in text  # sig-high, sent back
        configs = [body["generationConfig"]["thinkingConfig"] for body in bodies[::2]]
        on = {"includeThoughts": True}
        assert configs[:len(LEVELS)] == [{"thinkingBudget": 0}, *(
            {**on, "thinkingLevel": level} for level in
            ("MINIMAL", "LOW", "MEDIUM", "HIGH", "HIGH", "HIGH"))]
        assert configs[len(LEVELS):] == [{"thinkingBudget": 0}, *(
            {**on, "thinkingBudget": budget} for budget in
            (128, 2048, 8192, 24576, 24576, 24576))]
    elif api == "bedrock-converse-stream":
        assert "'toolResult'" in text and "'cachePoint'" in text
        assert "'signature': 'sig-max'" in text or "'signature': 'sig-high'" in text
        fields = [body.get("additionalModelRequestFields") for body in bodies[::2]]
        assert fields[0] is None and fields[1] == {
            "thinking": {"type": "adaptive", "display": "summarized"},
            "output_config": {"effort": "low"}}
        assert fields[len(LEVELS) + 3] == {
            "thinking": {"type": "enabled", "budget_tokens": 8192, "display": "summarized"},
            "anthropic_beta": ["interleaved-thinking-2025-05-14"]}
    elif api == "mistral-conversations":
        assert "'role': 'tool'" in text and "'type': 'thinking'" in text
        assert [body.get("prompt_mode") for body in bodies[::2]] == [None, *["reasoning"] * 6]
        assert all(len(call["id"]) == 9 and call["id"].isalnum() for body in bodies
                   for message in body["messages"] for call in message.get("tool_calls", []))
    elif api == "openai-completions":
        assert "'role': 'tool'" in text
        efforts = [body.get("reasoning_effort") for body in bodies[::2]]
        assert efforts == [None, *LEVELS[1:]]
    else:
        assert "'type': 'function_call_output'" in text and "'type': 'reasoning'" in text
        efforts = [(body.get("reasoning") or {}).get("effort") for body in bodies[::2]]
        assert efforts == ["none", *LEVELS[1:]]  # thinking off asked for as effort none


def reply_for(api: str) -> Reply:
    content: list[ScriptBlock] = [
        ScriptThinking(thinking="Let me look at both files.", chunks=3, signature="sig-1"),
        ScriptText(text="Reading them now.", chunks=4),
        ScriptToolCall(name="read", arguments={"path": "a.py"}, id="call_a", chunks=3),
        ScriptToolCall(name="grep", arguments={"pattern": "x", "path": "."}, chunks=2,
                       # Gemini's calls carry no id before Gemini 3: forged makes one up
                       id="call_b" if api.startswith("google") else None)]
    if api in ("anthropic-messages", "bedrock-converse-stream"):
        content.insert(1, ScriptRedactedThinking(data="opaque"))
    return Reply(content=content, usage=ScriptUsage(
        input=100, output=20, cache_read=30,
        cache_write=5 if api in ("anthropic-messages", "bedrock-converse-stream") else 0))


def neutral_forged(message: dict[str, Any]) -> dict[str, Any]:
    """forged's assembled message, reduced to what every API can say."""
    blocks: list[Any] = []
    for block in message["content"]:
        if block["type"] == "thinking":
            blocks.append(("redacted", block["thinkingSignature"]) if block.get("redacted")
                          else ("thinking", block["thinking"]))
        elif block["type"] == "text":
            blocks.append(("text", block["text"]))
        else:
            blocks.append(("toolCall", block["id"], block["name"], block["arguments"]))
    usage = message["usage"]
    return {"content": blocks, "stopReason": message["stopReason"],
            "usage": (usage["input"], usage["output"], usage["cacheRead"], usage["cacheWrite"])}


async def read_with_sdk(api: str, base_url: str) -> dict[str, Any]:
    """The message the SDK's own stream helper assembles, in the same neutral form."""
    blocks: list[Any] = []
    if api == "anthropic-messages":
        sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key="k", max_retries=0)
        async with sdk, sdk.messages.stream(model="m", max_tokens=100, messages=[
                {"role": "user", "content": "hi"}]) as stream:
            message = await stream.get_final_message()
        for block in message.content:
            if block.type == "thinking":
                blocks.append(("thinking", block.thinking))
            elif block.type == "redacted_thinking":
                blocks.append(("redacted", block.data))
            elif block.type == "text":
                blocks.append(("text", block.text))
            elif block.type == "tool_use":
                blocks.append(("toolCall", block.id, block.name, block.input))
        stop = {"tool_use": "toolUse", "end_turn": "stop"}[str(message.stop_reason)]
        usage = message.usage
        return {"content": blocks, "stopReason": stop,
                "usage": (usage.input_tokens, usage.output_tokens,
                          usage.cache_read_input_tokens, usage.cache_creation_input_tokens)}
    if api.startswith("google"):
        return await read_with_genai(base_url, vertex=api == "google-vertex")
    if api == "mistral-conversations":
        return await trio.to_thread.run_sync(read_with_mistral, f"{base_url}/mistral")
    if api == "bedrock-converse-stream":
        return await trio.to_thread.run_sync(read_with_botocore, base_url)
    openai_sdk = (openai.AsyncAzureOpenAI(base_url=f"{base_url}/openai/v1", api_key="k",
                                          api_version="v1", max_retries=0)
                  if api == "azure-openai-responses"
                  else openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="k",
                                          max_retries=0))
    async with openai_sdk as o:
        if api == "openai-completions":
            async with o.chat.completions.stream(model="m", messages=[
                    {"role": "user", "content": "hi"}]) as chat:
                completion = await chat.get_final_completion()
            choice = completion.choices[0]
            reasoning = getattr(choice.message, "reasoning_content", None)
            if reasoning:
                blocks.append(("thinking", reasoning))
            if choice.message.content:
                blocks.append(("text", choice.message.content))
            for call in choice.message.tool_calls or []:
                assert call.type == "function"
                blocks.append(("toolCall", call.id, call.function.name,
                               orjson.loads(call.function.arguments)))
            stop = {"tool_calls": "toolUse", "stop": "stop"}[choice.finish_reason]
            assert completion.usage is not None
            details = completion.usage.prompt_tokens_details
            cached = details.cached_tokens or 0 if details else 0
            return {"content": blocks, "stopReason": stop,
                    "usage": (completion.usage.prompt_tokens - cached,
                              completion.usage.completion_tokens, cached, 0)}
        async with o.responses.stream(model="m", input="hi") as responses:
            response = await responses.get_final_response()
    for item in response.output:
        if item.type == "reasoning":
            blocks.append(("thinking", "\n\n".join(part.text for part in item.summary)))
        elif item.type == "message":
            blocks.append(("text", "".join(part.text for part in item.content
                                           if part.type == "output_text")))
        elif item.type == "function_call":
            blocks.append(("toolCall", f"{item.call_id}|{item.id}", item.name,
                           orjson.loads(item.arguments)))
    has_calls = any(block[0] == "toolCall" for block in blocks)
    assert response.usage is not None
    cached = response.usage.input_tokens_details.cached_tokens
    return {"content": blocks, "stopReason": "toolUse" if has_calls else "stop",
            "usage": (response.usage.input_tokens - cached, response.usage.output_tokens,
                      cached, 0)}


async def read_with_genai(base_url: str, *, vertex: bool) -> dict[str, Any]:
    """google-genai's reading of a Gemini stream (its async client is asyncio's: the sync one
    runs in a thread), as forged reads one: a block per run of parts of one kind, a tool call
    per function call."""
    return await trio.to_thread.run_sync(read_with_genai_sync, base_url, vertex)


def read_with_genai_sync(base_url: str, vertex: bool) -> dict[str, Any]:
    sdk = genai.Client(api_key="k", vertexai=vertex or None, http_options=genai_types.HttpOptions(
        base_url=base_url, api_version="v1" if vertex else "v1beta"))
    blocks: list[Any] = []
    usage = None
    for chunk in sdk.models.generate_content_stream(model="m", contents="hi"):
        candidate = (chunk.candidates or [genai_types.Candidate()])[0]
        for part in (candidate.content.parts if candidate.content else None) or []:
            if part.function_call is not None:
                call = part.function_call
                blocks.append(("toolCall", call.id, call.name, call.args))
            elif part.text is not None:
                kind = "thinking" if part.thought else "text"
                if blocks and blocks[-1][0] == kind:
                    blocks[-1] = (kind, blocks[-1][1] + part.text)
                else:
                    blocks.append((kind, part.text))
        usage = chunk.usage_metadata or usage
    assert usage is not None
    cached = usage.cached_content_token_count or 0
    has_calls = any(block[0] == "toolCall" for block in blocks)
    return {"content": blocks, "stopReason": "toolUse" if has_calls else "stop",
            "usage": ((usage.prompt_token_count or 0) - cached,
                      usage.candidates_token_count, cached, 0)}


def read_with_botocore(base_url: str) -> dict[str, Any]:
    """botocore's reading of a ConverseStream answer (its client is sync: in a thread)."""
    client = botocore.session.get_session().create_client(
        "bedrock-runtime", region_name="us-east-1", endpoint_url=base_url,
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret")
    answer = client.converse_stream(modelId="m", messages=[
        {"role": "user", "content": [{"text": "hi"}]}])
    blocks: dict[int, list[Any]] = {}
    stop, usage = None, {}
    for event in answer["stream"]:
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = start["start"]["toolUse"]
            blocks[start["contentBlockIndex"]] = ["toolCall", use["toolUseId"], use["name"], ""]
        elif "contentBlockDelta" in event:
            index, delta = (event["contentBlockDelta"]["contentBlockIndex"],
                            event["contentBlockDelta"]["delta"])
            if "text" in delta:
                blocks.setdefault(index, ["text", ""])[1] += delta["text"]
            elif "toolUse" in delta:
                blocks[index][3] += delta["toolUse"]["input"]
            elif "redactedContent" in delta["reasoningContent"]:
                blocks[index] = ["redacted", base64.b64encode(
                    delta["reasoningContent"]["redactedContent"]).decode()]
            elif "text" in delta["reasoningContent"]:
                blocks.setdefault(index, ["thinking", ""])[1] += delta["reasoningContent"]["text"]
        elif "messageStop" in event:
            stop = event["messageStop"]["stopReason"]
        elif "metadata" in event:
            usage = event["metadata"]["usage"]
    content = [(*block[:3], orjson.loads(block[3])) if block[0] == "toolCall"
               else tuple(block) for _, block in sorted(blocks.items())]
    return {"content": content, "stopReason": {"tool_use": "toolUse", "end_turn": "stop"}[
        str(stop)], "usage": (usage["inputTokens"], usage["outputTokens"],
                              usage["cacheReadInputTokens"], usage["cacheWriteInputTokens"])}


def read_with_mistral(base_url: str) -> dict[str, Any]:
    """mistralai's reading of a Mistral stream (in a thread: its client is sync or
    asyncio's), as forged reads one."""
    blocks: list[Any] = []
    usage = None
    finish = None

    def add(kind: str, text: str) -> None:
        if blocks and blocks[-1][0] == kind:
            blocks[-1] = (kind, blocks[-1][1] + text)
        elif text:
            blocks.append((kind, text))

    with Mistral(api_key="k", server_url=base_url) as sdk:
        for event in sdk.chat.stream(model="m", messages=[{"role": "user", "content": "hi"}]):
            chunk = event.data
            usage = chunk.usage or usage
            choice = chunk.choices[0]
            finish = choice.finish_reason or finish
            content = choice.delta.content
            for item in [content] if isinstance(content, str) else content or []:
                if isinstance(item, str):
                    add("text", item)
                elif item.type == "thinking":
                    add("thinking", "".join(part.text for part in item.thinking))
            for call in choice.delta.tool_calls or []:
                blocks.append(("toolCall", call.id, call.function.name,
                               orjson.loads(call.function.arguments)))
    assert usage is not None and usage.prompt_tokens is not None
    cached = (usage.prompt_tokens_details or {}).get("cached_tokens", 0)
    calls = [block for block in blocks if block[0] == "toolCall"]
    return {"content": [block for block in blocks if block[0] != "toolCall"] + calls,
            "stopReason": {"tool_calls": "toolUse", "stop": "stop"}[str(finish)],
            "usage": (usage.prompt_tokens - cached, usage.completion_tokens, cached, 0)}


@pytest.mark.parametrize("api", [api for api in APIS if api not in SIGNED_IN_ONLY])
async def test_the_sdk_reads_the_scripted_stream_as_forged_does(tmp_path: Path,
                                                                api: str) -> None:
    async with open_client(tmp_path, [reply_for(api), Reply(content=[ScriptText(text="ok")])],
                           api=api) as client:
        await client.prompt_and_settle("look")
    assembled = neutral_forged(client.events("message_end")[1]["message"])

    server = ScriptedServer([reply_for(api)])
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        read = await read_with_sdk(api, server.base_url)
        nursery.cancel_scope.cancel()
    assert read == assembled
    kinds = [block[0] for block in assembled["content"]]
    assert kinds.count("toolCall") == 2 and "thinking" in kinds and "text" in kinds
