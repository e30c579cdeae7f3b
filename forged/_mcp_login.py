"""``forged mcp login NAME`` and ``forged mcp logout NAME``: OAuth sign-ins to streamable-HTTP
MCP servers, kept in ``<agentDir>/mcp-oauth.json`` (`forged._mcp.credentials`), which
sessions then use (`forged._mcp.oauth`).

``login`` signs in through the server's authorization server, as the server's 401 names it.
forged prints the address to open (and opens a browser where there is one: ``$BROWSER``,
``$DISPLAY`` or ``$WAYLAND_DISPLAY`` set), then waits for the browser's redirect on a
loopback port (`REDIRECT_PORT`, else any free one: the listener ``forged login`` uses,
`forged._login.serve_redirect`); a browser on another machine cannot reach it, so the
address it ends on can be pasted on stdin instead. ``logout`` removes the server's sign-in
and asks its authorization server to revoke the tokens.
"""

from __future__ import annotations

import argparse
import logging
import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import trio

from ._errors import ConfigError
from ._log import log
from ._login import read_pasted, say, serve_redirect
from ._mcp.config import MCP_FILE, McpConfig, ServerSpec, expand
from ._mcp.credentials import CredentialFile, Credentials, default_file
from ._mcp.oauth import LoginAuth, revoke, sign_in, signs_in_itself
from ._paths import agent_dir

if TYPE_CHECKING:
    from ._mcp.server import McpServer

REDIRECT_PORT = 53693
"""Where the browser comes back to (``http://127.0.0.1:53693/callback``), when it is free:
one address, so a client registered for it serves the next sign-in too."""
REVOKE_TIMEOUT_S = 10.0


def main(args: argparse.Namespace) -> int:
    """``forged mcp login NAME`` or ``forged mcp logout NAME``, for the project in ``--cwd``:
    the exit code."""
    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    spec = next((spec for spec in _servers(cwd) if spec.name == args.name), None)
    try:
        if args.action == "logout":
            return trio.run(logout, args.name, spec)
        if spec is None or spec.transport != "http":
            log(f"forged mcp login: no streamable-HTTP MCP server {args.name} "
                f"(`forged mcp list` shows them)" if spec is None else
                f"forged mcp login: {args.name} is a stdio server; sign-ins are for HTTP "
                "servers")
            return 1
        url, headers = expand(spec.url or ""), {k: expand(v) for k, v in spec.headers.items()}
        if signs_in_itself(headers):
            log(f"forged mcp login: {args.name} sends its own Authorization header (its "
                "headers in mcp.json); remove it to sign in with OAuth")
            return 1
        signed_in = trio.run(login, spec, url, headers)
    except ConfigError as exc:
        log(str(exc))
        return 1
    except (OSError, ValueError) as exc:
        log(f"forged mcp {args.action}: {exc}; nothing is changed")
        return 1
    except KeyboardInterrupt:
        log("login cancelled: nothing is stored")
        return 130
    if signed_in is None:
        print(f"{args.name} answered without asking for a sign-in: nothing is stored")
    else:
        print(f"Signed in to {args.name} at {signed_in.issuer}; saved in {default_file().path}")
    return 0


def _servers(cwd: Path) -> list[ServerSpec]:
    """The servers a session in `cwd` would have (the project's when it is trusted)."""
    from ._settings import PROJECT_DIR, Settings

    trusted = Settings(agent_dir(), cwd).project_trusted
    return McpConfig(user_file=agent_dir() / MCP_FILE,
                     project_file=cwd / PROJECT_DIR / MCP_FILE if trusted else None).load()


async def login(spec: ServerSpec, url: str, headers: dict[str, str]) -> Credentials | None:
    """Sign in to `spec`'s server at `url`: the address shown, the browser's redirect (or
    the pasted address) awaited, the sign-in stored; None when the server asked for none."""
    for reported in ("mcp.client.auth.oauth2", "mcp.client.streamable_http"):
        logging.getLogger(reported).setLevel(logging.CRITICAL)  # a failure is said below
    file = default_file()
    known = await trio.to_thread.run_sync(file.read)
    try:
        async with trio.open_nursery() as login_nursery:
            try:
                return await _sign_in(login_nursery, spec, url, headers, file, known)
            finally:
                login_nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
            group = group.exceptions[0]
        raise group from None


async def _sign_in(login_nursery: trio.Nursery, spec: ServerSpec, url: str,
                   headers: dict[str, str], file: CredentialFile,
                   known: dict[str, Any]) -> Credentials | None:
    """The sign-in, its redirect listener and stdin's reader in `login_nursery`."""
    found: dict[str, str] = {}
    done = trio.Event()
    shown: list[str] = []
    """The state of the address shown: the redirect must bring it back."""

    def refused(redirect: dict[str, str]) -> str | None:
        return auth.refused(redirect)

    port = await login_nursery.start(partial(
        serve_redirect, found, done, state=lambda: shown[-1] if shown else None,
        service=f"The sign-in to {spec.name}", port=REDIRECT_PORT, refused=refused))
    redirect = f"http://127.0.0.1:{port}/callback"

    async def opened(address: str) -> None:
        shown.append(parse_qs(urlsplit(address).query).get("state", [""])[0])
        say(f"To sign in to the MCP server {spec.name}, open this address in a browser:"
            f"\n\n  {address}\n\nforged waits for the browser's redirect to {redirect}; if "
            "the browser is on another machine, paste the address it ends on here.")
        if any(os.environ.get(name) for name in ("BROWSER", "DISPLAY", "WAYLAND_DISPLAY")):
            import webbrowser

            await trio.to_thread.run_sync(webbrowser.open, address)
        login_nursery.start_soon(read_pasted, found, done)

    async def returned(_: Any) -> dict[str, str]:
        await done.wait()
        return found

    auth = LoginAuth(url, spec.oauth, redirect, known, opened, returned)
    return await sign_in(auth, spec.name, url, headers, spec.timeout_s, file)


async def logout(name: str, spec: ServerSpec | None) -> int:
    """Remove the sign-in of `name` (its entry's URL, or the name it was stored under), and
    ask its authorization server to revoke the tokens."""
    file = default_file()
    url = expand(spec.url) if spec is not None and spec.url else None
    removed = await trio.to_thread.run_sync(file.remove, name, url)
    if not removed:
        print(f"No sign-in stored for {name}: nothing to remove")
        return 0
    for credentials in removed:
        why = await revoke(credentials, REVOKE_TIMEOUT_S)
        print(f"Signed out of {name}: its sign-in at {credentials.issuer} is removed from "
              f"{file.path}" + (f" (revoking its tokens there failed: {why})" if why else ""))
    return 0


def sign_in_line(server: McpServer) -> str | None:
    """What ``forged mcp list`` says of an HTTP server's sign-in, or None (its headers
    sign in)."""
    spec = server.spec
    url, headers = expand(spec.url or ""), {k: expand(v) for k, v in spec.headers.items()}
    if signs_in_itself(headers):
        return None
    if server.info().needs_auth:
        return f"  sign-in: needed: run `forged mcp login {spec.name}`"
    stored = default_file().credentials(url)
    return (f"  sign-in: stored ({stored.issuer}; `forged mcp logout {spec.name}` removes it)"
            if stored else "  sign-in: none stored")
