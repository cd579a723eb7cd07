"""Limits per namespace (``open_runtime(limits=...)``): permits for the jobs of one
namespace in this runtime — at most ``concurrency`` running, at most ``k`` starts in any
``per_seconds`` window.

A job takes a permit before it runs and gives it back when its run ends. An object
whose next job finds no permit is *held*: its alarm run ends (its turn, its alarm slot
and its flight slot go back, so calls and other namespaces never wait for the limit),
its jobs stay due, and it waits in line here, by object, in the order it was held. A
permit that comes free is handed to the first object in line (reserved for it) and that
object's alarm is delivered at once; a reservation its run does not use goes to the
next in line when the delivery ends. The object's alarm meanwhile stays a fallback
``park_for`` seconds out, so a process death loses no wake-up.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any, Final

import trio

from nursery_jobs._core._object import DurableObject
from nursery_jobs._errors import LimitError
from nursery_jobs._policy import Limit

# A held object's alarm: if the process dies while it waits in line, the next runtime
# wakes it this long after it was held (the alarm run's own fallback, FALLBACK_ALARM).
PARK_FOR: Final = 30.0


def check_limits(limits: object) -> dict[str, Limit]:
    """``open_runtime(limits=...)`` as ``{namespace: Limit}``: keys are namespaces or
    DurableObject classes (their namespace), values ``nj.Limit``.

    Raises:
        LimitError: naming the bad key or value (nothing is opened).
    """
    if limits is None:
        return {}
    if not isinstance(limits, Mapping):
        raise LimitError(f"limits must be a dict of namespace or class -> nj.Limit, got {limits!r}")
    checked: dict[str, Limit] = {}
    for key, limit in limits.items():
        if isinstance(key, type) and issubclass(key, DurableObject):
            namespace = key.namespace
        elif isinstance(key, str) and key:
            namespace = key
        else:
            raise LimitError(
                f"limits: a key must be a namespace (a non-empty str) or a DurableObject"
                f" class, got {key!r}"
            )
        if not isinstance(limit, Limit):
            raise LimitError(f"limits[{key!r}] must be an nj.Limit, got {limit!r}")
        if namespace in checked:
            raise LimitError(f"limits: namespace {namespace!r} is limited twice")
        checked[namespace] = limit
    return checked


class NamespaceLimit:
    """The permits of one namespace's jobs in this runtime (see the module docstring).

    ``wake(object_id)`` delivers an object's alarm now; ``start_soon`` runs the task
    that waits for the rate window to open. Nothing here checkpoints.
    """

    __slots__ = ("_concurrency", "_per", "_rate", "_start_soon", "_timer_at", "_wake",
                 "namespace", "parked", "pending", "reserved", "running", "starts")

    def __init__(
        self, namespace: str, limit: Limit, wake: Callable[[str], None],
        start_soon: Callable[..., Any],
    ) -> None:
        self.namespace = namespace
        self._concurrency = math.inf if limit.concurrency is None else limit.concurrency
        self._rate: float = math.inf if limit.rate is None else limit.rate[0]
        self._per: float = 0.0 if limit.rate is None else limit.rate[1]
        self._wake = wake
        self._start_soon = start_soon
        self.running = 0  # permits held: running jobs and reservations
        # When each start in the window leaves it (Trio time of the start + per_seconds).
        # Kept as the expiry, not the start: the window task sleeps until exactly that
        # time and the check compares with it, so the two cannot disagree by a rounding
        # (start + per - per < start for some floats: the line spun at one instant).
        self.starts: deque[float] = deque()
        self.pending = 0  # reservations not yet started (they count against the rate)
        self.parked: OrderedDict[str, None] = OrderedDict()  # held objects, in line
        self.reserved: dict[str, int] = {}  # object id -> permits handed to it
        self._timer_at = math.inf  # when the rate-window task wakes (inf: none)

    # -- what an alarm run asks ---------------------------------------------------------
    def try_acquire(self, object_id: str) -> bool:
        """Take a permit for one job of ``object_id`` if one is free (or reserved for
        it); False: the object is held."""
        now = trio.current_time()
        reserved = self.reserved.get(object_id, 0)
        if reserved:
            if reserved == 1:
                del self.reserved[object_id]
            else:
                self.reserved[object_id] = reserved - 1
            self.pending -= 1
            self._started(now)
            return True
        if self.parked or not self._free(now):
            return False  # (a free permit goes to the objects in line first)
        self.running += 1
        self._started(now)
        return True

    def release(self) -> None:
        """A job's run ended: its permit goes to the next object in line."""
        self.running -= 1
        self._dispatch()

    def park(self, object_id: str) -> None:
        """``object_id`` is held: it waits in line (keeping its place if it is in it)."""
        if object_id not in self.parked:
            self.parked[object_id] = None
        self._dispatch()

    def delivered(self, object_id: str) -> None:
        """The object's alarm delivery ended: reservations it did not use go on."""
        unused = self.reserved.pop(object_id, 0)
        if unused:
            self.running -= unused
            self.pending -= unused
            self._dispatch()

    # -- the line ---------------------------------------------------------------------
    def _started(self, now: float) -> None:
        if self._per:
            self.starts.append(now + self._per)

    def _free(self, now: float) -> bool:
        if self.running >= self._concurrency:
            return False
        if not self._per:
            return True
        starts = self.starts
        while starts and starts[0] <= now:
            starts.popleft()
        return len(starts) + self.pending < self._rate

    def _dispatch(self) -> None:
        """Hand free permits to the objects in line, first come first served."""
        now = trio.current_time()
        while self.parked and self._free(now):
            object_id, _ = self.parked.popitem(last=False)
            self.running += 1
            self.pending += 1
            self.reserved[object_id] = self.reserved.get(object_id, 0) + 1
            self._wake(object_id)
        if self.parked and self.running < self._concurrency and self.starts:
            # Held by the rate: look again when the oldest start leaves the window.
            self._wait_for_window(self.starts[0])

    def _wait_for_window(self, at: float) -> None:
        if at >= self._timer_at:
            return  # (a task already wakes by then)
        self._timer_at = at
        self._start_soon(self._window_opens, at)

    async def _window_opens(self, at: float) -> None:
        await trio.sleep_until(at)
        if self._timer_at == at:
            self._timer_at = math.inf
        self._dispatch()


class JobLimits:
    """The runtime's limits: one ``NamespaceLimit`` per limited namespace."""

    __slots__ = ("_by_namespace",)

    def __init__(
        self, limits: dict[str, Limit], wake: Callable[[str, str], None],
        start_soon: Callable[..., Any],
    ) -> None:
        self._by_namespace = {
            namespace: NamespaceLimit(namespace, limit, functools.partial(wake, namespace),
                                      start_soon)
            for namespace, limit in limits.items()
        }

    def __bool__(self) -> bool:
        return bool(self._by_namespace)

    def get(self, namespace: str) -> NamespaceLimit | None:
        return self._by_namespace.get(namespace)

    def delivered(self, namespace: str, object_id: str) -> None:
        limit = self._by_namespace.get(namespace)
        if limit is not None:
            limit.delivered(object_id)
