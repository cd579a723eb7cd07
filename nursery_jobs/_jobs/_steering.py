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


class _TurnWait:
    """A ``jobs.cancel`` waiting for the object's turn to delete a job that is not
    running; if the job starts meanwhile, its alarm run cancels ``scope`` and hands the
    canceller the ``request`` that ends that run."""

    __slots__ = ("request", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.request: CancelRequest | None = None


class Steering:
    """What lets a task that holds no turn of the object reach the job running now.
    One per Lifecycle; the alarm run registers itself in ``run`` while it dispatches."""

    __slots__ = ("_store", "_turns", "_work", "run", "waiting")

    def __init__(self, store: JobStore, turns: TurnGate) -> None:
        self._store = store
        store.end_work = self.cancel_work  # (once a cancel of the job is committed)
        self._turns = turns
        self.run: AlarmRun | None = None
        # The cancel scopes of tracked work in progress, by the (owner, id) of the job
        # that started it (work started outside a job is not steered): ids are reused,
        # and each owner cancels only its own jobs' work.
        self._work: dict[tuple[str, str], set[trio.CancelScope]] = {}
        # Cancels waiting for the turn, by (owner, job id): the alarm run looks here
        # before it starts a job (an empty dict: one truth test per job).
        self.waiting: dict[tuple[str, str], list[_TurnWait]] = {}

    def holds_turn(self) -> bool:
        """Whether the current task holds a turn of the object. Does not checkpoint."""
        return self._turns.holds()

    async def cancel(self, owner: str, job_id: str) -> bool:
        """``jobs.cancel`` from a task that holds no turn: a run of the job in progress
        is cancelled at once and the job deleted by its alarm run; otherwise the job is
        deleted in a turn of our own — unless its run starts while we wait for the turn
        (we waited behind a call, or behind the alarm run taking the turn back at a
        hand-over): then that run is cancelled before the job starts. Returns whether
        the job was there. Checkpoints."""
        while True:
            request = self._running(owner, job_id)
            if request is not None:
                await request.decided.wait()
                if request.cancelled:
                    return True
            key = (owner, job_id)
            wait = _TurnWait()
            waits = self.waiting.setdefault(key, [])
            waits.append(wait)
            try:
                with wait.scope:
                    async with self._turns.turn("write", f"jobs.cancel({job_id!r})"):
                        cancelled = self.cancel_queued(owner, job_id)
            finally:
                waits.remove(wait)
                if not waits and self.waiting.get(key) is waits:
                    del self.waiting[key]
            if wait.request is None:
                await self._store.durable()
                return cancelled
            # Its run started while we waited (the run ends it before it starts).
            await wait.request.decided.wait()
            if wait.request.cancelled:
                return True

    def _running(self, owner: str, job_id: str) -> CancelRequest | None:
        """The cancel of the job's run in progress (made now: the run's scope and the
        tracked work it started are cancelled), or None if it is not running."""
        run = self.run
        job = None if run is None or run.scope is None else run.job
        if run is None or job is None or job.id != job_id or job.owner != owner:
            return None
        request = run.cancel
        if request is None or request.job is not job:
            request = run.cancel = CancelRequest(job)
            assert run.scope is not None
            run.scope.cancel(reason=f"jobs.cancel({job_id!r}) of the running job")
            self.cancel_work(owner, job_id)
        return request

    def starting(self, job: Job) -> bool:
        """The alarm run is about to start ``job`` (``run.job`` is set): if cancels of
        it wait for the turn, cancel its run now and hand them that cancel. Returns
        whether it did (the run then checkpoints, so the job never starts). Does not
        checkpoint."""
        waits = self.waiting.get((job.owner, job.id))
        if not waits:
            return False
        request = self._running(job.owner, job.id)
        if request is None:
            return False
        for wait in waits:
            wait.request = request
            wait.scope.cancel(reason=f"jobs.cancel({job.id!r}): its run started")
        return True

    def cancel_queued(self, owner: str, job_id: str) -> bool:
        """Delete a job that is not running now (the caller holds the turn). The tracked
        work an earlier run of it started ends once the delete is committed (the store
        calls ``cancel_work``; a heartbeat job's work, cancelled between two runs, ran on
        orphaned with nothing left to stop it), and goes on if it rolls back — the job is
        back. Returns whether the job was there. Does not checkpoint."""
        return self._store.cancel(owner, job_id)

    # -- tracked work ---------------------------------------------------------------------
    @contextmanager
    def work_scope(self, job: Job | None) -> Iterator[None]:
        """Run a block of tracked work started by ``job`` under a scope that a cancel of
        the job's run cancels too."""
        if job is None:
            yield
            return
        key = (job.owner, job.id)
        with trio.CancelScope() as scope:
            scopes = self._work.setdefault(key, set())
            scopes.add(scope)
            try:
                yield
            finally:
                scopes.discard(scope)
                if not scopes and self._work.get(key) is scopes:
                    del self._work[key]

    def cancel_work(self, owner: str, job_id: str) -> None:
        """End the tracked work that runs of ``owner``'s job ``job_id`` started."""
        for scope in self._work.pop((owner, job_id), ()):
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
    try:
        with trio.move_on_after(timeout) as scope:
            outcome = await on_job(ctx)
    except MemoryError:
        raise  # (resets the object, whenever it is raised)
    except Exception as exc:
        if not scope.cancel_called:
            raise
        # Cut by its timeout, the run's clean-up raised: still a timeout (the error it
        # raised is the cause), so give_up_on and the retries see what happened.
        raise _timed_out(job, label, timeout, f"; its clean-up raised {type(exc).__name__}") \
            from exc
    if not scope.cancel_called:
        return outcome
    # Still going at its timeout, whether or not it let the Cancelled through (a job
    # that swallowed it and returned is timed out all the same).
    raise _timed_out(job, label, timeout, "")


def _timed_out(job: Job, label: str, timeout: float, more: str) -> JobTimeoutError:
    return JobTimeoutError(
        f"job {job.id!r} of {label} ran longer than its timeout of {timeout:g} s; its run"
        f" was cancelled{more}",
        job_id=job.id, timeout=timeout,
    )
