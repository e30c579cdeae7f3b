"""``<agentDir>/mcp-oauth.json``: what `forged mcp login` signed in to, keyed by the
authorization server's ``issuer``::

    {"issuers": {ISSUER: {
        "metadata": {...},               its metadata (RFC 8414) as discovered: the token and
                                         revocation endpoints a session uses without asking
        "clients": {CLIENT_ID: {...}},   forged's clients there: registered (RFC 7591), a
                                         client-ID metadata document, or mcp.json's clientId
        "servers": {URL: {               each MCP server signed in to through it, by its URL
            "name", "clientId", "resourceMetadata"?, "tokens", "expiresAt"?}}}}}

A server's tokens are bound to the URL they were granted for (an entry pointed elsewhere sends
none); ``name`` is the mcp.json name it had, for ``logout`` of an entry since removed.
``expiresAt`` is the access token's end, in seconds since 1970.

Changes are made under an exclusive ``flock`` of ``mcp-oauth.json.lock`` beside it: the file
is read again, changed and replaced whole (`forged._paths.rewrite`: a temporary file made mode
0600, renamed over it), so it is never readable by others, not even while it is written, and
tokens another process (a session refreshing) wrote meanwhile are kept. Reading needs no
lock. Everything here blocks: callers run it in a worker thread.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import orjson
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from pydantic import ValidationError

from .._log import log
from .._paths import agent_dir, rewrite

OAUTH_FILE = "mcp-oauth.json"
T = TypeVar("T")


@attrs.define(kw_only=True, eq=False, repr=False)
class Credentials:
    """One server's sign-in: its tokens and what refreshing them takes."""

    url: str
    name: str
    issuer: str
    metadata: OAuthMetadata | None
    client: OAuthClientInformationFull
    resource_metadata: ProtectedResourceMetadata | None
    tokens: OAuthToken
    expires_at: float | None


class CredentialFile:
    """One mcp-oauth.json (`default_file` is the user's)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        """The file as it is now; {} when there is none. `ValueError` when it is no JSON
        object."""
        try:
            data = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: not a JSON object")
        return data

    def change(self, edit: Callable[[dict[str, Any]], T]) -> T:
        """`edit` of the file as it is under the lock, in place; what it made of it is
        written whole (the file removed when nothing is left in it). `ValueError` when the
        file cannot be read: it is left as it was."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(self.path.with_name(self.path.name + ".lock"),
                       os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.read()
            before = orjson.dumps(data)
            result = edit(data)
            if orjson.dumps(data) != before:
                if _issuers(data):
                    rewrite(self.path, orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
                else:
                    self.path.unlink(missing_ok=True)
            return result
        finally:
            os.close(lock)  # and with it the lock

    def credentials(self, url: str) -> Credentials | None:
        """The sign-in stored for the server at `url`; None when there is none, or it cannot
        be read (said in the log)."""
        try:
            return find(self.read(), url)
        except (OSError, ValueError) as exc:
            log(f"MCP sign-ins: {exc}; none is used")
            return None

    def save(self, credentials: Credentials) -> None:
        """Store a sign-in, replacing any earlier one of its URL (at any issuer)."""
        self.change(lambda data: put(data, credentials))

    def save_tokens(self, url: str, issuer: str, tokens: OAuthToken,
                    expires_at: float | None) -> None:
        """Store refreshed tokens for the sign-in of `url` at `issuer`, if it is still
        there (a ``logout`` meanwhile is not undone)."""
        def edit(data: dict[str, Any]) -> None:
            server = _servers(_issuers(data).get(issuer, {})).get(url)
            if server is not None:
                server["tokens"] = _dumped(tokens)
                _set(server, "expiresAt", expires_at)

        self.change(edit)

    def remove(self, name: str, url: str | None) -> list[Credentials]:
        """Remove the sign-ins of `url`, and those stored under the mcp.json name `name`;
        what was removed (each readable one)."""
        return self.change(lambda data: remove(data, name, url))


def default_file() -> CredentialFile:
    return CredentialFile(agent_dir() / OAUTH_FILE)


def find(data: dict[str, Any], url: str) -> Credentials | None:
    for issuer, entry in _issuers(data).items():
        if (server := _servers(entry).get(url)) is not None:
            try:
                return _credentials(url, issuer, entry, server)
            except (ValidationError, KeyError, TypeError) as exc:
                log(f"MCP sign-in of {url} at {issuer} cannot be read ({exc}); it is not used")
    return None


def clients(data: dict[str, Any], issuer: str) -> list[OAuthClientInformationFull]:
    """forged's readable clients at `issuer`."""
    found = []
    for raw in _dict(_issuers(data).get(issuer, {}).get("clients")).values():
        try:
            found.append(OAuthClientInformationFull.model_validate(raw))
        except ValidationError:
            continue
    return found


def put(data: dict[str, Any], credentials: Credentials) -> None:
    remove(data, None, credentials.url)
    issuers = data["issuers"] = _issuers(data)
    entry = issuers.setdefault(credentials.issuer, {})
    _set(entry, "metadata", credentials.metadata and _dumped(credentials.metadata))
    client = credentials.client
    entry["clients"] = {**_dict(entry.get("clients")), client.client_id: _dumped(client)}
    server: dict[str, Any] = {"name": credentials.name, "clientId": client.client_id,
                              "tokens": _dumped(credentials.tokens)}
    _set(server, "resourceMetadata",
         credentials.resource_metadata and _dumped(credentials.resource_metadata))
    _set(server, "expiresAt", credentials.expires_at)
    entry["servers"] = {**_servers(entry), credentials.url: server}


def remove(data: dict[str, Any], name: str | None, url: str | None) -> list[Credentials]:
    """Remove the sign-ins of `url` and of the name `name` (each issuer's clients no sign-in
    uses any more with them, and each issuer left without any); what was removed."""
    removed: list[Credentials] = []
    issuers = _issuers(data)
    for issuer, entry in list(issuers.items()):
        servers = _servers(entry)
        for where, server in list(servers.items()):
            if where == url or (name is not None and server.get("name") == name):
                del servers[where]
                try:
                    removed.append(_credentials(where, issuer, entry, server))
                except (ValidationError, KeyError, TypeError):
                    pass
        used = {server.get("clientId") for server in servers.values()}
        entry["servers"] = servers
        entry["clients"] = {client: raw for client, raw in _dict(entry.get("clients")).items()
                            if client in used}
        if not servers:
            del issuers[issuer]
    if "issuers" in data or issuers:
        data["issuers"] = issuers
    return removed


def _credentials(url: str, issuer: str, entry: dict[str, Any],
                 server: dict[str, Any]) -> Credentials:
    client = _dict(entry.get("clients"))[server["clientId"]]
    metadata, resource = entry.get("metadata"), server.get("resourceMetadata")
    expires = server.get("expiresAt")
    return Credentials(
        url=url, name=str(server.get("name", "")), issuer=issuer,
        metadata=None if metadata is None else OAuthMetadata.model_validate(metadata),
        client=OAuthClientInformationFull.model_validate(client),
        resource_metadata=None if resource is None
        else ProtectedResourceMetadata.model_validate(resource),
        tokens=OAuthToken.model_validate(server["tokens"]),
        expires_at=float(expires) if isinstance(expires, int | float) else None)


def _issuers(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {issuer: entry for issuer, entry in _dict(data.get("issuers")).items()
            if isinstance(entry, dict)}


def _servers(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {url: server for url, server in _dict(entry.get("servers")).items()
            if isinstance(server, dict)}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dumped(model: Any) -> Any:
    return model.model_dump(mode="json", exclude_none=True)


def _set(record: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        record.pop(key, None)
    else:
        record[key] = value
