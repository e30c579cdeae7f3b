"""``forged pair``, ``forged devices`` and ``forged web``: the paired devices of the user's
daemon (docs/remote.md, docs/web.md).

``pair`` asks the running daemon for a one-time code (its ``pair_device`` command): the code
lives in the daemon alone, so a daemon must run, with a WebSocket listener for the device to
reach. ``devices`` and ``devices revoke`` ask the daemon too (a revocation ends the device's
connections); with no daemon running they read and change ``devices.json`` themselves, so a
lost phone can be revoked before the daemon starts again. ``web`` pairs this machine's own
browser as an owner device, by a link to the loopback listener, and opens it.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import _runtime
from ._devices import ROLES, Devices, iso
from ._errors import ConfigError, NotPaired
from ._log import log
from ._paths import agent_dir, rewrite
from ._thin import ask, open_daemon


def build_pair_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forged pair", description="Pair a device with the running daemon: print a "
        "one-time code and a link to open on the device (valid 10 minutes, once), and a QR "
        "code of the link on a terminal.")
    parser.add_argument("--name", required=True, help="the device's name (letters, digits, "
                        "'.', '_', '-')")
    parser.add_argument("--role", required=True, choices=ROLES,
                        help="what it may do: read (watch), approve (answer dialogs and "
                        "permission requests), control (drive runs), owner (everything)")
    _socket_option(parser)
    return parser


def build_devices_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forged devices", description="The paired devices: name, role, created, last "
        "seen and from where; 'forged devices revoke NAME' ends its connections and refuses "
        "it from then on.")
    parser.add_argument("action", nargs="?", choices=["revoke"])
    parser.add_argument("name", nargs="?")
    _socket_option(parser)
    return parser


def build_web_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forged web", description="Open the daemon's page in this machine's browser, "
        "signed in as the owner: pairs the browser as an owner device (a one-time link to "
        "the loopback WebSocket listener, printed too) and opens the link.")
    parser.add_argument("--name", help="the browser's device name (default: web, or web-2, "
                        "web-3, ... when taken)")
    parser.add_argument("--no-open", action="store_true",
                        help="print the link only; open it yourself (within 10 minutes)")
    _socket_option(parser)
    return parser


def _socket_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", type=Path, metavar="PATH",
                        help=f"the daemon's Unix socket (default {_runtime.default_socket_path()})")


def main(command: str, argv: list[str]) -> int:
    """``forged pair`` or ``forged devices``; the exit status."""
    if command == "pair":
        args = build_pair_parser().parse_args(argv)
        return pair(args.name, args.role, args.socket)
    if command == "web":
        args = build_web_parser().parse_args(argv)
        return web(args.name, args.socket, open_it=not args.no_open)
    parser = build_devices_parser()
    args = parser.parse_args(argv)
    if args.action == "revoke":
        if not args.name:
            parser.error("revoke needs the device's NAME")
        return revoke(args.name, args.socket)
    if args.name:
        parser.error(f"unexpected {args.name!r}: forged devices [revoke NAME]")
    return listing(args.socket)


def pair(name: str, role: str, socket_path: Path | None) -> int:
    answer = _ask(socket_path, {"type": "pair_device", "name": name, "role": role})
    if answer is None:
        log("no forged daemon runs: start one with forged serve --ws HOST:PORT (the device "
            "connects there), then pair")
        return 1
    if not answer.get("success"):
        log(str(answer.get("error")))
        return 1
    data = answer["data"]
    print(f"code: {data['code']}")
    print(f"link: {data['link']}", flush=True)
    if sys.stdout.isatty():
        import segno

        segno.make(data["link"], error="m").terminal(out=sys.stdout, compact=True)
    log(f"the code pairs one device as {name} ({role}) within "
        f"{int(data['expiresInSeconds']) // 60} minutes: open the link on it, or POST "
        '{"code": ...} to /pair')
    return 0


def web(name: str | None, socket_path: Path | None, *, open_it: bool) -> int:
    """Pair this machine's browser as an owner device and open the page (loopback only: an
    owner's link is never handed to another machine's listener)."""
    known = _ask(socket_path, {"type": "list_devices"})
    if known is None:
        log("no forged daemon runs: start one with forged serve --ws 127.0.0.1:8765, then "
            "forged web")
        return 1
    taken = {d["name"] for d in known.get("data", {}).get("devices", [])}
    name = name or next(f"web-{n}" if n > 1 else "web" for n in range(1, len(taken) + 2)
                        if (f"web-{n}" if n > 1 else "web") not in taken)
    answer = _ask(socket_path, {"type": "pair_device", "name": name, "role": "owner"})
    if answer is None or not answer.get("success"):
        log(str((answer or {}).get("error", "the daemon stopped")))
        return 1
    link = str(answer["data"]["link"])
    parts = urlsplit(link)
    if parts.hostname not in ("127.0.0.1", "::1", "localhost"):
        log(f"forged web opens the page on this machine only: the daemon's link is {parts.scheme}"
            f"://{parts.netloc}, not loopback; start it with --ws 127.0.0.1:PORT as well, or "
            "pair a device with forged pair")
        return 1
    link = link.replace("/pair#", "/pair?open#", 1)
    print(link, flush=True)
    log(f"the link signs one browser in as {name} (owner) within 10 minutes, once")
    if open_it and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                    or sys.platform == "darwin"):
        import webbrowser

        webbrowser.open(_opener(link, socket_path))
    return 0


def _opener(link: str, socket_path: Path | None) -> str:
    """A ``file://`` page (0600, in the daemon's own folder) that sends a browser on to
    `link`: the browser is started with its path, so the code is in no process's command
    line, where any local user could read it in ``/proc``."""
    page = Path(socket_path or _runtime.default_socket_path()).parent / "web-open.html"
    shown = html.escape(link, quote=True)
    rewrite(page, (f'<!doctype html><meta charset="utf-8"><title>forged</title>'
                   f'<meta http-equiv="refresh" content="0;url={shown}">'
                   f'<a href="{shown}">Open forged</a>\n').encode())
    return page.as_uri()


def listing(socket_path: Path | None) -> int:
    answer = _ask(socket_path, {"type": "list_devices"})
    if answer is None:
        devices: list[dict[str, Any]] = [
            {"name": d.name, "role": d.role, "created": iso(d.created),
             "lastSeen": d.last_seen and iso(d.last_seen), "address": d.address}
            for d in Devices(agent_dir() / "devices.json").devices.values()]
    elif not answer.get("success"):
        log(str(answer.get("error")))
        return 1
    else:
        devices = answer["data"]["devices"]
    if not devices:
        log("no paired device (forged pair --name NAME --role ROLE pairs one)")
    for device in devices:
        connected = device.get("connected")
        print(f"{device['name']}  {device['role']}  created {device['created']}  "
              f"last seen {device.get('lastSeen') or 'never'}  "
              f"from {device.get('address') or '-'}"
              + (f"  ({connected} connected)" if connected else ""))
    return 0


def revoke(name: str, socket_path: Path | None) -> int:
    answer = _ask(socket_path, {"type": "revoke_device", "name": name})
    if answer is None:
        try:
            Devices(agent_dir() / "devices.json").revoke(name)
        except NotPaired as exc:
            log(str(exc))
            return 1
        print(f"revoked {name} (no daemon runs: it is refused from now on)")
        return 0
    if not answer.get("success"):
        log(str(answer.get("error")))
        return 1
    print(f"revoked {name}: {answer['data']['disconnected']} connection(s) ended")
    return 0


def _ask(socket_path: Path | None, command: dict[str, str]) -> dict[str, Any] | None:
    """The daemon's answer to `command`, or None when no daemon runs."""
    path = str(socket_path or _runtime.default_socket_path())
    try:
        sock = open_daemon(path)
    except ConfigError as exc:
        log(str(exc))
        raise SystemExit(1) from None
    if sock is None:
        return None
    try:
        answer = ask(sock, {**command, "id": "cli"})
    finally:
        sock.close()
    return answer if answer is not None else {
        "success": False, "error": "the daemon closed the connection"}
