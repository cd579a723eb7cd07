"""The operator writes on a stopped directory of the shared layout: requeue a dead
letter, pause or resume an object's jobs (``nursery-jobs requeue``, ``pause``,
``resume`` on ``shared:<directory>``).

Under the directory's ``runtime.lock`` (no runtime opens it meanwhile), in one
transaction of its shared database: the object's rows are loaded into a working copy,
edited by the same code as on the files layout and PostgreSQL (``_offline``), and the
rows the edit changed are written back together with the object's alarm, lowered where
a job became due: never a job behind a later alarm, even for a moment. No runtime
starts, no alarm runs, no user code.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nursery_jobs._engines.postgres._copy import load_copy, take_captured
from nursery_jobs._errors import StorageError, UnknownObjectError
from nursery_jobs._ops._inspect_shared import DATABASE
from nursery_jobs._ops._offline import (
    NoDeadLetter,
    PauseChanged,
    Requeued,
    _job_row,
    _lower_catalog_alarm,
    _lowers_alarm,
    _move_back,
    _pause_in,
    _runtime_lock,
    _translated,
    _writable,
)
from nursery_jobs._ops._readonly import check_shared_directory
from nursery_jobs._ops._stored_rows import UNLOADABLE

T = TypeVar("T")
# What an edit of the working copy gives back: its result, and the time to lower the
# object's alarm to (None: leave it).
Edited = tuple[T, float | None]


def requeue_shared(
    data: str | os.PathLike[str], namespace: str, object_id: str, job_id: str, *,
    owner: str, now: float,
) -> Requeued | NoDeadLetter:
    """Move dead letter ``owner``/``job_id`` of an object in a stopped directory of the
    shared layout back into its queue, due at ``now`` with fresh attempts, and lower
    the object's alarm to ``now`` in the same transaction (``NoDeadLetter`` if there is
    no such dead letter: nothing is written). Blocks (plain file I/O).

    Raises:
        RuntimeLockedError: a runtime holds the directory.
        DataDirectoryError, UnknownObjectError: no such directory or object.
        JobOwnershipError: another owner's queued job holds the id.
        StorageError: the database is damaged, or the object's stored rows cannot be
            loaded (nothing was written).
    """

    def requeue(copy: sqlite3.Connection) -> Edited[Requeued | NoDeadLetter]:
        values = _job_row(copy, namespace, object_id, job_id, owner, now)
        if isinstance(values, NoDeadLetter):
            return values, None
        lower = _lowers_alarm(copy, values)
        _move_back(copy, values, owner, job_id)
        return (Requeued(namespace=namespace, object_id=object_id, owner=owner, id=job_id,
                         time=now), now if lower else None)

    return _edit_stopped(Path(data), namespace, object_id, requeue)


def pause_shared(
    data: str | os.PathLike[str], namespace: str, object_id: str, *, owner: str | None,
    paused: bool, now: float,
) -> PauseChanged:
    """Pause (``paused``) or resume the jobs of ``owner`` (None: the whole object; a
    resume of None lifts every pause, as ``lifecycle.resume(None)``) of an object in a
    stopped directory of the shared layout. A resume that changed something lowers the
    object's alarm to ``now`` in the same transaction (an early wake is harmless: the
    next runtime runs what is due and re-arms). Blocks.

    Raises:
        RuntimeLockedError, DataDirectoryError, UnknownObjectError, StorageError: as
            ``requeue_shared``.
    """

    def pause(copy: sqlite3.Connection) -> Edited[PauseChanged]:
        changed, has_jobs = _pause_in(copy, owner, paused)
        return (PauseChanged(namespace=namespace, object_id=object_id, owner=owner,
                             paused=paused, changed=changed),
                now if changed and not paused and has_jobs else None)

    return _edit_stopped(Path(data), namespace, object_id, pause)


def _edit_stopped(data: Path, namespace: str, object_id: str,
                  edit: Callable[[sqlite3.Connection], Edited[T]]) -> T:
    """``edit`` of the object's working copy, written back with its alarm in one
    transaction of the shared database, under the directory's runtime lock."""
    check_shared_directory(data)
    with _runtime_lock(data):
        where = f"the shared database of shared:{data}"
        with _translated(where):
            db = _writable(data / DATABASE)
        try:
            with _translated(where):
                return _edit_in(db, f"shared:{data}", namespace, object_id, edit)
        finally:
            db.close()


def _edit_in(db: sqlite3.Connection, where: str, namespace: str, object_id: str,
             edit: Callable[[sqlite3.Connection], Edited[T]]) -> T:
    label = f"{namespace}/{object_id}"
    db.execute("BEGIN IMMEDIATE")
    try:
        found = db.execute("SELECT 1 FROM nj_objects WHERE namespace = ? AND object_id = ?",
                           (namespace, object_id)).fetchone()
        if found is None:
            raise UnknownObjectError.absent(namespace, object_id, where)
        rows = db.execute("SELECT tbl, data FROM nj_rows WHERE namespace = ? AND object_id = ?",
                          (namespace, object_id)).fetchall()
        try:
            copy = load_copy(label, rows, captured=_nothing)
        except UNLOADABLE as exc:
            raise StorageError(f"{label}: its stored rows in {where} cannot be loaded ({exc};"
                               " a row changed outside nursery_jobs?); nothing was written"
                               ) from exc
        try:
            result, alarm = edit(copy)
            _, upserts, deletes = take_captured(copy, copy.captured)
        finally:
            copy.close()
        if alarm is not None:
            _lower_catalog_alarm(db, namespace, object_id, alarm)
        if deletes:
            db.executemany(
                "DELETE FROM nj_rows WHERE namespace = ? AND object_id = ? AND tbl = ?"
                " AND key = ?", [(namespace, object_id, tbl, key) for tbl, key in deletes])
        if upserts:
            db.executemany(
                "INSERT OR REPLACE INTO nj_rows (namespace, object_id, tbl, key, data)"
                " VALUES (?, ?, ?, ?, ?)",
                [(namespace, object_id, tbl, key, data) for tbl, key, data in upserts])
    except BaseException:
        if db.in_transaction:  # (a fault may have rolled it back already)
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return result


def _nothing() -> None:
    """The copy's changes are taken here, in the edit's own transaction: no loop to
    wake."""
