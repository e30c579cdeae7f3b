"""Model providers: each turns its SDK's stream into calls on one `AssistantBuilder`."""

from __future__ import annotations

from .base import AssistantBuilder as AssistantBuilder
from .base import Provider as Provider
from .base import ProviderRequest as ProviderRequest
from .base import ToolSpec as ToolSpec

APIS = ("anthropic-messages", "openai-completions", "openai-responses")


def provider_for(api: str) -> Provider:
    """The stream function for a model's `api`; raises `KeyError` for an unknown api."""
    if api == "anthropic-messages":
        from .anthropic import stream

        return stream
    if api == "openai-completions":
        from .openai import stream_chat

        return stream_chat
    if api == "openai-responses":
        from .openai import stream_responses

        return stream_responses
    raise KeyError(api)
