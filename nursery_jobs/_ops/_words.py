"""Stored things said in words for an operator: a Scheduler's envelope as "every 10 s" or
"cron 0 9 * * * Europe/Berlin, next 09:00", spans of time rounded, event data shown as
values (not as ``repr`` of ``repr``)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_KINDS: Final = frozenset({"delayed", "scheduled", "cron", "interval"})
EVENT_VALUE_CHARS: Final = 200


def span(seconds: float) -> str:
    """A length of time, rounded to what a person reads: 850 ms, 2.5 s, 17 s, 2.5 min,
    3 h, 2 d (a value that rounds up to the next unit is said in it: 1 h, not 60 min)."""
    value = abs(seconds)
    if value < 0.9995:
        return f"{value * 1000:.0f} ms"
    for unit, size, below in (("s", 1, 60), ("min", 60, 60), ("h", 3600, 24)):
        scaled = value / size
        if scaled < below - 0.5:
            return f"{_figure(scaled)} {unit}"
    return f"{_figure(value / 86400)} d"


def _figure(value: float) -> str:
    """One decimal below 10 (dropped when it is 0), none above."""
    if value < 9.95:
        return f"{value:.1f}".removesuffix(".0")
    return f"{value:.0f}"


def is_schedule(payload: Any) -> bool:
    """Whether a job's payload is a Scheduler's envelope."""
    return isinstance(payload, dict) and payload.get("k") in _KINDS and "p" in payload


def _zone(name: Any) -> dt.tzinfo:
    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        return dt.UTC


def _clock_time(t: float, zone: dt.tzinfo, now: float | None) -> str:
    local = dt.datetime.fromtimestamp(t, zone)
    if now is not None and abs(t - now) < 86400:
        return local.strftime("%H:%M") if local.second == 0 else local.strftime("%H:%M:%S")
    return local.strftime("%Y-%m-%d %H:%M")


def schedule_words(payload: Any, time: float, now: float | None = None) -> str | None:
    """A Scheduler's envelope in words, with its next run (its time of day within a
    day of ``now``, else its date too); None if it is not one."""
    if not is_schedule(payload):
        return None
    kind = payload["k"]
    zone_name = payload.get("z", "UTC")
    zone = _zone(zone_name)
    nxt = _clock_time(time, zone, now)
    if kind == "interval" and isinstance(payload.get("i"), int | float):
        return f"every {span(float(payload['i']))}, next {nxt}"
    if kind == "cron":
        return f"cron {payload.get('c')} {zone_name}, next {nxt}"
    if kind == "scheduled":
        return f"once at {nxt} {zone_name}"
    if now is None:
        return f"once at {nxt} {zone_name}"
    return f"once, {'in ' + span(time - now) if time > now else 'due now'}"


def event_value(value: Any) -> str:
    """An event's datum as shown in a table: text as it is, numbers rounded."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= EVENT_VALUE_CHARS else text[:EVENT_VALUE_CHARS - 1] + "…"
