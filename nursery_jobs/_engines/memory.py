"""The memory engine (``open_runtime(None)``): the files engine's catalog and object
databases, in memory."""

from __future__ import annotations

import functools
import sqlite3
from contextlib import suppress

import trio

from nursery_jobs import _clock
from nursery_jobs._engines._faults import GuardedConnection
from nursery_jobs._engines._schema import prepare
from nursery_jobs._engines.base import EngineSite
from nursery_jobs._engines.files._catalog import Catalog, connect
from nursery_jobs._engines.files._engine import FLIGHT_SLOTS, CatalogEngine
from nursery_jobs._engines.files._flight import FlightRecord
from nursery_jobs._engines.files._object import SqliteObject
from nursery_jobs._errors import UnknownObjectError


@functools.cache
def _empty_image() -> bytes:
    """An empty object database at ``SCHEMA_VERSION``, serialized once per process.

    A new object's database is this image deserialized (~70 µs of CPU) rather than the
    schema's DDL parsed and run again (~900 µs, measured): tests and throwaway
    runtimes create objects by the thousand."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        prepare(conn, label="the empty object image")
        return conn.serialize()
    finally:
        conn.close()


class MemoryEngine(CatalogEngine):
    """Everything in memory: for tests and throwaway runtimes. Object databases live
    as long as the engine, so an evicted object comes back with its data."""

    holds_files = False  # (see Engine.holds_files)

    def __init__(self, *, synchronous: str) -> None:
        super().__init__()
        self._synchronous = synchronous
        self._objects: dict[tuple[str, str], GuardedConnection] = {}

    @property
    def label(self) -> str:
        return "memory"

    def open(self, now: float) -> None:
        self.catalog = Catalog(connect(":memory:", synchronous=self._synchronous,
                                       factory=self.connection_class))
        self.flight = FlightRecord(None, FLIGHT_SLOTS)

    def close(self) -> None:
        for conn in self._objects.values():
            conn.close()
        self._objects.clear()
        with suppress(AttributeError):
            self.catalog.close()

    async def serve(self, site: EngineSite) -> None:
        self._attach(site)
        await self._serve_held()

    async def open_object(self, namespace: str, object_id: str, class_path: str, *,
                          create: bool = True) -> SqliteObject:
        await trio.lowlevel.checkpoint()
        key = (namespace, object_id)
        conn = self._objects.get(key)
        if not create and conn is None:
            raise UnknownObjectError.absent(namespace, object_id, self.label)
        self.catalog.register(namespace, object_id, class_path, _clock.now())
        label = f"{namespace}/{object_id}"
        if conn is None:
            conn = connect(":memory:", synchronous="OFF", label=label,
                           factory=self.connection_class)
            conn.deserialize(_empty_image())
            prepare(conn, label=label)  # (a version check now: the image is current)
            self._objects[key] = conn
        return SqliteObject(self, conn, namespace, object_id, file=":memory:", reopen=None)

    def database(self, namespace: str, object_id: str) -> sqlite3.Connection | None:
        """An object's in-memory database, kept while it is evicted (for reading)."""
        return self._objects.get((namespace, object_id))

    def destroy_object(self, namespace: str, object_id: str) -> None:
        self.catalog.forget(namespace, object_id)
        conn = self._objects.pop((namespace, object_id), None)
        if conn is not None:
            conn.close()
