"""The model catalogue, models.json, --model patterns, and the model and thinking commands."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from forged import _wire as w
from forged._cli import main
from forged._errors import ConfigError, ValueCommandFailed
from forged._models import ModelRegistry, clamp_level, supported_levels
from forged._process import VALUE_TIMEOUT_S, run_value_command
from forged._providers import ProviderRequest
from forged._providers.anthropic import build_body, build_headers
from forged._providers.openai import chat_params
from forged._providers.scripted import Reply, ScriptText
from forged._values import resolve_value

from .harness import open_client
from .test_process import running


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
    err = capsys.readouterr().err
    assert ("ignoring custom models" if content.startswith("{not") else
            "skipping provider 'x'") in err and err.count("\n") == 1


def test_a_bad_provider_is_skipped_and_the_others_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"providers": {
        "pigeon": {"baseUrl": "u", "apiKey": "k", "api": "carrier-pigeon",
                   "models": [{"id": "a"}]},
        "keyless": {"baseUrl": "u", "api": "openai-completions", "models": [{"id": "b"}]},
        "good": {"baseUrl": "http://127.0.0.1:9/v1", "apiKey": "k",
                 "api": "openai-completions", "models": [{"id": "c"}]}}}))
    registry = ModelRegistry()
    registry.load_models_json(path)
    assert registry.find("good", "c") is not None
    assert registry.find("pigeon", "a") is None and registry.find("keyless", "b") is None
    err = capsys.readouterr().err
    assert "skipping provider 'pigeon': model a: unknown api 'carrier-pigeon'" in err
    assert "skipping provider 'keyless': its models need an apiKey" in err
    assert registry.error is not None and "keyless" in registry.error


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


async def test_model_and_thinking_commands(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="ok")])]) as client:
        models = await client.request({"type": "get_available_models"})
        chosen = await client.request({"type": "set_model", "provider": "scripted",
                                       "modelId": "openai-responses"})
        keyless = await client.request({"type": "set_model", "provider": "anthropic",
                                        "modelId": "claude-sonnet-4-6"})
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
    assert ids == ["anthropic-messages", "openai-completions", "openai-responses",
                   "google-generative-ai", "azure-openai-responses", "google-vertex",
                   "mistral-conversations", "bedrock-converse-stream"]
    for model in models["data"]["models"]:
        assert set(model) == {"id", "name", "api", "provider", "baseUrl", "reasoning", "input",
                              "contextWindow", "maxTokens", "cost", "thinkingLevels"}
        assert set(model["cost"]) == {"input", "output", "cacheRead", "cacheWrite"}
    assert chosen["data"]["id"] == "openai-responses"
    assert missing["success"] is False
    assert missing["error"] == "Model not found: scripted/nope"
    assert keyless["error"] == (
        "No API key for anthropic: set ANTHROPIC_API_KEY, or apiKey in models.json")
    assert cycled["data"]["model"]["id"] == "google-generative-ai"
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
    with pytest.raises(ConfigError, match=r"^Unknown provider 'nosuch' \(known: amazon-bedrock, "
                       r"ant-ling, anthropic, .*openai, .*openrouter, .*zai-coding-cn\)$"):
        registry.check_provider("nosuch")


def test_a_misspelt_key_is_said_once_and_each_problem_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models.json").write_text(json.dumps({
        "provider": {"x": {}}, "providers": {"bad": {"models": [{"id": "a"}]}}}))
    monkeypatch.setenv("AGENT_FORGE_DIR", str(tmp_path))
    assert main(["--list-models"]) == 0
    err = capsys.readouterr().err
    assert err.count("unknown key 'provider' is ignored (did you mean \"providers\"?)") == 1
    assert err.count("its models need an apiKey") == 1


def test_values_are_resolved_as_the_ancestor_resolves_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TEAM", "blue")
    monkeypatch.delenv("NOT_SET", raising=False)
    assert resolve_value("$TEAM") == "blue"
    assert resolve_value("team-${TEAM}-x") == "team-blue-x"
    assert resolve_value("$$TEAM and $!") == "$TEAM and !"
    assert resolve_value("$NOT_SET") is None  # an unset variable: no value at all
    assert resolve_value("TEAM") == "blue"  # a variable's bare name, as before
    assert resolve_value("sk-literal") == "sk-literal"
    counter = tmp_path / "count"
    command = f"!echo run >> {counter}; echo from-a-command"
    assert resolve_value(command) == "from-a-command"
    assert resolve_value(command) == "from-a-command"
    assert counter.read_text() == "run\n"  # once per process
    assert resolve_value("!exit 3") is None


def test_a_value_command_is_bounded_and_leaves_nothing_running(tmp_path: Path) -> None:
    """Its output is capped at 1 MiB, its value is taken when it exits even while a child
    it left in the background holds the pipe (which is then stopped with its group), and
    one that runs too long is stopped with everything it started."""
    with pytest.raises(ValueCommandFailed, match="output is over 1024 KiB"):
        run_value_command("yes")
    pid_file = tmp_path / "child"
    started = time.monotonic()
    assert run_value_command(f"(sleep 100 & echo $! > {pid_file}); echo k; sleep 0.2") == "k"
    assert time.monotonic() - started < VALUE_TIMEOUT_S / 2
    assert not running(int(pid_file.read_text()))
    with pytest.raises(ValueCommandFailed, match=r"did not finish within 0\.3 s"):
        run_value_command(f"sleep 100 & echo $! > {pid_file}; wait", timeout_s=0.3)
    assert not running(int(pid_file.read_text()))
    with pytest.raises(ValueCommandFailed, match="printed nothing"):
        run_value_command("true")


def test_model_overrides_and_provider_compat_change_built_in_models(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"providers": {"anthropic": {
        "compat": {"supportsTemperature": False},
        "modelOverrides": {
            "claude-sonnet-4-5": {"name": "Sonnet (team)", "contextWindow": 1_000_000,
                                  "cost": {"input": 1.5}, "headers": {"x-team": "blue"},
                                  "compat": {"forceAdaptiveThinking": True}},
            "no-such-model": {"name": "ignored"}}}}}))
    registry = ModelRegistry()
    before = registry.find("anthropic", "claude-sonnet-4-5")
    registry.load_models_json(path)
    assert registry.error is None
    sonnet = registry.find("anthropic", "claude-sonnet-4-5")
    assert sonnet is not None and before is not None
    assert (sonnet.name, sonnet.context_window, sonnet.max_tokens) == (
        "Sonnet (team)", 1_000_000, before.max_tokens)
    assert (sonnet.cost.input, sonnet.cost.output) == (1.5, before.cost.output)
    assert sonnet.compat == {"supportsTemperature": False, "forceAdaptiveThinking": True}
    assert registry.request_headers(sonnet) == {"x-team": "blue"}
    opus = registry.find("anthropic", "claude-opus-4-6")
    assert opus is not None and opus.compat == {"supportsTemperature": False}
    assert registry.resolve_pattern("Sonnet (team)")[0] is sonnet


def _chat(model: w.Model, level: str) -> dict[str, Any]:
    return dict(chat_params(ProviderRequest(
        model=model, system_prompt="be brief", messages=[], tools=[], thinking_level=level,
        api_key="k", headers={}, session_id="s")))


def test_thinking_level_map_and_compat_shape_the_request(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"providers": {"local": {
        "baseUrl": "http://127.0.0.1:9/v1", "apiKey": "k", "api": "openai-completions",
        "models": [
            {"id": "mapped", "reasoning": True,
             "thinkingLevelMap": {"minimal": None, "low": "lite", "xhigh": "deep"}},
            {"id": "quirky", "reasoning": True,
             "compat": {"supportsUsageInStreaming": False, "maxTokensField": "max_tokens",
                        "supportsReasoningEffort": False, "supportsStore": True,
                        "supportsDeveloperRole": True}}]}}}))
    registry = ModelRegistry()
    registry.load_models_json(path)
    mapped, quirky = registry.find("local", "mapped"), registry.find("local", "quirky")
    assert mapped is not None and quirky is not None
    assert mapped.thinking_levels == ["off", "low", "medium", "high", "xhigh"]
    assert supported_levels(mapped) == mapped.thinking_levels
    assert _chat(mapped, "low")["reasoning_effort"] == "lite"
    assert _chat(mapped, "medium")["reasoning_effort"] == "medium"
    assert _chat(mapped, "xhigh")["reasoning_effort"] == "deep"
    body = _chat(mapped, "off")
    assert "reasoning_effort" not in body and body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] and "store" not in body
    quirks = _chat(quirky, "high")
    assert "stream_options" not in quirks and "reasoning_effort" not in quirks
    assert quirks["max_tokens"] and "max_completion_tokens" not in quirks
    assert quirks["store"] is False
    assert quirks["messages"][0] == {"role": "developer", "content": "be brief"}
    assert body["messages"][0]["role"] == "system"  # not api.openai.com: system
