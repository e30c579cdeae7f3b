"""The direct ``bash`` command and ``abort_bash``."""

from __future__ import annotations

from pathlib import Path

import trio

from forged._process import live_group_members
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall

from .harness import open_client


async def test_bash_streams_then_answers_and_enters_the_context(tmp_path: Path) -> None:
    script = "printf 'one\\n'; printf '\\033[31mred\\033[0m\\r\\n'; printf 'é' | head -c 1; " \
             "printf '\\251\\n'; exit 3"
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="seen")])]) as client:
        start = len(client.output)
        response = await client.request({"id": "b1", "type": "bash", "command": script})
        updates = [e for e in client.output[start:] if e["type"] == "bash_execution_update"]
        messages = (await client.request({"type": "get_messages"}))["data"]["messages"]
        await client.send_raw(b'{"type":"bash","command":"echo plain"}\n')  # no id
        quiet = await client.wait_for(lambda e: e.get("command") == "bash" and "id" not in e)
        await client.prompt_and_settle("what did it print?")
        body = client.server.requests[0].body
    assert response["data"] == {"output": "one\nred\né\n", "exitCode": 3, "cancelled": False,
                                "truncated": False}
    assert all(u["id"] == "b1" for u in updates)
    assert "".join(u["delta"] for u in updates) == "one\nred\né\n"  # never a split character
    assert client.output.index(response) > client.output.index(updates[-1])
    assert messages[0] == {"role": "bashExecution", "command": script,
                           "output": "one\nred\né\n", "exitCode": 3, "cancelled": False,
                           "truncated": False, "fullOutputPath": None,
                           "timestamp": messages[0]["timestamp"]}
    assert len(messages) == 1  # once: not again when the context is first read back
    assert quiet["data"]["output"] == "plain\n"
    assert "id" not in client.events("bash_execution_update")[-1]
    assert sum("Ran `" in block.get("text", "") for message in body["messages"]
               for block in message["content"]) == 2  # the two commands, each once
    first = body["messages"][0]["content"][0]["text"]
    assert first.startswith(f"Ran `{script}`\n```\none\nred\né\n\n```")
    assert first.endswith("Command exited with code 3")


async def test_an_escape_sequence_split_across_chunks_never_shows(tmp_path: Path) -> None:
    """The streamed deltas are plain text even when a colour code arrives in two reads (and
    one never finished is dropped)."""
    script = ("printf 'a\\033[3'; sleep 0.3; printf '1mred\\033]0;title'; sleep 0.3; "
              "printf '\\007 b\\n\\033['")
    async with open_client(tmp_path) as client:
        response = await client.request({"id": "b", "type": "bash", "command": script})
        updates = [e["delta"] for e in client.events("bash_execution_update")]
    assert len(updates) >= 2  # it did arrive in pieces
    assert "".join(updates) == "ared b\n"
    assert response["data"]["output"] == "ared b\n"


async def test_abort_bash_kills_the_command(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        bash_id = await client.send({"type": "bash", "command": "echo $$; sleep 60"})
        update = await client.wait_for(lambda e: e.get("type") == "bash_execution_update")
        busy = await client.request({"type": "bash", "command": "true"})
        with trio.fail_after(5):
            stopped = await client.request({"type": "abort_bash"})
            response = await client.response(bash_id)
    assert busy["success"] is False and busy["error"] == "A bash command is already running"
    assert stopped["success"] is True
    assert response["data"]["cancelled"] is True and "exitCode" not in response["data"]
    assert live_group_members(int(update["delta"])) == []


async def test_long_output_keeps_the_tail_and_the_whole_in_a_file(tmp_path: Path) -> None:
    async with open_client(tmp_path) as client:
        response = await client.request({"type": "bash", "command": "seq 1 100000"})
        streamed = "".join(e["delta"] for e in client.events("bash_execution_update"))
        full = Path(response["data"]["fullOutputPath"])  # kept while the session lives
        kept, mode = full.read_text(), full.stat().st_mode
    data = response["data"]
    assert data["truncated"] is True
    lines = data["output"].splitlines()
    assert len(lines) <= 2000 and lines[-1] == "100000"
    assert kept == streamed == "".join(f"{n}\n" for n in range(1, 100001))
    assert mode & 0o777 == 0o600


async def test_bash_during_a_run_is_recorded_when_it_settles(tmp_path: Path) -> None:
    # The reply waits (10 minutes) after its first word: the run lasts until it is aborted.
    waiting = Reply(content=[ScriptText(text="slowly "),
                             ScriptText(text="never", delay_ms=600_000)])
    async with open_client(tmp_path, [waiting]) as client:
        await client.request({"type": "prompt", "message": "go"})
        response = await client.request({"type": "bash", "command": "echo beside"})
        during = (await client.request({"type": "get_messages"}))["data"]["messages"]
        await client.request({"type": "abort"})
        await client.settled()
        after = (await client.request({"type": "get_messages"}))["data"]["messages"]
    assert response["data"]["output"] == "beside\n"
    assert "bashExecution" not in [m["role"] for m in during]
    assert [m["role"] for m in after] == ["user", "assistant", "bashExecution"]


async def test_full_output_files_go_with_their_session(tmp_path: Path) -> None:
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={"command": "seq 100000"})]),
               Reply(content=[ScriptText(text="counted")])]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("count")
        direct = await client.request({"type": "bash", "command": "seq 200000"})
        kept = [Path(client.events("tool_execution_end")[0]["result"]["details"][
                    "fullOutputPath"]), Path(direct["data"]["fullOutputPath"])]
        assert all(path.exists() for path in kept)  # while the session lives, to be read
    assert not any(path.exists() for path in kept)
    assert not kept[0].parent.exists()  # the session's own folder went too
