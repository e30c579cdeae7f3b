"""The models forged knows before any configuration (the built-in list and the catalogue's
files, ``forged/catalogue/``), and models.json's definitions of more models and of changes to
known ones, as read from the file. `forged._models.ModelRegistry` puts them together."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import attrs
import orjson

from . import _codec, _wire as w

BASIC_LEVELS: list[str] = list(w.THINKING_LEVELS[:w.THINKING_LEVELS.index("high") + 1])
_XHIGH: list[str] = list(w.THINKING_LEVELS[:w.THINKING_LEVELS.index("xhigh") + 1])
_MAX: list[str] = list(w.THINKING_LEVELS)


@attrs.define(kw_only=True, eq=False, repr=False)
class ProviderConfig:
    """How to reach one provider. Never written to the wire (it holds the key)."""

    name: str
    base_url: str
    api_key: str | None  # an environment variable's name, or a literal key
    headers: dict[str, str] = attrs.field(factory=dict)
    auth_header: bool = False
    """Send the key as ``Authorization: Bearer`` (models.json ``authHeader``)."""
    literal_key: bool = False
    """`api_key` is the key itself (``--api-key``), never a variable's name."""
    key_from_env: bool = False
    """`api_key` names an environment variable, which must be set (a built-in provider)."""


def make_model(provider: str, api: str, base_url: str, model_id: str, name: str, *, window: int,
           max_tokens: int, cost: tuple[float, float, float, float], levels: list[str] | None,
           images: bool = True) -> w.Model:
    return w.Model(
        id=model_id, name=name, api=api, provider=provider, base_url=base_url,
        reasoning=levels is not None, input=["text", "image"] if images else ["text"],
        context_window=window, max_tokens=max_tokens,
        cost=w.ModelCost(input=cost[0], output=cost[1], cache_read=cost[2], cache_write=cost[3]),
        thinking_levels=levels if levels is not None else ["off"],
    )


ANTHROPIC_URL = "https://api.anthropic.com"
OPENAI_URL = "https://api.openai.com/v1"


def builtin_models() -> list[w.Model]:
    def claude(model_id: str, name: str, max_tokens: int, cost: tuple[float, float, float, float],
               levels: list[str] | None = BASIC_LEVELS) -> w.Model:
        return make_model("anthropic", "anthropic-messages", ANTHROPIC_URL, model_id, name,
                      window=200_000, max_tokens=max_tokens, cost=cost, levels=levels)

    def gpt(model_id: str, name: str, window: int, max_tokens: int,
            cost: tuple[float, float, float, float], levels: list[str] | None) -> w.Model:
        return make_model("openai", "openai-responses", OPENAI_URL, model_id, name, window=window,
                      max_tokens=max_tokens, cost=cost, levels=levels)

    return [
        claude("claude-opus-4-6", "Claude Opus 4.6", 128_000, (5, 25, 0.5, 6.25), _MAX),
        claude("claude-sonnet-4-6", "Claude Sonnet 4.6", 64_000, (3, 15, 0.3, 3.75)),
        claude("claude-haiku-4-5", "Claude Haiku 4.5", 64_000, (1, 5, 0.1, 1.25)),
        claude("claude-opus-4-5", "Claude Opus 4.5", 64_000, (5, 25, 0.5, 6.25)),
        claude("claude-sonnet-4-5", "Claude Sonnet 4.5", 64_000, (3, 15, 0.3, 3.75)),
        claude("claude-opus-4-1", "Claude Opus 4.1", 32_000, (15, 75, 1.5, 18.75)),
        claude("claude-sonnet-4-20250514", "Claude Sonnet 4", 64_000, (3, 15, 0.3, 3.75)),
        gpt("gpt-5.6", "GPT-5.6", 400_000, 128_000, (1.75, 14, 0.175, 0), _MAX),
        gpt("gpt-5.4", "GPT-5.4", 400_000, 128_000, (1.25, 10, 0.125, 0), _XHIGH),
        gpt("gpt-5.2", "GPT-5.2", 400_000, 128_000, (1.25, 10, 0.125, 0), _XHIGH),
        gpt("gpt-5", "GPT-5", 400_000, 128_000, (1.25, 10, 0.125, 0), BASIC_LEVELS),
        gpt("gpt-5-mini", "GPT-5 mini", 400_000, 128_000, (0.25, 2, 0.025, 0), BASIC_LEVELS),
        gpt("gpt-5-nano", "GPT-5 nano", 400_000, 128_000, (0.05, 0.4, 0.005, 0), BASIC_LEVELS),
        gpt("o4-mini", "o4-mini", 200_000, 100_000, (1.1, 4.4, 0.275, 0),
            ["off", "low", "medium", "high"]),
        gpt("o3", "o3", 200_000, 100_000, (2, 8, 0.5, 0), ["off", "low", "medium", "high"]),
        gpt("gpt-4.1", "GPT-4.1", 1_047_576, 32_768, (2, 8, 0.5, 0), None),
        gpt("gpt-4.1-mini", "GPT-4.1 mini", 1_047_576, 32_768, (0.4, 1.6, 0.1, 0), None),
    ]


BUILTIN_PROVIDERS = {
    "anthropic": ProviderConfig(name="anthropic", base_url=ANTHROPIC_URL,
                                api_key="ANTHROPIC_API_KEY", key_from_env=True),
    "openai": ProviderConfig(name="openai", base_url=OPENAI_URL, api_key="OPENAI_API_KEY",
                             key_from_env=True),
}
CATALOGUE = Path(__file__).parent / "catalogue"
"""The other providers' models, from the ancestor's public catalogue
(``contrib/catalogue/generate.py``): ``providers.json`` names each one's key variable, and
``<provider>.json`` holds its models, read when the provider is first needed."""


@functools.cache
def catalogue_providers() -> dict[str, str]:
    try:
        index = orjson.loads((CATALOGUE / "providers.json").read_bytes())
        return {str(name): str(key) for name, key in index["providers"].items()}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return {}


DEFAULT_MODELS = {"anthropic": "claude-opus-4-6", "openai": "gpt-5.4"}


# --- models.json -------------------------------------------------------------------------------

DEFAULT_MAX_TOKENS = 16_384


def default_max_tokens(window: int) -> int:
    """A model's output cap when models.json gives none: 16,384, or a quarter of a smaller
    model's window (an 8K model would otherwise be asked for twice its window)."""
    return max(1, min(DEFAULT_MAX_TOKENS, window // 4))


@attrs.define(kw_only=True, eq=False, repr=False)
class ModelDefinition:
    id: str
    name: str | None = None
    api: str | None = None
    base_url: str | None = None
    reasoning: bool = False
    input: list[str] = attrs.field(factory=lambda: ["text"])
    context_window: int = 128_000
    max_tokens: int | None = None
    """None: `default_max_tokens` of the window."""
    cost: w.ModelCost = attrs.field(factory=w.ModelCost)
    headers: dict[str, str] | None = None
    thinking_levels: list[str] | None = None
    thinking_level_map: dict[str, str | None] | None = None
    compat: dict[str, Any] | None = None

    def model(self, provider: str, api: str, base_url: str,
              compat: dict[str, Any] | None = None) -> w.Model:
        """The model this entry defines for `provider`; its own ``api``, ``baseUrl`` and
        ``compat`` fields win over the ones given (the provider's)."""
        return w.Model(
            id=self.id, name=self.name or self.id, api=self.api or api, provider=provider,
            base_url=self.base_url or base_url, reasoning=self.reasoning, input=self.input,
            context_window=self.context_window,
            max_tokens=self.max_tokens or default_max_tokens(self.context_window),
            cost=self.cost,
            thinking_levels=levels_of(self.reasoning, self.thinking_level_map,
                                      self.thinking_levels),
            thinking_level_map=self.thinking_level_map, compat=_merged(compat, self.compat))


def catalogue_models(provider: str) -> list[tuple[w.Model, dict[str, str] | None]]:
    """`provider`'s catalogue models, each with the headers it is sent with."""
    found: list[tuple[w.Model, dict[str, str] | None]] = []
    for raw in orjson.loads((CATALOGUE / f"{provider}.json").read_bytes()):
        definition = _codec.structure(raw, ModelDefinition)
        found.append((definition.model(provider, str(definition.api),
                                       str(definition.base_url)), definition.headers))
    return found


@attrs.define(kw_only=True, eq=False, repr=False)
class ModelOverride:
    """``modelOverrides``: changes to a built-in model; objects merge field by field."""

    name: str | None = None
    reasoning: bool | None = None
    input: list[str] | None = None
    cost: dict[str, float] | None = None
    context_window: int | None = None
    max_tokens: int | None = None
    headers: dict[str, str] | None = None
    thinking_level_map: dict[str, str | None] | None = None
    compat: dict[str, Any] | None = None


@attrs.define(kw_only=True, eq=False, repr=False)
class ProviderDefinition:
    name: str | None = None
    base_url: str | None = None
    api: str | None = None
    api_key: str | None = None
    headers: dict[str, str] | None = None
    auth_header: bool | None = None
    compat: dict[str, Any] | None = None
    models: list[ModelDefinition] | None = None
    model_overrides: dict[str, ModelOverride] | None = None


MODELS_JSON_KEYS = frozenset({"providers", "$schema"})
"""The top-level keys of models.json; any other is said to be ignored."""


def levels_of(reasoning: bool, level_map: dict[str, str | None] | None,
              listed: list[str] | None = None) -> list[str]:
    """The levels a model supports: `listed`, else those its ``thinkingLevelMap`` does not
    mark null, the levels it leaves out being supported through ``high`` (``off`` too: a
    model whose map marks ``off`` null always thinks)."""
    if listed:
        return listed
    if not reasoning:
        return ["off"]
    if level_map is None:
        return list(BASIC_LEVELS)
    return [level for level in w.THINKING_LEVELS if (
        level_map[level] is not None if level in level_map else level in BASIC_LEVELS)]


def _merged(base: dict[str, Any] | None, over: dict[str, Any] | None) -> dict[str, Any] | None:
    """`over` on `base`, objects merged one level deep (``compat``, a routing object in it)."""
    if base is None or over is None:
        return over if base is None else base
    merged = dict(base)
    for key, value in over.items():
        inner = merged.get(key)
        merged[key] = ({**inner, **value} if isinstance(inner, dict) and isinstance(value, dict)
                       else value)
    return merged


_COST_FIELDS = {"input": "input", "output": "output", "cacheRead": "cache_read",
                "cacheWrite": "cache_write"}


def overridden(model: w.Model, override: ModelOverride | None,
                compat: dict[str, Any] | None) -> w.Model:
    """`model` with a provider's ``compat`` and its ``modelOverrides`` entry applied."""
    if override is None and compat is None:
        return model
    override = override or ModelOverride()
    cost = model.cost
    if override.cost:
        cost = attrs.evolve(cost, **{_COST_FIELDS[key]: float(value)
                                     for key, value in override.cost.items()
                                     if key in _COST_FIELDS})
    reasoning = model.reasoning if override.reasoning is None else override.reasoning
    level_map = override.thinking_level_map or model.thinking_level_map
    return attrs.evolve(
        model, name=override.name or model.name, reasoning=reasoning,
        input=override.input or model.input, cost=cost,
        context_window=override.context_window or model.context_window,
        max_tokens=override.max_tokens or model.max_tokens,
        thinking_levels=(levels_of(reasoning, level_map) if override.thinking_level_map
                         or override.reasoning is not None else model.thinking_levels),
        thinking_level_map=level_map,
        compat=_merged(_merged(model.compat, compat), override.compat))
