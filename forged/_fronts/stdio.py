"""stdio mode (``forged --mode rpc``): one session on the process's stdin and stdout.

The supervision tree of a stdio process::

    run_stdio
    └── process_nursery
        ├── ScriptedServer.serve          the scripted provider (--provider scripted only)
        ├── warm_up                       providers and converter hooks, while input is awaited
        ├── watch_signals_until_exit      SIGTERM / SIGINT / SIGHUP: stop reading, abort,
        │                                 flush, exit 0
        └── stdio_nursery
            └── serve_stdio → open_agent → session_nursery
                ├── Plugins.serve_observers   plugin event observers, in order
                ├── Runner._drive             one task per busy spell (a prompt and what follows
                │   │                         it), each run inside the runner's run_scope (abort)
                │   ├── the retry wait        retry_scope (abort_retry)
                │   └── run_agent             one run (`forged._loop`)
                │       ├── the provider's    one HTTP stream per turn (`forged._providers`)
                │       │   request
                │       └── tool processes    bash and rg, each in its own process group
                ├── Dispatcher tasks          commands that take time: session switches,
                │   └── DirectBash.start      export, plugin commands, direct bash (abort_bash
                │                             cancels its scope)
                └── StdioConnection.serve → connection_nursery (`forged._connection.Connection`)
                    ├── the writer            fd 1 is written only through the one Outbox, in
                    │                         order: at once while the pipe takes it, else here
                    └── input_scope           cancelled by a signal
                        ├── read              stdin -> lines -> commands, in order
                        └── dispatch          commands -> handlers, which never wait

A prompt's way down: the reader parses the line into a `Prompt` (`forged._codec`); the
dispatch hands it to `Dispatcher.prompt`, which answers it and calls `Session.start_prompt`;
that starts `Runner._drive`, which calls `run_agent`; its `stream_assistant` asks the
session's `ModelAsker.model_request` (`forged._asking`) for the request and calls the
provider, which POSTs it (`forged._providers.http`). Events come back as wire objects to the
connection, which encodes them into its outbox: `Session.emit` -> `Connection.send`.

Shutdown: at stdin EOF the reader ends, the dispatcher drains, the current run and its queued
messages finish, the outbox is flushed and the process exits 0. A signal aborts the run first
and allows `SHUTDOWN_GRACE_S` for the closing events.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import cast

import trio

from .. import _wire as w
from .._config import Options, open_session_config
from .._connection import (
    SHUTDOWN_GRACE_S,
    Connection,
    StreamTransport,
    Transport,
    open_fd_stream,
)
from .._dispatch import Agent, open_agent
from .._log import log
from .._opening import SessionConfig


async def run_stdio(options: Options, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """Serve one session over the process's stdin and stdout until EOF or a signal."""
    transport = StreamTransport(open_fd_stream(stdin_fd), open_fd_stream(stdout_fd))
    async with trio.open_nursery() as process_nursery:
        config = await open_session_config(options, process_nursery)
        async with trio.open_nursery() as stdio_nursery:
            stop = await stdio_nursery.start(serve_stdio, config, transport)
            await process_nursery.start(watch_signals_until_exit, stop)
        process_nursery.cancel_scope.cancel()


class StdioConnection(Connection):
    """The one connection of a stdio process: commands straight to its agent."""

    agent: Agent

    def __init__(self, transport: Transport) -> None:
        super().__init__(transport, hold_back=True)
        self.settle_scope = trio.CancelScope()
        """Waits for the last run; bounded once stopping."""

    def stop(self, _: int = 0) -> None:
        """Stop reading, drop what is queued and abort the run; its closing events follow."""
        self.settle_scope.deadline = min(self.settle_scope.deadline,
                                         trio.current_time() + SHUTDOWN_GRACE_S)
        self.agent.stop()
        self.input_scope.cancel()

    async def handle(self, command: w.Command | w.DaemonCommand,
                     command_id: str | int | None) -> None:
        # Its transport reads `w.COMMAND_CLASSES`' commands: none of the daemon's comes here.
        self.agent.handle(cast("w.Command", command), command_id)

    async def end_of_input(self) -> None:
        session = self.agent.session
        session.ui.set_interactive(False)  # no more answers can come
        with self.settle_scope:
            await self.agent.wait_idle()

    def broken(self) -> None:
        log("the client stopped reading; shutting down")
        self.stop()


async def serve_stdio(config: SessionConfig, transport: Transport, *,
                      task_status: trio.TaskStatus[Callable[[int], None]] = (
                          trio.TASK_STATUS_IGNORED)) -> None:
    """One session on one transport: reports started with the function that stops it (a
    signal's), and returns once the input ended and the output is flushed; the transport is
    closed then."""
    connection = StdioConnection(transport)
    async with open_agent(config, connection.send, connection.send,
                          wait_for_room=connection.outbox.wait_for_room,
                          in_thread=False) as agent:
        connection.agent = agent
        task_status.started(connection.stop)
        await connection.serve()
    await transport.aclose()


async def watch_signals_until_exit(
        stop: Callable[[int], None], *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The first SIGTERM, SIGINT or SIGHUP calls `stop`; later ones are only noted (the
    shutdown under way writes the closing events), until the process ends."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        stopping = False
        async for signum in signals:
            name = signal.Signals(signum).name
            log(f"{name}: {'already ' if stopping else ''}shutting down")
            if not stopping:
                stopping = True
                stop(signum)
