"""The files engine (a data directory) and the memory engine (``path=None``).

A data directory holds ``catalog.sqlite3`` (objects registry, alarm index, crash
tokens), ``objects/<hash>.sqlite3`` (one database per object), ``flight.rec`` (the
flight record) and ``runtime.lock`` (held with ``flock`` while a runtime runs).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
from contextlib import suppress
from pathlib import Path
from typing import Final

import trio

from . import _clock
from ._catalog import Catalog, connect, object_file_name
from ._engine import EngineSite, FlightSlot
from ._errors import RuntimeLockedError, StorageError
from ._flight import FlightRecord
from ._schema import prepare

logger = logging.getLogger("nursery_jobs")

# Alarm runs that can each hold a flight-record slot at once.
FLIGHT_SLOTS: Final = 64
# The catalog's WAL is checkpointed off the Trio thread when it passes this size.
CHECKPOINT_INTERVAL: Final = 1.0
CHECKPOINT_WAL_BYTES: Final = 4 * 1024 * 1024
CHECKPOINT_WAL_MAX: Final = 256 * 1024 * 1024


class SqliteObject:
    """An object's state in a SQLite database of its own (files or memory engine)."""

    __slots__ = ("_catalog", "_keep_open", "alarm", "conn", "namespace", "object_id")
    ships = False  # every commit is durable when it returns

    def __init__(
        self, catalog: Catalog, conn: sqlite3.Connection, namespace: str, object_id: str, *,
        keep_open: bool,
    ) -> None:
        self._catalog = catalog
        self.conn = conn
        self.namespace = namespace
        self.object_id = object_id
        self._keep_open = keep_open
        self.alarm = catalog.get_alarm(namespace, object_id)

    def write_alarm(self, time: float | None, retry: int) -> None:
        if time is None:
            self._catalog.delete_alarm(self.namespace, self.object_id)
        else:
            self._catalog.set_alarm(self.namespace, self.object_id, time, retry)

    def crash_tokens(self) -> list[tuple[str, float]]:
        return self._catalog.crashes(self.namespace, self.object_id)

    def clear_crash_tokens(self) -> None:
        self._catalog.clear_crashes(self.namespace, self.object_id)

    async def sync(self) -> None:
        await trio.lowlevel.checkpoint()  # every commit here is durable when it returns

    def close(self) -> None:
        conn = self.conn
        if conn.in_transaction:
            conn.execute("ROLLBACK")  # never leave a half-written transaction behind
        if not self._keep_open:
            conn.close()


class _CatalogEngine:
    """What the files and memory engines share: the catalog and the flight record."""

    catalog: Catalog
    flight: FlightRecord

    def class_path(self, namespace: str) -> str | None:
        return self.catalog.class_path(namespace)

    def due(self, now: float, limit: int) -> list[tuple[str, str]]:
        return [(ns, oid) for ns, oid, _time, _retry in self.catalog.due(now, limit)]

    def next_alarm_after(self, now: float) -> float | None:
        return self.catalog.next_after(now)

    def get_alarm(self, namespace: str, object_id: str) -> tuple[float, int] | None:
        return self.catalog.get_alarm(namespace, object_id)

    def set_alarm(self, namespace: str, object_id: str, time: float, retry: int) -> None:
        self.catalog.set_alarm(namespace, object_id, time, retry)

    def alarm_count(self) -> int:
        return self.catalog.alarm_count()

    def acquire_flight(self, namespace: str, object_id: str) -> FlightSlot | None:
        return self.flight.acquire(namespace, object_id)

    def release_flight(self, slot: FlightSlot) -> None:
        self.flight.release(slot)  # type: ignore[arg-type]


class MemoryEngine(_CatalogEngine):
    """Everything in memory: for tests and throwaway runtimes. Object databases live
    as long as the engine, so an evicted object comes back with its data."""

    def __init__(self, *, synchronous: str) -> None:
        self._synchronous = synchronous
        self._objects: dict[tuple[str, str], sqlite3.Connection] = {}

    @property
    def label(self) -> str:
        return "memory"

    def open(self, now: float) -> None:
        self.catalog = Catalog(connect(":memory:", synchronous=self._synchronous))
        self.flight = FlightRecord(None, FLIGHT_SLOTS)

    def close(self) -> None:
        for conn in self._objects.values():
            conn.close()
        self._objects.clear()
        with suppress(AttributeError):
            self.catalog.close()

    async def serve(self, site: EngineSite) -> None:
        await trio.sleep_forever()

    async def open_object(self, namespace: str, object_id: str, class_path: str) -> SqliteObject:
        await trio.lowlevel.checkpoint()
        self.catalog.register(namespace, object_id, class_path, _clock.now())
        key = (namespace, object_id)
        conn = self._objects.get(key)
        if conn is None:
            conn = connect(":memory:", synchronous="OFF")
            prepare(conn, label=f"{namespace}/{object_id}")
            self._objects[key] = conn
        return SqliteObject(self.catalog, conn, namespace, object_id, keep_open=True)

    def destroy_object(self, namespace: str, object_id: str) -> None:
        self.catalog.forget(namespace, object_id)
        conn = self._objects.pop((namespace, object_id), None)
        if conn is not None:
            conn.close()


class FilesEngine(_CatalogEngine):
    """A data directory on disk."""

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str) -> None:
        self.path = Path(path)
        self._synchronous = synchronous
        self._lock_fd: int | None = None

    @property
    def label(self) -> str:
        return str(self.path)

    def object_path(self, namespace: str, object_id: str) -> Path:
        return self.path / "objects" / object_file_name(namespace, object_id)

    def open(self, now: float) -> None:
        (self.path / "objects").mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / "runtime.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeLockedError(
                f"{self.path} is in use by another runtime (in this or another process)"
            ) from None
        self._lock_fd = fd
        try:
            self.catalog = Catalog(
                connect(str(self.path / "catalog.sqlite3"), synchronous=self._synchronous,
                        autocheckpoint=False)
            )
            self.flight = FlightRecord(self.path / "flight.rec", FLIGHT_SLOTS)
        except BaseException:
            self.close()
            raise
        # Work the last process on this path was doing when it died: hand it to the
        # objects (durably) before the record is wiped.
        crashed = self.flight.recover()
        if crashed:
            logger.warning("%d alarm run(s) were in flight when the last process on %s died",
                           len(crashed), self.path)
            self.catalog.add_crashes(crashed, now)
        self.flight.wipe()

    def close(self) -> None:
        with suppress(AttributeError):
            self.catalog.close()
        with suppress(AttributeError):
            self.flight.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    async def open_object(self, namespace: str, object_id: str, class_path: str) -> SqliteObject:
        await trio.lowlevel.checkpoint()
        file = self.catalog.register(namespace, object_id, class_path, _clock.now())
        label = f"{namespace}/{object_id}"
        try:
            conn = connect(str(self.path / "objects" / file), synchronous=self._synchronous,
                           exclusive=True)
        except sqlite3.OperationalError as exc:
            raise StorageError(
                f"cannot open the database of {label} ({file}): {exc}. If the open-file"
                " limit is reached, lower max_active or raise the limit"
            ) from exc
        try:
            prepare(conn, label=label)
        except BaseException:
            conn.close()
            raise
        return SqliteObject(self.catalog, conn, namespace, object_id, keep_open=False)

    def destroy_object(self, namespace: str, object_id: str) -> None:
        self.catalog.forget(namespace, object_id)
        file = self.object_path(namespace, object_id)
        for suffix in ("", "-wal", "-shm"):
            with suppress(FileNotFoundError):
                os.unlink(f"{file}{suffix}")

    async def serve(self, site: EngineSite) -> None:
        """Checkpoint the catalog's WAL from a worker thread once it has grown, so no
        commit on the Trio thread ever stalls on a checkpoint's fsync. A checkpoint's
        fsync can still hold up writes to the same filesystem (measured: p99 lateness
        401 ms), so it waits for a lull (no alarm due within a second) unless the WAL
        has grown past CHECKPOINT_WAL_MAX. (A thread can only let a MockClock jump
        ahead here, where nothing waits on its result.)"""
        catalog = self.path / "catalog.sqlite3"
        wal = self.path / "catalog.sqlite3-wal"
        while True:
            await trio.sleep(CHECKPOINT_INTERVAL)
            try:
                size = wal.stat().st_size
            except FileNotFoundError:
                continue
            lull = site.earliest_alarm() - _clock.now() > CHECKPOINT_INTERVAL
            if (size >= CHECKPOINT_WAL_BYTES and lull) or size >= CHECKPOINT_WAL_MAX:
                await trio.to_thread.run_sync(Catalog.checkpoint, str(catalog))

