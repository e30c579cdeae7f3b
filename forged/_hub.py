"""The daemon's sessions: the live ones, the clients attached to each, and their event streams.

A `LiveSession` owns one `Session` and outlives its clients. Every event it emits is stamped
with its ``sessionId`` and a per-session ``seq`` (written first in the object), kept in a
bounded replay buffer, and put in the outbox of every attached `Peer`. A peer's outbox is
bounded too: a client that stops reading is cut off (and may reattach with ``sinceSeq``)
instead of slowing the session or the other clients. Responses go only to the client that
sent the command.

A connection behaves like ``forged --mode rpc`` on its own session: its first session
command, if it has not attached, starts a new live session for it (the one its
``new_session`` described, if it sent one: a connection that ends before a command needs a
session leaves none behind). End of input on a
connection means what it means on stdin: what runs finishes, then the connection closes.
A session with no clients that stays idle for `Hub.idle_unload_s` is unloaded.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from . import _codec, _config, _wire as w
from ._config import Models, daemon_setting, find_stored, list_stored, one_session
from ._connection import Connection, Transport
from ._devices import OWNER, Access, Principal, allows, folder_refusal, refusal
from ._dispatch import Agent, Reply, open_agent
from ._errors import CommandError, ForgedError, NotPaired
from ._jsonl import encode_line
from ._log import log
from ._notify import Nudge, run_outcome
from ._opening import SessionConfig
from ._paths import agent_dir
from ._session import Session
from ._settings import DEFAULTS
from ._ui import answer_words
from ._webpush import WebPush

REPLAY_EVENTS = 10_000
REPLAY_BYTES = 16 * 1024 * 1024
PEER_QUEUE_BYTES = 16 * 1024 * 1024
"""A client with more than this unread is cut off."""
IDLE_UNLOAD_S = float(DEFAULTS["daemon.idleUnloadSeconds"])
EMPTY_IDLE_UNLOAD_S = 10.0
"""How long a session that holds nothing yet stays loaded once its last client left: a
dropped connection's fresh session is not worth keeping, and cheap to make again."""
UNLOAD_WAIT_S = 2.0
"""How long `Hub.unload` waits for the clients leaving a session to be gone."""
STALLED_S = 5.0
BURST_FACTOR = 4
MAX_LIVE_SESSIONS = int(DEFAULTS["daemon.maxSessions"])
PERMISSION_WAIT_S = float(DEFAULTS["daemon.permissionWaitSeconds"])
"""How long a permission request waits while no client is attached (`forged._ui`)."""
"""Live sessions at most; past it a new one first unloads an idle session no client holds."""


class Peer(Connection):
    """One client connection (`forged._connection.Connection`): the session it is attached
    to, and the scope that cutting it off cancels. Its commands go to `Hub.handle`."""

    def __init__(self, hub: Hub, name: str, transport: Transport,
                 principal: Principal = OWNER) -> None:
        super().__init__(transport)
        self.hub = hub
        self.name = name
        self.principal = principal
        """Who it is, and so what it may do (`forged._devices.needed_role`)."""
        self.queue_limit_bytes = hub.queue_limit_bytes
        self.live: LiveSession | None = None
        self.opening: SessionConfig | None = None
        """The session its ``new_session`` asked for, opened by its first command that needs
        one (a connection that ends before sending one leaves nothing behind)."""
        self.scope = trio.CancelScope()
        self.closing = False
        """Its input ended: it waits for its session to settle, and answers no dialog."""
        self.cut_off_reason: str | None = None
        self.plain = False
        """It reads what ``forged --mode rpc`` writes: no stamps, no ``extension_ui_resolved``
        (``forged connect``, which copies it to its client byte for byte)."""

    def put_line(self, line: bytes) -> None:
        """Queue `line`. A peer is cut off for not reading: when more than
        `queue_limit_bytes` wait and it has taken nothing for `STALLED_S`, or more than
        `BURST_FACTOR` times that wait. One large message, which a run's closing events
        repeat (message_end, turn_end, agent_end), cuts off no peer that reads."""
        if self.cut_off_reason is not None:
            return
        waiting = self.outbox.pending_bytes
        if waiting > self.queue_limit_bytes and (
                self.outbox.stalled_s >= STALLED_S
                or waiting > BURST_FACTOR * self.queue_limit_bytes):
            self.cut_off(f"it stopped reading ({waiting} bytes unread)")
            return
        self.outbox.put(line)

    def cut_off(self, reason: str) -> None:
        self.cut_off_reason = reason
        log(f"disconnecting {self.name}: {reason}")
        if self.live is not None:
            self.live.detach(self)
        self.scope.cancel()

    async def handle(self, command: w.Command | w.DaemonCommand,
                     command_id: str | int | None) -> None:
        await self.hub.handle(self, command, command_id)

    async def end_of_input(self) -> None:
        """As at the end of stdin: no more answers from it, and its session settles."""
        self.closing = True
        if self.live is not None:
            live = self.live
            live.update_interactive()
            await live.agent.wait_idle()

    def broken(self) -> None:
        if self.cut_off_reason is None:
            self.cut_off("the connection broke")


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
        if self._unclaimed.is_set():
            self._unclaimed = trio.Event()
        self._stirred.set()
        peer.live = self
        self.update_interactive()
        return w.AttachResult(session_id=self.id, seq=self.seq,
                              replayed=len(replayed) + len(open_message),
                              missed=missed), open_message

    def detach(self, peer: Peer) -> None:
        if peer in self.clients:
            self.clients.remove(peer)
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


@attrs.define(kw_only=True, eq=False, repr=False)
class SessionRequest:
    """What a new live session is to be: a cwd, a model, a stored file to continue."""

    cwd: Path | None = None
    provider: str | None = None
    model: str | None = None
    session_path: Path | None = None
    session: str | None = None
    """A path or id prefix, as ``--session``."""
    continue_recent: bool = False
    session_name: str | None = None
    no_session: bool = False
    permission_mode: str | None = None
    mcp_servers: dict[str, Any] = attrs.Factory(dict)
    """MCP servers the client hands the session, as mcp.json entries."""
    fork: str | None = None
    """A session file whose active branch the new session copies (as ``--fork``)."""


class Hub:
    """Every live session of the daemon, and the commands only the daemon has."""

    def __init__(self, make_config: Callable[[SessionRequest], SessionConfig],
                 nursery: trio.Nursery, *, idle_unload_s: float = IDLE_UNLOAD_S,
                 empty_unload_s: float = EMPTY_IDLE_UNLOAD_S,
                 queue_limit_bytes: int = PEER_QUEUE_BYTES,
                 max_live_sessions: int = MAX_LIVE_SESSIONS) -> None:
        self._make_config = make_config
        self._nursery = nursery
        self.idle_unload_s = idle_unload_s
        self.empty_unload_s = empty_unload_s
        self.max_live_sessions = max_live_sessions
        self.queue_limit_bytes = queue_limit_bytes
        self.live: list[LiveSession] = []
        self._starting = 0
        """Live sessions being opened: they count against `max_live_sessions` already."""
        self.peers: list[Peer] = []
        self.default_cwd = Path.cwd()
        self.models: Models | None = None
        """The daemon's models (`authenticate` of an ACP editor reads them again)."""
        self.access: Access | None = None
        """The paired devices and their codes (the daemon's WebSocket, docs/remote.md)."""
        self.nudge: Callable[[Nudge], None] | None = None
        self.push = WebPush(agent_dir(), paired=self._paired)
        """The subscribed browsers of paired devices (its worker: the daemon's)."""
        """Where the sessions' nudges go (`forged._notify.Notifier.send`), once targets are
        configured."""

    def forget_peer(self, peer: Peer) -> None:
        if peer.live is not None:
            peer.live.detach(peer)
        if peer in self.peers:
            self.peers.remove(peer)

    async def serve_connection(self, name: str, transport: Transport,
                               principal: Principal = OWNER) -> None:
        """One connection, whatever its transport, until its input ends and its session
        settled, or it is cut off; what was written to it is flushed first, and the
        transport closed. `principal`: whom it stands for (the local owner by default)."""
        peer = Peer(self, name, transport, principal)
        self.peers.append(peer)
        if self.revoked(principal):  # while its connection was being accepted
            peer.cut_off(f"its device {principal.device} was revoked")
        log(f"{name} connected" + ("" if principal.device is None else
                                   f" as device {principal.device} ({principal.role})"))
        try:
            with peer.scope:
                await peer.serve()
        finally:
            self.forget_peer(peer)
            await transport.aclose()
            log(f"{name} disconnected")

    # --- sessions ------------------------------------------------------------------------------

    async def session_config(self, request: SessionRequest) -> SessionConfig:
        """What `request` asks for (settings, models and plugin files are read off the
        loop: other sessions go on); `CommandError` saying why it cannot be."""
        try:
            return await trio.to_thread.run_sync(self._make_config, request)
        except ForgedError as exc:
            raise CommandError(str(exc)) from exc

    async def open_live(self, config: SessionConfig) -> LiveSession:
        """A live session of `config`: the one that holds its file already, else a new one,
        once there is room (`max_live_sessions`, counted with those being opened)."""
        if config.session_path is not None:  # a file a live session holds: that session
            path = config.session_path.expanduser().resolve()
            for live in self.live:
                if live.session.store.path == path:
                    return live
        self._make_room()
        live = LiveSession(config)
        live.nudge = self.nudge

        async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                await live.serve(self.idle_unload_s, self.empty_unload_s,
                                 task_status=task_status)
            finally:
                if live in self.live:
                    self.live.remove(live)
                for peer in list(live.clients):
                    live.detach(peer)
                live.closed.set()

        self._starting += 1
        try:
            await self._nursery.start(serve)
        finally:
            self._starting -= 1
        self.live.append(live)
        return live

    def _make_room(self, *, unload: bool = True) -> None:
        """Unload an idle session no client holds (an empty one first) when the live ones
        and those being opened are at the limit (unless not `unload`: only check there could
        be room); `CommandError` when none is idle. No await comes between this and the
        count growing: simultaneous openings cannot pass it."""
        loaded = len(self.live) + self._starting
        if loaded < self.max_live_sessions:
            return
        idle = sorted((live for live in self.live if live.idle), key=lambda live: not live.empty)
        if not idle:
            raise CommandError(f"Too many live sessions ({loaded}, all in use); end one first")
        if not unload:
            return
        log(f"unloading session {idle[0].id}: {self.max_live_sessions} live sessions at most")
        idle[0].unload_scope.cancel()
        self.live.remove(idle[0])

    async def unload(self, session_id: str) -> None:
        """The live session `session_id` unloaded, if live (its file closed): once no
        client is attached (those leaving it go; `UNLOAD_WAIT_S` at most); `CommandError`
        while another client holds it, or it runs."""
        live = self.find_live(session_id)
        if live is None:
            return
        with trio.move_on_after(UNLOAD_WAIT_S):
            await live.unclaimed()
        if live.clients:
            raise CommandError(f"Session {session_id} is open in another client of the "
                               f"daemon ({len(live.clients)} attached)")
        if not live.session.idle:
            raise CommandError(f"Session {session_id} still runs in the daemon")
        live.unload_scope.cancel()
        await live.closed.wait()

    async def delete(self, peer: Peer, session_id: str) -> w.Deleted:
        """The stored session `session_id` names (an id, or the start of one) deleted:
        `peer` leaves it, it is unloaded (`unload`'s refusals), then its file goes."""
        stored = find_stored(session_id)
        chosen = one_session(session_id, set(stored))
        if peer.live is not None and peer.live.id == chosen:
            peer.live.detach(peer)
        await self.unload(chosen)
        path = stored[chosen][0]
        await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
        log(f"deleted session {chosen} ({path}) for {peer.name} ({peer.principal.name})")
        return w.Deleted(session_id=chosen, path=str(path))

    def find_live(self, session_id: str) -> LiveSession | None:
        return next((live for live in self.live if live.id == session_id), None)

    def list_sessions(self, cwd: Path) -> w.SessionList:
        return w.SessionList(sessions=[live.info() for live in self.live],
                             stored=list_stored(cwd), cwd=str(cwd))

    # --- a peer's commands ---------------------------------------------------------------------

    async def handle(self, peer: Peer, command: w.Command | w.DaemonCommand,
                     command_id: str | int | None) -> None:
        reply = Reply(peer.send, command.type, command_id)
        principal = peer.principal
        if self.revoked(principal):  # by another process (forged devices revoke)
            peer.cut_off(f"its device {principal.device} was revoked")
            return
        refused = refusal(principal, command, attached=peer.live is not None)
        if (refused is None and principal.role != "owner" and isinstance(command, w.NewSession)
                and command.cwd):
            refused = folder_refusal(command.cwd, [self.default_cwd,
                                                   *(live.session.cwd for live in self.live)])
        if refused is not None:
            log(f"refused {command.type} from {peer.name} ({principal.name}): {refused}")
            reply.fail(refused)
            return
        if isinstance(command, w.ExtensionUiResponse):
            log(f"dialog {command_id} answered by {peer.name} ({principal.name}): "
                f"{answer_words(command)}")
        try:
            if isinstance(command, w.ListSessions):
                cwd = _config.command_folder(command.cwd, existing=False) if command.cwd else (
                    peer.live.session.cwd if peer.live else
                    self.default_cwd)
                reply.ok(self.list_sessions(cwd))
            elif isinstance(command, w.Attach):
                peer.plain = peer.plain or command.plain
                attached, open_message = await self.attach(peer, command.session_id,
                                                           command.since_seq)
                reply.ok(attached)
                for line in open_message:  # before any event that follows: no await between
                    peer.put_line(line)
            elif isinstance(command, w.PairDevice):
                reply.ok(self._access().offer(command.name, command.role,
                                              trio.current_time()))
            elif isinstance(command, w.ListDevices):
                reply.ok(self._access().listing(lambda name: sum(
                    1 for peer in self.peers if peer.principal.device == name)))
            elif isinstance(command, w.RevokeDevice):
                reply.ok(self.revoke_device(command.name, by=peer))
            elif isinstance(command, w.UnloadSession):
                await self.unload(command.session_id)
                reply.ok()
            elif isinstance(command, w.PUSH_COMMANDS):
                reply.ok(self.push.handle(principal.device, command))
            elif isinstance(command, w.DeleteSession):
                reply.ok(await self.delete(peer, command.session_id))
            elif isinstance(command, w.Detach):
                peer.opening = None
                if peer.live is not None:
                    peer.live.detach(peer)
                reply.ok()
            elif isinstance(command, w.NewSession) and (
                    peer.live is None or command.cwd or command.provider or command.model
                    or command.session or command.continue_recent or command.no_session
                    or command.session_name or command.mcp_servers
                    or command.permission_mode or command.fork):
                peer.plain = peer.plain or command.plain
                config = await self.session_config(SessionRequest(
                    cwd=_config.command_folder(command.cwd) if command.cwd else None,
                    provider=command.provider, model=command.model, session=command.session,
                    continue_recent=command.continue_recent,
                    session_name=command.session_name, no_session=command.no_session,
                    permission_mode=command.permission_mode,
                    mcp_servers=command.mcp_servers or {}, fork=command.fork))
                if peer.live is None:  # opened by the first command that needs it
                    self._make_room(unload=False)  # (refused now, if it could not be)
                    peer.opening = config
                else:
                    self._move(peer, await self.open_live(config))
                reply.ok(w.SwitchResult())
            else:
                if peer.live is None:
                    opening, peer.opening = peer.opening, None
                    self._move(peer, await self.open_live(
                        opening or await self.session_config(SessionRequest())))
                assert peer.live is not None
                peer.live.agent.handle(command, command_id, peer.send)
        except Exception as exc:  # a bug or an unforeseen input: this command's, not the daemon's
            reply.failed(exc)

    # --- devices (docs/remote.md) --------------------------------------------------------------

    def _paired(self, device: str) -> bool:
        return self.access is not None and device in self.access.devices.fresh().devices

    def revoked(self, principal: Principal) -> bool:
        return (principal.device is not None and self.access is not None
                and not self.access.current(principal))

    def _access(self) -> Access:
        if self.access is None:
            raise CommandError("this daemon keeps no paired devices")
        return self.access

    def revoke_device(self, name: str, *, by: Peer | None = None) -> w.Revoked:
        """`name` forgotten, and each of its connections cut off now."""
        access = self._access()
        try:
            access.devices.revoke(name)
        except NotPaired as exc:
            raise CommandError(str(exc)) from None
        self.push.forget_device(name)
        ended = [peer for peer in self.peers if peer.principal.device == name]
        for peer in ended:
            peer.cut_off(f"its device {name} was revoked")
        log(f"revoked device {name}" + (f" (by {by.name})" if by else "")
            + f": {len(ended)} connection(s) ended")
        return w.Revoked(device=name, disconnected=len(ended))

    def _move(self, peer: Peer, live: LiveSession) -> None:
        if peer.live is not None and peer.live is not live:
            peer.live.detach(peer)
        live.attach(peer, None)

    async def attach(self, peer: Peer, session_id: str, since_seq: int | None
                     ) -> tuple[w.AttachResult, list[bytes]]:
        """`peer` attached to the session `session_id` names (its id, or the start of one
        session's id, live or stored); what `LiveSession.attach` gives."""
        live = self.find_live(session_id)
        if live is None:
            lives = {live.id: live for live in self.live
                     if session_id and live.id.startswith(session_id)}
            stored = find_stored(session_id)
            chosen = one_session(session_id, {*lives, *stored})
            live = lives.get(chosen)
            if live is None:
                path, cwd = stored[chosen]
                live = await self.open_live(await self.session_config(
                    SessionRequest(cwd=cwd, session_path=path)))
        peer.opening = None
        if peer.live is not None and peer.live is not live:
            peer.live.detach(peer)
        return live.attach(peer, since_seq)
