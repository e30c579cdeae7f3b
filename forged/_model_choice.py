"""A session's model and thinking level: choosing, cycling, restoring and remembering them.

The level asked for is kept as asked (``preferred``) and clamped to what the current model
supports when read, so switching to a model with more levels gives the asked level back. Every
change is recorded in the session file (``model_change``, ``thinking_level_change``) and
remembered in the settings as the default for the next session.
"""

from __future__ import annotations

from collections.abc import Callable

from . import _wire as w
from ._context import recorded_model_of
from ._errors import CommandError
from ._models import ModelRegistry, clamp_level, supported_levels
from ._settings import Settings
from ._store import SessionFile


class ModelChoice:
    """The model and level of one session, which `store` (the current file) records."""

    def __init__(self, registry: ModelRegistry, settings: Settings, model: w.Model | None,
                 level: str, scope: list[str] | None, store: Callable[[], SessionFile],
                 emit: Callable[[w.Event], None]) -> None:
        self.registry = registry
        self.model = model
        self.preferred = level
        self._settings = settings
        self._scope = scope
        """``--models``: the patterns `cycle_model` cycles through (else ``enabledModels``)."""
        self._store = store
        self._emit = emit
        self.announce_changes = False
        """Emit ``model_changed`` (the daemon: its clients follow a shared session's model;
        not on stdio, where pi writes no such event)."""

    @property
    def thinking_level(self) -> str:
        return clamp_level(self.model, self.preferred)

    def available_levels(self) -> list[str]:
        return supported_levels(self.model)

    def restore(self, store: SessionFile, *, restore: bool) -> None:
        """Take the model and level `store`'s branch last used (when `restore`, and its model
        can be used); then record in it whatever it does not say."""
        path = store.path_to_leaf()
        recorded_model = recorded_model_of(store, path)
        change = store.latest("thinking_level_change", path)
        recorded_level = change.get("thinkingLevel") if change is not None else None
        if restore and recorded_model is not None:
            model = self.registry.find(*recorded_model)
            if model is not None and self.registry.has_auth(model.provider):
                self.model = model
        if restore and recorded_level in w.THINKING_LEVELS:
            self.preferred = str(recorded_level)
        if self.model is not None and recorded_model != (self.model.provider, self.model.id):
            store.append("model_change", provider=self.model.provider, modelId=self.model.id)
        if recorded_level != self.thinking_level:
            store.append("thinking_level_change", thinkingLevel=self.thinking_level)

    def set_model(self, provider: str, model_id: str) -> w.Model:
        for model in self.registry.available():
            if model.provider == provider and model.id == model_id:
                self._switch(model)
                return model
        if self.registry.find(provider, model_id) is not None:
            raise CommandError(self.registry.key_problem(provider)
                               or f"No API key for {provider}")
        raise CommandError(f"Model not found: {provider}/{model_id}")

    def cycle_model(self) -> w.CycledModel | None:
        """The next model of the scope (``--models``, else settings ``enabledModels``), else
        of every available model; a scoped model's ``:<level>`` is switched to with it."""
        patterns = self._scope
        if patterns is None:
            enabled = self._settings.get("enabledModels")
            patterns = [p for p in enabled if isinstance(p, str)] if isinstance(
                enabled, list) else []
        candidates = self.registry.scope(patterns) if patterns else []
        scoped = bool(candidates)
        if not scoped:
            candidates = [(model, None) for model in self.registry.available()]
        if len(candidates) <= 1:
            return None
        index = next((i for i, (m, _) in enumerate(candidates) if m == self.model), -1)
        model, level = candidates[(index + 1) % len(candidates)]
        self._switch(model, level)
        return w.CycledModel(model=model, thinking_level=self.thinking_level,
                             is_scoped=scoped)

    def set_thinking_level(self, level: str) -> None:
        if level not in w.THINKING_LEVELS:
            raise CommandError(
                f"Unknown thinking level: {level}. Expected one of: "
                + ", ".join(w.THINKING_LEVELS))
        previous = self.thinking_level
        self.preferred = level
        self._record_level(previous)

    def cycle_thinking_level(self) -> str | None:
        if self.model is None or not self.model.reasoning:
            return None
        levels = supported_levels(self.model)
        current = self.thinking_level
        self.preferred = levels[(levels.index(current) + 1) % len(levels)]
        self._record_level(current)
        return self.preferred

    def _switch(self, model: w.Model, level_asked: str | None = None) -> None:
        level = self.thinking_level
        if level_asked is not None:
            self.preferred = level_asked
        self.model = model
        self._store().append("model_change", provider=model.provider, modelId=model.id)
        self._settings.remember(defaultProvider=model.provider, defaultModel=model.id)
        if self.announce_changes:
            self._emit(w.ModelChanged(provider=model.provider, model_id=model.id))
        self._record_level(level)

    def _record_level(self, previous: str) -> None:
        if self.thinking_level != previous:
            self._store().append("thinking_level_change", thinkingLevel=self.thinking_level)
            self._settings.remember(defaultThinkingLevel=self.thinking_level)
            self._emit(w.ThinkingLevelChanged(level=self.thinking_level))
