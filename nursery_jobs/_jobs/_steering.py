"""Steering a job while it runs: its ``timeout``, and ``jobs.cancel`` of its run.

A running job holds the object's turn, so a task that wants to cancel it (an
``@nj.interleave`` method, a background task) cannot take the turn to delete its row
first. It asks instead: ``Steering.cancel`` marks the alarm run's ``CancelRequest`` and
cancels the run's dispatch scope (and the tracked work the job started); the alarm run,
still holding the turn, ends the job's run as a deletion (no retry, no dead letter,
``job:cancelled``), commits it, and tells the canceller. The dispatch scope is one per
alarm run, not one per job: a cancel scope costs a few µs, a job's dispatch ~10.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import trio

from nursery_jobs._errors import JobTimeoutError

if TYPE_CHECKING:
    from nursery_jobs._core._turns import TurnGate
    from nursery_jobs._jobs._alarm_run import AlarmRun
    from nursery_jobs._jobs._records import Job, JobContext
    from nursery_jobs._jobs._store import JobStore


class CancelRequest:
    """``jobs.cancel()`` of the job running now: decided once its alarm run has ended
    the run and deleted the job (``cancelled``), or could not (the run went another way:
    a shutdown, a fault; the canceller then cancels as for a job that is not running)."""

    __slots__ = ("cancelled", "decided", "job")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.decided = trio.Event()
        self.cancelled = False

    def decide(self, cancelled: bool) -> None:
        if not self.decided.is_set():
            self.cancelled = cancelled
            self.decided.set()


class Steering:
    """What lets a task that holds no turn of the object reach the job running now.
    One per Lifecycle; the alarm run registers itself in ``run`` while it dispatches."""

    __slots__ = ("_store", "_turns", "_work", "run")

    def __init__(self, store: JobStore, turns: TurnGate) -> None:
        self._store = store
        self._turns = turns
        self.run: AlarmRun | None = None
        # The cancel scopes of tracked work in progress, by the id of the job that
        # started it (work started outside a job is not steered).
        self._work: dict[str, set[trio.CancelScope]] = {}

    def holds_turn(self) -> bool:
        """Whether the current task holds a turn of the object. Does not checkpoint."""
        return self._turns.holds()

    async def cancel(self, owner: str, job_id: str) -> bool:
        """``jobs.cancel`` from a task that holds no turn: a run of the job in progress
        is cancelled at once and the job deleted by its alarm run; otherwise the job is
        deleted in a turn of our own. Returns whether the job was there. Checkpoints."""
        run = self.run
        job = None if run is None or run.scope is None else run.job
        if run is not None and job is not None and job.id == job_id and job.owner == owner:
            request = run.cancel
            if request is None or request.job is not job:
                request = run.cancel = CancelRequest(job)
                assert run.scope is not None
                run.scope.cancel(reason=f"jobs.cancel({job_id!r}) of the running job")
                self.cancel_work(job_id)
            await request.decided.wait()
            if request.cancelled:
                return True
        async with self._turns.turn("write", f"jobs.cancel({job_id!r})"):
            cancelled = self.cancel_queued(owner, job_id)
        await self._store.durable()
        return cancelled

    def cancel_queued(self, owner: str, job_id: str) -> bool:
        """Delete a job that is not running now (the caller holds the turn), and end the
        tracked work an earlier run of it started: a heartbeat job's work, cancelled
        between two runs, ran on orphaned with nothing left to stop it. Returns whether
        the job was there. Does not checkpoint."""
        cancelled = self._store.cancel(owner, job_id)
        if cancelled:
            self.cancel_work(job_id)
        return cancelled

    # -- tracked work ---------------------------------------------------------------------
    @contextmanager
    def work_scope(self, job: Job | None) -> Iterator[None]:
        """Run a block of tracked work started by ``job`` under a scope that a cancel of
        the job's run cancels too."""
        if job is None:
            yield
            return
        with trio.CancelScope() as scope:
            scopes = self._work.setdefault(job.id, set())
            scopes.add(scope)
            try:
                yield
            finally:
                scopes.discard(scope)
                if not scopes and self._work.get(job.id) is scopes:
                    del self._work[job.id]

    def cancel_work(self, job_id: str) -> None:
        for scope in self._work.pop(job_id, ()):
            scope.cancel(reason=f"jobs.cancel({job_id!r}): the work of a cancelled job")


async def run_with_timeout(
    on_job: Callable[[JobContext], Awaitable[Any]], ctx: JobContext, label: str
) -> Any:
    """Run ``on_job(ctx)`` for at most the job's ``timeout`` seconds.

    Raises:
        JobTimeoutError: the run was still going then (it was cancelled).
    """
    job = ctx.job
    timeout = job.timeout
    assert timeout is not None
    with trio.move_on_after(timeout) as scope:
        outcome = await on_job(ctx)
    if not scope.cancel_called:
        return outcome
    # Still going at its timeout, whether or not it let the Cancelled through (a job
    # that swallowed it and returned had its result stand, as a clean run).
    raise JobTimeoutError(
        f"job {job.id!r} of {label} ran longer than its timeout of {timeout:g} s; its run"
        " was cancelled",
        job_id=job.id, timeout=timeout,
    )
