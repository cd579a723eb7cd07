"""Owner-scoped views of an object's jobs: ``Jobs`` (``lifecycle.jobs``) and
``CapabilityLifecycle`` (``self.lifecycle`` inside a capability).

A view validates its arguments and goes to the ``JobStore``; it holds no state of its
own beyond its owner. Neither is meant to be built by users.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from nursery_jobs import _clock
from nursery_jobs._codec import encode_payload
from nursery_jobs._errors import CapabilityError, JobError
from nursery_jobs._events import EventBus
from nursery_jobs._jobs._records import (
    DeadLetter,
    Job,
    check_before,
    check_fn,
    check_hung_timeout,
    check_job_id,
    check_priority,
    check_retry,
    check_timeout,
    checked_job,
    new_job_id,
    resolve_time,
)
from nursery_jobs._jobs._steering import Cancelled, Selection
from nursery_jobs._policy import RetryOptions

if TYPE_CHECKING:
    from nursery_jobs._jobs._lifecycle import Lifecycle
    from nursery_jobs._jobs._steering import Steering
    from nursery_jobs._jobs._store import JobStore

_TOKEN = object()  # what only the Lifecycle passes: the views are not built by users


def _check_token(token: object, name: str) -> None:
    if token is not _TOKEN:
        raise TypeError(f"{name} is made by the Lifecycle; use lifecycle.jobs instead")


class Jobs:
    """``lifecycle.jobs``: push, cancel, reschedule and read the jobs of one owner."""

    __slots__ = ("_steering", "_store", "owner")

    def __init__(
        self, store: JobStore, owner: str, *, _token: object = None,
        _steering: Steering | None = None,
    ) -> None:
        _check_token(_token, "Jobs")
        assert _steering is not None
        self._store = store
        self._steering = _steering
        self.owner = owner

    def __repr__(self) -> str:
        return f"<Jobs of {self.owner!r}>"

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
        priority: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109 (the job's, stored: not this call's)
    ) -> Job:
        """Store a job; durable (committed, alarm lowered) when it returns.

        Pushing an id this owner already holds replaces that job in place. Among due
        jobs a higher ``priority`` runs first. A run still going after ``timeout``
        seconds is cancelled and fails with ``JobTimeoutError`` (an attempt, retried by
        ``retry``). Checkpoints.

        Raises:
            JobOwnershipError: another owner holds ``id``.
            JobError: a bad argument (nothing is written).
            CodecError: a payload that cannot be stored (nothing is written).
        """
        fn = check_fn(fn)
        # A relative delay counts from the wall clock as it is now (issue 22 #11).
        now = _clock.now() if delay is None else _clock.fresh_now()
        job_id = new_job_id(now) if id is None else check_job_id(id)
        label = job_id if id is not None else f"fn={fn}"  # name what the caller gave
        when = resolve_time(time, delay, now, job=label)
        retry = check_retry(retry, job=label)
        hung_timeout = check_hung_timeout(hung_timeout, job=label)
        priority = check_priority(priority, job=label)
        timeout = check_timeout(timeout, job=label)
        for name, flag in (("singleflight", singleflight), ("exclusive", exclusive),
                           ("recovery_loop", recovery_loop)):
            if not isinstance(flag, bool):
                raise JobError(f"job {label!r}: {name} must be a bool, got {flag!r}")
        payload_text = encode_payload(payload)
        job = checked_job(job_id, self.owner, fn, when, payload, retry, singleflight,
                          hung_timeout, exclusive, recovery_loop, now, priority, timeout)
        await trio.lowlevel.checkpoint()  # (see _checkpoint: inlined on the push path)
        job = self._store.push(job, payload_text, stable_id=id is not None)
        await self._store.durable()
        return job

    async def cancel(self, id: str) -> bool:
        """Delete this owner's job ``id``; return whether it existed. Checkpoints.

        Called where no turn of the object is held (an ``@nj.interleave`` method, a
        background task), a run of the job in progress is cancelled at once, with the
        tracked work it started, and the job deleted: no retry, no dead letter,
        ``job:cancelled``; it returns once that is committed. Called inside a turn (a
        stub call, the job itself), it waits for no run: a run in progress is its
        caller's own, and its result is discarded. Either way, tracked work that a run
        of the job started ends with it.
        """
        job_id = check_job_id(id)
        await self._checkpoint()
        return bool(await self._steering.cancel(Selection(owners=(self.owner,), job_id=job_id)))

    async def reschedule(self, id: str, time: float | datetime.datetime) -> bool:
        """Move this owner's job ``id`` to ``time``; return whether it existed."""
        job_id = check_job_id(id)
        try:
            when = _clock.coerce_time(time, name=f"reschedule {job_id!r}: time")
        except (TypeError, ValueError) as exc:
            raise JobError(str(exc), job_id=job_id) from None
        await self._checkpoint()
        moved = self._store.reschedule(self.owner, job_id, when)
        await self._store.durable()
        return moved

    def get(self, id: str) -> Job | None:
        """Return this owner's job ``id``, or None. Does not checkpoint."""
        row = self._store.row(check_job_id(id))
        return None if row is None or row.job.owner != self.owner else row.job

    def list(self) -> list[Job]:
        """Return this owner's jobs by due time (then push order). Does not
        checkpoint."""
        return [row.job for row in self._store.rows(self.owner)]

    async def rearm(self) -> None:
        """Set the object's alarm from the queue as it stands. Checkpoints."""
        await trio.lowlevel.checkpoint()
        self._store.rearm(write_through=True)

    async def _checkpoint(self) -> None:
        # (Every async call of the API checkpoints, even inside storage.transaction():
        # the turn keeps other tasks out of the object meanwhile.)
        await trio.lowlevel.checkpoint()


class CapabilityLifecycle:
    """``self.lifecycle`` inside a capability: the Lifecycle scoped to that capability."""

    __slots__ = ("_lifecycle", "capability_id", "jobs")

    def __init__(self, lifecycle: Lifecycle, capability_id: str, *, _token: object = None) -> None:
        _check_token(_token, "CapabilityLifecycle")
        self._lifecycle = lifecycle
        self.capability_id = capability_id
        self.jobs = Jobs(lifecycle.store, capability_id, _token=_TOKEN,
                         _steering=lifecycle.steering)

    def track_alarm_work(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """See ``Lifecycle.track_alarm_work``."""
        return self._lifecycle.track_alarm_work(fn, *args)

    def emit(self, type: str, **data: Any) -> None:
        """Publish a diagnostics event from this object. Does not checkpoint."""
        self._lifecycle.emit(type, **data)

    @property
    def events(self) -> EventBus:
        return self._lifecycle.ctx.events

    def dead_letters(self) -> list[DeadLetter]:
        """This capability's dead letters, oldest first."""
        return self._lifecycle.store.dead_letters(self.capability_id)

    async def requeue(self, id: str) -> Job | None:
        """Put this capability's dead letter ``id`` back in the queue, due now."""
        return await self._lifecycle.requeue(id, owner=self.capability_id)

    async def discard(self, id: str) -> bool:
        """Delete this capability's dead letter ``id``; return whether it existed."""
        return await self._lifecycle.discard(id, owner=self.capability_id)

    async def discard_dead_letters(self, *, before: Any = None) -> int:
        """Delete this capability's dead letters buried before ``before`` (None: all)."""
        cutoff = check_before(before)
        await trio.lowlevel.checkpoint()
        return self._lifecycle.store.discard_dead_letters(self.capability_id, cutoff)

    async def rearm_alarm(self) -> None:
        await self._lifecycle.rearm_alarm()

    async def pause(self, owner: str | None = None) -> None:
        """Pause this capability's jobs (``owner``: None or this capability's id). See
        ``Lifecycle.pause``."""
        await self._lifecycle.pause(self._own(owner))

    async def resume(self, owner: str | None = None) -> None:
        """Resume this capability's jobs (``owner``: None or this capability's id)."""
        await self._lifecycle.resume(self._own(owner))

    def paused(self) -> frozenset[str | None]:
        """See ``Lifecycle.paused`` (every paused owner of the object)."""
        return self._lifecycle.paused()

    def _own(self, owner: object) -> str:
        if owner is None or owner == self.capability_id:
            return self.capability_id
        raise CapabilityError(
            f"capability {self.capability_id!r} may pause or resume only its own jobs"
            f" (owner None or {self.capability_id!r}), got owner {owner!r}"
        )


async def cancel_jobs(*jobs: Jobs, id: str | None = None, fn: str | None = None) -> list[
        Cancelled]:
    """Cancel the jobs of the owners of ``jobs`` (views of one Lifecycle) of id ``id``
    (every job: None) whose fn is ``fn`` (any: None), as ``Jobs.cancel`` cancels one —
    from a task that holds no turn too, where a run in progress of one of them is
    cancelled at once; return the jobs cancelled. For capabilities
    (``Queue.cancel_all``, ``Scheduler.cancel``, ``Agent.cancel_schedule``): which jobs
    those are is read where the turn is held, never before. Checkpoints."""
    steering = jobs[0]._steering
    assert all(view._steering is steering for view in jobs)
    selection = Selection(owners=tuple(view.owner for view in jobs),
                          job_id=None if id is None else check_job_id(id), fn=fn)
    await trio.lowlevel.checkpoint()
    return await steering.cancel(selection)


def jobs_view(store: JobStore, owner: str, steering: Steering) -> Jobs:
    return Jobs(store, owner, _token=_TOKEN, _steering=steering)


def capability_view(lifecycle: Lifecycle, capability_id: str) -> CapabilityLifecycle:
    return CapabilityLifecycle(lifecycle, capability_id, _token=_TOKEN)
