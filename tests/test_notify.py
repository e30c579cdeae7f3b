"""The daemon's nudges, as a real HTTP receiver on 127.0.0.1 gets them: an ntfy message or a
webhook's JSON, the nudge's text only where a target asked for it, retries that stop, and a
target that never answers holding up nobody else."""

from __future__ import annotations

import calendar
import contextlib
import functools
import itertools
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import h11
import orjson
import pytest
import trio
import trio.testing

from forged import _wire as w
from forged._errors import ConfigError
from forged._notify import NUDGE_EVENTS, Notifier, Nudge, Target, targets_from
from forged._providers.scripted import Reply, ScriptText

from .harness import open_daemon
from .test_daemon import ASKING_PLUGIN
from .test_permissions import escalated, scripted

SECRET = "sk-live-0123"
PERMISSION = Nudge(event="permission", session_id="s-1", session_name=None,
                   folder="/home/ada/proj", summary="a permission request waits for you",
                   text=f"bash: curl -H 'x-api-key: {SECRET}' example.com")
RUN_END = Nudge(event="run_end", session_id="s-2", session_name="café ☕",
                folder="/home/ada/other", summary="the run finished",
                text="All done: the tests pass.")


@attrs.frozen
class Received:
    method: str
    target: str
    """The path and query."""
    headers: dict[str, str]
    body: bytes
    at: float
    """trio.current_time() when the request had come in whole."""

    @property
    def raw(self) -> str:
        return repr(self.headers) + self.body.decode()


class Receiver:
    """A real HTTP server on 127.0.0.1 (h11 over `trio.serve_tcp`). Each request it reads
    goes to `received`; it answers the next of `statuses` (200 once they are used up), or,
    when `silent`, never."""

    def __init__(self, statuses: Sequence[int] = (), *, silent: bool = False) -> None:
        self.statuses = list(statuses)
        self.silent = silent
        self._received_send, self.received = trio.open_memory_channel[Received](math.inf)
        self.url = ""

    async def start(self, nursery: trio.Nursery) -> Receiver:
        listeners: list[trio.SocketListener] = await nursery.start(
            functools.partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        return self

    async def _handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, h11.RemoteProtocolError):
            while True:
                request, body = None, bytearray()
                while not isinstance(event := connection.next_event(), h11.EndOfMessage):
                    if event is h11.NEED_DATA:
                        connection.receive_data(await stream.receive_some())
                    elif isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    else:  # the client closed the connection
                        return
                assert request is not None
                self._received_send.send_nowait(Received(
                    request.method.decode(), request.target.decode(),
                    {name.decode().lower(): value.decode("latin-1")
                     for name, value in request.headers}, bytes(body), trio.current_time()))
                if self.silent:
                    await trio.sleep_forever()
                status = self.statuses.pop(0) if self.statuses else 200
                for answer in (h11.Response(status_code=status,
                                            headers=[("content-length", "0")]),
                               h11.EndOfMessage()):
                    await stream.send_all(connection.send(answer) or b"")
                connection.start_next_cycle()

    async def nothing_more(self) -> None:
        """Nothing comes in a minute (of the mock clock) after what was received."""
        await trio.sleep(60)
        with pytest.raises(trio.WouldBlock):
            self.received.receive_nowait()


async def test_an_ntfy_topic_gets_a_titled_message_and_no_text(nursery: trio.Nursery) -> None:
    receiver = await Receiver().start(nursery)
    notifier = Notifier([Target(url=f"{receiver.url}/forged-ada", kind="ntfy",
                                headers=(("Authorization", "Bearer tk_ntfy"),))])
    await nursery.start(notifier.run)

    notifier.send(PERMISSION)
    got = await receiver.received.receive()
    assert (got.method, got.target) == ("POST", "/forged-ada")
    assert got.body == b"proj: a permission request waits for you"
    assert {name: got.headers[name] for name in ("title", "priority", "tags", "authorization")
            } == {"title": "forged: permission needed", "priority": "high", "tags": "lock",
                  "authorization": "Bearer tk_ntfy"}
    assert SECRET not in got.raw and "curl" not in got.raw

    notifier.send(RUN_END)  # a name beyond Latin-1 goes in the body, in UTF-8
    got = await receiver.received.receive()
    assert got.body.decode() == "café ☕: the run finished"
    assert (got.headers["title"], got.headers["priority"], got.headers["tags"]) == (
        "forged: run finished", "default", "white_check_mark")


async def test_with_include_text_an_ntfy_message_carries_the_text(
        nursery: trio.Nursery) -> None:
    receiver = await Receiver().start(nursery)
    notifier = Notifier([Target(url=f"{receiver.url}/t", kind="ntfy", include_text=True)])
    await nursery.start(notifier.run)

    notifier.send(PERMISSION)
    got = await receiver.received.receive()
    assert got.body.decode() == (f"proj: a permission request waits for you\n\n"
                                 f"bash: curl -H 'x-api-key: {SECRET}' example.com")


async def test_a_webhook_gets_json_and_the_text_only_when_it_asked(
        nursery: trio.Nursery) -> None:
    plain, texted = await Receiver().start(nursery), await Receiver().start(nursery)
    notifier = Notifier([Target(url=f"{plain.url}/hook", kind="webhook"),
                         Target(url=f"{texted.url}/hook", kind="webhook", include_text=True)])
    await nursery.start(notifier.run)
    failed = attrs.evolve(PERMISSION, event="run_error", summary="the run failed",
                          text=f"401 from the provider: key {SECRET} refused")

    before = time.time()
    notifier.send(failed)
    got = await plain.received.receive()
    assert got.headers["content-type"] == "application/json"
    document = orjson.loads(got.body)
    sent_at = calendar.timegm(time.strptime(document.pop("time"), "%Y-%m-%dT%H:%M:%SZ"))
    assert before - 1 <= sent_at <= time.time()
    assert document == {"event": "run_error", "title": "forged: run failed",
                        "message": "proj: the run failed",
                        "session": {"id": "s-1", "name": None, "folder": "/home/ada/proj"}}
    assert SECRET not in got.raw

    document = orjson.loads((await texted.received.receive()).body)
    assert document["text"] == f"401 from the provider: key {SECRET} refused"


async def test_a_target_gets_only_the_events_it_names(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    receiver = await Receiver().start(nursery)
    notifier = Notifier([Target(url=receiver.url, kind="ntfy", events=frozenset({"run_end"}))])
    await nursery.start(notifier.run)

    notifier.send(PERMISSION)
    notifier.send(RUN_END)
    got = await receiver.received.receive()  # one worker, in order: the first that came
    assert got.headers["title"] == "forged: run finished"
    await receiver.nothing_more()


async def test_a_503_is_tried_again_a_second_later_and_once_taken_not_again(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock,
        capsys: pytest.CaptureFixture[str]) -> None:
    receiver = await Receiver([503]).start(nursery)
    notifier = Notifier([Target(url=receiver.url, kind="webhook")])
    await nursery.start(notifier.run)

    notifier.send(PERMISSION)
    first = await receiver.received.receive()
    second = await receiver.received.receive()
    assert second.body == first.body
    assert 1.0 <= second.at - first.at < 1.1
    await receiver.nothing_more()
    assert capsys.readouterr().err == ""


async def test_giving_up_is_one_log_line_without_a_secret_and_a_4xx_is_not_retried(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock,
        capsys: pytest.CaptureFixture[str]) -> None:
    failing = await Receiver([503] * 10).start(nursery)
    refusing = await Receiver([404]).start(nursery)
    port = failing.url.rsplit(":", 1)[1]
    notifier = Notifier([
        Target(url=f"http://ada:pw-hidden@127.0.0.1:{port}/topic?auth=q-hidden", kind="ntfy",
               headers=(("Authorization", "Bearer tk-hidden"),)),
        Target(url=f"{refusing.url}/gone", kind="webhook")])
    await nursery.start(notifier.run)

    notifier.send(PERMISSION)
    times = [(await failing.received.receive()).at for _ in range(3)]
    assert [round(later - earlier) for earlier, later in itertools.pairwise(times)
            ] == [1, 3]
    await failing.nothing_more()
    await refusing.received.receive()
    await refusing.nothing_more()

    lines = capsys.readouterr().err.splitlines()
    assert sorted(lines) == sorted([
        f"forged: notify http://127.0.0.1:{port}/topic: gave up on the permission nudge of "
        "session s-1 after 3 attempts: HTTP 503",
        f"forged: notify {refusing.url}/gone: gave up on the permission nudge of session "
        "s-1: HTTP 404"])
    assert "hidden" not in "".join(lines) and SECRET not in "".join(lines)


async def test_a_target_that_never_answers_holds_up_only_its_own_nudges(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock,
        capsys: pytest.CaptureFixture[str]) -> None:
    silent = await Receiver(silent=True).start(nursery)
    prompt = await Receiver().start(nursery)
    notifier = Notifier([Target(url=silent.url, kind="ntfy"),
                         Target(url=prompt.url, kind="ntfy")], timeout_s=0.5)
    await nursery.start(notifier.run)

    with trio.fail_after(30):  # a hang guard only
        start, started_at = time.perf_counter(), trio.current_time()
        notifier.send(PERMISSION)
        notifier.send(RUN_END)
        assert time.perf_counter() - start < 0.05 and trio.current_time() == started_at
        hanging = await silent.received.receive()
        assert hanging.headers["title"] == "forged: permission needed"
        for title in ("forged: permission needed", "forged: run finished"):
            got = await prompt.received.receive()
            assert got.headers["title"] == title
            assert got.at - started_at < 0.5  # before the silent target's first timeout

        # Three attempts of 0.5 s, 1 s and 3 s apart: then its next nudge.
        attempts = [(await silent.received.receive()).at for _ in range(2)]
        assert [round(at - started_at, 1) for at in attempts] == [1.5, 5.0]
        following = await silent.received.receive()
        assert following.headers["title"] == "forged: run finished"
        assert round(following.at - started_at, 1) == 5.5
    assert capsys.readouterr().err == (
        f"forged: notify {silent.url}: gave up on the permission nudge of session s-1 after "
        "3 attempts: no answer within 0.5 s\n")


async def test_a_full_queue_drops_the_nudge_with_a_log_line_and_send_returns_at_once(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock,
        capsys: pytest.CaptureFixture[str]) -> None:
    silent = await Receiver(silent=True).start(nursery)
    notifier = Notifier([Target(url=silent.url, kind="webhook")], queue=2)
    await nursery.start(notifier.run)
    notifier.send(PERMISSION)
    await silent.received.receive()  # the first is in flight, held

    start = time.perf_counter()
    for _ in range(5):
        notifier.send(RUN_END)
    assert time.perf_counter() - start < 0.05
    assert capsys.readouterr().err.splitlines() == 3 * [
        f"forged: notify {silent.url}: dropped the run_end nudge of session s-2: earlier "
        "ones still wait to be delivered"]


def test_the_targets_of_the_settings() -> None:
    assert targets_from(None) == []
    assert targets_from([
        {"url": "https://ntfy.sh/forged-ada", "kind": "ntfy"},
        {"url": "http://127.0.0.1:9/hook", "kind": "webhook", "events": ["run_end"],
         "includeText": True, "headers": {"Authorization": "Bearer tk_1"}}]) == [
        Target(url="https://ntfy.sh/forged-ada", kind="ntfy", events=frozenset(NUDGE_EVENTS)),
        Target(url="http://127.0.0.1:9/hook", kind="webhook", events=frozenset({"run_end"}),
               include_text=True, headers=(("Authorization", "Bearer tk_1"),))]


GOOD = {"url": "https://ntfy.sh/forged-ada", "kind": "ntfy"}


@pytest.mark.parametrize(("section", "message"), [
    ({"url": "https://ntfy.sh/t"}, "daemon.notify must be a list of targets"),
    (["https://ntfy.sh/t"], "daemon.notify[0]: expected an object with url and kind"),
    ([GOOD, {"kind": "ntfy"}], "daemon.notify[1]: url must be an http or https URL"),
    ([{"url": "ftp://example.com/t", "kind": "ntfy"}],
     "daemon.notify[0]: url must be an http or https URL"),
    ([{"url": "https://example.com:port/t", "kind": "ntfy"}],
     "daemon.notify[0]: url must be an http or https URL"),
    ([GOOD, {"url": "https://ntfy.sh/t?auth=hidden", "kind": "slack"}],
     "daemon.notify[1] (https://ntfy.sh/t): kind must be one of ntfy, webhook"),
    ([{**GOOD, "events": ["run_end", "compaction"]}],
     "daemon.notify[0] (https://ntfy.sh/forged-ada): unknown event 'compaction' (one of "
     "permission, dialog, run_end, run_error)"),
    ([{**GOOD, "events": "run_end"}], "daemon.notify[0] (https://ntfy.sh/forged-ada): events "
     "must be a list of permission, dialog, run_end, run_error"),
    ([{**GOOD, "includeText": "yes"}],
     "daemon.notify[0] (https://ntfy.sh/forged-ada): includeText must be true or false"),
    ([{**GOOD, "include_text": True}], "daemon.notify[0] (https://ntfy.sh/forged-ada): "
     "unknown key 'include_text' (one of url, kind, events, includeText, headers)"),
    ([{**GOOD, "headers": ["Authorization: hidden"]}],
     "daemon.notify[0] (https://ntfy.sh/forged-ada): headers must map header names to strings"),
    ([{**GOOD, "headers": {"Bad Name": "x"}}],
     "daemon.notify[0] (https://ntfy.sh/forged-ada): headers: 'Bad Name' is not a header name"),
    ([{**GOOD, "headers": {"Authorization": "Bearer hidden\r\nX-Evil: 1"}}],
     "daemon.notify[0] (https://ntfy.sh/forged-ada): headers: Authorization's value must be "
     "a string of Latin-1 characters on one line"),
])
def test_an_invalid_target_is_refused_by_its_entry(section: object, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        targets_from(section)
    assert str(refused.value) == message
    assert "hidden" not in message


def test_nudges_load_no_http_client_until_a_target_needs_one() -> None:
    code = "import sys, forged._notify\nprint('httpx' in sys.modules)\n"
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True).stdout.strip()
    assert loaded == "False"


# --- through the daemon ----------------------------------------------------------------------


async def test_the_daemon_nudges_once_per_wait_and_run_and_a_silent_target_delays_nothing(
        tmp_path: Path) -> None:
    """A permission request, a plugin's question, a finished run and a failed run, each
    nudged once with its title; a target that never answers holds up no run; without
    ``includeText`` neither the prompt, the answer, the command nor the error goes out."""
    outside = tmp_path / "outside"
    outside.mkdir()
    replies = [Reply(content=[ScriptText(text="SECRET-ANSWER all done")]),
               Reply(status=400, error_type="invalid_request_error",
                     error_message="SECRET-ERROR bad"),
               *scripted(escalated(f"touch {outside / 'SECRET-CMD'}")),
               Reply(content=[ScriptText(text="the last")])]
    (tmp_path / "asking.py").write_text(ASKING_PLUGIN)
    async with trio.open_nursery() as nursery:
        ntfy = await Receiver().start(nursery)
        hook = await Receiver().start(nursery)
        silent = await Receiver(silent=True).start(nursery)
        (tmp_path / "agent").mkdir()
        (tmp_path / "agent" / "settings.json").write_bytes(orjson.dumps({"daemon": {"notify": [
            {"url": f"{silent.url}/hang", "kind": "webhook"},
            {"url": f"{ntfy.url}/topic", "kind": "ntfy"},
            {"url": f"{hook.url}/hook", "kind": "webhook", "events": ["run_error"],
             "includeText": True}]}}))
        async with (open_daemon(tmp_path, replies, plugins=[tmp_path / "asking.py"]) as daemon,
                    daemon.client() as client):
            await client.new_session()
            session_id = (await client.get_state()).session_id
            with trio.fail_after(5):  # the silent target's first nudge hangs for 10 s
                await client.prompt_and_wait("SECRET-PROMPT hello")
                await client.prompt_and_wait("SECRET-PROMPT again")
                await client.run("set_permission_mode", mode="auto")
                await client.prompt("SECRET-PROMPT touch it")
                asked = (await client.next_event(
                    lambda e: e.type == "extension_ui_request")).event
                assert isinstance(asked, w.ExtensionUiRequest)
                await client.answer_dialog(asked.id, value="Allow once")
                await client.next_event(lambda e: e.type == "agent_settled")
                async with trio.open_nursery() as asking:
                    asking.start_soon(client.prompt, "/ask SECRET-QUESTION")
                    question = (await client.next_event(
                        lambda e: e.type == "extension_ui_request")).event
                    assert isinstance(question, w.ExtensionUiRequest)
                    await client.answer_dialog(question.id, confirmed=True)
                await client.prompt_and_wait("SECRET-PROMPT last")
                got = [await ntfy.received.receive() for _ in range(6)]
                errors = [await hook.received.receive()]
                first_hung = await silent.received.receive()
        assert (outside / "SECRET-CMD").exists()
        with pytest.raises(trio.WouldBlock):  # each nudge was sent when it happened, in
            ntfy.received.receive_nowait()  # order: a second of any came before the last
        nursery.cancel_scope.cancel()
    assert [r.headers["title"] for r in got] == [
        "forged: run finished", "forged: run failed", "forged: permission needed",
        "forged: run finished", "forged: a question waits", "forged: run finished"]
    assert all(r.body.decode().startswith("project: ") for r in got)
    assert first_hung.target == "/hang"
    for received in [*got, first_hung]:
        assert "SECRET" not in received.raw
    error = orjson.loads(errors[0].body)
    assert (error["event"], error["session"]["id"]) == ("run_error", session_id)
    assert "SECRET-ERROR bad" in error["text"]


async def test_a_projects_settings_cannot_point_the_nudges_elsewhere(tmp_path: Path) -> None:
    """A repository's ``.agent-forge/settings.json`` (even of a trusted project) adds no
    target: only the user's own settings send nudges, so a project cannot have a run's text
    sent to its author."""
    replies = [Reply(content=[ScriptText(text="one")]), Reply(content=[ScriptText(text="two")])]
    async with trio.open_nursery() as nursery:
        receiver = await Receiver().start(nursery)
        project = tmp_path / "project"
        (project / ".agent-forge").mkdir(parents=True)
        (project / ".agent-forge" / "settings.json").write_bytes(orjson.dumps({"daemon": {
            "notify": [{"url": f"{receiver.url}/project", "kind": "webhook",
                        "includeText": True}]}}))
        (tmp_path / "agent").mkdir()
        (tmp_path / "agent" / "settings.json").write_bytes(orjson.dumps({
            "trustedProjects": [str(project)],
            "daemon": {"notify": [{"url": f"{receiver.url}/user", "kind": "ntfy"}]}}))
        async with open_daemon(tmp_path, replies) as daemon, daemon.client() as client:
            await client.prompt_and_wait("first")
            first = await receiver.received.receive()
            await client.prompt_and_wait("second")
            second = await receiver.received.receive()
        with pytest.raises(trio.WouldBlock):
            receiver.received.receive_nowait()
        nursery.cancel_scope.cancel()
    assert [first.target, second.target] == ["/user", "/user"]
