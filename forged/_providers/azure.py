"""Azure OpenAI (``azure-openai-responses``): the OpenAI Responses API of an Azure resource,
``POST {base}/responses?api-version=v1`` with the key in ``api-key``.

The base is ``AZURE_OPENAI_BASE_URL``, else ``https://{AZURE_OPENAI_RESOURCE_NAME}.openai.azure.
com/openai/v1``, else the model's ``baseUrl``; an Azure host given without its path gets
``/openai/v1``. A model is sent as its deployment: ``AZURE_OPENAI_DEPLOYMENT_NAME_MAP``
(``model=deployment,...``) names one, else the model id is the deployment's name. As the
ancestor configures Azure, all read from the environment.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from .._errors import ProviderError, ProviderStreamError
from .base import AssistantBuilder, ProviderRequest
from .http import merge_headers, open_events
from .openai import error_text, handle_responses_event, responses_params

API_VERSION = "v1"
MIN_OUTPUT_TOKENS = 16
AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".ai.azure.com")


def base_url(configured: str) -> str:
    """The resource's API root, from the environment or `configured` (the model's)."""
    base = (os.environ.get("AZURE_OPENAI_BASE_URL", "").strip()
            or (f"https://{name}.openai.azure.com/openai/v1"
                if (name := os.environ.get("AZURE_OPENAI_RESOURCE_NAME", "").strip())
                else configured.strip()))
    if not base:
        raise ProviderError("Azure OpenAI needs its address: set AZURE_OPENAI_BASE_URL or "
                            "AZURE_OPENAI_RESOURCE_NAME, or baseUrl in models.json")
    parts = urlsplit(base.rstrip("/"))
    if not parts.scheme or not parts.netloc:
        raise ProviderError(f"Invalid Azure OpenAI base URL: {base}")
    if (parts.hostname or "").endswith(AZURE_HOSTS) and parts.path.rstrip("/") in (
            "", "/openai", "/openai/v1/responses"):
        parts = parts._replace(path="/openai/v1", query="")
    return urlunsplit(parts).rstrip("/")


def deployment(model_id: str) -> str:
    for pair in os.environ.get("AZURE_OPENAI_DEPLOYMENT_NAME_MAP", "").split(","):
        name, _, deployed = pair.partition("=")
        if name.strip() == model_id and deployed.strip():
            return deployed.strip()
    return model_id


async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
    params = responses_params(request)
    params["model"] = deployment(request.model.id)
    params["max_output_tokens"] = max(params["max_output_tokens"], MIN_OUTPUT_TOKENS)
    version = os.environ.get("AZURE_OPENAI_API_VERSION") or API_VERSION
    url = f"{base_url(request.model.base_url)}/responses?api-version={version}"
    headers = merge_headers({"api-key": request.api_key, "accept": "application/json"},
                            request.headers)
    async with open_events(request, url, headers, params, out,
                           error_text=error_text) as events:
        async for _, event in events:
            if handle_responses_event(event, out):
                return
    raise ProviderStreamError("terminated: the stream ended before the message was complete")
