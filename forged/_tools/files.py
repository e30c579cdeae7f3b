"""The file tools: ``read``, ``write``, ``edit`` and ``ls``."""

from __future__ import annotations

import base64
import io
import os
import stat
import unicodedata
from functools import partial
from pathlib import Path
from typing import BinaryIO

import attrs
import trio

from .. import _wire as w
from .base import (
    MAX_BYTES,
    MAX_LINES,
    ToolContext,
    ToolError,
    format_size,
    listing_result,
    param,
    resolve_path,
    text_result,
    truncate_head,
    typed_tool,
)

LIMIT_TEXT = f"{MAX_LINES} lines or {MAX_BYTES // 1024}KB"


def _not_found(path: Path) -> ToolError:
    return ToolError(f"ENOENT: no such file or directory, access '{path}'")


# --- read --------------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class ReadParams:
    path: str = param("Path to the file (relative or absolute)")
    offset: int | None = param("Line number to start from (1-indexed)", None)
    limit: int | None = param("Maximum number of lines to read", None)


def image_type(head: bytes) -> str | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


READ_CHUNK_BYTES = 1 << 20


def _newline_offsets(file: BinaryIO, wanted: list[int]) -> tuple[list[int | None], int, int]:
    """One pass over `file` in chunks (memory stays bounded however large it is): the byte
    offset of the n-th newline for each n of `wanted` (None past the end), the file's size
    and its number of newlines."""
    found: list[int | None] = [None] * len(wanted)
    newlines = offset = 0
    while chunk := file.read(READ_CHUNK_BYTES):
        count = chunk.count(b"\n")
        for index, n in enumerate(wanted):
            if found[index] is None and 0 < n <= newlines + count:
                position = -1
                for _ in range(n - newlines):
                    position = chunk.find(b"\n", position + 1)
                found[index] = offset + position
        newlines += count
        offset += len(chunk)
    return found, offset, newlines


def _read_text(file: BinaryIO, params: ReadParams) -> w.ToolResult:
    """Lines as ``text.split("\\n")`` gives them, `params.offset` (1-based) to the `limit`-th
    after it, cut by `truncate_head`; read in two passes, keeping only what a result shows."""
    start = max(0, (params.offset or 1) - 1)
    end = start + params.limit if params.limit is not None else None
    wanted = [start, start + 1] + ([end] if end is not None else [])
    offsets, size, newlines = _newline_offsets(file, wanted)
    total = newlines + 1
    if params.offset is not None and start >= total:
        raise ToolError(f"Offset {params.offset} is beyond end of file ({total} lines total)")
    begin = 0 if start == 0 else (offsets[0] or 0) + 1
    first_end = offsets[1] if offsets[1] is not None else size
    finish = offsets[2] if end is not None and offsets[2] is not None else size
    end = min(total, end) if end is not None else total
    # Enough of the selection to cut it where the whole would be cut: whole lines within
    # MAX_BYTES, and the line that crosses it (or the one past MAX_LINES) begun.
    file.seek(begin)
    shown = file.read(min(finish - begin, MAX_BYTES + 1)).decode("utf-8", "replace")
    selected, truncation = truncate_head(shown)
    truncation.total_lines, truncation.total_bytes = end - start, finish - begin
    first = start + 1
    if truncation.first_line_exceeds_limit:
        return text_result(
            f"[Line {first} is {format_size(first_end - begin)}, exceeds "
            f"{format_size(MAX_BYTES)} limit. Use bash: "
            f"sed -n '{first}p' {params.path} | head -c {MAX_BYTES}]",
            {"truncation": truncation.details()})
    if truncation.truncated:
        last = start + truncation.output_lines
        by_bytes = truncation.truncated_by == "bytes"
        limit_note = f" ({format_size(MAX_BYTES)} limit)" if by_bytes else ""
        return text_result(
            f"{selected}\n\n[Showing lines {first}-{last} of {total}{limit_note}. "
            f"Use offset={last + 1} to continue.]",
            {"truncation": truncation.details()})
    if end < total and params.limit is not None:
        return text_result(
            f"{selected}\n\n[{total - end} more lines in file. Use offset={end + 1} to continue.]")
    return text_result(selected)


def _open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading, if it is a regular file: a FIFO or a device could block a
    read for ever or never end."""
    if not path.exists():
        raise _not_found(path)
    if path.is_dir():
        raise ToolError(f"EISDIR: illegal operation on a directory, read '{path}'")
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ToolError(f"Not a regular file: '{path}' (a FIFO, socket or device is not read)")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def _read_sync(params: ReadParams, path: Path) -> w.ToolResult:
    with _open_regular(path) as file:
        head = file.read(4100)
        mime = image_type(head)
        if mime is not None:
            data = head + file.read()
            return w.ToolResult(content=[
                w.TextContent(text=f"Read image file [{mime}]"),
                w.ImageContent(data=base64.b64encode(data).decode(), mime_type=mime)])
        file.seek(0)
        return _read_text(file, params)


def _is_image(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return image_type(file.read(4100)) is not None
    except OSError:
        return False


async def readable(path: str, ctx: ToolContext) -> Path:
    """The path a tool reads for its argument `path`, as the permission mode allows."""
    resolved = resolve_path(path, ctx.cwd)
    return resolved if ctx.guard is None else await ctx.guard.read(resolved)


async def writable(path: str, ctx: ToolContext) -> Path:
    """The path a tool writes for its argument `path`, once the permission mode allows it."""
    resolved = resolve_path(path, ctx.cwd)
    return resolved if ctx.guard is None else await ctx.guard.write(resolved)


async def run_read(params: ReadParams, ctx: ToolContext) -> w.ToolResult:
    path = await readable(params.path, ctx)
    if ctx.files is not None and not await trio.to_thread.run_sync(_is_image, path):
        text = await ctx.files.read_text(path)
        return _read_text(io.BytesIO(text.encode()), params)
    # Abandoned on abort: the tool ends at once; the thread's read of a huge file finishes
    # alone, its result dropped.
    return await trio.to_thread.run_sync(_read_sync, params, path, abandon_on_cancel=True)


READ = typed_tool(
    name="read",
    snippet="Read file contents",
    description=(
        "Read the contents of a file. Supports text files and images (jpg, png, gif, webp); "
        f"images are returned as attachments. Text output is limited to {LIMIT_TEXT}, "
        "whichever comes first; use offset and limit to page through large files. "
        "When the output is cut, the notice at the end says which offset continues it."),
    params=ReadParams,
    run=run_read,
)


# --- write -------------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class WriteParams:
    path: str = param("Path to the file (relative or absolute)")
    content: str = param("Content to write to the file")


def read_file(path: Path) -> str:
    """`path`'s text, undecodable bytes replaced; `ToolError` when it cannot be read."""
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        raise ToolError(f"{exc.strerror}: {path}") from None


def write_file(path: Path, text: str) -> None:
    """`text` as `path`'s whole content, as written (no newline translation), its folders
    made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")


async def run_write(params: WriteParams, ctx: ToolContext) -> w.ToolResult:
    path = await writable(params.path, ctx)
    if ctx.files is None:
        await trio.to_thread.run_sync(write_file, path, params.content)
    else:  # the client writes; the folders are made here, as for the disk
        await trio.to_thread.run_sync(partial(path.parent.mkdir, parents=True, exist_ok=True))
        await ctx.files.write_text(path, params.content)
    units = len(params.content.encode("utf-16-le")) // 2
    return text_result(f"Successfully wrote {units} bytes to {params.path}")


WRITE = typed_tool(
    name="write",
    snippet="Create or overwrite files",
    description=(
        "Write content to a file. Creates the file if it does not exist and overwrites it if "
        "it does; parent directories are created. Use it for new files or complete rewrites."),
    params=WriteParams,
    run=run_write,
)


# --- edit --------------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class EditParams:
    path: str = param("Path to the file to edit (relative or absolute)")
    old_text: str = param("Exact text to find and replace")
    new_text: str = param("New text to replace the old text with")


_FUZZY = str.maketrans({
    **dict.fromkeys(map(chr, range(0x2018, 0x201C)), "'"),
    **dict.fromkeys(map(chr, range(0x201C, 0x2020)), '"'),
    **dict.fromkeys([*map(chr, range(0x2010, 0x2016)), "\u2212"], "-"),
    **dict.fromkeys(["\u00a0", *map(chr, range(0x2002, 0x200B)), "\u202f", "\u205f", "\u3000"],
                    " "),
})


def fuzzy(text: str) -> str:
    """The text as edit matches it when the exact text is not found."""
    text = unicodedata.normalize("NFKC", text)
    return "\n".join(line.rstrip() for line in text.split("\n")).translate(_FUZZY)


def diff_string(old: str, new: str, context: int = 4) -> tuple[str, int | None]:
    """A numbered line diff (``+n`` added, ``-n`` removed, `` n`` context, ``...`` elided)."""
    import difflib  # at the first edit, not at start-up

    before, after = old.split("\n"), new.split("\n")
    width = len(str(max(len(before), len(after))))
    out: list[str] = []
    first_changed: int | None = None
    groups = difflib.SequenceMatcher(None, before, after, autojunk=False).get_grouped_opcodes(
        context)
    elided = f" {'':>{width}} ..."
    last_end = 0
    for group in groups:
        if group[0][1] > last_end:
            out.append(elided)
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out.extend(f" {k + 1:>{width}} {before[k]}" for k in range(i1, i2))
                continue
            if first_changed is None:
                first_changed = j1 + 1
            out.extend(f"-{k + 1:>{width}} {before[k]}" for k in range(i1, i2))
            out.extend(f"+{k + 1:>{width}} {after[k]}" for k in range(j1, j2))
        last_end = group[-1][2]
    if out and last_end < len(before):
        out.append(elided)
    return "\n".join(out), first_changed


def _edited(params: EditParams, raw: str) -> tuple[str, w.ToolResult]:
    """The file's new text (its BOM and line endings kept) and the result, for `raw`."""
    bom = "\ufeff" if raw.startswith("\ufeff") else ""
    raw = raw.removeprefix(bom)
    crlf = "\r\n" in raw and raw.index("\r\n") == raw.find("\n") - 1
    content = raw.replace("\r\n", "\n")
    old_text = params.old_text.replace("\r\n", "\n")
    new_text = params.new_text.replace("\r\n", "\n")
    fuzzy_content, fuzzy_old = fuzzy(content), fuzzy(old_text)
    index = content.find(old_text) if old_text else -1
    base = content
    if index < 0:
        index = fuzzy_content.find(fuzzy_old) if fuzzy_old else -1
        if index < 0:
            raise ToolError(
                f"Could not find the exact text in {params.path}. The old text must match "
                "exactly including all whitespace and newlines.")
        base, old_text = fuzzy_content, fuzzy_old
    occurrences = fuzzy_content.count(fuzzy_old)
    if occurrences > 1:
        raise ToolError(
            f"Found {occurrences} occurrences of the text in {params.path}. The text must be "
            "unique. Please provide more context to make it unique.")
    updated = base[:index] + new_text + base[index + len(old_text):]
    if updated == content:
        raise ToolError(
            f"No changes made to {params.path}. The replacement produced identical content. "
            "This might indicate an issue with special characters or the text not existing as "
            "expected.")
    written = updated.replace("\n", "\r\n") if crlf else updated
    diff, first_changed = diff_string(content, updated)
    return bom + written, text_result(f"Successfully replaced text in {params.path}.",
                                      {"diff": diff, "firstChangedLine": first_changed})


def _edit_sync(params: EditParams, path: Path) -> w.ToolResult:
    if not path.is_file() or not os.access(path, os.R_OK | os.W_OK):
        raise ToolError(f"File not found: {params.path}")
    text, result = _edited(params, read_file(path))
    path.write_bytes(text.encode("utf-8"))
    return result


async def run_edit(params: EditParams, ctx: ToolContext) -> w.ToolResult:
    path = await writable(params.path, ctx)
    if ctx.files is None:
        return await trio.to_thread.run_sync(_edit_sync, params, path)
    text, result = _edited(params, await ctx.files.read_text(path))
    await ctx.files.write_text(path, text)
    return result


EDIT = typed_tool(
    name="edit",
    snippet="Make surgical edits to files (find exact text and replace)",
    description=(
        "Edit a file by replacing exact text. oldText must match exactly one place in the file "
        "(including whitespace and newlines); include enough surrounding lines to make it "
        "unique. Read the file first."),
    params=EditParams,
    run=run_edit,
)


# --- ls ----------------------------------------------------------------------------------------

@attrs.define(kw_only=True, eq=False, repr=False)
class LsParams:
    path: str = param("Directory to list (default: current directory)", ".")
    limit: int = param("Maximum number of entries (default 500)", 500)


def _ls_sync(params: LsParams, path: Path) -> w.ToolResult:
    if not path.exists():
        raise ToolError(f"Path not found: {path}")
    if not path.is_dir():
        raise ToolError(f"Not a directory: {path}")
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise ToolError(f"Cannot read directory: {exc}") from exc
    entries: list[str] = []
    for name in sorted(names, key=str.lower):
        try:
            entries.append(name + "/" if (path / name).is_dir() else name)
        except OSError:
            continue
    if not entries:
        return text_result("(empty directory)")
    limit = max(1, params.limit)
    details: w.JSONObject = {}
    notices: list[str] = []
    if len(entries) > limit:
        entries = entries[:limit]
        details["entryLimitReached"] = limit
        notices.append(f"{limit} entries limit reached. Use limit={limit * 2} for more")
    return listing_result(entries, notices, details)


async def run_ls(params: LsParams, ctx: ToolContext) -> w.ToolResult:
    return await trio.to_thread.run_sync(_ls_sync, params, await readable(params.path, ctx),
                                         abandon_on_cancel=True)


LS = typed_tool(
    name="ls",
    snippet="List directory contents",
    description=(
        "List a directory's entries, sorted alphabetically, dotfiles included, directories "
        f"marked with a trailing '/'. At most 500 entries by default (limit) and "
        f"{MAX_BYTES // 1024}KB of output."),
    params=LsParams,
    run=run_ls,
)
