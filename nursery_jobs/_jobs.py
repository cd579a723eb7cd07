"""Job records, retry options, outcomes and the ``nj_jobs`` table of one object.

``JobTable`` is the only code that writes ``nj_jobs``; ``Jobs`` is the owner-scoped face
(host or one capability) that users call.
"""

from __future__ import annotations

import datetime
import enum
import itertools
import math
import sqlite3
import uuid
from typing import TYPE_CHECKING, Any, Final

import attrs

from . import _clock
from ._codec import converter, decode_payload, encode_payload
from ._errors import JobError, JobOwnershipError

if TYPE_CHECKING:
    from ._lifecycle import Lifecycle

HOST: Final = "host"
MAX_JOB_ID_LENGTH: Final = 1024


def _check_retry(instance: RetryOptions, attribute: Any, value: Any) -> None:
    if attribute.name == "max_attempts":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobError(f"RetryOptions.max_attempts must be an int >= 1, got {value!r}")
    elif (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise JobError(f"RetryOptions.{attribute.name} must be a finite number >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class RetryOptions:
    """How often a failing job is retried: ``max_attempts`` counts the first run; the
    wait before attempt n+1 is uniform in [0, min(max_delay, base_delay * 2**(n-1)))."""

    max_attempts: int = attrs.field(default=3, validator=_check_retry)
    base_delay: float = attrs.field(default=0.1, validator=_check_retry)
    max_delay: float = attrs.field(default=3.0, validator=_check_retry)
    jitter: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    """With ``jitter=False`` the wait is exactly the bound (the Agent's 1, 2, 4 ... s)."""

    def backoff_bound(self, attempt: int) -> float:
        """Upper bound of the wait after failed attempt ``attempt`` (1-based)."""
        return min(self.max_delay, self.base_delay * 2.0 ** min(attempt - 1, 1024))


DEFAULT_RETRY: Final = RetryOptions()


@attrs.frozen(kw_only=True)
class Job:
    """A job as stored: who owns it, what to run, when, and how."""

    id: str
    owner: str
    fn: str
    time: float
    payload: Any
    retry: RetryOptions
    singleflight: bool
    hung_timeout: float
    exclusive: bool
    recovery_loop: bool
    created_at: float


@attrs.frozen(kw_only=True)
class JobContext:
    """Passed to ``on_job``: the job and which attempt this is (1-based, durable)."""

    job: Job
    attempt: int


@attrs.frozen(kw_only=True)
class DeadLetter:
    """A job that ended without success: spent retries, or sealed by the breaker."""

    job: Job
    error: str
    attempts: int
    reason: str
    time: float


def _reschedule_time(value: float | datetime.datetime) -> float:
    try:
        return _clock.coerce_time(value, name="Reschedule.time")
    except (TypeError, ValueError) as exc:
        raise JobError(str(exc)) from None


@attrs.frozen
class Reschedule:
    """Outcome: keep the job and run it again at ``time`` (epoch seconds or aware
    datetime)."""

    time: float = attrs.field(converter=_reschedule_time)


class _Yield(enum.Enum):
    YIELD = "yield"

    def __repr__(self) -> str:
        return "nj.YIELD"


YIELD: Final = _Yield.YIELD
"""Outcome: the job stays due and the object wakes again at once (after other due jobs)."""

JobOutcome = Reschedule | _Yield | None

# Column order of every SELECT that builds a JobRow.
_COLUMNS = (
    "seq, id, owner, fn, time, payload, max_attempts, base_delay, max_delay, jitter, singleflight,"
    " hung_timeout, exclusive, recovery_loop, created_at, attempts, running_since, crash_strikes"
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nj_jobs (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    fn TEXT NOT NULL,
    time REAL NOT NULL,
    payload TEXT,
    max_attempts INTEGER NOT NULL,
    base_delay REAL NOT NULL,
    max_delay REAL NOT NULL,
    jitter INTEGER NOT NULL,
    singleflight INTEGER NOT NULL,
    hung_timeout REAL NOT NULL,
    exclusive INTEGER NOT NULL,
    recovery_loop INTEGER NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    running_since REAL,
    crash_strikes INTEGER NOT NULL DEFAULT 0,
    last_crash REAL
);
CREATE INDEX IF NOT EXISTS nj_jobs_due ON nj_jobs (time);
CREATE INDEX IF NOT EXISTS nj_jobs_exclusive ON nj_jobs (time) WHERE exclusive = 1;
CREATE INDEX IF NOT EXISTS nj_jobs_running ON nj_jobs (running_since)
    WHERE running_since IS NOT NULL;
CREATE TABLE IF NOT EXISTS nj_dead_letters (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    job TEXT NOT NULL,
    error TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    reason TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (owner, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nj_meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
"""


@attrs.define(slots=True)
class JobRow:
    """A job plus its bookkeeping: push sequence, attempts, running marker, strikes."""

    seq: int
    job: Job
    attempts: int
    running_since: float | None
    crash_strikes: int

    @classmethod
    def from_sql(cls, row: tuple[Any, ...]) -> JobRow:
        (seq, id, owner, fn, time, payload, max_attempts, base_delay, max_delay, jitter,
         singleflight, hung_timeout, exclusive, recovery_loop, created_at, attempts,
         running_since, crash_strikes) = row
        retry = (
            DEFAULT_RETRY
            if (max_attempts, base_delay, max_delay, jitter) == (3, 0.1, 3.0, 1)
            else RetryOptions(max_attempts=max_attempts, base_delay=base_delay,
                              max_delay=max_delay, jitter=bool(jitter))
        )
        job = Job(
            id=id, owner=owner, fn=fn, time=time, payload=decode_payload(payload), retry=retry,
            singleflight=bool(singleflight), hung_timeout=hung_timeout,
            exclusive=bool(exclusive), recovery_loop=bool(recovery_loop), created_at=created_at,
        )
        return cls(seq, job, attempts, running_since, crash_strikes)


class JobTable:
    """SQL on ``nj_jobs`` and ``nj_dead_letters``; every method is synchronous."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        if conn.in_transaction:
            _create_in_tx(conn)
        else:
            conn.executescript(_SCHEMA)

    # -- reads ----------------------------------------------------------------------
    def owner_of(self, job_id: str) -> str | None:
        row = self.conn.execute("SELECT owner FROM nj_jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else str(row[0])

    def row(self, job_id: str) -> JobRow | None:
        row = self.conn.execute(
            f"SELECT {_COLUMNS} FROM nj_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        return None if row is None else JobRow.from_sql(row)

    def rows(self, owner: str | None = None) -> list[JobRow]:
        if owner is None:
            cursor = self.conn.execute(f"SELECT {_COLUMNS} FROM nj_jobs ORDER BY time, seq")
        else:
            cursor = self.conn.execute(
                f"SELECT {_COLUMNS} FROM nj_jobs WHERE owner = ? ORDER BY time, seq", (owner,)
            )
        return [JobRow.from_sql(r) for r in cursor]

    def next_due(self, now: float, after: tuple[float, int], limit: int = 1) -> list[JobRow]:
        """The first ``limit`` jobs due at ``now`` that come after ``after`` = (time, seq)."""
        cursor = self.conn.execute(
            f"SELECT {_COLUMNS} FROM nj_jobs WHERE time <= ? AND (time, seq) > (?, ?)"
            " ORDER BY time, seq LIMIT ?",
            (now, after[0], after[1], limit),
        )
        return [JobRow.from_sql(row) for row in cursor]

    def due_counts(self, now: float) -> list[tuple[str, int]]:
        return self.conn.execute(
            "SELECT owner, COUNT(*) FROM nj_jobs WHERE time <= ? GROUP BY owner", (now,)
        ).fetchall()

    def has_due(self, now: float) -> bool:
        return self.conn.execute(
            "SELECT 1 FROM nj_jobs WHERE time <= ? LIMIT 1", (now,)
        ).fetchone() is not None

    def running(self) -> list[JobRow]:
        cursor = self.conn.execute(
            f"SELECT {_COLUMNS} FROM nj_jobs WHERE running_since IS NOT NULL ORDER BY time, seq"
        )
        return [JobRow.from_sql(r) for r in cursor]

    def first_exclusive_time(self, excluding: str | None = None) -> float | None:
        """The earliest exclusive job's time (leaving out job ``excluding``)."""
        row = self.conn.execute(
            "SELECT MIN(time) FROM nj_jobs WHERE exclusive = 1 AND id IS NOT ?", (excluding,)
        ).fetchone()
        return None if row[0] is None else float(row[0])

    def next_alarm_time(self, now: float) -> float | None:
        """When the object must wake: the earliest exclusive job (unclamped) if any;
        else the earliest runnable job, where an in-flight single-flight job counts
        from ``running_since + hung_timeout``."""
        exclusive = self.first_exclusive_time()
        if exclusive is not None:
            return exclusive
        row = self.conn.execute(
            "SELECT time FROM nj_jobs WHERE singleflight = 0 OR running_since IS NULL"
            " ORDER BY time LIMIT 1"
        ).fetchone()
        ready = None if row is None else float(row[0])
        row = self.conn.execute(
            "SELECT MIN(MAX(time, running_since + hung_timeout)) FROM nj_jobs"
            " WHERE running_since IS NOT NULL AND singleflight = 1"
        ).fetchone()
        in_flight = None if row[0] is None else float(row[0])
        if ready is None:
            return in_flight
        return ready if in_flight is None else min(ready, in_flight)

    # -- writes ---------------------------------------------------------------------
    def upsert(self, job: Job, payload_text: str | None) -> None:
        """Insert ``job``, or replace the same owner's job of that id in place (it keeps
        its push sequence and creation time; attempts, marker and strikes reset)."""
        retry = job.retry
        self.conn.execute(
            "INSERT INTO nj_jobs (id, owner, fn, time, payload, max_attempts, base_delay,"
            " max_delay, jitter, singleflight, hung_timeout, exclusive, recovery_loop,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET fn = excluded.fn, time = excluded.time,"
            " payload = excluded.payload, max_attempts = excluded.max_attempts,"
            " base_delay = excluded.base_delay, max_delay = excluded.max_delay,"
            " jitter = excluded.jitter,"
            " singleflight = excluded.singleflight, hung_timeout = excluded.hung_timeout,"
            " exclusive = excluded.exclusive, recovery_loop = excluded.recovery_loop,"
            " attempts = 0, running_since = NULL, crash_strikes = 0"
            " WHERE owner = excluded.owner",
            (job.id, job.owner, job.fn, job.time, payload_text, retry.max_attempts,
             retry.base_delay, retry.max_delay, retry.jitter, job.singleflight, job.hung_timeout,
             job.exclusive, job.recovery_loop, job.created_at),
        )

    def delete(self, owner: str, job_id: str) -> bool:
        cursor = self.conn.execute(
            "DELETE FROM nj_jobs WHERE id = ? AND owner = ?", (job_id, owner)
        )
        return cursor.rowcount > 0

    def retime(self, owner: str, job_id: str, time: float) -> bool:
        cursor = self.conn.execute(
            "UPDATE nj_jobs SET time = ?, running_since = NULL WHERE id = ? AND owner = ?",
            (time, job_id, owner),
        )
        return cursor.rowcount > 0

    # Outcomes of clean runs are staged in memory and applied in groups (see
    # ``Lifecycle._stage``): a death re-runs at most one group of completed jobs.
    def apply_completions(
        self, finished: list[tuple[int]], later: list[tuple[float, bool, int]],
        clean: list[tuple[str]],
    ) -> None:
        """Apply staged outcomes (by push sequence, except ``clean``, by id): delete
        finished jobs; re-time kept ones with attempts
        and strikes cleared (keeping the running marker where tracked work goes on);
        clear the attempts of jobs whose clean run was superseded."""
        conn = self.conn
        if finished:
            conn.executemany("DELETE FROM nj_jobs WHERE seq = ?", finished)
        if later:
            conn.executemany(
                "UPDATE nj_jobs SET time = ?, attempts = 0, crash_strikes = 0,"
                " running_since = CASE WHEN ? THEN running_since END WHERE seq = ?",
                later,
            )
        if clean:
            conn.executemany(
                "UPDATE nj_jobs SET attempts = 0, crash_strikes = 0 WHERE id = ?"
                " AND (attempts != 0 OR crash_strikes != 0)",
                clean,
            )

    def retry_later(self, job_id: str, time: float, attempts: int) -> None:
        """A failed attempt with attempts left: re-time it and record the attempt."""
        self.conn.execute(
            "UPDATE nj_jobs SET time = ?, attempts = ?, running_since = NULL WHERE id = ?",
            (time, attempts, job_id),
        )

    def set_marker(self, job_id: str, started: float) -> None:
        """Record that work of the job (tracked alarm work) is in progress."""
        self.conn.execute(
            "UPDATE nj_jobs SET running_since = ? WHERE id = ?", (started, job_id)
        )

    def clear_marker(self, job_id: str, started: float) -> bool:
        cursor = self.conn.execute(
            "UPDATE nj_jobs SET running_since = NULL WHERE id = ? AND running_since = ?",
            (job_id, started),
        )
        return cursor.rowcount > 0

    def strike(self, job_id: str, started: float, time: float) -> bool:
        """A process died while the job (started at ``started``) ran: count a crash
        strike and re-time it. Idempotent per death (``last_crash``)."""
        cursor = self.conn.execute(
            "UPDATE nj_jobs SET crash_strikes = crash_strikes + 1, time = ?, last_crash = ?,"
            " running_since = NULL WHERE id = ? AND last_crash IS NOT ?",
            (time, started, job_id, started),
        )
        return cursor.rowcount > 0

    # -- dead letters ---------------------------------------------------------------
    def bury(self, row: JobRow, error: str, reason: str, now: float, *, attempts: int) -> None:
        """Move a job into the dead letters (replacing an older letter of its id)."""
        job = row.job
        record = converter.unstructure(attrs.evolve(job, payload=None))
        record["payload"] = encode_payload(job.payload)
        self.conn.execute(
            "INSERT OR REPLACE INTO nj_dead_letters (owner, id, job, error, attempts, reason,"
            " time) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job.owner, job.id, encode_payload(record), error, attempts, reason, now),
        )
        self.conn.execute("DELETE FROM nj_jobs WHERE id = ?", (job.id,))

    def dead_letters(self, owner: str | None) -> list[DeadLetter]:
        if owner is None:
            cursor = self.conn.execute(
                "SELECT job, error, attempts, reason, time FROM nj_dead_letters ORDER BY time"
            )
        else:
            cursor = self.conn.execute(
                "SELECT job, error, attempts, reason, time FROM nj_dead_letters"
                " WHERE owner = ? ORDER BY time",
                (owner,),
            )
        return [_dead_letter(*row) for row in cursor]

    def unbury(self, owner: str, job_id: str) -> DeadLetter | None:
        row = self.conn.execute(
            "SELECT job, error, attempts, reason, time FROM nj_dead_letters"
            " WHERE owner = ? AND id = ?",
            (owner, job_id),
        ).fetchone()
        if row is None:
            return None
        self.conn.execute(
            "DELETE FROM nj_dead_letters WHERE owner = ? AND id = ?", (owner, job_id)
        )
        return _dead_letter(*row)

    # -- per-object state -------------------------------------------------------------
    def meta(self, key: str, default: int = 0) -> int:
        row = self.conn.execute("SELECT value FROM nj_meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else int(row[0])

    def set_meta(self, key: str, value: int) -> None:
        self.conn.execute(
            "INSERT INTO nj_meta (key, value) VALUES (?, ?)"
            " ON CONFLICT DO UPDATE SET value = excluded.value",
            (key, value),
        )


def _create_in_tx(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def _dead_letter(job: str, error: str, attempts: int, reason: str, time: float) -> DeadLetter:
    record = decode_payload(job)
    assert isinstance(record, dict)
    record["payload"] = decode_payload(record["payload"])
    return DeadLetter(
        job=converter.structure(record, Job), error=error, attempts=attempts, reason=reason,
        time=time,
    )


# -- validation of push arguments -------------------------------------------------------
def check_job_id(job_id: object, *, name: str = "id") -> str:
    if not isinstance(job_id, str):
        raise JobError(f"job {name} must be a str, got {type(job_id).__name__}")
    if not job_id.strip():
        raise JobError(f"job {name} must be a non-blank string, got {job_id!r}")
    if len(job_id) > MAX_JOB_ID_LENGTH:
        raise JobError(
            f"job {name} {job_id[:40]!r}... is longer than {MAX_JOB_ID_LENGTH} characters"
        )
    try:
        job_id.encode("utf-8")
    except UnicodeEncodeError:
        raise JobError(f"job {name} {job_id!r} holds a lone surrogate") from None
    return job_id


# Generated ids sort by creation: time in microseconds, a per-process counter and a
# per-process random tag. Jobs mostly complete in push order, so their deletions touch
# neighbouring pages of the id index; random UUIDs touched a new page each (measured:
# a group commit of 64 completions went from ~1 ms to ~0.2 ms).
_ID_TAG: Final = uuid.uuid4().hex[:8]
_id_counter = itertools.count()


def new_job_id(now: float) -> str:
    """A new job id for a push at epoch time ``now``."""
    return f"{int(now * 1e6):014x}{next(_id_counter) & 0xFFFFFF:06x}{_ID_TAG}"


def resolve_time(time: object, delay: object, now: float, *, job: str) -> float:
    if time is not None and delay is not None:
        raise JobError(f"job {job!r}: give time or delay, not both")
    if time is not None:
        try:
            return _clock.coerce_time(time, name=f"job {job!r}: time")
        except (TypeError, ValueError) as exc:
            raise JobError(str(exc)) from None
    if delay is not None:
        try:
            return now + _clock.coerce_delay(delay, name=f"job {job!r}: delay")
        except (TypeError, ValueError) as exc:
            raise JobError(str(exc)) from None
    return now


def check_fn(fn: object) -> str:
    if not isinstance(fn, str) or not fn:
        raise JobError(f"job fn must be a non-empty str, got {fn!r}")
    return fn


def check_hung_timeout(value: object, *, job: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        math.isfinite(value) and value >= 0
    ):
        raise JobError(f"job {job!r}: hung_timeout must be a finite number >= 0, got {value!r}")
    return float(value)


def check_retry(retry: object, *, job: str) -> RetryOptions:
    if retry is None:
        return DEFAULT_RETRY
    if not isinstance(retry, RetryOptions):
        raise JobError(f"job {job!r}: retry must be RetryOptions, got {retry!r}")
    return retry


def coerce_outcome(outcome: object) -> JobOutcome:
    """Return a valid outcome or raise ``JobError`` naming what was returned."""
    if outcome is None or outcome is YIELD or isinstance(outcome, Reschedule):
        return outcome
    raise JobError(f"invalid job outcome {outcome!r}: return None, nj.Reschedule(time) or nj.YIELD")


class Jobs:
    """``lifecycle.jobs``: push, cancel, reschedule and read the jobs of one owner."""

    __slots__ = ("_lifecycle", "owner")

    def __init__(self, lifecycle: Lifecycle, owner: str) -> None:
        self._lifecycle = lifecycle
        self.owner = owner

    async def push(
        self,
        fn: str,
        *,
        time: float | datetime.datetime | None = None,
        delay: float | datetime.timedelta | None = None,
        payload: Any = None,
        id: str | None = None,
        retry: RetryOptions | None = None,
        singleflight: bool = False,
        hung_timeout: float = 30.0,
        exclusive: bool = False,
        recovery_loop: bool = False,
    ) -> Job:
        """Store a job; durable (committed, alarm lowered) when it returns.

        Pushing an id this owner already holds replaces that job in place. Checkpoints,
        except inside ``storage.transaction()``, where it must not let other tasks in.

        Raises:
            JobOwnershipError: another owner holds ``id``.
            JobError: a bad argument (nothing is written).
            CodecError: a payload that cannot be stored (nothing is written).
        """
        return await self._lifecycle._push(
            self.owner, fn, time=time, delay=delay, payload=payload, id=id, retry=retry,
            singleflight=singleflight, hung_timeout=hung_timeout, exclusive=exclusive,
            recovery_loop=recovery_loop,
        )

    async def cancel(self, id: str) -> bool:
        """Delete this owner's job ``id``; return whether it existed. Checkpoints."""
        return await self._lifecycle._cancel(self.owner, id)

    async def reschedule(self, id: str, time: float | datetime.datetime) -> bool:
        """Move this owner's job ``id`` to ``time``; return whether it existed."""
        return await self._lifecycle._reschedule(self.owner, id, time)

    def get(self, id: str) -> Job | None:
        """Return this owner's job ``id``, or None. Does not checkpoint."""
        self._lifecycle._flush()
        row = self._lifecycle.table.row(check_job_id(id))
        return None if row is None or row.job.owner != self.owner else row.job

    def list(self) -> list[Job]:
        """Return this owner's jobs by due time (then push order)."""
        self._lifecycle._flush()
        return [row.job for row in self._lifecycle.table.rows(self.owner)]

    async def rearm(self) -> None:
        """Set the object's alarm from the queue as it stands. Checkpoints."""
        await self._lifecycle.rearm_alarm()


def ownership_error(owner: str, holder: str, job_id: str) -> JobOwnershipError:
    return JobOwnershipError(
        f"job id {job_id!r} already belongs to {holder!r}; {owner!r} cannot push, replace"
        " or cancel it (job ids are scoped to their owner)"
    )

