"""export_html: one self-contained page, readable without JavaScript, checked in Chromium."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from forged._providers.scripted import Reply, ScriptText, ScriptThinking, ScriptToolCall

from .chromium import find_chromium, open_page
from .harness import Client, open_client, stored_message

ARTIFACTS = Path(__file__).parent / "artifacts"

ANSWER = ("**Fixed** the greeting, see `greet.py`:\n\n```python\nprint('hello')\n```\n\n"
          "| before | after |\n|---|---|\n| helo | hello |\n")


def branched_file(path: Path) -> None:
    """A session that already has an abandoned branch."""
    def message(entry_id: str, parent: str | None, role: str, text: str) -> dict[str, Any]:
        return stored_message(entry_id, parent, role, text, tokens=(10, 5), cost=0.25)

    lines = [
        {"type": "session", "version": 3, "id": "export-me",
         "timestamp": "2026-01-01T00:00:00.000Z", "cwd": str(path.parent)},
        message("c0000001", None, "user", "Hello there"),
        message("c0000002", "c0000001", "assistant", "An answer nobody kept"),
        message("c0000003", "c0000001", "assistant", "Hi! What shall we fix?"),
        {"type": "label", "id": "c0000004", "parentId": "c0000003",
         "timestamp": "2026-01-01T00:00:02.000Z", "targetId": "c0000001",
         "label": "start here"},
        {"type": "compaction", "id": "c0000005", "parentId": "c0000004",
         "timestamp": "2026-01-01T00:00:03.000Z", "summary": "We said hello.",
         "firstKeptEntryId": "c0000003", "tokensBefore": 900},
    ]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


async def exported_session(tmp_path: Path) -> tuple[Client, dict[str, Any]]:
    session = tmp_path / "export.jsonl"
    branched_file(session)
    replies = [
        Reply(content=[ScriptThinking(thinking="The greeting has a typo."),
                       ScriptToolCall(name="edit", arguments={
                           "path": "greet.py", "oldText": "helo", "newText": "hello"})]),
        Reply(content=[ScriptToolCall(name="bash", arguments={"command": "seq 1 40"})]),
        Reply(content=[ScriptText(text=ANSWER)]),
    ]
    async with open_client(tmp_path, replies, session_path=session) as client:
        (client.cwd / "greet.py").write_text("print('helo')\n")
        await client.prompt_and_settle("Please fix the greeting <b>now</b>")
        response = await client.request({"type": "export_html"})
    return client, response


async def test_the_page_holds_the_conversation_as_html(tmp_path: Path) -> None:
    client, response = await exported_session(tmp_path)
    path = Path(response["data"]["path"])
    assert path == client.cwd / "forged-session-export.html"
    page = path.read_text()
    assert "<script" not in page  # readable with JavaScript off: there is none
    assert not re.search(r'(src|href)="(https?:)?//', page)  # and nothing to fetch
    assert "Please fix the greeting &lt;b&gt;now&lt;/b&gt;" in page  # user text, escaped
    assert "<strong>Fixed</strong>" in page and "<table>" in page  # Markdown rendered
    assert '<details class="thinking"><summary>Thinking</summary>' in page
    assert "The greeting has a typo." in page
    assert '<span class="diff-del">-1 print(&#x27;helo&#x27;)</span>' in page
    assert '<span class="diff-add">+1 print(&#x27;hello&#x27;)</span>' in page
    assert "$ seq 1 40" in page and "Show all 41 lines" in page  # long output folded
    assert "We said hello." in page and "900 tokens before" in page  # the compaction
    assert 'class="node message active"' in page and "leaf ▸" in page  # the tree
    assert "An answer nobody kept" in page and "Other branches" in page
    assert '<span class="tag">start here</span>' in page
    assert "Models used</dt><dd>scripted/anthropic-messages" in page
    # Every branch counts: two stored replies of $0.25 and three scripted ones of 10 in, 5 out.
    assert "Tokens</dt><dd>75 (50 in · 25 out" in page
    assert "Cost</dt><dd>$0.50" in page


async def test_export_errors_and_an_explicit_path(tmp_path: Path) -> None:
    async with open_client(tmp_path, persist=False) as client:
        memory = await client.request({"type": "export_html"})
    assert memory["error"] == "Cannot export in-memory session to HTML"
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
        early = await client.request({"type": "export_html"})
        await client.prompt_and_settle("hello")
        chosen = await client.request({"type": "export_html", "outputPath": "out/page.html"})
    assert early["error"] == "Nothing to export yet - start a conversation first"
    assert chosen["data"]["path"] == str(client.cwd / "out" / "page.html")
    assert "hello" in (client.cwd / "out" / "page.html").read_text()


async def test_export_never_writes_over_a_session_file_or_through_a_link(
        tmp_path: Path) -> None:
    outside = tmp_path / "outside.html"
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")]),
                                      Reply(content=[ScriptText(text="again")])]) as client:
        await client.prompt_and_settle("hello")
        state = (await client.request({"type": "get_state"}))["data"]
        session_file = Path(state["sessionFile"])
        other = session_file.with_name("other.jsonl")
        other.write_bytes(session_file.read_bytes())
        (client.cwd / "folder").mkdir()
        (client.cwd / "link.html").symlink_to(outside)
        refused = [await client.request({"type": "export_html", "outputPath": path})
                   for path in (str(session_file), str(other), f"{session_file}.lock",
                                "folder", "link.html")]
        await client.prompt_and_settle("still stored?")
    assert [r["success"] for r in refused] == [False] * 5
    assert [r["error"].rsplit(": ", 1)[-1] for r in refused[:3]] == ["it is a session file"] * 3
    assert refused[3]["error"].endswith("it is not a regular file")
    assert "it is a symbolic link" in refused[4]["error"] and not outside.exists()
    lines = session_file.read_bytes().splitlines()
    assert lines[0].startswith(b'{"type":"session"') and b"still stored?" in lines[-2]
    assert not list(client.cwd.glob(".*.tmp"))


VISIBLE = """(() => {
  const shown = (el) => !!el && el.getBoundingClientRect().height > 0
      && getComputedStyle(el).visibility !== 'hidden';
  const find = (selector, text) => [...document.querySelectorAll(selector)]
      .find((el) => el.textContent.includes(text));
  return {
    user: shown(find('article.user', 'Please fix the greeting <b>now</b>')),
    assistant: shown(find('article.assistant strong', 'Fixed')),
    diff: shown(document.querySelector('pre.diff .diff-add')),
    tree: shown(document.querySelector('nav ul.tree li.node.active')),
    leaf: shown(document.querySelector('nav li.node.leaf')),
    branch: shown(find('nav li.node:not(.active) a', 'An answer nobody kept')),
    thinkingFolded: !document.querySelector('details.thinking').open,
  };
})()"""


@pytest.mark.skipif(find_chromium() is None,
                    reason="chromium is not installed (.ci/run installs Debian's chromium)")
async def test_the_page_in_headless_chromium(tmp_path: Path) -> None:
    binary = find_chromium()
    assert binary is not None
    _, response = await exported_session(tmp_path)
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    with trio.fail_after(90):
        async with open_page(binary, profile) as page:
            await page.call("Emulation.setDeviceMetricsOverride", width=1280, height=1000,
                            deviceScaleFactor=1, mobile=False)
            await page.call("Page.navigate", url=Path(response["data"]["path"]).as_uri())
            await page.wait_event("Page.loadEventFired")
            visible = await page.evaluate(VISIBLE)
            shot = await page.call("Page.captureScreenshot", format="png")
            errors = page.console_errors()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "export.png").write_bytes(base64.b64decode(shot["data"]))
    assert errors == []
    assert visible == {"user": True, "assistant": True, "diff": True, "tree": True,
                       "leaf": True, "branch": True, "thinkingFolded": True}


async def test_export_is_answered_even_when_input_ends_right_after(tmp_path: Path) -> None:
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
        await client.prompt_and_settle("hello")
        await client.send_raw(b'{"type":"export_html","id":"last"}\n')
        await client.close_input()
        await client.wait_eof()
    (answer,) = [e for e in client.output if e.get("id") == "last"]
    assert answer["success"] is True and Path(answer["data"]["path"]).exists()
