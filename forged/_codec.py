"""The one cattrs converter: wire classes to JSON-ready values and back.

`configure_converter` registers every hook: camelCase names, omitted unset fields, ``null`` for
`keep_null` fields, tagged unions keyed on ``type`` / ``role``, and strict primitives (a string
field given a number is an error naming the field, never a silent ``str(5)``).
"""

from __future__ import annotations

import importlib
import os
import weakref
from collections.abc import Callable
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import attrs
import cattrs
import orjson
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from . import _wire as w
from ._errors import WireError
from ._jsonl import camel as camel, encode_line, separators_escaped

T = TypeVar("T")


def _strict(kind: type[Any], expected: str) -> Callable[[Any, type[Any]], Any]:
    def structure(value: Any, _: type[Any]) -> Any:
        if type(value) is bool and kind is not bool:
            raise ValueError(f"expected {expected}")
        if isinstance(value, kind):
            return value
        raise ValueError(f"expected {expected}")

    return structure


def _structure_float(value: Any, _: type[Any]) -> float:
    if type(value) is bool or not isinstance(value, int | float):
        raise ValueError("expected a number")
    return float(value)


def _is_list(cl: Any) -> bool:
    return get_origin(cl) is list


def _strict_list(converter: cattrs.Converter, cl: Any) -> Callable[[Any, Any], Any]:
    (item,) = get_args(cl)
    structure_item = converter.get_structure_hook(item)

    def structure(value: Any, _: Any) -> list[Any]:
        if not isinstance(value, list):
            raise ValueError("expected an array")
        errors: list[Exception] = []
        out: list[Any] = []
        for index, element in enumerate(value):
            try:
                out.append(structure_item(element, item))
            except Exception as exc:
                note = cattrs.errors.IterableValidationNote(f"index {index}", index, item)
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]
                errors.append(exc)
        if errors:
            raise cattrs.IterableValidationError("while structuring a list", errors, cl)
        return out

    return structure


def _is_literal(cl: Any) -> bool:
    return get_origin(cl) is Literal


def _structure_literal(cl: Any) -> Callable[[Any, Any], Any]:
    allowed = get_args(cl)
    expected = ", ".join(repr(value) for value in allowed)

    def structure(value: Any, _: Any) -> Any:
        if value in allowed and type(value) is str:
            return value
        raise ValueError(f"expected one of {expected}")

    return structure


def _field_overrides(cls: type[Any]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for field in attrs.fields(cls):
        keep = field.metadata.get(w.KEEP_NULL, False)
        omit = field.default is None and not keep
        overrides[field.name] = override(rename=camel(field.name), omit_if_default=omit)
    return overrides


def _unstructure_response(converter: cattrs.Converter) -> Callable[[w.Response], dict[str, Any]]:
    def unstructure(response: w.Response) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if response.id is not None:
            out["id"] = response.id
        out["type"] = "response"
        out["command"] = response.command
        out["success"] = response.success
        if response.data is not w.ABSENT:
            out["data"] = converter.unstructure(response.data)
        if response.error is not None:
            out["error"] = response.error
        return out

    return unstructure


def _tag_key(cl: Any) -> str | None:
    """The key a union of wire classes is told apart by (``type``, or ``role`` for messages):
    every member's first field, a tag; None if `cl` is not such a union."""
    if get_origin(cl) not in (Union, UnionType):
        return None
    keys = set()
    for member in get_args(cl):
        if not attrs.has(member):
            return None
        first = attrs.fields(member)[0]
        if first.init or not isinstance(first.default, str):
            return None
        keys.add(first.name)
    return keys.pop() if len(keys) == 1 else None


def _structure_tagged_union(converter: cattrs.Converter, union: Any) -> Callable[[Any, Any], Any]:
    key = _tag_key(union)
    by_tag = {attrs.fields(cls)[0].default: cls for cls in get_args(union)}

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError("expected an object")
        cls = by_tag.get(value.get(key))
        if cls is None:
            raise ValueError(f"unknown {key} {value.get(key)!r}")
        return converter.structure(value, cls)

    return structure


def configure_converter(converter: cattrs.Converter) -> None:
    converter.register_structure_hook(str, _strict(str, "a string"))
    converter.register_structure_hook(int, _strict(int, "an integer"))
    converter.register_structure_hook(bool, _strict(bool, "a boolean"))
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(Any, lambda value, _: value)
    # `w.JSONValue`, a field typed object: as Any is, taken as it is and written as it is.
    converter.register_structure_hook_func(lambda cl: cl is object, lambda value, _: value)
    converter.register_unstructure_hook_func(lambda cl: cl is object, converter.unstructure)

    converter.register_unstructure_hook(w.Response, _unstructure_response(converter))
    converter.register_unstructure_hook_factory(
        attrs.has,
        lambda cls: make_dict_unstructure_fn(
            cls, converter, _cattrs_include_init_false=True, **_field_overrides(cls)
        ),
    )
    converter.register_structure_hook_factory(_is_list, lambda cl: _strict_list(converter, cl))
    converter.register_structure_hook_factory(_is_literal, _structure_literal)
    converter.register_structure_hook_factory(
        attrs.has,
        lambda cls: make_dict_structure_fn(cls, converter, **_field_overrides(cls)),
    )
    converter.register_structure_hook_factory(
        lambda cl: _tag_key(cl) is not None,
        lambda cl: _structure_tagged_union(converter, cl))


def new_converter() -> cattrs.Converter:
    converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    configure_converter(converter)
    return converter


converter = new_converter()


_hooks: dict[type[Any], Callable[[Any], Any]] = {}


def unstructure(value: Any) -> Any:
    """`converter.unstructure`, with the per-class hook looked up once (the hot path)."""
    cls = type(value)
    hook = _hooks.get(cls)
    if hook is None:
        hook = _hooks[cls] = converter.get_unstructure_hook(cls)
    return hook(value)


def encode(item: Any) -> bytes:
    """A wire object as the line a peer reads: JSON, then LF. Every front encodes what it
    writes here, once, at its edge."""
    kind = getattr(item, "type", None)
    if kind == "message_update":  # (naming the class would load it)
        return _encode_update(item)
    if kind in _CARRYING:
        line = _encode_carrying(item, kind)
        if line is not None:
            return line
    if type(getattr(item, "data", None)).__name__ == "EntryTree":  # (by name: as above)
        return _encode_tree(item)
    return encode_line(unstructure(item))


def _encode_tree(answer: w.Response) -> bytes:
    """A response carrying a session's tree (`get_tree`, `navigate_tree`), as `encode`
    writes any other, but written without recursion: the tree nests as deep as the session
    is long (a node per entry), deeper than cattrs, orjson or the interpreter's stack go."""
    tree = answer.data
    assert isinstance(tree, w.EntryTree)
    marker = f"\0{os.urandom(8).hex()}\0"  # in no id a client chose
    line = encode_line(unstructure(attrs.evolve(answer, data=marker)))
    shell = encode_line(unstructure(attrs.evolve(tree, tree=[])))[:-1]
    body = shell.replace(b'"tree":[]', b'"tree":' + _nodes_json(tree.tree), 1)
    return line.replace(encode_line(marker)[:-1], body, 1)


def _nodes_json(nodes: list[w.TreeNode]) -> bytes:
    """`nodes` as a JSON array, each node's fields as `unstructure` writes them."""
    parts: list[bytes] = [b"["]
    stack: list[w.TreeNode | bytes] = [b"]"]  # what is still to write, the next last

    def push(items: list[w.TreeNode]) -> None:  # to write in order, commas between
        for index, node in reversed(list(enumerate(items))):
            stack.append(node)
            if index:
                stack.append(b",")

    push(nodes)
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):
            parts.append(item)
            continue
        own = encode_line(unstructure(attrs.evolve(item, children=[])))[:-1]
        head, _, tail = own.partition(b'"children":[]')
        parts.append(head + b'"children":[')
        stack.append(b"]" + tail)
        push(item.children)
    return b"".join(parts)


_ended: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()
"""The JSON of each message of the run whose ``message_end`` was encoded, until its
``agent_end`` is: a message does not change once it has ended, and ``turn_end`` and
``agent_end`` carry it again (an aborted run's closing events are made while its command
dies: what they take counts). Only `encode` fills it: a front that writes otherwise (the
daemon's, ACP) keeps nothing here."""
_CARRYING = frozenset({"message_start", "message_end", "turn_end", "agent_end"})


def _json_of(data: Any) -> bytes | None:
    """`data` as `encode_line` writes it within a line, two levels deep (None where only the
    general way writes it as `encode` does: what orjson refuses, a value too deep among
    them, makes the whole line ASCII)."""
    try:
        return separators_escaped(orjson.dumps([[data]])[2:-2])  # (as deep as agent_end)
    except TypeError:
        return None


def _message_json(message: Any, *, ending: bool) -> bytes | None:
    """`message`'s JSON within a line (`_json_of`): as it ended, or made now (and kept
    when it is ending)."""
    body = _ended.get(message)
    if body is None:
        body = _json_of(unstructure(message))
        if body is not None and ending:
            _ended[message] = body
    return body


def _encode_carrying(item: Any, kind: str) -> bytes | None:
    """`encode` for the events carrying whole messages, each message's JSON made once it
    has ended (a reply's ``message_start`` is written as it streams: made the general way);
    None for the general way."""
    if kind == "message_start" and item.message.role == "assistant":
        return None
    if kind in ("message_start", "message_end"):  # (a message not a reply: already whole)
        body = _message_json(item.message, ending=True)
        return None if body is None else b'{"type":"%s","message":%s}\n' % (kind.encode(), body)
    messages = [item.message, *item.tool_results] if kind == "turn_end" else item.messages
    bodies = [_message_json(message, ending=False) for message in messages]
    if kind == "agent_end":  # the run is over: what it kept goes
        for message in messages:
            _ended.pop(message, None)
    if None in bodies:
        return None
    if kind == "turn_end":
        return b'{"type":"turn_end","message":%s,"toolResults":[%s]}\n' % (
            bodies[0], b",".join(bodies[1:]))  # type: ignore[arg-type]
    return b'{"type":"agent_end","messages":[%s],"willRetry":%s}\n' % (
        b",".join(bodies), b"true" if item.will_retry else b"false")  # type: ignore[arg-type]


_update_head: list[Any] = [None, b""]
"""The last ``message_update``'s usage, as a tuple of its numbers, and the line's start up
to its ``assistantMessageEvent``: a reply's deltas mostly share one usage."""


def _encode_update(item: w.MessageUpdate) -> bytes:
    """`encode` for the most frequent event: the same bytes, its usage encoded once while it
    does not change (a stream of deltas: 20,000 of them in a long reply)."""
    usage, cost = item.usage, item.usage.cost
    key = (usage.input, usage.output, usage.cache_read, usage.cache_write, usage.total_tokens,
           cost.input, cost.output, cost.cache_read, cost.cache_write, cost.total)
    try:
        if key != _update_head[0]:
            _update_head[0] = None
            _update_head[1] = (b'{"type":"message_update","usage":' + orjson.dumps(
                unstructure(usage)) + b',"assistantMessageEvent":')
            _update_head[0] = key
        event = orjson.dumps(unstructure(item.assistant_message_event),
                             option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # what orjson refuses: the general way, whose fallback writes it all
        return encode_line(unstructure(item))
    if not event.isascii() and (b"\xe2\x80\xa8" in event or b"\xe2\x80\xa9" in event):
        return encode_line(unstructure(item))
    head: bytes = _update_head[1]
    return head + event[:-1] + b"}\n"


def prepare(cls: type[Any]) -> None:
    """Build `cls`'s unstructure hook now. cattrs builds a class's hook when it is first
    used, a millisecond or more for a class with nested unions: prepared while the process
    waits for input, no event or abort pays for that later. (Commands' structure hooks are
    left to their first use: each is a fraction of a millisecond.)

    Prepare every class twice: cattrs forgets the hooks it cached whenever it builds one for
    a list type it has not seen, which the first pass does (and the second never)."""
    _hooks[cls] = converter.get_unstructure_hook(cls)


URGENT_COMMANDS = ("abort", "abort_bash", "abort_retry", "prompt")
"""The commands whose structure hooks are built ahead (`prepare_command`): those that stop
what runs (0.3-0.4 ms each at first use, on the way to killing a command) and the prompt
(1.4 ms). The others' are left to their first use."""


def prepare_command(name: str) -> None:
    converter.get_structure_hook(w.COMMAND_CLASSES[name])


def rehearsals() -> list[Any]:
    """One of each event a first run writes, holding every kind of content: encoded once
    while the process waits (first thing after the providers load), they make cattrs build
    the hooks of the classes and unions nested in them, which it builds at their first use
    (3-5 ms for a first ``turn_end``), so an abort's closing events never pay for that."""
    call = w.ToolCall(id="", name="", arguments={})
    reply = w.AssistantMessage(api="", provider="", model="", timestamp=0, content=[
        w.TextContent(text=""), w.ThinkingContent(thinking=""), call])
    result = w.ToolResultMessage(tool_call_id="", tool_name="", is_error=False, timestamp=0,
                                 content=[w.TextContent(text=""),
                                          w.ImageContent(data="", mime_type="image/png")])
    user = w.UserMessage(content=[w.TextContent(text="")], timestamp=0)
    return [w.TurnEnd(message=reply, tool_results=[result]),
            w.AgentEnd(messages=[user, reply, result]),
            w.MessageStart(message=reply), w.MessageEnd(message=result),
            w.MessageEnd(message=user), w.ToolExecutionEnd(
                tool_call_id="", tool_name="", is_error=False,
                result=w.ToolResult(content=[w.TextContent(text="")]))]


def sent_classes() -> list[type[Any]]:
    """Every wire class forged writes: events, responses and what they hold (loading the
    modules `forged._wire` leaves to first use)."""
    modules = [w.base, *(importlib.import_module(f"{w.__name__}.{name}")
                         for name in ("messages", "events", "responses"))]
    return [value for module in modules for value in vars(module).values()
            if isinstance(value, type) and attrs.has(value)
            and value.__module__ == module.__name__ and value is not w.GetState]


def structure(value: Any, cls: type[T]) -> T:
    """Convert a JSON value to `cls`, or raise `WireError` naming the bad field."""
    try:
        return converter.structure(value, cls)
    except cattrs.BaseValidationError as exc:
        raise WireError(describe_error(exc)) from exc
    except (ValueError, TypeError) as exc:
        raise WireError(str(exc)) from exc


def _describe(exc: BaseException, path: str) -> str:
    message = str(exc)
    if isinstance(exc, KeyError):
        return f"missing required field '{path}'"
    if not message or isinstance(exc, TypeError):
        message = "invalid value"
    return f"invalid field '{path}': {message}"


def describe_error(exc: cattrs.BaseValidationError) -> str:
    problems: list[str] = []

    def walk(error: BaseException, path: str) -> None:
        if isinstance(error, cattrs.ClassValidationError):
            with_notes, others = error.group_exceptions()
            for inner, note in with_notes:
                walk(inner, f"{path}.{camel(note.name)}" if path else camel(note.name))
            for inner in others:
                walk(inner, path)
        elif isinstance(error, cattrs.IterableValidationError):
            with_index, rest = error.group_exceptions()
            for inner, index_note in with_index:
                walk(inner, f"{path}[{index_note.index}]")
            for inner in rest:
                walk(inner, path)
        elif isinstance(error, cattrs.BaseValidationError):
            for inner in error.exceptions:
                walk(inner, path)
        else:
            problems.append(_describe(error, path))

    walk(exc, "")
    return "; ".join(problems) or str(exc)
