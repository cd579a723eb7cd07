"""One object's storage: its SQLite database, a key-value table and its one alarm."""

from __future__ import annotations

import functools
import re
import sqlite3
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import sqlite_utils

from nursery_jobs._clock import coerce_time
from nursery_jobs._codec import decode_payload, encode_payload
from nursery_jobs._errors import AlarmOwnedError, StorageError, StorageKeyError, TurnError
from nursery_jobs._names import MAX_NAME_LENGTH, check_name

if TYPE_CHECKING:
    import datetime

    from nursery_jobs._core._alarm import ObjectAlarm
    from nursery_jobs._core._transactions import ObjectTransactions

T = TypeVar("T")

# storage.put (named: the benchmark's floor runs the same text).
KV_PUT: Final = (
    "INSERT INTO nj_kv (key, value) VALUES (?, ?) ON CONFLICT DO UPDATE SET value = excluded.value"
)
# Statements that give the connection state of its own, which a dormant object's
# reopened database would not have (after any leading blanks and comments).
_PER_CONNECTION = re.compile(
    r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*(?:PRAGMA|ATTACH|DETACH|CREATE\s+TEMP)",
    re.IGNORECASE | re.DOTALL,
)
# State of the connection that can be seen in it, however it was made: TEMP tables,
# views, triggers (``temp.name`` too) and attached databases.
_CONNECTION_STATE: Final = (
    "SELECT EXISTS (SELECT 1 FROM temp.sqlite_master)"
    " OR EXISTS (SELECT 1 FROM pragma_database_list WHERE name NOT IN ('main', 'temp'))"
)


class Storage:
    """``ctx.storage``: the object's own database. Every call is synchronous.

    SQLite runs inline on the Trio thread, so storage calls never interleave with
    other tasks; the statement is cheaper than a thread hop. Every call needs the
    object's turn (``TurnError`` otherwise: nothing is read or written) — every raw
    SQL statement too, whichever handle runs it (``run_sql``).
    """

    __slots__ = ("_alarm", "_conn", "_cursors", "_db", "_handle", "_tx", "pinned")

    def __init__(
        self, conn: sqlite3.Connection, alarm: ObjectAlarm, transactions: ObjectTransactions
    ) -> None:
        self._conn = conn
        self._db: sqlite_utils.Database | None = None
        self._alarm = alarm
        self._tx = transactions
        # Whether the connection was handed out (``conn``, ``db``) or given state of its
        # own (a PRAGMA, ATTACH, a TEMP table): the object then keeps its database open
        # while it is resident, since a dormant object's database is reopened afresh.
        self.pinned = False
        # Cursors ``execute`` handed out that are still alive (see ``keeps_connection``);
        # made by the first ``execute`` (a WeakSet is 7 objects, most objects never need
        # one).
        self._cursors: weakref.WeakSet[sqlite3.Cursor] | None = None
        self._handle: ObjectConnection | None = None  # (``conn``: made when first taken)

    def release(self, stand_in: sqlite3.Connection) -> None:
        """The object left memory: hold ``stand_in`` in place of its connection."""
        self._conn = stand_in
        self._db = None

    # -- SQL --------------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        """The object's ``sqlite3`` connection (it then stays open while the object is
        resident: it never goes dormant). Every use of it needs the object's turn as
        it is made (``ObjectConnection``), as ``execute`` does. Taking it needs a turn."""
        self._tx.check_read()
        self.pinned = True
        return cast("sqlite3.Connection", self._object_connection())

    def _object_connection(self) -> ObjectConnection:
        """The one ``ObjectConnection`` of this storage (made when first needed)."""
        if self._handle is None:
            self._handle = ObjectConnection(self)
        return self._handle

    @property
    def db(self) -> sqlite_utils.Database:
        """The object's database through sqlite-utils (file and memory engines), on
        ``conn``: each statement needs the object's turn as it runs. The object then
        keeps it open while resident (it never goes dormant), so what you set on it
        (functions, pragmas) lasts the activation. Taking it needs a turn."""
        _refuse_raw_sql(self._conn, "storage.db")  # hook(pg)
        conn = self.conn
        if self._db is None:
            self._db = sqlite_utils.Database(conn, execute_plugins=False)
        return self._db

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """Run one SQL statement on the object's database (committed unless inside
        :meth:`transaction`, or a job: a job's writes commit with its outcome). A
        statement that sets state of the connection itself (PRAGMA, ATTACH, a TEMP
        table) keeps the database open while the object is resident. In a read-only
        turn a statement that writes raises ``TurnError`` (``run_sql``)."""
        _refuse_raw_sql(self._conn, "storage.execute()")
        cursor = self.run_sql(lambda conn: conn.execute(sql, params))
        if not self.pinned and _PER_CONNECTION.match(sql):
            self.pinned = True
        if self._cursors is None:
            self._cursors = weakref.WeakSet()
        self._cursors.add(cursor)
        return cast("sqlite3.Cursor", ObjectCursor(self._object_connection(), cursor))

    def run_sql(self, run: Callable[[sqlite3.Connection], T]) -> T:
        """``run(connection)`` for one raw SQL statement of the object's code, in the
        current task's turn (``TurnError``: it holds none, and nothing ran). In a
        writing turn it runs as any write does (``check_write``: a job's savepoint
        opens); in a read-only turn it runs with ``PRAGMA query_only`` on, so that it
        reads and a write raises ``TurnError``. (The runtime's own statements use the
        raw connection: its hot path asks nothing.) Does not checkpoint."""
        conn = self._conn
        if self._tx.check_sql():
            return run(conn)
        conn.execute("PRAGMA query_only = ON")
        try:
            return run(conn)
        except sqlite3.DatabaseError as exc:
            if not _query_only_refused(exc):
                raise
            label = self._tx.label
            raise TurnError(
                f"{label}: a write in raw SQL inside a read-only turn; nothing was"
                " written. Drop @nj.read_only from the method, or write elsewhere",
                object_label=label,
            ) from exc
        finally:
            conn.execute("PRAGMA query_only = OFF")

    def keeps_connection(self) -> bool:
        """Whether the connection must stay open while the object is resident: it was
        handed out or given state of its own (``pinned``; TEMP objects and attached
        databases are also looked for), or a cursor of ``execute`` is still alive (its
        statement would hold the file's lock past a close). Does not checkpoint."""
        if self.pinned or self._cursors:
            return True
        return bool(self._conn.execute(_CONNECTION_STATE).fetchone()[0])

    @contextmanager
    def transaction(self) -> Iterator[Storage]:
        """Commit every write inside the block together, or none if it raises.

        Nested blocks (and blocks inside a job) are savepoints. While the block is open
        only its task may write: a write from another task (one that ran while the
        block awaited) raises ``StorageError``; ``jobs.push`` and friends wait for the
        block to end instead.
        """
        with self._tx.user_block():
            yield self

    # -- key-value --------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        """Return the value stored under ``key``, or ``default``."""
        self._tx.check_read()
        row = self._conn.execute("SELECT value FROM nj_kv WHERE key = ?", (_key(key),)).fetchone()
        return default if row is None else decode_payload(row[0])

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (through the payload codec) under ``key``."""
        text = encode_payload(value)
        self._tx.check_write()
        self._conn.execute(KV_PUT, (_key(key), text))

    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""
        self._tx.check_write()
        return self._conn.execute("DELETE FROM nj_kv WHERE key = ?", (_key(key),)).rowcount > 0

    def list(self, prefix: str = "") -> dict[str, Any]:
        """Return every key starting with ``prefix`` and its value, in key order."""
        self._tx.check_read()
        prefix = _key(prefix, allow_empty=True)  # (before len(): a typed error for any)
        rows = self._conn.execute(
            "SELECT key, value FROM nj_kv WHERE key >= ? AND substr(key, 1, ?) = ? ORDER BY key",
            (prefix, len(prefix), prefix),
        )
        return {key: decode_payload(value) for key, value in rows}

    # -- the alarm --------------------------------------------------------------
    def get_alarm(self) -> float | None:
        """Return the time of the object's alarm, or None."""
        self._tx.check_read()
        return self._alarm.get()

    def set_alarm(self, time: float | datetime.datetime) -> None:
        """Set (replace) the object's one alarm; durable when it returns."""
        self._tx.check_write()
        if self._alarm.owner is not None:
            raise self._owned("push a job instead of calling storage.set_alarm()")
        self._alarm.set(coerce_time(time))

    def delete_alarm(self) -> None:
        """Cancel the object's alarm."""
        self._tx.check_write()
        if self._alarm.owner is not None:
            raise self._owned("cancel its jobs instead of calling storage.delete_alarm()")
        self._alarm.delete()

    def _owned(self, instead: str) -> AlarmOwnedError:
        alarm = self._alarm
        return AlarmOwnedError(
            f"the {alarm.owner} owns the alarm of {alarm.namespace}/{alarm.object_id};"
            f" {instead}", namespace=alarm.namespace, object_id=alarm.object_id,
            owner=alarm.owner)


class ObjectConnection:
    """``storage.conn`` (and under ``storage.db``): the one way from the object's code to
    its ``sqlite3`` connection, and every way through it asks for the turn. A call of a
    method of the connection (``execute``, ``executemany``, ``executescript``,
    ``cursor``, ``commit``, ``rollback``, ``with conn:``, ``iterdump``, ``backup``,
    ``create_function``, ``blobopen``, any other) runs as a raw SQL statement does
    (``Storage.run_sql``); an attribute is read in a turn (``in_transaction``) and set as
    a statement runs (``row_factory``: setting ``isolation_level`` commits). What a call
    hands out that reaches the connection later (a cursor, a blob, ``iterdump``'s lines)
    asks for the turn as it is used (``_bound``). So a handle kept from ``__init__`` and
    used by a task without a turn raises ``TurnError`` and touches nothing, and one kept
    past the object's life raises ``StorageError``."""

    __slots__ = ("_storage",)

    def __init__(self, storage: Storage) -> None:
        object.__setattr__(self, "_storage", storage)

    def execute(self, sql: str, parameters: Any = (), /) -> ObjectCursor:
        return ObjectCursor(self, self._storage.run_sql(lambda c: c.execute(sql, parameters)))

    def executemany(self, sql: str, parameters: Any, /) -> ObjectCursor:
        return ObjectCursor(self, self._storage.run_sql(lambda c: c.executemany(sql, parameters)))

    def executescript(self, script: str, /) -> ObjectCursor:
        return ObjectCursor(self, self._storage.run_sql(lambda c: c.executescript(script)))

    def cursor(self, *args: Any) -> ObjectCursor:
        return ObjectCursor(self, self._storage.run_sql(lambda c: c.cursor(*args)))

    def commit(self) -> None:
        self._storage.run_sql(lambda c: c.commit())

    def rollback(self) -> None:
        self._storage.run_sql(lambda c: c.rollback())

    def __enter__(self) -> ObjectConnection:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._storage.run_sql(lambda c: c.__exit__(*exc)))

    def __getattr__(self, name: str) -> Any:
        storage = self._storage
        storage._tx.check_read()
        conn = storage._conn
        member = getattr(type(conn), name, None)
        if callable(member) and not isinstance(member, type):  # (conn.Error is a class)
            # A method: asked for the turn as it is called, not as it is looked up (a
            # bound method kept would reach the connection with no turn).
            return functools.partial(self._call, name)
        return getattr(conn, name)

    def _call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """The connection's method ``name``, run as a raw SQL statement is."""
        return _bound(self, self._storage.run_sql(lambda c: getattr(c, name)(*args, **kwargs)))

    def __setattr__(self, name: str, value: Any) -> None:
        self._storage.run_sql(lambda c: setattr(c, name, value))

    def __repr__(self) -> str:
        return f"<ObjectConnection of {self._storage._tx.label}>"


def _bound(connection: ObjectConnection, value: Any) -> Any:
    """``value``, returned by a method of the connection, as the object's code gets it:
    what reaches the connection as it is used later asks for the turn then."""
    if isinstance(value, sqlite3.Cursor):
        return ObjectCursor(connection, value)
    if isinstance(value, sqlite3.Blob):
        return ObjectBlob(connection._storage, value)
    if isinstance(value, Iterator):  # (iterdump's lines: each step runs a statement)
        return ObjectRows(connection._storage, value)
    return value


class ObjectCursor:
    """A cursor of ``ObjectConnection``: its statements ask for the turn as they run, and
    fetching its rows is a read, in a turn (SQLite steps a statement as its rows are
    fetched: rows fetched after the turn ended would be read in none)."""

    __slots__ = ("_cursor", "connection")
    _cursor: sqlite3.Cursor
    connection: ObjectConnection

    def __init__(self, connection: ObjectConnection, cursor: sqlite3.Cursor) -> None:
        object.__setattr__(self, "connection", connection)
        object.__setattr__(self, "_cursor", cursor)

    def execute(self, sql: str, parameters: Any = (), /) -> ObjectCursor:
        run = self.connection._storage.run_sql
        run(lambda _: self._cursor.execute(sql, parameters))
        return self

    def executemany(self, sql: str, parameters: Any, /) -> ObjectCursor:
        self.connection._storage.run_sql(lambda _: self._cursor.executemany(sql, parameters))
        return self

    def executescript(self, script: str, /) -> ObjectCursor:
        self.connection._storage.run_sql(lambda _: self._cursor.executescript(script))
        return self

    def _in_turn(self) -> sqlite3.Cursor:
        self.connection._storage._tx.check_read()
        return self._cursor

    def fetchone(self) -> Any:
        return self._in_turn().fetchone()

    def fetchmany(self, *size: int) -> list[Any]:
        return self._in_turn().fetchmany(*size)

    def fetchall(self) -> list[Any]:
        return self._in_turn().fetchall()

    def __iter__(self) -> ObjectCursor:
        return self

    def __next__(self) -> Any:
        return next(self._in_turn())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._in_turn(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._in_turn(), name, value)


class ObjectBlob:
    """A blob of ``ObjectConnection.blobopen``: reading it needs a turn of the object,
    writing it a writing turn (``TurnError`` otherwise: nothing is read or written).
    (``PRAGMA query_only`` stops a blob from opening for writing in a read-only turn,
    not one opened before.)"""

    __slots__ = ("_blob", "_storage")

    def __init__(self, storage: Storage, blob: sqlite3.Blob) -> None:
        self._storage = storage
        self._blob = blob

    def _reading(self) -> sqlite3.Blob:
        self._storage._tx.check_read()
        return self._blob

    def _writing(self) -> sqlite3.Blob:
        self._storage._tx.check_write()
        return self._blob

    def read(self, *length: int) -> bytes:
        return self._reading().read(*length)

    def write(self, data: bytes, /) -> None:
        self._writing().write(data)

    def seek(self, offset: int, origin: int = 0, /) -> None:
        self._reading().seek(offset, origin)

    def tell(self) -> int:
        return self._reading().tell()

    def close(self) -> None:
        self._reading().close()

    def __len__(self) -> int:
        return len(self._reading())

    def __getitem__(self, key: Any) -> Any:
        return self._reading()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._writing()[key] = value

    def __enter__(self) -> ObjectBlob:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ObjectRows:
    """An iterator a method of the connection handed out (``iterdump``'s lines): each
    step reads the database, in a turn of the object."""

    __slots__ = ("_rows", "_storage")

    def __init__(self, storage: Storage, rows: Iterator[Any]) -> None:
        self._storage = storage
        self._rows = rows

    def __iter__(self) -> ObjectRows:
        return self

    def __next__(self) -> Any:
        self._storage._tx.check_read()
        return next(self._rows)


def _query_only_refused(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` (or the error it was typed from: a file engine's connection types
    a read-only database as ``StorageFaultError``) is SQLite refusing a write. With
    ``PRAGMA query_only`` on, a write stops there, before it reaches the file: it is
    the read-only turn's refusal, never the file's."""
    for error in (exc, exc.__cause__):
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_READONLY:
            return True
    return False


def _refuse_raw_sql(conn: sqlite3.Connection, what: str) -> None:  # hook(pg)
    engine = getattr(conn, "refuses_raw_sql", None)
    if engine is not None:
        raise StorageError(
            f"{what}: raw SQL on the object's own tables belongs to the file engine; under"
            f" {engine} use the storage KV, jobs and capabilities"
        )


def _key(key: object, *, allow_empty: bool = False) -> str:
    """``key`` if it can be a storage key (a ``list`` prefix: or ``""``), else
    ``StorageKeyError``, before the statement runs. Bounded as an id is
    (``MAX_NAME_LENGTH``): a prefix longer than any key is refused too."""
    if (key.__class__ is str and key and key.isascii() and "\x00" not in key
            and len(key) <= MAX_NAME_LENGTH):
        return key  # (the usual key: no call, on every storage call)
    # (PostgreSQL text holds no NUL: a working copy holding one would never ship again.)
    return check_name(key, "storage key", StorageKeyError, max_length=MAX_NAME_LENGTH,
                      allow_empty=allow_empty)
