"""The user's documentation: docs/protocol.md names every command, event and wire field forged
reads or writes, every link in README.md and docs/ leads somewhere, every page of docs/ is
reachable from the README's map and the docs' index, and nothing in the project points
outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, get_args

import attrs
import pytest

from forged import _codec, _wire as w

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
PROTOCOL = DOCS / "protocol.md"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
         *sorted(DOCS.glob("*.md"))]


def _protocol_words() -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", PROTOCOL.read_text()))


def _wire_classes() -> list[type[Any]]:
    return [value for value in vars(w).values() if isinstance(value, type) and attrs.has(value)]


def test_every_command_is_documented() -> None:
    missing = sorted(set(w.DAEMON_COMMAND_CLASSES) - _protocol_words())
    assert missing == []


def test_every_event_is_documented() -> None:
    streamed = {attrs.fields(cls).type.default for cls in get_args(w.AssistantMessageEvent)}
    missing = sorted((w.EVENT_TYPES | streamed) - _protocol_words())
    assert missing == []


def test_every_wire_field_is_documented() -> None:
    words = _protocol_words()
    missing = sorted({f"{cls.__name__}.{_codec.camel(field.name)}"
                      for cls in _wire_classes() for field in attrs.fields(cls)
                      if _codec.camel(field.name) not in words})
    assert missing == []


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation gone, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken: list[str] = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        inside = linked.exists() and linked.is_relative_to(ROOT)
        if not inside or (anchor and anchor not in _anchors(linked)):
            broken.append(target)
    assert broken == []


def test_links_are_checked() -> None:
    """The link check above sees the README's link to the protocol and the contents' anchors."""
    assert "](docs/protocol.md)" in (ROOT / "README.md").read_text()
    assert {"lines", "the-daemon", "a-worked-transcript"} <= _anchors(PROTOCOL)


def test_every_page_is_on_the_map_and_in_the_index() -> None:
    """A page nothing links to is a page nobody finds: the README's map and docs/README.md
    each link every page of docs/."""
    readme = (ROOT / "README.md").read_text()
    index = (DOCS / "README.md").read_text()
    pages = [page.name for page in sorted(DOCS.glob("*.md")) if page.name != "README.md"]
    assert len(pages) > 3
    assert [name for name in pages if f"](docs/{name})" not in readme] == []
    assert [name for name in pages if f"]({name})" not in index] == []
    assert "](docs/README.md)" in readme


def test_nothing_points_outside_the_project() -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    outside = re.compile(r"\.\./shared|DECISIONS\.md|reference-behavio[u]r|\brpc\.md\b")
    offenders = [name for name in listed.stdout.decode().split("\0")
                 if name and (ROOT / name).is_file()
                 and outside.search((ROOT / name).read_bytes().decode(errors="replace"))]
    assert offenders == []
