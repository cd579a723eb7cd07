"""The Scheduler capability (DESIGN.md §4): one-shots by delay, timedelta and aware
datetime, cron (UTC, next slot after now), intervals on their grid ``anchor + k·seconds``
(lateness, overruns and restarts never shift later runs; missed slots coalesce),
stable-id upserts, content idempotency (the pile-up
and the lost re-arm users of the reference hit), cancel, events and argument checks.

Every timer test runs under ``autojump_clock`` and asserts exact virtual times relative
to ``EPOCH`` = 1_800_000_000 = 2027-01-15 08:00:00 UTC (a Friday).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from conftest import EPOCH, VIRTUAL_DAY_OF_POLLING, engine
from hypothesis import given
from hypothesis import strategies as st

import nursery_jobs as nj
from nursery_jobs._capabilities._slots import next_grid_slot


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


# A generous virtual-time bound: under autojump a hang jumps here and fails the test.
HANG = 1_000_000
UTC = dt.UTC
MINUTE = 60
HOUR = 3600
DAY = 86400


def rel() -> float:
    return nj.now() - EPOCH


def test_epoch_is_the_cron_anchor_these_tests_assume() -> None:
    assert dt.datetime.fromtimestamp(EPOCH, UTC) == dt.datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


class Env:
    """Shared between a test and its objects (passed as the runtime's ``env``)."""

    def __init__(self, retry: nj.RetryOptions | None = None) -> None:
        self.retry = retry
        # (callback, schedule id, time - EPOCH, payload) per callback run, in run order.
        self.runs: list[tuple[str, str, float, Any]] = []
        self.errors: list[tuple[Exception, nj.Schedule, float]] = []
        self.events: list[nj.Event] = []
        self.activations = 0
        # Awaited by every activation's on_start with the object, if set.
        self.on_start: Callable[[Clock], Awaitable[Any]] | None = None
        # Awaited by the "work" callback with (object, payload, schedule), if set.
        self.work: Callable[[Clock, Any, nj.Schedule], Awaitable[Any]] | None = None
        self.obj: Clock | None = None
        # What an on_start that calls every() passes (see _every_in_on_start).
        self.payload: Any = None
        self.idempotent: bool | None = None

    def ran(self) -> list[tuple[str, float]]:
        """(schedule id, time) of every run."""
        return [(sid, t) for _cb, sid, t, _payload in self.runs]

    def times(self) -> list[float]:
        return [t for _cb, _sid, t, _payload in self.runs]

    def of(self, type: str) -> list[tuple[float, dict[str, Any]]]:
        return [(e.time - EPOCH, e.data) for e in self.events if e.type == type]

    def callbacks(self) -> dict[str, Any]:
        env = self

        async def tick(payload: Any, schedule: nj.Schedule) -> None:
            env.runs.append(("tick", schedule.id, rel(), payload))

        def tick_sync(payload: Any, schedule: nj.Schedule) -> None:
            env.runs.append(("tick_sync", schedule.id, rel(), payload))

        async def work(payload: Any, schedule: nj.Schedule) -> None:
            env.runs.append(("work", schedule.id, rel(), payload))
            assert env.work is not None and env.obj is not None
            await env.work(env.obj, payload, schedule)

        async def fail(payload: Any, schedule: nj.Schedule) -> None:
            env.runs.append(("fail", schedule.id, rel(), payload))
            raise RuntimeError(f"boom {payload}")

        return {"tick": tick, "tick_sync": tick_sync, "work": work, "fail": fail}

    async def on_error(self, error: Exception, schedule: nj.Schedule) -> None:
        self.errors.append((error, schedule, rel()))


class Clock(nj.DurableObject):
    """A Lifecycle object with one Scheduler whose callbacks come from ``env``."""

    namespace = "tests.test_scheduler.Clock"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.scheduler = nj.Scheduler(self.env.callbacks(), retry=self.env.retry,
                                      on_error=self.env.on_error)
        self.lifecycle = nj.Lifecycle.install(self).use(self.scheduler)
        self.env.obj = self

    async def on_start(self) -> None:
        self.env.activations += 1
        if self.env.on_start is not None:
            await self.env.on_start(self)

    async def ping(self) -> None:
        pass

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

    async def cancel(self, schedule_id: str) -> bool:
        return await self.scheduler.cancel(schedule_id)

    async def dead_letters(self) -> list[nj.DeadLetter]:
        return self.lifecycle.dead_letters()


def alarm(rt: nj.Runtime, object_id: str = "o") -> float | None:
    found = engine.stored_alarm(rt, Clock.namespace, object_id)
    return None if found is None else found[0] - EPOCH


def listen(rt: nj.Runtime, env: Env) -> None:
    rt.events.add_listener(env.events.append)


def at(offset: float, tz: dt.tzinfo = UTC) -> dt.datetime:
    return dt.datetime.fromtimestamp(EPOCH + offset, tz)


# -- one-shots -------------------------------------------------------------------------------


async def test_delay_timedelta_and_datetime_fire_at_exact_times(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    plus_two = dt.timezone(dt.timedelta(hours=2))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            await trio.sleep(1)
            delayed = await obj.schedule(5, "tick", "delay 5", id="d")
            fraction = await obj.schedule(2.5, "tick_sync", "delay 2.5", id="f")
            td = await obj.schedule(dt.timedelta(minutes=1, seconds=30), "tick", "td", id="td")
            aware = await obj.schedule(at(40), "tick", "datetime", id="dt")
            other_tz = await obj.schedule(at(20, plus_two), "tick", "+02:00", id="tz")
            past = await obj.schedule(at(-100), "tick", "past", id="past")
            assert [(s.kind, s.time - EPOCH) for s in (delayed, fraction, td, aware, other_tz,
                                                       past)] == [
                ("delayed", 6), ("delayed", 3.5), ("delayed", 91), ("scheduled", 40),
                ("scheduled", 20), ("scheduled", -100),
            ]
            await trio.sleep(200)
            assert env.ran() == [("past", 1), ("f", 3.5), ("d", 6), ("tz", 20), ("dt", 40),
                                 ("td", 91)]
            assert [p for _, _, _, p in env.runs] == [
                "past", "delay 2.5", "delay 5", "+02:00", "datetime", "td",
            ]
            # One-shots are gone once they ran.
            assert await obj.schedules() == []
            assert alarm(rt) is None


async def test_schedule_record_fields(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    retry = nj.RetryOptions(max_attempts=2, base_delay=1, max_delay=1)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            one = await obj.schedule(30, "tick", {"a": [1, 2]}, id="one", retry=retry)
            cron = await obj.schedule("  */15  *  * * * ", "tick", None, id="cron")
            every = await obj.every(dt.timedelta(seconds=45), "tick", "x", id="every")
            assert one == nj.Schedule(
                id="one", callback="tick", payload={"a": [1, 2]}, kind="delayed",
                time=EPOCH + 30, cron=None, interval=None, anchor=None, created_at=EPOCH,
                retry=retry,
            )
            assert cron == nj.Schedule(
                id="cron", callback="tick", payload=None, kind="cron", time=EPOCH + 15 * MINUTE,
                cron="*/15 * * * *", interval=None, anchor=None, created_at=EPOCH,
                retry=nj.RetryOptions(),
            )
            assert every == nj.Schedule(
                id="every", callback="tick", payload="x", kind="interval", time=EPOCH + 45,
                cron=None, interval=45.0, anchor=EPOCH, created_at=EPOCH,
                retry=nj.RetryOptions(),
            )
            assert await obj.get("one") == one
            assert await obj.get("nope") is None
            # list() is by next due time.
            assert [s.id for s in await obj.schedules()] == ["one", "every", "cron"]


# -- cron ----------------------------------------------------------------------------------


async def test_cron_fires_at_the_next_utc_slot_after_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine.skip_on("postgres", VIRTUAL_DAY_OF_POLLING)
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            listen(rt, env)
            # At 08:00:00 exactly: the next slot is strictly after now.
            quarter = await obj.schedule("*/15 * * * *", "tick", "quarter")
            eight = await obj.schedule("0 8 * * *", "tick", "daily 08:00")
            await trio.sleep(7)
            # At 08:00:07: the first 09:30 (UTC, not local time) is today's.
            half_nine = await obj.schedule("30 9 * * *", "tick", "09:30")
            monday = await obj.schedule("0 0 * * 1", "tick", "monday")
            assert quarter.time == EPOCH + 15 * MINUTE
            assert eight.time == EPOCH + DAY
            assert half_nine.time == EPOCH + HOUR + 30 * MINUTE
            # Friday 2027-01-15 -> Monday 2027-01-18 00:00 UTC.
            assert monday.time == dt.datetime(2027, 1, 18, tzinfo=UTC).timestamp()
            await trio.sleep(DAY + HOUR - 7 + 1)  # to 09:00:01 tomorrow
            by_payload: dict[Any, list[float]] = {}
            for _, _, t, payload in env.runs:
                by_payload.setdefault(payload, []).append(t)
            assert by_payload["quarter"] == [15 * MINUTE * n for n in range(1, 4 * 25 + 1)]
            assert by_payload["daily 08:00"] == [DAY]
            assert by_payload["09:30"] == [HOUR + 30 * MINUTE]
            assert "monday" not in by_payload
            # Recurring: still there, next slots as cron says.
            assert {s.payload: s.time - EPOCH for s in await obj.schedules()} == {
                "quarter": DAY + HOUR + 15 * MINUTE,
                "daily 08:00": 2 * DAY,
                "09:30": DAY + HOUR + 30 * MINUTE,
                "monday": dt.datetime(2027, 1, 18, tzinfo=UTC).timestamp() - EPOCH,
            }
            assert env.of("schedule:execute")[0] == (
                15 * MINUTE, {"callback": "tick", "id": quarter.id})


async def test_cron_after_a_long_run_skips_to_the_first_slot_after_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()

    async def long(obj: Clock, payload: Any, schedule: nj.Schedule) -> None:
        await trio.sleep(7 * MINUTE)

    env.work = long
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            await obj.schedule("*/5 * * * *", "work", id="c")
            await trio.sleep(21 * MINUTE)
            # 08:05 runs until 08:12: 08:10 is skipped, the next is 08:15 (then 08:20).
            assert env.times() == [5 * MINUTE, 15 * MINUTE]


# -- intervals -----------------------------------------------------------------------------


async def test_every_runs_at_exact_multiples_even_when_the_callback_takes_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    ends: list[float] = []

    async def three_seconds(obj: Clock, payload: Any, schedule: nj.Schedule) -> None:
        await trio.sleep(3)
        ends.append(rel())

    env.work = three_seconds
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            schedule = await obj.every(10, "work", id="i")
            assert schedule.time == EPOCH + 10
            await trio.sleep(35)
            # From the start of each run: no drift.
            assert env.times() == [10, 20, 30]
            assert ends == [13, 23, 33]
            assert (await obj.get("i")).time == EPOCH + 40  # type: ignore[union-attr]


async def test_an_overrun_skips_to_the_next_grid_slot_and_never_overlaps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    ends: list[float] = []

    async def slow(obj: Clock, payload: Any, schedule: nj.Schedule) -> None:
        await trio.sleep(25)
        ends.append(rel())

    env.work = slow
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            await obj.every(10, "work", id="i")
            await trio.sleep(99)
            # Single-flight, and on the grid: the run at 10 ends at 35, the slots it
            # overran (20, 30) are skipped, the next run is the first slot after 35.
            assert env.times() == [10, 40, 70]
            assert ends == [35, 65, 95]
            assert (await obj.get("i")).time == EPOCH + 100  # type: ignore[union-attr]


async def test_a_late_run_does_not_shift_the_grid(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The reported drift: every(10) behind a 3 s job in the same alarm ran at 13, 23, 33.
    env = Env()

    async def three_seconds(obj: Clock, payload: Any, schedule: nj.Schedule) -> None:
        await trio.sleep(3)

    env.work = three_seconds
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            await obj.schedule(10, "work", "slow", id="slow")  # pushed first: runs first
            await obj.every(10, "tick", "beat", id="beat")
            await trio.sleep(45)
            assert env.ran() == [("slow", 10), ("beat", 13), ("beat", 20), ("beat", 30),
                                 ("beat", 40)]
            assert (await obj.get("beat")).time == EPOCH + 50  # type: ignore[union-attr]


async def test_the_hundredth_run_of_every_10_is_at_anchor_plus_1000(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()

    async def two_seconds(obj: Clock, payload: Any, schedule: nj.Schedule) -> None:
        await trio.sleep(2)

    env.work = two_seconds
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            # A 2 s job every 7 s keeps making the beat late (pushed first, it runs first
            # when both are due), and each beat itself takes time.
            await obj.every(7, "work", "busy", id="busy")
            await trio.sleep(0.5)
            beat = await obj.every(10, "tick", "beat", id="beat")
            assert beat.anchor == EPOCH + 0.5
            await trio.sleep(1000.25)
            beats = [t for sid, t in env.ran() if sid == "beat"]
            assert len(beats) == 100
            assert beats[99] == 1000.5
            late = [t for k, t in enumerate(beats, 1) if t != 0.5 + 10 * k]
            assert late  # the test really made runs late
            assert all(0 < t - (0.5 + 10 * k) <= 2 for k, t in enumerate(beats, 1)
                       if t in late)
            assert (await obj.get("beat")).time == EPOCH + 1010.5  # type: ignore[union-attr]


@given(
    anchor=st.floats(0, 4e9),
    seconds=st.floats(1e-3, 1e6),
    k=st.integers(0, 10**6),
    offset=st.floats(0, 1),
)
def test_next_grid_slot_is_the_first_slot_strictly_after(
    anchor: float, seconds: float, k: int, offset: float
) -> None:
    after = anchor + (k + offset) * seconds
    slot = next_grid_slot(anchor, seconds, after)
    assert slot > after
    # A slot of the grid, computed from the anchor, and the first one past ``after``.
    n = round((slot - anchor) / seconds)
    assert n >= 1 and slot == anchor + n * seconds
    assert n == 1 or anchor + (n - 1) * seconds <= after


def test_next_grid_slot_examples() -> None:
    assert next_grid_slot(100.0, 10.0, 100.0) == 110.0
    assert next_grid_slot(100.0, 10.0, 110.0) == 120.0  # strictly after
    assert next_grid_slot(100.0, 10.0, 135.0) == 140.0  # missed slots coalesce
    assert next_grid_slot(100.0, 10.0, 50.0) == 110.0  # before the anchor: the first slot
    assert next_grid_slot(EPOCH + 0.3, 0.1, EPOCH + 1000.3) == EPOCH + 0.3 + 10_001 * 0.1


async def test_restart_after_long_downtime_coalesces_missed_runs_and_keeps_the_grid(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Clock, "o")
            await trio.sleep(3)
            await obj.every(10, "tick", "beat", id="beat")
            await trio.sleep(22)
            assert env.times() == [13, 23]
        await trio.sleep(100)  # down from 25 to 125: slots 33 ... 123 missed
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(31)
            # One run at reopen for all the missed slots, then on the grid again.
            assert env.times() == [13, 23, 125, 133, 143, 153]
            [schedule] = await rt.get(Clock, "o").schedules()
            assert (schedule.anchor, schedule.time) == (EPOCH + 3, EPOCH + 163)


async def _every_10_in_on_start(obj: Clock) -> None:
    await obj.scheduler.every(10, "tick", "beat")


async def test_every_in_on_start_keeps_its_grid_across_restarts(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = Env()
    env.on_start = _every_10_in_on_start
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(3)
            await rt.get(Clock, "o").ping()  # the first activation creates it: anchor 3
            await trio.sleep(22)
        await trio.sleep(14.5)  # down from 25 to 39.5
        for _ in range(3):
            async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
                # Each activation calls every() again: a dedupe hit keeps the anchor.
                await rt.get(Clock, "o").ping()
                await trio.sleep(7)
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            [schedule] = await rt.get(Clock, "o").schedules()
            assert schedule.anchor == EPOCH + 3
            await trio.sleep(20)
        assert env.activations == 5
        # 13, 23; 33 missed while down, run at the reopen (39.5); then 43, 53 (46.5 to
        # 53.5 and 53.5 to 60.5 are two runtimes), 63, 73 — never shifted.
        assert env.times() == [13, 23, 39.5, 43, 53, 63, 73]


async def test_a_dedupe_hit_keeps_the_anchor_and_the_next_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            first = await obj.every(10, "tick", "beat")
            await trio.sleep(25)
            again = await obj.every(10, "tick", "beat")
            assert (again.id, again.anchor, again.time) == (first.id, EPOCH, EPOCH + 30)
            await trio.sleep(20)
            assert env.times() == [10, 20, 30, 40]


# -- stable ids and content idempotency ------------------------------------------------------


async def test_stable_id_is_an_upsert(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            listen(rt, env)
            first = await obj.schedule(10, "tick", 1, id="x")
            await trio.sleep(2)
            second = await obj.schedule(20, "tick_sync", 2, id="x")
            assert second.created_at == first.created_at == EPOCH
            assert [s.id for s in await obj.schedules()] == ["x"]
            assert alarm(rt) == 22
            # A one-shot can become an interval under the same id, and back.
            await obj.every(5, "tick", 3, id="y")
            await obj.schedule(at(50), "tick", 4, id="y")
            await trio.sleep(100)
            assert [(sid, t, p) for _, sid, t, p in env.runs] == [("x", 22, 2), ("y", 50, 4)]
            assert [d["id"] for _, d in env.of("schedule:create")] == ["x", "x", "y", "y"]


async def _every_in_on_start(obj: Clock) -> None:
    env = obj.env
    await obj.scheduler.every(60, "tick", env.payload, idempotent=env.idempotent)


@pytest.mark.parametrize(
    ("idempotent", "expected"), [(None, 1), (True, 1), (False, 10)],
)
async def test_every_in_on_start_across_ten_activations(
    autojump_clock: trio.testing.MockClock, idempotent: bool | None, expected: int
) -> None:
    env = Env()
    env.payload = {"inbox": "main"}
    env.idempotent = idempotent
    env.on_start = _every_in_on_start
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env, idle_timeout=1) as rt:
            listen(rt, env)
            obj = rt.get(Clock, "o")
            for _ in range(10):
                await obj.ping()
                await trio.sleep(2)  # idle for longer than idle_timeout: evicted
                assert rt.statistics().active_objects == 0
            assert env.activations == 10
            assert len(env.of("schedule:create")) == expected
            # Evicted again at once, so the check itself is an 11th activation.
            schedules = await obj.schedules()
            assert len(schedules) == (1 if expected == 1 else 11)
            assert all((s.kind, s.interval, s.payload) == ("interval", 60.0, {"inbox": "main"})
                       for s in schedules)
            if expected == 1:
                # The row of the first activation: due 60 s after it, and it runs once.
                assert [s.time - EPOCH for s in schedules] == [60]
                await trio.sleep(41)
                assert env.times() == [60]
            # A different payload is different content: a second schedule.
            env.payload = {"inbox": "other"}
            await trio.sleep(2)
            schedules = await obj.schedules()
            assert len(schedules) == (2 if expected == 1 else 12)


async def test_every_in_on_start_across_restarts_keeps_one_schedule(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = Env()
    env.payload = None
    env.idempotent = None
    env.on_start = _every_in_on_start
    with trio.fail_after(HANG):
        for _ in range(5):
            async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
                await rt.get(Clock, "o").ping()
                await trio.sleep(1)
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            assert len(await rt.get(Clock, "o").schedules()) == 1
            assert env.activations == 6
            await trio.sleep(60)
            assert env.times() == [60]


async def test_cron_is_idempotent_by_content_unless_opted_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            a = await obj.schedule("0 * * * *", "tick", "p")
            b = await obj.schedule("0  *  * * *", "tick", "p")  # same cron, other spacing
            assert a == b
            assert len(await obj.schedules()) == 1
            await obj.schedule("0 * * * *", "tick", "q")  # other payload
            await obj.schedule("30 * * * *", "tick", "p")  # other cron
            await obj.schedule("0 * * * *", "tick_sync", "p")  # other callback
            assert len(await obj.schedules()) == 4
            await obj.schedule("0 * * * *", "tick", "p", idempotent=False)
            await obj.schedule("0 * * * *", "tick", "p", idempotent=False)
            assert len(await obj.schedules()) == 6


async def test_one_shots_dedupe_only_when_asked(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            listen(rt, env)
            await obj.schedule(30, "tick", "plain")
            await obj.schedule(30, "tick", "plain")
            assert len(await obj.schedules()) == 2
            first = await obj.schedule(30, "tick", "once", idempotent=True)
            # The time is not part of the content: the second call finds the first.
            again = await obj.schedule(50, "tick", "once", idempotent=True)
            assert again == first and again.time == EPOCH + 30
            assert len(await obj.schedules()) == 3
            # A dedupe hit creates nothing.
            assert len(env.of("schedule:create")) == 3
            await trio.sleep(100)
            assert [p for _, _, _, p in env.runs] == ["plain", "plain", "once"]
            assert env.ran()[2] == (first.id, 30)
            assert env.times() == [30, 30, 30]


async def test_a_dedupe_hit_rearms_a_lost_alarm_on_activation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Reference issue #1119: an idempotent every() after a restart found its row but
    # never re-armed, so the schedule silently stopped.
    env = Env()
    env.payload = None
    env.idempotent = None
    env.on_start = _every_in_on_start
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env, idle_timeout=1) as rt:
            obj = rt.get(Clock, "o")
            await obj.ping()
            assert alarm(rt) == 60
            await trio.sleep(2)
            assert rt.statistics().active_objects == 0
            engine.lose_alarm(rt, Clock.namespace, "o")  # the alarm is lost
            await trio.sleep(100)
            assert env.runs == []
            await obj.ping()  # on_start: every() hits the stored row and re-arms
            await trio.sleep(1)
            # Overdue: it runs at once, then on its grid (anchor 0, every 60 s).
            assert env.times() == [102]
            assert alarm(rt) == 120


async def test_a_dedupe_hit_rearms_an_alarm_lost_while_resident(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            await obj.every(10, "tick", "beat")
            assert alarm(rt) == 10
            engine.lose_alarm(rt, Clock.namespace, "o")  # behind the object's back
            assert alarm(rt) is None
            await obj.every(10, "tick", "beat")  # a dedupe hit
            assert len(await obj.schedules()) == 1
            assert alarm(rt) == 10
            await trio.sleep(15)
            assert env.times() == [10]


# -- cancel ----------------------------------------------------------------------------------


async def test_cancel_removes_the_schedule_with_an_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            listen(rt, env)
            every = await obj.every(10, "tick", "beat")
            await obj.schedule(30, "tick", "once", id="once")
            await trio.sleep(25)
            assert await obj.cancel(every.id) is True
            assert await obj.cancel(every.id) is False
            assert await obj.cancel("never") is False
            assert env.of("schedule:cancel") == [(25, {"callback": "tick", "id": every.id})]
            assert alarm(rt) == 30
            assert await obj.cancel("once") is True
            assert alarm(rt) is None
            await trio.sleep(100)
            assert env.times() == [10, 20]
            assert await obj.schedules() == []
            assert len(env.of("schedule:cancel")) == 2


async def test_a_callback_may_cancel_its_own_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()

    async def third_time_stops(obj: Clock, payload: Any, schedule: nj.Schedule) -> None:
        if len(env.runs) == 3:
            assert await obj.scheduler.cancel(schedule.id) is True

    env.work = third_time_stops
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            await obj.every(10, "work", id="w")
            await trio.sleep(100)
            assert env.times() == [10, 20, 30]
            assert await obj.schedules() == []
            assert alarm(rt) is None


# -- failures and events -----------------------------------------------------------------------


async def test_one_shot_retries_then_error_and_dead_letter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env(retry=nj.RetryOptions(max_attempts=3, base_delay=2, max_delay=60, jitter=False))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            listen(rt, env)
            schedule = await obj.schedule(5, "fail", "x", id="f")
            await trio.sleep(100)
            assert env.times() == [5, 7, 11]
            data = {"callback": "fail", "id": "f"}
            assert env.of("schedule:create") == [(0, data)]
            assert env.of("schedule:execute") == [(5, data)]
            assert env.of("schedule:retry") == [
                (7, {**data, "attempt": 2, "max_attempts": 3}),
                (11, {**data, "attempt": 3, "max_attempts": 3}),
            ]
            assert env.of("schedule:error") == [
                (11, {**data, "error": "RuntimeError('boom x')", "attempts": 3}),
            ]
            [(error, failed, t)] = env.errors
            assert isinstance(error, RuntimeError) and t == 11
            # The schedule as it stood at its last attempt (re-timed by the retries).
            assert failed == attrs.evolve(schedule, time=EPOCH + 11)
            # A one-shot ends as a dead letter.
            assert await obj.schedules() == []
            [letter] = await obj.dead_letters()
            assert (letter.job.id, letter.attempts, letter.error) == ("f", 3,
                                                                      "RuntimeError: boom x")


async def test_recurring_schedule_goes_on_after_its_last_attempt_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env(retry=nj.RetryOptions(max_attempts=2, base_delay=1, jitter=False))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            listen(rt, env)
            await obj.every(10, "fail", id="e")
            await trio.sleep(25)
            # 10 fails, retried at 11, fails for good: the next run is the next slot of
            # the grid (20), with fresh attempts.
            assert env.times() == [10, 11, 20, 21]
            assert [t for t, _ in env.of("schedule:execute")] == [10, 20]
            assert [(t, d["attempt"]) for t, d in env.of("schedule:retry")] == [(11, 2),
                                                                                 (21, 2)]
            assert [t for t, _ in env.of("schedule:error")] == [11, 21]
            assert [t for _, _, t in env.errors] == [11, 21]
            assert [s.time - EPOCH for s in await obj.schedules()] == [30]
            assert await obj.dead_letters() == []


# -- arguments -------------------------------------------------------------------------------

BAD_SCHEDULES: dict[str, Callable[[], tuple[str, tuple[Any, ...], dict[str, Any]]]] = {
    "every 0": lambda: ("every", (0, "tick"), {}),
    "every -1": lambda: ("every", (-1, "tick"), {}),
    "every nan": lambda: ("every", (math.nan, "tick"), {}),
    "every inf": lambda: ("every", (math.inf, "tick"), {}),
    "every zero timedelta": lambda: ("every", (dt.timedelta(0), "tick"), {}),
    "every a str": lambda: ("every", ("10", "tick"), {}),
    "every a bool": lambda: ("every", (True, "tick"), {}),
    "negative delay": lambda: ("schedule", (-1, "tick"), {}),
    "nan delay": lambda: ("schedule", (math.nan, "tick"), {}),
    "negative timedelta": lambda: ("schedule", (dt.timedelta(seconds=-1), "tick"), {}),
    "naive datetime": lambda: ("schedule", (dt.datetime(2027, 1, 15, 9, 0), "tick"), {}),
    "cron with 4 fields": lambda: ("schedule", ("* * * *", "tick"), {}),
    "cron with 6 fields": lambda: ("schedule", ("0 * * * * *", "tick"), {}),
    "cron minute 61": lambda: ("schedule", ("61 * * * *", "tick"), {}),
    "cron nonsense": lambda: ("schedule", ("every day at noon", "tick"), {}),
    "empty cron": lambda: ("schedule", ("", "tick"), {}),
    "when a list": lambda: ("schedule", ([5], "tick"), {}),
    "blank id": lambda: ("schedule", (5, "tick"), {"id": "  "}),
    "retry not RetryOptions": lambda: ("every", (5, "tick"), {"retry": {"max_attempts": 1}}),
}


@pytest.mark.parametrize("case", BAD_SCHEDULES)
async def test_invalid_schedule_raises_value_error_and_stores_nothing(
    autojump_clock: trio.testing.MockClock, case: str
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            listen(rt, env)
            method, args, kwargs = BAD_SCHEDULES[case]()
            with pytest.raises(ValueError) as info:
                await obj.call(method, *args, **kwargs)
            assert isinstance(info.value, nj.NurseryJobsError)
            assert await obj.schedules() == []
            assert alarm(rt) is None
            assert env.of("schedule:create") == []


@pytest.mark.parametrize("method", ["schedule", "every"])
async def test_unknown_callback_raises_and_stores_nothing(
    autojump_clock: trio.testing.MockClock, method: str
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Clock, "o")
            with pytest.raises(nj.UnknownCallbackError, match="'nope'"):
                await obj.call(method, 5, "nope")
            with pytest.raises(nj.UnknownCallbackError, match="'nope'"):
                await obj.call(method, 5, "nope", id="stable")
            assert await obj.schedules() == []
            assert alarm(rt) is None
