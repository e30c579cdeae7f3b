"""forged: a headless coding-agent daemon speaking the agent-forge RPC protocol.

One package of private modules in layers, from the top; a module imports only from its own
layer and the layers below it, and no import cycle exists (``tests/test_layout.py`` checks both
against the import graph). A package named here stands for all its modules::

    __main__ _entry _cli _launch         the command line: argv to a mode (connect and status
                                         first try the thin path), run under trio
    _fronts                              how a process meets a client: stdio, -p and
                                         --mode json, ACP, forged connect
    client                               the public client of the protocol
    _daemon _oneshot _login _mcp_login _remote
                                         the daemon's tree and shutdown; --export, ...;
                                         forged login and logout, forged mcp login and
                                         logout; forged pair and devices
    _transports                          the daemon's listeners: the Unix socket, the
                                         WebSocket
    _hub                                 the daemon's live sessions and their clients
    _live                                one live session: its clients, stamps, replay
    _config                              options, models, each session's configuration
    _dispatch                            a command to its handler; an agent opened
    _session                             one session: state, queues, events, what runs
    _run _switching _model_choice _queues _opening _asking _toolset _direct_bash
                                         its run driver, its files, its model, its queues
    _compaction _loop _plugins _export _mcp _checkpointing
                                         summaries, one run, plugins, the HTML page, MCP,
                                         the session's checkpoints
    _models _catalogue _resources _context _stats _retry
                                         models, prompts and skills, what the model sees
    _providers _tools _store _settings _ui _auth _notify _webpush
                                         the model APIs, tools, session files, settings,
                                         dialogs, saved credentials (auth.json), the
                                         daemon's nudges (ntfy, webhooks, Web Push)
    _connection _codec _devices          lines in and out; wire classes to JSON; paired
                                         devices, their roles and codes
    _telemetry _otel _otel_export        traces and metrics: forged's hooks, what they do when
                                         the user turns them on, the SDK's exporting
    _wire                                the protocol's classes
    _jsonl _paths _process _values _sandbox _checkpoints _log _time _tls _systemd _version _startup
    _vocabulary                          the ground floor; the protocol's closed word lists
    _seccomp _gitfolders                 the sandbox's seccomp filter; git's folders as it
                                         keeps them
    _codecache                           the code attrs and cattrs compile, kept between
                                         runs
    _thin _runtime _errors               connect and status on the standard library alone;
                                         the runtime folder and its trust rule; the
                                         exception tree

Records are attrs classes. Those holding state compare by identity and keep object's repr
(``eq=False, repr=False``: attrs compiles both for each class, ~10 ms of every start across
forged's modules); frozen value types keep attrs' equality. The protocol's classes share one
repr (`forged._wire`).

The supervision trees are drawn in `forged._fronts.stdio` (one session on stdio) and
`forged._daemon` (many sessions).
"""

from ._version import __version__ as __version__

__all__ = ["CommandError", "ConfigError", "ForgedError", "ProviderError", "Session",
           "SessionConfig"]

from ._errors import (
    CommandError as CommandError,
    ConfigError as ConfigError,
    ForgedError as ForgedError,
    ProviderError as ProviderError,
)

TYPE_CHECKING = False  # not typing's: forged connect loads this package, typing costs it ~2 ms
if TYPE_CHECKING:
    from typing import Any

    from ._opening import SessionConfig as SessionConfig
    from ._session import Session as Session
del TYPE_CHECKING


def __dir__() -> list[str]:
    return sorted([*globals(), "Session", "SessionConfig"])


def __getattr__(name: str) -> "Any":
    # The session and everything under it load on first use: `forged._cli` starts its
    # warm-up before them, and `forged.client` never needs them.
    if name == "Session":
        from ._session import Session

        return Session
    if name == "SessionConfig":
        from ._opening import SessionConfig

        return SessionConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
