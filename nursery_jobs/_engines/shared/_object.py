"""An object's state under the shared layout: a working copy (the PostgreSQL engine's:
an in-memory SQLite database with the object schema and change-capture triggers) whose
commits ship into the data directory's shared database; and the pool the copies come
from.

Building a copy as the PostgreSQL engine does — a new in-memory database, the object
schema's DDL and 15 TEMP capture triggers, each a schema change that parses the schema
again — costs ~650 µs (1,200-1,500 objects/s, whatever the disk;
``benchmarks/layout_floor.py``), many times the storage itself (~10 µs an object in the
shared database). Two things bring it down:

- an *image*: the empty database with its schema and the triggers in ``main`` (an
  image cannot hold TEMP objects), serialized once per process; a copy is
  ``deserialize`` of it, its schema parsed once, on first use (~8x cheaper, measured);
- a *pool*: a copy whose object left memory is wiped (its rows deleted; the parsed
  schema and prepared statements kept) and handed to the next object (~35 µs).
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, cast

from nursery_jobs._engines._schema import prepare
from nursery_jobs._engines.base import RELEASED
from nursery_jobs._engines.postgres._copy import (
    Change,
    PgObject,
    WorkingCopy,
    capture,
    insert_rows,
)
from nursery_jobs._engines.postgres._schema import ROW_TABLES, capture_sql

Key = tuple[str, str]

# Wiped copies kept for the next objects. Each holds ~240 KiB (SQLite's schema, page
# cache and lookaside); resident objects are bounded by ``max_active`` apart from this.
POOL_SIZE: Final = 256
# The working copies' page size. 1 KiB, not SQLite's 4 KiB: a copy holds every page of
# its image (the empty schema: 60 KiB at 4 KiB pages, 16 at 1 KiB) whatever it stores.
IMAGE_PAGE_SIZE: Final = 1024
# A copy whose database grew past this many pages (256 KiB) is closed rather than kept:
# a pooled copy keeps its pages (and so its memory) after a wipe.
POOL_MAX_PAGES: Final = 256

# A wipe deletes from the tables that hold rows, found by one look: each DELETE costs
# ~10-30 µs even on an empty table (the capture triggers' programs run), and an object
# that lived for one job leaves rows in one or two of the six (a wipe of all six took
# ~90 µs). Statements, not one script: ``executescript`` compiles each anew (~285 µs a
# wipe, measured), where ``execute`` reuses the copy's prepared statements.
_WIPED: Final = tuple(f"main.{table.name}" for table in ROW_TABLES)
_WIPE_LOOK: Final = "SELECT " + ", ".join(
    f"EXISTS (SELECT 1 FROM {name})" for name in _WIPED)
_WIPE: Final = tuple(f"DELETE FROM {name}" for name in _WIPED)
_IMAGE: list[bytes] = []


def new_copy() -> SharedCopy:
    """An empty working copy, deserialized from the image (built on first use)."""
    if not _IMAGE:
        _IMAGE.append(_build_image())
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False,
                           factory=SharedCopy)
    conn.deserialize(_IMAGE[0])
    return conn


def _fill(conn: SharedCopy, label: str, rows: list[tuple[str, str]], *,
          wipe: bool) -> None:
    """Make a copy hold ``rows`` ((table, JSON row)) and nothing else, with nothing
    captured: delete (``wipe``: a pooled copy) from the tables that hold rows
    (``_WIPE_LOOK``), insert ``rows`` — in one transaction (the wipe and the load each
    in its own took ~39 us for one job's row against ~16, measured) — and forget the
    keys captured (by both, or by a stale handle of the copy's last object).

    Raises:
        StorageError: a row of a table the object schema lacks (nothing changed).
    """
    held = conn.execute(_WIPE_LOOK).fetchone() if wipe else None
    if rows or (held is not None and any(held)):
        conn.execute("BEGIN")
        try:
            if held is not None:
                for statement, found in zip(_WIPE, held, strict=False):
                    if found:
                        conn.execute(statement)
            if rows:
                insert_rows(conn, label, rows)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    conn.captured.keys.clear()


def _build_image() -> bytes:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size={IMAGE_PAGE_SIZE}")
        prepare(conn, label="the working copy image")
        for table in ROW_TABLES:
            for statement in capture_sql(table):
                # In main, not TEMP: an image holds no TEMP objects. (``nj_capture``
                # is each copy's own: ``CopyPool.take`` gives it one.)
                conn.execute(statement.replace("CREATE TEMP TRIGGER", "CREATE TRIGGER")
                             .replace(" ON main.", " ON "))
        return conn.serialize()
    finally:
        conn.close()


class SharedCopy(WorkingCopy):
    """A working copy of the shared layout: storage refuses raw SQL on it."""

    refuses_raw_sql = "the shared layout (shared:<directory>)"  # read by _storage
    capture: Capture  # its first-capture callback (set when it is built)


class Capture:
    """A copy's first-capture callback (its ``Captured`` calls it on the first key
    captured since its last take): tells the engine which object has something to ship.
    No owner while the copy is loaded, wiped or in the pool: those writes ship nothing.
    """

    __slots__ = ("_note", "owner")

    def __init__(self, note: Callable[[SharedObject], None]) -> None:
        self._note = note
        self.owner: SharedObject | None = None

    def __call__(self) -> None:
        owner = self.owner
        if owner is not None:
            self._note(owner)


class CopyPool:
    """Working copies whose objects left memory, kept for reuse (see the module
    docstring).

    A copy is reused only once nothing else refers to its connection: a storage handle
    of its old object kept somewhere (``storage.conn`` handed out, a task that outlived
    the object) must never reach the next object's rows. ``sys.getrefcount`` tells; a
    copy still referred to waits (closed when the pool is full), and is wiped when
    taken, not when given back, so that nothing written through a stale handle meanwhile
    survives.
    """

    __slots__ = ("_note", "_returned", "built", "reused")

    def __init__(self, note: Callable[[SharedObject], None]) -> None:
        # Called with the object whose copy captured its first key since it last
        # shipped (each copy's ``Capture``).
        self._note = note
        self._returned: list[SharedCopy] = []
        self.built = 0  # copies deserialized from the image
        self.reused = 0  # copies taken from the pool

    def take(self, label: str, rows: list[tuple[str, str]]) -> SharedCopy:
        """A copy holding ``rows`` ((table, JSON row)), nothing captured yet.

        Raises:
            StorageError: a stored row of a table the object schema lacks.
        """
        kept = self._reusable()
        conn = new_copy() if kept is None else kept
        try:
            if kept is None:
                self.built += 1
                conn.capture = Capture(self._note)
                capture(conn, conn.capture)
            else:
                self.reused += 1
            _fill(conn, label, rows, wipe=kept is not None)
        except BaseException:
            conn.close()
            raise
        return conn

    def _reusable(self) -> SharedCopy | None:
        returned = self._returned
        for i in range(len(returned) - 1, -1, -1):
            if _references(returned, i) <= _UNREFERENCED:
                return returned.pop(i)
        return None

    def give_back(self, conn: SharedCopy) -> None:
        """The object left memory (its transaction rolled back): keep its copy, or close
        it when the copy grew (a wiped copy keeps its pages, so its memory)."""
        conn.capture.owner = None
        try:
            grown = conn.execute("PRAGMA page_count").fetchone()[0] > POOL_MAX_PAGES
        except sqlite3.Error:
            grown = True
        if grown:
            conn.close()
            return
        returned = self._returned
        if len(returned) >= POOL_SIZE:
            returned.pop(0).close()
        returned.append(conn)

    def close(self) -> None:
        for conn in self._returned:
            conn.close()
        self._returned.clear()


def _references(held: Sequence[sqlite3.Connection], i: int) -> int:
    return sys.getrefcount(held[i])


def _unreferenced() -> int:
    """What ``_references`` says of a copy that only the pool holds (the list, the
    call's argument, and the connection's own statement cache, which refers to it)."""
    probe = [sqlite3.connect(":memory:", factory=SharedCopy)]
    try:
        return _references(probe, 0)
    finally:
        probe[0].close()


_UNREFERENCED: Final = _unreferenced()


def _unused() -> None:
    raise AssertionError("SharedObject wakes the ship loop through _wake")


class SharedObject(PgObject):
    """One active object's state under the shared layout (an ``ObjectState``): the
    PostgreSQL engine's working copy, shipped into the shared database, never fenced
    (the data directory's lock makes this runtime its only writer)."""

    __slots__ = ("_give_back", "_note", "unregistered")

    def __init__(
        self, key: Key, conn: SharedCopy, alarm: tuple[float, int] | None,
        tokens: list[tuple[str, float]], *, ship: Callable[[Change], Awaitable[str]],
        on_close: Callable[[PgObject], None],
        on_alarm: Callable[[PgObject, float | None, int], None],
        give_back: Callable[[SharedCopy], None],
        note: Callable[[SharedObject], None],
    ) -> None:
        super().__init__(key, 0, conn, alarm, tokens, ship=ship, on_close=on_close,
                         on_alarm=on_alarm, to_ship=_unused)
        self._give_back = give_back
        self._note = note  # this object has something to ship (the engine's ship loop)
        # (class path, time) of an object not in the registry yet: its next ship
        # registers it (``SharedEngine.open_object``).
        self.unregistered: tuple[str, float] | None = None
        conn.capture.owner = self

    def _wake(self) -> None:
        # (Not ``to_ship=self._noted``: this object would be a cycle of its own, left
        # to the collector with its copy's handle.)
        self._note(self)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = self.conn
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        self.conn = RELEASED  # (before the pool counts who still refers to the copy)
        self._give_back(cast("SharedCopy", conn))
        self._on_close(self)
