"""ChatGPT's Codex backend (``openai-codex-responses``): the OpenAI Responses API behind a
ChatGPT Plus or Pro sign-in, ``POST {baseUrl}/codex/responses``, as the ancestor sends it.

The key is the subscription's access token (auth.json, refreshed by
`forged._providers.oauth`); the ChatGPT account it names goes in ``chatgpt-account-id``. The
system prompt is a leading ``developer`` item rather than ``instructions`` (the backend puts
``instructions`` after the input, out of the prompt cache's reach), thinking off is effort
``none``, and the session is the prompt cache key and the ``session-id`` header. forged
speaks it over server-sent events, not the ancestor's WebSocket (which falls back to them).

A usage limit (429, or a ``usage_limit_reached`` error) reads as the ancestor words it: "You
have hit your ChatGPT usage limit (plus plan). Try again in ~N min."
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Literal, NotRequired, TypedDict

from .._errors import ProviderError, ProviderStreamError
from .base import AssistantBuilder, ProviderRequest
from .http import merge_headers, open_events
from .oauth import codex_account
from .openai import handle_responses_event, reasoning_effort, responses_params
from .openai_types import InputItemParam, ReasoningParam, ResponsesToolParam

DEFAULT_BASE_URL = "https://chatgpt.com/backend-api"
MIN_OUTPUT_TOKENS = 16
CACHE_KEY_MAX = 64


def url_of(base: str) -> str:
    base = (base.strip() or DEFAULT_BASE_URL).rstrip("/")
    if base.endswith("/codex/responses"):
        return base
    return f"{base}/responses" if base.endswith("/codex") else f"{base}/codex/responses"


class TextParam(TypedDict):
    verbosity: Literal["low"]


class CodexBody(TypedDict):
    """The backend's Responses body, its keys in the order they are sent."""

    model: str
    store: bool
    stream: bool
    input: list[InputItemParam]
    text: TextParam
    include: list[str]
    tool_choice: Literal["auto"]
    parallel_tool_calls: bool
    max_output_tokens: int
    prompt_cache_key: NotRequired[str]
    tools: NotRequired[list[ResponsesToolParam]]
    reasoning: NotRequired[ReasoningParam]


def build_body(request: ProviderRequest) -> CodexBody:
    model = request.model
    params = responses_params(request)
    body: CodexBody = {"model": params["model"], "store": False, "stream": True,
                            "input": params["input"], "text": {"verbosity": "low"},
                            "include": ["reasoning.encrypted_content"],
                            "tool_choice": "auto", "parallel_tool_calls": True,
                            "max_output_tokens": max(params["max_output_tokens"],
                                                     MIN_OUTPUT_TOKENS)}
    if request.system_prompt:
        body["input"] = [{"role": "developer", "content": request.system_prompt},
                         *body["input"]]
    if request.session_id:
        body["prompt_cache_key"] = request.session_id[:CACHE_KEY_MAX]
    if "tools" in params:
        body["tools"] = params["tools"]
    if model.reasoning:
        level = request.thinking_level
        if level != "off":
            effort = reasoning_effort(model, level)
            if effort is not None:
                body["reasoning"] = {"effort": effort, "summary": "auto"}
        else:
            off = (model.thinking_level_map or {}).get("off", "none")
            if off is not None:
                body["reasoning"] = {"effort": off}
    return body


def error_text(body: object) -> str | None:
    """The error's message; a usage limit as the ancestor words it."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    code = str(error.get("code") or error.get("type") or "")
    if any(limit in code for limit in ("usage_limit_reached", "usage_not_included",
                                       "rate_limit_exceeded")):
        return usage_limit(error)
    message = error.get("message")
    return message if isinstance(message, str) and message else None


def usage_limit(error: Mapping[str, object]) -> str:
    plan = f" ({str(error['plan_type']).lower()} plan)" if error.get("plan_type") else ""
    resets = error.get("resets_at")
    when = (f" Try again in ~{max(0, round((resets - time.time()) / 60))} min."
            if isinstance(resets, int | float) else "")
    return f"You have hit your ChatGPT usage limit{plan}.{when}"


async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
    account = codex_account(request.api_key)
    if account is None:
        raise ProviderError("The openai-codex key is not a ChatGPT sign-in token: sign in "
                            "with `forged login openai-codex` (or pi's /login)")
    headers = {"authorization": f"Bearer {request.api_key}", "chatgpt-account-id": account,
               "openai-beta": "responses=experimental", "accept": "text/event-stream",
               "originator": "pi"}
    if request.session_id:
        headers["session-id"] = headers["x-client-request-id"] = request.session_id[
            :CACHE_KEY_MAX]
    async with open_events(request, url_of(request.model.base_url),
                           merge_headers(headers, request.headers), build_body(request), out,
                           error_text=error_text) as events:
        async for _, event in events:
            if handle_responses_event(event, out):
                return
    raise ProviderStreamError("terminated: the stream ended before the message was complete")
