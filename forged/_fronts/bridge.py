"""``forged connect`` the full way: the stdio bridge to the daemon, when the thin path
(`forged._thin`) cannot serve it.

``forged connect`` stands in for ``forged --mode rpc`` (``forged connect --acp`` for
``forged --mode acp``, each ACP session a session of the daemon): it opens a session in the
daemon (in its cwd, with its ``--provider``/``--model``, or ``--session ID`` to attach) on a
*plain* connection, which the daemon writes as stdio would (no ``sessionId``/``seq`` stamps,
no ``extension_ui_resolved``); then it copies stdin to the daemon and the daemon's lines to
stdout, whole lines only. Only the answer to its opening is read (by `forged.client`).
End of stdin means what it means to ``forged --mode rpc`` (the run finishes, then exit 0);
SIGTERM or SIGINT aborts the run first. If no daemon answers, it starts one (unless
``--no-start``), which outlives it.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import trio

from .._errors import ConfigError, Refused
from .._log import log, reserve_stdout
from .._thin import (
    CONNECT_ID,
    STOP_ANSWER,
    STOP_COMMANDS,
    daemon_pid,
    note_keys,
    refusal_of,
    why_closed,
)

START_TIMEOUT_S = 15.0
ATTACH_WITH_MODE = "--permission-mode with --attach"
"""Stands in `connect`'s list of what a running daemon cannot take for this connection."""


# --- connect -----------------------------------------------------------------------------------

def connect(args: argparse.Namespace, argv: list[str], unused: list[str]) -> int:
    """`unused`: the options given that only a daemon connect starts would take."""
    from .._paths import default_socket_path

    path = args.socket or default_socket_path()
    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    start = None if args.no_start else _serve_argv(argv, path)
    if args.acp or args.mode == "acp":
        return trio.run(_acp_bridge, path, cwd, {
            **({"provider": args.provider} if args.provider else {}),
            **({"model": args.model} if args.model else {}),
            **({"permission_mode": args.permission_mode} if args.permission_mode else {})},
            start, unused, reserve_stdout())
    if args.session and ("/" in args.session or args.session.endswith(".jsonl")):
        args.session = str((cwd / Path(args.session).expanduser()).resolve())  # not the daemon's
    opening: dict[str, str | bool] = (
        {"type": "attach", "id": CONNECT_ID, "sessionId": args.attach, "plain": True}
        if args.attach else
        {"type": "new_session", "id": CONNECT_ID, "cwd": str(cwd), "plain": True,
         **({"provider": args.provider} if args.provider else {}),
         **({"model": args.model} if args.model else {}),
         **({"sessionName": args.session_name} if args.session_name else {}),
         **({"session": args.session} if args.session else {}),
         **({"continueRecent": True} if args.continue_ else {}),
         **({"noSession": True} if args.no_session else {}),
         **({"permissionMode": args.permission_mode} if args.permission_mode else {})})
    if args.attach and args.permission_mode:
        unused = [*unused, ATTACH_WITH_MODE]
    protocol_fd = reserve_stdout()
    return trio.run(_bridge, path, opening, start, unused, protocol_fd)


async def _acp_bridge(path: Path, cwd: Path, opening: dict[str, str], start: list[str] | None,
                      unused: list[str], stdout_fd: int) -> int:
    """``forged connect --acp``: the Agent Client Protocol on stdio, each session one of the
    daemon's (a connection of its own); `opening` has the provider and model to ask for."""
    from .._connection import open_fd_stream
    from .._errors import AcpError
    from .acp import serve_acp
    from .acp.backends import InDaemon
    from .acp.jsonrpc import INTERNAL_ERROR

    async def connect() -> trio.abc.Stream:
        try:
            return await _open(path, start, unused)
        except ConfigError as exc:
            raise AcpError(INTERNAL_ERROR, str(exc)) from None

    if unused:  # said now, not at the editor's first session/new
        try:
            await (await _open(path, None, unused)).aclose()
        except Refused as exc:
            log(str(exc))
            return 2
        except (OSError, ConfigError):
            pass  # no daemon yet: the one connect starts takes them

    async with trio.open_nursery() as nursery:
        await serve_acp(InDaemon(connect, provider=opening.get("provider"),
                                 model=opening.get("model"),
                                 permission_mode=opening.get("permission_mode")),
                        nursery, open_fd_stream(0),
                        open_fd_stream(stdout_fd), default_cwd=cwd)
        nursery.cancel_scope.cancel()
    return 0


def _serve_argv(argv: list[str], path: Path) -> list[str]:
    """``forged serve`` with connect's session options, for when no daemon runs."""
    passed: list[str] = []
    arguments = iter(argv)
    for arg in arguments:  # a permission mode is the session's, not the daemon's
        if arg in ("--attach", "--socket", "--mode", "--permission-mode"):
            next(arguments, None)  # and its value
        elif arg not in ("--no-start", "--acp") and not arg.startswith(
                ("--attach=", "--socket=", "--mode=", "--permission-mode=")):
            passed.append(arg)
    return [sys.executable, "-m", "forged", "serve", "--socket", str(path), *passed]


async def _open(path: Path, start: list[str] | None, unused: list[str]) -> trio.SocketStream:
    """A connection to the daemon, started with `start` if none runs. When one ran, the
    options in `unused` (each said once) did not reach it."""
    from .._paths import open_daemon_socket

    try:
        stream = await open_daemon_socket(path)
    except OSError:
        if start is None:
            raise ConfigError(f"no forged daemon on {path} (and --no-start)") from None
    else:
        refused = refusal_of([flag for flag in unused if flag != ATTACH_WITH_MODE],
                             ATTACH_WITH_MODE in unused)
        if refused is not None:
            await stream.aclose()
            raise Refused(refused)
        unused.clear()  # said once
        note_keys(daemon_pid(str(path), stream.socket.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, 12)))
        return stream
    log_path = _start_daemon(start, path)
    with trio.move_on_after(START_TIMEOUT_S):
        while True:
            try:
                return await open_daemon_socket(path)
            except OSError:
                await trio.sleep(0.05)
    raise ConfigError(f"the forged daemon did not start on {path}; see {log_path}")


def _start_daemon(argv: list[str], path: Path) -> Path:
    """Start a daemon that outlives this process, logging beside its socket."""
    from .._paths import runtime_dir

    log_path = runtime_dir(path) / "forged.log"
    with open(log_path, "ab") as log:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True)
    return log_path


async def _bridge(path: Path, opening: dict[str, str | bool], start: list[str] | None,
                  unused: list[str], stdout_fd: int) -> int:
    from .. import _wire as w
    from .._connection import open_fd_stream
    from .._jsonl import LineSplitter, LineTooLong
    from ..client import read_line

    try:
        stream = await _open(path, start, unused)
    except ConfigError as exc:
        log(str(exc))
        return 2 if isinstance(exc, Refused) else 1
    stdin, stdout = open_fd_stream(0), open_fd_stream(stdout_fd)
    await stream.send_all(orjson.dumps(opening) + b"\n")
    opened = trio.Event()
    input_ended = trio.Event()
    failure: list[str] = []

    async def copy_in() -> None:
        await opened.wait()
        while data := await stdin.receive_some(1 << 16):
            await stream.send_all(data)
        await stream.send_eof()
        input_ended.set()

    async def copy_out() -> None:
        splitter = LineSplitter()
        while True:
            data = await stream.receive_some(1 << 20)
            if not data and (splitter.holding or not input_ended.is_set()):
                # Cut off (a client that does not keep up) or gone: never half a line.
                failure.append(why_closed(str(path), splitter.holding))
                return
            lines = list(splitter.feed(bytes(data))) if data else []
            out = bytearray()
            for line in lines:
                if isinstance(line, LineTooLong):
                    continue
                if not opened.is_set():
                    answer = read_line(line)
                    if isinstance(answer, w.Response) and answer.id == CONNECT_ID:
                        if not answer.success:
                            failure.append(str(answer.error))
                            return
                        opened.set()
                    continue
                if not line.startswith(STOP_ANSWER):
                    out += line + b"\n"
            if out:
                await stdout.send_all(out)
            if not data:
                return

    async def on_signal(nursery: trio.Nursery) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for _ in signals:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(STOP_COMMANDS)
                    await stream.send_eof()
                input_ended.set()
                nursery.cancel_scope.deadline = trio.current_time() + 3
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(on_signal, nursery)
        nursery.start_soon(copy_in)
        await copy_out()
        nursery.cancel_scope.cancel()
    if failure:
        log(str(failure[0]))
        return 1
    return 0
