"""The one offline write: requeue a dead letter in a stopped data directory (no runtime,
no alarm runs), under the data directory's lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import attrs

from nursery_jobs._codec import decode_payload
from nursery_jobs._engines._faults import fault_cause
from nursery_jobs._errors import (
    DataDirectoryError,
    NurseryJobsError,
    ObjectInUseError,
    RuntimeLockedError,
    StorageError,
    UnknownObjectError,
)
from nursery_jobs._jobs._records import ownership_error
from nursery_jobs._ops._inspect import _tables, refuse_if_running


# -- the one offline write ----------------------------------------------------------------
@attrs.frozen(kw_only=True)
class Requeued:
    namespace: str
    object_id: str
    owner: str
    id: str
    time: float


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
) -> Requeued | None:
    """Move dead letter ``owner``/``job_id`` of an object in a stopped data directory
    back into its queue, due at ``now`` with fresh attempts, and lower the object's
    alarm to ``now`` so the next runtime wakes it. Returns None if there is no such
    dead letter. Runs no alarm and no user code; blocks (plain file I/O).

    Raises:
        RuntimeLockedError: a runtime holds the data directory.
        DataDirectoryError, UnknownObjectError: no such directory or object.
        JobOwnershipError: another owner's queued job holds the id.
    """
    data = Path(data)
    if not (data / "catalog.sqlite3").is_file():
        raise DataDirectoryError(f"{data} is not a nursery_jobs data directory"
                                 " (no catalog.sqlite3)")
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
                raise UnknownObjectError(f"no object {namespace}/{object_id} in {data}")
            path = data / "objects" / str(row[0])
            if not path.exists():
                raise UnknownObjectError(
                    f"the database of {namespace}/{object_id} ({path.name}) is missing"
                )
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
) -> Requeued | None:
    if "nj_dead_letters" not in _tables(db):
        return None
    found = db.execute(
        "SELECT job FROM nj_dead_letters WHERE owner = ? AND id = ?", (owner, job_id)
    ).fetchone()
    if found is None:
        return None
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
        elif column in retry:
            values[column] = retry[column]
        elif notnull and default is None:
            raise NurseryJobsError(
                f"dead letter {owner}/{job_id} of {namespace}/{object_id}: its record has no"
                f" value for column {column!r}"
            )
    exclusive = bool(values.get("exclusive", False))
    # Lower the alarm before the row commits (an early wake is harmless; a lost one is
    # not), unless an exclusive job alone decides when the object wakes.
    other_exclusive = db.execute(
        "SELECT 1 FROM nj_jobs WHERE exclusive = 1 LIMIT 1"
    ).fetchone() is not None
    if exclusive or not other_exclusive:
        catalog.execute(
            "INSERT INTO nj_alarms (namespace, object_id, time, retry) VALUES (?, ?, ?, 0)"
            " ON CONFLICT DO UPDATE SET time = excluded.time, retry = 0"
            " WHERE excluded.time < time",
            (namespace, object_id, now),
        )
    columns = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(f"INSERT INTO nj_jobs ({columns}) VALUES ({marks})",
                   [int(v) if isinstance(v, bool) else v for v in values.values()])
        db.execute("DELETE FROM nj_dead_letters WHERE owner = ? AND id = ?", (owner, job_id))
    except BaseException:
        if db.in_transaction:  # (a fault may have rolled it back already)
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return Requeued(namespace=namespace, object_id=object_id, owner=owner, id=job_id, time=now)


