"""An editor adapter written for the ancestor, unchanged: ``pi-acp`` (npm 0.0.34) spawns
``forged --mode rpc --no-themes`` where it would spawn ``pi``, and an ACP client (the official
Python SDK, ``agent-client-protocol``) drives it through a whole session.

pi-acp and its three dependencies are installed with npm into a cache folder; without node or
npm, or with the registry out of reach, the test skips saying which."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from forged._providers.scripted import Reply, ScriptedServer, ScriptText, ScriptToolCall

from .acp_editor import Editor, acp
from .test_pi_clients import CACHE
from .test_process import BIN

PI_ACP = "pi-acp@0.0.34"


def pi_acp() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed to run pi-acp")
    folder = CACHE / PI_ACP
    entry = folder / "node_modules" / "pi-acp" / "dist" / "index.js"
    if not entry.exists():
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund",
                               "--ignore-scripts", "--prefix", str(folder), PI_ACP],
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0 or not entry.exists():
            pytest.skip(f"npm install {PI_ACP} failed: {done.stderr.strip()[-300:]}")
    return entry


async def test_pi_acp_drives_a_whole_session(tmp_path: Path) -> None:
    entry = pi_acp()
    project, agent = tmp_path / "project", tmp_path / "agent"
    project.mkdir()
    agent.mkdir()
    (project / "notes.txt").write_text("hello\n")
    server = ScriptedServer([
        Reply(content=[ScriptToolCall(name="read", arguments={"path": "notes.txt"})]),
        Reply(content=[ScriptText(text="It says hello.")]),
        Reply(content=[ScriptText(text=" ".join(["slow"] * 200), chunks=200, delay_ms=50)]),
        Reply(content=[ScriptText(text="The summary.")]),
        Reply(content=[ScriptText(text="Welcome back.")]),
    ])

    async def drive(base_url: str) -> dict[str, Any]:
        (agent / "models.json").write_text(json.dumps({"providers": {"local": {
            "baseUrl": base_url, "api": "anthropic-messages", "apiKey": "k",
            "models": [{"id": "m1", "reasoning": True}, {"id": "m2"}]}}}))
        env = {**os.environ, "PI_ACP_PI_COMMAND": str(BIN / "forged"),
               "PI_CODING_AGENT_DIR": str(agent)}
        env.pop("AGENT_FORGE_DIR", None)
        seen: dict[str, Any] = {}
        editor = Editor()
        async with acp.spawn_agent_process(editor, "node", str(entry), env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            session = await conn.new_session(cwd=str(project))
            sid = session.session_id
            seen["models"] = [o.value for o in session.config_options[0].options]
            seen["read"] = (await conn.prompt(session_id=sid, prompt=[
                acp.text_block("What does notes.txt say?")])).stop_reason
            seen["said"] = editor.said()
            seen["tools"] = [type(u).__name__ for u in editor.updates
                             if "ToolCall" in type(u).__name__]
            slow = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[
                acp.text_block("Talk slowly")]))
            await editor.streaming.wait()
            await conn.cancel(session_id=sid)
            seen["cancelled"] = (await slow).stop_reason
            await conn.set_session_mode(session_id=sid, mode_id="low")
            await conn.set_config_option(config_id="model", session_id=sid, value="local/m2")
            editor.updates.clear()
            await conn.prompt(session_id=sid, prompt=[acp.text_block("/name Reading notes")])
            await conn.prompt(session_id=sid, prompt=[acp.text_block("/export")])
            seen["export"] = editor.said()
            editor.updates.clear()
            await conn.prompt(session_id=sid, prompt=[acp.text_block("/compact")])
            seen["compact"] = editor.said()
            listed = await conn.list_sessions(cwd=str(project))
            seen["listed"] = [(s.session_id, s.title) for s in listed.sessions]
        editor = Editor()
        async with acp.spawn_agent_process(editor, "node", str(entry), env=env,
                                           cwd=str(project)) as (conn, _):
            await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            await conn.load_session(cwd=str(project), session_id=sid)
            seen["replayed"] = editor.said()
            await conn.prompt(session_id=sid, prompt=[acp.text_block("Hello again")])
            seen["after_load"] = editor.said()
        seen["sid"] = sid
        return seen

    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        with trio.fail_after(120):  # a hang guard, not a timing
            seen = await trio.to_thread.run_sync(asyncio.run, drive(server.base_url))
        nursery.cancel_scope.cancel()
    assert seen["models"] == ["local/m1", "local/m2"]
    assert seen["read"] == "end_turn" and "It says hello." in seen["said"]
    assert "ToolCallStart" in seen["tools"]
    assert seen["cancelled"] == "cancelled"
    assert "Exported" in seen["export"] or ".html" in seen["export"], seen["export"]
    assert "Compaction completed." in seen["compact"] and "The summary." in seen["compact"]
    assert (seen["sid"], "Reading notes") in seen["listed"]
    assert "It says hello." in seen["replayed"]
    assert seen["after_load"].endswith("Welcome back.")
    last = server.requests[-1].body
    assert last["model"] == "m2"  # the model chosen in the editor, kept by the session
