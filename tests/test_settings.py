"""settings.json: the defaults forged starts with, and the choices it remembers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from forged._config import Options, open_session_config
from forged._settings import Settings

from .harness import open_client


async def test_choices_are_remembered_for_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / "settings.json").write_text(json.dumps({"theme": "dark", "retry": {"x": 1}}))
    async with open_client(tmp_path) as client:
        await client.request({"type": "set_model", "provider": "scripted",
                              "modelId": "openai-completions"})
        await client.request({"type": "set_thinking_level", "level": "high"})
        await client.request({"type": "set_follow_up_mode", "mode": "all"})
    saved = json.loads((agent_dir / "settings.json").read_text())
    assert saved == {"theme": "dark", "retry": {"x": 1}, "defaultProvider": "scripted",
                     "defaultModel": "openai-completions", "defaultThinkingLevel": "high",
                     "followUpMode": "all"}  # what forged does not know is kept
    assert not list(agent_dir.glob(".*.tmp"))

    # A built-in provider is what a fresh start can pick from settings without --model.
    saved.update(defaultProvider="openai", defaultModel="gpt-5-mini",
                 defaultThinkingLevel="low")
    (agent_dir / "settings.json").write_text(json.dumps(saved))
    monkeypatch.setenv("AGENT_FORGE_DIR", str(agent_dir))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    async with trio.open_nursery() as nursery:
        config = await open_session_config(Options(cwd=tmp_path), nursery)
    assert config.model is not None and config.model.id == "gpt-5-mini"
    assert config.thinking_level == "low"
    monkeypatch.delenv("OPENAI_API_KEY")  # without its key the saved model is passed over
    async with trio.open_nursery() as nursery:
        config = await open_session_config(Options(cwd=tmp_path), nursery)
    assert config.model is None or config.model.provider != "openai"


def test_the_project_file_wins_key_by_key(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"steeringMode": "all", "compaction": {"enabled": True, "reserveTokens": 1}}))
    project = tmp_path / "project" / ".agent-forge"
    project.mkdir(parents=True)
    (project / "settings.json").write_text(json.dumps({"compaction": {"enabled": False}}))
    settings = Settings(tmp_path / "agent", tmp_path / "project", trust_project=True)
    assert settings.get("compaction") == {"enabled": False, "reserveTokens": 1}
    assert settings.get("steeringMode") == "all"
    settings.remember(steeringMode="one-at-a-time")
    assert settings.get("steeringMode") == "one-at-a-time"
    assert json.loads((tmp_path / "agent" / "settings.json").read_text())["compaction"] == {
        "enabled": True, "reserveTokens": 1}  # the project's value is not written globally


def test_a_malformed_file_is_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "settings.json").write_text("{not json")
    settings = Settings(tmp_path)
    assert settings.get("defaultModel") is None
    assert "ignoring" in capsys.readouterr().err
    settings.remember(defaultModel="m")
    assert settings.get("defaultModel") == "m"  # for this process
    assert (tmp_path / "settings.json").read_text() == "{not json"  # left for the user


def test_config_show_names_where_each_value_came_from(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"retry": {"maxRetries": 5, "baseDelayMs": 100}, "theme": "dark",
         "trustedProjects": [str(tmp_path / "project")]}))
    project = tmp_path / "project" / ".agent-forge"
    project.mkdir(parents=True)
    (project / "settings.json").write_text(json.dumps({"retry": {"baseDelayMs": 10},
                                                       "steeringMode": "all"}))
    shown = subprocess.run(
        [sys.executable, "-m", "forged", "config", "show", "--json",
         "--cwd", str(tmp_path / "project")],
        env={**os.environ, "AGENT_FORGE_DIR": str(tmp_path / "agent")},
        capture_output=True, check=True, text=True).stdout
    rows = {row["key"]: (row["value"], row["source"])
            for row in map(json.loads, shown.splitlines())}
    global_file = str(tmp_path / "agent" / "settings.json")
    project_file = str(project / "settings.json")
    assert rows["retry.maxRetries"] == (5, global_file)
    assert rows["retry.baseDelayMs"] == (10, project_file)
    assert rows["retry.enabled"] == (True, "default")
    assert rows["steeringMode"] == ("all", project_file)
    assert rows["theme"] == ("dark", global_file)  # unknown keys are shown too
    assert rows["compaction.reserveTokens"] == (16384, "default")
    for key, value in [("daemon.maxSessions", 64), ("daemon.idleUnloadSeconds", 1800),
                       ("daemon.drainSeconds", 30), ("defaultProjectTrust", "ask"),
                       ("defaultTools", ["read", "bash", "edit", "write"]),
                       ("mcp.startupTimeout", 10), ("acpFsTimeoutSeconds", 30)]:
        assert rows[key] == (value, "default"), key  # every documented default is shown
    assert rows["shellPath"][0] in ("/bin/bash", "/bin/sh")

    text = subprocess.run(
        [sys.executable, "-m", "forged", "config", "show", "--cwd", str(tmp_path / "project")],
        env={**os.environ, "AGENT_FORGE_DIR": str(tmp_path / "agent")},
        capture_output=True, check=True, text=True).stdout
    assert any(line.split() == ["retry.baseDelayMs", "10", project_file]
               for line in text.splitlines())


def test_a_malformed_project_file_is_reported_and_the_global_one_still_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text(json.dumps({"steeringMode": "all"}))
    project = tmp_path / "project" / ".agent-forge"
    project.mkdir(parents=True)
    (project / "settings.json").write_text("[1, 2")
    settings = Settings(tmp_path / "agent", tmp_path / "project", trust_project=True)
    assert settings.get("steeringMode") == "all"
    assert str(project / "settings.json") in capsys.readouterr().err


async def test_shell_path_and_prefix_apply_to_bash(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"shellPath": "/bin/sh", "shellCommandPrefix": "GREETING=hello"}))
    async with open_client(tmp_path) as client:
        result = await client.request({"type": "bash",
                                       "command": 'echo "$GREETING from $0"'})
        assert result["data"]["output"] == "hello from /bin/sh\n"
        messages = (await client.request({"type": "get_messages"}))["data"]["messages"]
        assert messages[-1]["command"] == 'echo "$GREETING from $0"'  # stored unprefixed


async def test_cycle_model_goes_through_enabled_models_with_their_levels(
        tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"enabledModels": ["scripted/anthropic-messages", "scripted/openai-resp*:low",
                           "missing/model"]}))
    async with open_client(tmp_path) as client:
        first = (await client.request({"type": "cycle_model"}))["data"]
        assert (first["model"]["id"], first["thinkingLevel"], first["isScoped"]) == (
            "openai-responses", "low", True)
        second = (await client.request({"type": "cycle_model"}))["data"]
        assert second["model"]["id"] == "anthropic-messages"
        assert second["thinkingLevel"] == "low"  # no level asked: the current one is kept
