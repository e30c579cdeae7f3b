"""MCP prompts as commands. Each server's prompts, as it last listed them, are the commands
``/mcp__<server>__<prompt>`` (named as its tools are, `forged._mcp.config.tool_name`), which
``get_commands`` lists with the source ``prompt``. A prompt whose text is such a command is
rendered by its server (``prompts/get``), and the text of the rendered messages is what the
model gets, in place of the command. A server that fails, or refuses the prompt, fails the
command (`CommandError`): nothing reaches the model.

Arguments follow the command's name, split as a template's are (quotes keep spaces): words fill
the prompt's arguments in the order the server declares them, the last one taking the words
left over; ``name=value`` (a declared name) fills one by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import trio

from .. import _wire as w
from .._errors import CommandError, ToolError
from .cache import ListedPrompt
from .config import tool_name
from .results import content_of
from .server import McpServer

_NAMED = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.DOTALL)


def prompt_commands(servers: Iterable[McpServer]) -> dict[str, tuple[McpServer, ListedPrompt]]:
    """Each command's name, and whose prompt it is (the first of a name; an enabled
    server's, as it last listed them)."""
    found: dict[str, tuple[McpServer, ListedPrompt]] = {}
    for server in servers:
        for prompt in server.prompts if server.spec.enabled else []:
            found.setdefault(tool_name(server.spec.name, prompt.name), (server, prompt))
    return found


def command_infos(servers: Iterable[McpServer]) -> list[w.CommandInfo]:
    return [w.CommandInfo(
        name=name, description=prompt.description, source="prompt",
        source_info=w.SourceInfo(path=f"<mcp:{server.spec.name}:{prompt.name}>",
                                 source=f"mcp:{server.spec.name}", scope=server.spec.scope,
                                 origin="top-level"))
        for name, (server, prompt) in prompt_commands(servers).items()]


def server_named(servers: Iterable[McpServer], text: str) -> McpServer | None:
    """The server whose prompt `text` would be (it starts ``/mcp__<server>__``), or None."""
    if not text.startswith("/mcp__"):
        return None
    name = text[1:].split(None, 1)[0]
    return next((server for server in servers
                 if name.startswith(tool_name(server.spec.name, ""))), None)


async def render(server: McpServer, text: str) -> str:
    """The text of the prompt `text` names (``/mcp__<server>__<prompt> args``), rendered by
    `server`. A server never listed before is waited for first, as a model request waits;
    `CommandError` when there is no such prompt, its arguments do not fit, the server is
    not available or refuses it, or it renders no text."""
    name, *more = text[1:].split(None, 1)
    rest = more[0] if more else ""
    await server.first_listed()
    prompt = next((prompt for prompt in server.prompts
                   if tool_name(server.spec.name, prompt.name) == name), None)
    if prompt is None:
        offered = ", ".join(prompt.name for prompt in server.prompts) or "none"
        raise CommandError(f"MCP server {server.spec.name} has no prompt /{name} (its "
                           f"prompts: {offered})")
    arguments = prompt_arguments(prompt, rest, name)
    try:
        client = await server.connected()
    except ToolError as exc:
        raise CommandError(f"/{name}: {exc}") from None
    from mcp.shared.exceptions import MCPError

    timeout = server.spec.timeout_s
    answer_by = trio.CancelScope(deadline=trio.current_time() + timeout)
    server.answering.add(answer_by)
    try:
        with answer_by:
            result = await client.get_prompt(prompt.name, arguments)
        if answer_by.cancelled_caught:
            raise trio.TooSlowError
    except MCPError as exc:
        raise CommandError(f"/{name}: MCP server {server.spec.name} refused the prompt: "
                           f"{exc.error.message}") from None
    except trio.TooSlowError:
        raise CommandError(f"/{name}: MCP server {server.spec.name} did not answer within "
                           f"{timeout:g} s") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        server.lose(str(exc))
        raise CommandError(f"/{name}: MCP server {server.spec.name}: {exc}") from None
    except (ValueError, RuntimeError) as exc:  # not a prompt's answer; input asked for
        why = next(iter(str(exc).splitlines()), type(exc).__name__)
        raise CommandError(f"/{name}: MCP server {server.spec.name} did not render the "
                           f"prompt: {why}") from None
    finally:
        server.answering.discard(answer_by)
    texts = [block.text for block in (content_of(message.content)
                                      for message in result.messages)
             if isinstance(block, w.TextContent)]
    if not any(text.strip() for text in texts):
        raise CommandError(f"/{name}: MCP server {server.spec.name} rendered no text")
    return "\n\n".join(texts)


def prompt_arguments(prompt: ListedPrompt, rest: str, command: str) -> dict[str, str]:
    """The command's words as the prompt's arguments (the module's docstring);
    `CommandError` when a required one is missing, or words are left for none."""
    from .._resources import split_args

    declared = [argument.name for argument in prompt.arguments]
    named: dict[str, str] = {}
    words: list[str] = []
    for word in split_args(rest):
        found = _NAMED.match(word)
        if found and found.group(1) in declared:
            named[found.group(1)] = found.group(2)
        else:
            words.append(word)
    open_ones = [name for name in declared if name not in named]
    if words and not open_ones:
        raise CommandError(f"/{command} takes {_signature(prompt) or 'no arguments'}; "
                           f"{' '.join(words)!r} is left over")
    for index, name in enumerate(open_ones[:len(words)]):
        last = index == len(open_ones) - 1
        named[name] = " ".join(words[index:]) if last else words[index]
    missing = [argument.name for argument in prompt.arguments
               if argument.required and argument.name not in named]
    if missing:
        raise CommandError(f"/{command} needs {', '.join(missing)} (it takes "
                           f"{_signature(prompt)})")
    return named


def _signature(prompt: ListedPrompt) -> str:
    return " ".join(argument.name if argument.required else f"[{argument.name}]"
                    for argument in prompt.arguments)
