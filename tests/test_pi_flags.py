"""The ancestor's command line, as the programs that launch it pass it: each flag does what it
means, is accepted with a note where it means nothing without a screen, or is refused."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from forged._cli import main, options_from, parse_command_line
from forged._config import Models, session_config
from forged._errors import ConfigError
from forged._models import ModelRegistry, register_scripted
from forged._queues import user_message
from forged._session import Session, open_session
from forged._store import SessionFile
from forged._wire import UserMessage

from .harness import open_client


def parse(*argv: str) -> argparse.Namespace:
    return parse_command_line(list(argv))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder, with the agent folder beside it and no provider key set."""
    (tmp_path / "project").mkdir()
    (tmp_path / "agent").mkdir()
    monkeypatch.setenv("AGENT_FORGE_DIR", str(tmp_path / "agent"))
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path / "project"


@asynccontextmanager
async def session_for(project: Path, *argv: str) -> AsyncIterator[Session]:
    """The session ``forged --mode rpc ARGV`` would open in `project` (on the scripted
    provider unless ARGV chooses a model)."""
    registry = ModelRegistry()
    registry.load_models_json(project.parent / "agent" / "models.json")
    register_scripted(registry, "http://127.0.0.1:9")  # never called: nothing is prompted
    options = options_from(parse_command_line(["--cwd", str(project), *argv]))
    models = Models(registry=registry, provider=options.provider,
                    pattern=options.model or "scripted/anthropic-messages")
    async with open_session(session_config(options, models), lambda _: None) as session:
        yield session


def tool_names(session: Session) -> list[str]:
    return list(session.tools.all)


@pytest.mark.parametrize(("flag", "dest", "value"), [
    ("-ne", "ignored_no_extensions", True), ("-ns", "no_skills", True),
    ("-np", "no_prompt_templates", True), ("-nc", "no_context_files", True),
    ("-nt", "no_tools", True), ("-nbt", "no_builtin_tools", True), ("-na", "approve", False),
    ("-a", "approve", True), ("-r", "continue_", True)])
def test_a_short_flag_is_itself_and_never_a_session_name(flag: str, dest: str,
                                                          value: object) -> None:
    args = parse(flag)
    assert getattr(args, dest) == value
    assert args.session_name is None


def test_short_flags_with_values_and_the_name_flag_beside_them() -> None:
    args = parse("-t", "read,ls", "-xt", "ls", "-n", "e", "-e", "x.ts")
    assert (args.tools, args.exclude_tools, args.session_name, args.extension) == (
        ["read", "ls"], ["ls"], "e", ["x.ts"])


async def test_the_default_tools_are_read_bash_edit_write(project: Path) -> None:
    async with session_for(project) as session:
        assert tool_names(session) == ["read", "bash", "edit", "write"]
        _, request = await session.asking.model_request(session.context.messages)
    assert [tool.name for tool in request.tools] == ["read", "bash", "edit", "write"]
    assert "- grep:" not in request.system_prompt and "- write:" in request.system_prompt


@pytest.mark.parametrize(("argv", "expected"), [
    (["--tools", "read,ls"], ["read", "ls"]),
    (["-t", "*"], ["read", "bash", "edit", "write", "grep", "find", "ls"]),
    (["-t", "+grep,-write"], ["read", "bash", "edit", "grep"]),
    (["--no-tools"], []),
    (["-nt", "-t", "read"], ["read"]),
    (["--no-builtin-tools"], []),
    (["-nbt", "-t", "+find"], ["find"]),
    (["--exclude-tools", "b*,edit"], ["read", "write"]),
    (["-t", "*", "-xt", "*"], []),
])
async def test_the_tool_flags_choose_the_tools(project: Path, argv: list[str],
                                               expected: list[str]) -> None:
    async with session_for(project, *argv) as session:
        assert tool_names(session) == expected


def test_tool_names_and_changes_cannot_be_mixed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--tools", "read,+ls")
    assert "cannot be mixed with +name or -name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--tools", "+l*")


async def test_plugin_tools_are_on_top_unless_a_tool_list_leaves_them_out(
        project: Path, tmp_path: Path) -> None:
    source = tmp_path / "shout.py"
    source.write_text(
        "def register(api):\n"
        "    api.register_tool('shout', 'Shout', {'type': 'object', 'properties': {}},\n"
        "                      lambda args, ctx: 'HI')\n")
    async with session_for(project, "--plugin", str(source)) as session:
        assert tool_names(session) == ["read", "bash", "edit", "write", "shout"]
    async with session_for(project, "--plugin", str(source), "-nbt") as session:
        assert tool_names(session) == ["shout"]
    async with session_for(project, "--plugin", str(source), "-t", "read") as session:
        assert tool_names(session) == ["read"]
    async with session_for(project, "--plugin", str(source), "-t", "-shout") as session:
        assert tool_names(session) == ["read", "bash", "edit", "write"]
    async with session_for(project, "--plugin", str(source), "-nt") as session:
        assert tool_names(session) == []


async def test_default_tools_setting_global_then_project(
        project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"defaultTools": ["read", "grep", "nosuch"]}))
    (project / ".agent-forge").mkdir()
    (project / ".agent-forge" / "settings.json").write_text(json.dumps(
        {"defaultTools": ["+ls", "-read"]}))
    async with session_for(project) as session:  # the project is not trusted
        assert tool_names(session) == ["read", "grep"]
    assert "no tool is called nosuch; ignored" in capsys.readouterr().err
    async with session_for(project, "--approve") as session:
        assert tool_names(session) == ["grep", "ls"]
    async with session_for(project, "--approve", "-t", "+bash") as session:
        assert tool_names(session) == ["bash", "grep", "ls"]


async def test_approve_and_no_approve_decide_trust_for_the_run(project: Path,
                                                                tmp_path: Path) -> None:
    (project / ".agent-forge").mkdir()
    (project / ".agent-forge" / "settings.json").write_text(json.dumps({"steeringMode": "all"}))
    async with session_for(project) as session:
        assert session.queues.steering_mode == "one-at-a-time"
    async with session_for(project, "-a") as session:
        assert session.queues.steering_mode == "all"
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {"trustedProjects": [str(project)]}))
    async with session_for(project) as session:
        assert session.queues.steering_mode == "all"
    async with session_for(project, "--no-approve") as session:
        assert session.queues.steering_mode == "one-at-a-time"


async def test_thinking_sets_the_level_over_a_model_suffix_and_is_clamped(
        project: Path, tmp_path: Path) -> None:
    (tmp_path / "agent" / "models.json").write_text(json.dumps({"providers": {"local": {
        "baseUrl": "http://127.0.0.1:9", "api": "openai-completions", "apiKey": "LOCAL_KEY",
        "models": [{"id": "thinker", "reasoning": True}, {"id": "plain"}]}}}))
    async with session_for(project, "--model", "local/thinker:low", "--thinking",
                           "high") as session:
        assert session.thinking_level == "high"
    async with session_for(project, "--model", "local/plain", "--thinking", "high") as session:
        assert session.thinking_level == "off"
    with pytest.raises(SystemExit):
        parse("--thinking", "enormous")


async def test_api_key_is_the_chosen_models_providers_key_for_this_run(
        project: Path, tmp_path: Path) -> None:
    async with session_for(project, "--model", "claude-sonnet-4-5", "--api-key",
                           "sk-given") as session:
        assert session.model is not None and session.model.provider == "anthropic"
        _, request = await session.asking.model_request(session.context.messages)
    assert request.api_key == "sk-given"
    assert not (tmp_path / "agent" / "settings.json").exists() or "sk-given" not in (
        tmp_path / "agent" / "settings.json").read_text()
    with pytest.raises(ConfigError, match="--api-key needs --model"):
        async with session_for(project, "--api-key", "sk-given"):
            pass


async def test_system_prompt_appends_keep_every_value_in_order(project: Path,
                                                                tmp_path: Path) -> None:
    (tmp_path / "second.md").write_text("SECOND from a file")
    async with session_for(project, "--append-system-prompt", "FIRST",
                           "--append-system-prompt", str(tmp_path / "second.md")) as session:
        _, request = await session.asking.model_request(session.context.messages)
    assert "FIRST\n\nSECOND from a file" in request.system_prompt


async def test_no_skills_templates_or_context_files(project: Path, tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    (agent / "skills" / "lint").mkdir(parents=True)
    (agent / "skills" / "lint" / "SKILL.md").write_text(
        "---\nname: lint\ndescription: Lint the code\n---\nRun the linter.\n")
    (agent / "prompts").mkdir()
    (agent / "prompts" / "review.md").write_text("Review $1")
    (project / "AGENTS.md").write_text("CONTEXT-MARKER")
    extra = tmp_path / "extra-skill.md"
    extra.write_text("---\nname: extra\ndescription: An extra skill\n---\nDo more.\n")
    async with session_for(project) as session:
        assert [s.name for s in session.resources.skills] == ["lint"]
        assert [t.name for t in session.resources.templates] == ["review"]
        _, request = await session.asking.model_request(session.context.messages)
        assert "CONTEXT-MARKER" in request.system_prompt
    async with session_for(project, "-ns", "--skill", str(extra), "-np", "-nc") as session:
        assert [s.name for s in session.resources.skills] == ["extra"]
        assert session.resources.templates == []
        _, request = await session.asking.model_request(session.context.messages)
        assert "CONTEXT-MARKER" not in request.system_prompt


async def test_session_id_starts_or_continues_that_session(project: Path,
                                                           tmp_path: Path) -> None:
    async with session_for(project, "--session-id", "review-42") as session:
        assert session.session_id == "review-42"
        session.set_session_name("first")  # an entry, not yet a message: still unwritten
        session.context.append(_user("hello"))
        path = session.store.path
    assert path is not None and path.name.endswith("_review-42.jsonl") and path.exists()
    async with session_for(project, "--session-id", "review-42") as session:
        assert session.store.path == path and session.session_name == "first"
    with pytest.raises(SystemExit):
        parse("--session-id", "-bad-")
    with pytest.raises(ConfigError, match="--session-id cannot be combined"):
        options_from(parse("--session-id", "x1", "--continue"))


async def test_fork_copies_a_session_into_a_new_one(project: Path) -> None:
    async with session_for(project) as original:
        original.context.append(_user("the original"))
        source = original.store.path
        assert source is not None
        async with session_for(project, "--fork", str(source), "--session-id",
                               "copy-1") as session:  # while another session holds the source
            assert session.session_id == "copy-1"
            assert session.store.header["parentSession"] == str(source)
            assert [m.content[0].text for m in session.context.messages] == ["the original"]  # type: ignore[union-attr]
            forked = session.store.path
    assert forked is not None and forked != source and forked.exists()
    assert len(SessionFile.open(source).entries_since(None)) == len(
        SessionFile.open(forked).entries_since(None))
    with pytest.raises(ConfigError, match="--fork cannot be combined with"):
        options_from(parse("--fork", str(source), "--no-session"))


async def test_resume_continues_the_most_recent_session(project: Path) -> None:
    async with session_for(project) as session:
        session.context.append(_user("earlier"))
        recent = session.store.path
    async with session_for(project, "-r") as session:
        assert session.store.path == recent


def test_ignored_flags_say_so_once_and_extensions_are_refused(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options_from(parse("--no-themes", "--theme", "dark", "-ne", "--offline", "--verbose",
                       "--use-theme", "x", "--tui-mode", "regular"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "accepted, no effect" in err
    assert all(flag in err for flag in ("--no-themes", "--theme", "--no-extensions",
                                        "--offline", "--verbose", "--use-theme", "--tui-mode"))
    with pytest.raises(ConfigError, match="TypeScript extensions are not supported"):
        options_from(parse("-e", "review.ts"))


def test_list_models_prints_a_table_of_the_usable_ones(
        project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-models"]) == 0
    assert capsys.readouterr().out.startswith(
        "No models available: no provider has an API key. Set ANTHROPIC_API_KEY or "
        "OPENAI_API_KEY")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert main(["--list-models", "son 4-5"]) == 0  # letters in order, as a fuzzy search
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["provider", "model", "context", "max-out", "thinking", "images"]
    rows = [line.split() for line in lines[1:]]
    assert ["anthropic", "claude-sonnet-4-5", "200K", "64K", "yes", "yes"] in rows
    assert all(row[0] == "anthropic" and "son" in row[1] for row in rows)
    assert rows == sorted(rows)
    assert main(["--list-models", "nothing-like-it"]) == 0
    assert capsys.readouterr().out == 'No models matching "nothing-like-it"\n'


async def test_export_writes_a_session_file_as_html(
        project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "page.html"
    async with session_for(project) as session:
        session.context.append(_user("export me"))
        source = session.store.path
        assert source is not None
        held = source.read_bytes()
        assert await trio.to_thread.run_sync(  # while the session holds its file
            main, ["--export", str(source), str(out)]) == 0
        assert source.read_bytes() == held
    assert capsys.readouterr().out == f"Exported to: {out}\n"
    assert "export me" in out.read_text()
    assert await trio.to_thread.run_sync(main, ["--export", str(tmp_path / "none.jsonl")]) == 1


def _user(text: str) -> UserMessage:
    return user_message(text, None)


# --- project trust ------------------------------------------------------------------------------

def untrusted_project(project: Path) -> None:
    """A project whose own folder has a settings file and a prompt template."""
    (project / ".agent-forge" / "agent" / "prompts").mkdir(parents=True)
    (project / ".agent-forge" / "agent" / "prompts" / "ship.md").write_text("Ship it")
    (project / ".agent-forge" / "settings.json").write_text(json.dumps({"steeringMode": "all"}))
    (project / "AGENTS.md").write_text("PROJECT-CONTEXT")


@pytest.mark.parametrize(("trust", "settings", "trusted"), [
    ({}, {}, False),
    ("project", {}, True),
    ("parent", {}, True),
    ({"project": False, "parent": True}, {}, False),  # the nearest decision wins
    ({"project": False}, {"trustedProjects": ["project"]}, False),
    ({"project": None}, {"trustedProjects": ["project"]}, True),
    ({}, {"defaultProjectTrust": "always"}, True),
    ({}, {"defaultProjectTrust": "ask"}, False),
])
async def test_trust_is_decided_as_the_ancestor_decides_it(
        project: Path, tmp_path: Path, trust: Any, settings: dict[str, Any],
        trusted: bool) -> None:
    untrusted_project(project)
    folders = {"project": project, "parent": project.parent}
    decisions = {folders[trust]: True} if isinstance(trust, str) else {
        folders[key]: value for key, value in trust.items()}
    (tmp_path / "agent" / "trust.json").write_text(json.dumps(
        {str(folder): value for folder, value in decisions.items()}))
    (tmp_path / "agent" / "settings.json").write_text(json.dumps(
        {key: [str(folders[v]) for v in value] if key == "trustedProjects" else value
         for key, value in settings.items()}))
    async with session_for(project) as session:
        assert (session.queues.steering_mode == "all") is trusted
        assert ([t.name for t in session.resources.templates] == ["ship"]) is trusted
        _, request = await session.asking.model_request(session.context.messages)
        assert "PROJECT-CONTEXT" in request.system_prompt  # either way
    async with session_for(project, "--no-approve") as session:
        assert session.queues.steering_mode == "one-at-a-time"
    async with session_for(project, "--approve") as session:
        assert session.queues.steering_mode == "all"


async def test_get_commands_and_config_show_say_why_the_project_was_skipped(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with open_client(project.parent) as client:  # a bare project folder: no note
        bare = (await client.request({"type": "get_commands"}))["data"]
    assert "untrustedProject" not in bare
    untrusted_project(project)
    async with open_client(project.parent) as client:
        skipped = (await client.request({"type": "get_commands"}))["data"]
    assert "skipped: the project is not trusted" in skipped["untrustedProject"]
    assert "--approve" in skipped["untrustedProject"]
    assert all(command["name"] != "ship" for command in skipped["commands"])
    capsys.readouterr()
    assert main(["config", "show", "--cwd", str(project)]) == 0
    assert "skipped: the project is not trusted" in capsys.readouterr().err
