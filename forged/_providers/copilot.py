"""GitHub Copilot: its models (Claude's, OpenAI's, Gemini's) reached with a Copilot sign-in,
over the wire API each speaks, as the ancestor reaches them.

The sign-in (auth.json ``github-copilot``) keeps a GitHub token as ``refresh`` and a short-lived
Copilot token as ``access``, which names the API host to use (``proxy-ep=proxy.X`` in it:
``https://api.X``). `refresh` trades the GitHub token for a new Copilot token; `prepare` points
a request at the token's host and adds the headers Copilot asks for: who started the turn
(``X-Initiator``: ``user`` for a prompt, ``agent`` after a tool result), the intent, and
``Copilot-Vision-Request`` when the context holds an image.
"""

from __future__ import annotations

import re

import attrs

from .. import _wire as w
from .._auth import EARLY_MS, Entry
from .._errors import ProviderError
from .base import ProviderRequest
from .http import get_json, redirected

HEADERS = {"user-agent": "GitHubCopilotChat/0.35.0", "editor-version": "vscode/1.107.0",
           "editor-plugin-version": "copilot-chat/0.35.0",
           "copilot-integration-id": "vscode-chat"}
CLIENT_ID = "Iv1.b507a08c87ecfe98"
DEFAULT_BASE_URL = "https://api.individual.githubcopilot.com"
_PROXY = re.compile(r"proxy-ep=([^;]+)")


def urls(domain: str = "github.com") -> dict[str, str]:
    return {"device": f"https://{domain}/login/device/code",
            "access": f"https://{domain}/login/oauth/access_token",
            "copilot": f"https://api.{domain}/copilot_internal/v2/token"}


def base_url(token: str, enterprise: str | None = None) -> str:
    found = _PROXY.search(token)
    if found:
        base = "https://" + re.sub(r"^proxy\.", "api.", found[1])
    elif enterprise:
        base = f"https://copilot-api.{enterprise}"
    else:
        base = DEFAULT_BASE_URL
    return redirected(base + "/").rstrip("/")


async def copilot_token(github_token: str, enterprise: str | None = None) -> Entry:
    """A Copilot token for a GitHub token: the auth.json fields it sets."""
    answer = await get_json(urls(enterprise or "github.com")["copilot"],
                            {"authorization": f"Bearer {github_token}", **HEADERS},
                            "get a GitHub Copilot token")
    token, expires = answer.get("token"), answer.get("expires_at")
    if not isinstance(token, str) or not isinstance(expires, int | float):
        raise ProviderError(f"GitHub answered no Copilot token: {answer}")
    return {"access": token, "refresh": github_token,
            "expires": int(expires * 1000 - EARLY_MS)}


def prepare(request: ProviderRequest) -> ProviderRequest:
    """`request` as Copilot takes it: at the sign-in's host, with Copilot's headers."""
    last = request.messages[-1] if request.messages else None
    images = any(isinstance(block, w.ImageContent) for message in request.messages
                 if isinstance(message, w.UserMessage | w.ToolResultMessage)
                 for block in message.content)
    headers: dict[str, str] = {
        **HEADERS, **request.headers,
        "X-Initiator": "user" if isinstance(last, w.UserMessage) else "agent",
        "Openai-Intent": "conversation-edits"}
    if images:
        headers["Copilot-Vision-Request"] = "true"
    model = attrs.evolve(request.model, base_url=base_url(request.api_key))
    return attrs.evolve(request, model=model, headers=headers)
