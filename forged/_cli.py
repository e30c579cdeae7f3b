"""The command line: argv to `Options`, then the chosen mode under `trio.run`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import trio

from . import __version__, _tls
from ._errors import ConfigError, ForgedError
from ._log import log, reserve_stdout

if TYPE_CHECKING:
    from ._config import Options

DESCRIPTION = """\
forged: a headless coding agent speaking the agent-forge RPC protocol.

A client writes JSON commands (one per line) to stdin and reads responses and events
(one JSON object per line) from stdout. See docs/protocol.md for the protocol."""

EPILOG = """\
environment:
  AGENT_FORGE_DIR     the agent directory (default ~/.agent-forge/agent): models.json,
                      AGENTS.md and sessions live here
  ANTHROPIC_API_KEY   key for the built-in anthropic provider
  OPENAI_API_KEY      key for the built-in openai provider

example (no API key needed):
  forged --mode rpc --provider scripted --script forged/examples/fix-greeting.json

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
                      whether a daemon runs, its sessions and clients"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forged", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"forged {__version__}")
    parser.add_argument("--mode", choices=["rpc", "json", "text"], default=None,
                        help="rpc (default): JSON commands in on stdin, responses and events "
                        "out on stdout; json: run the MESSAGES and print the session header "
                        "and every event as JSON lines; text: as -p")
    parser.add_argument("-p", "--print", dest="print_mode", action="store_true",
                        help="run the MESSAGES one after another, print the last reply's text "
                        "and exit (1 if it failed)")
    parser.add_argument("messages", nargs="*", metavar="MESSAGE",
                        help="with -p or --mode json: the prompts to send, in order; piped "
                        "stdin is put before the first")
    add_session_options(parser)
    return parser


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
    parser.add_argument("--append-system-prompt", metavar="TEXT|PATH",
                        help="add this text or file to the system prompt (instead of "
                        "APPEND_SYSTEM.md)")
    parser.add_argument("--plugin", action="append", type=Path, default=[], metavar="PATH",
                        help="load a plugin (a .py file or a package folder) for this run "
                        "(repeatable)")
    parser.add_argument("--trust-project", action="store_true",
                        help="load the project's own plugins (.agent-forge/agent/plugins) "
                        "this time, as if it were in trustedProjects")
    parser.add_argument("--script", type=Path,
                        help="with --provider scripted: the JSON script of model replies")


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


def config_show(argv: list[str]) -> int:
    from ._paths import agent_dir
    from ._settings import Settings

    args = build_config_parser().parse_args(argv)
    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    settings = Settings(agent_dir(), cwd)
    if settings.project_untrusted_note:
        log(f"{settings.project_untrusted_note}")
    rows = settings.explain()
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

    cwd = (args.cwd or Path.cwd()).expanduser().resolve()
    if not cwd.is_dir():
        raise ConfigError(f"--cwd {cwd}: not a directory")
    return Options(cwd=cwd, provider=args.provider, model=args.model, script=args.script,
                      session_name=args.session_name, no_session=args.no_session,
                      session_dir=args.session_dir, session=args.session,
                      continue_=args.continue_,
                      models=[p.strip() for p in args.models.split(",") if p.strip()]
                      if args.models else None,
                      extra=ExtraPaths(skills=args.skill, prompt_templates=args.prompt_template,
                                       system_prompt=args.system_prompt,
                                       append_system_prompt=args.append_system_prompt),
                      plugins=args.plugin, trust_project=args.trust_project)


SUBCOMMANDS = ("serve", "connect", "status")


def _socket_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", type=Path, metavar="PATH",
                        help="the daemon's Unix socket (default "
                        "$XDG_RUNTIME_DIR/forged/forged.sock)")


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
                        help="allow --ws on an address other than loopback")
    parser.add_argument("--ws-allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="a browser origin (https://app.example) whose pages may "
                        "connect; requests with any other Origin are refused (repeatable)")
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
    parser.add_argument("--no-start", action="store_true",
                        help="fail if no daemon runs instead of starting one")
    parser.add_argument("--attach", metavar="SESSION-ID",
                        help="attach to this live or stored session instead of a new one")
    add_session_options(parser)
    return parser


def build_status_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forged status", description="Whether a daemon "
                                     "runs, and its sessions and clients.")
    _socket_option(parser)
    return parser


def run_subcommand(command: str, argv: list[str]) -> int:
    """``forged serve``, ``forged connect`` or ``forged status``."""
    try:
        if command == "serve":
            _tls.start()
            return serve(build_serve_parser().parse_args(argv))
        from . import _bridge

        if command == "connect":
            return _bridge.connect(build_connect_parser().parse_args(argv), argv)
        return trio.run(_bridge.status, build_status_parser().parse_args(argv).socket)
    except ConfigError as exc:
        log(str(exc))
        return 2


def serve(args: argparse.Namespace) -> int:
    from ._config import ServeOptions
    from ._daemon import run_daemon

    options = options_from(args)
    serve_options = ServeOptions(
        socket_path=args.socket, ws=args.ws, ws_allow_remote=args.ws_allow_remote,
        ws_allow_origins=args.ws_allow_origin, idle_unload_s=args.idle_unload,
        drain_grace_s=args.drain_grace, queue_limit_bytes=args.client_queue_bytes)
    os.close(reserve_stdout())  # the daemon writes no protocol to stdout: logs go to stderr
    return run_reporting(run_daemon, options, serve_options)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["config", "show"]:
        return config_show(argv[2:])
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return run_subcommand(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    _tls.start()  # before the session's modules are imported: it builds while they load
    from ._print import run_prompts
    from ._transports.stdio import run_stdio

    try:
        options = options_from(args)
    except ConfigError as exc:
        log(str(exc))
        return 2
    mode = args.mode or ("text" if args.print_mode else "rpc")
    messages = list(args.messages)
    if mode != "rpc":
        piped = "" if sys.stdin.isatty() else sys.stdin.read()
        if piped.strip():
            messages = [f"{piped.rstrip()}\n\n{messages[0]}" if messages else piped.rstrip(),
                        *messages[1:]]
        if not messages:
            log(f"--mode {mode} needs a MESSAGE argument or piped input")
            return 2
    elif messages:
        log("MESSAGE arguments need -p or --mode json (in rpc mode prompts come "
              "as commands on stdin)")
        return 2
    protocol_fd = reserve_stdout()
    if mode == "rpc":
        return run_reporting(run_stdio, options, 0, protocol_fd)
    return run_reporting(partial(run_prompts, events=mode == "json"), options, messages,
                         protocol_fd)


def run_reporting(main: Callable[..., Awaitable[int | None]], *args: Any) -> int:
    """`trio.run(main, *args)`: its exit code (0 when it returns none), or 1 with the errors
    on stderr when it failed on purpose (a bad --model, a locked session...)."""
    try:
        return trio.run(main, *args) or 0
    except (ForgedError, BaseExceptionGroup) as exc:
        problems = _startup_errors(exc)
        if not problems:
            raise
        for problem in problems:
            log(str(problem))
        return 1


def _startup_errors(exc: BaseException) -> list[ForgedError]:
    """The errors forged raised on purpose that `exc` is made of (a bad --model, a locked
    session...), or [] if it holds anything else (a bug: the traceback is shown)."""
    if isinstance(exc, ForgedError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        found = [_startup_errors(inner) for inner in exc.exceptions]
        if all(found):
            return [error for errors in found for error in errors]
    return []
