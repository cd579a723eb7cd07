"""Strikes: the memory-limit circuit breaker of one object, and crash strikes per job.

A reset (the runtime's memory watchdog, or a ``MemoryError`` escaping alarm work)
counts once, however many flows observe it. Below the limit, the job that was running
and every ``recovery_loop`` job due earlier move to ``now + STRIKE_DELAY``; at the limit
they are sealed into the dead letters and the count starts again.

A process that died while a job ran gives that job a crash strike (durable, per job)
when the object next starts: delayed by ``STRIKE_DELAY``, sealed at the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import attrs

from nursery_jobs import _clock
from nursery_jobs._core._alarm import AlarmClaim
from nursery_jobs._jobs._records import Job
from nursery_jobs._jobs._store import JobStore
from nursery_jobs._names import is_digest, name_digest
from nursery_jobs._policy import STRIKE_DELAY

logger = logging.getLogger("nursery_jobs")

STRIKES_KEY: Final = "memory_limit_strikes"


@attrs.frozen(kw_only=True)
class MemoryLimitContext:
    """Passed to ``on_memory_limit`` / ``on_alarm_memory_limit`` after a reset."""

    sealed: bool
    next_time: float | None
    executing: Job | None
    purged_recovery_loop_jobs: list[Job]


def limit_text(limit: int, sealed: bool) -> str:
    return f"{limit}; sealed" if sealed else str(limit)


def strike_delay(strikes: int) -> float:
    """The delay after the ``strikes``-th strike: 30 s each, capped at 5 minutes."""
    delay = STRIKE_DELAY.delay(strikes - 1)
    assert delay is not None
    return delay


Emit = Callable[..., None]


class MemoryBreaker:
    """Counts the resets of one activation's Lifecycle (one reset, one strike)."""

    __slots__ = ("_emit", "_label", "_limit", "_reset", "_store", "_strikes")

    def __init__(self, store: JobStore, limit: int, label: str, emit: Emit) -> None:
        self._store = store
        self._limit = limit
        self._label = label
        self._emit = emit
        # The durable count, cached (None: read when first needed). Built with its
        # Lifecycle, right after the store read ``nj_meta``: from those rows, with no
        # statement of its own (``JobTable.first_meta``; one of each activation's).
        self._strikes: int | None = store.table.first_meta(STRIKES_KEY)
        # (strikes, sealed, next_time, purged) of the reset this activation suffered.
        self._reset: tuple[int, bool, float, list[Job]] | None = None

    @property
    def tripped(self) -> bool:
        return self._reset is not None

    def strikes(self) -> int:
        if self._strikes is None:
            self._strikes = self._store.meta(STRIKES_KEY)
        return self._strikes

    def clear(self) -> None:
        """A clean, quiescent alarm run: the count starts again."""
        if self._reset is None and self.strikes():
            with self._store.writing():
                self._store.set_meta(STRIKES_KEY, 0)
            self._strikes = 0

    def _record(self, error: str) -> tuple[int, bool, float, list[Job]]:
        if self._reset is not None:
            return self._reset
        store = self._store
        strikes = self.strikes() + 1
        sealed = strikes >= self._limit
        next_time = _clock.now() + strike_delay(strikes)
        purged: list[Job] = []
        with store.writing():
            if sealed:
                purged = store.bury_recovery_loops(error, "memory_limit")
                store.set_meta(STRIKES_KEY, 0)
            else:
                store.defer_recovery_loops(next_time)
                store.set_meta(STRIKES_KEY, strikes)
        self._strikes = 0 if sealed else strikes
        self._reset = (strikes, sealed, next_time, purged)
        self._emit("alarm:memory_limit_reset", strikes=strikes, limit=self._limit,
                   sealed=sealed, error=error,
                   _log=(logging.ERROR, "%s was reset for memory (strike %d of %s)",
                         (self._label, strikes, limit_text(self._limit, sealed))))
        return self._reset

    def observe(self, executing: Job | None, error: str) -> MemoryLimitContext:
        """One flow saw the reset: count it (once), then move or seal the job that
        flow was running. Does not checkpoint."""
        _, sealed, next_time, purged = self._record(error)
        if executing is not None and not executing.recovery_loop:
            row = self._store.row(executing.id)
            # (Ids are unique in the table, not over time: once the job completed, its
            # id may be another owner's job now, which this reset must not touch.)
            if row is not None and row.job.owner == executing.owner:
                if sealed:
                    self._store.bury(executing.id, error, "memory_limit")
                else:
                    self._store.defer(executing.id, next_time)
        return MemoryLimitContext(
            sealed=sealed, next_time=None if sealed else next_time, executing=executing,
            purged_recovery_loop_jobs=list(purged),
        )


def recover_crashes(
    store: JobStore, claim: AlarmClaim, limit: int, label: str, emit: Emit
) -> list[Job]:
    """Give each job that a dead process was running (its flight record, or the marker
    of its tracked work) a crash strike; seal it at ``limit``. A crash uses up no
    attempt. Returns the sealed jobs."""
    crashed: dict[str, float] = dict(claim.crash_tokens())
    if any(map(is_digest, crashed)):
        crashed = _resolve_digests(crashed, store.job_ids())
    for marked in store.running_markers():
        assert marked.running_since is not None
        crashed.setdefault(marked.job.id, marked.running_since)
    sealed = []
    for job_id, started in crashed.items():
        job = strike_now(store, job_id, started, limit, label, emit,
                         why="it was running when its process died")
        if job is not None:
            sealed.append(job)
    claim.clear_crash_tokens()
    return sealed


def _resolve_digests(crashed: dict[str, float], job_ids: list[str]) -> dict[str, float]:
    """``crashed`` with each digested job id (one too long for its flight slot) replaced
    by the id of the job it digests; one of a job that is gone is dropped."""
    digests = {name_digest(job_id): job_id for job_id in job_ids}
    return {digests[token] if is_digest(token) else token: started
            for token, started in crashed.items()
            if not is_digest(token) or token in digests}


def strike_now(
    store: JobStore, job_id: str, started: float, limit: int, label: str, emit: Emit, *,
    why: str,
) -> Job | None:
    """Count a crash strike of a job (durable; idempotent per ``started``): delay it, or
    seal it into the dead letters at ``limit``. Returns the job if it was sealed."""
    row = store.row(job_id)
    if row is None:
        return None
    strikes = row.crash_strikes + 1
    job = row.job
    event: dict[str, Any] = {"id": job.id, "owner": job.owner, "fn": job.fn,
                             "strikes": strikes}
    if strikes >= limit:
        error = f"it was running at {strikes} process deaths"
        store.bury(job_id, error, "crash")
        emit("job:crash_strike", **event, sealed=True,
             _log=(logging.ERROR, "job %r of %s sealed: %s", (job.id, label, error)))
        return job
    delay = strike_delay(strikes)
    if store.strike(job_id, started, _clock.now() + delay):
        emit("job:crash_strike", **event, sealed=False, delay=delay,
             _log=(logging.WARNING, "job %r of %s: %s (crash strike %d); it runs again in"
                   " %.0f s", (job.id, label, why, strikes, delay)))
    return None
