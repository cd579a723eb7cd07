"""The operator faces' sources on the shared layout (``shared:<directory>``): every
object is rows of one database, ``shared.sqlite3`` — the catalog's tables (read by
``_CatalogReader``, as a data directory's catalog) and ``nj_rows``, loaded one object
at a time into an in-memory database (``_stored_rows``, as on PostgreSQL).

- ``SharedSource``: a stopped directory (``nursery-jobs inspect``, ``serve``), read-only:
  the database opened as ``_readonly`` opens one (no file created, no lock taken), once
  for as long as it is unchanged.
- ``SharedRuntimeSource``: a running runtime's dashboard. An object in memory is read
  from its working copy (its writes show before they ship), every other one from what
  it shipped (``nj_rows``, through the engine's own connection, on the Trio thread).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nursery_jobs._engines.shared._engine import SharedEngine
from nursery_jobs._ops._inspect import ObjectRow, State
from nursery_jobs._ops._readonly import (
    _file_signature,
    check_shared_directory,
    open_readonly,
)
from nursery_jobs._ops._sources import RuntimeSource, StoppedSource
from nursery_jobs._ops._stored_rows import StoredRow, StoredRows

if TYPE_CHECKING:
    from nursery_jobs._core._runtime import Runtime

DATABASE = "shared.sqlite3"
_ROWS_OF = ("SELECT tbl, key, data FROM nj_rows WHERE namespace = ? AND object_id = ?"
            " ORDER BY tbl, key")


class SharedSource(StoredRows, StoppedSource):
    """A stopped directory of the shared layout, read-only. Creates no file, takes no
    lock, runs nothing. Close it (or use it as a context manager).

    Raises (on construction):
        DataDirectoryError: not a directory of the shared layout.
    """

    def __init__(self, data: str | os.PathLike[str]) -> None:
        self.data = Path(data)
        self.database = self.data / DATABASE
        check_shared_directory(self.data)
        self._held: contextlib.ExitStack | None = None
        self._conn: sqlite3.Connection | None = None
        self._opened: Any = None  # the database's signature when it was opened

    @property
    def label(self) -> str:
        return f"shared:{self.data}"

    def __enter__(self) -> SharedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        super().close()
        self._release()

    def _release(self) -> None:
        held, self._held, self._conn = self._held, None, None
        if held is not None:
            held.close()

    def _db(self) -> sqlite3.Connection:
        """The database, opened read-only once, and again whenever its files changed
        (a runtime started meanwhile: ``ObjectInUseError``, as ``open_readonly``
        says; one that crashed left a WAL: read from a copy, made once).

        Raises:
            ObjectInUseError: another process holds the database.
        """
        signature = self._signature_now()
        if self._conn is None or signature != self._opened:
            self._release()  # (before the probe: no descriptor of it stays open here)
            held = contextlib.ExitStack()
            try:
                self._conn = held.enter_context(open_readonly(self.database))
            except BaseException:
                held.close()
                raise
            self._held, self._opened = held, signature
        return self._conn

    def _signature_now(self) -> Any:
        return _file_signature(str(self.database))

    @contextlib.contextmanager
    def _catalog(self) -> Iterator[sqlite3.Connection]:
        yield self._db()

    def _stored_rows(self, row: ObjectRow) -> list[StoredRow]:
        return self._db().execute(_ROWS_OF, (row.namespace, row.id)).fetchall()

    def _signature(self, row: ObjectRow) -> Any:
        # Any write to the directory moves the database's (or its WAL's) signature;
        # while it stays, every object's counts do.
        return self._signature_now()


class SharedRuntimeSource(RuntimeSource, StoredRows):
    """A running runtime on the shared layout (its dashboard), read on the Trio thread:
    an active object from its working copy, every other object from its rows in the
    shared database (what it shipped before it left memory). The catalog is the
    engine's, in the same database."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        assert isinstance(rt.engine, SharedEngine)
        self.engine = rt.engine

    @property
    def label(self) -> str:
        return self.engine.label

    def _stored_rows(self, row: ObjectRow) -> list[StoredRow]:
        return self.engine.object_rows(row.namespace, row.id)

    def _signature(self, row: ObjectRow) -> Any:
        conn = self._host_conn(row.namespace, row.id)
        if conn is not None:
            return ("open", id(conn), conn.total_changes, self._running_id(row))
        if self.rt.is_active(row.namespace, row.id):
            return None  # (opening or closing: read it each time)
        # Out of memory: its rows change only when this runtime writes them.
        return ("stored", self.engine.rows_written(row.namespace, row.id))

    @contextlib.contextmanager
    def _object_db(
        self, row: ObjectRow
    ) -> Iterator[tuple[sqlite3.Connection | None, State, str | None]]:
        conn = self._host_conn(row.namespace, row.id)
        if conn is not None:
            yield conn, "active", None
            return
        with self._stored_db(row, "evicted") as found:
            yield found


def runtime_source(rt: Runtime) -> RuntimeSource:
    """The source a running runtime's dashboard reads: its engine's."""
    if isinstance(rt.engine, SharedEngine):
        return SharedRuntimeSource(rt)
    return RuntimeSource(rt)
