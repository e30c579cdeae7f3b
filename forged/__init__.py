"""forged: a headless coding-agent daemon speaking the agent-forge RPC protocol.

Layout: one flat package of private modules, dependencies pointing down this list:
`_cli` (argv, modes) -> `_daemon` (the supervision tree) -> `_connection` (reader, writer) ->
`_dispatch` (command handlers) -> `_session` (state, queues, cancel scopes) -> `_loop` (one
run) -> `_providers/`, `_tools/`, `_models`, `_resources` -> `_wire` and `_codec` (the
protocol's classes and their converter) -> `_jsonl`, `_errors`.
"""

import typing

__version__ = "0.1.0"
__all__ = ["CommandError", "ConfigError", "ForgedError", "ProviderError", "Session",
           "SessionConfig"]

from ._errors import CommandError as CommandError
from ._errors import ConfigError as ConfigError
from ._errors import ForgedError as ForgedError
from ._errors import ProviderError as ProviderError

if typing.TYPE_CHECKING:
    from ._session import Session as Session
    from ._session import SessionConfig as SessionConfig


def __dir__() -> list[str]:
    return sorted([*globals(), "Session", "SessionConfig"])


def __getattr__(name: str) -> typing.Any:
    # The session and everything under it load on first use: `forged._cli` starts its
    # warm-up before them, and `forged.client` never needs them.
    if name in ("Session", "SessionConfig"):
        from . import _session

        return getattr(_session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
