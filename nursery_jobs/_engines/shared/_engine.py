"""The shared layout (``open_runtime("shared:<directory>")``, issue 26): every object
of a data directory kept as rows of one SQLite database, loaded into an in-memory
working copy on activation and shipped back on each commit — the PostgreSQL engine's
design, local.

A file per object costs a file creation, an open and a close (with the WAL's
checkpoint and fsync) per object: ~250-400 objects/s on this disk, whatever the code
does. One database has one WAL and no per-object file: ~100,000 objects/s for the
storage alone (``benchmarks/layout_floor.py``).

The directory holds ``shared.sqlite3`` (the catalog's tables — registry, alarm index,
crash tokens — and ``nj_rows``: every object's rows as JSON, keyed by (namespace,
object_id, tbl, key), as ``nj_rows`` of the PostgreSQL engine), ``flight.rec`` and
``runtime.lock``. A ship writes an object's changed rows and its alarm in one
transaction, so the alarm index never runs ahead of the jobs it stands for.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
from contextlib import suppress
from pathlib import Path
from typing import Final, cast

import attrs
import trio

from nursery_jobs import _clock
from nursery_jobs._engines.base import EngineSite
from nursery_jobs._engines.files._catalog import Catalog, connect
from nursery_jobs._engines.files._engine import (
    CATALOG_BUSY_TIMEOUT,
    FLIGHT_SLOTS,
    CatalogEngine,
    _unwritable,
)
from nursery_jobs._engines.files._flight import FlightRecord, resolve_owners
from nursery_jobs._engines.postgres._copy import SHIPPED, Change, PgObject
from nursery_jobs._engines.shared._object import POOL_SIZE, CopyPool, SharedObject
from nursery_jobs._errors import (
    DataLayoutError,
    RuntimeLockedError,
    StorageError,
    UnknownObjectError,
)

logger = logging.getLogger("nursery_jobs")

Key = tuple[str, str]

# Commits made outside a call or an alarm run (a task the object started, say) ship
# this often; calls and alarm runs ship before they return (the output gate).
SHIP_INTERVAL: Final = 0.05
# The shared database's page cache, KiB: every object's rows go through it.
SHARED_CACHE_KIB: Final = 65536

_ROWS: Final = """
CREATE TABLE IF NOT EXISTS nj_rows (
    namespace TEXT NOT NULL,
    object_id TEXT NOT NULL,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (namespace, object_id, tbl, key)
) WITHOUT ROWID
"""


@attrs.frozen(kw_only=True)
class SharedStatistics:
    """What a shared layout's engine has done since it opened (``statistics()``)."""

    ship_passes: int  # passes of the ship loop over the active objects
    ships: int  # transactions that wrote an object's changes into the shared database
    rows_shipped: int  # rows written or deleted by them
    copies_built: int  # working copies deserialized from the image
    copies_reused: int  # working copies taken from the pool


_REGISTERED: Final = (
    "SELECT o.class_path, a.time, a.retry FROM nj_objects o LEFT JOIN nj_alarms a"
    " ON a.namespace = o.namespace AND a.object_id = o.object_id"
    " WHERE o.namespace = ? AND o.object_id = ?")


class SharedEngine(CatalogEngine):
    """A data directory whose objects are rows of one shared database."""

    holds_files = False  # one database for every object (see Engine.holds_files)
    # Idle objects kept resident by default (``open_runtime(max_active=None)``), fewer
    # than the 2,048 open databases of a data directory: a resident object holds its
    # working copy, and only an evicted object's copy goes back to the pool. A copy
    # built from the image costs ~650 us of statement compiles on first use, a pooled
    # one ~110 us (a wipe, then its prepared statements; a create's statements replayed);
    # 3,000 creates took 1.7-2.1 ms of CPU an object with 2,048 resident (2,049 copies
    # built), ~0.9-1.0 with 256 (257 built), and the cycle collector's full passes
    # walk fewer resident objects. An application whose working set of busy objects is
    # larger raises ``max_active``.
    default_max_active = POOL_SIZE

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str) -> None:
        super().__init__()
        self.path = Path(path).absolute()
        self._synchronous = synchronous
        self._lock_fd: int | None = None
        # Set when an active object has something to ship (see ``serve``).
        self._to_ship = trio.Event()
        self._pool = CopyPool(self._noted)
        self._active: dict[Key, SharedObject] = {}
        # The active objects that noted something to ship since the ship loop last
        # looked at them: it looks at these, not at every active object (with 2,048
        # resident, 3,000 creates made 175,000 ``changed`` checks; issue 26).
        self._noted_states: set[SharedObject] = set()
        # Alarms written by active objects and not shipped yet: the timer sees them
        # (``due``, ``next_alarm_after``, ``get_alarm``) before the shared database does.
        self._unshipped: dict[Key, tuple[float | None, int]] = {}
        self._conn: sqlite3.Connection | None = None
        # (namespace, id) -> how many times this runtime wrote the object's stored rows
        # since an operator face first asked (``rows_written``); None until then: no
        # entry per object shipped where no dashboard reads.
        self._writes: dict[Key, int] | None = None
        self._ship_passes = 0
        self._ships = 0
        self._rows_shipped = 0

    @property
    def label(self) -> str:
        return f"shared:{self.path}"

    @property
    def database(self) -> Path:
        return self.path / "shared.sqlite3"

    def statistics(self) -> SharedStatistics:
        """Counts of ships and working copies since the engine opened. Does not
        checkpoint."""
        return SharedStatistics(
            ship_passes=self._ship_passes, ships=self._ships,
            rows_shipped=self._rows_shipped, copies_built=self._pool.built,
            copies_reused=self._pool.reused,
        )

    def open(self, now: float) -> None:
        if (self.path / "catalog.sqlite3").exists() or (self.path / "objects").is_dir():
            raise DataLayoutError(
                f"{self.path} holds a file per object (catalog.sqlite3, objects/): open it"
                " by its path, without 'shared:'; nothing was written",
                path=str(self.path), layout="files",
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
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
        try:
            conn = connect(str(self.database), synchronous=self._synchronous,
                           label=f"the shared database of {self.path}",
                           busy_timeout=CATALOG_BUSY_TIMEOUT, cache_kib=SHARED_CACHE_KIB,
                           factory=self.connection_class)
            self._conn = conn
            conn.execute(_ROWS)
            self.catalog = Catalog(conn)
            self.flight = FlightRecord(self.path / "flight.rec", FLIGHT_SLOTS)
        except BaseException:
            self.close()
            raise
        crashed = resolve_owners(self.flight.recover(),
                                 ((ns, oid) for ns, oid, _ in self.catalog.objects()))
        if crashed:
            logger.warning("%d alarm run(s) were in flight when the last process on %s died",
                           len(crashed), self.path)
            self.catalog.add_crashes(crashed, now)
        self.flight.wipe()

    def close(self) -> None:
        for state in list(self._active.values()):
            state.close()
        self._pool.close()
        with suppress(AttributeError):
            self.catalog.close()
        self._conn = None
        with suppress(AttributeError):
            self.flight.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def serve(self, site: EngineSite) -> None:
        """Ship commits made outside calls and alarm runs within ``SHIP_INTERVAL``.

        The loop sleeps until an active object notes something to ship: its working
        copy captured its first key since its last ship (``Captured``, see
        ``_object.Capture``), it wrote an alarm or cleared crash tokens. Then it looks at
        the objects that noted something every ``SHIP_INTERVAL``, until nothing they
        hold is left unshipped (a transaction still open keeps its writes back until it
        commits, which captures nothing new: such an object stays noted)."""
        self._attach(site)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve_held)
            while True:
                await self._to_ship.wait()
                self._to_ship = trio.Event()
                await trio.sleep(SHIP_INTERVAL)
                self._ship_passes += 1
                noted, self._noted_states = self._noted_states, set()
                for state in noted:
                    if not state.changed:
                        continue  # (shipped by a call meanwhile, or closed)
                    try:
                        await state.sync()
                    except StorageError as exc:
                        logger.warning("%s: shipping its commits failed (tried again in"
                                       " %.2f s): %s", state.label, SHIP_INTERVAL, exc)
                self._noted_states.update(state for state in noted if state.changed)
                if self._noted_states:
                    self._to_ship.set()

    def _noted(self, state: SharedObject) -> None:
        self._noted_states.add(state)
        self._to_ship.set()

    # -- objects ----------------------------------------------------------------------
    async def open_object(self, namespace: str, object_id: str, class_path: str, *,
                          create: bool = True) -> SharedObject:
        """Register the object (once), load its rows into a working copy. Checkpoints.

        Raises:
            StorageError: the shared database cannot be read, or holds rows this
                version cannot load.
            UnknownObjectError: ``create=False`` and the object is not registered
                (nothing is loaded or written).
        """
        await trio.lowlevel.checkpoint()
        key = (namespace, object_id)
        label = f"{namespace}/{object_id}"
        conn = self._conn
        assert conn is not None
        # (Its alarm in the same statement: one search of nj_alarms' key less, ~5 us.)
        registered = conn.execute(_REGISTERED, key).fetchone()
        if registered is None and not create:
            raise UnknownObjectError.absent(namespace, object_id, self.label)
        rows: list[tuple[str, str]] = []
        alarm: tuple[float, int] | None = None
        tokens: list[tuple[str, float]] = []
        if registered is not None:
            if registered[0] != class_path:
                self.catalog.register(namespace, object_id, class_path, _clock.now())
            rows = conn.execute(
                "SELECT tbl, data FROM nj_rows WHERE namespace = ? AND object_id = ?", key
            ).fetchall()
            kept = self._unshipped.get(key) if self._unshipped else None
            if kept is not None:
                alarm = None if kept[0] is None else (kept[0], kept[1])
            elif registered[1] is not None:
                alarm = (float(registered[1]), int(registered[2]))
            if self.catalog.may_have_crashes(namespace, object_id):  # (~8 us a read)
                tokens = self.catalog.crashes(namespace, object_id)
        # (Not registered: it never shipped, or was destroyed; either way the shared
        # database holds no rows, no alarm and no crash token of it that counts — a
        # run of jobs that never shipped was never durable. Its first ship registers
        # it, in the ship's transaction: a create commits once, not twice, and reads
        # nothing more; ~60 us of its ~1 ms, measured.)
        copy = self._pool.take(label, rows)
        state = SharedObject(
            key, copy, alarm, tokens,
            ship=self._ship, on_close=self._closed, on_alarm=self._unshipped_alarm,
            give_back=self._pool.give_back, note=self._noted,
        )
        if registered is None:
            state.unregistered = (class_path, _clock.now())
        self._active[key] = state
        return state

    def destroy_object(self, namespace: str, object_id: str) -> None:
        self.catalog.forget(namespace, object_id)
        self.catalog.clear_crashes(namespace, object_id)  # (an unregistered id has none)
        assert self._conn is not None
        self._conn.execute("DELETE FROM nj_rows WHERE namespace = ? AND object_id = ?",
                           (namespace, object_id))
        self._unshipped.pop((namespace, object_id), None)
        self._wrote((namespace, object_id))

    def rows_written(self, namespace: str, object_id: str) -> int:
        """A count that moves whenever this runtime writes the object's stored rows (a
        ship, a destroy), from the first time it is asked: while it stays, the rows an
        operator face read out of memory are still what is stored (this runtime is
        their only writer). Does not checkpoint."""
        if self._writes is None:
            self._writes = {}
        return self._writes.get((namespace, object_id), 0)

    def _wrote(self, key: Key) -> None:
        writes = self._writes
        if writes is not None:
            writes[key] = writes.get(key, 0) + 1

    def object_rows(self, namespace: str, object_id: str) -> list[tuple[str, str, str]]:
        """(table, key, JSON row) of an object as shipped (for reading, e.g. tests)."""
        assert self._conn is not None
        return self._conn.execute(
            "SELECT tbl, key, data FROM nj_rows WHERE namespace = ? AND object_id = ?"
            " ORDER BY tbl, key", (namespace, object_id)).fetchall()

    async def _ship(self, change: Change) -> str:
        """Write one object's changed rows, alarm and cleared crash tokens into the
        shared database in one transaction (durable as the files engine's commits are,
        by ``durability``). Inline on the Trio thread: a local commit (~20 µs, no fsync
        with durability="normal") costs less than a thread hop. Checkpoints.

        Raises:
            StorageError: it cannot be written (nothing was).
        """
        await trio.lowlevel.checkpoint()
        conn = self._conn
        if conn is None:
            raise StorageError(f"{self.label} is closed; the writes of"
                               f" {change.namespace}/{change.object_id} were not shipped")
        ns, oid = change.namespace, change.object_id
        state = self._active.get((ns, oid))
        unregistered = None if state is None else state.unregistered
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if unregistered is not None:
                    self.catalog.register(ns, oid, unregistered[0], unregistered[1])
                if change.upserts:
                    conn.executemany(
                        "INSERT OR REPLACE INTO nj_rows (namespace, object_id, tbl, key,"
                        " data) VALUES (?, ?, ?, ?, ?)",
                        [(ns, oid, tbl, key, data) for tbl, key, data in change.upserts])
                if change.deletes:
                    conn.executemany(
                        "DELETE FROM nj_rows WHERE namespace = ? AND object_id = ? AND"
                        " tbl = ? AND key = ?",
                        [(ns, oid, tbl, key) for tbl, key in change.deletes])
                if change.alarm is not None:
                    time, retry = change.alarm
                    if time is None:
                        self.catalog.delete_alarm(ns, oid)
                    else:
                        self.catalog.set_alarm(ns, oid, time, retry)
                if change.clear_crashes:
                    self.catalog.clear_crashes(ns, oid)
                conn.execute("COMMIT")
                if unregistered is not None and state is not None:
                    state.unregistered = None
                self._ships += 1
                self._rows_shipped += len(change.upserts) + len(change.deletes)
                if self._writes is not None:  # (a dashboard reads: see rows_written)
                    self._wrote((ns, oid))
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StorageError(
                f"cannot write the commits of {ns}/{oid} into {self.database}: {exc}."
                " They are kept in memory and written with the next sync (lost if the"
                " process stops first)"
            ) from exc
        if change.alarm is not None and self._unshipped.get((ns, oid)) == change.alarm:
            del self._unshipped[(ns, oid)]
        return SHIPPED  # (never fenced, never stale: this runtime is the only writer)

    def _unshipped_alarm(self, state: PgObject, time: float | None, retry: int) -> None:
        if self._active.get(state.key) is state:
            self._unshipped[state.key] = (time, retry)
            self._to_ship.set()

    def _closed(self, state: PgObject) -> None:
        self._noted_states.discard(cast("SharedObject", state))
        if self._active.get(state.key) is state:
            del self._active[state.key]
            # Whatever it did not ship is gone with its copy: the index says what the
            # shared database holds.
            self._unshipped.pop(state.key, None)

    # -- the alarm index: the shared database's, and what active objects did not ship ---
    def due(self, now: float, limit: int) -> list[tuple[str, str]]:
        unshipped = self._unshipped
        if not unshipped:
            return super().due(now, limit)
        # Every key the index finds is due; one an active object moved later (or
        # deleted) and has not shipped yet is not, and one it moved earlier is.
        kept = [key for key in super().due(now, limit + len(unshipped))
                if key not in unshipped]
        moved = sorted((time, key) for key, (time, _retry) in unshipped.items()
                       if time is not None and time <= now)
        return ([key for _time, key in moved] + kept)[:limit]

    def next_alarm_after(self, now: float) -> float | None:
        time = super().next_alarm_after(now)
        for kept, _retry in self._unshipped.values():
            if kept is not None and kept > now and (time is None or kept < time):
                time = kept
        # (An alarm the shared database has but an active object moved later or
        # deleted wakes the timer early: harmless, ``due`` leaves it out.)
        return time

    def get_alarm(self, namespace: str, object_id: str) -> tuple[float, int] | None:
        kept = self._unshipped.get((namespace, object_id)) if self._unshipped else None
        if kept is not None:
            return None if kept[0] is None else (kept[0], kept[1])
        return super().get_alarm(namespace, object_id)
