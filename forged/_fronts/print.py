"""``forged -p`` and ``forged --mode json``: messages from the command line, one after another,
then exit.

The tree is stdio's (`forged._fronts.stdio`) without a reader: the messages are the
input, and the outbox writes either every event (``--mode json``) or the last reply's text.
On a terminal, ``-p`` also shows each tool call on stderr as it ends (`Trace`): what the agent
did, a line or two each, with the reply on stdout; and each retry as it starts (what failed,
when the next try is, which of how many).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs
import trio

from .. import _wire as w
from .._codec import encode
from .._config import Options, open_session_config
from .._connection import Outbox, open_fd_stream
from .._dispatch import open_agent
from .._jsonl import encode_line
from .._log import log, log_plain
from .._session import Session
from .stdio import watch_signals_until_exit


async def run_prompts(options: Options, messages: list[str], stdout_fd: int, *,
                      events: bool) -> int:
    """Send `messages` one after another, each until the session settles, and return the exit
    code. With `events`, the session header and then every event are written to `stdout_fd`
    as JSON lines (exit 0 even when the model failed, as the ancestor does); without, the
    last reply's text is printed, or its error on stderr with exit 1. No client can answer
    dialogs: they resolve as cancelled.

    A signal (SIGINT, SIGTERM, SIGHUP) aborts the run (its closing events are written) and
    sends no further message: the exit status is 128 plus the signal's number."""
    stdout = open_fd_stream(stdout_fd)
    outbox = Outbox()
    responses: list[w.Response] = []
    signalled: list[int] = []
    sink: Callable[[w.Event], None] = (
        (lambda event: outbox.put(encode(event))) if events
        else Trace() if os.isatty(2) else (lambda _: None))
    async with trio.open_nursery() as process_nursery:
        config = await open_session_config(attrs.evolve(options, interactive=False),
                                           process_nursery)
        async with open_agent(config, sink, responses.append,
                              wait_for_room=outbox.wait_for_room if events else None,
                              in_thread=False) as agent:
            def stop(signum: int) -> None:
                signalled.append(signum)
                agent.stop()

            await process_nursery.start(watch_signals_until_exit, stop)
            if agent.session.guard.mode == "ask":
                log(f"the ask permission mode asks before every command and file change, and "
                    f"under {'--mode json' if events else '-p'} nobody can answer: each is "
                    "refused. Choose auto (commands in a sandbox) or full-access to let them "
                    "run")
            code = 0
            async with trio.open_nursery() as output_nursery:
                output_nursery.start_soon(outbox.serve_writer, stdout)
                if events:
                    outbox.put(encode_line(agent.session.store.header))
                for text in messages:
                    if signalled:
                        break
                    agent.handle(w.Prompt(message=text))
                    await agent.wait_idle()
                    if not responses[-1].success:
                        log(str(responses[-1].error))
                        code = 1
                        break
                if signalled:
                    code = 128 + signalled[0]
                elif not events and code == 0:
                    code = _print_last_reply(agent.session, outbox)
                outbox.close()
        process_nursery.cancel_scope.cancel()
    return code


TRACE_OUTPUT_LINES = 3


class Trace:
    """Each tool call, when it ends, as a line or two on stderr: ``[write] greet.py``, a
    command's first lines of output, a failure's first line; each retry as it starts."""

    def __init__(self) -> None:
        self._arguments: dict[str, w.JSONObject] = {}
        """Each running tool call's arguments, by its id."""

    def __call__(self, event: w.Event) -> None:
        if isinstance(event, w.ToolExecutionStart):
            self._arguments[event.tool_call_id] = event.args
        elif isinstance(event, w.ToolExecutionEnd):
            self._ended(event)
        elif isinstance(event, w.AutoRetryStart):
            log_plain(f"[retry {event.attempt}/{event.max_attempts}] {event.error_message}; "
                      f"trying again in {event.delay_ms / 1000:g} s")
        elif isinstance(event, w.AutoRetryEnd) and event.success:
            log_plain(f"[retry {event.attempt}] it worked")

    def _ended(self, event: w.ToolExecutionEnd) -> None:
        arguments = self._arguments.pop(event.tool_call_id, {})
        shown = next((str(arguments[key]) for key in ("path", "command", "pattern")
                      if isinstance(arguments.get(key), str)), "")
        text = w.text_of(event.result.content, "")
        lines = [f"[{event.tool_name}] {shown.splitlines()[0] if shown else ''}".rstrip()]
        if event.is_error:
            lines.append(f"    failed: {next(iter(text.strip().splitlines()), '')}")
        elif event.tool_name == "bash":
            output = text.strip().splitlines()
            lines += [f"    {out}" for out in output[:TRACE_OUTPUT_LINES]]
            if len(output) > TRACE_OUTPUT_LINES:
                more = len(output) - TRACE_OUTPUT_LINES
                lines.append(f"    … {more} more line{'s' if more > 1 else ''}")
        log_plain("\n".join(lines))


def _print_last_reply(session: Session, outbox: Outbox) -> int:
    messages = session.context.messages
    last = messages[-1] if messages else None
    if not isinstance(last, w.AssistantMessage):
        return 0
    if last.stop_reason in ("error", "aborted"):
        log(last.error_message or f"Request {last.stop_reason}")
        return 1
    for block in last.content:
        if isinstance(block, w.TextContent):
            outbox.put(block.text.encode() + b"\n")
    return 0
