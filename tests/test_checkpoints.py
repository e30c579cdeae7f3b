"""Checkpoints of the workspace's files, with real files, the real git and real processes:
what a run changes, bash included, comes back byte for byte, and nothing else is touched."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from forged import _codec
from forged._checkpoints import Shadow
from forged._providers.scripted import Reply

from .harness import Client, Event, open_client
from .test_process import BIN, child_env, running, spawn

BINARY = bytes(range(256)) * 4


def scripted(*replies: dict[str, Any]) -> list[Reply]:
    return [_codec.structure(reply, Reply) for reply in replies]


def bash(command: str) -> dict[str, Any]:
    return {"content": [{"type": "toolCall", "name": "bash", "arguments": {"command": command}}]}


def said(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def snapshot(folder: Path) -> dict[str, tuple[str, int, str]]:
    """Every path under `folder`: its kind, its mode bits and its bytes' hash (a link's
    target)."""
    found: dict[str, tuple[str, int, str]] = {}
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(root) / name
            info = path.lstat()
            relative = str(path.relative_to(folder))
            if stat.S_ISLNK(info.st_mode):
                found[relative] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[relative] = ("dir", 0, "")
            else:
                found[relative] = ("file", info.st_mode & 0o111,
                                   hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def make_project(project: Path) -> None:
    (project / "src").mkdir(parents=True, exist_ok=True)
    (project / "src" / "main.py").write_text("print('hello')\n")
    (project / "gone.txt").write_text("to be removed\n")
    (project / "old-name.txt").write_text("renamed\n")
    (project / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (project / "image.bin").write_bytes(BINARY)
    (project / "notes.md").write_text("alpha\nbeta\n")
    (project / ".gitignore").write_text("build/\n*.log\n")
    (project / "build").mkdir(exist_ok=True)
    (project / "build" / "out.o").write_bytes(b"\x7fELF object")
    (project / "debug.log").write_text("log line\n")


RUN = ("rm gone.txt && mv old-name.txt new-name.txt && chmod +x notes.md && "
       "printf '' > empty.txt && head -c 300 /dev/urandom > noise.bin && "
       "ln -s src/main.py link.py && mkdir -p deep/er/folder && echo nested > "
       "deep/er/folder/file.txt && echo more >> image.bin && echo new log >> debug.log")
EDIT = {"content": [{"type": "toolCall", "name": "edit", "arguments": {
    "path": "src/main.py", "oldText": "hello", "newText": "goodbye"}}]}


async def request(client: Client, kind: str, **fields: Any) -> Event:
    answer = await client.request({"type": kind, **fields})
    assert answer["success"], answer
    return answer


async def checkpoints(client: Client) -> list[dict[str, Any]]:
    return list((await request(client, "get_checkpoints"))["data"]["checkpoints"])


async def test_a_restore_brings_back_what_a_run_changed_bash_included(tmp_path: Path) -> None:
    project = tmp_path / "project"
    make_project(project)
    before = snapshot(project)
    async with open_client(tmp_path, scripted(bash(RUN), EDIT, said("Done."))) as client:
        await client.prompt_and_settle("Tidy up")
        after = snapshot(project)
        listed = await checkpoints(client)
        assert [item["kind"] for item in listed] == ["before", "after"]
        assert listed[0]["prompt"] == "Tidy up"
        changed = {item["path"]: item["status"] for item in listed[1]["files"]}
        assert changed == {"gone.txt": "D", "old-name.txt": "D", "new-name.txt": "A",
                           "notes.md": "M", "empty.txt": "A", "noise.bin": "A",
                           "link.py": "A", "deep/er/folder/file.txt": "A", "image.bin": "M",
                           "src/main.py": "M"}
        diff = (await request(client, "get_checkpoint_diff",
                              entryId=listed[0]["entryId"]))["data"]
        assert "-print('hello')" in diff["diff"] and "+print('goodbye')" in diff["diff"]
        assert "Binary files" in diff["diff"] and "\x00" not in diff["diff"]
        restored = (await request(client, "restore_checkpoint",
                                  entryId=listed[0]["entryId"]))["data"]
        assert {item["path"] for item in restored["files"]} == set(changed)
        assert snapshot(project) == {**before, "debug.log": after["debug.log"]}
        # The restore was checkpointed first: restoring that checkpoint undoes it.
        await request(client, "restore_checkpoint", entryId=restored["entryId"])
        assert snapshot(project) == after


async def test_drift_is_refused_unless_forced_and_a_dry_run_changes_nothing(
        tmp_path: Path) -> None:
    project = tmp_path / "project"
    make_project(project)
    async with open_client(tmp_path, scripted(bash("echo run > made.txt"),
                                              said("Done."))) as client:
        await client.prompt_and_settle("Make a file")
        first = (await checkpoints(client))[0]["entryId"]
        (project / "notes.md").write_text("the user's own edit\n")  # not the session's
        refused = await client.request({"type": "restore_checkpoint", "entryId": first})
        assert not refused["success"] and "notes.md" in refused["error"]
        dry = (await request(client, "restore_checkpoint", entryId=first, dryRun=True))["data"]
        assert dry["dryRun"] is True and dry["drift"] == [{"path": "notes.md",
                                                           "status": "M"}]
        assert (project / "made.txt").exists()
        await request(client, "restore_checkpoint", entryId=first, force=True)
    assert not (project / "made.txt").exists()
    assert (project / "notes.md").read_text() == "alpha\nbeta\n"


async def test_a_run_that_only_reads_takes_no_checkpoint(tmp_path: Path) -> None:
    project = tmp_path / "project"
    make_project(project)
    read = {"content": [{"type": "toolCall", "name": "read",
                         "arguments": {"path": "notes.md"}}]}
    async with open_client(tmp_path, scripted(read, said("It says alpha."))) as client:
        await client.prompt_and_settle("Read it")
        assert await checkpoints(client) == []
    assert not (tmp_path / "agent" / "checkpoints").exists()


async def test_fork_with_restore_files_and_a_restore_on_the_other_branch(
        tmp_path: Path) -> None:
    """Two runs; a fork from the second prompt takes the files back to before it; back on
    the first branch, a restore of its own checkpoint leaves the fork's file alone."""
    project = tmp_path / "project"
    make_project(project)
    replies = scripted(bash("echo one > one.txt"), said("One."),
                       bash("echo two > two.txt"), said("Two."),
                       bash("echo three > three.txt"), said("Three."))
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("First")
        await client.prompt_and_settle("Second")
        original = (await request(client, "get_state"))["data"]["sessionFile"]
        second = next(m for m in (await request(client, "get_fork_messages"))["data"][
            "messages"] if m["text"] == "Second")
        await request(client, "fork", entryId=second["entryId"], restoreFiles=True)
        assert (project / "one.txt").exists() and not (project / "two.txt").exists()
        await client.prompt_and_settle("Third")
        assert (project / "three.txt").exists()
        forked = (await request(client, "get_state"))["data"]["sessionFile"]
        await request(client, "switch_session", sessionPath=original)
        refused = await client.request({"type": "restore_checkpoint", "entryId": (
            await checkpoints(client))[2]["entryId"], "dryRun": False})
        # The fork's run changed the files since this branch's last checkpoint: drift.
        assert not refused["success"] and "three.txt" in refused["error"]
        await request(client, "restore_checkpoint",
                      entryId=(await checkpoints(client))[-1]["entryId"], force=True)
        assert (project / "two.txt").exists() and not (project / "three.txt").exists()
        await request(client, "switch_session", sessionPath=forked)
        fork_points = await checkpoints(client)
        assert [item["kind"] for item in fork_points][-3:] == ["restore", "before", "after"]


async def test_a_git_project_keeps_its_index_head_stash_and_hooks(tmp_path: Path) -> None:
    project = tmp_path / "project"
    make_project(project)

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True,
                       env={**os.environ, "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x",
                            "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@x"})

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "start")
    (project / "notes.md").write_text("stashed change\n")
    git("stash", "-q")
    (project / "src" / "main.py").write_text("print('staged')\n")
    git("add", "src/main.py")
    (project / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    dot_git = snapshot(project / ".git")
    async with open_client(tmp_path, scripted(bash(RUN), said("Done."))) as client:
        await client.prompt_and_settle("Tidy up")
        first = (await checkpoints(client))[0]["entryId"]
        await request(client, "restore_checkpoint", entryId=first)
    assert snapshot(project / ".git") == dot_git
    assert (project / "src" / "main.py").read_text() == "print('staged')\n"


async def test_a_failed_checkpoint_is_said_and_the_run_goes_on(tmp_path: Path) -> None:
    project = tmp_path / "project"
    make_project(project)
    (tmp_path / "agent").mkdir(exist_ok=True)
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"checkpoints": {"maxFiles": 3}}))
    async with open_client(tmp_path, scripted(bash("echo a > a.txt"), bash("echo b > b.txt"),
                                              said("Done."))) as client:
        await client.prompt_and_settle("Go")
    notices = [event["message"] for event in client.events("extension_ui_request")
               if event["method"] == "notify"]
    assert len(notices) == 1 and "checkpoints.maxFiles" in notices[0]
    assert (project / "a.txt").exists() and (project / "b.txt").exists()
    assert [end["isError"] for end in client.events("tool_execution_end")] == [False, False]


def test_two_sessions_capture_one_workspace_at_once(tmp_path: Path) -> None:
    project = tmp_path / "project"
    make_project(project)
    results: dict[str, str] = {}

    def capture(owner: str) -> None:
        results[owner] = Shadow(tmp_path / "agent", project).capture(owner).commit

    threads = [threading.Thread(target=capture, args=(f"session-{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shadow = Shadow(tmp_path / "agent", project)
    trees = {shadow.tree_of(commit) for commit in results.values()}
    assert len(results) == 4 and len(trees) == 1


async def test_after_kill_9_mid_run_the_work_so_far_can_be_undone(tmp_path: Path) -> None:
    """The checkpoint before a tool call is on disk before the tool starts: a forged killed
    mid-command leaves it, and a new process restores from it (the interrupted run's
    changes count as drift: forged cannot tell them from anyone else's, so force)."""
    project = tmp_path / "project"
    make_project(project)
    before = snapshot(project)
    (tmp_path / "agent").mkdir(exist_ok=True)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [
        bash("rm gone.txt; echo half > half.txt; echo started; sleep 100")]}))
    env = child_env(tmp_path / "agent")
    command = [str(BIN / "forged"), "--mode", "rpc", "--provider", "scripted", "--script",
               str(script)]
    process = await trio.lowlevel.open_process(command, stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, env=env, cwd=project)
    try:
        assert process.stdin is not None and process.stdout is not None
        await process.stdin.send_all(b'{"type": "prompt", "message": "Go"}\n')
        seen = b""
        with trio.fail_after(30):  # the command's own output: it is under way
            while not any(b'"tool_execution_update"' in line and b"started\\n" in line
                          for line in seen.split(b"\n")):
                seen += await process.stdout.receive_some(1 << 16)
    finally:
        process.send_signal(signal.SIGKILL)
        await process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                await stream.aclose()
    (session_file,) = (tmp_path / "agent" / "sessions").rglob("*.jsonl")
    lines = [json.loads(line) for line in session_file.read_text().splitlines()]
    (entry,) = [line for line in lines if line.get("customType") == "forged.checkpoint"]
    script.write_text(json.dumps({"replies": []}))
    commands = b"".join(json.dumps(line).encode() + b"\n" for line in [
        {"id": "1", "type": "restore_checkpoint", "entryId": entry["id"]},
        {"id": "2", "type": "restore_checkpoint", "entryId": entry["id"], "force": True}])
    with trio.fail_after(30):
        done = await trio.run_process([*command, "--session", str(session_file)],
                                      stdin=commands, capture_stdout=True, env=env,
                                      cwd=project, check=False)
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    refused, restored = [a for a in answers if a.get("type") == "response"]
    assert not refused["success"] and "half.txt" in refused["error"]
    assert restored["success"], restored
    assert snapshot(project) == before


@pytest.mark.parametrize("setting", [{"enabled": False}])
async def test_checkpoints_can_be_turned_off(tmp_path: Path, setting: dict[str, Any]) -> None:
    project = tmp_path / "project"
    make_project(project)
    (tmp_path / "agent").mkdir(exist_ok=True)
    (tmp_path / "agent" / "settings.json").write_text(json.dumps({"checkpoints": setting}))
    async with open_client(tmp_path, scripted(bash("echo a > a.txt"), said("Done."))) as client:
        await client.prompt_and_settle("Go")
        assert await checkpoints(client) == []
    assert not (tmp_path / "agent" / "checkpoints").exists()


async def test_a_direct_bash_command_is_checkpointed_and_large_files_are_left_out(
        tmp_path: Path) -> None:
    project = tmp_path / "project"
    make_project(project)
    (tmp_path / "agent").mkdir(exist_ok=True)
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"checkpoints": {"maxFileBytes": 500}}))
    (project / "big.dat").write_bytes(b"x" * 501)
    async with open_client(tmp_path) as client:
        await request(client, "bash", command="rm notes.md && echo grown >> big.dat")
        listed = await checkpoints(client)
        assert [(item["kind"], item.get("prompt")) for item in listed] == [
            ("before", "!rm notes.md && echo grown >> big.dat"), ("after", None)]
        assert listed[0]["skipped"] == ["big.dat", "image.bin"]
        assert listed[1]["files"] == [{"path": "notes.md", "status": "D"}]
        await request(client, "restore_checkpoint", entryId=listed[0]["entryId"])
    assert (project / "notes.md").read_text() == "alpha\nbeta\n"
    assert (project / "big.dat").read_bytes() == b"x" * 501 + b"grown\n"  # not captured


def test_housekeeping_drops_old_captures_and_packs_once_a_day(tmp_path: Path) -> None:
    from forged._checkpoints import due, housekeep

    project = tmp_path / "project"
    make_project(project)
    agent = tmp_path / "agent"
    shadow = Shadow(agent, project)
    kept = shadow.capture("session").commit
    (project / "notes.md").write_text("changed\n")
    shadow.capture("session")
    refs = shadow.git_dir / "refs" / "forged"
    assert len(list(refs.iterdir())) == 2 and due(agent, project)
    assert housekeep(agent, project, keep_days=30) == 0  # none is old: all kept, packed
    assert (shadow.git_dir / "packed-refs").read_text().count("refs/forged/") == 2
    assert list((shadow.git_dir / "objects" / "pack").glob("*.pack"))
    assert not due(agent, project) and housekeep(agent, project, keep_days=-1) == 0
    os.utime(shadow.git_dir / "housekept", (0, 0))  # a day later: everything is old now
    assert housekeep(agent, project, keep_days=-1) == 2
    listed = subprocess.run(["git", "--git-dir", str(shadow.git_dir), "for-each-ref"],
                            capture_output=True, text=True, check=True).stdout
    assert listed == "" and kept not in listed


def test_an_agent_folder_inside_the_workspace_is_never_captured(tmp_path: Path) -> None:
    """A home folder as the workspace holds the agent folder: its checkpoints must not
    capture themselves (git writing objects as it lists them), nor a restore put back old
    sessions, settings or keys. One captured before this rule is dropped at the next."""
    home = tmp_path / "home"
    make_project(home)
    agent = home / ".agent-forge" / "agent"
    (agent / "sessions").mkdir(parents=True)
    (agent / "auth.json").write_text('{"k": 1}')
    (agent / "sessions" / "s.jsonl").write_text("{}\n")
    shadow = Shadow(agent, home)
    first = shadow.capture("one").commit
    (home / "notes.md").write_text("changed\n")
    second = shadow.capture("one").commit

    def listed(commit: str) -> list[str]:
        names = shadow._git("ls-tree", "-r", "--name-only", "-z", commit).split(b"\0")
        return sorted(os.fsdecode(name) for name in names if name)

    assert listed(first) == [".gitignore", "gone.txt", "image.bin", "notes.md",
                             "old-name.txt", "src/main.py", "tool.sh"]
    assert [c.path for c in shadow.changes(first, second)] == ["notes.md"]
    index = shadow.git_dir / "indexes" / "one"  # an index from before: the folder in it
    shadow._git("update-index", "--add", "-z", "--stdin", index=index,
                stdin=b".agent-forge/agent/auth.json\0")
    assert ".agent-forge/agent/auth.json" in listed(
        shadow._git("commit-tree", shadow._git("write-tree", index=index).strip().decode(),
                    "-m", "old").strip().decode())
    assert not [name for name in listed(shadow.capture("one").commit)
                if name.startswith(".agent-forge")]


async def test_a_prompt_right_after_agent_end_is_taken_while_the_checkpoint_closes(
        tmp_path: Path) -> None:
    """A client written before agent_settled waits for agent_end (willRetry false) and
    prompts at once, while forged takes the run's closing checkpoint: the prompt is taken as
    once settled, and runs after that spell's agent_settled."""
    replies = scripted({"content": [{"type": "toolCall", "name": "write", "arguments": {
        "path": "made.txt", "content": "x\n"}}]},
        {"content": [{"type": "text", "text": "Done."}]},
        {"content": [{"type": "text", "text": "Second."}]})
    async with open_client(tmp_path, replies) as client:
        await client.send({"type": "prompt", "message": "Write it", "id": "first"})
        end = await client.wait_for(lambda e: e.get("type") == "agent_end")
        assert end["willRetry"] is False
        second = await client.request({"type": "prompt", "message": "Again", "id": "second"})
        assert second["success"], second
        await client.settled(2)
    after = [e.get("type") for e in client.output[client.output.index(end):]]
    assert after.index("agent_settled") < after.index("agent_start")
    assert after.count("agent_settled") == 2 and after[-1] == "agent_settled"
    assert client.count("agent_start") == 2


@pytest.mark.parametrize(("first", "then"), [
    ("mkdir -p d && echo KEEP > d/x", "rm -rf d && ln -s e d"),
    ("mkdir -p d && echo KEEP > d/x", "rm -rf d && echo file > d"),
    ("mkdir -p d && echo KEEP > d/x", "rm -rf d && ln -s ../outside d"),
    ("echo KEEP > d", "rm d && mkdir d && echo inside > d/x"),
    ("ln -s ../outside d", "rm d && mkdir d && echo inside > d/x"),
    ("mkdir -p d && echo KEEP > d/x", "rm -rf d && mkdir -p d/x && echo deeper > d/x/y"),
], ids=["folder-to-link", "folder-to-file", "folder-to-outside-link", "file-to-folder",
        "link-to-folder", "file-to-folder-inside"])
async def test_a_path_that_changes_kind_is_captured_and_restored_as_it_was(
        tmp_path: Path, first: str, then: str) -> None:
    """What a destructive model does (`rm -rf src && touch src`): the closing checkpoint
    records the new kind, a restore puts back the old one on either side, and nothing is
    ever written through a link (the folder it points to stays as it was)."""
    project = tmp_path / "project"
    make_project(project)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_text("the outside's own\n")
    replies = scripted(bash(first), said("One."), bash(then), said("Two."))
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("First")
        kept = snapshot(project)
        await client.prompt_and_settle("Then")
        changed = snapshot(project)
        assert not [event for event in client.events("extension_ui_request")
                    if event.get("method") == "notify"]
        listed = await checkpoints(client)
        assert [item["kind"] for item in listed] == ["before", "after", "before", "after"]
        await request(client, "restore_checkpoint", entryId=listed[2]["entryId"])
        assert snapshot(project) == kept
        assert snapshot(outside) == {"x": ("file", 0, hashlib.sha256(
            b"the outside's own\n").hexdigest())}
        restored = (await checkpoints(client))[-1]
        await request(client, "restore_checkpoint", entryId=restored["entryId"])
        assert snapshot(project) == changed
        await request(client, "restore_checkpoint", entryId=listed[0]["entryId"])
    assert "d" not in snapshot(project) and snapshot(outside)["x"][0] == "file"


def test_files_of_a_nested_repository_are_captured_and_restored(tmp_path: Path) -> None:
    """A cloned dependency with a `.git` of its own: git alone records it as one gitlink and
    none of its files; a capture holds them (its own ignores kept, its git folder left out),
    and a restore after `rm -rf vendor` brings them back."""
    project = tmp_path / "project"
    make_project(project)
    lib = project / "vendor" / "lib"
    (lib / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(lib)], check=True)
    (lib / "src" / "code.c").write_text("int main;\n")
    (lib / ".gitignore").write_text("*.o\n")
    (lib / "src" / "code.o").write_bytes(b"object")
    inner = lib / "plugins" / "inner"
    inner.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(inner)], check=True)
    (inner / "p.txt").write_text("plugin\n")
    shadow = Shadow(tmp_path / "agent", project)
    first = shadow.capture("session")
    names = shadow._git("ls-tree", "-r", "--name-only", "-z", first.commit).split(b"\0")
    assert {os.fsdecode(n) for n in names if n.startswith(b"vendor")} == {
        "vendor/lib/.gitignore", "vendor/lib/src/code.c", "vendor/lib/plugins/inner/p.txt"}
    (lib / "src" / "code.c").write_text("int main(void);\n")
    (inner / "new.txt").write_text("new\n")
    second = shadow.capture("session")
    assert {(c.status, c.path) for c in shadow.changes(first.commit, second.commit)} == {
        ("M", "vendor/lib/src/code.c"), ("A", "vendor/lib/plugins/inner/new.txt")}
    subprocess.run(["rm", "-rf", str(project / "vendor")], check=True)
    now = shadow.capture("session")
    shadow.restore(first.commit, now.commit)
    assert (lib / "src" / "code.c").read_text() == "int main;\n"
    assert (inner / "p.txt").read_text() == "plugin\n" and not (inner / "new.txt").exists()
    assert not (lib / ".git").exists() and not (lib / "src" / "code.o").exists()


def git_children(parent: int) -> list[int]:
    """The git processes whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            name = (entry / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == parent and name == "git":
            found.append(int(entry.name))
    return found


async def test_a_restores_git_ends_with_a_killed_forged(tmp_path: Path) -> None:
    """forged killed while a restore's git writes 4,000 files back: git ends with it, and
    stops writing into the workspace (it used to write them all). Their names fit in a pipe:
    git has them all before forged is killed."""
    project, agent_dir = tmp_path / "project", tmp_path / "agent"
    (project / "m").mkdir(parents=True)
    agent_dir.mkdir()
    for n in range(4_000):
        (project / "m" / str(n)).write_bytes(b"%d\n" % n * 2000)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [bash("rm -rf m"), said("Gone.")]}))
    child = await spawn(["--provider", "scripted", "--script", str(script)], project,
                        child_env(agent_dir))
    with trio.fail_after(60):
        await child.send({"id": "p", "type": "prompt", "message": "go"})
        await child.read_until("agent_settled")
        await child.send({"id": "c", "type": "get_checkpoints"})
        listed = (await child.read_until("response", id="c"))["data"]["checkpoints"]
        await child.send({"id": "r", "type": "restore_checkpoint",
                          "entryId": listed[0]["entryId"]})
        # The checkout is under way once a file is back.
        while not (project / "m").exists() or not any(  # noqa: ASYNC110 (files: no event)
                (project / "m").iterdir()):
            await trio.sleep(0.001)
        writers = git_children(child.process.pid)
        child.process.kill()
        await child.process.wait()
        assert writers
        while any(running(pid) for pid in writers):  # noqa: ASYNC110 (outside this run)
            await trio.sleep(0.01)
    assert len(list((project / "m").iterdir())) < 4_000


def test_the_projects_attributes_do_not_change_what_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `.gitattributes` asking for line-ending conversion or a filter (the model can write
    one): captures keep the bytes as they are, and a restore writes them back unchanged,
    running nothing."""
    project = tmp_path / "project"
    project.mkdir()
    (project / ".gitattributes").write_text("* text eol=crlf filter=run ident\n")
    (project / "unix.txt").write_bytes(b"one\ntwo\n$Id$\n")
    (project / "dos.txt").write_bytes(b"one\r\ntwo\r\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        f"[filter \"run\"]\n\tclean = touch {tmp_path}/ran\n\tsmudge = touch {tmp_path}/ran\n")
    monkeypatch.setenv("HOME", str(home))  # the user's git configuration defines the filter
    shadow = Shadow(tmp_path / "agent", project)
    first = shadow.capture("session")
    (project / "unix.txt").unlink()
    (project / "dos.txt").unlink()
    shadow.restore(first.commit, shadow.capture("session").commit)
    assert (project / "unix.txt").read_bytes() == b"one\ntwo\n$Id$\n"
    assert (project / "dos.txt").read_bytes() == b"one\r\ntwo\r\n"
    assert not (tmp_path / "ran").exists()
