"""Start-up: what forged loads late and why (`DEFERRED`), and its one trick with the
interpreter, the cyclic collector paused while forged's modules load.

Importing trio and forged makes ~40,000 objects that live as long as the process; with the
collector on, the allocations run a dozen collections over them, ~13 ms of a ~200 ms start.
`collector_paused` turns it off for an import and, after it, moves what the import made into
the collector's permanent generation (`gc.freeze`) before turning it on again, so later
collections never scan them either. A few cycles an import leaves behind stay with them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

DEFERRED = {
    # The command line loads what the arguments ask for, nothing before.
    "forged._thin": "connect and status first try the thin path: the standard library alone",
    "forged._cli": "the full path, for everything the thin path does not answer",
    "forged._codecache": "installed on the full path only, before attrs compiles anything",
    "forged._startup": "the collector's pause, on the full path only",
    "forged._fronts.stdio": "one front per process: the one the mode names",
    "forged._fronts.print": "one front per process: the one the mode names",
    "forged._fronts.acp": "one front per process: the one the mode names",
    "forged._fronts.bridge": "forged connect's full path, after the thin one gave up",
    "forged._oneshot": "the one-shot commands (--export, mcp, config, ...)",
    "forged._telemetry": "whether telemetry is on: as a mode starts, after argv is read",
    "forged._otel": "telemetry's spans: only when the user turned telemetry on",
    "forged._otel_export": "the OpenTelemetry SDK (~150 ms): in a thread, as telemetry starts",
    "opentelemetry": "its exporters: as telemetry starts (gRPC's only with forged[grpc])",
    "forged._daemon": "forged serve",
    "forged._login": "forged login and logout",
    "forged._remote": "forged pair and forged devices",
    "forged._mcp_login": "forged mcp login and logout, and mcp list's sign-ins",
    "forged._config": "options, models and sessions: after argv is read (--help needs none)",
    "forged._resources": "skills and templates: after argv is read",
    "forged._tools": "the tool table: after argv is read (--tools checks names in it)",
    "forged._sandbox": "forged config show's sandbox probe",
    "forged._settings": "settings, for the subcommands that report them",
    "forged._paths": "the agent and runtime folders, for the subcommands that use them",
    "forged._tools.guard": "the permission policy, for the subcommands that report it",
    "forged._tools.environment": "the command environment, for the subcommands that report it",
    "forged._tools.base": "forged mcp list's tool wrapping",
    "forged._ui": "forged mcp list's dialogs (none answer)",
    "forged._mcp": "forged mcp: the servers' configuration and connections",
    # forged connect, when it must go the full way: what that way needs, then.
    "forged._connection": "connect's full path: the socket and its lines",
    "forged._jsonl": "connect's full path: line splitting",
    "forged._wire": "connect's full path: the opening's answer as objects",
    "forged.client": "connect's full path: the one reader of forged's lines",
    "forged._errors": "connect's full path: the ACP bridge's error codes",
    "forged._fronts.acp.backends": "connect --acp's full path",
    "forged._fronts.acp.jsonrpc": "connect --acp's full path",
    # A session pays for a part the first time it uses it.
    "forged._session": "import forged (the version, the client) loads no session",
    "forged._opening": "import forged (the version, the client) loads no session",
    "forged._run": "the run driver: at the first prompt",
    "forged._compaction": "at the first compaction",
    "forged._checkpointing": "checkpoints: at the first run that may change files",
    "forged._export": "the HTML page: at the first export",
    "forged._tools.bash": "the shell: at the first command",
    "forged._tools.files": "the file tools: when the tool table is built",
    "forged._tools.search": "grep and find: when the tool table is built",
    "forged._models": "the model registry: login lists providers without a session",
    "forged._catalogue": "the catalogue: login lists providers without a session",
    "forged._providers.http": "the HTTP client (httpx, ~40 ms): at the first request",
    "forged._providers.oauth": "sign-in flows: when a key must be refreshed or made",
    "forged._providers.copilot": "GitHub Copilot's token exchange: its provider only",
    "forged._providers.scripted": "the scripted provider: --provider scripted only",
    "forged._mcp.http": "MCP over HTTP: with an http server configured",
    "forged._mcp.stdio": "MCP over stdio: with a stdio server configured",
    "forged._mcp.oauth": "MCP's OAuth sign-ins: with an HTTP server configured",
    "forged._mcp.eras": "the SDK's client and its protocol revisions: once a server connects",
    "forged._mcp.elicit": "a server's question to the user: when one asks",
    "forged._transports.unix": "the daemon's listeners: once it serves",
    "forged._transports.websocket": "the daemon's listeners: with --ws",
    # Other people's code, costly to import and needed by few.
    "mcp": "the MCP SDK (pydantic, ~300 ms): in a thread, once a server is configured",
    "mcp_types": "the MCP SDK's types: with it",
    "httpx2": "the MCP SDK's HTTP client: with it",
    "botocore": "Amazon Bedrock's signer (~150 ms): that provider only",
    "google": "google-auth for Vertex AI's application default credentials only",
    "httpx": "google-auth's token request (Vertex AI only); the daemon's nudges, once a "
             "target is configured",
    "h11": "the scripted server: --provider scripted and tests",
    "jiter": "partial JSON of a tool call's arguments while they stream",
    "jsonschema": "a plugin tool's schema, checked when registered",
    "yaml": "a skill's or template's frontmatter, when one has some",
    "segno": "forged pair's QR code, on a terminal only",
    "py_vapid": "Web Push's VAPID key: once a page asks for it or a push goes out",
    "http_ece": "Web Push's encryption: once a push goes out to a subscribed browser",
    "cryptography": "Web Push's keys: with py_vapid and http_ece",
    "pathspec": ".gitignore rules: find and the skills' folders",
    "trio_websocket": "the client's WebSocket: open_websocket only",
    "certifi": "the CA bundle: at the first TLS connection",
    "attr": "attrs' compiler, hooked by the code cache as it installs",
    "cattrs": "cattrs' compiler, hooked by the code cache as it installs",
    # The standard library: what start-up does without.
    "difflib": "closest-name suggestions and edit diffs, when needed",
    "email": "an HTTP Retry-After date",
    "importlib": "installed plugins' entry points",
    "json": "the thin path's rare answers (no orjson there)",
    "re": "reading an MCP server's sandbox failure",
    "socket": "naming a network error",
    "sysconfig": "where ripgrep may be installed",
    "webbrowser": "forged mcp login and forged web, where there is a browser to open",
}
"""Each module forged imports inside a function rather than at the top of a module, by its
name (forged's own) or its top package (others'), with why it waits. ``tests/test_layout.py``
holds this list and the code to each other: an import inside a function names its module
here, and each entry is still imported so."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()
