"""Command type to handler.

Every handler answers through its `Reply` exactly once. Handlers never wait: state reads,
setters and queue operations answer at once; work that takes time runs as a task in the
session's nursery and answers when done. What the run driver does is answered as its events
pass (`Dispatcher.saw`): ``abort`` right after the aborted run's ``agent_end`` (or the end of
what it cut short: a retry wait, a compaction), ``abort_retry`` after its ``auto_retry_end``,
a manual ``compact`` after its ``compaction_end``, before anything queued runs. Nothing below
the dispatcher answers a command.

A session switch (``new_session``, ``switch_session``, ``fork``, ``clone``) is such a task. While
it runs, reads and aborts are still answered at once (about the session being left), and every
other command waits, in order, to be handled against the new session once the switch has
answered: nothing sent after a switch lands in the session it left. A prompt that names an MCP
server's prompt is such a task too while its server renders it: the commands after it wait
likewise.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar, cast

import trio

from . import _wire as w
from ._connection import response
from ._errors import CommandError
from ._log import log_exception
from ._opening import SessionConfig
from ._retry import RETRY_CANCELLED
from ._session import Session, Sink as EventSink, open_session
from ._store import LEAF, entry_tree
from ._switching import (
    Maker,
    branch_store,
    entry_position,
    export_html,
    file_store,
    fork_messages,
    fork_point,
    new_store,
)
from ._telemetry import caller_of_command

Sink = Callable[[w.Response], None]
"""Where a command's response goes, as a wire object."""
C = TypeVar("C")

ANSWERED_DURING_SWITCH: frozenset[str] = frozenset({
    "get_state", "get_messages", "get_available_models", "get_available_thinking_levels",
    "get_entries", "get_tree", "get_last_assistant_text", "get_fork_messages",
    "get_session_stats", "get_commands", "abort", "abort_bash", "abort_retry", "clear_queue",
    "extension_ui_response", "get_mcp_servers",
})


def failure_text(command: str, exc: Exception) -> str:
    """The `error` of a response to a command that raised `exc`: a refusal's own message; a
    bug (anything else) is logged with its traceback and answered by its message. Every
    command that fails is answered through here."""
    if isinstance(exc, CommandError):
        return str(exc)
    log_exception(f"{command} failed: {exc!r}", exc)
    return str(exc) or type(exc).__name__


class Reply:
    """Answers one command, once: later calls are ignored."""

    __slots__ = ("_sink", "command", "command_id", "sent")

    def __init__(self, sink: Sink, command: str, command_id: str | int | None) -> None:
        self._sink = sink
        self.command = command
        self.command_id = command_id
        self.sent = False

    def ok(self, data: object = w.ABSENT) -> None:
        self._send(response(self.command, self.command_id, data=data))

    def fail(self, error: str) -> None:
        self._send(response(self.command, self.command_id, error=error))

    def failed(self, exc: Exception) -> None:
        """Answer that the command raised `exc` (`failure_text`)."""
        self.fail(failure_text(self.command, exc))

    def _send(self, answer: w.Response) -> None:
        if not self.sent:
            self._sink(answer)  # (one that raises, unwritten, leaves room for the error's)
            self.sent = True


class Agent:
    """A session and its dispatcher, opened together by `open_agent`: what every front
    drives. Its events go to the sink it was opened with; each command's response to the sink
    `handle` is given (else the agent's)."""

    def __init__(self, session: Session, dispatcher: Dispatcher) -> None:
        self.session = session
        self.dispatcher = dispatcher

    def handle(self, command: w.Command, command_id: str | int | None = None,
               reply: Sink | None = None) -> None:
        """One parsed command (`Dispatcher.handle`): never raises, never waits."""
        self.dispatcher.handle(command, command_id, reply)

    async def wait_idle(self) -> None:
        """Until every command is answered and the session has settled."""
        await self.dispatcher.wait_idle()

    def stop(self) -> None:
        """Drop what is queued and abort what runs; the closing events follow."""
        self.session.stop()


@contextlib.asynccontextmanager
async def open_agent(config: SessionConfig, events: EventSink, replies: Sink, *,
                     wait_for_room: Callable[[], Awaitable[None]] | None = None,
                     in_thread: bool = True) -> AsyncIterator[Agent]:
    """The one way a front opens an agent: `open_session` (`events` gets its events, as
    wire objects; with `wait_for_room` the run waits while the front's peer lags) and a
    dispatcher answering to `replies`, which sees each event after `events` did. Leaving the
    block aborts what runs and closes the session (`open_session`)."""
    seen: list[Dispatcher] = []

    def passed(event: w.Event) -> None:
        events(event)
        if seen:
            seen[0].saw(event)

    async with open_session(config, passed, wait_for_room, in_thread=in_thread) as session:
        dispatcher = Dispatcher(session, replies)
        seen.append(dispatcher)
        yield Agent(session, dispatcher)


Handler = Callable[["w.Command", Reply], None]
"""A command's handler, as the table holds it (`Dispatcher._on` registers it typed)."""


class Dispatcher:
    """Runs commands against one session."""

    def __init__(self, session: Session, sink: Sink) -> None:
        self.session = session
        self.sink = sink
        self._held: list[tuple[w.Command, str | int | None, Sink | None]] | None = None
        """Commands waiting for a session switch to finish; None when none runs."""
        self._switched = trio.Event()
        self._tasks = 0
        """Commands running as tasks (`_in_task`), not yet answered."""
        self._tasks_done = trio.Event()
        self._tasks_done.set()
        self._aborts: list[Reply] = []
        self._retry_aborts: list[Reply] = []
        self._compactions: list[Reply] = []
        """Commands answered as the events of what they asked for pass (`saw`)."""
        self._spell_ran = False
        """A run of the busy spell has ended (an aborted compaction after it ends what an
        abort cut short; one before its first run does not)."""
        self._handlers: dict[type[object], Handler] = {}
        self._on(w.GetState, lambda _, reply: reply.ok(self.session.state()))
        # The other commands' classes load with the first of them (`forged._wire`): a
        # client's first get_state is answered without them.

    def _register(self) -> dict[type[object], Handler]:
        """Every command's handler, in the table."""
        self._on(w.Prompt, self.prompt)
        self._on(w.Steer, self.steer)
        self._on(w.FollowUp, self.follow_up)
        self._on(w.Abort, self.abort)
        self._on(w.ClearQueue, lambda _, reply: reply.ok(self.session.queues.clear()))
        self._on(w.GetMessages, lambda _, reply: reply.ok(w.MessageList(
                messages=list(self.session.context.messages))))
        self._on(w.GetLastAssistantText, lambda _, reply: reply.ok(w.AssistantText(
                text=self.session.context.last_assistant_text())))
        self._on(w.SetModel, lambda cmd, reply: reply.ok(self.session.choice.set_model(
                cmd.provider, cmd.model_id)))
        self._on(w.CycleModel, lambda _, reply: reply.ok(self.session.choice.cycle_model()))
        self._on(w.GetAvailableModels, lambda _, reply: reply.ok(w.ModelList(
                models=self.session.registry.available())))
        self._on(w.SetThinkingLevel, self.set_thinking_level)
        self._on(w.SetPermissionMode, self.set_permission_mode)
        self._on(w.CycleThinkingLevel, self.cycle_thinking_level)
        self._on(w.GetAvailableThinkingLevels, lambda _, reply: reply.ok(w.ThinkingLevelList(
                levels=self.session.choice.available_levels())))
        self._on(w.SetSteeringMode, self.set_steering_mode)
        self._on(w.GetEntries, lambda cmd, reply: reply.ok(w.EntryList(
                entries=self.session.store.entries_since(cmd.since),
                leaf_id=self.session.store.leaf_id)))
        self._on(w.GetTree, lambda _, reply: reply.ok(w.EntryTree(
                tree=entry_tree(self.session.store),
                leaf_id=self.session.store.leaf_id)))
        self._on(w.SetSessionName, self.set_session_name)
        self._on(w.SetFollowUpMode, self.set_follow_up_mode)
        self._on(w.NewSession, lambda cmd, reply: self._switch(reply, new_store(
                self.session.session_dir, self.session.cwd, cmd.parent_session),
                restore=False))
        self._on(w.SwitchSession, lambda cmd, reply: self._switch(
                reply, file_store(self.session.cwd, Path(cmd.session_path)), restore=True))
        self._on(w.Fork, self.fork)
        self._on(w.Clone, self.clone)
        self._on(w.NavigateTree, self.navigate_tree)
        self._on(w.GetCheckpoints, lambda _, reply: reply.ok(w.CheckpointList(
                checkpoints=self.session.checkpoints.listing())))
        self._on(w.GetCheckpointDiff, lambda cmd, reply: self._in_task(
                reply, lambda: self.session.checkpoints.diff(cmd.entry_id, cmd.to_entry_id)))
        self._on(w.RestoreCheckpoint, self.restore_checkpoint)
        self._on(w.GetForkMessages, lambda _, reply: reply.ok(w.ForkMessageList(
                messages=fork_messages(self.session.store))))
        self._on(w.GetSessionStats, lambda _, reply: reply.ok(self.session.stats()))
        self._on(w.ExportHtml, self.export_html)
        self._on(w.SetAutoRetry, self.set_auto_retry)
        self._on(w.Compact, self.compact)
        self._on(w.SetAutoCompaction, self.set_auto_compaction)
        self._on(w.AbortRetry, self.abort_retry)
        self._on(w.Bash, self.bash)
        self._on(w.AbortBash, self.abort_bash)
        self._on(w.GetCommands, lambda _, reply: reply.ok(w.CommandList(
                commands=self.session.commands(),
                untrusted_project=self.session.settings.project_untrusted_note)))
        self._on(w.ExtensionUiResponse, self.extension_ui_response)
        self._on(w.GetMcpServers, lambda _, reply: reply.ok(w.McpServerList(
                servers=self.session.mcp.infos())))
        return self._handlers

    def _on(self, cls: type[C], handler: Callable[[C, Reply], None]) -> None:
        """`handler` answers the commands of `cls`."""
        self._handlers[cls] = lambda command, reply: handler(cast(C, command), reply)

    def handle(self, command: w.Command, command_id: str | int | None,
               sink: Sink | None = None) -> None:
        """Handle one parsed command, answering to `sink` (default: the dispatcher's). Never
        raises: failures become error responses."""
        if self._held is not None and command.type not in ANSWERED_DURING_SWITCH:
            self._held.append((command, command_id, sink))
            return
        reply = Reply(sink or self.sink, command.type, command_id)
        handler = self._handlers.get(type(command)) or self._register()[type(command)]
        try:
            handler(command, reply)
        except Exception as exc:
            reply.failed(exc)

    async def wait_idle(self) -> None:
        """Until every command is answered (those running as tasks too), no switch runs and
        the session has settled."""
        while True:
            if self._held is not None:
                await self._switched.wait()
            await self._tasks_done.wait()
            await self.session.wait_idle()
            if self._held is None and not self._tasks and self.session.idle:
                return

    # --- switching sessions --------------------------------------------------------------------

    def _switch(self, reply: Reply, make: Maker, *, restore: bool, data: object = None,
                files: tuple[bool, int | None, bool] = (False, None, False)) -> None:
        """Switch files; `files` says whether the files go back as they were at an entry
        (a position), and whether over drift."""
        self._held = []
        self._switched = trio.Event()
        restore_files, files_at, force = files

        async def switch() -> object:
            await self.session.switch(make, restore=restore, restore_files=restore_files,
                                      files_at=files_at, force=force)
            return data or w.SwitchResult()

        self._in_task(reply, switch, then=self._release)

    def _in_task(self, reply: Reply, work: Callable[[], Awaitable[object]],
                 then: Callable[[], None] | None = None) -> None:
        """Run `work` as a task of the session; answer with what it returns or raises, then
        call `then`."""
        async def run() -> None:
            try:
                result = await work()
            except Exception as exc:
                reply.failed(exc)
            else:
                reply.ok(result)
            finally:
                if then is not None:
                    then()
                self._tasks -= 1
                if not self._tasks:
                    self._tasks_done.set()

        if not self._tasks:
            self._tasks_done = trio.Event()
        self._tasks += 1
        self.session.start_task(run)

    def _release(self) -> None:
        """Handle the commands held during a switch, until one starts another switch."""
        held, self._held = self._held or [], None
        self._switched.set()
        for index, (command, command_id, sink) in enumerate(held):
            self.handle(command, command_id, sink)
            if self._held is not None:
                self._held.extend(held[index + 1:])
                return

    def bash(self, command: w.Bash, reply: Reply) -> None:
        self._in_task(reply, self.session.bash.start(
            command.command, reply.command_id,
            exclude_from_context=bool(command.exclude_from_context),
            caller=caller_of_command(command)))

    def abort_bash(self, _: w.AbortBash, reply: Reply) -> None:
        self.session.bash.abort()
        reply.ok()

    def export_html(self, command: w.ExportHtml, reply: Reply) -> None:
        async def export() -> w.ExportResult:
            session = self.session
            return w.ExportResult(path=await export_html(
                session.store, session.cwd, command.output_path, name=session.session_name,
                model=session.model))

        self._in_task(reply, export)

    def fork(self, command: w.Fork, reply: Reply) -> None:
        text, parent = fork_point(self.session.store, command.entry_id)
        self._switch(reply, branch_store(self.session.cwd, parent), restore=False,
                     data=w.ForkResult(text=text),
                     files=(command.restore_files, parent, command.force))

    def clone(self, command: w.Clone, reply: Reply) -> None:
        leaf = LEAF if command.entry_id is None else entry_position(self.session.store,
                                                                      command.entry_id)
        self._switch(reply, branch_store(self.session.cwd, leaf), restore=False,
                     files=(command.restore_files, leaf, command.force))

    def navigate_tree(self, command: w.NavigateTree, reply: Reply) -> None:
        session = self.session
        if not session.idle:  # (a settling run's last checkpoint goes on its own branch)
            raise CommandError("Cannot move in the tree while a run, a bash command or a "
                               "plugin command is active; wait for agent_settled or abort "
                               "it first")
        session.move_to(command.entry_id)
        reply.ok(w.EntryTree(tree=entry_tree(session.store), leaf_id=session.store.leaf_id))

    def restore_checkpoint(self, command: w.RestoreCheckpoint, reply: Reply) -> None:
        session = self.session
        if session.busy or session.bash.running:
            raise CommandError("Cannot restore files while a run or a bash command is "
                               "active; wait for agent_settled or abort it first")

        async def restore() -> object:
            if session.settling:  # the closing checkpoint first: the present is captured
                await session.run.wait_settled()
            return await session.checkpoints.restore(
                command.entry_id, force=command.force, dry_run=command.dry_run)

        self._in_task(reply, restore)

    # --- prompting -----------------------------------------------------------------------------

    def prompt(self, command: w.Prompt, reply: Reply) -> None:
        found = self.session.plugins.command_for(command.message)
        if found is not None:
            plugin_command, args = found
            self._in_task(reply, lambda: self.session.plugins.run_command(plugin_command, args))
            return

        def start(text: str) -> None:
            disposition = self.session.disposition(command.streaming_behavior)
            reply.ok(w.PromptAccepted(disposition=disposition))
            if disposition == "started":
                self.session.start_prompt(text, command.images, caller_of_command(command))
            else:
                kind = "steer" if command.streaming_behavior == "steer" else "follow_up"
                self.session.queues.add(kind, text, command.images, caller_of_command(command))

        self._expanded(command.message, reply, start)

    def steer(self, command: w.Steer, reply: Reply) -> None:
        self._queue("steer", command, reply)

    def follow_up(self, command: w.FollowUp, reply: Reply) -> None:
        self._queue("follow_up", command, reply)

    def _queue(self, kind: str, command: w.Steer | w.FollowUp, reply: Reply) -> None:
        text = command.message
        if self.session.plugins.command_for(text) is not None:
            raise CommandError(f'Plugin command "{text.split()[0]}" cannot be queued; send '
                               "it with prompt, which runs it at once")

        def enqueue(expanded: str) -> None:
            reply.ok(w.PromptAccepted(disposition="queued"))
            self.session.queues.add(kind, expanded, command.images, caller_of_command(command))

        self._expanded(text, reply, enqueue)

    def _expanded(self, text: str, reply: Reply, use: Callable[[str], None]) -> None:
        """`use` the text of a prompt: a skill or template expanded at once; an MCP
        server's prompt (``/mcp__<server>__<prompt>``) once the server has rendered it, in a
        task, while the commands after it wait as during a switch (nothing overtakes it). A
        prompt that cannot be rendered fails the command, and nothing is used."""
        if not self.session.mcp.names_prompt(text):
            use(self.session.resources.expand(text))
            return
        self._held = []
        self._switched = trio.Event()

        async def render() -> object:
            use(await self.session.mcp.render(text))  # answers the command
            return None

        self._in_task(reply, render, then=self._release)

    def extension_ui_response(self, command: w.ExtensionUiResponse, reply: Reply) -> None:
        """Answer an open dialog; an id that is not open changes nothing. It is the one
        command no response answers (docs/protocol.md, Dialogs), as in the ancestor."""
        self.session.ui.respond(reply.command_id, command)

    def abort(self, _: w.Abort, reply: Reply) -> None:
        if self.session.abort():
            self._aborts.append(reply)  # answered as the run's end passes (`saw`)
        else:
            reply.ok()

    def abort_retry(self, _: w.AbortRetry, reply: Reply) -> None:
        if self.session.run.cancel_retry():
            self._retry_aborts.append(reply)
        else:
            reply.ok()

    def compact(self, command: w.Compact, reply: Reply) -> None:
        self.session.run.compact(command.custom_instructions)
        self._compactions.append(reply)

    def saw(self, event: w.Event) -> None:
        """An event of the session passed (after its client got it): the commands waiting
        for it are answered now, before anything else happens."""
        if isinstance(event, w.AgentEnd):
            self._spell_ran = True
            self._answer(self._aborts)
        elif isinstance(event, w.AgentSettled):
            self._spell_ran = False
            self._answer(self._aborts)
            self._answer(self._retry_aborts)
        elif isinstance(event, w.AutoRetryEnd):
            self._answer(self._retry_aborts)
            if event.final_error == RETRY_CANCELLED:
                self._answer(self._aborts)
        elif isinstance(event, w.CompactionEnd):
            if event.reason == "manual":
                answers, self._compactions = self._compactions, []
                for reply in answers:
                    if event.result is not None:
                        reply.ok(event.result)
                    else:
                        reply.fail(event.error_message or "Compaction cancelled")
            if event.aborted and (self._spell_ran or event.reason == "manual"):
                self._answer(self._aborts)  # (before a prompt's run: its agent_end answers)
            if event.reason == "manual":
                self._spell_ran = False

    @staticmethod
    def _answer(replies: list[Reply]) -> None:
        waiting = list(replies)
        replies.clear()
        for reply in waiting:
            reply.ok()

    # --- setters -------------------------------------------------------------------------------

    def set_permission_mode(self, command: w.SetPermissionMode, reply: Reply) -> None:
        self.session.set_permission_mode(command.mode)
        reply.ok()

    def set_thinking_level(self, command: w.SetThinkingLevel, reply: Reply) -> None:
        self.session.choice.set_thinking_level(command.level)
        reply.ok()

    def cycle_thinking_level(self, _: w.CycleThinkingLevel, reply: Reply) -> None:
        level = self.session.choice.cycle_thinking_level()
        reply.ok(None if level is None else w.ThinkingLevelData(level=level))

    def set_auto_retry(self, command: w.SetAutoRetry, reply: Reply) -> None:
        self.session.run_settings.set_auto_retry(command.enabled)
        reply.ok()

    def set_auto_compaction(self, command: w.SetAutoCompaction, reply: Reply) -> None:
        self.session.run_settings.set_auto_compaction(command.enabled)
        reply.ok()

    def set_session_name(self, command: w.SetSessionName, reply: Reply) -> None:
        self.session.set_session_name(command.name)
        reply.ok()

    def set_steering_mode(self, command: w.SetSteeringMode, reply: Reply) -> None:
        self.session.queues.set_steering_mode(command.mode)
        reply.ok()

    def set_follow_up_mode(self, command: w.SetFollowUpMode, reply: Reply) -> None:
        self.session.queues.set_follow_up_mode(command.mode)
        reply.ok()
