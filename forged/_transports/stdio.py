"""stdio mode (``forged --mode rpc``): one session on the process's stdin and stdout.

The supervision tree of a stdio process::

    run_stdio
    └── process_nursery
        ├── ScriptedServer.serve          the scripted provider (--provider scripted only)
        ├── warm_up                       providers and converter hooks, while input is awaited
        ├── watch_signals                 SIGTERM / SIGINT / SIGHUP: stop reading, abort,
        │                                 flush, exit 0
        └── open_session → session_nursery
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
            └── serve_lines → connection_nursery (`forged._connection`)
                ├── the writer            fd 1 is written only through the one Outbox, in
                │                         order: at once while the pipe takes it, else here
                └── input_scope           cancelled by a signal
                    ├── serve_reader      stdin -> lines -> commands, in order
                    └── serve_dispatcher  commands -> handlers, which never wait

A prompt's way down: `serve_reader` parses the line into a `Prompt` (`forged._codec`);
`serve_dispatcher` hands it to `Dispatcher.prompt`, which answers it and calls
`Session.start_prompt`; that starts `Runner._drive`, which calls `run_agent`; its
`stream_assistant` asks `Session.model_request` for the request and calls the provider, which
POSTs it (`forged._providers.http`). Events come back only as `Session.emit` calls into the
outbox.

Shutdown: at stdin EOF the reader ends, the dispatcher drains, the current run and its queued
messages finish, the outbox is flushed and the process exits 0. A signal aborts the run first
and allows `SHUTDOWN_GRACE_S` for the closing events.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from .._config import Options, open_session_config
from .._connection import (
    Outbox,
    open_fd_stream,
    serve_dispatcher,
    serve_lines,
    serve_reader,
    write_now_to,
)
from .._dispatch import Dispatcher
from .._log import log
from .._session import SessionConfig, open_session

SHUTDOWN_GRACE_S = 2.5


async def run_stdio(options: Options, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """Serve one session over the process's stdin and stdout until EOF or a signal."""
    stdin, stdout = open_fd_stream(stdin_fd), open_fd_stream(stdout_fd)
    async with trio.open_nursery() as process_nursery:
        config = await open_session_config(options, process_nursery)
        await serve_stdio(config, stdin, stdout, process_nursery, watch_signals=True)
        process_nursery.cancel_scope.cancel()


async def serve_stdio(config: SessionConfig, stdin: Any, stdout: Any,
                      process_nursery: trio.Nursery, *, watch_signals: bool) -> None:
    """One session on one pair of streams: returns once input ended and output is flushed."""
    outbox = Outbox(write_now=write_now_to(stdout))
    async with open_session(config, outbox.put, outbox.wait_for_room,
                            in_thread=False) as session:
        dispatcher = Dispatcher(session, outbox.put)
        input_scope = trio.CancelScope()
        settle_scope = trio.CancelScope()  # waits for the last run; bounded once stopping

        def stop(_: int = 0) -> None:
            """Stop reading, drop what is queued and abort the run; its closing events
            follow."""
            settle_scope.deadline = min(settle_scope.deadline,
                                        trio.current_time() + SHUTDOWN_GRACE_S)
            session.stop()
            input_scope.cancel()

        if watch_signals:
            await process_nursery.start(watch_signals_until_exit, stop)

        async def end_of_input() -> None:
            session.ui.interactive = False  # no more answers can come
            session.ui.cancel_all()
            with settle_scope:
                await dispatcher.wait_idle()

        def broken() -> None:
            log("the client stopped reading; shutting down")
            stop()

        await serve_lines(outbox, stdout.send_all, partial(serve_reader, stdin),
                          partial(serve_dispatcher, handle=dispatcher.handle,
                                  refuse=outbox.put, wait_for_room=outbox.wait_for_room),
                          end_of_input, broken=broken, input_scope=input_scope)
    await _close(stdout)


async def _close(stream: Any) -> None:
    try:
        await stream.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


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
