"""The Lifecycle: owns an object's alarm and runs its due jobs, one at a time.

An alarm run: fallback alarm -> startup if cold -> backup alarm -> each due job in
(time, push sequence) order, re-read before it runs -> host ``on_alarm()`` -> alarm
for the next due job. Each job's attempt is recorded before it runs, so a crash is
never mistaken for a job that never ran.
"""

from __future__ import annotations

import contextvars
import logging
import math
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import attrs
import trio

from . import _clock
from ._breaker import MemoryBreaker, MemoryLimitContext
from ._capability import Capability
from ._codec import encode_payload
from ._errors import CapabilityError, JobError
from ._jobs import (
    HOST,
    DeadLetter,
    Job,
    JobContext,
    JobOutcome,
    JobRow,
    Jobs,
    JobTable,
    Reschedule,
    RetryOptions,
    check_fn,
    check_hung_timeout,
    check_job_id,
    check_retry,
    coerce_outcome,
    new_job_id,
    ownership_error,
    resolve_time,
)
from ._object import DurableObject

logger = logging.getLogger("nursery_jobs")

# The fallback alarm of a run: if the run dies, the object wakes again this soon.
FALLBACK_ALARM: Final = 30.0
BACKLOG_WARNING: Final = 10
# Jobs dispatched between forced checkpoints, so one busy object cannot starve others.
_CHECKPOINT_EVERY: Final = 32
# Due rows read per query in an alarm run (re-read whenever a mutation intervenes).
_DUE_BATCH: Final = 64
# Completed jobs whose outcome may wait for one commit: a process death re-runs at most
# this many completed jobs per object (at-least-once). 1 commits every completion.
DEFAULT_COMPLETION_GROUP: Final = 64
# Full-jitter backoff draws from this; tests may seed or patch it.
RNG: Final = random.Random()


def lifecycle_retry_delay(retry_count: int) -> float | None:
    """A failed Lifecycle alarm run is retried 2 s doubling, capped at 5 minutes."""
    return min(300.0, 2.0 * 2.0 ** min(retry_count, 16))


class _AlarmRun:
    """The alarm run in progress: what ``track_alarm_work`` attaches work to."""

    __slots__ = ("active", "epoch", "job", "lifecycle", "started", "tracked")

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self.epoch = _clock.epoch()  # nj.now() == epoch + trio.current_time()
        self.active = True
        self.job: Job | None = None
        self.started = 0.0
        self.tracked = False


_current_run: contextvars.ContextVar[_AlarmRun | None] = contextvars.ContextVar(
    "nursery_jobs_alarm_run", default=None
)


class Lifecycle:
    """The job queue of one object. Create it with ``Lifecycle.install(self)`` in the
    object's ``__init__``; it then owns the object's alarm."""

    def __init__(
        self,
        host: DurableObject,
        *,
        max_alarm_memory_limit_strikes: int = 3,
        completion_group: int = DEFAULT_COMPLETION_GROUP,
    ) -> None:
        if not isinstance(host, DurableObject):
            raise TypeError(f"Lifecycle.install() needs a DurableObject, got {host!r}")
        if (
            isinstance(max_alarm_memory_limit_strikes, bool)
            or not isinstance(max_alarm_memory_limit_strikes, int)
            or max_alarm_memory_limit_strikes < 1
        ):
            raise ValueError(
                "max_alarm_memory_limit_strikes must be an int >= 1, got "
                f"{max_alarm_memory_limit_strikes!r}"
            )
        if isinstance(completion_group, bool) or not isinstance(completion_group, int) or (
            completion_group < 1
        ):
            raise ValueError(f"completion_group must be an int >= 1, got {completion_group!r}")
        ctx = host.ctx
        self.host = host
        self.completion_group = completion_group
        self.ctx = ctx
        self.max_alarm_memory_limit_strikes = max_alarm_memory_limit_strikes
        self.table = JobTable(ctx.storage.conn)
        self._alarm = ctx.storage._own_alarm("Lifecycle")
        ctx._alarm_handler = self._alarm_run
        ctx._alarm_retry_delay = lifecycle_retry_delay
        self.jobs = Jobs(self, HOST)
        self._capabilities: dict[str, Capability] = {}
        self._started = False
        self._starting: trio.Event | None = None
        self._disabled = False
        self._tracked: dict[tuple[str, float], int] = {}
        self._watch_scope: trio.CancelScope | None = None
        self._watch_row: Job | None = None
        self._watch_deadline = math.inf
        # Outcomes of clean runs not yet committed (see _stage), and what runs now.
        self._finished: list[tuple[int]] = []
        self._later: list[tuple[float, bool, int]] = []
        self._clean: list[tuple[str]] = []
        self._staged = 0
        self._running_id: str | None = None
        self._running_seq = -1
        self._superseded = False
        # Bumped by every mutation through the API: an alarm run re-reads due rows then.
        self._version = 0
        self._breaker = MemoryBreaker(self)
        # A transaction the user opens must not carry our staged outcomes (its rollback
        # would undo them): commit them before it begins.
        ctx.storage._before_transaction.append(self._flush)

    @classmethod
    def install(
        cls,
        host: DurableObject,
        max_alarm_memory_limit_strikes: int = 3,
        *,
        completion_group: int = DEFAULT_COMPLETION_GROUP,
    ) -> Lifecycle:
        """Create the Lifecycle of ``host`` and hand it the object's alarm.

        ``completion_group`` bounds how many completed jobs a process death may re-run
        (their outcomes are committed together); 1 commits each completion.
        """
        return cls(host, max_alarm_memory_limit_strikes=max_alarm_memory_limit_strikes,
                   completion_group=completion_group)

    def __repr__(self) -> str:
        return f"<Lifecycle {self.ctx.namespace}/{self.ctx.id}>"

    # -- capabilities ---------------------------------------------------------------
    def use(self, *capabilities: Capability) -> Lifecycle:
        """Install capabilities (before startup). Returns self for chaining."""
        if self._started:
            raise CapabilityError(f"{self!r}: capabilities must be added before startup")
        for cap in capabilities:
            if not isinstance(cap, Capability):
                raise TypeError(f"use() takes Capability instances, got {cap!r}")
            cap_id = cap._capability_id()
            if not isinstance(cap_id, str) or not cap_id or cap_id == HOST:
                raise CapabilityError(
                    f"capability {cap!r} needs a non-empty id other than {HOST!r}"
                )
            if cap_id in self._capabilities:
                raise CapabilityError(
                    f"{self!r}: a capability with id {cap_id!r} is already installed"
                )
            self._capabilities[cap_id] = cap
            cap.lifecycle = CapabilityLifecycle(self, cap_id)
            cap.host = self.host
        return self

    @property
    def capabilities(self) -> dict[str, Capability]:
        return dict(self._capabilities)

    # -- startup --------------------------------------------------------------------
    async def start(self) -> None:
        """Recover from a crash (crash strikes), then run each capability's
        ``on_start``. Runs once per activation; later calls return at once."""
        if self._started:
            await trio.lowlevel.checkpoint()
            return
        if self._starting is not None:
            await self._starting.wait()
            if not self._started:
                await self.start()
            return
        self._starting = starting = trio.Event()
        try:
            sealed = self._recover_crashes()
            for cap in self._capabilities.values():
                await cap.on_start()
            self._started = True
            for row in sealed:
                await self._call_memory_hooks(
                    MemoryLimitContext(sealed=True, next_time=None, executing=row.job,
                                       purged_recovery_loop_jobs=[])
                )
        finally:
            self._starting = None
            starting.set()
        self._rearm_now()

    def _recover_crashes(self) -> list[JobRow]:
        """Give each job that a dead process was running (its flight record, or the
        marker of its tracked work) a crash strike; seal it at the limit. A crash uses
        up no attempt. Returns the sealed rows."""
        crashed: dict[str, float] = {}
        for job_id, started in self.ctx._take_crash_tokens():
            crashed[job_id] = started
        for marked in self.table.running():
            assert marked.running_since is not None
            crashed.setdefault(marked.job.id, marked.running_since)
        sealed = []
        now = _clock.now()
        for job_id, started in crashed.items():
            row = self.table.row(job_id)
            if row is None:
                continue
            strikes = row.crash_strikes + 1
            job = row.job
            if strikes >= self.max_alarm_memory_limit_strikes:
                error = f"it was running at {strikes} process deaths"
                with self._writing():
                    self.table.bury(row, error, "crash", now, attempts=row.attempts)
                logger.error("job %r of %s sealed: %s", job.id, self._label(), error)
                self._emit("job:crash_strike", id=job.id, owner=job.owner, fn=job.fn,
                           strikes=strikes, sealed=True)
                sealed.append(row)
                continue
            delay = min(300.0, 30.0 * strikes)
            with self._writing():
                applied = self.table.strike(job_id, started, now + delay)
            if applied:
                logger.warning(
                    "job %r of %s was running when its process died (crash strike %d);"
                    " it runs again in %.0f s", job.id, self._label(), strikes, delay,
                )
                self._emit("job:crash_strike", id=job.id, owner=job.owner, fn=job.fn,
                           strikes=strikes, sealed=False, delay=delay)
        self.ctx._crashes_recovered()
        return sealed

    # -- staged completions ---------------------------------------------------------
    def _stage(self, job: Job, outcome: JobOutcome, *, keep_marker: bool) -> None:
        """Stage a clean run's outcome; commit the group when it is full. A same-id
        push, reschedule or cancel made during the run supersedes the outcome."""
        if self._superseded:
            self._clean.append((job.id,))
        elif outcome is None:
            # By push sequence (the rowid), not id: no index search. Safe because every
            # mutation commits the staged outcomes first, so no row can take the seq.
            self._finished.append((self._running_seq,))
        elif isinstance(outcome, Reschedule):
            self._later.append((outcome.time, keep_marker, self._running_seq))
        else:  # YIELD: stays due
            self._later.append((job.time, keep_marker, self._running_seq))
        self._staged += 1
        if self._staged >= self.completion_group:
            self._flush()

    def _apply_staged(self) -> None:
        if self._finished or self._later or self._clean:
            self.table.apply_completions(self._finished, self._later, self._clean)

    def _clear_staged(self) -> None:
        self._finished, self._later, self._clean = [], [], []
        self._staged = 0

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One transaction for the staged outcomes and the writes in the block (or
        the caller's open transaction, if any)."""
        conn = self.ctx.storage.conn
        if conn.in_transaction:
            self._apply_staged()
            self._clear_staged()
            yield
            return
        conn.execute("BEGIN")
        try:
            self._apply_staged()
            yield
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self._clear_staged()

    def _flush(self) -> None:
        """Commit the staged outcomes now. Does not checkpoint."""
        if self._finished or self._later or self._clean:
            with self._writing():
                pass

    def _touch(self, job_id: str) -> None:
        """A mutation through the API is about to change ``job_id``."""
        self._version += 1
        if job_id == self._running_id:
            self._superseded = True

    # -- the job API (owner-scoped through Jobs) --------------------------------------
    async def _push(
        self,
        owner: str,
        fn: str,
        *,
        time: Any,
        delay: Any,
        payload: Any,
        id: str | None,
        retry: RetryOptions | None,
        singleflight: bool,
        hung_timeout: float,
        exclusive: bool,
        recovery_loop: bool,
    ) -> Job:
        fn = check_fn(fn)
        now = _clock.now()
        job_id = new_job_id(now) if id is None else check_job_id(id)
        label = job_id if id is not None else f"fn={fn}"  # name what the caller gave
        when = resolve_time(time, delay, now, job=label)
        retry = check_retry(retry, job=label)
        hung_timeout = check_hung_timeout(hung_timeout, job=label)
        for name, flag in (("singleflight", singleflight), ("exclusive", exclusive),
                           ("recovery_loop", recovery_loop)):
            if not isinstance(flag, bool):
                raise JobError(f"job {label!r}: {name} must be a bool, got {flag!r}")
        payload_text = encode_payload(payload)
        job = Job(
            id=job_id, owner=owner, fn=fn, time=when, payload=payload, retry=retry,
            singleflight=singleflight, hung_timeout=hung_timeout, exclusive=exclusive,
            recovery_loop=recovery_loop, created_at=now,
        )
        # Inside storage.transaction() a push must not yield: another task of the
        # object could write into the open transaction.
        if not self.ctx.storage.conn.in_transaction:
            await trio.lowlevel.checkpoint()
        replaced = False
        with self._writing():
            if id is not None:
                holder = self.table.owner_of(job_id)
                if holder is not None and holder != owner:
                    raise ownership_error(owner, holder, job_id)
                replaced = holder is not None
                self._touch(job_id)
            # Lower the alarm before the row commits: an early wake is harmless, a lost
            # one is not.
            self._lower_alarm(when, exclusive, job_id)
            self.table.upsert(job, payload_text)
        if replaced:
            stored = self.table.row(job_id)
            if stored is not None:
                job = attrs.evolve(job, created_at=stored.job.created_at)
        if (replaced or exclusive) and not self.ctx.storage.conn.in_transaction:
            self._rearm_now()  # committed: now the alarm may also rise
        return job

    async def _cancel(self, owner: str, job_id: str) -> bool:
        job_id = check_job_id(job_id)
        in_transaction = self.ctx.storage.conn.in_transaction
        if not in_transaction:
            await trio.lowlevel.checkpoint()
        with self._writing():
            deleted = self.table.delete(owner, job_id)
            if deleted:
                self._touch(job_id)
        # Inside storage.transaction() the alarm must not be raised: a rollback would
        # bring the job back with the alarm above it (an early wake is harmless).
        if deleted and not in_transaction:
            self._rearm_now()
        return deleted

    async def _reschedule(self, owner: str, job_id: str, time: Any) -> bool:
        job_id = check_job_id(job_id)
        try:
            when = _clock.coerce_time(time, name=f"reschedule {job_id!r}: time")
        except (TypeError, ValueError) as exc:
            raise JobError(str(exc)) from None
        in_transaction = self.ctx.storage.conn.in_transaction
        if not in_transaction:
            await trio.lowlevel.checkpoint()
        with self._writing():
            row = self.table.row(job_id)
            if row is None or row.job.owner != owner:
                return False
            self._touch(job_id)
            self._lower_alarm(when, row.job.exclusive, job_id)
            self.table.retime(owner, job_id, when)
        if not in_transaction:  # as in _cancel: never raise the alarm before a commit
            self._rearm_now()
        return True

    # -- the alarm ------------------------------------------------------------------
    def _lower_alarm(self, time: float, exclusive: bool, job_id: str) -> None:
        """Before a write commits: lower the alarm to ``time`` if it is later — never
        raise it (a rollback would leave a pending job behind a raised alarm). Raising
        it to an exclusive job's time is ``_rearm_now``'s, after the commit."""
        if self._disabled:
            return
        if not exclusive and self.table.first_exclusive_time(excluding=job_id) is not None:
            return  # an exclusive job alone decides when the object wakes
        current = self._alarm.get()
        if current is None or time < current:
            self._alarm.set(time)

    def _rearm_now(self, *, write_through: bool = False) -> None:
        self._flush()
        if self._disabled:
            return
        time = self.table.next_alarm_time(_clock.now())
        if write_through:
            self._alarm.write_through(time)
        elif time is None:
            self._alarm.delete()
        elif self._alarm.get() != time:
            self._alarm.set(time)

    async def rearm_alarm(self) -> None:
        """Set the alarm for the next due job as the queue stands, writing it through
        to the runtime's alarm index even if it seems to be there. Checkpoints."""
        await trio.lowlevel.checkpoint()
        self._rearm_now(write_through=True)

    async def disable_alarms(self) -> None:
        """Stop arming the alarm and stop the current run after its job. Jobs stay."""
        await trio.lowlevel.checkpoint()
        self._disabled = True
        self._alarm.delete()

    async def _alarm_run(self, info: Any) -> None:
        run = _AlarmRun(self)
        token = _current_run.set(run)
        try:
            now = _clock.now()
            fallback = self.table.next_alarm_time(now)
            if fallback is not None and not self._disabled:
                self._alarm.set(max(fallback, now + FALLBACK_ALARM))
            if not self._started:
                await self.start()
                now = _clock.now()
                if not self._disabled and self.table.has_due(now):
                    self._alarm.set(now + FALLBACK_ALARM)  # the backup alarm
            if not self._disabled:
                await self._run_due(run, now)
            on_alarm = getattr(self.host, "on_alarm", None)
            if on_alarm is not None:
                await on_alarm()
        except trio.Cancelled:
            self._flush()  # the jobs that completed stay completed
            host = self.ctx._host
            if host.memory_reset and not self._breaker.tripped:
                await self._observe_reset(None, host.reset_reason)
            if host.reset_reason is None:
                # A graceful shutdown is no failure: what was due stays due, so the
                # object wakes as soon as a runtime opens the path again.
                self._rearm_now()
            raise
        except Exception:
            self._flush()  # the jobs that completed stay completed
            if self.table.next_alarm_time(_clock.now()) is None:
                logger.exception("alarm run of %s failed; no jobs remain", self._label())
                return
            raise  # the runtime retries the run with backoff while jobs remain
        finally:
            run.active = False
            _current_run.reset(token)
        if not self._tracked:
            self._breaker.clear()  # a clean, quiescent alarm run
        self._rearm_now()

    async def _observe_reset(self, executing: Job | None, error: str | None) -> None:
        """This object was reset for memory while ``executing`` ran: strike, move or
        seal, re-arm, then tell the capabilities and the host (shielded, bounded)."""
        context = self._breaker.observe(executing, error or "memory limit")
        self._rearm_now()
        with trio.move_on_after(10, shield=True):
            await self._call_memory_hooks(context)

    async def _run_due(self, run: _AlarmRun, now: float) -> None:
        for owner, count in self.table.due_counts(now):
            if count >= BACKLOG_WARNING:
                logger.warning("%s: %d due jobs of %r in one alarm", self._label(), count, owner)
                self._emit("job:backlog_warning", owner=owner, count=count)
        start: tuple[float, int] = (-math.inf, -1)
        cursor = start
        ran: set[str] = set()
        readmitted: set[str] = set()
        batch: list[JobRow] = []
        index = 0
        read_at = -1
        dispatched = 0
        while not self._disabled:
            if read_at != self._version:
                # A push, reschedule or cancel may have changed the rows, perhaps ahead
                # of the cursor (a higher-priority queue item): read again from the top;
                # ``ran`` keeps what already ran from running twice.
                cursor, index = start, len(batch)
            if index == len(batch):
                batch = self.table.next_due(now, cursor, _DUE_BATCH)
                index, read_at = 0, self._version
                if not batch:
                    return
            row = batch[index]
            index += 1
            cursor = (row.job.time, row.seq)
            job = row.job
            if job.id in ran:
                continue  # replaced or yielded during this run: it runs at the next alarm
            ran.add(job.id)
            if job.singleflight and row.running_since is not None:
                age = _clock.now() - row.running_since
                if age < job.hung_timeout:
                    logger.debug("skipping job %r: a run of it is in progress", job.id)
                    continue
                logger.warning(
                    "forcing reset of hung job %r of %s (running for %.1f s)",
                    job.id, self._label(), age,
                )
                self._emit("job:hung_reset", id=job.id, owner=job.owner, fn=job.fn, age=age)
            if await self._dispatch(run, row) and job.id not in readmitted:
                # Replaced during its own run: the replacement keeps the job's place in
                # line, so it runs next in this pass (once; after that, next alarm).
                readmitted.add(job.id)
                ran.discard(job.id)
            dispatched += 1
            if dispatched % _CHECKPOINT_EVERY == 0:
                await trio.lowlevel.checkpoint()

    def _handler(self, owner_id: str) -> tuple[Any, Callable[..., Awaitable[Any]] | None]:
        if owner_id == HOST:
            return self.host, getattr(self.host, "on_job", None)
        cap = self._capabilities.get(owner_id)
        if cap is None or type(cap).on_job is Capability.on_job:
            return cap, None
        return cap, cap.on_job

    async def _dispatch(self, run: _AlarmRun, row: JobRow) -> bool:
        """Run one job; return whether a same-id push, reschedule or cancel superseded
        its outcome."""
        job = row.job
        owner, on_job = self._handler(job.owner)
        if on_job is None:
            logger.error(
                "no installed capability or host handler for job %r (owner %r, fn %r) of %s;"
                " dropping it", job.id, job.owner, job.fn, self._label(),
            )
            with self._writing():
                self.table.delete(job.owner, job.id)
            self._emit("job:dropped", id=job.id, owner=job.owner, fn=job.fn)
            return False
        if row.crash_strikes:
            # Jobs with crash strikes run one at a time per runtime ("probation"). A
            # job that kills its process is a suspect after its first death; the jobs
            # that were running beside it are suspects too, and with the same strikes
            # they fall due again at the same moment. Were they to run beside it
            # again, they would die with it again and be sealed with it. On probation
            # no death can take two suspects: the others finish and are cleared.
            version = self._version
            async with self.ctx.runtime.probation:
                if self._version != version:
                    # Pushed, re-timed or cancelled while it waited: run what is there.
                    fresh = self.table.row(job.id)
                    if fresh is None or fresh.job.time > _clock.now():
                        return False
                    row, job = fresh, fresh.job
                return await self._run_job(run, row, owner, on_job)
        return await self._run_job(run, row, owner, on_job)

    async def _run_job(
        self, run: _AlarmRun, row: JobRow, owner: Any, on_job: Callable[..., Awaitable[Any]]
    ) -> bool:
        job = row.job
        clock = trio.current_time()  # one clock read per job: both clocks derive from it
        started = run.epoch + clock
        # Record what runs before it runs, where a SIGKILL cannot erase it (a memory
        # write, not a commit): a death is then attributed to this job.
        flight = self.ctx._flight
        if flight is not None:
            flight.record(job.id, started)
        self._running_id, self._running_seq, self._superseded = job.id, row.seq, False
        run.job, run.started, run.tracked = job, started, False
        ctx = JobContext(job=job, attempt=row.attempts + 1)
        self._watch(job, clock)
        try:
            outcome = coerce_outcome(await on_job(ctx))
        except trio.Cancelled:
            # Shutdown or reset: a platform failure uses up no attempt.
            if self.ctx._host.memory_reset:
                await self._observe_reset(job, self.ctx._host.reset_reason)
            raise
        except MemoryError as exc:
            await self._memory_error(job, exc)
        except Exception as exc:
            self._unwatch()
            self.ctx.runtime.metrics.job_ran(self.ctx.namespace, job.owner,  # nj-hook: metrics
                                             trio.current_time() - clock, False)
            await self._failed(owner, ctx, exc, keep_marker=self._keeps_marker(run, job))
        else:
            self._unwatch()
            self.ctx.runtime.metrics.job_ran(self.ctx.namespace, job.owner,  # nj-hook: metrics
                                             trio.current_time() - clock, True)
            self._stage(job, outcome, keep_marker=self._keeps_marker(run, job))
        finally:
            if flight is not None:
                flight.clear()
            run.job = None
            self._running_id = None
        return self._superseded

    def _keeps_marker(self, run: _AlarmRun, job: Job) -> bool:
        """Whether the job's running marker must stay after this run: its tracked work
        goes on, started by this run or an earlier one (a heartbeat that found the work
        running must not erase what a crash during it is attributed by)."""
        if not self._tracked:
            return run.tracked
        return run.tracked or any(key[0] == job.id for key in self._tracked)

    async def _failed(
        self, owner: Any, ctx: JobContext, error: Exception, *, keep_marker: bool
    ) -> None:
        job = ctx.job
        if self._superseded:
            return  # pushed, re-timed or cancelled during the run: that change wins
        if ctx.attempt < job.retry.max_attempts:
            bound = job.retry.backoff_bound(ctx.attempt)
            delay = RNG.uniform(0.0, bound) if job.retry.jitter else bound
            logger.warning(
                "job %r of %s failed (attempt %d of %d): %r; retrying in %.3f s",
                job.id, self._label(), ctx.attempt, job.retry.max_attempts, error, delay,
            )
            # Committed at once (with any staged outcomes): attempts survive restarts.
            with self._writing():
                self.table.retry_later(job.id, _clock.now() + delay, ctx.attempt)
            self._emit("job:retry", id=job.id, owner=job.owner, fn=job.fn, attempt=ctx.attempt,
                       max_attempts=job.retry.max_attempts, delay=delay, error=repr(error))
            return
        outcome: JobOutcome = None
        on_job_error = None if job.owner == HOST else getattr(owner, "on_job_error", None)
        if on_job_error is not None:
            try:
                outcome = coerce_outcome(await on_job_error(ctx, error))
            except Exception:
                logger.exception("on_job_error of %r failed for job %r", job.owner, job.id)
            if self._superseded:
                return
        if outcome is not None:
            self._stage(job, outcome, keep_marker=keep_marker)
            return
        logger.error("job %r of %s failed after %d attempts: %r", job.id, self._label(),
                     ctx.attempt, error)
        with self._writing():
            row = self.table.row(job.id)
            if row is None:
                return
            self.table.bury(row, _error_text(error), "failed", _clock.now(),
                            attempts=ctx.attempt)
        self._emit("job:dead_letter", id=job.id, owner=job.owner, fn=job.fn,
                   attempts=ctx.attempt, error=_error_text(error))

    # -- slow dispatch --------------------------------------------------------------
    # The watchdog's deadline is moved only when it must come earlier; a stale, later
    # deadline just wakes it once to look (setting a deadline per job cost ~5 µs).
    def _watch(self, job: Job, clock: float) -> None:
        """Watch ``job``, started at Trio time ``clock``."""
        self._watch_row = job
        self._watch_deadline = deadline = clock + job.hung_timeout
        scope = self._watch_scope
        if scope is None:
            # Made here, not in the task: jobs that never checkpoint would otherwise
            # each start a watchdog before the first one runs.
            self._watch_scope = trio.CancelScope(deadline=deadline)
            self.ctx.nursery.start_soon(self._slow_dispatch_watchdog)
        elif deadline < scope.deadline:
            scope.deadline = deadline

    def _unwatch(self) -> None:
        self._watch_row = None

    async def _slow_dispatch_watchdog(self) -> None:
        while True:
            assert self._watch_scope is not None
            with self._watch_scope:
                await trio.sleep_forever()
            job = self._watch_row
            deadline = math.inf
            if job is not None:
                if trio.current_time() >= self._watch_deadline:
                    logger.warning(
                        "job %r (fn %r) of %s has run longer than its hung_timeout of %.1f s",
                        job.id, job.fn, self._label(), job.hung_timeout,
                    )
                    self._emit("job:slow_dispatch", id=job.id, owner=job.owner, fn=job.fn,
                               threshold=job.hung_timeout)
                    self._watch_row = None
                else:
                    deadline = self._watch_deadline  # another job runs now: watch it
            self._watch_scope = trio.CancelScope(deadline=deadline)

    # -- long work --------------------------------------------------------------------
    def track_alarm_work(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """Start ``fn(*args)`` in the object's nursery under the current alarm run.

        Returns False (and starts nothing) outside an alarm run or ``on_alarm``. The
        work keeps the object resident; a single-flight job that started it counts as
        running until the work ends. Does not checkpoint.
        """
        run = _current_run.get()
        if run is None or not run.active or run.lifecycle is not self:
            return False
        job, started = run.job, run.started
        if job is not None:
            if not run.tracked:
                # The job counts as running until its work ends (single-flight, and a
                # death meanwhile is a crash strike of this job).
                with self._writing():
                    self.table.set_marker(job.id, started)
            run.tracked = True
            key = (job.id, started)
            self._tracked[key] = self._tracked.get(key, 0) + 1
        self.ctx.nursery.start_soon(self._tracked_work, fn, args, job, started)
        return True

    async def _memory_error(self, job: Job | None, error: MemoryError) -> None:
        """A ``MemoryError`` escaped alarm work: reset the object as the watchdog would."""
        host = self.ctx._host
        host.reset(f"MemoryError in the alarm work of {self._label()}: {error!r}", memory=True)
        await self._observe_reset(job, host.reset_reason)
        await trio.lowlevel.checkpoint()  # the reset cancels this task here

    async def _tracked_work(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], job: Job | None,
        started: float,
    ) -> None:
        host = self.ctx._host
        try:
            with host.working(alarm=True):
                try:
                    await fn(*args)
                except trio.Cancelled:
                    # Work that hits the memory limit counts against the job that
                    # started it.
                    if host.memory_reset and (job is not None or not self._breaker.tripped):
                        await self._observe_reset(job, host.reset_reason)
                    raise
                except MemoryError as exc:
                    await self._memory_error(job, exc)
                except Exception as exc:
                    logger.exception("tracked work %r of %s failed", fn, self._label())
                    self._emit("alarm:tracked_work_failed", job=None if job is None else job.id,
                               error=repr(exc))
        finally:
            if job is not None:
                key = (job.id, started)
                left = self._tracked[key] - 1
                if left:
                    self._tracked[key] = left
                else:
                    del self._tracked[key]
                    self._flush()
                    if self.table.clear_marker(job.id, started):
                        self._rearm_now()

    # -- dead letters -----------------------------------------------------------------
    def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter of this object (all owners), oldest first."""
        return self.table.dead_letters(None)

    async def requeue(self, id: str, *, owner: str = HOST) -> Job | None:
        """Put dead letter ``id`` of ``owner`` back in the queue, due now, with fresh
        attempts. Returns the job, or None if there is no such dead letter."""
        return await self._requeue(owner, id)

    async def _requeue(self, owner: str, job_id: str) -> Job | None:
        job_id = check_job_id(job_id)
        await trio.lowlevel.checkpoint()
        with self._writing():
            letter = self.table.unbury(owner, job_id)
            if letter is None:
                return None
            if self.table.owner_of(job_id) is not None:
                raise ownership_error(owner, str(self.table.owner_of(job_id)), job_id)
            job = attrs.evolve(letter.job, time=_clock.now())
            self._lower_alarm(job.time, job.exclusive, job.id)
            self.table.upsert(job, encode_payload(job.payload))
        return job

    # -- memory-limit hooks -------------------------------------------------------------
    async def _call_memory_hooks(self, ctx: MemoryLimitContext) -> None:
        for cap in self._capabilities.values():
            hook = getattr(cap, "on_memory_limit", None)
            if hook is not None:
                try:
                    await hook(ctx)
                except Exception:
                    logger.exception("on_memory_limit of %r failed", cap)
        hook = getattr(self.host, "on_alarm_memory_limit", None)
        if hook is not None:
            try:
                await hook(ctx)
            except Exception:
                logger.exception("on_alarm_memory_limit of %s failed", self._label())

    # -- helpers ------------------------------------------------------------------------
    def _label(self) -> str:
        return f"{self.ctx.namespace}/{self.ctx.id}"

    def _emit(self, type: str, **data: Any) -> None:
        self.ctx.events.emit(type, self.ctx.namespace, self.ctx.id, **data)


class CapabilityLifecycle:
    """``self.lifecycle`` inside a capability: the Lifecycle scoped to that capability."""

    __slots__ = ("_lifecycle", "capability_id", "jobs")

    def __init__(self, lifecycle: Lifecycle, capability_id: str) -> None:
        self._lifecycle = lifecycle
        self.capability_id = capability_id
        self.jobs = Jobs(lifecycle, capability_id)

    def track_alarm_work(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """See ``Lifecycle.track_alarm_work``."""
        return self._lifecycle.track_alarm_work(fn, *args)

    def emit(self, type: str, **data: Any) -> None:
        """Publish a diagnostics event from this object. Does not checkpoint."""
        self._lifecycle._emit(type, **data)

    @property
    def events(self) -> Any:
        return self._lifecycle.ctx.events

    def dead_letters(self) -> list[DeadLetter]:
        """This capability's dead letters, oldest first."""
        return self._lifecycle.table.dead_letters(self.capability_id)

    async def requeue(self, id: str) -> Job | None:
        """Put this capability's dead letter ``id`` back in the queue, due now."""
        return await self._lifecycle._requeue(self.capability_id, id)

    async def rearm_alarm(self) -> None:
        await self._lifecycle.rearm_alarm()


def _error_text(error: BaseException) -> str:
    return f"{type(error).__qualname__}: {error}"

