"""The model catalogue: built-in Anthropic and OpenAI models, custom providers from
``<agentDir>/models.json``, API keys, ``--model`` patterns and thinking levels.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import orjson

from . import _codec, _wire as w
from ._auth import AuthFile, expired
from ._catalogue import (
    BASIC_LEVELS,
    BUILTIN_PROVIDERS,
    DEFAULT_MODELS,
    MODELS_JSON_KEYS,
    ProviderConfig,
    ProviderDefinition,
    builtin_models,
    catalogue_models,
    catalogue_providers,
    make_model,
    overridden,
)
from ._errors import ConfigError, WireError
from ._log import log
from ._paths import agent_dir
from ._providers import APIS
from ._values import not_run_yet, resolve_commands, value_now

AUTHENTICATED = "<authenticated>"
"""The key of a provider signed in by the machine's credentials (`ModelRegistry.ambient`)."""
BEARER_SIGN_INS = frozenset({"github-copilot"})
"""Providers whose sign-in token goes as ``Authorization: Bearer`` whatever the API."""
AMBIENT_HINTS = {"google-vertex": (
    ", or use application default credentials (GOOGLE_APPLICATION_CREDENTIALS or gcloud's) "
    "with GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION")}
"""What a provider without its key variable could sign in with instead."""
NO_KEY = {"amazon-bedrock": (
    "No AWS credentials for amazon-bedrock: set AWS_PROFILE, AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, or AWS_BEARER_TOKEN_BEDROCK")}
"""Why a provider that has no key variable cannot be reached, when not for want of a
sign-in."""


class ModelRegistry:
    """Every known model and how to reach its provider."""

    def __init__(self, auth: AuthFile | None = None) -> None:
        self.auth = auth or AuthFile(agent_dir() / "auth.json")
        """The credentials a user saved (pi's ``/login``, ``forged login``)."""
        self.providers: dict[str, ProviderConfig] = {
            name: attrs.evolve(config) for name, config in BUILTIN_PROVIDERS.items()}
        self.models: list[w.Model] = builtin_models()
        self._headers: dict[tuple[str, str], dict[str, str]] = {}
        self.error: str | None = None
        self._unread: set[str] = set()
        """Catalogue providers whose models are not read yet."""
        for name, key in catalogue_providers().items():
            self.providers[name] = ProviderConfig(name=name, base_url="", api_key=key,
                                                  key_from_env=True,
                                                  auth_header=name in BEARER_SIGN_INS)
            self._unread.add(name)

    def _read(self, provider: str | None = None) -> None:
        """Read `provider`'s catalogue models (every provider's, when None), if not yet."""
        for name in [provider] if provider is not None else sorted(self._unread):
            if name in self._unread:
                self._unread.discard(name)
                for model, headers in catalogue_models(name):
                    self.models.append(model)
                    if headers:
                        self._headers[(name, model.id)] = headers

    def add_provider(self, config: ProviderConfig, models: list[w.Model]) -> None:
        self.providers[config.name] = config
        for model in models:
            self._upsert(model)

    def _upsert(self, model: w.Model) -> None:
        for index, known in enumerate(self.models):
            if known.provider == model.provider and known.id == model.id:
                self.models[index] = model
                return
        self.models.append(model)

    def load_models_json(self, path: Path) -> None:
        """Merge the custom providers of `path`, as the ancestor reads it. A provider that
        cannot be used (an unknown api, models without a key, a malformed field) is skipped
        with a line on stderr, and the reasons are kept; a file that is not JSON is ignored
        whole."""
        if not path.exists():
            return
        try:
            data = orjson.loads(path.read_bytes())
            providers = data.get("providers", {}) if isinstance(data, dict) else None
            if not isinstance(providers, dict):
                raise ConfigError("expected {\"providers\": {...}}")
        except (OSError, orjson.JSONDecodeError, ConfigError) as exc:
            self.error = f"{path}: {exc}"
            log(f"ignoring custom models: {self.error}")
            return
        problems: list[str] = []
        for key in data:
            if key not in MODELS_JSON_KEYS:
                hint = " (did you mean \"providers\"?)" if key.startswith("provider") else ""
                problems.append(f"unknown key {key!r}{hint}")
                log(f"{path}: unknown key {key!r} is ignored{hint}")
        for name, raw in providers.items():
            try:
                self._merge(name, _codec.structure(raw, ProviderDefinition))
            except (ConfigError, WireError) as exc:
                problems.append(f"provider {name!r}: {exc}")
                log(f"{path}: skipping provider {name!r}: {exc}")
        self.error = f"{path}: {'; '.join(problems)}" if problems else None

    def _merge(self, name: str, definition: ProviderDefinition) -> None:
        """Add or change provider `name`; nothing changes when it raises `ConfigError`."""
        self._read(name)
        builtin = self.providers.get(name)
        if definition.models and builtin is None and not definition.api_key:
            raise ConfigError("its models need an apiKey")
        base_url = definition.base_url or (builtin.base_url if builtin else None)
        if base_url is None:
            raise ConfigError("it needs a baseUrl")
        config = ProviderConfig(
            name=name, base_url=base_url,
            api_key=definition.api_key or (builtin.api_key if builtin else None),
            headers={**(builtin.headers if builtin else {}), **(definition.headers or {})},
            auth_header=(definition.auth_header if definition.auth_header is not None
                         else builtin is not None and builtin.auth_header))
        config.key_from_env = (builtin is not None and builtin.key_from_env
                               and config.api_key == builtin.api_key)
        models: list[w.Model] = []
        headers: dict[tuple[str, str], dict[str, str]] = {}
        overrides = definition.model_overrides or {}
        for model in self.models:
            if model.provider != name:
                continue
            changed = overridden(model, overrides.get(model.id), definition.compat)
            if definition.base_url or changed is not model:
                models.append(attrs.evolve(changed, base_url=base_url))
            override = overrides.get(model.id)
            if override is not None and override.headers:
                headers[(name, model.id)] = {**self._headers.get((name, model.id), {}),
                                             **override.headers}
        for model_def in definition.models or []:
            api = model_def.api or definition.api
            if api not in APIS:
                raise ConfigError(f"model {model_def.id}: unknown api {api!r} (forged speaks "
                                  f"{', '.join(APIS)})")
            if model_def.context_window <= 0 or (model_def.max_tokens is not None
                                                 and model_def.max_tokens <= 0):
                raise ConfigError(f"model {model_def.id}: limits must be positive")
            models.append(model_def.model(name, api, base_url, definition.compat))
            if model_def.headers:
                headers[(name, model_def.id)] = model_def.headers
        self.providers[name] = config
        for model in models:
            self._upsert(model)
        self._headers.update(headers)

    # keys and availability
    def use_key(self, provider: str, key: str) -> None:
        """`key` for `provider` in this process (``--api-key``), whatever its configuration
        names."""
        self.providers[provider] = attrs.evolve(self.providers[provider], api_key=key,
                                                literal_key=True)

    def ambient(self, provider: str) -> bool:
        """Whether `provider` signs in without a key, by credentials of the machine, as the
        ancestor sees them: AWS's (a profile, keys, a Bedrock key, a container or web identity
        role) for Bedrock, application default credentials with a project and a location for
        Vertex AI."""
        if provider == "amazon-bedrock":
            return any(os.environ.get(name) for name in (
                "AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE")) or bool(
                os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"))
        if provider == "google-vertex":
            adc = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or os.path.expanduser(
                "~/.config/gcloud/application_default_credentials.json")
            return (os.path.exists(adc) and bool(os.environ.get("GOOGLE_CLOUD_LOCATION"))
                    and bool(os.environ.get("GOOGLE_CLOUD_PROJECT")
                             or os.environ.get("GCLOUD_PROJECT")))
        return False

    def api_key(self, provider: str) -> str | None:
        """`provider`'s key, as the ancestor looks for it: ``--api-key``, then auth.json (a
        saved key, or a subscription's access token), then the provider's variable or
        models.json's ``apiKey``. None when it has none (a variable unset, a ``!command``
        that failed or has not run yet: see `resolve`)."""
        config = self.providers.get(provider)
        if config is not None and config.literal_key:
            return config.api_key
        saved = self.auth.get(provider)
        if saved is not None:
            if saved["type"] == "oauth":
                return str(saved["access"])
            return value_now(saved.get("key"), saved.get("env"))
        if config is None:
            return None
        if config.key_from_env:
            key = os.environ.get(config.api_key or "") or None
        else:
            key = value_now(config.api_key)
        return key if key is not None or not self.ambient(provider) else AUTHENTICATED

    def key_problem(self, provider: str) -> str | None:
        """Why `provider` has no key, and how to give it one; None when it has one, or may
        have (a ``!command`` not run yet). Never runs a command."""
        config = self.providers.get(provider)
        if config is None:
            return f"No API key for {provider}: it is not a known provider"
        saved = self.auth.get(provider)
        if saved is not None and saved["type"] == "api_key":
            if self.api_key(provider) is not None or not_run_yet(saved.get("key")):
                return None
            return f"No API key for {provider}: its key in {self.auth.path} resolves to nothing"
        value = config.api_key
        if config.literal_key or self.api_key(provider) is not None or not_run_yet(value):
            return None
        if value and value.startswith("!"):
            return f"No API key for {provider}: the command in its apiKey gave no value"
        if config.key_from_env and not value:
            return NO_KEY.get(provider) or (
                f"No sign-in for {provider}: sign in with `forged login {provider}` (or "
                "pi's /login)")
        if config.key_from_env:
            return (f"No API key for {provider}: set {value}, or apiKey in models.json"
                    + AMBIENT_HINTS.get(provider, ""))
        return f"No API key for {provider}: its apiKey in models.json resolves to nothing"

    def _values(self, model: w.Model) -> list[str | None]:
        config = self.providers.get(model.provider)
        saved = self.auth.get(model.provider) or {}
        return [config.api_key if config and not config.literal_key else None,
                saved.get("key") if saved.get("type") == "api_key" else None,
                *(config.headers.values() if config else ()),
                *self._headers.get((model.provider, model.id), {}).values()]

    async def resolve(self, model: w.Model) -> None:
        """Run the ``!command`` values `model`'s key and headers use, if not run yet, off the
        loop (`resolve_commands`); refresh the provider's subscription token in auth.json if
        it expired (`refresh_oauth`)."""
        await resolve_commands(self._values(model))
        saved = self.auth.get(model.provider)
        config = self.providers.get(model.provider)
        if (saved is not None and saved["type"] == "oauth" and expired(saved)
                and not (config is not None and config.literal_key)):
            from ._providers.oauth import refresh_oauth

            await refresh_oauth(self.auth, model.provider)

    def request_headers(self, model: w.Model) -> dict[str, str]:
        """The provider's and the model's configured headers, values resolved (a
        ``!command`` as `resolve` left it), and the key as ``Authorization: Bearer`` when the
        provider asks for it (``authHeader``)."""
        config = self.providers.get(model.provider)
        headers = dict(config.headers) if config else {}
        headers.update(self._headers.get((model.provider, model.id), {}))
        resolved = {key: value_now(value) or "" for key, value in headers.items()}
        key = self.api_key(model.provider)
        if config is not None and config.auth_header and key:
            resolved["Authorization"] = f"Bearer {key}"
        return resolved

    def has_auth(self, provider: str) -> bool:
        if self.auth.get(provider) is not None or self.ambient(provider):
            return True
        config = self.providers.get(provider)
        if config is None or not config.api_key:
            return False
        if config.literal_key:
            return True
        if config.key_from_env:
            return bool(os.environ.get(config.api_key))
        return True

    def available(self) -> list[w.Model]:
        for name in sorted(self._unread):
            if self.has_auth(name):
                self._read(name)
        reachable = {name: self.has_auth(name) for name in {m.provider for m in self.models}}
        return [model for model in self.models if reachable[model.provider]]

    def find(self, provider: str, model_id: str) -> w.Model | None:
        self._read(provider)
        for model in self.models:
            if model.provider == provider and model.id == model_id:
                return model
        return None

    def resolve_pattern(self, pattern: str, provider: str | None = None
                        ) -> tuple[w.Model, str | None]:
        """``provider/id``, or an id or name, with an optional ``:<thinking>`` suffix."""
        model = self._match(pattern, provider)
        if model is not None:
            return model, None
        head, sep, level = pattern.rpartition(":")
        if sep:
            model = self._match(head, provider)
            if model is not None and level in w.THINKING_LEVELS:
                return model, level
            if model is not None:
                raise ConfigError(f"Unknown thinking level {level!r} in {pattern!r} (levels: "
                                  f"{', '.join(w.THINKING_LEVELS)})")
        raise ConfigError(f"Model not found: {pattern}")

    def check_provider(self, provider: str | None) -> None:
        """`ConfigError` naming the known providers when `provider` is none of them."""
        if provider is not None and provider not in self.providers:
            raise ConfigError(f"Unknown provider {provider!r} (known: "
                              f"{', '.join(sorted(self.providers))})")

    def no_model_reason(self) -> str:
        """Why no model could be chosen, and what would give one."""
        keys = " or ".join(sorted(str(config.api_key) for config in BUILTIN_PROVIDERS.values()))
        return (f"No model selected: set {keys}, or add a provider to "
                f"{agent_dir() / 'models.json'}{first_use_hints()}")

    def no_models_available(self) -> str:
        """What ``--list-models`` says when no provider has a key, and how to add one."""
        keys = " or ".join(sorted(str(config.api_key) for config in BUILTIN_PROVIDERS.values()))
        return (f"No models available: no provider has an API key. Set {keys} (or another "
                f"provider's key variable: OPENROUTER_API_KEY, GROQ_API_KEY, ...), or add a "
                f"provider with its apiKey to {agent_dir() / 'models.json'}{first_use_hints()}")

    def _match(self, pattern: str, provider: str | None) -> w.Model | None:
        """The model `pattern` names, among `provider`'s (else every provider's: the
        catalogue is read only when the models already read have none)."""
        if provider is not None:
            self._read(provider)
        elif "/" in pattern:
            self._read(pattern.partition("/")[0])
        found = self._match_read(pattern, provider)
        if found is None and self._unread and provider is None:
            self._read()
            found = self._match_read(pattern, provider)
        return found

    def _match_read(self, pattern: str, provider: str | None) -> w.Model | None:
        candidates = [m for m in self.models if provider is None or m.provider == provider]
        if "/" in pattern:
            head, _, tail = pattern.partition("/")
            for model in candidates:
                if model.provider == head and model.id == tail:
                    return model
        for model in candidates:
            if model.id == pattern:
                return model
        lowered = pattern.lower()
        for model in candidates:
            if lowered in model.id.lower() or lowered in model.name.lower():
                return model
        return None

    def scope(self, patterns: Sequence[str]) -> list[tuple[w.Model, str | None]]:
        """The available models `patterns` name (settings ``enabledModels``, ``--models``), in
        pattern order, each with the thinking level its ``:<level>`` suffix asks for: a
        pattern is a glob over ``provider/id`` and ``id`` (``anthropic/*``, ``*sonnet*``),
        or anything `resolve_pattern` takes."""
        available = self.available()
        scoped: list[tuple[w.Model, str | None]] = []
        for pattern in patterns:
            head, sep, suffix = pattern.rpartition(":")
            level: str | None = suffix if sep and suffix in w.THINKING_LEVELS else None
            glob = head if level else pattern
            if any(ch in glob for ch in "*?["):
                matched = [m for m in available if fnmatch.fnmatchcase(m.id, glob)
                           or fnmatch.fnmatchcase(f"{m.provider}/{m.id}", glob)]
            else:
                try:
                    model, level = self.resolve_pattern(pattern)
                except ConfigError:
                    continue
                matched = [model] if model in available else []
            scoped += [(m, level) for m in matched if all(m is not s for s, _ in scoped)]
        return scoped

    def initial_model(self, provider: str | None = None) -> w.Model | None:
        """The model a session starts with when none was asked for."""
        available = [m for m in self.available() if provider is None or m.provider == provider]
        for name, model_id in DEFAULT_MODELS.items():
            for model in available:
                if model.provider == name and model.id == model_id:
                    return model
        return available[0] if available else None


PI_AGENT_DIR = Path("~/.pi/agent")
"""Where pi keeps its auth.json and models.json (forged keeps its own in `agent_dir`)."""


def first_use_hints() -> str:
    """The rest of a no-model message: pi's keys where pi has some that forged does not read,
    ``forged login``, and the scripted provider for trying forged without a key."""
    pi = PI_AGENT_DIR.expanduser()
    hints = []
    if pi.resolve() != agent_dir().resolve() and any(
            (pi / name).is_file() for name in ("auth.json", "models.json")):
        hints.append(f"pi's keys and models are in {pi}, which forged reads only with "
                     f"PI_CODING_AGENT_DIR={pi} set")
    hints.append("`forged login PROVIDER` signs in or saves a key")
    hints.append("to try forged without a key: --provider scripted --script FILE "
                 "(docs/keys.md, The scripted provider)")
    return "; " + "; ".join(hints)


# --- thinking levels ---------------------------------------------------------------------------

def supported_levels(model: w.Model | None) -> list[str]:
    if model is None or not model.reasoning:
        return ["off"]
    return [level for level in w.THINKING_LEVELS if level in model.thinking_levels]


def clamp_level(model: w.Model | None, level: str) -> str:
    """The highest level the model supports that is not above `level`."""
    supported = supported_levels(model)
    wanted = w.THINKING_LEVELS.index(level)
    best = supported[0]
    for candidate in supported:
        if w.THINKING_LEVELS.index(candidate) <= wanted:
            best = candidate
    return best


SCRIPTED_PROVIDER = "scripted"
SCRIPTED_KEY = "scripted-key"


def register_scripted(registry: ModelRegistry, base_url: str) -> None:
    """The scripted provider: one model per wire format, all served by one local server."""
    def scripted(api: str, url: str) -> w.Model:
        return make_model(SCRIPTED_PROVIDER, api, url, api, f"Scripted ({api})", window=200_000,
                      max_tokens=16_384, cost=(3, 15, 0.3, 3.75), levels=BASIC_LEVELS)

    registry.add_provider(
        ProviderConfig(name=SCRIPTED_PROVIDER, base_url=base_url, api_key=SCRIPTED_KEY),
        [scripted("anthropic-messages", base_url),
         scripted("openai-completions", f"{base_url}/v1"),
         scripted("openai-responses", f"{base_url}/v1"),
         scripted("google-generative-ai", f"{base_url}/v1beta"),
         scripted("azure-openai-responses", f"{base_url}/openai/v1"),
         scripted("google-vertex", base_url),
         scripted("mistral-conversations", f"{base_url}/mistral"),
         scripted("bedrock-converse-stream", base_url)])
