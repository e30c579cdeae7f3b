"""Dialogs over the wire: extension_ui_request out, extension_ui_response in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from forged._plugins import PluginAPI, PluginContext, PluginSource

from .harness import Client, Event, open_client


def asking_plugin() -> PluginSource:
    """``/ask <method> [timeout]`` opens one dialog and notifies what it resolved to."""
    def register(api: PluginAPI) -> None:
        async def ask(args: str, ctx: PluginContext) -> None:
            method, _, timeout = args.partition(" ")
            timeout_s = float(timeout) if timeout else None
            result: Any
            if method == "select":
                result = await ctx.ui.select("Allow dangerous command?", ["Allow", "Block"],
                                             timeout_s=timeout_s)
            elif method == "confirm":
                result = await ctx.ui.confirm("Clear session?", "All messages will be lost.",
                                              timeout_s=timeout_s)
            else:
                result = await ctx.ui.input("Enter a value", "type something...",
                                            timeout_s=timeout_s)
            ctx.ui.notify(f"answer: {result!r}")

        api.register_command("ask", ask, description="Ask the user something")
        api.register_command("tell", lambda args, ctx: ctx.ui.notify(args, "warning"))

    return PluginSource(id="asking", register=register, scope="temporary")


async def dialog(client: Client, method: str, start: int = 0) -> Event:
    return await client.wait_for(lambda e: e.get("type") == "extension_ui_request"
                                 and e["method"] == method, start=start)


async def answer_of(client: Client, start: int = 0) -> str:
    event = await client.wait_for(lambda e: e.get("type") == "extension_ui_request"
                                  and e["method"] == "notify"
                                  and e["message"].startswith("answer: "), start=start)
    return str(event["message"]).removeprefix("answer: ")


async def test_each_dialog_method_and_its_answer(tmp_path: Path) -> None:
    async with open_client(tmp_path, plugins=[asking_plugin()]) as client:
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("select", {"value": "Allow"}, "'Allow'"),
            ("confirm", {"confirmed": True}, "True"),
            ("confirm", {"confirmed": False}, "False"),
            ("input", {"value": "typed"}, "'typed'")]
        for method, answer, expected in cases:
            start = len(client.output)
            prompt_id = await client.send({"type": "prompt", "message": f"/ask {method}"})
            request = await dialog(client, method, start)
            await client.send({"type": "extension_ui_response", "id": request["id"],
                               **answer})
            assert await answer_of(client, start) == expected
            response = await client.response(prompt_id)
            assert response["success"] is True
            assert response["data"] == {"disposition": "handled"}
        requests = [e for e in client.events("extension_ui_request") if e["method"] != "notify"]
        notified = await client.request({"type": "prompt", "message": "/tell Careful now"})
    assert [{k: v for k, v in r.items() if k != "id"} for r in requests[:2]] == [
        {"type": "extension_ui_request", "method": "select",
         "title": "Allow dangerous command?", "options": ["Allow", "Block"]},
        {"type": "extension_ui_request", "method": "confirm", "title": "Clear session?",
         "message": "All messages will be lost."}]
    assert {k: v for k, v in requests[3].items() if k != "id"} == {
        "type": "extension_ui_request", "method": "input", "title": "Enter a value",
        "placeholder": "type something..."}
    assert len({r["id"] for r in requests}) == 4  # each dialog has its own id
    assert notified["data"] == {"disposition": "handled"}
    notify = client.events("extension_ui_request")[-1]
    assert {k: v for k, v in notify.items() if k != "id"} == {
        "type": "extension_ui_request", "method": "notify", "message": "Careful now",
        "notifyType": "warning"}


async def test_a_cancelled_dialog_resolves_to_nothing_allowed(tmp_path: Path) -> None:
    async with open_client(tmp_path, plugins=[asking_plugin()]) as client:
        for method, expected in [("confirm", "False"), ("select", "None"), ("input", "None")]:
            start = len(client.output)
            await client.send({"type": "prompt", "message": f"/ask {method}"})
            request = await dialog(client, method, start)
            await client.send({"type": "extension_ui_response", "id": request["id"],
                               "cancelled": True, "confirmed": True, "value": "ignored"})
            assert await answer_of(client, start) == expected


def unanswered_ui_responses(client: Client) -> list[dict[str, Any]]:
    """Responses to ``extension_ui_response``: there must be none, as in the ancestor."""
    return [e for e in client.events("response") if e["command"] == "extension_ui_response"]


async def test_a_dialog_times_out_on_the_agent_side(tmp_path: Path,
                                                    autojump_clock: trio.abc.Clock) -> None:
    async with open_client(tmp_path, plugins=[asking_plugin()]) as client:
        began = trio.current_time()
        await client.send({"type": "prompt", "message": "/ask confirm 5"})
        request = await dialog(client, "confirm")
        assert request["timeout"] == 5000
        assert await answer_of(client) == "False"
        assert trio.current_time() - began >= 5
        await client.send({"type": "extension_ui_response", "id": request["id"],
                           "confirmed": True})
        await client.request({"type": "get_state"})
        assert not unanswered_ui_responses(client)  # ignored, and never answered
        assert client.count("extension_ui_request") == 2  # the request and the notify


async def test_unknown_and_second_responses_change_nothing(tmp_path: Path) -> None:
    async with open_client(tmp_path, plugins=[asking_plugin()]) as client:
        prompt_id = await client.send({"type": "prompt", "message": "/ask select"})
        request = await dialog(client, "select")
        await client.send({"type": "extension_ui_response", "id": "no-such-id",
                           "value": "Allow"})
        await client.request({"type": "get_state"})
        assert not unanswered_ui_responses(client)
        assert all(e.get("id") != prompt_id for e in client.events("response"))  # still open
        await client.send({"type": "extension_ui_response", "id": request["id"],
                           "value": "Block"})
        await client.send({"type": "extension_ui_response", "id": request["id"],
                           "value": "Allow"})
        assert await answer_of(client) == "'Block'"  # the first answer wins
        await client.response(prompt_id)
        state = await client.request({"type": "get_state"})  # and forged goes on
        assert state["success"] is True
    assert [e["message"] for e in client.events("extension_ui_request")
            if e["method"] == "notify"] == ["answer: 'Block'"]


async def test_abort_resolves_an_open_dialog_as_cancelled(tmp_path: Path) -> None:
    async with open_client(tmp_path, plugins=[asking_plugin()]) as client:
        prompt_id = await client.send({"type": "prompt", "message": "/ask confirm"})
        request = await dialog(client, "confirm")
        abort = await client.request({"type": "abort"})
        response = await client.response(prompt_id)
        await client.send({"type": "extension_ui_response", "id": request["id"],
                           "confirmed": True})
        await client.request({"type": "get_state"})
    assert abort["success"] is True and not unanswered_ui_responses(client)
    assert response["data"] == {"disposition": "handled"}  # the command saw False, and ended
    assert [e["message"] for e in client.events("extension_ui_request")
            if e["method"] == "notify"] == ["answer: False"]


async def test_end_of_input_cancels_open_dialogs(tmp_path: Path) -> None:
    async with open_client(tmp_path, plugins=[asking_plugin()]) as client:
        prompt_id = await client.send({"type": "prompt", "message": "/ask confirm"})
        await dialog(client, "confirm")
        await client.close_input()
        assert await answer_of(client) == "False"
        response = await client.response(prompt_id)
        assert response["data"] == {"disposition": "handled"}
        await client.wait_eof()


async def test_a_session_switch_cancels_open_dialogs(tmp_path: Path) -> None:
    async with open_client(tmp_path, plugins=[asking_plugin()]) as client:
        prompt_id = await client.send({"type": "prompt", "message": "/ask select"})
        await dialog(client, "select")
        switched = await client.request({"type": "new_session"})
        assert switched["success"] is True
        assert await answer_of(client) == "None"
        assert (await client.response(prompt_id))["data"] == {"disposition": "handled"}
