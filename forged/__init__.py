"""forged: a headless coding-agent daemon speaking the agent-forge RPC protocol.

Layout: one flat package of private modules, dependencies pointing down this list:
`_cli` (argv, modes) -> `_daemon` (the supervision tree) -> `_connection` (reader, writer) ->
`_dispatch` (command handlers) -> `_session` (state, queues, cancel scopes) -> `_loop` (one
run) -> `_providers/`, `_tools/`, `_models`, `_resources` -> `_wire` and `_codec` (the
protocol's classes and their converter) -> `_jsonl`, `_errors`.
"""

__version__ = "0.1.0"

from ._errors import CommandError as CommandError
from ._errors import ConfigError as ConfigError
from ._errors import ForgedError as ForgedError
from ._errors import ProviderError as ProviderError
from ._session import Session as Session
from ._session import SessionConfig as SessionConfig
