"""Scheduler time zones and missed slots (DESIGN.md §4): a cron string read in an IANA
zone (``tz=``) follows daylight-saving changes — 09:00 stays 09:00 local time, a local
time that does not exist that day fires at the next existing minute, one that occurs
twice fires once; ``missed="skip"`` drops slots missed while the process was down
instead of coalescing them into a catch-up run; both options are stored with the
schedule (they survive restarts, and rows stored before them still read), and are
checked at the call.

Every timer test runs under ``autojump_clock`` with exact virtual times. The DST tests
pin the epoch a little before the change they cross (Europe/Berlin in 2027: clocks go
forward 02:00 CET -> 03:00 CEST on Sunday 28 March, back 03:00 CEST -> 02:00 CET on
Sunday 31 October, both at 01:00 UTC); a test that needs the wall clock a day later
closes its runtime and sleeps while it is down, so no engine polls through the day.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import zoneinfo
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import trio
import trio.testing
from conftest import EPOCH, VIRTUAL_DAY_OF_POLLING, engine

import nursery_jobs as nj
from nursery_jobs import _clock
from nursery_jobs._capabilities._slots import next_cron_time
from nursery_jobs._codec import content_text


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


# A generous virtual-time bound: under autojump a hang jumps here and fails the test.
HANG = 10_000_000
UTC = dt.UTC
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
MINUTE = 60
HOUR = 3600
DAY = 86400


def utc(*fields: int) -> float:
    return dt.datetime(*fields, tzinfo=UTC).timestamp()  # type: ignore[misc]


def pin(epoch: float) -> None:
    """Make ``nj.now()`` read ``epoch`` now (conftest unpins after the test)."""
    _clock.pin_epoch(epoch - trio.current_time())


def berlin(t: float) -> str:
    """Epoch ``t`` as Berlin wall time with its zone name, e.g. ``03-28 03:00:00 CEST``
    (fractions of a second shown if any: every time asserted here is exact)."""
    local = dt.datetime.fromtimestamp(t, BERLIN)
    text = f"{local:%m-%d %H:%M:%S}"
    if local.microsecond:
        text += f".{local.microsecond:06d}"
    return f"{text} {local.tzname()}"


NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def new_york(t: float) -> str:
    """Epoch ``t`` as New York wall time with its zone name, e.g. ``11-07 01:30 EST``."""
    local = dt.datetime.fromtimestamp(t, NEW_YORK)
    return f"{local:%m-%d %H:%M} {local.tzname()}"


class Env:
    """Shared between a test and its objects (passed as the runtime's ``env``)."""

    def __init__(self) -> None:
        # (schedule id, epoch time, payload) per callback run, in run order.
        self.runs: list[tuple[str, float, Any]] = []
        self.events: list[nj.Event] = []
        # Awaited by the "work" callback, if set.
        self.work: Callable[[], Awaitable[None]] | None = None

    def times(self, schedule_id: str | None = None) -> list[float]:
        return [t for sid, t, _ in self.runs if schedule_id is None or sid == schedule_id]

    def local(self, schedule_id: str | None = None) -> list[str]:
        return [berlin(t) for t in self.times(schedule_id)]

    def of(self, type: str) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.type == type]

    def callbacks(self) -> dict[str, Any]:
        env = self

        async def tick(payload: Any, schedule: nj.Schedule) -> None:
            env.runs.append((schedule.id, nj.now(), payload))

        async def work(payload: Any, schedule: nj.Schedule) -> None:
            env.runs.append((schedule.id, nj.now(), payload))
            if env.work is not None:
                await env.work()

        return {"tick": tick, "work": work}


class Zoned(nj.DurableObject):
    """A Lifecycle object with one Scheduler whose callbacks come from ``env``."""

    namespace = "tests.test_scheduler_zones.Zoned"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.scheduler = nj.Scheduler(self.env.callbacks())
        self.lifecycle = nj.Lifecycle.install(self).use(self.scheduler)

    async def schedule(self, when: Any, callback: str, payload: Any = None,
                       **kwargs: Any) -> nj.Schedule:
        return await self.scheduler.schedule(when, callback, payload, **kwargs)

    async def every(self, seconds: Any, callback: str, payload: Any = None,
                    **kwargs: Any) -> nj.Schedule:
        return await self.scheduler.every(seconds, callback, payload, **kwargs)

    async def get(self, schedule_id: str) -> nj.Schedule | None:
        return self.scheduler.get(schedule_id)

    async def schedules(self) -> list[nj.Schedule]:
        return self.scheduler.list()

    async def schedule_in_zoneinfo(self, when: str, callback: str, key: str) -> nj.Schedule:
        """``schedule`` with ``tz`` a ``ZoneInfo`` (which no stub call carries)."""
        return await self.scheduler.schedule(when, callback, tz=zoneinfo.ZoneInfo(key))

    async def push_raw(self, callback: str, time: float, envelope: dict[str, Any],
                       job_id: str) -> None:
        """Store a schedule row as an older version wrote it (its own envelope)."""
        await self.scheduler.lifecycle.jobs.push(callback, time=time, payload=envelope,
                                                 id=job_id)


def alarm(rt: nj.Runtime, object_id: str = "z") -> float | None:
    found = engine.stored_alarm(rt, Zoned.namespace, object_id)
    return None if found is None else found[0]


def listen(rt: nj.Runtime, env: Env) -> None:
    rt.events.add_listener(env.events.append)


def test_the_2027_berlin_changes_these_tests_assume() -> None:
    assert berlin(utc(2027, 3, 28, 0, 59)) == "03-28 01:59:00 CET"
    assert berlin(utc(2027, 3, 28, 1, 0)) == "03-28 03:00:00 CEST"
    assert berlin(utc(2027, 10, 31, 0, 59)) == "10-31 02:59:00 CEST"
    assert berlin(utc(2027, 10, 31, 1, 0)) == "10-31 02:00:00 CET"


# -- 09:00 stays 09:00 ------------------------------------------------------------------------

# The day before each change, the day of it and the two after.
CHANGES = {
    "march": [dt.date(2027, 3, d) for d in (27, 28, 29, 30)],
    "october": [dt.date(2027, 10, 30), dt.date(2027, 10, 31), dt.date(2027, 11, 1),
                dt.date(2027, 11, 2)],
}
NINES = {
    "march": ["03-27 09:00:00 CET", "03-28 09:00:00 CEST", "03-29 09:00:00 CEST",
              "03-30 09:00:00 CEST"],
    "october": ["10-30 09:00:00 CEST", "10-31 09:00:00 CET", "11-01 09:00:00 CET",
                "11-02 09:00:00 CET"],
}


def local(day: dt.date, hour: int, minute: int = 0) -> float:
    """Berlin wall time ``hour:minute`` of ``day``, in epoch seconds."""
    return dt.datetime.combine(day, dt.time(hour, minute), tzinfo=BERLIN).timestamp()


@pytest.mark.parametrize("change", CHANGES)
async def test_a_berlin_nine_oclock_cron_fires_at_nine_local_across_the_change(
    autojump_clock: trio.testing.MockClock, change: str
) -> None:
    engine.skip_on("postgres", VIRTUAL_DAY_OF_POLLING)
    days = CHANGES[change]
    pin(local(days[0], 8))
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Zoned, "z")
            schedule = await obj.schedule("0 9 * * *", "tick", id="nine", tz="Europe/Berlin")
            assert (schedule.kind, schedule.cron, schedule.tz) == (
                "cron", "0 9 * * *", "Europe/Berlin")
            assert schedule.time == local(days[0], 9)
            await trio.sleep(local(days[2], 10) - nj.now())
            # The same local time on both sides of the change: 23 or 25 hours apart.
            assert env.times() == [local(day, 9) for day in days[:3]]
            assert env.local() == NINES[change][:3]
            [stored] = await obj.schedules()
            assert berlin(stored.time) == NINES[change][3]


@pytest.mark.parametrize("change", CHANGES)
async def test_the_zone_is_stored_and_a_reopened_runtime_keeps_nine_local(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, change: str
) -> None:
    # The runtime is down for most of each day (nothing polls): it opens a minute
    # before each 09:00, so every run is fired by a freshly opened runtime that only
    # has the stored row to go by.
    days = CHANGES[change]
    pin(local(days[0], 8, 59))
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await rt.get(Zoned, "z").schedule("0 9 * * *", "tick", id="nine",
                                              tz="Europe/Berlin")
        for n, day in enumerate(days[:3]):
            await trio.sleep(local(day, 8, 59) - nj.now())  # down until 08:59 local
            async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
                [stored] = await rt.get(Zoned, "z").schedules()
                assert (stored.tz, stored.missed) == ("Europe/Berlin", "coalesce")
                assert stored.time == local(day, 9)
                await trio.sleep(2 * MINUTE)
                assert env.times() == [local(d, 9) for d in days[:n + 1]]
        assert env.local() == NINES[change][:3]


# -- local times that do not exist, or exist twice -------------------------------------------


async def test_a_local_time_that_does_not_exist_fires_at_the_next_existing_minute(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pin(utc(2027, 3, 28, 0, 29))  # 01:29 CET, half an hour before the clocks go forward
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Zoned, "z")
            half_two = await obj.schedule("30 2 * * *", "tick", id="02:30", tz="Europe/Berlin")
            halves = await obj.schedule("*/30 * * * *", "tick", id="*/30", tz="Europe/Berlin")
            # There is no 02:30 on 28 March: the next existing minute is 03:00 CEST.
            assert berlin(half_two.time) == "03-28 03:00:00 CEST"
            assert berlin(halves.time) == "03-28 01:30:00 CET"
            await trio.sleep(62 * MINUTE)  # to 03:31 CEST
            assert env.local("02:30") == ["03-28 03:00:00 CEST"]
            # 02:00 and 02:30 do not exist: both fall on 03:00, which runs once.
            assert env.local("*/30") == ["03-28 01:30:00 CET", "03-28 03:00:00 CEST",
                                         "03-28 03:30:00 CEST"]
            stored = {s.id: berlin(s.time) for s in await obj.schedules()}
            assert stored == {"02:30": "03-29 02:30:00 CEST", "*/30": "03-28 04:00:00 CEST"}


async def test_a_local_time_that_occurs_twice_fires_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pin(utc(2027, 10, 31, 0, 29))  # 02:29 CEST: 02:00-02:59 comes again after 03:00 CEST
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Zoned, "z")
            await obj.schedule("30 2 * * *", "tick", id="02:30", tz="Europe/Berlin")
            await obj.schedule("*/30 * * * *", "tick", id="*/30", tz="Europe/Berlin")
            await trio.sleep(46 * MINUTE)  # to 02:15 CET, the second 02:15
            assert env.local("02:30") == ["10-31 02:30:00 CEST"]
            # Created in the second 02:00-02:59, after the first 02:30 and before the
            # second, a 02:30 cron fires at the second (once that day; never a time in
            # the past, run at once).
            late = await obj.schedule("30 2 * * *", "tick", id="late", tz="Europe/Berlin")
            assert berlin(late.time) == "10-31 02:30:00 CET"
            await trio.sleep(50 * MINUTE)  # to 03:05 CET
            assert env.local("02:30") == ["10-31 02:30:00 CEST"]
            assert env.local("late") == ["10-31 02:30:00 CET"]
            # Each local time fires once: not again in the repeated hour.
            assert env.local("*/30") == ["10-31 02:30:00 CEST", "10-31 03:00:00 CET"]
            stored = {s.id: berlin(s.time) for s in await obj.schedules()}
            assert stored == {"02:30": "11-01 02:30:00 CET", "late": "11-01 02:30:00 CET",
                              "*/30": "10-31 03:30:00 CET"}


async def test_a_cron_made_in_the_repeated_hour_fires_at_the_second_occurrence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 7 November 2027, New York: 02:00 EDT becomes 01:00 EST; 06:10 UTC is 01:10 EST,
    # in the second pass, after 01:30 EDT (05:30 UTC) and before 01:30 EST (06:30 UTC).
    pin(utc(2027, 11, 7, 6, 10))
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            assert new_york(nj.now()) == "11-07 01:10 EST"
            made = await rt.get(Zoned, "z").schedule("30 1 * * *", "tick", id="c",
                                                     tz="America/New_York")
            assert new_york(made.time) == "11-07 01:30 EST"
            await trio.sleep(HOUR)
            # Once that day (zero times, before: the first 01:30 was dropped as past).
            assert [new_york(t) for t in env.times("c")] == ["11-07 01:30 EST"]


def test_the_next_slot_in_the_repeated_hour_is_its_second_pass_unless_the_first_ran() -> None:
    expr, zone = "30 2 * * *", "Europe/Berlin"
    first, second = utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 1, 30)  # 02:30 CEST, CET
    tomorrow = "11-01 02:30:00 CET"
    assert berlin(next_cron_time(expr, utc(2027, 10, 31, 0, 10), zone)) == berlin(first)
    # In the second pass, before its 02:30: that one (the first is past).
    assert berlin(next_cron_time(expr, utc(2027, 10, 31, 1, 10), zone)) == berlin(second)
    # Just after a run at the first 02:30: its wall clock is past 02:30, tomorrow.
    assert berlin(next_cron_time(expr, first + 1, zone, ran=first)) == tomorrow
    # A late run of the first 02:30 (the process was down over it) in the second pass:
    # 02:30 fired once, so not again at the second.
    assert berlin(next_cron_time(expr, utc(2027, 10, 31, 1, 10), zone, ran=first)) == tomorrow
    assert berlin(next_cron_time(expr, second, zone)) == tomorrow
    # A wall time that does not exist has no second pass either.
    assert berlin(next_cron_time(expr, utc(2027, 3, 28, 0, 59), zone)) == "03-28 03:00:00 CEST"


async def test_a_late_run_of_the_first_occurrence_is_not_followed_by_the_second(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    pin(utc(2027, 10, 31, 0, 20))  # 02:20 CEST
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            made = await rt.get(Zoned, "z").schedule("30 2 * * *", "tick", id="c",
                                                     tz="Europe/Berlin")
            assert berlin(made.time) == "10-31 02:30:00 CEST"
            await trio.sleep(5 * MINUTE)
        await trio.sleep(45 * MINUTE)  # down over 02:30 CEST, to 02:10 CET
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(25 * MINUTE)  # to 02:35 CET
            # The first 02:30 ran late (coalesced), at 02:10 CET: not again at 02:30 CET.
            assert env.local("c") == ["10-31 02:10:00 CET"]
            [stored] = await rt.get(Zoned, "z").schedules()
            assert berlin(stored.time) == "11-01 02:30:00 CET"


async def test_utc_is_the_default_zone_and_unaffected_by_berlin_changes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pin(utc(2027, 3, 28, 0, 29))
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Zoned, "z")
            plain = await obj.schedule("30 1 * * *", "tick", id="plain")
            named = await obj.schedule("30 1 * * *", "tick", id="named", tz="UTC")
            assert (plain.tz, named.tz) == ("UTC", "UTC")
            assert plain.time == named.time == utc(2027, 3, 28, 1, 30)
            await trio.sleep(62 * MINUTE)
            assert env.times() == [utc(2027, 3, 28, 1, 30)] * 2


# -- missed slots ------------------------------------------------------------------------------

class Downtime(NamedTuple):
    """A schedule stopped for 75 s, then reopened; times relative to ``EPOCH``."""

    make: Callable[[nj.Stub, str], Awaitable[nj.Schedule]]
    stop: float  # when the runtime closes (it reopens at stop + 75)
    until: float  # when the test looks
    before: list[float]  # the runs before the stop
    dropped: float  # the slot due at the reopen
    coalesced: list[float]  # the runs after the reopen with missed="coalesce"
    skipped: list[float]  # ... and with missed="skip"


DOWNTIMES = {
    # every(10) from 3: runs 13, 23; down 25 -> 100 (33 ... 93 missed); next slot 103.
    "every 10": Downtime(lambda obj, missed: obj.every(10, "tick", id="s", missed=missed),
                         stop=25, until=130, before=[13, 23], dropped=33,
                         coalesced=[100, 103, 113, 123], skipped=[103, 113, 123]),
    # every(60) from 3: runs 63; down 65 -> 140 (123 missed by 17 s); next slot 183.
    "every 60": Downtime(lambda obj, missed: obj.every(60, "tick", id="s", missed=missed),
                         stop=65, until=200, before=[63], dropped=123,
                         coalesced=[140, 183], skipped=[183]),
    # Every minute by cron: 08:01, 08:02; down 08:02:30 -> 08:03:45 (08:03 missed).
    "cron * * * * *": Downtime(
        lambda obj, missed: obj.schedule("* * * * *", "tick", id="s", missed=missed),
        stop=150, until=310, before=[60, 120], dropped=180,
        coalesced=[225, 240, 300], skipped=[240, 300]),
}


@pytest.mark.parametrize("missed", ["coalesce", "skip"])
@pytest.mark.parametrize("kind", DOWNTIMES)
async def test_after_75_s_down_coalesce_runs_one_catch_up_and_skip_none(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, kind: str, missed: str
) -> None:
    case = DOWNTIMES[kind]
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(3)
            schedule = await case.make(rt.get(Zoned, "z"), missed)
            assert schedule.missed == missed
            await trio.sleep(case.stop - 3)
            assert [t - EPOCH for t in env.times()] == case.before
        await trio.sleep(75)
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            listen(rt, env)
            [stored] = await rt.get(Zoned, "z").schedules()
            assert stored.missed == missed
            await trio.sleep(case.until - (case.stop + 75))
        after = [t - EPOCH for t in env.times()][len(case.before):]
        if missed == "coalesce":
            assert after == case.coalesced
            assert env.of("schedule:skip") == []
        else:
            assert after == case.skipped
            assert env.of("schedule:skip") == [{
                "callback": "tick", "id": "s", "slot": EPOCH + case.dropped,
                "next": EPOCH + case.skipped[0]}]


async def test_skip_still_runs_a_slot_made_a_little_late_by_the_job_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Lateness is not a missed slot: a 3 s job due at the same time runs first.
    env = Env()

    async def three_seconds() -> None:
        await trio.sleep(3)

    env.work = three_seconds
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Zoned, "z")
            await obj.schedule(10, "work", id="slow")  # pushed first: runs first
            await obj.every(10, "tick", id="beat", missed="skip")
            await trio.sleep(45)
            assert [t - EPOCH for t in env.times("beat")] == [13, 20, 30, 40]


async def test_skip_after_an_overrun_runs_the_first_slot_after_its_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()

    async def slow() -> None:
        await trio.sleep(25)

    env.work = slow
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Zoned, "z")
            await obj.every(10, "work", id="i", missed="skip")
            await trio.sleep(99)
            # As with "coalesce": slots 20 and 30 fell inside the run at 10 (ends at
            # 35); the next run is the first slot after its end.
            assert [t - EPOCH for t in env.times()] == [10, 40, 70]


async def test_a_short_stop_is_no_missed_slot(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await rt.get(Zoned, "z").every(60, "tick", id="s", missed="skip")
            await trio.sleep(59)
        await trio.sleep(2)  # down from 59 to 61: the slot at 60 is a second late
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(60)
    assert [t - EPOCH for t in env.times()] == [61, 120]


# -- the record, content ids and rows from before -------------------------------------------


async def test_the_record_and_content_ids_know_the_zone_and_the_missed_policy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Zoned, "z")
            utc_nine = await obj.schedule("0 9 * * *", "tick")
            berlin_nine = await obj.schedule("0 9 * * *", "tick", tz="Europe/Berlin")
            again = await obj.schedule_in_zoneinfo("0 9 * * *", "tick", "Europe/Berlin")
            skipping = await obj.schedule("0 9 * * *", "tick", tz="Europe/Berlin", missed="skip")
            beat = await obj.every(10, "tick")
            beat_skip = await obj.every(10, "tick", missed="skip")
            assert again == berlin_nine
            assert len({utc_nine.id, berlin_nine.id, skipping.id, beat.id, beat_skip.id}) == 5
            assert len(await obj.schedules()) == 5
            # EPOCH is 2027-01-15 08:00 UTC = 09:00 CET: the next 09:00 Berlin is tomorrow's.
            assert (utc_nine.tz, utc_nine.missed, utc_nine.time) == ("UTC", "coalesce",
                                                                     EPOCH + HOUR)
            assert (berlin_nine.tz, berlin_nine.time) == ("Europe/Berlin", EPOCH + DAY)
            assert (skipping.tz, skipping.missed) == ("Europe/Berlin", "skip")
            assert (beat.tz, beat.missed, beat_skip.missed) == ("UTC", "coalesce", "skip")
            # Schedules without the new options keep the ids they had before them, so
            # an on_start that registers them still finds the rows it made then.
            assert utc_nine.id == _old_content_id(["cron", "tick", "0 9 * * *", None, None])
            assert beat.id == _old_content_id(["interval", "tick", None, 10.0, None])
            # A stable id whose zone changed is a changed schedule: re-timed.
            await obj.schedule("0 9 * * *", "tick", id="n")
            moved = await obj.schedule("0 9 * * *", "tick", id="n", tz="Asia/Tokyo")
            # 09:00 in Tokyo is 00:00 UTC: tomorrow, 16 hours after 08:00 UTC.
            assert (moved.tz, moved.time) == ("Asia/Tokyo", EPOCH + 16 * HOUR)


def _old_content_id(content: list[Any]) -> str:
    text = content_text(content)
    return "sched:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


async def test_rows_stored_before_zones_and_missed_read_as_utc_and_coalesce(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Zoned, "z")
            # 08:05 UTC (it would be 07:05 UTC read in Berlin time).
            await obj.push_raw("tick", EPOCH + 300, {"p": "old", "k": "cron", "c": "5 8 * * *"},
                               "old-cron")
            await obj.push_raw("tick", EPOCH + 10, {"p": "old", "k": "interval", "i": 10.0,
                                                    "a": EPOCH}, "old-every")
        await trio.sleep(95)  # down over slots 10 ... 90: an old row coalesces them
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Zoned, "z")
            stored = {s.id: (s.kind, s.tz, s.missed) for s in await obj.schedules()}
            assert stored == {"old-cron": ("cron", "UTC", "coalesce"),
                              "old-every": ("interval", "UTC", "coalesce")}
            await trio.sleep(301 - 95)
            assert [t - EPOCH for t in env.times("old-every")] == [95, *range(100, 301, 10)]
            assert [t - EPOCH for t in env.times("old-cron")] == [300]
            assert (await obj.get("old-cron")).time == EPOCH + DAY + 300  # type: ignore[union-attr]


# -- arguments ---------------------------------------------------------------------------------

# (method, args, kwargs, the argument the error must name)
BAD_OPTIONS: dict[str, tuple[str, tuple[Any, ...], dict[str, Any], str]] = {
    "tz unknown": ("schedule", ("0 9 * * *", "tick"), {"tz": "Mars/Olympus_Mons"}, "tz"),
    "tz empty": ("schedule", ("0 9 * * *", "tick"), {"tz": ""}, "tz"),
    "tz a path": ("schedule", ("0 9 * * *", "tick"), {"tz": "../../etc/passwd"}, "tz"),
    "tz absolute": ("schedule", ("0 9 * * *", "tick"), {"tz": "/usr/share/zoneinfo/UTC"}, "tz"),
    "tz a directory": ("schedule", ("0 9 * * *", "tick"), {"tz": "Europe"}, "tz"),
    "tz an int": ("schedule", ("0 9 * * *", "tick"), {"tz": 1}, "tz"),
    "tz with a NUL": ("schedule", ("0 9 * * *", "tick"), {"tz": "Europe/Ber\0lin"}, "tz"),
    "tz for a delay": ("schedule", (5, "tick"), {"tz": "Europe/Berlin"}, "tz"),
    "tz for a datetime": ("schedule", (dt.datetime(2030, 1, 1, tzinfo=UTC), "tick"),
                          {"tz": "Europe/Berlin"}, "tz"),
    "missed unknown": ("every", (10, "tick"), {"missed": "never"}, "missed"),
    "missed None": ("every", (10, "tick"), {"missed": None}, "missed"),
    "missed a bool": ("schedule", ("0 9 * * *", "tick"), {"missed": True}, "missed"),
    "missed upper case": ("schedule", ("0 9 * * *", "tick"), {"missed": "SKIP"}, "missed"),
    "skip for a one-shot": ("schedule", (5, "tick"), {"missed": "skip"}, "missed"),
}


@pytest.mark.parametrize("case", BAD_OPTIONS)
async def test_a_bad_zone_or_missed_policy_is_refused_naming_it_and_stores_nothing(
    autojump_clock: trio.testing.MockClock, case: str
) -> None:
    method, args, kwargs, name = BAD_OPTIONS[case]
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Zoned, "z")
            listen(rt, env)
            with pytest.raises(nj.JobError, match=rf"\b{name}\b") as info:
                await obj.call(method, *args, **kwargs)
            assert isinstance(info.value, ValueError)
            # The same with a stable id (an upsert checks before it looks).
            with pytest.raises(nj.JobError, match=rf"\b{name}\b"):
                await obj.call(method, *args, id="stable", **kwargs)
            assert await obj.schedules() == []
            assert alarm(rt) is None
            assert env.of("schedule:create") == []
