"""The SQL of ``nj_jobs`` and ``nj_dead_letters``: rows in, rows out.

Only ``JobStore`` (``_job_store``) calls these writes; everything else asks the store.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
from collections.abc import Iterable
from typing import Any, Final

import attrs

from nursery_jobs._codec import decode_payload, encode_payload
from nursery_jobs._converter import converter
from nursery_jobs._errors import DamagedJobError, describe_error, safe_repr
from nursery_jobs._jobs._records import DeadLetter, Job, checked_job
from nursery_jobs._policy import DEFAULT_RETRY, RetryOptions

_COLUMNS = (
    "seq, id, owner, fn, time, payload, max_attempts, base_delay, max_delay, jitter, singleflight,"
    " hung_timeout, exclusive, recovery_loop, created_at, attempts, running_since, crash_strikes,"
    " priority, timeout, give_up_on"
)
# Run order among due jobs: higher priority first, then due time, then push sequence.
_ORDER = "priority DESC, time, seq"
# The statements of the dispatch path, named: the benchmark's floor runs the same text.
UPSERT: Final = (
    "INSERT INTO nj_jobs (id, owner, fn, time, payload, max_attempts, base_delay,"
    " max_delay, jitter, singleflight, hung_timeout, exclusive, recovery_loop,"
    " created_at, priority, timeout, give_up_on, trace)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET fn = excluded.fn, time = excluded.time,"
    " payload = excluded.payload, max_attempts = excluded.max_attempts,"
    " base_delay = excluded.base_delay, max_delay = excluded.max_delay,"
    " jitter = excluded.jitter,"
    " singleflight = excluded.singleflight, hung_timeout = excluded.hung_timeout,"
    " exclusive = excluded.exclusive, recovery_loop = excluded.recovery_loop,"
    " priority = excluded.priority, timeout = excluded.timeout,"
    " give_up_on = excluded.give_up_on, trace = excluded.trace, attempts = 0,"
    " crash_strikes = 0"
    " WHERE owner = excluded.owner"
)
# Due rows after a (time, seq) cursor when no job has a priority (the usual case).
DUE: Final = (
    f"SELECT {_COLUMNS} FROM nj_jobs WHERE time <= ? AND (time, seq) > (?, ?)"
    " ORDER BY time, seq LIMIT ?"
)
Cursor = tuple[int, float, int]  # (-priority, time, seq) of the last row an alarm run read
# The ``nj_meta`` rows of a pause: the whole object, or one owner (the key's tail).
PAUSED_ALL: Final = "paused"
PAUSED_PREFIX: Final = "paused:"
# Due rows an alarm run counts for its backlog warning, at most (``due_counts``).
BACKLOG_WINDOW: Final = 10_000
KEEP_ATTEMPTS: Final = 5  # failed attempts kept per job
_MAX_STAGED = 512  # staged deletes run at once past this many (SQLite's variable limit)


@functools.lru_cache(maxsize=16)
def finished_delete(n: int) -> str:
    """The statement that deletes ``n`` finished jobs by push sequence."""
    return f"DELETE FROM nj_jobs WHERE seq IN ({','.join('?' * n)})"


_ANY_PRIORITY: Final = "SELECT 1 FROM nj_jobs WHERE priority != 0 LIMIT 1"
# Dead letters oldest first: in the order they were buried (``seq``, on the index
# ``nj_dead_letters_burial``). Letters buried at one time (one alarm run, a seal) tie on
# ``time``: ordered by it alone, they fell back to (owner, id), and the bound could drop
# the newest of them (semantics review, findings 5 and 6). Letters buried before schema
# 4 have no ``seq`` (NULL, first) and keep their order by time; (owner, id) only orders
# those of them that share a time.
_BURIAL_ORDER: Final = "seq, time, owner, id"
# A new letter's place: after every other (one probe of the index's end).
_INSERT_LETTER: Final = (
    "INSERT OR REPLACE INTO nj_dead_letters (owner, id, job, error, attempts, reason, time,"
    " seq) VALUES (?, ?, ?, ?, ?, ?, ?,"
    " (SELECT COALESCE(MAX(seq), 0) + 1 FROM nj_dead_letters))"
)
_AFTER_ZERO: Final[Cursor] = (0, math.inf, 2**63 - 1)  # after every row of priority 0


@functools.lru_cache(maxsize=64)
def _due_of_zero(held: str, *, zero_only: bool) -> str:
    """Due rows of priority 0 after a (time, seq) cursor, on the due index (``DUE`` with
    the clause of paused owners, and with ``priority = 0`` where others exist)."""
    zero = " AND priority = 0" if zero_only else ""
    return (f"SELECT {_COLUMNS} FROM nj_jobs WHERE time <= ? AND (time, seq) > (?, ?)"
            f"{zero}{held} ORDER BY time, seq LIMIT ?")


@functools.lru_cache(maxsize=64)
def _prioritized(held: str, sign: str) -> str:
    """Due rows of priority above (``sign`` ">") or below ("<") 0 after a cursor, in run
    order, on the partial index ``nj_jobs_priority`` (its ``priority != 0`` spelled out:
    SQLite uses a partial index only for a query whose WHERE names its condition)."""
    return (f"SELECT {_COLUMNS} FROM nj_jobs WHERE priority != 0 AND priority {sign} 0"
            f" AND time <= ? AND (-priority, time, seq) > (?, ?, ?){held}"
            f" ORDER BY {_ORDER} LIMIT ?")


# When the earliest pending exclusive job lets its object wake (``JobTable.exclusive_time``):
# its due time; for a single-flight one whose earlier run's tracked work is in progress,
# not before ``running_since + hung_timeout`` (as any in-flight single-flight job counts;
# unclamped, a due one re-fired the alarm at once, was skipped as in flight, re-armed the
# same past time, and spun until the work ended). The work's end re-arms it (its marker
# is cleared). On the partial index ``nj_jobs_exclusive``; the alarm time and the alarm
# run's rule (``AlarmRunner._run_due``) read the same expression.
_EXCLUSIVE_TIME: Final = (
    "SELECT MIN(CASE WHEN singleflight = 1 AND running_since IS NOT NULL"
    " THEN MAX(time, running_since + hung_timeout) ELSE time END)"
    " FROM nj_jobs WHERE exclusive = 1"
)


@functools.lru_cache(maxsize=64)
def _facts(held: str) -> str:
    """What an alarm run asks of the queue before and after its jobs, in one statement
    (``JobTable.facts``): the three times of ``next_alarm_time``, the earliest job's
    time (``has_due``), whether any job has a priority (``next_due``) or a running
    marker (``running``) — each subquery on an index of its own."""
    where = f" WHERE 1{held}" if held else ""
    return (f"SELECT ({_EXCLUSIVE_TIME}{held}),"
            " (SELECT time FROM nj_jobs WHERE (singleflight = 0 OR running_since IS NULL)"
            f"{held} ORDER BY time LIMIT 1),"
            " (SELECT MIN(MAX(time, running_since + hung_timeout)) FROM nj_jobs"
            f" WHERE running_since IS NOT NULL AND singleflight = 1{held}),"
            f" (SELECT time FROM nj_jobs{where} ORDER BY time LIMIT 1),"
            " EXISTS (SELECT 1 FROM nj_jobs WHERE priority != 0),"
            " EXISTS (SELECT 1 FROM nj_jobs WHERE running_since IS NOT NULL)")


# What ``_facts`` returns: (exclusive, ready, in flight) times, the earliest time, and
# whether a priority / a running marker exists.
Facts = tuple[float | None, float | None, float | None, float | None, int, int]


def _rollbacks(conn: sqlite3.Connection) -> int:
    """How many transactions of ``conn`` a fault rolled back (``GuardedConnection``; a
    working copy in memory has none)."""
    return getattr(conn, "rollbacks", 0)


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
        """The job of a row of ``nj_jobs``; ``DamagedJobError`` naming it if the row does
        not read back (changed outside nursery_jobs). (A ``try`` costs nothing here
        until it catches.)"""
        try:
            (seq, id, owner, fn, time, payload, max_attempts, base_delay, max_delay, jitter,
             singleflight, hung_timeout, exclusive, recovery_loop, created_at, attempts,
             running_since, crash_strikes, priority, timeout, give_up_on) = row
            if (max_attempts == 3 and base_delay == 0.1 and max_delay == 3.0 and jitter == 1
                    and give_up_on is None):
                retry = DEFAULT_RETRY  # (the default's fields, compared without a tuple)
            else:
                retry = RetryOptions(
                    max_attempts=max_attempts, base_delay=base_delay, max_delay=max_delay,
                    jitter=bool(jitter),
                    give_up_on=() if give_up_on is None else json.loads(give_up_on))
            # A row of our own table was checked when it was pushed (1.2 µs -> 0.5 µs, ~5%
            # of dispatch). Flags are stored as 0/1: ``!= 0`` is ``bool()`` without a call.
            job = checked_job(id, owner, fn, time, decode_payload(payload), retry,
                              singleflight != 0, hung_timeout, exclusive != 0,
                              recovery_loop != 0, created_at, priority, timeout)
            # Built without attrs' __init__ (every due row is read here: 1.24 -> 1.05 µs a
            # row with the lines above, best of 15).
            job_row = _new_row(cls)
            job_row.seq, job_row.job, job_row.attempts = seq, job, attempts
            job_row.running_since, job_row.crash_strikes = running_since, crash_strikes
            return job_row
        except Exception as exc:
            raise damaged_row(row, exc) from None


_new_row = object.__new__


def damaged_row(row: tuple[Any, ...], error: BaseException) -> DamagedJobError:
    """The error of a job row (``_COLUMNS``) that does not read back."""
    job_id, owner = _text(row[1]), _text(row[2])
    return DamagedJobError(
        f"job {job_id!r} (owner {owner!r}): its stored row does not read back:"
        f" {describe_error(error, 500)}", job_id, owner)


def _text(value: object) -> str:
    return value if isinstance(value, str) else safe_repr(value, 100)


# ``JobTable._meta`` of a table that has not read anything yet.
_UNREAD: Final[tuple[int, dict[str, Any]]] = (-1, {})


class JobTable:
    """SQL on ``nj_jobs`` and ``nj_dead_letters``; every method is synchronous.

    The deletes of finished jobs are staged and run as one statement (``settle``) before
    any other statement of the table, and before the group transaction they belong to
    reaches a user block's savepoint or a commit (``ObjectTransactions``). A ``DELETE``
    per job was a quarter of the dispatch time (issue 14); one ``DELETE ... IN`` per group
    costs about a third less per row, and staging costs a list append. A running job's
    savepoint does not settle them (it did: a job that writes paid a ``DELETE`` of the
    previous job's row); deletes run under it are staged again if it rolls back.
    """

    __slots__ = ("_conn", "_facts", "_facts_at", "_finished", "_held", "_held_args",
                 "_in_savepoint", "_meta", "_staged_at", "all_held", "damaged", "label",
                 "remembers")

    def __init__(self, conn: sqlite3.Connection, label: str = "") -> None:
        self._conn = conn  # the schema is the engine's (``_schema.prepare``)
        self.label = label  # ``ns/id``: a damaged row's error names its object
        # Rows the alarm's reads (``next_due``, ``running``) set aside because they do
        # not read back: (push sequence, row, error), for the store to bury.
        self.damaged: list[tuple[int, tuple[Any, ...], DamagedJobError]] = []
        self._finished: list[int] = []  # push sequences of finished jobs, not yet deleted
        self._staged_at = 0  # the connection's ``rollbacks`` when the first was staged
        # While a job's savepoint is open: the deletes run under it (a rollback of the
        # savepoint undoes them, so they are staged again).
        self._in_savepoint: list[int] | None = None
        # Paused owners (``hold``): their rows are left out of the due query and the
        # alarm time. Empty (the usual case): the plain statements, no extra clause.
        self._held = ""
        self._held_args: tuple[str, ...] = ()
        self.all_held = False
        # While an alarm run is in progress (``remembers``, set by it): the queue's facts
        # (``facts``) as last read outside a transaction, and the connection's
        # ``total_changes`` then. Nothing changes a row without counting a change, and a
        # rollback can only undo changes made after them (they were read with no
        # transaction open): while the count stands, they stand. An alarm run asks for
        # them five times — its fallback alarm, its startup's re-arm, its backup alarm,
        # the due read's priority check, the startup's running markers — with nothing
        # written in between when its object was cold (four statements of each cold
        # fire). Only during a run: a dormant object's reopened connection counts from
        # zero again, and an object dozes only when idle.
        self.remembers = False
        self._facts: Facts | None = None
        self._facts_at = 0
        # ``nj_meta`` as the first read of a new table found it (``meta``), while nothing
        # else was read or written since: its store reads the alarms' switch and the
        # pauses, its breaker the strikes, one statement for the three.
        self._meta: tuple[int, dict[str, Any]] | None = _UNREAD

    def hold(self, owners: frozenset[str | None]) -> None:
        """Leave the jobs of ``owners`` (every job, with None among them) out of what
        is due and of the alarm time, until the next ``hold``."""
        self.all_held = None in owners
        named = tuple(sorted(o for o in owners if o is not None))
        self._held_args = named
        self._held = f" AND owner NOT IN ({','.join('?' * len(named))})" if named else ""
        self._facts = None  # (they leave out the jobs of paused owners)

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection, with the staged deletes run: every read sees them."""
        self._meta = None
        if self._finished:
            self.settle()
        return self._conn

    def forget_facts(self) -> None:
        """The alarm run is over: nothing read during it is remembered after it."""
        self.remembers = False
        self._facts = None

    def facts(self) -> Facts:
        """The queue's facts (``_facts``): remembered while an alarm run is in progress
        and no change was made since they were read."""
        conn = self.conn
        if self._facts is not None and self._facts_at == conn.total_changes:
            return self._facts
        held = self._held
        facts: Facts = conn.execute(_facts(held), self._held_args * 4).fetchone()
        if self.remembers and not conn.in_transaction:
            self._facts, self._facts_at = facts, conn.total_changes
        return facts

    # -- staged deletes (the ``StagedWrites`` of ``_transactions``) ----------------------
    def settle(self) -> None:
        """Run the staged deletes now, in the group transaction they belong to. With no
        transaction open that group is gone (it commits only after a settle, so it was
        rolled back), and its deletes with it: the jobs run again."""
        seqs, self._finished = self._finished, []
        if not seqs or not self._conn.in_transaction or _rollbacks(self._conn) != self._staged_at:
            return  # (the transaction open now, if any, is another one)
        # Padded (repeating the last) to a power of two: a few statement texts, not one
        # per count, in the connection's statement cache.
        size = 1 << (len(seqs) - 1).bit_length()
        padded = seqs + seqs[-1:] * (size - len(seqs))
        try:
            self._conn.execute(finished_delete(size), padded)
        except BaseException:
            if self._conn.in_transaction:
                self._finished = seqs + self._finished  # the group stands: try again later
            raise
        if self._in_savepoint is not None:
            self._in_savepoint += seqs

    def enter_savepoint(self) -> None:
        """A job's savepoint opens: what is staged stays staged (a job that writes no
        longer costs a ``DELETE`` of its own: issue 14), and deletes run under the
        savepoint are remembered."""
        self._in_savepoint = []

    def leave_savepoint(self, *, undone: bool) -> None:
        """The job's savepoint ends: released (its deletes stand, in the group) or rolled
        back (``undone``: its deletes were undone with it; they are staged again)."""
        ran, self._in_savepoint = self._in_savepoint, None
        if undone and ran:
            if not self._finished:
                self._staged_at = _rollbacks(self._conn)
            self._finished = ran + self._finished

    def drop_staged(self) -> None:
        """The group transaction is gone (rolled back): so are its staged deletes."""
        self._finished = []
        self._in_savepoint = None

    def release(self, stand_in: sqlite3.Connection) -> None:
        """The object left memory: hold ``stand_in`` in place of its connection."""
        self._conn = stand_in
        self._facts = self._meta = None

    # -- reads ----------------------------------------------------------------------
    def owner_of(self, job_id: str) -> str | None:
        row = self.conn.execute("SELECT owner FROM nj_jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else str(row[0])

    def row(self, job_id: str) -> JobRow | None:
        row = self.conn.execute(
            f"SELECT {_COLUMNS} FROM nj_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        return None if row is None else self._read([row])[0]

    def rows(self, owner: str | None = None) -> list[JobRow]:
        """The jobs (of ``owner``; every owner's with None) by due time, then push order
        (``jobs.list()``, DESIGN 3; run order puts priority first)."""
        if owner is None:
            cursor = self.conn.execute(f"SELECT {_COLUMNS} FROM nj_jobs ORDER BY time, seq")
        else:
            cursor = self.conn.execute(
                f"SELECT {_COLUMNS} FROM nj_jobs WHERE owner = ? ORDER BY time, seq", (owner,)
            )
        return self._read(cursor)

    def named(self, owners: tuple[str, ...], job_id: str | None,
              fn: str | None) -> list[tuple[str, str, str]]:
        """(owner, id, fn) of the job ``job_id`` (every job: None) of ``owners`` if its
        fn is ``fn`` (any: None), in push order. No row parsed: a damaged one is named
        too."""
        if job_id is not None:
            rows = self.conn.execute(
                "SELECT owner, id, fn FROM nj_jobs WHERE id = ?", (job_id,))
        else:
            rows = self.conn.execute(
                f"SELECT owner, id, fn FROM nj_jobs WHERE owner IN"
                f" ({','.join('?' * len(owners))}) ORDER BY seq", owners)
        return [(owner, found, _text(its_fn)) for owner, found, its_fn in rows
                if owner in owners and (fn is None or its_fn == fn)]

    def job_ids(self) -> list[str]:
        """The id of every job (no row parsed: a damaged one is listed too)."""
        return [str(row[0]) for row in self.conn.execute("SELECT id FROM nj_jobs")]

    def _read(self, rows: Iterable[tuple[Any, ...]]) -> list[JobRow]:
        """The jobs of ``rows``, or the ``DamagedJobError`` of the first that does not
        read back, naming its object."""
        try:
            return [JobRow.from_sql(r) for r in rows]
        except DamagedJobError as exc:
            raise DamagedJobError(f"{self.label}: {exc}", exc.job_id, exc.owner,
                                  self.label) from None

    def _due(self, rows: list[tuple[Any, ...]]) -> list[JobRow]:
        """The jobs of ``rows`` that read back; those that do not are set aside
        (``damaged``): a row's fault is its job's, and the other jobs run."""
        try:
            return [JobRow.from_sql(r) for r in rows]  # (the usual case: one pass)
        except DamagedJobError:
            pass
        jobs = []
        for row in rows:
            try:
                jobs.append(JobRow.from_sql(row))
            except DamagedJobError as exc:
                self.damaged.append((row[0], row, DamagedJobError(
                    f"{self.label}: {exc}", exc.job_id, exc.owner, self.label)))
        return jobs

    def next_due(self, now: float, after: Cursor, limit: int = 1) -> list[JobRow]:
        """The first ``limit`` jobs due at ``now`` that come after ``after`` in run order."""
        if self.all_held:
            return []
        conn, held, args = self.conn, self._held, self._held_args
        if not (self.facts()[4] if self.remembers
                else conn.execute(_ANY_PRIORITY).fetchone() is not None):
            # No priorities (the usual case): (time, seq) on the due index, no sort.
            # (A cursor left in another priority: everything at 0 is after or before it.)
            if after[0] > 0:
                return []
            if after[0] < 0:
                after = (0, -math.inf, -1)
            sql = DUE if not held else _due_of_zero(held, zero_only=False)
            return self._due(conn.execute(sql, (now, after[1], after[2], *args, limit))
                             .fetchall())
        # Some priorities: run order in three parts, each read on an index in its own
        # order — priority > 0 and < 0 on the partial ``nj_jobs_priority``, priority 0
        # on ``nj_jobs_due``. One query ordered by (priority, time, seq) over all of them
        # read and sorted every due row for each batch of 64 (134 ms at 200k due, one of
        # them prioritized: issue 26).
        rows: list[JobRow] = []
        if after[0] < 0:
            rows += self._due_part(_prioritized(held, ">"), now, after, limit)
        if after[0] <= 0 and len(rows) < limit:
            start = after[1:] if after[0] == 0 else (-math.inf, -1)
            rows += self._due(conn.execute(
                _due_of_zero(held, zero_only=True),
                (now, *start, *args, limit - len(rows))).fetchall())
        if len(rows) < limit:
            rows += self._due_part(_prioritized(held, "<"), now,
                                   after if after[0] > 0 else _AFTER_ZERO, limit - len(rows))
        return rows

    def _due_part(self, sql: str, now: float, after: Cursor, limit: int) -> list[JobRow]:
        return self._due(self.conn.execute(
            sql, (now, *after, *self._held_args, limit)).fetchall())

    def trace(self, seq: int) -> str | None:
        """The pushing span's context stored with job ``seq`` (tracing on). Read apart
        from the due rows, so dispatch with tracing off reads no extra column; on the
        raw connection, since staged deletes are of other (finished) jobs."""
        row = self._conn.execute("SELECT trace FROM nj_jobs WHERE seq = ?", (seq,)).fetchone()
        return None if row is None or not isinstance(row[0], str) else row[0]

    def due_counts(self, now: float, window: int = BACKLOG_WINDOW) -> list[tuple[str, int]]:
        """Due jobs per owner among the first ``window`` due jobs by time: exact while
        no more are due. Counting them all read every due row at each alarm run's start
        (309 ms with 1,000,000 due: the first 20k jobs of such a queue ran at a fifth of
        the rate of a queue 20k deep, issue 26); the window bounds it (~3 ms)."""
        if self.all_held:
            return []
        return self.conn.execute(
            f"SELECT owner, COUNT(*) FROM (SELECT owner FROM nj_jobs WHERE time <= ?"
            f"{self._held} ORDER BY time LIMIT ?) GROUP BY owner",
            (now, *self._held_args, window),
        ).fetchall()

    def has_due(self, now: float) -> bool:
        if self.all_held:
            return False
        if self.remembers:
            earliest = self.facts()[3]
            return earliest is not None and earliest <= now
        return self.conn.execute(
            f"SELECT 1 FROM nj_jobs WHERE time <= ?{self._held} LIMIT 1", (now, *self._held_args)
        ).fetchone() is not None

    def running(self) -> list[JobRow]:
        if self.remembers and not self.facts()[5]:
            return []  # (no running marker: no statement)
        cursor = self.conn.execute(
            f"SELECT {_COLUMNS} FROM nj_jobs WHERE running_since IS NOT NULL ORDER BY {_ORDER}"
        )
        return self._due(cursor.fetchall())

    def untimed(self) -> None:
        """Set aside (``damaged``) every row whose time is no number (text or a blob:
        SQLite keeps what an outside writer put in a REAL column). SQLite orders every
        number before any text or blob, so ``time >= ''`` is a range of the time index:
        one probe."""
        for row in self.conn.execute(f"SELECT {_COLUMNS} FROM nj_jobs WHERE time >= ''"):
            error = damaged_row(row, TypeError(f"its time {row[4]!r} is no number"))
            self.damaged.append((row[0], row, DamagedJobError(
                f"{self.label}: {error}", error.job_id, error.owner, self.label)))

    def bury_damaged(self, seq: int, row: tuple[Any, ...], error: str, now: float) -> None:
        """Move a row that does not read back into the dead letters (reason
        ``"damaged"``): the letter keeps its id, owner and fn, and ``error`` says what
        did not read back (the payload is not kept: it did not decode)."""
        _seq, job_id, owner, fn, time = row[:5]
        letter = Job(id=_text(job_id), owner=_text(owner), fn=_text(fn),
                     time=time if isinstance(time, float) else now, payload=None,
                     retry=DEFAULT_RETRY, singleflight=False, hung_timeout=0.0,
                     exclusive=False, recovery_loop=False, created_at=now)
        record = converter.unstructure(letter)
        self.conn.execute(
            _INSERT_LETTER,
            (letter.owner, letter.id, encode_payload(record), error,
             row[15] if isinstance(row[15], int) else 0, "damaged", now),
        )
        self.conn.execute("DELETE FROM nj_jobs WHERE seq = ?", (seq,))

    def first_exclusive_time(self, excluding: str | None = None) -> float | None:
        """The earliest exclusive job's time (leaving out job ``excluding``, and the jobs
        of paused owners)."""
        if self.all_held:
            return None
        row = self.conn.execute(
            f"SELECT MIN(time) FROM nj_jobs WHERE exclusive = 1 AND id IS NOT ?{self._held}",
            (excluding, *self._held_args),
        ).fetchone()
        return None if row[0] is None else float(row[0])

    def exclusive_time(self) -> float | None:
        """When the earliest pending exclusive job lets the object wake (``_EXCLUSIVE_TIME``;
        the jobs of paused owners left out), or None if no such job is pending."""
        if self.all_held:
            return None
        if self.remembers:
            time = self.facts()[0]
        else:
            (time,) = self.conn.execute(f"{_EXCLUSIVE_TIME}{self._held}",
                                        self._held_args).fetchone()
        return None if time is None else float(time)

    def next_alarm_time(self, now: float) -> float | None:
        """When the object must wake: the earliest exclusive job if any (``exclusive_time``);
        else the earliest runnable job. Either way an in-flight single-flight job counts
        from ``running_since + hung_timeout``. The jobs of paused owners do not count."""
        if self.all_held:
            return None
        if self.remembers:
            exclusive, ready, in_flight = self.facts()[:3]
            return _alarm_time(exclusive, ready, in_flight)
        # The three times in one statement, each subquery on its own index: an alarm
        # run asks twice (its fallback alarm, its re-arm), and three statements were
        # six executes of every run.
        held, args = self._held, self._held_args
        exclusive, ready, in_flight = self.conn.execute(
            f"SELECT ({_EXCLUSIVE_TIME}{held}),"
            " (SELECT time FROM nj_jobs WHERE (singleflight = 0 OR running_since IS NULL)"
            f"{held} ORDER BY time LIMIT 1),"
            " (SELECT MIN(MAX(time, running_since + hung_timeout)) FROM nj_jobs"
            f" WHERE running_since IS NOT NULL AND singleflight = 1{held})",
            args * 3,
        ).fetchone()
        return _alarm_time(exclusive, ready, in_flight)

    # -- writes ---------------------------------------------------------------------
    def upsert(self, job: Job, payload_text: str | None, trace: str | None = None) -> None:
        """Insert ``job``, or replace the same owner's job of that id in place (it keeps
        its push sequence and creation time; attempts and strikes reset, the running
        marker kept: the replaced job's tracked work goes on, and single-flight holds
        the new one until it ends).
        ``trace``: the pushing span's context (tracing on), the newest push's wins."""
        retry = job.retry
        self.conn.execute(
            UPSERT,
            (job.id, job.owner, job.fn, job.time, payload_text, retry.max_attempts,
             retry.base_delay, retry.max_delay, retry.jitter, job.singleflight, job.hung_timeout,
             job.exclusive, job.recovery_loop, job.created_at, job.priority, job.timeout,
             json.dumps(retry.give_up_on) if retry.give_up_on else None, trace),
        )

    def delete(self, owner: str, job_id: str) -> bool:
        cursor = self.conn.execute(
            "DELETE FROM nj_jobs WHERE id = ? AND owner = ?", (job_id, owner)
        )
        return cursor.rowcount > 0

    def retime(self, owner: str, job_id: str, time: float) -> bool:
        """Move the job to ``time`` (its running marker kept, as in ``upsert``)."""
        cursor = self.conn.execute(
            "UPDATE nj_jobs SET time = ? WHERE id = ? AND owner = ?",
            (time, job_id, owner),
        )
        return cursor.rowcount > 0

    # The outcome of one clean run (applied in the group transaction, see JobStore).
    def finished(self, seq: int) -> None:
        """Delete the job of push sequence ``seq`` (staged until the next statement)."""
        finished = self._finished
        if not finished:
            self._staged_at = _rollbacks(self._conn)
        finished.append(seq)
        if len(finished) >= _MAX_STAGED:
            self.settle()

    def later(self, seq: int, time: float, marker: float | None) -> None:
        """Re-time a kept job, attempts and strikes cleared, its running marker
        ``marker`` (when its tracked work in progress started, or None)."""
        self.conn.execute(
            "UPDATE nj_jobs SET time = ?, attempts = 0, crash_strikes = 0,"
            " running_since = ? WHERE seq = ?",
            (time, marker, seq),
        )

    def clean(self, job_id: str) -> None:
        """A clean run superseded by a change of its job: clear the attempts only."""
        self.conn.execute(
            "UPDATE nj_jobs SET attempts = 0, crash_strikes = 0 WHERE id = ?"
            " AND (attempts != 0 OR crash_strikes != 0)",
            (job_id,),
        )

    def retry_later(self, job_id: str, time: float, attempts: int, marker: float | None) -> None:
        """A failed attempt with attempts left: re-time it, record the attempt, and set
        its running marker to ``marker`` (as ``later``: the failed run's own marker was
        rolled back with its writes, its work was not)."""
        self.conn.execute(
            "UPDATE nj_jobs SET time = ?, attempts = ?, running_since = ? WHERE id = ?",
            (time, attempts, marker, job_id),
        )

    def set_marker(self, job_id: str, started: float) -> None:
        """Record that work of the job (tracked alarm work) is in progress."""
        self.conn.execute(
            "UPDATE nj_jobs SET running_since = ? WHERE id = ?", (started, job_id)
        )

    def clear_marker(self, job_id: str, started: float, rest: float | None = None) -> bool:
        """The job's work that started at ``started`` ended: if that is its marker, set
        it to ``rest`` (work of it that goes on; None: no marker)."""
        cursor = self.conn.execute(
            "UPDATE nj_jobs SET running_since = ? WHERE id = ? AND running_since = ?",
            (rest, job_id, started),
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

    # -- failed attempts (the last KEEP_ATTEMPTS of a job or a dead letter) -----------
    def record_attempt(self, owner: str, job_id: str, attempt: int, started: float,
                       seconds: float, error: str) -> None:
        """Keep failed attempt ``attempt`` of a job, and only the last few of it."""
        self.conn.execute(
            "INSERT OR REPLACE INTO nj_attempts (owner, id, attempt, started, seconds, error)"
            " VALUES (?, ?, ?, ?, ?, ?)", (owner, job_id, attempt, started, seconds, error),
        )
        if attempt > KEEP_ATTEMPTS:
            self.conn.execute(
                "DELETE FROM nj_attempts WHERE owner = ? AND id = ? AND attempt <= ?",
                (owner, job_id, attempt - KEEP_ATTEMPTS),
            )

    def forget_attempts(self, owner: str, job_id: str) -> None:
        self.conn.execute("DELETE FROM nj_attempts WHERE owner = ? AND id = ?",
                          (owner, job_id))

    def forget_orphan_attempts(self) -> None:
        """Forget the attempts of jobs that are neither queued nor dead letters."""
        self.conn.execute(
            "DELETE FROM nj_attempts AS a WHERE NOT EXISTS (SELECT 1 FROM nj_jobs j"
            " WHERE j.owner = a.owner AND j.id = a.id) AND NOT EXISTS (SELECT 1 FROM"
            " nj_dead_letters d WHERE d.owner = a.owner AND d.id = a.id)"
        )

    # -- dead letters ---------------------------------------------------------------
    def bury(self, row: JobRow, error: str, reason: str, now: float, *, attempts: int) -> None:
        """Move a job into the dead letters (replacing an older letter of its id). Only
        ``JobStore._burying`` buries (the bound is kept there)."""
        job = row.job
        record = converter.unstructure(attrs.evolve(job, payload=None))
        record["payload"] = encode_payload(job.payload)
        self.conn.execute(
            _INSERT_LETTER,
            (job.owner, job.id, encode_payload(record), error, attempts, reason, now),
        )
        self.conn.execute("DELETE FROM nj_jobs WHERE id = ?", (job.id,))

    def dead_letters(self, owner: str | None) -> list[DeadLetter]:
        """The dead letters (of ``owner``; every owner's with None), oldest first."""
        if owner is None:
            cursor = self.conn.execute(
                "SELECT job, error, attempts, reason, time FROM nj_dead_letters"
                f" ORDER BY {_BURIAL_ORDER}"
            )
        else:
            cursor = self.conn.execute(
                "SELECT job, error, attempts, reason, time FROM nj_dead_letters"
                f" WHERE owner = ? ORDER BY {_BURIAL_ORDER}",
                (owner,),
            )
        return [_dead_letter(*row) for row in cursor]

    def discard(self, owner: str | None, job_id: str) -> bool:
        cursor = self.conn.execute(
            "DELETE FROM nj_dead_letters WHERE id = ? AND (owner = ? OR ? IS NULL)",
            (job_id, owner, owner),
        )
        return cursor.rowcount > 0

    def discard_before(self, owner: str | None, before: float | None) -> int:
        cursor = self.conn.execute(
            "DELETE FROM nj_dead_letters WHERE (owner = ? OR ? IS NULL)"
            " AND (time < ? OR ? IS NULL)",
            (owner, owner, before, before),
        )
        return cursor.rowcount

    def drop_oldest_dead_letters(self, keep: int) -> list[tuple[str, str]]:
        """Delete the oldest dead letters beyond ``keep``; return their (owner, id)."""
        (count,) = self.conn.execute("SELECT COUNT(*) FROM nj_dead_letters").fetchone()
        if count <= keep:
            return []
        oldest = self.conn.execute(
            f"SELECT owner, id FROM nj_dead_letters ORDER BY {_BURIAL_ORDER} LIMIT ?",
            (count - keep,)
        ).fetchall()
        self.conn.executemany("DELETE FROM nj_dead_letters WHERE owner = ? AND id = ?", oldest)
        return [(str(owner), str(job_id)) for owner, job_id in oldest]

    def dead_letter(self, owner: str, job_id: str) -> DeadLetter | None:
        row = self.conn.execute(
            "SELECT job, error, attempts, reason, time FROM nj_dead_letters"
            " WHERE owner = ? AND id = ?",
            (owner, job_id),
        ).fetchone()
        return None if row is None else _dead_letter(*row)

    def unbury(self, owner: str, job_id: str) -> None:
        """Delete dead letter ``job_id`` of ``owner`` (it goes back into the queue)."""
        self.conn.execute(
            "DELETE FROM nj_dead_letters WHERE owner = ? AND id = ?", (owner, job_id)
        )

    # -- per-object state -------------------------------------------------------------
    def meta(self, key: str, default: int = 0) -> int:
        rows = self._meta_rows()
        if rows is not None:
            value = rows.get(key)
            return default if value is None else int(value)
        row = self.conn.execute("SELECT value FROM nj_meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else int(row[0])

    def _meta_rows(self) -> dict[str, Any] | None:
        """``nj_meta`` as the first read of this table found it, while no other read or
        write of the table came since (``conn`` forgets it) and nothing changed. The
        first ``meta`` of a new table reads every row (a few: the pauses, two
        counters); the reads that follow it at once — the store's pauses, the breaker's
        strikes — are answered from them (two statements of each activation)."""
        meta, conn = self._meta, self._conn
        if meta is _UNREAD:
            self._meta = None
            if self._finished or conn.in_transaction:
                return None
            rows = {key: value for key, value in conn.execute("SELECT key, value FROM nj_meta")
                    if isinstance(key, str)}
            self._meta = (conn.total_changes, rows)
            return rows
        if meta is not None:
            if meta[0] == conn.total_changes:
                return meta[1]
            self._meta = None
        return None

    def first_meta(self, key: str, default: int = 0) -> int | None:
        """``meta(key)`` if the rows of the first reads answer it, else None (no
        statement). The first reads end here: ``nj_meta`` is read again after this."""
        rows = None if self._meta is None or self._meta is _UNREAD else self._meta_rows()
        self._meta = None
        if rows is None:
            return None
        value = rows.get(key)
        return default if value is None else int(value)

    def set_meta(self, key: str, value: int) -> None:
        self.conn.execute(
            "INSERT INTO nj_meta (key, value) VALUES (?, ?)"
            " ON CONFLICT DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def paused(self) -> frozenset[str | None]:
        """The owners whose jobs are paused (None: the whole object), from ``nj_meta``."""
        meta = None if self._meta is None else self._meta_rows()
        if meta is not None:
            rows = [(key,) for key in meta
                    if key == PAUSED_ALL or key[:len(PAUSED_PREFIX)] == PAUSED_PREFIX]
        else:
            rows = self.conn.execute(
                "SELECT key FROM nj_meta WHERE key = ? OR substr(key, 1, ?) = ?",
                (PAUSED_ALL, len(PAUSED_PREFIX), PAUSED_PREFIX),
            ).fetchall()
        return frozenset(None if key == PAUSED_ALL else key[len(PAUSED_PREFIX):]
                         for (key,) in rows)

    def set_paused(self, owner: str | None, paused: bool) -> bool:
        """Pause or resume ``owner`` (None: the whole object); return whether it
        changed."""
        key = PAUSED_ALL if owner is None else PAUSED_PREFIX + owner
        if paused:
            cursor = self.conn.execute(
                "INSERT INTO nj_meta (key, value) VALUES (?, 1) ON CONFLICT DO NOTHING", (key,)
            )
        else:
            cursor = self.conn.execute("DELETE FROM nj_meta WHERE key = ?", (key,))
        return cursor.rowcount > 0


def _alarm_time(exclusive: Any, ready: Any, in_flight: Any) -> float | None:
    if exclusive is not None:
        return float(exclusive)
    if ready is None:
        return None if in_flight is None else float(in_flight)
    return float(ready) if in_flight is None else float(min(ready, in_flight))


def _dead_letter(job: str, error: str, attempts: int, reason: str, time: float) -> DeadLetter:
    record = decode_payload(job)
    assert isinstance(record, dict)
    record["payload"] = decode_payload(record["payload"])
    return DeadLetter(
        job=converter.structure(record, Job), error=error, attempts=attempts, reason=reason,
        time=time,
    )


# -- validation of push arguments -------------------------------------------------------
