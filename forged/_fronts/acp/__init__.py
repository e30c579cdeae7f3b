"""The Agent Client Protocol (JSON-RPC 2.0 over stdio, protocol version 1), which editors
speak, in front of the same sessions as the RPC mode: ``forged --mode acp`` serves sessions of
its own process, ``forged connect --acp`` the daemon's.

The front is a translator, in four parts: a JSON-RPC 2.0 peer (`.jsonrpc`), the sessions'
events as ``session/update`` notifications (`.translate`), which turn answers which prompt
(`.turns`), and where the sessions live (`.backends`: this process, or the daemon)::

    run_acp
    └── process_nursery
        ├── warm_up, the scripted provider's server (as in stdio mode)
        ├── the writer                 stdout, through one Outbox
        ├── Peer.serve                 stdin -> AcpFront.handle, in order; responses to the
        │                              front's own requests (permissions, fs/*) settle them
        ├── Sessions.serve             one per session/new or session/load:
        │   └── in process: open_agent, its nursery; the daemon: its connection
        └── permission requests        one task per dialog, cancelled by session/cancel

A ``session/prompt`` is answered when its own turn ends (`.turns`).
"""

from __future__ import annotations

from pathlib import Path

import trio

from ... import _wire as w
from ..._codec import encode
from ..._config import Options, list_stored, stored_title
from ..._connection import SHUTDOWN_GRACE_S, Outbox, Prefixed, open_fd_stream, response
from ..._dispatch import Agent, failure_text
from ..._errors import AcpError, ClientGone, CommandError
from ..._hub import Hub
from ..._log import log
from ..._settings import DEFAULTS
from ..._tools import ToolError
from ..._tools.files import read_file, write_file
from ..._tools.guard import unusable_modes_problem
from ..._transports.unix import serve_stream_peer
from ..._ui import ALLOW_ONCE, ALLOW_SESSION, DENY
from ..._version import __version__
from ..._vocabulary import PERMISSION_MODES, SANDBOXED_MODES
from .backends import InDaemon, InProcess, Link, Sessions, call, mcp_entries
from .jsonrpc import (
    AUTH_REQUIRED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LATER,
    METHOD_NOT_FOUND,
    JSONObject,
    Peer,
    RequestId,
    shown,
)
from .translate import Translator
from .turns import Turns

PROTOCOL_VERSION = 1
BUSY_PROMPT_SETTING = "acpPromptWhileBusy"
"""``followUp`` (default) or ``steer``: what a prompt sent while one runs becomes."""
FS_TIMEOUT_SETTING = "acpFsTimeoutSeconds"
FS_TIMEOUT_S = float(DEFAULTS["acpFsTimeoutSeconds"])
"""How long the editor has to answer ``fs/read_text_file`` or ``fs/write_text_file``; past
it, the tool that asked fails."""
CONFIRM_OPTIONS = [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                   {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
                   {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]
_REFUSALS = ("no", "reject", "deny", "cancel", "block", "skip", "abort", "stop")
PERMISSION_KINDS = {ALLOW_ONCE: "allow_once", ALLOW_SESSION: "allow_always", DENY: "reject_once"}
"""A permission request's options (`forged._ui.PERMISSION_OPTIONS`) as ACP's kinds."""
_MODE_TEXTS = {
    "full-access": ("Full access",
                    "Commands and file tools act with your rights; nothing is asked"),
    "ask": ("Ask", "Asks before every command and every file change"),
    "auto": ("Auto", "Commands run in a sandbox that writes the project only, without the "
                     "network; asks to do more"),
    "read-only": ("Read only",
                  "Commands run in a sandbox that writes nothing; asks before any change")}
MODES = [{"id": mode, "name": _MODE_TEXTS[mode][0], "description": _MODE_TEXTS[mode][1]}
         for mode in PERMISSION_MODES]
"""The session modes: forged's permission modes (docs/security.md)."""
FRONT_COMMANDS = {"/undo": "Put the files back as they were before the last run",
                  "/checkpoints": "List the checkpoints of this session's files"}
"""Commands the front answers itself (docs/acp.md, Checkpoints)."""


class AcpSession:
    """One forged session behind an ACP ``sessionId``: its events become ``session/update``
    notifications (`Translator`), and each ``session/prompt`` is answered when its own turn
    ends (`Turns`)."""

    def __init__(self, front: AcpFront, cwd: Path) -> None:
        self._front = front
        self.cwd = cwd
        self.session_id = ""
        self.link: Link
        self.mcp_servers: dict[str, object] = {}
        """The MCP servers the client handed the session, as mcp.json entries."""
        self.busy_prompt: str = "followUp"
        """What a prompt sent while one runs becomes (`BUSY_PROMPT_SETTING`)."""
        self.fs_timeout_s = FS_TIMEOUT_S
        """How long the editor has to answer ``fs/*`` (`FS_TIMEOUT_SETTING`)."""
        self.translator = Translator(self._update, cwd)
        self.turns = Turns(self._answered, self._failed)
        self._tool: tuple[str, str] | None = None
        """The running tool call's id and tool name, which a dialog asks about."""
        self._always: set[tuple[str, str]] = set()
        """Dialogs (tool and title) the user allowed always."""
        self._asking: dict[str, trio.CancelScope] = {}
        """The permission requests open for each dialog."""

    def attach(self, link: Link, session_id: str) -> None:
        self.link = link
        self.session_id = session_id

    def opened(self, agent: Agent) -> None:
        """A session of this process: it reads and writes files through the editor, and
        takes the ACP settings of its own settings."""
        session = agent.session
        session.files = self if self._front.fs_read or self._front.fs_write else None
        if session.settings.get(BUSY_PROMPT_SETTING) == "steer":
            self.busy_prompt = "steer"
        timeout = session.settings.get(FS_TIMEOUT_SETTING)
        if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
            self.fs_timeout_s = float(timeout)

    def _update(self, update: JSONObject) -> None:
        self._front.peer.notify("session/update", {"sessionId": self.session_id,
                                                   "update": update})

    # --- events --------------------------------------------------------------------------------

    def on_event(self, event: w.Event) -> None:
        self.translator.event(event)
        if isinstance(event, w.ToolExecutionStart):
            self._tool = (event.tool_call_id, event.tool_name)
        elif isinstance(event, w.ToolExecutionEnd):
            self._tool = None
        elif isinstance(event, w.MessageEnd) and isinstance(event.message, w.AssistantMessage):
            self.turns.replied(event.message.stop_reason, event.message.error_message)
        elif isinstance(event, w.AgentEnd):
            # A failure that could not be stored (the session file cannot be written) is
            # announced in agent_end only: it answers the turn all the same.
            replies = [m for m in event.messages if isinstance(m, w.AssistantMessage)]
            if replies and replies[-1].stop_reason == "error":
                self.turns.replied("error", replies[-1].error_message)
        elif isinstance(event, w.QueueUpdate):
            self.turns.queue_changed(len(event.steering), len(event.follow_up))
        elif isinstance(event, w.ExtensionUiRequest):
            self._dialog(event)
        elif isinstance(event, w.ExtensionUiResolved) and event.id in self._asking:
            self._asking[event.id].cancel()  # another client of the daemon answered
        elif isinstance(event, w.AgentSettled):
            self.turns.settled(event.aborted)

    # --- prompts -------------------------------------------------------------------------------

    def prompt(self, request_id: RequestId, blocks: list[object]) -> None:
        text, images = prompt_content(blocks)
        if text.strip() in FRONT_COMMANDS and not images:
            self._front.nursery.start_soon(self._front_command, request_id, text.strip())
            return
        self.turns.prompted()

        def answered(response: w.Response) -> None:
            if isinstance(response.data, w.PromptAccepted):
                self.turns.accepted(request_id, response.data.disposition)
            else:
                self.turns.refused(request_id, response.error or f"prompt answered "
                                   f"{response.data!r}")

        self.link.send(w.Prompt(message=text, images=images or None,
                                streaming_behavior="steer" if self.busy_prompt == "steer"
                                else "followUp"), answered)

    def _answered(self, request_id: RequestId, stop: str | None, error: str | None) -> None:
        if stop is None:
            self._front.peer.fail(request_id, INTERNAL_ERROR, error or "The run failed")
        else:
            self._front.peer.answer(request_id, {"stopReason": stop})

    def _failed(self, error: str) -> None:
        log(f"session {self.session_id}: the run failed: {error}")

    def cancel(self) -> None:
        """Drop what is queued, abort the run, and withdraw the open permission requests:
        the prompts answer ``cancelled``."""
        self.turns.cancelling()
        for scope in self._asking.values():
            scope.cancel()
        self.link.send(w.ClearQueue())
        self.link.send(w.Abort())

    # --- /undo and /checkpoints --------------------------------------------------------------

    async def _front_command(self, request_id: RequestId, command: str) -> None:
        """``/undo`` or ``/checkpoints``, answered here: what it did as the agent's message,
        then ``end_turn``."""
        try:
            said = await (self._undo() if command == "/undo" else self._checkpoints())
        except (CommandError, AcpError, ClientGone) as exc:
            said = f"{command} failed: {exc}"
        self._update({"sessionUpdate": "agent_message_chunk",
                      "content": {"type": "text", "text": said}})
        self._front.peer.answer(request_id, {"stopReason": "end_turn"})

    async def _checkpoints(self) -> str:
        listed = (await call(self.link, w.GetCheckpoints(), w.CheckpointList)).checkpoints
        if not listed:
            return "No checkpoints yet: no run has changed a file."
        return "Checkpoints, oldest first:\n" + "\n".join(map(_checkpoint_line, listed))

    async def _undo(self) -> str:
        """The files back to before the last run; with drift, the user is asked first."""
        listed = (await call(self.link, w.GetCheckpoints(), w.CheckpointList)).checkpoints
        before = [item for item in listed if item.kind == "before"]
        if not before:
            return "Nothing to undo: no run has changed a file."
        target = before[-1].entry_id
        dry = await call(self.link, w.RestoreCheckpoint(entry_id=target, dry_run=True),
                         w.RestoreResult)
        force = False
        if dry.drift:
            names = ", ".join(item.path for item in dry.drift[:20])
            chosen = await self._permission(
                {"toolCallId": f"undo-{target}", "title": "Undo the last run"},
                f"These files changed since the last checkpoint, not by forged: {names}. "
                "Undoing the last run overwrites them. Undo anyway?",
                [{"optionId": "undo", "name": "Undo anyway", "kind": "allow_once"},
                 {"optionId": "keep", "name": "Keep the files", "kind": "reject_once"}])
            if chosen != "undo":
                return "Not undone: the files stay as they are."
            force = True
        done = await call(self.link, w.RestoreCheckpoint(entry_id=target, force=force),
                          w.RestoreResult)
        names = ", ".join(item.path for item in done.files) or "nothing to change"
        return f"Undone: the files are back as they were before the last run ({names})."

    # --- dialogs as permission requests --------------------------------------------------------

    def _dialog(self, event: w.ExtensionUiRequest) -> None:
        if event.method in ("confirm", "select"):
            self._front.nursery.start_soon(self._ask, event, self._tool)
        elif event.method == "input":
            log(f"an input dialog ({event.title!r}) has no ACP equivalent; it is cancelled")
            self.link.send(w.ExtensionUiResponse(cancelled=True), command_id=event.id)
        elif event.method == "notify":
            log(f"[{self.session_id}] {event.notify_type or 'info'}: {event.message}")

    async def _permission(self, tool_call: JSONObject, text: str,
                          options: list[dict[str, str]]) -> object:
        """``session/request_permission`` about `tool_call`, saying `text`: the id of the
        option the user selected, or None (cancelled, or an answer without one). `AcpError`
        or `ClientGone` when there is no answer."""
        result = await self._front.peer.request("session/request_permission", {
            "sessionId": self.session_id,
            "toolCall": {**tool_call, "content": [
                {"type": "content", "content": {"type": "text", "text": text}}]},
            "options": options})
        outcome = result.get("outcome") if isinstance(result, dict) else None
        if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
            return outcome.get("optionId")
        return None

    async def _ask(self, event: w.ExtensionUiRequest, tool: tuple[str, str] | None) -> None:
        """Ask the client with ``session/request_permission``; no answer, a cancellation or
        a closed client means no."""
        confirm = event.method == "confirm"
        title, message = event.title or "", event.message or ""
        key = (tool[1] if tool else "", title)
        if confirm and key in self._always:
            self.link.send(w.ExtensionUiResponse(confirmed=True), command_id=event.id)
            return
        choices = [str(option) for option in event.options or []]
        options = CONFIRM_OPTIONS if confirm else [
            {"optionId": str(index), "name": choice,
             "kind": PERMISSION_KINDS.get(choice) or (
                 "reject_once" if choice.lower().startswith(_REFUSALS) else "allow_once")}
            for index, choice in enumerate(choices)]
        question = f"{title}\n\n{message}" if message else title
        tool_call: JSONObject = {"toolCallId": tool[0] if tool else f"dialog-{event.id}"}
        if tool is None:
            tool_call["title"] = title
        chosen: object = None
        with trio.CancelScope() as scope:
            self._asking[event.id] = scope
            try:
                chosen = await self._permission(tool_call, question, options)
            except (AcpError, ClientGone) as exc:
                log(f"a permission request was not answered ({exc}); taken as no")
            finally:
                self._asking.pop(event.id, None)
        response = w.ExtensionUiResponse()
        if chosen is None:
            response.cancelled = True
        elif confirm:
            response.confirmed = chosen in ("allow", "always")
            if chosen == "always":
                self._always.add(key)
        elif str(chosen).isdigit() and int(str(chosen)) < len(choices):
            response.value = choices[int(str(chosen))]
        else:
            response.cancelled = True
        self.link.send(response, command_id=event.id)

    # --- the client's files --------------------------------------------------------------------

    async def read_text(self, path: Path) -> str:
        if not self._front.fs_read:
            return await trio.to_thread.run_sync(read_file, path)
        result = await self._client_file("fs/read_text_file", path)
        content = result.get("content") if isinstance(result, dict) else None
        if not isinstance(content, str):
            raise ToolError(f"fs/read_text_file {path}: the editor's answer holds no text "
                            f"(its result: {shown(result)})")
        return content

    async def write_text(self, path: Path, text: str) -> None:
        if not self._front.fs_write:
            await trio.to_thread.run_sync(write_file, path, text)
            return
        await self._client_file("fs/write_text_file", path, {"content": text})

    async def _client_file(self, method: str, path: Path,
                           more: dict[str, str] | None = None) -> object:
        try:
            return await self._front.peer.request(
                method, {"sessionId": self.session_id, "path": str(path), **(more or {})},
                timeout_s=self.fs_timeout_s)
        except AcpError as exc:
            raise ToolError(f"{method} {path}: {exc}") from None
        except ClientGone:
            raise ToolError(f"{method} {path}: the editor closed the connection") from None

    # --- modes, options, commands, replay ------------------------------------------------------

    async def choices(self) -> JSONObject:
        """The session's permission modes as modes, and its model, permission mode and
        thinking level as config options, as ``session/new`` and ``session/load`` answer
        them."""
        state = await call(self.link, w.GetState(), w.SessionState)
        levels = (await call(self.link, w.GetAvailableThinkingLevels(),
                             w.ThinkingLevelList)).levels
        models = (await call(self.link, w.GetAvailableModels(), w.ModelList)).models
        model, level = state.model, state.thinking_level
        self.translator.window = model.context_window if model else None
        options: list[JSONObject] = []
        if model is not None:
            options.append({"id": "model", "name": "Model", "category": "model",
                            "type": "select", "currentValue": f"{model.provider}/{model.id}",
                            "options": [{"value": f"{m.provider}/{m.id}", "name": m.name}
                                        for m in models]})
        modes = await _usable_modes(state.permission_mode)
        options.append({"id": "mode", "name": "Permissions", "category": "mode",
                        "type": "select", "currentValue": state.permission_mode,
                        "options": [{"value": m["id"], "name": m["name"],
                                     "description": m["description"]} for m in modes]})
        options.append({"id": "thought", "name": "Thinking", "category": "thought_level",
                        "type": "select", "currentValue": level,
                        "options": [{"value": name, "name": f"Thinking: {name}"}
                                    for name in levels]})
        return {"modes": {"currentModeId": state.permission_mode, "availableModes": modes},
                "configOptions": options}

    async def set_mode(self, mode: str) -> None:
        """The permission mode, announced with ``current_mode_update``; one that cannot work
        here (a sandboxed mode without a sandbox) is refused, saying why."""
        if mode not in PERMISSION_MODES:
            raise AcpError(INVALID_PARAMS, f"No mode {mode!r}")
        if mode in SANDBOXED_MODES and (problem := await unusable_modes_problem()) is not None:
            raise AcpError(INVALID_PARAMS, f"The {mode} mode cannot work here: {problem}")
        await call(self.link, w.SetPermissionMode(mode=mode), object)
        self._update({"sessionUpdate": "current_mode_update", "currentModeId": mode})

    async def set_level(self, level: str) -> None:
        levels = (await call(self.link, w.GetAvailableThinkingLevels(),
                             w.ThinkingLevelList)).levels
        if level not in levels:
            raise AcpError(INVALID_PARAMS, f"No thinking level {level!r}")
        await call(self.link, w.SetThinkingLevel(level=level), object)

    async def set_option(self, option: str, value: object) -> None:
        if option in ("thought", "thought_level"):  # (thought_level: its earlier id)
            await self.set_level(str(value))
        elif option == "mode":
            await self.set_mode(str(value))
        elif option == "model":
            provider, _, model_id = str(value).partition("/")
            await call(self.link, w.SetModel(provider=provider, model_id=model_id), object)
        else:
            raise AcpError(INVALID_PARAMS, f"No config option {option!r}")

    async def announce_commands(self) -> None:
        """The prompt templates, skills and plugin commands, as ``/name`` commands."""
        commands = (await call(self.link, w.GetCommands(), w.CommandList)).commands
        self._update({"sessionUpdate": "available_commands_update", "availableCommands": [
            *({"name": name.lstrip("/"), "description": description}
              for name, description in FRONT_COMMANDS.items()),
            *({"name": command.name, "description": command.description or command.name}
              for command in commands)]})

    async def replay(self) -> None:
        """The active branch as the editor saw it arrive (``session/load``)."""
        messages = (await call(self.link, w.GetMessages(), w.MessageList)).messages
        self.translator.replay(messages)


def prompt_content(blocks: list[object]) -> tuple[str, list[w.ImageContent]]:
    """A prompt's blocks as forged's prompt: its text, and its images."""
    texts: list[str] = []
    images: list[w.ImageContent] = []
    for block in blocks:
        if not isinstance(block, dict):
            raise AcpError(INVALID_PARAMS, "a prompt block is not an object")
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image":
            images.append(w.ImageContent(data=str(block.get("data", "")),
                                         mime_type=str(block.get("mimeType", "image/png"))))
        elif kind == "resource_link":
            texts.append(f"[{block.get('name') or block.get('uri')}]({block.get('uri')})")
        elif kind == "resource":
            resource = block.get("resource")
            resource = resource if isinstance(resource, dict) else {}
            texts.append(f"<context ref=\"{resource.get('uri')}\">\n{resource.get('text', '')}"
                         "\n</context>")
        else:
            raise AcpError(INVALID_PARAMS, f"unsupported prompt block: {kind!r}")
    return "\n".join(texts), images


class AcpFront:
    """ACP's methods, on one `Peer`: each request in order, answered in order."""

    def __init__(self, sessions: Sessions, outbox: Outbox, nursery: trio.Nursery, *,
                 default_cwd: Path) -> None:
        self._sessions = sessions
        self.nursery = nursery
        self._default_cwd = default_cwd
        self.sessions: dict[str, AcpSession] = {}
        self.fs_read = self.fs_write = False
        self.peer = Peer(outbox, self._call, self._failure)

    @staticmethod
    def _failure(method: str, exc: Exception) -> tuple[int, str]:
        """What RPC's success:false is (a refusal), or a bug (logged there)."""
        code = INVALID_PARAMS if isinstance(exc, CommandError) else INTERNAL_ERROR
        return code, failure_text(method, exc)

    async def _call(self, method: str, params: JSONObject, request_id: RequestId | None
                    ) -> object:
        if method == "initialize":
            client = params.get("clientCapabilities")
            found = client.get("fs") if isinstance(client, dict) else None
            fs = found if isinstance(found, dict) else {}
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
            loaded_answer = await loaded.choices()
            self.nursery.start_soon(loaded.announce_commands)
            return loaded_answer
        if method == "session/list":  # reads the head of every file: in a thread
            return {"sessions": await trio.to_thread.run_sync(self._stored, params)}
        if method == "session/prompt":
            if request_id is None:
                raise AcpError(INVALID_REQUEST, "session/prompt is a request")
            prompt = params.get("prompt")
            self._session(params).prompt(request_id, prompt if isinstance(prompt, list) else [])
            return LATER
        if method == "session/cancel":
            self._session(params).cancel()
            return None
        if method == "session/set_mode":
            await self._session(params).set_mode(str(params.get("modeId")))
            return {}
        if method == "session/set_config_option":
            chosen = self._session(params)
            await chosen.set_option(str(params.get("configId")), params.get("value"))
            return {"configOptions": (await chosen.choices())["configOptions"]}
        raise AcpError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def _session(self, params: JSONObject) -> AcpSession:
        session = self.sessions.get(str(params.get("sessionId")))
        if session is None:
            raise AcpError(INVALID_PARAMS, f"No session {params.get('sessionId')!r}")
        return session

    def _folder(self, params: JSONObject) -> Path:
        cwd = params.get("cwd")
        folder = Path(cwd) if isinstance(cwd, str) and cwd else self._default_cwd
        if not folder.is_absolute() or not folder.is_dir():
            raise AcpError(INVALID_PARAMS, f"cwd must be an absolute path to a folder: {cwd}")
        return folder

    async def _open(self, params: JSONObject, stored_id: str | None = None) -> AcpSession:
        """A new session in the request's cwd, or the stored one `stored_id` names there."""
        acp_session = AcpSession(self, self._folder(params))
        acp_session.mcp_servers = mcp_entries(params.get("mcpServers"))
        await self.nursery.start(self._sessions.serve, acp_session, stored_id)
        self.sessions[acp_session.session_id] = acp_session
        return acp_session

    def _stored(self, params: JSONObject) -> list[JSONObject]:
        folder = self._folder(params)
        return [{"sessionId": item.session_id, "cwd": str(folder),
                 "title": stored_title(Path(item.path)), "updatedAt": item.modified}
                for item in list_stored(folder)]


async def serve_acp(sessions: Sessions, nursery: trio.Nursery, stdin: trio.abc.ReceiveStream,
                    stdout: trio.abc.SendStream, *, default_cwd: Path) -> None:
    """Serve ACP on `stdin` and `stdout` until the client closes its end, then give the runs
    `SHUTDOWN_GRACE_S` to answer their prompts."""
    outbox = Outbox()
    front = AcpFront(sessions, outbox, nursery, default_cwd=default_cwd)
    nursery.start_soon(outbox.serve_writer, stdout)
    await front.peer.serve(stdin)
    with trio.move_on_after(SHUTDOWN_GRACE_S):
        for acp_session in front.sessions.values():
            await acp_session.turns.wait_answered()
    outbox.close()
    await outbox.flushed.wait()


ACP_OPENED_ID = "forged-connect"


async def serve_in_daemon(hub: Hub, request: w.JSONObject,
                          stream: trio.abc.HalfCloseableStream, read: bytes) -> None:
    """A socket connection of the daemon that asked for ACP (``{"type": "acp", "cwd"?,
    "provider"?, "model"?, "permissionMode"?, "id"?}``, answered as an RPC response to that
    id): the ACP front runs here, beside the sessions, each ACP session one of the daemon's
    on a connection of its own (a socket pair: the hub serves it as any client)."""
    cwd = request.get("cwd")
    folder = Path(cwd) if isinstance(cwd, str) and Path(cwd).is_absolute() else hub.default_cwd
    provider, model = request.get("provider"), request.get("model")
    mode = request.get("permissionMode")

    async with stream, trio.open_nursery() as nursery:
        async def connect() -> trio.abc.Stream:
            ours, theirs = trio.socket.socketpair()
            nursery.start_soon(serve_stream_peer, hub, trio.SocketStream(theirs),
                               "an ACP session")
            return trio.SocketStream(ours)

        request_id = request.get("id") or ACP_OPENED_ID
        await stream.send_all(encode(response(
            "acp", request_id if isinstance(request_id, str | int) else ACP_OPENED_ID)))
        await serve_acp(InDaemon(connect, provider=provider if isinstance(provider, str)
                                 else None, model=model if isinstance(model, str) else None,
                                 permission_mode=mode if isinstance(mode, str) else None),
                        nursery, Prefixed(stream, read), stream, default_cwd=folder)
        nursery.cancel_scope.cancel()


async def run_acp(options: Options, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """``forged --mode acp``: sessions of this process."""
    async with trio.open_nursery() as process_nursery:
        await serve_acp(InProcess(options, process_nursery), process_nursery,
                        open_fd_stream(stdin_fd), open_fd_stream(stdout_fd),
                        default_cwd=options.cwd)
        process_nursery.cancel_scope.cancel()


async def _usable_modes(current: str) -> list[dict[str, str]]:
    """The modes that can work here: without a sandbox, not `auto` nor `read-only` (unless
    the session is in one already: listed so, saying why its commands are refused)."""
    problem = await unusable_modes_problem()
    if problem is None:
        return MODES
    return [mode if mode["id"] != current else {
        **mode, "description": f"Cannot work here: {problem}"}
        for mode in MODES if mode["id"] not in SANDBOXED_MODES or mode["id"] == current]


def _checkpoint_line(item: w.Checkpoint) -> str:
    """One checkpoint as ``/checkpoints`` lists it: what it was taken before or after, and
    the files changed since the one before it (a ``before`` capture usually has none: the
    run's own changes are its ``after``'s), or by the restore it was taken for."""
    if item.kind == "before":
        said = f"before the run of “{item.prompt[:60]}”" if item.prompt else "before a run"
        since = "since the checkpoint before"
    elif item.kind == "after":
        said, since = "after the run", ""
    else:
        said, since = "a restore (the files just before it)", "by the restore"
    line = f"{item.timestamp} {said}"
    if item.files:
        count = len(item.files)
        names = ", ".join(change.path for change in item.files[:5])
        more = f", and {count - 5} more" if count > 5 else ""
        line += (f": {count} file{'s' if count != 1 else ''} changed {since}".rstrip()
                 + f" ({names}{more})")
    elif item.kind == "after":
        line += ": no file changed"
    return line
