"""The Lifecycle: claims an object's alarm and runs its jobs through capabilities.

``Lifecycle.install(obj)`` claims the object's alarm (``ctx.claim_alarm``), opens its
``JobStore`` and hands the alarm run to an ``AlarmRunner``. Startup (crash strikes,
then each capability's ``on_start``) runs once per activation.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import trio

from nursery_jobs._core._object import DurableObject
from nursery_jobs._errors import (
    CapabilityError,
    DamagedJobError,
    LifecycleArgumentError,
    memory_error_of,
    safe_repr,
    sole_leaf,
)
from nursery_jobs._jobs._alarm_run import (
    AlarmRun,
    AlarmRunner,
    current_run,
    memory_reset_of,
    reset_reason_of,
)
from nursery_jobs._jobs._capability import Capability
from nursery_jobs._jobs._records import HOST, DeadLetter, Job, check_before, check_job_id
from nursery_jobs._jobs._steering import Steering
from nursery_jobs._jobs._store import DEFAULT_COMPLETION_GROUP, DEFAULT_DEAD_LETTER_LIMIT, JobStore
from nursery_jobs._jobs._strikes import (
    MemoryBreaker,
    MemoryLimitContext,
    recover_crashes,
    strike_now,
)
from nursery_jobs._jobs._views import capability_view, jobs_view
from nursery_jobs._names import check_name
from nursery_jobs._policy import LIFECYCLE_RETRY

logger = logging.getLogger("nursery_jobs")

# Full-jitter backoff draws from this unless ``Lifecycle.install(rng=...)`` is given.
_DEFAULT_RNG: Final = random.Random()
# How long tracked work that ends (or is cancelled) waits for the object's turn to record it.
LAST_TURN_WAIT: Final = 5.0


class Lifecycle:
    """The job queue of one object. Create it with ``Lifecycle.install(self)`` in the
    object's ``__init__``; it then owns the object's alarm."""

    def __init__(
        self,
        host: DurableObject,
        *,
        max_alarm_memory_limit_strikes: int = 3,
        completion_group: int = DEFAULT_COMPLETION_GROUP,
        rng: random.Random | None = None,
        dead_letter_limit: int = DEFAULT_DEAD_LETTER_LIMIT,
    ) -> None:
        if not isinstance(host, DurableObject):
            raise LifecycleArgumentError(
                f"Lifecycle.install(): host must be a DurableObject, got {safe_repr(host)}")
        for name, value in (("max_alarm_memory_limit_strikes", max_alarm_memory_limit_strikes),
                            ("completion_group", completion_group),
                            ("dead_letter_limit", dead_letter_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LifecycleArgumentError(
                    f"Lifecycle.install(): {name} must be an int >= 1, got {safe_repr(value)}")
        if rng is not None and not isinstance(rng, random.Random):
            raise LifecycleArgumentError(
                f"Lifecycle.install(): rng must be a random.Random, got {safe_repr(rng)}")
        ctx = host.ctx
        self.host = host
        self.ctx = ctx
        self.label = f"{ctx.namespace}/{ctx.id}"
        self.max_alarm_memory_limit_strikes = max_alarm_memory_limit_strikes
        self._runner: AlarmRunner | None = None
        self.claim = ctx.claim_alarm("Lifecycle", self._alarm_run, LIFECYCLE_RETRY)
        self.store = JobStore(self.claim.transactions.conn, self.claim, self.claim.transactions,
                              completion_group=completion_group,
                              dead_letter_limit=dead_letter_limit,
                              on_dropped=self._dead_letter_dropped,
                              on_damaged=self._job_damaged, label=self.label)
        self.steering = Steering(self.store, self.claim.turns)
        self.jobs = jobs_view(self.store, HOST, self.steering)
        self.breaker = MemoryBreaker(self.store, max_alarm_memory_limit_strikes, self.label,
                                     self.emit)
        self._runner = AlarmRunner(self, rng or _DEFAULT_RNG)
        self._capabilities: dict[str, Capability] = {}
        self.started = False
        self._starting: trio.Event | None = None
        # Jobs sealed at their crash-strike limit whose hooks have not been called yet.
        self._seals: list[Job] = []
        # Tracked alarm work in progress: (job owner, job id) -> {when the run that
        # started it started: how many tasks}. Empty: none.
        self.tracked: dict[tuple[str, str], dict[float, int]] = {}
        # Every tracked work task in progress, whether a job started it or on_alarm did:
        # only with none is an alarm run quiescent (it clears the breaker's count).
        self.outstanding = 0
        # A row the store writes for a job carries the marker of its work in progress.
        self.store.work_since = self.work_since
        # Startup (crash strikes, capabilities' on_start, re-arming the alarm from the
        # queue) runs before the first call too, not only when an alarm wakes us.
        self.claim.on_startup(self.start)

    @classmethod
    def install(
        cls,
        host: DurableObject,
        max_alarm_memory_limit_strikes: int = 3,
        *,
        completion_group: int = DEFAULT_COMPLETION_GROUP,
        rng: random.Random | None = None,
        dead_letter_limit: int = DEFAULT_DEAD_LETTER_LIMIT,
    ) -> Lifecycle:
        """Create the Lifecycle of ``host`` and hand it the object's alarm.

        ``completion_group`` bounds how many completed jobs a process death may re-run
        (their outcomes are committed together); 1 commits each completion. ``rng``
        draws the retry jitter (seed one for reproducible tests). At most
        ``dead_letter_limit`` dead letters are kept; past it the oldest is dropped with a
        ``job:dead_letter_dropped`` event.
        """
        return cls(host, max_alarm_memory_limit_strikes=max_alarm_memory_limit_strikes,
                   completion_group=completion_group, rng=rng,
                   dead_letter_limit=dead_letter_limit)

    def __repr__(self) -> str:
        return f"<Lifecycle {self.label}>"

    async def _alarm_run(self, info: Any) -> None:
        assert self._runner is not None
        await self._runner(info)

    def running_for(self) -> tuple[str, float] | None:
        """The job running now and how many seconds it has run, if one runs."""
        return None if self._runner is None else self._runner.running_for()

    # -- capabilities ---------------------------------------------------------------
    def use(self, *capabilities: Capability) -> Lifecycle:
        """Install capabilities (before startup). Returns self for chaining."""
        if self.started:
            raise CapabilityError(f"{self!r}: capabilities must be added before startup")
        for cap in capabilities:
            if not isinstance(cap, Capability):
                raise LifecycleArgumentError(
                    f"{self!r}: use() takes Capability instances, got {safe_repr(cap)}")
            cap_id = check_name(cap._capability_id(), f"capability {cap!r} id", CapabilityError)
            if cap_id == HOST:
                raise CapabilityError(f"capability {cap!r} needs an id other than {HOST!r}")
            if cap_id in self._capabilities:
                raise CapabilityError(
                    f"{self!r}: a capability with id {cap_id!r} is already installed"
                )
            self._capabilities[cap_id] = cap
            cap.lifecycle = capability_view(self, cap_id)
            cap.host = self.host
        return self

    @property
    def capabilities(self) -> dict[str, Capability]:
        return dict(self._capabilities)

    def capability(self, cap_id: str) -> Capability | None:
        return self._capabilities.get(cap_id)

    # -- startup --------------------------------------------------------------------
    async def start(self, *, rearm: bool = True) -> None:
        """Recover from a crash (crash strikes), then run each capability's
        ``on_start``, then set the alarm for the next due job (unless not ``rearm``:
        an alarm run re-arms at its end). Runs once per activation; later calls
        return at once."""
        if self.started:
            await trio.lowlevel.checkpoint()
            return
        if self._starting is not None:
            await self._starting.wait()
            if not self.started:
                await self.start(rearm=rearm)
            return
        self._starting = starting = trio.Event()
        try:
            self.store.set_aside_untimed()
            # Sealed jobs wait here for their hooks until the capabilities have started:
            # a start that fails (and is retried) keeps them, since its seals stand.
            self._seals += recover_crashes(self.store, self.claim,
                                           self.max_alarm_memory_limit_strikes, self.label,
                                           self.emit)
            for cap in self._capabilities.values():
                await cap.on_start()
            self.started = True
            await self._deliver_seals()
        finally:
            self._starting = None
            starting.set()
        if rearm:
            self.store.rearm()

    # -- the alarm --------------------------------------------------------------------
    async def rearm_alarm(self) -> None:
        """Set the alarm for the next due job as the queue stands, writing it through
        to the runtime's alarm index even if it seems to be there. Checkpoints."""
        await trio.lowlevel.checkpoint()
        self.store.rearm(write_through=True)

    async def disable_alarms(self) -> None:
        """Turn the alarm off for good (teardown; durable across activations) and stop
        the current run after its job. Jobs stay. Checkpoints."""
        await trio.lowlevel.checkpoint()
        self.store.disable()

    # -- pausing ----------------------------------------------------------------------
    async def pause(self, owner: str | None = None) -> None:
        """Pause the jobs of ``owner`` ("host" or a capability id; None: every owner),
        durably: they stay due but do not run, nor wake the object, until ``resume``.
        Pushes are still accepted. Emits ``object:paused`` if it was not paused.
        Checkpoints.

        Raises:
            CapabilityError: ``owner`` is neither None, "host" nor an installed
                capability's id (nothing is written).
        """
        await self._set_paused(self._check_owner(owner), True)

    async def resume(self, owner: str | None = None) -> None:
        """Resume the jobs of ``owner`` (None: lift every pause of the object, its own
        and each owner's); what is due runs at once. A resumed owner's jobs stay held
        while the whole object is paused. Emits ``object:resumed``. Checkpoints.

        Raises:
            CapabilityError: as ``pause``.
        """
        owner = self._check_owner(owner)
        if owner is None:
            for named in sorted(o for o in self.store.paused if o is not None):
                await self._set_paused(named, False)
        await self._set_paused(owner, False)

    def paused(self) -> frozenset[str | None]:
        """The paused owners; None among them: the whole object is paused. Does not
        checkpoint."""
        self.store.reading()
        return self.store.paused

    def _check_owner(self, owner: object) -> str | None:
        if owner is None or owner == HOST or (
            isinstance(owner, str) and owner in self._capabilities
        ):
            return owner  # type: ignore[return-value]
        raise CapabilityError(
            f"{self!r}: owner must be None (every owner), {HOST!r} or an installed"
            f" capability's id ({', '.join(map(repr, self._capabilities)) or 'none'}),"
            f" got {owner!r}"
        )

    async def _set_paused(self, owner: str | None, paused: bool) -> None:
        await trio.lowlevel.checkpoint()
        if self.store.set_paused(owner, paused):
            await self.store.durable()
            self.emit("object:paused" if paused else "object:resumed", owner=owner)

    # -- long work --------------------------------------------------------------------
    def track_alarm_work(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """Start ``fn(*args)`` in the object's nursery under the current alarm run.

        Returns False (and starts nothing) outside an alarm run or ``on_alarm``. The
        work keeps the object resident; a single-flight job that started it counts as
        running until the work ends. Does not checkpoint.
        """
        run = current_run.get()
        if run is None or not run.active or run.lifecycle is not self:
            return False
        job, started = run.job, run.started
        if job is not None:
            if not run.tracked:
                # The job counts as running until its work ends (single-flight, and a
                # death meanwhile is a crash strike of this job).
                self.store.set_marker(job.id, started)
            run.tracked = True
            runs = self.tracked.setdefault((job.owner, job.id), {})
            runs[started] = runs.get(started, 0) + 1
        self.ctx.nursery.start_soon(self._tracked_work, fn, args, job, started)
        self.outstanding += 1  # (the task runs later: it counts itself out when it ends)
        return True

    def running_marker(self, run: AlarmRun, job: Job) -> float | None:
        """The job's running marker after this run: when its tracked work in progress
        started (this run's, else the latest earlier run's that goes on), or None. A
        heartbeat that found the work running must not erase what a crash during it is
        attributed by, nor a retry what single-flight holds it by (a failed run's own
        marker was rolled back with its writes)."""
        if run.tracked:
            return run.started
        return self.work_since(job.owner, job.id)

    def work_since(self, owner: str, job_id: str) -> float | None:
        """When the latest run of ``owner``'s job ``job_id`` whose tracked work goes on
        started, or None: the job's running marker, whichever row holds the job now (a
        job pushed again after it completed is held by its work as a replaced one is).
        Does not checkpoint."""
        runs = self.tracked.get((owner, job_id)) if self.tracked else None
        return max(runs) if runs else None

    async def _tracked_work(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], job: Job | None,
        started: float,
    ) -> None:
        """Tracked work holds no turn of the object (it enters ``ctx.turn()`` to touch
        storage); what it records when it ends is written in a turn of its own."""
        claim = self.claim
        try:
            with claim.working(alarm=True):
                try:
                    with self.steering.work_scope(job):  # (a cancel of the job ends it)
                        await fn(*args)
                except trio.Cancelled:
                    # Work that hits the memory limit counts against the job that
                    # started it.
                    if memory_reset_of(claim) and (job is not None or not self.breaker.tripped):
                        async with self._last_turn("tracked work reset"):
                            await self.observe_reset(job, reset_reason_of(claim))
                    raise
                except Exception as exc:
                    if (out_of_memory := memory_error_of(exc)) is not None:
                        # (Raised by the work, or by a task of its own nursery.)
                        async with self._last_turn("tracked work out of memory"):
                            await self.memory_error(job, out_of_memory)
                    else:
                        error = safe_repr(sole_leaf(exc))
                        self.emit("alarm:tracked_work_failed",
                                  job=None if job is None else job.id, error=error,
                                  _exc_info=exc,
                                  _log=(logging.ERROR, "tracked work %s of %s failed: %s",
                                        (safe_repr(fn), self.label, error)))
        finally:
            self.outstanding -= 1
            if job is not None:
                key = (job.owner, job.id)
                runs = self.tracked[key]
                left = runs[started] - 1
                if left:
                    runs[started] = left
                else:
                    del runs[started]
                    if not runs:
                        del self.tracked[key]
                    async with self._last_turn("tracked work ending"):
                        # The marker goes to the work of the job that goes on, if any
                        # (an earlier run's may outlast this one's), else it is cleared.
                        rest = self.work_since(job.owner, job.id)
                        if self.store.clear_marker(job.id, started, rest):
                            self.store.rearm()

    @asynccontextmanager
    async def _last_turn(self, holder: str) -> AsyncIterator[None]:
        """Hold the object's turn for a last record, even on the way out of a cancelled
        task: shielded, a bounded while (whoever holds it is being cancelled too). Not
        getting it in time, the record is not made (logged): a reset object's state is
        read again from its database on its next activation."""
        with trio.move_on_after(LAST_TURN_WAIT, shield=True) as scope:
            async with self.claim.turns.turn("write", holder):
                yield
        if scope.cancelled_caught:
            logger.warning("%s: %s could not get the object's turn within %.0f s; not"
                           " recorded", self.label, holder, LAST_TURN_WAIT)

    async def strike_job(self, job_id: str, started: float, *, why: str) -> None:
        """Give a job a crash strike now (it is about to take the process down); one
        that this seals gets its hooks called now (shielded, bounded), as a seal at the
        next start would: the process exits after this."""
        job = strike_now(self.store, job_id, started, self.max_alarm_memory_limit_strikes,
                         self.label, self.emit, why=why)
        if job is not None:
            self._seals.append(job)
            with trio.move_on_after(10, shield=True):
                await self._deliver_seals()

    async def _deliver_seals(self) -> None:
        """Call the hooks (``sealed=True``) for each job sealed at its crash-strike
        limit whose hooks were not called yet, once each."""
        while self._seals:
            job = self._seals.pop(0)
            await self.call_memory_hooks(
                MemoryLimitContext(sealed=True, next_time=None, executing=job,
                                   purged_recovery_loop_jobs=[]))

    # -- memory limits ------------------------------------------------------------------
    async def memory_error(self, job: Job | None, error: MemoryError) -> None:
        """A ``MemoryError`` escaped alarm work: reset the object as the watchdog would."""
        self.claim.reset(f"MemoryError in the alarm work of {self.label}: {safe_repr(error)}",
                         memory=True)
        await self.observe_reset(job, reset_reason_of(self.claim))
        await trio.lowlevel.checkpoint()  # the reset cancels this task here

    async def observe_reset(self, executing: Job | None, error: str | None) -> None:
        """This object was reset for memory while ``executing`` ran: strike, move or
        seal, re-arm, then tell the capabilities and the host (shielded, bounded)."""
        context = self.breaker.observe(executing, error or "memory limit")
        self.store.rearm()
        with trio.move_on_after(10, shield=True):
            await self.call_memory_hooks(context)

    async def call_memory_hooks(self, ctx: MemoryLimitContext) -> None:
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
                logger.exception("on_alarm_memory_limit of %s failed", self.label)

    # -- dead letters -----------------------------------------------------------------
    def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter of this object (all owners), oldest first."""
        return self.store.dead_letters(None)

    async def requeue(self, id: str, *, owner: str = HOST) -> Job | None:
        """Put dead letter ``id`` of ``owner`` back in the queue, due now, with fresh
        attempts. Returns the job, or None if there is no such dead letter."""
        job_id = check_job_id(id)
        await trio.lowlevel.checkpoint()
        return self.store.requeue(owner, job_id)

    async def discard(self, id: str, *, owner: str = HOST) -> bool:
        """Delete dead letter ``id`` of ``owner``; return whether it existed.
        Checkpoints."""
        job_id = check_job_id(id)
        await trio.lowlevel.checkpoint()
        return self.store.discard(owner, job_id)

    async def discard_dead_letters(self, *, before: Any = None) -> int:
        """Delete every dead letter of this object (all owners) buried before ``before``
        (epoch seconds or aware datetime; None: all). Returns how many. Checkpoints."""
        cutoff = check_before(before)
        await trio.lowlevel.checkpoint()
        return self.store.discard_dead_letters(None, cutoff)

    def _dead_letter_dropped(self, owner: str, job_id: str) -> None:
        self.emit("job:dead_letter_dropped", owner=owner, id=job_id,
                  limit=self.store.dead_letter_limit)

    def _job_damaged(self, error: DamagedJobError) -> None:
        self.emit("job:damaged", owner=error.owner, id=error.job_id, error=str(error),
                  _log=(logging.ERROR, "%s (buried as a dead letter of reason 'damaged';"
                        " the other jobs run)", (error,)))

    # -- diagnostics ------------------------------------------------------------------
    def emit(self, type: str, **data: Any) -> None:
        """Publish a diagnostics event from this object. Does not checkpoint."""
        self.ctx.events.emit(type, self.ctx.namespace, self.ctx.id, **data)
