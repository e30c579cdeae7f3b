"""One ACP session of the front: a forged session behind an ACP ``sessionId``. Its events
become ``session/update`` notifications (`.translate`), each ``session/prompt`` is answered
when its own turn ends (`.turns`), its dialogs become the editor's permission requests or
forms, and its files are read and written through the editor when the editor offers to.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import attrs
import trio

from ... import _wire as w
from ..._dispatch import Agent
from ..._errors import AcpError, ClientGone, CommandError
from ..._log import log, log_exception
from ..._settings import DEFAULTS
from ..._tools import ToolError
from ..._tools.files import read_file, write_file
from ..._tools.guard import unusable_modes_problem
from ..._ui import ALLOW_ONCE, ALLOW_SESSION, DENY
from ..._vocabulary import PERMISSION_MODES, SANDBOXED_MODES
from . import commands
from .backends import Link, call
from .jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, JSONObject, Peer, RequestId, shown
from .translate import Translator
from .turns import Turns

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
CLOSE_GRACE_S = 5.0
"""How long a closed session's run has to settle before its prompts answer ``cancelled``
without it."""


@attrs.define(eq=False, repr=False)
class Offers:
    """What the editor said it can do, in ``initialize``'s ``clientCapabilities``."""

    fs_read: bool = False
    fs_write: bool = False
    form: bool = False
    """``elicitation.form``: a dialog asking for a value becomes ``elicitation/create``."""
    terminal_output: bool = False
    """``_meta.terminal_output``: a ``bash`` call's output streams as a terminal's."""
    terminal_auth: bool = False
    """``auth.terminal``: a terminal sign-in method may be offered."""

    @classmethod
    def read(cls, capabilities: object) -> Offers:
        given = capabilities if isinstance(capabilities, dict) else {}

        def part(name: str, within: dict[str, object] = given) -> dict[str, object]:
            found = within.get(name)
            return found if isinstance(found, dict) else {}

        fs = part("fs")
        return cls(fs_read=fs.get("readTextFile") is True,
                   fs_write=fs.get("writeTextFile") is True,
                   form=isinstance(part("elicitation").get("form"), dict),
                   terminal_output=part("_meta").get("terminal_output") is True,
                   terminal_auth=part("auth").get("terminal") is True)


class Front(Protocol):
    """The front an ACP session belongs to."""

    peer: Peer
    nursery: trio.Nursery
    offers: Offers

    async def fork_session(self, session: AcpSession) -> str: ...


class AcpSession:
    """One forged session behind an ACP ``sessionId``: its events become ``session/update``
    notifications (`Translator`), and each ``session/prompt`` is answered when its own turn
    ends (`Turns`)."""

    def __init__(self, front: Front, cwd: Path) -> None:
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
        self.translator = Translator(self._update, cwd,
                                     terminal_output=front.offers.terminal_output)
        self.turns = Turns(self._answered, self._failed)
        self._tool: tuple[str, str] | None = None
        """The running tool call's id and tool name, which a dialog asks about."""
        self._always: set[tuple[str, str]] = set()
        """Dialogs (tool and title) the user allowed always."""
        self._asking: dict[str, RequestId] = {}
        """The editor's request open for each dialog (a permission request, a form)."""
        self.scope = trio.CancelScope()
        """Cancelled when the session is closed: it ends its forged session here."""
        self.ended = trio.Event()
        """Set once its forged session has ended here (the daemon's: detached)."""
        self.closed = False
        self.muted = True
        """Until its opening is answered: nothing of it is sent before (``session/resume``
        of a busy session replays nothing)."""

    def attach(self, link: Link, session_id: str) -> None:
        self.link = link
        self.session_id = session_id

    def opened(self, agent: Agent) -> None:
        """A session of this process: it reads and writes files through the editor, and
        takes the ACP settings of its own settings."""
        session = agent.session
        offers = self._front.offers
        session.files = self if offers.fs_read or offers.fs_write else None
        session.ui.announce_resolved = True  # a dialog that ends by itself is withdrawn
        if session.settings.get(BUSY_PROMPT_SETTING) == "steer":
            self.busy_prompt = "steer"
        timeout = session.settings.get(FS_TIMEOUT_SETTING)
        if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
            self.fs_timeout_s = float(timeout)

    def _update(self, update: JSONObject) -> None:
        if self.muted:
            return
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
            self._front.peer.withdraw(self._asking[event.id])  # another client answered
        elif isinstance(event, w.AgentSettled):
            self.turns.settled(event.aborted)
        elif isinstance(event, w.SessionInfoChanged):
            self._update({"sessionUpdate": "session_info_update", "title": event.name})
        elif isinstance(event, w.PermissionModeChanged):
            self._update({"sessionUpdate": "current_mode_update", "currentModeId": event.mode})
        elif isinstance(event, w.ModelChanged | w.ThinkingLevelChanged):
            self._front.nursery.start_soon(self.options_changed)

    # --- prompts -------------------------------------------------------------------------------

    def prompt(self, request_id: RequestId, blocks: list[object],
               meta: dict[str, object] | None = None) -> None:
        """A ``session/prompt``; its ``_meta.traceparent`` (and ``tracestate``), the W3C
        trace context its run's spans join."""
        text, images = prompt_content(blocks)
        trace = {key: value for key in ("traceparent", "tracestate")
                 if isinstance(value := (meta or {}).get(key), str)}
        command = commands.parse(text.strip()) if not images else None
        if command is not None:
            self._front.nursery.start_soon(self._command, request_id, *command)
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
                                else "followUp", **trace), answered)

    def _answered(self, request_id: RequestId, stop: str | None, error: str | None) -> None:
        if stop is None:
            self._front.peer.fail(request_id, INTERNAL_ERROR, error or "The run failed")
        else:
            self._front.peer.answer(request_id, {"stopReason": stop})

    def _failed(self, error: str) -> None:
        log(f"session {self.session_id}: the run failed: {error}")

    def cancel(self) -> None:
        """Withdraw the open permission requests and forms (``$/cancel_request``, before
        anything else), drop what is queued and abort the run: the prompts answer
        ``cancelled``."""
        self.turns.cancelling()
        for request_id in list(self._asking.values()):
            self._front.peer.withdraw(request_id)
        self.link.send(w.ClearQueue())
        self.link.send(w.Abort())

    async def close(self) -> None:
        """``session/close``: cancel what runs, answer every prompt (``cancelled``, once the
        run settled or after `CLOSE_GRACE_S`), and end the forged session here (through the
        daemon: this editor detaches; the session goes on for its other clients)."""
        self.closed = True
        try:
            if self.turns.unanswered:
                self.cancel()
                with trio.move_on_after(CLOSE_GRACE_S):
                    await self.turns.wait_answered()
                self.turns.settled(aborted=True)
        finally:
            self.scope.cancel()  # even when the close itself is withdrawn
        await self.ended.wait()

    # --- built-in commands ---------------------------------------------------------------------

    async def _command(self, request_id: RequestId, name: str, argument: str) -> None:
        """A built-in command (`.commands`), answered here: what it did as the agent's
        message, then ``end_turn``."""
        try:
            said = await commands.run(self, name, argument)
        except (CommandError, AcpError, ClientGone) as exc:
            said = f"/{name} failed: {exc}"
        except Exception as exc:  # a bug: this command's, never the front's
            log_exception(f"/{name} failed: {exc!r}", exc)
            said = f"/{name} failed: {exc}"
        self._update({"sessionUpdate": "agent_message_chunk",
                      "content": {"type": "text", "text": said}})
        self._front.peer.answer(request_id, {"stopReason": "end_turn"})

    async def fork(self) -> str:
        return await self._front.fork_session(self)

    # --- dialogs as permission requests --------------------------------------------------------

    def _dialog(self, event: w.ExtensionUiRequest) -> None:
        if event.method in ("confirm", "select"):
            self._front.nursery.start_soon(self._ask, event, self._tool)
        elif event.method == "input" and self._front.offers.form:
            self._front.nursery.start_soon(self._form, event, self._tool)
        elif event.method == "input":
            log(f"an input dialog ({event.title!r}) cannot be asked: the editor takes no "
                "forms (elicitation.form); it is cancelled")
            self.link.send(w.ExtensionUiResponse(cancelled=True), command_id=event.id)
        elif event.method == "notify":
            log(f"[{self.session_id}] {event.notify_type or 'info'}: {event.message}")

    async def permission(self, tool_call: JSONObject, text: str,
                         options: list[dict[str, str]], dialog: str | None = None) -> object:
        """``session/request_permission`` about `tool_call`, saying `text`: the id of the
        option the user selected, or None (cancelled, or an answer without one). `AcpError`
        or `ClientGone` when there is no answer. While it waits it is `dialog`'s request
        (withdrawn by `cancel`)."""
        try:
            result = await self._front.peer.request("session/request_permission", {
                "sessionId": self.session_id,
                "toolCall": {**tool_call, "content": [
                    {"type": "content", "content": {"type": "text", "text": text}}]},
                "options": options}, issued=self._issued(dialog))
        finally:
            if dialog is not None:
                self._asking.pop(dialog, None)
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
        remembered = not title.startswith("MCP server ")  # each server question is its own
        if confirm and remembered and key in self._always:
            self.link.send(w.ExtensionUiResponse(confirmed=True), command_id=event.id)
            return
        choices = [str(option) for option in event.options or []]
        options = (CONFIRM_OPTIONS if remembered else [
            option for option in CONFIRM_OPTIONS if option["optionId"] != "always"]
        ) if confirm else [
            {"optionId": str(index), "name": choice,
             "kind": PERMISSION_KINDS.get(choice) or (
                 "reject_once" if choice.lower().startswith(_REFUSALS) else "allow_once")}
            for index, choice in enumerate(choices)]
        question = f"{title}\n\n{message}" if message else title
        tool_call: JSONObject = {"toolCallId": tool[0] if tool else f"dialog-{event.id}"}
        if tool is None:
            tool_call["title"] = title
        chosen: object = None
        try:
            chosen = await self.permission(tool_call, question, options, event.id)
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

    def _issued(self, dialog: str | None) -> Callable[[RequestId], None] | None:
        if dialog is None:
            return None

        def issued(request_id: RequestId) -> None:
            self._asking[dialog] = request_id

        return issued

    async def _form(self, event: w.ExtensionUiRequest, tool: tuple[str, str] | None) -> None:
        """An ``input`` dialog as the editor's form (``elicitation/create``, one text
        field): accepted, its value; declined, cancelled or unanswered, cancelled."""
        title = event.title or "A value"
        field: JSONObject = {"type": "string", "title": title}
        if event.placeholder:
            field["description"] = event.placeholder
        params: JSONObject = {
            "sessionId": self.session_id, "mode": "form",
            "message": f"{title}\n\n{event.message}" if event.message else title,
            "requestedSchema": {"type": "object", "properties": {"value": field},
                                "required": ["value"]}}
        if tool is not None:
            params["toolCallId"] = tool[0]
        response = w.ExtensionUiResponse(cancelled=True)
        try:
            result = await self._front.peer.request("elicitation/create", params,
                                                    issued=self._issued(event.id))
        except (AcpError, ClientGone) as exc:
            log(f"a form was not answered ({exc}); taken as cancelled")
        else:
            content = result.get("content") if isinstance(result, dict) else None
            value = content.get("value") if isinstance(content, dict) else None
            if isinstance(result, dict) and result.get("action") == "accept" and isinstance(
                    value, str | int | float) and not isinstance(value, bool):
                response = w.ExtensionUiResponse(value=str(value))
        finally:
            self._asking.pop(event.id, None)
        self.link.send(response, command_id=event.id)

    # --- the client's files --------------------------------------------------------------------

    async def read_text(self, path: Path) -> str:
        if not self._front.offers.fs_read:
            return await trio.to_thread.run_sync(read_file, path)
        result = await self._client_file("fs/read_text_file", path)
        content = result.get("content") if isinstance(result, dict) else None
        if not isinstance(content, str):
            raise ToolError(f"fs/read_text_file {path}: the editor's answer holds no text "
                            f"(its result: {shown(result)})")
        return content

    async def write_text(self, path: Path, text: str) -> None:
        if not self._front.offers.fs_write:
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

    async def options_changed(self) -> None:
        """``config_option_update``: the model or thinking level changed (here, or by
        another client of the daemon's session)."""
        if self.closed:
            return
        try:
            options = (await self.choices())["configOptions"]
        except (CommandError, ClientGone) as exc:
            log(f"session {self.session_id}: its options could not be read: {exc}")
            return
        self._update({"sessionUpdate": "config_option_update", "configOptions": options})

    async def announce_commands(self) -> None:
        """The built-in commands, and the prompt templates, skills, plugin and MCP commands,
        as ``/name`` commands."""
        try:
            listed = (await call(self.link, w.GetCommands(), w.CommandList)).commands
        except (CommandError, ClientGone) as exc:  # closed meanwhile
            log(f"session {self.session_id}: its commands could not be listed: {exc}")
            return
        self._update({"sessionUpdate": "available_commands_update",
                      "availableCommands": commands.available(listed)})

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


async def _usable_modes(current: str) -> list[dict[str, str]]:
    """The modes that can work here: without a sandbox, not `auto` nor `read-only` (unless
    the session is in one already: listed so, saying why its commands are refused)."""
    problem = await unusable_modes_problem()
    if problem is None:
        return MODES
    return [mode if mode["id"] != current else {
        **mode, "description": f"Cannot work here: {problem}"}
        for mode in MODES if mode["id"] not in SANDBOXED_MODES or mode["id"] == current]
