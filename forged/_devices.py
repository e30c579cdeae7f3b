"""Paired devices, their roles, and the one-time codes and tickets that let them in
(docs/remote.md).

A device is a name, a role and a credential of its own: ``forged pair`` offers a code
(`Pairings.offer`), valid `PAIRING_S` and once, which the device trades at ``POST /pair``
for a credential (`Devices.add`). The daemon keeps only each credential's SHA-256 (the
credential is 256 random bits: no salt or slow hash adds anything), in ``devices.json`` in
the agent folder, 0600. `PAIRING_ATTEMPTS` wrong codes while codes are pending withdraw
every pending code: one guess in about 10^14 each, and then none.

A browser that keeps its credential in an HttpOnly cookie trades it at ``POST /ticket`` for
a ticket (`Tickets`), valid `TICKET_S` and once, that opens the WebSocket; so no lasting
secret is ever in a URL.

The roles, each allowing what the one before it does (`allows`): ``read`` watches (list,
attach, replay, stats, export), ``approve`` also answers dialogs and permission requests,
``control`` also drives runs (prompt, steer, abort, new and forked sessions, the model),
``owner`` also changes the permission mode, runs commands itself, and manages devices. The
local user (the Unix socket, ``ws-token``) is `OWNER`.

Times are the caller's clock (trio's, in the daemon): a test jumps it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

import attrs
import orjson

from . import _wire as w
from ._errors import CommandError, NotPaired
from ._log import log
from ._paths import rewrite

Role = Literal["read", "approve", "control", "owner"]
ROLES: tuple[Role, ...] = ("read", "approve", "control", "owner")
PAIRING_S = 600.0
PAIRING_ATTEMPTS = 5
"""Wrong codes, while any is pending, after which every pending code is withdrawn."""
TICKET_S = 30.0
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTVWXYZ23456789"
"""No I, L, O, U, 0 or 1: a code read aloud or off a phone is not mistyped."""
CODE_LENGTH = 10
SEEN_WRITE_S = 60.0
"""How stale devices.json's ``lastSeen`` of a device reconnecting from one address may be."""
CREDENTIAL_PREFIX = "fgd_"
"""So that secret scanners and people know a forged credential when they see one."""
DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def allows(role: str, needed: str) -> bool:
    """Whether `role` may do what `needed` may."""
    return role in ROLES and ROLES.index(role) >= ROLES.index(needed)


def check_name(name: str) -> str:
    """`name` if it can name a device; `NotPaired` saying why not."""
    if not DEVICE_NAME.fullmatch(name):
        raise NotPaired(f"invalid device name {name!r}: 1 to 64 letters, digits, '.', '_' "
                        "or '-', starting with a letter or digit")
    return name


def check_role(role: str) -> Role:
    if role not in ROLES:
        raise NotPaired(f"invalid role {role!r}: one of {', '.join(ROLES)}")
    return role


def _digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


@attrs.frozen(kw_only=True)
class Principal:
    """Who a connection is: a paired device, or the local owner."""

    name: str
    role: Role
    device: str | None = None
    """The device's name; None for the local owner."""
    digest: str | None = None
    """Its credential's hash: a device revoked and paired again under its name is another."""


OWNER = Principal(name="the local owner", role="owner")


@attrs.define(kw_only=True, eq=False, repr=False)
class Device:
    name: str
    role: Role
    created: float
    """Seconds since the epoch, as `last_seen`."""
    digest: str
    last_seen: float | None = None
    address: str | None = None
    """Where it last connected from."""

    def principal(self) -> Principal:
        return Principal(name=self.name, role=self.role, device=self.name, digest=self.digest)


def iso(seconds: float) -> str:
    """Seconds since the epoch as ISO 8601 (UTC), as `list_devices` gives times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class Devices:
    """The paired devices, kept in `path` (0600). A file that cannot be read admits no
    device (it is said in the log) and is replaced only by a change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.devices: dict[str, Device] = {}
        self._stamp: tuple[int, int] | None = None
        """The file's (mtime, size) as last read or written: another process's change
        (``forged devices revoke`` while no daemon answered) is read again."""
        self._read()

    def fresh(self) -> Devices:
        """Itself, the file read again if another process changed it."""
        if self._file_stamp() != self._stamp:
            self._read()
        return self

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            info = self.path.stat()
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size

    def _read(self) -> None:
        self._stamp = self._file_stamp()
        self.devices = {}
        try:
            stored = orjson.loads(self.path.read_bytes())
            for entry in stored["devices"]:
                device = Device(name=entry["name"], role=check_role(entry["role"]),
                                created=float(entry["created"]), digest=str(entry["digest"]),
                                last_seen=entry.get("lastSeen"), address=entry.get("address"))
                self.devices[device.name] = device
        except FileNotFoundError:
            pass
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError,
                NotPaired) as exc:
            log(f"{self.path}: cannot be read ({exc!r}): no paired device is admitted")
            self.devices = {}

    def save(self, *, durable: bool = True) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rewrite(self.path, orjson.dumps({"devices": [
            {"name": d.name, "role": d.role, "created": d.created, "digest": d.digest,
             "lastSeen": d.last_seen, "address": d.address} for d in self.devices.values()]},
            option=orjson.OPT_INDENT_2), 0o600, durable=durable)
        self._stamp = self._file_stamp()

    def add(self, name: str, role: Role) -> str:
        """A new device's credential (kept hashed); `NotPaired` if the name is taken."""
        self.fresh()
        if name in self.devices:
            raise NotPaired(f"a device named {name} is paired already: revoke it first "
                            "(forged devices revoke NAME) or choose another name")
        credential = CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
        self.devices[name] = Device(name=name, role=role, created=time.time(),
                                    digest=_digest(credential))
        self.save()
        return credential

    def identify(self, credential: str) -> Device | None:
        """The device whose credential this is (compared in constant time), or None."""
        if not credential.startswith(CREDENTIAL_PREFIX):
            return None
        self.fresh()
        digest = _digest(credential)
        found = None
        for device in self.devices.values():
            if hmac.compare_digest(device.digest, digest):
                found = device
        return found

    def revoke(self, name: str) -> Device:
        self.fresh()
        device = self.devices.pop(name, None)
        if device is None:
            raise NotPaired(f"no device named {name}")
        self.save()
        return device

    def seen(self, device: Device, address: str) -> None:
        """`device` connected from `address` now (kept, not fsynced: a cache; written at
        most once a minute for a device that comes back from where it was)."""
        self.fresh()  # a device revoked meanwhile is not written back
        now, before = time.time(), (device.last_seen, device.address)
        device.last_seen, device.address = now, address
        if before[1] == address and before[0] is not None and now - before[0] < SEEN_WRITE_S:
            return
        if self.devices.get(device.name) is device:
            try:
                self.save(durable=False)
            except OSError as exc:
                log(f"{self.path}: cannot record when {device.name} was last seen: {exc}")


@attrs.define(kw_only=True, eq=False, repr=False)
class _Offer:
    name: str
    role: Role
    expires: float


class Pairings:
    """The codes ``forged pair`` offered and not yet used, in memory only."""

    def __init__(self) -> None:
        self._offers: dict[str, _Offer] = {}
        self._wrong = 0

    def offer(self, name: str, role: Role, now: float) -> str:
        code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
        self._offers[code] = _Offer(name=name, role=role, expires=now + PAIRING_S)
        return code

    def redeem(self, code: str, now: float, name: str | None = None) -> tuple[str, Role]:
        """The name and role a code was offered for, once; `NotPaired` for a code unknown,
        used or expired (or offered for a device other than `name`, when given), and after
        `PAIRING_ATTEMPTS` wrong ones for every code."""
        for known in [known for known, offer in self._offers.items() if offer.expires <= now]:
            del self._offers[known]
        offer = None
        typed = code.strip().upper().replace("-", "").replace(" ", "")
        for known in self._offers:
            if hmac.compare_digest(known.encode(), typed.encode()) and (
                    name is None or name == self._offers[known].name):
                offer = self._offers.pop(known)
                break
        if offer is None:
            self._wrong += 1
            if self._wrong >= PAIRING_ATTEMPTS and self._offers:
                log(f"pairing: {self._wrong} wrong codes: every pending code is withdrawn "
                    "(run forged pair again)")
                self._offers.clear()
            if not self._offers:
                self._wrong = 0
            raise NotPaired("unknown, used or expired pairing code")
        return offer.name, offer.role


class Tickets:
    """Single-use tickets that open one WebSocket each, within `TICKET_S`."""

    def __init__(self) -> None:
        self._tickets: dict[str, tuple[Principal, float]] = {}

    def issue(self, principal: Principal, now: float) -> str:
        self._tickets = {ticket: held for ticket, held in self._tickets.items()
                         if held[1] > now}
        ticket = secrets.token_urlsafe(32)
        self._tickets[ticket] = (principal, now + TICKET_S)
        return ticket

    def redeem(self, ticket: str, now: float) -> Principal | None:
        held = self._tickets.pop(ticket, None)
        if held is None or held[1] <= now:
            return None
        return held[0]


class Access:
    """Who may use the daemon from its WebSocket: the local owner's token, the paired
    devices, the codes on offer and the tickets issued; and the links a pairing hands out
    (`links`: each WebSocket listener's base URL, filled in as they start)."""

    def __init__(self, token: str | None, devices: Devices) -> None:
        self.token = token
        self.devices = devices
        self.pairings = Pairings()
        self.tickets = Tickets()
        self.links: list[str] = []

    def authenticate(self, credential: str) -> Principal | None:
        """Whom `credential` (the owner's token or a device's) stands for, or None."""
        if self.token is not None and hmac.compare_digest(credential.encode(),
                                                          self.token.encode()):
            return OWNER
        device = self.devices.identify(credential)
        return None if device is None else device.principal()

    def current(self, principal: Principal) -> bool:
        """Whether `principal` may still connect: the owner, or a device not revoked (nor
        revoked and paired again under its name)."""
        if principal.device is None:
            return True
        device = self.devices.fresh().devices.get(principal.device)
        return device is not None and device.digest == principal.digest

    def offer(self, name: str, role: str, now: float) -> w.Pairing:
        """A code pairing a device `name` with `role` (``pair_device``); `CommandError` for
        a name or role that cannot be, a name taken, or no listener to reach."""
        if not self.links:
            raise CommandError("the daemon has no WebSocket listener, where paired devices "
                               "connect: start it with forged serve --ws HOST:PORT")
        try:
            check_name(name)
            checked = check_role(role)
            if name in self.devices.fresh().devices:
                raise NotPaired(f"a device named {name} is paired already: revoke it first "
                                "(forged devices revoke NAME) or choose another name")
        except NotPaired as exc:
            raise CommandError(str(exc)) from None
        code = self.pairings.offer(name, checked, now)
        log(f"pairing: a code is offered for device {name} ({role}), valid "
            f"{PAIRING_S / 60:g} minutes")
        return w.Pairing(code=code, link=f"{self.links[0]}/pair#{code}", device=name,
                         role=role, expires_in_seconds=int(PAIRING_S))

    def listing(self, connected: Callable[[str], int]) -> w.DeviceList:
        """The devices (``list_devices``), each with `connected`'s count of its open
        connections."""
        return w.DeviceList(devices=[w.DeviceInfo(
            name=device.name, role=device.role, created=iso(device.created),
            last_seen=None if device.last_seen is None else iso(device.last_seen),
            address=device.address, connected=connected(device.name))
            for device in self.devices.fresh().devices.values()])

    def pair(self, code: str, now: float, name: str | None = None) -> tuple[Device, str]:
        """The device a valid `code` pairs (named `name`, when given), and its credential
        (`NotPaired` otherwise)."""
        name, role = self.pairings.redeem(code, now, name)
        credential = self.devices.add(name, role)
        return self.devices.devices[name], credential


# --- what each command needs ---------------------------------------------------------------------

_READ = frozenset({
    "get_state", "get_messages", "get_available_models", "get_available_thinking_levels",
    "get_checkpoints", "get_checkpoint_diff", "get_session_stats", "export_html",
    "get_fork_messages", "get_entries", "get_tree", "get_last_assistant_text", "get_commands",
    "get_mcp_servers", "list_sessions", "attach", "detach", "get_push_key", "push_subscribe",
    "push_unsubscribe"})
_APPROVE = frozenset({"extension_ui_response"})
_CONTROL = frozenset({
    "prompt", "steer", "follow_up", "abort", "clear_queue", "new_session", "set_model",
    "cycle_model", "set_thinking_level", "cycle_thinking_level", "set_steering_mode",
    "set_follow_up_mode", "compact", "set_auto_compaction", "set_auto_retry", "abort_retry",
    "abort_bash", "fork", "clone", "set_session_name", "restore_checkpoint",
    "unload_session", "navigate_tree"})


def needed_role(command: w.Command | w.DaemonCommand) -> Role:
    """The least role that may send `command`. The owner's alone: the permission mode, a
    command run directly (``bash``: no permission mode applies), MCP servers handed to a
    session (each a program to run), a session file or an export path named by path (a
    ``new_session`` continuing or forking one), devices; and any command this table does
    not know."""
    kind = command.type
    if isinstance(command, w.NewSession) and (
            command.permission_mode or command.mcp_servers or command.fork
            or (command.session and ("/" in command.session
                                     or command.session.endswith(".jsonl")))):
        return "owner"
    if isinstance(command, w.ExportHtml) and command.output_path:
        return "owner"
    if kind in _READ:
        return "read"
    if kind in _APPROVE:
        return "approve"
    if kind in _CONTROL:
        return "control"
    return "owner"


def refusal(principal: Principal, command: w.Command | w.DaemonCommand, *, attached: bool
            ) -> str | None:
    """Why `principal` may not send `command` (the role it needs, said so that a client
    can show it), or None. A connection not `attached` to a session needs ``control`` for
    a session's command (a dialog's answer too), which would open one."""
    need = needed_role(command)
    if need in ("read", "approve") and not attached and not isinstance(
            command, (w.ListSessions, w.Attach, w.Detach, *w.PUSH_COMMANDS)):
        need = "control"
    if allows(principal.role, need):
        return None
    return (f"{command.type} needs the {need} role; this connection ({principal.name}) has "
            f"the {principal.role} role" + ("" if attached else " (attach to a session first)"))


def folder_refusal(cwd: str, chosen: Iterable[Path]) -> str | None:
    """Why a device below owner may not open a session in `cwd` (a ``new_session``'s), or
    None: only the `chosen` folders (the daemon's own, and those of live sessions) are
    offered to it, since a session's folder is what its model may write."""
    folder = Path(cwd).expanduser()
    if not folder.is_absolute():
        return None  # refused as the command's own error
    folder = folder.resolve()
    if folder in {known.resolve() for known in chosen}:
        return None
    return (f"new_session in {folder}, a folder no session uses, needs the owner role (a "
            "device may open sessions in the daemon's folder and the folders of live sessions)")
