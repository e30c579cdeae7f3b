"""Model providers: each speaks one wire API over HTTP (`http.py`) and turns its streamed
answer into calls on one `AssistantBuilder` (`base.py`).

The wire API modules and httpx with its transport take about 40 ms to import. They load once
per process in a worker thread: a serving process starts `load_providers` as it starts (and
the TLS context from its first moment, `forged._tls`), and a request made before that finished
waits for it without holding up the event loop.
"""

from __future__ import annotations

import threading

import trio

from .base import AssistantBuilder as AssistantBuilder
from .base import Provider as Provider
from .base import ProviderRequest as ProviderRequest
from .base import ToolSpec as ToolSpec

APIS = ("anthropic-messages", "openai-completions", "openai-responses", "google-generative-ai",
        "azure-openai-responses", "google-vertex", "mistral-conversations",
        "openai-codex-responses", "bedrock-converse-stream")

_loaded: dict[str, Provider] = {}
"""Each api's stream function, once loaded: filled in one assignment, never in part."""
_load_lock = threading.Lock()


def _load() -> None:
    global _loaded
    with _load_lock:
        if _loaded:
            return
        from . import anthropic, azure, bedrock, codex, google, http, mistral, openai, vertex

        http.prepare()
        _loaded = {"anthropic-messages": anthropic.stream,
                   "openai-completions": openai.stream_chat,
                   "openai-responses": openai.stream_responses,
                   "google-generative-ai": google.stream,
                   "azure-openai-responses": azure.stream,
                   "google-vertex": vertex.stream,
                   "mistral-conversations": mistral.stream,
                   "openai-codex-responses": codex.stream,
                   "bedrock-converse-stream": bedrock.stream}


async def load_providers() -> None:
    """Load the wire API modules and build the TLS context in a worker thread, once per
    process. Cancellation abandons the thread, which finishes the load for the next call."""
    if not _loaded:
        await trio.to_thread.run_sync(_load, abandon_on_cancel=True)


def provider_for(api: str) -> Provider:
    """The stream function for a model's `api`; raises `KeyError` for an unknown api."""
    if api not in APIS:
        raise KeyError(api)

    async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
        await load_providers()
        if request.model.provider == "github-copilot":
            from . import copilot

            request = copilot.prepare(request)
        await _loaded[api](request, out)

    return stream
