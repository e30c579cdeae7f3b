"""A session in the daemon (`LiveSession`): its clients, its stamped events and the buffer
that replays them, its idle unloading and its nudges. `forged._hub` keeps the live ones and
routes the clients' commands.

Every event the session emits is stamped with its ``sessionId`` and a per-session ``seq``
(written first in the object), kept in a bounded replay buffer (`REPLAY_EVENTS`,
`REPLAY_BYTES`), and put in the outbox of every attached `forged._hub.Peer`; a ``plain``
peer gets what stdio would write instead.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from typing import Protocol

import orjson
import trio

from . import _codec, _telemetry, _wire as w
from ._config import daemon_setting
from ._devices import Principal, allows
from ._dispatch import Agent, open_agent
from ._jsonl import encode_line
from ._log import log
from ._notify import Nudge, run_outcome
from ._opening import SessionConfig
from ._session import Session
from ._settings import DEFAULTS


class Peer(Protocol):
    """A client as a live session sees it (`forged._hub.Peer` is the one)."""

    plain: bool
    """It reads what stdio writes: no stamps, no daemon-only events."""
    live: LiveSession | None
    closing: bool
    principal: Principal

    def put_line(self, line: bytes) -> None: ...


REPLAY_EVENTS = 10_000
REPLAY_BYTES = 16 * 1024 * 1024
PERMISSION_WAIT_S = float(DEFAULTS["daemon.permissionWaitSeconds"])
"""How long a permission request waits while no client is attached (`forged._ui`)."""
EMPTY_IDLE_UNLOAD_S = 10.0
"""How long a session that holds nothing yet stays loaded once its last client left: a
dropped connection's fresh session is not worth keeping, and cheap to make again."""


def _unstamped(line: bytes) -> bytes:
    """A kept event as a plain client gets it: without the daemon's stamps."""
    data = orjson.loads(line)
    del data["sessionId"], data["seq"]
    return encode_line(data)


DAEMON_ONLY_EVENTS = (w.ExtensionUiResolved, w.ModelChanged, w.PermissionModeChanged)
"""Events a plain client (one that reads what stdio writes) never gets."""


def _daemon_only(line: bytes) -> bool:
    return any(marker in line for marker in (
        b'"type":"extension_ui_resolved"', b'"type":"model_changed"',
        b'"type":"permission_mode_changed"'))


def _no_reply(_: w.Response) -> None:
    """A live session's commands each name their client's reply sink."""


class LiveSession:
    """A session in the daemon, and its clients; its `serve` opens the session."""

    agent: Agent
    session: Session

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.clients: list[Peer] = []
        self.seq = 0
        self.load_id = os.urandom(6).hex()
        self.dialogs: dict[str, w.ExtensionUiRequest] = {}
        """The questions and permission requests still open, as they were asked."""
        self.queue: w.QueueUpdate | None = None
        """The messages queued now, as the last ``queue_update`` said (None: none)."""
        self._replay: collections.deque[tuple[int, bytes]] = collections.deque()
        self._replay_bytes = 0
        self._open_message: int | None = None
        """The seq of the ``message_start`` of a message still streaming."""
        self.unload_scope = trio.CancelScope()
        self._unclaimed = trio.Event()
        """Set while no client is attached."""
        self._unclaimed.set()
        self._stirred = trio.Event()
        """Set by anything that restarts the idle count: a client attaching, an event."""
        self.closed = trio.Event()
        """Set once it is unloaded (its file closed)."""
        self.last_activity = int(time.time() * 1000)
        self.nudge: Callable[[Nudge], None] | None = None
        """Where its nudges go (the daemon's `forged._notify.Notifier.send`)."""
        self._outcome: Nudge | None = None
        """How its last run ended, sent at the settling (one nudge for a prompt, its
        retries and the messages queued after it)."""

    @property
    def id(self) -> str:
        return self.session.session_id

    def broadcast(self, event: w.Event) -> None:
        """`event` to every attached client, stamped with the session's id and the next
        ``seq`` (first in the object), and kept for replay (as the bytes sent); a plain
        client gets it as stdio would."""
        self._stirred.set()
        self.last_activity = int(time.time() * 1000)
        self.seq += 1
        if self.nudge is not None and isinstance(event, (w.AgentEnd, w.AgentSettled)):
            self._nudge_run(event, self.nudge)
        if isinstance(event, w.MessageStart):
            self._open_message = self.seq
        elif isinstance(event, (w.MessageEnd, w.AgentEnd)):
            self._open_message = None
        elif isinstance(event, w.ExtensionUiRequest) and event.method != "notify":
            self.dialogs[event.id] = event
        elif isinstance(event, w.ExtensionUiResolved):
            self.dialogs.pop(event.id, None)
        elif isinstance(event, w.QueueUpdate):
            self.queue = event if event.steering or event.follow_up else None
        data = _codec.unstructure(event)
        stamped = encode_line({"sessionId": self.id, "seq": self.seq, **data})
        plain = (None if isinstance(event, DAEMON_ONLY_EVENTS)
                 else encode_line(data) if any(peer.plain for peer in self.clients) else b"")
        self._replay.append((self.seq, stamped))
        self._replay_bytes += len(stamped)
        while len(self._replay) > REPLAY_EVENTS or self._replay_bytes > REPLAY_BYTES:
            self._replay_bytes -= len(self._replay.popleft()[1])
        for peer in list(self.clients):
            if not peer.plain:
                peer.put_line(stamped)
            elif plain is not None:
                peer.put_line(plain)

    def _nudge_of(self, event: str, summary: str, text: str | None) -> Nudge:
        return Nudge(event=event, session_id=self.id, session_name=self.session.session_name,
                     folder=str(self.config.cwd), summary=summary, text=text)

    def _nudge_run(self, event: w.AgentEnd | w.AgentSettled, nudge: Callable[[Nudge], None]
                   ) -> None:
        """At a run's end, keep its outcome; at the settling, send it to `nudge`."""
        if isinstance(event, w.AgentEnd):
            if not event.will_retry:
                self._outcome = self._nudge_of(*run_outcome(event))
        elif self._outcome is not None:
            nudge(self._outcome)
            self._outcome = None

    def waits(self, kind: str, title: str) -> None:
        """A permission request or a dialog waits for the user (`Dialogs.on_wait`)."""
        if self.nudge is not None:
            self.nudge(self._nudge_of(kind, "a permission request waits" if kind ==
                                      "permission" else "a question waits", title))

    def attach(self, peer: Peer, since_seq: int | None
               ) -> tuple[w.AttachResult, list[bytes]]:
        """Add `peer`; with `since_seq`, first give it the kept events after that seq.
        Without, a peer that joins while a message streams gets that message's events from
        its ``message_start`` on: they are returned, for the caller to send right after the
        answer to ``attach`` (a bridge reads nothing before it), before any later event."""
        replayed: list[bytes] = []
        missed = False
        if since_seq is not None and not peer.plain:
            oldest = self._replay[0][0] if self._replay else self.seq + 1
            missed = since_seq + 1 < oldest
            replayed = [line for seq, line in self._replay if seq > since_seq]
        for line in replayed:
            peer.put_line(line)
        open_message: list[bytes] = []
        started = self._open_message
        if (since_seq is None and started is not None and peer not in self.clients
                and self._replay and self._replay[0][0] <= started):
            kept = [line for seq, line in self._replay if seq >= started]
            open_message = kept if not peer.plain else [
                _unstamped(line) for line in kept
                if not _daemon_only(line)]
        if peer not in self.clients:
            self.clients.append(peer)
            _telemetry.tracing.count("clients", 1)
        if self._unclaimed.is_set():
            self._unclaimed = trio.Event()
        self._stirred.set()
        peer.live = self
        self.update_interactive()
        return w.AttachResult(session_id=self.id, seq=self.seq, load_id=self.load_id,
                              dialogs=list(self.dialogs.values()) or None,
                              queue=self.queue,
                              replayed=len(replayed) + len(open_message),
                              missed=missed), open_message

    def detach(self, peer: Peer) -> None:
        if peer in self.clients:
            self.clients.remove(peer)
            _telemetry.tracing.count("clients", -1)
        if not self.clients:
            self._unclaimed.set()
        if peer.live is self:
            peer.live = None
        self.update_interactive()

    def update_interactive(self) -> None:
        """Dialogs wait for an answer while some client can give one; else they are
        cancelled (as at the end of stdin), while permission requests wait for a client
        (`Dialogs.permission`). A client whose role cannot answer (``read``) counts as
        none."""
        self.session.ui.set_interactive(any(
            not peer.closing and allows(peer.principal.role, "approve")
            for peer in self.clients))

    def info(self) -> w.LiveSessionInfo:
        session = self.session
        model = session.model
        session.totals.count(session.store)
        return w.LiveSessionInfo(
            session_id=self.id, cwd=str(session.cwd), session_name=session.session_name,
            session_file=str(session.store.path) if session.store.path else None,
            state="streaming" if session.busy else "idle", clients=len(self.clients),
            provider=model.provider if model else None, model_id=model.id if model else None,
            waiting=session.ui.waiting, cost=session.totals.cost,
            last_activity=self.last_activity)

    @property
    def idle(self) -> bool:
        return not self.clients and self.session.idle

    async def unclaimed(self) -> None:
        """Until no client is attached."""
        await self._unclaimed.wait()

    @property
    def empty(self) -> bool:
        """The session holds no conversation yet (no message)."""
        return self.session.store.message_entries == 0

    async def serve(self, idle_unload_s: float, empty_unload_s: float = EMPTY_IDLE_UNLOAD_S, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the session and run it until it has been idle with no client for
        `idle_unload_s` (`empty_unload_s` while it holds no conversation), or `unload_scope`
        is cancelled; its file is closed either way."""
        with self.unload_scope:
            async with open_agent(self.config, self.broadcast, _no_reply) as agent:
                self.agent, self.session = agent, agent.session
                agent.session.ui.announce_resolved = True
                agent.session.choice.announce_changes = True
                agent.session.ui.interactive = False
                agent.session.ui.on_wait = self.waits
                agent.session.ui.client_wait_s = daemon_setting(  # (its settings, read)
                    "permissionWaitSeconds", PERMISSION_WAIT_S,
                    agent.session.settings.get("daemon", {}))
                task_status.started()
                idle_s = await self._until_idle_for(idle_unload_s, empty_unload_s)
                log(f"unloading session {self.id}: idle for {idle_s:g} s")

    async def _until_idle_for(self, idle_unload_s: float, empty_unload_s: float) -> float:
        """Until the session has been idle with no client for its time: a deadline from
        when it last became so, put off by a client attaching or the session doing
        anything (each event it emits); nothing is polled. Returns the time waited."""
        while True:
            while not self.idle:
                if self.clients:
                    await self._unclaimed.wait()
                else:
                    await self.session.wait_idle()
            idle_s = min(idle_unload_s, empty_unload_s) if self.empty else idle_unload_s
            self._stirred = trio.Event()
            with trio.move_on_after(idle_s):
                await self._stirred.wait()
                continue
            return idle_s
