"""The operator writes outside a runtime: requeue a dead letter, pause or resume an
object's jobs; in a stopped data directory (under the data directory's lock) or in a
PostgreSQL database (in one fenced transaction, on an object no live host holds). No
runtime starts and no alarm runs; both engines build the job row with the same code,
from the dead letter's record."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from nursery_jobs._codec import decode_payload
from nursery_jobs._engines._faults import fault_cause
from nursery_jobs._errors import (
    NurseryJobsError,
    ObjectHeldError,
    ObjectInUseError,
    RuntimeLockedError,
    StorageError,
    UnknownObjectError,
)
from nursery_jobs._jobs._records import ownership_error
from nursery_jobs._jobs._table import PAUSED_ALL, PAUSED_PREFIX
from nursery_jobs._ops._queries import _tables
from nursery_jobs._ops._readonly import check_files_directory, refuse_if_running

if TYPE_CHECKING:
    from nursery_jobs._engines.postgres._ops import Edit


# -- the one offline write ----------------------------------------------------------------
@attrs.frozen(kw_only=True)
class Requeued:
    namespace: str
    object_id: str
    owner: str
    id: str
    time: float


@attrs.frozen(kw_only=True)
class NoDeadLetter:
    """There is no dead letter ``owner``/``id`` in the object; ``others`` are the
    owners whose dead letter has that id (the guess an error message should offer)."""

    namespace: str
    object_id: str
    owner: str
    id: str
    others: tuple[str, ...]


@contextlib.contextmanager
def _runtime_lock(data: Path) -> Iterator[None]:
    """Hold ``runtime.lock`` as a runtime would: no runtime can open ``data`` meanwhile."""
    fd = os.open(data / "runtime.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            refuse_if_running(data)  # says so with the dashboard hint
            raise RuntimeLockedError(f"{data} is in use by a running runtime") from None
        yield
    finally:
        os.close(fd)


def _writable(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=0, isolation_level=None)
    try:
        # As the runtime holds object databases: no -shm file, and the -wal is
        # checkpointed and removed when the connection closes.
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("PRAGMA synchronous=FULL")
    except BaseException:
        conn.close()
        raise
    return conn


def requeue_offline(
    data: str | os.PathLike[str], namespace: str, object_id: str, job_id: str, *,
    owner: str, now: float,
) -> Requeued | NoDeadLetter:
    """Move dead letter ``owner``/``job_id`` of an object in a stopped data directory
    back into its queue, due at ``now`` with fresh attempts, and lower the object's
    alarm to ``now`` so the next runtime wakes it (``NoDeadLetter`` if there is no
    such dead letter). Runs no alarm and no user code; blocks (plain file I/O).

    Raises:
        RuntimeLockedError: a runtime holds the data directory.
        DataDirectoryError, UnknownObjectError: no such directory or object.
        JobOwnershipError: another owner's queued job holds the id.
    """
    data = Path(data)
    check_files_directory(data)
    with _runtime_lock(data):
        with _translated(f"the catalog of {data}"):
            catalog = _writable(data / "catalog.sqlite3")
        try:
            with _translated(f"the catalog of {data}"):
                row = catalog.execute(
                    "SELECT file FROM nj_objects WHERE namespace = ? AND object_id = ?",
                    (namespace, object_id),
                ).fetchone()
            if row is None:
                raise UnknownObjectError.absent(namespace, object_id, str(data))
            path = data / "objects" / str(row[0])
            if not path.exists():
                raise UnknownObjectError(
                    f"the database of {namespace}/{object_id} ({path.name}) is missing",
                    namespace=namespace, object_id=object_id)
            with _translated(f"the database of {namespace}/{object_id}"):
                db = _writable(path)
            try:
                with _translated(f"the database of {namespace}/{object_id}"):
                    return _requeue_in(db, catalog, namespace, object_id, job_id, owner, now)
            finally:
                db.close()
        finally:
            catalog.close()


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """SQLite's errors on a file, typed by the runtime's own classifier
    (``fault_cause``): in use by another process, or damaged or failing (in a
    transaction that rolls back: nothing is requeued)."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        cause = fault_cause(exc)
        if cause == "locked":
            raise ObjectInUseError(f"{what} is in use by another process") from None
        if cause is None:
            raise  # an error of the SQL itself: a bug, not the file
        state = "is damaged" if cause == "corrupt" else "cannot be read or written"
        raise StorageError(f"{what} {state} ({exc}); nothing was requeued") from exc


# Columns a requeued row starts afresh with (their defaults), and the ones set here.
_FRESH: Final = frozenset({"seq", "attempts", "running_since", "crash_strikes", "last_crash"})


def _requeue_in(
    db: sqlite3.Connection, catalog: sqlite3.Connection, namespace: str, object_id: str,
    job_id: str, owner: str, now: float,
) -> Requeued | NoDeadLetter:
    values = _job_row(db, namespace, object_id, job_id, owner, now)
    if isinstance(values, NoDeadLetter):
        return values
    # Lower the alarm before the row commits (an early wake is harmless; a lost one is
    # not).
    if _lowers_alarm(db, values):
        catalog.execute(
            "INSERT INTO nj_alarms (namespace, object_id, time, retry) VALUES (?, ?, ?, 0)"
            " ON CONFLICT DO UPDATE SET time = excluded.time, retry = 0"
            " WHERE excluded.time < time",
            (namespace, object_id, now),
        )
    _move_back(db, values, owner, job_id)
    return Requeued(namespace=namespace, object_id=object_id, owner=owner, id=job_id, time=now)


def _job_row(
    db: sqlite3.Connection, namespace: str, object_id: str, job_id: str, owner: str,
    now: float,
) -> dict[str, Any] | NoDeadLetter:
    """The ``nj_jobs`` row that puts dead letter ``owner``/``job_id`` back, due at
    ``now`` with fresh attempts (its other columns from the letter's record)."""
    if "nj_dead_letters" not in _tables(db):
        return NoDeadLetter(namespace=namespace, object_id=object_id, owner=owner, id=job_id,
                            others=())
    found = db.execute(
        "SELECT job FROM nj_dead_letters WHERE owner = ? AND id = ?", (owner, job_id)
    ).fetchone()
    if found is None:
        others = db.execute(
            "SELECT owner FROM nj_dead_letters WHERE id = ? AND owner <> ? ORDER BY owner",
            (job_id, owner),
        ).fetchall()
        return NoDeadLetter(namespace=namespace, object_id=object_id, owner=owner, id=job_id,
                            others=tuple(str(o) for (o,) in others))
    record = decode_payload(found[0])
    if not isinstance(record, dict):
        raise NurseryJobsError(f"dead letter {owner}/{job_id} of {namespace}/{object_id}"
                               " holds no job record")
    holder = db.execute("SELECT owner FROM nj_jobs WHERE id = ?", (job_id,)).fetchone()
    if holder is not None:
        raise ownership_error(owner, str(holder[0]), job_id)
    retry = record.get("retry") or {}
    values: dict[str, Any] = {}
    info = db.execute("PRAGMA table_info(nj_jobs)").fetchall()
    for _cid, column, _type, notnull, default, _pk in info:
        if column in _FRESH:
            continue
        if column == "time":
            values[column] = now
        elif column == "payload":
            values[column] = record.get("payload")  # still encoded: stored as is
        elif column in record:
            values[column] = record[column]
        elif column == "give_up_on":  # a list in the record, JSON (or NULL) in the row
            names = retry.get(column) or []
            values[column] = json.dumps(names) if names else None
        elif column in retry:
            values[column] = retry[column]
        elif notnull and default is None:
            raise NurseryJobsError(
                f"dead letter {owner}/{job_id} of {namespace}/{object_id}: its record has no"
                f" value for column {column!r}"
            )
    return values


def _lowers_alarm(db: sqlite3.Connection, values: dict[str, Any]) -> bool:
    """Whether the requeued row's time becomes the object's alarm: yes, unless an
    exclusive job alone decides when the object wakes."""
    if values.get("exclusive", False):
        return True
    return db.execute("SELECT 1 FROM nj_jobs WHERE exclusive = 1 LIMIT 1").fetchone() is None


def _move_back(db: sqlite3.Connection, values: dict[str, Any], owner: str, job_id: str) -> None:
    """Insert the job row and delete the dead letter, in one transaction."""
    columns = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(f"INSERT INTO nj_jobs ({columns}) VALUES ({marks})",
                   [int(v) if isinstance(v, bool) else v for v in values.values()])
        db.execute("DELETE FROM nj_dead_letters WHERE owner = ? AND id = ?", (owner, job_id))
        if "nj_attempts" in _tables(db):  # (older databases have none)
            # It starts afresh, as a runtime's requeue: its failed attempts go.
            db.execute("DELETE FROM nj_attempts WHERE owner = ? AND id = ?", (owner, job_id))
    except BaseException:
        if db.in_transaction:  # (a fault may have rolled it back already)
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


# -- on PostgreSQL ------------------------------------------------------------------------
def requeue_postgres(
    dsn: str, namespace: str, object_id: str, job_id: str, *, owner: str, now: float,
) -> Requeued | NoDeadLetter:
    """Move dead letter ``owner``/``job_id`` of an object in a PostgreSQL engine's
    database back into its queue, due at ``now`` with fresh attempts, its alarm lowered
    to ``now`` (hosts are notified: one claims it at once). Runs no alarm and no user
    code; blocks.

    Only on an object no live host holds: a host's working copy is the object's state
    while it holds the lease, and a write behind it would be lost or undone by its next
    ship. The edit is the engine's fenced one (``_ops.edit_unheld``): the row lock keeps
    hosts out meanwhile, and the epoch moves on, so a host whose lease lapsed finds its
    later writes refused.

    Raises:
        ObjectHeldError: a live host leases the object (nothing was written).
        UnknownObjectError: no such object. DataDirectoryError: not a nursery_jobs
            database.
        JobOwnershipError: another owner's queued job holds the id.
        StorageError: PostgreSQL could not be reached or written (nothing was written).
    """
    from nursery_jobs._engines.postgres import _ops as pg_ops
    from nursery_jobs._ops._inspect_pg import PgReader, address_label, connect_driver

    label = address_label(dsn)
    psycopg, conn = connect_driver(dsn, label)

    def edit(copy: sqlite3.Connection) -> Edit[Requeued | NoDeadLetter]:
        values = _job_row(copy, namespace, object_id, job_id, owner, now)
        if isinstance(values, NoDeadLetter):
            return pg_ops.Edit(values)
        lower = _lowers_alarm(copy, values)
        _move_back(copy, values, owner, job_id)
        return pg_ops.Edit(Requeued(namespace=namespace, object_id=object_id, owner=owner,
                                    id=job_id, time=now), alarm=now if lower else None)

    with conn:
        try:
            PgReader(conn, label=label, live=False).check_schema()
            done = pg_ops.edit_unheld(conn, namespace, object_id, edit)
        except psycopg.Error as exc:
            raise StorageError(f"cannot requeue in PostgreSQL {label}: {exc};"
                               " nothing was written") from exc
    if done is None:
        raise UnknownObjectError.absent(namespace, object_id, label)
    if isinstance(done, pg_ops.Held):
        raise ObjectHeldError(namespace, object_id, done.owner, done.seconds_left)
    return done.result


# -- pause and resume -----------------------------------------------------------------
@attrs.frozen(kw_only=True)
class PauseChanged:
    """What ``pause_offline`` / ``pause_postgres`` did: ``owner`` None is the whole
    object; ``changed`` False: it was already so."""

    namespace: str
    object_id: str
    owner: str | None
    paused: bool
    changed: bool


def _pause_in(db: sqlite3.Connection, owner: str | None, paused: bool) -> tuple[bool, bool]:
    """Write the pause row (``nj_meta``, as ``JobTable.set_paused`` does); return
    (changed, whether the object has jobs: a resume must wake it)."""
    key = PAUSED_ALL if owner is None else PAUSED_PREFIX + owner
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("CREATE TABLE IF NOT EXISTS nj_meta (key TEXT PRIMARY KEY, value)"
                   " WITHOUT ROWID")
        if paused:
            cursor = db.execute(
                "INSERT INTO nj_meta (key, value) VALUES (?, 1) ON CONFLICT DO NOTHING", (key,))
        elif owner is None:  # (as ``lifecycle.resume(None)``: every pause of the object)
            cursor = db.execute(
                "DELETE FROM nj_meta WHERE key = ? OR substr(key, 1, ?) = ?",
                (PAUSED_ALL, len(PAUSED_PREFIX), PAUSED_PREFIX))
        else:
            cursor = db.execute("DELETE FROM nj_meta WHERE key = ?", (key,))
        changed = cursor.rowcount > 0
        has_jobs = "nj_jobs" in _tables(db) and db.execute(
            "SELECT 1 FROM nj_jobs LIMIT 1").fetchone() is not None
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return changed, has_jobs


def pause_offline(
    data: str | os.PathLike[str], namespace: str, object_id: str, *, owner: str | None,
    paused: bool, now: float,
) -> PauseChanged:
    """Pause (``paused``) or resume the jobs of ``owner`` (None: the whole object; a
    resume of None lifts every pause, as ``lifecycle.resume(None)``) of an object in a
    stopped data directory. A resume lowers the object's alarm to ``now``
    (an early wake is harmless: the next runtime runs what is due and re-arms). Runs no
    alarm and no user code; blocks.

    Raises:
        RuntimeLockedError: a runtime holds the data directory.
        DataDirectoryError, UnknownObjectError: no such directory or object.
    """
    data = Path(data)
    check_files_directory(data)
    with _runtime_lock(data):
        with _translated(f"the catalog of {data}"):
            catalog = _writable(data / "catalog.sqlite3")
        try:
            with _translated(f"the catalog of {data}"):
                row = catalog.execute(
                    "SELECT file FROM nj_objects WHERE namespace = ? AND object_id = ?",
                    (namespace, object_id),
                ).fetchone()
            if row is None:
                raise UnknownObjectError.absent(namespace, object_id, str(data))
            path = data / "objects" / str(row[0])
            if not path.exists():
                raise UnknownObjectError(
                    f"the database of {namespace}/{object_id} ({path.name}) is missing",
                    namespace=namespace, object_id=object_id)
            with _translated(f"the database of {namespace}/{object_id}"):
                db = _writable(path)
            try:
                with _translated(f"the database of {namespace}/{object_id}"):
                    if not paused:  # lowered before the row commits, as requeue does
                        _lower_catalog_alarm(catalog, namespace, object_id, now)
                    changed, _ = _pause_in(db, owner, paused)
            finally:
                db.close()
        finally:
            catalog.close()
    return PauseChanged(namespace=namespace, object_id=object_id, owner=owner, paused=paused,
                        changed=changed)


def _lower_catalog_alarm(
    catalog: sqlite3.Connection, namespace: str, object_id: str, now: float
) -> None:
    catalog.execute(
        "INSERT INTO nj_alarms (namespace, object_id, time, retry) VALUES (?, ?, ?, 0)"
        " ON CONFLICT DO UPDATE SET time = excluded.time, retry = 0"
        " WHERE excluded.time < time",
        (namespace, object_id, now),
    )


def pause_postgres(
    dsn: str, namespace: str, object_id: str, *, owner: str | None, paused: bool, now: float,
) -> PauseChanged:
    """``pause_offline`` on a PostgreSQL engine's database: only on an object no live
    host holds (see ``requeue_postgres``); a resume lowers its alarm to ``now`` (hosts
    are notified). Blocks.

    Raises:
        ObjectHeldError: a live host leases the object (nothing was written).
        UnknownObjectError, DataDirectoryError, StorageError: as ``requeue_postgres``.
    """
    from nursery_jobs._engines.postgres import _ops as pg_ops
    from nursery_jobs._ops._inspect_pg import PgReader, address_label, connect_driver

    label = address_label(dsn)
    psycopg, conn = connect_driver(dsn, label)

    def edit(copy: sqlite3.Connection) -> Edit[PauseChanged]:
        changed, has_jobs = _pause_in(copy, owner, paused)
        return pg_ops.Edit(
            PauseChanged(namespace=namespace, object_id=object_id, owner=owner, paused=paused,
                         changed=changed),
            alarm=now if changed and not paused and has_jobs else None)

    with conn:
        try:
            PgReader(conn, label=label, live=False).check_schema()
            done = pg_ops.edit_unheld(conn, namespace, object_id, edit)
        except psycopg.Error as exc:
            raise StorageError(f"cannot change the pause of {namespace}/{object_id} in"
                               f" PostgreSQL {label}: {exc}; nothing was written") from exc
    if done is None:
        raise UnknownObjectError.absent(namespace, object_id, label)
    if isinstance(done, pg_ops.Held):
        raise ObjectHeldError(namespace, object_id, done.owner, done.seconds_left)
    return done.result
