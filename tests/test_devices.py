"""Paired devices, as a phone or a stolen credential would try them: the daemon's WebSocket
over real TLS (a certificate made here by openssl), ``POST /pair`` and ``/ticket`` over
HTTPS, trio-websocket's client and `forged.client` for the connections. Each refusal is
judged where it lands: what the scripted model was asked, a file made or not, a connection
that ends."""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import stat
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import orjson
import pytest
import trio
import trio.testing
from trio_websocket import HandshakeError, open_websocket_url

from forged import _wire as w
from forged._devices import PAIRING_ATTEMPTS, Devices, needed_role
from forged._paths import read_ws_token
from forged._providers.scripted import Reply, ScriptText
from forged.client import Client

from .chromium import find_chromium, open_page
from .harness import Daemon, open_daemon
from .test_daemon import free_port
from .test_permissions import escalated, scripted
from .test_process import BIN, child_env
from .test_remote import certificate, trusting


class Remote:
    """A daemon with a WebSocket over TLS on 127.0.0.1, and what a device needs to reach
    it: its https base, its wss URL and a context trusting its certificate."""

    def __init__(self, daemon: Daemon, port: int, context: ssl.SSLContext) -> None:
        self.daemon = daemon
        self.base = f"https://127.0.0.1:{port}"
        self.url = f"wss://127.0.0.1:{port}/"
        self.context = context

    async def post(self, path: str, body: dict[str, Any] | bytes | None = None,
                   headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else (
            orjson.dumps(body) if body is not None else b"")
        async with httpx.AsyncClient(verify=self.context) as http:
            return await http.post(self.base + path, headers=headers, content=content)

    async def offer(self, name: str, role: str) -> w.Pairing:
        """`forged pair` as the owner asks the daemon, over its socket."""
        async with self.daemon.client() as owner:
            return await owner.pair_device(name, role)

    async def pair(self, name: str, role: str) -> str:
        """A device paired end to end: the code offered, traded once; its credential."""
        code = (await self.offer(name, role)).link.rpartition("#")[2]
        answer = await self.post("/pair", {"code": code, "name": name})
        assert answer.status_code == 200, answer.text
        assert answer.json()["device"] == name and answer.json()["role"] == role
        credential: str = answer.json()["credential"]
        return credential

    @asynccontextmanager
    async def device(self, credential: str) -> AsyncIterator[Client]:
        async with Client.open_websocket(self.url, credential,
                                         ssl_context=self.context) as client:
            yield client

    async def refused_status(self, url: str, headers: Sequence[tuple[bytes, bytes]] = ()
                             ) -> int:
        with pytest.raises(HandshakeError) as refused:
            async with open_websocket_url(url, ssl_context=self.context,
                                          extra_headers=list(headers)):
                pass
        return int(getattr(refused.value, "status_code", 0))


@asynccontextmanager
async def open_remote(tmp_path: Path, replies: list[Reply] | None = None
                      ) -> AsyncIterator[Remote]:
    cert, key = certificate(tmp_path, "daemon")
    port = free_port()
    async with open_daemon(tmp_path, replies, ws=("127.0.0.1", port), tls_cert=cert,
                           tls_key=key) as daemon:
        yield Remote(daemon, port, trusting(cert))


async def test_a_device_pairs_once_and_connects_with_a_credential_of_its_own(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    async with open_remote(tmp_path) as remote:
        pairing = await remote.offer("phone", "read")
        assert pairing.link == f"{remote.base}/pair#{pairing.code}"
        assert pairing.expires_in_seconds == 600
        answer = await remote.post("/pair", {"code": pairing.code, "name": "phone"})
        credential = answer.json()["credential"]
        assert answer.status_code == 200 and credential.startswith("fgd_")
        again = await remote.post("/pair", {"code": pairing.code, "name": "phone"})
        assert again.status_code == 403 and "credential" not in again.json()

        async with remote.device(credential) as phone:
            assert (await phone.list_sessions()).sessions == []
        async with remote.daemon.client() as owner:
            [device] = await owner.list_devices()
        assert (device.name, device.role, device.address) == ("phone", "read", "127.0.0.1")
        assert device.last_seen is not None
        assert await remote.refused_status(remote.url, [
            (b"authorization", b"Bearer " + credential[:-2].encode() + b"xx")]) == 401

    stored = tmp_path / "agent" / "devices.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert credential not in stored.read_text()  # only its hash is kept
    log = capfd.readouterr().err
    assert "paired device phone (read)" in log
    assert credential not in log and pairing.code not in log


async def test_forged_pair_prints_the_code_and_link_and_devices_lists_it(
        tmp_path: Path) -> None:
    async with open_remote(tmp_path) as remote:
        env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
        printed = await trio.run_process(
            [str(BIN / "forged"), "pair", "--name", "laptop", "--role", "approve",
             "--socket", str(remote.daemon.socket_path)],
            capture_stdout=True, capture_stderr=True, env=env)
        code_line, link_line = printed.stdout.decode().splitlines()
        code = code_line.removeprefix("code: ")
        assert link_line == f"link: {remote.base}/pair#{code}"
        assert (await remote.post("/pair", {"code": code})).status_code == 200
        listed = await trio.run_process(
            [str(BIN / "forged"), "devices", "--socket", str(remote.daemon.socket_path)],
            capture_stdout=True, env=env)
    [line] = listed.stdout.decode().splitlines()
    assert line.startswith("laptop  approve  created 20") and "from 127.0.0.1" in line


async def test_a_read_device_watches_and_its_prompt_runs_nothing(tmp_path: Path) -> None:
    async with open_remote(tmp_path, [Reply(content=[ScriptText(text="hello")])]) as remote:
        credential = await remote.pair("tablet", "read")
        async with remote.daemon.client() as owner:
            await owner.prompt_and_wait("hi")
            session_id = (await owner.get_state()).session_id
        asked_before = len(remote.daemon.server.requests)
        async with remote.device(credential) as tablet:
            unattached = await tablet.request("prompt", message="run rm -rf ~")
            attached = await tablet.attach(session_id)
            messages = await tablet.request("get_messages")
            refused = {kind: await tablet.request(kind, **fields) for kind, fields in [
                ("prompt", {"message": "run rm -rf ~"}), ("steer", {"message": "x"}),
                ("abort", {}), ("set_model", {"provider": "scripted", "modelId": "x"}),
                ("extension_ui_response", {"value": "Allow once"}),
                ("bash", {"command": "touch ../pwned"}),
                ("set_permission_mode", {"mode": "full-access"})]}
    assert unattached["success"] is False
    assert str(unattached["error"]).startswith("prompt needs the control role")
    assert attached.session_id == session_id and messages["success"] is True
    assert {kind: str(answer["error"]).split(";")[0] for kind, answer in refused.items()} == {
        "prompt": "prompt needs the control role", "steer": "steer needs the control role",
        "abort": "abort needs the control role",
        "set_model": "set_model needs the control role",
        "extension_ui_response": "extension_ui_response needs the approve role",
        "bash": "bash needs the owner role",
        "set_permission_mode": "set_permission_mode needs the owner role"}
    assert len(remote.daemon.server.requests) == asked_before  # the model was asked nothing
    assert not (tmp_path / "pwned").exists()


async def test_an_approve_devices_answer_before_it_attached_opens_no_session(
        tmp_path: Path) -> None:
    """A dialog's answer from a connection attached to nothing would open a session for it
    (any session command does): below control it is refused, and none is opened."""
    async with open_remote(tmp_path) as remote:
        credential = await remote.pair("watch", "approve")
        async with remote.device(credential) as watch:
            await watch.answer_dialog("d1", value="Allow once")
            listed = await watch.list_sessions()  # answered after the answer's refusal
    assert listed.sessions == []


async def test_an_approve_device_answers_a_permission_request(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    replies = scripted(escalated(f"touch {outside / 'made'}"))
    async with open_remote(tmp_path, replies) as remote:
        credential = await remote.pair("watch", "approve")
        async with remote.daemon.client() as owner:
            await owner.new_session()
            session_id = (await owner.get_state()).session_id
            await owner.run("set_permission_mode", mode="auto")
            await owner.prompt("Go")
            await owner.next_event(lambda e: e.type == "extension_ui_request")
        async with remote.device(credential) as watch:  # the owner has gone: it waits
            await watch.attach(session_id)
            asked = (await watch.next_event(lambda e: e.type == "extension_ui_request")).event
            assert isinstance(asked, w.ExtensionUiRequest)
            prompt = await watch.request("prompt", message="and more")
            await watch.answer_dialog(asked.id, value="Allow once")
            await watch.next_event(lambda e: e.type == "agent_settled")
    assert (outside / "made").exists()
    assert str(prompt["error"]).startswith("prompt needs the control role")
    log = capfd.readouterr().err.splitlines()
    assert [line for line in log if "(watch): prompt needs the control role" in line
            and "refused prompt from websocket client 127.0.0.1:" in line]
    assert [line for line in log if "answered by websocket client 127.0.0.1:" in line
            and line.endswith("(watch): 'Allow once'")]
    assert credential not in "\n".join(log)


async def test_a_control_device_drives_runs_but_not_the_permission_mode(
        tmp_path: Path) -> None:
    async with open_remote(tmp_path, [Reply(content=[ScriptText(text="ran")])]) as remote:
        credential = await remote.pair("phone", "control")
        async with remote.device(credential) as phone:
            await phone.new_session()
            before = (await phone.get_state()).permission_mode
            refused = await phone.request("set_permission_mode", mode="full-access")
            opened_elsewhere = await phone.request(
                "new_session", permissionMode="full-access")
            devices = await phone.request("pair_device", name="mine", role="owner")
            await phone.prompt_and_wait("go")
            state = await phone.get_state()
            text = await phone.get_last_assistant_text()
    assert str(refused["error"]).startswith("set_permission_mode needs the owner role")
    assert str(opened_elsewhere["error"]).startswith("new_session needs the owner role")
    assert str(devices["error"]).startswith("pair_device needs the owner role")
    assert state.permission_mode == before
    assert text == "ran"


async def test_revoking_a_device_ends_its_connection_at_once_and_refuses_it_after(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    async with open_remote(tmp_path) as remote:
        credential = await remote.pair("phone", "control")
        async with remote.device(credential) as phone:
            await phone.new_session()
            async with remote.daemon.client() as owner:
                revoked = await owner.revoke_device("phone")
            with trio.fail_after(1):
                await phone.closed.wait()
        assert (revoked.device, revoked.disconnected) == ("phone", 1)
        assert await remote.refused_status(remote.url, [
            (b"authorization", f"Bearer {credential}".encode())]) == 401
        ticket = await remote.post("/ticket", headers={"authorization": f"Bearer {credential}"})
        assert ticket.status_code == 401
        async with remote.daemon.client() as owner:
            assert await owner.list_devices() == []
    log = capfd.readouterr().err
    assert "revoked device phone" in log and "1 connection(s) ended" in log
    assert "connected as device phone (control)" in log
    assert credential not in log


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Trio's clock at real speed, jumped by a test to expire a code or a ticket."""
    return trio.testing.MockClock(rate=1)


async def test_a_reused_expired_or_guessed_code_is_refused(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with open_remote(tmp_path) as remote:
        used = (await remote.offer("a", "read")).code
        assert (await remote.post("/pair", {"code": used})).status_code == 200
        assert (await remote.post("/pair", {"code": used})).status_code == 403

        expired = (await remote.offer("b", "read")).code
        clock.jump(601)
        assert (await remote.post("/pair", {"code": expired})).status_code == 403

        wanted = (await remote.offer("c", "owner")).code
        wrong = await remote.post("/pair", {"code": wanted, "name": "someone-else"})
        guesses = [await remote.post("/pair", {"code": f"GUESS{n:05d}"})
                   for n in range(PAIRING_ATTEMPTS - 1)]
        assert {answer.status_code for answer in [wrong, *guesses]} == {403}
        assert (await remote.post("/pair", {"code": wanted})).status_code == 403  # withdrawn
        async with remote.daemon.client() as owner:
            assert [device.name for device in await owner.list_devices()] == ["a"]
        malformed = [await remote.post("/pair", body) for body in (
            None, {"name": "x"}, {"code": ["x"]}, {"code": "x", "name": 3})]
        assert {answer.status_code for answer in malformed} == {400}
        deep = await remote.post("/pair", b'{"code":' + b"[" * 1500 + b"]" * 1500 + b"}")
        assert deep.status_code == 400


async def test_a_ticket_opens_one_websocket_once_within_30_seconds(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    async with open_remote(tmp_path) as remote:
        credential = await remote.pair("browser", "read")
        bearer = {"authorization": f"Bearer {credential}"}

        async def ticket() -> str:
            answer = await remote.post("/ticket", headers=bearer)
            assert answer.status_code == 200 and answer.json()["expiresInSeconds"] == 30
            issued: str = answer.json()["ticket"]
            return issued

        first = await ticket()
        async with open_websocket_url(f"{remote.url}?ticket={first}",
                                      ssl_context=remote.context) as ws:
            await ws.send_message('{"id": "l", "type": "list_sessions"}')
            assert orjson.loads(await ws.get_message())["success"] is True
        assert await remote.refused_status(f"{remote.url}?ticket={first}") == 401
        late = await ticket()
        clock.jump(31)
        assert await remote.refused_status(f"{remote.url}?ticket={late}") == 401
        assert (await remote.post("/ticket")).status_code == 401


async def test_a_browser_keeps_its_credential_in_a_strict_cookie(tmp_path: Path) -> None:
    """The cookie is HttpOnly, Secure, SameSite=Strict and scoped to a path only the
    daemon's page knows (a cookie is not kept apart by port: another server on the same
    host is sent it for any path it covers); taken only there, from the daemon's own
    origin."""
    async with open_remote(tmp_path) as remote:
        code = (await remote.offer("browser", "read")).code
        paired = await remote.post("/pair", {"code": code, "cookie": True},
                                   headers={"origin": remote.base})
        assert paired.status_code == 200 and paired.json()["credential"] is None
        cookie = paired.headers["set-cookie"]
        path = paired.json()["ticketPath"]
        assert {"HttpOnly", "Secure", "SameSite=Strict", f"Path={path}"} <= {
            part.strip() for part in cookie.split(";")}
        assert re.fullmatch(r"/ticket/[0-9a-f]{32}", path)
        sent = {"cookie": cookie.split(";")[0]}
        own = await remote.post(path, headers={**sent, "origin": remote.base})
        elsewhere = await remote.post("/ticket", headers={**sent, "origin": remote.base})
        foreign = await remote.post(path, headers={**sent, "origin": "https://evil.example"})
        rebound = await remote.post(path, headers={
            **sent, "origin": "https://evil.example", "host": "evil.example"})
        no_origin = await remote.post(path, headers=sent)
        page = await remote.post("/pair", {"code": "X"}, headers={"origin": "https://evil.example"})
    assert own.status_code == 200 and own.json()["ticket"]
    assert [elsewhere.status_code, foreign.status_code, rebound.status_code,
            no_origin.status_code, page.status_code] == [403, 403, 403, 403, 403]


async def test_the_owners_token_stays_the_owners_and_a_device_never_is(
        tmp_path: Path) -> None:
    """``ws-token`` keeps every right; a device cannot pair another or itself anew."""
    async with open_remote(tmp_path) as remote:
        credential = await remote.pair("phone", "control")
        async with Client.open_websocket(remote.url, read_ws_token(),
                                         ssl_context=remote.context) as owner:
            pairing = await owner.pair_device("spare", "read")
        async with remote.device(credential) as phone:
            listed = await phone.request("list_devices")
            revoke = await phone.request("revoke_device", name="phone")
    assert pairing.device == "spare"
    assert str(listed["error"]).startswith("list_devices needs the owner role")
    assert str(revoke["error"]).startswith("revoke_device needs the owner role")


async def test_devices_revoke_without_a_daemon_changes_the_file(tmp_path: Path) -> None:
    async with open_remote(tmp_path) as remote:
        await remote.pair("old-phone", "control")
    env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    revoked = await trio.run_process([str(BIN / "forged"), "devices", "revoke", "old-phone"],
                                     capture_stdout=True, env=env)
    assert b"revoked old-phone" in revoked.stdout
    stored = orjson.loads((tmp_path / "agent" / "devices.json").read_bytes())
    assert "old-phone" not in json.dumps(stored)


def _documented_roles() -> dict[str, str]:
    """Each command docs/remote.md's roles table names, and the role its row is."""
    table = (Path(__file__).parents[1] / "docs" / "remote.md").read_text()
    roles: dict[str, str] = {}
    for row in table.split("## Roles", 1)[1].split("\n\n")[2].splitlines()[2:]:
        role, _, commands = (cell.strip() for cell in row.strip("|").split("|"))
        for command in re.findall(r"`([a-z_]+)`(?! with)", commands):
            if command in w.DAEMON_COMMAND_CLASSES:
                roles.setdefault(command, role.strip("`"))
    return roles


def test_every_command_needs_the_role_the_documented_table_says() -> None:
    """The roles table of docs/remote.md is the one the daemon enforces, for every command
    the daemon knows (its plain form: a path, a mode or servers given make it the owner's)."""
    documented = _documented_roles()
    enforced = {}
    for kind, command_class in w.DAEMON_COMMAND_CLASSES.items():
        fields = {a.name: "x" for a in attrs.fields(command_class)
                  if a.default is attrs.NOTHING and a.name != "type"}
        make: Any = command_class
        enforced[kind] = needed_role(make(**fields))
    assert {kind: role for kind, role in enforced.items() if role != "owner"} == {
        kind: role for kind, role in documented.items() if role != "owner"}
    assert {kind for kind, role in documented.items() if role == "owner"} <= {
        kind for kind, role in enforced.items() if role == "owner"}
    owner_only: list[w.Command] = [
        w.NewSession(permission_mode="full-access"), w.NewSession(fork="/a.jsonl"),
        w.NewSession(session="../other/s.jsonl"),
        w.NewSession(mcp_servers={"mcpServers": {"x": {"command": "sh"}}}),
        w.ExportHtml(output_path="/etc/x.html")]
    assert {needed_role(command) for command in owner_only} == {"owner"}


def test_an_unreadable_devices_file_admits_no_device(tmp_path: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    devices = Devices(tmp_path / "devices.json")
    credential = devices.add("phone", "owner")
    assert devices.identify(credential) is not None
    (tmp_path / "devices.json").write_text('{"devices": [{"name": "phone"')
    assert Devices(tmp_path / "devices.json").identify(credential) is None
    assert "no paired device is admitted" in capfd.readouterr().err


async def test_pairing_needs_a_listener_the_device_can_reach(tmp_path: Path) -> None:
    """A daemon without ``--ws`` offers no code (a device could not use it); ``forged pair``
    says what to do, and with no daemon at all says so too."""
    env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    pair = [str(BIN / "forged"), "pair", "--name", "phone", "--role", "read"]
    async with open_daemon(tmp_path) as daemon:
        refused = await trio.run_process([*pair, "--socket", str(daemon.socket_path)],
                                         capture_stdout=True, capture_stderr=True,
                                         env=env, check=False)
    alone = await trio.run_process(pair, capture_stdout=True, capture_stderr=True, env=env,
                                   check=False)
    assert (refused.returncode, refused.stdout) == (1, b"")
    assert b"no WebSocket listener" in refused.stderr and b"--ws" in refused.stderr
    assert (alone.returncode, alone.stdout) == (1, b"")
    assert b"no forged daemon runs" in alone.stderr


@pytest.mark.skipif(find_chromium() is None, reason="no chromium to pair")
async def test_a_real_browser_pairs_by_the_link_and_opens_the_websocket_with_a_ticket(
        tmp_path: Path) -> None:
    """Headless Chromium opens the link ``forged pair`` gives: the page pairs it (the code
    gone from its address, the credential in a cookie no script reads), then a ticket opens
    the WebSocket with the device's role."""
    binary = find_chromium()
    assert binary is not None
    async with open_remote(tmp_path) as remote:
        pairing = await remote.offer("browser", "read")
        async with open_page(binary, tmp_path / "profile") as page:
            await page.call("Security.setIgnoreCertificateErrors", ignore=True)
            await page.call("Page.navigate", url=pairing.link)
            with trio.fail_after(20):  # a hang guard
                await page.wait_event("Page.loadEventFired")
                status = (await page.call(  # the page's own word, when it says how it went
                    "Runtime.evaluate", awaitPromise=True, returnByValue=True,
                    expression="""new Promise((resolve) => {
                      const status = document.getElementById('status');
                      const said = () => /^(Paired|Not paired)/.test(status.textContent)
                        && resolve(status.textContent);
                      if (!said()) new MutationObserver(said).observe(
                        status, {childList: true, characterData: true, subtree: true});
                    })"""))["result"]["value"]
            address = await page.evaluate("location.href")
            scripts_see = await page.evaluate("document.cookie")
            answered = await page.call("Runtime.evaluate", awaitPromise=True,
                                       returnByValue=True, expression="""(async () => {
                const bare = (await fetch('/ticket', {method: 'POST'})).status;
                const path = localStorage.getItem('forged.ticketPath');
                const ticket = (await (await fetch(path, {method: 'POST'})).json()).ticket;
                return await new Promise((resolve, reject) => {
                  const ws = new WebSocket(`wss://${location.host}/?ticket=${ticket}`);
                  ws.onopen = () => {
                    ws.send(JSON.stringify({id: 'l', type: 'list_sessions'}));
                    ws.send(JSON.stringify({id: 'p', type: 'prompt', message: 'rm -rf ~'}));
                  };
                  const answers = {};
                  ws.onmessage = (m) => {
                    const answer = JSON.parse(m.data);
                    answers[answer.id] = answer;
                    if (answers.l && answers.p) resolve({bare, ...answers});
                  };
                  ws.onerror = () => reject('the WebSocket was refused');
                });
              })()""")
        async with remote.daemon.client() as owner:
            [device] = await owner.list_devices()
    assert status == "Paired: this browser is the device browser (read)."
    assert "#" not in address and pairing.code not in address
    assert scripts_see == ""
    answers = answered["result"]["value"]
    assert answers["bare"] == 401  # the cookie goes to its own path only
    assert answers["l"]["success"] is True
    assert answers["p"]["success"] is False
    assert answers["p"]["error"].startswith("prompt needs the control role")
    assert device.name == "browser" and len(remote.daemon.server.requests) == 0


async def test_a_control_device_opens_sessions_only_in_folders_the_owner_chose(
        tmp_path: Path) -> None:
    """A session's folder is what its model may write: a device below owner that names
    another (the agent folder, the home) is refused, and nothing is written there."""
    replies = [Reply(content=[ScriptText(text="here")])]
    async with open_remote(tmp_path, replies) as remote:
        credential = await remote.pair("phone", "control")
        async with remote.device(credential) as phone:
            elsewhere = {str(folder): await phone.request("new_session", cwd=str(folder))
                         for folder in (tmp_path / "agent", tmp_path, Path("/"))}
            home = await phone.request("new_session", cwd="~")
            same = await phone.request("new_session", cwd=str(tmp_path / "project"))
            await phone.prompt_and_wait("hello")
            cwd = (await phone.list_sessions()).sessions[0].cwd
    for answer in [*elsewhere.values(), home]:
        assert "a folder no session uses, needs the owner role" in str(answer["error"])
    assert same["success"] is True and cwd == str(tmp_path / "project")
    assert len(remote.daemon.server.requests) == 1


async def test_a_revocation_written_by_another_process_holds_and_is_not_undone(
        tmp_path: Path) -> None:
    """``forged devices revoke`` that reached no daemon (another runtime folder) edits the
    file: the running daemon refuses the device from then on, cuts its connection at its
    next command, and another device connecting does not write it back."""
    async with open_remote(tmp_path) as remote:
        phone_credential = await remote.pair("phone", "control")
        laptop_credential = await remote.pair("laptop", "read")
        env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(tmp_path / "other")}
        async with remote.device(phone_credential) as phone:
            await phone.new_session()
            await trio.run_process([str(BIN / "forged"), "devices", "revoke", "phone"],
                                   capture_stdout=True, env=env)
            with pytest.raises(ConnectionError):
                await phone.request("get_state")
        async with remote.device(laptop_credential) as laptop:
            await laptop.list_sessions()
        assert await remote.refused_status(remote.url, [
            (b"authorization", f"Bearer {phone_credential}".encode())]) == 401
    stored = orjson.loads((tmp_path / "agent" / "devices.json").read_bytes())
    assert [device["name"] for device in stored["devices"]] == ["laptop"]


async def test_a_ticket_dies_with_its_device_even_when_the_name_is_paired_again(
        tmp_path: Path) -> None:
    async with open_remote(tmp_path) as remote:
        credential = await remote.pair("phone", "owner")
        ticket = (await remote.post("/ticket", headers={
            "authorization": f"Bearer {credential}"})).json()["ticket"]
        async with remote.daemon.client() as owner:
            await owner.revoke_device("phone")
        await remote.pair("phone", "read")
        assert await remote.refused_status(f"{remote.url}?ticket={ticket}") == 401


async def test_a_request_with_a_bare_line_feed_writes_no_line_of_its_own_in_the_log(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    async with open_remote(tmp_path) as remote:
        stream = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", int(remote.base.rsplit(":", 1)[1]), ssl_context=remote.context)
        await stream.send_all(b"POST /pair HTTP/1.1\r\nHost: x\r\n"
                              b"Origin: https://a\nforged: revoked device phone\r\n\r\n")
        with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
            while await stream.receive_some():  # until the daemon drops it
                pass
    assert not [line for line in capfd.readouterr().err.splitlines()
                if line.startswith("forged: revoked device phone")]
