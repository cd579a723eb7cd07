"""Steering a job while it runs: its ``timeout``, and ``jobs.cancel`` of its run.

A running job holds the object's turn, so a task that wants to cancel it (an
``@nj.interleave`` method, a background task) cannot take the turn to delete its row
first. It asks instead: ``Steering.cancel`` marks the alarm run's ``CancelRequest`` and
cancels the run's dispatch scope (and the tracked work the job started); the alarm run,
still holding the turn, ends the job's run as a deletion (no retry, no dead letter,
``job:cancelled``), commits it, and tells the canceller. The dispatch scope is one per
alarm run, not one per job: a cancel scope costs a few µs, a job's dispatch ~10.

A cancel names its jobs by a ``Selection`` — one id (``jobs.cancel``), or every job of
its owners, or those of one fn (``Queue.cancel_all``) — and reads which jobs those are
only where it holds the turn: so a cancel of many jobs, or one that must say what it
cancelled (``Scheduler.cancel``), works from a task that holds no turn as one of a
single id does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from nursery_jobs._errors import JobTimeoutError, memory_error_of

if TYPE_CHECKING:
    from nursery_jobs._core._turns import TurnGate
    from nursery_jobs._jobs._alarm_run import AlarmRun
    from nursery_jobs._jobs._records import Job, JobContext
    from nursery_jobs._jobs._store import JobStore


@attrs.frozen(kw_only=True)
class Cancelled:
    """A job a cancel deleted."""

    owner: str
    id: str
    fn: str


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


@attrs.frozen(kw_only=True)
class Selection:
    """The jobs a cancel names: the jobs of ``owners`` of id ``job_id`` (any id: None)
    and of fn ``fn`` (any fn: None)."""

    owners: tuple[str, ...]
    job_id: str | None = None
    fn: str | None = None

    def matches(self, job: Job) -> bool:
        return (job.owner in self.owners and (self.job_id is None or job.id == self.job_id)
                and (self.fn is None or job.fn == self.fn))

    def __str__(self) -> str:
        named = [repr(self.job_id)] if self.job_id is not None else []
        if self.fn is not None:
            named.append(f"fn={self.fn!r}")
        return f"jobs.cancel({', '.join(named) or 'all'})"


class _TurnWait:
    """A cancel waiting for the object's turn to delete the jobs of its ``selection``
    that are not running; if one of them starts meanwhile, its alarm run cancels
    ``scope`` and hands the canceller the ``requests`` that end those runs."""

    __slots__ = ("requests", "scope", "selection")

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        self.scope = trio.CancelScope()
        self.requests: list[CancelRequest] = []


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
        # Cancels waiting for the turn: the alarm run looks here before it starts a job
        # (an empty list: one truth test per job).
        self.waiting: list[_TurnWait] = []

    def holds_turn(self) -> bool:
        """Whether the current task holds a turn of the object. Does not checkpoint."""
        return self._turns.holds()

    async def cancel(self, selection: Selection) -> list[Cancelled]:
        """Delete the jobs of ``selection``; return those it deleted. Checkpoints.

        From a task that holds no turn, a run in progress of one of them is cancelled
        at once and its job deleted by its alarm run; the others are deleted in a turn
        of our own — and one whose run starts while we wait for that turn (we waited
        behind a call, or behind the alarm run taking the turn back at a hand-over) is
        cancelled before it starts. Inside a turn, the jobs are deleted at once: a run
        in progress is the caller's own, and its result is discarded."""
        if self.holds_turn():
            deleted = self.cancel_queued(selection)
            await self._store.durable()
            return deleted
        cancelled: list[Cancelled] = []
        # Registered for the whole cancel: a run of one of the jobs that starts at any
        # point before we delete it is cancelled before it starts.
        wait = _TurnWait(selection)
        self.waiting.append(wait)
        try:
            while True:
                request = self._running(selection)
                if request is not None and request not in wait.requests:
                    wait.requests.append(request)
                while wait.requests:  # (more may come while we wait for one)
                    request = wait.requests.pop(0)
                    await request.decided.wait()
                    if request.cancelled:
                        cancelled.append(_cancelled(request.job))
                if selection.job_id is not None and cancelled:
                    return cancelled  # (the one job it names)
                wait.scope = trio.CancelScope()
                with wait.scope:
                    async with self._turns.turn("write", str(selection)):
                        cancelled += self.cancel_queued(selection)
                if not wait.requests:
                    await self._store.durable()
                    return cancelled
                # A run of one of them started while we waited for the turn (its run
                # ends it before it starts): what it cancelled, then the rest.
        finally:
            self.waiting.remove(wait)

    def _running(self, selection: Selection) -> CancelRequest | None:
        """The cancel of the run in progress if its job is of ``selection`` (made now:
        the run's scope and the tracked work it started are cancelled), or None."""
        run = self.run
        job = None if run is None or run.scope is None else run.job
        if run is None or job is None or not selection.matches(job):
            return None
        request = run.cancel
        if request is None or request.job is not job:
            request = run.cancel = CancelRequest(job)
            assert run.scope is not None
            run.scope.cancel(reason=f"{selection} of the running job {job.id!r}")
            self.cancel_work(job.owner, job.id)
        return request

    def starting(self, job: Job) -> bool:
        """The alarm run is about to start ``job`` (``run.job`` is set): if cancels of
        it wait for the turn, cancel its run now and hand them that cancel. Returns
        whether it did (the run then checkpoints, so the job never starts). Does not
        checkpoint."""
        waits = [wait for wait in self.waiting if wait.selection.matches(job)]
        if not waits:
            return False
        request = self._running(waits[0].selection)
        if request is None:
            return False
        for wait in waits:
            wait.requests.append(request)
            wait.scope.cancel(reason=f"{wait.selection}: the run of {job.id!r} started")
        return True

    def cancel_queued(self, selection: Selection) -> list[Cancelled]:
        """Delete the jobs of ``selection`` that are not running now (the caller holds
        the turn); return them. The tracked work an earlier run of one started ends
        once its delete is committed (the store calls ``cancel_work``; a heartbeat
        job's work, cancelled between two runs, ran on orphaned with nothing left to
        stop it), and goes on if it rolls back — the job is back. Does not
        checkpoint."""
        store = self._store
        return [Cancelled(owner=owner, id=job_id, fn=fn)
                for owner, job_id, fn in store.named(selection.owners, selection.job_id,
                                                     selection.fn)
                if store.cancel(owner, job_id)]

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


def _cancelled(job: Job) -> Cancelled:
    return Cancelled(owner=job.owner, id=job.id, fn=job.fn)


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
    except Exception as exc:
        if not scope.cancel_called or memory_error_of(exc) is not None:
            raise  # (out of memory resets the object, whenever it is raised)
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
