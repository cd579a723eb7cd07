"""The runtime's counters and histograms, and their Prometheus text exposition.

Counted on the hot path by two calls (``job_ran``, ``alarm_delivered``: plain dict and
list increments, well under a microsecond); everything else comes from the event bus.
Gauges (objects, due alarms and jobs) are read from a ``DataSource`` when scraped.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

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


class Metrics:
    """What a runtime counts: ``rt.metrics``."""

    __slots__ = ("alarm_lateness", "breaker_seals", "breaker_trips", "crash_strikes",
                 "dead_lettered", "dispatch_duration", "dispatched", "failed", "retried")

    def __init__(self, events: EventBus | None = None) -> None:
        self.dispatched: dict[Labels, int] = {}
        self.failed: dict[Labels, int] = {}
        self.retried: dict[Labels, int] = {}
        self.dead_lettered: dict[Labels, int] = {}
        self.crash_strikes: dict[Labels, int] = {}
        self.breaker_trips: dict[str, int] = {}
        self.breaker_seals: dict[str, int] = {}
        self.dispatch_duration = Histogram(DISPATCH_BUCKETS)
        self.alarm_lateness = Histogram(LATENESS_BUCKETS)
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
        histogram = self.dispatch_duration
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        histogram.sum += seconds

    def alarm_delivered(self, lateness: float) -> None:
        """An alarm run began ``lateness`` seconds after its alarm was due."""
        if lateness < 0.0:
            lateness = 0.0  # re-armed for later meanwhile: on time
        histogram = self.alarm_lateness
        histogram.counts[bisect_left(histogram.bounds, lateness)] += 1
        histogram.sum += lateness

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


# -- Prometheus text exposition (format 0.0.4) ----------------------------------------------
def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    inner = ",".join(f'{n}="{_label_value(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + inner + "}"


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return repr(value)


class Exposition:
    """Builds the text of one scrape."""

    def __init__(self, prefix: str = "nursery_jobs_") -> None:
        self.prefix = prefix
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help: str, samples: Iterable[tuple[tuple[str, ...], float]],
        labels: tuple[str, ...] = (),
    ) -> None:
        # A counter's family is named as its samples are (``x_total``), as
        # prometheus_client writes format 0.0.4: its parser reads samples that do not
        # carry the family's name as a family of their own, typed ``unknown``.
        full = self.prefix + name + ("_total" if kind == "counter" else "")
        self.lines.append(f"# HELP {full} {help}")
        self.lines.append(f"# TYPE {full} {kind}")
        for values, value in samples:
            self.lines.append(f"{full}{_labels(labels, values)} {_number(value)}")

    def counter(self, name: str, help: str, counts: Mapping[Any, int],
                labels: tuple[str, ...]) -> None:
        self.family(name, "counter", help, sorted(counts.items()), labels)

    def gauge(self, name: str, help: str, values: Mapping[Any, float],
              labels: tuple[str, ...] = ()) -> None:
        self.family(name, "gauge", help, sorted(values.items()), labels)

    def histogram(self, name: str, help: str, histogram: Histogram) -> None:
        full = self.prefix + name
        self.lines.append(f"# HELP {full} {help}")
        self.lines.append(f"# TYPE {full} histogram")
        counts, total = histogram.snapshot()
        cumulative = 0
        for bound, n in zip((*histogram.bounds, math.inf), counts, strict=True):
            cumulative += n
            self.lines.append(f'{full}_bucket{{le="{_number(bound)}"}} {cumulative}')
        self.lines.append(f"{full}_sum {_number(total)}")
        self.lines.append(f"{full}_count {cumulative}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def expose_metrics(metrics: Metrics, out: Exposition) -> None:
    """Add the runtime's counters and histograms to ``out``."""
    by_owner = ("namespace", "owner")
    out.counter("jobs_dispatched", "Job attempts run (completed or failed).",
                metrics.dispatched, by_owner)
    out.counter("jobs_failed", "Job attempts that raised.", metrics.failed, by_owner)
    out.counter("jobs_retried", "Failed attempts re-timed for another try.",
                metrics.retried, by_owner)
    out.counter("jobs_dead_lettered", "Jobs moved to the dead letters (failed or sealed).",
                metrics.dead_lettered, by_owner)
    out.counter("crash_strikes", "Jobs that were running when their process died.",
                metrics.crash_strikes, by_owner)
    out.counter("breaker_trips", "Memory-limit resets counted by objects' circuit breakers.",
                {(k,): v for k, v in metrics.breaker_trips.items()}, ("namespace",))
    out.counter("breaker_seals", "Memory-limit resets that sealed jobs.",
                {(k,): v for k, v in metrics.breaker_seals.items()}, ("namespace",))
    out.histogram("dispatch_duration_seconds", "How long job attempts ran.",
                  metrics.dispatch_duration)
    out.histogram("alarm_lateness_seconds", "How late alarm runs began after their alarm.",
                  metrics.alarm_lateness)
