"""The memory watchdog: which objects a breach of ``memory_limit`` resets, and freeing
what a reset dropped before anyone else is blamed.

A process's memory cannot be attributed to one object exactly, so the watch blames by
growth: an object whose alarm work (an alarm run, tracked work) began when memory stood
at ``mark`` and is now over the limit at ``used`` grew it by at most ``used - mark``.
At a breach, the objects that grew it the most (at least half the largest growth) are
reset — never one whose work began when memory was already where it is now (a healthy
neighbour that starts a job after a leak crossed the limit). Issue 22.2: resetting every
object running alarm work struck healthy neighbours until the leak was sealed.

After a reset the watch acts again only once the reset objects have unwound and a full
garbage collection has run (their instances sit in reference cycles: instance, its
Lifecycle, the alarm handler), so the memory they held is gone before the next sample
decides anything.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nursery_jobs._core._host import ObjectHost

logger = logging.getLogger("nursery_jobs")


class MemoryWatch:
    """One runtime's memory watch; ``check`` is called at every sample (sync)."""

    __slots__ = ("_last", "_limit", "_probe", "_quiet", "_unwinding")

    def __init__(self, limit: float, probe: Callable[[], float]) -> None:
        self._limit = limit
        self._probe = probe
        self._last: float | None = None  # the previous sample
        self._unwinding: list[ObjectHost] = []  # reset, not closed yet
        self._quiet = False  # over the limit with nobody to blame: said once

    def begin(self) -> None:
        """Take the first sample, before any object's work begins (sync). Work already
        running at the first periodic sample grew memory from here: marking it with that
        sample instead hid a leak that grew before it, forever (a job due at start)."""
        self._last = self._probe()

    def check(self, hosts: Iterable[ObjectHost]) -> None:
        """Sample the probe; over the limit, reset the objects that grew it most."""
        if self._unwinding:
            if not all(host.closed.is_set() for host in self._unwinding):
                return  # what they hold is not released yet: decide nothing now
            self._unwinding = []
            gc.collect()  # their instances sit in reference cycles
        used = self._probe()
        previous = used if self._last is None else self._last
        self._last = used
        working = [host for host in hosts if host.serving and host.running_alarm_work]
        for host in working:
            if host.memory_mark is None:
                host.memory_mark = previous  # the last sample before its work began
        if used <= self._limit:
            self._quiet = False
            return
        growth = {host: used - (host.memory_mark or 0.0) for host in working}
        top = max(growth.values(), default=0.0)
        if top <= 0:
            if not self._quiet:
                self._quiet = True
                logger.warning(
                    "memory %.0f > limit %.0f, and no object's alarm work grew it since it"
                    " began: nothing is reset", used, self._limit)
            return
        victims = [host for host, grew in growth.items() if grew > 0 and grew >= top / 2]
        logger.error("memory %.0f > limit %.0f: resetting %d object(s) whose alarm work grew it"
                     " most (%s)", used, self._limit, len(victims),
                     ", ".join(host.label for host in victims))
        for host in victims:
            host.reset(f"memory limit exceeded ({used:.0f} > {self._limit})", memory=True)
        self._unwinding = victims
