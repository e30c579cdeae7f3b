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
import shutil
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from .. import _gitfolders, _sandbox, _seccomp, _thin
from .._errors import ConfigError, ToolError
from .._log import log
from .._settings import DEFAULTS, Settings
from .._ui import ALLOW_SESSION, Dialogs
from .base import ScratchDir
from .environment import ShellEnvironment

MODES = ("full-access", "ask", "auto", "read-only")
DEFAULT_MODE = str(DEFAULTS["permissionMode"])
SANDBOXED = frozenset({"auto", "read-only"})
LOWER = {"full-access": frozenset({"ask", "auto", "read-only"}),
         "auto": frozenset({"read-only"}), "ask": frozenset(), "read-only": frozenset()}
"""The modes a trusted project may choose instead of the user's: those that let nothing run
or change unasked that the user's mode would not (``ask`` runs nothing unasked but may, when
asked, read what ``auto`` and ``read-only`` never read; they are not below each other)."""
AGENT_SECRETS = ("models.json", "auth.json", "mcp.json")
SERVER_CACHE = "sandbox-cache"
"""`Guard.server_cache`'s folder in the agent folder."""
SERVER_CACHES = (("XDG_CACHE_HOME", "xdg"), ("npm_config_cache", "npm"), ("UV_CACHE_DIR", "uv"),
                 ("UV_PYTHON_INSTALL_DIR", "uv-python"), ("UV_TOOL_DIR", "uv-tools"),
                 ("PIP_CACHE_DIR", "pip"))
"""Where a confined stdio server's package runner keeps what it fetches (``npx``, ``uvx``),
in `Guard.server_cache`: never the user's own caches, which the user's next unconfined
``npx`` would run from."""
TITLE_MAX_CHARS = 2000
"""How much of the model's text (a command, a path) a dialog's title shows."""
REASON_MAX_CHARS = 500
_UNSHOWN = {**{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7f, 0xa0))},
            ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r",
            **{code: f"\\u{code:04x}" for code in (0x200b, 0x200c, 0x200d, 0x2028, 0x2029,
                                                   0xfeff, *range(0x202a, 0x202f),
                                                   *range(0x2066, 0x206a))}}
"""Characters a title shows escaped: controls (a terminal's escape sequences, line breaks
that push the rest off the screen), and invisible or reordering ones."""


def shown(text: str, limit: int = TITLE_MAX_CHARS) -> str:
    """The model's `text` as a dialog shows it: on one line, every control character
    escaped, and cut at `limit` characters saying how many more there were."""
    escaped = text.translate(_UNSHOWN)
    if len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}… ({len(escaped) - limit:,} more characters not shown)"
"""Files of forged's agent dir that hold keys: hidden as ``sandbox.denyRead`` is."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown permission mode {mode!r} (one of {', '.join(MODES)})")
    return mode


def starting_mode(chosen: str | None, settings: Settings) -> str:
    """A session's first mode: `chosen` (``--permission-mode``), else the global
    ``permissionMode``, else `DEFAULT_MODE`; a trusted project's ``permissionMode`` replaces
    it only when `LOWER`."""
    mode = chosen
    if mode is None:
        found = settings.global_value("permissionMode")
        if found is not None and found not in MODES:
            log(f"ignoring permissionMode {found!r}: one of {', '.join(MODES)}")
        mode = found if found in MODES else DEFAULT_MODE
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
    own = [Path(os.path.realpath(_thin.guarded_folders(_thin.default_socket_path())[0]))]
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


def forged_folders() -> tuple[Path, ...]:
    """forged's runtime folder (``$XDG_RUNTIME_DIR/forged``, else ``/tmp/forged-<uid>``),
    made now if missing, so that no confined command can make it first and fill it."""
    socket_path = _thin.default_socket_path()
    try:
        _thin.runtime_folder(socket_path)
    except (OSError, ConfigError):
        return ()
    return (Path(_thin.guarded_folders(socket_path)[0]),)


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

    @property
    def sandboxed(self) -> bool:
        return self.mode in SANDBOXED

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
            deny_read=self.sandbox.deny_read,
            network=self.sandbox.network if network is None else network,
            unix_sockets=self.sandbox.unix_sockets, cwd=cwd)

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
        try:  # it reads the workspace for git's folders: in a thread
            return await trio.to_thread.run_sync(policy.wrap, bwrap, argv)
        except _seccomp.UnknownArchitecture as exc:
            raise ToolError(f"Not run: the {self.mode} permission mode runs {doing} in the "
                            f"sandbox, and {exc}. Nothing ran unconfined.") from None

    # --- commands --------------------------------------------------------------------------

    async def command(self, argv: Sequence[str], command: str,
                      escalate: str | None = None) -> list[str]:
        """How the bash tool runs `command` (`argv`): unconfined once allowed, or in the
        sandbox; `escalate` is the model's reason to run it outside. `ToolError` when it
        may not run.

        An escalation is allowed once at a time, never for the session: what a command
        runs can change while its text does not (``sh run.sh`` after ``run.sh`` is
        rewritten, ``make`` after the Makefile is), and the model writes files unasked."""
        if self.mode == "full-access":
            return list(argv)
        if self.mode == "ask":
            await self._ask(("bash", command), f"Allow the model to run this command?\n\n"
                                               f"{shown(command)}")
            return list(argv)
        if escalate is not None and escalate.strip():
            await self._ask(("escalate", command),
                            f"Allow the model to run this command outside the sandbox "
                            f"({self.mode} mode)?\n\n{shown(command)}\n\n"
                            f"The model gives this reason (its words, not forged's): "
                            f"\"{shown(escalate.strip(), REASON_MAX_CHARS)}\"",
                            for_session=False)
            return list(argv)
        return await self.confine(argv)

    async def search(self, argv: Sequence[str], cwd: Path) -> list[str]:
        """How ripgrep runs (in `cwd`) for ``grep`` and ``find``: in the sandbox in a
        sandboxed mode (what ``denyRead`` names is hidden from it too), else as it is."""
        if self.mode not in SANDBOXED:
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
        if self.mode not in SANDBOXED or not sandbox:
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

    def _denied(self, real: Path) -> bool:
        return any(_inside(real, Path(os.path.realpath(denied)))
                   for denied in self.sandbox.deny_read)

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
            if self.mode in SANDBOXED:
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
            return
        allowed, why = await self._dialogs.permission(title, for_session=for_session)
        if allowed is None:
            raise ToolError(f"Not allowed ({self.mode} permission mode): {why}.")
        if allowed == ALLOW_SESSION:
            self._allowed.add(key)
