"""The daemon's nudges: when a run needs the user (a permission request or a dialog waits) or
ends (finished or failed), a POST to each target of the settings' ``daemon.notify``.

A target is an ntfy topic (``kind: "ntfy"``: a plain-text message, its title, priority and
tags in ntfy's headers) or a webhook (``kind: "webhook"``: one JSON object). What goes out
names the event, the session (its name, else its folder's last component) and a fixed
summary; the nudge's `text` (a permission's title, the run's last words, an error message:
what may hold a secret, a prompt or a tool's output) goes only to a target that asked for it
with ``includeText``. A target's own ``headers`` (an access token) go to it alone and are
never logged, nor is a URL's query string or user info.

Resource handling: `Notifier.run` holds one worker per target, each with its own queue and
its own ``httpx.AsyncClient``, opened and closed by the worker; cancelling `run` ends them
and drops what their queues held. Nothing waits on a worker: `Notifier.send` only queues, so
a target that never answers delays its own later nudges and nothing else.

Error handling: `send` never raises. A delivery is tried `attempts` times in all, each
within `timeout_s`, while the failure is a connection's, a timeout, 429 or 5xx; giving up is
one log line, and the worker goes on with the next nudge.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, cast, get_args
from urllib.parse import urlsplit

import attrs
import orjson
import trio

from . import _wire as w
from ._errors import ConfigError
from ._log import log, log_exception
from ._tls import tls_context

if TYPE_CHECKING:
    import httpx

NudgeEvent = Literal["permission", "dialog", "run_end", "run_error"]
NUDGE_EVENTS: tuple[str, ...] = get_args(NudgeEvent)
TargetKind = Literal["ntfy", "webhook"]
TARGET_KINDS: tuple[str, ...] = get_args(TargetKind)

RETRY_DELAYS_S = (1.0, 3.0)
"""The wait before the second attempt, and before each one after it."""
TEXT_MAX_BYTES = 3072
"""What of a nudge's text goes out, in UTF-8."""
NTFY_MAX_BODY_BYTES = 4096
"""ntfy keeps a longer body as an attachment, not as the message."""

_NTFY_HEADERS: dict[str, tuple[str, str, str]] = {
    "permission": ("forged: permission needed", "high", "lock"),
    "dialog": ("forged: a question waits", "high", "question"),
    "run_end": ("forged: run finished", "default", "white_check_mark"),
    "run_error": ("forged: run failed", "high", "x"),
}
"""Each event's title, ntfy priority and ntfy tag (an emoji's short name)."""
_KEYS = ("url", "kind", "events", "includeText", "headers")
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
"""The characters of an HTTP header's name."""


@attrs.frozen(kw_only=True)
class Target:
    """One entry of ``daemon.notify``."""

    url: str
    kind: TargetKind
    events: frozenset[str] = frozenset(NUDGE_EVENTS)
    include_text: bool = False
    """``includeText``: the nudge's text goes out too."""
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)
    """Sent with every request to this target (an ``Authorization`` token): never shown."""


@attrs.frozen(kw_only=True)
class Nudge:
    event: str
    """One of `NUDGE_EVENTS`."""
    session_id: str
    session_name: str | None
    folder: str
    summary: str
    """What happened, in words free of anything the user or a tool wrote."""
    text: str | None = attrs.field(default=None, repr=False)
    """What only a target with ``includeText`` receives."""


def targets_from(section: object) -> list[Target]:
    """The targets of the settings' ``daemon.notify``, a list of objects with ``url``,
    ``kind`` and optionally ``events``, ``includeText`` and ``headers``; none when it is
    absent. `ConfigError` names the first invalid entry and what is wrong with it."""
    if section is None:
        return []
    if not isinstance(section, list):
        raise ConfigError("daemon.notify must be a list of targets")
    return [_target(index, entry) for index, entry in enumerate(section)]


def _target(index: int, entry: object) -> Target:
    name = f"daemon.notify[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{name}: expected an object with url and kind")
    url = entry.get("url")
    if not isinstance(url, str) or not _web_url(url):
        raise ConfigError(f"{name}: url must be an http or https URL")
    name = f"{name} ({shown_url(url)})"
    unknown = sorted(str(key) for key in entry if key not in _KEYS)
    if unknown:
        raise ConfigError(f"{name}: unknown key {unknown[0]!r} (one of {', '.join(_KEYS)})")
    kind = entry.get("kind")
    if kind not in TARGET_KINDS:
        raise ConfigError(f"{name}: kind must be one of {', '.join(TARGET_KINDS)}")
    events = entry.get("events", list(NUDGE_EVENTS))
    if not isinstance(events, list):
        raise ConfigError(f"{name}: events must be a list of {', '.join(NUDGE_EVENTS)}")
    for event in events:
        if event not in NUDGE_EVENTS:
            raise ConfigError(f"{name}: unknown event {event!r} (one of "
                              f"{', '.join(NUDGE_EVENTS)})")
    include_text = entry.get("includeText", False)
    if not isinstance(include_text, bool):
        raise ConfigError(f"{name}: includeText must be true or false")
    headers = entry.get("headers", {})
    if not isinstance(headers, dict):
        raise ConfigError(f"{name}: headers must map header names to strings")
    for header, value in headers.items():
        if not (isinstance(header, str) and header and set(header) <= _TOKEN):
            raise ConfigError(f"{name}: headers: {header!r} is not a header name")
        if not isinstance(value, str) or not _header_safe(value):
            # The value may be a secret: the message names the header only.
            raise ConfigError(f"{name}: headers: {header}'s value must be a string of "
                              "Latin-1 characters on one line")
    return Target(url=url, kind=cast("TargetKind", kind), events=frozenset(events),
                  include_text=include_text, headers=tuple(headers.items()))


def _web_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and (
            parts.port is None or parts.port > 0)
    except ValueError:  # a port that is no number, a bracket left open
        return False


def _header_safe(value: str) -> bool:
    return all((" " <= char <= "\xff" and char != "\x7f") or char == "\t" for char in value)


def shown_url(url: str) -> str:
    """`url` as a log line may show it: without its user info, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}{port}{parts.path}"


def message(nudge: Nudge) -> str:
    """``<label>: <summary>``, the label the session's name, else its folder's last
    component."""
    label = nudge.session_name or nudge.folder.rstrip("/").rsplit("/", 1)[-1] or nudge.folder
    return f"{label}: {nudge.summary}"


def request_of(target: Target, nudge: Nudge, sent_at: float
               ) -> tuple[list[tuple[str, str]], bytes]:
    """The headers and body of `nudge`'s POST to `target`, `sent_at` its Unix time."""
    title, priority, tag = _NTFY_HEADERS[nudge.event]
    text = _clipped(nudge.text, TEXT_MAX_BYTES) if target.include_text and nudge.text else None
    if target.kind == "ntfy":
        ours = [("Content-Type", "text/plain; charset=utf-8"), ("Title", title),
                ("Priority", priority), ("Tags", tag)]
        body = message(nudge) + (f"\n\n{text}" if text else "")
        data = _clipped(body, NTFY_MAX_BODY_BYTES).encode()
    else:
        ours = [("Content-Type", "application/json")]
        document: dict[str, object] = {
            "event": nudge.event, "title": title, "message": message(nudge),
            "session": {"id": nudge.session_id, "name": nudge.session_name,
                        "folder": nudge.folder},
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(sent_at))}
        if target.include_text:
            document["text"] = text
        data = orjson.dumps(document)
    # The target's own headers win over ours, whatever their case.
    merged = {name.lower(): (name, value) for name, value in [
        ("User-Agent", "forged"), *ours, *target.headers]}
    return list(merged.values()), data


def _clipped(text: str, max_bytes: int) -> str:
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes - len("…".encode())].decode(errors="ignore") + "…"


_Queued = tuple[Nudge, float]
"""A nudge and the Unix time it was sent at."""


class Notifier:
    """Sends each nudge to the targets whose events include it, one worker per target."""

    def __init__(self, targets: Sequence[Target], *, timeout_s: float = 10.0,
                 attempts: int = 3, queue: int = 64) -> None:
        self.targets = tuple(targets)
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self._queues = [trio.open_memory_channel[_Queued](max(0, queue)) for _ in self.targets]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """One worker per target until cancelled (with no target, nothing but the wait)."""
        async with trio.open_nursery() as delivery_nursery:
            for target, (_, queued_receive) in zip(self.targets, self._queues, strict=True):
                delivery_nursery.start_soon(self._deliver_all, target, queued_receive)
            task_status.started()
            await trio.sleep_forever()

    def send(self, nudge: Nudge) -> None:
        """Queue `nudge` for each target whose events include it; never blocks nor raises.
        A target whose queue is full loses it, said in one log line."""
        sent_at = time.time()
        for target, (queued_send, _) in zip(self.targets, self._queues, strict=True):
            if nudge.event not in target.events:
                continue
            try:
                queued_send.send_nowait((nudge, sent_at))
            except trio.WouldBlock:
                log(f"notify {shown_url(target.url)}: dropped the {nudge.event} nudge of "
                    f"session {nudge.session_id}: earlier ones still wait to be delivered")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the worker has ended: the daemon is shutting down

    async def _deliver_all(self, target: Target,
                           queued_receive: trio.MemoryReceiveChannel[_Queued]) -> None:
        import httpx

        async with queued_receive:
            try:
                client = httpx.AsyncClient(verify=tls_context(), timeout=None)
            except OSError as exc:  # the CA bundle (SSL_CERT_FILE) cannot be read
                log(f"notify {shown_url(target.url)}: no nudges will go there: {exc}")
                return
            async with client:
                async for nudge, sent_at in queued_receive:
                    try:
                        await self._deliver(client, target, nudge, sent_at)
                    except Exception as exc:  # a bug: the other nudges still go
                        log_exception(f"notify {shown_url(target.url)}: the {nudge.event} "
                                      f"nudge of session {nudge.session_id} failed", exc)

    async def _deliver(self, client: httpx.AsyncClient, target: Target, nudge: Nudge,
                       sent_at: float) -> None:
        headers, body = request_of(target, nudge, sent_at)
        for attempt in range(1, self.attempts + 1):
            failure, retry = await self._attempt(client, target.url, headers, body)
            if failure is None:
                return
            if not retry or attempt == self.attempts:
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                log(f"notify {shown_url(target.url)}: gave up on the {nudge.event} nudge of "
                    f"session {nudge.session_id}{tries}: {failure}")
                return
            await trio.sleep(RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S)) - 1])

    async def _attempt(self, client: httpx.AsyncClient, url: str,
                       headers: list[tuple[str, str]], body: bytes) -> tuple[str | None, bool]:
        """One POST within `timeout_s`: None if it was taken, else why not and whether
        another attempt may do better. The answer's body is never read."""
        import httpx

        with trio.move_on_after(self.timeout_s):
            try:
                async with client.stream("POST", url, headers=headers, content=body) as answer:
                    status = answer.status_code
            except httpx.HTTPError as exc:
                # Only a network error's words: others may quote a request's header.
                broken = isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError)
                detail = f": {exc}" if broken and str(exc) else ""
                timeout = isinstance(exc, httpx.TimeoutException)
                return f"{type(exc).__name__}{detail}", broken or timeout
            except OSError as exc:
                return f"{type(exc).__name__}: {exc}", True
            if 200 <= status < 300:
                return None, False
            return f"HTTP {status}", status == 429 or status >= 500
        return f"no answer within {self.timeout_s:g} s", True


def run_outcome(end: w.AgentEnd) -> tuple[str, str, str | None]:
    """A run's nudge (event, summary, text): ``run_error`` with the error when its last
    answer failed, else ``run_end`` with the answer's last words."""
    last = next((m for m in reversed(end.messages) if isinstance(m, w.AssistantMessage)),
                None)
    if last is not None and last.stop_reason == "error":
        return "run_error", "the run failed", last.error_message
    words = None if last is None else w.text_of(last.content, "") or None
    if last is not None and last.stop_reason == "aborted":
        return "run_end", "the run was stopped", words
    return "run_end", "the run finished", words
