"""The system prompt and the project context files it carries."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

from ._tools import Tool

CONTEXT_FILE_NAMES = ("AGENTS.md", "CLAUDE.md")


@attrs.define(kw_only=True)
class ContextFile:
    path: Path
    content: str


def _context_file_in(directory: Path) -> ContextFile | None:
    for name in CONTEXT_FILE_NAMES:
        candidate = directory / name
        if candidate.is_file():
            try:
                return ContextFile(path=candidate, content=candidate.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                print(f"forged: cannot read {candidate}: {exc}", file=sys.stderr)
    return None


def find_context_files(cwd: Path, agent_dir: Path) -> list[ContextFile]:
    """The agent dir's file first, then each directory from the root down to `cwd`."""
    found: list[ContextFile] = []
    seen: set[Path] = set()
    directories = [agent_dir, *reversed([cwd, *cwd.parents])]
    for directory in directories:
        context = _context_file_in(directory)
        if context is not None and context.path.resolve() not in seen:
            seen.add(context.path.resolve())
            found.append(context)
    return found


IDENTITY = (
    "You are an expert coding assistant working inside forged, a headless coding agent. "
    "You help the user by reading files, running commands, editing code and writing new "
    "files in their project."
)


def build_system_prompt(tools: Sequence[Tool], cwd: Path, context_files: Sequence[ContextFile],
                        today: datetime.date | None = None) -> str:
    names = {tool.name for tool in tools}
    lines = [IDENTITY, "", "Available tools:"]
    lines += [f"- {tool.name}: {tool.snippet}" for tool in tools] or ["(none)"]
    lines += ["", "Guidelines:"]
    guidelines: list[str] = []
    if "bash" in names and names & {"grep", "find", "ls"}:
        guidelines.append("Prefer grep/find/ls over bash for exploring files; they are faster "
                          "and respect .gitignore")
    elif "bash" in names:
        guidelines.append("Use bash for file operations like ls, rg and find")
    if {"read", "edit"} <= names:
        guidelines.append("Read a file before you edit it")
    if "edit" in names:
        guidelines.append("Use edit for precise changes: oldText must match the file exactly")
    if "write" in names:
        guidelines.append("Use write only for new files or complete rewrites")
    if names & {"edit", "write"}:
        guidelines.append("When summarizing your work, answer in plain text; do not cat files "
                          "to show what you did")
    guidelines += ["Be concise in your responses",
                   "Show file paths clearly when working with files"]
    lines += [f"- {guideline}" for guideline in guidelines]
    prompt = "\n".join(lines)
    if context_files:
        prompt += "\n\n# Project Context\n\nProject-specific instructions and guidelines:\n\n"
        prompt += "".join(f"## {item.path}\n\n{item.content}\n\n" for item in context_files)
    day = today or datetime.datetime.now(datetime.UTC).date()
    prompt += f"\nCurrent date: {day.isoformat()}"
    prompt += f"\nCurrent working directory: {cwd.as_posix()}"
    return prompt
