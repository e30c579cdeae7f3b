"""The man pages: they render without warnings and name every option the commands take."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from forged._cli import (
    build_config_parser,
    build_connect_parser,
    build_parser,
    build_serve_parser,
)

MAN = Path(__file__).parents[1] / "man"
PAGES = ["forged.1", "forged-rpc.7", "forged-settings.5"]


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
@pytest.mark.parametrize("page", PAGES)
def test_a_page_renders_without_warnings(page: str) -> None:
    result = subprocess.run(["groff", "-man", "-ww", "-z", str(MAN / page)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stderr == ""


def test_forged_1_names_every_option() -> None:
    text = (MAN / "forged.1").read_text().replace("\\-", "-")
    options = {option for parser in (build_parser(), build_serve_parser(),
                                     build_connect_parser(), build_config_parser())
               for action in parser._actions for option in action.option_strings}
    missing = sorted(o for o in options if o not in ("-h", "--help", "--version")
                     and not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text))
    assert missing == []


def test_forged_rpc_7_names_every_command() -> None:
    from forged import _wire as w

    text = (MAN / "forged-rpc.7").read_text().replace("\\-", "-")
    missing = sorted(name for name in w.DAEMON_COMMAND_CLASSES if name not in text)
    assert missing == []


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_an_install_puts_the_pages_where_man_finds_them(tmp_path: Path) -> None:
    """The README's install (its first `pip install`), into a prefix: `man forged` finds
    every page with only the prefix's bin on PATH, as man looks beside each bin folder."""
    import sys

    source = tmp_path / "source"  # a copy: a build writes its folders beside the sources
    top = MAN.parent
    shutil.copytree(top / "forged", source / "forged",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(MAN, source / "man")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(top / name, source / name)
    readme = (top / "README.md").read_text()
    install = re.search(r"\.venv/bin/pip install ([^&]*?) &&", readme)
    assert install is not None
    given = [str(source) if arg == "." else arg for arg in install[1].split()]
    prefix = tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-I",
                    "--no-build-isolation", "--prefix", str(prefix), *given],
                   check=True, capture_output=True)
    env = {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for section, page in (("1", "forged"), ("7", "forged-rpc"), ("5", "forged-settings")):
        found = subprocess.run(["man", "-w", section, page], capture_output=True, text=True,
                               env=env, check=False)
        assert found.stdout.strip() == str(prefix / "share" / "man" / f"man{section}"
                                           / f"{page}.{section}"), found.stderr
