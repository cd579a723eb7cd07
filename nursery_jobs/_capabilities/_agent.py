"""Agent: a DurableObject with a Lifecycle, a Queue and a Scheduler that dispatch to
its own methods by name."""

from __future__ import annotations

import contextvars
import logging
import zoneinfo
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import attrs

from nursery_jobs import _clock, _codec
from nursery_jobs._capabilities._queue import Queue, QueueItem, call_callback, callback_filter
from nursery_jobs._capabilities._scheduler import (
    Missed,
    Schedule,
    Scheduler,
    When,
    schedules_cancelled,
)
from nursery_jobs._core._object import DurableObject, ObjectContext
from nursery_jobs._errors import JobError, UnknownCallbackError, safe_repr
from nursery_jobs._jobs._lifecycle import Lifecycle
from nursery_jobs._jobs._records import DeadLetter, Job, JobContext, JobOutcome
from nursery_jobs._jobs._views import cancel_jobs
from nursery_jobs._policy import MAX_ATTEMPTS, RetryOptions

logger = logging.getLogger("nursery_jobs")

DESTROY_JOB = "nj:destroy"


@attrs.frozen(kw_only=True)
class TaskRecord:
    """A queued or scheduled task of an Agent, from ``list_schedules()``."""

    id: str
    name: str
    payload: Any
    due: float
    every: float | None
    attempts: int
    max_retries: int
    created_at: float


@attrs.frozen(kw_only=True)
class TaskInfo:
    """Which task and which delivery (1-based) this is: passed to ``on_task``, and
    ``Agent.current_task`` while a task's method runs."""

    id: str
    name: str
    attempt: int


# (A stub call may return them.)
_codec.register_record(TaskRecord, "TaskRecord")
_codec.register_record(TaskInfo, "TaskInfo")

# The task running in this Trio task (and the tasks it starts), with its Agent: a
# context variable, so a call that another task makes meanwhile (an @interleave
# method, a read-only turn) sees none, and the Agent, so a call into another Agent
# made from a task does not see the caller's.
_RUNNING_TASK: contextvars.ContextVar[tuple[Agent, TaskInfo] | None] = contextvars.ContextVar(
    "nursery_jobs_agent_task", default=None)


def agent_retry(max_retries: int) -> RetryOptions:
    """1 s doubling, capped at 5 minutes, ``max_retries`` after the first delivery."""
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or not (
        0 <= max_retries < MAX_ATTEMPTS
    ):
        # (Checked here, not left to RetryOptions: its message named max_attempts and
        # max_retries + 1, neither of which the caller gave.)
        raise JobError(
            f"max_retries must be an int in [0, {MAX_ATTEMPTS - 1}], got {max_retries!r}")
    return RetryOptions(max_attempts=max_retries + 1, base_delay=1.0, max_delay=300.0,
                        jitter=False)


class _Methods(Mapping[str, Callable[[Any, Any], Any]]):
    """The Agent's methods as a callback mapping for its Queue and Scheduler."""

    __slots__ = ("_agent",)

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def _method(self, name: str) -> Callable[..., Any] | None:
        if not_a_task(name):
            return None
        fn = getattr(self._agent, name, None)
        return fn if callable(fn) and hasattr(fn, "__self__") else None

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or not name:
            return False
        return self._method(name) is not None or type(self._agent).on_task is not Agent.on_task

    def __getitem__(self, name: str) -> Callable[[Any, Any], Any]:
        if name not in self:
            raise KeyError(name)
        return lambda payload, item: self._agent._run_task(name, payload, item)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(n for n in dir(type(self._agent)) if self._method(n) is not None))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Agent(DurableObject):
    """A DurableObject with Lifecycle, Queue and Scheduler installed.

    ``await self.queue("method", payload)`` runs ``self.method(payload)`` soon;
    ``schedule(when, ...)`` and ``every(seconds, ...)`` run it later. A missing
    method falls back to ``on_task(name, payload, info)``.
    """

    max_alarm_memory_limit_strikes: ClassVar[int] = 3
    # Dispatch hooks are called by the Lifecycle, never by a stub.
    _rpc_hidden: ClassVar[frozenset[str]] = DurableObject._rpc_hidden | {
        "on_job", "on_task", "on_error"}

    def __init__(self, ctx: ObjectContext) -> None:
        super().__init__(ctx)
        methods = _Methods(self)
        self.lifecycle = Lifecycle.install(
            self, max_alarm_memory_limit_strikes=self.max_alarm_memory_limit_strikes
        )
        self._task_queue = Queue(methods, retry=agent_retry(5), on_error=self._task_failed,
                                 id="agent:queue")
        self._task_scheduler = Scheduler(methods, retry=agent_retry(5),
                                         on_error=self._task_failed, id="agent:scheduler")
        self.lifecycle.use(self._task_queue, self._task_scheduler)

    # -- scheduling -------------------------------------------------------------------
    def _check(self, method: str) -> None:
        if not isinstance(method, str) or method not in self._task_queue.callbacks:
            raise UnknownCallbackError(
                f"{type(self).__qualname__} has no method {method!r} and no on_task override"
                " to handle it"
            )

    async def queue(
        self, method: str, payload: Any = None, *, id: str | None = None, max_retries: int = 5
    ) -> str:
        """Run ``self.<method>(payload)`` as soon as possible; return the task id."""
        self._check(method)
        item = await self._task_queue.push(method, payload, id=id, retry=agent_retry(max_retries))
        return item.id

    async def schedule(
        self, when: When, method: str, payload: Any = None, *, id: str | None = None,
        max_retries: int = 5, tz: str | zoneinfo.ZoneInfo | None = None,
        missed: Missed = "coalesce",
    ) -> str:
        """Run ``self.<method>(payload)`` at ``when`` (delay, timedelta, aware datetime
        or 5-field cron string, read in IANA zone ``tz``, default UTC); return the task
        id. ``missed="skip"`` drops the slots of a cron the process missed instead of
        one catch-up run (``Scheduler.schedule``)."""
        self._check(method)
        schedule = await self._task_scheduler.schedule(
            when, method, payload, id=id, retry=agent_retry(max_retries), tz=tz, missed=missed
        )
        return schedule.id

    async def every(
        self, seconds: float, method: str, payload: Any = None, *, id: str | None = None,
        max_retries: int = 5, missed: Missed = "coalesce",
    ) -> str:
        """Run ``self.<method>(payload)`` every ``seconds``; return the task id.
        ``missed="skip"`` drops missed slots instead of one catch-up run
        (``Scheduler.every``)."""
        self._check(method)
        schedule = await self._task_scheduler.every(
            seconds, method, payload, id=id, retry=agent_retry(max_retries), missed=missed
        )
        return schedule.id

    # -- dead letters (queued and scheduled tasks whose retries ran out) ---------------
    def dead_letters(self) -> list[DeadLetter]:
        """Tasks whose retries ran out (queued and scheduled), oldest first."""
        owners = (self._task_queue.id, self._task_scheduler.id)
        return [d for d in self.lifecycle.dead_letters() if d.job.owner in owners]

    async def requeue(self, id: str) -> bool:
        """Run the dead task ``id`` again with fresh attempts; return whether it was
        there. Checkpoints."""
        if await self._task_queue.requeue(id) is not None:
            return True
        return await self._task_scheduler.requeue(id) is not None

    async def discard(self, id: str) -> bool:
        """Delete the dead task ``id``; return whether it was there. Checkpoints."""
        if await self._task_queue.discard(id):
            return True
        return await self._task_scheduler.discard(id)

    async def discard_dead_letters(self, *, before: Any = None) -> int:
        """Delete the dead tasks buried before ``before`` (None: all); return how many."""
        return (await self._task_queue.discard_dead_letters(before=before)
                + await self._task_scheduler.discard_dead_letters(before=before))

    async def cancel_schedule(self, id: str) -> bool:
        """Cancel a queued or scheduled task; return whether it existed. A run of it in
        progress is cancelled as ``dequeue`` cancels one: at once where no turn is held
        (an ``@nj.interleave`` method). Checkpoints."""
        scheduler = self._task_scheduler
        cancelled = await cancel_jobs(scheduler.lifecycle.jobs, self._task_queue.lifecycle.jobs,
                                      id=id)
        schedules_cancelled(scheduler, cancelled)
        return bool(cancelled)

    # -- queued tasks (the reference's getQueue, getQueues, dequeue, dequeueAll) --------
    def get_queued(self, id: str) -> QueueItem | None:
        """Return queued task ``id`` (not a scheduled one), or None. Does not checkpoint."""
        return self._task_queue.get(id)

    def list_queued(self, method: str | None = None) -> list[QueueItem]:
        """Return the queued tasks (of ``method``, if given) in run order; a task whose
        run is in progress is listed until it ends. Does not checkpoint."""
        return self._task_queue.list(callback_filter(method, call="list_queued",
                                                     argument="method"))

    async def dequeue(self, id: str) -> bool:
        """Remove queued task ``id``; return whether it was queued. A scheduled task is
        left alone (``cancel_schedule`` removes either). A run in progress finishes,
        but is neither retried nor dead-lettered — unless this is called where no turn
        is held (an ``@nj.interleave`` method): then that run is cancelled at once, as
        ``jobs.cancel`` does. Checkpoints."""
        return await self._task_queue.cancel(id)

    async def dequeue_all(self, method: str | None = None) -> int:
        """Remove every queued task (of ``method``, if given); return how many.
        Scheduled tasks stay. A run in progress is cancelled as ``dequeue`` cancels
        one. Checkpoints."""
        return await self._task_queue.cancel_all(callback_filter(method, call="dequeue_all",
                                                                 argument="method"))

    def list_schedules(self) -> list[TaskRecord]:
        """Every queued and scheduled task, by due time."""
        store = self.lifecycle.store
        records = [
            self._record(row.job, row.attempts)
            for owner in (self._task_queue.id, self._task_scheduler.id)
            for row in store.rows(owner)
        ]
        records.sort(key=lambda r: r.due)
        return records

    def _record(self, job: Job, attempts: int) -> TaskRecord:
        envelope = job.payload
        due = job.time
        if job.owner == self._task_queue.id:
            # A queue item's time encodes its place in line; it is due from its push
            # ("pos") until a failed attempt re-times it for the retry.
            due = max(envelope["pos"], job.time)
        return TaskRecord(
            id=job.id, name=job.fn, payload=envelope["p"], due=due, every=envelope.get("i"),
            attempts=attempts, max_retries=job.retry.max_attempts - 1,
            created_at=job.created_at,
        )

    # -- running tasks ----------------------------------------------------------------
    @property
    def current_task(self) -> TaskInfo | None:
        """The task whose method is running (its id, name and attempt, 1-based), seen
        from that method and what it calls and starts while it runs; None elsewhere
        (a task started by it that outlives the run sees None, as with turns). With
        the id, the attempt is the idempotency key for external effects. Does not
        checkpoint."""
        found = _RUNNING_TASK.get()
        if found is None or found[0] is not self:
            return None
        info = found[1]
        running = self._task_queue.running or self._task_scheduler.running
        if running is None or running.job.id != info.id or running.attempt != info.attempt:
            return None
        return info

    async def _run_task(self, name: str, payload: Any, item: QueueItem | Schedule) -> Any:
        running = self._task_queue.running or self._task_scheduler.running
        attempt = 1 if running is None else running.attempt
        info = TaskInfo(id=item.id, name=name, attempt=attempt)
        token = _RUNNING_TASK.set((self, info))
        try:
            fn = None if not_a_task(name) else getattr(self, name, None)
            if callable(fn):
                return await call_callback(fn, payload)
            return await self.on_task(name, payload, info)
        finally:
            _RUNNING_TASK.reset(token)

    async def on_task(self, name: str, payload: Any, info: TaskInfo) -> Any:
        """Called for a task whose method does not exist. Override to handle it."""
        raise UnknownCallbackError(f"{type(self).__qualname__} has no method {name!r}")

    async def on_error(self, error: Exception, task: TaskRecord) -> None:
        """Called when a task's last delivery fails; it is then kept as a dead letter."""
        logger.error("task %r (%s) of %s/%s failed for good: %s", task.id, task.name,
                     self.ctx.namespace, self.ctx.id, safe_repr(error))

    async def _task_failed(self, error: Exception, item: QueueItem | Schedule) -> None:
        # The failed attempt's context (its number is not in the table yet, and the
        # job is as it was due for that attempt), set by the Queue or Scheduler.
        failing = self._task_queue.running or self._task_scheduler.running
        assert failing is not None and failing.job.id == item.id
        await self.on_error(error, self._record(failing.job, failing.attempt))

    # -- destroy ----------------------------------------------------------------------
    async def destroy(self) -> None:
        """Remove this object's storage and alarm, through an exclusive job that runs
        at once; the object's next activation starts empty. Checkpoints."""
        await self.lifecycle.jobs.push(DESTROY_JOB, id=DESTROY_JOB, exclusive=True,
                                       time=_clock.now())

    async def on_job(self, ctx: JobContext) -> JobOutcome:
        """Host jobs of an Agent: only the deferred destroy. Subclasses that push host
        jobs of their own override this and call ``super().on_job(ctx)`` for the rest."""
        if ctx.job.fn == DESTROY_JOB:
            await self.lifecycle.disable_alarms()
            self.lifecycle.claim.destroy()
            return None
        logger.error("%s/%s: no handler for host job %r", self.ctx.namespace, self.ctx.id,
                     ctx.job.fn)
        return None


# Methods of Agent itself that are not tasks.
_NOT_TASKS = frozenset(
    name for name in dir(Agent) if not name.startswith("__")
) | {"ctx", "lifecycle"}


def not_a_task(name: str) -> bool:
    """The Agent's own API and Python's special methods (``__delattr__`` as a task, from
    any stub caller, would break the object) are never tasks."""
    return name in _NOT_TASKS or (name.startswith("__") and name.endswith("__"))

