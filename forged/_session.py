"""One agent session: its state, its queues, its named cancel scopes and its event stream.

Many sessions can live in one process: each has its own cwd, its own nursery (opened by
`Session.serve`) and its own event sink. A session never writes to a stream itself; it emits
encoded lines to the sink it was given, in the order it produces them.

A session is *busy* from an accepted prompt until ``agent_settled``: one task (`_drive`) runs
the prompt and then every queued continuation, each run inside `run_scope`, so an abort is one
``run_scope.cancel()``.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from . import _codec
from . import _wire as w
from ._errors import CommandError
from ._jsonl import encode_line
from ._loop import run_agent
from ._models import ModelRegistry, clamp_level, supported_levels
from ._providers import Provider, ProviderRequest, ToolSpec, provider_for
from ._providers.base import now_ms
from ._resources import build_system_prompt, find_context_files
from ._store import SessionFile, session_dir_for
from ._tools import BUILTIN_TOOLS, Tool

Sink = Callable[[bytes], None]

BUSY_PROMPT_ERROR = (
    "Agent is already processing. Specify streamingBehavior ('steer' or 'followUp') to queue "
    "the message."
)


@attrs.define(kw_only=True)
class SessionConfig:
    cwd: Path
    agent_dir: Path
    registry: ModelRegistry
    model: w.Model | None = None
    thinking_level: str = "medium"
    session_name: str | None = None
    persist: bool = True
    """False for --no-session: the session's entries live in memory only."""
    session_dir: Path | None = None
    """Where new session files go (default: per cwd under <agentDir>/sessions)."""
    session_path: Path | None = None
    """An existing session file to continue."""
    keep_model: bool = False
    """The model and level were asked for (--model): a continued session does not restore
    its own."""


@attrs.define(kw_only=True)
class Queued:
    """A steering or follow-up message waiting for delivery."""

    text: str
    message: w.UserMessage


def user_message(text: str, images: list[w.ImageContent] | None) -> w.UserMessage:
    content: list[w.UserContent] = [w.TextContent(text=text)]
    content.extend(images or [])
    return w.UserMessage(content=content, timestamp=now_ms())


class Session:
    def __init__(self, config: SessionConfig, sink: Sink,
                 wait_for_room: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cwd = config.cwd
        self.agent_dir = config.agent_dir
        self.registry = config.registry
        self.model = config.model
        self._preferred_level = config.thinking_level
        self.store = open_store(config)
        self.steering_mode: w.QueueMode = "one-at-a-time"
        self.follow_up_mode: w.QueueMode = "one-at-a-time"
        self.auto_compaction_enabled = True
        self.tools: dict[str, Tool] = dict(BUILTIN_TOOLS)
        self._messages: list[w.AgentMessage] | None = None  # read from the file when needed
        self.session_name = stored_name(self.store)
        if len(self.store) and not config.keep_model:
            self._restore_model_and_level()
        self.steering: list[Queued] = []
        self.follow_ups: list[Queued] = []
        self._sink = sink
        self._wait_for_room = wait_for_room
        self._nursery: trio.Nursery | None = None
        self.run_scope: trio.CancelScope | None = None
        self._busy = False
        self._settled = trio.Event()
        self._settled.set()
        self._after_run: list[Callable[[], None]] = []
        if not len(self.store):
            if self.model is not None:
                self.store.append("model_change", provider=self.model.provider,
                                  modelId=self.model.id)
            self.store.append("thinking_level_change", thinkingLevel=self.thinking_level)
        if config.session_name:
            self.set_session_name(config.session_name)

    def _restore_model_and_level(self) -> None:
        """A continued session takes back the model and thinking level its branch last used."""
        path = self.store.path_to_leaf()
        change = self.store.latest("model_change", path)
        if change is not None:
            model = self.registry.find(str(change.get("provider")), str(change.get("modelId")))
            if model is not None and self.registry.has_auth(model.provider):
                self.model = model
        change = self.store.latest("thinking_level_change", path)
        if change is not None and change.get("thinkingLevel") in w.THINKING_LEVELS:
            self._preferred_level = str(change["thinkingLevel"])

    @property
    def messages(self) -> list[w.AgentMessage]:
        """The context: the active branch's messages, read back on first use."""
        if self._messages is None:
            self._messages = build_context(self.store)
        return self._messages

    @property
    def session_id(self) -> str:
        return self.store.session_id

    def set_session_name(self, name: str) -> None:
        name = name.strip()
        if not name:
            raise CommandError("Session name cannot be empty")
        self.store.append("session_info", name=name)
        self.session_name = name

    # --- lifetime ------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Own the session's nursery until cancelled; runs are started in it.

        Cancellation aborts any run; its closing events are still emitted.
        """
        try:
            async with trio.open_nursery() as session_nursery:
                self._nursery = session_nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self.store.close()

    async def wait_settled(self) -> None:
        await self._settled.wait()

    # --- events --------------------------------------------------------------------------------

    def emit(self, event: w.Event) -> None:
        self._sink(encode_line(_codec.unstructure(event)))

    async def wait_for_room(self) -> None:
        if self._wait_for_room is not None:
            await self._wait_for_room()

    def _queue_changed(self) -> None:
        self.emit(w.QueueUpdate(steering=[q.text for q in self.steering],
                                follow_up=[q.text for q in self.follow_ups]))

    # --- state ---------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def thinking_level(self) -> str:
        return clamp_level(self.model, self._preferred_level)

    def state(self) -> w.SessionState:
        return w.SessionState(
            model=self.model, thinking_level=self.thinking_level, is_streaming=self._busy,
            is_compacting=False, steering_mode=self.steering_mode,
            follow_up_mode=self.follow_up_mode,
            session_file=str(self.store.path) if self.store.path else None,
            session_id=self.session_id,
            session_name=self.session_name,
            auto_compaction_enabled=self.auto_compaction_enabled,
            message_count=(len(self._messages) if self._messages is not None
                           else context_size(self.store)),
            pending_message_count=len(self.steering) + len(self.follow_ups),
        )

    def last_assistant_text(self) -> str | None:
        for message in reversed(self.messages):
            if not isinstance(message, w.AssistantMessage):
                continue
            text = "".join(b.text for b in message.content if isinstance(b, w.TextContent))
            if message.stop_reason == "aborted" and not text.strip():
                continue
            return text.strip() or None
        return None

    # --- prompting -----------------------------------------------------------------------------

    def check_can_prompt(self) -> None:
        if self.model is None:
            raise CommandError("No model selected")
        if self.registry.api_key(self.model.provider) is None:
            raise CommandError(f"No API key found for {self.model.provider}")

    def prompt(self, text: str, images: list[w.ImageContent] | None,
               streaming_behavior: str | None) -> tuple[str, Callable[[], None]]:
        """Validate a prompt; return its disposition and what to do once it is answered."""
        if self._busy:
            if streaming_behavior is None:
                raise CommandError(BUSY_PROMPT_ERROR)
            kind = "steer" if streaming_behavior == "steer" else "follow_up"
            return "queued", lambda: self.enqueue(kind, text, images)
        self.check_can_prompt()
        message = user_message(text, images)
        return "started", lambda: self._start([message], poll_steering=True)

    def enqueue(self, kind: str, text: str, images: list[w.ImageContent] | None) -> None:
        queue = self.steering if kind == "steer" else self.follow_ups
        queue.append(Queued(text=text, message=user_message(text, images)))
        self._queue_changed()

    def clear_queue(self) -> w.QueueContents:
        contents = w.QueueContents(steering=[q.text for q in self.steering],
                                   follow_up=[q.text for q in self.follow_ups])
        if self.steering or self.follow_ups:
            self.steering.clear()
            self.follow_ups.clear()
            self._queue_changed()
        return contents

    def _take(self, queue: list[Queued], mode: w.QueueMode) -> list[w.AgentMessage]:
        if not queue:
            return []
        count = len(queue) if mode == "all" else 1
        taken = queue[:count]
        del queue[:count]
        self._queue_changed()
        return [q.message for q in taken]

    def take_steering(self) -> list[w.AgentMessage]:
        return self._take(self.steering, self.steering_mode)

    def take_follow_ups(self) -> list[w.AgentMessage]:
        return self._take(self.follow_ups, self.follow_up_mode)

    def append(self, message: w.AgentMessage) -> None:
        """A finished message: into the context and the session file."""
        self.messages.append(message)
        self.store.append("message", message=_codec.unstructure(message))

    def model_request(self) -> tuple[Provider, ProviderRequest]:
        model = self.model
        if model is None:
            raise CommandError("No model selected")
        tools = list(self.tools.values())
        request = ProviderRequest(
            model=model,
            system_prompt=build_system_prompt(tools, self.cwd,
                                              find_context_files(self.cwd, self.agent_dir)),
            messages=list(self.messages),
            tools=[ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
                   for t in tools],
            thinking_level=self.thinking_level,
            api_key=self.registry.api_key(model.provider) or "",
            headers=self.registry.request_headers(model),
            session_id=self.session_id,
        )
        return provider_for(model.api), request

    # --- runs ----------------------------------------------------------------------------------

    def _start(self, prompt: list[w.AgentMessage], *, poll_steering: bool) -> None:
        assert self._nursery is not None, "Session.serve is not running"
        self._busy = True
        self._settled = trio.Event()
        self.run_scope = trio.CancelScope()
        self._nursery.start_soon(self._drive, prompt, poll_steering)

    def _continuation(self) -> list[w.AgentMessage]:
        """What the session goes on with after a run: queued steering, else follow-ups."""
        return self.take_steering() or self.take_follow_ups()

    async def _drive(self, prompt: list[w.AgentMessage], poll_steering: bool) -> None:
        try:
            while prompt:
                assert self.run_scope is not None
                with self.run_scope:
                    try:
                        await run_agent(self, prompt, poll_steering=poll_steering)
                    except Exception:
                        # A bug, not a provider or tool failure (those end the turn): the run
                        # was closed with agent_end; the session lives on.
                        traceback.print_exc(file=sys.stderr)
                for callback in self._after_run:
                    callback()
                self._after_run.clear()
                prompt, poll_steering = self._continuation(), False
                self.run_scope = trio.CancelScope()
        finally:
            self.run_scope = None
            self._busy = False
            self.emit(w.AgentSettled())
            self._settled.set()

    def abort(self, done: Callable[[], None]) -> None:
        """Cancel the current run; `done` is called right after its ``agent_end``."""
        if self.run_scope is None:
            done()
            return
        self._after_run.append(done)
        self.run_scope.cancel()

    # --- models and thinking -------------------------------------------------------------------

    def set_model(self, provider: str, model_id: str) -> w.Model:
        for model in self.registry.available():
            if model.provider == provider and model.id == model_id:
                self._switch_model(model)
                return model
        raise CommandError(f"Model not found: {provider}/{model_id}")

    def cycle_model(self) -> w.CycledModel | None:
        available = self.registry.available()
        if len(available) <= 1:
            return None
        index = next((i for i, m in enumerate(available) if m == self.model), -1)
        model = available[(index + 1) % len(available)]
        self._switch_model(model)
        return w.CycledModel(model=model, thinking_level=self.thinking_level,
                             is_scoped=False)

    def _switch_model(self, model: w.Model) -> None:
        level = self.thinking_level
        self.model = model
        self.store.append("model_change", provider=model.provider, modelId=model.id)
        self._record_level(level)

    def _record_level(self, previous: str) -> None:
        if self.thinking_level != previous:
            self.store.append("thinking_level_change", thinkingLevel=self.thinking_level)

    def set_thinking_level(self, level: str) -> None:
        if level not in w.THINKING_LEVELS:
            raise CommandError(
                f"Unknown thinking level: {level}. Expected one of: "
                + ", ".join(w.THINKING_LEVELS))
        previous = self.thinking_level
        self._preferred_level = level
        self._record_level(previous)

    def cycle_thinking_level(self) -> str | None:
        if self.model is None or not self.model.reasoning:
            return None
        levels = supported_levels(self.model)
        current = self.thinking_level
        self._preferred_level = levels[(levels.index(current) + 1) % len(levels)]
        self._record_level(current)
        return self._preferred_level

    def available_thinking_levels(self) -> list[str]:
        return supported_levels(self.model)



def open_store(config: SessionConfig) -> SessionFile:
    if config.session_path is not None:
        if config.session_path.exists():
            return SessionFile.open(config.session_path)
        # A path that does not exist yet is a new session to be written there.
        store = SessionFile.create(config.session_path.parent, config.cwd)
        store.path = config.session_path.resolve()
        return store
    directory = None
    if config.persist:
        directory = config.session_dir or session_dir_for(config.agent_dir, config.cwd)
    return SessionFile.create(directory, config.cwd)


def _context_positions(store: SessionFile) -> tuple[dict[str, Any] | None, list[int]]:
    """The latest compaction on the active branch (or None), and the positions of the
    message entries the context holds: those the compaction kept, then what came after."""
    positions = store.path_to_leaf()
    compactions = [i for i, position in enumerate(positions)
                   if store.kind(position) == "compaction"]
    summary = None
    if compactions:
        at = compactions[-1]
        summary = store.entry(positions[at])
        kept_from = next((i for i, position in enumerate(positions[:at])
                          if store.entry_id(position) == summary.get("firstKeptEntryId")), at)
        positions = positions[kept_from:at] + positions[at + 1:]
    return summary, [position for position in positions if store.kind(position) == "message"]


def stored_name(store: SessionFile) -> str | None:
    """The latest non-empty ``session_info`` name in the file (all branches)."""
    for position in reversed(range(len(store))):
        if store.kind(position) == "session_info":
            name = store.entry(position).get("name")
            if name:
                return str(name)
    return None


def context_size(store: SessionFile) -> int:
    summary, positions = _context_positions(store)
    return len(positions) + (summary is not None)


def build_context(store: SessionFile) -> list[w.AgentMessage]:
    """The messages of the active branch (reference-behaviour.md §2.7): the latest
    compaction's summary first, then the entries it kept, then what came after. Only those
    message entries are read back from the file."""
    summary, positions = _context_positions(store)
    messages: list[w.AgentMessage] = []
    if summary is not None:
        messages.append(w.UserMessage(content=[w.TextContent(text=(
            "The conversation history before this point was compacted into the following "
            f"summary:\n\n<summary>\n{summary.get('summary', '')}\n</summary>"))],
            timestamp=0))
    for position in positions:
        try:
            message: w.AgentMessage = _codec.structure(
                store.entry(position)["message"], w.AgentMessage)  # type: ignore[arg-type]
        except (CommandError, KeyError):
            continue  # a message kind forged does not know yet stays in the file
        messages.append(message)
    return messages
