"""When recurring schedules fall due: an interval's grid, ``anchor + k·seconds``, and
a cron expression's next slot, matched by ``cronsim`` against the wall clock of its
IANA zone and placed in that zone by the daylight-saving rules of DESIGN section 4;
and the checks of a zone and a cron expression."""

from __future__ import annotations

import datetime
import functools
import math
import zoneinfo
from typing import Final

from cronsim import CronSim, CronSimError

from nursery_jobs._errors import JobError, safe_repr

# The zone a cron string is read in unless ``tz=`` says otherwise.
DEFAULT_TZ: Final = "UTC"


def next_grid_slot(anchor: float, seconds: float, after: float) -> float:
    """The first slot ``anchor + k·seconds`` (k >= 1) strictly after ``after``.

    Each slot is computed from the anchor, never by adding up intervals, so rounding
    does not accumulate: the 1,000th slot of ``every(10)`` is ``anchor + 10_000``.
    """
    k = max(1, math.floor((after - anchor) / seconds) + 1)
    # The division may round either way: settle on the first slot past ``after``.
    while anchor + k * seconds <= after:
        k += 1
    while k > 1 and anchor + (k - 1) * seconds > after:
        k -= 1
    return anchor + k * seconds


def next_cron_time(
    expr: str, after: float, tz: str = DEFAULT_TZ, *, ran: float | None = None,
) -> float:
    """The first slot of cron ``expr`` strictly after epoch time ``after``, its fields
    read as wall-clock time in IANA zone ``tz``. ``ran``: the slot whose run this one
    follows, if any.

    cronsim walks the wall clock (naive datetimes); each wall time it finds is then
    placed in the zone by DESIGN section 4's rules, which cronsim follows only in part
    (for expressions with a fixed minute and hour; and from the second pass of a
    repeated hour it returns the first pass, a time already past): a wall time that
    does not exist that day (skipped by a change to summer time) falls on the next
    existing minute, and one that occurs twice (a change back) fires once — at its
    first occurrence, or at its second where the first was past before the schedule
    counted it (made, or looked again, in the second pass: the walk starts at the wall
    time of ``after``, so a schedule that ran at the first occurrence starts past it,
    and a late run of the first, ``ran``, is not followed by the second).
    """
    zone = _zone(tz)
    wall = datetime.datetime.fromtimestamp(after, zone).replace(tzinfo=None)
    done = None if ran is None else datetime.datetime.fromtimestamp(ran, zone).replace(
        tzinfo=None)
    for slot in CronSim(expr, wall):
        time = _place(slot, zone)
        if time > after:
            return time
        # Its first occurrence precedes ``after``: we are in the second pass of a
        # repeated hour. Its second occurrence (``fold=1``, later only where the wall
        # time is ambiguous) is the slot, unless the first one ran.
        second = slot.replace(tzinfo=zone, fold=1).timestamp()
        if second > after and second > time and slot != done:
            return second
    raise JobError(f"cron expression {expr!r} has no slot in the 50 years after {after}")


def _zone(key: str) -> datetime.tzinfo:
    # UTC needs no time zone database (a slim container may have none): cron schedules
    # without tz= work wherever they did before zones.
    return datetime.UTC if key == DEFAULT_TZ else zoneinfo.ZoneInfo(key)


def _place(wall: datetime.datetime, zone: datetime.tzinfo) -> float:
    """Epoch time of wall time ``wall`` in ``zone``: its first occurrence (``fold=0``)
    if it occurs twice; the next existing minute if it does not exist."""
    moment = wall.replace(tzinfo=zone)
    while _skipped(moment):
        wall += datetime.timedelta(minutes=1)
        moment = wall.replace(tzinfo=zone)
    return moment.timestamp()


def _skipped(moment: datetime.datetime) -> bool:
    """Whether the wall time of ``moment`` does not exist in its zone (a gap)."""
    there_and_back = moment.astimezone(datetime.UTC).astimezone(moment.tzinfo)
    return there_and_back.replace(tzinfo=None) != moment.replace(tzinfo=None)


@functools.cache
def _zone_names() -> frozenset[str]:
    # "localtime" names a different zone on each machine (the host's setting).
    return frozenset(zoneinfo.available_timezones()) - {"localtime"}


def check_tz(tz: object) -> str:
    """The IANA key of ``tz`` (a key, or a ``ZoneInfo`` made from one).

    Keys are looked up among the zones this machine knows, never opened as given: a
    hostile string never reaches the file system.
    """
    key = tz.key if isinstance(tz, zoneinfo.ZoneInfo) else tz
    if key == DEFAULT_TZ:
        return DEFAULT_TZ
    if not isinstance(key, str) or key not in _zone_names():
        raise JobError(
            f"tz must be an IANA time zone name such as 'Europe/Berlin' or 'UTC' (or a"
            f" ZoneInfo of one), got {safe_repr(tz)}"
        )
    return key


def check_cron(expr: str) -> str:
    fields = expr.split()
    if len(fields) != 5:
        raise JobError(
            f"cron expression {expr!r} must have 5 fields (minute hour day month weekday)"
        )
    try:
        CronSim(" ".join(fields), datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC))
    except CronSimError as exc:
        raise JobError(f"invalid cron expression {expr!r}: {exc}") from None
    return " ".join(fields)
