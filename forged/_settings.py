"""settings.json: the user's defaults, and the choices forged remembers for them.

The global file is ``<agentDir>/settings.json``; a trusted project's
``<cwd>/.agent-forge/settings.json`` overrides it key by key (objects merged one level deep).
forged writes only the global file, and only the keys it changed: the file is read again,
those keys replaced, and the result written to a temporary file that is renamed over the
old one, under a lock on ``settings.json.lock``, so a crash or another writer never leaves
half a file or loses a key. Keys forged does not know are kept as they are; a file that
cannot be read is never written.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import orjson

from ._log import log
from ._paths import rewrite
from ._sandbox import DEFAULT_DENY_READ

PROJECT_DIR = ".agent-forge"

UNSET: Any = None
DEFAULTS: dict[str, Any] = {
    "defaultProvider": UNSET,
    "defaultModel": UNSET,
    "defaultThinkingLevel": "medium",
    "steeringMode": "one-at-a-time",
    "followUpMode": "one-at-a-time",
    "acpPromptWhileBusy": "followUp",
    "acpFsTimeoutSeconds": 30,
    "compaction.enabled": True,
    "compaction.reserveTokens": 16_384,
    "compaction.keepRecentTokens": 20_000,
    "retry.enabled": True,
    "retry.maxRetries": 3,
    "retry.baseDelayMs": 2000,
    "retry.maxDelayMs": 60_000,
    "retry.idleTimeoutMs": 120_000,
    "shellPath": "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh",
    "shellCommandPrefix": UNSET,
    "enabledModels": UNSET,
    "defaultTools": ["read", "bash", "edit", "write"],
    "skills": [],
    "prompts": [],
    "trustedProjects": [],
    "defaultProjectTrust": "ask",
    "mcp.startupTimeout": 10,
    "daemon.idleUnloadSeconds": 1800,
    "daemon.drainSeconds": 30,
    "daemon.maxSessions": 64,
    "daemon.permissionWaitSeconds": 600,
    "checkpoints.enabled": True,
    "checkpoints.maxFileBytes": 5 * 1024 * 1024,
    "checkpoints.maxFiles": 100_000,
    "checkpoints.keepDays": 30,
    "permissionMode": "full-access",
    "sandbox.network": False,
    "sandbox.writableRoots": [],
    "sandbox.denyRead": list(DEFAULT_DENY_READ),
    "sandbox.allowUnixSockets": [],
    "shellEnvironment.inherit": UNSET,
    "shellEnvironment.exclude": [],
    "shellEnvironment.include": [],
    "shellEnvironment.set": {},
}
"""The keys forged reads, by dotted path, with the value used when no file sets one."""


def _read(path: Path) -> dict[str, Any] | None:
    """A settings file's object; {} when missing, None (with a warning) when unreadable."""
    try:
        value = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        log(f"ignoring {path}: {exc}")
        return None
    if not isinstance(value, dict):
        log(f"ignoring {path}: not a JSON object")
        return None
    return value


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def apply_section(target: object, section: object, keys: Mapping[str, str]) -> None:
    """Copy the values of the settings object `section` named in `keys` (JSON key to
    attribute) onto `target`; a value not of the attribute's kind (a bool, or a
    non-negative int) is ignored."""
    if not isinstance(section, dict):
        return
    for key, name in keys.items():
        value = section.get(key)
        if isinstance(getattr(target, name), bool):
            if isinstance(value, bool):
                setattr(target, name, value)
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            setattr(target, name, value)


PROTECTED = ("settings.json", "mcp.json", "SYSTEM.md", "APPEND_SYSTEM.md", "agent/skills",
             "agent/prompts", "agent/plugins", "agent/SYSTEM.md", "agent/APPEND_SYSTEM.md")
"""What of a project's ``.agent-forge/`` needs trust: settings, prompts, skills and plugins
(a bare folder does not)."""


def saved_trust(agent_dir: Path, cwd: Path) -> bool | None:
    """The decision ``<agentDir>/trust.json`` keeps for `cwd` or its nearest folder that has
    one (the ancestor's file: ``{"<folder>": true | false | null}``), if any."""
    try:
        data = orjson.loads((agent_dir / "trust.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    decisions = {Path(key).expanduser().resolve(): value for key, value in data.items()
                 if isinstance(value, bool)}
    for folder in (cwd, *cwd.parents):
        if folder in decisions:
            return bool(decisions[folder])
    return None


def _listed(cwd: Path, trusted: Any) -> bool:
    """`cwd` is in, or below, a folder of the ``trustedProjects`` list."""
    if not isinstance(trusted, list):
        return False
    folders = {Path(item).expanduser().resolve() for item in trusted if isinstance(item, str)}
    return any(folder in folders for folder in (cwd, *cwd.parents))


class Settings:
    """The global settings and, for a trusted project, the project's over them.

    A project's ``.agent-forge/`` is code and instructions from whoever wrote the repository:
    its settings (a ``shellPath`` runs), skills, templates, system prompts and plugins count
    only when the project is trusted: listed in the global ``trustedProjects`` (a project
    cannot trust itself), or the session was started with ``--approve``."""

    def __init__(self, agent_dir: Path, cwd: Path | None = None, *,
                 trust_project: bool = False, distrust_project: bool = False) -> None:
        """`trust_project` (``--approve``) or `distrust_project` (``--no-approve``) decides
        for this process instead of ``trustedProjects``."""
        self.path = agent_dir / "settings.json"
        self.project_path = cwd / PROJECT_DIR / "settings.json" if cwd is not None else None
        self._global = _read(self.path) or {}
        decided: bool | None = None
        if cwd is not None:
            decided = saved_trust(agent_dir, cwd)
            if decided is None and _listed(cwd, self._global.get("trustedProjects")):
                decided = True
        self.project_trusted = cwd is not None and not distrust_project and (
            trust_project or bool(decided) or (
                decided is None and self._global.get("defaultProjectTrust") == "always"))
        self.project_untrusted_note: str | None = None
        """Why the project's own files were skipped, when they were."""
        if cwd is not None and not self.project_trusted and any(
                (cwd / PROJECT_DIR / name).exists() for name in PROTECTED):
            self.project_untrusted_note = (
                f"{cwd / PROJECT_DIR} skipped: --no-approve" if distrust_project else
                f"{cwd / PROJECT_DIR} skipped: trust.json does not trust the project"
                if decided is False else
                f"{cwd / PROJECT_DIR} skipped: the project is not trusted (add it to "
                "trustedProjects in the global settings.json, or pass --approve)")
        self._project = ((_read(self.project_path) or {})
                         if self.project_path and self.project_trusted else {})
        self.merged = merge(self._global, self._project)

    def get(self, key: str, default: Any = None) -> Any:
        return self.merged.get(key, default)

    def global_value(self, key: str, default: Any = None) -> Any:
        """A key of the global file only (``trustedProjects``: a project cannot trust
        itself)."""
        return self._global.get(key, default)

    def project_value(self, key: str, default: Any = None) -> Any:
        return self._project.get(key, default)

    def default_tools(self) -> list[str] | None:
        """``defaultTools`` of both files: a project list of plain names replaces the global
        one, a list of only ``+name``/``-name`` entries goes after it (it changes it)."""
        found: list[str] | None = None
        for layer in (self._global, self._project):
            value = layer.get("defaultTools")
            if not isinstance(value, list):
                continue
            names = [item for item in value if isinstance(item, str) and item]
            modifiers_only = bool(names) and all(name[0] in "+-" for name in names)
            found = [*(found or []), *names] if modifiers_only and found else names
        return found

    def explain(self) -> list[tuple[str, Any, str]]:
        """Every key in effect by dotted path, its value, and where it came from: the
        project file, the global file or ``default`` (a key forged reads that no file sets)."""
        rows: dict[str, tuple[Any, str]] = {
            key: (value, "default") for key, value in DEFAULTS.items() if value is not UNSET}
        for origin, values in ((str(self.path), self._global),
                               (str(self.project_path), self._project)):
            for key, value in values.items():
                if isinstance(value, dict) and value:
                    rows.pop(key, None)
                    rows.update({f"{key}.{inner}": (item, origin)
                                 for inner, item in value.items()})
                else:
                    for nested in [k for k in rows if k.startswith(key + ".")]:
                        del rows[nested]
                    rows[key] = (value, origin)
        return [(key, value, origin) for key, (value, origin) in sorted(rows.items())]

    def remember_in(self, section: str, **values: Any) -> None:
        """Set keys of one object of the global file (``retry``, ``compaction``)."""
        current = self._global.get(section)
        self.remember(**{section: {**(current if isinstance(current, dict) else {}),
                                   **values}})

    def remember(self, **values: Any) -> None:
        """Set top-level keys in the global file (atomically); a project value still wins."""
        self._global.update(values)
        self.merged = merge(self._global, self._project)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name("settings.json.lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one read-modify-write at a time
                current = _read(self.path)
                if current is None:
                    return  # never overwrite a file the user must mend by hand
                current.update(values)
                rewrite(self.path, orjson.dumps(current, option=orjson.OPT_INDENT_2) + b"\n")
        except OSError as exc:
            log(f"could not save {self.path}: {exc}")


@attrs.define(kw_only=True, eq=False, repr=False)
class CompactionSettings:
    enabled: bool = True
    reserve_tokens: int = 16_384
    """Room left for the reply: compaction starts when the context grows past the window
    minus this."""
    keep_recent_tokens: int = 20_000

    @classmethod
    def from_settings(cls, section: object) -> CompactionSettings:
        found = cls()
        apply_section(found, section, {"enabled": "enabled", "reserveTokens": "reserve_tokens",
                                       "keepRecentTokens": "keep_recent_tokens"})
        return found

    def reserve_for(self, window: int) -> int:
        """The room left for the reply in a `window`: ``reserveTokens``, never more than a
        quarter of the window (else a small model compacts after every reply)."""
        return min(self.reserve_tokens, window // 4)

    def keep_for(self, window: int) -> int:
        """The recent conversation kept whole, never more than a quarter of the window
        (else a small model's compaction finds nothing to summarize)."""
        return min(self.keep_recent_tokens, window // 4)

    def should_compact(self, tokens: int, window: int) -> bool:
        return self.enabled and tokens > window - self.reserve_for(window)
