"""The ``forged`` command's thin paths: ``forged connect`` and ``forged status`` to a daemon
that already runs, on the standard library alone (`forged._entry` tries them first).

A launcher spawns ``forged connect`` in place of ``forged --mode rpc``; when the daemon runs,
nothing more than this module is loaded (no trio, no attrs, nothing else of forged; of the
standard library neither pathlib nor json, nor the Python modules over socket and signal): it
checks the daemon's folder and that the process listening is the user's (``SO_PEERCRED``),
opens a session on a *plain* connection (the daemon writes it as stdio would: no stamps), and
copies bytes both ways, whole lines only to stdout (``--acp``: the daemon's ACP front, bytes
both ways). Anything else (no daemon yet, which connect starts; options it does not read) goes
the full way, `forged._cli.main`.
"""

from __future__ import annotations

import _socket
import os
import select
import sys
import time

from ._errors import ConfigError
from ._runtime import check_runtime, default_socket_path

TYPE_CHECKING = False  # not typing's: it costs ~2 ms
if TYPE_CHECKING:
    import signal as _signal
else:
    import _signal
# The C modules under socket and signal: socket.py and signal.py import enum (and socket.py
# selectors), ~5 ms of a ~20 ms connect.

CONNECT_ID = "forged-connect"
STOP_ID = "forged-connect-stop"
STOP_COMMANDS = (b'{"type":"clear_queue","id":"' + STOP_ID.encode() + b'"}\n'
                 b'{"type":"abort","id":"' + STOP_ID.encode() + b'"}\n')
STOP_ANSWER = b'{"id":"' + STOP_ID.encode() + b'",'
"""How the answers to connect's own stop commands start: a response's id comes first in
the object. They are not the client's, so not copied."""
STOP_GRACE_S = 3.0
CHUNK = 1 << 20

CONNECT_OPTIONS: tuple[tuple[tuple[str, ...], bool, str], ...] = (
    (("--socket",), True, "socket"), (("--mode",), True, "mode"), (("--acp",), False, "acp"),
    (("--no-start",), False, "no_start"), (("--attach",), True, "attach"),
    (("--provider",), True, "provider"), (("--model",), True, "model"),
    (("--name", "-n"), True, "session_name"), (("--no-session",), False, "no_session"),
    (("--session-dir",), True, "session_dir"), (("--session",), True, "session"),
    (("--continue", "-c"), False, "continue_"), (("--cwd",), True, "cwd"),
    (("--models",), True, "models"), (("--skill",), True, "skill"),
    (("--prompt-template",), True, "prompt_template"),
    (("--system-prompt",), True, "system_prompt"),
    (("--append-system-prompt",), True, "append_system_prompt"),
    (("--no-skills", "-ns"), False, "no_skills"),
    (("--no-prompt-templates", "-np"), False, "no_prompt_templates"),
    (("--no-context-files", "-nc"), False, "no_context_files"),
    (("--thinking",), True, "thinking"), (("--permission-mode",), True, "permission_mode"),
    (("--api-key",), True, "api_key"), (("--tools", "-t"), True, "tools"),
    (("--no-tools", "-nt"), False, "no_tools"),
    (("--no-builtin-tools", "-nbt"), False, "no_builtin_tools"),
    (("--exclude-tools", "-xt"), True, "exclude_tools"), (("--session-id",), True, "session_id"),
    (("--fork",), True, "fork"), (("--resume", "-r"), False, "continue_"),
    (("--approve", "-a"), False, "approve"), (("--no-approve", "-na"), False, "approve"),
    (("--plugin",), True, "plugin"), (("--trust-project",), False, "approve"),
    (("--mcp-config",), True, "mcp_config"), (("--no-mcp",), False, "no_mcp"),
    (("--extension", "-e"), True, "extension"), (("--no-themes",), False, "ignored_no_themes"),
    (("--theme",), True, "ignored_theme"), (("--use-theme",), True, "ignored_use_theme"),
    (("--no-extensions", "-ne"), False, "ignored_no_extensions"),
    (("--offline",), False, "ignored_offline"), (("--tui-mode",), True, "ignored_tui_mode"),
    (("--verbose",), False, "ignored_verbose"), (("--script",), True, "script"))
"""``forged connect``'s options as its parser has them (flags, takes a value, destination),
in its order; `tests/test_daemon.py` checks they stay the same."""
PER_SESSION = frozenset({"provider", "model", "session_name", "session", "continue_",
                         "no_session", "cwd", "socket", "mode", "acp", "no_start", "attach",
                         "permission_mode"})
"""Options that reach the session connect opens (or connect itself); the others shape only
a daemon that connect starts (`forged._cli.CONNECT_PER_SESSION`)."""
DAEMON_WIDE = frozenset({"script", "session_dir", "api_key", "models", "plugin", "mcp_config",
                         "no_mcp", "approve", "extension"})
"""connect's options that shape the daemon as a whole (what a daemon it starts takes): a
running daemon keeps its own, which connect says once. Every other option a running daemon
cannot apply to this connection's session is refused (`refusal_of`)."""
_BY_FLAG = {flag: (takes_value, dest) for flags, takes_value, dest in CONNECT_OPTIONS
            for flag in flags}


# --- the daemon's socket -----------------------------------------------------------------------

def peer_creds(sock: _socket.socket) -> bytes:
    """``SO_PEERCRED`` of a Unix socket: the pid, uid and gid at its other end."""
    return sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)


def socket_uid(sock: _socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket."""
    return int.from_bytes(peer_creds(sock)[4:8], sys.byteorder)


def open_daemon(socket_path: str) -> _socket.socket | None:
    """A blocking connection to the user's daemon, or None when none answers now (the full
    path then waits for a busy one, or starts one). `ConfigError` for a folder or a daemon
    that is not the user's."""
    try:
        check_runtime(socket_path)
    except OSError:
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
    except OSError:
        sock.close()
        return None
    uid = socket_uid(sock)
    if uid != os.getuid():
        sock.close()
        raise ConfigError(f"refusing the daemon on {socket_path}: it runs as uid {uid}, not "
                          f"uid {os.getuid()}")
    return sock


KEY_NAMES = ("HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS",
             "GOOGLE_CLOUD_PROJECT", "COPILOT_GITHUB_TOKEN")
"""Provider credentials besides every ``*_API_KEY`` variable."""


def note_keys(daemon_pid: int) -> None:
    """Say once, on stderr, which provider keys of this environment the daemon's lacks: its
    sessions use the daemon's environment and auth.json, never the client's."""
    names = [name for name in os.environ if name.endswith("_API_KEY") or name in KEY_NAMES]
    if not names:
        return
    try:
        with open(f"/proc/{daemon_pid}/environ", "rb") as file:
            theirs = {entry.split(b"=", 1)[0].decode(errors="replace")
                      for entry in file.read().split(b"\0")}
    except OSError:
        return
    missing = sorted(name for name in names if name not in theirs)
    if missing:
        _say(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} set here but not "
             f"in the daemon's environment (pid {daemon_pid}): its sessions use the daemon's "
             "own keys and auth.json, not this environment's; set them where the daemon "
             "starts (contrib/systemd: EnvironmentFile=), or sign in with forged login")


def _say(message: str) -> None:
    sys.stderr.write(f"forged: {message}\n")
    sys.stderr.flush()


_ESCAPED = {**{code: f"\\u{code:04x}" for code in range(0x20)}, ord('"'): '\\"',
            ord("\\"): "\\\\"}


def _json(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return '"' + value.translate(_ESCAPED) + '"'


def _line(data: dict[str, str | bool]) -> bytes:
    """`data` as a line of JSON (what the json module would write, which this path does not
    load: strings and booleans are all it sends)."""
    return ("{" + ",".join(f"{_json(key)}:{_json(value)}" for key, value in data.items())
            + "}\n").encode()


# --- connect -----------------------------------------------------------------------------------

def _parse(argv: list[str]) -> tuple[dict[str, str | bool], list[str]] | None:
    """connect's options by destination, and the daemon-only ones given (their long flags,
    in the parser's order); None for anything this path does not read (the full path's:
    it says what is wrong)."""
    found: dict[str, str | bool] = {}
    given: set[str] = set()
    arguments = iter(argv)
    for arg in arguments:
        flag, equals, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        known = _BY_FLAG.get(flag)
        if known is None:
            return None
        takes_value, dest = known
        if takes_value:
            if not equals:
                taken = next(arguments, None)
                if taken is None or taken.startswith("-"):
                    return None
                value = taken
            found[dest] = value
        elif equals:
            return None
        else:
            found[dest] = True
        given.add(flag)
    if found.get("mode") == "acp":
        found["acp"] = True
    elif found.get("mode", "rpc") != "rpc":
        return None
    unused = [next(f for f in flags if f.startswith("--")) for flags, _, dest in CONNECT_OPTIONS
              if dest not in PER_SESSION and not dest.startswith("ignored_")
              and given & set(flags)]
    return found, unused


def refusal_of(unused: list[str], attach_with_mode: bool) -> str | None:
    """Why connect refuses to go on with a daemon that already runs, or None: session
    options among `unused` (those it gets only as a daemon connect starts), which this
    connection's session cannot take, or a permission mode for a session it attaches to
    (whose mode is its own). The daemon-wide ones are said, once, on stderr."""
    wide = [flag for flag in unused if _BY_FLAG.get(flag, (False, ""))[1] in DAEMON_WIDE]
    if wide:
        _say(f"{', '.join(wide)}: the daemon already runs and keeps its own (they apply to "
             "a daemon that connect starts, or to forged serve)")
    session = [flag for flag in unused if flag not in wide]
    if session:
        return (f"{', '.join(session)}: the daemon already runs and cannot give this "
                "connection's session these options (a daemon that connect starts takes "
                "them, as forged serve does); leave them out, or stop the daemon first")
    if attach_with_mode:
        return ("--permission-mode: --attach joins a session that keeps its own mode; send "
                "set_permission_mode to change it for every client of that session")
    return None


def connect(argv: list[str]) -> int | None:
    """``forged connect`` to a running daemon; None when this path cannot serve it."""
    parsed = _parse(argv)
    if parsed is None:
        return None
    options, unused = parsed
    socket_path = str(options.get("socket") or default_socket_path())
    try:
        sock = open_daemon(socket_path)
    except ConfigError as exc:
        _say(str(exc))
        return 1
    if sock is None:
        return None
    refused = refusal_of(unused, bool(options.get("attach")) and "permission_mode" in options)
    if refused is not None:
        sock.close()
        _say(refused)
        return 2
    note_keys(daemon_pid(socket_path, peer_creds(sock)))
    cwd = os.path.realpath(os.path.expanduser(str(options.get("cwd") or os.getcwd())))
    stop = STOP_COMMANDS
    if options.get("acp"):  # the daemon runs the ACP front: bytes both ways
        opening: dict[str, str | bool] = {"type": "acp", "id": CONNECT_ID, "cwd": cwd, **{
            name: options[key] for key, name in (("provider", "provider"), ("model", "model"),
                                                 ("permission_mode", "permissionMode"))
            if key in options}}
        stop = b""
    elif options.get("attach"):
        opening = {"type": "attach", "id": CONNECT_ID, "sessionId": options["attach"],
                   "plain": True}
    else:
        session = options.get("session")
        if isinstance(session, str) and ("/" in session or session.endswith(".jsonl")):
            session = os.path.realpath(os.path.join(cwd, os.path.expanduser(session)))
        names = {"provider": "provider", "model": "model", "session_name": "sessionName",
                 "continue_": "continueRecent", "no_session": "noSession",
                 "permission_mode": "permissionMode"}
        opening = {"type": "new_session", "id": CONNECT_ID, "cwd": cwd, "plain": True,
                   **{name: options[dest] for dest, name in names.items() if dest in options}}
        if session:
            opening["session"] = session
    try:
        return Bridge(sock, socket_path, stop=stop).run(opening)
    finally:
        sock.close()


class Bridge:
    """stdin to the daemon, the daemon's whole lines to stdout; one thread, one poll (not
    epoll: stdin may be a file)."""

    def __init__(self, sock: _socket.socket, socket_path: str, *,
                 stop: bytes = STOP_COMMANDS) -> None:
        self.sock = sock
        self.socket_path = socket_path
        self.stop = stop
        """What a signal sends before input ends: RPC's clear_queue and abort."""
        self.pending = b""
        """The start of a line not complete yet."""
        self.answer = b""
        """How the daemon's answer to the opening starts when the session opened (a
        response's id comes first, its success after the command)."""
        self.opened = False
        self.input_ended = False
        self.stopping = False
        self.failure: str | None = None

    def run(self, opening: dict[str, str | bool]) -> int:
        self.answer = (b'{"id":"' + CONNECT_ID.encode() + b'","type":"response","command":"'
                       + str(opening["type"]).encode() + b'","success":true')
        self.sock.sendall(_line(opening))
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        previous = _signal.set_wakeup_fd(wake_write)
        handlers = {number: _signal.signal(number, lambda *_: None)
                    for number in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)}
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(wake_read, select.POLLIN)
        reading_stdin = False
        deadline: float | None = None
        try:
            while True:
                timeout = None if deadline is None else max(0.0, deadline - _now()) * 1000
                ready = poller.poll(timeout)
                if not ready and deadline is not None:
                    break  # the stop's grace is over
                for fd, _ in ready:
                    if fd == wake_read:
                        os.read(wake_read, 512)
                        if not self.stopping:
                            self._stop()
                            deadline = _now() + STOP_GRACE_S
                    elif fd != 0:
                        if not self._from_daemon():
                            return self._ended()
                    elif reading_stdin and not self._from_stdin():
                        poller.unregister(0)
                        reading_stdin = False
                if self.stopping and reading_stdin:
                    poller.unregister(0)
                    reading_stdin = False
                if self.opened and not self.input_ended and not reading_stdin:
                    poller.register(0, select.POLLIN)
                    reading_stdin = True
        finally:
            _signal.set_wakeup_fd(previous)
            for number, handler in handlers.items():
                _signal.signal(number, handler)
            os.close(wake_read)
            os.close(wake_write)
        return self._ended()

    def _ended(self) -> int:
        if self.failure is not None:
            _say(self.failure)
            return 1
        return 0

    def _from_stdin(self) -> bool:
        try:
            data = os.read(0, 1 << 16)
        except OSError:  # no stdin at all: no input
            data = b""
        if data:
            self.sock.sendall(data)
            return True
        self.sock.shutdown(_socket.SHUT_WR)
        self.input_ended = True
        return False

    def _stop(self) -> None:
        """SIGTERM, SIGINT or SIGHUP: what is queued is dropped and the run aborted, as
        ``forged --mode rpc`` does; no more input goes to the daemon."""
        self.stopping = True
        try:
            if not self.input_ended:
                self.sock.sendall(self.stop)
                self.sock.shutdown(_socket.SHUT_WR)
        except OSError:
            pass
        self.input_ended = True

    def _from_daemon(self) -> bool:
        """Copy what the daemon wrote; False once it closed the connection."""
        data = self.sock.recv(CHUNK)
        if not data:
            if self.pending or not self.input_ended:
                self.failure = self.failure or why_closed(self.socket_path,
                                                           bool(self.pending))
            return False
        data = self.pending + data
        cut = data.rfind(b"\n") + 1
        whole, self.pending = data[:cut], data[cut:]
        if not self.opened or self.stopping:
            whole = self._filtered(whole)
            if self.failure is not None:
                return False
        if whole:
            try:
                _write_all(1, whole)
            except OSError as exc:  # the client closed its end
                self.failure = f"cannot write to stdout: {exc.strerror}"
                return False
        return True

    def _filtered(self, whole: bytes) -> bytes:
        """Lines before the answer to the opening are not the client's (the answer says
        whether the session opened); nor are the answers to the stop commands."""
        kept = []
        for line in whole.splitlines(keepends=True):
            if not self.opened:
                if line.startswith(self.answer):
                    self.opened = True
                elif line.startswith(b'{"id":"' + CONNECT_ID.encode() + b'",'):
                    self.failure = _refusal(line)
                    if self.failure is not None:
                        return b""
                    self.opened = True
                continue
            if not line.startswith(STOP_ANSWER):
                kept.append(line)
        return b"".join(kept)


def _refusal(line: bytes) -> str | None:
    """What the daemon said when it did not open the session; None when it did after all
    (in an answer not written as `Bridge.answer` expects)."""
    import json

    try:
        answer = json.loads(line)
    except (ValueError, RecursionError):
        return f"the daemon answered what connect cannot read: {line[:200]!r}"
    if not isinstance(answer, dict):
        return f"the daemon answered what connect cannot read: {line[:200]!r}"
    return None if answer.get("success") is True else str(answer.get("error"))


def _now() -> float:
    return time.monotonic()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def why_closed(socket_path: str, mid_line: bool) -> str:
    """Why the daemon closed our connection: it stopped (nothing answers on its socket any
    more), or it cut us off."""
    where = " in the middle of a line" if mid_line else ""
    try:
        again = open_daemon(socket_path)
    except ConfigError:
        again = None
    if again is None:
        return f"the daemon stopped{where} (its log says why)"
    again.close()
    return (f"the daemon closed the connection{where} (it cuts off a client that stops "
            "reading; its log says why)")


# --- status and stop ---------------------------------------------------------------------------

STOP_WAIT_S = 120.0
"""How long ``forged stop`` waits for the daemon to drain and end: its runs get
``daemon.drainSeconds`` (30 s by default), then are aborted."""


def status(argv: list[str]) -> int | None:
    """``forged status``: whether a daemon runs, its pid, socket and log, its sessions and
    their clients (exit 1 when none runs). None for any option but ``--socket`` (the full
    path's)."""
    socket_path = _socket_option(argv)
    if socket_path is None:
        return None
    found = _find_daemon(socket_path)
    if isinstance(found, int):
        return found
    pid, sessions = found
    print(f"forged daemon on {socket_path}: {len(sessions)} live session(s)")
    print(f"  pid {pid}, log: {_log_of(pid)}")
    for item in sessions:
        name = f" {item['sessionName']!r}" if item.get("sessionName") else ""
        print(f"  {item['sessionId']}{name}  {item['state']}  {item['clients']} client(s)  "
              f"{item['cwd']}")
    return 0


def stop(argv: list[str]) -> int:
    """``forged stop``: SIGTERM to the daemon, which drains (its runs get
    ``daemon.drainSeconds`` to end, then are aborted, and every client gets the closing
    events), then waits until the process has ended and says so. Exit 1 when none runs, or
    when it has not ended after `STOP_WAIT_S`; 2 for an option it does not take."""
    socket_path = _socket_option(argv)
    if socket_path is None:
        _say("usage: forged stop [--socket PATH]")
        return 2
    found = _find_daemon(socket_path)
    if isinstance(found, int):
        return found
    pid, sessions = found
    running = sum(1 for item in sessions if item.get("state") != "idle")
    try:
        ended = os.pidfd_open(pid)
        os.kill(pid, _signal.SIGTERM)
    except ProcessLookupError:
        print(f"the forged daemon on {socket_path} (pid {pid}) had already ended")
        return 0
    print(f"stopping the forged daemon on {socket_path} (pid {pid}): {len(sessions)} live "
          f"session(s), {running} running" + (
              "; runs under way get daemon.drainSeconds to finish" if running else ""),
          flush=True)
    try:
        if not select.select([ended], [], [], STOP_WAIT_S)[0]:
            _say(f"the daemon (pid {pid}) is still running after {STOP_WAIT_S:g} s; its log "
                 f"says what it waits for: {_log_of(pid)}")
            return 1
    finally:
        os.close(ended)
    print("stopped")
    return 0


def _socket_option(argv: list[str]) -> str | None:
    """The socket ``--socket PATH`` names, else the default; None for any other option."""
    if argv and not (len(argv) == 2 and argv[0] == "--socket") and not (
            len(argv) == 1 and argv[0].startswith("--socket=")):
        return None
    return argv[-1].removeprefix("--socket=") if argv else default_socket_path()


def _find_daemon(socket_path: str) -> tuple[int, list[dict[str, object]]] | int:
    """The daemon on `socket_path`: its pid and live sessions; else the exit status, said."""
    try:
        sock = open_daemon(socket_path)
    except ConfigError as exc:
        _say(str(exc))
        return 1
    if sock is None:
        print(f"no forged daemon on {socket_path}")
        return 1
    try:
        pid = daemon_pid(socket_path, peer_creds(sock))
        answer = ask(sock, {"type": "list_sessions", "id": "status"})
    finally:
        sock.close()
    if answer is None:
        print(f"no forged daemon on {socket_path}")
        return 1
    if not answer.get("success"):
        _say(str(answer.get("error")))
        return 1
    data = answer.get("data")
    return pid, (data.get("sessions", []) if isinstance(data, dict) else [])


def ask(sock: _socket.socket, command: dict[str, str | bool]) -> dict[str, object] | None:
    """The daemon's answer to `command` (which names its ``id``) on `sock`, the events
    before it skipped; None when the daemon closed the connection first."""
    import json

    sock.sendall(_line(command))
    buffered = b""
    while True:
        data = sock.recv(CHUNK)
        if not data:
            return None
        buffered += data
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            answer = json.loads(line)
            if isinstance(answer, dict) and answer.get("id") == command["id"]:
                return answer


def daemon_pid(socket_path: str, creds: bytes) -> int:
    """The daemon's pid: the process at the socket's other end (`creds`, what
    ``SO_PEERCRED`` gives), unless that is the service manager that made the socket
    (systemd's socket activation): then the one the daemon wrote beside its socket, if that
    process is a forged of this user's."""
    peer = int.from_bytes(creds[:4], sys.byteorder)
    try:
        with open(os.path.join(os.path.dirname(socket_path), "forged.pid")) as file:
            written = int(file.read().strip())
        with open(f"/proc/{written}/cmdline", "rb") as file:
            command = file.read()
        mine = os.stat(f"/proc/{written}").st_uid == os.getuid()
    except (OSError, ValueError):
        return peer
    return written if mine and b"forged" in command else peer


def _log_of(pid: int) -> str:
    """Where the daemon's log goes: the file its stderr is, or the systemd journal."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return "unknown (its stderr cannot be seen)"
    if target.startswith("/") and target != "/dev/null":
        return target  # (a file removed since ends " (deleted)", as the kernel says)
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            managed = b"\0INVOCATION_ID=" in b"\0" + file.read()
        with open(f"/proc/{pid}/cgroup") as file:
            unit = file.read().strip().rsplit("/", 1)[-1]
    except OSError:
        managed, unit = False, ""
    if managed and unit.endswith(".service"):
        return f"the systemd journal (journalctl --user -u {unit})"
    return f"none that can be read ({target})"
