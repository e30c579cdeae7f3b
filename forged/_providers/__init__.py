"""Model providers: each speaks one wire API over HTTP (`http.py`) and turns its streamed
answer into calls on one `AssistantBuilder` (`base.py`).

Each wire API types both sides of its JSON. What forged sends is TypedDicts (``*Param``, and
the body a module's ``build_body`` makes; `openai_types.py` holds OpenAI's two APIs'). What a
service sends enters as `object` through one reader per format (``stream_event``,
``chat_chunk``, ``converse_event``, ...: `sse.json_object`, then one cast to the format's
event type); sign-in answers through `http.sign_in_answer`, error bodies through each
module's ``error_text``, which narrows with ``isinstance``.

httpx with its transport and a wire API's module take about 40 ms to import. Each loads once
per process in a worker thread, and only for an API a model can be reached over: a serving
process starts `load_providers` for the APIs of the models it has keys for as it starts (and
the TLS context from its first moment, `forged._tls`); a request made before its API loaded
waits for it without holding up the event loop.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterable

import trio

from .base import (
    AssistantBuilder as AssistantBuilder,
    Provider as Provider,
    ProviderRequest as ProviderRequest,
    ToolSpec as ToolSpec,
    reply_streaming as reply_streaming,
    streaming as streaming,
    wait_replies_ended as wait_replies_ended,
)

STREAMS = {"anthropic-messages": ("anthropic", "stream"),
           "openai-completions": ("openai", "stream_chat"),
           "openai-responses": ("openai", "stream_responses"),
           "google-generative-ai": ("google", "stream"),
           "azure-openai-responses": ("azure", "stream"),
           "google-vertex": ("vertex", "stream"),
           "mistral-conversations": ("mistral", "stream"),
           "openai-codex-responses": ("codex", "stream"),
           "bedrock-converse-stream": ("bedrock", "stream")}
"""Each wire API's module and stream function."""
APIS = tuple(STREAMS)

# httpx's package imports its command line when it can (click, pygments, rich: 7-12 ms of a
# fresh process's first request); forged never runs it. A None entry makes that import fail at
# once, and httpx falls back to its stub `httpx.main`.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

_loaded: dict[str, Provider] = {}
"""Each loaded api's stream function."""
_load_lock = threading.Lock()


def _load(apis: Iterable[str]) -> None:
    with _load_lock:
        if not _loaded:
            from . import http

            http.prepare()
        for api in apis:
            if api not in _loaded:
                module, function = STREAMS[api]
                stream = getattr(importlib.import_module(f".{module}", __name__), function)
                _loaded[api] = stream


async def load_providers(apis: Iterable[str]) -> None:
    """Load httpx and the modules of `apis` and build the TLS context in a worker thread,
    each once per process. Cancellation abandons the thread, which finishes the load for the
    next call."""
    missing = [api for api in apis if api not in _loaded]
    if missing or not _loaded:
        await trio.to_thread.run_sync(_load, missing, abandon_on_cancel=True)


def provider_for(api: str) -> Provider:
    """The stream function for a model's `api`; raises `KeyError` for an unknown api."""
    if api not in APIS:
        raise KeyError(api)

    async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
        await load_providers([api])
        if request.model.provider == "github-copilot":
            from . import copilot

            request = copilot.prepare(request)
        await _loaded[api](request, out)

    return stream
