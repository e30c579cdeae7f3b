"""An MCP server's questions to the user (elicitation), in both eras, asked where someone can
answer: over RPC as dialogs, over ACP as the editor's permission requests and forms, in the
daemon held for a client to come; and never offered where nobody can (``-p``). The server is
built with the official SDK (``mcp_elicit_server.py``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from forged import _wire as w
from forged._providers.scripted import Reply, ScriptToolCall
from forged.client import Client

from .acp_editor import Editor, acp
from .harness import open_daemon
from .test_mcp import DONE, Forged, forged_with, text
from .test_process import BIN, child_env

SERVER = str(Path(__file__).parent / "mcp_elicit_server.py")
PAGE = "https://accounts.example.test/link?code=4711"


def entry(era: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [SERVER, era]}


def call(tool: str) -> Reply:
    return Reply(content=[ScriptToolCall(name=f"mcp__asker__{tool}", arguments={})])


async def next_event(forged: Forged) -> dict[str, Any]:
    """The next line forged writes."""
    assert forged.process.stdout is not None
    while b"\n" not in forged.buffer:
        data = await forged.process.stdout.receive_some(1 << 16)
        assert data, "forged exited early"
        forged.buffer += data
    line, forged.buffer = forged.buffer.split(b"\n", 1)
    event: dict[str, Any] = orjson.loads(line)
    forged.output.append(event)
    return event


async def answered(forged: Forged, answers: list[dict[str, Any]]
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """Run the prompt to its end, each dialog answered with the next of `answers`; the
    dialogs asked, and the tools' results."""
    asked: list[dict[str, Any]] = []
    results: list[str] = []
    await forged.send({"type": "prompt", "message": "go"})
    with trio.fail_after(60):  # a hang guard, not a timing
        while (event := await next_event(forged))["type"] != "agent_settled":
            if event["type"] == "extension_ui_request" and event["method"] != "notify":
                asked.append(event)
                await forged.send({"type": "extension_ui_response", "id": event["id"],
                                   **answers.pop(0)})
            elif event["type"] == "tool_execution_end":
                results.append(text(event))
    return asked, results


@pytest.mark.parametrize("era", ["dual", "handshake"])
async def test_a_servers_questions_are_dialogs_over_rpc(tmp_path: Path, era: str) -> None:
    replies = [call("sign_up"), call("sign_up"), call("sign_up"), call("link"), call("link"),
               DONE]
    yes: dict[str, Any] = {"confirmed": True}
    no: dict[str, Any] = {"confirmed": False}
    answers: list[dict[str, Any]] = [
        yes, {"value": "Ada"}, {"value": "thirty-six"}, {"value": "36"}, {"value": "red"},
        {"value": "Yes"},  # accepted (the age asked again)
        no,  # declined
        {"cancelled": True},  # cancelled
        yes, no]  # the page: opened, then not
    async with forged_with(tmp_path, {"asker": entry(era)}, replies) as (forged, _):
        await forged.logged("MCP server asker connected")
        asked, results = await answered(forged, answers)
        version = (await forged.call("get_mcp_servers"))["servers"][0]["protocolVersion"]
    revision = "2026-07-28" if era == "dual" else "2025-11-25"
    assert version == revision
    assert results == [f"{revision}: accepted Ada, 36, red, subscribed",
                       f"{revision}: decline", f"{revision}: cancel",
                       f"{revision}: page accept", f"{revision}: page decline"]
    methods = [(dialog["method"], dialog.get("title")) for dialog in asked]
    assert methods[:6] == [("confirm", "MCP server asker asks"), ("input", "asker: Name"),
                           ("input", "asker: Age"), ("input", "asker: Age"),
                           ("select", "asker: Color"), ("select", "asker: Subscribe")]
    assert asked[0]["message"].startswith("Sign up for the build notices")
    assert asked[1]["placeholder"] == "as on your badge"
    assert asked[4]["options"] == ["red", "blue"]
    assert asked[-1]["method"] == "confirm" and PAGE in asked[-1]["message"]


def test_where_nobody_can_answer_no_question_is_offered(tmp_path: Path) -> None:
    """``-p``: elicitation is not advertised, so the server cannot ask, and the run ends."""
    agent, project = tmp_path / "agent", tmp_path / "project"
    agent.mkdir()
    project.mkdir()
    (agent / "mcp.json").write_text(json.dumps({"mcpServers": {"asker": entry("handshake")}}))
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"api": "anthropic-messages", "replies": [
        {"content": [{"type": "toolCall", "name": "mcp__asker__sign_up", "arguments": {}}]},
        {"content": [{"type": "text", "text": "Done."}]}]}))
    done = subprocess.run(
        [str(BIN / "forged"), "--provider", "scripted", "--script", str(script), "--mode",
         "json", "-p", "go"], capture_output=True, env=child_env(agent), cwd=project,
        timeout=60, check=False)
    events = [json.loads(line) for line in done.stdout.splitlines()]
    (end,) = [e for e in events if e["type"] == "tool_execution_end"]
    assert end["isError"] and "elicitation" in text(end).lower()
    assert not [e for e in events if e["type"] == "extension_ui_request"]


async def test_in_the_daemon_a_question_waits_for_a_client(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "mcp.json").write_text(json.dumps({"mcpServers": {"asker": entry("dual")}}))
    async with open_daemon(tmp_path, [call("link"), DONE]) as daemon:
        async with Client.open_unix(daemon.socket_path) as first:
            await first.new_session()
            session_id = (await first.get_state()).session_id
            await first.prompt("go")
            asked = (await first.next_event(lambda r: r.type == "extension_ui_request")).event
            assert isinstance(asked, w.ExtensionUiRequest) and PAGE in (asked.message or "")
        # this client left without answering: the question waits for the next
        async with Client.open_unix(daemon.socket_path) as second:
            await second.attach(session_id)
            again = (await second.next_event(lambda r: r.type == "extension_ui_request")).event
            assert isinstance(again, w.ExtensionUiRequest) and again.id == asked.id
            await second.answer_dialog(again.id, confirmed=True)
            end = (await second.next_event(lambda r: r.type == "tool_execution_end")).event
            assert isinstance(end, w.ToolExecutionEnd)
            result = "".join(block.text for block in end.result.content
                             if isinstance(block, w.TextContent))
    assert result == "2026-07-28: page accept"


def test_over_acp_a_question_is_the_editors_permission_request_and_form(
        tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"api": "anthropic-messages", "replies": [
        {"content": [{"type": "toolCall", "name": "mcp__asker__sign_up", "arguments": {}}]},
        {"content": [{"type": "text", "text": "Done."}]}]}))
    env = {**child_env(tmp_path / "agent")}
    answers = iter(["allow", "red", "no"])

    class Asked(Editor):
        def __init__(self) -> None:
            super().__init__(choose=self._pick)
            self.forms: list[str] = []
            self.values = iter([{"action": "accept", "content": {"value": "Ada"}},
                                {"action": "accept", "content": {"value": "36"}}])

        def _pick(self, options: list[Any]) -> str | None:
            wanted = next(answers)
            for option in options:
                if wanted in (option.option_id, option.name.lower()):
                    return str(option.option_id)
            return None

        async def create_elicitation(self, message: str, mode: Any, **_: Any) -> Any:
            self.forms.append(message)
            return next(self.values)

    async def drive() -> Asked:
        editor = Asked()
        async with acp.spawn_agent_process(
                editor, str(BIN / "forged"), "--mode", "acp", "--provider", "scripted",
                "--script", str(script), env=env, cwd=str(project),
                use_unstable_protocol=True) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                  client_capabilities=acp.schema.ClientCapabilities(
                                      elicitation={"form": {}}))
            sid = (await conn.new_session(cwd=str(project), mcp_servers=[
                acp.schema.McpServerStdio(name="asker", command=sys.executable,
                                          args=[SERVER, "dual"], env=[])])).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
        return editor

    editor = asyncio.run(asyncio.wait_for(drive(), 60))
    assert editor.forms == ["asker: Name", "asker: Age"]
    (question, _), _, _ = editor.permissions
    ends = [u for u in editor.updates if type(u).__name__ == "ToolCallProgress"]
    assert "accepted Ada, 36, red, not subscribed" in ends[-1].content[0].content.text
    assert question is not None


async def test_the_users_time_to_answer_is_not_the_servers(tmp_path: Path) -> None:
    """A server with a 3 s timeout asks; the user takes longer than that to answer: the call
    still gets its answer (the deadline is put off while the question is open). (The timeout
    also bounds the server's start, its SDK's import ~0.8 s on an idle two-core machine: 1 s
    failed a loaded CI run.)"""
    replies = [call("link"), DONE]
    async with forged_with(tmp_path, {"asker": {**entry("handshake"), "timeout": 3}},
                           replies) as (forged, _):
        await forged.logged("MCP server asker connected")
        await forged.send({"type": "prompt", "message": "go"})
        results: list[str] = []
        with trio.fail_after(60):  # a hang guard, not a timing
            while (event := await next_event(forged))["type"] != "agent_settled":
                if event["type"] == "extension_ui_request" and event["method"] == "confirm":
                    await trio.sleep(3.5)  # the user, slower than the server's timeout
                    await forged.send({"type": "extension_ui_response", "id": event["id"],
                                       "confirmed": True})
                elif event["type"] == "tool_execution_end":
                    results.append(text(event))
    assert results == ["2025-11-25: page accept"]
