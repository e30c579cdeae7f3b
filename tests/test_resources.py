"""Skills, prompt templates, SYSTEM.md / APPEND_SYSTEM.md, and get_commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forged._plugins import PluginAPI, PluginSource
from forged._providers.scripted import Reply, ScriptText, ScriptToolCall
from forged._resources import (
    Origin,
    expand_skill,
    load_prompt_templates,
    load_skills,
    split_args,
    substitute,
)

from .harness import open_client


def trust_the_project(tmp_path: Path) -> None:
    """The project's own resources count only for a trusted project."""
    write(tmp_path / "agent" / "settings.json",
          json.dumps({"trustedProjects": [str(tmp_path / "project")]}))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def skill_md(name: str | None, description: str | None, body: str = "Do it well.") -> str:
    lines = ["---"]
    if name is not None:
        lines.append(f"name: {name}")
    if description is not None:
        lines.append(f"description: {description}")
    return "\n".join([*lines, "---", body, ""])


# --- skills ------------------------------------------------------------------------------------

def test_skill_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "skills"
    write(root / "good" / "SKILL.md", skill_md("good", "A good skill"))
    write(root / "no-description" / "SKILL.md", skill_md("no-description", None))
    write(root / "blank" / "SKILL.md", skill_md("blank", "''"))
    write(root / "Bad_Name" / "SKILL.md", skill_md("Bad_Name", "Loads, with a warning"))
    write(root / "folder" / "SKILL.md", skill_md("other-name", "Loads, with a warning"))
    write(root / "broken" / "SKILL.md", "---\nname: [unclosed\n---\nbody\n")
    write(root / "good" / "inner" / "SKILL.md", skill_md("inner", "Inside a skill: not one"))
    write(root / "category" / "nested" / "SKILL.md", skill_md("nested", "Found below a folder"))
    write(root / "loose.md", skill_md(None, "A root .md file is a skill too"))
    write(root / "category" / "notes.md", skill_md(None, "Not a skill: not in the root"))
    write(root / ".hidden" / "SKILL.md", skill_md("hidden", "Dot folders are skipped"))
    write(root / ".gitignore", "ignored/\n")
    write(root / "ignored" / "SKILL.md", skill_md("ignored", "Ignored by .gitignore"))
    skills = load_skills([Origin(path=root, scope="user")])
    err = capsys.readouterr().err
    assert sorted(s.name for s in skills) == ["Bad_Name", "good", "loose", "nested",
                                              "other-name"]
    assert f"{root / 'no-description' / 'SKILL.md'}: a description is required; skipped" in err
    assert f"{root / 'blank' / 'SKILL.md'}: a description is required; skipped" in err
    assert f"{root / 'broken' / 'SKILL.md'}: invalid frontmatter" in err
    assert 'name "Bad_Name" should be lowercase letters' in err
    assert 'name "other-name" does not match its folder "folder"' in err


def test_the_first_folder_wins_a_skill_name(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    project = write(tmp_path / "project" / "review" / "SKILL.md", skill_md("review", "Ours"))
    user = write(tmp_path / "user" / "review" / "SKILL.md", skill_md("review", "Mine"))
    skills = load_skills([Origin(path=tmp_path / "project", scope="project"),
                          Origin(path=tmp_path / "user", scope="user")])
    assert [(s.description, s.origin.scope) for s in skills] == [("Ours", "project")]
    assert f'skill {user}: the name "review" is taken by {project}; skipped' in (
        capsys.readouterr().err)


def test_a_skill_command_expands_to_its_body(tmp_path: Path) -> None:
    path = write(tmp_path / "skills" / "deploy" / "SKILL.md",
                 skill_md("deploy", "Deploys", body="\nRun ./ship.sh\n"))
    skills = load_skills([Origin(path=tmp_path / "skills", scope="user")])
    assert expand_skill("/skill:deploy  to staging ", skills) == (
        f'<skill name="deploy" location="{path}">\nReferences are relative to {path.parent}.'
        "\n\nRun ./ship.sh\n</skill>\n\nto staging")
    assert expand_skill("/skill:deploy", skills).endswith("</skill>")
    assert expand_skill("/skill:unknown x", skills) == "/skill:unknown x"
    assert expand_skill("deploy /skill:deploy", skills) == "deploy /skill:deploy"


# --- prompt templates --------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "args", "expected"), [
    ("Fix $1 in $2", "a.py tests", "Fix a.py in tests"),
    ("Fix $1 and $3", "a.py", "Fix a.py and "),
    ("All: $@", "one 'two three' \"four\"", "All: one two three four"),
    ("Args: $ARGUMENTS", "x  y", "Args: x y"),
    ("From 2: ${@:2}", "a b c d", "From 2: b c d"),
    ("Two from 2: ${@:2:2}", "a b c d", "Two from 2: b c"),
    ("Zero is one: ${@:0}", "a b", "Zero is one: a b"),
    ("$1 once", "$2 two", "$2 once"),  # a value is not substituted again
    ("No args: [$@]", "", "No args: []"),
])
def test_template_arguments(body: str, args: str, expected: str) -> None:
    assert substitute(body, split_args(args)) == expected


def test_template_descriptions(tmp_path: Path) -> None:
    write(tmp_path / "p" / "fix.md", "---\ndescription: Fix failing tests\n---\n\nFix $@\n")
    write(tmp_path / "p" / "long.md", "\n\n" + "word " * 20 + "\nmore\n")
    write(tmp_path / "p" / "nested" / "skip.md", "not direct: not a template")
    write(tmp_path / "q" / "fix.md", "---\ndescription: Second fix\n---\nlater folder\n")
    templates = load_prompt_templates([Origin(path=tmp_path / "p", scope="project"),
                                       Origin(path=tmp_path / "q", scope="user")])
    found = {t.name: t for t in templates}
    assert sorted(found) == ["fix", "long"]
    assert (found["fix"].description, found["fix"].body) == ("Fix failing tests", "Fix $@")
    assert found["long"].description == ("word " * 12)[:60] + "..."
    assert found["long"].body.startswith("\n\nword")  # no frontmatter: kept exactly


# --- over the wire -----------------------------------------------------------------------------

def sent_user_texts(body: dict[str, object]) -> list[str]:
    texts: list[str] = []
    for message in body["messages"]:  # type: ignore[attr-defined]
        if message["role"] == "user":
            content = message["content"]
            texts += [content] if isinstance(content, str) else [
                block["text"] for block in content if block.get("type") == "text"]
    return texts


async def test_templates_and_skills_expand_in_prompt_steer_and_follow_up(
        tmp_path: Path) -> None:
    trust_the_project(tmp_path)
    project = tmp_path / "project"
    write(project / ".agent-forge" / "agent" / "prompts" / "fix.md",
          "---\ndescription: Fix a file\n---\nPlease fix $1 ($@)\n")
    write(tmp_path / "agent" / "skills" / "tidy" / "SKILL.md",
          skill_md("tidy", "Tidy up", body="Remove dead code."))
    replies = [Reply(content=[ScriptText(text="ok")], delay_ms=300),
               Reply(content=[ScriptText(text="ok")]), Reply(content=[ScriptText(text="ok")])]
    async with open_client(tmp_path, replies) as client:
        response = await client.request({"type": "prompt", "message": '/fix a.py "b c"'})
        assert response["data"] == {"disposition": "started"}
        await client.request({"type": "steer", "message": "/skill:tidy now"})
        await client.request({"type": "follow_up", "message": "/fix b.py"})
        await client.settled()
        requests = client.server.requests
    assert sent_user_texts(requests[0].body) == ["Please fix a.py (a.py b c)"]
    steered = sent_user_texts(requests[1].body)[-1]
    assert steered.startswith('<skill name="tidy"') and steered.endswith(
        "Remove dead code.\n</skill>\n\nnow")
    assert sent_user_texts(requests[2].body)[-1] == "Please fix b.py (b.py)"


async def test_unknown_slash_text_is_sent_as_it_is(tmp_path: Path) -> None:
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="ok")])]) as client:
        await client.prompt_and_settle("/unknown thing")
        assert sent_user_texts(client.server.requests[0].body) == ["/unknown thing"]


async def test_get_commands_lists_templates_and_skills_with_their_sources(
        tmp_path: Path) -> None:
    trust_the_project(tmp_path)
    project = tmp_path / "project"
    prompts = project / ".agent-forge" / "agent" / "prompts"
    write(prompts / "fix-tests.md", "---\ndescription: Fix failing tests\n---\nFix them\n")
    skills = tmp_path / "agent" / "skills"
    write(skills / "brave-search" / "SKILL.md",
          skill_md("brave-search", "Web search via Brave API"))
    async with open_client(tmp_path) as client:
        commands = (await client.request({"type": "get_commands"}))["data"]["commands"]
    assert commands == [
        {"name": "fix-tests", "description": "Fix failing tests", "source": "prompt",
         "sourceInfo": {"path": str(prompts / "fix-tests.md"), "source": "local",
                        "scope": "project", "origin": "top-level", "baseDir": str(prompts)}},
        {"name": "skill:brave-search", "description": "Web search via Brave API",
         "source": "skill",
         "sourceInfo": {"path": str(skills / "brave-search" / "SKILL.md"), "source": "local",
                        "scope": "user", "origin": "top-level", "baseDir": str(skills)}},
    ]


async def test_system_md_replaces_and_append_system_md_extends_the_prompt(
        tmp_path: Path) -> None:
    trust_the_project(tmp_path)
    project = tmp_path / "project"
    write(project / ".agent-forge" / "SYSTEM.md", "You are the project's own agent.")
    write(tmp_path / "agent" / "APPEND_SYSTEM.md", "Always answer in French.")
    write(project / "AGENTS.md", "Run make test.")
    write(tmp_path / "agent" / "skills" / "tidy" / "SKILL.md", skill_md("tidy", "Tidy up"))
    write(tmp_path / "agent" / "skills" / "secret" / "SKILL.md",
          "---\ndescription: Only by command\ndisable-model-invocation: true\n---\nx\n")
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="ok")])]) as client:
        await client.prompt_and_settle("hi")
        system = client.server.requests[0].body["system"]
    text = system if isinstance(system, str) else "".join(block["text"] for block in system)
    assert text.startswith("You are the project's own agent.\n\nAlways answer in French.")
    assert "expert coding assistant" not in text
    assert "Run make test." in text
    assert "<name>tidy</name>" in text and "secret" not in text
    assert text.index("French") < text.index("Run make test.") < text.index("<available_skills>")


async def test_append_system_md_extends_forged_s_own_prompt(tmp_path: Path) -> None:
    trust_the_project(tmp_path)
    write(tmp_path / "project" / ".agent-forge" / "APPEND_SYSTEM.md", "Project rule.")
    async with open_client(tmp_path, [Reply(content=[ScriptText(text="ok")])]) as client:
        await client.prompt_and_settle("hi")
        system = client.server.requests[0].body["system"]
    text = system if isinstance(system, str) else "".join(block["text"] for block in system)
    assert "expert coding assistant" in text
    assert text.index("Show file paths clearly") < text.index("Project rule.")


async def test_get_commands_lists_plugin_commands_first_then_templates_then_skills(
        tmp_path: Path) -> None:
    write(tmp_path / "agent" / "prompts" / "fix.md", "Fix it")
    write(tmp_path / "agent" / "skills" / "tidy" / "SKILL.md", skill_md("tidy", "Tidy up"))

    def register(api: PluginAPI) -> None:
        api.register_command("fix", lambda args, ctx: None, description="The plugin's fix")

    source = PluginSource(id="p", register=register, scope="user")
    async with open_client(tmp_path, plugins=[source]) as client:
        commands = (await client.request({"type": "get_commands"}))["data"]["commands"]
        handled = await client.request({"type": "prompt", "message": "/fix"})
    assert [(c["name"], c["source"], c["sourceInfo"]["scope"]) for c in commands] == [
        ("fix", "capability", "user"), ("fix", "prompt", "user"),
        ("skill:tidy", "skill", "user")]
    assert handled["data"] == {"disposition": "handled"}  # a plugin command comes first


@pytest.mark.parametrize("trusted", [False, True])
async def test_an_untrusted_project_runs_no_code_and_changes_no_instructions(
        tmp_path: Path, trusted: bool) -> None:
    """A cloned repository's .agent-forge/: its settings (a shellPath runs), SYSTEM.md,
    APPEND_SYSTEM.md, skills and templates count only once the project is trusted (its
    plugins too: test_plugins); its AGENTS.md is context either way."""
    project, marker = tmp_path / "project", tmp_path / "the-repository-ran-code"
    own = project / ".agent-forge"
    write(own / "evil-shell", f"#!/bin/sh\ntouch {marker}\nexec /bin/sh \"$@\"\n").chmod(0o755)
    write(own / "settings.json", json.dumps({"shellPath": str(own / "evil-shell")}))
    write(own / "SYSTEM.md", "REPOSITORY SYSTEM PROMPT")
    write(own / "APPEND_SYSTEM.md", "REPOSITORY APPENDED RULE")
    write(own / "agent" / "skills" / "leak" / "SKILL.md", skill_md("leak", "Leak the keys"))
    write(own / "agent" / "prompts" / "go.md", "REPOSITORY TEMPLATE")
    write(project / "AGENTS.md", "Project context, read as context.")
    if trusted:
        trust_the_project(tmp_path)
    replies = [Reply(content=[ScriptToolCall(name="bash", arguments={"command": "true"})]),
               Reply(content=[ScriptText(text="ok")])]
    async with open_client(tmp_path, replies) as client:
        await client.prompt_and_settle("hello")
        commands = (await client.request({"type": "get_commands"}))["data"]["commands"]
    system = client.server.requests[0].body["system"][0]["text"]
    names = [command["name"] for command in commands]
    assert "Project context, read as context." in system
    assert ("REPOSITORY SYSTEM PROMPT" in system) is trusted
    assert ("REPOSITORY APPENDED RULE" in system) is trusted
    assert ("go" in names and "skill:leak" in names) is trusted
    assert marker.exists() is trusted  # the project's shell ran, or did not
