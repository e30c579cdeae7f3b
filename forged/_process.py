"""Processes forged starts: each in a process group of its own, told to end when forged ends,
and stopped as a whole group (SIGTERM, then SIGKILL after `KILL_GRACE_S`), so nothing a child
forks outlives it.

`open_process` is the one way a command or a server is started. Linux sends the signal a
child asked for with ``PR_SET_PDEATHSIG`` when the *thread* that started it exits, not the
process; trio starts processes in a worker thread that exits after ten idle seconds, which
killed any command that ran longer. So children are started by one thread that lives as long
as forged (`_Spawner`), and the loop waits for it without blocking. How a child asks for the
signal without forged forking is `tied`.

`run_value_command` runs a configuration's ``!command`` (an API key, a header, an MCP
server's value): in a group of its own, output capped, taken when the command exits even if a
child of it still holds the pipe, and the group stopped afterwards. It blocks: run it in a
worker thread, never on the loop.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import queue
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import trio

from ._errors import ValueCommandFailed
from ._log import log

KILL_GRACE_S = 2.0
"""SIGTERM first; the process group gets SIGKILL if anything is left after this long."""
GROUP_POLL_S = (0.001, 0.05)
"""How often a killed group is checked for members still running: from the first value,
doubling up to the second (no event tells when the leader's children are gone)."""
VALUE_TIMEOUT_S = 10.0
VALUE_MAX_BYTES = 1024 * 1024
"""A ``!command``'s output is its value up to this size; a longer one is refused."""
VALUE_EXIT_DRAIN_S = 0.1
"""After a ``!command`` exits, how long output still in flight is read."""
VALUE_POLL_S = 0.5
"""Where its exit cannot be waited for (no pidfd), how often it is looked at."""

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl


TIED_CHECK = ('case $PPID in "$0") ;; *) exit 126;; esac; '
              'case $1 in =*) PWD=${1#=}; export PWD;; *) unset PWD;; esac; shift; exec "$@"')
"""What ``/bin/sh`` runs between ``setpriv`` and the program (`tied`): the program only if
forged is still the parent (had forged ended before ``setpriv`` asked for the signal, none
would ever come); ``case``, which no function from the environment can stand in for. The
shell sets ``PWD``: the program gets the one it was given (``=value`` in ``$1``), or none."""


def tied(argv: Sequence[str], *, cwd: Path | str | None = None,
         env: Mapping[str, str] | None = None) -> tuple[list[str], Callable[[], None] | None]:
    """How `subprocess.Popen` starts `argv` so that it gets SIGTERM when forged (the thread
    starting it) ends: the command line and the ``preexec_fn``.

    With util-linux's ``setpriv``, the child asks for the signal after an exec, so Python
    starts it with vfork. A fork copies forged's page tables (~5 ms at 70 MB, the event loop
    held meanwhile) and leaves every page of forged copy-on-write: each page it next writes
    faults once (~140 of them, 0.3 ms, between an abort's SIGTERM and its ``agent_end``).
    Without ``setpriv`` the child is forked and asks before its exec (`_die_with_forged`).

    The program is looked up here, as `subprocess.Popen` looks it up (in `env`'s PATH, from
    `cwd`), and `FileNotFoundError` or `PermissionError` raised as it raises them; what runs
    is the file found. One the kernel cannot run (no ``#!`` line) is run by ``sh``, as
    ``execvp`` does, where `subprocess.Popen` would raise. Where ``/bin/sh`` is bash, the
    program's environment gains bash's ``SHLVL``."""
    setpriv = _setpriv()
    if setpriv is None:
        return list(argv), partial(_die_with_forged, os.getpid())
    environ = os.environ if env is None else env
    given_pwd = f"={environ['PWD']}" if "PWD" in environ else ""
    return [setpriv, "--pdeathsig", "TERM", "--", "/bin/sh", "-c", TIED_CHECK,
            str(os.getpid()), given_pwd, _found(argv[0], cwd, env), *argv[1:]], None


@functools.cache
def _setpriv() -> str | None:
    """util-linux's ``setpriv`` (found on PATH, as ``bwrap`` is), if it is here and sets the
    parent-death signal (2.33 on)."""
    path = shutil.which("setpriv")
    if path is None or not os.path.isabs(path):  # (not one a relative PATH entry found)
        return None
    try:
        done = subprocess.run([path, "--pdeathsig", "TERM", "--", "/bin/sh", "-c", ":"],
                              stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL, timeout=10,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"{path} does not start: every child is forked ({exc})")
        return None
    if done.returncode != 0:
        log(f"{path} cannot set the parent-death signal: every child is forked")
        return None
    return path


def _found(program: str, cwd: Path | str | None, env: Mapping[str, str] | None) -> str:
    """The file `program` names, as the child (in `cwd`) finds it; what `subprocess.Popen`
    raises where there is none it may run."""
    names = ([program] if os.path.dirname(program)
             else [os.path.join(directory, program) for directory in os.get_exec_path(env)])
    code = errno.ENOENT
    for name in names:
        path = os.path.join(cwd or "", name)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) and os.access(path, os.X_OK):
            return name if os.path.dirname(name) else os.path.join(".", name)  # (not looked up)
        code = errno.EACCES
    raise (PermissionError if code == errno.EACCES else FileNotFoundError)(
        code, os.strerror(code), program)


def _die_with_forged(forged_pid: int) -> None:
    """In a forked child, before exec: SIGTERM when forged ends (already ended: at once)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != forged_pid:
        os.kill(os.getpid(), signal.SIGTERM)


class _Spawner:
    """One thread, started on first use and living as long as the process, that forks every
    child: a child's parent-death signal then comes only when forged ends."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._started = False
        self._lock = threading.Lock()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()

    async def run(self, spawn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """`spawn()` on the spawner thread. Shielded: a fork is quick, and a child started
        while its caller was cancelled would have no owner."""
        with self._lock:
            if not self._started:
                threading.Thread(target=self._serve, name="forged-spawner", daemon=True).start()
                self._started = True
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        result: list[subprocess.Popen[bytes]] = []
        failure: list[BaseException] = []

        def job() -> None:
            try:
                result.append(spawn())
            except BaseException as exc:
                failure.append(exc)
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        self._jobs.put(job)
        with trio.CancelScope(shield=True):
            await done.wait()
        if failure:
            raise failure[0]
        return result[0]


_spawner = _Spawner()

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT

FEED_PREFIX = "\0forged-feed:"
"""Starts an argument `feed` made: no real argument can hold a NUL character."""
FEED_MAX_BYTES = 1 << 16
"""What a pipe holds before its reader reads: a feed is written whole before the child runs."""


def feed(data: bytes) -> str:
    """An argument that `open_process` (and `open_feeds`) replaces with the number of a file
    descriptor from which the child reads `data`: how a bubblewrap command line carries its
    seccomp filter (``--seccomp FD``) through every caller that starts it."""
    if len(data) > FEED_MAX_BYTES:
        raise ValueError(f"a feed holds at most {FEED_MAX_BYTES} bytes")
    return FEED_PREFIX + data.hex()


def open_feeds(argv: Sequence[str]) -> tuple[list[str], list[int]]:
    """`argv` with each `feed` replaced by a pipe's read end holding its data, and those
    ends: the caller passes them to the child (``pass_fds``) and closes them once it is
    started."""
    args, fds = list(argv), []
    try:
        for index, arg in enumerate(args):
            if arg.startswith(FEED_PREFIX):
                read, write = os.pipe()
                fds.append(read)
                try:
                    os.write(write, bytes.fromhex(arg[len(FEED_PREFIX):]))
                finally:
                    os.close(write)
                args[index] = str(read)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return args, fds


class Child:
    """A process `open_process` started: its pid (its process group's id too), its pipes as
    trio streams, and `wait`.

    Resource handling: the caller owns the process and its pipes; `kill_process_group` stops
    it and everything it forked, and `aclose` closes the pipes."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: trio.lowlevel.FdStream | None,
                 stdout: trio.lowlevel.FdStream | None,
                 stderr: trio.lowlevel.FdStream | None) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._wait_lock = trio.Lock()
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # an old kernel: a thread waits instead
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """Until the process has exited (it is reaped); its exit status."""
        async with self._wait_lock:
            if self._popen.poll() is None:
                if self._pidfd is not None:
                    await trio.lowlevel.wait_readable(self._pidfd)
                else:
                    await trio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)
            status = self._popen.wait()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return status

    @property
    def reaped(self) -> bool:
        return self._popen.returncode is not None

    def exited(self) -> bool:
        """Whether the process has exited, without reaping it: until `wait` or `reap`, its
        pid (and its group's id) name no other process."""
        if self.reaped:
            return True
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped by another waiter
            return True

    async def until_exited(self) -> None:
        """Until the process has exited, without reaping it (`exited`)."""
        if self._pidfd is None:  # an old kernel: reaped as it is waited for
            await self.wait()
            return
        while not self.exited():
            await trio.lowlevel.wait_readable(self._pidfd)

    def reap(self) -> int:
        """The exit status of a process that has `exited`, which is reaped now."""
        status = self._popen.wait()
        if self._pidfd is not None and not self._wait_lock.locked():
            os.close(self._pidfd)
            self._pidfd = None
        return status

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """`aclose` without its checkpoint: for a `finally` that a cancellation is already
        passing through (a checkpoint there costs two rounds of the scheduler)."""
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()


async def open_process(argv: Sequence[str], *, cwd: Path | str | None = None,
                       env: Mapping[str, str] | None = None, stdin: int = DEVNULL,
                       stdout: int = PIPE, stderr: int = STDOUT) -> Child:
    """Start `argv` in a process group of its own (its pid is the group's id), told to end
    when forged ends; each `feed` in it becomes a file descriptor the child reads. `stdin`,
    `stdout` and `stderr` are `PIPE` (a trio stream of the `Child`), `DEVNULL`, `STDOUT` (for
    stderr) or a file descriptor of ours."""
    ends: list[int] = []  # the child's ends of our pipes, closed here once it has them
    ours: dict[str, trio.lowlevel.FdStream] = {}

    def pipe(name: str, given: int, *, to_child: bool) -> int:
        if given != PIPE:
            return given
        read, write = os.pipe()
        child_end, our_end = (read, write) if to_child else (write, read)
        ends.append(child_end)
        ours[name] = trio.lowlevel.FdStream(our_end)
        return child_end

    try:
        stdin = pipe("stdin", stdin, to_child=True)
        stdout = pipe("stdout", stdout, to_child=False)
        if stderr == STDOUT and stdout == DEVNULL:
            stderr = DEVNULL
        stderr = pipe("stderr", stderr, to_child=False)

        def spawn() -> subprocess.Popen[bytes]:
            args, fed = open_feeds(argv)
            try:
                args, preexec = tied(args, cwd=cwd, env=env)
                return subprocess.Popen(args, cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                                        stderr=stderr, start_new_session=True, pass_fds=fed,
                                        preexec_fn=preexec)
            finally:
                for fd in fed:
                    os.close(fd)

        popen = await _spawner.run(spawn)
    except BaseException:
        for stream in ours.values():
            await stream.aclose()
        raise
    finally:
        for fd in ends:
            os.close(fd)
    return Child(popen, ours.get("stdin"), ours.get("stdout"), ours.get("stderr"))


def live_group_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that still run (zombies excluded: an init that never reaps
    leaves them in the group forever, and they hold nothing)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return []  # the common case, answered by one system call
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pgid]
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:  # one system call, not a file read
                continue
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                state = stat_file.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z":
            members.append(int(entry))
    return members


def group_alive(pgid: int) -> bool:
    return bool(live_group_members(pgid))


def _pidfds(pids: list[int]) -> list[int] | None:
    """A pidfd of each of `pids` still there; None where the kernel gives none."""
    found = []
    for pid in pids:
        try:
            found.append(os.pidfd_open(pid))
        except ProcessLookupError:  # gone already
            continue
        except (AttributeError, OSError):
            for fd in found:
                os.close(fd)
            return None
    return found


async def wait_group_gone(pgid: int) -> None:
    """Until no process of group `pgid` runs. Each member's end is waited for on a pidfd of
    it (an event, at once), then the group is looked at again (a member may have forked
    meanwhile); where pidfds cannot be had, the group is polled (`GROUP_POLL_S`)."""
    poll_s, longest_s = GROUP_POLL_S
    while members := live_group_members(pgid):
        watched = _pidfds(members)
        if watched is None:  # no pidfd here: poll
            await trio.sleep(poll_s)
            poll_s = min(poll_s * 2, longest_s)
            continue
        try:
            for fd in watched:
                await trio.lowlevel.wait_readable(fd)  # readable: the process has ended
        finally:
            for fd in watched:
                os.close(fd)


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def is_cancellation(exc: BaseException) -> bool:
    """True for `trio.Cancelled`, or a group made only of them (what a nursery raises when
    an abort cancels the tasks in it)."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(inner) for inner in exc.exceptions)
    return False


async def kill_process_group(process: Child, *, force: bool = False) -> None:
    """SIGTERM the process's group (SIGKILL with `force`), SIGKILL what is left after
    `KILL_GRACE_S`, whether or not the leader still lives. Waits for the group leader.
    Shielded: it finishes even when cancelled."""
    pgid = process.pid
    with trio.CancelScope(shield=True):
        signal_group(pgid, signal.SIGKILL if force else signal.SIGTERM)
        ends = _pidfds(live_group_members(pgid)) or []  # while they die: a scan's cost
        gone = False
        try:
            with trio.move_on_after(KILL_GRACE_S):
                await process.wait()
                for fd in ends:
                    await trio.lowlevel.wait_readable(fd)
                await wait_group_gone(pgid)  # at once, unless one forked or lingers
                gone = True  # (a scan of /proc where init leaves zombies: not done twice)
        finally:
            for fd in ends:
                os.close(fd)
        if not gone:  # the grace ran out
            signal_group(pgid, signal.SIGKILL)
            await process.wait()


class Stopping:
    """The commands an abort stopped, as the run they belong to ends: `stop` signals a
    command's process group at once and leaves the wait to the run, whose closing events
    are made while the command dies. `ended` (before the run's ``agent_end``) waits for each
    command's leader (SIGKILL to the group if it outlasts `KILL_GRACE_S`), then SIGKILLs
    what is left of its group: nothing of it runs another instruction. `gone` (before the
    session settles: before its closing checkpoint) waits until no process of those groups
    is left.

    Resource handling: what `stop` was given is waited for by `ended`, then `gone`, which
    reaps its leader and closes its pipes; both are shielded. A command the run never hands
    over is killed where it ran (`kill_process_group`)."""

    def __init__(self) -> None:
        self._stopped: list[Child] = []
        self._killed: list[Child] = []

    def stop(self, process: Child) -> None:
        signal_group(process.pid, signal.SIGTERM)
        self._stopped.append(process)

    def _ended_now(self) -> bool:
        """`ended`, where no leader is left to wait for: True then. (On the way to an
        abort's ``agent_end``: not even a round of the scheduler.)"""
        if not all(process.exited() for process in self._stopped):
            return False
        for process in self._stopped:  # (an unreaped leader, or what is left of the group,
            signal_group(process.pid, signal.SIGKILL)  # keeps the id the group's)
        self._killed += self._stopped
        self._stopped = []
        return True

    async def ended(self, before_waiting: Callable[[], None] = lambda: None) -> None:
        """Each stopped command's leader has ended and the rest of its group is killed;
        `before_waiting` is called first where one has not ended yet."""
        if self._ended_now():
            return
        before_waiting()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(KILL_GRACE_S):
                for process in self._stopped:
                    await process.until_exited()
            for process in self._stopped:
                if not process.exited():
                    signal_group(process.pid, signal.SIGKILL)
                    await process.until_exited()
        self._ended_now()

    async def gone(self) -> None:
        """No process of a group `ended` killed is left (each is waited for, for at most
        `KILL_GRACE_S`: one that cannot die, say in a hung disk's wait, is left to it)."""
        with trio.CancelScope(shield=True):
            while self._killed:
                process = self._killed.pop(0)
                with trio.move_on_after(KILL_GRACE_S):  # (the leader unreaped meanwhile: the
                    await wait_group_gone(process.pid)  # group's id names no other group)
                process.reap()
                process.close()


# --- a configuration's !command ----------------------------------------------------------------

def run_value_command(command: str, *, timeout_s: float = VALUE_TIMEOUT_S,
                      max_bytes: int = VALUE_MAX_BYTES) -> str:
    """The trimmed output of ``sh -c command``; `ValueCommandFailed` when it fails, prints
    nothing, runs past `timeout_s` or prints more than `max_bytes`.

    Resource handling: the command runs in a process group of its own, which gets SIGTERM
    once the command has exited (a child it left in the background ends with it) or timed
    out, and SIGKILL if anything is left after `KILL_GRACE_S`. Its value is taken when the
    command exits, even if such a child still holds the pipe. Blocks the calling thread."""
    # This thread waits until the command and its group have ended, so the parent-death
    # signal, tied to it, cannot come early.
    argv, preexec = tied(["/bin/sh", "-c", command])
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=preexec)
    assert process.stdout is not None
    output = bytearray()
    deadline = time.monotonic() + timeout_s
    drain_until: float | None = None
    failure: str | None = None
    try:
        exited = os.pidfd_open(process.pid)  # readable once the command has exited
    except (AttributeError, OSError):
        exited = None
    try:
        fd = process.stdout.fileno()
        while True:
            now = time.monotonic()
            if process.poll() is not None and drain_until is None:
                drain_until = now + VALUE_EXIT_DRAIN_S
            until = min(deadline, drain_until) if drain_until is not None else deadline
            if now >= until:
                if drain_until is None:
                    failure = f"it did not finish within {timeout_s:g} s"
                break
            waits = [fd] if exited is None or drain_until is not None else [fd, exited]
            ready, _, _ = select.select(waits, [], [], min(until - now, VALUE_POLL_S))
            if fd not in ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # every writer closed the pipe
                process.wait(max(0.0, deadline - time.monotonic()))
                break
            output += chunk
            if len(output) > max_bytes:
                failure = f"its output is over {max_bytes // 1024} KiB"
                break
    except subprocess.TimeoutExpired:
        failure = f"it did not finish within {timeout_s:g} s"
    finally:
        if exited is not None:
            os.close(exited)
        process.stdout.close()
        _stop_group(process)
    if failure is None and process.returncode != 0:
        failure = f"it exited with status {process.returncode}"
    value = output.decode("utf-8", "replace").strip()
    if failure is None and not value:
        failure = "it printed nothing"
    if failure is not None:
        raise ValueCommandFailed(failure)
    return value


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the group of `process`, SIGKILL after the grace what is left; reap it."""
    signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    poll_s = GROUP_POLL_S[0]
    while True:
        if process.poll() is None:
            pass
        elif not group_alive(process.pid):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
        poll_s = min(poll_s * 2, GROUP_POLL_S[1])
    signal_group(process.pid, signal.SIGKILL)
    try:
        process.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        log(f"a !command's process {process.pid} did not end after SIGKILL")
