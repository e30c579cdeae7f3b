"""The command line: argv to `Options`, then the chosen mode under `trio.run`."""

from __future__ import annotations

import argparse
import os
import re
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from . import _runtime, _thin, _tls
from ._errors import ConfigError, ForgedError
from ._launch import mark_process, run_reporting
from ._log import log, reserve_stdout
from ._startup import collector_paused
from ._version import __version__
from ._vocabulary import PERMISSION_MODES, THINKING_LEVELS

if TYPE_CHECKING:
    from ._config import Options

DESCRIPTION = """\
forged: a headless coding agent speaking the agent-forge RPC protocol.

A client writes JSON commands (one per line) to stdin and reads responses and events
(one JSON object per line) from stdout. See docs/protocol.md for the protocol."""

EPILOG = """\
environment:
  AGENT_FORGE_DIR     the agent directory (else $PI_CODING_AGENT_DIR, else
                      ~/.agent-forge/agent): models.json, AGENTS.md and sessions live here
  PI_CODING_AGENT_SESSION_DIR
                      where session files go (over the sessionDir setting)
  ANTHROPIC_API_KEY   key for the built-in anthropic provider
  OPENAI_API_KEY      key for the built-in openai provider

example (no API key needed; each tool call on stderr, the reply on stdout):
  forged -p --provider scripted --script {example} "Write a greeting program"

for scripts:
  forged -p "Fix the failing test"         print the final reply (exit 1 on error)
  git diff | forged -p "Review this diff"  piped input comes before the first message
  forged --mode json "Explain main.py"     every event of the run as JSON lines

other commands:
  forged config show [--cwd DIR] [--json]
                      the settings in effect and where each value came from
  forged serve [--socket PATH] [--ws HOST:PORT] ...
                      the daemon: many sessions over a Unix socket and WebSocket
  forged connect [--socket PATH] [--no-start] ...
                      a stdio bridge to the daemon, in place of forged --mode rpc
  forged status [--socket PATH]
                      whether a daemon runs: its pid, log, sessions and clients
  forged stop [--socket PATH]
                      stop the daemon as SIGTERM does (runs under way get
                      daemon.drainSeconds to finish), and wait until it has
  forged mcp list | add NAME (--url URL | -- COMMAND ARGS...) | remove NAME
                      the MCP servers sessions connect (mcp.json)
  forged mcp login NAME | forged mcp logout NAME
                      sign in to an HTTP MCP server (OAuth), or out
  forged login PROVIDER | forged logout PROVIDER
                      save or remove a sign-in (anthropic, openai-codex, github-copilot)
                      or an API key
                      in auth.json, shared with pi"""


def build_parser() -> argparse.ArgumentParser:
    example = Path(__file__).parent / "examples" / "fix-greeting.json"  # where it is installed
    parser = argparse.ArgumentParser(
        prog="forged", description=DESCRIPTION, epilog=EPILOG.replace("{example}", str(example)),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", "-v", action="version", version=__version__,
                        help="print the version number and exit")
    parser.add_argument("--list-models", nargs="?", const="", metavar="SEARCH",
                        help="list the models forged has keys for (those matching SEARCH), "
                        "then exit")
    parser.add_argument("--export", nargs="+", metavar=("FILE", "OUT"),
                        help="write the session file FILE (a path, or the start of a "
                        "session's id) as an HTML page (to OUT, else beside the current "
                        "directory's name for it), then exit")
    parser.add_argument("--mode", choices=["rpc", "json", "text", "acp"], default=None,
                        help="rpc (default): JSON commands in on stdin, responses and events "
                        "out on stdout; json: run the MESSAGES and print the session header "
                        "and every event as JSON lines; text: as -p; acp: the Agent Client "
                        "Protocol on stdin and stdout, for editors")
    parser.add_argument("-p", "--print", dest="print_mode", action="store_true",
                        help="run the MESSAGES one after another, print the last reply's text "
                        "and exit (1 if it failed)")
    parser.add_argument("messages", nargs="*", metavar="MESSAGE",
                        help="with -p or --mode json: the prompts to send, in order; piped "
                        "stdin is put before the first")
    add_session_options(parser)
    return parser


VALUE_FLAGS = frozenset({"--tools", "-t", "--exclude-tools", "-xt"})
"""Flags whose value may start with ``-`` (``--tools -write``), as the ancestor takes it."""


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """`build_parser`'s parse of `argv`, where a value of `VALUE_FLAGS` is taken whatever it
    starts with."""
    joined: list[str] = []
    arguments = iter(argv)
    for arg in arguments:
        value = next(arguments, None) if arg in VALUE_FLAGS else None
        joined.append(arg if value is None else f"{arg}={value}")
    return build_parser().parse_args(joined)


def add_session_options(parser: argparse.ArgumentParser) -> None:
    """The options that shape a session: every mode and the daemon take them."""
    parser.add_argument("--provider", help="the model provider (anthropic, openai, scripted, "
                        "or one from models.json)")
    parser.add_argument("--model", help="the model: an id, provider/id, or a name fragment, "
                        "with an optional :<thinking> suffix (off, minimal, low, medium, high, "
                        "xhigh, max)")
    parser.add_argument("--name", "-n", dest="session_name", help="the session's display name")
    parser.add_argument("--no-session", action="store_true",
                        help="keep the session in memory only; write no session file")
    parser.add_argument("--session-dir", type=Path,
                        help="where session files are stored (default <agentDir>/sessions/...)")
    parser.add_argument("--session", metavar="PATH|ID-PREFIX",
                        help="continue a session file, given by path or by session id prefix")
    parser.add_argument("--continue", "-c", dest="continue_", action="store_true",
                        help="continue the most recently modified session of this directory")
    parser.add_argument("--cwd", type=Path, help="the project directory the agent works in "
                        "(default: the current directory)")
    parser.add_argument("--models", metavar="PATTERNS",
                        help="comma-separated model patterns (globs like 'anthropic/*', "
                        "optional :<thinking>) that cycle_model goes through; default: the "
                        "enabledModels setting")
    parser.add_argument("--skill", action="append", type=Path, default=[], metavar="PATH",
                        help="a skill file or folder of skills to add (repeatable)")
    parser.add_argument("--prompt-template", action="append", type=Path, default=[],
                        metavar="PATH", help="a prompt template file or folder to add "
                        "(repeatable)")
    parser.add_argument("--system-prompt", metavar="TEXT|PATH",
                        help="replace the system prompt (and SYSTEM.md) with this text or file")
    parser.add_argument("--append-system-prompt", action="append", default=[],
                        metavar="TEXT|PATH", help="add this text or file to the system prompt "
                        "(instead of APPEND_SYSTEM.md; repeatable, kept in order)")
    parser.add_argument("--no-skills", "-ns", action="store_true",
                        help="no discovered or configured skills (--skill paths still load)")
    parser.add_argument("--no-prompt-templates", "-np", action="store_true",
                        help="no discovered or configured prompt templates (--prompt-template "
                        "paths still load)")
    parser.add_argument("--no-context-files", "-nc", action="store_true",
                        help="do not read AGENTS.md or CLAUDE.md files")
    parser.add_argument("--thinking", metavar="LEVEL", choices=THINKING_LEVELS,
                        help="the starting thinking level (over a --model suffix; clamped to "
                        "the model)")
    parser.add_argument("--permission-mode", metavar="MODE", choices=PERMISSION_MODES,
                        help="what the model's tools may do: full-access (the default), ask "
                        "(asks before every command and write), auto (commands in the "
                        "sandbox, writes in the project; asks to do more) or read-only "
                        "(docs/permissions.md); over the permissionMode setting")
    parser.add_argument("--api-key", metavar="KEY",
                        help="the API key of the chosen model's provider, for this run only")
    parser.add_argument("--tools", "-t", metavar="LIST", type=_tool_list,
                        help="the tools the model gets: names or patterns with * (built-in or "
                        "plugin), or only +name/-name entries changing the default set "
                        "(read, bash, edit, write, or the defaultTools setting); MCP tools "
                        "stay unless an entry starts with mcp__")
    parser.add_argument("--no-tools", "-nt", action="store_true",
                        help="start with no tool at all (plus any --tools)")
    parser.add_argument("--no-builtin-tools", "-nbt", action="store_true",
                        help="no built-in tool by default; plugin tools stay")
    parser.add_argument("--exclude-tools", "-xt", metavar="LIST", type=_tool_list,
                        help="remove these tools (names or patterns with *) after every "
                        "other choice")
    parser.add_argument("--session-id", metavar="ID", type=_session_id,
                        help="continue this directory's session with this id, or start one "
                        "with it")
    parser.add_argument("--fork", metavar="PATH|ID-PREFIX",
                        help="start a new session in this directory holding a copy of that "
                        "session")
    parser.add_argument("--resume", "-r", dest="continue_", action="store_true",
                        help="as --continue (forged has no session picker)")
    parser.add_argument("--approve", "-a", dest="approve", action="store_const", const=True,
                        help="trust this project's own settings, prompts, skills and plugins "
                        "for this run")
    parser.add_argument("--no-approve", "-na", dest="approve", action="store_const",
                        const=False, help="ignore them for this run, even if the project is "
                        "trusted")
    parser.add_argument("--plugin", action="append", type=Path, default=[], metavar="PATH",
                        help="load a plugin (a .py file or a package folder) for this run "
                        "(repeatable)")
    parser.add_argument("--trust-project", dest="approve", action="store_const", const=True,
                        help="as --approve")
    parser.add_argument("--mcp-config", action="append", type=Path, default=[], metavar="FILE",
                        help="also connect the MCP servers of this file ({\"mcpServers\": "
                        "...}) for this run (repeatable)")
    parser.add_argument("--no-mcp", action="store_true",
                        help="connect no MCP server for this run")
    parser.add_argument("--extension", "-e", action="append", default=[], metavar="PATH",
                        help="refused: TypeScript extensions are not supported (see --plugin)")
    for flag, takes in IGNORED_FLAGS.items():
        names = flag.split("|")
        kind: dict[str, Any] = ({"action": "append", "metavar": "X"} if takes
                                else {"action": "store_true"})
        parser.add_argument(*names, dest=_ignored_dest(flag),
                            help="accepted, no effect: forged has no terminal, themes or "
                            "TypeScript extensions, and fetches nothing", **kind)
    parser.add_argument("--script", type=Path,
                        help="with --provider scripted: the JSON script of model replies")


IGNORED_FLAGS = {"--no-themes": False, "--theme": True, "--use-theme": True,
                 "--no-extensions|-ne": False, "--offline": False, "--tui-mode": True,
                 "--verbose": False}
"""pi's flags that mean nothing to a program without a screen: accepted with a note (`True`:
the flag takes a value)."""


def _ignored_dest(flag: str) -> str:
    """Where argparse keeps an `IGNORED_FLAGS` entry: ``--no-themes`` -> ignored_no_themes."""
    return "ignored_" + flag.split("|")[0][2:].replace("-", "_")


def _tool_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    modifiers = [name for name in names if name[0] in "+-"]
    if modifiers and len(modifiers) < len(names):
        raise argparse.ArgumentTypeError("tool names cannot be mixed with +name or -name "
                                         "entries")
    if any("*" in name for name in modifiers):
        raise argparse.ArgumentTypeError("+name and -name entries take exact tool names, not "
                                         "patterns")
    return names


def _session_id(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", text):
        raise argparse.ArgumentTypeError(
            f"invalid session id {text!r}: letters, digits, '.', '_' and '-', starting and "
            "ending with a letter or digit")
    return text


def build_config_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forged config show",
        description="Print the settings in effect (the project's .agent-forge/settings.json "
                    "over <agentDir>/settings.json over the defaults), each with where its "
                    "value came from.")
    parser.add_argument("--cwd", type=Path, help="the project directory (default: the "
                        "current directory)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per key: {key, value, source}")
    return parser


def build_mcp_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forged mcp", description="The MCP servers sessions connect: <agentDir>/mcp.json "
        "and, in a trusted project, .agent-forge/mcp.json.")
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="connect each server and print its transport, "
                                 "status and tools (exit 1 if one failed)")
    adding = actions.add_parser("add", help="add a server: --url URL, or -- COMMAND ARGS...")
    adding.add_argument("name")
    adding.add_argument("--url", help="a streamable-HTTP server's URL")
    adding.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                        help="an HTTP header (repeatable; ${VAR} is expanded when used)")
    adding.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of a stdio server (repeatable)")
    adding.add_argument("command", nargs="*", help="after --: a stdio server's command")
    removing = actions.add_parser("remove", help="remove a server")
    removing.add_argument("name")
    for action, what in (("login", "sign in to"), ("logout", "sign out of")):
        actions.add_parser(action, help=f"{what} an HTTP server (OAuth)").add_argument("name")
    for sub in (listing, adding, removing, actions.choices["login"], actions.choices["logout"]):
        sub.add_argument("--cwd", type=Path, help="the project directory (default: the "
                         "current directory)")
    for sub in (adding, removing):
        sub.add_argument("--local", "-l", action="store_true",
                         help="the project's .agent-forge/mcp.json instead of the user's")
    return parser


def parse_mcp_args(argv: list[str]) -> argparse.Namespace:
    """``forged mcp``'s arguments. What follows ``--`` is a stdio server's command, wherever
    the options stand (``add NAME --env K=V --local -- COMMAND ARGS``): argparse alone takes
    no positional after options that follow the name."""
    parser = build_mcp_parser()
    if "--" not in argv:
        return parser.parse_args(argv)
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    if args.action != "add":
        parser.error(f"{args.action} takes no command after --")
    args.command = [*args.command, *argv[split + 1:]]
    return args


def config_show(argv: list[str]) -> int:
    from ._paths import agent_dir
    from ._sandbox import problem as sandbox_problem
    from ._settings import Settings

    args = build_config_parser().parse_args(argv)
    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    settings = Settings(agent_dir(), cwd)
    if settings.project_untrusted_note:
        log(f"{settings.project_untrusted_note}")
    from ._tools.environment import ShellEnvironment
    from ._tools.guard import starting_mode

    rows = settings.explain()
    rows.append(("sandbox", sandbox_problem() or "works here (bubblewrap, seccomp)",
                 "this machine"))
    mode = starting_mode(None, settings)
    rows.append(("command environment", ShellEnvironment.from_settings(settings).describe(mode),
                 "shellEnvironment, in the permission mode a session starts in"))
    if args.json:
        for key, value, source in rows:
            print(orjson.dumps({"key": key, "value": value, "source": source}).decode())
        return 0
    shown = [(key, orjson.dumps(value).decode(), source) for key, value, source in rows]
    key_width = max((len(key) for key, _, _ in shown), default=0)
    value_width = max((len(value) for _, value, _ in shown), default=0)
    for key, value, source in shown:
        print(f"{key:<{key_width}}  {value:<{value_width}}  {source}")
    return 0


def options_from(args: argparse.Namespace) -> Options:
    """The session options of parsed `args`; `ConfigError` for a --cwd that is no folder."""
    from ._config import Options
    from ._resources import ExtraPaths
    from ._tools import ToolChoice

    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    if not cwd.is_dir():
        raise ConfigError(f"--cwd {cwd}: not a directory")
    if args.fork and (args.session or args.continue_ or args.no_session):
        raise ConfigError("--fork cannot be combined with --session, --continue, --resume or "
                          "--no-session")
    if args.session_id and (args.session or args.continue_):
        raise ConfigError("--session-id cannot be combined with --session, --continue or "
                          "--resume")
    if args.extension:
        raise ConfigError("-e/--extension: TypeScript extensions are not supported; forged "
                          "loads Python plugins (--plugin, see docs/plugins.md)")
    ignored = [flag.split("|")[0] for flag in IGNORED_FLAGS
               if getattr(args, _ignored_dest(flag))]
    if ignored:
        log(f"{', '.join(ignored)}: accepted, no effect (forged has no terminal, themes or "
            "TypeScript extensions, and fetches nothing)")
    return Options(
        cwd=cwd, provider=args.provider, model=args.model, script=args.script,
        session_name=args.session_name, no_session=args.no_session,
        session_dir=args.session_dir, session=args.session, continue_=args.continue_,
        models=[p.strip() for p in args.models.split(",") if p.strip()] if args.models
        else None,
        extra=ExtraPaths(skills=args.skill, prompt_templates=args.prompt_template,
                         system_prompt=args.system_prompt,
                         append_system_prompt=args.append_system_prompt,
                         no_skills=args.no_skills, no_prompt_templates=args.no_prompt_templates,
                         no_context_files=args.no_context_files),
        plugins=args.plugin, approve=args.approve, thinking=args.thinking,
        permission_mode=args.permission_mode,
        mcp_files=[path.expanduser().resolve() for path in args.mcp_config],
        no_mcp=args.no_mcp,
        api_key=args.api_key, session_id=args.session_id, fork=args.fork,
        tools=ToolChoice(tools=args.tools, no_tools=args.no_tools,
                         no_builtin_tools=args.no_builtin_tools,
                         exclude=args.exclude_tools or []))


SUBCOMMANDS = ("serve", "connect", "status", "stop", "login", "logout", "pair", "devices",
               "web")


def _socket_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", type=Path, metavar="PATH",
                        help=f"the daemon's Unix socket (default {_runtime.default_socket_path()})")


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def build_serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forged serve", description="Serve many sessions over a Unix socket (and a "
        "WebSocket) until SIGTERM, then drain. Session options are the defaults of the "
        "sessions it starts.")
    _socket_option(parser)
    parser.add_argument("--ws", type=_host_port, metavar="HOST:PORT",
                        help="also listen for WebSocket connections (loopback unless "
                        "--ws-allow-remote); a client needs the token in ws-token beside "
                        "the socket")
    parser.add_argument("--ws-allow-remote", action="store_true",
                        help="allow --ws on an address other than loopback (with TLS)")
    parser.add_argument("--tls-cert", type=Path, metavar="FILE", help="--ws over TLS: the "
                        "certificate (PEM); reloaded on SIGHUP")
    parser.add_argument("--tls-key", type=Path, metavar="FILE", help="its private key")
    parser.add_argument("--insecure", action="store_true", help="a remote --ws without TLS "
                        "(only behind a proxy that terminates TLS)")
    parser.add_argument("--ws-allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="a browser origin (https://app.example) whose pages may "
                        "connect; requests with any other Origin are refused (repeatable)")
    parser.add_argument("--public-url", metavar="URL", help="where devices reach --ws (a "
                        "proxy's https:// address), for the links forged pair prints "
                        "(default: setting daemon.publicUrl, else the listener's address)")
    parser.add_argument("--idle-unload", type=float, metavar="SECONDS",
                        help="unload a session idle this long with no client (default: "
                        "setting daemon.idleUnloadSeconds, else 1800)")
    parser.add_argument("--drain-grace", type=float, metavar="SECONDS",
                        help="on SIGTERM, how long runs may finish before they are aborted "
                        "(default: setting daemon.drainSeconds, else 30)")
    parser.add_argument("--client-queue-bytes", type=int, metavar="BYTES",
                        help="unread output after which a client is disconnected (default "
                        "16 MiB)")
    add_session_options(parser)
    return parser


def build_connect_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forged connect", description="A stdio bridge to the daemon: spawn it in place "
        "of forged --mode rpc. The session options start the daemon if none runs.")
    _socket_option(parser)
    parser.add_argument("--mode", choices=["rpc", "acp"], default="rpc",
                        help="the protocol on stdio: rpc (default; for programs that replace "
                        "forged --mode rpc with forged connect) or acp (as --acp)")
    parser.add_argument("--acp", action="store_true",
                        help="speak the Agent Client Protocol, as forged --mode acp, each "
                        "session a session of the daemon")
    parser.add_argument("--no-start", action="store_true",
                        help="fail if no daemon runs instead of starting one")
    parser.add_argument("--attach", metavar="SESSION-ID",
                        help="attach to this live or stored session (its id, or the start "
                        "of one) instead of a new one")
    add_session_options(parser)
    return parser


CONNECT_PER_SESSION = frozenset({
    "provider", "model", "session_name", "session", "continue_", "no_session", "cwd", "socket",
    "mode", "acp", "no_start", "attach", "permission_mode"})
"""connect's options that reach the session it opens (or connect itself); the others shape
only a daemon that connect starts."""


def daemon_only(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The options given to ``forged connect`` that only a daemon it starts would take."""
    defaults = parser.parse_args([])
    return [next((flag for flag in action.option_strings if flag.startswith("--")),
                 action.option_strings[0]) for action in parser._actions
            if action.option_strings and action.dest not in CONNECT_PER_SESSION
            and not action.dest.startswith("ignored_")
            and getattr(args, action.dest, None) != getattr(defaults, action.dest, None)]


def build_status_parser(command: str = "status") -> argparse.ArgumentParser:
    description = {
        "status": "Whether a daemon runs: its pid, socket and log, its sessions and their "
                  "clients (exit 1 when none runs).",
        "stop": "Stop the daemon as SIGTERM does: runs under way get daemon.drainSeconds to "
                "finish (then are aborted), every client gets the closing events; then wait "
                "until the process has ended, and say so (exit 1 when none runs)."}[command]
    parser = argparse.ArgumentParser(prog=f"forged {command}", description=description)
    _socket_option(parser)
    return parser


def run_subcommand(command: str, argv: list[str]) -> int:
    """``forged serve``, ``connect``, ``status``, ``stop``, ``login``, ``logout``, ``pair``,
    ``devices`` or ``web``."""
    if command in ("pair", "devices", "web"):
        from ._remote import main as remote

        return remote(command, argv)
    if command in ("login", "logout"):
        _tls.start()
        from ._login import main as login

        return login(command, argv)
    try:
        if command == "serve":
            _tls.start()
            return serve(build_serve_parser().parse_args(argv))
        from ._fronts import bridge as _bridge

        if command == "connect":
            parser = build_connect_parser()
            args = parser.parse_args(argv)
            return _bridge.connect(args, argv, daemon_only(parser, args))
        socket_path = build_status_parser(command).parse_args(argv).socket
        given = ["--socket", str(socket_path)] if socket_path else []
        return (_thin.stop(given) if command == "stop" else _thin.status(given)) or 0
    except ConfigError as exc:
        log(str(exc))
        return 2


def serve(args: argparse.Namespace) -> int:
    from ._config import ServeOptions
    from ._daemon import run_daemon

    options = options_from(args)
    from ._fronts.acp import serve_in_daemon

    serve_options = ServeOptions(
        socket_path=args.socket, ws=args.ws, ws_allow_remote=args.ws_allow_remote,
        tls_cert=args.tls_cert, tls_key=args.tls_key, insecure=args.insecure,
        ws_allow_origins=args.ws_allow_origin, public_url=args.public_url,
        idle_unload_s=args.idle_unload,
        drain_grace_s=args.drain_grace, queue_limit_bytes=args.client_queue_bytes,
        upgrade=serve_in_daemon)
    mark_process()
    os.close(reserve_stdout())  # the daemon writes no protocol to stdout: logs go to stderr
    return run_reporting(run_daemon, options, serve_options)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["config", "show"]:
        return config_show(argv[2:])
    if argv[:1] == ["config"]:  # never a MESSAGE: the one command config has, and its usage
        parser = build_config_parser()
        if not argv[1:]:
            parser.error("forged config needs a command: show")
        if argv[1] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[1]!r}: forged config show is the only one")
        parser.print_help()
        return 0
    if argv[:1] == ["mcp"]:
        mcp_args = parse_mcp_args(argv[1:])
        if mcp_args.action in ("login", "logout"):
            from ._mcp_login import main as mcp_login

            return mcp_login(mcp_args)
        from ._oneshot import mcp_command

        return mcp_command(mcp_args)
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return run_subcommand(argv[0], argv[1:])
    args = parse_command_line(argv)
    _tls.start()  # before the session's modules are imported: it builds while they load
    with collector_paused():
        from ._fronts.stdio import run_stdio

    try:
        options = options_from(args)
    except ConfigError as exc:
        log(str(exc))
        return 2
    if args.export is not None:
        if len(args.export) > 2:
            log("--export takes FILE and an optional OUT")
            return 2
        from ._oneshot import export

        return export(args.export[0], args.export[1] if len(args.export) > 1 else None)
    if args.list_models is not None:
        from ._oneshot import list_models

        try:
            return list_models(options, args.list_models)
        except ForgedError as exc:
            log(str(exc))
            return 1
    mode = args.mode or ("text" if args.print_mode else "rpc")
    messages = list(args.messages)
    if mode not in ("rpc", "acp"):
        piped = "" if sys.stdin.isatty() else sys.stdin.read()
        if piped.strip():
            messages = [f"{piped.rstrip()}\n\n{messages[0]}" if messages else piped.rstrip(),
                        *messages[1:]]
        if not messages:
            log(f"{'-p' if mode == 'text' else '--mode json'} needs a MESSAGE argument or "
                "piped input")
            return 2
    elif messages:
        if args.mode is None and len(messages) == 1 and messages[0].isidentifier():
            import difflib

            known = [*SUBCOMMANDS, "config", "mcp"]
            nearest = difflib.get_close_matches(messages[0], known, n=3, cutoff=0.4)
            log(f"unknown command {messages[0]!r}"
                + (f" (did you mean {' or '.join(nearest)}?)" if nearest else "")
                + f"; the commands are {', '.join(known)} (forged --help); to send it as a "
                f"prompt: forged -p {messages[0]}")
            return 2
        log(f"MESSAGE arguments need -p or --mode json (in {mode} mode prompts come "
            "on stdin)")
        return 2
    elif mode == "rpc" and sys.stdin.isatty():
        log("reading JSON commands, one per line, on stdin (the RPC protocol: docs/protocol.md; "
            "Ctrl-D ends); to ask one thing from a terminal, try forged -p \"your question\"")
    if mode == "acp":
        with collector_paused():
            from ._fronts.acp import run_acp

        mark_process()
        return run_reporting(run_acp, options, 0, reserve_stdout())
    mark_process()
    protocol_fd = reserve_stdout()
    if mode == "rpc":
        return run_reporting(run_stdio, options, 0, protocol_fd, caller=True)
    from ._fronts.print import run_prompts

    return run_reporting(partial(run_prompts, events=mode == "json"), options, messages,
                         protocol_fd, caller=True)
