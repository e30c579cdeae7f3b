"""The Agent Client Protocol (JSON-RPC 2.0 over stdio, protocol version 1), which editors
speak, in front of the same sessions as the RPC mode: ``forged --mode acp`` serves sessions of
its own process, ``forged connect --acp`` the daemon's.

The front is a translator. Each ACP session talks to its forged session through a `Link` in
RPC commands and reads its RPC events, whether the session runs here (`LocalLink`, straight
into its dispatcher) or in the daemon (`DaemonLink`, one socket connection per session)::

    run_acp
    └── process_nursery
        ├── warm_up, the scripted provider's server (as in stdio mode)
        ├── the writer                 stdout, through one Outbox
        ├── the reader                 stdin -> AcpFront.handle, in order; responses to the
        │                              front's own requests (permissions, fs/*) resolve them
        ├── AcpSession.serve           one per session/new or session/load:
        │   └── InProcess: open_session, its nursery; Daemon: the connection's reader and writer
        └── permission requests        one task per dialog, cancelled by session/cancel

A ``session/prompt`` is answered when its own turn ends: the prompts of a session are followed
through the run's events (its response says whether it started a run or was queued; each
``queue_update`` that takes queued prompts ends the turn before them), and the ones left are
answered at ``agent_settled``.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import orjson
import trio

from ... import _codec
from ... import _wire as w
from ..._config import Models, Options, list_stored, open_models, session_config
from ..._connection import SHUTDOWN_GRACE_S, Outbox, open_fd_stream, read_lines
from ..._dispatch import Agent, failure_text, open_agent
from ..._errors import AcpError, ClientGone, CommandError
from ..._jsonl import LineTooLong, decode_json, encode_line
from ..._log import log
from ..._settings import DEFAULTS
from ..._tools import ToolError
from ..._tools.files import read_file, write_file
from ..._version import __version__

PROTOCOL_VERSION = 1
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
AUTH_REQUIRED = -32000
STOP_REASONS = {"stop": "end_turn", "toolUse": "end_turn", "length": "max_tokens",
                "aborted": "cancelled"}
TOOL_KINDS = {"read": "read", "edit": "edit", "write": "edit", "bash": "execute",
              "grep": "search", "find": "search", "ls": "search"}
BUSY_PROMPT_SETTING = "acpPromptWhileBusy"
"""``followUp`` (default) or ``steer``: what a prompt sent while one runs becomes."""
FS_TIMEOUT_SETTING = "acpFsTimeoutSeconds"
FS_TIMEOUT_S = float(DEFAULTS["acpFsTimeoutSeconds"])
"""How long the editor has to answer ``fs/read_text_file`` or ``fs/write_text_file``; past
it, the tool that asked fails."""
CONFIRM_OPTIONS = [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                   {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
                   {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]
_REFUSED = re.compile(r"\brefusal\b|content filter", re.IGNORECASE)
"""A failed reply that is the model declining (Anthropic's ``refusal`` stop, OpenAI's content
filter): the prompt answers ``refusal``, not an error."""
_REFUSALS = ("no", "reject", "deny", "cancel", "block", "skip", "abort", "stop")

RequestId = int | str
Message = dict[str, Any]
Answered = Callable[[Message], None]


# --- links: how an ACP session reaches its forged session --------------------------------------

class Link(Protocol):
    """RPC commands to one forged session. `answered` gets the command's response in the
    order of the session's lines: before the events written after it."""

    def send(self, command: Message, answered: Answered | None = None) -> None: ...


def _ignore(_: Message) -> None:
    pass


def _ignore_response(_: w.Response) -> None:
    pass


async def call(link: Link, command: Message) -> Any:
    """Send `command` and return its response's ``data``; `CommandError` if it failed."""
    done = trio.Event()
    response: Message = {}

    def answered(message: Message) -> None:
        response.update(message)
        done.set()

    link.send(command, answered)
    await done.wait()
    if not response.get("success"):
        raise CommandError(str(response.get("error")))
    return response.get("data")


class LocalLink:
    """A session of this process: commands go straight to its dispatcher."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def send(self, command: Message, answered: Answered | None = None) -> None:
        parsed = _codec.structure(command, w.COMMAND_CLASSES[command["type"]])
        self._agent.handle(parsed, command.get("id"), (
            lambda response: answered(_codec.unstructure(response))) if answered
            else _ignore_response)


class DaemonLink:
    """A session of the daemon, over a connection of its own (`serve` reads and writes it)."""

    def __init__(self, stream: trio.abc.Stream, on_event: Callable[[Message], None]) -> None:
        self._stream = stream
        self._on_event = on_event
        self._ids = itertools.count(1)
        self._waiting: dict[str, Answered] = {}
        self._lines_send, self._lines_receive = trio.open_memory_channel[bytes](math.inf)
        self.closed = trio.Event()

    def send(self, command: Message, answered: Answered | None = None) -> None:
        if answered is not None:
            command = {**command, "id": f"acp-{next(self._ids)}"}
            if self.closed.is_set():
                answered({"success": False, "error": "the daemon closed the connection"})
                return
            self._waiting[command["id"]] = answered
        self._lines_send.send_nowait(orjson.dumps(command) + b"\n")

    async def serve(self) -> None:
        """Write what is sent and read what comes, until the daemon closes the connection."""
        async def write() -> None:
            async for line in self._lines_receive:
                await self._stream.send_all(line)

        async def take(piece: bytes | LineTooLong) -> None:
            if isinstance(piece, LineTooLong) or not piece.strip():
                return
            item = orjson.loads(piece)
            answered = self._waiting.pop(str(item.get("id")), None) if item.get(
                "type") == "response" else None
            if answered is not None:
                answered(item)
            else:
                self._on_event(item)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                await read_lines(self._stream, take)
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed.set()
            waiting, self._waiting = self._waiting, {}
            for answered in waiting.values():
                answered({"success": False, "error": "the daemon closed the connection"})


# --- where sessions live -----------------------------------------------------------------------

class Sessions(Protocol):
    """Where the front's sessions run: in this process, or in the daemon."""

    async def serve(self, acp_session: AcpSession, stored_id: str | None, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open a new session in ``acp_session.cwd`` (or the stored `stored_id`), `attach` it,
        report started, and serve it until cancelled."""

    async def auth_methods(self) -> list[Message]:
        """Empty when a model is available; else how to make one available."""


class InProcess:
    """Sessions of this process, opened as ``forged --mode rpc`` opens its own."""

    def __init__(self, options: Options, nursery: trio.Nursery) -> None:
        self._options = options
        self._nursery = nursery
        self._models: Models | None = None

    async def _registry(self) -> Models:
        if self._models is None:
            self._models = await open_models(self._options, self._nursery)
        return self._models

    async def auth_methods(self) -> list[Message]:
        if (await self._registry()).registry.available():
            return []
        return [{"id": "api-key", "name": "Set a provider's API key", "description": (
            "forged found no model with a key. Set the provider's key in the environment "
            "the editor starts forged in (ANTHROPIC_API_KEY, OPENAI_API_KEY, ...), or add "
            "the provider to ~/.agent-forge/agent/models.json, and restart the agent.")}]

    async def serve(self, acp_session: AcpSession, stored_id: str | None, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        models = await self._registry()
        options = attrs.evolve(self._options, cwd=acp_session.cwd,
                               mcp_handed=acp_session.mcp_servers)
        if stored_id is not None:
            path = await stored_path(acp_session.cwd, stored_id)
            options = attrs.evolve(options, session=str(path), continue_=False,
                                   session_id=None, fork=None)
        config = session_config(options, models)
        async with open_agent(config, acp_session.on_session_event, _ignore_response,
                              in_thread=False) as agent:
            session = agent.session
            session.files = acp_session.files()
            if session.settings.get(BUSY_PROMPT_SETTING) == "steer":
                acp_session.busy_prompt = "steer"
            timeout = session.settings.get(FS_TIMEOUT_SETTING)
            if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
                acp_session.fs_timeout_s = float(timeout)
            acp_session.attach(LocalLink(agent), session.session_id)
            task_status.started()
            await trio.sleep_forever()


class InDaemon:
    """The daemon's sessions (``forged connect --acp``): each ACP session opens a
    connection with `connect` and a new session there (with `opening`'s provider and model),
    or attaches to a stored or live one."""

    def __init__(self, connect: Callable[[], Awaitable[trio.abc.Stream]],
                 opening: Message) -> None:
        self._connect = connect
        self._opening = opening

    async def auth_methods(self) -> list[Message]:
        return []

    async def serve(self, acp_session: AcpSession, stored_id: str | None, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        handed = {"mcpServers": acp_session.mcp_servers} if acp_session.mcp_servers else {}
        cwd = str(acp_session.cwd)
        if stored_id is None:
            opening = {**self._opening, "type": "new_session", "cwd": cwd, **handed}
        else:  # a file of this folder, named by its exact id, as --mode acp finds it
            path = await stored_path(acp_session.cwd, stored_id)
            opening = ({"type": "new_session", "cwd": cwd, "session": str(path), **handed}
                       if handed else {"type": "attach", "sessionId": stored_id})
        stream = await self._connect()
        refused: str | None = None
        async with stream, trio.open_nursery() as nursery:
            link = DaemonLink(stream, acp_session.on_event)
            nursery.start_soon(link.serve)
            try:
                await call(link, opening)
                state = await call(link, {"type": "get_state"})
            except CommandError as exc:
                refused = str(exc)
            else:
                acp_session.attach(link, state["sessionId"])
                task_status.started()
                await link.closed.wait()
                log(f"the daemon closed session {acp_session.session_id}")
            nursery.cancel_scope.cancel()
        if refused is not None:  # raised out here: a nursery would wrap it in a group
            raise AcpError(INVALID_PARAMS, refused)


async def stored_path(cwd: Path, session_id: str) -> Path:
    """The file of `cwd`'s stored session whose id is exactly `session_id` (never a prefix,
    a path or another folder's); `AcpError` when there is none."""
    stored = await trio.to_thread.run_sync(list_stored, cwd)
    path = next((Path(item.path) for item in stored if item.session_id == session_id), None)
    if path is None:
        raise AcpError(INVALID_PARAMS, f"No session {session_id} in {cwd}")
    return path


# --- one session -------------------------------------------------------------------------------

class AcpSession:
    """One forged session behind an ACP ``sessionId``: its events become ``session/update``
    notifications, and each ``session/prompt`` is answered when its own turn ends."""

    def __init__(self, front: AcpFront, cwd: Path) -> None:
        self._front = front
        self.cwd = cwd
        self.session_id = ""
        self.link: Link
        self.mcp_servers: dict[str, Any] = {}
        """The MCP servers the client handed the session, as mcp.json entries."""
        self.busy_prompt = "followUp"
        """What a prompt sent while one runs becomes (`BUSY_PROMPT_SETTING`)."""
        self.fs_timeout_s = FS_TIMEOUT_S
        """How long the editor has to answer ``fs/*`` (`FS_TIMEOUT_SETTING`)."""
        self._arguments: dict[str, dict[str, Any]] = {}
        """Each running tool call's arguments, for the diff its end shows."""
        self._tool: tuple[str, str] | None = None
        """The running tool call's id and tool name, which a dialog asks about."""
        self._running: list[RequestId] = []
        """The prompts whose turn runs."""
        self._queued: dict[str, list[RequestId | None]] = {"steering": [], "followUp": []}
        """forged's queues as ``queue_update`` shows them: the prompt of each entry (None
        for one that is not an ACP prompt's)."""
        self._expected: list[RequestId] = []
        """Prompts answered ``queued`` whose entry the next growing ``queue_update`` adds."""
        self._unanswered = 0
        self._quiet = trio.Event()
        self._quiet.set()
        self._cancelling = False
        self._stop = "stop"
        self._error: str | None = None
        """The last reply's stop reason and error message, which answer its turn."""
        self._window: int | None = None
        self._cost = 0.0
        self._always: set[tuple[str, str]] = set()
        """Dialogs (tool and title) the user allowed always."""
        self._asking: dict[str, trio.CancelScope] = {}
        """The permission requests open for each dialog."""

    def attach(self, link: Link, session_id: str) -> None:
        self.link = link
        self.session_id = session_id

    def files(self) -> AcpSession | None:
        """This session as the file tools' `ClientFiles`, when the client offers its files."""
        return self if self._front.fs_read or self._front.fs_write else None

    def _update(self, update: Message) -> None:
        self._front.notify("session/update", {"sessionId": self.session_id, "update": update})

    # --- events --------------------------------------------------------------------------------

    def on_session_event(self, event: w.Event) -> None:
        self.on_event(_codec.unstructure(event))

    def on_event(self, event: Message) -> None:
        kind = event.get("type")
        if kind == "message_update":
            inner = event["assistantMessageEvent"]
            if inner["type"] == "text_delta":
                self._update({"sessionUpdate": "agent_message_chunk",
                              "content": {"type": "text", "text": inner["delta"]}})
            elif inner["type"] == "thinking_delta":
                self._update({"sessionUpdate": "agent_thought_chunk",
                              "content": {"type": "text", "text": inner["delta"]}})
        elif kind == "tool_execution_start":
            self._tool = (event["toolCallId"], event["toolName"])
            self._tool_started(event["toolCallId"], event["toolName"], event.get("args") or {})
        elif kind == "tool_execution_end":
            self._tool = None
            self._tool_ended(event["toolCallId"], event["toolName"], event["isError"],
                             _text(event["result"]["content"]))
        elif kind == "message_end" and event["message"].get("role") == "assistant":
            self._stop = event["message"].get("stopReason", "stop")
            self._error = event["message"].get("errorMessage")
            self._usage(event["message"])
        elif kind == "agent_end":
            # A failure that could not be stored (the session file cannot be written) is
            # announced in agent_end only: it answers the turn all the same.
            replies = [message for message in event.get("messages") or []
                       if message.get("role") == "assistant"]
            if replies and replies[-1].get("stopReason") == "error":
                self._stop, self._error = "error", replies[-1].get("errorMessage")
        elif kind == "queue_update":
            self._queue_changed(event)
        elif kind == "extension_ui_request":
            self._dialog(event)
        elif kind == "extension_ui_resolved" and event.get("id") in self._asking:
            self._asking[event["id"]].cancel()  # another client of the daemon answered
        elif kind == "thinking_level_changed":
            self._update({"sessionUpdate": "current_mode_update",
                          "currentModeId": event["level"]})
        elif kind == "agent_settled":
            self._cancelling = False
            self._running += [*(prompt for queue in self._queued.values() for prompt in queue
                                if prompt is not None), *self._expected]
            self._expected.clear()
            for queue in self._queued.values():
                queue[:] = [None] * len(queue)
            self._finish_turn(aborted=bool(event.get("aborted")))

    def _tool_started(self, call_id: str, tool: str, arguments: Message) -> None:
        self._arguments[call_id] = arguments
        update: Message = {
            "sessionUpdate": "tool_call", "toolCallId": call_id,
            "title": _title(tool, arguments), "kind": TOOL_KINDS.get(tool, "other"),
            "status": "in_progress", "rawInput": arguments}
        if isinstance(arguments.get("path"), str):
            update["locations"] = [{"path": str(self.cwd / arguments["path"])}]
        self._update(update)

    def _tool_ended(self, call_id: str, tool: str, failed: bool, text: str) -> None:
        content: list[Message] = [{"type": "content",
                                   "content": {"type": "text", "text": text}}]
        arguments = self._arguments.pop(call_id, {})
        if not failed:
            content += self._diff(tool, arguments)
        self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                      "status": "failed" if failed else "completed", "content": content})

    def _diff(self, tool: str, arguments: Message) -> list[Message]:
        """What an edit or a write changed, as the editor shows it: the replaced text and
        its replacement, or a new file's whole content."""
        path = arguments.get("path")
        if not isinstance(path, str):
            return []
        where = str(self.cwd / path)
        if tool == "edit" and isinstance(arguments.get("newText"), str):
            return [{"type": "diff", "path": where, "oldText": arguments.get("oldText"),
                     "newText": arguments["newText"]}]
        if tool == "write" and isinstance(arguments.get("content"), str):
            return [{"type": "diff", "path": where, "oldText": None,
                     "newText": arguments["content"]}]
        return []

    def _usage(self, message: Message) -> None:
        """The context's size after a reply, against the model's window, and the session's
        cost so far."""
        usage = message.get("usage") or {}
        self._cost += float((usage.get("cost") or {}).get("total") or 0)
        if self._window is None or not usage:
            return
        used = usage.get("totalTokens") or sum(
            usage.get(key, 0) for key in ("input", "output", "cacheRead", "cacheWrite"))
        self._update({"sessionUpdate": "usage_update", "used": used, "size": self._window,
                      "cost": {"amount": self._cost, "currency": "USD"}})

    # --- prompts -------------------------------------------------------------------------------

    def prompt(self, request_id: RequestId, blocks: list[Any]) -> None:
        text, images = _prompt_content(blocks)
        self._unanswered += 1
        self._quiet = trio.Event()

        def answered(response: Message) -> None:
            if not response.get("success"):
                self._front.fail(request_id, INTERNAL_ERROR, str(response.get("error")))
                self._answered()
                return
            disposition = response["data"]["disposition"]
            if disposition == "handled":  # a plugin command, done
                self._answer(request_id, "end_turn")
            elif disposition == "queued":
                self._expected.append(request_id)
            else:
                self._running.append(request_id)

        command: Message = {"type": "prompt", "message": text,
                            "streamingBehavior": self.busy_prompt}
        if images:
            command["images"] = images
        self.link.send(command, answered)

    def _queue_changed(self, event: Message) -> None:
        """Mirror forged's queues; entries taken from the front start a turn, which ends the
        turn of the prompts running until then."""
        for key in ("steering", "followUp"):
            mirror, now = self._queued[key], len(event[key])
            if now > len(mirror):
                mirror += [self._expected.pop(0) if self._expected else None
                           for _ in range(now - len(mirror))]
            elif now < len(mirror):
                taken = mirror[:len(mirror) - now]
                del mirror[:len(mirror) - now]
                if not self._cancelling:
                    self._finish_turn()
                self._running += [prompt for prompt in taken if prompt is not None]

    def _finish_turn(self, *, aborted: bool = False) -> None:
        """Answer the prompts whose turn ended: with the turn's stop reason, or, when it
        failed, with its error."""
        running, self._running = self._running, []
        stop = "cancelled" if aborted else STOP_REASONS.get(self._stop, "end_turn")
        if self._stop == "error" and not aborted:
            stop = "refusal" if _REFUSED.search(self._error or "") else ""
        if running and not stop:
            log(f"session {self.session_id}: the run failed: {self._error or 'no reason given'}")
        for request_id in running:
            if stop:
                self._answer(request_id, stop)
            else:
                self._front.fail(request_id, INTERNAL_ERROR, self._error or "The run failed")
                self._answered()

    def _answer(self, request_id: RequestId, stop: str) -> None:
        self._front.answer(request_id, {"stopReason": stop})
        self._answered()

    def _answered(self) -> None:
        self._unanswered -= 1
        if self._unanswered <= 0:
            self._unanswered = 0
            self._quiet.set()

    async def wait_answered(self) -> None:
        """Until every prompt of this session is answered."""
        await self._quiet.wait()

    def cancel(self) -> None:
        """Drop what is queued, abort the run, and withdraw the open permission requests:
        the prompts answer ``cancelled``."""
        self._cancelling = self._unanswered > 0
        for scope in self._asking.values():
            scope.cancel()
        self.link.send({"type": "clear_queue"}, _ignore)
        self.link.send({"type": "abort"}, _ignore)

    # --- dialogs as permission requests --------------------------------------------------------

    def _dialog(self, event: Message) -> None:
        method = event.get("method")
        if method in ("confirm", "select"):
            self._front.nursery.start_soon(self._ask, event, self._tool)
        elif method == "input":
            log(f"an input dialog ({event.get('title')!r}) has no ACP equivalent; "
                "it is cancelled")
            self.link.send({"type": "extension_ui_response", "id": event["id"],
                            "cancelled": True})
        elif method == "notify":
            log(f"[{self.session_id}] {event.get('notifyType', 'info')}: {event.get('message')}")

    async def _ask(self, event: Message, tool: tuple[str, str] | None) -> None:
        """Ask the client with ``session/request_permission``; no answer, a cancellation or
        a closed client means no."""
        confirm = event["method"] == "confirm"
        title, message = str(event.get("title") or ""), str(event.get("message") or "")
        key = (tool[1] if tool else "", title)
        response: Message = {"type": "extension_ui_response", "id": event["id"]}
        if confirm and key in self._always:
            self.link.send({**response, "confirmed": True})
            return
        choices = [str(option) for option in event.get("options") or []]
        options = CONFIRM_OPTIONS if confirm else [
            {"optionId": str(index), "name": choice,
             "kind": "reject_once" if choice.lower().startswith(_REFUSALS) else "allow_once"}
            for index, choice in enumerate(choices)]
        question = f"{title}\n\n{message}" if message else title
        tool_call: Message = {"toolCallId": tool[0] if tool else f"dialog-{event['id']}",
                              "content": [{"type": "content",
                                           "content": {"type": "text", "text": question}}]}
        if tool is None:
            tool_call["title"] = title
        outcome: Message = {}
        with trio.CancelScope() as scope:
            self._asking[event["id"]] = scope
            try:
                result = await self._front.request("session/request_permission", {
                    "sessionId": self.session_id, "toolCall": tool_call, "options": options})
                outcome = result.get("outcome") or {} if isinstance(result, dict) else {}
            except (AcpError, ClientGone) as exc:
                log(f"a permission request was not answered ({exc}); taken as no")
            finally:
                self._asking.pop(event["id"], None)
        chosen = outcome.get("optionId") if outcome.get("outcome") == "selected" else None
        if chosen is None:
            response["cancelled"] = True
        elif confirm:
            response["confirmed"] = chosen in ("allow", "always")
            if chosen == "always":
                self._always.add(key)
        elif str(chosen).isdigit() and int(chosen) < len(choices):
            response["value"] = choices[int(chosen)]
        else:
            response["cancelled"] = True
        self.link.send(response)

    # --- the client's files --------------------------------------------------------------------

    async def read_text(self, path: Path) -> str:
        if not self._front.fs_read:
            return await trio.to_thread.run_sync(read_file, path)
        result = await self._client_file("fs/read_text_file", {"path": str(path)})
        content = result.get("content") if isinstance(result, dict) else None
        if not isinstance(content, str):
            raise ToolError(f"fs/read_text_file {path}: the editor's answer holds no text "
                            f"(its result: {_shown(result)})")
        return content

    async def write_text(self, path: Path, text: str) -> None:
        if not self._front.fs_write:
            await trio.to_thread.run_sync(write_file, path, text)
            return
        await self._client_file("fs/write_text_file", {"path": str(path), "content": text})

    async def _client_file(self, method: str, params: Message) -> Any:
        try:
            return await self._front.request(method, {"sessionId": self.session_id, **params},
                                             timeout_s=self.fs_timeout_s)
        except AcpError as exc:
            raise ToolError(f"{method} {params['path']}: {exc}") from None
        except ClientGone:
            raise ToolError(f"{method} {params['path']}: the editor closed the "
                            "connection") from None

    # --- modes, options, commands, replay ------------------------------------------------------

    async def choices(self) -> Message:
        """The session's thinking levels as modes, and its model and level as config
        options, as ``session/new`` and ``session/load`` answer them."""
        state = await call(self.link, {"type": "get_state"})
        levels = (await call(self.link, {"type": "get_available_thinking_levels"}))["levels"]
        models = (await call(self.link, {"type": "get_available_models"}))["models"]
        model, level = state.get("model"), state["thinkingLevel"]
        self._window = model.get("contextWindow") if model else None
        modes = [{"id": name, "name": f"Thinking: {name}"} for name in levels]
        options: list[Message] = []
        if model is not None:
            options.append({"id": "model", "name": "Model", "category": "model",
                            "type": "select",
                            "currentValue": f"{model['provider']}/{model['id']}",
                            "options": [{"value": f"{m['provider']}/{m['id']}",
                                         "name": m["name"]} for m in models]})
        options.append({"id": "thought_level", "name": "Thinking", "category": "thought_level",
                        "type": "select", "currentValue": level,
                        "options": [{"value": m["id"], "name": m["name"]} for m in modes]})
        return {"modes": {"currentModeId": level, "availableModes": modes},
                "configOptions": options}

    async def set_level(self, level: str) -> None:
        levels = (await call(self.link, {"type": "get_available_thinking_levels"}))["levels"]
        if level not in levels:
            raise AcpError(INVALID_PARAMS, f"No mode {level!r}")
        await call(self.link, {"type": "set_thinking_level", "level": level})

    async def set_option(self, option: str, value: Any) -> None:
        if option == "thought_level":
            await self.set_level(str(value))
        elif option == "model":
            provider, _, model_id = str(value).partition("/")
            await call(self.link, {"type": "set_model", "provider": provider,
                                   "modelId": model_id})
        else:
            raise AcpError(INVALID_PARAMS, f"No config option {option!r}")

    async def announce_commands(self) -> None:
        """The prompt templates, skills and plugin commands, as ``/name`` commands."""
        commands = (await call(self.link, {"type": "get_commands"}))["commands"]
        self._update({"sessionUpdate": "available_commands_update", "availableCommands": [
            {"name": command["name"], "description": command.get("description")
             or command["name"]} for command in commands]})

    async def replay(self) -> None:
        """The active branch as the editor saw it arrive (session/load): the same updates,
        tool calls with their locations and diffs; and the cost spent so far."""
        messages = (await call(self.link, {"type": "get_messages"}))["messages"]
        for message in messages:
            role = message.get("role")
            if role == "user":
                content = message.get("content")
                text = content if isinstance(content, str) else _text(content or [])
                if text:
                    self._update({"sessionUpdate": "user_message_chunk",
                                  "content": {"type": "text", "text": text}})
            elif role == "assistant":
                self._cost += float(((message.get("usage") or {}).get("cost") or {}).get(
                    "total") or 0)
                for part in message.get("content") or []:
                    kind = part.get("type")
                    if kind == "thinking" and part.get("thinking"):
                        self._update({"sessionUpdate": "agent_thought_chunk",
                                      "content": {"type": "text", "text": part["thinking"]}})
                    elif kind == "text" and part.get("text"):
                        self._update({"sessionUpdate": "agent_message_chunk",
                                      "content": {"type": "text", "text": part["text"]}})
                    elif kind == "toolCall":
                        self._tool_started(part["id"], part["name"], part.get("arguments") or {})
            elif role == "toolResult":
                self._tool_ended(message["toolCallId"], message["toolName"],
                                 bool(message.get("isError")), _text(message.get("content")
                                                                     or []))


def mcp_entries(servers: Any) -> dict[str, Any]:
    """ACP's ``mcpServers`` (a list; ``env`` and ``headers`` as name/value lists) as
    mcp.json entries; one that is not an object with a name is reported and skipped."""
    entries: dict[str, Any] = {}
    for server in servers if isinstance(servers, list) else []:
        if not isinstance(server, dict) or not isinstance(server.get("name"), str):
            log(f"an MCP server of session/new is skipped: {server!r}")
            continue
        entry = {key: value for key, value in server.items()
                 if key not in ("name", "env", "headers", "_meta")}
        for key in ("env", "headers"):
            pairs = server.get(key)
            if isinstance(pairs, list):
                entry[key] = {pair["name"]: pair["value"] for pair in pairs
                              if isinstance(pair, dict) and isinstance(pair.get("name"), str)
                              and isinstance(pair.get("value"), str)}
        entries[server["name"]] = entry
    return entries


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _text(blocks: list[Any]) -> str:
    return "".join(block.get("text", "") for block in blocks
                   if isinstance(block, dict) and block.get("type") == "text")


def session_title(path: Path) -> str:
    """A stored session's name, else the start of its first prompt (read from its first
    64 KB: listing stays quick whatever the files hold)."""
    try:
        with path.open("rb") as file:
            head = file.read(64 * 1024)
    except OSError:
        return path.stem
    name = first = None
    for line in head.splitlines()[1:]:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if entry.get("type") == "session_info" and isinstance(entry.get("name"), str):
            name = entry["name"]
        message = entry.get("message") if entry.get("type") == "message" else None
        if first is None and isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            first = content if isinstance(content, str) else " ".join(
                block.get("text", "") for block in content or [] if isinstance(block, dict))
    return name or (first or path.stem).strip()[:80]


def _title(tool: str, arguments: Message) -> str:
    detail = arguments.get("path") or arguments.get("command") or arguments.get("pattern")
    return f"{tool} {detail}" if isinstance(detail, str) else tool


def _prompt_content(blocks: list[Any]) -> tuple[str, list[Message]]:
    texts: list[str] = []
    images: list[Message] = []
    for block in blocks:
        if not isinstance(block, dict):
            raise AcpError(INVALID_PARAMS, "a prompt block is not an object")
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image":
            images.append({"type": "image", "data": str(block.get("data", "")),
                           "mimeType": str(block.get("mimeType", "image/png"))})
        elif kind == "resource_link":
            texts.append(f"[{block.get('name') or block.get('uri')}]({block.get('uri')})")
        elif kind == "resource":
            resource = block.get("resource") or {}
            texts.append(f"<context ref=\"{resource.get('uri')}\">\n{resource.get('text', '')}"
                         "\n</context>")
        else:
            raise AcpError(INVALID_PARAMS, f"unsupported prompt block: {kind!r}")
    return "\n".join(texts), images


# --- the JSON-RPC side -------------------------------------------------------------------------

@attrs.define
class _Request:
    """A request of ours to the client, until its response comes."""

    done: trio.Event = attrs.Factory(trio.Event)
    response: Message | None = None
    unreadable: str | None = None
    """Why its answer could not be read."""


_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')


def _is_id(value: Any) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def _readable_id(line: bytes) -> RequestId | None:
    """The id of a line that is not valid JSON, when it can still be read: the whole line by
    Python's more lenient parser (which takes lone surrogates), else the first ``"id"`` field."""
    try:
        message = json.loads(line)
    except ValueError:
        found = _ID.search(line)
        if found is None:
            return None
        try:
            value = json.loads(found.group(1))
        except ValueError:
            return None
    else:
        value = message.get("id") if isinstance(message, dict) else None
    return value if _is_id(value) else None


class AcpFront:
    """Requests in, responses and notifications out, in order; and the front's own requests
    to the client (permissions, files), answered through the same input."""

    def __init__(self, sessions: Sessions, outbox: Outbox, nursery: trio.Nursery, *,
                 default_cwd: Path) -> None:
        self._sessions = sessions
        self._outbox = outbox
        self.nursery = nursery
        self._default_cwd = default_cwd
        self.sessions: dict[str, AcpSession] = {}
        self.fs_read = self.fs_write = False
        self._ids = itertools.count()
        self._requests: dict[RequestId, _Request] = {}
        self._client_gone = False

    def _send(self, message: Message) -> None:
        self._outbox.put(encode_line({"jsonrpc": "2.0", **message}))

    def answer(self, request_id: RequestId, result: Any) -> None:
        self._send({"id": request_id, "result": result})

    def fail(self, request_id: RequestId | None, code: int, message: str) -> None:
        self._send({"id": request_id, "error": {"code": code, "message": message}})

    def notify(self, method: str, params: Message) -> None:
        self._send({"method": method, "params": params})

    async def request(self, method: str, params: Message, *,
                      timeout_s: float = math.inf) -> Any:
        """Ask the client; its result, `AcpError` for its error (or an answer that could not
        be read, or none within `timeout_s`), `ClientGone` if it closed its end first."""
        if self._client_gone:
            raise ClientGone(method)
        request_id = next(self._ids)
        pending = self._requests[request_id] = _Request()
        self._send({"id": request_id, "method": method, "params": params})
        try:
            with trio.move_on_after(timeout_s) as waited:
                await pending.done.wait()
        finally:
            self._requests.pop(request_id, None)
        if waited.cancelled_caught:
            raise AcpError(INTERNAL_ERROR, f"the editor did not answer within {timeout_s:g} s")
        if pending.unreadable is not None:
            raise AcpError(PARSE_ERROR, f"the editor's answer could not be read: "
                           f"{pending.unreadable}")
        if pending.response is None:
            raise ClientGone(method)
        error = pending.response.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            raise AcpError(code if isinstance(code, int) else INTERNAL_ERROR,
                           str(error.get("message") or error))
        if error is not None:
            raise AcpError(INTERNAL_ERROR, f"the editor answered with an error that is not "
                           f"a JSON-RPC error object: {_shown(error)}")
        if "result" not in pending.response:
            raise AcpError(INVALID_REQUEST, "the editor's answer has neither result nor error")
        return pending.response.get("result")

    def settle_unreadable(self, line: bytes, reason: str) -> bool:
        """A line that is not valid JSON (a lone surrogate, say) but may be an answer to a
        request of ours: when its id can be read and is waited for, that request fails with
        `reason` (it never waits for ever). False when no request was settled."""
        request_id = _readable_id(line)
        pending = self._requests.pop(request_id, None) if request_id is not None else None
        if pending is None:
            return False
        pending.unreadable = reason
        pending.done.set()
        return True

    def client_gone(self) -> None:
        """The client closed its end: what we asked it is answered no."""
        self._client_gone = True
        requests, self._requests = self._requests, {}
        for pending in requests.values():
            pending.done.set()

    async def handle(self, message: Any) -> None:
        if isinstance(message, dict) and "method" not in message and (
                "result" in message or "error" in message or (_is_id(message.get("id"))
                and message.get("id") in self._requests)):
            answered = message.get("id")
            pending = self._requests.pop(answered, None) if isinstance(
                answered, int | str) else None
            if pending is not None:
                pending.response = message
                pending.done.set()
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(
                message.get("method"), str):
            self.fail(message.get("id") if isinstance(message, dict) else None,
                      INVALID_REQUEST, "Invalid Request: expected a JSON-RPC 2.0 message")
            return
        request_id = message.get("id")
        params = message.get("params") or {}
        try:
            result = await self._call(message["method"], params, request_id)
        except Exception as exc:
            while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # a nursery's wrapping of one error
            if isinstance(exc, AcpError):
                code, text = exc.code, str(exc)
            else:  # what the RPC mode answers success:false; or a bug, logged there
                code = INVALID_PARAMS if isinstance(exc, CommandError) else INTERNAL_ERROR
                text = failure_text(message["method"], exc)
            if request_id is not None:
                self.fail(request_id, code, text)
            return
        if request_id is not None and result is not _LATER:
            self.answer(request_id, result)

    async def _call(self, method: str, params: Message, request_id: Any) -> Any:
        if method == "initialize":
            fs = (params.get("clientCapabilities") or {}).get("fs") or {}
            self.fs_read = fs.get("readTextFile") is True
            self.fs_write = fs.get("writeTextFile") is True
            return {"protocolVersion": PROTOCOL_VERSION,
                    "agentCapabilities": {
                        "loadSession": True,
                        "promptCapabilities": {"image": True, "embeddedContext": True},
                        "mcpCapabilities": {"http": True, "sse": False},
                        "sessionCapabilities": {"list": {}}},
                    "agentInfo": {"name": "forged", "title": "forged",
                                  "version": __version__},
                    "authMethods": await self._sessions.auth_methods()}
        if method == "authenticate":
            if await self._sessions.auth_methods():
                raise AcpError(AUTH_REQUIRED, "no model has a key yet: set one and restart")
            return {}
        if method == "session/new":
            opened = await self._open(params)
            answer = {"sessionId": opened.session_id, **await opened.choices()}
            self.nursery.start_soon(opened.announce_commands)  # after the answer
            return answer
        if method == "session/load":
            session_id = str(params.get("sessionId") or "")
            if session_id in self.sessions:
                raise AcpError(INVALID_PARAMS, f"Session {session_id} is already open")
            loaded = await self._open(params, session_id)
            await loaded.replay()
            answer = await loaded.choices()
            self.nursery.start_soon(loaded.announce_commands)
            return answer
        if method == "session/list":  # reads the head of every file: in a thread
            return {"sessions": await trio.to_thread.run_sync(self._stored, params)}
        if method == "session/prompt":
            if request_id is None:
                raise AcpError(INVALID_REQUEST, "session/prompt is a request")
            self._session(params).prompt(request_id, list(params.get("prompt") or []))
            return _LATER
        if method == "session/cancel":
            self._session(params).cancel()
            return None
        if method == "session/set_mode":
            await self._session(params).set_level(str(params.get("modeId")))
            return {}
        if method == "session/set_config_option":
            chosen = self._session(params)
            await chosen.set_option(str(params.get("configId")), params.get("value"))
            return {"configOptions": (await chosen.choices())["configOptions"]}
        raise AcpError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def _session(self, params: Message) -> AcpSession:
        session = self.sessions.get(str(params.get("sessionId")))
        if session is None:
            raise AcpError(INVALID_PARAMS, f"No session {params.get('sessionId')!r}")
        return session

    def _folder(self, params: Message) -> Path:
        cwd = params.get("cwd")
        folder = Path(cwd) if isinstance(cwd, str) and cwd else self._default_cwd
        if not folder.is_absolute() or not folder.is_dir():
            raise AcpError(INVALID_PARAMS, f"cwd must be an absolute path to a folder: {cwd}")
        return folder

    async def _open(self, params: Message, stored_id: str | None = None) -> AcpSession:
        """A new session in the request's cwd, or the stored one `stored_id` names there."""
        acp_session = AcpSession(self, self._folder(params))
        acp_session.mcp_servers = mcp_entries(params.get("mcpServers"))
        await self.nursery.start(self._sessions.serve, acp_session, stored_id)
        self.sessions[acp_session.session_id] = acp_session
        return acp_session

    def _stored(self, params: Message) -> list[Message]:
        folder = self._folder(params)
        return [{"sessionId": item.session_id, "cwd": str(folder),
                 "title": session_title(Path(item.path)), "updatedAt": item.modified}
                for item in list_stored(folder)]


_LATER = object()
"""The answer comes later (a prompt's, once its turn ends)."""


async def serve_acp(sessions: Sessions, nursery: trio.Nursery, stdin: trio.abc.ReceiveStream,
                    stdout: trio.abc.SendStream, *, default_cwd: Path) -> None:
    """Serve ACP on `stdin` and `stdout` until the client closes its end, then give the runs
    `SHUTDOWN_GRACE_S` to answer their prompts."""
    outbox = Outbox()
    front = AcpFront(sessions, outbox, nursery, default_cwd=default_cwd)
    nursery.start_soon(outbox.serve_writer, stdout)

    async def take(piece: bytes | LineTooLong) -> None:
        if isinstance(piece, LineTooLong):
            front.fail(None, PARSE_ERROR, "Parse error: line too long")
        elif piece.strip():
            try:
                message = decode_json(piece)
            except (ValueError, RecursionError) as exc:
                if not front.settle_unreadable(piece, str(exc)):
                    front.fail(None, PARSE_ERROR, f"Parse error: {exc}")
            else:
                await front.handle(message)

    await read_lines(stdin, take)
    front.client_gone()
    with trio.move_on_after(SHUTDOWN_GRACE_S):
        for acp_session in front.sessions.values():
            await acp_session.wait_answered()
    outbox.close()
    await outbox.flushed.wait()


async def run_acp(options: Options, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """``forged --mode acp``: sessions of this process."""
    async with trio.open_nursery() as process_nursery:
        await serve_acp(InProcess(options, process_nursery), process_nursery,
                        open_fd_stream(stdin_fd), open_fd_stream(stdout_fd),
                        default_cwd=options.cwd)
        process_nursery.cancel_scope.cancel()
