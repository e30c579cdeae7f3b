"""The sandbox: the bubblewrap policy that confines what the model starts, and whether it can
work on this machine.

A confined command sees the whole filesystem read-only but for the workspace (when the mode lets
it write), the run's temp folder and the writable roots the settings add; inside the workspace,
``.agent-forge/``, ``.git/hooks/`` and ``.git/config`` stay read-only, so a model can neither
trust itself nor plant a hook, while the rest of ``.git`` is writable and commits work, and so
does forged's runtime folder wherever it is (the folders above such a path, up to the writable
root, are mount points, so none can be renamed to put a new one in its place); where
``.agent-forge/`` or ``.git/hooks/`` does not exist yet, an empty read-only folder stands in its
place (and stays, empty, afterwards). What ``sandbox.denyRead`` names is hidden (an empty
read-only tmpfs over a folder, an empty file over a file). It has its own PID namespace, so
killing bubblewrap ends everything the command forked, and its own network namespace with
loopback only unless the network is allowed. There is no fallback: where bubblewrap is missing
or cannot make namespaces, `problem` says why and what to do, and nothing runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs

PROTECTED = (".agent-forge", ".git/hooks", ".git/config")
"""Paths in the workspace a confined command may never write."""
EMPTY_WHEN_MISSING = (".agent-forge", ".git/hooks")
"""Protected folders that do not exist yet: an empty read-only folder stands there while a
command runs, so it cannot create one (bubblewrap leaves the empty folder behind)."""
DEFAULT_DENY_READ = ("~/.ssh", "~/.gnupg", "~/.aws", "~/.config/gcloud")
PROBE_TIMEOUT_S = 10


@attrs.frozen(kw_only=True)
class Policy:
    """What one confined command may do."""

    workspace: Path
    """The session's cwd."""
    temp: Path
    """The folder forged gives the run for temporary files (``TMPDIR`` inside)."""
    write_workspace: bool = True
    """False in ``read-only``: only `temp` is writable."""
    writable_roots: tuple[Path, ...] = ()
    read_only: tuple[Path, ...] = ()
    """forged's own folders, read-only even inside a writable root: the runtime folder (the
    daemon's socket, the code forged's next start runs)."""
    deny_read: tuple[Path, ...] = ()
    network: bool = False
    cwd: Path | None = None
    """Where the command starts (default: the workspace)."""

    def bwrap_args(self) -> list[str]:
        """bubblewrap's arguments for this policy, up to the command."""
        args = ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--ro-bind", "/", "/", "--dev", "/dev",
                "--proc", "/proc"]
        if not self.network:
            args.append("--unshare-net")
        writable = [self.temp, *self.writable_roots]
        if self.write_workspace:
            writable.insert(0, self.workspace)
        roots = [root.resolve() for root in writable]
        for root in roots:
            args += ["--bind", str(root), str(root)]
        workspace = self.workspace.resolve()
        kept: list[list[str]] = []  # what stays read-only, and how
        for folder in self.read_only:
            real = str(folder.resolve())
            kept.append(["--ro-bind", real, real])
        for relative in PROTECTED:
            path = workspace / relative
            if path.exists():
                real = str(path.resolve())
                kept.append(["--ro-bind", real, real])
            elif self.write_workspace and relative in EMPTY_WHEN_MISSING and (
                    path.parent.is_dir() and not path.parent.is_symlink()):
                kept.append(["--tmpfs", str(path), "--remount-ro", str(path)])
        for folder in _pins([Path(how[-1]) for how in kept], roots):
            args += ["--bind", str(folder), str(folder)]
        for how in kept:
            args += how
        for denied in self.deny_read:
            path = denied.expanduser()
            if path.is_dir():
                real = str(path.resolve())
                args += ["--tmpfs", real, "--remount-ro", real]
            elif path.exists():
                args += ["--ro-bind", "/dev/null", str(path.resolve())]
        start = self.cwd.resolve() if self.cwd is not None else workspace
        args += ["--setenv", "TMPDIR", str(self.temp.resolve()), "--chdir", str(start)]
        return args

    def wrap(self, bwrap: str, command: Sequence[str]) -> list[str]:
        """`command` run under this policy by the bubblewrap at `bwrap`."""
        return [bwrap, *self.bwrap_args(), "--", *command]


def _pins(kept: list[Path], roots: list[Path]) -> list[Path]:
    """Each folder between a writable root and a path kept read-only in it, outermost first:
    bound onto itself, it is a mount point, which cannot be renamed, so no command can move
    it away with the kept path inside and make a new one in its place (``mv .git .git2`` and
    a fresh ``.git/hooks``)."""
    pins = {folder for path in kept for root in roots if path.is_relative_to(root)
            for folder in path.parents
            if folder.is_relative_to(root) and folder != root and folder.is_dir()}
    return sorted(pins, key=lambda folder: len(folder.parts))


def problem(bwrap: str | None = None) -> str | None:
    """Why the sandbox cannot work here, and what to do about it; None when it works. Tries
    bubblewrap once with the namespaces a confined command gets."""
    if not sys.platform.startswith("linux"):
        return (f"the sandbox needs Linux with bubblewrap; this system is {sys.platform}: "
                "use --permission-mode full-access or ask")
    found = bwrap or shutil.which("bwrap")
    if found is None:
        return ("the sandbox needs bubblewrap (bwrap), which is not installed: install the "
                "bubblewrap package (apt install bubblewrap, dnf install bubblewrap)")
    trial = Policy(workspace=Path("/"), temp=Path(tempfile.gettempdir()), write_workspace=False)
    try:
        done = subprocess.run(
            trial.wrap(found, ["true"]), capture_output=True,
            timeout=PROBE_TIMEOUT_S, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({found}) could not be run: {exc}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        return (f"bubblewrap cannot make the sandbox's namespaces here ({said}); where "
                "unprivileged user namespaces are restricted (Ubuntu 24.04's AppArmor rule, "
                "kernel.unprivileged_userns_clone=0), allow them for bwrap or run forged "
                "where they are allowed")
    return None
