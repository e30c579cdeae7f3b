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
import re
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
    links = [folder / name for name, entry in entries.items()
             if entry.is_symlink() and name not in COMMITTING]
    if links:
        # A link to another repository's config or hooks (git-new-workdir): the whole
        # folder read-only keeps the links (commits then fail in the sandbox, as they
        # must), and what they lead to is kept read-only where it is.
        targets = (Path(os.path.realpath(link)) for link in links)
        return Kept(folder, read_only=(folder, *(target for target in targets
                                                 if target.exists())), stand_ins=())
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


@attrs.frozen
class Found:
    """What `find` found in some folders."""

    folders: tuple[Path, ...]
    """Git folders (real paths, each once): ``.git`` folders, the folders ``.git`` files
    name, bare repositories, and the common folders those name."""
    gitfiles: tuple[Path, ...]
    links: tuple[Path, ...]
    """``.git`` entries that are symbolic links: nothing keeps one from being replaced."""
    entries: int
    """How many entries were looked at."""


def find(roots: Iterable[Path], *, entries: int = SCAN_ENTRIES) -> Found:
    """The git folders, ``.git`` files and ``.git`` links in `roots`, as far as `entries`
    entries and `SCAN_DEPTH` levels of the roots are looked at. A git folder's own
    contents are not walked."""
    folders: dict[Path, None] = {}
    gitfiles: list[Path] = []
    links: list[Path] = []
    budget = [entries]
    for root in roots:
        for folder, gitfile in _walk(root, budget):
            if folder.is_symlink() and folder.name == ".git":
                links.append(folder)
                continue
            if gitfile is not None:
                gitfiles.append(gitfile)
            if folder.is_dir():
                for candidate in _with_common(folder):
                    folders.setdefault(candidate)
    return Found(tuple(folders), tuple(gitfiles), tuple(links), entries=entries - budget[0])


def _with_common(folder: Path) -> Iterator[Path]:
    real = Path(os.path.realpath(folder))
    yield real
    common = common_folder(real)
    if common is not None and common.is_dir():
        yield Path(os.path.realpath(common))


def checkouts(kept: Kept) -> list[Path]:
    """The ``.git`` files of the submodules whose git folders `kept` holds, found by the
    ``core.worktree`` each git folder names (however deep they lie, scanned or not)."""
    found = []
    for sub in kept.submodules:
        worktree = config_value(sub.folder / "config", "core", "worktree")
        if worktree is not None:
            gitfile = Path(os.path.normpath(sub.folder / worktree)) / ".git"
            if gitfile.is_file() and not gitfile.is_symlink():
                found.append(gitfile)
        found += checkouts(sub)
    return found


def config_entries(path: Path) -> list[tuple[str, str]] | None:
    """A git config file's keys (``section.subsection.name``, lowercased but the
    subsection) and values, or None where it cannot be read as git writes one."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    section = None
    found = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            header = re.fullmatch(r'\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]'
                                  r"\s*(?:[#;].*)?", line)
            if header is None:
                return None
            name, sub = header.group(1).lower(), header.group(2)
            section = f"{name}.{sub}" if sub is not None else name
            continue
        key = re.fullmatch(r"([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*))?", line)
        if key is None or section is None:
            return None
        found.append((f"{section}.{key.group(1).lower()}", (key.group(2) or "").strip()))
    return found


def config_value(path: Path, section: str, name: str) -> str | None:
    for key, value in config_entries(path) or []:
        if key == f"{section}.{name}":
            return value.strip('"')
    return None


SAFE_KEYS = re.compile(
    r"core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|"
    r"precomposeunicode|symlinks|autocrlf|eol)|extensions\.objectformat|user\.(name|email)|"
    r"init\.defaultbranch|branch\..+\.(remote|merge|rebase)|remote\..+\.(url|fetch)|"
    r"submodule\..+\.(url|active)")
"""What ``git init``, ``git clone`` and ``git checkout -b`` write in a new repository's
config: nothing of it makes git run a program."""


def set_aside(folder: Path) -> list[Path]:
    """Make a git folder that a confined command made or changed harmless before anyone
    runs git in it: a config holding more than `SAFE_KEYS` (a ``core.fsmonitor``, an alias,
    a filter), hooks (any but git's samples), ``commondir`` and ``config.worktree`` are
    renamed with the `SET_ASIDE` suffix. What was set aside."""
    moved = []
    config = folder / "config"
    entries = config_entries(config) if config.exists() else []
    if entries is None or any(not SAFE_KEYS.fullmatch(key) for key, _ in entries):
        moved.append(config)
    hooks = folder / "hooks"
    try:
        if hooks.is_symlink() or any(not name.endswith(".sample") for name in os.listdir(hooks)):
            moved.append(hooks)
    except OSError:
        pass
    for name in ("commondir", "config.worktree"):
        if (folder / name).exists() or (folder / name).is_symlink():
            moved.append(folder / name)
    return [path for path in moved if _rename(path)]


def _rename(path: Path) -> bool:
    try:
        path.rename(path.with_name(path.name + SET_ASIDE))
    except OSError:
        return False
    return True


def changed_since(paths: Iterable[Path], start_ns: int) -> bool:
    """Whether any of `paths` was made or changed at or after `start_ns` (``st_ctime``,
    which no command can set back)."""
    for path in paths:
        try:
            if os.lstat(path).st_ctime_ns >= start_ns:
                return True
        except OSError:
            continue
    return False


def disarm(found: Found, seen: set[Path], start_ns: int) -> list[Path]:
    """What a confined command that started at `start_ns` left in its writable folders for
    the user's next git, set aside (`set_aside`): git folders, ``.git`` files and ``.git``
    links not in `seen` (those were kept read-only) that were made or changed since. What
    was set aside."""
    aside: list[Path] = []
    for folder in found.folders:
        dangerous = (folder / name for name in ("config", "hooks", "commondir",
                                                "config.worktree"))
        if folder not in seen and changed_since(dangerous, start_ns) and is_git_folder(folder):
            aside += set_aside(folder)
    for path in (*found.gitfiles, *found.links):
        if path not in seen and changed_since([path], start_ns) and _rename(path):
            aside.append(path)
    return aside


SET_ASIDE = ".set-aside-by-forged"


def _walk(root: Path, budget: list[int], depth: int = 0
          ) -> Iterator[tuple[Path, Path | None]]:
    """Each git folder under `root`, with the ``.git`` file that named it (or None), and each
    ``.git`` link (as its own path). `budget` is what is left of the entries to look at."""
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
            if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
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
