"""Telemetry (docs/observability.md), judged at a real OTLP/HTTP collector the test starts
(`tests.otlp`): forged as a process exports its spans and metrics there, parented to the
caller's trace context however the caller gave it, and forwards the context to the model's
API, an MCP server and the commands the model runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from forged._providers.scripted import Reply, ScriptedServer, ScriptText, ScriptToolCall
from forged._telemetry import TelemetryConfig, configured

from .otlp import Collector, Span
from .test_mcp import forged_with, provider_for, stdio_entry
from .test_process import BIN, child_env

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
STATE = "vendor=opaque"
PROMPT = "SECRET-PROMPT: run the two tools"
REPLY = "SECRET-REPLY: both ran"
OUTPUT = "SECRET-OUTPUT"
ERROR = "SECRET-ERROR: Overloaded"
EXAMPLE = Path(__file__).parent.parent / "forged" / "examples" / "fix-greeting.json"


def otel_env(collector: Collector, **more: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50", **more}


def without_otel() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACE"))}


def script(*, fail_first: bool = True) -> list[Reply]:
    """A reply that fails (retried), then two tool calls (a command, an MCP tool), then text."""
    return [*([Reply(status=503, error_type="overloaded_error",
                     error_message=ERROR)] if fail_first else []),
            Reply(content=[
                ScriptToolCall(name="bash", id="call-bash", arguments={
                    "command": f"echo {OUTPUT} TP=$TRACEPARENT TS=$TRACESTATE"}),
                ScriptToolCall(name="mcp__srv__traceparent", id="call-mcp", arguments={})]),
            Reply(content=[ScriptText(text=REPLY)])]


def settings(agent_dir: Path, **telemetry: Any) -> None:
    agent_dir.mkdir(exist_ok=True)
    (agent_dir / "settings.json").write_text(json.dumps({
        "retry": {"baseDelayMs": 1}, **({"telemetry": telemetry} if telemetry else {})}))


def by_id(spans: list[Span]) -> dict[str, Span]:
    return {span.span_id: span for span in spans}


def forged_spans(collector: Collector) -> list[Span]:
    return [span for span in collector.spans if span.scope == "forged"]


def assert_run_tree(collector: Collector, session_id: str, parent: str = CALLER_SPAN) -> Span:
    """The span tree of `script`'s run, under `parent` in the caller's trace: its
    ``invoke_agent`` span, returned."""
    [run] = collector.named("invoke_agent")
    assert (run.trace_id, run.parent_id) == (TRACE_ID, parent)
    chats = [chat for chat in collector.named("chat ") if chat.parent_id == run.span_id]
    assert len(chats) == 3
    failed, *answered = sorted(chats, key=lambda c: "error.type" in c.attributes,
                               reverse=True)
    assert failed.attributes["error.type"] == "ProviderStatusError" and failed.status == 2
    assert all("error.type" not in chat.attributes for chat in answered)
    assert [name for name, _ in run.events] == ["forged.retry"]
    bash, mcp = collector.named("execute_tool bash"), collector.named(
        "execute_tool mcp__srv__traceparent")
    assert len(bash) == len(mcp) == 1 and bash[0].parent_id == mcp[0].parent_id == run.span_id
    assert bash[0].attributes["gen_ai.tool.call.id"] == "call-bash"
    assert mcp[0].attributes["forged.mcp.server"] == "srv"
    assert mcp[0].attributes["gen_ai.tool.type"] == "extension"
    assert bash[0].attributes["forged.permission.mode"] == "full-access"
    assert bash[0].attributes["forged.confined"] is False
    sent = [span for span in collector.spans if span.name.startswith("MCP send tools/call")]
    assert len(sent) == 1 and sent[0].parent_id == mcp[0].span_id
    for span in [*forged_spans(collector), *sent]:  # the MCP SDK's too
        assert span.attributes["gen_ai.conversation.id"] == session_id, span.name
    model = answered[0].attributes
    assert (model["gen_ai.provider.name"], model["gen_ai.request.model"]) == ("local", "m")
    assert model["gen_ai.usage.input_tokens"] == 10 and model["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.response.time_to_first_chunk" in model
    assert run.resource["service.name"] == "forged"
    return run


def exported_text(collector: Collector) -> str:
    """Every value of every span, the MCP SDK's too."""
    return json.dumps([[span.name, span.attributes, span.events, span.status_message]
                       for span in collector.spans])


def assert_forwarded(collector: Collector, provider: ScriptedServer, output: str,
                     mcp_output: str) -> None:
    """The run's context reached the model's API (each request under its chat span), the
    command's environment (under its tool call's span) and the MCP server's ``_meta``."""
    spans = by_id(collector.spans)
    for request in provider.requests:
        _, trace_id, span_id, _ = request.headers["traceparent"].split("-")
        assert spans[span_id].name == "chat m" and spans[span_id].trace_id == trace_id
        if trace_id == TRACE_ID:  # (the compaction's is in a trace of its own)
            assert request.headers.get("tracestate") == STATE
    [bash] = collector.named("execute_tool bash")
    assert f"TP=00-{TRACE_ID}-{bash.span_id}-01 TS={STATE}" in output
    [sent] = [span for span in collector.spans if span.name.startswith("MCP send tools/call")]
    assert f"traceparent=00-{TRACE_ID}-{sent.span_id}-01" in mcp_output
    [connect] = collector.named("mcp connect srv")
    assert f"started under=00-{connect.trace_id}-{connect.span_id}-" in mcp_output


def tool_outputs(events: list[dict[str, Any]]) -> dict[str, str]:
    return {event["toolName"]: event["result"]["content"][0]["text"] for event in events
            if event.get("type") == "tool_execution_end"}


@asynccontextmanager
async def collecting(silent: bool = False) -> AsyncIterator[Collector]:
    collector = Collector(silent=silent)
    async with trio.open_nursery() as nursery:
        await nursery.start(collector.serve)
        yield collector
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("log_content", [False, True])
async def test_a_run_is_one_trace_under_the_rpc_prompts_traceparent(
        tmp_path: Path, log_content: bool) -> None:
    """A prompt's ``traceparent`` field: the run's spans (a failed request and its retry, a
    command, an MCP tool) under it, the context forwarded on every hop, metrics exported, and
    no text of the run exported unless ``logContent``."""
    settings(tmp_path / "agent", logContent=log_content)
    async with collecting() as collector:
        async with forged_with(tmp_path, {"srv": stdio_entry("srv")}, [
                *script(), Reply(content=[ScriptText(text="the summary")])],
                               "--permission-mode", "full-access",
                               env=otel_env(collector)) as (forged, provider):
            session_id = (await forged.call("get_state"))["sessionId"]
            await forged.send({"type": "prompt", "message": PROMPT, "traceparent": CALLER,
                               "tracestate": STATE})
            await forged.read_until("agent_settled")
            outputs = tool_outputs(forged.output)
            await forged.call("compact")
            first = (await forged.call("get_checkpoints"))["checkpoints"][0]
            await forged.call("restore_checkpoint", entryId=first["entryId"], dryRun=True)
        await collector.wait_for(lambda: collector.named("checkpoint restore") and (
            "gen_ai.client.token.usage" in collector.metrics))
    run = assert_run_tree(collector, session_id)
    captures = collector.named("checkpoint capture")
    [bash] = collector.named("execute_tool bash")
    assert [(c.attributes["forged.checkpoint.kind"], c.parent_id) for c in captures] == [
        ("before", bash.span_id), ("after", run.span_id)]  # before the first change, and as
    # the spell ends
    [compaction] = collector.named("compaction")
    assert compaction.attributes["forged.compaction.reason"] == "manual"
    assert len([c for c in collector.named("chat ") if c.parent_id == compaction.span_id]) == 1
    [restore] = collector.named("checkpoint restore")
    assert restore.attributes["forged.checkpoint.entry_id"] == first["entryId"]
    assert_forwarded(collector, provider, outputs["bash"], outputs["mcp__srv__traceparent"])
    text = exported_text(collector)
    secrets = (PROMPT, REPLY, OUTPUT, "SECRET-ERROR")
    assert [secret in text for secret in secrets] == [log_content] * 4
    metrics = collector.metrics
    assert {point["gen_ai.token.type"] for point in metrics["gen_ai.client.token.usage"]} == {
        "input", "output"}
    durations = metrics["gen_ai.client.operation.duration"]
    assert {point.get("error.type") for point in durations} == {None, "ProviderStatusError"}
    assert {p["gen_ai.tool.name"] for p in metrics["forged.tool.duration"]} == {
        "bash", "mcp__srv__traceparent"}
    assert "gen_ai.client.operation.time_to_first_chunk" in metrics


def test_telemetry_is_off_unless_asked_and_the_off_switches_win() -> None:
    assert configured(None, {}) is None
    assert configured({"logContent": True}, {}) is None
    on = configured(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert on == TelemetryConfig()
    assert configured({"enabled": True}, {}) == TelemetryConfig()
    assert configured({"endpoint": "http://c:4318", "logContent": True}, {}) == (
        TelemetryConfig(endpoint="http://c:4318", log_content=True))
    assert configured({"enabled": False}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}) is None
    assert configured({"enabled": True}, {"OTEL_SDK_DISABLED": "true"}) is None
    assert configured(None, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none"}
                      ) == TelemetryConfig(metrics=False)
    assert "not one forged" in str(configured(None, {"OTEL_TRACES_EXPORTER": "zipkin"}))
    assert "http/json" in str(configured({"enabled": True},
                                         {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}))


@pytest.mark.parametrize("mcp", [False, True])
def test_off_imports_nothing_of_opentelemetrys_sdk(tmp_path: Path, mcp: bool) -> None:
    """Off: a real run imports no OpenTelemetry SDK or exporter, and, without an MCP server
    (whose SDK brings the API), nothing of OpenTelemetry at all; on, the SDK is there."""
    agent = tmp_path / "agent"
    agent.mkdir()
    if mcp:
        (agent / "mcp.json").write_text(json.dumps({"mcpServers": {
            "srv": stdio_entry("srv")}}))
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('loaded: ' + ' '.join(sorted(\n"
            "    m for m in sys.modules if m.split('.')[:2] == ['opentelemetry', 'sdk']\n"
            "    or m.startswith('opentelemetry.exporter') or m == 'opentelemetry')) + '\\n'))\n"
            "from forged._entry import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    argv = [sys.executable, "-c", code, "-p", "--provider", "scripted", "--script",
            str(EXAMPLE), "go"]
    env = {**without_otel(), "AGENT_FORGE_DIR": str(agent)}
    off = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True)
    loaded = off.stderr.rsplit("loaded: ", 1)[1].split()
    assert set(loaded) <= ({"opentelemetry"} if mcp else set()), off.stderr
    (agent / "settings.json").write_text('{"telemetry": {"enabled": true}}')
    on = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=True, env={
        **env, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"})
    assert "opentelemetry.sdk.trace" in on.stderr.rsplit("loaded: ", 1)[1].split()


def one_command() -> list[Reply]:
    return [Reply(content=[ScriptToolCall(name="bash", id="call-bash", arguments={
        "command": "echo TP=$TRACEPARENT TS=$TRACESTATE"})]), Reply(content=[ScriptText(
            text=REPLY)])]


@asynccontextmanager
async def spawned(argv: list[str], env: dict[str, str], **pipes: Any
                  ) -> AsyncIterator[trio.Process]:
    """`argv` started; killed at the end if it still runs (a test that failed leaves nothing
    behind)."""
    process = await trio.lowlevel.open_process(argv, env=env, **pipes)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()


async def json_run(agent: Path, project: Path, mode: str, env: dict[str, str]
                   ) -> subprocess.CompletedProcess[bytes]:
    """``forged --mode json PROMPT`` on ``local/m`` in `mode`, ended well."""
    done = await trio.run_process(
        [str(BIN / "forged"), "--mode", "json", "--model", "local/m", "--permission-mode",
         mode, "--cwd", str(project), PROMPT], env={**child_env(agent), **env},
        capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done


async def test_print_mode_runs_under_traceparent_from_its_environment(tmp_path: Path) -> None:
    """``TRACEPARENT``/``TRACESTATE`` in -p's environment: its run under them; a command the
    model runs confined (``auto``) sees its own tool call's context instead."""
    agent, project = tmp_path / "agent", tmp_path / "project"
    settings(agent)
    project.mkdir()
    async with collecting() as collector, provider_for(agent, one_command()) as provider:
        done = await json_run(agent, project, "auto", otel_env(
            collector, TRACEPARENT=CALLER, TRACESTATE=STATE))
        await collector.wait_for(lambda: collector.named("invoke_agent"))
    events = [json.loads(line) for line in done.stdout.splitlines()]
    [run] = collector.named("invoke_agent")
    assert (run.trace_id, run.parent_id) == (TRACE_ID, CALLER_SPAN)
    [bash] = collector.named("execute_tool bash")
    assert bash.parent_id == run.span_id and bash.attributes["forged.confined"] is True
    assert bash.attributes["forged.permission.mode"] == "auto"
    assert f"TP=00-{TRACE_ID}-{bash.span_id}-01 TS={STATE}" in tool_outputs(events)["bash"]
    chats = by_id(collector.named("chat "))
    assert {chats[r.headers["traceparent"].split("-")[2]].parent_id
            for r in provider.requests} == {run.span_id}


async def test_an_acp_prompts_meta_traceparent_parents_its_run(tmp_path: Path) -> None:
    agent, project = tmp_path / "agent", tmp_path / "project"
    settings(agent)
    project.mkdir()
    async with collecting() as collector, provider_for(agent, one_command()):
        async with spawned([str(BIN / "forged"), "--mode", "acp", "--model", "local/m"],
                           {**child_env(agent), **otel_env(collector)}, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as process:
            assert process.stdin is not None and process.stdout is not None
            answers: dict[object, Any] = {}
            buffer = b""

            async def ask(request_id: int, method: str, params: dict[str, Any]) -> Any:
                nonlocal buffer
                assert process.stdin is not None and process.stdout is not None
                await process.stdin.send_all(json.dumps({
                    "jsonrpc": "2.0", "id": request_id, "method": method,
                    "params": params}).encode() + b"\n")
                with trio.fail_after(30):  # a hang guard, not a timing
                    while request_id not in answers:
                        if b"\n" not in buffer:
                            buffer += await process.stdout.receive_some(1 << 16)
                            continue
                        line, buffer = buffer.split(b"\n", 1)
                        message = json.loads(line)
                        if "id" in message and "method" not in message:
                            answers[message["id"]] = message
                return answers[request_id]

            await ask(1, "initialize", {"protocolVersion": 1})
            session = (await ask(2, "session/new", {"cwd": str(project), "mcpServers": []}))[
                "result"]["sessionId"]
            prompted = await ask(3, "session/prompt", {
                "sessionId": session, "prompt": [{"type": "text", "text": PROMPT}],
                "_meta": {"traceparent": CALLER, "tracestate": STATE}})
            assert prompted["result"]["stopReason"] == "end_turn", prompted
            await process.stdin.aclose()
            with trio.fail_after(30):
                await process.wait()
        await collector.wait_for(lambda: collector.named("invoke_agent"))
    [run] = collector.named("invoke_agent")
    assert (run.trace_id, run.parent_id) == (TRACE_ID, CALLER_SPAN)
    assert {span.parent_id for span in collector.named("execute_tool")} == {run.span_id}


async def test_a_websocket_upgrades_traceparent_parents_its_commands_unless_they_bring_one(
        tmp_path: Path) -> None:
    from trio_websocket import open_websocket_url

    from .test_daemon import free_port

    agent, project = tmp_path / "agent", tmp_path / "project"
    settings(agent)
    project.mkdir()
    own = f"00-{TRACE_ID}-{'1' * 16}-01"
    port = free_port()
    async with collecting() as collector, provider_for(
            agent, [*one_command(), Reply(content=[ScriptText(text="again")])]):
        env = {**child_env(agent), **otel_env(collector),
               "XDG_RUNTIME_DIR": str(tmp_path / "run")}
        daemon = await trio.lowlevel.open_process(
            [str(BIN / "forged"), "serve", "--ws", f"127.0.0.1:{port}", "--model", "local/m",
             "--cwd", str(project)], env=env, stderr=subprocess.PIPE)
        try:
            assert daemon.stderr is not None
            seen = b""
            with trio.fail_after(30):
                while b"listening on ws://" not in seen:
                    seen += await daemon.stderr.receive_some(1 << 16)
            token = (tmp_path / "run" / "forged" / "ws-token").read_text().strip()
            async with open_websocket_url(f"ws://127.0.0.1:{port}/", extra_headers=[
                    (b"authorization", f"Bearer {token}".encode()),
                    (b"traceparent", CALLER.encode()), (b"tracestate", STATE.encode())]) as ws:
                for prompt in ({"type": "prompt", "message": PROMPT},
                               {"type": "prompt", "message": "again", "traceparent": own}):
                    await ws.send_message(json.dumps(prompt))
                    with trio.fail_after(30):
                        while json.loads(await ws.get_message()).get("type") != (
                                "agent_settled"):
                            pass
        finally:
            daemon.terminate()
            with trio.fail_after(30):
                await daemon.wait()
        await collector.wait_for(lambda: len(collector.named("invoke_agent")) == 2)
    first, second = sorted(collector.named("invoke_agent"),
                           key=lambda span: span.parent_id != CALLER_SPAN)
    assert (first.trace_id, first.parent_id) == (TRACE_ID, CALLER_SPAN)
    assert second.parent_id == "1" * 16
    [bash] = collector.named("execute_tool bash")
    assert bash.parent_id == first.span_id
    live, attached = collector.metrics["forged.sessions"], collector.metrics["forged.clients"]
    assert live[-1]["value"] == attached[-1]["value"] == 0  # all gone by the exit


async def test_a_collector_that_never_answers_does_not_hold_up_a_run(tmp_path: Path) -> None:
    """Its first export (the first request's span, as the run's command waits) hangs; the run
    goes on to its end meanwhile, and the process still exits."""
    agent, project = tmp_path / "agent", tmp_path / "project"
    settings(agent)
    project.mkdir()
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={"command": f"cat {gate}"})]),
               Reply(content=[ScriptText(text=REPLY)])]
    async with collecting(silent=True) as collector, provider_for(agent, replies), spawned(
            [str(BIN / "forged"), "--mode", "json", "--model", "local/m", "--cwd",
             str(project), PROMPT],
            {**child_env(agent), **otel_env(collector, OTEL_BSP_SCHEDULE_DELAY="1")},
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as process:
        assert process.stdout is not None
        output = b""

        async def read_until(kind: bytes) -> None:
            nonlocal output
            while kind not in output:
                chunk = await process.stdout.receive_some(1 << 16)  # type: ignore[union-attr]
                assert chunk, output
                output += chunk

        with trio.fail_after(30):  # a hang guard, not a timing
            await read_until(b'"tool_execution_start"')
            await collector.wait_for(lambda: collector.requests > 0)  # an export hangs
            await trio.to_thread.run_sync(gate.write_text, "open\n")
            await read_until(b'"agent_settled"')
            assert not collector.spans  # it still hangs: nothing was ever answered
            await process.wait()
    assert process.returncode == 0


def test_grpc_without_its_extra_is_one_line_and_no_telemetry(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    agent.mkdir()
    done = subprocess.run(
        [str(BIN / "forged"), "-p", "--provider", "scripted", "--script", str(EXAMPLE), "go"],
        cwd=tmp_path, capture_output=True, text=True, env={
            **without_otel(), "AGENT_FORGE_DIR": str(agent),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert done.returncode == 0 and "Hello, world" in done.stdout
    assert done.stderr.splitlines() == [
        "forged: telemetry off: OTLP over gRPC needs the grpc extra (pip install "
        "'forged[grpc]'); or export over http/protobuf"]


async def test_a_call_the_user_was_asked_about_says_so(tmp_path: Path) -> None:
    """``ask`` mode with nobody to answer (``--mode json``): the call's span says the user was
    asked and the call not allowed, and that it failed."""
    agent, project = tmp_path / "agent", tmp_path / "project"
    settings(agent)
    project.mkdir()
    async with collecting() as collector, provider_for(agent, one_command()):
        await json_run(agent, project, "ask", otel_env(collector))
        await collector.wait_for(lambda: collector.named("execute_tool bash"))
    [bash] = collector.named("execute_tool bash")
    assert (bash.attributes["forged.approval.asked"], bash.attributes["forged.approval.given"],
            bash.attributes["error.type"]) == (True, False, "tool_error")
    assert "forged.confined" not in bash.attributes  # it never ran


async def test_rpc_bash_and_queued_messages_bring_their_own_context(tmp_path: Path) -> None:
    """``--mode rpc`` under ``TRACEPARENT``: a direct ``bash`` with its own ``traceparent`` runs
    under it (its command told its span), one without runs under the process's; a
    ``follow_up`` with its own context, taken into a run under way, is linked from it."""
    settings(tmp_path / "agent")
    own = f"00-{TRACE_ID}-{'2' * 16}-01"
    queued = f"00-{'3' * 32}-{'4' * 16}-01"
    gate = tmp_path / "gate"
    os.mkfifo(gate)  # the run's command waits on it until the follow_up is queued
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={"command": f"cat {gate}"})]),
               Reply(content=[ScriptText(text="first")]),
               Reply(content=[ScriptText(text="second")])]
    async with collecting() as collector:
        async with forged_with(tmp_path, {}, replies, env=otel_env(
                collector, TRACEPARENT=CALLER)) as (forged, _):
            answers = []
            for extra in ({"traceparent": own}, {}):
                await forged.send({"id": "b", "type": "bash", "command": "echo TP=$TRACEPARENT",
                                   **extra})
                answers.append((await forged.read_until("response", id="b"))["data"])
            mine, theirs = answers
            await forged.send({"type": "prompt", "message": PROMPT})
            await forged.read_until("tool_execution_start")
            await forged.call("follow_up", message="and then", traceparent=queued)
            await trio.to_thread.run_sync(gate.write_text, "open\n")  # (once cat reads it)
            await forged.read_until("agent_settled")
        await collector.wait_for(lambda: len(collector.named("bash")) == 2 and (
            collector.named("invoke_agent")))
    by_parent = {span.parent_id: span for span in collector.named("bash")}
    assert f"TP=00-{TRACE_ID}-{by_parent['2' * 16].span_id}-01" in mine["output"]
    assert f"TP=00-{TRACE_ID}-{by_parent[CALLER_SPAN].span_id}-01" in theirs["output"]
    [run] = collector.named("invoke_agent")
    assert run.parent_id == CALLER_SPAN and run.links == [("3" * 32, "4" * 16)]


def test_what_a_mode_raises_leaves_as_it_was_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Telemetry around a mode's main changes nothing of how it ends: its own exception (not
    a group around it), at once, whatever the SDK is doing (here: refusing its settings)."""
    from forged import _telemetry
    from forged._otel import observed

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "-1")  # the SDK refuses it: telemetry off

    async def fails() -> int:
        raise KeyError("the mode's own")

    async def answers() -> int:
        await _telemetry.ready()
        return 7

    with pytest.raises(KeyError, match="the mode's own"):
        trio.run(observed(fails, TelemetryConfig(), caller=None))
    assert trio.run(observed(answers, TelemetryConfig(), caller=None)) == 7
    assert _telemetry.starting is None and not _telemetry.tracing.enabled
