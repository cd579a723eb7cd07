"""JobStore: the one writer of an object's ``nj_jobs`` and dead letters.

It applies the outcomes of runs in the group transaction (``_transactions``) together
with the jobs' own writes, and keeps the object's alarm consistent with the queue: the
alarm is lowered before a row commits (an early wake is harmless, a lost one is not)
and raised only after. Outcomes are applied as they happen, so every read sees them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Final, cast

import attrs

from nursery_jobs import _clock
from nursery_jobs._codec import encode_payload
from nursery_jobs._core._transactions import atomic
from nursery_jobs._errors import DamagedJobError, JobError, JobOwnershipError
from nursery_jobs._jobs._records import Completion, DeadLetter, Job, ownership_error
from nursery_jobs._jobs._table import Cursor, JobRow, JobTable

if TYPE_CHECKING:
    from nursery_jobs._core._alarm import AlarmClaim
    from nursery_jobs._core._transactions import ObjectTransactions

# Completed jobs whose outcome may wait for one commit: a process death re-runs at most
# this many completed jobs per object (at-least-once). 1 commits every completion.
DEFAULT_COMPLETION_GROUP: Final = 64
_ALARMS_DISABLED: Final = "alarms_disabled"
# What ``writing`` returns inside a transaction: the writes join it.
_JOINED: Final = nullcontext()
# Dead letters kept per object; past it the oldest go (job:dead_letter_dropped).
DEFAULT_DEAD_LETTER_LIMIT: Final = 10_000


class JobStore:
    """The jobs and dead letters of one object, and the alarm they imply."""

    __slots__ = (
        "_alarm", "_cancels", "_cancels_at_job", "_damaged", "_done", "_dropped", "_rise",
        "completion_group", "conn", "dead_letter_limit", "disabled", "end_work", "paused",
        "running_attempts", "running_id", "running_seq", "ships_group", "superseded", "table",
        "tracing", "tx", "version", "work_since",
    )

    def __init__(
        self, conn: sqlite3.Connection, alarm: AlarmClaim, transactions: ObjectTransactions, *,
        completion_group: int, dead_letter_limit: int = DEFAULT_DEAD_LETTER_LIMIT,
        on_dropped: Callable[[str, str], None] = lambda owner, job_id: None,
        on_damaged: Callable[[DamagedJobError], None] = lambda error: None, label: str = "",
    ) -> None:
        self.conn = conn
        self.table = JobTable(conn, label)  # (``label``: ns/id, named by damaged rows)
        self._damaged = on_damaged
        self.tx = transactions
        transactions.staged = self.table  # finished jobs' deletes wait for the group
        transactions.blocks = self  # a rolled-back block's effects in memory go too
        self._alarm = alarm
        # open_runtime(tracing=...): a push stores the current span's context (None: off).
        self.tracing = alarm.tracing
        self.completion_group = completion_group
        self.dead_letter_limit = dead_letter_limit
        self._dropped = on_dropped
        # Jobs finished in the open group transaction (committed every completion_group).
        self._done = 0
        # A full group was committed where commits ship (the shared layout, PostgreSQL):
        # the alarm run ships it before the next job starts (``ship_group``), so a death
        # re-runs at most ``completion_group`` completed jobs there too.
        self.ships_group = False
        # The job running now: a mutation of its id supersedes its outcome.
        self.running_id: str | None = None
        self.running_seq = -1
        self.running_attempts = 0  # its failed attempts before this run
        self.superseded = False
        # Bumped by every mutation through the API: an alarm run re-reads due rows then.
        self.version = 0
        # Alarms disabled for good (``Lifecycle.disable_alarms``, durable): the alarm
        # is left alone. (Read when a rollback may have undone it: ``_reread``.)
        self.disabled = bool(self.table.meta(_ALARMS_DISABLED))
        # Paused owners (None: the whole object), durable in nj_meta; read again, as
        # ``disabled``, when a rollback may have undone a pause or resume.
        self.paused: frozenset[str | None] = frozenset()
        self._read_paused()
        # Jobs cancelled in the open transaction, (owner, id): the tracked work their runs
        # started ends once it commits, and goes on if it rolls back (the job is back).
        # A savepoint rolled back takes those cancelled since it opened (``_cancels_at_job``
        # for the running job's).
        self._cancels: list[tuple[str, str]] = []
        self._cancels_at_job = 0
        # What ends that work (``Steering.cancel_work``).
        self.end_work: Callable[[str, str], None] = lambda owner, job_id: None
        # When the latest tracked work in progress of (owner, id)'s runs started, or None
        # (``Lifecycle.work_since``): a row written for that job carries it as its
        # running marker, whether it replaces the job's row or follows one that is gone.
        self.work_since: Callable[[str, str], float | None] = lambda owner, job_id: None
        # A change made inside a user block may let the alarm rise (an exclusive push, a
        # cancel, a re-time, a resume): never before the block commits (``committed``
        # re-arms then; a rollback would leave a job behind a raised alarm).
        self._rise = False

    def _read_paused(self) -> None:
        self.paused = paused = self.table.paused()
        self.table.hold(paused)

    # -- the group transaction ------------------------------------------------------
    # A job's writes and its outcome commit together: the alarm run opens the group and
    # the job's savepoint before the job runs (``begin_run``); a clean run releases the
    # savepoint and applies the outcome in the group (``finish``), a failed one rolls
    # the savepoint back (``fail``). A death before the group commits loses the jobs'
    # writes with their outcomes: their re-runs find the storage as it was.
    def begin_run(self, row: JobRow) -> None:
        self.tx.begin_job()
        self._cancels_at_job = len(self._cancels)
        self.running_id, self.running_seq, self.superseded = row.job.id, row.seq, False
        self.running_attempts = row.attempts

    def end_run(self) -> None:
        self.running_id = None

    def complete(self, job: Job, completion: Completion) -> Job | None:
        """Apply what the run of ``job`` came to (see ``Completion``): keep the run's
        writes (``kept``; they were undone by ``fail`` otherwise) and record its outcome in
        the group; a retry or a burial commits at once (attempts survive restarts), the
        others with the group when it is full. A same-id push, reschedule or cancel
        during the run supersedes the outcome (the change wins). Returns the buried job
        (``bury``; None if it is gone), else ``job``.

        Raises:
            StorageError: the outcome could not be recorded; the group was rolled back
                (the run's writes with it), so its jobs run again.
        """
        kind = completion.kind
        if kind == "drop":
            with self.writing():
                self.table.delete(job.owner, job.id)
                self.table.forget_attempts(job.owner, job.id)
            return job
        if kind in ("retry", "bury"):
            if self.superseded:
                return None
            if kind == "retry":
                with self.writing():
                    self.table.retry_later(job.id, completion.time, completion.attempts,
                                           completion.marker)
                    self._record_attempt(job, completion)
                self.flush()
                return job
            return self.bury(job.id, completion.error, "failed", attempts=completion.attempts,
                             failure=completion)
        table = self.table
        try:
            if completion.kept:
                self.tx.end_job(keep=True)
            if not self.conn.in_transaction:  # (the group was committed during the job)
                self.tx.open_group()
            if self.superseded:
                table.clean(job.id)
            elif kind == "done":
                # By push sequence (the rowid), not id: no index search. Safe because the
                # row cannot have been replaced (that would have superseded the run).
                table.finished(self.running_seq)
            else:
                table.later(self.running_seq, completion.time, completion.marker)
            if self.running_attempts and not self.superseded:
                # Its failed attempts go with it (attempts clear); only a job that
                # failed before costs this statement.
                table.forget_attempts(job.owner, job.id)
        except BaseException:
            # Kept without its outcome, the job's writes would be made again by its
            # re-run (found by the fault sweep: a failed RELEASE or DELETE here).
            self._abort()
            raise
        self._done += 1
        if self._done >= self.completion_group:
            self.flush()
            if self._alarm.ships and not self.tx.group:
                self.ships_group = True
        return job

    def _record_attempt(self, job: Job, completion: Completion) -> None:
        if completion.started == completion.started:  # (not NaN: a run's failure)
            self.table.record_attempt(job.owner, job.id, completion.attempts,
                                      completion.started, completion.seconds, completion.error)

    def fail(self) -> None:
        """The running job raised or was cancelled: undo everything it wrote, its queue
        mutations (``lifecycle.jobs``) included — its next attempt makes them again."""
        was_written = self.tx.job_savepoint
        try:
            self.tx.end_job(keep=False)
        except BaseException:
            self._abort()  # (as in complete: the writes must not outlive the run)
            raise
        self._cancels_undone(self._cancels_at_job)
        if was_written:
            self._reread()

    def _abort(self) -> None:
        """Roll the group back after a failure to record a run (see ``complete``)."""
        self._done = 0
        self.tx.abort_group()
        self._cancels_undone(0)
        self._reread()

    def _reread(self) -> None:
        """A rollback undid writes: what this store keeps in memory about them is read
        again (a same-id push that superseded the run, alarms disabled)."""
        self.superseded = False
        self.version += 1
        self.disabled = bool(self.table.meta(_ALARMS_DISABLED))
        self._read_paused()

    # -- storage.transaction() blocks (the ``BlockWatcher`` of ``_transactions``) --------
    def mark(self) -> tuple[str | None, bool, int]:
        return self.running_id, self.superseded, len(self._cancels)

    def undo(self, mark: object) -> None:
        """A block rolled back: a push, cancel or re-time of the running job's id made in
        it did not happen (the job's outcome stands), nor did a disable_alarms(); the
        jobs it cancelled keep their tracked work."""
        running_id, superseded, cancels = cast("tuple[str | None, bool, int]", mark)
        self._cancels_undone(cancels)
        if running_id == self.running_id:
            self.superseded = superseded
        self.version += 1
        self.disabled = bool(self.table.meta(_ALARMS_DISABLED))
        self._read_paused()

    def release(self, stand_in: sqlite3.Connection) -> None:
        """The object left memory: hold ``stand_in`` in place of its connection. (Its
        table is the transactions' staged writes: released with them.)"""
        self.conn = stand_in

    def writing(self) -> AbstractContextManager[None]:
        """``with store.writing():`` one transaction for the writes in the block — or,
        inside the group or a user block, part of that transaction. (Not a generator:
        see ``atomic``.)"""
        self.tx.check_write()
        if self.conn.in_transaction:
            return _JOINED
        return atomic(self.conn)

    def reading(self) -> JobTable:
        """The table, for a read by the current task (which must hold a turn)."""
        self.tx.check_read()
        return self.table

    def committed(self) -> None:
        """A block committed, no transaction is left open: the jobs it cancelled lose
        their tracked work, and the alarm is set as the queue now stands if a change in
        the block may have to raise it. Does not checkpoint."""
        self._cancels_committed(committed=True)
        if self._rise:
            self.rearm()

    def flush(self) -> None:
        """Commit the group transaction now (unless a user block is open). Does not
        checkpoint."""
        was_open = self.conn.in_transaction
        self.tx.commit_group()
        if not self.tx.group:
            self._done = 0
        self._cancels_committed(committed=was_open)

    def _cancels_committed(self, *, committed: bool) -> None:
        """If no transaction is open any more, the cancels made in it were committed (the
        tracked work of those jobs ends) or, ``committed`` False, rolled back underneath
        us (a failed statement: the work goes on). Does not checkpoint."""
        if self._cancels and not self.conn.in_transaction:
            cancels, self._cancels = self._cancels, []
            if committed:
                for owner, job_id in cancels:
                    self.end_work(owner, job_id)

    def _cancels_undone(self, mark: int) -> None:
        """A rollback: the cancels made since ``mark`` did not happen (all of them, if it
        left no transaction open)."""
        del self._cancels[mark if self.conn.in_transaction else 0:]

    def _touch(self, job_id: str) -> None:
        """A mutation through the API is about to change ``job_id``."""
        self.version += 1
        if job_id == self.running_id:
            self.superseded = True

    # -- reads (outcomes are applied in the group: reads see them) -------------------
    def row(self, job_id: str) -> JobRow | None:
        return self.reading().row(job_id)

    def rows(self, owner: str | None = None) -> list[JobRow]:
        return self.reading().rows(owner)

    def job_ids(self) -> list[str]:
        return self.reading().job_ids()

    def named(self, owners: tuple[str, ...], job_id: str | None,
              fn: str | None) -> list[tuple[str, str, str]]:
        return self.reading().named(owners, job_id, fn)

    def dead_letters(self, owner: str | None) -> list[DeadLetter]:
        return self.reading().dead_letters(owner)

    def meta(self, key: str) -> int:
        return self.reading().meta(key)

    def due_batch(self, now: float, after: Cursor, limit: int) -> list[JobRow]:
        """The alarm run's read: due rows after ``after`` in run order (those that do
        not read back are buried, ``set_aside``)."""
        rows = self.table.next_due(now, after, limit)
        if self.table.damaged:
            self.set_aside()
        return rows

    def trace(self, row: JobRow) -> str | None:
        """The pushing span's context stored with ``row``'s job (read with tracing on)."""
        return self.table.trace(row.seq)

    def due_counts(self, now: float) -> list[tuple[str, int]]:
        return self.table.due_counts(now)

    def has_due(self, now: float) -> bool:
        return self.table.has_due(now)

    def next_alarm_time(self) -> float | None:
        return self.table.next_alarm_time(_clock.now())

    def exclusive_time(self) -> float | None:
        """When the earliest pending exclusive job (of an owner not paused) lets the
        object wake; None if none is pending."""
        return self.table.exclusive_time()

    def is_paused(self, owner: str) -> bool:
        """Whether ``owner``'s jobs are paused (its own pause or the object's)."""
        paused = self.paused
        return bool(paused) and (None in paused or owner in paused)

    # -- mutations through the API -------------------------------------------------
    def push(self, job: Job, payload_text: str | None, *, stable_id: bool) -> Job:
        """Insert ``job`` or replace the same owner's job of its id; durable (with the
        alarm lowered) when it returns, unless inside a user transaction.

        Raises:
            JobOwnershipError: another owner holds the id.
        """
        replaced = marked = False
        if not stable_id:
            # A new id: one statement, atomic on its own (no BEGIN and COMMIT around
            # it: two statements fewer a push, ~10 % of a push's SQL on a working copy).
            self.tx.check_write()
            self._lower_alarm(job.time, job.exclusive, job.id, job.owner)
            tracing = self.tracing
            self.table.upsert(job, payload_text,
                              None if tracing is None else tracing.push_context())
            if job.exclusive:
                self._rearm_when_committed()
            return job
        with self.writing():
            if stable_id:
                holder = self.table.owner_of(job.id)
                if holder is not None and holder != job.owner:
                    raise ownership_error(job.owner, holder, job.id)
                replaced = holder is not None
                self._touch(job.id)
            self._lower_alarm(job.time, job.exclusive, job.id, job.owner)
            tracing = self.tracing
            self.table.upsert(job, payload_text,
                              None if tracing is None else tracing.push_context())
            if replaced:
                # The replacement starts with attempts 0: the old job's failed attempts
                # go (they showed as the new job's, and stayed for good once it passed
                # at its first attempt: only a job that failed before forgets its rows).
                self.table.forget_attempts(job.owner, job.id)
            if stable_id:
                marked = self._mark_work(job.owner, job.id)
        if replaced:
            stored = self.table.row(job.id)
            if stored is not None:
                job = attrs.evolve(job, created_at=stored.job.created_at)
        if replaced or marked or job.exclusive:
            self._rearm_when_committed()
        return job

    def _mark_work(self, owner: str, job_id: str) -> bool:
        """Give the row just written for ``owner``'s job ``job_id`` the running marker of
        the tracked work its earlier runs started, if some goes on; return whether it
        did. The id names the job across its rows: one that completed (its row deleted)
        or became a dead letter while its work went on, then is pushed or requeued
        again, is that job still running (single-flight holds it until the work ends or
        is hung; a death meanwhile is its crash strike), as a replaced row is (the
        upsert keeps its marker)."""
        since = self.work_since(owner, job_id)
        if since is None:
            return False
        self.table.set_marker(job_id, since)
        return True

    def cancel(self, owner: str, job_id: str) -> bool:
        in_transaction = self.conn.in_transaction
        with self.writing():
            deleted = self.table.delete(owner, job_id)
            if deleted:
                self.table.forget_attempts(owner, job_id)
                self._touch(job_id)
        if not deleted:
            return False
        if in_transaction:
            # Its tracked work ends when this commits: a rollback brings the job back.
            # Nor may the alarm be raised: the job would be back with the alarm above
            # it (an early wake is harmless).
            self._cancels.append((owner, job_id))
        else:
            self.end_work(owner, job_id)  # (committed)
        self._rearm_when_committed()
        return True

    def delete_cancelled(self, job: Job) -> bool:
        """``jobs.cancel`` ended the run of ``job`` (the alarm run, which holds the turn,
        deletes it for the canceller, which cannot take it): delete the job, committed
        now. Its alarm is left to the run's end. Returns whether it was there."""
        with self.writing():
            deleted = self.table.delete(job.owner, job.id)
            # (as cancel: a job that failed before its cancelled run leaves no history)
            self.table.forget_attempts(job.owner, job.id)
            self._touch(job.id)
        self.flush()
        return deleted

    def reschedule(self, owner: str, job_id: str, when: float) -> bool:
        with self.writing():
            row = self.table.row(job_id)
            if row is None or row.job.owner != owner:
                return False
            self._touch(job_id)
            self._lower_alarm(when, row.job.exclusive, job_id, owner)
            self.table.retime(owner, job_id, when)
        self._rearm_when_committed()  # as in cancel: never raise the alarm before a commit
        return True

    def requeue(self, owner: str, job_id: str) -> Job | None:
        """Move dead letter ``job_id`` of ``owner`` back into the queue, due now."""
        with self.writing():
            # Checked before anything is written: inside the group, nothing would undo
            # the letter's delete if the refusal came after it.
            letter = self.table.dead_letter(owner, job_id)
            if letter is None:
                return None
            if letter.reason == "damaged":
                raise JobError(
                    f"cannot requeue {job_id!r}: its stored row did not read back (its payload"
                    " is lost: see the letter's error); push the job again, or discard it",
                    job_id=job_id)
            holder = self.table.owner_of(job_id)
            if holder == owner:
                raise JobOwnershipError(
                    f"cannot requeue {job_id!r}: a job of that id is queued again (pushed"
                    " since it became a dead letter); requeue it once that one has run, or"
                    " cancel that one first", job_id=job_id, owner=owner)
            if holder is not None:
                raise ownership_error(owner, holder, job_id)
            self.table.unbury(owner, job_id)
            self.table.forget_attempts(owner, job_id)  # (it starts afresh)
            job = attrs.evolve(letter.job, time=_clock.now())
            self._touch(job_id)
            self._lower_alarm(job.time, job.exclusive, job.id, job.owner)
            text = encode_payload(job.payload)
            # (The requeue's own span, if any, asked for this run: the letter kept none.)
            self.table.upsert(job, text,
                              None if self.tracing is None else self.tracing.push_context())
            self._mark_work(owner, job_id)  # (its last run's work may go on: see push)
        return job

    def set_paused(self, owner: str | None, paused: bool) -> bool:
        """Pause or resume the jobs of ``owner`` (None: the whole object); return
        whether that changed anything. A resume lowers the alarm before the commit (an
        early wake is harmless, a lost one is not); after the commit, either may raise
        it (a pause takes jobs out; a resume may bring back an exclusive job, which
        alone decides when the object wakes)."""
        with self.writing():
            changed = self.table.set_paused(owner, paused)
            if not changed:
                return False
            self.version += 1  # an alarm run in progress reads the due rows again
            self._read_paused()
            if not paused and not self.disabled:
                time = self.table.next_alarm_time(_clock.now())
                current = self._alarm.get()
                if time is not None and (current is None or time < current):
                    self._alarm.set(time)
        self._rearm_when_committed()
        return True

    # -- what the alarm run and the breaker write ------------------------------------
    def bury(
        self, job_id: str, error: str, reason: str, *, attempts: int | None = None,
        failure: Completion | None = None,
    ) -> Job | None:
        """Move a job into the dead letters (with its last attempt, ``failure``, in its
        attempt history); returns it, or None if it is gone."""
        with self._burying() as table:
            row = table.row(job_id)
            if row is None:
                return None
            table.bury(row, error, reason, _clock.now(),
                       attempts=row.attempts if attempts is None else attempts)
            if failure is not None:
                self._record_attempt(row.job, failure)
        return row.job

    @contextmanager
    def _burying(self) -> Iterator[JobTable]:
        """``with store._burying() as table:`` bury dead letters with ``table``. Every
        burial goes through here — a failure, a seal, a crash, a damaged row — so the
        bound holds whatever buried: past ``dead_letter_limit`` the oldest letters go,
        in the same transaction, which is then committed (the group's too, unless a
        user block or the running job's writes are open), and
        ``job:dead_letter_dropped`` tells of each. Does not checkpoint."""
        with self.writing():
            yield self.table
            dropped = self.table.drop_oldest_dead_letters(self.dead_letter_limit)
            if dropped:
                self.table.forget_orphan_attempts()
        self.flush()
        for owner, dropped_id in dropped:
            self._dropped(owner, dropped_id)

    def discard(self, owner: str | None, job_id: str) -> bool:
        """Delete dead letter ``job_id`` (of ``owner``, or any owner with None)."""
        with self.writing():
            found = self.table.discard(owner, job_id)
            if found:
                self.table.forget_orphan_attempts()
            return found

    def discard_dead_letters(self, owner: str | None, before: float | None) -> int:
        """Delete the dead letters (of ``owner``) buried before ``before`` (all: None)."""
        with self.writing():
            count = self.table.discard_before(owner, before)
            if count:
                self.table.forget_orphan_attempts()
            return count

    def defer(self, job_id: str, time: float) -> None:
        """Move a job to ``time`` and clear its running marker (a reset)."""
        with self.writing():
            self.table.conn.execute(
                "UPDATE nj_jobs SET time = ?, running_since = NULL WHERE id = ?", (time, job_id)
            )

    def defer_recovery_loops(self, time: float) -> None:
        """Move every ``recovery_loop`` job due by ``time`` to ``time``."""
        self.table.conn.execute(
            "UPDATE nj_jobs SET time = ?, running_since = NULL"
            " WHERE recovery_loop = 1 AND time <= ?",
            (time, time),
        )

    def bury_recovery_loops(self, error: str, reason: str) -> list[Job]:
        """Move every ``recovery_loop`` job into the dead letters (a seal); return
        them."""
        buried = []
        with self._burying() as table:
            for row in table.rows():
                if row.job.recovery_loop:
                    table.bury(row, error, reason, _clock.now(), attempts=row.attempts)
                    buried.append(row.job)
        return buried

    def set_meta(self, key: str, value: int) -> None:
        self.table.set_meta(key, value)

    def strike(self, job_id: str, started: float, time: float) -> bool:
        with self.writing():
            return self.table.strike(job_id, started, time)

    def running_markers(self) -> list[JobRow]:
        rows = self.table.running()
        if self.table.damaged:
            self.set_aside()
        return rows

    def set_aside_untimed(self) -> None:
        """Bury the jobs whose time is no number (at activation: the alarm time of the
        others would not read otherwise)."""
        self.table.untimed()
        if self.table.damaged:
            self.set_aside()

    def set_aside(self) -> None:
        """Bury the rows the table's reads found not to read back (``JobTable.damaged``)
        as dead letters of reason ``"damaged"``, and tell ``on_damaged`` of each: the
        fault is its job's, the other jobs run."""
        damaged, self.table.damaged = self.table.damaged, []
        with self._burying() as table:
            for seq, row, error in damaged:
                table.bury_damaged(seq, row, str(error), _clock.now())
        for _seq, _row, error in damaged:
            self._damaged(error)

    def set_marker(self, job_id: str, started: float) -> None:
        with self.writing():
            self.table.set_marker(job_id, started)

    def clear_marker(self, job_id: str, started: float, rest: float | None = None) -> bool:
        """The tracked work of job ``job_id`` that started at ``started`` has ended: its
        marker becomes ``rest``, when the work of the job still in progress started
        (None: none is). Returns whether the row's marker was ``started``."""
        with self.writing():
            cleared = self.table.clear_marker(job_id, started, rest)
            return cleared

    # -- the alarm --------------------------------------------------------------------
    def _lower_alarm(self, time: float, exclusive: bool, job_id: str, owner: str) -> None:
        """Before a write commits: lower the alarm to ``time`` if it is later — never
        raise it (a rollback would leave a pending job behind a raised alarm). Raising
        it to an exclusive job's time is ``rearm``'s, after the commit."""
        if self.disabled:
            return
        current = self._alarm.get()
        if self.paused and (self.table.all_held or owner in self.paused):
            return  # a paused owner's job wakes nothing (its resume lowers the alarm)
        if current is not None and time >= current:
            return  # (most pushes of a batch: no query for exclusive jobs)
        if not exclusive and self.table.first_exclusive_time(excluding=job_id) is not None:
            return  # an exclusive job alone decides when the object wakes
        self._alarm.set(time)

    def _rearm_when_committed(self) -> None:
        """After a change that may let the alarm rise: re-arm now if the change is
        committed, else once it is (``rearm`` defers it). Does not checkpoint."""
        if self.conn.in_transaction:
            self._rise = True
        else:
            self.rearm()

    def rearm(self, *, write_through: bool = False) -> None:
        """Set the alarm for the next due job as the queue stands (after committing the
        group: the alarm may only rise above what is committed). Does not checkpoint."""
        self.flush()
        if self.disabled:
            return
        if self.conn.in_transaction:
            # Not committed (a user block, or the running job's writes, are open): never
            # raise the alarm above what may roll back. The block's commit
            # (``committed``) or the alarm run's end re-arms it.
            self._rise = True
            return
        self._rise = False
        time = self.table.next_alarm_time(_clock.now())
        if write_through:
            self._alarm.write_through(time)
        elif time is None:
            self._alarm.delete()
        elif self._alarm.get() != time:
            self._alarm.set(time)

    async def ship_group(self) -> None:
        """Ship the group committed by the last completion (see ``ships_group``).
        Checkpoints."""
        self.ships_group = False
        await self.durable()

    async def durable(self) -> None:
        """After a mutation: make it durable where the engine ships commits (a no-op,
        without a checkpoint, where every commit is durable already)."""
        if self._alarm.ships and not self.conn.in_transaction:
            await self._alarm.sync()

    def alarm(self) -> float | None:
        """The alarm's time as last written (None: no alarm)."""
        return self._alarm.get()

    def set_alarm(self, time: float) -> None:
        """Set the alarm to ``time`` outright (the fallback and backup alarms)."""
        if not self.disabled:
            self._alarm.set(time)

    def disable(self) -> None:
        """Turn the alarm off for good (teardown): durable, so a later activation does
        not re-arm it from the jobs that remain."""
        with self.writing():
            self.table.set_meta(_ALARMS_DISABLED, 1)
        self.disabled = True
        self._alarm.delete()
