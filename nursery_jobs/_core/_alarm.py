"""Alarms as one unit: each active object's alarm state, the claim its owner holds,
the backoff policies, and the timer that wakes objects.

A due alarm travels: alarm index (the engine) -> ``Timer`` -> the runtime activates the
object -> ``ObjectAlarm.handler`` runs in the object's nursery -> on failure,
``ObjectAlarm.failed`` re-times it by the alarm's ``Backoff``.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Final, Protocol, cast

import trio

from nursery_jobs import _clock
from nursery_jobs._core._left import Left
from nursery_jobs._errors import (
    DataDirectoryAccessError,
    StorageError,
    StorageFaultError,
    safe_repr,
)
from nursery_jobs._policy import ACTIVATION_RETRY, DURABLE_OBJECT_RETRY

if TYPE_CHECKING:
    from nursery_jobs._core._host import Reset
    from nursery_jobs._core._metrics import Metrics
    from nursery_jobs._core._object import AlarmInfo
    from nursery_jobs._core._tracing import Tracing
    from nursery_jobs._core._transactions import ObjectTransactions
    from nursery_jobs._core._turns import TurnGate
    from nursery_jobs._engines.base import Engine, FlightSlot, ObjectState
    from nursery_jobs._events import EventBus

logger = logging.getLogger("nursery_jobs")

Key = tuple[str, str]
AlarmHandler = Callable[["AlarmInfo"], Awaitable[None]]

# Due alarms fetched per timer pass, beyond those already in flight.
_TIMER_BATCH: Final = 256
# What a failed alarm run may raise that is a fault of the platform — the file, the
# disk, the data directory — rather than of the object's code.
_PLATFORM_FAULTS: Final = (StorageFaultError, DataDirectoryAccessError)


class JobPermits(Protocol):
    """The permits of a limited namespace (``_limits.NamespaceLimit``): taken before
    each job runs, given back when its run ends; an object that finds none is parked
    and its alarm delivered again when one comes free."""

    def try_acquire(self, object_id: str) -> bool: ...

    def release(self) -> None: ...

    def park(self, object_id: str) -> None: ...


class AlarmClaim(Protocol):
    """What the one owner of an object's alarm (the Lifecycle) may do with the object's
    host: the alarm itself, the work and reset hooks, the flight slot, probation."""

    def get(self) -> float | None:
        """The alarm's time, or None."""

    def set(self, time: float) -> None:
        """Set the alarm (lower or raise it); durable when it returns."""

    def delete(self) -> None: ...

    def write_through(self, time: float | None) -> None:
        """Write the alarm to the index even if the cached time says it is there."""

    def working(self, *, alarm: bool = False) -> AbstractContextManager[trio.CancelScope]:
        """Run a block as work of the object (holds off eviction; a reset cancels it)."""

    def reset(self, reason: str, *, memory: bool = False) -> None:
        """Cancel everything the object does and drop it from memory."""

    @property
    def reset_cause(self) -> Reset | None:
        """Why the object was reset (None: it was not): the reason, whether for memory."""

    @property
    def flight(self) -> FlightSlot | None:
        """The flight-record slot of the alarm run in progress (None outside one)."""

    @property
    def probation(self) -> trio.Lock:
        """Held around work under suspicion of killing the process (one at a time)."""

    @property
    def limit(self) -> JobPermits | None:
        """The permits of the object's namespace (None: it is not limited)."""

    def crash_tokens(self) -> list[tuple[str, float]]: ...

    def clear_crash_tokens(self) -> None: ...

    @property
    def turns(self) -> TurnGate:
        """The object's turns (an alarm run hands its turn to waiting calls)."""

    @property
    def transactions(self) -> ObjectTransactions:
        """Who holds the object's database in a transaction (the group, a job, a user
        block)."""

    def destroy(self) -> None:
        """Delete the object's data once its current work ends (its next activation
        starts empty)."""

    def on_startup(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` before the first call each activation serves (until it
        succeeds: a call it fails for gets its error, the next call tries again)."""

    @property
    def metrics(self) -> Metrics:
        """The runtime's counters (jobs run, their durations)."""

    @property
    def tracing(self) -> Tracing | None:
        """The runtime's tracing (``open_runtime(tracing=...)``); None when it is off."""

    @property
    def ships(self) -> bool:
        """Whether commits need ``sync`` to be durable (see ``ObjectState.ships``)."""

    async def sync(self) -> None:
        """Make every commit so far durable. Checkpoints."""


class ObjectAlarm:
    """One active object's alarm: time and retry count as the index holds them, a
    version bumped by every write, what runs when it is due, and its retry policy."""

    __slots__ = (
        "_events", "_state", "_timer", "handler", "namespace", "object_id", "owner",
        "policy", "retry", "time", "version",
    )

    def __init__(
        self, state: ObjectState, timer: Timer, events: EventBus, namespace: str,
        object_id: str,
    ) -> None:
        self._state = state
        self._timer = timer
        self._events = events
        self.namespace = namespace
        self.object_id = object_id
        alarm = state.alarm
        self.time: float | None = None if alarm is None else alarm[0]
        self.retry = 0 if alarm is None else alarm[1]
        self.version = 0
        # What a due alarm runs (None: the object's own ``alarm`` method), and who
        # claimed it (storage.set_alarm is then refused).
        self.handler: AlarmHandler | None = None
        self.owner: str | None = None
        self.policy = DURABLE_OBJECT_RETRY

    def release(self) -> None:
        """The object left memory: let go of its state (``ObjectHost.close``); a late
        write raises ``StorageError`` instead of reaching an object no longer resident."""
        self._state = cast("ObjectState", Left(f"{self.namespace}/{self.object_id}",
                                               "alarm"))

    # -- the storage face (``ctx.storage.set_alarm`` and friends) ---------------------
    def get(self) -> float | None:
        return self.time

    def set(self, time: float) -> None:
        self.write(time, 0)

    def delete(self) -> None:
        self.write(None, 0)

    def write_through(self, time: float | None) -> None:
        self.write(time, 0, force=True)

    def write(self, time: float | None, retry: int, *, force: bool = False) -> None:
        """Set (``time``) or delete (None) the alarm, durably, and tell the timer.
        Skips the write when the cached alarm already says so, unless ``force``."""
        self.version += 1
        if time == self.time and retry == self.retry and not force:
            return
        self._state.write_alarm(time, retry)
        self.time = time
        self.retry = retry
        if time is not None:
            self._timer.lowered(time)

    def failed(self, failure: BaseException, retry: int) -> None:
        """A run of this alarm failed: re-time it by the policy, or drop it."""
        label = f"{self.namespace}/{self.object_id}"
        # nj-faults hook: a storage fault (disk full, a damaged or locked file, a data
        # directory that cannot be written) is the platform's, not the object's: retried
        # with backoff for good, never dropped. Any other StorageError is the code's own
        # (a TurnError, raw SQL under PostgreSQL): it follows the object's policy.
        policy = ACTIVATION_RETRY if isinstance(failure, _PLATFORM_FAULTS) else self.policy
        delay = policy.delay(retry)
        if delay is None:
            self._events.emit(
                "alarm:failed", self.namespace, self.object_id, retries=retry,
                error=safe_repr(failure),
                _log=(logging.ERROR, "alarm of %s failed after %d retries; dropping it: %s",
                      (label, retry, safe_repr(failure))))
            self.write(None, 0)
            return
        self._events.emit(
            "alarm:retry", self.namespace, self.object_id, retry=retry + 1, delay=delay,
            error=safe_repr(failure),
            _log=(logging.WARNING, "alarm of %s raised %s; retry %d in %.1f s",
                  (label, safe_repr(failure), retry + 1, delay)))
        self.write(_clock.now() + delay, retry + 1)


def retry_unreachable(
    engine: Engine, events: EventBus, namespace: str, object_id: str, event: str, why: str,
    *, error: BaseException | None = None,
) -> None:
    """An alarm is due but its object cannot be activated (no class, a database that
    will not open, a fault of ours: ``error``, whose traceback the log record carries):
    try again with backoff, never drop it — its jobs are still there."""
    alarm = engine.get_alarm(namespace, object_id)
    if alarm is None:
        return
    retry = alarm[1]
    delay = ACTIVATION_RETRY.delay(retry)
    assert delay is not None
    events.emit(event, namespace, object_id, retry=retry + 1, delay=delay, error=why,
                _log=(logging.ERROR, "alarm of %s/%s is due but %s; retrying in %.0f s",
                      (namespace, object_id, why, delay)), _exc_info=error)
    engine.set_alarm(namespace, object_id, _clock.now() + delay, retry + 1)


class Timer:
    """Sleeps until the earliest alarm in the engine's index and hands each due object
    to ``deliver`` (one task per object, at most one in flight per object).

    At most ``max_inflight`` deliveries are in flight (``deliver_now`` aside): the rest
    of what is due waits in the index, read again, earliest first, once half of them
    have ended. Each read of the index then costs at most ``max_inflight`` rows however
    many alarms are due. (Issue 26: with every due alarm in flight, 5,000 overdue
    objects, each delivery's end re-read every due row: 613 reads, 3.0 s of a 28.6 s
    cold fire.) Runs beyond the runtime's bound on alarm runs at once only waited for
    it, holding a task each; ``max_inflight`` is a few times that bound, so it never
    waits for deliveries.
    """

    def __init__(
        self, engine: Engine, deliver: Callable[[Key], Awaitable[None]], *,
        max_inflight: int = _TIMER_BATCH,
    ) -> None:
        self._engine = engine
        self._deliver = deliver
        self._max_inflight = max_inflight
        self._scope: trio.CancelScope | None = None
        self._target = math.inf
        # Asleep with ``max_inflight`` in flight: woken when half of them have ended.
        self._full = False
        self._nursery: trio.Nursery | None = None
        self.inflight: set[Key] = set()
        # Objects to deliver again as soon as their delivery in flight ends (a permit of
        # their namespace's limit was reserved for them during it).
        self._again: set[Key] = set()

    def earliest_alarm(self) -> float:
        """The alarm time the timer sleeps until (``inf`` if none). Does not checkpoint."""
        return self._target

    def lowered(self, time: float) -> None:
        """An alarm was set to ``time``: wake earlier if that is sooner."""
        if time < self._target and self._scope is not None:
            self._target = time
            self._scope.deadline = _clock.to_trio_time(time)

    def nudge(self) -> None:
        """Look at the index again now (an alarm may have changed behind our back)."""
        self.lowered(-math.inf)

    def deliver_now(self, key: Key) -> None:
        """Deliver ``key``'s alarm now, whatever its time in the index (a permit of
        its namespace's limit came free). Does not checkpoint."""
        if self._nursery is None:
            return
        if key in self.inflight:
            # The delivery in flight may be past its last job (the object was held, its
            # on_alarm() still runs): it hands the permit on at its end, and the object,
            # out of the line by then, would wait for its fallback alarm (30 s). So it
            # is delivered again once that delivery ends.
            self._again.add(key)
            return
        self.inflight.add(key)
        self._nursery.start_soon(self._delivery, key)

    async def run(self, nursery: trio.Nursery) -> None:
        engine, inflight = self._engine, self.inflight
        self._nursery = nursery
        while True:
            _clock.reanchor()  # every timer wake re-anchors the wall clock (DESIGN §2)
            now = _clock.now()
            room = self._max_inflight - len(inflight)
            started = 0
            if room > 0:
                # (Those in flight come first among the due ones: read past them.)
                for key in engine.due(now, len(inflight) + min(room, _TIMER_BATCH)):
                    if key not in inflight:
                        inflight.add(key)
                        nursery.start_soon(self._delivery, key)
                        started += 1
                        if started == room:
                            break
            if started and started < room:
                await trio.lowlevel.checkpoint()
                continue
            if started:
                # As many in flight as may be: the rest waits in the index, read again
                # (earliest first) when half of these have ended. A lowered alarm
                # changes nothing meanwhile (``_target``: no earlier wake).
                self._full = True
                self._target = -math.inf
                deadline = math.inf
            else:
                # Every due alarm is in flight; sleep until a later one, or until an
                # alarm is lowered (a push, or an alarm run that ended still due).
                target = engine.next_alarm_after(now)
                self._target = math.inf if target is None else target
                deadline = math.inf if target is None else _clock.to_trio_time(target)
            with trio.CancelScope(deadline=deadline) as self._scope:
                await trio.sleep_forever()
            self._scope = None
            self._full = False
            self._target = -math.inf

    async def _delivery(self, key: Key) -> None:
        try:
            await self._deliver(key)
        finally:
            self.inflight.discard(key)
            if key in self._again:
                self._again.discard(key)
                self.deliver_now(key)
            self._delivered(key)

    def _delivered(self, key: Key) -> None:
        """A delivery ended: wake the timer if it has room again, or if the object's
        alarm is still due (a YIELD, a retry now): the index is the truth."""
        if self._full:
            if len(self.inflight) <= self._max_inflight // 2 and self._scope is not None:
                self._scope.cancel(reason="deliveries ended: room to read the index")
            return
        try:
            alarm = self._engine.get_alarm(*key)
        except (StorageError, sqlite3.Error):
            self.nudge()  # (the timer's read of the index handles the fault)
            return
        if alarm is not None:
            self.lowered(alarm[0])
