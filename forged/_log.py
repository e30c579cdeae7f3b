"""Where output goes: fd 1 carries protocol lines only, and every diagnostic is one
``forged: <message>`` line on stderr, flushed (journald keeps each line as one entry).

Writing a diagnostic never blocks: a line the pipe takes is written at once, but when stderr
is a pipe its reader has stopped draining (a client that piped forged's stderr and never reads
it, while an MCP server floods its log), lines wait for a writer thread instead, in order. At most
`MAX_WAITING_LINES` wait; the ones past that are counted, and the count is written once the
pipe drains.
"""

from __future__ import annotations

import atexit
import collections
import os
import stat
import sys
import threading
import traceback

MAX_WAITING_LINES = 10_000
EXIT_DRAIN_S = 1.0
"""How long an exiting process waits for its waiting lines to be written."""


def log(message: str) -> None:
    _stderr.write(f"forged: {message}\n")


def log_plain(text: str) -> None:
    """`text` as it is, for a person reading stderr (``-p``'s trace on a terminal)."""
    _stderr.write(f"{text}\n")


def log_exception(message: str, exc: BaseException) -> None:
    """`message`, then `exc`'s traceback: a bug, or a failure of someone else's code (a
    plugin's)."""
    log(message)
    _stderr.write("".join(traceback.format_exception(exc)))


def reserve_stdout() -> int:
    """Keep fd 1 for protocol lines only: return a duplicate of it for the writer and point fd 1
    at stderr, so a stray print or a child process cannot corrupt the stream."""
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol_fd


class _Stderr:
    """``sys.stderr``, written now when that cannot block, else by a thread of its own.

    When stderr is a pipe, lines go through a descriptor of our own for it, opened
    non-blocking (``/proc/self/fd/2``: a new open file, so the flag is not shared with fd 2,
    which child processes inherit): a line the pipe cannot take now, or its rest, waits."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._waiting: collections.deque[bytes] = collections.deque()
        """Bytes for the thread; the first stays here while it is being written."""
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self._pipe: tuple[int, int, int] | None = None
        """The non-blocking descriptor, and the device and inode of the pipe it is for."""

    def write(self, text: str) -> None:
        with self._lock:
            pipe = self._nonblocking()
            if pipe is None:  # a file, a terminal, a test's capture: never held up for long
                _write_now(text)
                return
            data = text.encode("utf-8", "replace")
            if not self._waiting:
                try:
                    data = data[os.write(pipe, data):]
                except BlockingIOError:
                    pass
                except OSError:  # stderr closed: nowhere to say it
                    return
                if not data:
                    return
            if len(self._waiting) >= MAX_WAITING_LINES:
                self._dropped += 1
                return
            self._waiting.append(data)
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="forged-stderr",
                                                daemon=True)
                self._thread.start()
                atexit.register(self.finish)
            self._lock.notify_all()

    def _nonblocking(self) -> int | None:
        """Our non-blocking descriptor for stderr's pipe; None when stderr is no pipe."""
        try:
            fd = sys.stderr.fileno()
            status = os.fstat(fd)
        except (OSError, ValueError, AttributeError):
            return None
        if not stat.S_ISFIFO(status.st_mode):
            return None
        if self._pipe is None or self._pipe[1:] != (status.st_dev, status.st_ino):
            try:
                own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:  # no /proc: written at once, as any file
                return None
            if self._pipe is not None:
                os.close(self._pipe[0])
            self._pipe = (own, status.st_dev, status.st_ino)
        return self._pipe[0]

    def _drain(self) -> None:
        while True:
            with self._lock:
                while not self._waiting:
                    self._lock.wait()
                data = self._waiting[0]
            _write_blocking(data)  # waits for the pipe's reader; the loop goes on meanwhile
            with self._lock:
                self._waiting.popleft()
                if not self._waiting and self._dropped:
                    self._waiting.append(f"forged: {self._dropped} log lines dropped: stderr "
                                         "was not being read\n".encode())
                    self._dropped = 0
                self._lock.notify_all()

    def finish(self) -> None:
        """Until the waiting lines are written, at most `EXIT_DRAIN_S`."""
        with self._lock:
            self._lock.wait_for(lambda: not self._waiting, timeout=EXIT_DRAIN_S)


def _write_now(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: nowhere to say it
        pass


def _write_blocking(data: bytes) -> None:
    view = memoryview(data)
    try:
        fd = sys.stderr.fileno()
        while view:
            view = view[os.write(fd, view):]
    except (OSError, ValueError):  # stderr closed: nowhere to say it
        pass


_stderr = _Stderr()
