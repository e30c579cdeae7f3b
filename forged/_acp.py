"""``forged --mode acp``: the Agent Client Protocol (JSON-RPC 2.0 over stdio, protocol version
1), which editors speak, in front of the same sessions as the RPC mode.

First part: ``initialize``, ``session/new``, ``session/prompt`` (text and image blocks) with
its stream of ``session/update`` notifications (``agent_message_chunk``,
``agent_thought_chunk``, ``tool_call``, ``tool_call_update``), ``session/cancel``, and the
framing errors. A session's events are translated as the session emits them::

    run_acp
    └── process_nursery
        ├── warm_up, the scripted provider's server (as in stdio mode)
        ├── the writer                 stdout, through one Outbox
        ├── read_requests              stdin -> JSON-RPC messages, in order
        └── AcpSession.serve           one per session/new: open_session, its nursery
            └── prompt tasks           each answers its session/prompt at agent_settled
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from . import __version__
from . import _wire as w
from ._config import Models, Options, list_stored, open_models, session_config
from ._connection import Outbox, open_fd_stream, read_lines
from ._dispatch import Dispatcher
from ._errors import CommandError
from ._jsonl import LineTooLong, decode_json, encode_line
from ._log import log
from ._session import SessionConfig, open_session
from ._transports.stdio import SHUTDOWN_GRACE_S

PROTOCOL_VERSION = 1
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
STOP_REASONS = {"stop": "end_turn", "toolUse": "end_turn", "length": "max_tokens",
                "aborted": "cancelled", "error": "end_turn"}
TOOL_KINDS = {"read": "read", "edit": "edit", "write": "edit", "bash": "execute",
              "grep": "search", "find": "search", "ls": "search"}


class AcpError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class AcpSession:
    """One forged session behind an ACP ``sessionId``: its events become ``session/update``
    notifications, and each ``session/prompt`` is answered when the session settles."""

    def __init__(self, front: AcpFront, config: SessionConfig) -> None:
        self._front = front
        self._config = config
        self.session_id = ""
        self._arguments: dict[str, dict[str, Any]] = {}
        """Each running tool call's arguments, for the diff its end shows."""
        self._waiting: list[int | str] = []
        """The session/prompt requests answered when the session settles."""
        self._last_stop = "stop"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        async with open_session(self._config, self._event, in_thread=False) as session:
            self.session = session
            self.session_id = session.session_id
            self.dispatcher = Dispatcher(session, lambda _: None)
            task_status.started()
            await trio.sleep_forever()

    def _update(self, update: dict[str, Any]) -> None:
        self._front.notify("session/update", {"sessionId": self.session_id, "update": update})

    def _event(self, line: bytes) -> None:
        event = orjson.loads(line)
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
            self._tool_started(event["toolCallId"], event["toolName"], event.get("args") or {})
        elif kind == "tool_execution_end":
            self._tool_ended(event["toolCallId"], event["toolName"], event["isError"],
                             "".join(block.get("text", "")
                                     for block in event["result"]["content"]
                                     if block.get("type") == "text"))
        elif kind == "message_end" and event["message"].get("role") == "assistant":
            message = event["message"]
            self._last_stop = message.get("stopReason", "stop")
            self._usage(message)
        elif kind == "agent_settled":
            stop = "cancelled" if event.get("aborted") else STOP_REASONS.get(
                self._last_stop, "end_turn")
            waiting, self._waiting = self._waiting, []
            for request_id in waiting:
                self._front.answer(request_id, {"stopReason": stop})

    def _tool_started(self, call_id: str, tool: str, arguments: dict[str, Any]) -> None:
        self._arguments[call_id] = arguments
        update: dict[str, Any] = {
            "sessionUpdate": "tool_call", "toolCallId": call_id,
            "title": _title(tool, arguments), "kind": TOOL_KINDS.get(tool, "other"),
            "status": "in_progress", "rawInput": arguments}
        if isinstance(arguments.get("path"), str):
            update["locations"] = [{"path": str(self.session.cwd / arguments["path"])}]
        self._update(update)

    def _tool_ended(self, call_id: str, tool: str, failed: bool, text: str) -> None:
        content: list[dict[str, Any]] = [{"type": "content",
                                          "content": {"type": "text", "text": text}}]
        arguments = self._arguments.pop(call_id, {})
        if not failed:
            content += self._diff(tool, arguments)
        self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                      "status": "failed" if failed else "completed", "content": content})

    def _diff(self, tool: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """What an edit or a write changed, as the editor shows it: the replaced text and
        its replacement, or a new file's whole content."""
        path = arguments.get("path")
        if not isinstance(path, str):
            return []
        where = str(self.session.cwd / path)
        if tool == "edit" and isinstance(arguments.get("newText"), str):
            return [{"type": "diff", "path": where, "oldText": arguments.get("oldText"),
                     "newText": arguments["newText"]}]
        if tool == "write" and isinstance(arguments.get("content"), str):
            return [{"type": "diff", "path": where, "oldText": None,
                     "newText": arguments["content"]}]
        return []

    def _usage(self, message: dict[str, Any]) -> None:
        """The context's size after a reply, against the model's window, and the session's
        cost so far."""
        model, usage = self.session.model, message.get("usage") or {}
        if model is None or not usage:
            return
        used = usage.get("totalTokens") or sum(
            usage.get(key, 0) for key in ("input", "output", "cacheRead", "cacheWrite"))
        self._update({"sessionUpdate": "usage_update", "used": used,
                      "size": model.context_window,
                      "cost": {"amount": self.session.stats().cost, "currency": "USD"}})

    def prompt(self, request_id: int | str, blocks: list[Any]) -> None:
        text, images = _prompt_content(blocks)
        outcome: list[dict[str, Any]] = []
        self.dispatcher.handle(w.Prompt(message=text, images=images or None,
                                        streaming_behavior="followUp"), request_id,
                               lambda line: outcome.append(orjson.loads(line)))
        if not outcome or not outcome[0]["success"]:
            error = outcome[0]["error"] if outcome else "the prompt was not taken"
            raise AcpError(INTERNAL_ERROR, error)
        if outcome[0]["data"]["disposition"] == "handled":
            self._front.answer(request_id, {"stopReason": "end_turn"})
            return
        self._waiting.append(request_id)

    def choices(self) -> dict[str, Any]:
        """The session's thinking levels as modes, and its model and level as config
        options, as ``session/new`` and ``session/load`` answer them."""
        session = self.session
        levels = session.choice.available_levels()
        modes = [{"id": level, "name": f"Thinking: {level}"} for level in levels]
        model = session.model
        models = [{"value": f"{m.provider}/{m.id}", "name": m.name}
                  for m in session.registry.available()]
        options: list[dict[str, Any]] = []
        if model is not None:
            options.append({"id": "model", "name": "Model", "category": "model",
                            "type": "select", "currentValue": f"{model.provider}/{model.id}",
                            "options": models})
        options.append({"id": "thought_level", "name": "Thinking", "category": "thought_level",
                        "type": "select", "currentValue": session.thinking_level,
                        "options": [{"value": m["id"], "name": m["name"]} for m in modes]})
        return {"modes": {"currentModeId": session.thinking_level, "availableModes": modes},
                "configOptions": options}

    def set_level(self, level: str) -> None:
        if level not in self.session.choice.available_levels():
            raise AcpError(INVALID_PARAMS, f"No mode {level!r}")
        self.session.choice.set_thinking_level(level)
        self._update({"sessionUpdate": "current_mode_update",
                      "currentModeId": self.session.thinking_level})

    def set_option(self, option: str, value: Any) -> None:
        if option == "thought_level":
            self.set_level(str(value))
        elif option == "model":
            provider, _, model_id = str(value).partition("/")
            self.session.choice.set_model(provider, model_id)
        else:
            raise AcpError(INVALID_PARAMS, f"No config option {option!r}")

    async def announce_commands(self) -> None:
        """The prompt templates, skills and plugin commands, as ``/name`` commands."""
        await trio.lowlevel.checkpoint()  # after the session/new answer
        self._update({"sessionUpdate": "available_commands_update", "availableCommands": [
            {"name": command.name, "description": command.description or command.name}
            for command in self.session.commands()]})

    def replay(self) -> None:
        """The active branch as the editor saw it arrive (session/load): the same updates,
        tool calls with their locations and diffs."""
        for message in self.session.messages:
            if isinstance(message, w.UserMessage):
                for block in message.content:
                    if isinstance(block, w.TextContent):
                        self._update({"sessionUpdate": "user_message_chunk",
                                      "content": {"type": "text", "text": block.text}})
            elif isinstance(message, w.AssistantMessage):
                for part in message.content:
                    if isinstance(part, w.ThinkingContent) and part.thinking:
                        self._update({"sessionUpdate": "agent_thought_chunk",
                                      "content": {"type": "text", "text": part.thinking}})
                    elif isinstance(part, w.TextContent) and part.text:
                        self._update({"sessionUpdate": "agent_message_chunk",
                                      "content": {"type": "text", "text": part.text}})
                    elif isinstance(part, w.ToolCall):
                        self._tool_started(part.id, part.name, part.arguments)
            elif isinstance(message, w.ToolResultMessage):
                self._tool_ended(message.tool_call_id, message.tool_name, message.is_error,
                                 "".join(b.text for b in message.content
                                         if isinstance(b, w.TextContent)))

    def cancel(self) -> None:
        self.session.queues.clear()
        self.session.abort(lambda: None)


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


def _title(tool: str, arguments: dict[str, Any]) -> str:
    detail = arguments.get("path") or arguments.get("command") or arguments.get("pattern")
    return f"{tool} {detail}" if isinstance(detail, str) else tool


def _prompt_content(blocks: list[Any]) -> tuple[str, list[w.ImageContent]]:
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
            resource = block.get("resource") or {}
            texts.append(f"<context ref=\"{resource.get('uri')}\">\n{resource.get('text', '')}"
                         "\n</context>")
        else:
            raise AcpError(INVALID_PARAMS, f"unsupported prompt block: {kind!r}")
    return "\n".join(texts), images


class AcpFront:
    """The JSON-RPC side: requests in, responses and notifications out, in order."""

    def __init__(self, options: Options, outbox: Outbox, nursery: trio.Nursery) -> None:
        self._options = options
        self._outbox = outbox
        self._nursery = nursery
        self._models: Models | None = None
        self.sessions: dict[str, AcpSession] = {}

    def _send(self, message: dict[str, Any]) -> None:
        self._outbox.put(encode_line({"jsonrpc": "2.0", **message}))

    def answer(self, request_id: int | str, result: Any) -> None:
        self._send({"id": request_id, "result": result})

    def fail(self, request_id: int | str | None, code: int, message: str) -> None:
        self._send({"id": request_id, "error": {"code": code, "message": message}})

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._send({"method": method, "params": params})

    async def handle(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(
                message.get("method"), str):
            if isinstance(message, dict) and "method" not in message and (
                    "result" in message or "error" in message):
                return  # a response to a request of ours
            self.fail(message.get("id") if isinstance(message, dict) else None,
                      INVALID_REQUEST, "Invalid Request: expected a JSON-RPC 2.0 message")
            return
        request_id = message.get("id")
        params = message.get("params") or {}
        try:
            result = await self._call(message["method"], params, request_id)
        except AcpError as exc:
            if request_id is not None:
                self.fail(request_id, exc.code, str(exc))
            return
        except CommandError as exc:  # what the RPC mode answers success:false
            if request_id is not None:
                self.fail(request_id, INVALID_PARAMS, str(exc))
            return
        except Exception as exc:  # a bug: this request's, not the agent's
            log(f"{message['method']} failed: {exc!r}")
            if request_id is not None:
                self.fail(request_id, INTERNAL_ERROR, f"{message['method']} failed: {exc}")
            return
        if request_id is not None and result is not _LATER:
            self.answer(request_id, result)

    async def _call(self, method: str, params: dict[str, Any], request_id: Any) -> Any:
        if method == "initialize":
            return {"protocolVersion": PROTOCOL_VERSION,
                    "agentCapabilities": {
                        "loadSession": True,
                        "promptCapabilities": {"image": True, "embeddedContext": True},
                        "sessionCapabilities": {"list": {}}},
                    "agentInfo": {"name": "forged", "title": "forged",
                                  "version": __version__},
                    "authMethods": []}
        if method == "session/new":
            opened = await self._open(params)
            return {"sessionId": opened.session_id, **opened.choices()}
        if method == "session/load":
            session_id = str(params.get("sessionId") or "")
            if session_id in self.sessions:
                raise AcpError(INVALID_PARAMS, f"Session {session_id} is already open")
            loaded = await self._open(params, session_id)
            loaded.replay()
            return loaded.choices()
        if method == "session/list":
            return {"sessions": self._stored(params)}
        if method == "session/prompt":
            if request_id is None:
                raise AcpError(INVALID_REQUEST, "session/prompt is a request")
            self._session(params).prompt(request_id, list(params.get("prompt") or []))
            return _LATER
        if method == "session/cancel":
            self._session(params).cancel()
            return None
        if method == "session/set_mode":
            self._session(params).set_level(str(params.get("modeId")))
            return {}
        if method == "session/set_config_option":
            chosen = self._session(params)
            chosen.set_option(str(params.get("configId")), params.get("value"))
            return {"configOptions": chosen.choices()["configOptions"]}
        raise AcpError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def _session(self, params: dict[str, Any]) -> AcpSession:
        session = self.sessions.get(str(params.get("sessionId")))
        if session is None:
            raise AcpError(INVALID_PARAMS, f"No session {params.get('sessionId')!r}")
        return session

    def _folder(self, params: dict[str, Any]) -> Path:
        cwd = params.get("cwd")
        folder = Path(cwd) if isinstance(cwd, str) and cwd else self._options.cwd
        if not folder.is_absolute() or not folder.is_dir():
            raise AcpError(INVALID_PARAMS, f"cwd must be an absolute path to a folder: {cwd}")
        return folder

    async def _open(self, params: dict[str, Any], stored_id: str | None = None) -> AcpSession:
        """A new session in the request's cwd, or the stored one `stored_id` names there."""
        if params.get("mcpServers"):
            log(f"{len(params['mcpServers'])} MCP server(s) asked for; forged does not "
                "connect MCP servers yet")
        folder = self._folder(params)
        if self._models is None:
            self._models = await open_models(self._options, self._nursery)
        options = attrs.evolve(self._options, cwd=folder)
        if stored_id is not None:
            path = next((Path(item.path) for item in list_stored(folder)
                         if item.session_id == stored_id), None)
            if path is None:
                raise AcpError(INVALID_PARAMS, f"No session {stored_id} in {folder}")
            options = attrs.evolve(options, session=str(path), continue_=False,
                                   session_id=None, fork=None)
        config = session_config(options, self._models)
        acp_session = AcpSession(self, config)
        await self._nursery.start(acp_session.serve)
        self.sessions[acp_session.session_id] = acp_session
        self._nursery.start_soon(acp_session.announce_commands)
        return acp_session

    def _stored(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        folder = self._folder(params)
        return [{"sessionId": item.session_id, "cwd": str(folder),
                 "title": session_title(Path(item.path)), "updatedAt": item.modified}
                for item in list_stored(folder)]


_LATER = object()
"""The answer comes later (a prompt's, once its session settles)."""


async def run_acp(options: Options, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """Serve ACP on stdin and stdout until the client closes its end."""
    stdin, stdout = open_fd_stream(stdin_fd), open_fd_stream(stdout_fd)
    outbox = Outbox()
    async with trio.open_nursery() as process_nursery:
        front = AcpFront(options, outbox, process_nursery)
        process_nursery.start_soon(outbox.serve_writer, stdout)

        async def take(piece: bytes | LineTooLong) -> None:
            if isinstance(piece, LineTooLong):
                front.fail(None, PARSE_ERROR, "Parse error: line too long")
            elif piece.strip():
                try:
                    message = decode_json(piece)
                except (ValueError, RecursionError) as exc:
                    front.fail(None, PARSE_ERROR, f"Parse error: {exc}")
                else:
                    await front.handle(message)

        await read_lines(stdin, take)
        for acp_session in front.sessions.values():
            with trio.move_on_after(SHUTDOWN_GRACE_S):
                await acp_session.dispatcher.wait_idle()
        outbox.close()
        await outbox.flushed.wait()
        process_nursery.cancel_scope.cancel()
