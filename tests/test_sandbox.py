"""The bubblewrap policy, applied by the real bwrap to real commands in real files: what a
confined command can and cannot write, read and reach."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forged._process import open_feeds
from forged._sandbox import DEFAULT_DENY_READ, Policy, problem, run

BWRAP = shutil.which("bwrap")


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """A workspace that is a git checkout with forged's project folder, a home with keys, a
    folder outside both, and the run's temp folder."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=workspace, check=True)
    (workspace / ".git" / "config").write_text("[core]\n")
    (workspace / ".agent-forge").mkdir()
    (workspace / ".agent-forge" / "settings.json").write_text("{}")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("SECRET KEY")
    (home / ".netrc").write_text("SECRET NETRC")
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "link-out").symlink_to(outside)
    temp = tmp_path / "temp"
    temp.mkdir()
    return {"workspace": workspace, "home": home, "outside": outside, "temp": temp}


def confined(policy: Policy, script: str) -> subprocess.CompletedProcess[str]:
    assert BWRAP is not None, "bubblewrap is installed by .ci/run; install it to run these"
    return run(policy.wrap(BWRAP, ["sh", "-c", script]), capture_output=True, text=True,
               timeout=30)


def policy_for(places: dict[str, Path], **changes: object) -> Policy:
    home = places["home"]
    deny = tuple(Path(p.replace("~", str(home), 1)) for p in DEFAULT_DENY_READ)
    return Policy(workspace=places["workspace"], temp=places["temp"],
                  deny_read=(*deny, home / ".netrc"), **changes)  # type: ignore[arg-type]


def test_the_sandbox_works_on_this_machine() -> None:
    assert problem() is None


def test_a_missing_bwrap_is_said_with_what_to_install() -> None:
    said = problem("/nowhere/bwrap")
    assert said is not None and "could not be run" in said
    old = os.environ["PATH"]
    os.environ["PATH"] = "/nowhere"
    try:
        said = problem()
    finally:
        os.environ["PATH"] = old
    assert said is not None and "install the bubblewrap package" in said


def test_a_confined_command_writes_the_workspace_and_temp_only(
        places: dict[str, Path]) -> None:
    ws, outside = places["workspace"], places["outside"]
    done = confined(policy_for(places), f"""
        echo made > new.txt && mkdir -p deep/er && echo ok > deep/er/f
        echo t > "$TMPDIR/t"
        echo x > {places['home']}/x; echo x > /etc/forged-sandbox-x; echo x > link-out/x
        echo x > {outside}/y
        echo hook > .git/hooks/pre-commit; echo '[x]' >> .git/config
        echo '{{"trusted":true}}' > .agent-forge/settings.json
        echo obj > .git/objects/o
        true""")
    assert done.returncode == 0, done.stderr
    assert (ws / "new.txt").read_text() == "made\n" and (ws / "deep/er/f").exists()
    assert (places["temp"] / "t").exists() and (ws / ".git/objects/o").exists()
    assert not (places["home"] / "x").exists()
    assert not Path("/etc/forged-sandbox-x").exists()
    assert list(outside.iterdir()) == []  # neither directly nor through the symbolic link
    assert not (ws / ".git/hooks/pre-commit").exists()
    assert (ws / ".git/config").read_text() == "[core]\n"
    assert (ws / ".agent-forge/settings.json").read_text() == "{}"
    assert done.stderr.count("Read-only file system") == 7


def test_read_only_writes_nothing_but_temp(places: dict[str, Path]) -> None:
    done = confined(policy_for(places, write_workspace=False),
                    'echo x > made.txt; echo t > "$TMPDIR/t"; true')
    assert not (places["workspace"] / "made.txt").exists()
    assert (places["temp"] / "t").exists()
    assert "Read-only file system" in done.stderr


def test_deny_read_paths_are_hidden(places: dict[str, Path]) -> None:
    home = places["home"]
    done = confined(policy_for(places),
                    f"ls -A {home}/.ssh; cat {home}/.ssh/id_ed25519 {home}/.netrc; "
                    f"echo x > {home}/.ssh/planted; true")
    assert "SECRET" not in done.stdout
    assert "No such file" in done.stderr and "Read-only file system" in done.stderr
    assert sorted(p.name for p in (home / ".ssh").iterdir()) == ["id_ed25519"]


@pytest.mark.parametrize("network", [False, True])
def test_the_hosts_loopback_is_reached_only_with_the_network_on(
        places: dict[str, Path], network: bool) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        done = confined(policy_for(places, network=network), f"""exec {sys.executable} -c '
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
    print("reached")
except OSError as exc:
    print("refused", exc)'""")
    assert done.stdout.startswith("reached" if network else "refused"), done.stderr


def test_killing_bwrap_ends_what_the_command_forked(places: dict[str, Path]) -> None:
    """The confined command's child holds the pipe bwrap's output goes to: the pipe ends
    only when the last process holding it has gone."""
    assert BWRAP is not None
    name = f"fsb{os.getpid()}"[:15]  # a process name of its own: a copy of sleep
    shutil.copy(shutil.which("sleep") or "/bin/sleep", places["temp"] / name)
    argv, fds = open_feeds(policy_for(places).wrap(
        BWRAP, ["sh", "-c", f'"$TMPDIR/{name}" 60 & echo started; wait']))
    process = subprocess.Popen(argv, pass_fds=fds, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    for fd in fds:
        os.close(fd)
    assert process.stdout is not None
    try:
        assert process.stdout.readline() == b"started\n"
        deadline = time.monotonic() + 10  # forked before "started", run soon after
        while subprocess.run(["pgrep", "-x", name], check=False).returncode != 0:
            assert time.monotonic() < deadline, f"{name} never ran"
            time.sleep(0.001)
    finally:
        process.kill()
        process.wait()
    ended, _, _ = select.select([process.stdout], [], [], 20)
    assert ended and process.stdout.read() == b"", "a confined process outlived bubblewrap"
    assert subprocess.run(["pgrep", "-x", name], check=False).returncode == 1


@pytest.mark.parametrize("path", ["/usr/local/bin:/usr/bin:/bin", "/nowhere"])
def test_config_show_says_whether_the_sandbox_works_here(tmp_path: Path, path: str) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "forged", "config", "show", "--json", "--cwd", str(tmp_path)],
        env={**os.environ, "AGENT_FORGE_DIR": str(tmp_path / "agent"), "PATH": path},
        capture_output=True, check=True, text=True).stdout
    rows = {row["key"]: (row["value"], row["source"])
            for row in map(json.loads, shown.splitlines())}
    value, source = rows["sandbox"]
    assert source == "this machine"
    assert rows["command environment"][0] == (
        "all of forged's environment (full-access, no shellEnvironment setting)")
    if path == "/nowhere":
        assert "bubblewrap (bwrap), which is not installed" in value
    else:
        assert value == "works here (bubblewrap, seccomp)"


def test_protected_folders_that_do_not_exist_yet_cannot_be_made(tmp_path: Path) -> None:
    workspace = tmp_path / "fresh"
    (workspace / ".git").mkdir(parents=True)
    temp = tmp_path / "temp"
    temp.mkdir()
    done = confined(Policy(workspace=workspace, temp=temp), """
        mkdir -p .agent-forge; echo '{"trusted":true}' > .agent-forge/settings.json
        mkdir -p .git/hooks; echo hook > .git/hooks/pre-commit
        echo ok > kept; true""")
    assert (workspace / "kept").exists(), done.stderr
    assert list((workspace / ".agent-forge").iterdir()) == []
    assert list((workspace / ".git").iterdir()) == []  # no repository yet: none is made


def test_forgeds_runtime_folder_stays_read_only_inside_a_writable_workspace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder of the daemon's socket and of the code forged's next start runs
    (`forged._codecache`): made before the command, so it cannot make it first either."""
    from forged._tools.guard import forged_folders

    workspace = tmp_path / "home"
    workspace.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(workspace / "run"))
    temp = tmp_path / "temp"
    temp.mkdir()
    done = confined(Policy(workspace=workspace, temp=temp, hidden=forged_folders()), """
        echo planted > run/forged/code-cpython; mv run/forged run/moved
        echo ok > kept; true""")
    assert (workspace / "kept").exists(), done.stderr
    assert (workspace / "run" / "forged").stat().st_mode & 0o777 == 0o700
    assert list((workspace / "run" / "forged").iterdir()) == []


def test_a_kept_folder_cannot_be_moved_away_with_its_parent_and_made_anew(
        places: dict[str, Path], tmp_path: Path) -> None:
    """Renaming a writable parent would take a read-only mount along and leave its place
    free: ``.git`` (holding the hooks and config), and the folders above forged's runtime
    folder when a writable workspace holds it."""
    ws = places["workspace"]
    runtime = ws / "deep" / "run" / "forged"
    runtime.mkdir(parents=True, mode=0o700)
    done = confined(policy_for(places, hidden=(runtime,)), """
        mv .git .git-moved; mkdir -p .git/hooks; echo hook > .git/hooks/pre-commit
        mv deep deep-moved; mv deep/run deep/run-moved
        mkdir -p deep/run/forged; echo planted > deep/run/forged/code
        echo obj > .git/objects/o; echo ok > kept; true""")
    assert (ws / "kept").exists() and (ws / ".git/objects/o").exists(), done.stderr
    assert not (ws / ".git-moved").exists() and not (ws / ".git/hooks/pre-commit").exists()
    assert not (ws / "deep-moved").exists() and not (ws / "deep/run-moved").exists()
    assert list(runtime.iterdir()) == []


def test_an_architecture_with_no_filter_gets_no_sandbox(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: no seccomp filter for the machine, no confined command (there is no
    other machine here to run on, so its name is what changes)."""
    from forged import _seccomp
    from forged._errors import UnknownArchitecture

    with pytest.raises(UnknownArchitecture):
        _seccomp.program("ppc64le")
    _seccomp.program.cache_clear()
    monkeypatch.setattr("platform.machine", lambda: "ppc64le")
    try:
        said = problem()
    finally:
        _seccomp.program.cache_clear()
    assert said is not None and "seccomp filter cannot be built here" in said
    assert "not ppc64le" in said and "nothing runs unconfined" in said
