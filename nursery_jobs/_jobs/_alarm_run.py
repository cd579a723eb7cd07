"""The alarm run of a Lifecycle object: what its due alarm does.

fallback alarm -> startup if cold (a backup alarm if it pushed a due job) -> each due
job in run order (priority, time, push sequence), re-read before it runs -> host
``on_alarm()`` -> alarm for the next due job. Each job's start is recorded in the flight
record before it runs, so a crash is never mistaken for a job that never ran; a failure
is the job's (an attempt, a durable backoff, a dead letter), a reset or a shutdown is
not.
"""

from __future__ import annotations

import contextvars
import logging
import math
import random
from collections.abc import Awaitable, Callable
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Final

import trio

from nursery_jobs import _clock
from nursery_jobs._core._limits import PARK_FOR
from nursery_jobs._core._tracing import traced_run
from nursery_jobs._errors import describe_error, from_signal, memory_error_of, safe_repr
from nursery_jobs._jobs._capability import Capability
from nursery_jobs._jobs._records import (
    DONE,
    HOST,
    Completion,
    Job,
    JobContext,
    JobOutcome,
    coerce_outcome,
    completion_of,
    job_context,
)
from nursery_jobs._jobs._slow_dispatch import SlowDispatchWatch, watched
from nursery_jobs._jobs._steering import CancelRequest, run_with_timeout
from nursery_jobs._jobs._table import BACKLOG_WINDOW, Cursor, JobRow

if TYPE_CHECKING:
    from nursery_jobs._core._alarm import AlarmClaim
    from nursery_jobs._engines.base import FlightSlot
    from nursery_jobs._jobs._lifecycle import Lifecycle

logger = logging.getLogger("nursery_jobs")

# The fallback alarm of a run: if the run dies, the object wakes again this soon.
FALLBACK_ALARM: Final = 30.0
BACKLOG_WARNING: Final = 10
# Jobs dispatched between forced checkpoints, so one busy object cannot starve others.
_CHECKPOINT_EVERY: Final = 32
# Due rows read per query in an alarm run (re-read whenever a mutation intervenes).
_DUE_BATCH: Final = 64
_START: Final[Cursor] = (-(2**31), -math.inf, -1)


class AlarmRun:
    """One alarm run in progress: what ``track_alarm_work`` attaches work to."""

    __slots__ = ("active", "cancel", "epoch", "flight", "job", "lifecycle", "scope", "started",
                 "time", "tracked")

    def __init__(self, lifecycle: Lifecycle, flight: FlightSlot | None) -> None:
        self.lifecycle = lifecycle
        # The run's flight-record slot (the host holds one for the whole run): read
        # once, not through the claim per job.
        self.flight = flight
        self.epoch = _clock.epoch()  # nj.now() == epoch + trio.current_time()
        # trio.current_time() itself, two calls shorter (read twice per job).
        self.time = trio.lowlevel.current_clock().current_time
        self.active = True
        self.job: Job | None = None
        self.started = 0.0
        self.tracked = False
        # The scope the jobs of this run are dispatched in (``jobs.cancel`` of the job
        # running now cancels it), and that cancel.
        self.scope: trio.CancelScope | None = None
        self.cancel: CancelRequest | None = None


current_run: contextvars.ContextVar[AlarmRun | None] = contextvars.ContextVar(
    "nursery_jobs_alarm_run", default=None
)


def _at_least(count: int) -> str:
    """A backlog's count as logged: counted among the first ``BACKLOG_WINDOW`` due jobs
    only (``JobTable.due_counts``), so a full window is a lower bound."""
    return f"{count:,} or more" if count >= BACKLOG_WINDOW else str(count)


def memory_reset_of(claim: AlarmClaim) -> bool:
    """Whether the object was reset for memory (the watchdog, a MemoryError)."""
    cause = claim.reset_cause
    return cause is not None and cause.memory


def reset_reason_of(claim: AlarmClaim) -> str | None:
    cause = claim.reset_cause
    return None if cause is None else cause.reason


def error_text(error: BaseException) -> str:
    return describe_error(error)


class AlarmRunner:
    """Runs a Lifecycle's alarm: the dispatch loop and job failures. One per
    Lifecycle."""

    def __init__(self, lifecycle: Lifecycle, rng: random.Random) -> None:
        self._lc = lifecycle
        self._store = lifecycle.store
        self._claim = lifecycle.claim
        self._metrics = lifecycle.claim.metrics
        self._namespace = lifecycle.ctx.namespace
        self._tracing = lifecycle.store.tracing  # (tracing) None: off
        self._turns = lifecycle.claim.turns
        self._steering = lifecycle.steering
        self._rng = rng
        self._watch = SlowDispatchWatch(lifecycle)
        # The permits of the object's namespace (None: not limited, no cost per job).
        self._limit = lifecycle.claim.limit
        self._object_id = lifecycle.ctx.id
        # Owners whose backlog was warned of: warned once per backlog, not per alarm
        # run (a drain of 100k jobs printed 4,793 warnings, issue 22 #10); again once an
        # alarm run has found it cleared.
        self._backlogged: set[str] = set()
        self._run: AlarmRun | None = None  # the alarm run in progress (set once per run)

    async def __call__(self, info: Any) -> None:
        table = self._store.table
        # What the run reads of the queue is remembered while nothing changes it
        # (``JobTable.facts``): a cold object's run asked five times in a row.
        table.remembers = True
        try:
            await self._alarm_run()
        finally:
            table.forget_facts()

    async def _alarm_run(self) -> None:
        lc, store = self._lc, self._store
        run = self._run = AlarmRun(lc, self._claim.flight)
        token = current_run.set(run)
        try:
            now = _clock.now()
            fallback = store.next_alarm_time()
            backup = now + FALLBACK_ALARM
            if fallback is not None:
                # During the run the alarm is only a fallback: a death in it (in
                # ``on_start`` too) wakes the object again in 30 s, not in a loop.
                store.set_alarm(max(fallback, backup))
            if not lc.started:
                # Its own re-arm is left to the run's end (it would lower the alarm to
                # the due jobs' time, and the backup then raise it again: two catalog
                # writes of a cold fire's four, with a gap between them where a death
                # re-ran the object at once).
                await lc.start(rearm=False)
                now = _clock.now()
                alarm = store.alarm()
                if (alarm is None or alarm < backup) and store.has_due(now):
                    # ``on_start`` pushed a due job (its push lowered the alarm).
                    store.set_alarm(now + FALLBACK_ALARM)  # the backup alarm
            held = False
            if not store.disabled:
                held = await self._run_due(run, now)
            on_alarm = getattr(lc.host, "on_alarm", None)
            if on_alarm is not None:
                await on_alarm()
        except trio.Cancelled:
            if not self._turns.holds():
                raise  # (cancelled in a hand-over, and the object did not come back)
            store.flush()  # the jobs that completed stay completed
            if memory_reset_of(self._claim) and not lc.breaker.tripped:
                await lc.observe_reset(None, reset_reason_of(self._claim))
            if self._claim.reset_cause is None:
                # A graceful shutdown is no failure: what was due stays due, so the
                # object wakes as soon as a runtime opens the path again.
                store.rearm()
            raise
        except (KeyboardInterrupt, SystemExit):
            # The process stops: what is due stays due (the fallback alarm is 30 s out),
            # so the next start runs it at once.
            try:
                store.rearm()
            except Exception as exc:
                logger.warning("the alarm of %s was not re-armed as the process stopped:"
                               " %s", lc.label, describe_error(exc))
            raise
        except Exception:
            store.flush()  # the jobs that completed stay completed
            if store.next_alarm_time() is None:
                logger.exception("alarm run of %s failed; no jobs remain", lc.label)
                return
            raise  # the runtime retries the run with backoff while jobs remain
        finally:
            run.active = False
            self._run = None
            current_run.reset(token)
            self._watch.stop()
        if not lc.outstanding:
            lc.breaker.clear()  # a clean, quiescent alarm run (no tracked work at all)
        if held:
            self._park()
        else:
            store.rearm()

    def _park(self) -> None:
        """A job found no permit of the namespace's limit: what is due stays due, the
        object waits in line for a permit (which delivers its alarm again), and its
        alarm is only a fallback meanwhile (a process death loses no wake-up)."""
        assert self._limit is not None
        store = self._store
        store.flush()
        fallback = store.next_alarm_time()
        if fallback is not None:
            store.set_alarm(max(fallback, _clock.now() + PARK_FOR))
        self._limit.park(self._object_id)

    async def _run_due(self, run: AlarmRun, now: float) -> bool:
        """Run the due jobs; return True if a job was held by the namespace's limit
        (the run stops there: what is due stays due, in order)."""
        store = self._store
        exclusive = store.exclusive_time()
        if exclusive is not None and exclusive > now:
            # While an exclusive job is pending, it alone decides when the object wakes
            # (DESIGN 3): a wake before its time — an alarm left lower by a resume or a
            # block that had not committed, a fallback alarm, a crash — runs nothing,
            # and the run's end sets the alarm to it. So an early wake is harmless by
            # construction, whoever set the alarm.
            return False
        # The first batch of due rows, read before the backlog is counted: a short one
        # holds every due job, so the counts are its own (a statement of each alarm
        # run); the dispatch starts from it.
        first = store.due_batch(now, _START, _DUE_BATCH)
        read_at = store.version
        if len(first) < BACKLOG_WARNING:
            due_counts: list[tuple[str, int]] = []  # (no owner can have a backlog)
        elif len(first) < _DUE_BATCH:
            counts: dict[str, int] = {}
            for row in first:
                owner = row.job.owner
                counts[owner] = counts.get(owner, 0) + 1
            due_counts = sorted(counts.items())  # (by owner, as the statement's)
        else:
            due_counts = store.due_counts(now)
        backlogged = {owner: count for owner, count in due_counts
                      if count >= BACKLOG_WARNING}
        for owner, count in backlogged.items():
            if owner not in self._backlogged:
                self._lc.emit("job:backlog_warning", owner=owner, count=count,
                              _log=(logging.WARNING, "%s: %s due jobs of %r in one alarm"
                                    " (warned once until the backlog clears)",
                                    (self._lc.label, _at_least(count), owner)))
        if backlogged or self._backlogged:
            self._backlogged = set(backlogged)
        if not first and read_at == store.version:
            return False  # nothing is due
        ran: set[str] = set()
        readmitted: set[str] = set()
        steering = self._lc.steering
        steering.run = run
        try:
            while True:
                # One scope per run, not per job (a scope costs a few µs, a dispatch
                # ~10): a cancel of the running job ends the scope, and a new one
                # carries the run on.
                with trio.CancelScope() as run.scope:
                    return await self._dispatch_due(run, now, ran, readmitted, first, read_at)
                first, read_at = [], -1
                if run.cancel is not None:
                    await self._end_cancelled(run, run.cancel)
                    if self._turns.waiting:
                        # Between two jobs (fairness, as after any job): a waiting call
                        # — a cancel of more jobs, say — has the object before the
                        # next job starts. (The cancel was committed.)
                        await self._turns.hand_over("alarm run")
                now = _clock.now()
        finally:
            steering.run = run.scope = None
            if run.cancel is not None:
                run.cancel.decide(False)  # (the run ended another way: a shutdown, a fault)
                run.cancel = None

    async def _end_cancelled(self, run: AlarmRun, request: CancelRequest) -> None:
        """``jobs.cancel`` ended the run of ``request.job`` (its writes were undone on the
        way out): delete the job — no retry, no dead letter — commit, and tell the
        canceller once that is durable."""
        job = request.job
        self._watch.job = None
        self._store.delete_cancelled(job)
        self._lc.emit("job:cancelled", id=job.id, owner=job.owner, fn=job.fn,
                      _log=(logging.INFO, "job %r of %s: its run was cancelled (jobs.cancel)",
                            (job.id, self._lc.label)))
        await self._store.durable()
        run.cancel = None
        request.decide(True)

    async def _dispatch_due(
        self, run: AlarmRun, now: float, ran: set[str], readmitted: set[str],
        batch: list[JobRow], read_at: int,
    ) -> bool:
        """Run the due jobs in run order, from ``batch`` (the first rows, read at store
        version ``read_at``; -1 and none: read them first)."""
        store = self._store
        cursor = _START
        # Each owner's handler, looked up once per run.
        handlers: dict[str, tuple[Any, Callable[..., Awaitable[Any]] | None]] = {}
        index = 0
        dispatched = 0
        while not store.disabled:
            if read_at != store.version:
                # A push, reschedule or cancel may have changed the rows, perhaps ahead
                # of the cursor (a higher-priority queue item, due now): read again from
                # the top; ``ran`` keeps what already ran from running twice.
                cursor, batch, index = _START, [], 0
                if read_at != -1:
                    now = _clock.now()
            if index == len(batch):
                if batch:  # (read at this version: a mutation would have emptied it)
                    if len(batch) < _DUE_BATCH:
                        # A short batch held every row due at ``now`` after the cursor;
                        # what ran since changed only rows in ``ran``. Nothing is left
                        # for this pass (a read that found nothing was two statements
                        # of each alarm run).
                        return False
                    last = batch[-1]  # on from the last row read (made here, not per job)
                    cursor = (-last.job.priority, last.job.time, last.seq)
                batch = store.due_batch(now, cursor, _DUE_BATCH)
                index, read_at = 0, store.version
                if not batch:
                    return False
            row = batch[index]
            index += 1
            job = row.job
            if job.id in ran:
                continue  # replaced or yielded during this run: it runs at the next alarm
            ran.add(job.id)
            if job.singleflight and row.running_since is not None:
                age = _clock.now() - row.running_since
                if age < job.hung_timeout:
                    logger.debug("skipping job %r: a run of it is in progress", job.id)
                    continue
                self._lc.emit("job:hung_reset", id=job.id, owner=job.owner, fn=job.fn, age=age,
                              _log=(logging.WARNING,
                                    "forcing reset of hung job %r of %s (running for %.1f s)",
                                    (job.id, self._lc.label, age)))
            handler = handlers.get(job.owner)
            if handler is None:
                handler = handlers[job.owner] = self._handler(job.owner)
            owner, on_job = handler
            if on_job is None:
                self._drop(job)
                superseded = False
            elif self._limit is not None:
                if not self._limit.try_acquire(self._object_id):
                    return True  # held: no attempt used, nothing written
                superseded = await self._with_permit(run, row, owner, on_job)
            elif row.crash_strikes:
                superseded = await self._on_probation(run, row, owner, on_job)
            else:
                superseded = await self._run_job(run, row, owner, on_job)
            if superseded and job.id not in readmitted:
                # Replaced during its own run: the replacement keeps the job's place in
                # line, so it runs next in this pass (once; after that, next alarm).
                readmitted.add(job.id)
                ran.discard(job.id)
            dispatched += 1
            if store.ships_group:
                await store.ship_group()  # before the next job starts (group committed)
            if self._turns.waiting:
                # Fairness: a call waits for one job, never for the backlog. What ran
                # commits first (the call must not see half a group), then the call has
                # the object; the run goes on when it gets it back.
                store.flush()
                await self._turns.hand_over("alarm run")
            else:
                # A call the job forwarded that comes back later is no part of the
                # next job's chain (a hand-over renews the holding too).
                self._turns.renew()
                if dispatched % _CHECKPOINT_EVERY == 0:
                    await trio.lowlevel.checkpoint()
        return False

    async def _with_permit(
        self, run: AlarmRun, row: JobRow, owner: Any, on_job: Callable[..., Awaitable[Any]]
    ) -> bool:
        """Run one job of a limited namespace under the permit it took; the permit goes
        back when the run ends, however it ends."""
        assert self._limit is not None
        try:
            if row.crash_strikes:
                return await self._on_probation(run, row, owner, on_job)
            return await self._run_job(run, row, owner, on_job)
        finally:
            self._limit.release()

    def _handler(self, owner_id: str) -> tuple[Any, Callable[..., Awaitable[Any]] | None]:
        if owner_id == HOST:
            return self._lc.host, getattr(self._lc.host, "on_job", None)
        cap = self._lc.capability(owner_id)
        if cap is None or type(cap).on_job is Capability.on_job:
            return cap, None
        return cap, cap.on_job

    def _drop(self, job: Job) -> None:
        """A job whose owner has no handler: logged and deleted."""
        self._store.complete(job, Completion(kind="drop"))
        self._lc.emit(
            "job:dropped", id=job.id, owner=job.owner, fn=job.fn,
            _log=(logging.ERROR, "no installed capability or host handler for job %r"
                  " (owner %r, fn %r) of %s; dropping it",
                  (job.id, job.owner, job.fn, self._lc.label)))

    async def _on_probation(
        self, run: AlarmRun, row: JobRow, owner: Any, on_job: Callable[..., Awaitable[Any]]
    ) -> bool:
        """Run a job with crash strikes, one at a time per runtime ("probation"). A job
        that kills its process is a suspect after its first death; the jobs that were
        running beside it are suspects too, and with the same strikes they fall due again
        at the same moment. Were they to run beside it again, they would die with it
        again and be sealed with it. On probation no death can take two suspects: the
        others finish and are cleared."""
        store, lock = self._store, self._claim.probation
        version = store.version
        try:
            if lock.locked():
                # Another suspect runs, perhaps another object's, for minutes: wait for
                # it without this object's turn (what ran commits first, as at a
                # hand-over). Holding the turn, every call — a pause, a jobs.cancel of
                # this very job — waited for that other run, and the cancelled job
                # then ran all the same.
                store.flush()
                await self._turns.step_out(lock.acquire)
            else:
                await lock.acquire()
            if store.version != version:
                # Pushed, re-timed, cancelled or paused while it waited: run what is
                # there, if it is still due.
                fresh = store.row(row.job.id)
                if (fresh is None or fresh.job.owner != row.job.owner
                        or fresh.job.time > _clock.now() or store.is_paused(fresh.job.owner)):
                    return False
                row = fresh
            return await self._run_job(run, row, owner, on_job)
        finally:
            if lock.statistics().owner is trio.lowlevel.current_task():
                lock.release()

    async def _run_job(
        self, run: AlarmRun, row: JobRow, owner: Any, on_job: Callable[..., Awaitable[Any]]
    ) -> bool:
        """Run one job; return whether a same-id push, reschedule or cancel superseded
        its outcome."""
        store, job = self._store, row.job
        clock = run.time()  # one clock read per job: both clocks derive from it
        started = run.epoch + clock
        # Record what runs before it runs, where a SIGKILL cannot erase it (a memory
        # write, not a commit): a death is then attributed to this job.
        flight = run.flight
        if flight is not None:
            flight.record(job.id, started)
        store.begin_run(row)  # the group transaction and the job's savepoint
        run.job, run.started, run.tracked = job, started, False
        ctx = job_context(job, row.attempts + 1)
        watch = self._watch
        watch.watch(job, clock)
        if self._tracing is not None:  # (tracing) the run in a span linked to its push
            on_job = traced_run(self._tracing, self._namespace, self._lc.ctx.id, job.id,
                                job.fn, job.owner, store.trace(row), on_job)
        try:
            if self._steering.waiting and self._steering.starting(job):
                # A jobs.cancel of this job waited for the turn: the job never starts
                # (the run's scope is cancelled; this raises its Cancelled).
                await trio.lowlevel.checkpoint()
            if job.timeout is None:
                running = on_job(ctx)
                if type(running) is CoroutineType:
                    # Watched once it waits for something (``SlowDispatchWatch.waits``).
                    outcome = await watched(running, watch.waits)
                else:
                    watch.waits()
                    outcome = await running
                if outcome is not None:  # (None, most outcomes, needs no check)
                    outcome = coerce_outcome(outcome)
            else:
                watch.waits()
                outcome = coerce_outcome(await run_with_timeout(on_job, ctx, self._lc.label))
            if run.cancel is not None:
                # Cancelled (jobs.cancel), the job went on to the end: its run's scope
                # raises the Cancelled here, and it is cancelled all the same.
                await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            if trio.current_effective_deadline() != -math.inf:
                # A Cancelled the job made itself, not a cancellation of its scope: the
                # job's own failure.
                await self._job_failed(run, owner, ctx, exc, clock)
                return store.superseded
            # Shutdown or reset: a platform failure uses up no attempt. The job's
            # writes go (it runs again); the jobs that completed stay completed.
            store.fail()
            store.flush()
            if memory_reset_of(self._claim):
                await self._lc.observe_reset(job, reset_reason_of(self._claim))
            raise
        except MemoryError as exc:
            store.fail()
            store.flush()
            await self._lc.memory_error(job, exc)
        except (KeyboardInterrupt, SystemExit) as exc:
            store.fail()
            store.flush()
            if not from_signal(exc):
                # The job asked the process to stop: it may, once — with a crash strike
                # for the job first, so a job that does it every time is sealed, never
                # a loop. A Ctrl-C that landed in its code is no act of the job's: a
                # stop, as a cancellation is (issue 22 #3).
                await self._lc.strike_job(job.id, started,
                                          why=f"it raised {type(exc).__name__}")
            raise
        except BaseExceptionGroup as group:
            if (group.split(trio.Cancelled)[1] is None
                    and trio.current_effective_deadline() == -math.inf):
                # The job's own nursery, cancelled with it (a shutdown, a reset): the
                # job's cancellation, as above, not its failure.
                store.fail()
                store.flush()
                if memory_reset_of(self._claim):
                    await self._lc.observe_reset(job, reset_reason_of(self._claim))
                raise
            if (out_of_memory := memory_error_of(group)) is not None:
                # A task of the job's own nursery ran out of memory: the object's reset,
                # as a MemoryError the job raised itself, never an attempt used.
                store.fail()
                store.flush()
                await self._lc.memory_error(job, out_of_memory)
            else:
                await self._job_failed(run, owner, ctx, group, clock)
        except BaseException as exc:
            await self._job_failed(run, owner, ctx, exc, clock)
        else:
            self._watch.job = None
            self._metrics.job_ran(self._namespace, job.owner, run.time() - clock, True)
            store.complete(job, DONE if outcome is None else completion_of(
                job, outcome, marker=self._lc.running_marker(run, job)))
        finally:
            if store.tx.job_running:  # (something above was cut off)
                store.tx.end_job(keep=False)
            if flight is not None:
                flight.clear()
            run.job = None
            store.end_run()
        return store.superseded

    async def _job_failed(
        self, run: AlarmRun, owner: Any, ctx: JobContext, error: BaseException, clock: float
    ) -> None:
        """What the job raised is its own failure: an attempt, a retry, a dead letter."""
        if run.cancel is not None:
            # Cancelled (jobs.cancel), the job raised something else on its way out: no
            # attempt; its writes go, and its run's scope raises the Cancelled here.
            self._store.fail()
            await trio.lowlevel.checkpoint()
        self._watch.job = None
        seconds = run.time() - clock
        self._metrics.job_ran(self._namespace, ctx.job.owner, seconds, False)
        self._store.fail()
        await self._failed(owner, ctx, error, marker=self._lc.running_marker(run, ctx.job),
                           started=run.epoch + clock, seconds=seconds)

    async def _failed(
        self, owner: Any, ctx: JobContext, error: BaseException, *, marker: float | None,
        started: float = math.nan, seconds: float = math.nan,
    ) -> None:
        store, job, label = self._store, ctx.job, self._lc.label
        if store.superseded:
            return  # pushed, re-timed or cancelled during the run: that change wins
        if ctx.attempt < job.retry.max_attempts and not (
            job.retry.give_up_on and job.retry.gives_up_on(error)
        ):
            bound = job.retry.backoff_bound(ctx.attempt)
            delay = self._rng.uniform(0.0, bound) if job.retry.jitter else bound
            store.complete(job, Completion(kind="retry", kept=False,
                                           time=_clock.now() + delay, attempts=ctx.attempt,
                                           marker=marker,
                                           error=error_text(error), started=started,
                                           seconds=seconds))
            self._lc.emit("job:retry", id=job.id, owner=job.owner, fn=job.fn,
                          attempt=ctx.attempt, max_attempts=job.retry.max_attempts, delay=delay,
                          error=safe_repr(error),
                          _log=(logging.WARNING,
                                "job %r of %s failed (attempt %d of %d): %s; retrying in %.3f s",
                                (job.id, label, ctx.attempt, job.retry.max_attempts,
                                 safe_repr(error), delay)))
            return
        outcome: JobOutcome = None
        on_job_error = None if job.owner == HOST else getattr(owner, "on_job_error", None)
        if on_job_error is not None:
            try:
                outcome = coerce_outcome(await on_job_error(ctx, error))
            except Exception:
                logger.exception("on_job_error of %r failed for job %r", job.owner, job.id)
            if store.superseded:
                return
        if outcome is not None:
            store.complete(job, completion_of(job, outcome, kept=False, marker=marker))
            return
        buried = store.complete(job, Completion(kind="bury", kept=False, error=error_text(error),
                                                attempts=ctx.attempt, started=started,
                                                seconds=seconds))
        if buried is not None:
            self._lc.emit("job:dead_letter", id=job.id, owner=job.owner, fn=job.fn,
                          attempts=ctx.attempt, error=error_text(error),
                          _log=(logging.ERROR, "job %r of %s failed after %d attempts: %s",
                                (job.id, label, ctx.attempt, safe_repr(error))))

    def running_for(self) -> tuple[str, float] | None:
        """The job running now and how many seconds it has run (read from the alarm
        run's own record of it: nothing more is recorded per job for this)."""
        run = self._run
        if run is None or run.job is None:
            return None
        return run.job.id, run.epoch + run.time() - run.started
