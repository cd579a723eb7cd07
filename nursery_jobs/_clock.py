"""The runtime's wall clock: epoch seconds derived from Trio's clock, kept on the system
clock.

``now()`` is ``epoch0 + trio.current_time()``, so ``trio.testing.MockClock`` drives every
timer in the library. ``epoch0`` (the anchor) belongs to the Trio run, so that a runtime
reopened later in the same run sees one continuous clock. Trio's clock is monotonic and
stops while the machine sleeps, and NTP may step the system clock: a running runtime
re-anchors (``run_anchor``, and ``reanchor`` whenever its timer wakes), moving ``epoch0``
when it has drifted more than ``DRIFT_THRESHOLD`` from the wall clock. A pinned epoch
(``pin_epoch``, ``set_epoch``) is never moved.
"""

from __future__ import annotations

import datetime as _dt
import math
import numbers
import random
import time as _time
from collections.abc import Callable
from contextlib import aclosing
from typing import Final, NoReturn

import trio
import trio.testing
from trio_util import periodic

from nursery_jobs._errors import TimeArgumentError, describe_error

# Past this drift between the anchor and the wall clock, the anchor moves. (Below it is
# NTP slewing and the cost of reading two clocks; above it a timer would fire visibly
# off its wall time.)
DRIFT_THRESHOLD: Final = 0.05
# How often a runtime compares the anchor with the wall clock, at least.
REANCHOR_INTERVAL: Final = 1.0


class _Anchor:
    """The epoch of one Trio run, and who to tell when it moves."""

    __slots__ = ("epoch", "listeners", "mock_clock", "pinned")

    def __init__(self, epoch: float, *, pinned: bool = False) -> None:
        self.epoch = epoch
        self.pinned = pinned
        self.listeners: list[Callable[[float], object]] = []
        # The run's clock never changes: asked once (an ABC isinstance check costs a
        # microsecond, and every push with a delay asks, issue 22 #11).
        self.mock_clock = isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)


_ANCHOR: trio.lowlevel.RunVar[_Anchor] = trio.lowlevel.RunVar("nursery_jobs_epoch")
# Set by tests (``pin_epoch``) to make every Trio run start at the same epoch.
_pinned: float | None = None
# The wall-clock source: epoch seconds now. Tests replace it (``set_wall_clock``).
_SYSTEM_WALL_CLOCK: Final = _time.time
_wall_clock: Callable[[], float] = _SYSTEM_WALL_CLOCK


def _measure() -> float:
    """The epoch at Trio time zero by the wall clock: the one place it is read."""
    return _wall_clock() - trio.current_time()


def _anchor() -> _Anchor:
    try:
        return _ANCHOR.get()
    except LookupError:
        # Under a pinned epoch the wall clock is never read, not even here.
        anchor = _Anchor(_measure() if _pinned is None else _pinned)
        _ANCHOR.set(anchor)
        return anchor


def _epoch0() -> float:
    if _pinned is not None:
        return _pinned
    try:
        return _ANCHOR.get().epoch
    except LookupError:
        return _anchor().epoch


def set_wall_clock(source: Callable[[], float] | None) -> None:
    """Read the wall clock from ``source()`` (epoch seconds) instead of ``time.time``;
    None restores the system clock. For tests that step the wall clock. Does not
    checkpoint."""
    global _wall_clock
    _wall_clock = _SYSTEM_WALL_CLOCK if source is None else source


def set_epoch(epoch_at_trio_zero: float) -> None:
    """Pin the epoch of this Trio run so that ``now() == epoch + trio.current_time()``;
    it is then never re-anchored.

    Meant for tests under ``MockClock``: times then come out exact. Does not checkpoint.
    """
    anchor = _anchor()
    anchor.epoch = float(epoch_at_trio_zero)
    anchor.pinned = True


def pin_epoch(epoch_at_trio_zero: float | None) -> None:
    """Pin (or with None, unpin) the epoch of every Trio run in this process. For tests
    under ``MockClock``, whose Trio time starts at 0. A pinned epoch is never
    re-anchored."""
    global _pinned
    _pinned = epoch_at_trio_zero


def epoch() -> float:
    """``now() - trio.current_time()``, exactly. Does not checkpoint."""
    return _epoch0()


def now() -> float:
    """Return the runtime's wall clock in Unix epoch seconds. Does not checkpoint."""
    return _epoch0() + trio.current_time()


def fresh_now() -> float:
    """``now()`` after a ``reanchor()``: for a relative delay, measured from when it was
    pushed. Between the once-a-second checks a stepped wall clock leaves ``now()``
    stale by the step (a ``delay=1`` pushed after a 5 s step back fired 6 s later,
    issue 22 #11); reading the wall clock costs well under a microsecond, a push
    hundreds. Does not checkpoint."""
    # ``reanchor()`` then ``now()``, with one look-up of the anchor and one read of each
    # clock (every push with a delay comes here: 1.07 -> 0.54 µs).
    if _pinned is not None:
        return _pinned + trio.current_time()
    anchor = _anchor()
    trio_now = trio.current_time()
    if _may_reanchor(anchor):
        measured = _wall_clock() - trio_now
        drift = measured - anchor.epoch
        if abs(drift) > DRIFT_THRESHOLD:
            _move(anchor, measured, drift)
    return anchor.epoch + trio_now


def _may_reanchor(anchor: _Anchor) -> bool:
    if _pinned is not None or anchor.pinned:
        return False
    # A MockClock's time has nothing to do with the system clock: comparing them would
    # drag now() back to the real time. A test that steps a wall clock sets its own.
    return not (_wall_clock is _SYSTEM_WALL_CLOCK and anchor.mock_clock)


def reanchor() -> float | None:
    """Compare the anchor with the wall clock; past ``DRIFT_THRESHOLD`` of drift, move
    the anchor and call every ``run_anchor`` listener of this Trio run with the drift.

    Returns the drift (seconds the wall clock is ahead of ``now()``; negative if it is
    behind), or None if the anchor stayed. Never moves a pinned epoch. Does not
    checkpoint.
    """
    anchor = _anchor()
    if not _may_reanchor(anchor):
        return None
    measured = _measure()
    drift = measured - anchor.epoch
    if abs(drift) <= DRIFT_THRESHOLD:
        return None
    _move(anchor, measured, drift)
    return drift


def _move(anchor: _Anchor, measured: float, drift: float) -> None:
    """Move the anchor to ``measured`` and tell every ``run_anchor`` listener."""
    anchor.epoch = measured
    for listener in list(anchor.listeners):
        listener(drift)


async def run_anchor(on_adjust: Callable[[float], object]) -> NoReturn:
    """Keep ``now()`` on the wall clock while this task runs: re-anchor every
    ``REANCHOR_INTERVAL`` seconds, and call ``on_adjust(drift)`` whenever a re-anchor
    of this Trio run (this task's, or a ``reanchor()`` call elsewhere) moves the
    epoch — timers whose deadlines are on Trio's clock must then re-arm.

    Under a pinned epoch, or a ``MockClock`` read against the system clock, there is
    nothing to re-anchor: it only waits (so it costs an autojump test nothing).
    """
    anchor = _anchor()
    anchor.listeners.append(on_adjust)
    try:
        if not _may_reanchor(anchor):
            await trio.sleep_forever()
        async with aclosing(periodic(REANCHOR_INTERVAL)) as ticks:
            async for _ in ticks:
                reanchor()
        raise AssertionError("periodic() never ends")  # pragma: no cover
    finally:
        anchor.listeners.remove(on_adjust)


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
        if value.tzinfo is None:
            raise TimeArgumentError(f"{name}: naive datetime {value!r}; pass an aware datetime")
        try:  # (a tzinfo is user code: its utcoffset may raise, or be a day or more off)
            offset = value.utcoffset()
            seconds = None if offset is None else value.timestamp()
        except Exception as exc:
            raise TimeArgumentError(
                f"{name}: a datetime whose tzinfo gives no usable UTC offset"
                f" ({describe_error(exc, 200)})"
            ) from None
        if seconds is None:
            raise TimeArgumentError(f"{name}: naive datetime {value!r}; pass an aware datetime")
        return seconds
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TimeArgumentError(
            f"{name}: expected epoch seconds or an aware datetime, got {value!r}"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        raise TimeArgumentError(f"{name}: {value!r} is not a finite time") from None
    if not math.isfinite(seconds):
        raise TimeArgumentError(f"{name}: {value!r} is not a finite time")
    return seconds


def coerce_delay(value: object, *, name: str = "delay") -> float:
    """Return ``value`` (seconds or a ``timedelta``) as finite seconds >= 0."""
    kind = type(value)
    seconds_of: object = value
    if kind is not float and kind is not int:  # (most delays skip these tests)
        if isinstance(value, _dt.timedelta):
            seconds_of = value.total_seconds()
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TimeArgumentError(f"{name}: expected seconds or a timedelta, got {value!r}")
    try:
        seconds = float(seconds_of)  # type: ignore[arg-type]
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise TimeArgumentError(f"{name}: {value!r} must be a finite number of seconds >= 0")
    return seconds


def is_finite(value: int | float) -> bool:
    """math.isfinite, also for an int too large for a float (which is not finite here:
    math.isfinite raises OverflowError)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def jitter(base: float, fraction: float = 0.5) -> float:
    """Return ``base + uniform(0, base * fraction)``: spread wake-ups of many objects.
    Does not checkpoint.

    Raises:
        TimeArgumentError: (a TypeError and ValueError) ``base`` or ``fraction`` is not
            a finite real number >= 0 (a str, None, a bool, a Decimal), or the time
            they give is past the largest float (``jitter(1e308, 10)``).
    """
    low = _jitter_argument("base", base)
    spread = low * _jitter_argument("fraction", fraction)
    value = low + random.uniform(0.0, spread)
    if not math.isfinite(spread) or not math.isfinite(value):
        raise TimeArgumentError(
            f"jitter: base {base!r} with fraction {fraction!r} is past the largest float")
    return value


def _jitter_argument(name: str, value: object) -> float:
    """``value`` as a float, if it is a finite real number >= 0 (bools are not)."""
    seconds = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            pass
    if not math.isfinite(seconds) or seconds < 0:
        raise TimeArgumentError(f"jitter: {name} {value!r} must be a finite number >= 0")
    return seconds
