"""Subscriptions' OAuth tokens: refreshing an expired access token saved in auth.json, as the
ancestor does for each provider it signs in to.

A refresh happens under auth.json's lock (`forged._auth.AuthFile.modify`): the entry is read
again there, and if another process (a forged, a pi) refreshed it meanwhile its token is used
as it is; otherwise the provider's token endpoint is asked and the new tokens replace the old
ones, the entry's other fields kept. Without that, two processes refreshing at once would each
spend the same refresh token, and the provider would revoke the second.

``FORGED_OAUTH_ORIGINS`` (a JSON object) sends a provider's sign-in requests to another origin,
``{"https://auth.openai.com": "http://127.0.0.1:8080"}``: a test double, or a gateway.

Error handling: a refused or failed refresh is a `ProviderError` that says which provider and
what its endpoint answered; the turn ends with it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable, Mapping

import orjson

from .._auth import EARLY_MS, AuthFile, Entry, expired
from .._errors import ProviderError
from . import copilot
from .http import SignInAnswer, get_json as get_json, post_raw as post_raw

ANTHROPIC_CLIENT_ID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
ANTHROPIC_TOKEN_URL = "https://platform.claude.com/v1/oauth/token"
CODEX_CLIENT_ID = "app_EMoamEEZ73f0CkXaXp7hrann"
CODEX_TOKEN_URL = "https://auth.openai.com/oauth/token"
CODEX_CLAIM = "https://api.openai.com/auth"


async def post_json(url: str, body: Mapping[str, object], doing: str) -> SignInAnswer:
    """POST `body`; the JSON answer, or a `ProviderError` saying what failed."""
    status, answer = await post_raw(url, json=body)
    if status >= 400:
        raise ProviderError(f"Could not {doing} ({status}): {answer}")
    return answer


async def post_token(url: str, provider: str, *, json: Mapping[str, object] | None = None,
                     form: Mapping[str, str] | None = None, doing: str | None = None
                     ) -> SignInAnswer:
    """POST to a token endpoint; its JSON answer (with an ``access_token``), or a
    `ProviderError` saying what failed."""
    doing = doing or f"refresh the {provider} sign-in"
    status, answer = await post_raw(url, json=json, form=form)
    if status >= 400:
        raise ProviderError(f"Could not {doing} ({status}): {answer}")
    if not answer.get("access_token"):
        raise ProviderError(f"Could not {doing}: no access_token in the answer")
    return answer


async def anthropic_tokens(body: dict[str, str], doing: str, refresh: str | None = None
                           ) -> Entry:
    """Claude's tokens for `body` (a code's exchange, a refresh): the entry's fields, the
    refresh token kept when the answer brings no new one."""
    answer = await post_token(ANTHROPIC_TOKEN_URL, "anthropic", json=body, doing=doing)
    return _tokens(answer, EARLY_MS, refresh, doing)


async def refresh_anthropic(entry: Entry) -> Entry:
    return await anthropic_tokens(
        {"grant_type": "refresh_token", "client_id": ANTHROPIC_CLIENT_ID,
         "refresh_token": entry["refresh"]}, "refresh the anthropic sign-in", entry["refresh"])


def codex_account(access: str) -> str | None:
    """The ChatGPT account id in a Codex access token (a JWT), which requests carry."""
    try:
        payload = access.split(".")[1]
        claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        account = claims[CODEX_CLAIM]["chatgpt_account_id"]
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return account if isinstance(account, str) and account else None


async def codex_tokens(form: dict[str, str], doing: str, refresh: str | None = None) -> Entry:
    """ChatGPT's tokens for `form`, with the account the access token names."""
    answer = await post_token(CODEX_TOKEN_URL, "openai-codex", form=form, doing=doing)
    account = codex_account(answer["access_token"])
    if account is None:
        raise ProviderError(f"Could not {doing}: the token names no ChatGPT account")
    return {**_tokens(answer, 0, refresh, doing), "accountId": account}


async def refresh_codex(entry: Entry) -> Entry:
    return await codex_tokens(
        {"grant_type": "refresh_token", "refresh_token": entry["refresh"],
         "client_id": CODEX_CLIENT_ID}, "refresh the openai-codex sign-in", entry["refresh"])


def _tokens(answer: SignInAnswer, early_ms: int, refresh: str | None, doing: str) -> Entry:
    seconds = answer.get("expires_in")
    refresh = answer.get("refresh_token") or refresh
    if not isinstance(seconds, int | float) or not refresh:
        raise ProviderError(f"Could not {doing}: no expires_in or refresh_token in the answer")
    return {"access": answer["access_token"], "refresh": refresh,
            "expires": int(time.time() * 1000 + seconds * 1000 - early_ms)}


async def refresh_copilot(entry: Entry) -> Entry:
    return await copilot.copilot_token(str(entry["refresh"]), entry.get("enterpriseUrl") or None)


REFRESHERS: dict[str, Callable[[Entry], Awaitable[Entry]]] = {
    "anthropic": refresh_anthropic, "openai-codex": refresh_codex,
    "github-copilot": refresh_copilot}
"""The subscriptions whose tokens forged refreshes, by auth.json provider id."""


async def refresh_oauth(auth: AuthFile, provider: str) -> None:
    """Refresh `provider`'s expired token in `auth`, unless another process just did."""
    refresher = REFRESHERS.get(provider)
    if refresher is None:
        raise ProviderError(f"The {provider} sign-in in {auth.path} has expired, and forged "
                            f"cannot refresh it: sign in again with pi")

    async def change(current: Entry | None) -> Entry | None:
        if current is None or current.get("type") != "oauth" or not expired(current):
            return None  # removed, replaced or refreshed by another process: as it is
        return {**current, **await refresher(current)}

    await auth.modify(provider, change)
