"""Where a session's MCP servers come from, and what each entry of ``mcp.json`` says.

In this order (a later entry of a name replaces an earlier one): ``<agentDir>/mcp.json``; a
trusted project's ``.agent-forge/mcp.json`` (an entry with no ``command``, ``url`` or ``type``
changes only ``enabled``, ``exposure`` and ``toolExposure`` of the user's entry); each
``--mcp-config FILE``; the servers a client hands the session (ACP's ``mcpServers``). The
format is the one other MCP clients share: ``{"mcpServers": {NAME: {...}}}``
(docs/protocol.md, MCP servers).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import attrs
import orjson

from .._errors import ConfigProblem
from .._log import log
from .._settings import DEFAULTS
from .._values import resolve_value

MCP_FILE = "mcp.json"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_STARTUP_TIMEOUT_S = float(DEFAULTS["mcp.startupTimeout"])
"""How long a model request waits for a server that has never listed its tools (setting
``mcp.startupTimeout``, per server ``startupTimeout``)."""
DEFAULT_MAX_RESULT_BYTES = 32 * 1024 * 1024
"""The most one message from a server may hold (``maxResultBytes``): past it, the call it
answers fails, naming the limit, and nothing more of it is read."""
MAX_TOOL_NAME = 64
PROTOCOLS = ("auto", "legacy", "2026-07-28")
"""An entry's ``protocol``: ``auto`` asks ``server/discover`` and falls back to the
2025-11-25 handshake (``initialize``); ``legacy`` opens with the handshake only; a revision
(``2026-07-28``) is spoken from the first request, unasked."""
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@attrs.define(kw_only=True, eq=False, repr=False)
class ServerSpec:
    """One configured server, as written (values are expanded when it connects)."""

    name: str
    transport: str
    """``stdio`` or ``http`` (streamable HTTP)."""
    command: str | None = None
    args: list[str] = attrs.Factory(list)
    env: dict[str, str] = attrs.Factory(dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = attrs.Factory(dict)
    enabled: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_timeout_s: float | None = None
    """How long a model request waits for it while it has never listed its tools (None:
    the session's ``mcp.startupTimeout``)."""
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    description: str | None = None
    exposure: str = "direct"
    """The server's tools: ``hidden``, or offered to the model (the ancestor's ``direct``,
    ``codemode`` and ``deferred`` alike: forged declares every reachable tool)."""
    tool_exposure: list[str] | dict[str, str] = attrs.Factory(list)
    """A list: ``name`` shows only the tools listed so, ``!name`` hides one; or the ancestor's
    object of names or patterns to exposures (an exact name first, else the first pattern
    that matches). ``*`` matches any characters."""
    source: str = ""
    network: bool = True
    """In a sandboxed permission mode: the server keeps the network (``"network": false``
    takes it away)."""
    sandbox: bool = True
    """In a sandboxed permission mode: the server starts in the sandbox (``"sandbox":
    false``: unconfined, the user's explicit choice)."""
    protocol: str = "auto"
    """How the protocol revision is chosen: one of `PROTOCOLS`."""
    scope: Literal["user", "project", "temporary"] = "user"
    """Whose entry it is, as ``get_commands`` says of its prompts: ``user``, ``project``,
    or ``temporary`` (``--mcp-config``, a client's)."""
    oauth: OAuthSpec | None = None
    """An HTTP server's ``oauth`` object: how `forged mcp login` signs in to it."""


@attrs.define(kw_only=True, frozen=True)
class OAuthSpec:
    """An entry's ``oauth``: the client forged signs in as (by default, one it registers
    where the authorization server offers dynamic registration)."""

    client_metadata_url: str | None = None
    """``clientMetadataUrl``: forged's client-ID metadata document, an https URL with a path,
    used as its client ID where the authorization server accepts such documents."""
    scopes: tuple[str, ...] = ()
    """``scopes``: what to ask for (none: what the server says it needs)."""
    client_id: str | None = None
    """``clientId``: a client registered beforehand (a public one: no secret)."""


def parse_entry(name: str, raw: Any, source: str) -> ServerSpec:
    """One ``mcpServers`` entry; `ConfigProblem` says what is wrong with it."""
    if not _SERVER_NAME.match(name):
        raise ConfigProblem(f"server name {name!r} may hold only letters, digits, _ and -")
    if not isinstance(raw, dict):
        raise ConfigProblem(f"server {name}: expected an object")
    kind = raw.get("type")
    if kind == "sse":
        raise ConfigProblem(
            f"server {name}: the legacy SSE transport is not supported; servers that offer "
            "SSE usually offer streamable HTTP too, often at /mcp instead of /sse")
    if kind not in (None, "stdio", "http", "streamable-http"):
        raise ConfigProblem(f"server {name}: unknown type {kind!r} (stdio, http or "
                            "streamable-http)")
    has_command, has_url = isinstance(raw.get("command"), str), isinstance(raw.get("url"), str)
    if has_command == has_url:
        raise ConfigProblem(f"server {name}: give either command (stdio) or url (HTTP)")
    transport = "stdio" if has_command else "http"
    if kind is not None and (kind == "stdio") != (transport == "stdio"):
        raise ConfigProblem(f"server {name}: type {kind} does not match its "
                            f"{'command' if has_command else 'url'}")
    timeout = raw.get("timeout", DEFAULT_TIMEOUT_S)
    if not seconds(timeout):
        raise ConfigProblem(f"server {name}: timeout must be a positive number of seconds")
    startup = raw.get("startupTimeout")
    if startup is not None and not seconds(startup):
        raise ConfigProblem(f"server {name}: startupTimeout must be a positive number of "
                            "seconds")
    max_bytes = raw.get("maxResultBytes", DEFAULT_MAX_RESULT_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024:
        raise ConfigProblem(f"server {name}: maxResultBytes must be a whole number of bytes, "
                            "1024 at least")
    for flag in ("network", "sandbox"):
        if not isinstance(raw.get(flag, True), bool):
            raise ConfigProblem(f"server {name}: {flag} must be true or false")
    oauth = _oauth(raw["oauth"], name) if "oauth" in raw else None
    if oauth is not None and transport == "stdio":
        raise ConfigProblem(f"server {name}: oauth is for HTTP servers (a url)")
    protocol = raw.get("protocol", "auto")
    if protocol not in PROTOCOLS:
        raise ConfigProblem(f"server {name}: protocol must be one of {', '.join(PROTOCOLS)}")
    return ServerSpec(
        name=name, transport=transport, command=raw.get("command"),
        args=_strings(raw.get("args", []), name, "args"),
        env=_string_map(raw.get("env", {}), name, "env"),
        cwd=raw["cwd"] if isinstance(raw.get("cwd"), str) else None,
        url=raw.get("url"), headers=_string_map(raw.get("headers", {}), name, "headers"),
        enabled=raw.get("enabled", True) is not False, timeout_s=float(timeout),
        startup_timeout_s=None if startup is None else float(startup),
        max_result_bytes=max_bytes,
        description=raw["description"] if isinstance(raw.get("description"), str) else None,
        exposure=_exposure(raw.get("exposure", "direct"), name, "exposure"),
        tool_exposure=_tool_exposure(raw.get("toolExposure", []), name),
        source=source, network=raw.get("network", True), sandbox=raw.get("sandbox", True),
        protocol=protocol, oauth=oauth)


EXPOSURES = ("direct", "codemode", "codemode-deferred", "deferred", "hidden")


def startup_timeout(section: Any) -> float:
    """The settings' ``mcp.startupTimeout``, else the default."""
    value: Any = section.get("startupTimeout") if isinstance(section, dict) else None
    return float(value) if seconds(value) else DEFAULT_STARTUP_TIMEOUT_S


def seconds(value: Any) -> bool:
    """Whether `value` is a positive number of seconds."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _oauth(value: Any, name: str) -> OAuthSpec:
    if not isinstance(value, dict):
        raise ConfigProblem(f"server {name}: oauth must be an object")
    document, scopes, client = (value.get(key) for key in ("clientMetadataUrl", "scopes",
                                                           "clientId"))
    if document is not None:
        where = urlsplit(document) if isinstance(document, str) else None
        if where is None or where.scheme != "https" or not where.netloc or where.path in (
                "", "/"):
            raise ConfigProblem(f"server {name}: oauth.clientMetadataUrl must be an https URL "
                                "with a path")
    if scopes is not None and (not isinstance(scopes, list) or not all(
            isinstance(scope, str) and scope and not any(c.isspace() for c in scope)
            for scope in scopes)):
        raise ConfigProblem(f"server {name}: oauth.scopes must be a list of scopes (strings "
                            "without spaces)")
    if client is not None and (not isinstance(client, str) or not client.strip()):
        raise ConfigProblem(f"server {name}: oauth.clientId must be a string")
    return OAuthSpec(client_metadata_url=document, scopes=tuple(scopes or ()), client_id=client)


def _exposure(value: Any, name: str, key: str) -> str:
    if value not in EXPOSURES:
        raise ConfigProblem(f"server {name}: {key} must be one of {', '.join(EXPOSURES)}")
    return str(value)


def _tool_exposure(value: Any, name: str) -> list[str] | dict[str, str]:
    if isinstance(value, dict):
        return {str(tool): _exposure(exposure, name, f"toolExposure.{tool}")
                for tool, exposure in value.items()}
    return _strings(value, name, "toolExposure")


def _strings(value: Any, name: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigProblem(f"server {name}: {key} must be a list of strings")
    return list(value)


def _string_map(value: Any, name: str, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(item, str)
                                              for item in value.values()):
        raise ConfigProblem(f"server {name}: {key} must map names to strings")
    return dict(value)


def read_file(path: Path) -> dict[str, Any]:
    """A file's ``mcpServers`` object; empty when the file does not exist."""
    try:
        raw = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigProblem(f"{path}: {exc}") from None
    servers = raw.get("mcpServers", {}) if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise ConfigProblem(f"{path}: mcpServers must be an object")
    return servers


@attrs.define(kw_only=True, eq=False, repr=False)
class McpConfig:
    """Where a session's servers come from."""

    user_file: Path | None = None
    project_file: Path | None = None
    """Only for a trusted project."""
    files: list[Path] = attrs.Factory(list)
    """``--mcp-config``."""
    handed: dict[str, Any] = attrs.Factory(dict)
    """Entries a client hands the session (ACP's ``mcpServers``)."""
    disabled: bool = False
    """``--no-mcp``."""
    problems: list[str] = attrs.Factory(list)
    """What `load` skipped, and why."""

    def load(self) -> list[ServerSpec]:
        """The servers, each problem reported on stderr and its entry skipped."""
        if self.disabled:
            return []
        raw: dict[str, tuple[Any, str, str]] = {}
        layers: list[tuple[str, dict[str, Any] | Path | None]] = [
            ("user", self.user_file), ("project", self.project_file),
            *(("file", path) for path in self.files), ("client", self.handed)]
        for layer, where in layers:
            if where is None:
                continue
            try:
                entries = where if isinstance(where, dict) else read_file(where)
            except ConfigProblem as exc:
                self._problem(f"MCP configuration skipped: {exc}")
                continue
            source = "client" if isinstance(where, dict) else str(where)
            for name, entry in entries.items():
                previous = raw.get(name)
                if (layer == "project" and previous is not None and isinstance(entry, dict)
                        and not {"command", "url", "type"} & entry.keys()):
                    entry = {**previous[0], **{key: entry[key] for key in (
                        "enabled", "exposure", "toolExposure") if key in entry}}
                same = next((known for known in raw if _same_server(known, name)), name)
                if same != name:
                    self._problem(f"MCP server skipped ({source}): {name} and {same} name one "
                                  "server (- and _ are alike in tool names)")
                    continue
                raw[name] = (entry, source, layer)
        specs: list[ServerSpec] = []
        for name, (entry, source, layer) in raw.items():
            try:
                specs.append(attrs.evolve(parse_entry(name, entry, source),
                                          scope=_SCOPES.get(layer, "temporary")))
            except ConfigProblem as exc:
                self._problem(f"MCP server skipped ({source}): {exc}")
        return specs

    def _problem(self, text: str) -> None:
        log(text)
        self.problems.append(text)


_SCOPES: dict[str, Literal["user", "project", "temporary"]] = {
    "user": "user", "project": "project"}
"""A configuration layer's scope, as a command's source says it (the others: temporary)."""


def _same_server(one: str, other: str) -> bool:
    return one.replace("-", "_") == other.replace("-", "_")


def expand(value: str) -> str:
    """``${VAR}`` from the environment (empty when unset), or ``!command``'s output."""
    if value.startswith("!"):
        return resolve_value(value) or ""
    return _ENV_REFERENCE.sub(lambda match: os.environ.get(match.group(1), ""), value)


def tool_name(server: str, tool: str) -> str:
    return _NOT_NAME.sub("_", f"mcp__{server}__{tool}")


def suffixed(name: str, key: str) -> str:
    """`name` cut to leave room for a hash of `key`: unique where names collide or run long."""
    digest = hashlib.sha1(key.encode()).hexdigest()[:6]
    return f"{name[:MAX_TOOL_NAME - 7]}_{digest}"


def exposed(tool: str, tool_exposure: list[str] | dict[str, str],
            exposure: str = "direct") -> bool:
    """Whether `tool` reaches the model under ``exposure`` and ``toolExposure``."""
    if isinstance(tool_exposure, dict):
        chosen = tool_exposure.get(tool) or next(
            (value for pattern, value in tool_exposure.items()
             if fnmatch.fnmatchcase(tool, pattern)), exposure)
        return chosen != "hidden"
    if any(fnmatch.fnmatchcase(tool, p[1:]) for p in tool_exposure if p.startswith("!")):
        return False
    shown = [p for p in tool_exposure if not p.startswith("!")]
    if shown:
        return any(fnmatch.fnmatchcase(tool, p) for p in shown)
    return exposure != "hidden"
