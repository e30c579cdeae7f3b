"""Git's folders, as the sandbox keeps them: what a confined command may write in a
repository's git folder (what committing needs) and what stays read-only (everything that
makes git run a program: config, hooks, ``commondir`` and the rest).

git runs programs a repository's metadata names (``core.fsmonitor``, ``core.hooksPath``,
hooks, filter and diff drivers, aliases) the next time anyone runs git there, unconfined: a
shell prompt does, on every line. So in a folder a confined command may write, each git
folder found there before the command starts is kept: the entries committing writes stay
writable (`COMMITTING`), every other entry is bound read-only, the entries git reads that
do not exist yet are filled with read-only stand-ins (`STAND_INS`), and each git folder of a
submodule (``modules/<name>``) is kept the same way. A git folder is found as a ``.git``
folder, as the folder a ``.git`` file names (a linked worktree's, a submodule's checkout),
as a bare repository (``HEAD``, ``objects`` and ``refs`` together), and as the common folder
a ``commondir`` names.

Resource handling: `find` and `keep` only read; `stand_in_files` writes the stand-in files.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

COMMITTING = frozenset({"objects", "refs", "logs", "index", "HEAD", "ORIG_HEAD", "FETCH_HEAD",
                        "COMMIT_EDITMSG", "packed-refs"})
"""What a commit (and a branch, a reset, a merge's bookkeeping) writes in a git folder; git
also makes its lock files (``index.lock``) beside them, so the folder itself stays writable."""
STAND_IN_FOLDERS = ("hooks", "info", "worktrees", "modules")
STAND_IN_FILES = {"config": "", "config.worktree": "", "commondir": ".\n"}
"""What git reads that a git folder may not have yet: an empty read-only folder, or a
read-only file, stands in its place, so none can be planted. ``commondir`` is the one file
git cannot read empty ("failed to read"): it holds ``.``, which git reads as this folder."""
STAND_INS = (*STAND_IN_FOLDERS, *STAND_IN_FILES)
SCAN_ENTRIES = 20_000
"""How many entries of a writable folder are looked at for nested repositories, at most."""
SCAN_DEPTH = 8


@attrs.frozen
class Kept:
    """What the sandbox does for one git folder."""

    folder: Path
    read_only: tuple[Path, ...]
    """Entries bound read-only where they are."""
    stand_ins: tuple[Path, ...]
    """Missing entries of `STAND_INS`: made read-only while a command runs."""
    submodules: tuple[Kept, ...] = ()


def is_git_folder(folder: Path) -> bool:
    """Whether `folder` looks like a git folder, as git itself asks (``HEAD``, ``objects``,
    ``refs``)."""
    return ((folder / "HEAD").is_file() and (folder / "objects").is_dir()
            and (folder / "refs").is_dir())


def read_gitfile(path: Path) -> Path | None:
    """The folder a ``.git`` file names (``gitdir: ...``), or None."""
    try:
        with open(path, "rb") as file:
            first = file.read(4096).split(b"\n", 1)[0].decode(errors="replace")
    except OSError:
        return None
    if not first.startswith("gitdir:"):
        return None
    named = Path(first.removeprefix("gitdir:").strip())
    return (path.parent / named) if not named.is_absolute() else named


def common_folder(folder: Path) -> Path | None:
    """The folder ``commondir`` in `folder` names (a linked worktree's repository), or None."""
    try:
        named = (folder / "commondir").read_text(errors="replace").strip()
    except OSError:
        return None
    return None if not named or named == "." else (folder / named)


def keep(folder: Path) -> Kept:
    """What stays read-only in the git folder `folder` (which exists)."""
    read_only, stand_ins, submodules = [], [], []
    try:
        entries = {entry.name: entry for entry in os.scandir(folder)}
    except OSError:
        entries = {}
    for name, entry in entries.items():
        if name in COMMITTING or name.endswith(".lock"):
            continue
        path = folder / name
        if name == "modules" and entry.is_dir(follow_symlinks=False):
            submodules += _modules(path)
        else:
            read_only.append(path)
    for name in STAND_INS:
        if name not in entries:
            stand_ins.append(folder / name)
    return Kept(folder, tuple(read_only), tuple(stand_ins), tuple(submodules))


def _modules(folder: Path, depth: int = 0) -> list[Kept]:
    """The git folders of submodules under ``modules`` (a name may hold slashes)."""
    found: list[Kept] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if is_git_folder(path):
            found.append(keep(path))
        elif depth < SCAN_DEPTH:
            found += _modules(path, depth + 1)
    return found


def find(roots: Iterable[Path], *, entries: int = SCAN_ENTRIES
         ) -> tuple[list[Path], list[Path]]:
    """The git folders in `roots` (real paths, each once: ``.git`` folders, the folders
    ``.git`` files name, bare repositories, and the common folders those name), and the
    ``.git`` files, as far as `entries` entries and `SCAN_DEPTH` levels of the roots are
    looked at. A git folder's own contents are not walked."""
    folders: dict[Path, None] = {}
    gitfiles: list[Path] = []
    budget = [entries]
    for root in roots:
        for folder, gitfile in _walk(root, budget):
            if gitfile is not None:
                gitfiles.append(gitfile)
            if folder.is_dir():
                for candidate in _with_common(folder):
                    folders.setdefault(candidate)
    return list(folders), gitfiles


def _with_common(folder: Path) -> Iterator[Path]:
    real = Path(os.path.realpath(folder))
    yield real
    common = common_folder(real)
    if common is not None and common.is_dir():
        yield Path(os.path.realpath(common))


def _walk(root: Path, budget: list[int], depth: int = 0
          ) -> Iterator[tuple[Path, Path | None]]:
    """Each git folder under `root`, with the ``.git`` file that named it (or None)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    budget[0] -= len(entries)
    names = {entry.name for entry in entries}
    if {"HEAD", "objects", "refs"} <= names and is_git_folder(root):
        yield root, None  # a bare repository
        return
    for entry in entries:
        if entry.name == ".git":
            if entry.is_dir(follow_symlinks=False):
                yield Path(entry.path), None
            elif entry.is_file(follow_symlinks=False):
                named = read_gitfile(Path(entry.path))
                yield (named or Path(entry.path)), Path(entry.path)
    if depth >= SCAN_DEPTH:
        return
    for entry in entries:
        if budget[0] <= 0:
            return
        if entry.name != ".git" and entry.is_dir(follow_symlinks=False):
            yield from _walk(Path(entry.path), budget, depth + 1)


def stand_in_files(kept: Kept) -> None:
    """Write the stand-in files `kept` lacks, with what git reads in them as absent, for the
    sandbox to bind read-only: ``commondir`` could not be the empty file bubblewrap makes for
    a mount, which git refuses to read. They stay afterwards, as the empty stand-in folders
    do (removing one a running sandbox has mounted would free its name there)."""
    for path in kept.stand_ins:
        if path.name in STAND_IN_FILES:
            try:
                with open(path, "x") as file:
                    file.write(STAND_IN_FILES[path.name])
            except FileExistsError:
                pass
    for sub in kept.submodules:
        stand_in_files(sub)
