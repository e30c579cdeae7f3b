"""What systemd's user manager offers a service: sockets it listens on for us (socket
activation, ``LISTEN_FDS``), and a socket to tell it how we are (``NOTIFY_SOCKET``:
``READY=1``, ``STATUS=``, ``STOPPING=1``, ``WATCHDOG=1``). Without systemd, both are absent
and these functions do nothing."""

from __future__ import annotations

import os
import socket

LISTEN_FDS_START = 3


def listen_sockets() -> list[socket.socket]:
    """The sockets systemd passed to this process (and not to its children: the variables
    are removed)."""
    try:
        pid, count = int(os.environ.get("LISTEN_PID", "")), int(os.environ.get("LISTEN_FDS", ""))
    except ValueError:
        return []
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if pid != os.getpid():
        return []
    sockets = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + count):
        os.set_inheritable(fd, False)
        sockets.append(socket.socket(fileno=fd))
    return sockets


def notify(*states: str) -> bool:
    """Send `states` (``READY=1``...) to the service manager; False when there is none or it
    is not reading (the send never blocks the event loop)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
    with socket.socket(socket.AF_UNIX, kind) as sender:
        try:
            sender.sendto("\n".join(states).encode(), address)
        except OSError:
            return False
    return True


def watchdog_interval_s() -> float | None:
    """How often to send ``WATCHDOG=1`` (half the manager's timeout), if it asks."""
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    watchdog_pid = os.environ.get("WATCHDOG_PID")
    if usec <= 0 or (watchdog_pid and watchdog_pid != str(os.getpid())):
        return None
    return usec / 2 / 1_000_000
