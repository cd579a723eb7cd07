"""What an operator sees: read-only views of a data directory or a running runtime.

``DataSource`` is the one seam the CLI, the dashboard and the test helpers read through,
and ``SourceAccess`` says where a face may read it: ``Inline`` on the Trio thread (SQLite
files and memory: microseconds), or, for PostgreSQL (``_inspect_pg``), in a worker thread
inside one snapshot. ``OfflineSource`` reads a stopped data directory without creating a
file or taking a lock a runtime would wait on; ``RuntimeSource`` reads a running runtime,
and is the only code outside the core that touches the runtime's internals (keep it that
way: after a restructure of the core, this class is what changes). ``_offline`` holds the
one write, requeue, on either engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import struct
import tempfile
from collections.abc import Awaitable, Callable, Generator, Iterator
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeVar, cast, runtime_checkable

import attrs
import trio
import trio.testing

from nursery_jobs import _clock
from nursery_jobs._codec import decode_payload
from nursery_jobs._engines.files._rebuild import QUARANTINE
from nursery_jobs._errors import (
    DataDirectoryError,
    NurseryJobsError,
    ObjectInUseError,
    RuntimeLockedError,
    UnknownObjectError,
)
from nursery_jobs._jobs._table import JobTable

if TYPE_CHECKING:
    from nursery_jobs._core._runtime import Runtime

State = Literal["active", "evicted", "in use", "missing", "damaged", "quarantined"]
T = TypeVar("T")

STRIKES_KEY: Final = "memory_limit_strikes"  # the breaker's row in nj_meta


# -- records --------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class ObjectRow:
    """An object as the catalog knows it (no object database is opened for this)."""

    namespace: str
    id: str
    file: str
    class_path: str
    created_at: float
    alarm: float | None
    alarm_retry: int
    active: bool


@attrs.frozen(kw_only=True)
class ObjectPage:
    """One page of objects, in (namespace, id) order."""

    objects: list[ObjectRow]
    total: int
    offset: int
    limit: int


@attrs.frozen(kw_only=True)
class JobInfo:
    """A queued job. ``priority`` is None where the table has no priority column (a
    Queue item's time then still carries its priority: shown as stored)."""

    id: str
    owner: str
    fn: str
    time: float
    priority: int | None
    attempts: int
    max_attempts: int
    running: bool
    running_since: float | None
    crash_strikes: int
    created_at: float
    exclusive: bool
    singleflight: bool
    payload: Any
    timeout: float | None = None
    """Seconds a run may last (``push(timeout=)``); None: no limit, or a table from
    before the column."""


@attrs.frozen(kw_only=True)
class DeadLetterInfo:
    """A dead letter: the job that ended without success, and why."""

    owner: str
    id: str
    fn: str
    error: str
    attempts: int
    reason: str
    time: float
    payload: Any


@attrs.frozen(kw_only=True)
class AttemptInfo:
    """A failed attempt of a job (the last few are kept, for a job and a dead letter)."""

    attempt: int
    started: float
    seconds: float
    error: str


@attrs.frozen(kw_only=True)
class ObjectSummary:
    """Counts from one object's database (opened once, briefly)."""

    row: ObjectRow
    state: State
    problem: str | None = None
    lifecycle: bool = False
    jobs: int = 0
    due: int = 0
    running: int = 0
    max_attempts: int = 0
    dead_letters: int = 0
    breaker_strikes: int = 0
    # Paused owners (``lifecycle.pause``); None among them: the whole object is paused.
    paused: tuple[str | None, ...] = ()


@attrs.frozen(kw_only=True)
class ObjectDetail:
    """One object's jobs and dead letters (up to the limits asked for)."""

    summary: ObjectSummary
    jobs: list[JobInfo]
    dead_letters: list[DeadLetterInfo]
    # (owner, job id) -> its recent failed attempts, oldest first
    attempts: dict[tuple[str, str], list[AttemptInfo]] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class JobTotals:
    """Counts across every object (not only active ones), by namespace: what the
    metrics' gauges and an alert read."""

    dead_letters: dict[str, int] = attrs.Factory(dict)
    due_jobs: dict[str, int] = attrs.Factory(dict)
    running_jobs: dict[str, int] = attrs.Factory(dict)
    paused_objects: dict[str, int] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class ObjectCounts:
    """One object's share of ``JobTotals`` (due: waiting to run, not running);
    ``next_due``: the earliest job not due at the time counted (the counts hold until
    then while the database is unchanged)."""

    dead_letters: int = 0
    due_jobs: int = 0
    running_jobs: int = 0
    paused: tuple[str | None, ...] = ()  # paused owners (None: the whole object)
    next_due: float | None = None
    jobs: int = 0
    failing_jobs: int = 0  # jobs with failed attempts (kept in nj_attempts), to retry
    crash_strikes: int | None = None  # jobs with a crash strike (None: not counted)
    max_attempts: int = 0  # the most failed attempts of a job (as kept in nj_attempts)
    breaker_strikes: int = 0
    state: State | None = None  # as read (None: not opened)
    problem: str | None = None


@attrs.frozen(kw_only=True)
class FoundLetter:
    """A dead letter and the object that holds it."""

    namespace: str
    object_id: str
    letter: DeadLetterInfo


@attrs.frozen(kw_only=True)
class LetterPage:
    """One page of the dead letters of every object, newest first."""

    letters: list[FoundLetter]
    total: int
    offset: int
    limit: int


@attrs.frozen(kw_only=True)
class AlarmSummary:
    objects: int
    alarms: int
    due: int
    next_alarm: float | None


class DataSource(Protocol):
    """What the operator's faces read. Every method is synchronous and cheap: nothing
    here opens more object databases than the objects it is asked about."""

    @property
    def label(self) -> str: ...
    @property
    def live(self) -> bool: ...
    def namespaces(self) -> list[tuple[str, int]]: ...
    def alarm_summary(self, now: float) -> AlarmSummary: ...
    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage: ...
    def summary(self, row: ObjectRow, now: float) -> ObjectSummary: ...
    def detail(
        self, namespace: str, object_id: str, now: float, *, job_limit: int | None = None,
        letter_limit: int | None = None,
    ) -> ObjectDetail | None: ...
    def job_totals(self, now: float) -> JobTotals: ...
    def object_counts(self, now: float, *, strikes: bool = False,
                      ) -> dict[tuple[str, str], ObjectCounts]: ...
    def all_dead_letters(
        self, *, search: str | None = None, offset: int = 0, limit: int = 50,
        counts: dict[tuple[str, str], ObjectCounts] | None = None,
    ) -> LetterPage: ...


@runtime_checkable
class SourceAccess(Protocol):
    """Where a face reads its ``DataSource``: ``await access.read(fn)`` returns
    ``fn(source)``, called where the source's reads may block — so ``fn`` reads the
    source only, never a runtime's live state (read that before, on the Trio thread)."""

    @property
    def label(self) -> str: ...

    async def read(self, fn: Callable[[DataSource], T]) -> T: ...


class Inline:
    """A ``SourceAccess`` to a source read on the Trio thread (SQLite: each read takes
    microseconds, and runs between the runtime's statements)."""

    def __init__(self, source: DataSource) -> None:
        self.source = source

    @property
    def label(self) -> str:
        return self.source.label

    async def read(self, fn: Callable[[DataSource], T]) -> T:
        """``fn(source)``, on the Trio thread. Checkpoints."""
        await trio.lowlevel.checkpoint()
        return fn(self.source)


def is_postgres_address(text: str) -> bool:
    """Whether a location is a ``postgresql://`` (or ``postgres://``) address."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in ("postgresql", "postgres")


# -- reading SQLite without leaving anything behind --------------------------------------
# SQLite's POSIX lock bytes (os_unix.c): a process that has the database open holds a
# lock in the shared range.
_PENDING_BYTE: Final = 0x40000000
_SHARED_FIRST: Final = _PENDING_BYTE + 2
_SHARED_SIZE: Final = 510
_FLOCK: Final = "hhqqi4x"  # struct flock on Linux (64-bit off_t)


def _held_by_another_process(path: Path) -> bool:
    """Whether another process holds a SQLite lock on ``path`` (fcntl F_GETLK).

    Only for processes that have no SQLite connection of their own on the file: closing
    this descriptor drops every POSIX lock the process holds on it.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, _PENDING_BYTE,
                            _SHARED_FIRST + _SHARED_SIZE - _PENDING_BYTE, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        return bool(struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK)
    except OSError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_readonly(path: Path, *, probe: bool = True) -> Iterator[sqlite3.Connection]:
    """Open a SQLite database for reading without creating a file beside it and
    without waiting on a lock (``ObjectInUseError`` at once instead).

    A cleanly closed database has no ``-wal``: read it as immutable (no locks, no
    files). One with a ``-wal`` (its process died) would need a ``-shm`` beside it, and
    a read-only connection would create one or rewrite the one there: the pair is
    copied aside and read there instead.
    """
    wal = Path(f"{path}-wal")
    if not wal.exists():
        conn = sqlite3.connect(f"file:{_uri(path)}?mode=ro&immutable=1", uri=True,
                               timeout=0, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()
        return
    if probe and _held_by_another_process(path):
        raise ObjectInUseError(f"{path} is in use by another process")
    with tempfile.TemporaryDirectory(prefix="nursery-jobs-read-") as tmp:
        copy = Path(tmp) / "db.sqlite3"
        shutil.copyfile(path, copy)
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(wal, f"{copy}-wal")
        conn = sqlite3.connect(str(copy), timeout=0, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()


def _uri(path: Path) -> str:
    from urllib.parse import quote

    return quote(str(path.resolve()))


def runtime_running(data: Path) -> bool:
    """Whether a runtime holds ``data`` (its ``runtime.lock``). Creates nothing."""
    try:
        fd = os.open(data / "runtime.lock", os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False  # (not a data directory at all: the caller says so)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the probe's own lock
    return False


def refuse_if_running(data: Path) -> None:
    if runtime_running(data):
        raise RuntimeLockedError(
            f"{data} is in use by a running runtime: its objects' databases are locked."
            " Stop it, or look at it live: open_runtime(..., http=('127.0.0.1', 8321))"
            " serves its dashboard at http://127.0.0.1:8321/"
        )


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


class _CatalogReader:
    """Catalog queries shared by both sources (on a connection they provide)."""

    def _catalog(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _is_active(self, namespace: str, object_id: str) -> bool:
        return False

    def namespaces(self) -> list[tuple[str, int]]:
        with self._catalog() as conn:
            return [(str(ns), int(n)) for ns, n in conn.execute(
                "SELECT namespace, COUNT(*) FROM nj_objects GROUP BY namespace ORDER BY namespace"
            )]

    def alarm_summary(self, now: float) -> AlarmSummary:
        with self._catalog() as conn:
            objects = conn.execute("SELECT COUNT(*) FROM nj_objects").fetchone()[0]
            alarms, due = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(time <= ?), 0) FROM nj_alarms", (now,)
            ).fetchone()
            later = conn.execute(
                "SELECT MIN(time) FROM nj_alarms WHERE time > ?", (now,)
            ).fetchone()[0]
        return AlarmSummary(objects=int(objects), alarms=int(alarms), due=int(due),
                            next_alarm=None if later is None else float(later))

    def _page(
        self, namespace: str | None, search: str | None, only: str, now: float,
        offset: int, limit: int,
    ) -> ObjectPage:
        where, params = _filters(namespace, search, only, now)
        with self._catalog() as conn:
            total = conn.execute(
                "SELECT COUNT(*) FROM nj_objects o LEFT JOIN nj_alarms a"
                f" USING (namespace, object_id){where}", params
            ).fetchone()[0]
            rows = conn.execute(
                f"{_ROW_SQL}{where} ORDER BY o.namespace, o.object_id LIMIT ? OFFSET ?",
                [*params, limit, offset],
            ).fetchall()
        return ObjectPage(
            objects=[_object_row(r, self._is_active(r[0], r[1])) for r in rows],
            total=int(total), offset=offset, limit=limit,
        )

    def _rows(self, keys: list[tuple[str, str]]) -> list[ObjectRow]:
        with self._catalog() as conn:
            found = []
            for namespace, object_id in keys:
                row = conn.execute(
                    f"{_ROW_SQL} WHERE o.namespace = ? AND o.object_id = ?",
                    (namespace, object_id),
                ).fetchone()
                if row is not None:
                    found.append(_object_row(row, self._is_active(namespace, object_id)))
            return found

    def row(self, namespace: str, object_id: str) -> ObjectRow | None:
        rows = self._rows([(namespace, object_id)])
        return rows[0] if rows else None


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")]


def _count(conn: sqlite3.Connection, row: ObjectRow, state: State, now: float,
           running_id: str | None) -> ObjectSummary:
    tables = _tables(conn)
    if "nj_jobs" not in tables:
        return ObjectSummary(row=row, state=state)
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


def summary_of(row: ObjectRow, counts: ObjectCounts) -> ObjectSummary:
    """An object's summary from its counts (read already for every object)."""
    state: State = counts.state or ("active" if row.active else "evicted")
    return ObjectSummary(
        row=row, state=state, problem=counts.problem, lifecycle=counts.state is not None,
        jobs=counts.jobs, due=counts.due_jobs, running=counts.running_jobs,
        max_attempts=counts.max_attempts, dead_letters=counts.dead_letters,
        breaker_strikes=counts.breaker_strikes, paused=counts.paused)


def totals_of(counts: dict[tuple[str, str], ObjectCounts]) -> JobTotals:
    """Objects' counts, summed by namespace."""
    totals = JobTotals()
    for (namespace, _), c in counts.items():
        for into, n in ((totals.dead_letters, c.dead_letters),
                        (totals.due_jobs, c.due_jobs),
                        (totals.running_jobs, c.running_jobs),
                        (totals.paused_objects, int(bool(c.paused)))):
            into[namespace] = into.get(namespace, 0) + n
    return totals


def _matches(item: FoundLetter, needle: str) -> bool:
    """Whether ``needle`` (casefolded) is in the letter's object id, job id, function or
    error text."""
    letter = item.letter
    return any(needle in text.casefold()
               for text in (item.object_id, letter.id, letter.fn, letter.error))


def letter_page(found: list[FoundLetter], search: str | None, offset: int,
                limit: int) -> LetterPage:
    """``found`` filtered by ``search``, newest first, one page of it."""
    if search:
        needle = search.casefold()
        found = [item for item in found if _matches(item, needle)]
    found.sort(key=lambda item: (-item.letter.time, item.namespace, item.object_id,
                                 item.letter.owner, item.letter.id))
    end = None if limit < 0 else offset + limit
    return LetterPage(letters=found[offset:end], total=len(found), offset=offset, limit=limit)


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


class _ObjectReader:
    """Reads object databases: ``_object_db`` yields a connection (or a state) for an
    object the catalog (``row``) knows."""

    # Counts of objects whose database cannot have changed: (namespace, id) ->
    # (signature, counts). Only where ``_signature`` gives one (closed files).
    _counts_cache: dict[tuple[str, str], tuple[Any, ObjectCounts]]

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        raise NotImplementedError

    def _signature(self, row: ObjectRow) -> Any:
        """What changes whenever ``row``'s database may have (None: read it each time)."""
        return None

    def _counts(self, row: ObjectRow, now: float, *, strikes: bool = False) -> ObjectCounts:
        signature = self._signature(row)
        cache: dict[tuple[str, str], tuple[Any, ObjectCounts]] = self.__dict__.setdefault(
            "_counts_cache", {})
        key = (row.namespace, row.id)
        if signature is not None:
            known = cache.get(key)
            if known is not None and known[0] == signature and (
                    known[1].next_due is None or now < known[1].next_due) and (
                    not strikes or known[1].crash_strikes is not None):
                return known[1]
        with self._object_db(row) as (conn, state, problem):
            if conn is None:
                return ObjectCounts(state=state, problem=problem)
            try:
                counts = attrs.evolve(
                    _object_counts(conn, now, self._running_id(row), strikes=strikes),
                    state=state)
            except sqlite3.DatabaseError as exc:
                return ObjectCounts(state="damaged", problem=str(exc))
        if signature is not None:
            cache[key] = (signature, counts)
        return counts

    def object_counts(self, now: float, *, strikes: bool = False,
                      ) -> dict[tuple[str, str], ObjectCounts]:
        """Every object's counts (crash strikes too with ``strikes``: a scan of every
        job). Reads every object's database (one unchanged since, not again)."""
        return {(row.namespace, row.id): self._counts(row, now, strikes=strikes)
                for row in self.objects(limit=-1).objects}

    def job_totals(self, now: float) -> JobTotals:
        """Dead letters, due and running jobs and paused objects of every object, by
        namespace."""
        return totals_of(self.object_counts(now))

    def all_dead_letters(
        self, *, search: str | None = None, offset: int = 0, limit: int = 50,
        counts: dict[tuple[str, str], ObjectCounts] | None = None,
    ) -> LetterPage:
        """The dead letters of every object, newest first, those matching ``search``
        (in the object id, job id, function or error text). ``counts``: every object's,
        read already in this request (only objects with letters are opened then)."""
        found: list[FoundLetter] = []
        if counts is not None:
            rows = [row for ns, oid in sorted(k for k, c in counts.items() if c.dead_letters)
                    if (row := self.row(ns, oid)) is not None]
        else:
            cache: dict[tuple[str, str], tuple[Any, ObjectCounts]] = self.__dict__.get(
                "_counts_cache", {})
            rows = []
            for row in self.objects(limit=-1).objects:
                known = cache.get((row.namespace, row.id))
                if known is not None and not known[1].dead_letters and (
                        known[0] is not None and known[0] == self._signature(row)):
                    continue  # (unchanged since counted: none)
                rows.append(row)
        for row in rows:
            found += self._letters_of(row)
        return letter_page(found, search, offset, limit)

    def _letters_of(self, row: ObjectRow) -> list[FoundLetter]:
        """``row``'s dead letters (none where its database cannot be read)."""
        with self._object_db(row) as (conn, _state, _problem):
            if conn is None:
                return []
            try:
                letters = _read_dead_letters(conn, None)
            except sqlite3.DatabaseError:
                return []
        return [FoundLetter(namespace=row.namespace, object_id=row.id, letter=letter)
                for letter in letters]

    def row(self, namespace: str, object_id: str) -> ObjectRow | None:
        raise NotImplementedError

    def _object_db(
        self, row: ObjectRow
    ) -> contextlib.AbstractContextManager[tuple[sqlite3.Connection | None, State, str | None]]:
        raise NotImplementedError

    def _running_id(self, row: ObjectRow) -> str | None:
        return None

    def _running_started(self, row: ObjectRow) -> float | None:
        """When the job ``_running_id`` names started (None: not known)."""
        return None

    def summary(self, row: ObjectRow, now: float) -> ObjectSummary:
        with self._object_db(row) as (conn, state, problem):
            if conn is None:
                return ObjectSummary(row=row, state=state, problem=problem)
            try:
                return _count(conn, row, state, now, self._running_id(row))
            except sqlite3.DatabaseError as exc:
                return ObjectSummary(row=row, state="damaged", problem=str(exc))

    def detail(
        self, namespace: str, object_id: str, now: float, *, job_limit: int | None = None,
        letter_limit: int | None = None,
    ) -> ObjectDetail | None:
        row = self.row(namespace, object_id)
        if row is None:
            return None
        with self._object_db(row) as (conn, state, problem):
            if conn is None:
                return ObjectDetail(summary=ObjectSummary(row=row, state=state, problem=problem),
                                    jobs=[], dead_letters=[])
            try:
                running_id = self._running_id(row)
                return ObjectDetail(
                    summary=_count(conn, row, state, now, running_id),
                    jobs=_read_jobs(conn, job_limit, running_id, self._running_started(row)),
                    dead_letters=_read_dead_letters(conn, letter_limit),
                    attempts=_read_attempts(conn),
                )
            except sqlite3.DatabaseError as exc:
                return ObjectDetail(
                    summary=ObjectSummary(row=row, state="damaged", problem=str(exc)),
                    jobs=[], dead_letters=[],
                )


@contextlib.contextmanager
def _file_db(
    path: Path, *, probe: bool
) -> Iterator[tuple[sqlite3.Connection | None, State, str | None]]:
    if not path.exists():
        held = path.parent / QUARANTINE / path.name
        if held.exists():
            yield None, "quarantined", (f"damaged; moved to {held} — move it back to restore"
                                        " the object (its alarm is kept)")
        else:
            yield None, "missing", f"no database file {path.name}"
        return
    with contextlib.ExitStack() as stack:
        found: tuple[sqlite3.Connection | None, State, str | None]
        try:
            conn = stack.enter_context(open_readonly(path, probe=probe))
        except ObjectInUseError as exc:
            found = (None, "in use", str(exc))
        except sqlite3.DatabaseError as exc:
            found = (None, "damaged", f"{path.name}: {exc}")
        else:
            found = (conn, "evicted", None)
        yield found


def _file_signature(path: str, *, wal: bool = True) -> Any:
    """A database file's and its ``-wal``'s (inode, size, mtime): any write moves one.
    Without ``wal``: the file only (one closed by this process, its log checkpointed
    into it on close). (``os.stat`` of a string: pathlib's parsing cost more than the
    stat, measured.)"""
    out: list[tuple[int, int, int] | None] = []
    for name in (path, f"{path}-wal") if wal else (path,):
        try:
            st = os.stat(name)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


# -- reading every object without holding the Trio thread --------------------------------
# A page over every object (its counts, its dead letters) reads one database per object:
# 3,000 objects held the runtime's loop ~430 ms in one piece. ``Sliced`` reads them in
# slices of about ``SLICE_SECONDS`` of work, with a checkpoint between slices, then
# renders the page from what it read (``_Prefetched``): the loop is never held longer
# than a slice (plus the page's own rendering, which reads no object database).
SLICE_SECONDS: Final = 0.002
CATALOG_CHUNK: Final = 500  # catalog rows read per statement (between checkpoints)


# Of the loop's time, about the most that pages built from reads of every object take
# while loads keep coming: each second of the loop a page spent (reading in slices,
# rendering, its live counters) holds the next read of every object back 1 / PAGE_SHARE
# seconds (a load still waits for a read that starts after it came).
PAGE_SHARE: Final = 0.05
PACE_LIMIT: Final = 2.0  # seconds a load waits for the pace at most (a first, cold read)

_KnownRow = tuple[tuple[str, str], bool, ObjectRow]


def _same_row(row: ObjectRow, raw: tuple[Any, ...]) -> bool:
    """Whether a catalog row (``_ROW_SQL``) says what ``row`` says (its key aside)."""
    _, _, file, class_path, created_at, alarm, retry = raw
    return (row.file == file and row.class_path == class_path
            and row.created_at == float(created_at)
            and row.alarm == (None if alarm is None else float(alarm))
            and row.alarm_retry == int(retry or 0))


class _Slicer:
    """Checkpoints once about ``SLICE_SECONDS`` of work has run since the last one;
    ``work``: the seconds worked between checkpoints so far."""

    def __init__(self) -> None:
        self.work = 0.0
        self.start = perf_counter()
        self.deadline = self.start + SLICE_SECONDS

    async def tick(self, *, force: bool = False) -> None:
        now = perf_counter()
        if force or now >= self.deadline:
            self.work += now - self.start
            await trio.lowlevel.checkpoint()
            self.start = perf_counter()
            self.deadline = self.start + SLICE_SECONDS

    def total(self) -> float:
        return self.work + perf_counter() - self.start


class _FileSource(_CatalogReader, _ObjectReader):
    """A source of SQLite databases (a data directory, or a runtime's files or memory
    databases), readable in slices (``Sliced``)."""

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def live(self) -> bool:
        raise NotImplementedError

    async def rows_in_slices(self, slicer: _Slicer | None = None,
                             ) -> list[tuple[tuple[str, str], ObjectRow]]:
        """Every object's (namespace, id) and catalog row, in (namespace, id) order,
        ``CATALOG_CHUNK`` rows a statement with a checkpoint between statements."""
        rows: list[tuple[tuple[str, str], ObjectRow]] = []
        after: tuple[str, str] | None = None
        # The entries of the last pass, reused where unchanged: they live across the
        # pass's checkpoints, so new ones each time reach the collector's oldest
        # generation and set off full collections (50-100 ms with 3,000 objects,
        # measured). (namespace, id) -> (that key, active, ObjectRow)
        known: dict[tuple[str, str], _KnownRow] = self.__dict__.get("_known_rows", {})
        kept: dict[tuple[str, str], _KnownRow] = {}
        while True:
            with self._catalog() as conn:
                if after is None:
                    found = conn.execute(
                        f"{_ROW_SQL} ORDER BY o.namespace, o.object_id LIMIT ?",
                        (CATALOG_CHUNK,)).fetchall()
                else:
                    found = conn.execute(
                        f"{_ROW_SQL} WHERE (o.namespace, o.object_id) > (?, ?)"
                        " ORDER BY o.namespace, o.object_id LIMIT ?",
                        (*after, CATALOG_CHUNK)).fetchall()
            for raw in found:
                active = self._is_active(raw[0], raw[1])
                was = known.get((raw[0], raw[1]))
                if was is None or was[1] != active or not _same_row(was[2], raw):
                    row = _object_row(raw, active)
                    was = ((row.namespace, row.id), active, row)
                kept[was[0]] = was
                rows.append((was[0], was[2]))
            if len(found) < CATALOG_CHUNK:
                self.__dict__["_known_rows"] = kept
                return rows
            after = (found[-1][0], found[-1][1])
            await (slicer or _Slicer()).tick(force=True)

    async def prefetch(self, now: float, *, strikes: bool = False,
                       letters: bool = False) -> _Prefetched:
        """Every object's counts (and with ``letters`` the dead letters of those that
        have some), read in slices of about ``SLICE_SECONDS``: between two slices the
        runtime runs. Each object is read whole in one slice (as ``object_counts``
        reads it); objects read in different slices are read at different moments."""
        slicer = _Slicer()
        rows = await self.rows_in_slices(slicer)
        counts: dict[tuple[str, str], ObjectCounts] = {}
        for key, row in rows:
            counts[key] = self._counts(row, now, strikes=strikes)
            await slicer.tick()
        found: list[FoundLetter] | None = None
        if letters:
            found = []
            for key, row in rows:
                if counts[key].dead_letters:
                    found += self._letters_of(row)
                    await slicer.tick()
        return _Prefetched(self, [row for _, row in rows], counts, strikes=strikes,
                           letters=found, work=slicer.total())


class _Prefetched:
    """A ``DataSource`` whose reads over every object were made already (``prefetch``):
    the catalog's rows, every object's counts and perhaps every dead letter. The rest is
    read from ``source`` (one object, or the catalog's small aggregates)."""

    def __init__(self, source: _FileSource, rows: list[ObjectRow],
                 counts: dict[tuple[str, str], ObjectCounts], *, strikes: bool,
                 letters: list[FoundLetter] | None, work: float = 0.0) -> None:
        self.source = source
        self.work = work  # seconds of the loop the read took
        self.rows = rows
        self.counts = counts
        self.strikes = strikes
        self.letters = letters
        # What the pages rendered from this read computed over every object (the
        # object list in an order): loads that share the read share these too.
        self.memo: dict[Any, Any] = {}

    @property
    def label(self) -> str:
        return self.source.label

    @property
    def live(self) -> bool:
        return self.source.live

    def namespaces(self) -> list[tuple[str, int]]:
        if "namespaces" not in self.memo:
            found: dict[str, int] = {}
            for row in self.rows:
                found[row.namespace] = found.get(row.namespace, 0) + 1
            self.memo["namespaces"] = sorted(found.items())
        return list(self.memo["namespaces"])

    def alarm_summary(self, now: float) -> AlarmSummary:
        return self.source.alarm_summary(now)

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        if only == "active":  # (the runtime's resident objects: at most max_active)
            return self.source.objects(namespace=namespace,
                                       search=search, only=only, now=now, offset=offset,
                                       limit=limit)
        rows = [row for row in self.rows
                if (not namespace or row.namespace == namespace)
                and (not search or search in row.id)
                and (only != "due" or (row.alarm is not None and row.alarm <= now))]
        end = None if limit < 0 else offset + limit
        return ObjectPage(objects=rows[offset:end], total=len(rows), offset=offset,
                          limit=limit)

    def summary(self, row: ObjectRow, now: float) -> ObjectSummary:
        return self.source.summary(row, now)

    def detail(
        self, namespace: str, object_id: str, now: float, *, job_limit: int | None = None,
        letter_limit: int | None = None,
    ) -> ObjectDetail | None:
        return self.source.detail(namespace, object_id, now, job_limit=job_limit,
                                  letter_limit=letter_limit)

    def job_totals(self, now: float) -> JobTotals:
        if "job_totals" not in self.memo:
            self.memo["job_totals"] = totals_of(self.counts)
        return self.memo["job_totals"]  # type: ignore[no-any-return]

    def object_counts(self, now: float, *, strikes: bool = False,
                      ) -> dict[tuple[str, str], ObjectCounts]:
        if strikes and not self.strikes:  # (not prefetched: read now, in one piece)
            return self.source.object_counts(now, strikes=True)
        return self.counts

    def all_dead_letters(
        self, *, search: str | None = None, offset: int = 0, limit: int = 50,
        counts: dict[tuple[str, str], ObjectCounts] | None = None,
    ) -> LetterPage:
        if self.letters is None:
            return self.source.all_dead_letters(search=search, offset=offset, limit=limit,
                                                counts=self.counts)
        return letter_page(list(self.letters), search, offset, limit)

    def row(self, namespace: str, object_id: str) -> ObjectRow | None:
        return self.source.row(namespace, object_id)


class Sliced:
    """A ``SourceAccess`` to a SQLite source read on the Trio thread, where a page that
    reads every object (``read(fn, now=..., counts=True)``) reads them in slices first
    (``_FileSource.prefetch``), then calls ``fn`` on what was read.

    Loads that wait while such a read runs share the next one (it starts after they
    arrived, so each still sees every write made before it asked): 20 clients loading
    pages cost about one read of every object at a time, not 20."""

    def __init__(self, source: _FileSource) -> None:
        self.source = source
        # (strikes, letters) -> a lock that one read of every object holds, the reads
        # started so far, and the newest read's (number, result).
        self._locks: dict[tuple[bool, bool], trio.Lock] = {}
        self._started: dict[tuple[bool, bool], int] = {}
        self._newest: dict[tuple[bool, bool], tuple[int, _Prefetched]] = {}
        self._next_read = 0.0  # (perf_counter) when the next read may begin

    @property
    def label(self) -> str:
        return self.source.label

    async def read(self, fn: Callable[[DataSource], T], *, now: float | None = None,
                   counts: bool = False, strikes: bool = False, letters: bool = False,
                   limiter: trio.CapacityLimiter | None = None) -> T:
        """``fn(source)`` on the Trio thread; with ``counts`` (or ``letters``) and
        ``now``, every object's counts (and dead letters) read in slices before, by
        this call or by one that started after it was made. ``limiter``: held by each
        read of every object (and by a call that reads none, while it runs ``fn``).
        Checkpoints."""
        if now is None or not (counts or letters):
            async with contextlib.AsyncExitStack() as stack:
                if limiter is not None:
                    await stack.enter_async_context(limiter)
                await trio.lowlevel.checkpoint()
                return fn(cast("DataSource", self.source))
        key = (strikes, letters)
        arrived = self._started.get(key, 0)  # (reads started before this call)
        # Loads of one kind wait here (holding no token of ``limiter``: that bounds
        # the reads under way, of different kinds).
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            newest = self._newest.get(key)
            if newest is not None and newest[0] > arrived:
                found = newest[1]  # (started after this call was made: shared)
                await trio.lowlevel.checkpoint()
            else:
                await self._paced()
                async with contextlib.AsyncExitStack() as stack:
                    if limiter is not None:
                        await stack.enter_async_context(limiter)
                    number = self._started[key] = self._started.get(key, 0) + 1
                    began = perf_counter()
                    found = await self.source.prefetch(now, strikes=strikes,
                                                       letters=letters)
                    self._newest[key] = (number, found)
                    self._charge(found.work, began)
            if not lock.statistics().tasks_waiting:
                # (No load waits for it: not kept, with every dead letter it holds.)
                self._newest.pop(key, None)
        began = perf_counter()
        try:
            return fn(found)
        finally:
            self._charge(perf_counter() - began, began)

    def charge(self, seconds: float) -> None:
        """Counts ``seconds`` of the loop spent on a page (its live counters, say)
        against the pace of the reads of every object (``PAGE_SHARE``)."""
        self._charge(seconds, perf_counter() - seconds)

    def _charge(self, work: float, began: float) -> None:
        # (A leaky bucket: work done at once by reads of different kinds adds up, so
        # together they stay within the share. A cold first read waits PACE_LIMIT.)
        start = max(self._next_read, began)
        self._next_read = start + min(work / PAGE_SHARE,
                                      perf_counter() - start + PACE_LIMIT)

    async def stepwise(self, steps: Callable[[DataSource], Generator[None, None, T]], *,
                       limiter: trio.CapacityLimiter | None = None) -> T:
        """What ``steps(source)`` returns, its steps (each yields) run in slices of about
        ``SLICE_SECONDS`` with a checkpoint between slices (``limiter`` held)."""
        async with contextlib.AsyncExitStack() as stack:
            if limiter is not None:
                await stack.enter_async_context(limiter)
            await trio.lowlevel.checkpoint()
            running = steps(cast("DataSource", self.source))
            slicer = _Slicer()
            while True:
                try:
                    next(running)
                except StopIteration as done:
                    self._charge(slicer.total(), perf_counter() - slicer.total())
                    return cast("T", done.value)
                await slicer.tick()

    async def _paced(self) -> None:
        """Waits until a read of every object may begin (``PAGE_SHARE``). Not under a
        ``MockClock``: the pace is real time, which a virtual clock does not measure."""
        wait = self._next_read - perf_counter()
        if wait > 0 and not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
            await trio.sleep(wait)


class OfflineSource(_FileSource):
    """A stopped data directory, read-only. Creates no file; runs nothing."""

    def __init__(self, data: str | os.PathLike[str]) -> None:
        self.data = Path(data)
        if not (self.data / "catalog.sqlite3").is_file():
            raise DataDirectoryError(f"{self.data} is not a nursery_jobs data directory"
                                     " (no catalog.sqlite3)")

    @property
    def label(self) -> str:
        return str(self.data)

    @property
    def live(self) -> bool:
        return False

    def _catalog(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return open_readonly(self.data / "catalog.sqlite3")

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        if only == "active":
            return ObjectPage(objects=[], total=0, offset=offset, limit=limit)
        return self._page(namespace, search, only, now, offset, limit)

    def _object_db(
        self, row: ObjectRow
    ) -> contextlib.AbstractContextManager[tuple[sqlite3.Connection | None, State, str | None]]:
        return _file_db(self.data / "objects" / row.file, probe=True)

    def _signature(self, row: ObjectRow) -> Any:
        return _file_signature(f"{self.data}/objects/{row.file}")


class RuntimeSource(_FileSource):
    """A running runtime, read in its own process (on the Trio thread; every call is
    synchronous and runs between the runtime's statements).

    The one place outside the core that reads the runtime's internals: the catalog
    connection, the hosts of active objects (their databases are locked exclusively,
    so their own connection is the only way in), the in-memory databases of a
    ``path=None`` runtime, and the id of the job an alarm run is executing. A job an
    active object completed may show until its completion group commits.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @property
    def label(self) -> str:
        return str(self.rt.engine.label)

    @property
    def live(self) -> bool:
        return True

    @contextlib.contextmanager
    def _catalog(self) -> Iterator[sqlite3.Connection]:
        catalog = getattr(self.rt.engine, "catalog", None)
        if catalog is None:
            raise UnknownObjectError(
                f"the dashboard reads the files and memory engines; {self.label} has no catalog"
            )
        yield catalog.conn

    def _is_active(self, namespace: str, object_id: str) -> bool:
        return self.rt.is_active(namespace, object_id)

    def active_keys(self) -> list[tuple[str, str]]:
        return self.rt.active_objects()

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        if only != "active":
            return self._page(namespace, search, only, now, offset, limit)
        keys = sorted(
            key for key in self.rt.active_objects()
            if (not namespace or key[0] == namespace) and (not search or search in key[1])
        )
        end = None if limit < 0 else offset + limit
        return ObjectPage(objects=self._rows(keys[offset:end]), total=len(keys),
                          offset=offset, limit=limit)

    def _signature(self, row: ObjectRow) -> Any:
        # An open database: its connection's count of changed rows moves with every
        # write (a rolled-back one too). An evicted object's file changes only when it
        # is activated again (this runtime holds the directory).
        conn = self._host_conn(row.namespace, row.id)
        if conn is None and self.rt.path is None:
            conn = self.rt.engine.database(row.namespace, row.id)  # type: ignore[attr-defined]
        if conn is not None:
            return ("open", id(conn), conn.total_changes, self._running_id(row))
        if self.rt.is_active(row.namespace, row.id):
            return None  # (dormant or closing: read it each time)
        assert self.rt.path is not None
        return _file_signature(f"{self.rt.path}/objects/{row.file}", wal=False)

    def _host_conn(self, namespace: str, object_id: str) -> sqlite3.Connection | None:
        return self.rt.active_database(namespace, object_id)

    @contextlib.contextmanager
    def _object_db(
        self, row: ObjectRow
    ) -> Iterator[tuple[sqlite3.Connection | None, State, str | None]]:
        conn = self._host_conn(row.namespace, row.id)
        if conn is not None:
            yield conn, "active", None
            return
        if self.rt.path is not None and self.rt.is_active(row.namespace, row.id):
            if self.rt.database_closing(row.namespace, row.id):
                # Its close still runs (checkpointing, in a worker thread): opening the
                # file now, then closing it, would drop this process's lock on it.
                yield None, "active", "closing its database (dozing): look again shortly"
                return
            # Dormant: resident, its file closed (read as an evicted one's is).
            with _file_db(self.rt.path / "objects" / row.file, probe=False) as found:
                conn, state, problem = found
                yield conn, "active" if state == "evicted" else state, problem
            return
        if self.rt.path is None:
            memory = self.rt.engine.database(row.namespace, row.id)  # type: ignore[attr-defined]
            if memory is None:
                yield None, "missing", "no in-memory database"
            else:
                yield memory, "evicted", None
            return
        # Evicted: the file is closed, and nothing else in this process can open it
        # while this synchronous read runs (no lock probe: see _held_by_another_process).
        with _file_db(self.rt.path / "objects" / row.file, probe=False) as found:
            yield found

    def _lifecycle(self, namespace: str, object_id: str) -> Any:
        instance = self.rt.active_instance(namespace, object_id)
        return None if instance is None else _lifecycle_of(instance)

    def _running_id(self, row: ObjectRow) -> str | None:
        lifecycle = self._lifecycle(row.namespace, row.id)
        return None if lifecycle is None else lifecycle.store.running_id

    def _running_started(self, row: ObjectRow) -> float | None:
        lifecycle = self._lifecycle(row.namespace, row.id)
        found = None if lifecycle is None else lifecycle.running_for()
        return None if found is None else _clock.now() - found[1]

    # -- what the test helpers need -----------------------------------------------------
    def busy(self, now: float) -> bool:
        """Whether an alarm is in flight or due at ``now``."""
        return bool(self.rt.timer.inflight) or bool(self.rt.engine.due(now, 1))

    # -- the dashboard's write actions (only with http_writes) ---------------------------
    async def requeue(self, namespace: str, object_id: str, owner: str, job_id: str) -> bool:
        """Requeue a dead letter through the object's Lifecycle, as a write call of the
        object (activating it; durable when it returns)."""

        async def requeue(lifecycle: Any) -> bool:
            return await lifecycle.requeue(job_id, owner=owner) is not None

        return await self._in_lifecycle(namespace, object_id, "dashboard requeue", requeue)

    async def discard(self, namespace: str, object_id: str, owner: str, job_id: str) -> bool:
        """Delete a dead letter through the object's job table, as a write call of the
        object (activating it; durable when it returns)."""

        async def discard(lifecycle: Any) -> bool:
            return bool(await lifecycle.discard(job_id, owner=owner))

        return await self._in_lifecycle(namespace, object_id, "dashboard discard", discard)

    async def _in_lifecycle(self, namespace: str, object_id: str, holder: str,
                            fn: Callable[[Any], Awaitable[bool]]) -> bool:
        """``await fn(lifecycle)`` in a write turn of the object (``Runtime.run_in``:
        resident from activation to the end, so that no eviction comes in between)."""
        from nursery_jobs._core._object import resolve_namespace

        cls = resolve_namespace(namespace, self.rt.engine.class_path(namespace))
        if cls is None:
            raise UnknownObjectError(f"no class is registered for namespace {namespace!r}")

        async def run(instance: Any) -> bool:
            lifecycle = _lifecycle_of(instance)
            if lifecycle is None:
                raise UnknownObjectError(f"{namespace}/{object_id} has no Lifecycle")
            return await fn(lifecycle)

        return await self.rt.run_in(cls, object_id, holder, run)


def _lifecycle_of(instance: object) -> Any:
    """The Lifecycle an object installed, or None."""
    from nursery_jobs._jobs._lifecycle import Lifecycle

    for value in vars(instance).values():
        if isinstance(value, Lifecycle):
            return value
    return None
