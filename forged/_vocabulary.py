"""The protocol's closed vocabularies, each named once: thinking levels and permission modes.

On the ground floor with no import of forged's own, so that the command line checks its flags
without loading the wire classes or the tools."""

from __future__ import annotations

from typing import Literal

ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"]
THINKING_LEVELS: tuple[ThinkingLevel, ...] = (
    "off", "minimal", "low", "medium", "high", "xhigh", "max",
)
"""From none to the most; a model offers a prefix of them (``xhigh`` and ``max`` only where
its provider has them)."""

PermissionMode = Literal["full-access", "ask", "auto", "read-only"]
PERMISSION_MODES: tuple[PermissionMode, ...] = ("full-access", "ask", "auto", "read-only")
SANDBOXED_MODES: frozenset[str] = frozenset({"auto", "read-only"})
"""The modes whose commands run in the sandbox (docs/security.md)."""
