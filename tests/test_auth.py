"""auth.json, shared with the ancestor: saved keys count and are sent, an expired subscription
token is refreshed against a local token endpoint and written back under pi's lock, and a file
pi's own code wrote is read."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from forged._catalogue import catalogue_providers
from forged._models import ModelRegistry
from forged._providers.scripted import Reply, ScriptText

from .harness import open_client
from .sign_in_servers import JsonServer
from .test_pi_clients import CACHE, PI_PACKAGE
from .test_process import child_env

HOUR_MS = 3_600_000


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", *catalogue_providers().values()}:
        monkeypatch.delenv(key, raising=False)


def write_auth(agent: Path, entries: dict[str, Any]) -> Path:
    agent.mkdir(exist_ok=True)
    path = agent / "auth.json"
    path.write_text(json.dumps(entries, indent=2))
    return path


@pytest.mark.parametrize(("entry", "sent"), [
    ({"type": "api_key", "key": "gsk-saved"}, "gsk-saved"),
    ({"type": "api_key", "key": "!printf gsk-%s command"}, "gsk-command"),
    ({"type": "api_key", "key": "gsk-$SUFFIX", "env": {"SUFFIX": "from-env-map"}},
     "gsk-from-env-map"),
])
async def test_a_saved_key_makes_its_provider_available_and_is_sent(
        tmp_path: Path, entry: dict[str, Any], sent: str) -> None:
    write_auth(tmp_path / "agent", {"groq": entry})
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
        available = (await client.request({"type": "get_available_models"}))["data"]
        assert {model["provider"] for model in available["models"]} == {"groq", "scripted"}
        await client.use_redirected("groq", "llama-3.3-70b-versatile", "/v1")
        await client.prompt_and_settle("hello")
    assert client.server.requests[0].headers["authorization"] == f"Bearer {sent}"


def jwt(claims: dict[str, Any]) -> str:
    def part(value: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.signature"


class TokenEndpoint(JsonServer):
    """A local OAuth token endpoint: it answers each refresh with new tokens, counting them;
    `delay_s` holds each answer (two refreshing processes then overlap)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, Any]]:
        time.sleep(self.delay_s)
        count = len(self.calls)
        answer = {"access_token": f"sk-ant-oat-new-{count}", "refresh_token": f"refresh-{count}",
                  "expires_in": 3600}
        if path == "/oauth/token":  # OpenAI's: the account is in the token
            answer["access_token"] = jwt({"https://api.openai.com/auth": {
                "chatgpt_account_id": "account-1"}, "n": count})
        return 200, answer

    @property
    def posts(self) -> list[tuple[str, str, bytes]]:
        """(path, content type, body) of each request."""
        return [(path, headers["content-type"], body) for _, path, headers, body in self.calls]


def expired_anthropic() -> dict[str, Any]:
    return {"type": "oauth", "access": "sk-ant-oat-old", "refresh": "refresh-0",
            "expires": int(time.time() * 1000) - HOUR_MS}


async def test_an_expired_subscription_token_is_refreshed_and_written_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_auth(tmp_path / "agent", {
        "groq": {"type": "api_key", "key": "gsk-kept"}, "anthropic": expired_anthropic()})
    path.chmod(0o600)
    with TokenEndpoint().running() as tokens:
        monkeypatch.setenv("FORGED_OAUTH_ORIGINS", json.dumps(
            {"https://platform.claude.com": tokens.origin}))
        async with open_client(tmp_path, [Reply(content=[ScriptText(text="hi")])]) as client:
            await client.use_redirected("anthropic", "claude-sonnet-4-6")
            await client.prompt_and_settle("hello")
    ((where, kind, body),) = tokens.posts
    assert where == "/v1/oauth/token" and kind == "application/json"
    assert json.loads(body) == {"grant_type": "refresh_token", "refresh_token": "refresh-0",
                                "client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e"}
    headers = client.server.requests[0].headers
    assert headers["authorization"] == "Bearer sk-ant-oat-new-1"
    saved = json.loads(path.read_text())
    assert saved["groq"] == {"type": "api_key", "key": "gsk-kept"}
    assert saved["anthropic"]["access"] == "sk-ant-oat-new-1"
    assert saved["anthropic"]["refresh"] == "refresh-1"
    assert saved["anthropic"]["expires"] > time.time() * 1000 + 50 * 60 * 1000
    assert path.stat().st_mode & 0o777 == 0o600
    assert not Path(str(path) + ".lock").exists()


def test_two_processes_refreshing_at_once_spend_the_refresh_token_once(
        tmp_path: Path) -> None:
    """Two forged processes whose first request finds the ChatGPT token expired: one
    refreshes under the lock, the other waits and takes the new token."""
    agent = tmp_path / "agent"
    path = write_auth(agent, {
        "groq": {"type": "api_key", "key": "gsk-kept"},
        "openai-codex": {"type": "oauth", "access": "old", "refresh": "refresh-0",
                         "expires": int(time.time() * 1000) - HOUR_MS,
                         "accountId": "account-0"},
        "anthropic": expired_anthropic()})
    code = ("import sys, trio\n"
            "from forged._models import ModelRegistry\n"
            "async def main():\n"
            "    registry = ModelRegistry()\n"
            "    model = registry.find('anthropic', 'claude-sonnet-4-6')\n"
            "    await registry.resolve(model)\n"
            "    print(registry.api_key('anthropic'))\n"
            "trio.run(main)\n")
    with TokenEndpoint(delay_s=0.3).running() as tokens:
        env = {**child_env(agent), "FORGED_OAUTH_ORIGINS": json.dumps(
            {"https://platform.claude.com": tokens.origin})}
        processes = [subprocess.Popen([sys.executable, "-c", code],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
                     for _ in range(2)]
        outputs = [process.communicate(timeout=60) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert [out.strip() for out, _ in outputs] == ["sk-ant-oat-new-1"] * 2
    assert len(tokens.calls) == 1
    saved = json.loads(path.read_text())
    assert saved["anthropic"]["access"] == "sk-ant-oat-new-1"
    assert saved["groq"] == {"type": "api_key", "key": "gsk-kept"}
    assert saved["openai-codex"]["refresh"] == "refresh-0"  # untouched


def pi_auth_storage() -> Path:
    """A folder where ``node`` can import the ancestor's own ``AuthStorage`` (its package
    from ``npm pack``, and the two modules it needs from npm), fetched once."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed to run the ancestor's AuthStorage")
    folder = CACHE / "pi-auth-storage"
    module = folder / "package" / "dist" / "core" / "auth-storage.js"
    if not module.exists():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "package.json").write_text('{"private": true}')
        installed = subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "proper-lockfile@4.1.2",
             "cross-spawn@7"], cwd=folder, capture_output=True, text=True, timeout=300,
            check=False)
        packed = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(folder),
                                 PI_PACKAGE], capture_output=True, text=True, timeout=120,
                                check=False)
        if installed.returncode != 0 or packed.returncode != 0:
            pytest.skip("npm could not fetch the ancestor's package: "
                        f"{(installed.stderr + packed.stderr).strip()[-300:]}")
        with tarfile.open(folder / packed.stdout.strip().splitlines()[-1]) as archive:
            archive.extractall(folder, members=[
                m for m in archive.getmembers() if m.name.startswith("package/dist/")
                or m.name == "package/package.json"], filter="data")
    return module


async def node(module_code: str) -> str:
    """Run `module_code` as an ES module; its output."""
    with trio.fail_after(60):
        done = await trio.run_process(["node", "--input-type=module", "-e", module_code],
                                      capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout.decode()


async def test_an_auth_json_written_by_pi_is_read_and_refreshed_for_pi_to_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = pi_auth_storage()
    agent = tmp_path / "agent"
    agent.mkdir()
    path = agent / "auth.json"
    write = (f"import {{ AuthStorage }} from {json.dumps(str(module))};\n"
             f"const storage = AuthStorage.create({json.dumps(str(path))});\n"
             "await storage.modify('groq', async () => ({type: 'api_key', key: 'gsk-pi'}));\n"
             "await storage.modify('anthropic', async () => ({type: 'oauth', "
             "access: 'sk-ant-oat-old', refresh: 'refresh-0', expires: Date.now() - 1000}));\n")
    await node(write)
    monkeypatch.setenv("AGENT_FORGE_DIR", str(agent))
    registry = ModelRegistry()
    assert registry.api_key("groq") == "gsk-pi" and registry.has_auth("anthropic")
    with TokenEndpoint().running() as tokens:
        monkeypatch.setenv("FORGED_OAUTH_ORIGINS", json.dumps(
            {"https://platform.claude.com": tokens.origin}))
        model = registry.find("anthropic", "claude-sonnet-4-6")
        assert model is not None
        await registry.resolve(model)
    assert registry.api_key("anthropic") == "sk-ant-oat-new-1"
    read = (f"import {{ AuthStorage }} from {json.dumps(str(module))};\n"
            f"const storage = AuthStorage.create({json.dumps(str(path))});\n"
            "const a = await storage.read('anthropic'); const g = await storage.read('groq');\n"
            "console.log(JSON.stringify([a.access, a.refresh, g.key]));\n")
    assert json.loads(await node(read)) == ["sk-ant-oat-new-1", "refresh-1", "gsk-pi"]
    assert os.stat(path).st_mode & 0o777 == 0o600


async def test_forged_waits_for_a_change_pi_is_making_and_keeps_it(tmp_path: Path) -> None:
    """pi holds auth.json's lock while it changes an entry; a `forged logout` meanwhile
    waits for the lock, then reads the file again: both changes are in it."""
    module = pi_auth_storage()
    path = write_auth(tmp_path / "agent", {"groq": {"type": "api_key", "key": "gsk-1"},
                                           "mistral": {"type": "api_key", "key": "m-1"}})
    slow_change = (
        f"import {{ AuthStorage }} from {json.dumps(str(module))};\n"
        f"const storage = AuthStorage.create({json.dumps(str(path))});\n"
        "await storage.modify('openrouter', async () => {\n"
        "  console.log('holding the lock');\n"
        "  await new Promise((done) => setTimeout(done, 1500));\n"
        "  return {type: 'api_key', key: 'or-from-pi'};\n"
        "});\n")
    with trio.fail_after(60):
        pi = await trio.lowlevel.open_process(
            ["node", "--input-type=module", "-e", slow_change], stdout=subprocess.PIPE)
        assert pi.stdout is not None
        assert b"holding the lock" in await pi.stdout.receive_some(1024)
        forged = await trio.run_process(
            [str(Path(sys.executable).parent / "forged"), "logout", "groq"],
            capture_stdout=True, env=child_env(tmp_path / "agent"))
        assert await pi.wait() == 0
    assert forged.stdout == b"Signed out of groq\n"
    assert json.loads(path.read_text()) == {
        "mistral": {"type": "api_key", "key": "m-1"},
        "openrouter": {"type": "api_key", "key": "or-from-pi"}}
