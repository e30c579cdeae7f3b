"""The daemon (``forged serve``): many sessions over a Unix socket and a WebSocket, until a
signal; then the drain.

Its supervision tree::

    run_daemon
    └── daemon_nursery
        ├── ScriptedServer.serve            the scripted provider (--provider scripted only)
        ├── warm_up                         providers and converter hooks, before any prompt
        ├── _keep_watchdog_fed              systemd's watchdog, with a status line
        └── sessions_nursery                the `Hub`'s: its live sessions
            ├── LiveSession.serve           one per live session; unloads it when idle with
            │   │                           no client
            │   └── open_agent → session_nursery
            │                               as in stdio mode (`forged._fronts.stdio`):
            │                               Runner._drive and its run, dispatcher tasks,
            │                               direct bash, plugin observers
            └── peers_nursery               the connections: they outlive the listeners
                ├── listen_nursery          cancelled by the stop signal: nothing new
                │   ├── serve_unix          the Unix socket's accept loop (`_transports.unix`)
                │   └── serve_websocket     the WebSocket's (`_transports.websocket`)
                └── Hub.serve_connection    one per connection, started by a listener
                    └── Peer.serve → connection_nursery
                                            its writer, reader and dispatch, as on stdio
                                            (`forged._connection.Connection`)

A connection's command goes to `Hub.handle`: the daemon's own commands are answered there,
every other one goes to its live session's agent, and from there down as in stdio mode.
Events come back through `LiveSession.broadcast`, which stamps them as it encodes them and
puts the line in every attached peer's outbox.

SIGHUP loads the WebSocket's TLS certificate again (`forged._transports.websocket.Tls`): the
connections that follow use it, those open keep theirs, the sessions go on.

Stopping (SIGTERM, SIGINT or `stop`): the listeners close; runs may finish for the
drain grace, then are aborted (their closing events are written); every client is flushed
for `FLUSH_S`; the sessions are unloaded and their files closed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from . import _systemd as systemd
from ._config import Models, Options, ServeOptions, daemon_setting, open_models, session_config
from ._connection import FLUSH_S, SHUTDOWN_GRACE_S
from ._devices import Access, Devices
from ._errors import ConfigError
from ._hub import IDLE_UNLOAD_S, MAX_LIVE_SESSIONS, PEER_QUEUE_BYTES, Hub, SessionRequest
from ._live import EMPTY_IDLE_UNLOAD_S
from ._log import log
from ._notify import Notifier, Nudge, shown_url, targets_from
from ._opening import SessionConfig
from ._paths import agent_dir, default_socket_path, make_ws_token, runtime_dir
from ._settings import DEFAULTS, Settings
from ._tools import guard

if TYPE_CHECKING:
    from ._transports.websocket import Tls

# --- the daemon --------------------------------------------------------------------------------

DRAIN_GRACE_S = float(DEFAULTS["daemon.drainSeconds"])


async def run_daemon(options: Options, serve: ServeOptions, *, models: Models | None = None,
                     stop: trio.Event | None = None,
                     task_status: trio.TaskStatus[Hub] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve sessions on the Unix socket (and WebSocket) until SIGTERM or SIGINT (or `stop`),
    then drain: stop accepting, let runs finish for the grace period, abort the rest (their
    closing events are written), flush every client and session file, and return. `models`
    replaces loading them from the options."""
    from ._transports.unix import bind_unix

    idle_unload_s = serve.idle_unload_s if serve.idle_unload_s is not None else (
        daemon_setting("idleUnloadSeconds", IDLE_UNLOAD_S))
    drain_grace_s = serve.drain_grace_s if serve.drain_grace_s is not None else (
        daemon_setting("drainSeconds", DRAIN_GRACE_S))
    max_live_sessions = serve.max_live_sessions or max(1, int(
        daemon_setting("maxSessions", MAX_LIVE_SESSIONS)))
    passed = systemd.listen_sockets()
    unix_sockets = [trio.socket.from_stdlib_socket(s) for s in passed
                    if s.family == socket.AF_UNIX]
    tcp_sockets = [trio.socket.from_stdlib_socket(s) for s in passed
                   if s.family != socket.AF_UNIX]
    socket_path = serve.socket_path or default_socket_path()
    bound = not unix_sockets
    if bound:
        unix_sockets = [bind_unix(socket_path)]
    guard.SERVED_SOCKETS.append(socket_path)
    pid_path = runtime_dir(socket_path) / "forged.pid"
    pid_path.write_text(f"{os.getpid()}\n")
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as daemon_nursery:
                models = models or await open_models(options, daemon_nursery)
                if options.script is not None:
                    log(f"--script {options.script}: one playback for the whole daemon; its "
                        "sessions take the replies in turn, whichever asks")

                def make_config(request: SessionRequest) -> SessionConfig:
                    asked = Models(registry=models.registry,
                                   provider=request.provider or models.provider,
                                   pattern=request.model or (
                                       None if request.provider else models.pattern))
                    return session_config(attrs.evolve(
                        options, cwd=request.cwd or options.cwd,
                        model=request.model or options.model,
                        session=(str(request.session_path) if request.session_path
                                 else request.session),
                        continue_=request.continue_recent,
                        session_name=request.session_name or options.session_name,
                        no_session=request.no_session or options.no_session,
                        permission_mode=request.permission_mode or options.permission_mode,
                        fork=request.fork, mcp_handed=request.mcp_servers), asked)

                targets = targets_from(_daemon_section().get("notify"))
                notifier = None
                if targets:
                    notifier = Notifier(targets)
                    await daemon_nursery.start(notifier.run)
                    log(f"notifying {', '.join(shown_url(t.url) for t in targets)}")
                async with trio.open_nursery() as sessions_nursery:
                    hub = Hub(make_config, sessions_nursery, idle_unload_s=idle_unload_s,
                              queue_limit_bytes=serve.queue_limit_bytes or PEER_QUEUE_BYTES,
                              max_live_sessions=max_live_sessions,
                              empty_unload_s=(EMPTY_IDLE_UNLOAD_S if serve.empty_unload_s is None
                                              else serve.empty_unload_s))
                    hub.default_cwd = options.cwd
                    hub.models = models
                    await daemon_nursery.start(hub.push.run)
                    hub.nudge = hub.push.send if notifier is None else _both(notifier.send,
                                                                              hub.push.send)
                    async with trio.open_nursery() as peers_nursery:
                        async with trio.open_nursery() as listen_nursery:
                            tls = await _listen(hub, serve, unix_sockets, tcp_sockets,
                                                socket_path,
                                          listen_nursery, peers_nursery)
                            daemon_nursery.start_soon(_keep_watchdog_fed, hub)
                            systemd.notify("READY=1", f"STATUS={_status(hub)}")
                            task_status.started(hub)
                            await _wait_for_stop(signals, stop,
                                                 reload=tls.reload if tls else None)
                            systemd.notify("STOPPING=1")
                            listen_nursery.cancel_scope.cancel()
                        await _drain(hub, drain_grace_s)
                        await _flush_peers(hub)
                        peers_nursery.cancel_scope.cancel()
                    for live in list(hub.live):
                        live.unload_scope.cancel()
                daemon_nursery.cancel_scope.cancel()
    finally:
        with contextlib.suppress(OSError):
            pid_path.unlink()
        if bound:
            with contextlib.suppress(OSError):
                socket_path.unlink()
    log("stopped")


async def _wait_for_stop(signals: Any, stop: trio.Event | None, *,
                         reload: Callable[[], None] | None = None) -> None:
    """Until SIGTERM, SIGINT or `stop`; SIGHUP reloads the TLS certificate (`reload`) and
    the daemon goes on."""
    async with trio.open_nursery() as nursery:
        async def signalled() -> None:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    log("SIGHUP: reloading the TLS certificate" if reload else
                        "SIGHUP: nothing to reload (no TLS)")
                    if reload is not None:
                        await trio.to_thread.run_sync(reload)
                    continue
                log(f"{signal.Signals(signum).name}: draining")
                break
            nursery.cancel_scope.cancel()

        async def asked() -> None:
            if stop is not None:
                await stop.wait()
                log("asked to stop: draining")
                nursery.cancel_scope.cancel()

        nursery.start_soon(signalled)
        nursery.start_soon(asked)


async def _listen(hub: Hub, serve: ServeOptions, unix_sockets: list[Any],
                  tcp_sockets: list[Any], socket_path: Path, listen_nursery: trio.Nursery,
                  peers_nursery: trio.Nursery) -> Tls | None:
    """Start the listeners; the WebSocket's TLS, when it has one."""
    from ._transports.unix import serve_unix
    from ._transports.websocket import check_address, serve_websocket

    for listener in unix_sockets:
        await listen_nursery.start(partial(serve_unix, hub, listener,
                                           handler_nursery=peers_nursery,
                                           upgrade=serve.upgrade))
    for listener in unix_sockets:
        log(f"listening on {listener.getsockname()}")
    devices = await trio.to_thread.run_sync(Devices, agent_dir() / "devices.json")
    hub.access = access = Access(None, devices)
    if serve.ws is None and not tcp_sockets:
        return None
    tls = await trio.to_thread.run_sync(_tls, serve)
    listeners = [trio.SocketListener(s) for s in tcp_sockets]
    if serve.ws is not None:
        host, port = serve.ws
        check_address(host, serve.ws_allow_remote, tls=tls is not None,
                      insecure=serve.insecure)
        listeners += await trio.open_tcp_listeners(port, host=host)
    access.token = make_ws_token(socket_path.parent)
    await listen_nursery.start(partial(serve_websocket, hub, listeners, access,
                                       allowed_origins=serve.ws_allow_origins, tls=tls,
                                       handler_nursery=peers_nursery))
    scheme = "wss" if tls is not None else "ws"
    public = serve.public_url or _public_url()
    for listener in listeners:
        host, port, *_ = listener.socket.getsockname()
        log(f"listening on {scheme}://{host}:{port} (token in "
            f"{socket_path.parent / 'ws-token'})")
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else (
            f"[{host}]" if ":" in host else host)
        access.links.append(f"{'https' if tls else 'http'}://{shown}:{port}")
    if public:
        access.links.insert(0, public.rstrip("/"))
    return tls


def _both(first: Callable[[Nudge], None], second: Callable[[Nudge], None]
          ) -> Callable[[Nudge], None]:
    def send(nudge: Nudge) -> None:
        first(nudge)
        second(nudge)

    return send


def _daemon_section() -> dict[str, Any]:
    """The user's own settings' ``daemon`` section: never a project's (whose repository
    could point the nudges or the links elsewhere)."""
    section = Settings(agent_dir()).get("daemon")
    return section if isinstance(section, dict) else {}


def _public_url() -> str | None:
    """The settings' ``daemon.publicUrl``: where devices reach the listener (a proxy's
    address), for the links pairing hands out."""
    url = _daemon_section().get("publicUrl")
    return url if isinstance(url, str) and url.startswith(("https://", "http://")) else None


def _tls(serve: ServeOptions) -> Tls | None:
    """The listener's TLS: ``--tls-cert``/``--tls-key``, else the settings' ``daemon.tls``
    (``cert``, ``key``); `ConfigError` for one without the other, or files that do not
    load."""
    from ._transports.websocket import Tls

    cert, key = serve.tls_cert, serve.tls_key
    if cert is None and key is None:
        given = _daemon_section().get("tls")
        if isinstance(given, dict):
            cert = Path(str(given["cert"])).expanduser() if given.get("cert") else None
            key = Path(str(given["key"])).expanduser() if given.get("key") else None
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("TLS needs both a certificate and its key (--tls-cert and "
                          "--tls-key, or daemon.tls's cert and key)")
    return Tls(cert, key)


def _status(hub: Hub) -> str:
    streaming = sum(1 for live in hub.live if live.session.busy)
    return (f"{len(hub.live)} sessions ({streaming} streaming), {len(hub.peers)} clients")


async def _keep_watchdog_fed(hub: Hub) -> None:
    interval = systemd.watchdog_interval_s()
    while interval is not None:
        systemd.notify("WATCHDOG=1", f"STATUS={_status(hub)}")
        await trio.sleep(interval)


async def _drain(hub: Hub, grace_s: float) -> None:
    """Let the runs finish for `grace_s`; then abort what still runs, and wait (a little)
    for the closing events."""
    with trio.move_on_after(grace_s):
        for live in list(hub.live):
            await live.agent.wait_idle()
    busy = [live for live in hub.live if live.session.busy or live.session.settling]
    for live in busy:
        log(f"aborting session {live.id}")
        live.session.stop()
    with trio.move_on_after(SHUTDOWN_GRACE_S):
        for live in busy:
            await live.session.run.wait_settled()


async def _flush_peers(hub: Hub) -> None:
    for peer in hub.peers:
        peer.outbox.close()
    with trio.move_on_after(FLUSH_S):
        for peer in list(hub.peers):
            await peer.outbox.flushed.wait()
