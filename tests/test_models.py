"""The model catalogue, models.json, --model patterns, and the model and thinking commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forged import _wire as w
from forged._errors import ConfigError
from forged._models import ModelRegistry, clamp_level, supported_levels
from forged._providers import ProviderRequest
from forged._providers.anthropic import build_body, build_headers
from forged._providers.scripted import Reply, ScriptText

from .harness import open_client


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def test_builtin_models_need_their_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ModelRegistry()
    assert registry.available() == []
    assert registry.initial_model() is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    available = registry.available()
    assert available and {m.provider for m in available} == {"anthropic"}
    assert registry.initial_model() == registry.find("anthropic", "claude-opus-4-6")
    for model in registry.models:
        assert model.context_window > 0 and model.max_tokens > 0
        assert model.thinking_levels[0] == "off"
        assert model.reasoning == (model.thinking_levels != ["off"])


def test_models_json_adds_a_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"providers": {"local": {
        "baseUrl": "http://127.0.0.1:8080", "api": "anthropic-messages", "apiKey": "LOCAL_KEY",
        "headers": {"x-team": "TEAM_HEADER"},
        "models": [{"id": "m1", "name": "M1", "reasoning": True, "input": ["text", "image"],
                    "contextWindow": 200000, "maxTokens": 8192,
                    "cost": {"input": 3, "output": 15, "cacheRead": 0.3, "cacheWrite": 3.75}},
                   {"id": "m2"}]}}}))
    monkeypatch.setenv("LOCAL_KEY", "from-env")
    monkeypatch.setenv("TEAM_HEADER", "blue")
    registry = ModelRegistry()
    registry.load_models_json(path)
    assert registry.error is None
    m1 = registry.find("local", "m1")
    assert m1 is not None and m1.cost.cache_write == 3.75 and m1.max_tokens == 8192
    assert m1.thinking_levels == ["off", "minimal", "low", "medium", "high"]
    m2 = registry.find("local", "m2")
    assert m2 is not None and m2.name == "m2" and m2.context_window == 128000
    assert m2.input == ["text"] and not m2.reasoning
    assert registry.api_key("local") == "from-env"
    assert registry.request_headers(m1) == {"x-team": "blue"}
    monkeypatch.delenv("LOCAL_KEY")
    assert registry.api_key("local") == "LOCAL_KEY"  # not a variable: the literal key


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"providers": {"x": {"models": [{"id": "a"}]}}}),
    json.dumps({"providers": {"x": {"baseUrl": "u", "apiKey": "k", "api": "carrier-pigeon",
                                    "models": [{"id": "a"}]}}}),
    json.dumps({"providers": {"x": {"baseUrl": "u", "apiKey": "k", "api": "openai-completions",
                                    "models": [{"id": "a", "maxTokens": 0}]}}}),
])
def test_a_bad_models_json_is_reported_and_ignored(tmp_path: Path, content: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "models.json"
    path.write_text(content)
    registry = ModelRegistry()
    count = len(registry.models)
    registry.load_models_json(path)
    assert registry.error is not None and len(registry.models) == count
    assert "ignoring custom models" in capsys.readouterr().err


def test_model_patterns() -> None:
    registry = ModelRegistry()
    opus = registry.find("anthropic", "claude-opus-4-6")
    assert registry.resolve_pattern("anthropic/claude-opus-4-6:high") == (opus, "high")
    assert registry.resolve_pattern("claude-opus-4-6") == (opus, None)
    assert registry.resolve_pattern("Opus 4.6") == (opus, None)
    assert registry.resolve_pattern("gpt-5.4", "openai")[0] == registry.find("openai", "gpt-5.4")
    with pytest.raises(ConfigError, match="Model not found: nothing-like-this"):
        registry.resolve_pattern("nothing-like-this")


def test_thinking_levels_clamp_down() -> None:
    registry = ModelRegistry()
    sonnet = registry.find("anthropic", "claude-sonnet-4-6")
    gpt4 = registry.find("openai", "gpt-4.1")
    o3 = registry.find("openai", "o3")
    assert supported_levels(gpt4) == ["off"]
    assert clamp_level(gpt4, "high") == "off"
    assert clamp_level(sonnet, "max") == "high"
    assert clamp_level(o3, "minimal") == "off"
    assert supported_levels(registry.find("openai", "gpt-5.6"))[-2:] == ["xhigh", "max"]


def _request(model: w.Model, level: str) -> ProviderRequest:
    return ProviderRequest(model=model, system_prompt="s", messages=[], tools=[],
                           thinking_level=level, api_key="k", headers={}, session_id="x")


def test_anthropic_thinking_parameters() -> None:
    registry = ModelRegistry()
    sonnet45 = registry.find("anthropic", "claude-sonnet-4-5")
    opus46 = registry.find("anthropic", "claude-opus-4-6")
    assert sonnet45 is not None and opus46 is not None
    budget = build_body(_request(sonnet45, "low"))
    assert budget["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert budget["max_tokens"] == 32000 + 2048
    assert "interleaved-thinking-2025-05-14" in build_headers(
        _request(sonnet45, "low"))["anthropic-beta"]
    adaptive = build_body(_request(opus46, "xhigh"))
    assert adaptive["thinking"] == {"type": "adaptive"}
    assert adaptive["output_config"] == {"effort": "max"}
    assert "thinking" not in build_body(_request(opus46, "off"))


async def test_model_and_thinking_commands(tmp_path: Path) -> None:
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="ok")])]) as client:
        models = await client.request({"type": "get_available_models"})
        chosen = await client.request({"type": "set_model", "provider": "scripted",
                                       "modelId": "openai-responses"})
        missing = await client.request({"type": "set_model", "provider": "scripted",
                                        "modelId": "nope"})
        cycled = await client.request({"type": "cycle_model"})
        levels = await client.request({"type": "get_available_thinking_levels"})
        high = await client.request({"type": "set_thinking_level", "level": "high"})
        state_high = await client.request({"type": "get_state"})
        clamped = await client.request({"type": "set_thinking_level", "level": "max"})
        state_clamped = await client.request({"type": "get_state"})
        bogus = await client.request({"type": "set_thinking_level", "level": "extreme"})
        cycled_level = await client.request({"type": "cycle_thinking_level"})
        state_final = await client.request({"type": "get_state"})
        await client.prompt_and_settle("hi")
    ids = [m["id"] for m in models["data"]["models"]]
    assert ids == ["anthropic-messages", "openai-completions", "openai-responses"]
    for model in models["data"]["models"]:
        assert set(model) == {"id", "name", "api", "provider", "baseUrl", "reasoning", "input",
                              "contextWindow", "maxTokens", "cost", "thinkingLevels"}
        assert set(model["cost"]) == {"input", "output", "cacheRead", "cacheWrite"}
    assert chosen["data"]["id"] == "openai-responses"
    assert missing["success"] is False
    assert missing["error"] == "Model not found: scripted/nope"
    assert cycled["data"]["model"]["id"] == "anthropic-messages"
    assert cycled["data"]["isScoped"] is False
    assert levels["data"] == {"levels": ["off", "minimal", "low", "medium", "high"]}
    assert high == {"id": high["id"], "type": "response", "command": "set_thinking_level",
                    "success": True}
    assert state_high["data"]["thinkingLevel"] == "high"
    assert clamped["success"] is True and state_clamped["data"]["thinkingLevel"] == "high"
    assert bogus["success"] is False and "extreme" in bogus["error"]
    assert cycled_level["data"] == {"level": "off"}
    assert state_final["data"]["thinkingLevel"] == "off"
    assert "thinking" not in client.server.requests[0].body


async def test_cycles_with_nothing_to_cycle_are_null(tmp_path: Path) -> None:
    async with open_client(tmp_path, model=False) as client:
        levels = await client.request({"type": "cycle_thinking_level"})
        registry = client.config.registry
        registry.models = registry.models[-1:]
        response = await client.request({"type": "cycle_model"})
    assert levels["data"] is None  # no model: no thinking levels to cycle
    assert response["data"] is None  # only one model


def test_errors_say_what_is_unknown() -> None:
    registry = ModelRegistry()
    with pytest.raises(ConfigError, match=r"^Unknown thinking level 'ultra' in "
                       r"'claude-opus-4-6:ultra' \(levels: off, minimal, low, medium, high, "
                       r"xhigh, max\)$"):
        registry.resolve_pattern("claude-opus-4-6:ultra")
    with pytest.raises(ConfigError, match=r"^Model not found: nosuch:high$"):
        registry.resolve_pattern("nosuch:high")
    with pytest.raises(ConfigError, match=r"^Unknown provider 'nosuch' \(known: anthropic, "
                       r"openai\)$"):
        registry.check_provider("nosuch")
