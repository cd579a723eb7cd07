"""The runtime's counters and histograms (``rt.metrics``).

Counted on the hot path by two calls (``job_ran``, ``alarm_delivered``: plain dict and
list increments, well under a microsecond); everything else comes from the event bus.
The operator faces read a ``snapshot()`` at scrape time (``_ops._prometheus`` writes it as
Prometheus text, with the gauges read from the data source).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from nursery_jobs._events import Event, EventBus

Labels = tuple[str, str]  # (namespace, owner)

DISPATCH_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                           0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATENESS_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                           5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Cumulative-on-read buckets: ``counts[i]`` holds observations <= ``bounds[i]``
    (and above the bound before); the last slot holds the rest (+Inf)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> tuple[list[int], float]:
        return list(self.counts), self.sum


def quantile(bounds: tuple[float, ...], counts: list[int], q: float) -> float | None:
    """Estimate quantile ``q`` from (non-cumulative) bucket counts, as Prometheus'
    ``histogram_quantile`` does (linear within a bucket). None without observations."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    lower = 0.0
    for i, n in enumerate(counts):
        upper = bounds[i] if i < len(bounds) else math.inf
        if seen + n >= rank and n:
            if upper == math.inf:
                return lower
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        lower = upper if upper != math.inf else lower
    return lower


@attrs.frozen(kw_only=True)
class MetricsSnapshot:
    """A copy of a runtime's counters and histograms at one moment (for a scrape)."""

    dispatched: dict[Labels, int]
    failed: dict[Labels, int]
    retried: dict[Labels, int]
    dead_lettered: dict[Labels, int]
    crash_strikes: dict[Labels, int]
    breaker_trips: dict[str, int]
    breaker_seals: dict[str, int]
    # namespace -> (non-cumulative bucket counts, sum)
    dispatch_duration: dict[str, tuple[list[int], float]]
    alarm_lateness: dict[str, tuple[list[int], float]]


def _merged(histograms: dict[str, Histogram], bounds: tuple[float, ...]) -> Histogram:
    out = Histogram(bounds)
    for histogram in histograms.values():
        out.counts = [a + b for a, b in zip(out.counts, histogram.counts, strict=True)]
        out.sum += histogram.sum
    return out


class Metrics:
    """What a runtime counts: ``rt.metrics``. The histograms are kept per namespace."""

    __slots__ = ("breaker_seals", "breaker_trips", "crash_strikes", "dead_lettered",
                 "dispatch_by_namespace", "dispatched", "failed", "lateness_by_namespace",
                 "retried")

    def __init__(self, events: EventBus | None = None) -> None:
        self.dispatched: dict[Labels, int] = {}
        self.failed: dict[Labels, int] = {}
        self.retried: dict[Labels, int] = {}
        self.dead_lettered: dict[Labels, int] = {}
        self.crash_strikes: dict[Labels, int] = {}
        self.breaker_trips: dict[str, int] = {}
        self.breaker_seals: dict[str, int] = {}
        self.dispatch_by_namespace: dict[str, Histogram] = {}
        self.lateness_by_namespace: dict[str, Histogram] = {}
        if events is not None:
            events.add_listener(self.on_event)

    # -- the hot path ---------------------------------------------------------------
    def job_ran(self, namespace: str, owner: str, seconds: float, ok: bool) -> None:
        """A job's attempt ended (``ok``: without an exception) after ``seconds``."""
        key = (namespace, owner)
        counts = self.dispatched
        counts[key] = counts.get(key, 0) + 1
        if not ok:
            failed = self.failed
            failed[key] = failed.get(key, 0) + 1
        histogram = self.dispatch_by_namespace.get(namespace)
        if histogram is None:
            histogram = self.dispatch_by_namespace[namespace] = Histogram(DISPATCH_BUCKETS)
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        histogram.sum += seconds

    def alarm_delivered(self, namespace: str, lateness: float) -> None:
        """An alarm run of an object of ``namespace`` began ``lateness`` seconds after
        its alarm was due."""
        if lateness < 0.0:
            lateness = 0.0  # re-armed for later meanwhile: on time
        histogram = self.lateness_by_namespace.get(namespace)
        if histogram is None:
            histogram = self.lateness_by_namespace[namespace] = Histogram(LATENESS_BUCKETS)
        histogram.counts[bisect_left(histogram.bounds, lateness)] += 1
        histogram.sum += lateness

    @property
    def dispatch_duration(self) -> Histogram:
        """How long job attempts ran, every namespace together (a copy)."""
        return _merged(self.dispatch_by_namespace, DISPATCH_BUCKETS)

    @property
    def alarm_lateness(self) -> Histogram:
        """How late alarm runs began, every namespace together (a copy)."""
        return _merged(self.lateness_by_namespace, LATENESS_BUCKETS)

    # -- from events ------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        kind = event.type
        if kind == "job:retry":
            _bump(self.retried, (event.namespace, str(event.data.get("owner"))))
        elif kind == "job:dead_letter":
            _bump(self.dead_lettered, (event.namespace, str(event.data.get("owner"))))
        elif kind == "job:crash_strike":
            key = (event.namespace, str(event.data.get("owner")))
            _bump(self.crash_strikes, key)
            if event.data.get("sealed"):
                _bump(self.dead_lettered, key)
        elif kind == "alarm:memory_limit_reset":
            self.breaker_trips[event.namespace] = self.breaker_trips.get(event.namespace, 0) + 1
            if event.data.get("sealed"):
                self.breaker_seals[event.namespace] = (
                    self.breaker_seals.get(event.namespace, 0) + 1)

    # -- reading ----------------------------------------------------------------------
    def snapshot(self) -> MetricsSnapshot:
        """A copy of every counter and histogram (microseconds: dict copies)."""
        return MetricsSnapshot(
            dispatched=dict(self.dispatched), failed=dict(self.failed),
            retried=dict(self.retried), dead_lettered=dict(self.dead_lettered),
            crash_strikes=dict(self.crash_strikes), breaker_trips=dict(self.breaker_trips),
            breaker_seals=dict(self.breaker_seals),
            dispatch_duration={ns: h.snapshot() for ns, h in self.dispatch_by_namespace.items()},
            alarm_lateness={ns: h.snapshot() for ns, h in self.lateness_by_namespace.items()},
        )

    def totals(self) -> dict[str, int]:
        return {
            "dispatched": sum(self.dispatched.values()),
            "failed": sum(self.failed.values()),
            "retried": sum(self.retried.values()),
            "dead_lettered": sum(self.dead_lettered.values()),
            "crash_strikes": sum(self.crash_strikes.values()),
            "breaker_trips": sum(self.breaker_trips.values()),
        }


def _bump(counts: dict[Labels, int], key: Labels) -> None:
    counts[key] = counts.get(key, 0) + 1
