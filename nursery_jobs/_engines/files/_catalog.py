"""The catalog database: the registry of objects and the alarm index the timer reads.

The catalog is an index: every fact in it but a plain object's alarm can be rebuilt
from the object files (``_rebuild``). A registry row's ``created`` flag says the
object's file was created (its first open succeeded): a file missing then is a fault,
never a reason to start the object empty.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sqlite3
from collections.abc import Iterable, Iterator
from urllib.request import pathname2url

import trio

from nursery_jobs._engines._faults import GuardedConnection, fault_cause, fault_error
from nursery_jobs._errors import ObjectIdError
from nursery_jobs._names import MAX_NAME_LENGTH, check_name

MAX_OBJECT_ID_LENGTH = MAX_NAME_LENGTH
# Alarms of ``Catalog.due`` remembered for ``get_alarm`` at most (past it, forgotten).
_SEEN_MAX = 8192

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nj_objects (
    namespace TEXT NOT NULL,
    object_id TEXT NOT NULL,
    file TEXT NOT NULL,
    class_path TEXT NOT NULL,
    created_at REAL NOT NULL,
    created INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, object_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nj_alarms (
    namespace TEXT NOT NULL,
    object_id TEXT NOT NULL,
    time REAL NOT NULL,
    retry INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, object_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nj_alarms_time ON nj_alarms (time);
CREATE TABLE IF NOT EXISTS nj_crashes (
    namespace TEXT NOT NULL,
    object_id TEXT NOT NULL,
    token TEXT NOT NULL,
    started REAL NOT NULL,
    PRIMARY KEY (namespace, object_id, token, started)
) WITHOUT ROWID;
"""


def check_object_id(object_id: object) -> str:
    """Return ``object_id`` if it is a valid object id, else raise ``ObjectIdError``
    (its ``object_id`` the id given)."""
    return check_name(object_id, "object id",
                      functools.partial(ObjectIdError, object_id=object_id),
                      max_length=MAX_OBJECT_ID_LENGTH)


def object_file_name(namespace: str, object_id: str) -> str:
    """Derive a database file name from an object's identity.

    The name is a hash, so no id can reach outside the data directory, and the
    length-prefixed input keeps distinct (namespace, id) pairs distinct.
    """
    key = f"{len(namespace)}:{namespace}:{object_id}".encode()
    return hashlib.sha256(key).hexdigest()[:40] + ".sqlite3"


def connect(
    path: str, *, synchronous: str, exclusive: bool = False, autocheckpoint: bool = True,
    label: str = "the catalog", busy_timeout: float = 0.0, cache_kib: int = 8192,
    factory: type[GuardedConnection] = GuardedConnection,
) -> GuardedConnection:
    """Open a SQLite connection in autocommit mode with WAL and the given sync level.

    ``exclusive`` holds the file's lock for the connection's life: no shared-memory
    index file (one file descriptor fewer per open object) and cheaper commits
    (measured: 26 µs instead of 35 µs). Object databases are the runtime's alone.

    ``busy_timeout`` is 0 by default: SQLite's busy wait sleeps inline, on the Trio
    thread (5 s per attempt with Python's default), so a file locked by another process
    fails at once (``StorageFaultError``, cause ``locked``) and is retried with backoff
    by whoever asked. A failed open closes what it opened: a half-open connection would
    keep the file locked in this process for as long as the error is referenced.
    ``factory`` is the connection class (a subclass injects faults in tests).

    Raises:
        StorageFaultError: the file cannot be opened (locked, damaged, disk full...).
    """
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                               timeout=busy_timeout, factory=factory)
    except sqlite3.Error as exc:  # typed as a statement's fault is (issue 22 #9)
        raise fault_error(exc, label=label, file=path, doing="opening it") from exc
    assert isinstance(conn, GuardedConnection)
    conn.name(label, path, quarantines=exclusive)
    try:
        conn.executescript(_pragmas(path, synchronous=synchronous, exclusive=exclusive,
                                    autocheckpoint=autocheckpoint, cache_kib=cache_kib))
    except BaseException:
        conn.close()
        raise
    return conn


def reopen(conn: GuardedConnection, *, synchronous: str, cache_kib: int) -> None:
    """Open a closed object database again *in place*, as ``connect(exclusive=True)``
    opened it: the same connection object, so whoever holds it (storage, the job table)
    keeps a valid reference. CPython lets ``Connection.__init__`` run again on a
    connection (a closed one is simply reopened); it clears the subclass's attributes,
    which are put back. Per-connection state is not: statements are prepared again.

    Raises:
        StorageFaultError: the file cannot be opened (locked, damaged, gone...); the
            connection stays closed.
    """
    kept = dict(vars(conn))
    try:
        # mode=rw: a file that went away is never replaced by an empty one.
        sqlite3.Connection.__init__(conn, f"file:{pathname2url(conn.file)}?mode=rw",
                                    uri=True, isolation_level=None,
                                    check_same_thread=False, timeout=0.0)
    except sqlite3.Error as exc:
        vars(conn).update(kept)
        raise fault_error(exc, label=conn.label, file=conn.file,
                          cause=None if os.path.exists(conn.file) else "missing",
                          doing="opening it again") from exc
    vars(conn).update(kept)
    try:
        conn.executescript(_pragmas(conn.file, synchronous=synchronous, exclusive=True,
                                    autocheckpoint=True, cache_kib=cache_kib))
    except BaseException:
        conn.close()
        raise


def _pragmas(
    path: str, *, synchronous: str, exclusive: bool, autocheckpoint: bool, cache_kib: int
) -> str:
    # One script: pragmas run once, so they stay out of the statement cache (each
    # cached statement is memory held for the connection's life).
    pragmas = []
    if exclusive:
        pragmas.append("PRAGMA locking_mode=EXCLUSIVE")
    # The sync level first: switching a new file to WAL under the default FULL costs
    # several fsyncs (measured: 13 ms per new object database on this disk).
    pragmas.append(f"PRAGMA synchronous={synchronous}")
    # A bound on the page cache (allocated only as a database grows).
    pragmas.append(f"PRAGMA cache_size=-{int(cache_kib)}")
    # With autocheckpoint: only every ~40 MB of WAL (a checkpoint is an fsync, inline
    # in a commit: with the default 4 MB the timer benchmark saw stalls, p99 lateness
    # 369 ms -> 1.5 ms). Without, the owner checkpoints from a worker thread instead
    # (measured: alarm lateness p99 409 ms with it, 1.6 ms without, 9,000 objects over
    # 10 s).
    pragmas.append(f"PRAGMA wal_autocheckpoint={10000 if autocheckpoint else 0}")
    if path != ":memory:":
        pragmas.append("PRAGMA journal_mode=WAL")
    return ";".join(pragmas)


class Catalog:
    """The objects registry and the alarm index, in ``catalog.sqlite3``.

    Every method runs one or two statements inline and commits (autocommit).
    """

    __slots__ = ("_class_paths", "_conn", "_crashed", "_seen", "migrated_created", "written")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        # Set by every method that writes: the engine's checkpoint loop sleeps on it
        # while the catalog is quiet (it looked every second, 176,000 passes over a
        # test's two virtual days; see ``FilesEngine.serve``).
        self.written = trio.Event()
        # What reads found, kept while no write of this catalog can have changed it
        # (every write is one of its methods: this runtime holds the data directory's
        # lock). Each was a statement of every activation of a cold fire:
        # - ``class_path`` per namespace (asked at every alarm delivery);
        # - the alarms the timer's ``due`` read, for the ``get_alarm`` of the objects it
        #   then opens (a write of an object's alarm forgets its entry);
        # - which objects ``nj_crashes`` may hold rows of (``crashes``, at every
        #   activation: almost always none, and only ``add_crashes`` adds any; a clear
        #   leaves the object counted, since the ship that clears may roll back).
        self._class_paths: dict[str, str] = {}
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}
        conn.executescript(_SCHEMA)
        self._crashed: set[tuple[str, str]] = {
            (str(ns), str(oid)) for ns, oid in conn.execute(
                "SELECT DISTINCT namespace, object_id FROM nj_crashes")}
        columns = {row[1] for row in conn.execute("PRAGMA table_info(nj_objects)")}
        # Catalogs written before the ``created`` flag: the engine sets it for the rows
        # whose file exists (``mark_created``).
        self.migrated_created = "created" not in columns
        if self.migrated_created:
            conn.execute(
                "ALTER TABLE nj_objects ADD COLUMN created INTEGER NOT NULL DEFAULT 0"
            )

    @property
    def conn(self) -> sqlite3.Connection:
        """The catalog's connection, for reading (the dashboard). Write through methods."""
        return self._conn

    def close(self) -> None:
        self._conn.close()

    def check(self) -> str | None:
        """What ``PRAGMA quick_check`` finds wrong with the catalog, or None.

        Damage it cannot step over (a b-tree page past the first one that is not a
        page) raises from the rows themselves, where no connection method sees it
        (issue 22 #6): that is damage too, not an error to raise.

        Raises:
            StorageFaultError: the catalog cannot be read for another reason (I/O...).
        """
        try:
            rows = [str(row[0]) for row in self._conn.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as exc:
            if fault_cause(exc) != "corrupt":
                raise fault_error(exc, label="the catalog", file=self._file(),
                                  doing="checking it") from exc
            return str(exc)
        return None if rows == ["ok"] else "; ".join(rows[:5])

    def _file(self) -> str:
        return str(getattr(self._conn, "file", "catalog.sqlite3"))

    def register(
        self, namespace: str, object_id: str, class_path: str, now: float
    ) -> tuple[str, bool]:
        """Record an object (once); return its database file name and whether that
        file was created (its first open succeeded)."""
        self.written.set()
        row = self._conn.execute(
            "SELECT file, class_path, created FROM nj_objects"
            " WHERE namespace = ? AND object_id = ?",
            (namespace, object_id),
        ).fetchone()
        self._registered(namespace, class_path)
        if row is None:
            file = object_file_name(namespace, object_id)
            self._conn.execute(
                "INSERT INTO nj_objects (namespace, object_id, file, class_path, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (namespace, object_id, file, class_path, now),
            )
            return file, False
        if row[1] != class_path:
            self._conn.execute(
                "UPDATE nj_objects SET class_path = ? WHERE namespace = ? AND object_id = ?",
                (class_path, namespace, object_id),
            )
        return str(row[0]), bool(row[2])

    def registered(self, namespace: str, object_id: str) -> tuple[str, bool] | None:
        """An object's database file name and whether that file was created, if it is
        recorded (``register`` without recording it). Writes nothing."""
        row = self._conn.execute(
            "SELECT file, created FROM nj_objects WHERE namespace = ? AND object_id = ?",
            (namespace, object_id),
        ).fetchone()
        return None if row is None else (str(row[0]), bool(row[1]))

    def _registered(self, namespace: str, class_path: str) -> None:
        """A row of ``namespace`` is written with ``class_path``: the remembered answer
        of ``class_path(namespace)`` stands only if it is that one (whichever row comes
        first then, its class path is the one remembered)."""
        if self._class_paths.get(namespace, class_path) != class_path:
            del self._class_paths[namespace]

    def mark_created(self, namespace: str, object_id: str) -> None:
        """The object's file exists now: from here on, its absence is a fault."""
        self.written.set()
        self._conn.execute(
            "UPDATE nj_objects SET created = 1 WHERE namespace = ? AND object_id = ?",
            (namespace, object_id),
        )

    def mark_files_created(self, files: Iterable[str]) -> None:
        """Set the ``created`` flag of the rows whose file is among ``files``."""
        self.written.set()
        self._conn.executemany(
            "UPDATE nj_objects SET created = 1 WHERE file = ?", [(file,) for file in files]
        )

    def files(self) -> set[str]:
        """The database file names of every registered object."""
        return {str(row[0]) for row in self._conn.execute("SELECT file FROM nj_objects")}

    def adopt(
        self, namespace: str, object_id: str, class_path: str, now: float,
        alarm: float | None,
    ) -> None:
        """Register an object found on disk (its file exists: ``created``), with the
        alarm its earliest job implies; an alarm already set is only ever lowered."""
        self.written.set()
        self._registered(namespace, class_path)
        self._seen.pop((namespace, object_id), None)
        self._conn.execute(
            "INSERT INTO nj_objects (namespace, object_id, file, class_path, created_at,"
            " created) VALUES (?, ?, ?, ?, ?, 1) ON CONFLICT DO UPDATE SET created = 1",
            (namespace, object_id, object_file_name(namespace, object_id), class_path, now),
        )
        if alarm is not None:
            self._conn.execute(
                "INSERT INTO nj_alarms (namespace, object_id, time, retry) VALUES (?, ?, ?, 0)"
                " ON CONFLICT DO UPDATE SET time = excluded.time WHERE excluded.time < time",
                (namespace, object_id, alarm),
            )

    def forget(self, namespace: str, object_id: str) -> None:
        """Remove an object's registry row and alarm."""
        self.written.set()
        self._class_paths.pop(namespace, None)  # (its row may have been the first)
        self._seen.pop((namespace, object_id), None)
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.execute(
                "DELETE FROM nj_objects WHERE namespace = ? AND object_id = ?",
                (namespace, object_id),
            )
            self._conn.execute(
                "DELETE FROM nj_alarms WHERE namespace = ? AND object_id = ?",
                (namespace, object_id),
            )

    def forget_file(self, file: str) -> None:
        """Remove the registry row and alarm of the object whose file is ``file``."""
        self.written.set()
        row = self._conn.execute(
            "SELECT namespace, object_id FROM nj_objects WHERE file = ?", (file,)
        ).fetchone()
        if row is not None:
            self.forget(str(row[0]), str(row[1]))

    def class_path(self, namespace: str) -> str | None:
        known = self._class_paths.get(namespace)
        if known is not None:
            return known
        row = self._conn.execute(
            "SELECT class_path FROM nj_objects WHERE namespace = ? LIMIT 1", (namespace,)
        ).fetchone()
        if row is None:
            return None
        self._class_paths[namespace] = found = str(row[0])
        return found

    def objects(self) -> Iterator[tuple[str, str, str]]:
        """Yield (namespace, object_id, file) for every registered object."""
        yield from self._conn.execute("SELECT namespace, object_id, file FROM nj_objects")

    def get_alarm(self, namespace: str, object_id: str) -> tuple[float, int] | None:
        """Return (time, retry count) of an object's alarm, or None."""
        seen = self._seen.get((namespace, object_id)) if self._seen else None
        if seen is not None:
            return seen
        row = self._conn.execute(
            "SELECT time, retry FROM nj_alarms WHERE namespace = ? AND object_id = ?",
            (namespace, object_id),
        ).fetchone()
        return None if row is None else (float(row[0]), int(row[1]))

    def set_alarm(self, namespace: str, object_id: str, time: float, retry: int = 0) -> None:
        self.written.set()
        if self._seen:
            self._seen.pop((namespace, object_id), None)
        self._conn.execute(
            "INSERT INTO nj_alarms (namespace, object_id, time, retry) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO UPDATE SET time = excluded.time, retry = excluded.retry",
            (namespace, object_id, time, retry),
        )

    def delete_alarm(self, namespace: str, object_id: str) -> None:
        self.written.set()
        if self._seen:
            self._seen.pop((namespace, object_id), None)
        self._conn.execute(
            "DELETE FROM nj_alarms WHERE namespace = ? AND object_id = ?",
            (namespace, object_id),
        )

    def due(self, now: float, limit: int) -> list[tuple[str, str, float, int]]:
        """Return up to ``limit`` alarms due at ``now``, earliest first (remembered for
        ``get_alarm``: the objects they name are opened next)."""
        rows: list[tuple[str, str, float, int]] = self._conn.execute(
            "SELECT namespace, object_id, time, retry FROM nj_alarms WHERE time <= ?"
            " ORDER BY time LIMIT ?",
            (now, limit),
        ).fetchall()
        seen = self._seen
        if len(seen) > _SEEN_MAX:
            seen.clear()  # (alarms read but never asked for: objects already active)
        for namespace, object_id, time, retry in rows:
            seen[(namespace, object_id)] = (float(time), int(retry))
        return rows

    def next_after(self, now: float) -> float | None:
        """Return the earliest alarm time later than ``now``, or None."""
        row = self._conn.execute(
            "SELECT MIN(time) FROM nj_alarms WHERE time > ?", (now,)
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def add_crashes(self, entries: list[tuple[str, str, str, float]], now: float) -> None:
        """Store the work a dead process was doing (from its flight record) until each
        object handles it, and wake those objects now. An empty token only says an
        alarm run was in flight: it wakes the object and is not stored."""
        self.written.set()
        self._seen.clear()
        self._crashed.update((ns, oid) for ns, oid, token, _ in entries if token)
        with self._conn:
            self._conn.execute("BEGIN")
            self._conn.executemany(
                "INSERT OR IGNORE INTO nj_crashes (namespace, object_id, token, started)"
                " VALUES (?, ?, ?, ?)",
                [entry for entry in entries if entry[2]],
            )
            self._conn.executemany(
                "UPDATE nj_alarms SET time = ? WHERE namespace = ? AND object_id = ? AND time > ?",
                [(now, ns, oid, now) for ns, oid, _, _ in entries],
            )

    def may_have_crashes(self, namespace: str, object_id: str) -> bool:
        """Whether ``nj_crashes`` may hold tokens of the object (no statement)."""
        return (namespace, object_id) in self._crashed

    def crashes(self, namespace: str, object_id: str) -> list[tuple[str, float]]:
        """(token, started) of the work this object was doing when a process died."""
        if (namespace, object_id) not in self._crashed:
            return []  # (none stored when the catalog opened, nor added since)
        return [
            (str(token), float(started)) for token, started in self._conn.execute(
                "SELECT token, started FROM nj_crashes WHERE namespace = ? AND object_id = ?",
                (namespace, object_id),
            )
        ]

    def clear_crashes(self, namespace: str, object_id: str) -> None:
        self.written.set()
        self._conn.execute(
            "DELETE FROM nj_crashes WHERE namespace = ? AND object_id = ?",
            (namespace, object_id),
        )

    @staticmethod
    def checkpoint(path: str) -> None:
        """Copy the catalog's WAL into the database (PASSIVE: never blocks the runtime's
        writer). Blocks; meant for a worker thread, on a connection of its own."""
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()

    def alarm_count(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM nj_alarms").fetchone()[0])
