"""Commands that do one thing and exit, as the ancestor's: ``--list-models [SEARCH]``,
``--export FILE [OUT]`` and ``forged mcp list|add|remove``."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import orjson
import trio

from ._config import Options, use_key
from ._context import stored_name
from ._errors import ForgedError
from ._log import log
from ._models import ModelRegistry
from ._paths import agent_dir
from ._store import SessionFile
from ._switching import export_html


def list_models(options: Options, search: str) -> int:
    """The models forged has a key for, those matching `search` (every word of it, letters
    in order, in ``provider id``), as a table: provider, model, context, max-out, thinking,
    images."""
    registry = ModelRegistry()
    registry.load_models_json(agent_dir() / "models.json")  # which says what it skips
    if options.api_key is not None:
        use_key(registry, options, options.provider)
    models = registry.available()
    if not models:
        print(registry.no_models_available())
        return 0
    found = [model for model in models if _fuzzy(search, f"{model.provider} {model.id}")]
    if not found:
        print(f'No models matching "{search}"')
        return 0
    found.sort(key=lambda model: (model.provider, model.id))
    rows = [("provider", "model", "context", "max-out", "thinking", "images")]
    rows += [(model.provider, model.id, _tokens(model.context_window), _tokens(model.max_tokens),
              "yes" if model.reasoning else "no", "yes" if "image" in model.input else "no")
             for model in found]
    widths = [max(len(row[column]) for row in rows) for column in range(6)]
    table = "".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                    + "\n" for row in rows)
    with contextlib.suppress(BrokenPipeError):  # `| head` read what it wanted
        sys.stdout.write(table)
        sys.stdout.flush()
    return 0


def _fuzzy(search: str, text: str) -> bool:
    text = text.lower()
    for word in search.lower().split():
        position = 0
        for letter in word:
            position = text.find(letter, position) + 1
            if position == 0:
                return False
    return True


def _tokens(count: int) -> str:
    """200000 -> 200K, 1000000 -> 1M, 1500000 -> 1.5M."""
    for size, suffix in ((1_000_000, "M"), (1_000, "K")):
        if count >= size:
            value = count / size
            return f"{value:g}{suffix}" if value == int(value) else f"{value:.1f}{suffix}"
    return str(count)


def export(path: str, output: str | None) -> int:
    """Write the session file at `path` (or the one whose session id `path` starts, in any
    folder's sessions) as an HTML page (to `output`, else ``forged-session-<name>.html`` in
    the current directory); print where."""
    cwd = Path.cwd()
    try:
        file = Path(path).expanduser()
        if not file.exists() and "/" not in path and not path.endswith(".jsonl"):
            from ._config import find_stored, one_session

            stored = find_stored(path)
            file = stored[one_session(path, set(stored))][0]
        store = SessionFile.snapshot(file)
        try:
            written = trio.run(lambda: export_html(store, cwd, output, name=stored_name(store),
                                                   model=None))
        finally:
            store.close()
    except (ForgedError, OSError) as exc:
        log(str(exc))
        return 1
    print(f"Exported to: {written}")
    return 0


# --- forged mcp --------------------------------------------------------------------------------

def mcp_command(args: Any) -> int:
    """``forged mcp list``, ``add`` or ``remove``, for the project in ``--cwd``."""
    from ._mcp import MCP_FILE
    from ._settings import PROJECT_DIR

    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    if args.action == "list":
        return trio.run(_mcp_list, cwd)
    path = cwd / PROJECT_DIR / MCP_FILE if args.local else agent_dir() / MCP_FILE
    try:
        raw = orjson.loads(path.read_bytes()) if path.exists() else {}
    except (OSError, orjson.JSONDecodeError) as exc:
        log(f"{path}: {exc}")
        return 1
    servers = raw.setdefault("mcpServers", {}) if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        log(f"{path}: mcpServers must be an object")
        return 1
    if args.action == "remove":
        if servers.pop(args.name, None) is None:
            log(f"no MCP server {args.name} in {path}")
            return 1
        done = "removed"
    else:
        entry = _mcp_entry(args)
        if entry is None:
            return 2
        done = "replaced" if args.name in servers else "added"
        servers[args.name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(raw, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"{done} {args.name} in {path}")
    return 0


def _mcp_entry(args: Any) -> dict[str, Any] | None:
    from ._errors import ConfigProblem
    from ._mcp import parse_entry

    def pairs(items: list[str], flag: str) -> dict[str, str] | None:
        found: dict[str, str] = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                log(f"{flag} {item!r}: expected NAME=VALUE")
                return None
            found[key] = value
        return found

    env, headers = pairs(args.env, "--env"), pairs(args.header, "--header")
    if env is None or headers is None:
        return None
    if bool(args.url) == bool(args.command):
        log("forged mcp add: give --url URL, or -- COMMAND [ARGS...]")
        return None
    entry: dict[str, Any] = (
        {"url": args.url, **({"headers": headers} if headers else {})} if args.url else
        {"command": args.command[0], "args": args.command[1:], **({"env": env} if env else {})})
    try:
        parse_entry(args.name, entry, "forged mcp add")
    except ConfigProblem as exc:
        log(str(exc))
        return None
    return entry


async def _mcp_list(cwd: Path) -> int:
    """Connect every server of `cwd` as a session there would, in the permission mode it
    would start in (a sandboxed mode: stdio servers in the sandbox), and print each:
    transport, status, tools."""
    from ._mcp import CACHE_DIR, MCP_FILE, ListingCache, McpConfig, McpServers
    from ._settings import PROJECT_DIR, Settings
    from ._tools.base import ScratchDir
    from ._tools.environment import ShellEnvironment
    from ._tools.guard import SERVER_CACHE, Guard, SandboxSettings, starting_mode
    from ._ui import Dialogs

    settings = Settings(agent_dir(), cwd)
    config = McpConfig(user_file=agent_dir() / MCP_FILE,
                       project_file=cwd / PROJECT_DIR / MCP_FILE
                       if settings.project_trusted else None)
    specs = config.load()
    scratch = ScratchDir()
    guard = Guard(starting_mode(None, settings),
                  SandboxSettings.from_settings(settings, agent_dir()), cwd, scratch,
                  Dialogs(lambda _: None, interactive=False),
                  environment=ShellEnvironment.from_settings(settings),
                  server_cache=agent_dir() / SERVER_CACHE)
    servers = McpServers(specs, cwd, cache=ListingCache(agent_dir() / CACHE_DIR),
                         confine=lambda argv, folder, spec: guard.server(
                             argv, folder, network=spec.network, sandbox=spec.sandbox))
    if specs:
        print(f"permission mode {guard.mode}: stdio servers start "
              f"{'in the sandbox' if guard.sandboxed else 'unconfined'}, as a session's would")
    try:
        return await _list_servers(servers, specs, config)
    finally:
        scratch.remove()


async def _list_servers(servers: Any, specs: list[Any], config: Any) -> int:
    from ._mcp import MCP_FILE, exposed

    async with trio.open_nursery() as nursery:
        nursery.start_soon(servers.serve)
        for server in servers.servers.values():
            await server.attempted()
        failed = False
        for server in servers.servers.values():
            spec = server.spec
            where = spec.command if spec.transport == "stdio" else spec.url
            status = (f"{server.status} (MCP {server.protocol_version})"
                      if server.status == "ready" else server.status)
            print(f"{spec.name}  {spec.transport}  {status}  {where}  ({spec.source})")
            if server.status == "ready":
                names = [tool.name if exposed(tool.name, spec.tool_exposure, spec.exposure)
                         else f"{tool.name} (hidden)" for tool in server.listed]
                print(f"  {len(server.listed)} tools: {', '.join(names) or '(none)'}")
            elif server.status == "failed":
                failed = True
                print(f"  error: {server.last_error}")
            if spec.transport == "http":
                from ._mcp_login import sign_in_line

                if (line := sign_in_line(server)) is not None:
                    print(line)
        if not specs and not config.problems:
            print(f"no MCP servers (add one with: forged mcp add NAME -- COMMAND, or in "
                  f"{agent_dir() / MCP_FILE})")
        nursery.cancel_scope.cancel()
    return 1 if failed or config.problems else 0
