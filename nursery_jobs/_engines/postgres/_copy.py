"""An object's working copy under the PostgreSQL engine: an in-memory SQLite database
with the object schema, loaded from PostgreSQL at activation, whose commits are shipped
back by ``sync`` as one fenced transaction each.

Change capture: TEMP triggers hand the key of every row a write touches to the copy's
``Captured`` (a set; a rolled-back write's key stays: harmless). ``sync`` reads the
current version of each changed row — an upsert, or a delete where it is gone — and
ships them with the alarm, in one statement that first checks the lease's epoch and
the stored ``version`` the copy builds on (issue 22 #1: after a server crash lost the last
commits, a delta shipped onto the older state would make one that never existed; the
ship is refused instead and the object reloaded).
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Final

import attrs
import trio

from nursery_jobs._engines._schema import prepare
from nursery_jobs._engines.postgres._schema import ROW_TABLES, TABLES_BY_NAME, capture_sql
from nursery_jobs._errors import ObjectFencedError, StorageError

Key = tuple[str, str]

# What a ship finds (``_ops.ship``): written; the lease is gone; the base is gone.
SHIPPED: Final = "shipped"
FENCED: Final = "fenced"
STALE: Final = "stale"
STALE_REASON: Final = (
    "PostgreSQL lost its last commits of the object (a server crash?): reloading it"
)


class WorkingCopy(sqlite3.Connection):
    """The working database's connection class: storage refuses raw SQL on it."""

    refuses_raw_sql = "the PostgreSQL engine"  # read by _storage (hook(pg))
    captured: Captured  # the keys its writes changed (``capture``)


class Captured:
    """The keys ((table, key)) a working copy's writes changed since they were last
    taken: its capture triggers call it (``nj_capture``). The first key since the last
    take calls ``first``, which wakes an engine's ship loop. (It looked every 50 ms for
    as long as objects were resident: 72,000 passes a virtual hour, most of the time of
    the long-span tests, measured.) Once: the loop keeps looking while a copy has
    anything unshipped, and a captured key stays until it ships."""

    __slots__ = ("_first", "keys")

    def __init__(self, first: Callable[[], object]) -> None:
        self._first = first
        self.keys: set[tuple[str, str]] = set()

    def __call__(self, tbl: str, key: str) -> None:
        keys = self.keys
        if not keys:
            self._first()
        keys.add((tbl, key))

    def restore(self, keys: list[tuple[str, str]]) -> None:
        """Keys taken by a ship that failed: captured again."""
        if keys and not self.keys:
            self._first()
        self.keys.update(keys)


def capture(conn: WorkingCopy, first: Callable[[], object]) -> Captured:
    """Give ``conn`` (its triggers made by ``_schema.capture_sql``) its ``Captured``."""
    conn.captured = captured = Captured(first)
    conn.create_function("nj_capture", 2, captured)
    return captured


@attrs.define
class Change:
    """What one ``sync`` ships."""

    namespace: str
    object_id: str
    epoch: int
    keys: list[tuple[str, str]]
    upserts: list[tuple[str, str, str]]
    deletes: list[tuple[str, str]]
    alarm: tuple[float | None, int] | None  # None: the alarm did not change
    clear_crashes: bool
    # The stored version this change builds on (set when it ships: changes ship one at
    # a time, each on the version the one before it made).
    version: int = 0
    # Ships just before this one whose outcome is unknown (their caller was cancelled,
    # or their answer lost): each may have committed, so the stored version may be up to
    # this many newer — made by them, whose rows this change carries again (the keys of
    # a failed ship go back into the next; the rows are read as they are then).
    unsure: int = 0
    shipped_version: int = 0  # the stored version once it shipped (set by the ship)


def load_copy(
    label: str, rows: list[tuple[str, str]], *, captured: Callable[[], object],
    factory: type[WorkingCopy] = WorkingCopy,
) -> WorkingCopy:
    """A working copy holding ``rows`` ((table, JSON row)), with change capture on
    (``factory``: its connection class, a ``WorkingCopy``); ``captured`` is called when
    it captures a first key since its last take (``Captured``)."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False,
                           factory=factory)
    conn.execute("PRAGMA cache_size=-8192")
    prepare(conn, label=label)
    load_rows(conn, label, rows)
    for table in ROW_TABLES:
        for statement in capture_sql(table):
            conn.execute(statement)
    capture(conn, captured)
    return conn


# Per table: the row of one key, and the rows of several (a JSON array of them). Built
# once: ``RowTable.key`` and ``select`` build their text on every use, ~50 µs a ship.
_ROW_OF: Final = {table.name: f"{table.select} WHERE {table.key} = ?"
                  for table in ROW_TABLES}
_ROWS_OF: Final = {
    table.name: f"{table.select} WHERE {table.key} IN (SELECT value FROM json_each(?))"
    for table in ROW_TABLES
}


def _row_dumper() -> Callable[[tuple[object, ...]], str]:
    """``json.dumps`` of a row (a tuple of SQLite values), without the encoder it
    builds on every call: 6.1 -> 3.0 us a row, measured (a push ships one). The same
    text, and the same ``TypeError`` for a value JSON cannot hold (a BLOB)."""
    make = getattr(json.encoder, "c_make_encoder", None)  # (None without the C module)
    if make is None:
        return json.dumps
    encode = make(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii,
                  None, ": ", ", ", False, False, True)

    def dump_row(row: tuple[object, ...]) -> str:
        return "".join(encode(row, 0))

    return dump_row


dump_row: Final = _row_dumper()


def captured_rows(
    conn: sqlite3.Connection, keys: list[tuple[str, str]]
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """The rows behind the changed ``keys`` of a working copy: (table, key, JSON row)
    for those that exist, (table, key) for those deleted.

    Raises:
        KeyError: a key of a table the object schema does not have.
    """
    upserts: list[tuple[str, str, str]] = []
    deletes: list[tuple[str, str]] = []
    if len(keys) == 1:  # (a push: one statement on the key's index)
        tbl, key = keys[0]
        row = conn.execute(_ROW_OF[tbl], (key,)).fetchone()
        if row is None:
            deletes.append((tbl, key))
        else:
            upserts.append((tbl, key, dump_row(row[1:])))
        return upserts, deletes
    by_table: dict[str, list[str]] = defaultdict(list)
    for tbl, key in keys:
        by_table[tbl].append(key)
    for tbl, table_keys in by_table.items():
        found = set()
        for row in conn.execute(_ROWS_OF[tbl], (json.dumps(table_keys),)):
            found.add(row[0])
            upserts.append((tbl, row[0], dump_row(row[1:])))
        deletes.extend((tbl, key) for key in table_keys if key not in found)
    return upserts, deletes


def take_captured(
    conn: sqlite3.Connection, captured: Captured,
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]], list[tuple[str, str]]]:
    """The keys a working copy captured (``captured``: its ``Captured``), and the rows
    behind them (``captured_rows``); forgets the keys (not where reading the rows
    failed)."""
    keys = list(captured.keys)
    upserts, deletes = captured_rows(conn, keys)
    captured.keys.clear()
    return keys, upserts, deletes


def load_rows(conn: sqlite3.Connection, label: str, rows: list[tuple[str, str]]) -> None:
    """Insert ``rows`` ((table, JSON row)) into the tables of a database with the object
    schema, in one transaction (nothing, on an error).

    Raises:
        StorageError: a row of a table the object schema does not have.
        ValueError, sqlite3.Error: a row that is not one of its table's.
    """
    conn.execute("BEGIN")
    try:
        insert_rows(conn, label, rows)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def insert_rows(conn: sqlite3.Connection, label: str, rows: list[tuple[str, str]]) -> None:
    """``load_rows`` in the caller's transaction.

    Raises:
        StorageError: a row of a table the object schema does not have.
        ValueError, sqlite3.Error: a row that is not one of its table's.
    """
    grouped: dict[str, list[list[object]]] = defaultdict(list)
    for tbl, data in rows:
        grouped[tbl].append(json.loads(data))
    for tbl, values in grouped.items():
        table = TABLES_BY_NAME.get(tbl)
        if table is None:
            raise StorageError(f"{label}: stored rows of unknown table {tbl!r}")
        width = len(table.columns)
        # A row stored by an older object schema lacks the columns added since (at the
        # end, each NULL by default).
        conn.executemany(table.insert, [row + [None] * (width - len(row)) for row in values])


class PgObject:
    """One active object's state under the PostgreSQL engine (an ``ObjectState``)."""

    __slots__ = (
        "_admit", "_captured", "_clear_crashes", "_closed", "_lock", "_on_alarm_cb",
        "_on_close", "_pending_alarm", "_ship", "_to_ship", "_tokens", "_unsure",
        "alarm", "conn", "epoch", "key", "label", "version",
    )
    ships = True

    def __init__(
        self, key: Key, epoch: int, conn: WorkingCopy,
        alarm: tuple[float, int] | None, tokens: list[tuple[str, float]], *,
        ship: Callable[[Change], Awaitable[str]],
        on_close: Callable[[PgObject], None],
        on_alarm: Callable[[PgObject, float | None, int], None],
        to_ship: Callable[[], None], admit: Callable[[], None] = lambda: None,
        version: int = 0,
    ) -> None:
        self.key = key
        self._to_ship = to_ship  # wakes the ship loop (rows wake it through the copy)
        # The stored state's version this copy matches once its commits so far shipped.
        self.version = version
        self._unsure = 0  # ships since the last known one whose outcome is unknown
        self._admit = admit
        self.label = f"{key[0]}/{key[1]}"
        self.epoch = epoch
        self.conn: sqlite3.Connection = conn
        self.alarm = alarm
        self._tokens = tokens
        self._ship = ship
        self._on_close = on_close
        self._on_alarm_cb = on_alarm
        self._pending_alarm: tuple[float | None, int] | None = None
        self._clear_crashes = False
        self._closed = False
        self._lock = trio.Lock()
        self._captured = conn.captured

    dormant = False  # the working copy is the object's only copy here: never closed
    can_sleep = False
    closing = False

    async def sleep(self) -> bool:
        await trio.lowlevel.checkpoint()
        return False

    async def wake(self) -> None:
        await trio.lowlevel.checkpoint()

    def admit(self) -> None:
        """Before a call runs: is this host's lease known to hold (``ObjectState``)?"""
        self._admit()

    @property
    def changed(self) -> bool:
        """Whether something may wait to ship (a cheap check, no query)."""
        return not self._closed and (
            bool(self._captured.keys)
            or self._pending_alarm is not None or self._clear_crashes
        )

    @property
    def settled(self) -> bool:
        """Nothing written since the last take, and no ship in flight (that the
        caller's commits may ride in): ``sync`` has nothing to do. No query."""
        return not self._lock.locked() and (self._closed or (
            not self._captured.keys
            and self._pending_alarm is None and not self._clear_crashes))

    def write_alarm(self, time: float | None, retry: int) -> None:
        self._pending_alarm = (time, retry)
        self._on_alarm_cb(self, time, retry)
        self._wake()

    def _wake(self) -> None:
        """Wake the ship loop: something but rows is to ship (rows wake it through
        the copy's capture)."""
        self._to_ship()

    def crash_tokens(self) -> list[tuple[str, float]]:
        return list(self._tokens)

    def clear_crash_tokens(self) -> None:
        if self._tokens:
            self._tokens = []
            self._clear_crashes = True
            self._wake()

    def _snapshot(self) -> Change:
        keys, upserts, deletes = take_captured(self.conn, self._captured)
        change = Change(
            namespace=self.key[0], object_id=self.key[1], epoch=self.epoch, keys=keys,
            upserts=upserts, deletes=deletes, alarm=self._pending_alarm,
            clear_crashes=self._clear_crashes,
        )
        self._pending_alarm = None
        self._clear_crashes = False
        return change

    def _restore(self, change: Change) -> None:
        """A ship failed in transport: what it carried ships with the next sync."""
        if self._closed:
            return
        self._captured.restore(change.keys)
        if self._pending_alarm is None:
            self._pending_alarm = change.alarm
        self._clear_crashes = self._clear_crashes or change.clear_crashes

    def _take(self) -> Change | None:
        """The committed changes not yet shipped (None: none, or a transaction is open,
        whose changes are not committed). Does not checkpoint."""
        if self._closed or self.conn.in_transaction:
            return None
        if not self._captured.keys and (
                self._pending_alarm is None and not self._clear_crashes):
            # Nothing written since the last take (a key put back by ``_restore``
            # counts): no query. A push syncs, then its call's output gate syncs again:
            # ~2 of every 3 syncs find nothing (issue 26).
            return None
        return self._snapshot()

    async def sync(self) -> None:
        """Ship every commit so far to PostgreSQL in one fenced transaction. Checkpoints.

        Raises:
            ObjectFencedError: another host took the object over, or PostgreSQL no longer
                holds the state this copy builds on (it lost its last commits); nothing
                was written.
            StorageError: PostgreSQL could not be reached (the changes ship next time).
        """
        if self.settled:
            # Nothing to wait for, no lock to take (13.0 -> 4.5 us; of a create's 3
            # syncs, 2 found nothing).
            await trio.lowlevel.checkpoint()
            return
        # What is committed now is taken before the lock: a job may open its group
        # while this task waits for the lock, and the caller's commit (the output
        # gate's, just before) would then wait for that group — after the caller was
        # told it was durable.
        change = self._take()
        # One ship at a time, in the order they were taken. A free lock is taken
        # without a schedule point of its own (every path below checkpoints: one
        # scheduler pass fewer per ship, of ~13 a create). A taken change goes back
        # if the wait for the lock is cancelled (it was lost: nothing shipped it).
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            try:
                await self._lock.acquire()
            except BaseException:
                if change is not None:
                    self._restore(change)
                raise
        try:
            await self._ship_taken(change)
        finally:
            self._lock.release()

    async def _ship_taken(self, change: Change | None) -> None:
        """``sync`` under the lock: ship ``change`` (or what is committed now).
        Checkpoints."""
        if self._closed:
            if change is not None:
                self._restore(change)
            await trio.lowlevel.checkpoint()
            return
        if change is None:
            change = self._take()
        if change is None:
            # Nothing, or a transaction is open (the alarm run's group, a user block):
            # only what is committed ships, with the next sync after that commit.
            await trio.lowlevel.checkpoint()
            return
        change.version, change.unsure = self.version, self._unsure
        try:
            shipped = await self._ship(change)
        except BaseException:
            # Not known to have shipped (out of reach, or the caller cancelled the
            # statement): it ships again with the next sync, which accepts the base
            # it may have made. (Refusing that base as STALE reloaded the object and
            # failed the next caller's writes with ObjectFencedError "lost its last
            # commits" after a mere cancelled call.)
            self._restore(change)
            self._unsure += 1
            raise
        if shipped == SHIPPED:
            self.version, self._unsure = change.shipped_version, 0
            return
        if shipped == STALE:
            raise ObjectFencedError(
                f"{self.label}: PostgreSQL no longer holds the state this host's"
                f" writes build on (version {self.version}: it lost its last commits,"
                " as a server crash does under durability='normal'); this host's"
                " writes were refused and the object reloads from what PostgreSQL"
                " holds", reason=STALE_REASON,
            )
        raise ObjectFencedError(
            f"{self.label}: another host took the object over (lease epoch"
            f" {self.epoch} is gone); this host's writes were refused"
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = self.conn
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()
        self._on_close(self)
