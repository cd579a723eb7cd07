"""The dashboard's charts: a ``Recorder`` samples the runtime's counters per namespace
every ``SAMPLE_INTERVAL`` (an hour of them is kept), and ``charts`` draws dispatch rate,
failed attempts and alarm lateness (p95) per namespace over a window the operator picks
(server-side SVG, no JavaScript)."""

from __future__ import annotations

from collections import deque
from itertools import pairwise
from typing import TYPE_CHECKING, Final
from urllib.parse import urlencode

import attrs
from trio_util import periodic

from nursery_jobs import _clock
from nursery_jobs._core._metrics import LATENESS_BUCKETS, quantile
from nursery_jobs._ops._web_html import _nice, _tick, esc
from nursery_jobs._ops._words import span as span_words

if TYPE_CHECKING:
    from nursery_jobs._core._metrics import Metrics

SAMPLE_INTERVAL: Final = 5.0  # seconds between samples
KEPT: Final = 3600.0  # seconds of samples kept
WINDOWS: Final = (60.0, 300.0, 600.0, 1800.0, 3600.0)  # what the operator may pick
DEFAULT_WINDOW: Final = 600.0
MAX_LINES: Final = 6  # namespaces drawn (the busiest), the rest summed as "other"
COLOURS: Final = ("#3257d6", "#1f8a4c", "#b7791f", "#c53030", "#805ad5", "#2c7a7b", "#6b7385")

Series = dict[str, list[tuple[float, float | None]]]  # namespace -> (time, value)


@attrs.frozen(kw_only=True)
class Sample:
    time: float
    dispatched: dict[str, int]
    failed: dict[str, int]
    lateness: dict[str, list[int]]  # non-cumulative bucket counts


@attrs.frozen(kw_only=True)
class ChartData:
    """The series of one window, read on the Trio thread for one page."""

    window: float
    rates: Series
    failures: Series
    lateness: Series


class Recorder:
    """Samples ``metrics`` every ``interval`` seconds (what the charts draw)."""

    def __init__(self, metrics: Metrics, interval: float = SAMPLE_INTERVAL) -> None:
        self.metrics = metrics
        self.interval = interval
        self.samples: deque[Sample] = deque(maxlen=int(KEPT / interval) + 1)

    def sample(self, now: float) -> None:
        m = self.metrics
        dispatched: dict[str, int] = {}
        failed: dict[str, int] = {}
        for into, counts in ((dispatched, m.dispatched), (failed, m.failed)):
            for (namespace, _owner), n in counts.items():
                into[namespace] = into.get(namespace, 0) + n
        self.samples.append(Sample(
            time=now, dispatched=dispatched, failed=failed,
            lateness={ns: list(h.counts) for ns, h in m.lateness_by_namespace.items()}))

    async def run(self) -> None:
        async for _ in periodic(self.interval):
            self.sample(_clock.now())

    def chart_data(self, window: float, namespace: str | None = None) -> ChartData:
        """Per-interval rates and p95 lateness per namespace over the last ``window``
        seconds (only ``namespace``'s, if given)."""
        samples = list(self.samples)
        if samples:
            start = samples[-1].time - window - self.interval / 2
            samples = [s for s in samples if s.time >= start]
        rates: Series = {}
        failures: Series = {}
        lateness: Series = {}
        for a, b in pairwise(samples):
            elapsed = max(b.time - a.time, 1e-9)
            for ns in {*b.dispatched, *b.lateness}:
                if namespace is not None and ns != namespace:
                    continue
                rates.setdefault(ns, []).append(
                    (b.time, (b.dispatched.get(ns, 0) - a.dispatched.get(ns, 0)) / elapsed))
                failures.setdefault(ns, []).append(
                    (b.time, (b.failed.get(ns, 0) - a.failed.get(ns, 0)) / elapsed))
                before = a.lateness.get(ns, [0] * (len(LATENESS_BUCKETS) + 1))
                after = b.lateness.get(ns, before)
                delta = [y - x for x, y in zip(before, after, strict=True)]
                lateness.setdefault(ns, []).append(
                    (b.time, quantile(LATENESS_BUCKETS, delta, 0.95)))
        return ChartData(window=window, rates=rates, failures=failures, lateness=lateness)


def _busiest(series: Series, rates: Series) -> list[str]:
    volume = {ns: sum(v or 0.0 for _, v in rates.get(ns, [])) for ns in series}
    return sorted(series, key=lambda ns: (-volume[ns], ns))


def svg_lines(series: Series, order: list[str], *, now: float, window: float, unit: str,
              scale: float = 1.0, width: int = 400, height: int = 120) -> str:
    """A chart of one line per namespace (``order``: the colours' order)."""
    left, bottom = 44, 18
    plot_w, plot_h = width - left - 6, height - bottom - 8
    values = [v * scale for points in series.values() for _, v in points if v is not None]
    top = max(values, default=0.0)
    top = _nice(top) if top > 0 else 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
             ' role="img" aria-label="chart">',
             f'<rect x="{left}" y="8" width="{plot_w}" height="{plot_h}" fill="#fafbfd"'
             ' stroke="#e3e6ee"/>']
    for frac in (0.5, 1.0):
        y = 8 + plot_h * (1 - frac)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"'
                     ' stroke="#e3e6ee"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="10" fill="#6b7385"'
                     f' text-anchor="end">{_tick(top * frac)}</text>')
    parts.append(f'<text x="{left}" y="{height - 4}" font-size="10" fill="#6b7385">'
                 f"-{span_words(window)}</text>")
    parts.append(f'<text x="{left + plot_w}" y="{height - 4}" font-size="10" fill="#6b7385"'
                 f' text-anchor="end">now · {esc(unit)}</text>')
    for i, ns in enumerate(order):
        points = [
            (left + plot_w * (1 - min(max(now - t, 0.0), window) / window),
             8 + plot_h * (1 - min(v * scale / top, 1.0)))
            for t, v in series.get(ns, []) if v is not None
        ]
        if points:
            line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            parts.append(f'<polyline points="{line}" fill="none"'
                         f' stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="1.6">'
                         f"<title>{esc(ns)}</title></polyline>")
    if not values:
        parts.append(f'<text x="{left + plot_w / 2}" y="{8 + plot_h / 2}" font-size="11"'
                     ' fill="#6b7385" text-anchor="middle">no samples yet</text>')
    parts.append("</svg>")
    return "".join(parts)


def charts(data: ChartData, now: float, query: dict[str, str]) -> str:
    """The three charts, their legend and the window picker."""
    order = _busiest({**data.rates, **data.lateness}, data.rates)[:MAX_LINES]
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{COLOURS[i]}"></span>'
        f"{esc(ns)}</span>" for i, ns in enumerate(order))
    hidden = len({*data.rates, *data.lateness}) - len(order)
    if hidden > 0:
        legend += f'<span class="muted">… {hidden} quieter namespace(s) not drawn</span>'
    picks = []
    for window in WINDOWS:
        label = span_words(window)
        if window == data.window:
            picks.append(f"<b>{label}</b>")
        else:
            href = "/?" + urlencode({**query, "window": f"{window:g}"})
            picks.append(f'<a href="{esc(href)}">{label}</a>')
    def chart(series: Series, unit: str, scale: float = 1.0) -> str:
        return svg_lines(series, order, now=now, window=data.window, unit=unit, scale=scale)

    return (
        '<div class="charts">'
        f'<div class="chart"><h3>Dispatch rate</h3>'
        f'{chart(data.rates, "jobs/s")}</div>'
        f'<div class="chart"><h3>Failed attempts</h3>'
        f'{chart(data.failures, "per s")}</div>'
        f'<div class="chart"><h3>Alarm lateness (p95)</h3>'
        f'{chart(data.lateness, "ms", 1000.0)}</div>'
        f'<div class="legend">{legend or "<span class=muted>no namespaces yet</span>"}'
        f' <span class="window">window: {" · ".join(picks)}</span></div></div>'
    )


def window_of(query: dict[str, str]) -> float:
    """The chart window the query asks for (one of ``WINDOWS``; the default otherwise)."""
    raw = query.get("window", "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_WINDOW
    return value if value in WINDOWS else DEFAULT_WINDOW
