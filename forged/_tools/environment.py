"""The environment a command gets: the ``shellEnvironment`` policy (docs/security.md).

forged's own environment holds what the model must not see (API keys, tokens) and what points
at ways out of the sandbox (``SSH_AUTH_SOCK``, the session bus). A command of the ``bash``
tool, a client's direct ``bash`` and a stdio MCP server start with what the policy keeps of
it, then their own additions (the session's ``PI_*`` names, a server's ``env`` entries):

- ``inherit``: ``all`` of forged's environment, the ``core`` names (`CORE`), or ``none``;
  by default ``core`` in ``ask``, ``auto`` and ``read-only``, ``all`` in ``full-access``;
- ``exclude``: name patterns dropped; in ``ask``, ``auto`` and ``read-only`` the names of
  secrets (`SECRET_PATTERNS`) are dropped too, always;
- ``include``: names kept whatever the rest says (but `NEVER_CONFINED` in a sandboxed mode);
- ``set``: names set to a value, last.

In ``full-access`` with no ``shellEnvironment`` setting, everything is inherited, as pi does.
A trusted project may narrow the policy (a narrower ``inherit``, more ``exclude`` patterns),
never widen it: its ``include`` and ``set`` are ignored, as its ``sandbox`` section's
widening keys are.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Mapping

import attrs

from .._log import log
from .._settings import Settings
from .._vocabulary import SANDBOXED_MODES

INHERIT = ("all", "core", "none")
"""From widest to narrowest."""
CORE = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_*", "TERM", "TZ", "TMPDIR",
        "PWD")
SECRET_PATTERNS = ("*KEY*", "*SECRET*", "*TOKEN*", "*PASS*", "*CREDENTIAL*", "*AUTH",
                   "*AUTH_*", "*_PAT", "*DSN*", "*DATABASE_URL*", "OTEL_EXPORTER_OTLP*HEADERS")
"""Names of secrets (``GIT_AUTHOR_NAME`` is none: ``*AUTH`` and ``*AUTH_*``, not ``*AUTH*``)."""
NEVER_CONFINED = ("SSH_AUTH_SOCK", "DBUS_*", "XDG_RUNTIME_DIR", "DISPLAY", "WAYLAND_DISPLAY")
"""Names that point at the host's sockets: never given to a confined command (the sandbox
hides what they name anyway)."""


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return _matcher(patterns)(name.upper()) is not None


@functools.cache
def _matcher(patterns: tuple[str, ...]) -> Callable[[str], re.Match[str] | None]:
    """One regular expression for all of `patterns` (case-insensitive shell patterns)."""
    if not patterns:
        return lambda _: None
    return re.compile("|".join(fnmatch.translate(pattern.upper())
                               for pattern in patterns)).match


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(item for item in value if isinstance(item, str) and item)


@attrs.frozen(kw_only=True)
class ShellEnvironment:
    """The ``shellEnvironment`` setting, as it applies (global, narrowed by a trusted
    project)."""

    inherit: str | None = None
    """None: the mode's default."""
    exclude: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    set: tuple[tuple[str, str], ...] = ()
    configured: bool = False
    """Whether the settings have the section at all (``full-access`` then applies it too)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> ShellEnvironment:
        mine = settings.global_value("shellEnvironment")
        project = settings.project_value("shellEnvironment")
        if not isinstance(mine, dict) and not isinstance(project, dict):
            return cls()
        mine = mine if isinstance(mine, dict) else {}
        project = project if isinstance(project, dict) else {}
        inherit = _inherit(mine.get("inherit"), "the global settings")
        narrower = _inherit(project.get("inherit"), "the project's settings")
        if narrower is not None and (inherit is None
                                     or INHERIT.index(narrower) > INHERIT.index(inherit)):
            inherit = narrower
        if "include" in project or "set" in project:
            log("ignoring the project's shellEnvironment include and set: a project may "
                "narrow the environment, never widen it")
        values = mine.get("set")
        pairs = tuple((str(name), str(value)) for name, value in values.items()
                      if isinstance(value, str | int | float)) if isinstance(values, dict) else ()
        return cls(inherit=inherit,
                   exclude=(*_strings(mine.get("exclude")), *_strings(project.get("exclude"))),
                   include=_strings(mine.get("include")), set=pairs, configured=True)

    def inherits(self, mode: str) -> str:
        return self.inherit or ("all" if mode == "full-access" else "core")

    def applies(self, mode: str) -> bool:
        """False in ``full-access`` with no setting: forged's whole environment, as is."""
        return self.configured or mode != "full-access"

    def excluded(self, mode: str) -> tuple[str, ...]:
        return (*self.exclude, *(SECRET_PATTERNS if mode != "full-access" else ()))

    def environment(self, mode: str, base: Mapping[str, str]) -> dict[str, str] | None:
        """What a command in `mode` starts with, of `base` (forged's environment); None where
        the policy does not apply (`applies`)."""
        if not self.applies(mode):
            return None
        inherit = self.inherits(mode)
        excluded = self.excluded(mode)
        kept = {}
        for name, value in base.items():
            if mode in SANDBOXED_MODES and _matches(name, NEVER_CONFINED):
                continue
            if name in self.include:
                kept[name] = value
                continue
            if inherit == "none" or (inherit == "core" and not _matches(name, CORE)):
                continue
            if _matches(name, excluded):
                continue
            kept[name] = value
        kept.update(self.set)
        return kept

    def describe(self, mode: str) -> str:
        """The policy in force in `mode`, in one line (``forged config show``)."""
        if not self.applies(mode):
            return "all of forged's environment (full-access, no shellEnvironment setting)"
        parts = [f"inherit {self.inherits(mode)}"]
        if excluded := self.excluded(mode):
            parts.append(f"exclude {', '.join(excluded)}")
        if mode in SANDBOXED_MODES:
            parts.append(f"never {', '.join(NEVER_CONFINED)}")
        if self.include:
            parts.append(f"include {', '.join(self.include)}")
        if self.set:
            parts.append(f"set {', '.join(name for name, _ in self.set)}")
        return f"{'; '.join(parts)} ({mode})"


def _inherit(value: object, where: str) -> str | None:
    if value is None:
        return None
    if value not in INHERIT:
        log(f"ignoring shellEnvironment.inherit {value!r} in {where}: one of "
            f"{', '.join(INHERIT)}")
        return None
    return str(value)
