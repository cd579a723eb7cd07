"""Reading objects whose rows are stored as ``nj_rows`` — (table, key, JSON row) per
object, as the PostgreSQL engine and the shared layout keep them — through the readers
of a data directory: ``StoredRows`` loads one object's rows into an in-memory database
with the object schema (one, refilled for each object in turn) and hands it to the
per-object readers (``_readers._ObjectReader``).

A row changed outside nursery_jobs (no JSON, a number field that holds none) is its
object's fault: that object is shown ``damaged``, naming the row, and every other object
is read as before.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sqlite3
from collections.abc import Iterator
from typing import Final

from nursery_jobs._engines._schema import prepare
from nursery_jobs._engines.postgres._copy import load_rows
from nursery_jobs._engines.postgres._schema import ROW_TABLES
from nursery_jobs._errors import StorageError, safe_repr
from nursery_jobs._ops._inspect import ObjectRow, State
from nursery_jobs._ops._queries import STRIKES_KEY

StoredRow = tuple[str, str, str]  # (table, key, JSON row)


class StoredRows:
    """The per-object half of a source over stored rows: ``_object_db`` (what
    ``_ObjectReader`` reads an object through) from ``_stored_rows``, which a subclass
    gives. Close it (its in-memory database)."""

    # One in-memory database with the object schema, refilled with each object's rows
    # in turn: a working copy per object (schema, capture triggers) cost ~0.7 ms of the
    # ~1 ms an object took on a dashboard page.
    _copy: sqlite3.Connection | None = None

    @property
    def label(self) -> str:
        raise NotImplementedError

    def _stored_rows(self, row: ObjectRow) -> list[StoredRow]:
        """The object's stored rows."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the in-memory database (reopened if read again)."""
        if self._copy is not None:
            self._copy.close()
            self._copy = None

    def _object_db(
        self, row: ObjectRow
    ) -> contextlib.AbstractContextManager[tuple[sqlite3.Connection | None, State, str | None]]:
        return self._stored_db(row, "active" if row.active else "evicted")

    @contextlib.contextmanager
    def _stored_db(
        self, row: ObjectRow, state: State
    ) -> Iterator[tuple[sqlite3.Connection | None, State, str | None]]:
        """The in-memory database holding ``row``'s stored rows (and ``state``), or
        None, ``"damaged"`` and what is wrong, naming the row."""
        label = f"{row.namespace}/{row.id}"
        stored = self._stored_rows(row)
        conn = self._copy
        if conn is None:
            conn = self._copy = sqlite3.connect(":memory:", isolation_level=None)
            prepare(conn, label=self.label)
        problem = load_stored(conn, label, stored)
        if problem is not None:
            # Rows this code cannot read (changed outside nursery_jobs, another
            # version): the object is shown damaged, naming the row; the others are read.
            yield None, "damaged", problem
            return
        yield conn, state, None


# What loading a stored row may raise: a row of a table the object schema lacks, no
# JSON, no row of its table (too long, a list where a value goes, NULL where none may
# be, an int too large for SQLite).
UNLOADABLE: Final = (StorageError, ValueError, TypeError, OverflowError, sqlite3.Error)
_OUTSIDE: Final = " (the row was changed outside nursery_jobs)"


def _row_name(table: str, key: object) -> str:
    return f"job {key!r}" if table == "nj_jobs" else f"{table} row {key!r}"


def _clear(conn: sqlite3.Connection) -> None:
    for table in ROW_TABLES:
        conn.execute(f"DELETE FROM {table.name}")


def load_stored(conn: sqlite3.Connection, label: str, stored: list[StoredRow]) -> str | None:
    """Fill the working copy on ``conn`` with an object's ``stored`` rows ((table, key,
    JSON row)); what is wrong with them, naming the row (None: nothing). The copy then
    holds a number in every number column, as nursery_jobs writes it: every reader of
    it converts what it reads without a check of its own."""
    _clear(conn)
    try:
        load_rows(conn, label, [(table, data) for table, _key, data in stored])
    except UNLOADABLE as exc:
        return _unloadable(conn, label, stored, exc)
    return _misfiled(conn)


def _unloadable(conn: sqlite3.Connection, label: str, stored: list[StoredRow],
                error: Exception) -> str:
    """The problem of the first of ``stored`` rows that does not load alone (their
    loading together raised ``error``). Reads the rows again: only for a damaged
    object."""
    for table, key, data in stored:
        try:
            load_rows(conn, label, [(table, data)])
        except UNLOADABLE as exc:
            return f"{_row_name(table, key)}: its stored row does not load: {exc}{_OUTSIDE}"
        finally:
            _clear(conn)
    return f"{label}: stored rows cannot be read: {error}"


@functools.cache
def _number_columns() -> list[tuple[str, tuple[str, ...], list[tuple[str, bool]]]]:
    """Per table of the working copy: its name, its key columns, and its number columns
    (name, and whether an integer column: an infinity converts to no int), as the object
    schema declares them."""
    scratch = sqlite3.connect(":memory:")
    try:
        prepare(scratch, label="(the object schema)")
        return [(table.name, table.key_columns, [
            (str(name), str(kind) == "INTEGER") for _cid, name, kind, *_ in
            scratch.execute(f"PRAGMA table_info({table.name})")
            if str(kind) in ("INTEGER", "REAL")]) for table in ROW_TABLES]
    finally:
        scratch.close()


def _misfiled(conn: sqlite3.Connection) -> str | None:
    """The first row of the working copy with a number column that holds no number
    (SQLite keeps the text of a number stored as a JSON string), or breaker strikes that
    are no number, named; None where there is none. A scan of each table in memory."""
    for table, key_columns, numbers in _number_columns():
        if not numbers:
            continue
        wrong = " OR ".join(
            f"typeof({name}) IN ('text', 'blob')" + (f" OR abs({name}) = 9e999"
                                                     if integer else "")
            for name, integer in numbers)
        found = conn.execute(
            f"SELECT {', '.join(key_columns)}, {', '.join(name for name, _ in numbers)}"
            f" FROM {table} WHERE {wrong} LIMIT 1").fetchone()
        if found is None:
            continue
        width = len(key_columns)
        key = found[0] if width == 1 else list(found[:width])
        for (name, integer), value in zip(numbers, found[width:], strict=True):
            if isinstance(value, (str, bytes)) or (
                    integer and isinstance(value, float) and math.isinf(value)):
                return (f"{_row_name(table, key)}: its stored {name} {safe_repr(value, 60)}"
                        f" is no number{_OUTSIDE}")
    found = conn.execute("SELECT value FROM nj_meta WHERE key = ? AND typeof(value)"
                         " NOT IN ('integer', 'real')", (STRIKES_KEY,)).fetchone()
    if found is not None:
        return (f"{_row_name('nj_meta', STRIKES_KEY)}: its stored value"
                f" {safe_repr(found[0], 60)} is no number{_OUTSIDE}")
    return None
