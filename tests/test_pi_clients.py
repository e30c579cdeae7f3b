"""Programs written for the ancestor drive forged unchanged: its own `RpcClient` (npm
``@earendil-works/pi-coding-agent``) over ``forged --mode rpc`` and over ``forged connect``.

The client is fetched with ``npm pack`` (one package, no dependencies: the RPC client needs
none) into a cache folder; without node or npm, or with the registry out of reach, the test
skips saying which."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from .test_process import BIN, stop_daemon

PI_PACKAGE = "@earendil-works/pi-coding-agent@1.6.0"
NODE = Path(__file__).parent / "node"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "forged-tests"


def rpc_client() -> Path:
    """The ancestor's ``rpc-client.js``, fetched once."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed to run the ancestor's RpcClient")
    folder = CACHE / PI_PACKAGE.replace("/", "_")
    client = folder / "package" / "dist" / "modes" / "rpc" / "rpc-client.js"
    if not client.exists():
        folder.mkdir(parents=True, exist_ok=True)
        packed = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(folder),
                                 PI_PACKAGE], capture_output=True, text=True, timeout=120,
                                check=False)
        if packed.returncode != 0:
            pytest.skip(f"npm pack {PI_PACKAGE} failed: {packed.stderr.strip()[-300:]}")
        with tarfile.open(folder / packed.stdout.strip().splitlines()[-1]) as archive:
            members = [m for m in archive.getmembers()
                       if m.name.startswith("package/dist/modes/rpc/")]
            archive.extractall(folder, members=members, filter="data")
    return client


@pytest.mark.parametrize("how", ["rpc", "connect"])
def test_the_ancestors_rpc_client_drives_forged(tmp_path: Path, how: str) -> None:
    client = rpc_client()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"api": "anthropic-messages", "replies": [
        {"content": [{"type": "text", "text": "Hello from forged"}]}]}))
    project, runtime = tmp_path / "project", tmp_path / "run"
    project.mkdir()
    command = [str(BIN / "forged"), *(["connect"] if how == "connect" else [])]
    env = {**os.environ, "FORGED_COMMAND": json.dumps(command),
           "AGENT_FORGE_DIR": str(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(runtime)}
    try:
        done = subprocess.run(
            ["node", str(NODE / "rpc_client.mjs"), str(client), str(NODE / "forged_shim.mjs"),
             str(project), str(script)], capture_output=True, text=True, env=env,
            timeout=120, check=False)
    finally:
        stop_daemon(runtime)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["model"] == "anthropic-messages" and seen["streaming"] is False
    assert seen["text"] == "Hello from forged"
    assert {"agent_start", "message_update", "agent_end", "agent_settled"} <= set(
        seen["events"])
    assert seen["replyTypes"] == ["agent_end", "agent_settled"]  # promptAndWait waits for it
    assert seen["userMessages"] == 1 and seen["bash"] == "from-bash\n"
    assert seen["levels"][0] == "off" and seen["level"] == "low"
    assert seen["roles"] == ["user", "assistant", "bashExecution"]
