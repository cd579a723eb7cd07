"""The runtime's wall clock: epoch seconds derived from Trio's clock.

``now()`` is ``epoch0 + trio.current_time()``, so ``trio.testing.MockClock`` drives every
timer in the library. ``epoch0`` is fixed once per Trio run (a ``RunVar``) so that a
runtime reopened later in the same run sees one continuous clock.
"""

from __future__ import annotations

import datetime as _dt
import math
import random
import time as _time

import trio

from ._errors import TimeArgumentError

_EPOCH: trio.lowlevel.RunVar[float] = trio.lowlevel.RunVar("nursery_jobs_epoch")
# Set by tests (``pin_epoch``) to make every Trio run start at the same epoch.
_pinned: float | None = None


def _epoch0() -> float:
    if _pinned is not None:
        return _pinned
    try:
        return _EPOCH.get()
    except LookupError:
        # The one place the wall clock is read: it anchors Trio's clock to the epoch.
        epoch = _time.time() - trio.current_time()
        _EPOCH.set(epoch)
        return epoch


def set_epoch(epoch_at_trio_zero: float) -> None:
    """Pin the epoch of this Trio run so that ``now() == epoch + trio.current_time()``.

    Meant for tests under ``MockClock``: times then come out exact. Does not checkpoint.
    """
    _EPOCH.set(float(epoch_at_trio_zero))


def pin_epoch(epoch_at_trio_zero: float | None) -> None:
    """Pin (or with None, unpin) the epoch of every Trio run in this process. For tests
    under ``MockClock``, whose Trio time starts at 0."""
    global _pinned
    _pinned = epoch_at_trio_zero


def epoch() -> float:
    """``now() - trio.current_time()``, exactly. Does not checkpoint."""
    return _epoch0()


def now() -> float:
    """Return the runtime's wall clock in Unix epoch seconds. Does not checkpoint."""
    return _epoch0() + trio.current_time()


def to_trio_time(epoch_seconds: float) -> float:
    """Convert an epoch time to a deadline on Trio's clock. Does not checkpoint."""
    return epoch_seconds - _epoch0()


def coerce_time(value: object, *, name: str = "time") -> float:
    """Return ``value`` as finite epoch seconds; accept ints, floats and aware datetimes.

    Raises:
        TimeArgumentError: (a TypeError and ValueError) for what is not a time: other
            types, NaN, infinities and naive datetimes.
    """
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise TimeArgumentError(f"{name}: naive datetime {value!r}; pass an aware datetime")
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TimeArgumentError(
            f"{name}: expected epoch seconds or an aware datetime, got {value!r}"
        )
    seconds = float(value)
    if not math.isfinite(seconds):
        raise TimeArgumentError(f"{name}: {value!r} is not a finite time")
    return seconds


def coerce_delay(value: object, *, name: str = "delay") -> float:
    """Return ``value`` (seconds or a ``timedelta``) as finite seconds >= 0."""
    if isinstance(value, _dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TimeArgumentError(f"{name}: expected seconds or a timedelta, got {value!r}")
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise TimeArgumentError(f"{name}: {value!r} must be a finite number of seconds >= 0")
    return seconds


def jitter(base: float, fraction: float = 0.5) -> float:
    """Return ``base + uniform(0, base * fraction)``: spread wake-ups of many objects."""
    if not math.isfinite(base) or base < 0:
        raise TimeArgumentError(f"jitter: base {base!r} must be a finite number >= 0")
    if not math.isfinite(fraction) or fraction < 0:
        raise TimeArgumentError(f"jitter: fraction {fraction!r} must be a finite number >= 0")
    return base + random.uniform(0.0, base * fraction)
