"""OAuth for streamable-HTTP MCP servers: the MCP SDK's client (`OAuthClientProvider`: the
protected resource's and the authorization server's metadata, PKCE, the ``resource``
parameter, dynamic registration, client-ID metadata documents, refresh), with the sign-ins
kept in ``<agentDir>/mcp-oauth.json`` (`forged._mcp.credentials`). Two ways in:

- `sign_in`, for ``forged mcp login NAME``: the SDK's whole flow, the browser step the
  caller's. The authorization response's ``iss`` must be the authorization server's issuer
  (RFC 9207: when its metadata says it sends one, and whenever one comes). Nothing is stored
  until the server has taken the new token: a refused sign-in leaves the file as it was.
- `session_auth`, for a session's connection: the stored tokens, refreshed when they expire
  or the server answers 401 (after looking whether another process stored newer ones), and
  never a browser. A server that still answers 401 `needs_auth`; its 401 reaches the SDK as a
  JSON-RPC error saying to run ``forged mcp login NAME``, so a call, or a connection attempt,
  fails with that.

An entry whose ``headers`` carry an ``Authorization`` signs in its own way: it gets neither.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx2
import orjson
import trio
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.exceptions import OAuthFlowError
from mcp.client.auth.utils import validate_authorization_response_iss
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import INVALID_REQUEST, Implementation
from pydantic import AnyUrl

from .._errors import ConfigError
from .._version import __version__
from . import sdk
from .config import OAuthSpec
from .credentials import CredentialFile, Credentials, clients, default_file

UNUSED_REDIRECT = "http://127.0.0.1/callback"
"""A session never sends a browser anywhere; the SDK's client metadata needs an address."""


def needs_sign_in(name: str) -> str:
    return f"it needs a sign-in: run `forged mcp login {name}`"


def signs_in_itself(headers: dict[str, str]) -> bool:
    """Whether an entry's headers carry its own credentials (no OAuth for it)."""
    return any(key.lower() == "authorization" for key in headers)


# --- a session's connection -----------------------------------------------------------------

async def session_auth(name: str, url: str, headers: dict[str, str]) -> SessionAuth | None:
    """The auth of a session's connection to the server `name` at `url` (its values
    expanded), with what is stored for it (read in a worker thread); None when its headers
    sign in."""
    if signs_in_itself(headers):
        return None
    file = default_file()
    return SessionAuth(name, url, file, await trio.to_thread.run_sync(file.credentials, url))


class SessionAuth(OAuthClientProvider):
    """The stored sign-in of one connection (made again for each): the token on each
    request, refreshed when it has expired, or when the server answers 401 and no newer one
    is stored; never a browser. The refreshed tokens are stored (in a worker thread)."""

    def __init__(self, name: str, url: str, file: CredentialFile,
                 stored: Credentials | None) -> None:
        super().__init__(url, OAuthClientMetadata(redirect_uris=[AnyUrl(UNUSED_REDIRECT)]),
                         _Kept(self))
        self.name = name
        self.needs_auth = False
        """The server's last answer was 401, and no stored or refreshed token passed."""
        self._file = file
        self._stored = stored
        self._known: str | None = None
        """The access token last read from the file or written to it."""
        self._adopt(stored)
        self._initialized = True  # what the SDK would read from storage is read above

    def answers(self, inner: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
        """`inner`, its 401s from the server's endpoint made JSON-RPC errors saying how to
        sign in (the SDK reads a bare one as "Server returned an error response")."""
        return _SignInAnswers(inner, self.context.server_url, needs_sign_in(self.name))

    def _adopt(self, stored: Credentials | None) -> None:
        context = self.context
        self._stored = stored
        self._known = stored.tokens.access_token if stored else None
        context.current_tokens = stored.tokens if stored else None
        context.client_info = stored.client if stored else None
        context.oauth_metadata = stored.metadata if stored else None
        context.protected_resource_metadata = stored.resource_metadata if stored else None
        context.auth_server_url = stored.issuer if stored else None
        context.token_expiry_time = stored.expires_at if stored else None

    async def _newer_stored(self) -> bool:
        """Whether the file holds tokens this connection has not seen (another session
        refreshed them, or a ``forged mcp login`` ran): they are taken."""
        stored = await trio.to_thread.run_sync(self._file.credentials, self.context.server_url)
        if stored is None or stored.tokens.access_token == self._known:
            return False
        self._adopt(stored)
        return True

    async def _auth_flow(self, request: httpx2.Request
                         ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """The lock is held while tokens are renewed, not while a request waits for its
        answer: a connection's requests go on side by side."""
        context = self.context
        refreshed = False
        async with context.lock:
            context.protocol_version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
            if (context.current_tokens is not None and not context.is_token_valid()
                    and not await self._newer_stored() and context.can_refresh_token()):
                refreshed = await self._handle_refresh_response(
                    (yield await self._refresh_token()))
            sent = context.current_tokens if context.is_token_valid() else None
        if sent is not None:
            request.headers["Authorization"] = f"Bearer {sent.access_token}"
        response = yield request
        if response.status_code == 401:
            async with context.lock:
                renewed = context.current_tokens not in (None, sent)  # by another request
                renewed = renewed or await self._newer_stored()
                if not renewed and not refreshed and context.can_refresh_token():
                    renewed = await self._handle_refresh_response(
                        (yield await self._refresh_token()))
                retry = context.current_tokens if renewed else None
            if retry is not None:
                request.headers["Authorization"] = f"Bearer {retry.access_token}"
                response = yield request
        self.needs_auth = response.status_code == 401


class _Kept:
    """The SDK's token storage for a session: refreshed tokens go to the file."""

    def __init__(self, owner: SessionAuth) -> None:
        self._owner = owner

    async def get_tokens(self) -> OAuthToken | None:
        return self._owner.context.current_tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        stored = self._owner._stored
        self._owner._known = tokens.access_token
        if stored is not None:
            await trio.to_thread.run_sync(
                self._owner._file.save_tokens, stored.url, stored.issuer, tokens,
                self._owner.context.token_expiry_time)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self._owner.context.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        pass  # a session registers nothing


class _SignInAnswers(httpx2.AsyncBaseTransport):
    """`SessionAuth.answers`: a 401 to a request for `url` becomes a JSON-RPC error saying
    `message`, its headers (``WWW-Authenticate``) kept for the auth flow, which sees it
    first and may still refresh and send the request again."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, url: str, message: str) -> None:
        self._inner = inner
        self._url = httpx2.URL(url).copy_with(query=None, fragment=None)
        self._message = message

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code != 401 or request.url.copy_with(
                query=None, fragment=None) != self._url:
            return response
        await response.aclose()
        body = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {
            "code": INVALID_REQUEST, "message": self._message}})
        headers = [(key, value) for key, value in response.headers.multi_items()
                   if key.lower() not in ("content-type", "content-length", "content-encoding",
                                          "transfer-encoding")]
        return httpx2.Response(401, headers=[*headers, ("content-type", "application/json")],
                               content=body, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- forged mcp login --------------------------------------------------------------------------

Opened = Callable[[str], Awaitable[None]]
"""Shows the authorization address (and opens a browser where there is one)."""
Returned = Callable[["LoginAuth"], Awaitable[dict[str, str]]]
"""Waits for the browser's redirect (or its address, pasted): its ``code``, ``state`` and
``iss``, or an ``error``."""


async def sign_in(auth: LoginAuth, name: str, url: str, headers: dict[str, str],
                  timeout_s: float, file: CredentialFile) -> Credentials | None:
    """Sign in to the server `name` at `url` (its values expanded) through `auth`'s flow,
    which the server's 401 to the MCP handshake starts; the sign-in, stored in `file`, or
    None when the server answered without asking for one (nothing is stored). `ConfigError`
    says why it failed: nothing is stored then either. The connection is closed before it
    returns; cancelled, it has stored nothing (or, once storing has begun, all of it)."""
    await sdk.loaded()  # the SDK's own log lines go to forged's, a line each
    try:
        async with httpx2.AsyncClient(headers=headers, auth=auth,
                                      timeout=httpx2.Timeout(timeout_s)) as client, \
                streamable_http_client(url, http_client=client) as (read, write), \
                ClientSession(read, write, client_info=Implementation(
                    name="forged", version=__version__)) as session:
            await session.initialize()
    except Exception as exc:  # the handshake's end is judged by the sign-in, below
        if auth.failure is not None:
            raise ConfigError(f"Signing in to {name} failed: {auth.failure}") from None
        if auth.tokens is None or auth.last_status in (401, 403):
            raise ConfigError(f"Signing in to {name} failed: {exc}") from None
        # signed in: the server took the token, whatever it then made of the handshake
    if auth.failure is not None:
        raise ConfigError(f"Signing in to {name} failed: {auth.failure}")
    if auth.tokens is None:
        return None
    if auth.last_status in (401, 403):
        raise ConfigError(f"{name} refused the token it just granted (HTTP "
                          f"{auth.last_status})")
    context = auth.context
    assert context.client_info is not None
    issuer = (str(context.oauth_metadata.issuer) if context.oauth_metadata else
              context.auth_server_url or f"{urlsplit(url).scheme}://{urlsplit(url).netloc}")
    credentials = Credentials(
        url=url, name=name, issuer=issuer, metadata=context.oauth_metadata,
        client=context.client_info, resource_metadata=context.protected_resource_metadata,
        tokens=auth.tokens, expires_at=context.token_expiry_time)
    await trio.to_thread.run_sync(file.save, credentials)
    return credentials


class LoginAuth(OAuthClientProvider):
    """The SDK's whole flow, its results held until the sign-in is done: the client it
    registers (or one forged registered at that issuer before for the same redirect address,
    or mcp.json's ``clientId``) and the tokens."""

    def __init__(self, url: str, oauth: OAuthSpec | None, redirect_uri: str,
                 known: dict[str, Any],
                 opened: Opened, returned: Returned) -> None:
        scope = " ".join(oauth.scopes) if oauth is not None and oauth.scopes else None
        metadata = (_PinnedScope if scope else OAuthClientMetadata)(
            redirect_uris=[AnyUrl(redirect_uri)], scope=scope, client_name="forged",
            software_id="forged", software_version=__version__)
        super().__init__(url, metadata, _Held(self),
                         redirect_handler=opened,
                         callback_handler=functools.partial(self._returned, returned),
                         client_metadata_url=oauth.client_metadata_url if oauth else None)
        self.tokens: OAuthToken | None = None
        self.failure: Exception | None = None
        """What ended the flow (the SDK's transport only logs it)."""
        self.last_status: int | None = None
        self._known = known
        self._redirect = AnyUrl(redirect_uri)
        if oauth is not None and oauth.client_id:
            self.context.client_info = OAuthClientInformationFull(
                client_id=oauth.client_id, redirect_uris=[self._redirect],
                token_endpoint_auth_method="none")
        self._initialized = True  # nothing to read: a sign-in starts afresh

    def refused(self, redirect: dict[str, str]) -> str | None:
        """Why the redirect's ``iss`` is refused (RFC 9207), or None."""
        try:
            validate_authorization_response_iss(redirect.get("iss"), self.context.oauth_metadata)
        except OAuthFlowError:
            expected = self.context.oauth_metadata and self.context.oauth_metadata.issuer
            return (f"the authorization server's answer names the issuer "
                    f"{redirect.get('iss')!r}, not {str(expected)!r}: refused")
        return None

    async def _returned(self, returned: Returned) -> AuthorizationCodeResult:
        redirect = await returned(self)
        if "error" in redirect:
            raise ConfigError(redirect["error"])
        if (why := self.refused(redirect)) is not None:
            raise ConfigError(why)
        return AuthorizationCodeResult(code=redirect["code"], state=redirect.get("state"),
                                       iss=redirect.get("iss"))

    def _select_authorization_server(self, advertised: list[str]) -> str:
        issuer = advertised[0]
        if self.context.client_info is None:
            self.context.client_info = self._reusable(issuer)
        return issuer

    def _reusable(self, issuer: str) -> OAuthClientInformationFull | None:
        """A client forged has at `issuer` for this redirect address (and mcp.json's
        clientMetadataUrl, when it names one) whose secret has not expired."""
        document = self.context.client_metadata_url
        for client in clients(self._known, issuer):
            if (self._redirect in (client.redirect_uris or [])
                    and (document is None or client.client_id == document)
                    and not (client.client_secret_expires_at
                             and client.client_secret_expires_at < time.time())):
                return client
        return None

    async def async_auth_flow(self, request: httpx2.Request
                              ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        flow = super().async_auth_flow(request)
        try:
            outgoing = await flow.__anext__()
            while True:
                response = yield outgoing
                if outgoing is request:
                    self.last_status = response.status_code
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        except Exception as exc:
            self.failure = exc
            raise
        finally:
            await flow.aclose()


class _Held:
    """The SDK's token storage for a sign-in: kept in memory until it is done."""

    def __init__(self, owner: LoginAuth) -> None:
        self._owner = owner

    async def get_tokens(self) -> OAuthToken | None:
        return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._owner.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self._owner.context.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        pass  # kept in the SDK's context; stored with the tokens


class _PinnedScope(OAuthClientMetadata):
    """Client metadata whose scope (mcp.json's ``oauth.scopes``) the SDK's choice (what the
    server's 401 or its metadata asks for) does not replace."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "scope":
            super().__setattr__(name, value)


# --- forged mcp logout -------------------------------------------------------------------------

async def revoke(credentials: Credentials, timeout_s: float) -> str | None:
    """Ask the authorization server to revoke the sign-in's tokens (RFC 7009), the refresh
    token first; why it could not, or None (also when it offers no revocation)."""
    metadata = credentials.metadata
    if metadata is None or metadata.revocation_endpoint is None:
        return None
    client = credentials.client
    tokens = [(credentials.tokens.refresh_token, "refresh_token"),
              (credentials.tokens.access_token, "access_token")]
    try:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(timeout_s)) as http:
            for token, hint in tokens:
                if not token:
                    continue
                form = {"token": token, "token_type_hint": hint, "client_id": client.client_id}
                if client.client_secret and client.token_endpoint_auth_method == (
                        "client_secret_basic"):
                    answer = await http.post(str(metadata.revocation_endpoint), data=form,
                                             auth=(client.client_id, client.client_secret))
                else:
                    if client.client_secret:
                        form["client_secret"] = client.client_secret
                    answer = await http.post(str(metadata.revocation_endpoint), data=form)
                if answer.status_code != 200:
                    return f"{metadata.revocation_endpoint} answered {answer.status_code}"
    except (httpx2.HTTPError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None
