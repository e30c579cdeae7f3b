"""Plain HTTP on the WebSocket's listener: pairing a device, and a browser's ticket.

A connection's request head is read here first (`read_head`); an upgrade to a WebSocket goes
on to `forged._transports.websocket` with what was read replayed (`Replayed`). Any other
request is answered here, once, and the connection closed:

- ``GET /pair``: a small page that reads the code from the link's fragment and pairs this
  browser (its credential kept in an HttpOnly cookie);
- ``POST /pair`` ``{"code", "name"?, "cookie"?}``: a pairing code traded, once, for a
  device's credential (`forged._devices.Access.pair`), as JSON, or with ``"cookie": true``
  as an HttpOnly, Secure, SameSite=Strict cookie only;
- ``POST /ticket`` (or ``/ticket/<path>``, the one path a cookie is sent to: `ticket_path`):
  a credential (``Authorization: Bearer``, or the cookie from a page of
  the daemon's own origin) traded for a single-use ticket that opens one WebSocket
  (``?ticket=``) within 30 s.

A request from a browser page (one with ``Origin``) is answered only for the daemon's own
origin and the allowed ones; the bodies are small (`MAX_BODY_BYTES`); every pairing and
refusal is a line in the log, never a credential or a code.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import attrs
import orjson
import trio

from .._connection import Prefixed
from .._devices import TICKET_S, Access, Principal
from .._errors import HttpRefused, NotPaired
from .._log import log

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 16 * 1024
COOKIE = "forged_device"
COOKIE_MAX_AGE_S = 400 * 24 * 3600
"""The longest a browser keeps a cookie (Chrome's cap); revoking the device ends it sooner."""


@attrs.frozen(kw_only=True)
class Head:
    method: str
    path: str
    """The target without its query."""
    query: str
    headers: dict[str, str]
    """By lower-case name; a repeated header's values joined by ``, ``."""

    @property
    def upgrade(self) -> bool:
        return self.headers.get("upgrade", "").lower() == "websocket"


_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""What no request line or header holds (tab aside), once its lines' CRLFs are taken out."""


async def read_head(stream: trio.abc.ReceiveStream) -> tuple[Head | None, bytes]:
    """The request head at the start of `stream`, and every byte read (to replay); None
    for the head when it is not HTTP, is too long, or the stream ended first."""
    read = b""
    while b"\r\n\r\n" not in read:
        if len(read) > MAX_HEAD_BYTES:
            return None, read
        data = await stream.receive_some(MAX_HEAD_BYTES)
        if not data:
            return None, read
        read += data
    head = read.partition(b"\r\n\r\n")[0]
    if _CONTROL.search(head.replace(b"\r\n", b"")):  # a bare CR or LF: no line in a log
        return None, read
    lines = head.decode("latin-1").split("\r\n")
    request_line = lines[0].split(" ")
    if len(request_line) != 3 or not request_line[2].startswith("HTTP/1."):
        return None, read
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            return None, read
        key = name.lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    path, _, query = request_line[1].partition("?")
    return Head(method=request_line[0], path=path, query=query, headers=headers), read


class Replayed(Prefixed, trio.abc.Stream):
    """`stream`, its first bytes given again (a head read to route the request)."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        super().__init__(stream, prefix)
        self._whole = stream

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._whole.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._whole.wait_send_all_might_not_block()


def origin_refused(head: Head, allowed_origins: Sequence[str], links: Sequence[str]
                   ) -> str | None:
    """Why a browser page's request is refused, or None: its ``Origin`` must be allowed, or
    the daemon's own, where a link pairing hands out points (`forged._devices.Access.links`:
    the listener's address, or the proxy's in front of it). The ``Host`` a request names
    proves nothing: a page of another site can resolve its name to this address."""
    origin = head.headers.get("origin")
    if origin is None or origin in allowed_origins or origin in {
            _origin_of(link) for link in links}:
        return None
    return f"origin {origin} is not allowed"


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def cookie_credential(head: Head) -> str | None:
    for pair in head.headers.get("cookie", "").split(";"):
        name, _, value = pair.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None


def bearer(head: Head) -> str | None:
    authorization = head.headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[len("bearer "):].strip()
    return None


async def serve_plain(stream: trio.abc.Stream, head: Head, read: bytes, access: Access, *,
                      name: str, address: str, allowed_origins: Sequence[str]) -> None:
    """Answer the one request `head` begins (`read`: the bytes read of it so far) from
    `address` (the client's host; `name` says who in the log)."""
    try:
        status, body, headers = await _route(stream, head, read, access, name=name,
                                              address=address,
                                              allowed_origins=allowed_origins)
    except HttpRefused as refusal:
        status, body, headers = refusal.status, _json({"error": refusal.reason}), []
        log(f"refused {head.method} {head.path} from {name}: {refusal.reason} "
            f"(HTTP {status})")
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
              404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
              413: "Content Too Large", 411: "Length Required"}.get(status, "Error")
    if not any(header.startswith("Content-Type:") for header in headers):
        headers.append("Content-Type: " + ("text/html; charset=utf-8"
                                           if body.startswith(b"<!doctype")
                                           else "application/json"))
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}",
             "Connection: close", "Cache-Control: no-cache" if head.path in PAGE_FILES
             else "Cache-Control: no-store",
             "X-Content-Type-Options: nosniff", "Referrer-Policy: no-referrer",
             "Content-Security-Policy: default-src 'none'; connect-src 'self'; img-src 'self'; "
             "manifest-src 'self'; worker-src 'self'; frame-ancestors 'none'; "
             "base-uri 'none'; form-action 'none'; "
             + ("script-src 'self'; style-src 'self'" if head.path in PAGE_FILES
                # the pairing page's one inline script and style
                else "script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'"),
             *headers]
    if head.method == "HEAD":
        body = b""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body)


async def _route(stream: trio.abc.Stream, head: Head, read: bytes, access: Access, *,
                 name: str, address: str, allowed_origins: Sequence[str]
                 ) -> tuple[int, bytes, list[str]]:
    if head.method in ("GET", "HEAD") and head.path in PAGE_FILES:
        return 200, _page_file(head.path), [f"Content-Type: {PAGE_FILES[head.path]}"]
    if head.path not in ("/pair", "/ticket") and not head.path.startswith("/ticket/"):
        raise HttpRefused(404, f"nothing at {head.path}")
    refused = origin_refused(head, allowed_origins, access.links)
    if refused is not None:
        raise HttpRefused(403, refused)
    if head.path == "/pair" and head.method in ("GET", "HEAD"):
        return 200, PAIR_PAGE, []
    if head.method != "POST":
        raise HttpRefused(405, f"{head.method} {head.path}: only POST")
    body = await _body(stream, head, read)
    if head.path != "/pair":
        principal = _ticket_holder(head, access)
        ticket = access.tickets.issue(principal, trio.current_time())
        log(f"ticket issued to {name} ({principal.name}, {principal.role})")
        return 200, _json({"ticket": ticket, "expiresInSeconds": int(TICKET_S),
                           "device": principal.name, "role": principal.role}), []
    try:
        asked = orjson.loads(body)
        code, named = asked["code"], asked.get("name")
        if not isinstance(code, str) or not isinstance(named, str | None):
            raise TypeError("code")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise HttpRefused(400, 'expected {"code": "...", "name"?: "..."}') from None
    try:
        device, credential = access.pair(code, trio.current_time(), named)
    except NotPaired as exc:
        raise HttpRefused(403, str(exc)) from None
    access.devices.seen(device, address)
    log(f"paired device {device.name} ({device.role}) from {name}")
    if asked.get("cookie") is True:
        path = ticket_path(credential)
        cookie = (f"Set-Cookie: {COOKIE}={credential}; Path={path}; "
                  f"Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; Secure; SameSite=Strict")
        return 200, _json({"credential": None, "device": device.name,
                           "role": device.role, "ticketPath": path}), [cookie]
    return 200, _json({"credential": credential, "device": device.name,
                       "role": device.role}), []


def ticket_path(credential: str) -> str:
    """Where a browser trades its cookie for a ticket: a path derived from the credential,
    which the cookie is scoped to. A cookie is not kept apart by port: without this, every
    other server on the daemon's host name (a project's dev server on another port) would
    be sent it; none can name this path, which only the daemon's own page knows."""
    return "/ticket/" + hashlib.sha256(b"forged ticket path\0" + credential.encode()
                                       ).hexdigest()[:32]


def _ticket_holder(head: Head, access: Access) -> Principal:
    """Whom a ticket request stands for: its bearer credential, else its cookie when it
    comes from a page (`origin_refused` let it through) to the cookie's own path."""
    credential = bearer(head)
    if credential is None:
        credential = cookie_credential(head)
        if credential is not None and head.headers.get("origin") is None:
            raise HttpRefused(403, "a cookie is taken only from a page (with its Origin)")
        if credential is not None and head.path != ticket_path(credential):
            raise HttpRefused(403, "a cookie is taken only at its own ticket path")
    if credential is None:
        raise HttpRefused(401, "no credential")
    principal = access.authenticate(credential)
    if principal is None:
        raise HttpRefused(401, "wrong credential")
    return principal


async def _body(stream: trio.abc.ReceiveStream, head: Head, read: bytes) -> bytes:
    if "transfer-encoding" in head.headers:
        raise HttpRefused(411, "send a Content-Length")
    try:
        length = int(head.headers.get("content-length", "0"))
    except ValueError:
        raise HttpRefused(400, "invalid Content-Length") from None
    if not 0 <= length <= MAX_BODY_BYTES:
        raise HttpRefused(413, f"a body of {MAX_BODY_BYTES} bytes at most")
    body = read.partition(b"\r\n\r\n")[2]
    while len(body) < length:
        data = await stream.receive_some(MAX_BODY_BYTES)
        if not data:
            raise HttpRefused(400, "the body ended early")
        body += data
    return body[:length]


PAGE = Path(__file__).parent.parent / "web"
"""The page's files (docs/web.md), shipped in the package; read when asked for, so that a
daemon no browser visits holds none of them."""
PAGE_FILES = {
    "/": "text/html; charset=utf-8", "/app.css": "text/css; charset=utf-8",
    **{f"/{name}.js": "text/javascript; charset=utf-8" for name in (
        "app", "state", "link", "transcript", "panels", "markdown", "preact-htm", "sw")},
    "/icon.svg": "image/svg+xml", "/manifest.webmanifest": "application/manifest+json"}


def _page_file(path: str) -> bytes:
    return (PAGE / ("index.html" if path == "/" else path[1:])).read_bytes()


def _json(data: object) -> bytes:
    return orjson.dumps(data)


PAIR_PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Pair with forged</title>
<link rel="icon" href="/icon.svg" type="image/svg+xml">
<style>body{font:1.1rem/1.5 system-ui,sans-serif;max-width:30rem;margin:2rem auto;padding:0 1rem;
color:#111;background:#fff}@media (prefers-color-scheme:dark){body{color:#eee;background:#111}}
</style></head>
<body><main><h1>Pair with forged</h1><p id="status" role="status" aria-live="polite">Pairing\
 this browser&hellip;</p>
<p id="next" hidden><a href="/">Open forged</a></p></main>
<script>
(async () => {
  const status = document.getElementById("status");
  const code = decodeURIComponent(location.hash.slice(1));
  const open = location.search === "?open";
  history.replaceState(null, "", location.pathname);
  if (!code) { status.textContent = "No pairing code: open the link forged pair printed."; return; }
  try {
    const answer = await fetch("/pair", {method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify({code, cookie: true})});
    const data = await answer.json();
    if (answer.ok) localStorage.setItem("forged.ticketPath", data.ticketPath);
    status.textContent = answer.ok
      ? `Paired: this browser is the device ${data.device} (${data.role}).`
      : `Not paired: ${data.error}.`;
    if (answer.ok && open) location.replace("/");
    else if (answer.ok) document.getElementById("next").hidden = false;
  } catch (error) { status.textContent = `Not paired: ${error}.`; }
})();
</script></body></html>
"""
