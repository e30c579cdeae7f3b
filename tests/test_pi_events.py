"""What pi 1.x clients read beyond the base protocol: `agent_settled.aborted`, a tool's
`durationMs` and `structuredContent`, `session_info_changed`, `thinking_level_changed`, the
`pending` assistant `message_start`, and `bash` output kept from the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from forged._plugins import PluginAPI, PluginSource, ToolCallEvent
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall

from .harness import Client, open_client

DONE = Reply(content=[ScriptText(text="done")])


def call(name: str, **arguments: Any) -> Reply:
    return Reply(content=[ScriptToolCall(name=name, id=f"call_{name}", arguments=arguments)])


def tool_ends(client: Client) -> dict[str, dict[str, Any]]:
    return {end["toolCallId"]: end for end in client.events("tool_execution_end")}


async def test_agent_settled_says_whether_the_run_was_aborted(tmp_path: Path) -> None:
    slow = Reply(content=[ScriptText(text="a b c d e f g h", chunks=8, delay_ms=200)])
    async with open_client(tmp_path, [DONE, slow]) as client:
        await client.prompt_and_settle("quick")
        await client.send({"type": "prompt", "message": "slow"})
        await client.wait_for(lambda e: e.get("type") == "message_update")
        await client.request({"type": "abort"})
        await client.settled(2)
    assert [e["aborted"] for e in client.events("agent_settled")] == [False, True]


async def test_a_tool_that_ran_says_how_long_one_that_did_not_does_not(
        tmp_path: Path) -> None:
    def register(api: PluginAPI) -> None:
        api.on("before_tool_call", lambda event, ctx: api.block("not today")
               if isinstance(event, ToolCallEvent) and event.tool_name == "write" else None)

    replies = [Reply(content=[
        ScriptToolCall(name="bash", id="ran", arguments={"command": "sleep 0.05"}),
        ScriptToolCall(name="nosuch", id="unknown", arguments={}),
        ScriptToolCall(name="read", id="invalid", arguments={"offset": 1}),
        ScriptToolCall(name="write", id="blocked", arguments={"path": "x", "content": "y"})]),
        DONE]
    source = PluginSource(id="gate", register=register, scope="temporary")
    async with open_client(tmp_path, replies, plugins=[source]) as client:
        await client.prompt_and_settle("go")
    ends = tool_ends(client)
    assert 40 <= ends["ran"]["durationMs"] < 5000
    assert all("durationMs" not in ends[name] for name in ("unknown", "invalid", "blocked"))
    assert all(ends[name]["isError"] for name in ("unknown", "invalid", "blocked"))


async def test_bash_results_carry_structured_content(tmp_path: Path) -> None:
    replies = [Reply(content=[
        ScriptToolCall(name="bash", id="ok", arguments={"command": "echo hi"}),
        ScriptToolCall(name="bash", id="fails", arguments={"command": "echo no; exit 3"}),
        ScriptToolCall(name="bash", id="long",
                       arguments={"command": "head -c 3000000 /dev/zero | tr '\\0' x"})]),
        DONE]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("go")
    ends = tool_ends(client)
    ok = ends["ok"]["result"]["structuredContent"]
    assert {k: ok[k] for k in ("output", "truncated", "exit_code")} == {
        "output": "hi\n", "truncated": False, "exit_code": 0}
    assert isinstance(ok["wall_time_seconds"], float)
    fails = ends["fails"]
    assert fails["isError"] is True
    assert fails["result"]["structuredContent"]["exit_code"] == 3
    assert fails["result"]["structuredContent"]["output"] == "no\n"
    long = ends["long"]["result"]["structuredContent"]
    assert long["truncated"] is True and long["full_output_path"]
    assert "[... 1951424 bytes omitted ...]" in long["output"]
    assert len(long["output"]) < 1_100_000
    messages = [e["message"] for e in client.events("message_end")
                if e["message"]["role"] == "toolResult"]
    assert all("structuredContent" not in m for m in messages)  # for programs, not the model


async def test_renames_and_level_changes_are_announced(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        await client.request({"type": "set_session_name", "name": "  review  "})
        await client.request({"type": "set_thinking_level", "level": "high"})
        await client.request({"type": "set_thinking_level", "level": "high"})  # no change
        await client.request({"type": "cycle_thinking_level"})
    assert client.events("session_info_changed") == [
        {"type": "session_info_changed", "name": "review"}]
    assert [e["level"] for e in client.events("thinking_level_changed")] == ["high", "off"]
    types = client.types()
    assert types.index("session_info_changed") < types.index("response")  # then answered


async def test_an_assistant_message_starts_pending_and_is_never_stored_so(
        tmp_path: Path) -> None:
    async with open_client(tmp_path, [DONE]) as client:
        await client.prompt_and_settle("hi")
        path = (await client.request({"type": "get_state"}))["data"]["sessionFile"]
    starts = [e["message"] for e in client.events("message_start")
              if e["message"]["role"] == "assistant"]
    ends = [e["message"] for e in client.events("message_end")
            if e["message"]["role"] == "assistant"]
    assert [m["stopReason"] for m in starts] == ["pending"]
    assert [m["stopReason"] for m in ends] == ["stop"]
    assert b"pending" not in Path(path).read_bytes()


async def test_bash_excluded_from_context_never_reaches_the_model(tmp_path: Path) -> None:
    async with open_client(tmp_path, [DONE, DONE]) as client:
        kept = await client.request({"type": "bash", "command": "echo SECRET-TOKEN",
                                     "excludeFromContext": True})
        shown = await client.request({"type": "bash", "command": "echo visible-output"})
        await client.prompt_and_settle("go on")
        await client.request({"type": "compact"})
        path = (await client.request({"type": "get_state"}))["data"]["sessionFile"]
    assert kept["success"] and shown["success"]
    sent = [orjson.dumps(request.body) for request in client.server.requests]
    assert all(b"SECRET-TOKEN" not in body for body in sent)  # the prompt, the summary
    assert b"visible-output" in sent[0]
    stored = [orjson.loads(line) for line in Path(path).read_bytes().splitlines()]
    bash = [e["message"] for e in stored if e.get("type") == "message"
            and e["message"]["role"] == "bashExecution"]
    assert [m.get("excludeFromContext") for m in bash] == [True, None]
    assert "SECRET-TOKEN" in bash[0]["output"]  # kept in the session
