"""``export_html``: a session as one self-contained HTML page a person would want to read.

The page is rendered here, not in the browser: every message, tool call and summary is HTML
in the file, readable with JavaScript off (the page has no script at all) and without network
access (styles inline, images as data URLs). It shows

- a header with the session's name, id, cwd, models, and token and cost totals;
- the session tree, every entry a link, the active branch marked (a chain without branches
  stays at one level, so a long session does not nest thousands deep);
- the active branch in order: Markdown rendered, thinking folded, tool calls with their
  arguments and results (edit diffs coloured, long output folded), bash runs, compaction and
  branch summaries;
- after it, the entries of the other branches.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Iterator
from typing import Any

import orjson
from markdown_it import MarkdownIt

from . import _wire as w
from ._context import content_text
from ._stats import UsageTotals
from ._store import Entry, SessionFile

FOLD_LINES = 20
"""Tool output longer than this shows its first lines and folds the rest."""

_markdown = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def markdown(text: str) -> str:
    return str(_markdown.render(text))


def clock(timestamp: Any) -> str:
    try:
        moment = datetime.datetime.fromisoformat(str(timestamp))
    except ValueError:
        return ""
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def folded(text: str, css: str = "output") -> str:
    """Text in a <pre>; past `FOLD_LINES` lines, the rest behind a <details>."""
    lines = text.split("\n")
    if len(lines) <= FOLD_LINES:
        return f'<pre class="{css}">{esc(text)}</pre>'
    head = "\n".join(lines[:FOLD_LINES])
    return (f'<pre class="{css}">{esc(head)}</pre>'
            f'<details class="fold"><summary>Show all {len(lines)} lines</summary>'
            f'<pre class="{css}">{esc(text)}</pre></details>')


def diff_html(diff: str) -> str:
    """The edit tool's numbered diff, a line each: added, removed, context."""
    rows = []
    for line in diff.split("\n"):
        css = {"+": "add", "-": "del"}.get(line[:1], "ctx")
        rows.append(f'<span class="diff-{css}">{esc(line)}</span>')
    return f'<pre class="diff">{"".join(rows)}</pre>'


def _images(content: Any) -> str:
    return "".join(
        f'<img class="image" alt="image" src="data:{esc(block.get("mimeType", "image/png"))};'
        f'base64,{esc(block.get("data", ""))}">'
        for block in content or [] if isinstance(block, dict) and block.get("type") == "image")


class _Page:
    def __init__(self, store: SessionFile, count: int) -> None:
        self.store = store
        self.entries: list[Entry] = [store.entry(position) for position in range(count)]
        self.active = {store.entry_id(position) for position in store.path_to_leaf()
                       if position < count}
        self.leaf_id = self.entries[-1].get("id") if self.entries else None
        self.results: dict[str, dict[str, Any]] = {}
        self.labels: dict[str, str] = {}
        for entry in self.entries:
            message = entry.get("message")
            if isinstance(message, dict) and message.get("role") == "toolResult":
                self.results[str(message.get("toolCallId"))] = message
            if entry.get("type") == "label" and isinstance(entry.get("targetId"), str):
                if entry.get("label"):
                    self.labels[entry["targetId"]] = str(entry["label"])
                else:
                    self.labels.pop(entry["targetId"], None)
        self.shown_results: set[str] = set()

    # --- the tree ------------------------------------------------------------------------------

    def tree(self) -> str:
        """Nested lists that nest only where the tree branches."""
        children: dict[str | None, list[Entry]] = {}
        ids = {entry.get("id") for entry in self.entries}
        for entry in self.entries:
            parent = entry.get("parentId")
            children.setdefault(parent if parent in ids else None, []).append(entry)
        out = ['<ul class="tree">']
        # Each frame: the siblings still to render at one nesting level.
        stack: list[Iterator[Entry]] = [iter(children.get(None, []))]
        while stack:
            node = next(stack[-1], None)
            if node is None:
                stack.pop()
                out.append("</ul></li>" if stack else "</ul>")
                continue
            while True:
                out.append(self._tree_item(node))
                kids = children.get(node.get("id"), [])
                if len(kids) == 1:
                    node = kids[0]  # a chain: the next entry at the same level
                    continue
                if kids:
                    out.append('<li class="fork"><ul>')
                    stack.append(iter(kids))
                break
        return "".join(out)

    def _tree_item(self, entry: Entry) -> str:
        entry_id = str(entry.get("id"))
        classes = ["node", str(entry.get("type"))]
        if entry_id in self.active:
            classes.append("active")
        if entry_id == self.leaf_id:
            classes.append("leaf")
        label = self.labels.get(entry_id)
        tag = f' <span class="tag">{esc(label)}</span>' if label else ""
        marker = '<span class="leaf-mark">leaf ▸</span> ' if entry_id == self.leaf_id else ""
        return (f'<li class="{" ".join(classes)}">{marker}<a href="#e-{esc(entry_id)}">'
                f"{esc(self._caption(entry))}</a>{tag}</li>")

    def _caption(self, entry: Entry) -> str:
        kind = entry.get("type")
        message = entry.get("message")
        if kind == "message" and isinstance(message, dict):
            role = message.get("role")
            if role == "assistant":
                calls = [b.get("name") for b in message.get("content") or []
                         if isinstance(b, dict) and b.get("type") == "toolCall"]
                text = content_text(message.get("content")) or (
                    "→ " + ", ".join(map(str, calls)) if calls else "")
            elif role == "toolResult":
                text = f"{message.get('toolName')} result"
            elif role == "bashExecution":
                text = f"$ {message.get('command')}"
            else:
                text = content_text(message.get("content"))
            caption = f"{role}: {' '.join(text.split())}"
        elif kind == "model_change":
            caption = f"model: {entry.get('provider')}/{entry.get('modelId')}"
        elif kind == "thinking_level_change":
            caption = f"thinking: {entry.get('thinkingLevel')}"
        elif kind == "session_info":
            caption = f"name: {entry.get('name')}"
        elif kind == "label":
            caption = f"label: {entry.get('label')}"
        else:
            caption = str(kind)
        return caption if len(caption) <= 70 else caption[:69] + "…"

    # --- entries -------------------------------------------------------------------------------

    def entry_html(self, entry: Entry) -> str:
        kind = entry.get("type")
        anchor = f'id="e-{esc(entry.get("id"))}"'
        when = f'<time>{esc(clock(entry.get("timestamp")))}</time>'
        if kind == "message" and isinstance(entry.get("message"), dict):
            return self.message_html(entry["message"], anchor, when)
        if kind == "compaction":
            return (f'<article class="summary compaction" {anchor}><h3>Compaction {when}</h3>'
                    f'<p class="meta">{esc(entry.get("tokensBefore", 0))} tokens before</p>'
                    f'{markdown(str(entry.get("summary", "")))}</article>')
        if kind == "branch_summary":
            return (f'<article class="summary branch-summary" {anchor}>'
                    f"<h3>Branch summary {when}</h3>"
                    f'{markdown(str(entry.get("summary", "")))}</article>')
        if kind == "custom_message":
            return (f'<article class="msg custom" {anchor}><h3>'
                    f'{esc(entry.get("customType", "custom"))} {when}</h3>'
                    f'{markdown(content_text(entry.get("content")))}'
                    f'{_images(entry.get("content"))}</article>')
        info = {
            "model_change": f"Model: {entry.get('provider')}/{entry.get('modelId')}",
            "thinking_level_change": f"Thinking level: {entry.get('thinkingLevel')}",
            "session_info": f"Session named: {entry.get('name')}",
            "label": f"Label: {entry.get('label') or '(cleared)'}",
        }.get(str(kind))
        if info is None:
            return f'<div class="info" {anchor}>{esc(kind)} {when}</div>'
        return f'<div class="info" {anchor}>{esc(info)} {when}</div>'

    def message_html(self, message: dict[str, Any], anchor: str, when: str) -> str:
        role = message.get("role")
        content = message.get("content")
        if role == "user":
            return (f'<article class="msg user" {anchor}><h3>User {when}</h3>'
                    f"{markdown(content_text(content))}{_images(content)}</article>")
        if role == "assistant":
            return self.assistant_html(message, anchor, when)
        if role == "toolResult":
            if str(message.get("toolCallId")) in self.shown_results:
                return f'<span class="anchor" {anchor}></span>'
            return (f'<article class="msg tool" {anchor}><h3>'
                    f'{esc(message.get("toolName"))} result {when}</h3>'
                    f"{self.result_html(message)}</article>")
        if role == "bashExecution":
            exit_code = message.get("exitCode")
            status = ("cancelled" if message.get("cancelled")
                      else f"exit {exit_code}" if exit_code is not None else "killed")
            return (f'<article class="msg bash" {anchor}><h3>Bash {when}</h3>'
                    f'<pre class="command">$ {esc(message.get("command", ""))}</pre>'
                    f'{folded(str(message.get("output", "")))}'
                    f'<p class="meta">{esc(status)}</p></article>')
        return (f'<article class="msg custom" {anchor}><h3>{esc(role)} {when}</h3>'
                f"{markdown(content_text(content))}</article>")

    def assistant_html(self, message: dict[str, Any], anchor: str, when: str) -> str:
        parts = [f'<article class="msg assistant" {anchor}><h3>Assistant '
                 f'<span class="model">{esc(message.get("model", ""))}</span> {when}</h3>']
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                parts.append(markdown(str(block.get("text", ""))))
            elif block.get("type") == "thinking":
                parts.append('<details class="thinking"><summary>Thinking</summary>'
                             f'{markdown(str(block.get("thinking", "")))}</details>')
            elif block.get("type") == "toolCall":
                parts.append(self.tool_call_html(block))
        reason = message.get("stopReason")
        if reason == "error":
            parts.append(f'<p class="error">Error: {esc(message.get("errorMessage", ""))}</p>')
        elif reason == "aborted":
            parts.append('<p class="error">Aborted</p>')
        usage = message.get("usage")
        if isinstance(usage, dict):
            cost = usage.get("cost")
            cost = cost if isinstance(cost, dict) else {}
            parts.append(f'<p class="meta">{esc(usage.get("input", 0))} in · '
                         f'{esc(usage.get("output", 0))} out · '
                         f'{esc(usage.get("cacheRead", 0))} cache read · '
                         f'${float(cost.get("total", 0) or 0):.4f}</p>')
        parts.append("</article>")
        return "".join(parts)

    def tool_call_html(self, block: dict[str, Any]) -> str:
        name = str(block.get("name", ""))
        args = block.get("arguments") if isinstance(block.get("arguments"), dict) else {}
        assert isinstance(args, dict)
        result = self.results.get(str(block.get("id")))
        if name == "bash":
            shown = f'<pre class="command">$ {esc(args.get("command", ""))}</pre>'
        elif name in ("read", "write", "edit", "ls"):
            shown = f'<p class="path">{esc(args.get("path", ""))}</p>'
            if name == "write":
                shown += ('<details class="fold"><summary>Content</summary>'
                          f'<pre class="output">{esc(args.get("content", ""))}</pre></details>')
        elif name in ("grep", "find"):
            shown = (f'<p class="path">{esc(args.get("pattern", ""))}'
                     f' in {esc(args.get("path", "."))}</p>')
        else:
            shown = (f'<pre class="args">'
                     f'{esc(orjson.dumps(args, option=orjson.OPT_INDENT_2).decode())}</pre>')
        parts = [f'<div class="tool-call"><h4>{esc(name)}</h4>{shown}']
        if result is not None:
            self.shown_results.add(str(block.get("id")))
            parts.append(self.result_html(result))
        parts.append("</div>")
        return "".join(parts)

    def result_html(self, result: dict[str, Any]) -> str:
        details = result.get("details")
        css = "result error" if result.get("isError") else "result"
        body = ""
        if isinstance(details, dict) and isinstance(details.get("diff"), str):
            body = diff_html(details["diff"])
        text = content_text(result.get("content"))
        if not body or result.get("isError"):
            body += folded(text)
        return f'<div class="{css}">{body}{_images(result.get("content"))}</div>'

    # --- the page ------------------------------------------------------------------------------

    def conversation(self) -> str:
        out = []
        for entry in self.entries:
            if entry.get("id") in self.active:
                out.append(self.entry_html(entry))
        return "".join(out)

    def other_branches(self) -> str:
        out: list[str] = []
        previous: Any = object()
        for entry in self.entries:
            if entry.get("id") in self.active or entry.get("type") == "label":
                continue
            if entry.get("parentId") != previous:
                out.append(f'<h2 class="branch-start">Branch from '
                           f'<a href="#e-{esc(entry.get("parentId"))}">'
                           f'{esc(entry.get("parentId") or "the start")}</a></h2>')
            out.append(self.entry_html(entry))
            previous = entry.get("id")
        return "".join(out)


def _models_used(entries: list[Entry]) -> set[str]:
    used = set()
    for entry in entries:
        message = entry.get("message")
        if entry.get("type") == "model_change":
            used.add(f"{entry.get('provider')}/{entry.get('modelId')}")
        elif isinstance(message, dict) and message.get("role") == "assistant":
            used.add(f"{message.get('provider')}/{message.get('model')}")
    return used


def render(store: SessionFile, count: int, *, name: str | None, model: w.Model | None,
           totals: UsageTotals) -> str:
    page = _Page(store, count)
    header = store.header
    models = sorted(_models_used(page.entries))
    title = name or f"forged session {header.get('id')}"
    tokens = totals.input + totals.output + totals.cache_read + totals.cache_write
    facts = [
        ("Session", header.get("id")), ("Directory", header.get("cwd")),
        ("Started", clock(header.get("timestamp"))),
        ("Model", f"{model.provider}/{model.id}" if model else "none"),
        ("Models used", ", ".join(models) or "none"),
        ("Messages", f"{totals.user} user · {totals.assistant} assistant · "
                     f"{totals.tool_results} tool results"),
        ("Tokens", f"{tokens:,} ({totals.input:,} in · {totals.output:,} out · "
                   f"{totals.cache_read:,} cache read · {totals.cache_write:,} cache write)"),
        ("Cost", f"${totals.cost:.4f}"),
    ]
    if header.get("parentSession"):
        facts.append(("Parent session", header["parentSession"]))
    others = page.other_branches()
    return "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">",
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
        f'<header class="session"><h1>{esc(title)}</h1><dl>',
        "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts),
        "</dl></header>",
        f'<div class="layout"><nav aria-label="Session tree"><h2>Tree</h2>{page.tree()}</nav>',
        f'<main><h2>Conversation</h2>{page.conversation()}',
        f'<section class="other-branches"><h2>Other branches</h2>{others}</section>'
        if others else "",
        "</main></div></body></html>\n",
    ])


STYLE = """
:root { --bg: #fafaf7; --fg: #1d1d1b; --muted: #6b6b66; --card: #fff; --line: #deded8;
  --user: #eef3fb; --accent: #2f5fb3; --add: #e3f5e1; --add-fg: #1c6b1c; --del: #fbe4e4;
  --del-fg: #9b1c1c; --code: #f2f2ee; --error: #a4161a; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #161614; --fg: #e6e6e1; --muted: #9a9a92; --card: #1f1f1c; --line: #34342f;
    --user: #1e2633; --accent: #86a8e8; --add: #17301a; --add-fg: #8fd48f; --del: #3a1a1a;
    --del-fg: #f0a0a0; --code: #262622; --error: #ff8a8a; } }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; }
header.session { padding: 16px 24px; border-bottom: 1px solid var(--line); }
header.session h1 { margin: 0 0 8px; font-size: 20px; }
header.session dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px;
  margin: 0; font-size: 13px; }
header.session dt { color: var(--muted); }
header.session dd { margin: 0; overflow-wrap: anywhere; }
.layout { display: flex; align-items: flex-start; }
nav { position: sticky; top: 0; width: 320px; max-height: 100vh; overflow: auto; flex: none;
  padding: 12px; border-right: 1px solid var(--line); font-size: 12px; }
nav h2, main h2 { font-size: 14px; text-transform: uppercase; letter-spacing: .05em;
  color: var(--muted); }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 0; }
ul.tree ul { padding-left: 12px; border-left: 1px dashed var(--line); margin-left: 4px; }
li.node { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
li.node a { color: var(--muted); text-decoration: none; }
li.node.active > a { color: var(--fg); font-weight: 600; }
li.node.active::before { content: "● "; color: var(--accent); }
li.node:not(.active)::before { content: "○ "; color: var(--muted); }
.leaf-mark { color: var(--accent); font-weight: 600; }
.tag { background: var(--accent); color: var(--bg); border-radius: 3px; padding: 0 4px; }
main { flex: 1; min-width: 0; padding: 12px 24px 48px; max-width: 980px; }
article, .info { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
  padding: 8px 14px; margin: 10px 0; }
article h3 { margin: 0 0 4px; font-size: 13px; color: var(--muted); font-weight: 600; }
article h3 time, .info time { font-weight: 400; margin-left: 6px; font-size: 12px; }
article.user { background: var(--user); }
.info { color: var(--muted); font-size: 12px; padding: 4px 14px; }
.summary { border-left: 4px solid var(--accent); }
.model { font-weight: 400; }
.meta { color: var(--muted); font-size: 12px; margin: 4px 0 0; }
.error { color: var(--error); font-weight: 600; }
pre { background: var(--code); padding: 8px 10px; border-radius: 4px; overflow-x: auto;
  font: 12.5px/1.45 ui-monospace, "SF Mono", Menlo, Consolas, monospace; margin: 6px 0; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 90%; }
.tool-call { border: 1px solid var(--line); border-radius: 4px; padding: 6px 10px;
  margin: 8px 0; }
.tool-call h4 { margin: 0; font: 600 12px ui-monospace, Menlo, monospace;
  color: var(--accent); }
.path { font-family: ui-monospace, Menlo, monospace; font-size: 12.5px; margin: 4px 0; }
.result.error pre { color: var(--error); }
pre.diff span { display: block; }
.diff-add { background: var(--add); color: var(--add-fg); }
.diff-del { background: var(--del); color: var(--del-fg); }
details > summary { cursor: pointer; color: var(--muted); font-size: 13px; }
details.thinking { border-left: 3px solid var(--line); padding-left: 10px; margin: 6px 0;
  color: var(--muted); }
img.image { max-width: 100%; border-radius: 4px; }
.branch-start { margin-top: 24px; }
table { border-collapse: collapse; } td, th { border: 1px solid var(--line); padding: 2px 6px; }
"""
