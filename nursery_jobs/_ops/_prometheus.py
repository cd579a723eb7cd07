"""``/metrics``: one scrape's numbers (``Scrape``, read before it is written) as Prometheus
text, written by ``prometheus_client`` (the ``web`` extra) from a collector built per
scrape — the runtime's hot path only counts (``_core._metrics``), nothing here runs
between scrapes.

Families (prefix ``nursery_jobs_``): counters by namespace and owner, histograms by
namespace, gauges of the catalog and of every object's jobs (``JobTotals``: not only the
active objects'), the live runtime's own gauges, ``process_*`` and ``build_info``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import attrs

from nursery_jobs._core._metrics import (
    DISPATCH_BUCKETS,
    LATENESS_BUCKETS,
    Labels,
    MetricsSnapshot,
)
from nursery_jobs._ops._inspect import AlarmSummary, DataSource, JobTotals

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

PREFIX: Final = "nursery_jobs_"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


@attrs.frozen(kw_only=True)
class LiveCounters:
    """What a running runtime says of itself at the scrape (read on the Trio thread)."""

    active_by_namespace: dict[str, int]
    alarms_in_flight: int
    events_dropped: int


@attrs.frozen(kw_only=True)
class Scrape:
    """Everything one ``/metrics`` response reports."""

    namespaces: list[tuple[str, int]]
    alarms: AlarmSummary
    totals: JobTotals
    live: LiveCounters | None = None
    metrics: MetricsSnapshot | None = None


def read_scrape(source: DataSource, now: float, live: LiveCounters | None,
                metrics: MetricsSnapshot | None) -> Scrape:
    """The source's part of a scrape (where the source may be read), with the live parts
    read before."""
    return Scrape(namespaces=source.namespaces(), alarms=source.alarm_summary(now),
                  totals=source.job_totals(now), live=live, metrics=metrics)


class ScrapeCollector:
    """A ``prometheus_client`` collector over one ``Scrape``."""

    def __init__(self, scrape: Scrape) -> None:
        self.scrape = scrape

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        scrape = self.scrape
        namespaces = [ns for ns, _ in scrape.namespaces]

        def by_namespace(name: str, doc: str, values: dict[str, int]) -> Metric:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["namespace"])
            # Every namespace of the catalog, 0 where none: an alert sees 0, not absence.
            for ns in sorted({*namespaces, *values}):
                family.add_metric([ns], values.get(ns, 0))
            return family

        yield by_namespace("objects", "Objects in the catalog, by namespace.",
                           dict(scrape.namespaces))
        yield GaugeMetricFamily(PREFIX + "alarms", "Objects with an alarm set.",
                                value=scrape.alarms.alarms)
        yield GaugeMetricFamily(PREFIX + "alarms_due", "Objects whose alarm is due now.",
                                value=scrape.alarms.due)
        totals = scrape.totals
        yield by_namespace("dead_letters", "Dead letters held by every object.",
                           totals.dead_letters)
        yield by_namespace("due_jobs", "Jobs due now, in every object.", totals.due_jobs)
        yield by_namespace("running_jobs", "Jobs running now, in every object.",
                           totals.running_jobs)
        yield by_namespace("paused_objects", "Paused objects.", totals.paused_objects)
        if scrape.live is not None:
            live = scrape.live
            yield by_namespace("active_objects", "Objects resident in memory, by namespace.",
                               live.active_by_namespace)
            yield GaugeMetricFamily(PREFIX + "alarms_in_flight", "Alarm runs in progress.",
                                    value=live.alarms_in_flight)
            yield CounterMetricFamily(PREFIX + "events_dropped",
                                      "Events a full subscriber buffer dropped.",
                                      value=live.events_dropped)
        if scrape.metrics is not None:
            yield from _counters(scrape.metrics, CounterMetricFamily)
            for name, doc, bounds, histograms in (
                ("dispatch_duration_seconds", "How long job attempts ran.", DISPATCH_BUCKETS,
                 scrape.metrics.dispatch_duration),
                ("alarm_lateness_seconds", "How late alarm runs began after their alarm.",
                 LATENESS_BUCKETS, scrape.metrics.alarm_lateness),
            ):
                family = HistogramMetricFamily(PREFIX + name, doc, labels=["namespace"])
                for ns in sorted({*namespaces, *histograms}):
                    counts, total = histograms.get(ns, ([0] * (len(bounds) + 1), 0.0))
                    family.add_metric([ns], _buckets(bounds, counts), total)
                yield family
        from nursery_jobs import __version__

        info = GaugeMetricFamily(PREFIX + "build_info", "The nursery_jobs serving this.",
                                 labels=["version"])
        info.add_metric([__version__], 1)
        yield info


def _counters(metrics: MetricsSnapshot, family_type: Any) -> Iterator[Metric]:
    # Every (namespace, owner) that any counter has seen gets a sample in each (0 until
    # its first increment): a rate over a series that appears at its first increment
    # misses that increment.
    keys: set[Labels] = {*metrics.dispatched, *metrics.failed, *metrics.retried,
                         *metrics.dead_lettered, *metrics.crash_strikes}
    for name, doc, counts in (
        ("jobs_dispatched", "Job attempts run (completed or failed).", metrics.dispatched),
        ("jobs_failed", "Job attempts that raised.", metrics.failed),
        ("jobs_retried", "Failed attempts re-timed for another try.", metrics.retried),
        ("jobs_dead_lettered", "Jobs moved to the dead letters (failed or sealed).",
         metrics.dead_lettered),
        ("crash_strikes", "Jobs that were running when their process died.",
         metrics.crash_strikes),
    ):
        family = family_type(PREFIX + name, doc, labels=["namespace", "owner"])
        for key in sorted(keys):
            family.add_metric(list(key), counts.get(key, 0))
        yield family
    breaker_keys = sorted({*metrics.breaker_trips, *metrics.breaker_seals})
    for name, doc, by_ns in (
        ("breaker_trips", "Memory-limit resets counted by objects' circuit breakers.",
         metrics.breaker_trips),
        ("breaker_seals", "Memory-limit resets that sealed jobs.", metrics.breaker_seals),
    ):
        family = family_type(PREFIX + name, doc, labels=["namespace"])
        for ns in breaker_keys:
            family.add_metric([ns], by_ns.get(ns, 0))
        yield family


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    out = []
    cumulative = 0
    for bound, n in zip((*bounds, math.inf), counts, strict=True):
        cumulative += n
        out.append(("+Inf" if bound == math.inf else repr(bound), float(cumulative)))
    return out


def exposition(scrape: Scrape) -> bytes:
    """The Prometheus text (format 0.0.4) of ``scrape``, with this process's
    ``process_*`` families.

    Raises:
        ImportError: ``prometheus_client`` is not installed (the ``web`` extra).
    """
    try:
        from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
    except ImportError as exc:  # pragma: no cover - the web extra brings it
        raise ImportError(
            "/metrics needs the web extra: pip install 'nursery_jobs[web]'") from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(scrape))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return bytes(generate_latest(registry))
