"""The daemon's page (docs/web.md), used as a person would: headless Chromium, signed in by a
pairing link, against a real daemon on the scripted provider. Every check reads what the page
shows or what happened to the files, never what the page says about itself."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from forged import _codec
from forged._providers.scripted import Reply

from .browser import (
    PHONE,
    Web,
    axe_violations,
    has_playwright,
    in_browser,
    on_trio,
    open_web,
    screenshot,
)
from .test_permissions import call, scripted
from .test_process import BIN, child_env

pytestmark = pytest.mark.skipif(not has_playwright(), reason="no chromium or playwright")

if has_playwright():
    from playwright.sync_api import expect


def said(*texts: str) -> list[Reply]:
    return [_codec.structure({"content": [{"type": "text", "text": text}]}, Reply)
            for text in texts]


def shot(page: Any, tmp_path: Path, name: str) -> None:
    """The pictures in README.md and docs/web.md, made again when FORGED_SCREENSHOTS is
    set (elsewhere they are taken, and kept in the test's folder)."""
    if os.environ.get("FORGED_SCREENSHOTS"):
        screenshot(page, name)
    else:
        page.screenshot(path=str(tmp_path / f"{name}.png"))


async def open_session(web: Web, name: str, mode: str | None = None) -> str:
    """A live session opened by the owner on the socket, named `name` (in permission
    `mode`, when given)."""
    async with web.daemon.client() as owner:
        await owner.new_session()
        await owner.run("set_session_name", name=name)
        if mode is not None:
            await owner.run("set_permission_mode", mode=mode)
        return (await owner.get_state()).session_id


def go_to_session(page: Any, link: str, name: str) -> None:
    """The page signed in by `link`, then the session named `name` opened from the list."""
    page.goto(link)
    page.locator(".session-item", has_text=name).get_by_role("link").click()


def no_serious_violations(page: Any) -> None:
    violations = axe_violations(page)
    assert violations == [], [(v["id"], v["help"], [n["target"] for n in v["nodes"]])
                              for v in violations]


async def test_the_page_lists_sessions_and_a_prompt_streams_into_the_transcript(
        tmp_path: Path) -> None:
    replies = said("**Hello** from `forged`:\n\n- one\n- two")
    async with open_web(tmp_path, replies, empty_unload_s=600) as web:
        await open_session(web, "tidy the parser")
        link = await web.link("laptop", "owner")

        def scenario(page: Any) -> dict[str, Any]:
            page.goto(link)
            item = page.locator(".session-item", has_text="tidy the parser")
            expect(item).to_contain_text("idle")
            expect(item).to_contain_text(str(web.project))
            expect(item).to_contain_text("scripted/")
            shot(page, tmp_path, "sessions-desktop")
            no_serious_violations(page)
            item.get_by_role("link").click()
            page.get_by_role("textbox", name="Prompt").fill("Say hello")
            page.get_by_role("button", name="Send", exact=True).click()
            answer = page.locator(".message.assistant").last
            expect(answer.locator("strong")).to_have_text("Hello")
            expect(answer.locator("code")).to_have_text("forged")
            expect(answer.locator("li")).to_have_text(["one", "two"])
            expect(page.locator(".state-line .state")).to_have_text("idle")
            expect(page.locator(".usage")).to_contain_text("tokens")
            no_serious_violations(page)
            return {"user": page.locator(".message.user").all_inner_texts()}

        seen = await in_browser(tmp_path / "profile", scenario)
    assert seen["user"] == ["Say hello"]
    assert [[block["text"] for block in r.body["messages"][-1]["content"]]
            for r in web.daemon.server.requests] == [["Say hello"]]


async def test_a_permission_request_is_answered_from_the_page_and_the_command_runs(
        tmp_path: Path) -> None:
    made = tmp_path / "project" / "made"
    replies = scripted(call("bash", command="touch made && echo made it"))
    async with open_web(tmp_path, replies, empty_unload_s=600) as web:
        session_id = await open_session(web, "needs you", mode="ask")
        link = await web.link("phone", "approve")

        async def prompt() -> None:
            async with web.daemon.client() as owner:
                await owner.attach(session_id)
                await owner.prompt("Make it")
                await owner.next_event(lambda e: e.type == "extension_ui_request")

        def scenario(page: Any) -> bool:
            page.goto(link)
            on_trio(prompt)  # asked while the page lists the sessions
            item = page.locator(".session-item", has_text="needs you")
            page.get_by_role("button", name="Refresh").click()
            expect(item).to_contain_text("waiting for you")
            item.get_by_role("link").click()
            expect(page.locator(".state-line .state")).to_have_text("waiting for you")
            for option in ("Allow once", "Allow for this session", "Deny"):
                expect(page.get_by_role("button", name=option, exact=True)).to_be_visible()
            no_serious_violations(page)
            made_before = made.exists()
            page.get_by_role("button", name="Allow once").click()
            expect(page.locator(".tool .output")).to_contain_text("made it")
            expect(page.locator(".state-line .state")).to_have_text("idle")
            expect(page.get_by_role("button", name="Allow once")).to_have_count(0)
            trio.from_thread.run_sync(  # an answer waits for no response: none is lost
                functools.partial(web.proxy.cut, stay_down=False))
            expect(page.locator(".banner")).to_have_text("Reconnected.")
            expect(page.get_by_role("alert")).to_have_count(0)
            return made_before

        made_before = await in_browser(tmp_path / "profile", scenario)
    assert not made_before
    assert made.exists()


async def test_a_checkpoints_diff_is_shown_and_a_restore_puts_the_file_back_over_drift(
        tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("old line\n")
    replies = scripted(call("write", path="notes.txt", content="new line\n"))
    async with open_web(tmp_path, replies, empty_unload_s=600) as web:
        await open_session(web, "undo me")
        link = await web.link("laptop", "control")

        def scenario(page: Any) -> dict[str, Any]:
            go_to_session(page, link, "undo me")
            page.get_by_role("textbox", name="Prompt").fill("Rewrite the notes")
            page.get_by_role("button", name="Send", exact=True).click()
            expect(page.locator(".message.assistant").last).to_contain_text("Done.")
            panel = page.get_by_role("region", name="Checkpoints")
            before = panel.locator("li", has_text="Before the run")
            expect(before).to_have_count(1)
            before.get_by_role("button", name="Show diff").click()
            diff = before.locator(".diff")
            expect(diff).to_contain_text("-old line")
            expect(diff).to_contain_text("+new line")
            written = (project / "notes.txt").read_text()
            (project / "notes.txt").write_text("my own edit\n")  # drift: the user's edit
            before.get_by_role("button", name="Restore").click()
            expect(panel.get_by_role("group")).to_contain_text("notes.txt")
            kept = (project / "notes.txt").read_text()
            panel.get_by_role("button", name="Restore anyway").click()
            expect(panel.get_by_role("status")).to_contain_text("Restored 1 file")
            return {"written": written, "kept": kept}

        seen = await in_browser(tmp_path / "profile", scenario)
    assert seen == {"written": "new line\n", "kept": "my own edit\n"}
    assert (project / "notes.txt").read_text() == "old line\n"


async def test_a_move_and_a_fork_from_the_tree_show_the_new_branch(tmp_path: Path) -> None:
    replies = said("First answer", "Second answer", "Other answer")
    async with open_web(tmp_path, replies, empty_unload_s=600) as web:
        await open_session(web, "branches")
        link = await web.link("laptop", "control")

        def scenario(page: Any) -> dict[str, Any]:
            go_to_session(page, link, "branches")
            box = page.get_by_role("textbox", name="Prompt")
            for text, answer in (("one", "First answer"), ("two", "Second answer")):
                box.fill(text)
                page.get_by_role("button", name="Send", exact=True).click()
                expect(page.locator(".message.assistant").last).to_have_text(answer)
            tree = page.get_by_role("region", name="Tree")
            expect(tree.locator(".entry")).to_have_count(4)
            tree.get_by_role("button", name="Move here: First answer").click()
            expect(page.locator(".message")).to_have_count(2)
            box.fill("three")
            page.get_by_role("button", name="Send", exact=True).click()
            expect(page.locator(".message.assistant").last).to_have_text("Other answer")
            branches = tree.locator(".branch")  # after "First answer": "two" and "three"
            expect(branches).to_have_count(2)
            expect(branches.first.locator(".entry").first).to_have_text("You two")
            expect(branches.last.locator(".entry").first).to_have_text("You three")
            branch = tree.locator("li[aria-current=true] > .entry").all_inner_texts()
            before = page.url
            tree.get_by_role("button", name="Fork here: two").click()
            expect(page).not_to_have_url(before)
            expect(tree.locator(".entry")).to_have_count(3)
            return {"branch": branch, "forked": page.locator(".message").all_inner_texts()}

        seen = await in_browser(tmp_path / "profile", scenario)
    assert [re.sub(r"\s+", " ", text).strip() for text in seen["branch"]] == [
        "You one", "Assistant First answer", "You three", "Assistant Other answer"]
    assert [text.strip() for text in seen["forked"]] == ["one", "First answer", "two"]


async def test_a_connection_cut_mid_run_resumes_with_no_gap_and_no_duplicate(
        tmp_path: Path) -> None:
    go = tmp_path / "go"
    replies = scripted(call("bash", command=f"while [ ! -e {go} ]; do sleep 0.02; done; "
                            "echo went on"))
    async with open_web(tmp_path, replies, empty_unload_s=600) as web:
        session_id = await open_session(web, "asleep")
        link = await web.link("phone", "control")

        async def away_while_it_ends() -> None:
            web.proxy.cut(stay_down=True)
            async with web.daemon.client() as owner:
                await owner.attach(session_id)
                go.touch()
                await owner.next_event(lambda e: e.type == "agent_settled")

        def scenario(page: Any) -> dict[str, Any]:
            go_to_session(page, link, "asleep")
            page.get_by_role("textbox", name="Prompt").fill("Wait for it")
            page.get_by_role("button", name="Send", exact=True).click()
            expect(page.locator(".tool .tool-state")).to_have_text("running")
            on_trio(away_while_it_ends)
            expect(page.get_by_role("status").first).to_have_text(
                "Connection lost: reconnecting…")
            web.proxy.down = False
            expect(page.locator(".message.assistant").last).to_contain_text("Done.")
            expect(page.locator(".banner")).to_have_text("Reconnected.")
            return {"messages": page.locator(".message").all_inner_texts(),
                    "output": page.locator(".tool .output").all_inner_texts(),
                    "state": page.locator(".state-line .state").inner_text()}

        seen = await in_browser(tmp_path / "profile", scenario, viewport=PHONE)
    assert [text.splitlines()[0].strip() for text in seen["messages"]] == [
        "Wait for it", "bash", "Done."]
    assert [text.strip() for text in seen["output"]] == ["went on"]
    assert seen["state"] == "idle"
    assert web.proxy.connections >= 2  # the page came back on a connection of its own


async def test_a_read_device_sees_no_prompt_box_and_a_crafted_prompt_is_refused(
        tmp_path: Path) -> None:
    async with open_web(tmp_path, said(), empty_unload_s=600) as web:
        await open_session(web, "watched")
        link = await web.link("tv", "read")

        def scenario(page: Any) -> dict[str, Any]:
            go_to_session(page, link, "watched")
            expect(page.get_by_role("heading", name="Tree")).to_be_visible()
            expect(page.get_by_text("may watch only")).to_be_visible()
            offered = {name: page.get_by_role("button", name=name, exact=True).count()
                       for name in ("Send", "Steer", "Follow up", "Abort", "Rename", "Fork",
                                    "Delete", "New session")}
            crafted = page.evaluate("""async () => {
              const path = localStorage.getItem('forged.ticketPath');
              const {ticket} = await (await fetch(path, {method: 'POST'})).json();
              const ws = new WebSocket(`ws://${location.host}/?ticket=${ticket}`);
              await new Promise((resolve) => { ws.onopen = resolve; });
              const answer = new Promise((resolve) => {
                ws.onmessage = (m) => { const a = JSON.parse(m.data);
                  if (a.id === 'p') resolve(a); };
              });
              ws.send(JSON.stringify({id: 'a', type: 'attach', sessionId: location.hash.slice(4)}));
              ws.send(JSON.stringify({id: 'p', type: 'prompt', message: 'rm -rf ~'}));
              return await answer;
            }""")
            return {"prompt box": page.get_by_role("textbox", name="Prompt").count(),
                    "offered": offered, "crafted": crafted}

        seen = await in_browser(tmp_path / "profile", scenario)
    assert seen["prompt box"] == 0
    assert set(seen["offered"].values()) == {0}
    assert seen["crafted"]["success"] is False
    assert seen["crafted"]["error"].startswith("prompt needs the control role")
    assert web.daemon.server.requests == []


async def test_on_a_phone_nothing_scrolls_sideways_and_nothing_is_inaccessible(
        tmp_path: Path) -> None:
    long_line = "x" * 300
    replies = scripted(call("bash", command=f"echo {long_line}"))
    async with open_web(tmp_path, replies, empty_unload_s=600) as web:
        await open_session(web, "on the train")
        link = await web.link("phone", "owner")

        def wide(page: Any) -> int:
            return int(page.evaluate(
                "document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth"))

        def scenario(page: Any) -> dict[str, Any]:
            page.goto(link)
            expect(page.locator(".session-item")).to_have_count(1)
            list_wide = wide(page)
            shot(page, tmp_path, "sessions-phone")
            no_serious_violations(page)
            page.locator(".session-item").get_by_role("link").click()
            page.get_by_role("textbox", name="Prompt").fill(f"Print {long_line}")
            page.get_by_role("button", name="Send", exact=True).click()
            expect(page.locator(".message.assistant").last).to_contain_text("Done.")
            page.get_by_role("region", name="Checkpoints").scroll_into_view_if_needed()
            session_wide = wide(page)
            page.evaluate("window.scrollTo(0, 0)")
            shot(page, tmp_path, "session-phone")
            no_serious_violations(page)
            page.reload()
            expect(page.get_by_role("heading", name="Tree")).to_be_visible()
            page.keyboard.press("Tab")  # the first stop: past the header to the content
            skip = page.evaluate("document.activeElement.textContent")
            page.keyboard.press("Enter")  # and it stays in the session
            expect(page.locator(":focus")).to_have_count(0)  # (the focus moved to #main)
            expect(page.get_by_role("heading", name="Tree")).to_be_visible()
            return {"list": list_wide, "session": session_wide, "skip": skip}

        seen = await in_browser(tmp_path / "profile", scenario, viewport=PHONE)
    assert seen == {"list": 0, "session": 0, "skip": "Skip to the content"}


async def test_the_page_is_served_from_the_wheels_files_with_its_headers(
        tmp_path: Path) -> None:
    import httpx

    async with open_web(tmp_path) as web, httpx.AsyncClient() as http:
        page = await http.get(web.base + "/")
        script = await http.get(web.base + "/app.js")
        manifest = await http.get(web.base + "/manifest.webmanifest")
        nothing = await http.get(web.base + "/../pyproject.toml")
        head = await http.head(web.base + "/app.css")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self';" in page.headers["content-security-policy"]
    assert "unsafe" not in page.headers["content-security-policy"]  # no inline script runs
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert script.headers["content-type"].startswith("text/javascript")
    assert manifest.json()["start_url"] == "/"
    assert nothing.status_code == 404
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) > 0


async def test_forged_web_signs_this_machines_browser_in_as_the_owner(tmp_path: Path) -> None:
    """``forged web`` prints a one-time owner link to the loopback listener; the link opens
    the page signed in; once that browser is paired, the next gets a name of its own."""
    async with open_web(tmp_path, empty_unload_s=600) as web:
        await open_session(web, "mine")
        env = {**child_env(tmp_path / "agent"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
        opened = tmp_path / "opened"
        browser = tmp_path / "browser"  # what webbrowser starts: it notes its arguments
        browser.write_text(f'#!/bin/sh\necho "$@" >> {opened}\n')
        browser.chmod(0o755)
        env.update(DISPLAY=":99", BROWSER=f"{browser} %s")
        command = [str(BIN / "forged"), "web", "--socket", str(web.daemon.socket_path)]
        first = await trio.run_process(command, capture_stdout=True, capture_stderr=True,
                                       env=env)
        link = first.stdout.decode().strip()
        argv = opened.read_text().split()
        page_file = Path(argv[0].removeprefix("file://"))
        opener = page_file.read_text()

        def scenario(page: Any) -> str:
            page.goto(link)
            expect(page.locator(".session-item", has_text="mine")).to_contain_text("idle")
            return str(page.locator(".who").inner_text())

        who = await in_browser(tmp_path / "profile", scenario)
        second = await trio.run_process(command, capture_stdout=True, capture_stderr=True,
                                        env=env)
        async with web.daemon.client() as owner:
            devices = {device.name: device.role for device in await owner.list_devices()}
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/pair\?open#[A-Z0-9]{10}", link), link
    assert link.rpartition("#")[2] not in opened.read_text()  # no code on a command line
    assert argv[0].startswith("file://") and page_file.stat().st_mode & 0o077 == 0
    assert f'content="0;url={link}"' in opener
    assert "as web (owner)" in first.stderr.decode()
    assert "as web-2 (owner)" in second.stderr.decode()
    assert who == "web · owner"
    assert devices == {"web": "owner"}  # (the second link was never opened)


async def test_rename_and_delete_from_the_page(tmp_path: Path) -> None:
    async with open_web(tmp_path, said("Kept"), empty_unload_s=600) as web:
        await open_session(web, "old name")
        link = await web.link("laptop", "owner")

        def scenario(page: Any) -> list[str]:
            go_to_session(page, link, "old name")
            page.get_by_role("textbox", name="Prompt").fill("Write it down")
            page.get_by_role("button", name="Send", exact=True).click()
            expect(page.locator(".message.assistant").last).to_have_text("Kept")
            page.once("dialog", lambda dialog: dialog.accept("new name"))
            page.get_by_role("button", name="Rename").click()
            expect(page.get_by_role("heading", level=1)).to_have_text("new name")
            page.once("dialog", lambda dialog: dialog.accept())
            page.get_by_role("button", name="Delete").click()
            expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
            expect(page.locator(".session-item")).to_have_count(0)
            return [path.name for path in (tmp_path / "agent" / "sessions").rglob("*.jsonl")]

        left = await in_browser(tmp_path / "profile", scenario)
    assert left == []


async def test_the_page_installs_and_says_so_when_this_browser_cannot_take_pushes(
        tmp_path: Path) -> None:
    """The manifest and the service worker make the page installable (its shell cached);
    "Notify me" asks the browser, and where it cannot subscribe (headless Chromium reaches
    no push service here) the page says why, and nothing is kept."""
    async with open_web(tmp_path, empty_unload_s=600) as web:
        await open_session(web, "pocket")
        link = await web.link("phone", "read")

        def scenario(page: Any) -> dict[str, Any]:
            page.goto(link)
            expect(page.locator(".session-item")).to_have_count(1)
            installed = page.evaluate("""async () => {
              const manifest = await (await fetch(
                document.querySelector('link[rel=manifest]').href)).json();
              const registration = await navigator.serviceWorker.ready;
              const cache = await caches.open('forged-shell-v1');
              const cached = (await cache.keys()).map((r) => new URL(r.url).pathname);
              return {manifest, scope: new URL(registration.scope).pathname, cached};
            }""")
            page.context.grant_permissions(["notifications"])
            page.clock.install()  # the page's own clock, moved on below: no wait of 10 s
            page.get_by_role("button", name="Notify me on this device").click()
            expect(page.get_by_text("Asking this browser's push service")).to_be_visible()
            page.clock.fast_forward(10_000)
            said = page.get_by_role("alert")
            expect(said).to_contain_text("push service")
            no_serious_violations(page)
            return {**installed, "said": said.inner_text()}

        seen = await in_browser(tmp_path / "profile", scenario, viewport=PHONE)
    manifest = seen["manifest"]
    assert (manifest["start_url"], manifest["display"]) == ("/", "standalone")
    assert manifest["icons"][0]["src"] == "/icon.svg"
    assert seen["scope"] == "/"
    assert {"/", "/app.js", "/preact-htm.js", "/app.css"} <= set(seen["cached"])
    assert seen["said"] == ("This browser could not subscribe to its push service: no answer "
                            "in 10 s")
    assert not (tmp_path / "agent" / "web-push.json").exists()


async def test_a_page_away_while_its_session_is_loaded_again_reads_it_whole(
        tmp_path: Path) -> None:
    """The session is unloaded while the page is away and loaded again by another client,
    whose runs take its ``seq`` past what the page had seen: the page notices the new load
    (``loadId``) and reads the transcript whole, rather than skip what it cannot count."""
    async with open_web(tmp_path, said("First", "Second", "Third"),
                        empty_unload_s=600) as web:
        session_id = await open_session(web, "reloaded")
        link = await web.link("laptop", "control")

        async def elsewhere() -> None:
            web.proxy.cut(stay_down=True)
            async with web.daemon.client() as owner:
                answer = await owner.request("unload_session", sessionId=session_id)
                assert answer["success"], answer
                again = await owner.attach(session_id)
                assert again.seq == 0
                await owner.prompt_and_wait("two")
                await owner.prompt_and_wait("three")

        def scenario(page: Any) -> list[str]:
            go_to_session(page, link, "reloaded")
            page.get_by_role("textbox", name="Prompt").fill("one")
            page.get_by_role("button", name="Send", exact=True).click()
            expect(page.locator(".message.assistant").last).to_have_text("First")
            on_trio(elsewhere)
            web.proxy.down = False
            expect(page.locator(".banner")).to_have_text("Reconnected.")
            expect(page.locator(".message")).to_have_count(6)
            return [text.strip() for text in page.locator(".message").all_inner_texts()]

        seen = await in_browser(tmp_path / "profile", scenario)
    assert seen == ["one", "First", "two", "Second", "three", "Third"]


async def test_a_run_is_started_and_approved_with_the_keyboard_alone(tmp_path: Path) -> None:
    """Tab, Enter and Ctrl+Enter: open the session, send the prompt, allow the command."""
    replies = scripted(call("bash", command="echo typed"))
    async with open_web(tmp_path, replies, empty_unload_s=600) as web:
        await open_session(web, "keys", mode="ask")
        link = await web.link("laptop", "control")

        def tab_to(page: Any, name: str) -> None:
            for _ in range(60):
                page.keyboard.press("Tab")
                focused = page.evaluate("""(() => { const e = document.activeElement;
                    return e.getAttribute('aria-label') || e.labels?.[0]?.textContent
                      || e.textContent; })()""")
                if focused.strip() == name:
                    return
            raise AssertionError(f"Tab never reached {name}")

        def scenario(page: Any) -> str:
            page.goto(link)
            expect(page.locator(".session-item")).to_have_count(1)
            tab_to(page, "keys")
            page.keyboard.press("Enter")
            expect(page.get_by_role("heading", name="Tree")).to_be_visible()
            tab_to(page, "Prompt")
            page.keyboard.type("Say it")
            page.keyboard.press("Control+Enter")
            expect(page.get_by_role("button", name="Allow once")).to_be_visible()
            tab_to(page, "Allow once")
            page.keyboard.press("Enter")
            expect(page.locator(".message.assistant").last).to_contain_text("Done.")
            return str(page.locator(".tool .output").inner_text())

        output = await in_browser(tmp_path / "profile", scenario)
    assert output.strip() == "typed"


async def test_the_controls_of_a_run_from_the_page(tmp_path: Path) -> None:
    """A new session in a folder; the thinking level and the permission mode; thinking
    folded and an edit as a diff; steering and a follow-up queued while a tool runs, then
    delivered; a run aborted."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("alpha\n")
    go, never = tmp_path / "go", tmp_path / "never"
    wait = "while [ ! -e {} ]; do sleep 0.02; done; echo waited"
    replies = [_codec.structure(reply, Reply) for reply in [
        {"content": [{"type": "thinking", "thinking": "Plan: swap the word."},
                     {"type": "text", "text": "Editing."},
                     {"type": "toolCall", "name": "edit", "arguments": {
                         "path": "notes.txt", "oldText": "alpha", "newText": "beta"}}]},
        {"content": [{"type": "text", "text": "Edited."}]},
        call("bash", command=wait.format(go)),
        {"content": [{"type": "text", "text": "Steered."}]},
        {"content": [{"type": "text", "text": "Followed."}]},
        call("bash", command=wait.format(never))]]
    async with open_web(tmp_path, replies) as web:
        link = await web.link("laptop", "owner")

        def scenario(page: Any) -> dict[str, Any]:
            page.goto(link)
            page.get_by_label("Folder").fill(str(project))
            page.get_by_role("button", name="New session").click()
            expect(page.get_by_role("heading", name="Tree")).to_be_visible()
            page.get_by_label("Thinking").select_option("high")
            page.get_by_label("Permission mode").select_option("auto")
            expect(page.get_by_label("Thinking")).to_have_value("high")
            box = page.get_by_role("textbox", name="Prompt")
            send = page.get_by_role("button", name="Send", exact=True)
            box.fill("Swap it")
            send.click()
            expect(page.locator(".message.assistant").last).to_have_text("Edited.")
            thinking = page.locator("details.thinking").first
            folded = thinking.get_attribute("open") is None
            diff = page.locator(".tool .diff").first.inner_text()
            expect(page.get_by_role("region", name="Checkpoints").locator("li")).to_have_count(2)
            shot(page, tmp_path, "session-desktop")
            box.fill("Wait for it")
            send.click()
            expect(page.locator(".tool .tool-state").last).to_have_text("running")
            box.fill("steer me")
            page.get_by_role("button", name="Steer").click()
            box.fill("later")
            page.get_by_role("button", name="Follow up").click()
            queue = page.get_by_role("region", name="Queue")
            expect(queue.locator("li")).to_have_count(2)
            queued = queue.locator("li").all_inner_texts()
            page.reload()  # a page opening the session mid-run shows what is queued
            expect(queue.locator("li")).to_have_count(2)
            go.touch()
            expect(page.locator(".message.assistant").last).to_have_text("Followed.")
            box.fill("Wait forever")
            send.click()
            expect(page.locator(".tool .tool-state").last).to_have_text("running")
            page.get_by_role("button", name="Abort").click()
            expect(page.locator(".state-line .state")).to_have_text("idle")
            return {"folded": folded, "diff": diff, "queued": queued,
                    "aborted": page.locator(".message.assistant").last.inner_text()}

        seen = await in_browser(tmp_path / "profile", scenario)
        async with web.daemon.client() as owner:
            [live] = (await owner.list_sessions()).sessions
            await owner.attach(live.session_id)
            state = await owner.get_state()
    assert seen["folded"] and seen["diff"].splitlines() == ["- alpha", "+ beta"]
    assert [" ".join(text.split()) for text in seen["queued"]] == [
        "steer steer me", "follow-up later"]
    assert "failed" in seen["aborted"] and " aborted" in seen["aborted"]
    assert (project / "notes.txt").read_text() == "beta\n"
    assert (state.thinking_level, state.permission_mode) == ("high", "auto")
    asked = [{block.get("text") for block in r.body["messages"][-1]["content"]}
             for r in web.daemon.server.requests]
    assert any("steer me" in texts for texts in asked)
    assert any("later" in texts for texts in asked)
    assert live.cwd == str(project)


async def test_a_page_opened_while_another_client_holds_the_session_answers_its_question(
        tmp_path: Path) -> None:
    """A permission request is not sent again to a client that attaches while another can
    answer it: the page finds it in ``attach``'s answer, and its answer is the one taken."""
    made = tmp_path / "project" / "made"
    replies = scripted(call("bash", command="touch made"))
    async with open_web(tmp_path, replies, empty_unload_s=600) as web:
        session_id = await open_session(web, "held", mode="ask")
        link = await web.link("phone", "approve")
        asked, done = trio.Event(), trio.Event()

        async def editor() -> None:  # attached all along, never answering
            async with web.daemon.client() as owner:
                await owner.attach(session_id)
                await owner.prompt("Make it")
                await owner.next_event(lambda e: e.type == "extension_ui_request")
                asked.set()
                await owner.next_event(lambda e: e.type == "agent_settled")
                done.set()

        def scenario(page: Any) -> None:
            on_trio(asked.wait)
            go_to_session(page, link, "held")
            expect(page.locator(".state-line .state")).to_have_text("waiting for you")
            page.get_by_role("button", name="Allow once").click()
            on_trio(done.wait)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(editor)
            await in_browser(tmp_path / "profile", scenario)
    assert made.exists()


async def test_a_connection_open_on_one_side_only_is_found_and_replaced(tmp_path: Path) -> None:
    """A phone that slept leaves its connection open on one side: nothing arrives and
    nothing says so. The page asks the daemon something once it has heard nothing for 25 s,
    and takes no answer in 10 s for a dead connection (the page's clock, moved on here)."""
    async with open_web(tmp_path, empty_unload_s=600) as web:
        await open_session(web, "dozing")
        link = await web.link("phone", "read")

        def scenario(page: Any) -> int:
            page.clock.install()  # before the page's timers are set
            go_to_session(page, link, "dozing")
            expect(page.get_by_role("heading", name="Tree")).to_be_visible()
            trio.from_thread.run_sync(web.proxy.freeze)
            page.clock.fast_forward(26_000)  # quiet: it asks
            page.clock.fast_forward(11_000)  # unanswered: it gives the connection up
            expect(page.locator(".banner")).to_have_text("Connection lost: reconnecting…")
            trio.from_thread.run_sync(web.proxy.thaw)
            expect(page.locator(".banner")).to_have_text("Reconnected.")
            return web.proxy.connections

        connections = await in_browser(tmp_path / "profile", scenario, viewport=PHONE)
    assert connections >= 2
