"""Settings for the whole suite: hypothesis keeps no example database, so one run says
nothing about the next, and under CI (``CI`` set, as `.ci/run` does) it is derandomized: each
test draws the same examples every time."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("dev", database=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def mounted_tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs at `mount_point` with `options` while the generator is held (mounting needs
    root: the test skips, saying so, without it)."""
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs",
                              str(mount_point)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """An empty folder on a read-only file system, which even root cannot write."""
    yield from mounted_tmpfs(tmp_path / "read-only", "ro,size=64k")


@pytest.fixture(autouse=True)
def own_agent_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's agent folder is its own (``tmp_path/agent``, made when used): one test's
    models.json or auth.json never reaches the next through ``AGENT_FORGE_DIR``."""
    monkeypatch.setenv("AGENT_FORGE_DIR", str(tmp_path / "agent"))
