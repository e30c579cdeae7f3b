"""The ancestor's folders and environment: a launcher that points pi at its files, or a
command that asks which agent and session runs it, finds forged's answers where pi's are."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from forged._cli import options_from, parse_command_line
from forged._config import Models, list_stored, session_config
from forged._models import ModelRegistry, register_scripted
from forged._paths import agent_dir, session_dir_for
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall
from forged._queues import user_message
from forged._session import open_session

from .harness import open_client

DONE = Reply(content=[ScriptText(text="done")])
SHOW = ("echo id=${PI_SESSION_ID:-unset} file=${PI_SESSION_FILE:-unset} "
        "model=${PI_PROVIDER:-unset}/${PI_MODEL:-unset} level=${PI_REASONING_LEVEL:-unset}")


def test_pi_coding_agent_dir_is_the_agent_folder_after_agent_forge_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_FORGE_DIR", raising=False)
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "pi-agent"))
    assert agent_dir() == tmp_path / "pi-agent"
    monkeypatch.setenv("AGENT_FORGE_DIR", str(tmp_path / "forged-agent"))
    assert agent_dir() == tmp_path / "forged-agent"


async def test_sessions_go_where_the_ancestor_is_told_to_keep_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    monkeypatch.delenv("AGENT_FORGE_DIR", raising=False)
    monkeypatch.delenv("PI_CODING_AGENT_SESSION_DIR", raising=False)
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "pi-agent"))
    registry = ModelRegistry()
    register_scripted(registry, "http://127.0.0.1:9")
    models = Models(registry=registry, provider="scripted",
                    pattern="scripted/anthropic-messages")

    async def written(*argv: str) -> Path:
        options = options_from(parse_command_line(["--cwd", str(project), *argv]))
        async with open_session(session_config(options, models), lambda _: None) as session:
            session.context.append(user_message("hi", None))
            assert session.store.path is not None
            return session.store.path

    default = await written()
    assert default.parent == session_dir_for(tmp_path / "pi-agent", project)
    assert [item.path for item in list_stored(project)] == [str(default)]
    (tmp_path / "pi-agent" / "settings.json").write_text(json.dumps({"sessionDir": "sub"}))
    assert (await written()).parent == project / "sub"
    monkeypatch.setenv("PI_CODING_AGENT_SESSION_DIR", str(tmp_path / "env-sessions"))
    from_env = await written()
    assert from_env.parent == tmp_path / "env-sessions"
    assert [item.path for item in list_stored(project)] == [str(from_env)]
    assert (await written("--session-dir", str(tmp_path / "flag"))).parent == tmp_path / "flag"


async def test_the_bash_tool_is_told_the_session_and_direct_bash_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PI_SESSION_ID", "PI_SESSION_FILE", "PI_PROVIDER", "PI_MODEL"):
        monkeypatch.setenv(name, "stale-from-a-parent")
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={"command": SHOW})]), DONE]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("show me")
        direct = await client.request({"type": "bash", "command": "echo ${PI_MODEL}"})
        state = (await client.request({"type": "get_state"}))["data"]
    result = client.events("tool_execution_end")[0]["result"]["content"][0]["text"]
    assert result.strip() == (f"id={state['sessionId']} file={state['sessionFile']} "
                              "model=scripted/anthropic-messages level=medium")
    assert direct["data"]["output"].strip() == "stale-from-a-parent"  # not the tool's


async def test_an_in_memory_session_has_no_session_file_variable(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={"command": SHOW})]), DONE]
    async with open_client(tmp_path, replies, persist=False) as client:
        await client.prompt_and_settle("show me")
    result = client.events("tool_execution_end")[0]["result"]["content"][0]["text"]
    assert "file=unset" in result


async def test_every_process_forged_starts_knows_its_agent(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"api": "anthropic-messages", "replies": [
        {"content": [{"type": "toolCall", "name": "bash",
                      "arguments": {"command": "echo $AI_AGENT $PI_CODING_AGENT"}}]},
        {"content": [{"type": "text", "text": "done"}]}]}))
    commands = b'{"type":"prompt","message":"who"}\n'
    result = await trio.run_process(
        [sys.executable, "-m", "forged", "--mode", "rpc", "--provider", "scripted",
         "--script", str(script), "--no-session", "--cwd", str(tmp_path)],
        stdin=commands, capture_stdout=True, capture_stderr=True,
        env={"PATH": "/usr/bin:/bin", "AGENT_FORGE_DIR": str(tmp_path / "agent")},
        check=False)
    ends = [json.loads(line) for line in result.stdout.splitlines()
            if b'"tool_execution_end"' in line]
    assert ends and ends[0]["result"]["content"][0]["text"].strip() == "forged true", (
        result.stderr.decode())
