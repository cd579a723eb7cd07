"""The Queue capability: named callbacks run one at a time, FIFO within a priority.

Every item is a job of the capability (no storage of its own), due when it is pushed,
with its priority in the job's ``priority`` column: among due jobs a higher priority
runs first, then the earlier due time, then the push sequence. A replaced item keeps its
due time (its place in line); ``pos`` in the envelope remembers when it was queued.
"""

from __future__ import annotations

import builtins
import inspect
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from nursery_jobs import _clock, _codec
from nursery_jobs._errors import JobError, UnknownCallbackError, safe_repr
from nursery_jobs._jobs._capability import CallbackCapability
from nursery_jobs._jobs._records import MAX_PRIORITY, Job, JobContext, JobOutcome, check_job_id
from nursery_jobs._jobs._views import cancel_jobs
from nursery_jobs._policy import RetryOptions

logger = logging.getLogger("nursery_jobs")


Callback = Callable[[Any, Any], Any]


@attrs.frozen(kw_only=True)
class QueueItem:
    """One queued call: ``callbacks[callback](payload, item)``.

    ``attempt`` is the attempt being run (1-based, as ``JobContext.attempt``) in the
    item a callback or ``on_error`` receives — with ``id``, the idempotency key for
    external effects; 0 in items read outside a run (``push``, ``get``, ``list``,
    dead letters).
    """

    id: str
    callback: str
    payload: Any
    priority: int
    created_at: float
    retry: RetryOptions
    attempt: int = 0


@attrs.frozen(kw_only=True)
class QueueDeadLetter:
    """An item whose retries ran out: the item, the error text, attempts and when."""

    item: QueueItem
    error: str
    attempts: int
    time: float


_codec.register_record(QueueItem, "QueueItem")  # (a stub call may return it)
_codec.register_record(QueueDeadLetter, "QueueDeadLetter")


def item_of(job: Job, attempt: int = 0) -> QueueItem:
    envelope = job.payload
    return QueueItem(
        id=job.id, callback=job.fn, payload=envelope["p"], priority=job.priority,
        created_at=job.created_at, retry=job.retry, attempt=attempt,
    )


def callback_filter(value: object, *, call: str, argument: str = "callback") -> str | None:
    """``value`` as a filter by callback name (None: every callback), or ``JobError``
    naming ``argument`` of ``call``: something that is no name would match nothing, and
    the caller would read "none" where it made a mistake. (The Queue's and the Agent's
    filters: one check.)"""
    if value is None or (isinstance(value, str) and value):
        return value
    raise JobError(f"{call}(): {argument} must be a callback name (a non-empty str) or None,"
                   f" got {safe_repr(value)}")


def _higher_priority_first(job: Job) -> int:
    return -job.priority


async def call_callback(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async callback."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class Queue(CallbackCapability):
    """``Queue(callbacks={name: fn}, retry=None, on_error=None, id="queue")``.

    ``fn(payload, item)`` may be sync or async; ``item.attempt`` says which attempt
    runs. ``on_error(error, item)`` is called when an item's last attempt fails (that
    attempt in ``item.attempt``); the item is then kept as a dead letter.
    """

    kind = "Queue"

    def __init__(
        self,
        callbacks: Mapping[str, Callback],
        *,
        retry: RetryOptions | None = None,
        on_error: Callable[[Exception, QueueItem], Any] | None = None,
        id: str = "queue",
    ) -> None:
        super().__init__(callbacks, retry=retry, on_error=on_error, id=id)
        self._last_position: float | None = None  # (read from the queue when first needed)

    # -- the API ------------------------------------------------------------------------
    async def push(
        self,
        callback: str,
        payload: Any = None,
        *,
        id: str | None = None,
        retry: RetryOptions | None = None,
        priority: int = 0,
    ) -> QueueItem:
        """Queue a call of ``callback``; durable when it returns. Pushing an existing id
        replaces that item in place, keeping its position (and superseding a run of it
        in flight). Checkpoints.

        Raises:
            UnknownCallbackError: ``callback`` is not registered.
            JobError: a blank id, bad retry options or a bad priority.
            CodecError: a payload that cannot be stored.
        """
        return await self._push(callback, payload, id=id, retry=retry, priority=priority,
                                keep_position=True)

    async def _push(
        self, callback: str, payload: Any, *, id: str | None, retry: RetryOptions | None,
        priority: int, keep_position: bool,
    ) -> QueueItem:
        if not isinstance(callback, str):
            raise JobError(f"queue callback must be a str (its name), got {callback!r}")
        if callback not in self.callbacks:
            raise UnknownCallbackError(
                f"unknown queue callback {callback!r}: not registered on Queue {self.id!r}"
                f" (registered: {sorted(self.callbacks)})"
            )
        if retry is not None and not isinstance(retry, RetryOptions):
            raise JobError(f"queue item retry must be RetryOptions, got {retry!r}")
        if isinstance(priority, bool) or not isinstance(priority, int) or not (
            -MAX_PRIORITY <= priority <= MAX_PRIORITY
        ):
            raise JobError(
                f"queue priority must be an int in [-{MAX_PRIORITY}, {MAX_PRIORITY}],"
                f" got {priority!r}"
            )
        jobs = self.lifecycle.jobs
        existing = None if id is None else jobs.get(check_job_id(id))
        if keep_position and existing is not None and existing.priority == priority:
            position = existing.payload["pos"]
        else:
            position = self._next_position()
        job = await jobs.push(
            callback,
            time=position,
            payload={"p": payload, "pr": priority, "pos": position},
            id=id,
            retry=retry or self.retry,
            priority=priority,
        )
        item = item_of(job)
        self.lifecycle.emit("queue:create", callback=callback, id=item.id)
        return item

    def _next_position(self) -> float:
        """A new item's place in line (its due time): now — or, if the wall clock has
        stepped back since an item was queued, that item's place (ties run in push
        order), so items keep running in the order they were pushed."""
        last = self._last_position
        if last is None:
            last = max((job.payload["pos"] for job in self.lifecycle.jobs.list()),
                       default=-math.inf)
        self._last_position = position = max(_clock.now(), last)
        return position

    def get(self, id: str) -> QueueItem | None:
        """Return item ``id``, or None. Does not checkpoint."""
        job = self.lifecycle.jobs.get(id)
        return None if job is None else item_of(job)

    def list(self, callback: str | None = None) -> list[QueueItem]:
        """Return the items (of one callback, if given) in run order: higher priority
        first, then by due time and push order (as ``jobs.list()`` gives them: the sort
        is stable). Does not checkpoint.

        Raises:
            JobError: ``callback`` is neither None nor a name.
        """
        callback = callback_filter(callback, call="Queue.list")
        jobs = sorted(self.lifecycle.jobs.list(), key=_higher_priority_first)
        return [item_of(job) for job in jobs if callback is None or job.fn == callback]

    async def cancel(self, id: str) -> bool:
        """Remove item ``id``; return whether it was queued. Checkpoints."""
        return await self.lifecycle.jobs.cancel(id)

    async def cancel_all(self, callback: str | None = None) -> int:
        """Remove every item (of one callback, if given); return how many. A run of one
        in progress is cancelled as ``cancel`` cancels it: at once where no turn is held
        (an ``@nj.interleave`` method). Checkpoints.

        Raises:
            JobError: ``callback`` is neither None nor a name (nothing is cancelled).
        """
        callback = callback_filter(callback, call="Queue.cancel_all")
        return len(await cancel_jobs(self.lifecycle.jobs, fn=callback))

    def dead_letters(self) -> builtins.list[QueueDeadLetter]:  # (list: the method above)
        """Items whose retries ran out, oldest first."""
        return [
            QueueDeadLetter(item=item_of(letter.job), error=letter.error,
                            attempts=letter.attempts, time=letter.time)
            for letter in self.lifecycle.dead_letters()
        ]

    async def requeue(self, id: str) -> QueueItem | None:
        """Queue dead letter ``id`` again with fresh attempts (at the back of its
        priority). Returns the item, or None if there is no such dead letter."""
        letter = next((d for d in self.lifecycle.dead_letters() if d.job.id == id), None)
        if letter is not None and letter.job.fn not in self.callbacks:
            # Refused before anything is written: requeued, it could only fail again,
            # and its dead letter would be gone.
            raise UnknownCallbackError(
                f"cannot requeue {id!r}: its callback {letter.job.fn!r} is no longer"
                f" registered on Queue {self.id!r} (registered: {sorted(self.callbacks)})"
            )
        job = await self.lifecycle.requeue(id)
        if job is None:
            return None
        return await self._push(job.fn, job.payload["p"], id=job.id, retry=job.retry,
                                priority=job.priority, keep_position=False)

    async def discard(self, id: str) -> bool:
        """Delete dead letter ``id``; return whether it existed. Checkpoints."""
        return await self.lifecycle.discard(id)

    async def discard_dead_letters(self, *, before: Any = None) -> int:
        """Delete the dead letters buried before ``before`` (None: all); return how
        many. Checkpoints."""
        return await self.lifecycle.discard_dead_letters(before=before)

    # -- the capability hooks -----------------------------------------------------------
    async def on_job(self, ctx: JobContext) -> JobOutcome:
        job = ctx.job
        item = item_of(job, ctx.attempt)
        if ctx.attempt > 1:
            self.lifecycle.emit("queue:retry", callback=job.fn, id=job.id, attempt=ctx.attempt,
                                max_attempts=job.retry.max_attempts)
        fn = self.callbacks.get(job.fn)
        if fn is None:
            raise UnknownCallbackError(
                f"queue callback {job.fn!r} of item {job.id!r} is no longer registered"
            )
        self.running = ctx
        try:
            await call_callback(fn, item.payload, item)
        finally:
            self.running = None
        return None

    async def on_job_error(self, ctx: JobContext, error: Exception) -> JobOutcome:
        job = ctx.job
        item = item_of(job, ctx.attempt)
        self.lifecycle.emit("queue:error", callback=job.fn, id=job.id, error=safe_repr(error),
                            attempts=ctx.attempt)
        if self.on_error is not None:
            self.running = ctx
            try:
                await call_callback(self.on_error, error, item)
            except Exception:
                logger.exception("on_error of Queue %r failed for item %r", self.id, job.id)
            finally:
                self.running = None
        return None  # the Lifecycle keeps it as a dead letter

