"""The MCP SDK, imported once a process, in a thread of its own: 0.6 s of imports (pydantic,
httpx2, anyio) that every server waits for and the loop never does. Its log goes into
forged's, a line each, never blocking.
"""

from __future__ import annotations

import logging
import os
import threading

import trio

from .._log import log

_sdk_imported = threading.Event()
_sdk_failure: list[BaseException] = []
_sdk_start = threading.Lock()
_sdk_started = False


async def loaded() -> None:
    """Until the SDK is imported: once a process, by a thread of its own (0.6 s of imports,
    off the loop), which every server waits for; a wait cancelled (a server that exited
    meanwhile) leaves the import going."""
    global _sdk_started
    if not _sdk_imported.is_set():
        with _sdk_start:
            if not _sdk_started:
                threading.Thread(target=_import_sdk, name="forged-mcp-sdk", daemon=True).start()
                _sdk_started = True
        await trio.to_thread.run_sync(_sdk_imported.wait, abandon_on_cancel=True)
    if _sdk_failure:
        raise _sdk_failure[0]


def _import_sdk() -> None:
    try:
        _load_sdk()
    except BaseException as exc:  # said to each server that waits
        _sdk_failure.append(exc)
    finally:
        _sdk_imported.set()


def default_environment() -> dict[str, str]:
    """What of forged's environment a server that is not confined gets, as the SDK's
    ``get_default_environment`` gives it (without importing the SDK)."""
    names = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
    return {name: value for name in names
            if (value := os.environ.get(name)) is not None and not value.startswith("()")}


def _load_sdk() -> None:
    """Import the parts of the MCP SDK a connection uses (in a worker thread: the loop goes
    on answering meanwhile)."""
    import httpx2  # noqa: F401
    import mcp.client.client  # noqa: F401 (loaded here, used later)
    import mcp.client.stdio  # noqa: F401
    import mcp.client.streamable_http  # noqa: F401

    from . import eras, http  # noqa: F401

    sdk = logging.getLogger("mcp")
    if not any(isinstance(handler, _SdkLog) for handler in sdk.handlers):
        sdk.addHandler(_SdkLog(logging.WARNING))
        sdk.propagate = False  # not Python's last-resort handler, a blocking write to stderr


class _SdkLog(logging.Handler):
    """The SDK's warnings and errors (a server that writes what is not JSON-RPC, say) as one
    line each in forged's log, which never blocks."""

    def emit(self, record: logging.LogRecord) -> None:
        text = f"MCP SDK {record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f" ({type(error).__name__}: {next(iter(str(error).splitlines()), '')})"
        log(text)
