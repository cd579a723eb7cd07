"""The files engine (a data directory), and the catalog engine it shares with the memory
engine (``_engines.memory``); each object's state is a ``files._object.SqliteObject``.

A data directory holds ``catalog.sqlite3`` (objects registry, alarm index, crash
tokens), ``objects/<hash>.sqlite3`` (one database per object), ``flight.rec`` (the
flight record) and ``runtime.lock`` (held with ``flock`` while a runtime runs).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import sqlite3
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio
import trio.testing

from nursery_jobs import _clock
from nursery_jobs._engines._faults import GuardedConnection, fault_cause
from nursery_jobs._engines._schema import prepare
from nursery_jobs._engines.base import EngineSite, FlightSlot
from nursery_jobs._engines.files._catalog import Catalog, connect, object_file_name, reopen
from nursery_jobs._engines.files._flight import FlightRecord, resolve_owners
from nursery_jobs._engines.files._object import SqliteObject
from nursery_jobs._engines.files._rebuild import (
    DESTROYED_SUFFIX,
    adopt_files,
    finish_destroys,
    move_aside,
    quarantine_path,
    stamp_identity,
)
from nursery_jobs._errors import (
    DataDirectoryAccessError,
    DataLayoutError,
    RuntimeLockedError,
    StorageFaultError,
    UnknownObjectError,
)
from nursery_jobs._policy import LOCKED_RETRY, Backoff

if TYPE_CHECKING:
    from nursery_jobs._events import EventBus

logger = logging.getLogger("nursery_jobs")

# Alarm runs that can each hold a flight-record slot at once.
FLIGHT_SLOTS: Final = 64
# The catalog's WAL is checkpointed off the Trio thread when it passes this size.
CHECKPOINT_INTERVAL: Final = 1.0
CHECKPOINT_WAL_BYTES: Final = 4 * 1024 * 1024
CHECKPOINT_WAL_MAX: Final = 256 * 1024 * 1024
# The catalog is shared with nobody but ``nursery-jobs`` and the checkpoint thread (WAL:
# readers never block its writer): a short inline wait at most.
CATALOG_BUSY_TIMEOUT: Final = 0.05
# The timer's reads of an alarm index that fails (a damaged catalog, I/O errors).
INDEX_RETRY: Final = Backoff(base=1.0, cap=300.0)
# Alarm writes the catalog refused are written again this often.
HELD_RETRY_INTERVAL: Final = 1.0
# Page cache per object database, KiB. 1 MiB, not 8: a 100k-job queue dispatches as fast
# (the OS page cache serves the rest; measured 12.7 µs per job either way), and a busy
# object holds 1.2 MB instead of up to 8 (benchmarks/timers.py, memory).
OBJECT_CACHE_KIB: Final = 1024
# What all object databases' page caches may hold together (SQLite's soft heap limit,
# process-wide: past it, caches recycle their own pages instead of growing). Measured
# with 1,000 busy objects (1 MiB each, read through): 1.2 MB per object without it,
# 440 KB with it.
PAGE_CACHE_BUDGET: Final = 256 * 1024 * 1024


class _HeapBudget:
    """SQLite's soft heap limit while any files engine is open, restored after."""

    users = 0
    previous = 0

    @classmethod
    def acquire(cls, budget: int) -> None:
        conn = sqlite3.connect(":memory:")
        try:
            current = int(conn.execute("PRAGMA soft_heap_limit").fetchone()[0])
            if cls.users == 0:
                cls.previous = current
            if budget > 0 and (current == 0 or budget < current):
                conn.execute(f"PRAGMA soft_heap_limit={int(budget)}")
        finally:
            conn.close()
        cls.users += 1

    @classmethod
    def release(cls) -> None:
        cls.users -= 1
        if cls.users == 0:
            conn = sqlite3.connect(":memory:")
            try:
                conn.execute(f"PRAGMA soft_heap_limit={int(cls.previous)}")
            finally:
                conn.close()


class CatalogEngine:
    """What the files and memory engines share: the catalog, the flight record, alarms
    kept in memory while the catalog cannot be written, and events raised before the
    runtime's event bus was at hand."""

    catalog: Catalog
    flight: FlightRecord
    # The class of every connection the engine opens (tests inject faults with one).
    connection_class: type[GuardedConnection] = GuardedConnection
    default_max_active: int | None = None  # (see Engine.default_max_active)

    def __init__(self) -> None:
        # Alarm writes the catalog refused (disk full, read-only, I/O errors): kept here
        # and written again every HELD_RETRY_INTERVAL. Only writes that leave the index
        # holding an earlier alarm are kept (an early wake is harmless, a lost one is
        # not); any other refused write raises to its writer.
        self._held: dict[tuple[str, str], tuple[float | None, int]] = {}
        self._held_event = trio.Event()
        # The timer's reads of the alarm index failing: when to try again.
        self._index_failures = 0
        self._index_retry_at = -math.inf
        self._events: EventBus | None = None
        self._pending_events: list[tuple[str, str, str, dict[str, Any]]] = []

    # -- events -----------------------------------------------------------------------
    def emit(self, type: str, namespace: str, object_id: str, **data: Any) -> None:
        """Emit an event on the runtime's bus (queued until ``serve`` starts)."""
        if self._events is None:
            self._pending_events.append((type, namespace, object_id, data))
        else:
            self._events.emit(type, namespace, object_id, **data)

    def _attach(self, site: EngineSite) -> None:
        self._events = site.events
        pending, self._pending_events = self._pending_events, []
        for type, namespace, object_id, data in pending:
            site.events.emit(type, namespace, object_id, **data)

    # -- objects --------------------------------------------------------------------------
    def class_path(self, namespace: str) -> str | None:
        return self.catalog.class_path(namespace)

    def quarantine(
        self, namespace: str, object_id: str, file: str, error: StorageFaultError
    ) -> None:
        """A damaged object file left memory (files engine: moved aside)."""

    # -- the alarm index (the timer's side) -------------------------------------------------
    def due(self, now: float, limit: int) -> list[tuple[str, str]]:
        if now < self._index_retry_at:
            return []
        held = self._held
        try:
            rows = self.catalog.due(now, limit + len(held))
        except StorageFaultError as exc:
            self._index_failed(exc, now)
            return []
        self._index_failures = 0
        due = []
        for ns, oid, _time, _retry in rows:
            kept = held.get((ns, oid)) if held else None
            if kept is not None and (kept[0] is None or kept[0] > now):
                continue  # retried later than the index says: the in-memory time rules
            due.append((ns, oid))
        return due[:limit]

    def next_alarm_after(self, now: float) -> float | None:
        if self._index_failures:
            return max(self._index_retry_at, now)
        try:
            time = self.catalog.next_after(now)
        except StorageFaultError as exc:
            self._index_failed(exc, now)
            return self._index_retry_at
        for kept, _retry in self._held.values():
            if kept is not None and kept > now and (time is None or kept < time):
                time = kept
        return time

    def _index_failed(self, exc: StorageFaultError, now: float) -> None:
        delay = INDEX_RETRY.delay(self._index_failures)
        assert delay is not None
        self._index_failures += 1
        self._index_retry_at = now + delay
        self.emit("catalog:error", "", "", error=str(exc), cause=exc.cause, delay=delay,
                  hint="restart the runtime to rebuild a damaged catalog"
                  if exc.cause == "corrupt" else None)

    def get_alarm(self, namespace: str, object_id: str) -> tuple[float, int] | None:
        kept = self._held.get((namespace, object_id)) if self._held else None
        if kept is not None:
            return None if kept[0] is None else (kept[0], kept[1])
        return self.catalog.get_alarm(namespace, object_id)

    def set_alarm(self, namespace: str, object_id: str, time: float, retry: int) -> None:
        self.write_alarm(namespace, object_id, time, retry)

    def write_alarm(
        self, namespace: str, object_id: str, time: float | None, retry: int
    ) -> None:
        """Set (or with None, delete) an alarm in the index. A write the catalog refuses
        is kept in memory when the index then still holds an earlier alarm (a retry's
        backoff, say: the object is not woken again before it) and raises otherwise.

        Raises:
            StorageFaultError: the catalog cannot be written, and keeping the write in
                memory could lose a wake-up (a new or lowered alarm).
        """
        key = (namespace, object_id)
        try:
            if time is None:
                self.catalog.delete_alarm(namespace, object_id)
            else:
                self.catalog.set_alarm(namespace, object_id, time, retry)
        except StorageFaultError as exc:
            try:
                current = self.catalog.get_alarm(namespace, object_id)
            except StorageFaultError:
                raise exc from None
            if current is None or (time is not None and time < current[0]):
                raise
            if not self._held:
                logger.error(
                    "the catalog cannot be written (%s); alarm retries are kept in memory and"
                    " written again every %.0f s", exc, HELD_RETRY_INTERVAL,
                )
                self._held_event.set()
            self._held[key] = (time, retry)
            return
        if self._held:
            self._held.pop(key, None)

    def write_held(self) -> None:
        """Write the alarms kept in memory to the catalog, while it takes them."""
        for (namespace, object_id), (time, retry) in list(self._held.items()):
            try:
                if time is None:
                    self.catalog.delete_alarm(namespace, object_id)
                else:
                    self.catalog.set_alarm(namespace, object_id, time, retry)
            except StorageFaultError:
                return
            del self._held[(namespace, object_id)]
        if self._held_event.is_set():
            logger.warning("the catalog can be written again; the alarms kept in memory are"
                           " written")
            self._held_event = trio.Event()

    async def _serve_held(self) -> None:
        while True:
            await self._held_event.wait()
            await trio.sleep(HELD_RETRY_INTERVAL)
            self.write_held()

    def alarm_count(self) -> int:
        return self.catalog.alarm_count()

    def acquire_flight(self, namespace: str, object_id: str) -> FlightSlot | None:
        return self.flight.acquire(namespace, object_id)

    def release_flight(self, slot: FlightSlot) -> None:
        self.flight.release(slot)  # type: ignore[arg-type]


class FilesEngine(CatalogEngine):
    """A data directory on disk."""

    holds_files = True  # (see Engine.holds_files)

    def __init__(
        self, path: str | os.PathLike[str], *, synchronous: str,
        page_cache_budget: int = PAGE_CACHE_BUDGET,
    ) -> None:
        super().__init__()
        # Absolute: object files are opened (and dormant ones reopened) long after, and
        # a chdir meanwhile must not move them somewhere else.
        self.path = Path(path).absolute()
        self._synchronous = synchronous
        self._lock_fd: int | None = None
        self._budget = page_cache_budget
        self._budget_held = False
        self._catalog_passes = 0

    @property
    def label(self) -> str:
        return str(self.path)

    @property
    def objects_dir(self) -> Path:
        return self.path / "objects"

    def object_path(self, namespace: str, object_id: str) -> Path:
        return self.objects_dir / object_file_name(namespace, object_id)

    def open(self, now: float) -> None:
        if (self.path / "shared.sqlite3").exists():
            raise DataLayoutError(
                f"{self.path} holds the shared layout (shared.sqlite3): open it as"
                f" 'shared:{self.path}'; nothing was written", path=str(self.path),
                layout="shared",
            )
        try:
            self.objects_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / "runtime.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _unwritable(self.path, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeLockedError(
                f"{self.path} is in use by another runtime (in this or another process)"
            ) from None
        self._lock_fd = fd
        _HeapBudget.acquire(self._budget)
        self._budget_held = True
        try:
            self._open_catalog(now)
            self.flight = FlightRecord(self.path / "flight.rec", FLIGHT_SLOTS)
        except BaseException:
            self.close()
            raise
        # Work the last process on this path was doing when it died: hand it to the
        # objects (durably) before the record is wiped.
        crashed = resolve_owners(self.flight.recover(),
                                 ((ns, oid) for ns, oid, _ in self.catalog.objects()))
        if crashed:
            logger.warning("%d alarm run(s) were in flight when the last process on %s died",
                           len(crashed), self.path)
            self.catalog.add_crashes(crashed, now)
        self.flight.wipe()

    # -- the catalog: an index, rebuilt from the object files when damaged or lost --------
    def _open_catalog(self, now: float) -> None:
        path = self.path / "catalog.sqlite3"
        existed = path.exists() and path.stat().st_size > 0
        damage = None
        try:
            self.catalog = self._connect_catalog(path)
            damage = self.catalog.check()
            if damage is not None:
                self.catalog.close()
        except sqlite3.DatabaseError as exc:  # typed, or raised from a row of a read
            if fault_cause(exc) != "corrupt":
                raise
            with suppress(AttributeError):
                self.catalog.close()
            damage = str(exc)
        moved = None
        if damage is not None:
            moved = move_aside(path, self.path / f"catalog.sqlite3.damaged-{int(now)}")
            self.catalog = self._connect_catalog(path)
        finish_destroys(self.catalog, self.objects_dir)
        if self.catalog.migrated_created:
            with os.scandir(self.objects_dir) as entries:
                self.catalog.mark_files_created([e.name for e in entries])
        adopted = adopt_files(self.catalog, self.objects_dir, now)
        if damage is None and not adopted.objects and not adopted.skipped:
            return
        reason = (f"damaged: {damage}" if damage is not None
                  else "missing" if not existed
                  else "incomplete: object files it did not list")
        self.emit("catalog:rebuilt", "", "", reason=reason, objects=adopted.objects,
                  alarms=adopted.alarms, skipped=len(adopted.skipped),
                  moved_to=None if moved is None else str(moved))

    def _connect_catalog(self, path: Path) -> Catalog:
        conn = connect(str(path), synchronous=self._synchronous, autocheckpoint=False,
                       label="the catalog", busy_timeout=CATALOG_BUSY_TIMEOUT,
                       factory=self.connection_class)
        try:
            return Catalog(conn)
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        with suppress(AttributeError):
            self.catalog.close()
        with suppress(AttributeError):
            self.flight.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None
        if self._budget_held:
            self._budget_held = False
            _HeapBudget.release()

    # -- objects ----------------------------------------------------------------------------
    async def open_object(self, namespace: str, object_id: str, class_path: str, *,
                          create: bool = True) -> SqliteObject:
        """Open the object's database. A file locked by another process is tried again
        with backoff (``LOCKED_RETRY``, in Trio sleeps, never SQLite's inline busy wait)
        before ``StorageFaultError`` (cause ``locked``) is raised; a damaged file is
        quarantined; a file the catalog says was created but is gone is never replaced
        by an empty one. ``create=False``: only an object the catalog records whose file
        was created (or is there), else ``UnknownObjectError``, nothing written."""
        await trio.lowlevel.checkpoint()
        label = f"{namespace}/{object_id}"
        if create:
            file, created = self.catalog.register(namespace, object_id, class_path,
                                                  _clock.now())
        else:
            found = self.catalog.registered(namespace, object_id)
            if found is None or not (found[1] or (self.objects_dir / found[0]).exists()):
                raise UnknownObjectError.absent(namespace, object_id, self.label)
            file, created = found
        path = self.objects_dir / file
        if created and not path.exists():
            raise self._missing(label, file)
        attempt = 0
        while True:
            try:
                conn = self._open_file(path, label, namespace, object_id, class_path)
                break
            except StorageFaultError as exc:
                if exc.cause == "corrupt":
                    self.quarantine(namespace, object_id, file, exc)
                    raise
                delay = LOCKED_RETRY.delay(attempt) if exc.cause == "locked" else None
                if delay is None:
                    raise
            await trio.sleep(delay)
            attempt += 1
        if not created:
            self.catalog.mark_created(namespace, object_id)
        return SqliteObject(self, conn, namespace, object_id, file=file,
                            reopen=self._reopen_object)

    def _reopen_object(self, conn: GuardedConnection) -> None:
        reopen(conn, synchronous=self._synchronous, cache_kib=OBJECT_CACHE_KIB)

    def _open_file(
        self, path: Path, label: str, namespace: str, object_id: str, class_path: str
    ) -> GuardedConnection:
        try:
            conn = connect(str(path), synchronous=self._synchronous, exclusive=True,
                           label=label, cache_kib=OBJECT_CACHE_KIB,
                           factory=self.connection_class)
        except StorageFaultError as exc:
            if exc.cause == "cantopen":
                raise StorageFaultError(
                    f"cannot open the database of {label} ({path}): {_why_not(path)} ({exc})",
                    label=label, file=str(path), cause="cantopen",
                ) from exc
            raise
        try:
            prepare(conn, label=label)
            stamp_identity(conn, namespace, object_id, class_path)
        except BaseException:
            conn.close()
            raise
        return conn

    def _missing(self, label: str, file: str) -> StorageFaultError:
        held = quarantine_path(self.objects_dir, file)
        where = (f"it was quarantined to {held}; move it back to restore the object"
                 if held.exists() else
                 "restore it from a backup; the object is not recreated empty")
        return StorageFaultError(
            f"the database of {label} ({self.objects_dir / file}) is missing, though the"
            f" catalog says it was created: {where}",
            label=label, file=str(self.objects_dir / file), cause="missing",
        )

    def quarantine(
        self, namespace: str, object_id: str, file: str, error: StorageFaultError
    ) -> None:
        """Move a damaged object file to ``objects/quarantine/``. Its catalog rows stay:
        its alarm keeps being retried (with backoff), so the object comes back when an
        operator restores the file; until then it is answered with ``StorageError``."""
        path = self.objects_dir / file
        try:
            moved = move_aside(path, quarantine_path(self.objects_dir, file))
        except OSError as exc:
            logger.error("cannot move the damaged database of %s/%s (%s) aside: %s",
                         namespace, object_id, path, exc)
            return
        self.emit("object:quarantined", namespace, object_id, file=str(path),
                  moved_to=str(moved), error=str(error))

    def destroy_object(self, namespace: str, object_id: str) -> None:
        file = self.object_path(namespace, object_id)
        gone = Path(f"{file}{DESTROYED_SUFFIX}")
        with suppress(FileNotFoundError):
            os.replace(file, gone)
        for suffix in ("-wal", "-shm"):
            with suppress(FileNotFoundError):
                os.unlink(f"{file}{suffix}")
        self.catalog.forget(namespace, object_id)
        with suppress(FileNotFoundError):
            os.unlink(gone)

    async def serve(self, site: EngineSite) -> None:
        """Checkpoint the catalog's WAL from a worker thread once it has grown, so no
        commit on the Trio thread ever stalls on a checkpoint's fsync. A checkpoint's
        fsync can still hold up writes to the same filesystem (measured: p99 lateness
        401 ms), so it waits for a lull (no alarm due within a second) unless the WAL
        has grown past CHECKPOINT_WAL_MAX. (A thread can only let a MockClock jump
        ahead here, where nothing waits on its result.) Alarms kept in memory are
        written again on the same beat."""
        self._attach(site)
        catalog = self.path / "catalog.sqlite3"
        wal = self.path / "catalog.sqlite3-wal"
        behind = False  # the WAL is past CHECKPOINT_WAL_BYTES, waiting for a lull
        while True:
            # Asleep while the catalog is quiet: nothing can grow its WAL, and nothing
            # is held to write again (a pass every second cost ~176,000 passes over two
            # virtual days of a cron test, measured). A write wakes it.
            if not self._held and not behind:
                await self.catalog.written.wait()
            self.catalog.written = trio.Event()
            await trio.sleep(CHECKPOINT_INTERVAL)
            self._catalog_passes += 1
            if self._held:
                self.write_held()
            try:
                size = wal.stat().st_size
            except FileNotFoundError:
                behind = False
                continue
            lull = site.earliest_alarm() - _clock.now() > CHECKPOINT_INTERVAL
            behind = size >= CHECKPOINT_WAL_BYTES
            if (behind and lull) or size >= CHECKPOINT_WAL_MAX:
                try:
                    await trio.to_thread.run_sync(Catalog.checkpoint, str(catalog))
                    behind = False
                except sqlite3.Error as exc:
                    logger.warning("checkpointing the catalog failed: %s", exc)

    def catalog_passes(self) -> int:
        """Passes of the checkpoint loop since the engine opened (it sleeps while the
        catalog is quiet). Does not checkpoint."""
        return self._catalog_passes


def _unwritable(data: Path, exc: OSError) -> DataDirectoryAccessError:
    """The typed error for a data directory the runtime may not write (issue 22 #9: a
    raw ``OSError`` on ``runtime.lock`` was all a read-only mount said)."""
    where = exc.filename or data
    if exc.errno == errno.EROFS:
        cause, why = "readonly", "it is on a read-only filesystem"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        cause, why = "denied", "permission denied: this process may not write it"
    else:
        cause = errno.errorcode.get(exc.errno or 0, "OSError")
        why = os.strerror(exc.errno) if exc.errno else str(exc)
    return DataDirectoryAccessError(
        f"cannot open the data directory {data}: {where}: {why}", path=str(where), cause=cause,
    )


def _why_not(path: Path) -> str:
    """Why ``path`` cannot be opened, as the operating system says."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return ("the open-file limit is reached: lower max_active or raise the limit"
                    " (ulimit -n)")
        return os.strerror(exc.errno or 0) or str(exc)
    os.close(fd)
    return "SQLite cannot open it"
