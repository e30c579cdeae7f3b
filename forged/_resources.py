"""What shapes a session besides its settings: the system prompt and the project context files
it carries, skills (``SKILL.md``) the model reads when a task calls for them, and prompt
templates behind ``/name``.

Each kind is found in a project folder first, then the user's agent dir, then the paths the
settings name, then the command line's; the first of a name wins. What cannot be used is
reported on stderr and passed over, never fatal.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from . import _wire as w
from ._errors import CommandError, FrontmatterError
from ._log import log
from ._settings import PROJECT_DIR, Settings
from ._tools import Tool

CONTEXT_FILE_NAMES = ("AGENTS.md", "CLAUDE.md")
IGNORE_FILE_NAMES = (".gitignore", ".ignore", ".fdignore")
MAX_SKILL_NAME_CHARS = 64
MAX_SKILL_DESCRIPTION_CHARS = 1024
TEMPLATE_DESCRIPTION_CHARS = 60
_SKILL_NAME = r"[a-z0-9]+(?:-[a-z0-9]+)*"  # compiled at its first use, as _PLACEHOLDER

Scope = Literal["user", "project", "temporary"]


@attrs.define(kw_only=True, eq=False, repr=False)
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
                log(f"cannot read {candidate}: {exc}")
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


# --- frontmatter -------------------------------------------------------------------------------

def split_frontmatter(text: str) -> tuple[dict[str, Any] | None, str]:
    """The YAML object between a leading ``---`` line and the next ``---`` line, and the
    text after it; (None, text) when there is no such block."""
    text = text.replace("\r\n", "\n")
    if not text.startswith("---\n"):
        return None, text
    end = text.find("\n---", 3)
    if end == -1:
        return None, text
    import yaml  # slow to import; only frontmatter needs it

    block, body = text[4:end], text[end + 4:]
    body = body.split("\n", 1)[1] if "\n" in body else ""
    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError as exc:
        raise FrontmatterError(f"invalid frontmatter: {exc}") from None
    if data is None:
        return {}, body
    if not isinstance(data, dict):
        raise FrontmatterError("invalid frontmatter: not a mapping")
    return data, body


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        log(f"cannot read {path}: {exc}")
        return None


# --- where things are found --------------------------------------------------------------------

@attrs.define(kw_only=True, frozen=True)
class Origin:
    """A folder (or file) things were found in, and whose it is."""

    path: Path
    scope: Scope


@attrs.define(kw_only=True, eq=False, repr=False)
class ExtraPaths:
    """What the command line adds (scope ``temporary``)."""

    skills: list[Path] = attrs.Factory(list)
    prompt_templates: list[Path] = attrs.Factory(list)
    system_prompt: str | None = None
    append_system_prompt: list[str] = attrs.Factory(list)
    """Each a text or a file, added in order."""
    no_skills: bool = False
    """Only the `skills` given here load (``--no-skills``)."""
    no_prompt_templates: bool = False
    no_context_files: bool = False
    """No ``AGENTS.md`` or ``CLAUDE.md`` is read (``--no-context-files``)."""


def origins(kind: str, settings_key: str, cwd: Path, agent_dir: Path, settings: Settings,
            extra: Sequence[Path], *, discover: bool = True) -> list[Origin]:
    """The project's ``.agent-forge/agent/<kind>``, the user's ``<agentDir>/<kind>``, then the
    paths in the settings key (relative to the file's folder), then `extra`; only `extra`
    unless `discover`."""
    temporary = [Origin(path=path.expanduser().resolve(), scope="temporary") for path in extra]
    if not discover:
        return temporary
    found = [Origin(path=agent_dir / kind, scope="user")]
    if settings.project_trusted:  # else the project's own are code from the repository
        found.insert(0, Origin(path=cwd / PROJECT_DIR / "agent" / kind, scope="project"))
    layers: list[tuple[Scope, Path, Any]] = [
        ("project", cwd / PROJECT_DIR, settings.project_value(settings_key)),
        ("user", agent_dir, settings.global_value(settings_key))]
    for scope, base, listed in layers:
        if isinstance(listed, list):
            found += [Origin(path=(base / Path(item).expanduser()).resolve(), scope=scope)
                      for item in listed if isinstance(item, str) and item]
    return found + temporary


# --- skills ------------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class Skill:
    name: str
    description: str
    path: Path
    """The skill's file: a ``SKILL.md``, or a ``.md`` file directly in a skills folder."""
    origin: Origin
    disable_model_invocation: bool = False

    @property
    def directory(self) -> Path:
        return self.path.parent


class _Ignores:
    """The ignore files met on the way down, each applying below its own folder."""

    def __init__(self, specs: tuple[tuple[Path, Any], ...] = ()) -> None:
        self.specs = specs

    def below(self, directory: Path) -> _Ignores:
        lines: list[str] = []
        for name in IGNORE_FILE_NAMES:
            candidate = directory / name
            if candidate.is_file():
                lines += (_read_text(candidate) or "").splitlines()
        if not lines:
            return self
        import pathspec  # slow to import; only ignore files need it

        spec = pathspec.PathSpec.from_lines("gitignore", lines)
        return _Ignores((*self.specs, (directory, spec)))

    def ignores(self, path: Path, is_dir: bool) -> bool:
        for base, spec in self.specs:
            relative = path.relative_to(base).as_posix() + ("/" if is_dir else "")
            if spec.match_file(relative):
                return True
        return False


def _skill_files(origin: Origin) -> Iterator[Path]:
    """A skills folder's skill files: a folder holding ``SKILL.md`` is one skill (nothing
    under it is looked at); ``.md`` files directly in the root are skills too."""
    root = origin.path
    if root.is_file():
        yield root
        return

    def walk(directory: Path, ignores: _Ignores) -> Iterator[Path]:
        if (directory / "SKILL.md").is_file():
            yield directory / "SKILL.md"
            return
        ignores = ignores.below(directory)
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith(".") or entry.name == "node_modules":
                continue
            is_dir = entry.is_dir()
            if ignores.ignores(entry, is_dir):
                continue
            if is_dir:
                yield from walk(entry, ignores)
            elif directory == root and entry.suffix == ".md" and entry.is_file():
                yield entry

    if root.is_dir():
        yield from walk(root, _Ignores())


def _read_frontmatter(path: Path, kind: str) -> tuple[dict[str, Any] | None, str] | None:
    """A file's frontmatter and body; None (reported) when it cannot be read or parsed."""
    text = _read_text(path)
    if text is None:
        return None
    try:
        return split_frontmatter(text)
    except FrontmatterError as exc:
        log(f"{kind} {path}: {exc}; skipped")
        return None


def _load_skill(path: Path, origin: Origin) -> Skill | None:
    found = _read_frontmatter(path, "skill")
    if found is None:
        return None
    meta = found[0] or {}
    description = meta.get("description")
    if not isinstance(description, str) or not description.strip():
        log(f"skill {path}: a description is required; skipped")
        return None
    expected = path.parent.name if path.name == "SKILL.md" else path.stem
    name = meta.get("name", expected)
    if not isinstance(name, str) or not name:
        log(f"skill {path}: name must be a string; skipped")
        return None
    for problem in _name_problems(name, expected if path.name == "SKILL.md" else None):
        log(f"skill {path}: {problem}")
    if len(description) > MAX_SKILL_DESCRIPTION_CHARS:
        log(f"skill {path}: description is longer than {MAX_SKILL_DESCRIPTION_CHARS} "
             "characters")
    return Skill(name=name, description=description.strip(), path=path, origin=origin,
                 disable_model_invocation=meta.get("disable-model-invocation") is True)


def _name_problems(name: str, directory: str | None) -> list[str]:
    """What is wrong with a skill's name: reported, but the skill still loads."""
    problems: list[str] = []
    if directory is not None and name != directory:
        problems.append(f'name "{name}" does not match its folder "{directory}"')
    if len(name) > MAX_SKILL_NAME_CHARS:
        problems.append(f"name is longer than {MAX_SKILL_NAME_CHARS} characters")
    if not re.fullmatch(_SKILL_NAME, name):
        problems.append(f'name "{name}" should be lowercase letters, digits and single '
                        "hyphens, not starting or ending with one")
    return problems


def load_skills(found_in: Iterable[Origin]) -> list[Skill]:
    skills: dict[str, Skill] = {}
    seen: set[Path] = set()
    for origin in found_in:
        for path in _skill_files(origin):
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            skill = _load_skill(path, origin)
            if skill is None:
                continue
            if skill.name in skills:
                log(f'skill {path}: the name "{skill.name}" is taken by '
                     f"{skills[skill.name].path}; skipped")
                continue
            skills[skill.name] = skill
    return list(skills.values())


def expand_skill(text: str, skills: Sequence[Skill]) -> str:
    """``/skill:name args`` as the skill's body in a ``<skill>`` block, the args after it;
    other text unchanged. An unreadable skill file is a `CommandError`."""
    if not text.startswith("/skill:"):
        return text
    name, _, args = text[len("/skill:"):].partition(" ")
    skill = next((s for s in skills if s.name == name), None)
    if skill is None:
        return text
    try:
        _, body = split_frontmatter(skill.path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, FrontmatterError) as exc:
        raise CommandError(f"Cannot read skill {name}: {exc}") from None
    block = (f'<skill name="{skill.name}" location="{skill.path}">\n'
             f"References are relative to {skill.directory}.\n\n{body.strip()}\n</skill>")
    return f"{block}\n\n{args.strip()}" if args.strip() else block


def _xml(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&apos;"))


def skills_block(skills: Sequence[Skill]) -> str:
    visible = [skill for skill in skills if not skill.disable_model_invocation]
    if not visible:
        return ""
    lines = ["", "", "The following skills provide specialized instructions for specific tasks.",
             "Use the read tool to load a skill's file when the task matches its description.",
             "When a skill file refers to a relative path, resolve it against the skill's "
             "folder (the folder of its file).",
             "", "<available_skills>"]
    for skill in visible:
        lines += ["  <skill>", f"    <name>{_xml(skill.name)}</name>",
                  f"    <description>{_xml(skill.description)}</description>",
                  f"    <location>{_xml(str(skill.path))}</location>", "  </skill>"]
    lines.append("</available_skills>")
    return "\n".join(lines)


# --- prompt templates --------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class PromptTemplate:
    name: str
    description: str
    body: str
    path: Path
    origin: Origin


def _load_template(path: Path, origin: Origin) -> PromptTemplate | None:
    found = _read_frontmatter(path, "prompt template")
    if found is None:
        return None
    meta, body = found
    if meta is not None:
        body = body.strip()
    description = meta.get("description") if meta else None
    if not isinstance(description, str) or not description.strip():
        first = next((line.strip() for line in body.splitlines() if line.strip()), "")
        description = (first[:TEMPLATE_DESCRIPTION_CHARS] + "..."
                       if len(first) > TEMPLATE_DESCRIPTION_CHARS else first)
    return PromptTemplate(name=path.stem, description=description.strip(), body=body,
                          path=path, origin=origin)


def load_prompt_templates(found_in: Iterable[Origin]) -> list[PromptTemplate]:
    """The ``.md`` files directly in each folder (or each file named); first name wins."""
    templates: dict[str, PromptTemplate] = {}
    for origin in found_in:
        if origin.path.is_file():
            paths = [origin.path]
        elif origin.path.is_dir():
            paths = sorted(p for p in origin.path.glob("*.md") if p.is_file())
        else:
            continue
        for path in paths:
            template = _load_template(path, origin)
            if template is not None and template.name not in templates:
                templates[template.name] = template
    return list(templates.values())


def split_args(text: str) -> list[str]:
    """Arguments as a shell splits them on whitespace, ``'…'`` and ``"…"`` grouping (quotes
    removed, no escapes)."""
    args: list[str] = []
    current: list[str] = []
    quote: str | None = None
    started = False
    for char in text:
        if quote is not None:
            if char == quote:
                quote = None
            else:
                current.append(char)
        elif char in "'\"":
            quote, started = char, True
        elif char.isspace():
            if started:
                args.append("".join(current))
                current, started = [], False
        else:
            current.append(char)
            started = True
    if started:
        args.append("".join(current))
    return args


_PLACEHOLDER = r"\$\{@:(\d+)(?::(\d+))?\}|\$ARGUMENTS|\$@|\$(\d+)"


def substitute(body: str, args: Sequence[str]) -> str:
    """``$1``…, ``${@:N}``, ``${@:N:L}``, ``$ARGUMENTS`` and ``$@`` in one pass: a value is
    never substituted again."""
    def value(match: re.Match[str]) -> str:
        if match.group(3) is not None:
            index = int(match.group(3)) - 1
            return args[index] if 0 <= index < len(args) else ""
        if match.group(1) is not None:
            start = max(int(match.group(1)), 1) - 1
            length = int(match.group(2)) if match.group(2) is not None else None
            return " ".join(args[start:] if length is None else args[start:start + length])
        return " ".join(args)

    return re.sub(_PLACEHOLDER, value, body)


def expand_template(text: str, templates: Sequence[PromptTemplate]) -> str:
    if not text.startswith("/"):
        return text
    name, _, rest = text[1:].partition(" ")
    template = next((t for t in templates if t.name == name), None)
    if template is None:
        return text
    return substitute(template.body, split_args(rest))


# --- the system prompt -------------------------------------------------------------------------

def _text_or_file(value: str) -> str:
    candidate = Path(value).expanduser()
    try:
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    return value


def _first_file(*candidates: Path) -> str | None:
    for candidate in candidates:
        if candidate.is_file():
            text = _read_text(candidate)
            if text is not None:
                return text
    return None


@attrs.define(kw_only=True, eq=False, repr=False)
class Resources:
    """A session's skills, templates and system prompt parts, found once when it starts."""

    cwd: Path
    agent_dir: Path
    skills: list[Skill] = attrs.Factory(list)
    templates: list[PromptTemplate] = attrs.Factory(list)
    base_prompt: str | None = None
    """``--system-prompt``, else ``SYSTEM.md``: replaces forged's own prompt."""
    append_prompt: str | None = None
    """``--append-system-prompt``, else ``APPEND_SYSTEM.md``: added after it."""
    context_files: bool = True
    """``AGENTS.md`` and ``CLAUDE.md`` are read (not ``--no-context-files``)."""

    @classmethod
    def load(cls, cwd: Path, agent_dir: Path, settings: Settings,
             extra: ExtraPaths | None = None) -> Resources:
        extra = extra or ExtraPaths()
        project = cwd / PROJECT_DIR
        # An untrusted project's own system prompts are left out: instructions from the
        # repository (its AGENTS.md is read as context, as everywhere).
        prompts_from = [project / "agent", project] if settings.project_trusted else []
        return cls(
            cwd=cwd, agent_dir=agent_dir,
            skills=load_skills(origins("skills", "skills", cwd, agent_dir, settings,
                                       extra.skills, discover=not extra.no_skills)),
            templates=load_prompt_templates(origins(
                "prompts", "prompts", cwd, agent_dir, settings, extra.prompt_templates,
                discover=not extra.no_prompt_templates)),
            base_prompt=(_text_or_file(extra.system_prompt) if extra.system_prompt else
                         _first_file(*(folder / "SYSTEM.md"
                                       for folder in [*prompts_from, agent_dir]))),
            append_prompt=("\n\n".join(_text_or_file(text)
                                        for text in extra.append_system_prompt)
                           if extra.append_system_prompt else
                           _first_file(*(folder / "APPEND_SYSTEM.md"
                                         for folder in [*prompts_from, agent_dir]))),
            context_files=not extra.no_context_files)

    def command_infos(self) -> list[w.CommandInfo]:
        """The prompt templates, then the skills, as ``get_commands`` lists them."""
        found = [w.CommandInfo(name=template.name, description=template.description,
                               source="prompt",
                               source_info=_source_info(template.path, template.origin))
                 for template in self.templates]
        found += [w.CommandInfo(name=f"skill:{skill.name}", description=skill.description,
                                source="skill", source_info=_source_info(skill.path,
                                                                         skill.origin))
                  for skill in self.skills]
        return found

    def expand(self, text: str) -> str:
        """A prompt's text with ``/skill:name`` and then ``/template`` expanded."""
        return expand_template(expand_skill(text, self.skills), self.templates)

    def system_prompt(self, tools: Sequence[Tool], guidelines: Sequence[str] = ()) -> str:
        return build_system_prompt(
            tools, self.cwd,
            find_context_files(self.cwd, self.agent_dir) if self.context_files else [],
            base=self.base_prompt, append=self.append_prompt, skills=self.skills,
            guidelines=guidelines)


IDENTITY = (
    "You are an expert coding assistant working inside forged, a headless coding agent. "
    "You help the user by reading files, running commands, editing code and writing new "
    "files in their project."
)


def build_system_prompt(tools: Sequence[Tool], cwd: Path, context_files: Sequence[ContextFile],
                        today: datetime.date | None = None, *, base: str | None = None,
                        append: str | None = None, skills: Sequence[Skill] = (),
                        guidelines: Sequence[str] = ()) -> str:
    """forged's prompt (or `base`), `append`, the context files, the skills when the model
    can read them, the date and the cwd."""
    prompt = base if base is not None else _default_prompt(tools, guidelines)
    if append:
        prompt += f"\n\n{append}"
    if context_files:
        prompt += "\n\n# Project Context\n\nProject-specific instructions and guidelines:\n\n"
        prompt += "".join(f"## {item.path}\n\n{item.content}\n\n" for item in context_files)
    if any(tool.name == "read" for tool in tools):
        prompt += skills_block(skills)
    day = today or datetime.datetime.now(datetime.UTC).date()
    prompt += f"\nCurrent date: {day.isoformat()}"
    prompt += f"\nCurrent working directory: {cwd.as_posix()}"
    return prompt


def _default_prompt(tools: Sequence[Tool], extra_guidelines: Sequence[str]) -> str:
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
    guidelines += [g for g in extra_guidelines if g not in guidelines]
    guidelines += ["Be concise in your responses",
                   "Show file paths clearly when working with files"]
    lines += [f"- {guideline}" for guideline in dict.fromkeys(guidelines)]
    return "\n".join(lines)


def _source_info(path: Path, origin: Origin) -> w.SourceInfo:
    return w.SourceInfo(path=str(path), source="local", scope=origin.scope, origin="top-level",
                        base_dir=str(origin.path if origin.path.is_dir() else path.parent))
