"""An MCP server's question to the user (elicitation: a form, or a page to open), asked with
the session's dialogs, in both eras (an ``elicitation/create`` request, or an input-required
result of 2026-07-28: the SDK hands either to the same callback).

- A form: first a ``confirm`` saying what the server asks (no: ``decline``), then a dialog
  per field: a ``select`` for a choice (an enum, or yes/no), an ``input`` for text or a
  number; the answers, checked against the field's type, are ``accept``'s content.
- A page (URL mode): a ``confirm`` holding the address (yes: ``accept``, no: ``decline``).
  forged opens nothing itself.

A dialog that is cancelled, or that nobody answers (no client in time, ``abort``), makes the
answer ``cancel``. The dialogs wait for a client as permission requests do (the daemon); in
print mode, where nobody can ever answer, elicitation is not offered to servers at all.
"""

from __future__ import annotations

from typing import Any

import trio

from .._log import log
from .._ui import Dialogs, one_line

YES, NO = "Yes", "No"


async def answer(server: str, params: Any, dialogs: Dialogs) -> Any:
    """The SDK's ``ElicitResult`` for `params` (its form or URL request)."""
    from mcp_types import ElicitResult

    with trio.CancelScope() as cancelled:  # a dialog cancelled, or nobody answered
        if getattr(params, "mode", "form") == "url":
            confirmed = await _confirm(
                dialogs, cancelled, f"MCP server {server} asks you to open a page",
                f"{params.message}\n\n{params.url}")
            return ElicitResult(action="accept" if confirmed else "decline")
        schema = params.requested_schema if isinstance(params.requested_schema, dict) else {}
        properties = schema.get("properties")
        fields = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        needed = set(required) if isinstance(required, list) else set()
        names = ", ".join(str(field.get("title") or name) for name, field in fields.items()
                          if isinstance(field, dict))
        if not await _confirm(dialogs, cancelled, f"MCP server {server} asks",
                              f"{params.message}" + (f"\n\n(It asks for: {names})"
                                                     if names else "")):
            return ElicitResult(action="decline")
        content: dict[str, Any] = {}
        for name, field in fields.items():
            value = await _field(dialogs, cancelled, server, name,
                                 field if isinstance(field, dict) else {}, name in needed)
            if value is not None:
                content[name] = value
        return ElicitResult(action="accept", content=content)
    log(f"MCP server {server}: its question was cancelled: {one_line(params.message)}")
    return ElicitResult(action="cancel")


async def _confirm(dialogs: Dialogs, cancelled: trio.CancelScope, title: str,
                   message: str) -> bool:
    reply = await dialogs.ask_waiting("confirm", title=title, message=message)
    if reply is None or reply.cancelled:
        cancelled.cancel()
        await trio.lowlevel.checkpoint()
    return reply is not None and reply.confirmed is True


async def _ask(dialogs: Dialogs, cancelled: trio.CancelScope, method: str,
               **fields: Any) -> str | None:
    """The dialog's value; a cancelled dialog cancels the question (`cancelled`)."""
    reply = await dialogs.ask_waiting(method, **fields)
    if reply is None or reply.cancelled:
        cancelled.cancel()
        await trio.lowlevel.checkpoint()
    return reply.value if reply is not None else None


async def _field(dialogs: Dialogs, cancelled: trio.CancelScope, server: str, name: str,
                 field: dict[str, Any], required: bool) -> Any:
    """One field's value, asked until it fits its type (three times at most); None for an
    optional field left empty."""
    title = f"{server}: {field.get('title') or name}"
    choices = _choices(field)
    kind = field.get("type")
    if choices is not None:
        shown = list(choices)
        picked = await _ask(dialogs, cancelled, "select", title=title, options=shown)
        if picked not in choices:
            cancelled.cancel()
            await trio.lowlevel.checkpoint()
        return choices.get(str(picked))
    if kind == "boolean":
        picked = await _ask(dialogs, cancelled, "select", title=title, options=[YES, NO])
        if picked not in (YES, NO):
            cancelled.cancel()
            await trio.lowlevel.checkpoint()
        return picked == YES
    hint = field.get("description")
    items = field.get("items")
    if kind == "array" and isinstance(items, dict) and (allowed := _choices(items)):
        hint = f"{hint or 'Choose'}: one or more of {', '.join(allowed)}, comma-separated"
    for _ in range(3):
        text = await _ask(dialogs, cancelled, "input", title=title,
                          placeholder=str(hint) if hint else None)
        text = (text or "").strip()
        if not text and not required:
            return None
        value = _typed(text, field)
        if value is not None:
            return value
        hint = f"{field.get('description') or ''} (a {kind or 'value'}, please)".strip()
    cancelled.cancel()
    await trio.lowlevel.checkpoint()
    return None


def _choices(field: dict[str, Any]) -> dict[str, Any] | None:
    """A choice's options by what is shown: ``oneOf`` consts by title, ``enum`` values
    (named by ``enumNames`` where given); None when the field is not a choice."""
    one_of = field.get("oneOf")
    if isinstance(one_of, list) and one_of:
        return {str(option.get("title") or option.get("const")): option.get("const")
                for option in one_of if isinstance(option, dict) and "const" in option}
    enum = field.get("enum")
    if isinstance(enum, list) and enum:
        names = field.get("enumNames")
        shown = names if isinstance(names, list) and len(names) == len(enum) else enum
        return {str(label): value for label, value in zip(shown, enum, strict=True)}
    return None


def _typed(text: str, field: dict[str, Any]) -> Any:
    """`text` as the field's type, or None when it is not one."""
    kind = field.get("type")
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        return None
    if kind == "array":  # a multiple choice: the items given, comma-separated
        items = field.get("items")
        allowed = _choices(items) if isinstance(items, dict) else None
        given = [item.strip() for item in text.split(",") if item.strip()]
        if allowed is None:
            return given
        if any(item not in allowed for item in given):
            return None
        return [allowed[item] for item in given]
    return text
