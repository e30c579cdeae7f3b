"""The model's tools, called as the loop calls them, with the exact texts a model reads."""

from __future__ import annotations

import os
import re
import resource
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings, strategies as st

from forged import _wire as w
from forged._tools import (
    BUILTIN_NAMES,
    ToolContext,
    ToolError,
    builtin_tools,
    parse_arguments,
)
from forged._tools.base import MAX_BYTES, format_size, truncate_head, truncate_tail
from forged._tools.files import diff_string


async def call(name: str, cwd: Path, updates: list[w.ToolResult] | None = None,
               **arguments: Any) -> w.ToolResult:
    tool = builtin_tools()[name]
    context = ToolContext(cwd=cwd, update=(updates if updates is not None else []).append)
    return await tool.run(parse_arguments(tool, arguments), context)


def text(result: w.ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, w.TextContent)
    return block.text


def detail(result: w.ToolResult, *keys: str) -> object:
    """What the result's ``details`` hold under `keys`, one object in the next."""
    value: object = result.details
    for key in keys:
        assert isinstance(value, dict)
        value = value[key]
    return value


def detail_path(result: w.ToolResult) -> str:
    path = detail(result, "fullOutputPath")
    assert isinstance(path, str)
    return path


async def fails(name: str, cwd: Path, **arguments: Any) -> str:
    with pytest.raises(ToolError) as caught:
        await call(name, cwd, **arguments)
    return caught.value.text


# --- read --------------------------------------------------------------------------------------

def test_the_built_in_tools_are_the_ones_sessions_choose_by_name() -> None:
    assert tuple(builtin_tools()) == BUILTIN_NAMES


async def test_read_whole_file_and_pages(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("\n".join(f"line {i}" for i in range(1, 11)))
    assert text(await call("read", tmp_path, path="f.txt")).startswith("line 1\nline 2")
    paged = text(await call("read", tmp_path, path="f.txt", offset=3, limit=2))
    assert paged == "line 3\nline 4\n\n[6 more lines in file. Use offset=5 to continue.]"
    assert text(await call("read", tmp_path, path="@f.txt", offset="9")) == "line 9\nline 10"
    assert await fails("read", tmp_path, path="f.txt", offset=11) == (
        "Offset 11 is beyond end of file (10 lines total)")


async def test_read_truncates_by_lines_and_bytes(tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("\n".join(str(i) for i in range(1, 3001)))
    result = await call("read", tmp_path, path="long.txt")
    assert text(result).endswith("\n\n[Showing lines 1-2000 of 3000. Use offset=2001 to continue.]")
    assert detail(result, "truncation", "truncatedBy") == "lines"
    (tmp_path / "wide.txt").write_text("\n".join("x" * 100 for _ in range(1000)))
    wide = text(await call("read", tmp_path, path="wide.txt"))
    assert wide.endswith("\n\n[Showing lines 1-506 of 1000 (50.0KB limit). "
                         "Use offset=507 to continue.]")
    (tmp_path / "huge.txt").write_text("y" * 60_000 + "\nshort")
    assert text(await call("read", tmp_path, path="huge.txt")) == (
        "[Line 1 is 58.6KB, exceeds 50.0KB limit. Use bash: sed -n '1p' huge.txt | "
        "head -c 51200]")


def reference_read(data: bytes, offset: int | None, limit: int | None) -> str:
    """How read answered when it held the whole file: the oracle for the streaming read."""
    lines = data.decode("utf-8", "replace").split("\n")
    total = len(lines)
    start = max(0, (offset or 1) - 1)
    if offset is not None and start >= total:
        return f"Offset {offset} is beyond end of file ({total} lines total)"
    end = min(total, start + limit) if limit is not None else total
    selected, truncation = truncate_head("\n".join(lines[start:end]))
    first = start + 1
    if truncation.first_line_exceeds_limit:
        size = format_size(len(lines[start].encode()))
        return (f"[Line {first} is {size}, exceeds {format_size(MAX_BYTES)} limit. Use bash: "
                f"sed -n '{first}p' f.txt | head -c {MAX_BYTES}]")
    if truncation.truncated:
        last = start + truncation.output_lines
        note = f" ({format_size(MAX_BYTES)} limit)" if truncation.truncated_by == "bytes" else ""
        return (f"{selected}\n\n[Showing lines {first}-{last} of {total}{note}. "
                f"Use offset={last + 1} to continue.]")
    if end < total and limit is not None:
        return (f"{selected}\n\n[{total - end} more lines in file. "
                f"Use offset={end + 1} to continue.]")
    return selected


LINE_SIZES = st.sampled_from([0, 1, 7, 80, 3000, 60_000])


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(LINE_SIZES, max_size=12), repeat=st.sampled_from([1, 300]),
       offset=st.none() | st.integers(1, 4000), limit=st.none() | st.integers(1, 3000),
       final_newline=st.booleans())
def test_read_streams_yet_answers_as_reading_it_whole(
        tmp_path_factory: pytest.TempPathFactory, sizes: list[int], repeat: int,
        offset: int | None, limit: int | None, final_newline: bool) -> None:
    folder = tmp_path_factory.mktemp("read")
    lines = [("é" if size % 2 else "x") * size for size in sizes] * repeat
    data = ("\n".join(lines) + ("\n" if final_newline else "")).encode()
    (folder / "f.txt").write_bytes(data)
    arguments: dict[str, Any] = {"path": "f.txt"}
    if offset is not None:
        arguments["offset"] = offset
    if limit is not None:
        arguments["limit"] = limit
    try:
        answer = text(trio.run(partial(call, "read", folder, **arguments)))
    except ToolError as exc:
        answer = exc.text
    assert answer == reference_read(data, offset, limit)


async def test_read_of_a_huge_file_keeps_memory_bounded_and_refuses_a_fifo(
        tmp_path: Path) -> None:
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as file:  # 1 GiB: ten lines, then a hole of zero bytes
        file.write(b"".join(b"line %d\n" % n for n in range(1, 11)))
        file.truncate(1 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    first = text(await call("read", tmp_path, path="huge.txt", limit=10))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert first.startswith("line 1\nline 2") and "\n\n[1 more lines in file." in first
    assert grown_mb < 60
    os.mkfifo(tmp_path / "pipe")
    assert (await fails("read", tmp_path, path="pipe")).startswith("Not a regular file:")


async def test_read_image_by_magic_bytes(tmp_path: Path) -> None:
    (tmp_path / "pic.dat").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    result = await call("read", tmp_path, path="pic.dat")
    assert text(result) == "Read image file [image/png]"
    image = result.content[1]
    assert isinstance(image, w.ImageContent) and image.mime_type == "image/png"


async def test_read_missing_file(tmp_path: Path) -> None:
    message = await fails("read", tmp_path, path="nope.txt")
    assert message == f"ENOENT: no such file or directory, access '{tmp_path / 'nope.txt'}'"


@pytest.mark.parametrize("name", sorted(builtin_tools()))
def test_a_tool_takes_what_its_schema_shows_the_model(name: str) -> None:
    """Every property the model is shown is taken, under the name it is shown; what the
    schema requires is required."""
    tool = builtin_tools()[name]
    samples = {"string": "x", "number": 7, "boolean": True}
    properties, required_names = tool.parameters["properties"], tool.parameters["required"]
    assert isinstance(properties, dict) and isinstance(required_names, list)
    arguments: dict[str, object] = {key: samples[spec["type"]]
                                    for key, spec in properties.items()}
    parsed = parse_arguments(tool, arguments).params
    assert {key: getattr(parsed, re.sub("([A-Z])", r"_\1", key).lower())
            for key in arguments} == arguments
    for required in required_names:
        with pytest.raises(ToolError, match=f"missing required field '{required}'"):
            parse_arguments(tool, {k: v for k, v in arguments.items() if k != required})


async def test_arguments_are_validated_and_coerced(tmp_path: Path) -> None:
    message = await fails("read", tmp_path, offset="x")
    assert message.startswith('Validation failed for tool "read":\n'
                              "  - missing required field 'path'\n")
    assert message.endswith('Received arguments:\n{\n  "offset": "x"\n}')


# --- write and edit ----------------------------------------------------------------------------

async def test_write_creates_parents(tmp_path: Path) -> None:
    result = await call("write", tmp_path, path="a/b/c.txt", content="héllo 😀")
    assert text(result) == "Successfully wrote 8 bytes to a/b/c.txt"
    assert (tmp_path / "a/b/c.txt").read_text() == "héllo 😀"


async def test_edit_exact_and_diff(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("".join(f"line{i}\n" for i in range(1, 21)))
    result = await call("edit", tmp_path, path="m.py", oldText="line10\n", newText="ten\n")
    assert text(result) == "Successfully replaced text in m.py."
    assert result.details is not None
    assert result.details["firstChangedLine"] == 10
    assert result.details["diff"] == "\n".join([
        "    ...", "  6 line6", "  7 line7", "  8 line8", "  9 line9", "-10 line10",
        "+10 ten", " 11 line11", " 12 line12", " 13 line13", " 14 line14", "    ..."])


async def test_edit_keeps_crlf_and_bom(tmp_path: Path) -> None:
    (tmp_path / "w.txt").write_bytes("\ufeffone\r\ntwo\r\n".encode())
    await call("edit", tmp_path, path="w.txt", oldText="two\n", newText="2\n")
    assert (tmp_path / "w.txt").read_bytes() == "\ufeffone\r\n2\r\n".encode()


async def test_edit_fuzzy_match_normalizes_quotes_and_trailing_space(tmp_path: Path) -> None:
    (tmp_path / "q.txt").write_text("say \u201chello\u201d   \nbye\n")
    await call("edit", tmp_path, path="q.txt", oldText='say "hello"\n', newText="say hi\n")
    assert (tmp_path / "q.txt").read_text() == "say hi\nbye\n"


async def test_edit_failures(tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text("a\na\n")
    assert await fails("edit", tmp_path, path="none.txt", oldText="a", newText="b") == (
        "File not found: none.txt")
    assert await fails("edit", tmp_path, path="d.txt", oldText="zzz", newText="b") == (
        "Could not find the exact text in d.txt. The old text must match exactly including "
        "all whitespace and newlines.")
    assert await fails("edit", tmp_path, path="d.txt", oldText="a", newText="b") == (
        "Found 2 occurrences of the text in d.txt. The text must be unique. Please provide "
        "more context to make it unique.")
    assert (await fails("edit", tmp_path, path="d.txt", oldText="a\na", newText="a\na")
            ).startswith("No changes made to d.txt.")


def test_diff_numbers_pad_to_the_longest() -> None:
    diff, first = diff_string("a\nb\nc", "a\nB\nc")
    assert diff == " 1 a\n-2 b\n+2 B\n 3 c"
    assert first == 2


# --- ls, grep, find ----------------------------------------------------------------------------

async def test_ls_sorts_marks_dirs_and_shows_dotfiles(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "A").mkdir()
    (tmp_path / ".hidden").write_text("")
    assert text(await call("ls", tmp_path)) == ".hidden\nA/\nb.txt"
    (tmp_path / "empty").mkdir()
    assert text(await call("ls", tmp_path, path="empty")) == "(empty directory)"
    limited = await call("ls", tmp_path, limit=2)
    assert text(limited) == ".hidden\nA/\n\n[2 entries limit reached. Use limit=4 for more]"
    assert await fails("ls", tmp_path, path="b.txt") == f"Not a directory: {tmp_path / 'b.txt'}"


async def test_grep_matches_and_context(tmp_path: Path) -> None:
    (tmp_path / "example.txt").write_text("first\nmatch line\nlast\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "context.txt").write_text("before\nmatch here\nafter\n")
    result = text(await call("grep", tmp_path, pattern="match"))
    assert sorted(result.split("\n")) == ["example.txt:2: match line",
                                          "sub/context.txt:2: match here"]
    with_context = text(await call("grep", tmp_path, pattern="here", context=1))
    assert with_context == ("sub/context.txt-1- before\nsub/context.txt:2: match here\n"
                            "sub/context.txt-3- after")
    single = text(await call("grep", tmp_path, pattern="MATCH", path="example.txt",
                             ignoreCase=True))
    assert single == "example.txt:2: match line"
    assert text(await call("grep", tmp_path, pattern="absent")) == "No matches found"


async def test_grep_limit_and_long_lines(tmp_path: Path) -> None:
    (tmp_path / "many.txt").write_text("".join(f"hit {i}\n" for i in range(10)) + "hit "
                                       + "z" * 600 + "\n")
    limited = await call("grep", tmp_path, pattern="hit", limit=3)
    assert text(limited).endswith(
        "\n\n[3 matches limit reached. Use limit=6 for more, or refine pattern]")
    assert limited.details == {"matchLimitReached": 3}
    long = await call("grep", tmp_path, pattern="zzz")
    assert text(long).endswith("... [truncated]\n\n[Some lines truncated to 500 chars. "
                               "Use read tool to see full lines]")


async def test_find_respects_gitignore_and_includes_hidden(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("ignored.py\n")
    for name in ("a.py", "ignored.py", ".hidden.py", "src/b.py", "src/c.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert text(await call("find", tmp_path, pattern="*.py")) == ".hidden.py\na.py\nsrc/b.py"
    assert text(await call("find", tmp_path, pattern="*.rs")) == "No files found matching pattern"


# --- bash --------------------------------------------------------------------------------------

async def test_bash_output_exit_code_and_updates(tmp_path: Path) -> None:
    updates: list[w.ToolResult] = []
    assert text(await call("bash", tmp_path, updates, command="echo out; echo err >&2")) == (
        "out\nerr\n")
    assert updates and text(updates[0]).startswith("out")
    assert text(await call("bash", tmp_path, command="true")) == "(no output)"
    assert await fails("bash", tmp_path, command="echo bad; exit 3") == (
        "bad\n\n\nCommand exited with code 3")
    assert await fails("bash", tmp_path, command="sleep 5", timeout=0.2) == (
        "Command timed out after 0.2 seconds")
    assert await fails("bash", tmp_path, command="echo started; sleep 5", timeout=0.2) == (
        "started\n\nCommand timed out after 0.2 seconds")
    assert text(await call("bash", tmp_path, command="pwd")) == f"{tmp_path}\n"


async def test_a_long_command_outlives_the_thread_that_started_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child's parent-death signal comes when the *thread* that forked it exits; trio's
    worker threads exit after ten idle seconds, which killed every command that ran longer.
    Here they exit after 50 ms, and the command still runs to its end."""
    import trio._core._thread_cache as thread_cache

    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 0.05)
    result = await call("bash", tmp_path, command="sleep 0.6; echo survived")
    assert text(result) == "survived\n"


async def test_bash_truncates_and_spills_the_full_output(tmp_path: Path) -> None:
    result = await call("bash", tmp_path, command="seq 1 100000")
    path = detail_path(result)
    assert text(result) == "".join(f"{i}\n" for i in range(98002, 100001)) + (
        f"\n\n[Showing lines 98002-100001 of 100001. Full output: {path}]")
    assert Path(path).read_text() == "".join(f"{i}\n" for i in range(1, 100001))
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert detail(result, "truncation", "truncatedBy") == "lines"

    wide = await call("bash", tmp_path, command="for i in $(seq 1 2000); do "
                      "printf '%0100d\\n' $i; done")
    shown = text(wide).split("\n\n[")[0].split("\n")
    assert len("\n".join(shown).encode()) <= 51200
    assert text(wide).endswith(
        f"\n\n[Showing lines {int(shown[0])}-2001 of 2001 (50.0KB limit). "
        f"Full output: {detail_path(wide)}]")

    lines = await call("bash", tmp_path, command="seq 1 3000")
    assert text(lines).endswith(
        f"\n\n[Showing lines 1002-3001 of 3001. Full output: {detail_path(lines)}]")
    assert Path(detail_path(lines)).read_text().startswith("1\n2\n")


def test_truncate_head_and_tail_limits() -> None:
    head, info = truncate_head("a\nb\nc", max_lines=2)
    assert head == "a\nb" and info.truncated_by == "lines" and info.output_lines == 2
    tail, info = truncate_tail("a\nb\nc", max_lines=2)
    assert tail == "b\nc" and info.total_lines == 3
    tail, info = truncate_tail("é" * 10, max_bytes=5)
    assert tail == "éé" and info.last_line_partial
