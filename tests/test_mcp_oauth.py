"""OAuth for streamable-HTTP MCP servers, end to end: ``forged mcp login NAME`` run as a
process against an authorization server and an MCP server built on the SDK's server side
(``mcp_oauth_server.py``), the browser's part played by an HTTP client that follows the
printed address's redirects to forged's loopback listener (or pastes where they end); then
sessions (``forged --mode rpc``) that use what it stored, and ``forged mcp logout NAME``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from forged import _codec, _wire as w
from forged._errors import ConfigProblem
from forged._mcp import parse_entry
from forged._mcp.config import OAuthSpec
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall

from .test_mcp import ends, forged_with, text
from .test_process import BIN, child_env

SERVER = str(Path(__file__).parent / "mcp_oauth_server.py")
DONE = Reply(content=[ScriptText(text="done")])
NAME = "guarded"
CALL = [Reply(content=[ScriptToolCall(name=f"mcp__{NAME}__echo",
                                      arguments={"text": "signed in"})]), DONE]
DOCUMENT = "https://forged.example/oauth/client.json"


@attrs.define
class Guarded:
    """``mcp_oauth_server.py``, running: the issuer at `base`, the MCP endpoint at `url`."""

    base: str

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    async def steer(self, what: str, **values: object) -> None:
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"{self.base}/test/{what}",
                                       params={k: str(v) for k, v in values.items()})
        answer.raise_for_status()

    async def log(self) -> list[dict[str, Any]]:
        async with httpx.AsyncClient() as client:
            answer: list[dict[str, Any]] = (await client.get(f"{self.base}/test/log")).json()
        return answer


@asynccontextmanager
async def guarded(tmp_path: Path, **entry: object) -> AsyncIterator[Guarded]:
    """The server, named `NAME` in the agent folder's mcp.json (with `entry`'s fields)."""
    server = await trio.lowlevel.open_process([sys.executable, SERVER, NAME],
                                              stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int((await server.stdout.receive_some(100)).split()[0])
        running = Guarded(base=f"http://127.0.0.1:{port}")
        (tmp_path / "agent").mkdir(exist_ok=True)
        (tmp_path / "project").mkdir(exist_ok=True)
        (tmp_path / "agent" / "mcp.json").write_text(json.dumps(
            {"mcpServers": {NAME: {"url": running.url, **entry}}}))
        yield running
    finally:
        server.kill()
        await server.wait()


def env(tmp_path: Path) -> dict[str, str]:
    """A child's environment: its own agent folder, and no browser to open."""
    return {key: value for key, value in child_env(tmp_path / "agent").items()
            if key not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}


@attrs.define
class Login:
    returncode: int
    stdout: str
    stderr: str
    page: httpx.Response | None


async def login(tmp_path: Path, *, paste: bool = False) -> Login:
    """``forged mcp login NAME``, the browser played by an HTTP client: it opens the printed
    address and follows its redirects to forged's listener, or (`paste`) stops at the
    authorization server's redirect and pastes its address on forged's stdin."""
    forged = await trio.lowlevel.open_process(
        [str(BIN / "forged"), "mcp", "login", NAME, "--cwd", str(tmp_path / "project")],
        env=env(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    assert forged.stdin is not None and forged.stdout is not None
    assert forged.stderr is not None
    stderr, stdout = b"", b""
    page = None
    with trio.fail_after(60):  # a hang guard, not a timing
        while b"/authorize?" not in stderr or b"ends on here.\n" not in stderr:
            data = await forged.stderr.receive_some(65536)
            if not data:
                break
            stderr += data
        address = next((word for word in stderr.decode().split() if "/authorize?" in word),
                       None)
        if address is not None:
            async with httpx.AsyncClient(follow_redirects=not paste) as browser:
                page = await browser.get(address)
            if paste:
                assert page.status_code == 302
                await forged.stdin.send_all(page.headers["location"].encode() + b"\n")
        async for data in forged.stderr:
            stderr += data
        async for data in forged.stdout:
            stdout += data
        await forged.wait()
    assert forged.returncode is not None
    return Login(forged.returncode, stdout.decode(), stderr.decode(), page)


def stored_file(tmp_path: Path) -> Path:
    return tmp_path / "agent" / "mcp-oauth.json"


def stored(tmp_path: Path, server: Guarded) -> dict[str, Any]:
    """The sign-in stored for `server`: its issuer's entry, with ``server`` its record."""
    data = json.loads(stored_file(tmp_path).read_text())
    entry: dict[str, Any] = data["issuers"][server.base]
    return {**entry, "server": entry["servers"][server.url]}


async def mcp_command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(60):  # a hang guard
        return await trio.run_process(
            [str(BIN / "forged"), "mcp", *args, "--cwd", str(tmp_path / "project")],
            env=env(tmp_path), capture_stdout=True, capture_stderr=True, check=False)


async def test_a_sign_in_is_stored_0600_and_a_session_calls_with_it(tmp_path: Path) -> None:
    async with guarded(tmp_path) as server:
        signed_in = await login(tmp_path)
        assert signed_in.returncode == 0, signed_in.stderr
        assert f"Signed in to {NAME} at {server.base}" in signed_in.stdout
        assert signed_in.page is not None and signed_in.page.status_code == 200
        mode = stat.S_IMODE(os.stat(stored_file(tmp_path)).st_mode)
        record = stored(tmp_path, server)
        async with forged_with(tmp_path, {NAME: {"url": server.url}}, CALL) as (forged, _):
            events = await forged.prompt("echo")
            listed = (await forged.call("get_mcp_servers"))["servers"]
        listing = await mcp_command(tmp_path, "list")
        log = await server.log()
    assert mode == 0o600
    assert record["server"]["name"] == NAME and record["metadata"]["issuer"] == server.base
    (registered,) = [event for event in log if event["event"] == "register"]
    assert record["server"]["clientId"] == registered["client_id"]
    (authorized,) = [event for event in log if event["event"] == "authorize"]
    assert authorized["resource"] == server.url  # RFC 8707
    assert text(ends(events)[0]) == f"{NAME} echo: signed in"
    assert listed[0]["status"] == "ready" and "needsAuth" not in listed[0]
    access = record["server"]["tokens"]["access_token"]
    assert {"event": "bearer", "token": access, "passed": True} in log
    assert not [event for event in log if event.get("grant") == "refresh_token"]
    assert f"  sign-in: stored ({server.base};" in listing.stdout.decode()


@pytest.mark.parametrize("lifetime_s", [2, 3600])
async def test_an_expired_token_is_refreshed_and_stored(tmp_path: Path,
                                                        lifetime_s: int) -> None:
    """A 2 s token has expired for forged too by the time a session starts (its own clock: it
    refreshes before a request, or on the 401); a 3600 s one has not, and only the server's
    401 says it is past (forged refreshes on it)."""
    async with guarded(tmp_path) as server:
        await server.steer("lifetime", seconds=lifetime_s)
        assert (await login(tmp_path)).returncode == 0
        before = stored(tmp_path, server)["server"]["tokens"]
        await server.steer("clock", advance=lifetime_s + 1)  # the server refuses it from now
        async with forged_with(tmp_path, {NAME: {"url": server.url}}, CALL) as (forged, _):
            events = await forged.prompt("echo")
        after = stored(tmp_path, server)["server"]
        mode = stat.S_IMODE(os.stat(stored_file(tmp_path)).st_mode)
        log = await server.log()
    assert text(ends(events)[0]) == f"{NAME} echo: signed in"
    assert [event["grant"] for event in log if event["event"] == "token"] == [
        "authorization_code", "refresh_token"]
    assert after["tokens"]["access_token"] != before["access_token"]
    assert after["tokens"]["refresh_token"] != before["refresh_token"]  # rotated, kept
    assert {"event": "bearer", "token": after["tokens"]["access_token"], "passed": True} in log
    assert mode == 0o600


async def test_a_server_without_a_usable_sign_in_needs_one_and_no_browser_opens(
        tmp_path: Path) -> None:
    async with guarded(tmp_path) as server:
        async with forged_with(tmp_path, {NAME: {"url": server.url}}, [DONE]) as (forged, _):
            await forged.logged(f"MCP server {NAME} failed")
            never = (await forged.call("get_mcp_servers"))["servers"][0]
        assert (await login(tmp_path)).returncode == 0
        async with forged_with(tmp_path, {NAME: {"url": server.url}}, CALL) as (forged, _):
            assert text(ends(await forged.prompt("echo"))[0]) == f"{NAME} echo: signed in"
        record = stored(tmp_path, server)
        client = record["clients"][record["server"]["clientId"]]
        async with httpx.AsyncClient() as http:  # the refresh token, and the access token too
            revoked = await http.post(f"{server.base}/revoke", data={
                "token": record["server"]["tokens"]["refresh_token"],
                "token_type_hint": "refresh_token", "client_id": client["client_id"],
                "client_secret": client["client_secret"]})
        assert revoked.status_code == 200
        seen = len(await server.log())
        async with forged_with(tmp_path, {NAME: {"url": server.url}}, CALL) as (forged, _):
            events = await forged.prompt("echo")
            listed = (await forged.call("get_mcp_servers"))["servers"][0]
        listing = await mcp_command(tmp_path, "list")
        after = (await server.log())[seen:]
    assert never["needsAuth"] is True and never["status"] == "failed"
    assert f"run `forged mcp login {NAME}`" in never["lastError"]
    (call,) = ends(events)
    assert call["isError"] and f"run `forged mcp login {NAME}`" in text(call)
    assert listed["needsAuth"] is True and listed["status"] == "failed"
    assert f"  sign-in: needed: run `forged mcp login {NAME}`" in listing.stdout.decode()
    assert {event["event"] for event in after} <= {"bearer"}  # no registration, no browser
    assert not any(event["passed"] for event in after)


@pytest.mark.parametrize("iss", ["http://127.0.0.1:1", "", "issuer-with/slash/"])
async def test_a_wrong_iss_is_refused_and_nothing_is_stored(tmp_path: Path, iss: str) -> None:
    async with guarded(tmp_path) as server:
        await server.steer("iss", value=iss.replace("issuer-with/slash/", server.base + "/"))
        refused = await login(tmp_path)
        absent = not stored_file(tmp_path).exists()
        await server.steer("iss", value=server.base)
        assert (await login(tmp_path)).returncode == 0
        kept = stored_file(tmp_path).read_bytes()
        await server.steer("iss", value=iss.replace("issuer-with/slash/", server.base + "/"))
        again = await login(tmp_path)
        unchanged = stored_file(tmp_path).read_bytes() == kept
        log = await server.log()
    assert refused.returncode == 1 and "issuer" in refused.stderr
    assert refused.page is not None and refused.page.status_code == 400
    assert "refused" in refused.page.text
    assert absent  # not even the client it registered before the redirect
    assert again.returncode == 1 and unchanged
    # registered at the refused sign-in and at the next; the stored client then serves
    assert len([event for event in log if event["event"] == "register"]) == 2


async def test_logout_removes_the_sign_in(tmp_path: Path) -> None:
    async with guarded(tmp_path) as server:
        assert (await login(tmp_path)).returncode == 0
        logout = await mcp_command(tmp_path, "logout", NAME)
        absent = not stored_file(tmp_path).exists()
        again = await mcp_command(tmp_path, "logout", NAME)
        log = await server.log()
    assert logout.returncode == 0
    assert f"Signed out of {NAME}: its sign-in at {server.base} is removed" in (
        logout.stdout.decode())
    assert absent
    assert [event["event"] for event in log if event["event"] == "revoke"] == ["revoke"]
    assert again.returncode == 0
    assert f"No sign-in stored for {NAME}" in again.stdout.decode()


async def test_a_client_metadata_document_is_the_client_id_and_an_address_can_be_pasted(
        tmp_path: Path) -> None:
    oauth = {"clientMetadataUrl": DOCUMENT, "scopes": ["tools", "extra"]}
    async with guarded(tmp_path, oauth=oauth) as server:
        signed_in = await login(tmp_path, paste=True)
        record = stored(tmp_path, server)
        log = await server.log()
    assert signed_in.returncode == 0, signed_in.stderr
    assert not [event for event in log if event["event"] == "register"]
    (authorized,) = [event for event in log if event["event"] == "authorize"]
    assert authorized["client_id"] == DOCUMENT == record["server"]["clientId"]
    assert authorized["scopes"] == ["tools", "extra"]  # mcp.json's, not only what it needs


def test_an_entrys_oauth_is_checked() -> None:
    spec = parse_entry("s", {"url": "https://x/mcp", "oauth": {
        "clientMetadataUrl": DOCUMENT, "scopes": ["read", "write"], "clientId": "c"}}, "user")
    assert spec.oauth == OAuthSpec(client_metadata_url=DOCUMENT, scopes=("read", "write"),
                                   client_id="c")
    assert parse_entry("s", {"url": "https://x/mcp"}, "user").oauth is None
    for oauth, message in [
            ("yes", "oauth must be an object"),
            ({"clientMetadataUrl": "http://forged.example/c.json"}, "https URL with a path"),
            ({"clientMetadataUrl": "https://forged.example/"}, "https URL with a path"),
            ({"scopes": "read write"}, "list of scopes"),
            ({"scopes": ["read write"]}, "list of scopes"),
            ({"clientId": ""}, "clientId must be a string")]:
        with pytest.raises(ConfigProblem, match=message):
            parse_entry("s", {"url": "https://x/mcp", "oauth": oauth}, "user")
    with pytest.raises(ConfigProblem, match="oauth is for HTTP servers"):
        parse_entry("s", {"command": "x", "oauth": {}}, "user")


def test_needs_auth_is_written_only_when_true() -> None:
    info = w.McpServerInfo(name="s", transport="http", status="ready", tool_count=1)
    assert "needsAuth" not in _codec.unstructure(info)
    info.needs_auth = True
    assert _codec.unstructure(info)["needsAuth"] is True
