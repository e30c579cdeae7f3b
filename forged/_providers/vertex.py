"""Vertex AI (``google-vertex``): Gemini on Google Cloud, the Gemini API's body and stream
(`forged._providers.google`) at Vertex's address, signed in one of two ways, as the ancestor
does:

- an API key (``GOOGLE_CLOUD_API_KEY``, auth.json, models.json): Vertex's express mode,
  ``POST https://aiplatform.googleapis.com/v1/publishers/google/models/{id}:streamGenerateContent``
  with ``x-goog-api-key``;
- application default credentials (``GOOGLE_APPLICATION_CREDENTIALS``, else gcloud's
  ``application_default_credentials.json``), a service account's or a user's, with the project
  (``GOOGLE_CLOUD_PROJECT`` or ``GCLOUD_PROJECT``, else the credentials') and the location
  (``GOOGLE_CLOUD_LOCATION``): ``POST https://{location}-aiplatform.googleapis.com/v1/projects/
  {project}/locations/{location}/publishers/google/models/{id}:streamGenerateContent``, with
  an access token google-auth gets (and renews before it expires) in a worker thread. Its
  requests go over httpx, as forged's own do.

A model's ``baseUrl`` without ``{location}`` (a proxy, a test server) replaces the host; the
path stays, after the base's own path (``/v1`` not added twice).
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING

import trio

from .._errors import ProviderError
from .._tls import tls_context
from .base import AssistantBuilder, ProviderRequest
from .google import stream_events
from .http import merge_headers

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

AUTHENTICATED = "<authenticated>"
"""The key a provider signed in by ambient credentials has (the ancestor's placeholder)."""
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
API_VERSION = "v1"
_VERSIONED = re.compile(r"/v\d+(?:beta\d*)?(?:/|$)")


def project_and_location(credentials_project: str | None) -> tuple[str, str]:
    project = (os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("GCLOUD_PROJECT")
               or credentials_project)
    if not project:
        raise ProviderError("Vertex AI needs a project: set GOOGLE_CLOUD_PROJECT")
    location = os.environ.get("GOOGLE_CLOUD_LOCATION")
    if not location:
        raise ProviderError("Vertex AI needs a location: set GOOGLE_CLOUD_LOCATION")
    return project, location


def model_url(base: str, path: str, location: str | None) -> str:
    """``{host}/v1{path}:streamGenerateContent?alt=sse`` for the model `base` names."""
    base = base.strip().rstrip("/")
    if not base or "{location}" in base:
        host = ("aiplatform.googleapis.com" if location in (None, "global")
                else f"{location}-aiplatform.googleapis.com")
        base = f"https://{host}"
    if not _VERSIONED.search(base):
        base = f"{base}/{API_VERSION}"
    return f"{base}{path}:streamGenerateContent?alt=sse"


def has_api_key(key: str) -> bool:
    return bool(key) and key != AUTHENTICATED and not (key.startswith("<") and key.endswith(">"))


async def stream(request: ProviderRequest, out: AssistantBuilder) -> None:
    model = request.model
    models = f"/publishers/google/models/{model.id}"
    if has_api_key(request.api_key):
        url = model_url(model.base_url, models, None)
        headers = {"x-goog-api-key": request.api_key}
    else:
        token, credentials_project = await trio.to_thread.run_sync(access_token,
                                                                   abandon_on_cancel=True)
        project, location = project_and_location(credentials_project)
        url = model_url(model.base_url,
                        f"/projects/{project}/locations/{location}{models}", location)
        headers = {"authorization": f"Bearer {token}"}
    await stream_events(request, url, merge_headers(headers, request.headers), out)


# --- application default credentials -----------------------------------------------------------

_lock = threading.Lock()
_found: dict[str | None, tuple[Credentials, str | None]] = {}
"""The credentials (and their project) found for each ``GOOGLE_APPLICATION_CREDENTIALS``."""


def access_token() -> tuple[str, str | None]:
    """A valid access token of the application default credentials, and their project; run
    in a worker thread (google-auth reads files and asks the token endpoint, blocking)."""
    import google.auth
    import google.auth.exceptions

    source = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    with _lock:
        try:
            if source not in _found:
                _found[source] = google.auth.default(scopes=[SCOPE])
            credentials, project = _found[source]
            if not credentials.valid:
                # google-auth leaves `refresh` unannotated.
                credentials.refresh(HttpxRequest())  # type: ignore[no-untyped-call]
        except google.auth.exceptions.GoogleAuthError as exc:
            raise ProviderError(f"Vertex AI sign-in failed: {exc}") from exc
        return str(credentials.token), project


class HttpxRequest:
    """google-auth's transport (`google.auth.transport.Request`) on httpx."""

    def __call__(self, url: str, method: str = "GET", body: bytes | None = None,
                 headers: dict[str, str] | None = None, timeout: float | None = None,
                 **kwargs: object) -> _Response:
        import google.auth.exceptions
        import httpx

        try:
            with httpx.Client(verify=tls_context(), timeout=timeout or 60) as client:
                response = client.request(method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            # google-auth leaves its exceptions' constructor unannotated.
            raise google.auth.exceptions.TransportError(  # type: ignore[no-untyped-call]
                str(exc)) from exc
        return _Response(response.status_code, dict(response.headers), response.content)


class _Response:
    def __init__(self, status: int, headers: dict[str, str], data: bytes) -> None:
        self.status, self.headers, self.data = status, headers, data
