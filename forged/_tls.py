"""The process's TLS context, built in a thread as the process starts.

Loading the CA bundle into a TLS context takes about 25 ms, nearly all of it in OpenSSL with
the GIL released. `start` begins it in a thread before forged's own modules are imported, so
it runs on another core while they load. This module imports nothing of forged (and not
httpx, whose import would hold the GIL): the thread never waits on an import the main thread
holds, nor slows it. The thread is not a daemon: a process that exits at once (a bad option)
waits the few milliseconds it has left, since OpenSSL must not be torn down under it.

Error handling: the thread keeps nothing of a failure; the next `tls_context` call, made on a
request's path, tries again and raises.
"""

from __future__ import annotations

import os
import ssl
import threading

_context: ssl.SSLContext | None = None
_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The process's TLS context, built on first use; safe from any thread. As httpx builds
    its default one: the CA bundle named by ``SSL_CERT_FILE`` or ``SSL_CERT_DIR``, else
    certifi's."""
    global _context
    with _lock:
        if _context is None:
            if os.environ.get("SSL_CERT_FILE"):
                _context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
            elif os.environ.get("SSL_CERT_DIR"):
                _context = ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
            else:
                import certifi

                _context = ssl.create_default_context(cafile=certifi.where())
        return _context


def _build() -> None:
    try:
        tls_context()
    except Exception:
        pass  # raised again where a request needs it


def start() -> None:
    """Start building `tls_context` in a thread."""
    threading.Thread(target=_build, name="forged-tls").start()
