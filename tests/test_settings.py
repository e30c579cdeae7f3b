"""settings.json: the defaults forged starts with, and the choices it remembers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from forged._daemon import Options, open_session_config
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
    settings = Settings(tmp_path / "agent", tmp_path / "project")
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
