"""The loop-stall watchdog: notices the Trio thread held by one piece of work (a job
that calls ``time.sleep``, a CPU-bound loop) and names it (issue 10 #8).

A task on the Trio side ticks every ``TICK`` seconds; a daemon thread checks that the
tick is never more than ``STALL_THRESHOLD`` late. When it is, the thread looks at the
Trio thread's stack (``sys._current_frames``) to name what holds it, and logs it, once
per piece of work that holds it (two blocking jobs back to back are two stalls). When
the loop runs again, the tick task emits ``runtime:stalled {seconds, object, job,
where}`` for each, on the Trio thread, where the event bus lives.

Why the stack and not a "what is running" slot that the Lifecycle fills in when a job
starts: jobs interleave at ``await`` points, so the job that started last is often not
the one that blocks (``await fetch()`` then a slow parse). The stack is exact, and
costs nothing until a stall.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

import trio
import trio.testing

if TYPE_CHECKING:
    from nursery_jobs._events import EventBus

logger = logging.getLogger("nursery_jobs")

# A loop that has not run for this long is stalled.
STALL_THRESHOLD: Final = 0.25
# How often the Trio side ticks, and how often the thread looks at the tick.
TICK: Final = 0.05
CHECK: Final = 0.025

# (namespace, object_id, job id or None, "file:line in function") of what held the loop.
Culprit = tuple[str | None, str | None, str | None, str | None]
_NOBODY: Final[Culprit] = (None, None, None, None)


class StallWatch:
    """The watchdog of one runtime's loop. ``await run()`` in the runtime's nursery."""

    def __init__(self, events: EventBus, threshold: float = STALL_THRESHOLD) -> None:
        self._events = events
        self._threshold = threshold
        # Written by the Trio side, read by the thread: single attribute stores and
        # loads, atomic under the GIL. Times are time.monotonic(): the stall is real
        # time on this machine, not the runtime's (possibly virtual) clock.
        self._due = float("inf")  # when the tick task should next run
        # (due, segments) of a stall: what held the loop, piece by piece.
        self._seen: tuple[float, tuple[tuple[float, Culprit], ...]] | None = None
        self._stop = threading.Event()
        self._trio_thread = 0

    async def run(self) -> None:
        """Tick until cancelled, with the thread watching. Under a ``MockClock`` it
        returns at once: virtual time is no measure of a stall, and a 50 ms tick would
        turn every autojump into a walk of 50 ms steps."""
        if isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
            await trio.lowlevel.checkpoint()
            return
        self._trio_thread = threading.get_ident()
        thread = threading.Thread(target=self._watch, name="nursery_jobs stall watchdog",
                                  daemon=True)
        thread.start()
        try:
            while True:
                due = self._due = time.monotonic() + TICK
                await trio.sleep(TICK)
                late = time.monotonic() - due
                if late > self._threshold:
                    self._report(due, late)
        finally:
            self._due = float("inf")
            self._stop.set()

    def _report(self, due: float, late: float) -> None:
        """On the Trio thread, once the loop runs again: emit the stall, one event per
        piece of work that held it (two blocking jobs back to back are two stalls, each
        naming its own job, issue 22 #11)."""
        seen = self._seen
        segments = seen[1] if seen is not None and seen[0] == due else ()
        if not segments:  # too short for the thread to see it: log it here
            logger.warning("the Trio loop stalled for %.3f s", late)
            self._emit(late, _NOBODY)
            return
        ends = [start for start, _ in segments[1:]] + [due + late]
        spans = [(end - start, culprit)
                 for (start, culprit), end in zip(segments, ends, strict=True)]
        long_ones = [span for span in spans if span[0] > self._threshold]
        # Pieces each shorter than a stall (the thread saw several jobs in turn) are
        # one stall of their sum, named by the first.
        for seconds, culprit in long_ones or [(late, segments[0][1])]:
            self._emit(seconds, culprit)

    def _emit(self, seconds: float, culprit: Culprit) -> None:
        namespace, object_id, job, where = culprit
        self._events.emit(
            "runtime:stalled", namespace or "", object_id or "", seconds=round(seconds, 3),
            object=None if namespace is None else f"{namespace}/{object_id}", job=job,
            where=where,
        )

    # -- the thread ---------------------------------------------------------------------
    def _watch(self) -> None:
        stall = 0.0  # the due time of the stall being watched
        # (start, culprit) of each piece of work seen holding the loop in this stall;
        # a new piece starts when another object or job holds it.
        segments: tuple[tuple[float, Culprit], ...] = ()
        logged = 0  # how many of them were logged
        while not self._stop.wait(CHECK):
            due = self._due
            now = time.monotonic()
            if now - due <= self._threshold:
                continue
            if due != stall:
                stall, segments, logged = due, (), 0
            try:
                culprit = self._culprit()
            except Exception:  # a stack in flux, a hostile __eq__: name nobody
                culprit = _NOBODY
            if self._due != due:
                continue  # the loop ran again meanwhile: the tick task reports it
            if not segments or segments[-1][1][:3] != culprit[:3]:
                segments = (*segments, (due if not segments else now, culprit))
                self._seen = (due, segments)
            start, (namespace, object_id, job, where) = segments[-1]
            if logged == len(segments) or now - start <= self._threshold:
                continue
            logged = len(segments)
            logger.warning(
                "the Trio loop has not run for %.3f s: held by %s%s%s", now - start,
                "no object" if namespace is None else f"{namespace}/{object_id}",
                "" if job is None else f", job {job!r}",
                "" if where is None else f", at {where}",
            )

    def _culprit(self) -> Culprit:
        """What the Trio thread runs now: the innermost object host (an alarm run or a
        call) and job context on its stack, and the innermost Python frame."""
        from nursery_jobs._core._host import ObjectHost

        frame: FrameType | None = sys._current_frames().get(self._trio_thread)
        where = None if frame is None else _where(frame)
        job: str | None = None
        try:
            while frame is not None:
                local: dict[str, Any] = frame.f_locals
                ctx = local.get("ctx")
                if job is None:
                    # A JobContext (the floor above: named by shape, not imported).
                    job_id = getattr(getattr(ctx, "job", None), "id", None)
                    job = job_id if isinstance(job_id, str) else None
                host = local.get("self")
                if isinstance(host, ObjectHost):
                    return host.namespace, host.object_id, job, where
                frame = frame.f_back
        finally:
            del frame  # hold no frame of another thread
        return None, None, job, where


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
