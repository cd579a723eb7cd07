"""The SQL the SQLite sources run, on a connection they opened: the catalog's rows, and
one object's jobs, dead letters, failed attempts and counts, as the records of
``_inspect`` (a table or column an older database lacks is read as absent).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Final

from nursery_jobs._codec import decode_payload
from nursery_jobs._errors import NurseryJobsError, safe_repr
from nursery_jobs._jobs._table import JobTable
from nursery_jobs._ops._inspect import (
    AttemptInfo,
    DeadLetterInfo,
    JobInfo,
    ObjectCounts,
    ObjectRow,
    ObjectSummary,
    State,
)

STRIKES_KEY: Final = "memory_limit_strikes"  # the breaker's row in nj_meta


# -- reading one object's tables --------------------------------------------------------
_ROW_SQL = (
    "SELECT o.namespace, o.object_id, o.file, o.class_path, o.created_at, a.time, a.retry"
    " FROM nj_objects o LEFT JOIN nj_alarms a USING (namespace, object_id)"
)


def _filters(
    namespace: str | None, search: str | None, only: str, now: float
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if namespace:
        clauses.append("o.namespace = ?")
        params.append(namespace)
    if search:
        clauses.append("instr(o.object_id, ?) > 0")
        params.append(search)
    if only == "due":
        clauses.append("a.time <= ?")
        params.append(now)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _object_row(row: tuple[Any, ...], active: bool) -> ObjectRow:
    namespace, object_id, file, class_path, created_at, alarm, retry = row
    return ObjectRow(
        namespace=namespace, id=object_id, file=file, class_path=class_path,
        created_at=float(created_at), alarm=None if alarm is None else float(alarm),
        alarm_retry=int(retry or 0), active=active,
    )


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")]


def _count(conn: sqlite3.Connection, row: ObjectRow, state: State, now: float,
           running_id: str | None) -> ObjectSummary:
    tables = _tables(conn)
    if "nj_jobs" not in tables:
        return ObjectSummary(row=row, state=state)
    _check_times(conn)
    jobs, due, running, attempts = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(time <= ?), 0),"
        " COALESCE(SUM(running_since IS NOT NULL OR id IS ?), 0), COALESCE(MAX(attempts), 0)"
        " FROM nj_jobs", (now, running_id),
    ).fetchone()
    letters = 0
    if "nj_dead_letters" in tables:
        letters = conn.execute("SELECT COUNT(*) FROM nj_dead_letters").fetchone()[0]
    strikes = 0
    paused: tuple[str | None, ...] = ()
    if "nj_meta" in tables:
        found = conn.execute("SELECT value FROM nj_meta WHERE key = ?", (STRIKES_KEY,)).fetchone()
        strikes = 0 if found is None else int(found[0])
        # (JobTable.paused: the same rows, read without a Lifecycle)
        paused = paused_owners(conn)
    return ObjectSummary(
        row=row, state=state, lifecycle=True, jobs=int(jobs), due=int(due),
        running=int(running), max_attempts=int(attempts), dead_letters=int(letters),
        breaker_strikes=strikes, paused=paused,
    )


class DamagedRowError(sqlite3.DatabaseError):
    """A job row holds what nursery_jobs never writes (a time that is no number: SQLite
    keeps text in a REAL column). The readers show its object as damaged, naming the
    job, as they show a database that cannot be read; the other objects are read."""


# SQLite orders every number before any text or blob: ``time >= ''`` finds the rows
# whose time is no number on the time index (one probe).
_UNTIMED: Final = "SELECT id, time FROM nj_jobs WHERE time >= '' LIMIT 1"


def _check_times(conn: sqlite3.Connection) -> None:
    found = conn.execute(_UNTIMED).fetchone()
    if found is not None:
        raise DamagedRowError(
            f"job {found[0]!r}: its stored time {safe_repr(found[1], 60)} is no number (the"
            " file was changed outside nursery_jobs)")


def _payload(text: str | None) -> Any:
    try:
        return decode_payload(text)
    except NurseryJobsError:
        return "<undecodable payload>"


def _read_jobs(conn: sqlite3.Connection, limit: int | None, running_id: str | None,
               running_started: float | None = None) -> list[JobInfo]:
    """The jobs (up to ``limit``); ``running_id`` runs now, since ``running_started``
    (where its row has no marker of its own)."""
    if "nj_jobs" not in _tables(conn):
        return []
    _check_times(conn)
    has_priority = "priority" in _columns(conn, "nj_jobs")
    priority = "priority" if has_priority else "NULL"
    order = "priority DESC, time, seq" if has_priority else "time, seq"
    timeout = "timeout" if "timeout" in _columns(conn, "nj_jobs") else "NULL"
    cursor = conn.execute(
        f"SELECT id, owner, fn, time, {priority}, attempts, max_attempts, running_since,"
        f" crash_strikes, created_at, exclusive, singleflight, payload, {timeout} FROM nj_jobs"
        f" ORDER BY {order} LIMIT ?", (-1 if limit is None else limit,),
    )
    return [
        JobInfo(id=id, owner=owner, fn=fn, time=float(time),
                priority=None if prio is None else int(prio), attempts=int(attempts),
                max_attempts=int(max_attempts),
                running=running_since is not None or id == running_id,
                running_since=(running_started if running_since is None and id == running_id
                               else running_since), crash_strikes=int(strikes),
                created_at=float(created), exclusive=bool(exclusive),
                singleflight=bool(singleflight), payload=_payload(payload),
                timeout=None if timeout is None else float(timeout))
        for (id, owner, fn, time, prio, attempts, max_attempts, running_since, strikes,
             created, exclusive, singleflight, payload, timeout) in cursor
    ]


def _read_dead_letters(conn: sqlite3.Connection, limit: int | None) -> list[DeadLetterInfo]:
    if "nj_dead_letters" not in _tables(conn):
        return []
    letters = []
    for owner, id, job, error, attempts, reason, time in conn.execute(
        "SELECT owner, id, job, error, attempts, reason, time FROM nj_dead_letters"
        " ORDER BY time DESC LIMIT ?", (-1 if limit is None else limit,),
    ):
        record = _payload(job)
        fn, payload = "?", None
        if isinstance(record, dict):
            fn = str(record.get("fn", "?"))
            payload = _payload(record.get("payload"))
        letters.append(DeadLetterInfo(owner=owner, id=id, fn=fn, error=error,
                                      attempts=int(attempts), reason=reason,
                                      time=float(time), payload=payload))
    return letters


# -- across every object ------------------------------------------------------------------
def paused_owners(conn: sqlite3.Connection) -> tuple[str | None, ...]:
    """The paused owners of the object whose database is on ``conn`` (None: the whole
    object), from its ``nj_meta`` (``JobTable.paused``: the same rows, read without a
    Lifecycle); empty when nothing is paused."""
    return tuple(sorted(JobTable(conn).paused(), key=lambda o: (o is not None, o or "")))


def _object_counts(conn: sqlite3.Connection, now: float, running_id: str | None, *,
                   strikes: bool = False) -> ObjectCounts:
    """One object's counts. Each query is answered by an index (``nj_jobs_due``,
    ``nj_jobs_running``, the id key) or by the small tables (attempts, dead letters,
    meta): a scrape reads every active object's counts, and a scan of the jobs of 100
    objects with 3,000 due each took ~90 ms of the Trio thread (measured). Crash strikes
    have no index: counted (a scan) only with ``strikes``."""
    tables = _tables(conn)
    if "nj_jobs" not in tables:
        return ObjectCounts(crash_strikes=0 if strikes else None)
    _check_times(conn)
    (jobs,) = conn.execute("SELECT COUNT(*) FROM nj_jobs").fetchone()
    (due,) = conn.execute("SELECT COUNT(*) FROM nj_jobs WHERE time <= ?", (now,)).fetchone()
    (later,) = conn.execute("SELECT MIN(time) FROM nj_jobs WHERE time > ?", (now,)).fetchone()
    running = dict(conn.execute(
        "SELECT id, time FROM nj_jobs WHERE running_since IS NOT NULL").fetchall())
    if running_id is not None and running_id not in running:
        found = conn.execute("SELECT time FROM nj_jobs WHERE id = ?", (running_id,)).fetchone()
        if found is not None:
            running[running_id] = found[0]
    due -= sum(1 for t in running.values() if t <= now)  # (running, not waiting)
    failing, attempts = 0, 0
    if "nj_attempts" in tables:
        failing, attempts = conn.execute(
            "SELECT COUNT(*), COALESCE(MAX(n), 0) FROM (SELECT MAX(attempt) AS n"
            " FROM nj_attempts a WHERE EXISTS (SELECT 1 FROM nj_jobs j WHERE j.id = a.id"
            " AND j.owner = a.owner) GROUP BY owner, id)"
        ).fetchone()
    struck = None
    if strikes:
        (struck,) = conn.execute(
            "SELECT COUNT(*) FROM nj_jobs WHERE crash_strikes > 0").fetchone()
    letters = conn.execute("SELECT COUNT(*) FROM nj_dead_letters").fetchone()[0]
    breaker = 0
    if "nj_meta" in tables:
        found = conn.execute("SELECT value FROM nj_meta WHERE key = ?", (STRIKES_KEY,)).fetchone()
        breaker = 0 if found is None else int(found[0])
    return ObjectCounts(dead_letters=int(letters), due_jobs=int(due), running_jobs=len(running),
                        paused=paused_owners(conn) if "nj_meta" in tables else (),
                        next_due=None if later is None else float(later), jobs=int(jobs),
                        failing_jobs=int(failing), crash_strikes=struck,
                        max_attempts=int(attempts), breaker_strikes=breaker)


def _read_attempts(conn: sqlite3.Connection) -> dict[tuple[str, str], list[AttemptInfo]]:
    if "nj_attempts" not in _tables(conn):
        return {}
    found: dict[tuple[str, str], list[AttemptInfo]] = {}
    for owner, id, attempt, started, seconds, error in conn.execute(
        "SELECT owner, id, attempt, started, seconds, error FROM nj_attempts"
        " ORDER BY owner, id, attempt"
    ):
        found.setdefault((str(owner), str(id)), []).append(AttemptInfo(
            attempt=int(attempt), started=float(started), seconds=float(seconds),
            error=str(error)))
    return found
