"""A session's one direct ``bash`` command slot (docs/protocol.md, Direct bash): a client's
command, run outside any turn, its output streamed as ``bash_execution_update`` events and
its result kept in the session (entering the context once a run under way settles).

``abort_bash`` cancels the slot's scope; the command's process group is killed before the
cancellation goes on (`forged._tools.bash.run_direct`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import trio

from . import _telemetry, _wire as w
from ._errors import CommandError
from ._telemetry import Caller
from ._tools.base import ScratchDir, Shell


class Captures(Protocol):
    """The checkpoints a command is taken between (`forged._checkpointing.Checkpoints`)."""

    async def capture(self, kind: str, prompt: str | None = None) -> str | None: ...


class DirectBash:
    """The slot. `environment` is read as each command starts (the permission mode's
    policy); `checkpoints` gives the session's (made on first use); `record` keeps the
    result (`forged._run.Runner.record`)."""

    def __init__(self, cwd: Path, shell: Shell, scratch: ScratchDir, *,
                 emit: Callable[[w.Event], None], wait_for_room: Callable[[], Awaitable[None]],
                 environment: Callable[[], dict[str, str] | None],
                 checkpoints: Callable[[], Captures],
                 record: Callable[[w.BashExecutionMessage], None],
                 session_id: Callable[[], str]) -> None:
        self._cwd = cwd
        self._shell = shell
        self._scratch = scratch
        self._emit = emit
        self._wait_for_room = wait_for_room
        self._environment = environment
        self._checkpoints = checkpoints
        self._record = record
        self._session_id = session_id
        self.scope: trio.CancelScope | None = None
        self._done = trio.Event()
        self._done.set()

    @property
    def running(self) -> bool:
        return self.scope is not None

    async def wait(self) -> None:
        await self._done.wait()

    def abort(self) -> None:
        if self.scope is not None:
            self.scope.cancel()

    def start(self, command: str, command_id: str | int | None, *,
              exclude_from_context: bool = False, caller: Caller | None = None
              ) -> Callable[[], Awaitable[w.BashResult]]:
        """Take the slot now (a second command fails at once, in arrival order) and return
        what runs it; with `exclude_from_context` its result is kept in the session but
        never shown to the model. It runs under a span (`caller`'s child, when given), whose
        context the command's environment carries."""
        if self.scope is not None:
            raise CommandError("A bash command is already running")
        scope = self.scope = trio.CancelScope()
        self._done = trio.Event()

        async def run() -> w.BashResult:
            from ._tools.bash import run_direct

            checkpoints = self._checkpoints()
            try:
                await _telemetry.ready()
                with _telemetry.tracing.span("bash", {}, conversation=self._session_id(),
                                             caller=caller) as span:
                    await checkpoints.capture("before", f"!{command}")
                    message = await run_direct(
                        command, self._cwd,
                        lambda delta: self._emit(w.BashExecutionUpdate(id=command_id,
                                                                       delta=delta)),
                        scope, self._shell, self._wait_for_room, self._scratch,
                        env=self._environment(), changes=_telemetry.tracing.env())
                    span.set({"forged.exit_code": -1 if message.exit_code is None
                              else message.exit_code, "forged.aborted": message.cancelled})
                    await checkpoints.capture("after")
            finally:
                self.scope = None
                self._done.set()
            if exclude_from_context:
                message.exclude_from_context = True
            self._record(message)
            return w.BashResult(output=message.output, exit_code=message.exit_code,
                                cancelled=message.cancelled, truncated=message.truncated,
                                full_output_path=message.full_output_path)

        return run
