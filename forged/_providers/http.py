"""The HTTP skeleton the wire APIs share, on httpx.

A wire API module builds a request body and its headers; `open_events` encodes the body with
orjson, POSTs it, checks the status and hands the streamed bytes to the SSE decoder. A cloud
provider that signs its requests would add its headers here the same way.

Resource handling: one `httpx.AsyncClient` per base URL and key in each trio run (its pooled
connections belong to that run's event loop), kept alive across turns. They share the
process's one TLS context (`forged._tls`), which start-up builds in a thread.

Error handling: everything HTTP that can go wrong becomes a `ProviderError` in
`provider_errors`, the one place that knows httpx's exceptions. An error status is a
`ProviderStatusError` carrying the service's ``retry-after``; a refused, reset or cut
connection and a silent one are `ProviderStreamError` s, which the retry policy retries.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AsyncExitStack, aclosing, asynccontextmanager, contextmanager, suppress
from typing import TypedDict, cast

import httpx
import orjson
import trio

from .. import _telemetry
from .._errors import ProviderError, ProviderStatusError, ProviderStreamError
from .._tls import tls_context
from .base import AssistantBuilder, ProviderRequest, reply_streaming
from .sse import silent, sse_events

CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 600.0
"""httpx's own limit between two reads; `ProviderRequest.idle_timeout_s` is the real one."""
ERROR_BODY_MAX_BYTES = 64 * 1024
DRAIN_TIMEOUT_S = 1.0
"""How long a finished stream may take to end its body, so its connection is kept alive."""
USER_AGENT = "forged"

Events = AsyncIterator[tuple[bytes, object]]
"""A stream's (event name, decoded JSON data) pairs, the data for its wire API's reader."""
ErrorText = Callable[[object], str | None]
"""The message of a decoded JSON error body (any JSON value), or None for the whole body."""

_BROKEN = (httpx.TransportError, OSError, trio.BrokenResourceError)


def prepare() -> None:
    """What a first request would otherwise pay for: the TLS context, and httpx's transport
    (httpcore, h11), which httpx imports when a client is first made."""
    httpx.AsyncClient(verify=tls_context())


_clients: trio.lowlevel.RunVar[dict[tuple[str, str], httpx.AsyncClient]] = (
    trio.lowlevel.RunVar("forged_http_clients"))


def client_for(base_url: str, api_key: str) -> httpx.AsyncClient:
    """The run's client for `base_url` and `api_key`: connections are reused across turns."""
    try:
        clients = _clients.get()
    except LookupError:
        clients = {}
        _clients.set(clients)
    client = clients.get((base_url, api_key))
    if client is None:
        client = clients[(base_url, api_key)] = httpx.AsyncClient(
            verify=tls_context(), timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            # Every stream holds a connection: a cap would hold a daemon's later sessions back.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=20))
    return client


def redirected(url: str) -> str:
    """`url`, its origin replaced as ``FORGED_OAUTH_ORIGINS`` says: a sign-in's requests,
    and the API host a sign-in names (Copilot's), sent to a test double or a gateway."""
    raw = os.environ.get("FORGED_OAUTH_ORIGINS")
    if raw:
        try:
            origins = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ProviderError(f"FORGED_OAUTH_ORIGINS is not JSON: {exc}") from exc
        for origin, replacement in origins.items() if isinstance(origins, dict) else ():
            if url.startswith(origin.rstrip("/") + "/"):
                return str(replacement).rstrip("/") + url[len(origin.rstrip("/")):]
    return url


# --- sign-in endpoints ---------------------------------------------------------------------

SIGN_IN_TIMEOUT_S = 30.0


class SignInAnswer(TypedDict, total=False):
    """What the sign-in endpoints forged asks answer (OAuth token endpoints, device code
    flows, Copilot's token exchange), each some of these; ``body`` holds an answer that was
    not JSON. Fields the callers check before use are `object`."""

    access_token: str
    refresh_token: str
    expires_in: object
    token: object
    expires_at: object
    device_auth_id: str
    device_code: str
    user_code: str
    verification_uri: str
    interval: object
    authorization_code: str
    code_verifier: str
    error: str | dict[str, str]
    body: str


def sign_in_answer(answer: object) -> SignInAnswer | None:
    """The reader of sign-in endpoints' JSON: a JSON object as a `SignInAnswer`, else None."""
    return cast(SignInAnswer, answer) if isinstance(answer, dict) else None


async def _sign_in(method: str, url: str, headers: dict[str, str], *,
                   json: Mapping[str, object] | None = None,
                   form: Mapping[str, str] | None = None) -> tuple[int, object]:
    """A request to a sign-in endpoint (`redirected`): its status and decoded JSON answer (the
    body's text, when it is not JSON)."""
    target = redirected(url)
    with provider_errors(target):
        response = await client_for(target, "").request(method, target, json=json, data=form,
                                                         headers=headers,
                                                         timeout=SIGN_IN_TIMEOUT_S)
    try:
        return response.status_code, orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.status_code, {"body": response.text[:2000]}


async def post_raw(url: str, *, json: Mapping[str, object] | None = None,
                   form: Mapping[str, str] | None = None) -> tuple[int, SignInAnswer]:
    """POST to a sign-in endpoint: the status and the JSON answer ({} when it is not a JSON
    object)."""
    status, answer = await _sign_in("POST", url, {"accept": "application/json"}, json=json,
                                    form=form)
    return status, sign_in_answer(answer) or {}


async def get_json(url: str, headers: dict[str, str], doing: str) -> SignInAnswer:
    """GET a sign-in endpoint's JSON, or a `ProviderError` saying what failed."""
    status, answer = await _sign_in("GET", url, headers)
    read = sign_in_answer(answer)
    if status >= 400 or read is None:
        raise ProviderError(f"Could not {doing} ({status}): {answer}")
    return read


def merge_headers(defaults: dict[str, str], configured: dict[str, str]) -> dict[str, str]:
    """`defaults` (lowercase names) overridden by the configured headers, whatever their case."""
    merged = {"user-agent": USER_AGENT, **defaults}
    merged.update((name.lower(), value) for name, value in configured.items())
    return merged


@asynccontextmanager
async def open_events(request: ProviderRequest, url: str, headers: dict[str, str],
                      body: Mapping[str, object], out: AssistantBuilder, *,
                      error_text: ErrorText | None = None) -> AsyncIterator[Events]:
    """POST `body` to `url` and yield the answer's server-sent events, as (event name, parsed
    data) pairs. An answer that does not start within `request.idle_timeout_s`, or a stream
    silent that long, fails as a retryable `ProviderStreamError`; an error status fails as
    a `ProviderStatusError` whose message `error_text` picks from a JSON body (by default
    the whole body is the message).

    Cancellation closes the connection. On a normal exit the rest of the body is read
    (briefly), so the connection goes back to the pool."""
    async with (open_body(request, url, {"content-type": "application/json", **headers},
                          orjson.dumps(body), error_text=error_text) as chunks,
                aclosing(sse_events(chunks, out, request.idle_timeout_s)) as events):
        yield events


@asynccontextmanager
async def open_body(request: ProviderRequest, url: str, headers: dict[str, str],
                    content: bytes, *, error_text: ErrorText | None = None
                    ) -> AsyncIterator[AsyncIterator[bytes]]:
    """POST `content` (`headers` complete: a signature covers them) and yield the answer's
    body as it comes, as `open_events` does for a stream of any framing."""
    client = client_for(request.model.base_url, request.api_key)
    with provider_errors(url, request.model.provider):
        async with AsyncExitStack() as stack:
            with trio.move_on_after(request.idle_timeout_s) as waiting:
                response = await stack.enter_async_context(client.stream(
                    "POST", url, content=content,
                    headers={**headers, **_telemetry.tracing.headers()}))
            if waiting.cancelled_caught:
                raise silent(request.idle_timeout_s)
            if response.is_error:
                raise await status_error(response, error_text, request.idle_timeout_s)
            chunks = response.aiter_bytes()
            with reply_streaming():
                yield chunks
                # Best effort: a body that does not end in time only costs its connection.
                with trio.move_on_after(DRAIN_TIMEOUT_S), suppress(*_BROKEN):
                    async for _ in chunks:
                        pass


async def status_error(response: httpx.Response, error_text: ErrorText | None,
                       idle_timeout_s: float = READ_TIMEOUT_S) -> ProviderStatusError:
    """The error for an error status: ``<status> <message>``, the message being the service's
    own (`error_text` of a JSON body), the body's text, or ``status code (no body)``. A body
    cut short, or silent for `idle_timeout_s`, still gives its status."""
    body = bytearray()
    with trio.move_on_after(idle_timeout_s), suppress(*_BROKEN):
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) >= ERROR_BODY_MAX_BYTES:
                break
    text = body[:ERROR_BODY_MAX_BYTES].decode(errors="replace").strip()
    message: str | None = None
    if text and error_text is not None:
        try:
            message = error_text(orjson.loads(text))
        except orjson.JSONDecodeError:
            pass
    status = response.status_code
    return ProviderStatusError(f"{status} {message or text or 'status code (no body)'}",
                               status=status, retry_after_s=retry_after_s(response.headers))


def retry_after_s(headers: httpx.Headers) -> float | None:
    """The wait a service asks for: ``retry-after-ms``, else ``retry-after`` in seconds or as
    an HTTP date."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return float(milliseconds) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        import email.utils  # rare, and slow to import

        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, parsed.timestamp() - time.time())


@contextmanager
def provider_errors(url: str | None = None, provider: str | None = None) -> Iterator[None]:
    """Map httpx's and the network's errors to `ProviderError`. The only place that knows
    them. A connection that could not be made says to what (`provider`, the host of `url`),
    why in words, and the proxy it went through or, where one may be what is missing, the
    variables that set one."""
    try:
        yield
    except ProviderError:
        raise
    except httpx.ConnectTimeout as exc:
        raise ProviderStreamError(_unreachable(exc, url, provider, timed_out=True)) from exc
    except httpx.TimeoutException as exc:
        raise ProviderStreamError(f"Request timed out: {_describe(exc)}") from exc
    except (httpx.ConnectError, httpx.ProxyError) as exc:
        raise ProviderStreamError(_unreachable(exc, url, provider)) from exc
    except httpx.TransportError as exc:
        raise ProviderStreamError(f"Connection error: {_describe(exc)}") from exc
    except (OSError, trio.BrokenResourceError) as exc:
        raise ProviderStreamError(f"Connection error: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ProviderError(_describe(exc)) from exc


def _describe(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


PROXY_VARIABLES = {"https": ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"),
                   "http": ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")}
"""Where httpx finds a proxy for a URL of each scheme, in its order (``NO_PROXY`` aside)."""


def _unreachable(exc: Exception, url: str | None, provider: str | None, *,
                 timed_out: bool = False) -> str:
    """``Connection error: cannot reach <provider> at <host>: <why>`` and the proxy's part."""
    import socket

    target = httpx.URL(url) if url else None
    host = target.host if target is not None else "the service"
    port = target.port if target is not None else None
    where = f"{host}:{port}" if port else host
    proxy = _proxy_for(target) if target is not None else None
    cause = _first_os_error(exc)
    if timed_out:
        why = f"it did not answer within {CONNECT_TIMEOUT_S:g} s"
    elif isinstance(cause, socket.gaierror):
        why = (f"the name {host} could not be resolved (no network, or no DNS)" if proxy is None
               else "the proxy's name could not be resolved")
    elif isinstance(cause, ConnectionRefusedError):
        why = "the connection was refused" + (" (nothing listens there)" if proxy is None
                                              else " by the proxy")
    elif isinstance(cause, OSError) and cause.errno in (101, 113):  # ENETUNREACH, EHOSTUNREACH
        why = "there is no route to it (no network?)"
    else:
        why = _describe(exc)
    said = f"Connection error: cannot reach {provider + ' at ' if provider else ''}{where}: {why}"
    if proxy is not None:
        return f"{said}; through the proxy {proxy[1]} ({proxy[0]})"
    if not isinstance(cause, ConnectionRefusedError) and host not in ("localhost", "127.0.0.1",
                                                                      "::1"):
        variables = " or ".join(PROXY_VARIABLES.get(target.scheme if target else "https",
                                                    PROXY_VARIABLES["https"])[::2])
        said += f"; if this network reaches it through a proxy, set {variables}"
    return said


def _first_os_error(exc: BaseException | None) -> OSError | None:
    """The network's own error under `exc`: the first with an errno, looking through
    causes and groups (trio's "all attempts to connect failed" holds one per address)."""
    seen: set[int] = set()
    pending = [exc]
    found: OSError | None = None
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            if current.errno is not None:
                return current
            found = found or current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending += [current.__cause__, current.__context__]
    return found


def _proxy_for(url: httpx.URL) -> tuple[str, str] | None:
    """The variable naming the proxy a request to `url` goes through, and its value; None
    when none does (none set, or ``NO_PROXY`` leaves the host out)."""
    found = next(((name, os.environ[name]) for name in PROXY_VARIABLES.get(url.scheme, ())
                  if os.environ.get(name)), None)
    if found is None:
        return None
    excluded = os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or ""
    for entry in (item.strip().lstrip(".") for item in excluded.split(",")):
        if entry == "*" or (entry and (url.host == entry or url.host.endswith("." + entry))):
            return None
    return found
