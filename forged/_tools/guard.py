"""The permission modes: what the model's tools may do in a session, and asking the user when
one would do more (docs/security.md).

=============  ===================================  ==========================  =============
mode           commands and MCP stdio servers       file tools                  asks
=============  ===================================  ==========================  =============
full-access    unconfined                           anywhere                    never
ask            unconfined                           anywhere (denyRead asked)   before every
                                                                                command, write
auto           sandboxed: workspace and temp        write inside the workspace  to escalate
               writable, no network
read-only      sandboxed: temp writable only        read only                   before any
                                                                                write or escalation
=============  ===================================  ==========================  =============

One `Guard` per session holds the mode and applies it: the bash tool asks it how to run a
command (`Guard.command`), the file tools which real path they may read or write
(`Guard.read`, `Guard.write`), the searches how to run ripgrep (`Guard.search`), and the MCP
servers how to start (`Guard.server`). A sandboxed mode never falls back: where bubblewrap
cannot work, commands are refused with the reason and what to install.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from .. import _gitfolders, _runtime, _sandbox, _telemetry
from .._errors import ConfigError, ToolError, UnknownArchitecture, Unprotectable
from .._log import log
from .._settings import DEFAULTS, Settings
from .._store import SessionFile
from .._ui import ALLOW_SESSION, Dialogs
from .._vocabulary import PERMISSION_MODES, SANDBOXED_MODES
from .base import ScratchDir
from .environment import ShellEnvironment

DEFAULT_MODE = str(DEFAULTS["permissionMode"])
LOWER = {"full-access": frozenset({"ask", "auto", "read-only"}),
         "auto": frozenset({"read-only"}), "ask": frozenset(), "read-only": frozenset()}
"""The modes a trusted project may choose instead of the user's: those that let nothing run
or change unasked that the user's mode would not (``ask`` runs nothing unasked but may, when
asked, read what ``auto`` and ``read-only`` never read; they are not below each other)."""
AGENT_SECRETS = ("models.json", "auth.json", "mcp.json")
"""Files of forged's agent dir that hold keys: hidden as ``sandbox.denyRead`` is."""
SERVER_CACHE = "sandbox-cache"
"""`Guard.server_cache`'s folder in the agent folder."""
SERVER_CACHES = (("XDG_CACHE_HOME", "xdg"), ("npm_config_cache", "npm"), ("UV_CACHE_DIR", "uv"),
                 ("UV_PYTHON_INSTALL_DIR", "uv-python"), ("UV_TOOL_DIR", "uv-tools"),
                 ("PIP_CACHE_DIR", "pip"))
"""Where a confined stdio server's package runner keeps what it fetches (``npx``, ``uvx``),
in `Guard.server_cache`: never the user's own caches, which the user's next unconfined
``npx`` would run from."""
CTIME_SLACK_NS = 50_000_000
"""How much earlier than a command's start a change may be stamped and still count as the
command's: file times come from a coarse clock, a few milliseconds behind."""
SMALL_ENTRIES = 500
TITLE_MAX_CHARS = 2000
"""How much of the model's text (a command, a path) a dialog's title shows."""
REASON_MAX_CHARS = 500
SPACES_SHOWN = 8
"""A run of more plain spaces than this is shown counted (a command pushed off the screen
behind a wall of spaces)."""
_HIDDEN = frozenset({"Cc", "Cf", "Co", "Cn", "Zl", "Zp", "Zs"})


class _Escapes(dict[int, str]):
    """`str.translate`'s table for `shown`, filled as characters are first met."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if char == " " or unicodedata.category(char) not in _HIDDEN:
            shown_as = char
        elif code < 0x100:
            shown_as = f"\\x{code:02x}"
        else:
            shown_as = f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        self[code] = shown_as
        return shown_as


_ESCAPES = _Escapes({ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"})


def _spaces(run: re.Match[str]) -> str:
    return f"⟨{len(run.group())} spaces⟩"


def shown(text: str, limit: int = TITLE_MAX_CHARS) -> str:
    """The model's `text` as a dialog shows it: on one line, every control, format,
    unassigned and non-plain space character escaped (a terminal's escape sequences, line
    breaks and invisible or reordering characters), long runs of spaces counted, and cut at
    `limit` characters keeping its start and its end (where a command's payload would
    hide), saying how many were left out."""
    escaped = re.sub(f" {{{SPACES_SHOWN + 1},}}", _spaces, text.translate(_ESCAPES))
    if len(escaped) <= limit:
        return escaped
    head, tail = escaped[:limit * 3 // 4], escaped[-(limit // 4):]
    return f"{head}… ({len(escaped) - len(head) - len(tail):,} more characters not shown) …{tail}"


MODE_ENTRY = "forged.permissionMode"
"""The ``customType`` of the session entry recording a permission mode (pi and older
readers skip ``custom`` entries), as ``model_change`` records a model."""


def recorded_mode(store: SessionFile) -> str | None:
    """The permission mode `store`'s active branch last recorded, or None."""
    for position in reversed(store.path_to_leaf()):
        if store.kind(position) != "custom":
            continue
        entry = store.entry(position)
        if entry.get("customType") == MODE_ENTRY:
            data = entry.get("data")
            mode = data.get("mode") if isinstance(data, dict) else None
            return mode if mode in PERMISSION_MODES else None
    return None


def record_mode(store: SessionFile, mode: str) -> None:
    """Append `mode` to `store`'s branch unless it is the one the branch records."""
    if recorded_mode(store) != mode:
        store.append("custom", customType=MODE_ENTRY, data={"mode": mode})


def check_mode(mode: str) -> str:
    if mode not in PERMISSION_MODES:
        raise ValueError(f"unknown permission mode {mode!r} (one of {', '.join(PERMISSION_MODES)})")
    return mode


def starting_mode(chosen: str | None, settings: Settings) -> str:
    """A session's first mode: `chosen` (``--permission-mode``), else the global
    ``permissionMode``, else `DEFAULT_MODE`; a trusted project's ``permissionMode`` replaces
    it only when `LOWER`."""
    mode = chosen
    if mode is None:
        found = settings.global_value("permissionMode")
        if found is not None and found not in PERMISSION_MODES:
            log(f"ignoring permissionMode {found!r}: one of {', '.join(PERMISSION_MODES)}")
        mode = found if found in PERMISSION_MODES else DEFAULT_MODE
    project = settings.project_value("permissionMode")
    if project in LOWER[mode]:
        return str(project)
    if project is not None and project != mode:
        log(f"ignoring the project's permissionMode {project!r}: it may lower the mode's "
            f"rights ({mode}), never raise them")
    return mode


def _paths(value: object) -> tuple[Path, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(Path(item).expanduser() for item in value if isinstance(item, str) and item)


@attrs.frozen(kw_only=True)
class SandboxSettings:
    """The ``sandbox`` section. A trusted project may narrow it (add ``denyRead`` paths,
    turn the network off) but not widen it: ``writableRoots`` and ``network: true`` count
    from the global file only."""

    writable_roots: tuple[Path, ...] = ()
    deny_read: tuple[Path, ...] = _paths(DEFAULTS["sandbox.denyRead"])
    network: bool = False
    unix_sockets: tuple[Path, ...] = ()
    """``allowUnixSockets``: sockets a confined command may connect to (global only)."""

    @classmethod
    def from_settings(cls, settings: Settings, agent_dir: Path) -> SandboxSettings:
        def section(layer: object) -> dict[str, object]:
            return layer if isinstance(layer, dict) else {}

        mine = section(settings.global_value("sandbox"))
        project = section(settings.project_value("sandbox"))
        deny = mine.get("denyRead", DEFAULTS["sandbox.denyRead"])
        return cls(writable_roots=_paths(mine.get("writableRoots")),
                   deny_read=(*_paths(deny), *_paths(project.get("denyRead")),
                              *(agent_dir / name for name in AGENT_SECRETS)),
                   network=mine.get("network") is True and project.get("network") is not False,
                   unix_sockets=_allowed_sockets(mine.get("allowUnixSockets")))


def _allowed_sockets(value: object) -> tuple[Path, ...]:
    """``allowUnixSockets``, without forged's own runtime folder: the daemon refuses a
    confined client anyway, and its ``ws-token`` stays hidden."""
    allowed = []
    own = [Path(os.path.realpath(_runtime.guarded_folders(_runtime.default_socket_path())[0]))]
    for path in _paths(value):
        real = Path(os.path.realpath(path))
        if any(_inside(real, folder) for folder in own):
            log(f"ignoring sandbox.allowUnixSockets entry {path}: it is in forged's runtime "
                "folder, which no confined command may reach")
        else:
            allowed.append(path)
    return tuple(allowed)


_probed: dict[str, str | None] = {}
"""Each bubblewrap's problem (`sandbox_problem`), by its path ("": none)."""


async def sandbox_problem(bwrap: str | None) -> str | None:
    """Why the sandbox cannot work here with the bubblewrap at `bwrap` (None: none on
    ``PATH``), from `forged._sandbox.problem`, asked once a process for each."""
    key = bwrap or ""
    if key not in _probed:
        _probed[key] = await trio.to_thread.run_sync(_sandbox.problem, bwrap)
    return _probed[key]


_said: set[str] = set()


async def unusable_modes_problem() -> str | None:
    """Why the sandboxed modes (`SANDBOXED_MODES`) cannot work here, said in the log the first time
    it is found (once a process); None when they can."""
    problem = await sandbox_problem(shutil.which("bwrap"))
    if problem is not None and problem not in _said:
        _said.add(problem)
        log(f"the auto and read-only permission modes cannot work here: {problem}. In them "
            "every command is refused (nothing runs unconfined); full-access and ask work")
    return problem


SERVED_SOCKETS: list[Path] = []
"""The sockets this process serves as a daemon (`forged._daemon` adds them): their
``ws-token`` is hidden from every confined command and file tool."""


def forged_folders() -> tuple[Path, ...]:
    """forged's runtime folder (``$XDG_RUNTIME_DIR/forged``, else ``/tmp/forged-<uid>``),
    made now if missing, so that no confined command can make it first and fill it."""
    socket_path = _runtime.default_socket_path()
    try:
        _runtime.runtime_folder(socket_path)
    except (OSError, ConfigError):
        return ()
    return (Path(_runtime.guarded_folders(socket_path)[0]),)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


class Guard:
    """A session's permission mode, applied to what its model's tools do."""

    def __init__(self, mode: str, sandbox: SandboxSettings, workspace: Path,
                 scratch: ScratchDir, dialogs: Dialogs, *,
                 environment: ShellEnvironment | None = None,
                 server_cache: Path | None = None) -> None:
        self.mode = check_mode(mode)
        self.sandbox = sandbox
        self.workspace = workspace
        self.shell_environment = environment or ShellEnvironment()
        self.server_cache = server_cache
        """Where confined stdio MCP servers keep their package runners' caches (npm's,
        uv's): a folder of forged's own, writable to them, that nothing unconfined runs
        from (None: none is given)."""
        self._scratch = scratch
        self._dialogs = dialogs
        self._allowed: set[tuple[str, str]] = set()
        """What the user allowed for this session: (kind, the command or real path)."""
        self._small = False
        """Whether the writable folders held at most `SMALL_ENTRIES` entries when last
        scanned: scanning them again then costs less than a thread's hop."""
        self._git_seen: set[Path] = set()
        """Git folders and ``.git`` files the sandbox found in the writable folders, kept
        read-only from then on (`forged._sandbox.git_policy`)."""

    @property
    def sandboxed(self) -> bool:
        return self.mode in SANDBOXED_MODES

    def temp(self) -> Path:
        """The run's temporary folder (``TMPDIR`` of a confined command)."""
        folder = self._scratch.path() / "tmp"
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder

    def environment(self) -> dict[str, str] | None:
        """What a command (the ``bash`` tool's, a direct ``bash``) starts with in this mode
        (`forged._tools.environment`); None: forged's whole environment."""
        return self.shell_environment.environment(self.mode, os.environ)

    def direct_environment(self) -> dict[str, str] | None:
        """What a client's direct ``bash`` starts with: the policy in a sandboxed mode (the
        client's command runs unconfined, but where the model works, forged's keys stay out
        of the session) or where the settings have one; else forged's whole environment."""
        if self.sandboxed or self.shell_environment.configured:
            return self.environment()
        return None

    def policy(self, *, network: bool | None = None, cwd: Path | None = None,
               caches: tuple[Path, ...] = ()) -> _sandbox.Policy:
        """The sandbox's policy for one command."""
        return _sandbox.Policy(
            workspace=self.workspace, temp=self.temp(), write_workspace=self.mode == "auto",
            writable_roots=self.sandbox.writable_roots, caches=caches,
            hidden=(*forged_folders(), *_sandbox.socket_folders()),
            deny_read=self._deny_read(),
            network=self.sandbox.network if network is None else network,
            unix_sockets=self.sandbox.unix_sockets, cwd=cwd, git_seen=self._git_seen)

    async def confine(self, argv: Sequence[str], *, network: bool | None = None,
                      cwd: Path | None = None, doing: str = "commands",
                      caches: tuple[Path, ...] = ()) -> list[str]:
        """`argv` under the sandbox's policy; `ToolError` saying why when it cannot be."""
        bwrap = shutil.which("bwrap")
        problem = await sandbox_problem(bwrap)
        if problem is not None:
            raise ToolError(f"Not run: the {self.mode} permission mode runs {doing} in the "
                            f"sandbox, and {problem}. Nothing ran unconfined.")
        assert bwrap is not None
        policy = self.policy(network=network, cwd=cwd, caches=caches)
        try:  # it reads the workspace for git's folders: in a thread, unless it is small
            confined = (policy.wrap(bwrap, argv) if self._small
                        else await trio.to_thread.run_sync(policy.wrap, bwrap, argv))
        except (UnknownArchitecture, Unprotectable) as exc:
            raise ToolError(f"Not run: the {self.mode} permission mode runs {doing} in the "
                            f"sandbox, and {exc}. Nothing ran unconfined.") from None
        _telemetry.tracing.note({"forged.confined": True})
        return confined

    def _writable_roots(self) -> list[Path]:
        return [*([self.workspace] if self.mode == "auto" else []), *self.sandbox.writable_roots]

    async def after_command(self, start_ns: int) -> str:
        """After a command of a sandboxed mode that started at `start_ns` (``time.time_ns``):
        what it left in the writable folders for the user's next git to run (a repository it
        made with a ``core.fsmonitor``, a ``.git`` file or link naming one) set aside
        (`forged._gitfolders.disarm`), and a note saying so for the tool's result ("":
        nothing was)."""
        if self.mode not in SANDBOXED_MODES:
            return ""

        def disarm() -> list[Path]:
            found = _gitfolders.find(Path(os.path.realpath(root))
                                     for root in self._writable_roots())
            self._small = found.entries <= SMALL_ENTRIES
            return _gitfolders.disarm(found, self._git_seen, start_ns - CTIME_SLACK_NS)

        aside = disarm() if self._small else await trio.to_thread.run_sync(disarm)
        if not aside:
            return ""
        return ("[forged set aside what this command left for git to run the next time anyone "
                "runs git there, renamed with the suffix "
                f"{_gitfolders.SET_ASIDE}: {', '.join(shown(str(path), 300) for path in aside)}]")

    # --- commands --------------------------------------------------------------------------

    async def command(self, argv: Sequence[str], command: str,
                      escalate: str | None = None) -> list[str]:
        """How the bash tool runs `command` (`argv`): unconfined once allowed, or in the
        sandbox; `escalate` is the model's reason to run it outside. `ToolError` when it
        may not run.

        An escalation is allowed once at a time, never for the session: what a command
        runs can change while its text does not (``sh run.sh`` after ``run.sh`` is
        rewritten, ``make`` after the Makefile is), and the model writes files unasked."""
        if self.mode == "ask":
            await self._ask(("bash", command), f"Allow the model to run this command?\n\n"
                                               f"{shown(command)}")
        elif self.mode != "full-access":
            if escalate is None or not escalate.strip():
                return await self.confine(argv)
            await self._ask(("escalate", command),
                            f"Allow the model to run this command outside the sandbox "
                            f"({self.mode} mode)?\n\n{shown(command)}\n\n"
                            f"The model gives this reason (its words, not forged's): "
                            f"\"{shown(escalate.strip(), REASON_MAX_CHARS)}\"",
                            for_session=False)
        _telemetry.tracing.note({"forged.confined": False})
        return list(argv)

    async def search(self, argv: Sequence[str], cwd: Path) -> list[str]:
        """How ripgrep runs (in `cwd`) for ``grep`` and ``find``: in the sandbox in a
        sandboxed mode (what ``denyRead`` names is hidden from it too), else as it is."""
        if self.mode not in SANDBOXED_MODES:
            return list(argv)
        return await self.confine(argv, network=False, cwd=cwd, doing="searches")

    async def server(self, argv: Sequence[str], cwd: Path, *, network: bool, sandbox: bool
                     ) -> tuple[list[str], dict[str, str] | None, str | None]:
        """How an MCP stdio server starts (in `cwd`), the environment it starts with before
        its entry's ``env`` (None: the SDK's default), and the mode whose sandbox it runs
        in (None: unconfined). In a sandboxed mode it runs in the sandbox (with the network
        unless its entry turns it off), unless its entry opts out, with caches of forged's
        own for the package runners (`SERVER_CACHES`)."""
        environment = self.environment()
        if self.mode not in SANDBOXED_MODES or not sandbox:
            return list(argv), environment, None
        caches: tuple[Path, ...] = ()
        if self.server_cache is not None:
            cache = self.server_cache
            await trio.to_thread.run_sync(functools.partial(
                cache.mkdir, mode=0o700, parents=True, exist_ok=True))
            caches = (cache,)
            environment = {**(environment or {}),
                           **{name: str(cache / folder) for name, folder in SERVER_CACHES}}
        confined = await self.confine(argv, network=network, cwd=cwd, doing="MCP servers",
                                      caches=caches)
        return confined, environment, self.mode

    # --- files -----------------------------------------------------------------------------

    def _deny_read(self) -> tuple[Path, ...]:
        """``denyRead``, and the WebSocket token of every socket this process serves (a
        daemon's ``--socket`` may be anywhere, outside the hidden runtime folder)."""
        return (*self.sandbox.deny_read, *(Path(socket).parent / "ws-token"
                                           for socket in SERVED_SOCKETS))

    def _denied(self, real: Path) -> bool:
        return any(_inside(real, Path(os.path.realpath(denied)))
                   for denied in self._deny_read())

    def _writable(self, real: Path) -> bool:
        """Inside the workspace (but none of its protected paths), the temp folder or a
        writable root; never a denied path, and nothing of git's (a ``.git`` folder or file
        at any depth, or a git folder by any name: a bare repository, a submodule's)."""
        if self._denied(real):
            return False
        workspace = Path(os.path.realpath(self.workspace))
        roots = [Path(os.path.realpath(root))
                 for root in (self.temp(), *self.sandbox.writable_roots)]
        root = next((root for root in [workspace, *roots] if _inside(real, root)), None)
        if root is None:
            return False
        if root == workspace and _inside(real, workspace / ".agent-forge"):
            return False
        inner = real.relative_to(root)
        if ".git" in inner.parts:
            return False
        return not any(_gitfolders.is_git_folder(folder) for folder in real.parents
                       if _inside(folder, root))

    async def read(self, path: Path) -> Path:
        """The path the file tools read for `path`: its real path (symbolic links and
        ``..`` resolved) outside ``full-access``; a ``denyRead`` path is refused in a
        sandboxed mode and asked in ``ask``."""
        if self.mode == "full-access":
            return path
        real = Path(await trio.to_thread.run_sync(os.path.realpath, path))
        if self._denied(real):
            if self.mode in SANDBOXED_MODES:
                raise ToolError(f"Not read: {path} is hidden from the model in the {self.mode} "
                                "permission mode (sandbox.denyRead)")
            await self._ask(("read", str(real)),
                            f"Allow the model to read {shown(str(real))}? It is in "
                            "sandbox.denyRead.")
        return real

    async def write(self, path: Path) -> Path:
        """The real path ``write`` and ``edit`` write for `path`, once allowed: in ``ask``
        and ``read-only`` every write is asked; in ``auto`` one outside the workspace (or
        into ``.agent-forge/``, ``.git/hooks/``, ``.git/config``, or through a symbolic link
        that leads out) is."""
        if self.mode == "full-access":
            return path
        real = Path(await trio.to_thread.run_sync(os.path.realpath, path))
        if self.mode == "auto" and await trio.to_thread.run_sync(self._writable, real):
            return real
        where = ("" if self.mode != "auto" else
                 " It is outside what the auto mode lets the model write.")
        await self._ask(("write", str(real)),
                        f"Allow the model to write {shown(str(real))}?{where}")
        return real

    # --- asking ----------------------------------------------------------------------------

    async def _ask(self, key: tuple[str, str], title: str, *, for_session: bool = True
                   ) -> None:
        if key in self._allowed:
            _telemetry.tracing.note({"forged.approval.asked": False,
                                     "forged.approval.given": True})
            return
        allowed, why = await self._dialogs.permission(title, for_session=for_session)
        _telemetry.tracing.note({"forged.approval.asked": True,
                                 "forged.approval.given": allowed is not None})
        if allowed is None:
            raise ToolError(f"Not allowed ({self.mode} permission mode): {why}.")
        if allowed == ALLOW_SESSION:
            self._allowed.add(key)
