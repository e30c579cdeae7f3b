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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from . import _config, _telemetry, _wire as w
from ._config import Models, find_stored, list_stored, one_session
from ._connection import Connection, Transport
from ._devices import OWNER, Access, Principal, folder_refusal, refusal
from ._dispatch import Reply
from ._errors import CommandError, ForgedError, NotPaired
from ._live import EMPTY_IDLE_UNLOAD_S, LiveSession
from ._log import log
from ._notify import Nudge
from ._opening import SessionConfig
from ._paths import agent_dir
from ._settings import DEFAULTS
from ._ui import answer_words
from ._webpush import WebPush

PEER_QUEUE_BYTES = 16 * 1024 * 1024
"""A client with more than this unread is cut off."""
IDLE_UNLOAD_S = float(DEFAULTS["daemon.idleUnloadSeconds"])
UNLOAD_WAIT_S = 2.0
"""How long `Hub.unload` waits for the clients leaving a session to be gone."""
STALLED_S = 5.0
BURST_FACTOR = 4
MAX_LIVE_SESSIONS = int(DEFAULTS["daemon.maxSessions"])
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
        await _telemetry.ready()  # (counted once telemetry that is on has started)
        if config.session_path is not None:  # a file a live session holds: that session
            path = config.session_path.expanduser().resolve()
            for live in self.live:
                if live.session.store.path == path:
                    return live
        self._make_room()
        live = LiveSession(config)
        live.nudge = self.nudge

        async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            _telemetry.tracing.count("sessions", 1)
            try:
                await live.serve(self.idle_unload_s, self.empty_unload_s,
                                 task_status=task_status)
            finally:
                if live in self.live:
                    self.live.remove(live)
                for peer in list(live.clients):
                    live.detach(peer)
                live.closed.set()
                _telemetry.tracing.count("sessions", -1)

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
        live = self.find_live(chosen)
        if live is not None and not live.session.idle:
            raise CommandError(f"Session {chosen} still runs in the daemon")
        held = peer.live if peer.live is live and live is not None else None
        if held is not None:
            seq = held.seq
            held.detach(peer)
        try:
            await self.unload(chosen)
        except CommandError:
            if held is not None:  # back as it was, what came meanwhile given first
                held.attach(peer, seq)
            raise
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
                reply.ok(await self.push.handle(principal, command))
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

    def _paired(self, name: str, digest: str) -> bool:
        device = self.access.devices.fresh().devices.get(name) if self.access else None
        return device is not None and device.digest == digest

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
