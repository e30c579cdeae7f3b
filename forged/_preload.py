"""The HTTP stack and the TLS context, made ready in a thread as the process starts.

Importing httpx with its transport (httpcore, h11) and loading the CA bundle into a TLS
context take about 60 ms, and every provider request needs both. `start` begins that work in
a daemon thread before forged's own modules are imported, so it overlaps the start-up (the
CA bundle loads without holding the GIL) instead of delaying the first prompt. This module
imports nothing of forged: the thread never waits on an import the main thread holds.

Error handling: the thread keeps nothing of a failure; the next `tls_context` call, made on a
request's path, tries again and raises.
"""

from __future__ import annotations

import ssl
import threading

_context: ssl.SSLContext | None = None
_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The process's TLS context, built on first use with httpx's defaults (certifi's CA
    bundle unless ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` name another); safe from any thread.
    Building it also imports httpx's transport."""
    global _context
    with _lock:
        if _context is None:
            import httpx

            context = httpx.create_ssl_context()
            httpx.AsyncClient(verify=context)  # httpx imports httpcore and h11 for its first
            _context = context
        return _context


def _warm() -> None:
    try:
        tls_context()
    except Exception:
        pass  # raised again where a request needs it


def start() -> None:
    """Start building `tls_context` in a daemon thread."""
    threading.Thread(target=_warm, name="forged-preload", daemon=True).start()
