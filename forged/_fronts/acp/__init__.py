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
from ..._auth import AuthFile
from ..._codec import encode
from ..._config import Options
from ..._connection import SHUTDOWN_GRACE_S, Outbox, Prefixed, open_fd_stream, response
from ..._dispatch import failure_text
from ..._errors import AcpError, CommandError
from ..._hub import Hub
from ..._paths import agent_dir
from ..._transports.unix import serve_stream_peer
from ..._version import __version__
from . import listing
from .backends import InDaemon, InProcess, Sessions, call, mcp_entries, no_model_text
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
)
from .session import AcpSession, Offers

PROTOCOL_VERSION = 1
AGENT_AUTH = "forged-keys"
TERMINAL_AUTH = "forged-login"
"""The sign-in methods: the keys forged finds (read again), and ``forged login`` run in the
editor's terminal (the editor's command with `LOGIN_ARGS`)."""
LOGIN_ARGS = ["--login"]


class AcpFront:
    """ACP's methods, on one `Peer`: each request in order, answered in order."""

    def __init__(self, sessions: Sessions, outbox: Outbox, nursery: trio.Nursery, *,
                 default_cwd: Path) -> None:
        self._sessions = sessions
        self.nursery = nursery
        self._default_cwd = default_cwd
        self.sessions: dict[str, AcpSession] = {}
        self.offers = Offers()
        self.peer = Peer(outbox, self._call, self._failure)

    @staticmethod
    def _failure(method: str, exc: Exception) -> tuple[int, str]:
        """What RPC's success:false is (a refusal), or a bug (logged there)."""
        code = INVALID_PARAMS if isinstance(exc, CommandError) else INTERNAL_ERROR
        return code, failure_text(method, exc)

    async def _call(self, method: str, params: JSONObject, request_id: RequestId | None
                    ) -> object:
        if method == "initialize":
            self.offers = Offers.read(params.get("clientCapabilities"))
            return {"protocolVersion": PROTOCOL_VERSION,
                    "agentCapabilities": {
                        "loadSession": True,
                        "promptCapabilities": {"image": True, "embeddedContext": True},
                        "mcpCapabilities": {"http": True, "sse": False},
                        "sessionCapabilities": {"list": {}, "resume": {}, "close": {},
                                                "delete": {}, "fork": {}},
                        "auth": {"logout": {}}},
                    "agentInfo": {"name": "forged", "title": "forged",
                                  "version": __version__},
                    "authMethods": await self._auth_methods()}
        if method == "authenticate":
            if not await self._sessions.has_model(reread=True):
                raise AcpError(AUTH_REQUIRED, no_model_text())
            return {}
        if method == "logout":
            return await self._logout()
        if method == "session/list":  # reads the head of every file: in a thread
            cwd = params.get("cwd")
            folder = self._folder(params) if cwd is not None else None
            return await trio.to_thread.run_sync(listing.page, folder, params.get("cursor"))
        if method == "session/delete":
            await self._delete(str(params.get("sessionId") or ""))
            return {}
        if method in ("session/new", "session/load", "session/resume", "session/fork"):
            return await self._opening(method, params)
        if method == "session/prompt":
            if request_id is None:
                raise AcpError(INVALID_REQUEST, "session/prompt is a request")
            prompt = params.get("prompt")
            session = self._session(params)
            meta = params.get("_meta")
            session.prompt(request_id, prompt if isinstance(prompt, list) else [],
                           meta if isinstance(meta, dict) else {})
            self.peer.on_withdrawn(request_id, session.cancel)
            return LATER
        if method == "session/cancel":
            self._session(params).cancel()
            return None
        if method == "session/close":
            closed = self._session(params)
            self.sessions.pop(closed.session_id, None)
            await closed.close()
            return {}
        if method == "session/set_mode":
            await self._session(params).set_mode(str(params.get("modeId")))
            return {}
        if method == "session/set_config_option":
            chosen = self._session(params)
            await chosen.set_option(str(params.get("configId")), params.get("value"))
            return {"configOptions": (await chosen.choices())["configOptions"]}
        raise AcpError(METHOD_NOT_FOUND, f"Method not found: {method}")

    async def _auth_methods(self) -> list[JSONObject]:
        """The ``agent`` method (the keys forged finds, read again at ``authenticate``);
        the ``terminal`` one (``forged login`` in the editor's terminal) only for an editor
        that runs them."""
        ready = await self._sessions.has_model()
        methods: list[JSONObject] = [{
            "id": AGENT_AUTH, "name": "Use the keys forged finds",
            "description": "forged has a model with a key." if ready else no_model_text()}]
        if self.offers.terminal_auth:
            methods.append({"id": TERMINAL_AUTH, "name": "Sign in with forged login",
                            "description": "Choose a provider and sign in, or save its key",
                            "type": "terminal", "args": LOGIN_ARGS})
        return methods

    async def _logout(self) -> JSONObject:
        """Every credential saved in auth.json is removed (a key in the environment or in
        models.json stays: forged did not save it)."""
        auth = AuthFile(agent_dir() / "auth.json")
        for provider in list(await trio.to_thread.run_sync(auth.entries)):
            await auth.delete(provider)
        return {}

    async def _opening(self, method: str, params: JSONObject) -> JSONObject:
        """``session/new``, ``session/load`` (the branch replayed first), ``session/resume``
        (nothing replayed) and ``session/fork``: the session's modes and options, its
        commands announced after the answer."""
        if not await self._sessions.has_model():
            raise AcpError(AUTH_REQUIRED, no_model_text())
        session_id = str(params.get("sessionId") or "")
        if method in ("session/load", "session/resume") and session_id in self.sessions:
            raise AcpError(INVALID_PARAMS, f"Session {session_id} is already open")
        answer: JSONObject = {}
        if method == "session/new":
            opened = await self._open(params)
            answer["sessionId"] = opened.session_id
        elif method == "session/fork":
            opened = await self._fork(params, session_id)
            answer["sessionId"] = opened.session_id
        else:
            opened = await self._open(params, session_id)
        try:
            if method == "session/load":
                opened.muted = False
                await opened.replay()
            answer.update(await opened.choices())
        except BaseException:  # failed or withdrawn: the editor never learns of it
            self.sessions.pop(opened.session_id, None)
            opened.scope.cancel()
            raise
        opened.muted = False  # the answer goes out next, before anything of the session
        self.nursery.start_soon(opened.announce_commands)  # after the answer
        return answer

    async def _fork(self, params: JSONObject, session_id: str) -> AcpSession:
        """A new session holding a copy of `session_id`'s active branch, in the request's
        cwd; the files are left as they are, unless ``_meta.forged`` says
        ``{"entryId": ID, "restoreFiles": true}``: then the fork starts before that user
        message, the files put back as they were there (forged's ``fork``)."""
        found = await trio.to_thread.run_sync(listing.find, session_id, self._folder(params))
        if found is None:
            raise AcpError(INVALID_PARAMS, f"No session {session_id}")
        meta = params.get("_meta")
        ours = meta.get("forged") if isinstance(meta, dict) else None
        ours = ours if isinstance(ours, dict) else {}
        forked = await self._open(params, fork_of=found[0])
        entry = ours.get("entryId")
        if isinstance(entry, str):
            try:
                await self._fork_at(forked, entry, ours.get("restoreFiles") is True)
            except BaseException:
                self.sessions.pop(forked.session_id, None)
                forked.scope.cancel()
                raise
        return forked

    async def _fork_at(self, forked: AcpSession, entry: str, restore: bool) -> None:
        """`forked` (a copy) forked again before the prompt `entry`, the copy deleted."""
        copy = (await call(forked.link, w.GetSessionStats(), w.SessionStats)).session_file
        await call(forked.link, w.Fork(entry_id=entry, restore_files=restore), w.ForkResult)
        state = await call(forked.link, w.GetState(), w.SessionState)
        self.sessions.pop(forked.session_id, None)
        forked.session_id = state.session_id
        self.sessions[forked.session_id] = forked
        if copy:  # the copy the fork was taken from: nobody else has it
            await trio.to_thread.run_sync(lambda: Path(copy).unlink(missing_ok=True))

    async def fork_session(self, session: AcpSession) -> str:
        """``/fork``: a new session holding a copy of `session`'s active branch."""
        forked = await self._fork({"cwd": str(session.cwd)}, session.session_id)
        forked.muted = False
        self.nursery.start_soon(forked.announce_commands)
        return forked.session_id

    async def _delete(self, session_id: str) -> None:
        """The stored session's file deleted (closed here first, unloaded by the daemon):
        gone from ``session/list``, ``session/load`` fails."""
        open_here = self.sessions.get(session_id)
        found = await trio.to_thread.run_sync(
            listing.find, session_id, open_here.cwd if open_here else None)
        if found is None:
            raise AcpError(INVALID_PARAMS, f"No session {session_id}")
        open_here = self.sessions.pop(session_id, None)
        if open_here is not None:
            await open_here.close()
        await self._sessions.release(session_id)
        await trio.to_thread.run_sync(lambda: found[0].unlink(missing_ok=True))

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

    async def _open(self, params: JSONObject, stored_id: str | None = None, *,
                    fork_of: Path | None = None) -> AcpSession:
        """A new session in the request's cwd, or the stored one `stored_id` names there, or
        a copy of `fork_of`'s branch; served until it is closed."""
        acp_session = AcpSession(self, self._folder(params))
        acp_session.mcp_servers = mcp_entries(params.get("mcpServers"))

        async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                        ) -> None:
            try:
                with acp_session.scope:
                    await self._sessions.serve(acp_session, stored_id, fork_of=fork_of,
                                               task_status=task_status)
            finally:
                acp_session.ended.set()

        await self.nursery.start(serve)
        self.sessions[acp_session.session_id] = acp_session
        return acp_session


async def serve_acp(sessions: Sessions, nursery: trio.Nursery, stdin: trio.abc.ReceiveStream,
                    stdout: trio.abc.SendStream, *, default_cwd: Path) -> None:
    """Serve ACP on `stdin` and `stdout` until the client closes its end, then give the runs
    `SHUTDOWN_GRACE_S` to answer their prompts."""
    outbox = Outbox()
    front = AcpFront(sessions, outbox, nursery, default_cwd=default_cwd)
    nursery.start_soon(outbox.serve_writer, stdout)
    await front.peer.serve(stdin)
    with trio.move_on_after(SHUTDOWN_GRACE_S):
        for acp_session in list(front.sessions.values()):
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
                                 permission_mode=mode if isinstance(mode, str) else None,
                                 hub=hub),
                        nursery, Prefixed(stream, read), stream, default_cwd=folder)
        nursery.cancel_scope.cancel()


async def run_acp(options: Options, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """``forged --mode acp``: sessions of this process."""
    async with trio.open_nursery() as process_nursery:
        await serve_acp(InProcess(options, process_nursery), process_nursery,
                        open_fd_stream(stdin_fd), open_fd_stream(stdout_fd),
                        default_cwd=options.cwd)
        process_nursery.cancel_scope.cancel()
