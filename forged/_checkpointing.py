"""A session's checkpoints of its workspace's files (docs/protocol.md, Checkpoints): when its
runs capture them, the entries that record each capture on its branch of the session file,
and restoring one.

A run captures the files before its first tool call that can change them (any tool but
``read``, ``grep``, ``find``, ``ls`` and the MCP resource readers) and the spell captures
them again as it ends, before ``agent_settled``; a direct ``bash`` command is captured before
and after. A run that only reads costs nothing. Each capture is a ``custom`` entry
(``customType`` `CUSTOM_TYPE`, which pi and older readers skip) whose ``data`` holds the
capture's commit in the shadow repository (`forged._checkpoints`), what changed since the
workspace's last known state, and for a restore the state it left. A capture that fails is
said in the run (a ``notify``) and never fails the run.

*Drift*: files changed since this session last captured or restored them, by something other
than its runs (the user's editor, another program, another session). A restore refuses while
there is drift, and names the files, unless forced.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from . import _telemetry, _wire as w
from ._checkpoints import (
    MAX_FILE_BYTES,
    MAX_FILES,
    Change,
    Shadow,
    due,
    housekeep,
)
from ._errors import CheckpointError, CommandError, PersistenceError
from ._log import log
from ._store import LEAF, SessionFile

CUSTOM_TYPE = "forged.checkpoint"
CAPTURE_TIMEOUT_S = 60.0
T = TypeVar("T")


@attrs.define(kw_only=True, eq=False, repr=False)
class CheckpointSettings:
    """The ``checkpoints`` settings."""

    enabled: bool = True
    max_file_bytes: int = MAX_FILE_BYTES
    max_files: int = MAX_FILES
    keep_days: float = 30.0

    @classmethod
    def from_settings(cls, section: object) -> CheckpointSettings:
        made = cls()
        if not isinstance(section, dict):
            return made
        if isinstance(section.get("enabled"), bool):
            made.enabled = section["enabled"]
        for key, name in (("maxFileBytes", "max_file_bytes"), ("maxFiles", "max_files")):
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                setattr(made, name, value)
        days = section.get("keepDays")
        if isinstance(days, int | float) and not isinstance(days, bool) and days > 0:
            made.keep_days = float(days)
        return made


def checkpoint_data(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The ``data`` of a checkpoint entry; None for any other entry."""
    if entry.get("type") != "custom" or entry.get("customType") != CUSTOM_TYPE:
        return None
    data = entry.get("data")
    return data if isinstance(data, dict) and isinstance(data.get("commit"), str) else None


def state_after(data: dict[str, Any]) -> str:
    """The workspace's files once the entry was written: a restore's target, else the
    capture itself."""
    after = data.get("after")
    return after if isinstance(after, str) else str(data["commit"])


def _changes(changes: list[Change]) -> list[dict[str, str]]:
    return [{"path": change.path, "status": change.status} for change in changes]


def changed_files(changes: list[Change]) -> list[w.ChangedFile]:
    return [w.ChangedFile(path=change.path, status=change.status) for change in changes]


def _data_at(store: SessionFile, position: int) -> dict[str, Any] | None:
    """The ``data`` of the checkpoint entry at `position`, or None (another entry; only a
    ``custom`` one is read)."""
    return checkpoint_data(store.entry(position)) if store.kind(position) == "custom" else None


@attrs.frozen(kw_only=True)
class RestorePlan:
    """A restore checked and ready: the capture of the files now, what it will change."""

    target: str
    target_entry: str
    now: str
    changes: list[Change]
    """What the restore does to the files: ``A`` recreates, ``D`` removes, ``M`` and ``T``
    write back."""
    drift: list[Change]


class Checkpoints:
    """One session's checkpoints. `store` gives the session's current file; `notify` says a
    failure to the client."""

    def __init__(self, settings: CheckpointSettings, agent_dir: Path, cwd: Path,
                 store: Callable[[], SessionFile], notify: Callable[[str], None]) -> None:
        self.settings = settings
        self._agent_dir = agent_dir
        self._cwd = cwd
        self._store = store
        self._notify = notify
        self._shadow = Shadow(agent_dir, cwd, max_file_bytes=settings.max_file_bytes,
                              max_files=settings.max_files)
        self._lock = trio.Lock()
        """One capture at a time."""
        self.restoring = trio.Lock()
        """One restore at a time, from its check to its end (`plan_to`, then `apply`)."""
        self._captured_for: object = None
        """The prompt the current run captured for."""
        self._unsettled = False
        """A capture was taken since the last one that ended a spell."""
        self._too_many_said = False

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def owner(self) -> str:
        return self._store().session_id

    def known_state(self) -> str | None:
        """The workspace's files as this session last captured or restored them (its file's
        last checkpoint entry, on any branch)."""
        store = self._store()
        for position in range(len(store) - 1, -1, -1):
            data = _data_at(store, position)
            if data is not None:
                return state_after(data)
        return None

    # --- capturing -----------------------------------------------------------------------------

    async def before_change(self, prompt: w.UserMessage | None) -> None:
        """Before a tool call that can change files: capture once per run (`prompt`, the
        message it works on, names it). On disk before the tool starts."""
        if not self.enabled or self._captured_for is prompt:
            return
        self._captured_for = prompt
        await self.capture("before", "" if prompt is None else w.text_of(prompt.content, ""))

    async def settle(self) -> None:
        """As a spell ends: capture what its runs left, if they captured before."""
        self._captured_for = None
        if self._unsettled:
            self._unsettled = False
            await self.capture("after")

    async def capture(self, kind: str, prompt: str | None = None) -> str | None:
        """Capture the files and record it on the branch; the entry's id, or None when the
        capture failed (said, never raised)."""
        if not self.enabled:
            return None
        with _telemetry.tracing.span("checkpoint capture", {"forged.checkpoint.kind": kind},
                                     conversation=self.owner()) as span:
            entry_id = await self._capture(kind, prompt)
            if entry_id is None:
                span.fail("CheckpointError", "the capture failed")
            return entry_id

    async def _capture(self, kind: str, prompt: str | None) -> str | None:
        async with self._lock:
            known = self.known_state()
            try:
                with trio.move_on_after(CAPTURE_TIMEOUT_S) as scope:
                    captured, changed = await trio.to_thread.run_sync(
                        self._capture_sync, known, abandon_on_cancel=True)
                if scope.cancelled_caught:
                    raise CheckpointError(f"it took over {CAPTURE_TIMEOUT_S:g} s")
            except (CheckpointError, OSError) as exc:
                self._failed(exc)
                return None
            data: dict[str, Any] = {"commit": captured.commit, "kind": kind,
                                    "files": _changes(changed)}
            if prompt is not None:
                data["prompt"] = prompt
            if captured.skipped:
                data["skipped"] = list(captured.skipped)
            self._unsettled = kind != "after"
            return self._record(data)

    def _capture_sync(self, known: str | None) -> tuple[Any, list[Change]]:
        captured = self._shadow.capture(self.owner(), previous=known)
        changed = (self._shadow.changes(known, captured.commit)
                   if known is not None and known != captured.commit else [])
        return captured, changed

    def _record(self, data: dict[str, Any]) -> str | None:
        try:
            entry = self._store().append("custom", customType=CUSTOM_TYPE, data=data)
        except PersistenceError as exc:
            self._failed(exc)
            return None
        return str(entry["id"])

    def _failed(self, exc: Exception) -> None:
        text = f"The checkpoint of {self._cwd} failed: {exc}"
        if "checkpoints.maxFiles" in str(exc):
            if self._too_many_said:
                return
            self._too_many_said = True
        log(text)
        self._notify(text)

    # --- reading -------------------------------------------------------------------------------

    def listing(self) -> list[w.Checkpoint]:
        """The checkpoints of the active branch, oldest first."""
        store = self._store()
        found: list[w.Checkpoint] = []
        for position in store.path_to_leaf():
            data = _data_at(store, position)
            if data is not None:
                entry = store.entry(position)
                found.append(w.Checkpoint(
                    entry_id=str(entry["id"]), timestamp=str(entry.get("timestamp")),
                    kind=str(data.get("kind", "before")), prompt=data.get("prompt"),
                    files=[w.ChangedFile(path=str(item.get("path")),
                                         status=str(item.get("status")))
                           for item in data.get("files", []) if isinstance(item, dict)],
                    skipped=data.get("skipped") or None))
        return found

    def _entry_data(self, entry_id: str) -> dict[str, Any]:
        store = self._store()
        position = store.index.get(entry_id)
        data = checkpoint_data(store.entry(position)) if position is not None else None
        if data is None:
            raise CommandError(f"No checkpoint {entry_id}")
        return data

    async def diff(self, entry_id: str, to_entry_id: str | None) -> w.CheckpointDiff:
        """What changed from the checkpoint `entry_id` to `to_entry_id`, else to the next
        checkpoint of the active branch, else to the files now."""
        older = str(self._entry_data(entry_id)["commit"])
        newer: str | None = None
        if to_entry_id is not None:
            newer = state_after(self._entry_data(to_entry_id))
        else:
            later = [item.entry_id for item in self.listing()]
            following = later[later.index(entry_id) + 1:] if entry_id in later else []
            if following:
                newer = state_after(self._entry_data(following[0]))
        owner = self.owner()

        def read() -> w.CheckpointDiff:
            target = newer or self._shadow.capture(owner).commit
            changes = self._shadow.changes(older, target)
            return w.CheckpointDiff(files=changed_files(changes),
                                    diff=self._shadow.diff(older, target))

        return await self._run(read)

    # --- restoring -----------------------------------------------------------------------------

    def state_at(self, position: int | None) -> tuple[str, str] | None:
        """The files as they were at entry `position` of the file (None: before the first
        entry; `LEAF`: the last), and the checkpoint that says so: the last one on the way
        to it, else (no run had changed anything yet) the first one after it on the active
        branch; None when the branch has no checkpoint."""
        store = self._store()
        if position == LEAF:
            position = len(store) - 1 if len(store) else None
        for at in reversed(store.path_to(position)):
            data = _data_at(store, at)
            if data is not None:
                return state_after(data), str(store.entry_id(at))
        branch = store.path_to_leaf()
        after = branch.index(position) + 1 if position in branch else 0
        for at in branch[after:]:
            data = _data_at(store, at)
            if data is not None:
                return str(data["commit"]), str(store.entry_id(at))
        return None

    async def restore(self, entry_id: str, *, force: bool, dry_run: bool) -> w.RestoreResult:
        """``restore_checkpoint``: the files back as they were at the checkpoint `entry_id`
        (`plan_to`, then `apply`), one restore at a time; with `dry_run`, only what it
        would do, and the drift."""
        target = str(self._entry_data(entry_id)["commit"])
        await _telemetry.ready()
        async with self.restoring:
            with _telemetry.tracing.span(
                    "checkpoint restore", {"forged.checkpoint.entry_id": entry_id,
                                           "forged.checkpoint.dry_run": dry_run},
                    conversation=self.owner()):
                return await self._restore(target, entry_id, force=force, dry_run=dry_run)

    async def _restore(self, target: str, entry_id: str, *, force: bool, dry_run: bool
                       ) -> w.RestoreResult:
        plan = await self.plan_to(target, entry_id, force=force or dry_run)
        if dry_run:
            return w.RestoreResult(files=changed_files(plan.changes), dry_run=True,
                                   drift=changed_files(plan.drift))
        return await self.apply(plan)

    async def plan_to(self, target: str, entry_id: str, *, force: bool) -> RestorePlan:
        """Check a restore to the capture `target` (the checkpoint `entry_id`'s): the files
        now are captured, and drift refuses it (`CommandError` naming the files) unless
        `force`."""
        if not self.enabled:
            raise CommandError("Checkpoints are off (checkpoints.enabled)")
        known, owner = self.known_state(), self.owner()

        def check() -> RestorePlan:
            now = self._shadow.capture(owner, previous=known).commit
            drift = self._shadow.changes(known, now) if known and known != now else []
            return RestorePlan(target=target, target_entry=entry_id, now=now,
                               changes=self._shadow.changes(now, target), drift=drift)

        found = await self._run(check)
        if found.drift and not force:
            names = ", ".join(change.path for change in found.drift[:20])
            more = f" and {len(found.drift) - 20} more" if len(found.drift) > 20 else ""
            raise CommandError(
                f"Files changed since the last checkpoint, not by this session's runs: "
                f"{names}{more}. Restoring would overwrite them; send force: true to restore "
                "anyway")
        return found

    async def apply(self, plan: RestorePlan) -> w.RestoreResult:
        """Restore: first a checkpoint of the files as they are (so the restore can be
        undone), then the files as they were."""
        data = {"commit": plan.now, "kind": "restore", "after": plan.target,
                "restoredTo": plan.target_entry, "files": _changes(plan.changes)}
        async with self._lock:
            entry_id = self._record(data)
            if entry_id is None:
                raise CommandError("The restore was not done: its checkpoint could not be "
                                   "written to the session file")
            await self._run(lambda: self._shadow.restore(plan.target, plan.now))
        return w.RestoreResult(files=changed_files(plan.changes), entry_id=entry_id)

    async def _run(self, work: Callable[[], T]) -> T:
        try:
            return await trio.to_thread.run_sync(work)
        except CheckpointError as exc:
            raise CommandError(f"Checkpoints: {exc}") from None

    async def housekeep(self) -> None:
        """Drop old captures and pack the repository, in a worker thread."""
        if not self.enabled or not due(self._agent_dir, self._cwd):
            return  # (a stat or two: no thread for a workspace with nothing to keep)
        try:
            dropped = await trio.to_thread.run_sync(
                housekeep, self._agent_dir, self._cwd, self.settings.keep_days)
        except (CheckpointError, OSError) as exc:
            log(f"checkpoint housekeeping of {self._cwd} failed: {exc}")
            return
        if dropped:
            log(f"dropped {dropped} checkpoints older than {self.settings.keep_days:g} days")
