"""Checkpoints of a workspace's files: a shadow git repository per workspace, under
``<agentDir>/checkpoints/``, with the workspace as its work tree. The project's own ``.git``
is never read or written: the shadow repository has its own ``GIT_DIR``, and each capture its
own index file, so two sessions in one workspace never share an index.

What a capture holds: every file git would not ignore (the project's ``.gitignore`` and
``.ignore``, the user's global excludes), untracked ones included, and the files of nested
repositories (a cloned dependency with a ``.git`` of its own, which git alone records as one
gitlink: their own ignores apply, their git folders are left out); files over
`Shadow.max_file_bytes` are left out and named. A path that changes kind (folder, file,
link) is recorded as what it is now, and never followed through a link. The agent folder
is never captured when it lies in the workspace (a home folder as the workspace holds
``~/.agent-forge/agent``): its checkpoints would capture themselves, and a restore must not
put back old sessions, settings or keys. Each capture is a commit kept alive by a ref of its
own (``refs/forged/<sha>``). git records a file's executable bit and symbolic links; other
mode bits are not kept.

Every method runs git and blocks: callers run them in a worker thread, never on the loop.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import attrs

from ._errors import CheckpointError
from ._process import tied

MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_FILES = 100_000
HOUSEKEEPING_S = 86400
"""Old captures are dropped, and the repository packed, once a day at most."""


ATTRIBUTES = "* -text -eol -filter -ident -working-tree-encoding\n"
"""The shadow repository's own attributes, which outrank the project's: bytes are captured
and written back as they are, never converted (line endings, encodings, ``$Id$``) nor passed
through a filter program (a ``.gitattributes`` the model wrote, naming one the user's git
configuration defines)."""


@attrs.frozen(kw_only=True)
class Capture:
    commit: str
    skipped: tuple[str, ...] = ()
    """Files left out: larger than the limit."""


@attrs.frozen(kw_only=True)
class Change:
    status: str
    """``A`` (added), ``M`` (modified), ``D`` (deleted) or ``T`` (its kind changed)."""
    path: str


def _without_git_variables() -> dict[str, str]:
    """forged's environment without ``GIT_*``: the user's own (a ``GIT_DIR`` set in the
    shell, say) must not steer the shadow repository's git."""
    return {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}


def repository_for(agent_dir: Path, workspace: Path) -> Path:
    """The shadow repository of `workspace`, keyed by its real path."""
    key = hashlib.sha256(os.path.realpath(workspace).encode()).hexdigest()[:24]
    return agent_dir / "checkpoints" / key


class Shadow:
    """The shadow repository of one workspace."""

    def __init__(self, agent_dir: Path, workspace: Path, *,
                 max_file_bytes: int = MAX_FILE_BYTES, max_files: int = MAX_FILES) -> None:
        self.workspace = Path(os.path.realpath(workspace))
        self.git_dir = repository_for(agent_dir, workspace)
        agent = Path(os.path.realpath(agent_dir))
        if agent == self.workspace:  # (its own checkpoints, at least)
            agent /= "checkpoints"
        self.left_out = (os.fsencode(agent.relative_to(self.workspace)) + b"/"
                         if agent.is_relative_to(self.workspace) else None)
        """The agent folder, relative to the workspace, when it lies in it."""
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files

    # --- git ---------------------------------------------------------------------------------

    def _env(self, index: Path | None = None) -> dict[str, str]:
        env = _without_git_variables()
        env |= {"GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.workspace),
                "GIT_AUTHOR_NAME": "forged", "GIT_AUTHOR_EMAIL": "forged@localhost",
                "GIT_COMMITTER_NAME": "forged", "GIT_COMMITTER_EMAIL": "forged@localhost",
                "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        return env

    def _git(self, *args: str, index: Path | None = None, stdin: bytes | None = None,
             env: dict[str, str] | None = None, work_tree: Path | None = None) -> bytes:
        if work_tree is not None:
            env = self._env(index) | {"GIT_WORK_TREE": str(work_tree)}
        env = env or self._env(index)
        try:
            argv, preexec = tied(["git", *args], cwd=self.workspace, env=env)
            done = subprocess.run(argv, input=stdin, capture_output=True, env=env,
                                  cwd=self.workspace, check=False, preexec_fn=preexec)
        except FileNotFoundError:
            raise CheckpointError("checkpoints need git, which is not installed: install "
                                  "the git package") from None
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()
            raise CheckpointError(f"git {args[0]} failed: {said}")
        return done.stdout

    def _ensure(self) -> None:
        """Make the repository, once, whoever else is making it."""
        if (self.git_dir / "ready").exists():
            if not (self.git_dir / "info" / "attributes").exists():  # (one made before)
                _write_whole(self.git_dir / "info" / "attributes", ATTRIBUTES)
            return
        self.git_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.git_dir.parent / f"{self.git_dir.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (self.git_dir / "ready").exists():
                return
            self._git("init", "--quiet", "--bare", str(self.git_dir),
                      env=_without_git_variables())
            for key, value in (("core.autocrlf", "false"), ("core.symlinks", "true"),
                               ("core.fileMode", "true"), ("gc.auto", "0"),
                               ("core.bare", "false"), ("core.untrackedCache", "true"),
                               ("core.looseCompression", "0"), ("pack.compression", "1")):
                self._git("config", key, value)
            (self.git_dir / "info").mkdir(exist_ok=True)
            (self.git_dir / "info" / "exclude").write_text(".git\n")
            _write_whole(self.git_dir / "info" / "attributes", ATTRIBUTES)
            (self.git_dir / "workspace").write_text(str(self.workspace) + "\n")
            (self.git_dir / "ready").write_text("")

    # --- capturing ---------------------------------------------------------------------------

    def capture(self, owner: str, message: str = "checkpoint",
                previous: str | None = None) -> Capture:
        """Commit every file git would not ignore, through `owner`'s own index (a session's:
        files unchanged since its last capture are not read again); `previous`, a capture
        whose tree is the same, is returned instead of a new commit. `CheckpointError` when
        it cannot be (more than `max_files` files, git missing, a disk full)."""
        self._ensure()
        index = self.git_dir / "indexes" / owner
        index.parent.mkdir(exist_ok=True)
        # New files, and files changed or gone since this index last saw them: two walks,
        # side by side (each stats the tree; neither reads a file it need not).
        # git's exclude spares the walk the agent folder; `_left_out` below is what decides
        # (a pattern reads `*` or `[` in a folder's name as a wildcard).
        exclude = [] if self.left_out is None else [
            f"--exclude=/{os.fsdecode(self.left_out)}"]
        walks = [("ls-files", "-z", "--others", "--exclude-standard", *exclude),
                 ("diff-files", "--name-only", "-z")]
        if self.left_out is not None:  # what an index holds from before that rule
            walks.append(("ls-files", "-z", "--cached", "--",
                          f":(top,literal){os.fsdecode(self.left_out)}"))
        others, *listed = _side_by_side(
            [partial(self._git, *args, index=index) for args in walks])
        new_names = self._untracked(others, b"")
        changed = {name for names in listed for name in names.split(b"\0") if name}
        count = _index_entries(index) + len(new_names)
        if count > self.max_files:
            raise CheckpointError(
                f"the workspace has {count:,} files, more than checkpoints.maxFiles "
                f"({self.max_files:,}); it is not captured")
        changed.update(new_names)
        update: list[bytes] = []
        dropped: list[bytes] = []
        skipped: list[str] = []
        for name in sorted(changed):
            info = None if self._left_out(name) else _present(self.workspace, name)
            if info is None or stat.S_ISDIR(info.st_mode):
                dropped.append(name)  # gone, out of reach behind a link, or a folder now
            elif info.st_size > self.max_file_bytes and not stat.S_ISLNK(info.st_mode):
                skipped.append(os.fsdecode(name))
                dropped.append(name)
            else:
                update.append(name)
        # Removals first, then additions that replace what stands in their way: a file
        # where a folder's files were (`rm -rf d && touch d`), or the reverse.
        if dropped:
            self._git("update-index", "--force-remove", "-z", "--stdin", index=index,
                      stdin=b"\0".join(dropped) + b"\0")
        if update:
            self._git("update-index", "--add", "--replace", "-z", "--stdin", index=index,
                      stdin=b"\0".join(update) + b"\0")
        tree = self._git("write-tree", index=index).strip().decode()
        if previous is not None and self.tree_of(previous) == tree:
            return Capture(commit=previous, skipped=tuple(skipped))
        commit = self._git("commit-tree", tree, "-m", message).strip().decode()
        self._keep(commit)
        return Capture(commit=commit, skipped=tuple(skipped))

    def _untracked(self, listed: bytes, folder: bytes) -> list[bytes]:
        """The files `git ls-files --others` listed under `folder` (relative to the workspace),
        and those of the nested repositories it listed as folders (``vendor/lib/``): git
        does not look inside one, so each is listed on its own, as a work tree of the shadow
        repository with no index yet (its files are in none: git would have walked into it)."""
        found: list[bytes] = []
        for name in listed.split(b"\0"):
            if not name or self._left_out(folder + name):
                continue
            if not name.endswith(b"/"):
                found.append(folder + name)
                continue
            nested = folder + name
            with tempfile.TemporaryDirectory(dir=self.git_dir) as scratch:
                inner = self._git("ls-files", "-z", "--others", "--exclude-standard",
                                  index=Path(scratch) / "index",
                                  work_tree=self.workspace / os.fsdecode(nested))
            found.extend(self._untracked(inner, nested))
        return found

    def _left_out(self, name: bytes) -> bool:
        return self.left_out is not None and name.startswith(self.left_out)

    def _keep(self, commit: str) -> None:
        """A ref named after `commit` keeps it, written as git writes a loose ref but
        without a process: to a file of this writer's own, renamed into place (two sessions
        that capture the same files in the same second make the same commit, and both may
        write its ref: each write is whole)."""
        ref = self.git_dir / "refs" / "forged" / commit
        ref.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(ref, commit + "\n")

    def tree_of(self, commit: str) -> str:
        return self._git("rev-parse", f"{commit}^{{tree}}").strip().decode()

    # --- reading -----------------------------------------------------------------------------

    def changes(self, older: str, newer: str) -> list[Change]:
        """What changed from the capture `older` to `newer`, file by file."""
        out = self._git("diff-tree", "-r", "-z", "--no-renames", "--name-status", older, newer)
        fields = [field for field in out.split(b"\0") if field]
        return [Change(status=fields[i].decode()[0], path=os.fsdecode(fields[i + 1]))
                for i in range(0, len(fields) - 1, 2)]

    def diff(self, older: str, newer: str) -> str:
        """A unified diff between two captures; binary files are named, not shown."""
        return self._git("diff-tree", "-r", "-p", "--no-renames", "--no-color",
                         "--no-ext-diff", older, newer).decode(errors="replace")

    # --- restoring ---------------------------------------------------------------------------

    def restore(self, target: str, current: str) -> list[Change]:
        """Make the workspace's captured files what they were at `target`, given `current`,
        a capture of them now: files changed since are written back (content, executable
        bit, symbolic links), files created since removed. Returns what changed."""
        changes = self.changes(target, current)
        back = [change.path for change in changes if change.status != "A"]
        for change in changes:
            if change.status == "A":
                created = self.workspace / change.path
                info = _present(self.workspace, os.fsencode(change.path))
                if info is not None and not stat.S_ISDIR(info.st_mode):
                    created.unlink()
                _prune_empty(created.parent, self.workspace)
        if back:
            with tempfile.TemporaryDirectory(dir=self.git_dir) as scratch:
                index = Path(scratch) / "index"
                for name in back:  # a file in the way of a folder, or the reverse
                    _clear_for(self.workspace / name, self.workspace)
                self._git("read-tree", target, index=index)
                self._git("checkout-index", "-f", "-z", "--stdin", index=index,
                          stdin=b"\0".join(os.fsencode(path) for path in back) + b"\0")
        return changes


def _side_by_side(calls: list[Callable[[], bytes]]) -> list[bytes]:
    """Each of `calls` in a thread of its own, at once; their results in order, or the first
    one's failure. Plain threads, not concurrent.futures': its executor's lock, which it also
    takes around every fork, came out released under a ``submit`` while a git was forked
    beside it (``RuntimeError: release unlocked lock``)."""
    results: list[bytes | BaseException] = [b""] * len(calls)

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except BaseException as exc:  # handed to the caller
            results[index] = exc

    threads = [threading.Thread(target=run, args=(index,)) for index in range(1, len(calls))]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [result for result in results if isinstance(result, bytes)]


def _write_whole(path: Path, text: str) -> None:
    """Write `path` through a file of its own renamed into place: a reader never sees it half
    written."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    partial.write_text(text)
    partial.replace(path)


def _index_entries(index: Path) -> int:
    """How many entries an index file holds (its header's count; 0 for none yet)."""
    try:
        with index.open("rb") as file:
            header = file.read(12)
    except FileNotFoundError:
        return 0
    return int.from_bytes(header[8:12], "big") if header[:4] == b"DIRC" else 0


def _prune_empty(folder: Path, top: Path) -> None:
    """Remove `folder` and the folders above it up to `top` while they are empty."""
    while folder != top and top in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _present(top: Path, name: bytes) -> os.stat_result | None:
    """`name`'s own status (a link's, not its target's), or None when it is gone or lies
    behind something that is not a folder: a link (whatever it points to is not the
    workspace's) or a file."""
    *folders, last = name.split(b"/")
    place = top
    try:
        for part in folders:
            place /= os.fsdecode(part)
            if not stat.S_ISDIR(place.lstat().st_mode):
                return None
        return (place / os.fsdecode(last)).lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _clear_for(path: Path, top: Path) -> None:
    """Make way for writing the file `path`, never through a link: a link or a file where
    one of its folders goes, and a folder where it goes, are removed (they were made since
    the capture)."""
    for parent in reversed(path.relative_to(top).parents):
        place = top / parent
        if place == top:
            continue
        try:
            mode = place.lstat().st_mode
        except FileNotFoundError:
            return  # nothing below it either
        if not stat.S_ISDIR(mode):
            place.unlink()
            return
    try:
        if stat.S_ISDIR(path.lstat().st_mode):
            shutil.rmtree(path)
    except FileNotFoundError:
        pass


def due(agent_dir: Path, workspace: Path) -> bool:
    """Whether `workspace` has a shadow repository not housekept for a day."""
    git_dir = repository_for(agent_dir, workspace)
    try:
        return (git_dir / "ready").exists() and (
            time.time() - (git_dir / "housekept").stat().st_mtime >= HOUSEKEEPING_S)
    except FileNotFoundError:
        return True


def housekeep(agent_dir: Path, workspace: Path, keep_days: float) -> int:
    """Drop the captures of `workspace` older than `keep_days` and pack what is left (git's
    own grace keeps objects a capture under way still needs); how many were dropped. For a
    worker thread, never the loop."""
    shadow = Shadow(agent_dir, workspace)
    if not due(agent_dir, workspace):
        return 0
    (shadow.git_dir / "housekept").write_text("")
    cutoff = time.time() - keep_days * 86400
    listed = shadow._git("for-each-ref", "--format=%(refname) %(committerdate:unix)",
                         "refs/forged/").decode().splitlines()
    old = [line.split()[0] for line in listed if line and int(line.split()[1]) < cutoff]
    if old:
        shadow._git("update-ref", "--stdin",
                    stdin="".join(f"delete {ref}\n" for ref in old).encode())
    shadow._git("gc", "--quiet")
    return len(old)
