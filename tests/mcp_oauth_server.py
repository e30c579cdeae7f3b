"""An MCP server that asks for OAuth, for the tests, on the official SDK's server side: its own
authorization server (RFC 8414 metadata, dynamic registration, authorize, token with refresh,
revocation) and a resource server (the MCP endpoint, ``/mcp``, which takes only its bearer
tokens, and its protected-resource metadata), all on one 127.0.0.1 port::

    python mcp_oauth_server.py NAME      prints its port first

``/authorize`` approves at once: it redirects to the client's address with the code, the
state and ``iss`` (RFC 9207; its metadata says it sends one). A client-ID metadata document
(an https client ID) is taken as a client, without fetching it. The endpoint needs the scope
``tools``; ``extra`` is granted too when asked for. Its one tool is ``echo``.

The tests steer it, without a token:

- ``POST /test/clock?advance=S``: its clock S seconds on (the resource server then refuses an
  access token past its lifetime: no test sleeps for it);
- ``POST /test/lifetime?seconds=S``: the access tokens it issues from then on live S seconds
  (3600 until then);
- ``POST /test/iss?value=X``: the ``iss`` its redirects carry from then on (empty: none);
- ``GET /test/log``: what it saw, one object an event: ``register``, ``authorize``,
  ``token`` (with its ``grant``), ``revoke``, ``bearer`` (a token the endpoint was shown,
  and whether it passed).
"""

from __future__ import annotations

import secrets
import socket
import sys
import time
from typing import Any

import anyio
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    IdentityAssertionParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import build_metadata
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import InvalidRedirectUriError, OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl, AnyUrl
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

SCOPE = "tools"
"""What the MCP endpoint requires, and its metadata names."""
EXTRA = "extra"
"""A scope it also grants, when asked."""
REGISTRATION = ClientRegistrationOptions(enabled=True, valid_scopes=[SCOPE, EXTRA],
                                         default_scopes=[SCOPE])
REVOCATION = RevocationOptions(enabled=True)


class DocumentClient(OAuthClientInformationFull):
    """A client named by its metadata document's https URL: any loopback redirect passes."""

    def validate_redirect_uri(self, redirect_uri: AnyUrl | None) -> AnyUrl:
        if redirect_uri is not None and str(redirect_uri).startswith("http://127.0.0.1:"):
            return redirect_uri
        raise InvalidRedirectUriError(f"{redirect_uri} is not a loopback address")


class Provider:
    """The authorization server's state, in memory, on a clock the tests move."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer
        self.iss: str = issuer
        self.offset_s = 0.0
        self.lifetime_s = 3600
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, tuple[AccessToken, float]] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.log: list[dict[str, Any]] = []

    def now(self) -> float:
        return time.time() + self.offset_s

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        if client_id.startswith("https://"):
            return DocumentClient(client_id=client_id, token_endpoint_auth_method="none",
                                  scope=f"{SCOPE} {EXTRA}")
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = client_info
        self.log.append({"event": "register", "client_id": client_info.client_id,
                         "redirect_uris": [str(uri) for uri in client_info.redirect_uris or []]})

    async def authorize(self, client: OAuthClientInformationFull,
                        params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or [], expires_at=time.time() + 300,
            client_id=client.client_id, code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource)
        self.log.append({"event": "authorize", "client_id": client.client_id,
                         "resource": params.resource, "scopes": params.scopes})
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state,
                                      iss=self.iss or None)

    async def load_authorization_code(self, client: OAuthClientInformationFull,
                                      authorization_code: str) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(self, client: OAuthClientInformationFull,
                                          authorization_code: AuthorizationCode) -> OAuthToken:
        del self.codes[authorization_code.code]
        self.log.append({"event": "token", "grant": "authorization_code",
                         "client_id": client.client_id})
        return self._issue(client.client_id, authorization_code.scopes,
                           authorization_code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull,
                                 refresh_token: str) -> RefreshToken | None:
        found = self.refresh.get(refresh_token)
        return found if found is not None and found.client_id == client.client_id else None

    async def exchange_refresh_token(self, client: OAuthClientInformationFull,
                                     refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        del self.refresh[refresh_token.token]  # rotated
        self.log.append({"event": "token", "grant": "refresh_token",
                         "client_id": client.client_id})
        return self._issue(client.client_id, scopes, refresh_token.resource)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = f"at-{secrets.token_hex(8)}", f"rt-{secrets.token_hex(8)}"
        self.access[access] = (AccessToken(token=access, client_id=client_id, scopes=scopes,
                                           resource=resource), self.now() + self.lifetime_s)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes,
                                             resource=resource)
        return OAuthToken(access_token=access, expires_in=self.lifetime_s,
                          refresh_token=refresh, scope=" ".join(scopes) or None)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        passed = found is not None and found[1] >= self.now()
        self.log.append({"event": "bearer", "token": token, "passed": passed})
        return found[0] if found is not None and passed else None

    async def exchange_identity_assertion(self, client: OAuthClientInformationFull,
                                          params: IdentityAssertionParams) -> OAuthToken:
        raise TokenError(error="unsupported_grant_type")

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        """Every token of the client goes, access and refresh alike."""
        self.log.append({"event": "revoke", "client_id": token.client_id})
        for tokens in (self.access, self.refresh):
            for key in [key for key, value in tokens.items()
                        if (value[0] if isinstance(value, tuple) else value).client_id
                        == token.client_id]:
                del tokens[key]


def build(name: str, port: int) -> tuple[Any, Provider]:
    issuer = f"http://127.0.0.1:{port}"
    provider = Provider(issuer)
    settings = AuthSettings.model_validate({
        "issuer_url": issuer, "resource_server_url": f"{issuer}/mcp",
        "client_registration_options": REGISTRATION, "revocation_options": REVOCATION,
        "required_scopes": [SCOPE], "validate_token_resource": True})
    server = MCPServer(name, instructions=f"The {name} test server, behind OAuth.",
                       auth_server_provider=provider, auth=settings)

    @server.tool(description="Echo the text back")
    def echo(text: str) -> str:
        return f"{name} echo: {text}"

    return steered(server.streamable_http_app(), provider, settings.issuer_url), provider


def steered(app: Any, provider: Provider, issuer: AnyHttpUrl) -> Any:
    """`app`, with the tests' controls and metadata that says ``iss`` comes (and that
    client-ID metadata documents are taken)."""
    metadata = build_metadata(issuer, None, REGISTRATION, REVOCATION)
    metadata.authorization_response_iss_parameter_supported = True
    metadata.client_id_metadata_document_supported = True

    async def steer(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request = Request(scope, receive)
        path, query = request.url.path, request.query_params
        answer: Response | None = None
        if path == "/.well-known/oauth-authorization-server":
            answer = JSONResponse(metadata.model_dump(mode="json", exclude_none=True))
        elif path == "/test/clock":
            provider.offset_s += float(query["advance"])
            answer = JSONResponse({"offset": provider.offset_s})
        elif path == "/test/lifetime":
            provider.lifetime_s = int(query["seconds"])
            answer = JSONResponse({"lifetime": provider.lifetime_s})
        elif path == "/test/iss":
            provider.iss = query["value"]
            answer = JSONResponse({"iss": provider.iss})
        elif path == "/test/log":
            answer = JSONResponse(provider.log)
        if answer is None:
            await app(scope, receive, send)
        else:
            await answer(scope, receive, send)

    return steer


async def serve(name: str) -> None:
    import uvicorn

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)  # before the port is said: a test connects at once
    port = listener.getsockname()[1]
    app, _ = build(name, port)
    print(port, flush=True)
    config = uvicorn.Config(app, log_level="warning")
    await uvicorn.Server(config).serve(sockets=[listener])


if __name__ == "__main__":
    anyio.run(serve, sys.argv[1] if len(sys.argv) > 1 else "guarded")
