"""The commands the ACP front answers itself, without a model call: ``/compact``, ``/export``,
``/name``, ``/session``, ``/fork``, ``/model``, ``/undo`` and ``/checkpoints``. Each says what it
did as the agent's message, and the prompt answers ``end_turn`` (docs/acp.md, Commands).
"""

from __future__ import annotations

from typing import Protocol

from ... import _wire as w
from .backends import Link, call
from .jsonrpc import JSONObject

BUILT_IN: dict[str, tuple[str, str | None]] = {
    "compact": ("Summarize the conversation so far, to free the context",
                "instructions for the summary (optional)"),
    "export": ("Write this session as an HTML page, and say where", None),
    "name": ("Name this session", "the session's new name"),
    "session": ("Show this session's tokens, cost and file", None),
    "fork": ("Copy this session into a new one (open it from the session list)", None),
    "model": ("List the models, or switch to one", "provider/model (optional)"),
    "undo": ("Put the files back as they were before the last run", None),
    "checkpoints": ("List the checkpoints of this session's files", None),
}
"""Each command's description, and the hint of the argument it takes (None: none)."""


class Host(Protocol):
    """The ACP session a command runs in."""

    link: Link

    async def options_changed(self) -> None: ...
    async def fork(self) -> str: ...
    async def permission(self, tool_call: JSONObject, text: str,
                         options: list[dict[str, str]], dialog: str | None = None
                         ) -> object: ...


def parse(text: str) -> tuple[str, str] | None:
    """A prompt that is a built-in command: its name and its argument; else None."""
    if not text.startswith("/"):
        return None
    name, _, argument = text[1:].partition(" ")
    return (name, argument.strip()) if name in BUILT_IN else None


def available(commands: list[w.CommandInfo]) -> list[JSONObject]:
    """``available_commands_update``'s list: the built-in commands, then the prompt
    templates, skills, plugin and MCP commands of the session (one of the same name as a
    built-in one is left out: the built-in answers)."""
    listed: list[JSONObject] = []
    for name, (description, hint) in BUILT_IN.items():
        entry: JSONObject = {"name": name, "description": description}
        if hint is not None:
            entry["input"] = {"hint": hint}
        listed.append(entry)
    listed += [{"name": command.name, "description": command.description or command.name}
               for command in commands if command.name not in BUILT_IN]
    return listed


async def run(host: Host, name: str, argument: str) -> str:
    """Run the built-in command `name`; what it did, as the agent says it."""
    link = host.link
    if name == "compact":
        done = await call(link, w.Compact(custom_instructions=argument or None),
                          w.CompactionResult)
        after = (f", about {done.estimated_tokens_after:,} after"
                 if done.estimated_tokens_after is not None else "")
        return f"Compacted: {done.tokens_before:,} tokens of context before{after}."
    if name == "export":
        path = (await call(link, w.ExportHtml(), w.ExportResult)).path
        return f"Exported to {path}"
    if name == "name":
        if not argument:
            return "Usage: /name <title>"
        await call(link, w.SetSessionName(name=argument), object)
        return f"Named this session “{argument}”."
    if name == "session":
        return _stats(await call(link, w.GetSessionStats(), w.SessionStats))
    if name == "fork":
        return f"Forked into session {await host.fork()}: open it from the session list."
    if name == "model":
        return await _model(host, argument)
    if name == "undo":
        return await _undo(host)
    return await _checkpoints(link)


def _stats(stats: w.SessionStats) -> str:
    tokens = stats.tokens
    lines = [f"Session {stats.session_id}",
             f"Messages: {stats.user_messages} from you, {stats.assistant_messages} replies, "
             f"{stats.tool_calls} tool calls",
             f"Tokens: {tokens.input:,} in, {tokens.output:,} out, {tokens.cache_read:,} "
             f"read from cache, {tokens.cache_write:,} written to it ({tokens.total:,} in all)",
             f"Cost: ${stats.cost:.4f}",
             f"File: {stats.session_file or 'none (kept in memory)'}"]
    usage = stats.context_usage
    if usage is not None and usage.tokens is not None:
        lines.append(f"Context: {usage.tokens:,} of {usage.context_window:,} tokens")
    return "\n".join(lines)


async def _model(host: Host, argument: str) -> str:
    models = (await call(host.link, w.GetAvailableModels(), w.ModelList)).models
    current = (await call(host.link, w.GetState(), w.SessionState)).model
    if not argument:
        if not models:
            return "No model has a key."
        return "Models (/model provider/id to switch):\n" + "\n".join(
            f"{'* ' if current and (m.provider, m.id) == (current.provider, current.id) else '  '}"
            f"{m.provider}/{m.id}" for m in models)
    provider, _, model_id = argument.rpartition("/")
    matches = [m for m in models if m.id == model_id and provider in ("", m.provider)]
    if len(matches) != 1:
        said = "is ambiguous: name its provider" if matches else "is not among the models"
        return f"{argument} {said} (/model lists them)."
    (chosen,) = matches
    await call(host.link, w.SetModel(provider=chosen.provider, model_id=chosen.id), object)
    await host.options_changed()
    return f"Model: {chosen.provider}/{chosen.id}"


async def _checkpoints(link: Link) -> str:
    listed = (await call(link, w.GetCheckpoints(), w.CheckpointList)).checkpoints
    if not listed:
        return "No checkpoints yet: no run has changed a file."
    return "Checkpoints, oldest first:\n" + "\n".join(map(_checkpoint_line, listed))


async def _undo(host: Host) -> str:
    """The files back to before the last run; with drift, the user is asked first."""
    link = host.link
    listed = (await call(link, w.GetCheckpoints(), w.CheckpointList)).checkpoints
    before = [item for item in listed if item.kind == "before"]
    if not before:
        return "Nothing to undo: no run has changed a file."
    target = before[-1].entry_id
    dry = await call(link, w.RestoreCheckpoint(entry_id=target, dry_run=True),
                     w.RestoreResult)
    force = False
    if dry.drift:
        names = ", ".join(item.path for item in dry.drift[:20])
        chosen = await host.permission(
            {"toolCallId": f"undo-{target}", "title": "Undo the last run"},
            f"These files changed since the last checkpoint, not by forged: {names}. "
            "Undoing the last run overwrites them. Undo anyway?",
            [{"optionId": "undo", "name": "Undo anyway", "kind": "allow_once"},
             {"optionId": "keep", "name": "Keep the files", "kind": "reject_once"}],
            dialog=f"undo-{target}")  # withdrawn by session/cancel
        if chosen != "undo":
            return "Not undone: the files stay as they are."
        force = True
    done = await call(link, w.RestoreCheckpoint(entry_id=target, force=force),
                      w.RestoreResult)
    names = ", ".join(item.path for item in done.files) or "nothing to change"
    return f"Undone: the files are back as they were before the last run ({names})."


def _checkpoint_line(item: w.Checkpoint) -> str:
    """One checkpoint as ``/checkpoints`` lists it: what it was taken before or after, and
    the files changed since the one before it (a ``before`` capture usually has none: the
    run's own changes are its ``after``'s), or by the restore it was taken for."""
    if item.kind == "before":
        said = f"before the run of “{item.prompt[:60]}”" if item.prompt else "before a run"
        since = "since the checkpoint before"
    elif item.kind == "after":
        said, since = "after the run", ""
    else:
        said, since = "a restore (the files just before it)", "by the restore"
    line = f"{item.timestamp} {said}"
    if item.files:
        count = len(item.files)
        names = ", ".join(change.path for change in item.files[:5])
        more = f", and {count - 5} more" if count > 5 else ""
        line += (f": {count} file{'s' if count != 1 else ''} changed {since}".rstrip()
                 + f" ({names}{more})")
    elif item.kind == "after":
        line += ": no file changed"
    return line
