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
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from . import _gitfolders, _seccomp
from ._errors import UnknownArchitecture, Unprotectable
from ._process import feed, open_feeds

EMPTY_WHEN_MISSING = (".agent-forge", ".git")
"""Protected folders that do not exist yet: an empty read-only folder stands there while a
command runs, so it cannot create one (bubblewrap leaves the empty folder behind; git reads an
empty ``.git`` as no repository and looks further up, as before)."""
DEFAULT_DENY_READ = ("~/.ssh", "~/.gnupg", "~/.aws", "~/.config/gcloud", "~/.config/gh",
                     "~/.git-credentials", "~/.netrc", "~/.npmrc", "~/.pypirc", "~/.docker",
                     "~/.kube")
X11_SOCKETS = Path("/tmp/.X11-unix")
MARK = "FORGED_SANDBOX"
"""Set in a confined command's environment by bubblewrap's own arguments, which is how the
daemon recognises a process in one of forged's sandboxes (`confined_peer`)."""
PROBE_TIMEOUT_S = 10


def socket_folders() -> tuple[Path, ...]:
    """The folders of the user's Unix sockets the sandbox hides: the user's runtime folder
    (``$XDG_RUNTIME_DIR``, ``/run/user/<uid>``: the session bus, the ssh and gpg agents,
    Wayland, PipeWire, systemd's user instance) and X11's socket folder."""
    found: dict[Path, None] = {}
    for folder in (os.environ.get("XDG_RUNTIME_DIR"), f"/run/user/{os.getuid()}",
                   str(X11_SOCKETS)):
        if folder and os.path.isabs(folder) and os.path.isdir(folder):
            found.setdefault(Path(os.path.realpath(folder)))
    return tuple(found)


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
    caches: tuple[Path, ...] = ()
    """Writable too, as `temp` is: folders of forged's own that no repository is in."""
    hidden: tuple[Path, ...] = ()
    """Folders behind an empty read-only tmpfs wherever they are (even inside a writable
    root): forged's runtime folder (the daemon's socket, ``ws-token``, the code forged's next
    start runs) and `socket_folders`."""
    deny_read: tuple[Path, ...] = ()
    network: bool = False
    unix_sockets: tuple[Path, ...] = ()
    """``sandbox.allowUnixSockets``: sockets bound in where they are, even inside a hidden
    folder. Naming any lifts the filter's refusal of ``socket(AF_UNIX)`` (`forged._seccomp`)."""
    cwd: Path | None = None
    """Where the command starts (default: the workspace)."""
    git_seen: set[Path] = attrs.field(factory=set, eq=False)
    """The git folders and ``.git`` files earlier commands' scans found, which stay kept;
    `bwrap_args` adds what it finds (a session's `forged._tools.guard.Guard` passes its
    own)."""

    def bwrap_args(self) -> list[str]:
        """bubblewrap's arguments for this policy, up to the command (the seccomp filter is
        a `forged._process.feed`); `forged._errors.UnknownArchitecture` where no filter is
        known. Reads the writable folders for git's, and writes the stand-in files their
        git folders lack (`git_policy`): call it off the event loop."""
        args = ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--ro-bind", "/", "/", "--dev", "/dev",
                "--proc", "/proc"]
        if not self.network:
            args.append("--unshare-net")
        writable = [self.temp, *self.caches, *self.writable_roots]
        if self.write_workspace:
            writable.insert(0, self.workspace)
        roots = [root.resolve() for root in writable]
        hidden = sorted({str(folder.resolve()) for folder in self.hidden if folder.is_dir()},
                        key=lambda folder: len(Path(folder).parts))  # outermost first
        for folder in hidden:  # first, so a writable root inside one is bound over it
            args += ["--tmpfs", folder]
        for root in roots:
            args += ["--bind", str(root), str(root)]
        kept, stand_ins = self._kept(roots[:1] if self.write_workspace else [])
        for pin in _pins([Path(path) for path in [*kept, *stand_ins, *hidden]], roots):
            args += ["--bind", str(pin), str(pin)]
        for kept_path in kept:
            args += ["--ro-bind", kept_path, kept_path]
        for stand_in in stand_ins:
            args += ["--tmpfs", stand_in, "--remount-ro", stand_in]
        for folder in hidden:  # again where a writable root's bind showed it
            if any(Path(folder).is_relative_to(root) for root in roots):
                args += ["--tmpfs", folder]
        for sock in self.unix_sockets:
            if sock.exists():
                args += ["--ro-bind", str(sock.resolve()), str(sock.resolve())]
        for folder in hidden:
            args += ["--remount-ro", folder]
        for denied in self.deny_read:
            path = denied.expanduser()
            if not path.exists():
                continue
            real = str(path.resolve())
            if any(real.startswith(folder.rstrip("/") + "/") or real == folder
                   for folder in hidden):
                continue  # hidden already (and nothing can be bound in a read-only tmpfs)
            if os.path.isdir(real):
                args += ["--tmpfs", real, "--remount-ro", real]
            else:
                args += ["--ro-bind", "/dev/null", real]
        start = self.cwd.resolve() if self.cwd is not None else self.workspace.resolve()
        program = _seccomp.program(unix_sockets=bool(self.unix_sockets))
        args += ["--setenv", "TMPDIR", str(self.temp.resolve()), "--setenv", MARK, "1",
                 "--seccomp", feed(program), "--chdir", str(start)]
        return args

    def _kept(self, workspace_root: list[Path]) -> tuple[list[str], list[str]]:
        """What is bound read-only where it is, and the missing folders an empty read-only
        one stands in for: ``.agent-forge``, and git's folders and ``.git`` files in the
        workspace (when writable) and the writable roots (`git_policy`); the run's temp
        folder is nobody's repository."""
        workspace = self.workspace.resolve()
        kept: list[str] = []
        stand_ins: list[str] = []
        if self.write_workspace:
            for relative in EMPTY_WHEN_MISSING:
                path = workspace / relative
                if path.is_symlink():
                    raise Unprotectable(
                        f"{path} is a symbolic link, which the sandbox cannot keep from being "
                        "replaced; make it a folder")
                if path.exists():
                    if relative == ".agent-forge":
                        kept.append(str(path.resolve()))
                elif path.parent.is_dir() and not path.parent.is_symlink():
                    stand_ins.append(str(path))

        def add(folder: _gitfolders.Kept) -> None:
            kept.extend(str(path) for path in folder.read_only)
            for path in folder.stand_ins:
                if path.name in _gitfolders.STAND_IN_FILES:
                    if path.exists():  # written before the command (`stand_in_files`)
                        kept.append(str(path))
                else:
                    stand_ins.append(str(path))
            for sub in folder.submodules:
                add(sub)

        git, gitfiles = git_policy([*workspace_root, *self.writable_roots], self.git_seen)
        for folder in git:
            add(folder)
        kept.extend(str(path) for path in gitfiles)
        return kept, stand_ins

    def wrap(self, bwrap: str, command: Sequence[str]) -> list[str]:
        """`command` run under this policy by the bubblewrap at `bwrap`."""
        return [bwrap, *self.bwrap_args(), "--", *command]


def _pins(kept: list[Path], roots: list[Path]) -> list[Path]:
    """Each folder between a writable root and a path kept read-only in it, outermost first:
    bound onto itself, it is a mount point, which cannot be renamed, so no command can move
    it away with the kept path inside and make a new one in its place (``mv .git .git2`` and
    a fresh ``.git/hooks``)."""
    pins: set[str] = set()
    for root in map(str, roots):
        prefix = root.rstrip("/") + "/"
        for path in map(str, kept):
            if path.startswith(prefix):
                parts = path[len(prefix):].split("/")[:-1]
                pins.update(prefix + "/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return sorted((Path(pin) for pin in pins if os.path.isdir(pin)),
                  key=lambda folder: len(folder.parts))


def git_policy(roots: Sequence[Path], seen: set[Path] | None = None
               ) -> tuple[tuple[_gitfolders.Kept, ...], tuple[Path, ...]]:
    """The git folders and ``.git`` files in the writable `roots` (`forged._gitfolders`), with
    their stand-in files written: those found now, those in `seen` (found by an earlier
    command's scan: a command may hide one behind more entries than a scan looks at), and
    the checkouts of submodules the git folders name. `seen` gets what was found.
    `forged._errors.Unprotectable` for a ``.git`` that is a symbolic link."""
    real_roots = [Path(os.path.realpath(root)) for root in roots]

    def writable(path: Path) -> bool:
        return any(path.is_relative_to(root) for root in real_roots)

    found = _gitfolders.find(real_roots)
    if found.links:
        raise Unprotectable(
            f"{found.links[0]} is a symbolic link, which the sandbox cannot keep from being "
            "replaced (with a repository whose config runs a program for the user's next "
            "git); make it a folder or a .git file")
    folders = dict.fromkeys(found.folders)
    gitfiles = dict.fromkeys(found.gitfiles)
    for path in seen or ():
        if path.name == ".git" and path.is_file() and not path.is_symlink():
            gitfiles.setdefault(path)
        elif path.is_dir() and not path.is_symlink():
            folders.setdefault(path)
    kept = []
    for folder in folders:
        if not writable(folder):
            continue  # read-only already
        if _gitfolders.is_git_folder(folder):
            found_here = _gitfolders.keep(folder)
            _gitfolders.stand_in_files(found_here)
            gitfiles.update(dict.fromkeys(_gitfolders.checkouts(found_here)))
        else:  # a ``.git`` that is no repository (yet): none may be made of it
            found_here = _gitfolders.Kept(folder, read_only=(folder,), stand_ins=())
        kept.append(found_here)
    if seen is not None:
        seen.update(folders, gitfiles)
    return tuple(kept), tuple(path for path in gitfiles if writable(path))


SO_PEERPIDFD = 77
"""``<asm-generic/socket.h>`` (Linux 6.5): a pidfd of the peer, which a pid number is not
(a pid freed and taken again names another process)."""
_MARK_ARGS = f"\0--setenv\0{MARK}\0".encode()
ANCESTRY_MAX = 4096


def confined_peer(fd: int) -> str | None:
    """Why the process at the other end of the Unix socket `fd` may be a confined one, or
    None when it is not: it descends from one of forged's sandboxes, which is what every
    process in one does (a sandbox is a PID namespace under a bubblewrap forged started, and
    whatever a confined command forks or leaves behind stays in it), and a sandbox's
    bubblewrap carries `MARK` in its arguments, which nothing inside can change. Fails
    closed: a peer whose pid the kernel cannot show here (another PID namespace beside
    ours), or that is gone before it was looked at, counts as confined."""
    sock = socket.socket(fileno=fd)
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        try:
            pidfd: int | None = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError:  # a kernel before 6.5: the pid alone
            pidfd = None
    finally:
        sock.detach()  # the fd stays the caller's
    try:
        return _confined_pid(int.from_bytes(creds[:4], sys.byteorder), pidfd)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _confined_pid(pid: int, pidfd: int | None) -> str | None:
    if pid <= 0:
        return "its process is in a PID namespace this daemon cannot see into"
    current = pid
    for _ in range(ANCESTRY_MAX):
        try:
            with open(f"/proc/{current}/cmdline", "rb") as file:
                if _MARK_ARGS in file.read():
                    return f"process {pid} runs in one of forged's sandboxes"
            with open(f"/proc/{current}/stat", "rb") as file:
                parent = int(file.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return f"process {pid} could not be looked at"
        if parent <= 1:
            break
        current = parent
    if pidfd is not None:  # still the process that connected, not a pid taken again
        try:
            signal.pidfd_send_signal(pidfd, 0)
        except OSError:
            return f"process {pid} ended before it could be looked at"
    return None


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
        argv = trial.wrap(found, ["true"])
    except UnknownArchitecture as exc:
        return (f"the sandbox's seccomp filter cannot be built here ({exc}); nothing runs "
                "unconfined in its place")
    try:
        done = run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({found}) could not be run: {exc}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        if "seccomp" in said.lower():
            return (f"the kernel refused the sandbox's seccomp filter ({said}); forged needs "
                    "a kernel with seccomp filters (CONFIG_SECCOMP_FILTER) to confine "
                    "commands")
        return (f"bubblewrap cannot make the sandbox's namespaces here ({said}); where "
                "unprivileged user namespaces are restricted (Ubuntu 24.04's AppArmor rule, "
                "kernel.unprivileged_userns_clone=0), allow them for bwrap or run forged "
                "where they are allowed")
    return None


def run(argv: Sequence[str], **options: Any) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run` for a command line holding feeds (`forged._process.feed`), as a
    bubblewrap one does: outside forged's loop (its probe, tests, benches)."""
    args, fds = open_feeds(argv)
    try:
        return subprocess.run(args, pass_fds=fds, check=False, **options)
    finally:
        for fd in fds:
            os.close(fd)
