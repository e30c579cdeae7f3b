"""Model Context Protocol servers as tool sources (and their prompts as commands), in every
mode.

Its modules: `config` (where servers come from, what an entry says), `cache` (each server's
tools and prompts as it last listed them), `server` (one server: its task, its state, its
calls), `eras` (the protocol revisions and how one is chosen), `listing` (what a server
offers, listed), `results` (its answers as the model gets them), `servers` (a session's
servers and the tools they give the model), `prompts` (their prompts as commands),
`elicit` (a server's questions to the user, as the session's dialogs), `oauth` and
`credentials` (sign-ins to HTTP servers, and where they are kept), `sdk` (the SDK's import),
and the transports `stdio` and `http`, with `sieve` between a transport and the SDK's
session.
"""

from .cache import CACHE_DIR as CACHE_DIR, Listing as Listing, ListingCache as ListingCache
from .config import (
    MCP_FILE as MCP_FILE,
    McpConfig as McpConfig,
    ServerSpec as ServerSpec,
    exposed as exposed,
    parse_entry as parse_entry,
    startup_timeout as startup_timeout,
    tool_name as tool_name,
)
from .servers import McpServers as McpServers
