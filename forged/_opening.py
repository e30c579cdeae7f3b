"""What a session is opened with: its configuration (`SessionConfig`, which every front and
the daemon build) and the files it reads before it opens (`SessionFiles`)."""

from __future__ import annotations

from pathlib import Path

import attrs

from . import _wire as w
from ._mcp import CACHE_DIR as MCP_CACHE_DIR, MCP_FILE, Listing, ListingCache, McpConfig, ServerSpec
from ._models import ModelRegistry
from ._paths import session_dir_for
from ._plugins import PluginSource
from ._resources import ExtraPaths, Resources
from ._settings import PROJECT_DIR, Settings
from ._store import SessionFile
from ._switching import open_store
from ._tools import ToolChoice


@attrs.define(kw_only=True, eq=False, repr=False)
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
    settings: Settings | None = None
    """Read from the agent dir and the cwd when not given."""
    model_scope: list[str] | None = None
    """``--models``: the patterns `cycle_model` cycles through (else ``enabledModels``)."""
    extra: ExtraPaths = attrs.Factory(ExtraPaths)
    """Skills, templates and system prompt text the command line adds."""
    plugins: list[PluginSource] = attrs.Factory(list)
    interactive: bool = True
    """A client can answer dialogs (False in print mode: they resolve as cancelled)."""
    tools: ToolChoice = attrs.Factory(ToolChoice)
    new_session_id: str | None = None
    """The id a new session file gets (``--session-id``; else a fresh one)."""
    fork_from: Path | None = None
    """A session file whose whole branch the new session starts with (``--fork``)."""
    mcp: McpConfig = attrs.Factory(McpConfig)
    """MCP servers beyond the user's and the trusted project's ``mcp.json``."""
    permission_mode: str | None = None
    """``--permission-mode`` (else the settings' ``permissionMode``)."""

    @property
    def new_files_dir(self) -> Path | None:
        """Where new session files go; None keeps new sessions in memory."""
        if not self.persist:
            return None
        return self.session_dir or session_dir_for(self.agent_dir, self.cwd)


@attrs.frozen
class SessionFiles:
    """What a session reads from disk before it opens."""

    settings: Settings
    resources: Resources
    store: SessionFile
    mcp_servers: list[ServerSpec]
    mcp_cache: ListingCache
    mcp_listings: dict[str, Listing]
    """The servers' tools as they last listed them."""

    @classmethod
    def read(cls, config: SessionConfig) -> SessionFiles:
        settings = config.settings or Settings(config.agent_dir, config.cwd)
        mcp = attrs.evolve(
            config.mcp, user_file=config.agent_dir / MCP_FILE,
            project_file=config.cwd / PROJECT_DIR / MCP_FILE if settings.project_trusted
            else None)
        servers = mcp.load()
        cache = ListingCache(config.agent_dir / MCP_CACHE_DIR)
        return cls(settings=settings,
                   resources=Resources.load(config.cwd, config.agent_dir, settings, config.extra),
                   store=open_store(config.session_path, config.new_files_dir, config.cwd,
                                    session_id=config.new_session_id,
                                    fork_from=config.fork_from),
                   mcp_servers=servers, mcp_cache=cache,
                   mcp_listings={spec.name: listing for spec in servers
                                 if spec.enabled and (listing := cache.read(spec))})
