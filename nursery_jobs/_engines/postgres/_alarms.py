"""Alarms under the PostgreSQL engine, this host's side: the local index the timer reads
(the alarms of the objects this host holds), and the claim of due objects nobody holds.

A host claims the alarms of the namespaces its runtime resolves to a class only; one it
cannot resolve is logged once and left to the hosts that can.
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import TYPE_CHECKING, Final

import psycopg
import trio

from nursery_jobs import _clock
from nursery_jobs._engines.base import EngineSite
from nursery_jobs._engines.postgres import _ops as ops
from nursery_jobs._engines.postgres._leases import lease_clock

if TYPE_CHECKING:
    from nursery_jobs._engines.postgres._copy import PgObject
    from nursery_jobs._engines.postgres._leases import Leases
    from nursery_jobs._engines.postgres._statements import Db

logger = logging.getLogger("nursery_jobs")

Key = tuple[str, str]

# The claim loop looks for due, unleased objects at least this often (seconds).
POLL_INTERVAL: Final = 1.0
# Objects claimed per statement, and claimed but not yet activated at most.
CLAIM_BATCH: Final = 64
MAX_UNACTIVATED: Final = 256
# A namespace this host cannot resolve to a class is looked at again after this many
# seconds (a module imported since, a class defined later); logged the first time only.
UNSERVED_RECHECK: Final = 60.0


class AlarmIndex:
    """The alarms of the objects this host holds: key -> (time, retry) in ``times``,
    and the same alarms as a heap of (time, key) in ``heap``, for ``due`` and
    ``next_after`` without a scan of every held object. Heap entries go stale when an
    alarm moves or goes (an entry counts only while ``times`` has that time for its
    key); the heap is rebuilt when stale entries outnumber live ones."""

    __slots__ = ("heap", "times")

    def __init__(self) -> None:
        self.times: dict[Key, tuple[float, int]] = {}
        self.heap: list[tuple[float, Key]] = []

    def __len__(self) -> int:
        return len(self.times)

    def get(self, key: Key) -> tuple[float, int] | None:
        return self.times.get(key)

    def discard(self, key: Key) -> None:
        self.times.pop(key, None)

    def clear(self) -> None:
        self.times.clear()
        self.heap.clear()

    def put(self, key: Key, alarm: tuple[float, int]) -> None:
        old = self.times.get(key)
        self.times[key] = alarm
        if old is not None and old[0] == alarm[0]:
            return  # the heap entry for this time is live already
        heap = self.heap
        heapq.heappush(heap, (alarm[0], key))
        if len(heap) > 2 * len(self.times) + 64:
            self.heap = heap = [(t, k) for k, (t, _) in self.times.items()]
            heapq.heapify(heap)

    def _live(self, time: float, key: Key) -> bool:
        alarm = self.times.get(key)
        return alarm is not None and alarm[0] == time

    def due(self, now: float, limit: int) -> list[tuple[str, str]]:
        # Walk the heap's subtree of entries <= now (every other entry's children are
        # later still): the cost is the number of due entries, not of held objects.
        heap, found, stack = self.heap, [], [0]
        while stack:
            i = stack.pop()
            if i >= len(heap) or heap[i][0] > now:
                continue
            if self._live(*heap[i]):
                found.append(heap[i])
            stack += (2 * i + 1, 2 * i + 2)
        return [key for _, key in heapq.nsmallest(limit, set(found))]

    def next_after(self, now: float) -> float | None:
        heap, best, stack = self.heap, math.inf, [0]
        while stack:
            i = stack.pop()
            if i >= len(heap) or heap[i][0] >= best:
                continue
            time, key = heap[i]
            if time > now and self._live(time, key):
                best = time  # its children are no earlier
                continue
            stack += (2 * i + 1, 2 * i + 2)
        return None if best == math.inf else best


class Claims:
    """The claim loop: takes the leases of due objects nobody holds, in the namespaces
    this host serves (``served``), and indexes their alarms. ``classes`` (namespace ->
    class path) is the engine's, shared."""

    def __init__(self, host_id: str, lease_ttl: float, label: str, db: Db, leases: Leases,
                 alarms: AlarmIndex, active: dict[Key, PgObject],
                 classes: dict[str, str]) -> None:
        self._host_id = host_id
        self._lease_ttl = lease_ttl
        self._label = label
        self._db = db
        self._held = leases.held
        self._hold = leases.hold
        self._alarms = alarms
        self._active = active
        self._classes = classes
        # Namespaces whose alarms this host claims (its runtime resolves them), and
        # those it does not: namespace -> when (Trio time) to look at it again.
        self.served: set[str] = set()
        self._unserved: dict[str, float] = {}
        self._unserved_logged: set[str] = set()
        self._wake = trio.Event()

    def wake(self) -> None:
        """Look for due objects now (an alarm was announced, a lease released)."""
        self._wake.set()

    async def loop(self, site: EngineSite) -> None:
        while True:
            room = max(0, min(CLAIM_BATCH, MAX_UNACTIVATED - (len(self._held) - len(self._active))))
            sent = lease_clock()
            unknown: list[tuple[str, str]] = []
            try:
                claimed, next_time, unknown = await self._db(
                    ops.claim, self._host_id, self._lease_ttl, _clock.now(), room,
                    sorted(self.served), self._skipped_namespaces(),
                )
            except psycopg.Error as exc:
                logger.warning("cannot claim due objects on %s: %s", self._label, exc)
                claimed, next_time = [], None
            for c in claimed:
                key = (c.namespace, c.object_id)
                if not self._hold(key, c.epoch, sent):
                    continue  # (taken again meanwhile by an activation: its alarm stands)
                self._alarms.put(key, c.alarm)
                self._classes.setdefault(c.namespace, c.class_path)
            if claimed:
                site.wake_timer()
                if len(claimed) == room:
                    await trio.lowlevel.checkpoint()
                    continue
            if self._learn_namespaces(site, unknown):
                await trio.lowlevel.checkpoint()
                continue  # a namespace it serves has due alarms: claim them now
            delay = POLL_INTERVAL
            if next_time is not None:
                delay = min(delay, max(0.0, next_time - _clock.now()))
            with trio.move_on_after(delay):
                await self._wake.wait()
            self._wake = trio.Event()

    def _skipped_namespaces(self) -> list[str]:
        """The namespaces this host does not serve, until it looks at them again."""
        now = trio.current_time()
        for namespace in [ns for ns, until in self._unserved.items() if until <= now]:
            del self._unserved[namespace]
        return sorted(self._unserved)

    def _learn_namespaces(self, site: EngineSite, found: list[tuple[str, str]]) -> bool:
        """Sort namespaces with due alarms that this host has not looked at into those
        it serves and those it does not (one log line per namespace, the first time);
        whether any is served."""
        served = False
        for namespace, class_path in found:
            self._classes.setdefault(namespace, class_path)
            if site.serves(namespace, self._classes.get(namespace)):
                self.served.add(namespace)
                self._unserved_logged.discard(namespace)
                served = True
                continue
            self._unserved[namespace] = trio.current_time() + UNSERVED_RECHECK
            if namespace not in self._unserved_logged:
                self._unserved_logged.add(namespace)
                logger.warning(
                    "alarms of namespace %r are due, but no class is registered for it on"
                    " host %s (class path %r does not import here): this host leaves them to"
                    " hosts that have it", namespace, self._host_id, class_path)
        return served
