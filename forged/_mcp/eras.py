"""The protocol revisions forged speaks with a server, and how one is chosen.

Two eras of MCP:

- **2025-11-25** (and the revisions before it): a connection opens with the ``initialize``
  handshake; the server says its lists changed with notifications
  (``notifications/tools/list_changed``) and sends its log lines once asked
  (``notifications/message``).
- **2026-07-28**: stateless. ``server/discover`` tells what the server speaks and offers; each
  request carries its revision, the client's name and capabilities (and whether it wants log
  lines: forged asks for them all, as the handshake era sends them); changes come on a
  ``subscriptions/listen`` stream, the client's to open; listings say in ``ttlMs`` how long
  they stay fresh; a call may answer that it needs input first.

An entry's ``protocol`` chooses (`forged._mcp.config.PROTOCOLS`): ``auto`` asks
``server/discover`` and falls back to the handshake when the server gives no evidence of
2026-07-28 (a method it does not know, an answer naming older revisions only); ``legacy``
opens with the handshake; ``2026-07-28`` speaks it from the first request, unasked (what the
server offers is then unknown until asked). The SDK's ``Client`` negotiates, over forged's own
transports and the sieve (`forged._mcp.stdio`, `forged._mcp.http`, `forged._mcp.sieve`):
their bounds hold in both eras.

Imported with the SDK (a server's task, once it has loaded).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import attrs
import trio
from mcp.client.client import Client
from mcp.client.session import ElicitationFnT, LoggingFnT, MessageHandlerFnT
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared.exceptions import MCPError
from mcp_types import METHOD_NOT_FOUND, Implementation, LoggingLevel
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .._log import log
from .._version import __version__
from .config import ServerSpec

LOG_LEVEL: LoggingLevel = "debug"
"""The log lines a 2026-07-28 server is asked for, on each request: all of them, as a
handshake-era server sends them unasked."""
MAX_LISTEN_BACKOFF_S = 30.0


class _Opened:
    """The streams forged's transport opened, as the SDK's ``Client`` takes a transport:
    entering hands them over; the connection's own exit stack closes them."""

    def __init__(self, read: Any, write: Any) -> None:
        self._streams = (read, write)

    async def __aenter__(self) -> tuple[Any, Any]:
        return self._streams

    async def __aexit__(self, *exc: object) -> None:
        return None


async def open_client(stack: contextlib.AsyncExitStack, spec: ServerSpec, read: Any,
                      write: Any, *, negotiated_by: float, on_log: LoggingFnT,
                      on_message: MessageHandlerFnT,
                      on_elicit: ElicitationFnT | None = None) -> Client:
    """The SDK's client over `read` and `write`, its revision negotiated as the entry's
    ``protocol`` says, by `negotiated_by` (trio's clock) at the latest.

    Resource handling: the client lives in a task of a nursery on `stack`, which stops it
    as it unwinds. Error handling: what the negotiation raised (the SDK's ``MCPError``, a
    transport's error, `trio.TooSlowError` past the deadline) is raised here; what fails
    later fails that nursery, and with it the connection."""
    client = Client(
        _Opened(read, write), mode=spec.protocol, read_timeout_seconds=spec.timeout_s,
        logging_callback=on_log, log_level=LOG_LEVEL, message_handler=on_message,
        elicitation_callback=on_elicit,  # None: elicitation is not offered
        client_info=Implementation(name="forged", version=__version__),
        cache=None)  # forged keeps its own listings, on trio's clock
    client_nursery = await stack.enter_async_context(trio.open_nursery())
    stack.callback(client_nursery.cancel_scope.cancel)
    with trio.fail_at(negotiated_by):  # the start only: the task outlives it
        opened: Client = await client_nursery.start(_hold, client)
    return opened


async def _hold(client: Client, *, task_status: trio.TaskStatus[Client]) -> None:
    """Enter `client` (it negotiates) and keep it open until cancelled."""
    async with client:
        task_status.started(client)
        await trio.sleep_forever()


def modern(client: Client) -> bool:
    """Whether the connection speaks 2026-07-28 (or a later revision the SDK knows)."""
    return client.protocol_version in MODERN_PROTOCOL_VERSIONS


@attrs.frozen(kw_only=True)
class Offer:
    """What a server said it offers, each None when it was not asked (``protocol``
    ``2026-07-28``: a request will tell)."""

    prompts: bool | None
    resources: bool | None
    listen: frozenset[str]
    """Whose changes (``tools``, ``prompts``) a ``subscriptions/listen`` stream may tell."""


def offer(client: Client, spec: ServerSpec) -> Offer:
    """What the negotiation said the server offers (nothing, when it was not asked)."""
    if spec.protocol in MODERN_PROTOCOL_VERSIONS:
        return Offer(prompts=None, resources=None, listen=frozenset({"tools", "prompts"}))
    capabilities = client.server_capabilities
    changing = {"tools": capabilities.tools, "prompts": capabilities.prompts}
    return Offer(prompts=capabilities.prompts is not None,
                 resources=capabilities.resources is not None,
                 listen=frozenset(kind for kind, offered in changing.items()
                                  if modern(client) and offered and offered.list_changed))


async def keep_listening(client: Client, name: str, *, kinds: frozenset[str],
                         listened: Callable[[frozenset[str]], None]) -> None:
    """Keep a ``subscriptions/listen`` stream open for the changes of `kinds` (``tools``,
    ``prompts``), telling `listened` what the server honours each time one opens (the
    events themselves reach the session's message handler, as notifications do) and an
    empty set while none is open. A stream that ends is opened again after a back-off
    (0.25 s, doubling to 30 s while streams end within 30 s); nothing is replayed, so the
    caller lists again as each opens. A server that refuses the request (one that does
    not serve the method, say) ends it. Runs until cancelled."""
    failures = 0
    while True:
        opened_at = math.inf
        try:
            async with client.listen(tools_list_changed="tools" in kinds,
                                     prompts_list_changed="prompts" in kinds) as stream:
                opened_at = trio.current_time()
                honoured = stream.honored
                listened(frozenset(kind for kind, on in (
                    ("tools", honoured.tools_list_changed),
                    ("prompts", honoured.prompts_list_changed)) if on))
                async for _ in stream:
                    pass
            why = "the server closed it"
        except ListenNotSupportedError:
            return
        except MCPError as exc:
            if opened_at == math.inf:  # refused: listings go by their ttlMs alone
                if exc.code != METHOD_NOT_FOUND:
                    log(f"MCP server {name}: subscriptions/listen refused "
                        f"({exc.error.message})")
                listened(frozenset())
                return
            why = exc.error.message
        except Exception as exc:  # SubscriptionLost, a timeout, a broken stream: again
            why = str(exc) or type(exc).__name__
        listened(frozenset())
        lasted = trio.current_time() - opened_at
        failures = 1 if lasted > MAX_LISTEN_BACKOFF_S else failures + 1
        pause = min(MAX_LISTEN_BACKOFF_S, 0.25 * 2 ** (failures - 1))
        log(f"MCP server {name}: its subscriptions/listen stream ended ({why}); again in "
            f"{pause:g} s")
        await trio.sleep(pause)
