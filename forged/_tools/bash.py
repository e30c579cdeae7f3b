"""The ``bash`` tool, and the process handling direct ``bash`` will share.

Each command runs in its own process group. Output is kept as a bounded rolling tail; once it
outgrows what a result can show, the whole of it goes to a 0600 temp file as well.
"""

from __future__ import annotations

import codecs
import os
import re
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import attrs
import trio

from .. import _wire as w
from .._process import Stopping, group_alive, is_cancellation, kill_process_group, open_process
from .._time import now_ms
from .base import (
    MAX_BYTES,
    MAX_LINES,
    ScratchDir,
    Shell,
    ToolContext,
    ToolError,
    format_size,
    param,
    text_result,
    truncate_tail,
    typed_tool,
)

GUARD = ('trap "kill -KILL 0" TERM; __forged_command=$1; shift; '
         'eval "$__forged_command" & wait $!')
"""What a POSIX shell runs: the command in a subshell, while the shell itself (the process
group's leader, so ``$$`` is still the group) waits for it and exits with its status. The
shell gets SIGTERM when forged's process ends, however it ends (`forged._process`), and
then kills its whole process group: no child of a command outlives a killed forged."""
POSIX_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})


def guarded(shell: Shell, command: str) -> list[str]:
    """`shell`'s argv for `command`, under `GUARD` when it is a POSIX shell (another one, say
    fish, only dies with forged itself)."""
    argv = shell.argv(command)
    if Path(argv[0]).name not in POSIX_SHELLS or argv[1:2] != ["-c"]:
        return argv
    return [argv[0], "-c", GUARD, argv[0], *argv[2:]]


EXIT_DRAIN_S = 0.5
"""After the shell exits, how long output from leftover background processes is still read."""
UPDATE_INTERVAL_S = 0.05
ROLLING_BYTES = 2 * MAX_BYTES
STRUCTURED_OUTPUT_BYTES = 1024 * 1024
"""How much of a command's output its result's ``structuredContent`` carries."""


class OutputSpool:
    """A command's output: the last `ROLLING_BYTES` in memory, everything in a file once large.

    Resource handling: the temp file is created on demand (in `scratch`, if given) and closed
    by `close`; it is kept (its path is in the result) so the full output can be read later,
    until `scratch` is removed.
    """

    def __init__(self, scratch: ScratchDir | None = None) -> None:
        self._scratch = scratch
        self.total_bytes = 0
        self.newlines = 0
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._file: IO[bytes] | None = None
        self.path: str | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> str:
        """Take a chunk; return it decoded (never a split UTF-8 character)."""
        self.total_bytes += len(data)
        self.newlines += data.count(b"\n")
        self._tail.append(data)
        self._tail_bytes += len(data)
        if self._file is None and self.total_bytes > MAX_BYTES:
            self._spill()
        elif self._file is not None:
            self._file.write(data)
        while self._tail_bytes - len(self._tail[0]) >= ROLLING_BYTES:
            self._tail_bytes -= len(self._tail.popleft())
        return self._decoder.decode(data)

    def _spill(self) -> None:
        directory = self._scratch.path() if self._scratch is not None else None
        descriptor, self.path = tempfile.mkstemp(prefix="forged-bash-", suffix=".log",
                                                 dir=directory)
        self._file = os.fdopen(descriptor, "wb")
        # Everything so far is still in memory: only once past MAX_BYTES is anything dropped.
        for piece in self._tail:
            self._file.write(piece)

    def full_output_path(self) -> str:
        """The temp file with the whole output, created now if it was not needed before."""
        if self._file is None:
            self._spill()
        assert self._file is not None and self.path is not None
        self._file.flush()
        return self.path

    def tail_text(self) -> str:
        data = b"".join(self._tail)
        if self.total_bytes > self._tail_bytes:
            # Trimmed at a chunk boundary: drop a partial leading UTF-8 sequence.
            while data and 0x80 <= data[0] < 0xC0:
                data = data[1:]
        return data.decode("utf-8", "replace")

    def whole_text(self, max_bytes: int) -> tuple[str, bool]:
        """The whole output, or when longer than `max_bytes` its first and last halves with
        the bytes left out between them; and whether any were."""
        if self._file is None:  # never spilled: all of it is in memory
            return b"".join(self._tail).decode("utf-8", "replace"), False
        assert self.path is not None
        self._file.flush()
        with open(self.path, "rb") as file:
            if self.total_bytes <= max_bytes:
                return file.read().decode("utf-8", "replace"), False
            half = max_bytes // 2
            head = file.read(half)
            file.seek(self.total_bytes - (max_bytes - half))
            tail = file.read()
        head_text = codecs.getincrementaldecoder("utf-8")("replace").decode(head)
        while tail and 0x80 <= tail[0] < 0xC0:
            tail = tail[1:]
        left_out = self.total_bytes - len(head) - (max_bytes - half)
        return (f"{head_text}\n\n[... {left_out} bytes omitted ...]\n\n"
                f"{tail.decode('utf-8', 'replace')}"), True

    @property
    def total_lines(self) -> int:
        return self.newlines + 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


@attrs.define(kw_only=True, eq=False, repr=False)
class Execution:
    """How a command ended."""

    exit_code: int | None
    timed_out: bool = False


def _environment(changes: Mapping[str, str | None] | None,
                 base: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """`base` (None: forged's environment) with `changes`; None for forged's as it is."""
    if not changes and base is None:
        return None
    env = dict(os.environ if base is None else base)
    for name, value in (changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


async def run_command(command: str, cwd: Path, spool: OutputSpool, *, timeout_s: float | None,
                      on_output: Callable[[str], None], shell: Shell | None = None,
                      wait_for_room: Callable[[], Awaitable[None]] | None = None,
                      env: Mapping[str, str | None] | None = None,
                      base_env: Mapping[str, str] | None = None,
                      argv: Sequence[str] | None = None,
                      stopping: Stopping | None = None) -> Execution:
    """Run `command` in its own process group, feeding output to `spool` and `on_output`
    (and, after each chunk, waiting for `wait_for_room`: a slow reader slows the command
    instead of filling memory). `env` changes `base_env` (forged's environment when None:
    the permission mode's policy, `forged._tools.environment`) for it (None: unset);
    `argv` is what runs instead of the shell's own (the command in the sandbox).

    Cancellation: the process group is killed (SIGTERM, then SIGKILL after a grace)
    before `Cancelled` propagates; nothing of it survives. The shell `GUARD` runs the command
    under answers SIGTERM by killing its whole group at once, so this is quick. With
    `stopping`, the group gets its SIGTERM and `Cancelled` propagates at once: the wait is
    `stopping`'s (before the run's ``agent_end``).
    """
    if not os.path.isdir(cwd):  # noqa: ASYNC240 (a stat; cheaper than a thread hop)
        raise ToolError(f"Working directory does not exist: {cwd}\nCannot execute bash commands.")
    process = await open_process(argv or guarded(shell or Shell(), command), cwd=cwd,
                                 env=_environment(env, base_env))
    assert process.stdout is not None
    output_closed = trio.Event()

    async def pump() -> None:
        assert process.stdout is not None
        try:
            async for chunk in process.stdout:
                on_output(spool.write(bytes(chunk)))
                if wait_for_room is not None:
                    await wait_for_room()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        output_closed.set()

    timed_out = handed = False
    try:
        with trio.move_on_after(timeout_s if timeout_s else float("inf")) as timeout_scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump)
                await process.wait()
                with trio.move_on_after(EXIT_DRAIN_S):
                    await output_closed.wait()
                nursery.cancel_scope.cancel()
        if timeout_scope.cancelled_caught:
            timed_out = True
            await kill_process_group(process, force=True)
    except BaseException as exc:
        # Handed over only while the group's id cannot name another group: its leader not
        # reaped, or something of the group left (in the drain after the leader's exit).
        if stopping is not None and is_cancellation(exc) and (
                not process.reaped or group_alive(process.pid)):
            stopping.stop(process)
            handed = True
        raise
    finally:
        if not handed:  # (else `stopping` closes its pipes once it has ended)
            if process.returncode is None or group_alive(process.pid):
                await kill_process_group(process)
            process.close()  # no checkpoint: an abort passing through needs none
    return Execution(exit_code=None if timed_out else process.returncode, timed_out=timed_out)


def format_output(spool: OutputSpool) -> tuple[str, w.JSONObject | None]:
    """The result text for the model: the tail, with a notice naming the full output file.

    The rolling tail holds more than a result shows, so whenever output was dropped from
    memory, `truncate_tail` reports it truncated too.
    """
    tail = spool.tail_text()
    text, truncation = truncate_tail(tail)
    if not truncation.truncated:
        return text or "(no output)", None
    path = spool.full_output_path()
    total = spool.total_lines
    start = total - truncation.output_lines + 1
    truncation.total_lines = total
    truncation.total_bytes = spool.total_bytes
    if truncation.last_line_partial:
        line_size = format_size(len(tail.rsplit("\n", 1)[-1].encode()))
        notice = (f"[Showing last {format_size(truncation.output_bytes)} of line {total} "
                  f"(line is {line_size}). Full output: {path}]")
    elif truncation.truncated_by == "lines":
        notice = f"[Showing lines {start}-{total} of {total}. Full output: {path}]"
    else:
        notice = (f"[Showing lines {start}-{total} of {total} ({format_size(MAX_BYTES)} limit). "
                  f"Full output: {path}]")
    return f"{text}\n\n{notice}", {"truncation": truncation.details(), "fullOutputPath": path}


@attrs.define(kw_only=True, eq=False, repr=False)
class BashParams:
    command: str = param("Bash command to execute")
    timeout: float | None = param("Timeout in seconds (optional, no default timeout)", None)


@attrs.define(kw_only=True, eq=False, repr=False)
class SandboxedBashParams(BashParams):
    escalate: str | None = param(
        "Only when the command cannot work in the sandbox (it needs the network, or to write "
        "outside the workspace): why it must run outside it. The user is asked first.", None)


async def run_bash(params: BashParams, ctx: ToolContext) -> w.ToolResult:
    argv = guarded(ctx.shell, params.command)
    if ctx.guard is not None:
        argv = await ctx.guard.command(argv, params.command,
                                       getattr(params, "escalate", None))
    spool = OutputSpool(ctx.scratch)
    last_update = -UPDATE_INTERVAL_S

    def on_output(_: str) -> None:
        nonlocal last_update
        now = trio.current_time()
        if now - last_update < UPDATE_INTERVAL_S:
            return
        last_update = now
        text, truncation = truncate_tail(spool.tail_text())
        ctx.update(w.ToolResult(content=[w.TextContent(text=text)], details={
            "truncation": truncation.details() if truncation.truncated else None,
            "fullOutputPath": spool.path}))

    # What a confined command left is looked at once it has ended (`after_command`): only an
    # unconfined one's end, on an abort, is left to the run.
    stopping = None if ctx.guard is not None and ctx.guard.sandboxed else ctx.stopping
    started = time.perf_counter()
    started_ns = time.time_ns()
    aside = ""
    try:
        execution = await run_command(params.command, ctx.cwd, spool, timeout_s=params.timeout,
                                      on_output=on_output, shell=ctx.shell, env=ctx.env,
                                      base_env=None if ctx.guard is None
                                      else ctx.guard.environment(), argv=argv,
                                      stopping=stopping)
        text, details = format_output(spool)
        whole, cut = (await trio.to_thread.run_sync(spool.whole_text, STRUCTURED_OUTPUT_BYTES)
                      if spool.path is not None  # on disk: read in a thread
                      else spool.whole_text(STRUCTURED_OUTPUT_BYTES))
    except BaseException as exc:  # an abort: a Cancelled, or the command's nursery's group of them
        if is_cancellation(exc):
            text, details = format_output(spool)
            ctx.aborted_result = text_result(f"{_ahead(text)}Command aborted", details)
        raise
    finally:
        spool.close()
        if stopping is None and ctx.guard is not None:  # even when aborted: what it left
            with trio.CancelScope(shield=True):  # must not run later
                aside = await ctx.guard.after_command(started_ns)
    if aside:
        text = f"{text}\n\n{aside}"
    if execution.timed_out:
        raise ToolError(f"{_ahead(text)}Command timed out after {params.timeout:g} seconds",
                        details)
    structured: w.JSONObject = {"output": whole, "truncated": cut}
    if cut and details is not None:
        structured["full_output_path"] = details["fullOutputPath"]
    structured["exit_code"] = execution.exit_code
    structured["wall_time_seconds"] = round(time.perf_counter() - started, 1)
    if execution.exit_code not in (0, None):
        raise ToolError(f"{text}\n\nCommand exited with code {execution.exit_code}", details,
                        structured)
    return text_result(text, details, structured)


def _ahead(text: str) -> str:
    """The output before a note that the command was stopped: one blank line between."""
    return "" if text == "(no output)" else f"{text.rstrip(chr(10))}\n\n"


BASH_DESCRIPTION = (
    "Execute a bash command in the current working directory. Returns stdout and stderr "
    f"merged. Output is cut to the last {MAX_LINES} lines or {MAX_BYTES // 1024}KB, "
    "whichever comes first; the full output is then saved to a temp file whose path is "
    "given. Optionally pass a timeout in seconds.")
BASH = typed_tool(
    name="bash",
    snippet="Execute bash commands (ls, grep, find, etc.)",
    description=BASH_DESCRIPTION,
    params=BashParams,
    run=run_bash,
)
SANDBOXED_BASH = typed_tool(
    name="bash",
    snippet=BASH.snippet,
    description=(
        f"{BASH_DESCRIPTION} Commands run in a sandbox: the filesystem is read-only but for "
        "the working directory (in auto mode) and $TMPDIR, and there is no network. When a "
        "command cannot work there, run it again with escalate saying why it must run "
        "outside; the user decides."),
    params=SandboxedBashParams,
    run=run_bash,
)
"""The bash tool of the sandboxed permission modes (`forged._tools.guard`)."""


# Patterns `re` compiles (and keeps) at their first use, not at start-up.
_ANSI = r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])"
_CONTROL = r"[\x00-\x08\x0b-\x1f\x7f\ufff9-\ufffb]"
_UNFINISHED_ANSI = r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?)?\Z"
HELD_ANSI_MAX_CHARS = 4096
"""An escape sequence still open after this much output is not one a terminal would wait for."""


def sanitize(text: str) -> str:
    """Terminal output as plain text: ANSI sequences, carriage returns and control characters
    other than tab and newline removed."""
    return re.sub(_CONTROL, "", re.sub(_ANSI, "", text))


class StreamSanitizer:
    """`sanitize` for output arriving in chunks: an escape sequence cut by a chunk's end is
    held until the next chunk completes it, so no piece of it shows as text (one never
    finished is dropped, as a terminal shows nothing of it)."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        text = self._held + text
        unfinished = re.search(_UNFINISHED_ANSI, text)
        if unfinished is not None and len(text) - unfinished.start() <= HELD_ANSI_MAX_CHARS:
            text, self._held = text[:unfinished.start()], text[unfinished.start():]
        else:
            self._held = ""
        return sanitize(text)


async def run_direct(command: str, cwd: Path, on_output: Callable[[str], None],
                     scope: trio.CancelScope, shell: Shell | None = None,
                     wait_for_room: Callable[[], Awaitable[None]] | None = None,
                     scratch: ScratchDir | None = None,
                     env: Mapping[str, str] | None = None,
                     changes: Mapping[str, str | None] | None = None
                     ) -> w.BashExecutionMessage:
    """A direct ``bash`` command (docs/protocol.md, Direct bash): no timeout, every chunk
    streamed, the kept output the tail; `env` is its environment (None: forged's), with
    `changes` (as a tool call's `ToolContext.env`).
    Cancelling `scope` kills the process group and gives a cancelled result instead of
    raising."""
    spool = OutputSpool(scratch)
    cancelled = False
    exit_code: int | None = None
    sanitizer = StreamSanitizer()

    def stream(text: str) -> None:
        clean = sanitizer.feed(text)
        if clean:
            on_output(clean)

    try:
        with scope:
            execution = await run_command(
                command, cwd, spool, timeout_s=None,
                on_output=stream, shell=shell, env=changes,
                wait_for_room=wait_for_room, base_env=env)
            exit_code = execution.exit_code
        cancelled = scope.cancelled_caught
        # As the deltas were: a sequence left unfinished at the end is dropped.
        text, truncation = truncate_tail(StreamSanitizer().feed(spool.tail_text()))
        truncated = truncation.truncated or spool.total_bytes > MAX_BYTES
        path = spool.full_output_path() if truncated else None
    finally:
        spool.close()
    return w.BashExecutionMessage(command=command, output=text, exit_code=exit_code,
                                  cancelled=cancelled, truncated=truncated,
                                  full_output_path=path, timestamp=now_ms())
