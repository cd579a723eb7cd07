"""The memory-limit circuit breaker of one object: durable strikes, delays, the seal.

A reset (the runtime's memory watchdog, or a ``MemoryError`` escaping alarm work)
counts once, however many flows observe it. Below the limit, the job that was running
and every ``recovery_loop`` job due earlier move to ``now + min(300, 30 * strikes)``;
at the limit they are sealed into the dead letters and the count starts again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import attrs

from . import _clock
from ._jobs import Job

if TYPE_CHECKING:
    from ._lifecycle import Lifecycle

logger = logging.getLogger("nursery_jobs")

STRIKES_KEY: Final = "memory_limit_strikes"


@attrs.frozen(kw_only=True)
class MemoryLimitContext:
    """Passed to ``on_memory_limit`` / ``on_alarm_memory_limit`` after a reset."""

    sealed: bool
    next_time: float | None
    executing: Job | None
    purged_recovery_loop_jobs: list[Job]


def strike_delay(strikes: int) -> float:
    return min(300.0, 30.0 * strikes)


class MemoryBreaker:
    """Counts the resets of one activation's Lifecycle (one reset, one strike)."""

    __slots__ = ("_lifecycle", "_reset", "_strikes")

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle
        self._strikes: int | None = None  # cached durable count
        # (strikes, sealed, next_time, purged) of the reset this activation suffered.
        self._reset: tuple[int, bool, float, list[Job]] | None = None

    @property
    def tripped(self) -> bool:
        return self._reset is not None

    def strikes(self) -> int:
        if self._strikes is None:
            self._strikes = self._lifecycle.table.meta(STRIKES_KEY)
        return self._strikes

    def clear(self) -> None:
        """A clean, quiescent alarm run: the count starts again."""
        if self._reset is None and self.strikes():
            with self._lifecycle._writing():
                self._lifecycle.table.set_meta(STRIKES_KEY, 0)
            self._strikes = 0

    def _record(self, error: str) -> tuple[int, bool, float, list[Job]]:
        if self._reset is not None:
            return self._reset
        lifecycle = self._lifecycle
        table = lifecycle.table
        strikes = self.strikes() + 1
        limit = lifecycle.max_alarm_memory_limit_strikes
        sealed = strikes >= limit
        now = _clock.now()
        next_time = now + strike_delay(strikes)
        purged: list[Job] = []
        with lifecycle._writing():
            if sealed:
                for row in table.rows():
                    if row.job.recovery_loop:
                        table.bury(row, error, "memory_limit", now, attempts=row.attempts)
                        purged.append(row.job)
                table.set_meta(STRIKES_KEY, 0)
            else:
                table.conn.execute(
                    "UPDATE nj_jobs SET time = ?, running_since = NULL"
                    " WHERE recovery_loop = 1 AND time <= ?",
                    (next_time, next_time),
                )
                table.set_meta(STRIKES_KEY, strikes)
        self._strikes = 0 if sealed else strikes
        self._reset = (strikes, sealed, next_time, purged)
        logger.error(
            "%s was reset for memory (strike %d of %d%s)", lifecycle._label(), strikes, limit,
            "; sealed" if sealed else "",
        )
        lifecycle._emit("alarm:memory_limit_reset", strikes=strikes, limit=limit, sealed=sealed,
                        error=error)
        return self._reset

    def observe(self, executing: Job | None, error: str) -> MemoryLimitContext:
        """One flow saw the reset: count it (once), then move or seal the job that
        flow was running. Does not checkpoint."""
        _, sealed, next_time, purged = self._record(error)
        lifecycle = self._lifecycle
        table = lifecycle.table
        if executing is not None and not executing.recovery_loop:
            row = table.row(executing.id)
            if row is not None:
                with lifecycle._writing():
                    if sealed:
                        table.bury(row, error, "memory_limit", _clock.now(),
                                   attempts=row.attempts)
                    else:
                        table.conn.execute(
                            "UPDATE nj_jobs SET time = ?, running_since = NULL WHERE id = ?",
                            (next_time, executing.id),
                        )
        return MemoryLimitContext(
            sealed=sealed, next_time=None if sealed else next_time, executing=executing,
            purged_recovery_loop_jobs=list(purged),
        )
