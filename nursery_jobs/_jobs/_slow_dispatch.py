"""The slow-dispatch watch of an alarm run: ``job:slow_dispatch`` once a running job
outlives its ``hung_timeout``. A task in the object's nursery, started only when a job
first waits for something (a job that never waits cannot be seen running by any other
task), and ended with the run."""

from __future__ import annotations

import logging
import math
import types
from collections.abc import Callable
from types import CoroutineType
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from nursery_jobs._jobs._lifecycle import Lifecycle
    from nursery_jobs._jobs._records import Job


class SlowDispatchWatch:
    """Watches the job an alarm run runs now. One per Lifecycle.

    The watch task's deadline is moved only when it must come earlier; a stale, later
    deadline just wakes it once to look (setting a deadline per job cost ~5 µs)."""

    __slots__ = ("_deadline", "_lc", "_scope", "_scope_deadline", "job")

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lc = lifecycle
        self._scope: trio.CancelScope | None = None
        self.job: Job | None = None  # the job watched (None: it ended)
        self._deadline = math.inf
        # The scope's deadline as set here (read per job: trio's property costs more
        # than the comparison it serves).
        self._scope_deadline = math.inf

    def watch(self, job: Job, clock: float) -> None:
        """Watch ``job``, started at Trio time ``clock``. Does not checkpoint."""
        self.job = job
        self._deadline = deadline = clock + job.hung_timeout
        scope = self._scope
        if scope is not None and deadline < self._scope_deadline:
            scope.deadline = self._scope_deadline = deadline

    def waits(self) -> None:
        """The running job waits for something (or may: a timeout's, an awaitable that
        is no coroutine): start the task that tells when it outlives its
        ``hung_timeout``, unless it runs. (A task per alarm run was ~2% of a cold
        fire's CPU, its start and its cancel, measured.) Does not checkpoint."""
        if self._scope is None and self.job is not None:
            # Made here, not in the task: the job goes on before the task first runs.
            deadline = self._deadline
            self._scope = trio.CancelScope(deadline=deadline)
            self._scope_deadline = deadline
            self._lc.ctx.nursery.start_soon(self._watchdog)

    def stop(self) -> None:
        """The alarm run is over: the task ends (an idle object keeps no task in its
        nursery, so it can doze); the next run's first waiting job starts another."""
        self.job = None
        if self._scope is not None:
            self._scope.cancel(reason="alarm run over")

    async def _watchdog(self) -> None:
        while True:
            scope = self._scope
            assert scope is not None
            with scope:
                await trio.sleep_forever()
            job = self.job
            if job is not None and trio.current_time() >= self._deadline:
                self._lc.emit(
                    "job:slow_dispatch", id=job.id, owner=job.owner, fn=job.fn,
                    threshold=job.hung_timeout,
                    _log=(logging.WARNING,
                          "job %r (fn %r) of %s has run longer than its hung_timeout"
                          " of %.1f s", (job.id, job.fn, self._lc.label, job.hung_timeout)))
                job = self.job = None
            if job is None:
                self._scope = None  # nothing to watch: the next job starts a task
                return
            # Another job runs now: watch it.
            self._scope = trio.CancelScope(deadline=self._deadline)
            self._scope_deadline = self._deadline


@types.coroutine
def watched(running: CoroutineType[Any, Any, Any], waits: Callable[[], None]) -> Any:
    """``await running``, calling ``waits()`` when it first suspends (waits for
    something). What ``await`` does for a coroutine, spelled out: every value sent or
    exception thrown in goes on to it, and its result or exception comes out."""
    send = running.send
    try:
        trap = send(None)
    except StopIteration as done:
        return done.value
    waits()
    while True:
        try:
            sent = yield trap
        except GeneratorExit:
            running.close()
            raise
        except BaseException as exc:  # (thrown in: it goes on to the job)
            try:
                trap = running.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                trap = send(sent)
            except StopIteration as done:
                return done.value
