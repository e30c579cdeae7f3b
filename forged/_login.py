"""``forged login PROVIDER`` and ``forged logout PROVIDER``: sign-ins saved in auth.json, the
file pi's ``/login`` writes, headless (a terminal over SSH is enough).

- ``openai-codex`` (ChatGPT Plus/Pro): the device code flow. forged prints a code and the page
  to enter it on, and asks OpenAI until the sign-in is done (15 minutes at most).
- ``anthropic`` (Claude Pro/Max): the browser flow with PKCE. forged prints the address to open
  and waits for the browser's redirect on a loopback port (53692, else any free one); a
  browser on another machine cannot reach it, so the redirect address (or ``code#state``) can
  be pasted on stdin instead.
- ``github-copilot``: GitHub's device code flow, then the GitHub token is traded for a Copilot
  token (`forged._providers.copilot`).
- any other provider: an API key, read from stdin (not echoed on a terminal).

Each saves its entry under auth.json's lock (`forged._auth`), the others untouched.
``logout`` removes the provider's entry.
"""

from __future__ import annotations

import base64
import difflib
import getpass
import hashlib
import html
import secrets
import sys
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import trio

from ._auth import AuthFile, Entry
from ._errors import ConfigError, ProviderError
from ._log import log
from ._paths import agent_dir

ANTHROPIC_AUTHORIZE_URL = "https://claude.ai/oauth/authorize"
ANTHROPIC_PORT = 53692
ANTHROPIC_SCOPES = ("org:create_api_key user:profile user:inference user:sessions:claude_code "
                    "user:mcp_servers user:file_upload")
CODEX_USER_CODE_URL = "https://auth.openai.com/api/accounts/deviceauth/usercode"
CODEX_DEVICE_TOKEN_URL = "https://auth.openai.com/api/accounts/deviceauth/token"
CODEX_VERIFICATION_URL = "https://auth.openai.com/codex/device"
CODEX_DEVICE_REDIRECT = "https://auth.openai.com/deviceauth/callback"
DEVICE_TIMEOUT_S = 15 * 60


SIGN_INS = ("anthropic", "openai-codex", "github-copilot")
"""Providers signed in to with an account (a browser or a device code); any other known
provider takes an API key."""


def usage(command: str) -> str:
    return (f"usage: forged {command} PROVIDER\n"
            f"  sign in with an account: {', '.join(SIGN_INS)}\n"
            "  or save an API key (read from stdin) for any other provider of the catalogue "
            "or of models.json:\n"
            f"  {', '.join(sorted(set(known_providers()) - set(SIGN_INS)))}\n"
            f"saved in {agent_dir() / 'auth.json'} (pi's is ~/.pi/agent/auth.json: to share "
            "it, run forged with PI_CODING_AGENT_DIR=~/.pi/agent)")


def known_providers() -> list[str]:
    """Every provider forged can use: its own, the catalogue's and models.json's."""
    from ._catalogue import catalogue_providers
    from ._models import ModelRegistry

    registry = ModelRegistry()
    registry.load_models_json(agent_dir() / "models.json")
    return sorted({*SIGN_INS, *registry.providers, *catalogue_providers()})


def main(command: str, argv: list[str]) -> int:
    """``forged login`` / ``forged logout``: the exit code."""
    if len(argv) != 1 or argv[0].startswith("-"):
        help_asked = argv in (["--help"], ["-h"])
        print(usage(command), file=sys.stdout if help_asked else sys.stderr)
        return 0 if help_asked else 2
    provider = argv[0]
    auth = AuthFile(agent_dir() / "auth.json")
    if command == "login" and provider not in (known := known_providers()):
        nearest = difflib.get_close_matches(provider, known, n=3, cutoff=0.5)
        log(f"forged login: unknown provider {provider!r}"
            + (f" (did you mean {' or '.join(nearest)}?)" if nearest else "")
            + f"; `forged login --help` lists them (a provider of your own goes in "
            f"{agent_dir() / 'models.json'})")
        return 2
    try:
        if command == "logout":
            removed = trio.run(auth.delete, provider)
            print(f"Signed out of {provider}" if removed else f"No sign-in for {provider}")
            return 0
        entry = trio.run(sign_in, provider)
        trio.run(auth.modify, provider, _replace_with(entry))
    except (ConfigError, ProviderError) as exc:
        log(str(exc))
        return 1
    except (OSError, ValueError, ExceptionGroup) as exc:
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if not isinstance(exc, OSError | ValueError):
            raise
        doing = "read" if isinstance(exc, ValueError) else "change"
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        log(f"{command}: could not {doing} {auth.path}: {what}; it is left as it was")
        return 1
    except KeyboardInterrupt:
        log("login cancelled")
        return 130
    print(f"Signed in to {provider}; saved in {auth.path}")
    return 0


def choose() -> int:
    """``forged --mode acp --login`` (an editor's terminal sign-in): the providers listed,
    one chosen by its number or name, then ``forged login`` for it."""
    providers = known_providers()
    shown = [*SIGN_INS, *(name for name in providers if name not in SIGN_INS)]
    say("Sign in to a model provider for forged:")
    for number, name in enumerate(shown, 1):
        how = "an account" if name in SIGN_INS else "an API key"
        say(f"  {number:>3}. {name} ({how})")
    print("Provider (a number or a name): ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip()
    if answer.isdigit() and 1 <= int(answer) <= len(shown):
        answer = shown[int(answer) - 1]
    if not answer:
        say("No provider chosen: nothing signed in")
        return 2
    return main("login", [answer])


def _replace_with(entry: Entry) -> Any:
    async def change(_: Entry | None) -> Entry:
        return entry

    return change


async def sign_in(provider: str) -> Entry:
    if provider == "openai-codex":
        return await codex_device_flow()
    if provider == "anthropic":
        return await anthropic_browser_flow()
    if provider == "github-copilot":
        return await copilot_device_flow()
    key = await trio.to_thread.run_sync(_read_key, provider)
    if not key:
        raise ConfigError("no key given: nothing saved")
    return {"type": "api_key", "key": key}


def _read_key(provider: str) -> str:
    prompt = f"API key for {provider}: "
    if sys.stdin.isatty():
        return getpass.getpass(prompt).strip()
    print(prompt, file=sys.stderr, flush=True)
    return sys.stdin.readline().strip()


def seconds(value: object, default: float) -> float:
    """A server's number of seconds (``0`` and ``"0"`` included: zero), else `default`."""
    try:
        return float(value) if isinstance(value, int | float | str) else default
    except ValueError:
        return default


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- ChatGPT: the device code flow ---------------------------------------------------------------

async def codex_device_flow() -> Entry:
    from ._providers.oauth import CODEX_CLIENT_ID, codex_tokens, post_json, post_raw

    device = await post_json(CODEX_USER_CODE_URL, {"client_id": CODEX_CLIENT_ID},
                             "start the ChatGPT sign-in")
    if not device.get("device_auth_id") or not device.get("user_code"):
        raise ProviderError(f"OpenAI answered no device code: {device}")
    say(f"To sign in to ChatGPT, open {CODEX_VERIFICATION_URL} and enter the code "
        f"{device['user_code']}")
    interval = seconds(device.get("interval"), 5)
    deadline = trio.current_time() + DEVICE_TIMEOUT_S
    while True:
        if trio.current_time() >= deadline:
            raise ProviderError("The ChatGPT sign-in was not completed in 15 minutes")
        status, answer = await post_raw(CODEX_DEVICE_TOKEN_URL, json={
            "device_auth_id": device["device_auth_id"], "user_code": device["user_code"]})
        if status == 200 and answer.get("authorization_code") and answer.get("code_verifier"):
            break
        code = answer.get("error")
        code = code.get("code") if isinstance(code, dict) else code
        if status == 200 or (status not in (403, 404) and code not in (
                "deviceauth_authorization_pending", "slow_down")):
            raise ProviderError(f"The ChatGPT sign-in failed ({status}): {answer}")
        if code == "slow_down":
            interval += 5
        await trio.sleep(max(interval, 0.2))
    return {"type": "oauth", **await codex_tokens({
        "grant_type": "authorization_code", "client_id": CODEX_CLIENT_ID,
        "code": answer["authorization_code"], "code_verifier": answer["code_verifier"],
        "redirect_uri": CODEX_DEVICE_REDIRECT}, "sign in to ChatGPT")}


# --- GitHub Copilot: GitHub's device code flow ---------------------------------------------------

async def copilot_device_flow() -> Entry:
    from ._providers import copilot
    from ._providers.oauth import post_raw

    links = copilot.urls()
    status, device = await post_raw(links["device"], form={"client_id": copilot.CLIENT_ID,
                                                           "scope": "read:user"})
    if status >= 400 or not device.get("device_code") or not device.get("user_code"):
        raise ProviderError(f"GitHub answered no device code ({status}): {device}")
    say(f"To sign in to GitHub Copilot, open {device.get('verification_uri')} and enter the "
        f"code {device['user_code']}")
    interval = seconds(device.get("interval"), 5)
    deadline = trio.current_time() + seconds(device.get("expires_in"), DEVICE_TIMEOUT_S)
    while True:
        await trio.sleep(max(interval, 0.2))
        if trio.current_time() >= deadline:
            raise ProviderError("The GitHub sign-in was not completed in time")
        status, answer = await post_raw(links["access"], form={
            "client_id": copilot.CLIENT_ID, "device_code": device["device_code"],
            "grant_type": "urn:ietf:params:oauth:grant-type:device_code"})
        if isinstance(answer.get("access_token"), str):
            break
        error = answer.get("error")
        if error == "slow_down":
            interval = seconds(answer.get("interval"), interval + 5)
        elif error != "authorization_pending":
            raise ProviderError(f"The GitHub sign-in failed ({status}): {answer}")
    return {"type": "oauth", **await copilot.copilot_token(answer["access_token"])}


# --- Claude: the browser flow with PKCE ----------------------------------------------------------

def pkce() -> tuple[str, str]:
    verifier = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    challenge = base64.urlsafe_b64encode(
        hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def pasted_code(text: str) -> tuple[str | None, str | None]:
    """The code (and state) in what a user pasted: the redirect address, ``code#state``, a
    query, or the code alone."""
    text = text.strip()
    if not text:
        return None, None
    parts = urlsplit(text)
    if parts.scheme and parts.netloc:
        query = parse_qs(parts.query)
        return query.get("code", [None])[0], query.get("state", [None])[0]
    if "#" in text:
        code, state = text.split("#", 1)
        return code, state
    if "code=" in text:
        query = parse_qs(text)
        return query.get("code", [None])[0], query.get("state", [None])[0]
    return text, None


async def anthropic_browser_flow() -> Entry:
    from ._providers.oauth import ANTHROPIC_CLIENT_ID, anthropic_tokens

    verifier, challenge = pkce()
    found: dict[str, str] = {}
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve_redirect, found, done, state=lambda: verifier,
                                           service="Claude", port=ANTHROPIC_PORT))
        redirect = f"http://localhost:{port}/callback"
        query = urlencode({"code": "true", "client_id": ANTHROPIC_CLIENT_ID,
                           "response_type": "code", "redirect_uri": redirect,
                           "scope": ANTHROPIC_SCOPES, "code_challenge": challenge,
                           "code_challenge_method": "S256", "state": verifier})
        say(f"To sign in to Claude, open this address in a browser:\n\n"
            f"  {ANTHROPIC_AUTHORIZE_URL}?{query}\n\nforged waits for the browser's redirect to "
            f"{redirect}; if the browser is on another machine, paste the address it ends "
            "on here.")
        nursery.start_soon(read_pasted, found, done)
        await done.wait()
        nursery.cancel_scope.cancel()
    if "error" in found:
        raise ProviderError(found["error"])
    if found.get("state", verifier) != verifier:
        raise ProviderError("The sign-in's state does not match: start again")
    return {"type": "oauth", **await anthropic_tokens({
        "grant_type": "authorization_code", "client_id": ANTHROPIC_CLIENT_ID,
        "code": found["code"], "state": found.get("state", verifier),
        "redirect_uri": redirect, "code_verifier": verifier}, "sign in to Claude")}


async def read_pasted(found: dict[str, str], done: trio.Event) -> None:
    """What is pasted on stdin, a line at a time, until one holds a code: its code, state and
    (RFC 9207) ``iss`` into `found`, and `done` set."""
    while not done.is_set():
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if not line:
            return  # no input: the browser's redirect is the only way
        code, state = pasted_code(line)
        if code:
            issuer = parse_qs(urlsplit(line.strip()).query).get("iss")
            found.update(code=code, **({"state": state} if state else {}),
                         **({"iss": issuer[0]} if issuer else {}))
            done.set()


async def serve_redirect(found: dict[str, str], done: trio.Event, *,
                         state: Callable[[], str | None], service: str, port: int = 0,
                         refused: Callable[[dict[str, str]], str | None] | None = None,
                         task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """The loopback page the browser is sent back to, with the code, on 127.0.0.1: `port`
    (any free one when it is taken, or 0), which it starts with. A redirect whose state is
    not ``state()`` is answered 400 and waited past; one that carries an error, or that
    `refused` refuses (saying why), sets ``found["error"]``; any other puts its code, state
    and ``iss`` into `found`. Either sets `done`. Serves until cancelled."""
    try:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    except OSError:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request and len(request) < 65536:
                data = await stream.receive_some(4096)
                if not data:
                    return
                request += data
            target = request.split(b" ", 2)[1].decode(errors="replace")
            query = parse_qs(urlsplit(target).query)
            expected = state()
            if (urlsplit(target).path != "/callback" or expected is None
                    or query.get("state", [""])[0] != expected):
                await _page(stream, 400, "This is not the sign-in forged is waiting for.")
                return
            if query.get("error"):
                found["error"] = (f"{service} sign-in failed: "
                                  + query.get("error_description", query["error"])[0])
            elif query.get("code"):
                got = {"code": query["code"][0], "state": expected,
                       **({"iss": query["iss"][0]} if query.get("iss") else {})}
                if (why := refused(got) if refused else None) is not None:
                    found["error"] = why
                    await _page(stream, 400, f"forged refused this sign-in: {why}")
                    done.set()
                    return
                found.update(got)
            else:
                await _page(stream, 400, "No code in the address.")
                return
            await _page(stream, 200, "Signed in: you may close this page.")
            done.set()

    await trio.serve_listeners(answer, listeners)


async def _page(stream: trio.SocketStream, status: int, text: str) -> None:
    body = f"<!doctype html><title>forged</title><p>{html.escape(text)}</p>".encode()
    head = (f"HTTP/1.1 {status} {'OK' if status == 200 else 'Bad Request'}\r\n"
            "content-type: text/html; charset=utf-8\r\ncache-control: no-store\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    await stream.send_all(head.encode() + body)
