"""``forged login`` and ``forged logout``, headless, against local sign-in servers: ChatGPT's
device code flow, Claude's browser flow (the loopback redirect, or the address pasted), and a
plain API key; each saved in auth.json beside what it held."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import trio

from .sign_in_servers import JsonServer
from .test_auth import jwt, write_auth
from .test_process import BIN, child_env


class SignInServer(JsonServer):
    """OpenAI's and Anthropic's sign-in endpoints, as far as forged uses them; the device
    code is pending at the first poll and granted at the second."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, Any]]:
        if path == "/api/accounts/deviceauth/usercode":
            return 200, {"device_auth_id": "dev-1", "user_code": "ABCD-1234", "interval": "0"}
        if path == "/api/accounts/deviceauth/token":
            if self.count(path) == 1:
                return 403, {"error": {"code": "deviceauth_authorization_pending"}}
            return 200, {"authorization_code": "auth-code", "code_verifier": "verifier-1"}
        access = (jwt({"https://api.openai.com/auth": {"chatgpt_account_id": "acct-9"}})
                  if path == "/oauth/token" else "sk-ant-oat-signed-in")
        return 200, {"access_token": access, "refresh_token": "refresh-new",
                     "expires_in": 3600}

    def sent(self) -> list[tuple[str, Any]]:
        """(path, parsed body) of each request: JSON, or a form."""
        return [(path, json.loads(body) if headers["content-type"].startswith(
            "application/json") else parse_qs(body.decode()))
            for _, path, headers, body in self.calls]


@contextmanager
def sign_in_env(tmp_path: Path) -> Iterator[tuple[SignInServer, dict[str, str]]]:
    with SignInServer().running() as server:
        env = {**child_env(tmp_path / "agent"), "FORGED_OAUTH_ORIGINS": json.dumps({
            "https://auth.openai.com": server.origin,
            "https://platform.claude.com": server.origin})}
        yield server, env


def kept(tmp_path: Path) -> Path:
    return write_auth(tmp_path / "agent", {"groq": {"type": "api_key", "key": "gsk-kept"}})


async def test_chatgpt_signs_in_with_a_device_code(tmp_path: Path) -> None:
    path = kept(tmp_path)
    with sign_in_env(tmp_path) as (server, env), trio.fail_after(30):
        done = await trio.run_process([str(BIN / "forged"), "login", "openai-codex"],
                                      capture_stdout=True, capture_stderr=True, env=env,
                                      stdin=b"", check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert b"open https://auth.openai.com/codex/device and enter the code ABCD-1234" in (
        done.stderr)
    assert [called for called, _ in server.sent()] == [
        "/api/accounts/deviceauth/usercode", "/api/accounts/deviceauth/token",
        "/api/accounts/deviceauth/token", "/oauth/token"]
    exchange = server.sent()[-1][1]
    assert exchange["grant_type"] == ["authorization_code"]
    assert exchange["code"] == ["auth-code"] and exchange["code_verifier"] == ["verifier-1"]
    saved = json.loads(path.read_text())
    assert saved["groq"] == {"type": "api_key", "key": "gsk-kept"}
    assert saved["openai-codex"]["accountId"] == "acct-9"
    assert saved["openai-codex"]["refresh"] == "refresh-new"


async def read_address(process: trio.Process) -> str:
    """The sign-in address forged prints on stderr."""
    assert process.stderr is not None
    seen = b""
    while b"/oauth/authorize?" not in seen or not seen.endswith(b"here.\n"):
        data = await process.stderr.receive_some(65536)
        assert data, seen
        seen += data
    return next(word for word in seen.decode().split() if "/oauth/authorize?" in word)


@pytest.mark.parametrize("how", ["redirect", "pasted"])
async def test_claude_signs_in_by_the_browsers_redirect_or_a_pasted_address(
        tmp_path: Path, how: str) -> None:
    path = kept(tmp_path)
    with sign_in_env(tmp_path) as (server, env), trio.fail_after(30):
        process = await trio.lowlevel.open_process(
            [str(BIN / "forged"), "login", "anthropic"], env=env, stdin=-1, stdout=-1,
            stderr=-1)
        query = parse_qs(urlsplit(await read_address(process)).query)
        state, redirect = query["state"][0], query["redirect_uri"][0]
        back = f"{redirect}?code=the-code&state={state}"
        assert process.stdin is not None
        if how == "redirect":
            async with httpx.AsyncClient() as browser:
                page = await browser.get(back.replace("localhost", "127.0.0.1"))
            assert page.status_code == 200 and "Signed in" in page.text
        else:
            await process.stdin.send_all(back.encode() + b"\n")
        assert await process.wait() == 0
    ((where, exchange),) = server.sent()
    assert where == "/v1/oauth/token" and exchange["code"] == "the-code"
    challenge = base64.urlsafe_b64encode(hashlib.sha256(
        exchange["code_verifier"].encode()).digest()).decode().rstrip("=")
    assert query["code_challenge"] == [challenge] and exchange["redirect_uri"] == redirect
    saved = json.loads(path.read_text())
    assert saved["anthropic"]["access"] == "sk-ant-oat-signed-in"
    assert saved["groq"] == {"type": "api_key", "key": "gsk-kept"}


async def test_a_key_is_saved_and_logout_removes_it(tmp_path: Path) -> None:
    path = kept(tmp_path)
    env = child_env(tmp_path / "agent")
    with trio.fail_after(30):
        login = await trio.run_process([str(BIN / "forged"), "login", "mistral"],
                                       stdin=b"mist-key\n", capture_stdout=True,
                                       capture_stderr=True, env=env, check=False)
        assert login.returncode == 0, login.stderr.decode()
        assert json.loads(path.read_text())["mistral"] == {"type": "api_key",
                                                           "key": "mist-key"}
        logout = await trio.run_process([str(BIN / "forged"), "logout", "mistral"],
                                        capture_stdout=True, env=env)
        again = await trio.run_process([str(BIN / "forged"), "logout", "mistral"],
                                       capture_stdout=True, env=env)
    assert logout.stdout == b"Signed out of mistral\n"
    assert again.stdout == b"No sign-in for mistral\n"
    assert json.loads(path.read_text()) == {"groq": {"type": "api_key", "key": "gsk-kept"}}


async def test_an_unknown_provider_is_refused_with_the_nearest_names(tmp_path: Path) -> None:
    """``forged login gorq`` saves nothing for a provider nothing knows, and names the
    nearest; ``--help`` lists every provider, sign-ins first; a provider of models.json takes
    its key."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "models.json").write_text(json.dumps({"providers": {"mine": {
        "baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "apiKey": "MINE_KEY",
        "models": [{"id": "m1"}]}}}))
    env = child_env(tmp_path / "agent")
    with trio.fail_after(30):
        wrong = await trio.run_process([str(BIN / "forged"), "login", "gorq"], stdin=b"k\n",
                                       capture_stdout=True, capture_stderr=True, env=env,
                                       check=False)
        helped = await trio.run_process([str(BIN / "forged"), "login", "--help"],
                                        capture_stdout=True, env=env)
        mine = await trio.run_process([str(BIN / "forged"), "login", "mine"], stdin=b"mk\n",
                                      capture_stdout=True, capture_stderr=True, env=env,
                                      check=False)
    assert wrong.returncode == 2 and b"Signed in" not in wrong.stdout
    assert b"unknown provider 'gorq' (did you mean groq" in wrong.stderr, wrong.stderr
    assert not (tmp_path / "agent" / "auth.json").exists() or "gorq" not in (
        tmp_path / "agent" / "auth.json").read_text()
    listed = helped.stdout.decode()
    assert "anthropic, openai-codex, github-copilot" in listed
    assert all(name in listed for name in ("groq", "mistral", "mine", "openai"))
    assert mine.returncode == 0, mine.stderr.decode()
    saved = json.loads((tmp_path / "agent" / "auth.json").read_text())
    assert saved["mine"] == {"type": "api_key", "key": "mk"}


async def test_a_broken_auth_json_is_one_line_and_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    path = tmp_path / "agent" / "auth.json"
    path.write_text('{"groq": [')
    env = child_env(tmp_path / "agent")
    with trio.fail_after(30):
        runs = [await trio.run_process([str(BIN / "forged"), *args], stdin=b"k\n",
                                       capture_stdout=True, capture_stderr=True, env=env,
                                       check=False)
                for args in (["logout", "groq"], ["login", "groq"])]
    for done in runs:
        said = done.stderr.decode()
        assert done.returncode == 1 and "Traceback" not in said, said
        assert f"could not read {path}" in said and "left as it was" in said
    assert path.read_text() == '{"groq": ['


@pytest.fixture
def full_agent_dir(tmp_path: Path) -> Iterator[Path]:
    """An agent folder on a 16 KiB tmpfs, filled up, holding an auth.json."""
    from .conftest import mounted_tmpfs

    for disk in mounted_tmpfs(tmp_path / "disk", "size=16k"):
        agent = disk / "agent"
        agent.mkdir()
        (agent / "auth.json").write_text('{"groq": {"type": "api_key", "key": "gsk-kept"}}')
        filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(filler, b"x" * 512):
                pass
        except OSError:  # full
            pass
        finally:
            os.close(filler)
        yield agent


async def test_login_on_a_full_disk_says_so_in_one_line(full_agent_dir: Path) -> None:
    auth = full_agent_dir / "auth.json"
    before = auth.read_bytes()
    with trio.fail_after(30):
        login = await trio.run_process([str(BIN / "forged"), "login", "mistral"],
                                       stdin=b"mist-key\n", capture_stdout=True,
                                       capture_stderr=True, env=child_env(full_agent_dir),
                                       check=False)
    said = login.stderr.decode()
    assert login.returncode == 1
    assert said.splitlines()[-1] == (f"forged: login: could not change {auth}: No space left "
                                     "on device; it is left as it was")
    assert "Traceback" not in said and said.count("forged: ") == 1
    assert auth.read_bytes() == before
