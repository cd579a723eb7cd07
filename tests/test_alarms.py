"""The one alarm of a DurableObject: exact firing times, replacement, cancellation,
eviction and restarts, retries with backoff, and many objects at once."""

from __future__ import annotations

import collections
import datetime as dt
import random
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import EPOCH, engine

import nursery_jobs as nj
from nursery_jobs._core._host import ObjectHost
from nursery_jobs._core._runtime import Runtime

# A generous virtual-time bound: under autojump a hang jumps here and fails the test.
HANG = 100_000


class Alarmed(nj.DurableObject):
    """Logs activations and alarm runs into ``ctx.env`` (a list)."""

    namespace = "tests.test_alarms.Alarmed"

    async def on_start(self) -> None:
        self.ctx.env.append(("start", self.ctx.id, nj.now()))

    async def arm(self, when: Any) -> None:
        self.ctx.storage.set_alarm(when)

    async def disarm(self) -> None:
        self.ctx.storage.delete_alarm()

    async def alarm_time(self) -> float | None:
        return self.ctx.storage.get_alarm()

    async def alarm(self, info: nj.AlarmInfo) -> None:
        if len(self.ctx.env) > 1000:
            # A runaway alarm refiring at one virtual instant would spin forever
            # without advancing the clock; raising lets retries move time on.
            raise RuntimeError("runaway alarm")
        self.ctx.env.append(("alarm", self.ctx.id, nj.now(), info))


def alarms(log: list[Any], object_id: str | None = None) -> list[tuple[float, nj.AlarmInfo]]:
    return [
        (entry[2], entry[3])
        for entry in log
        if entry[0] == "alarm" and (object_id is None or entry[1] == object_id)
    ]


FIRST = nj.AlarmInfo(retry_count=0, is_retry=False)


async def test_alarm_fires_at_its_exact_time(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log) as rt:
            obj = rt.get(Alarmed, "a")
            await obj.arm(EPOCH + 12.5)
            assert await obj.alarm_time() == EPOCH + 12.5
            assert rt.statistics().pending_alarms == 1
            await trio.sleep(12.25)
            assert alarms(log) == []
            await trio.sleep(0.5)
            assert alarms(log) == [(EPOCH + 12.5, FIRST)]
            # A run that returns cleanly clears the alarm.
            assert await obj.alarm_time() is None
            assert rt.statistics().pending_alarms == 0
            await trio.sleep(1000)
            assert len(alarms(log)) == 1


async def test_alarm_in_the_past_fires_at_once(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log) as rt:
            await trio.sleep(5)
            await rt.get(Alarmed, "a").arm(EPOCH - 100)
            await trio.sleep(1)
            assert alarms(log) == [(EPOCH + 5, FIRST)]


async def test_set_alarm_replaces_later(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log) as rt:
            obj = rt.get(Alarmed, "a")
            await obj.arm(EPOCH + 10)
            await obj.arm(EPOCH + 20)
            assert await obj.alarm_time() == EPOCH + 20
            await trio.sleep(100)
            assert alarms(log) == [(EPOCH + 20, FIRST)]


async def test_set_alarm_replaces_earlier(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log) as rt:
            obj = rt.get(Alarmed, "a")
            await obj.arm(EPOCH + 20)
            await trio.sleep(3)
            # Lowered while the timer sleeps towards +20: it must wake for +5.
            await obj.arm(EPOCH + 5)
            await trio.sleep(100)
            assert alarms(log) == [(EPOCH + 5, FIRST)]


async def test_delete_alarm_cancels(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log) as rt:
            obj = rt.get(Alarmed, "a")
            await obj.arm(EPOCH + 10)
            await trio.sleep(4)
            await obj.disarm()
            assert await obj.alarm_time() is None
            assert rt.statistics().pending_alarms == 0
            await trio.sleep(100)
            assert alarms(log) == []
            await obj.disarm()  # deleting a missing alarm is fine


async def test_aware_datetime_alarm(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    when = dt.datetime.fromtimestamp(EPOCH + 30, tz=dt.timezone(dt.timedelta(hours=5)))
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log) as rt:
            obj = rt.get(Alarmed, "a")
            await obj.arm(when)
            assert await obj.alarm_time() == EPOCH + 30
            await trio.sleep(100)
            assert alarms(log) == [(EPOCH + 30, FIRST)]


async def test_naive_datetime_alarm_is_refused(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log) as rt:
            obj = rt.get(Alarmed, "a")
            with pytest.raises(ValueError, match="naive"):
                await obj.arm(dt.datetime(2027, 1, 1, 12, 0))
            assert await obj.alarm_time() is None
            assert rt.statistics().pending_alarms == 0


async def test_alarm_survives_eviction(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log, idle_timeout=1) as rt:
            await rt.get(Alarmed, "a").arm(EPOCH + 10)
            await trio.sleep(5)
            assert rt.statistics().active_objects == 0  # evicted at +1
            assert rt.statistics().pending_alarms == 1
            await trio.sleep(10)
            assert log == [
                ("start", "a", EPOCH),
                ("start", "a", EPOCH + 10),  # the alarm activated it again, on_start first
                ("alarm", "a", EPOCH + 10, FIRST),
            ]
            # ... and it is evicted again afterwards.
            assert rt.statistics().active_objects == 0


async def test_alarm_survives_runtime_restart(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path, env=log) as rt:
            await rt.get(Alarmed, "a").arm(EPOCH + 100)
        assert alarms(log) == []
        await trio.sleep(500)  # the process is "down" while the alarm falls due
        assert alarms(log) == []
        async with nj.open_runtime(tmp_path, env=log) as rt:
            assert rt.statistics().pending_alarms == 1
            await trio.sleep(1)
            assert alarms(log) == [(EPOCH + 500, FIRST)]
            assert rt.statistics().pending_alarms == 0
        async with nj.open_runtime(tmp_path, env=log) as rt:
            assert rt.statistics().pending_alarms == 0
            await trio.sleep(1000)
        assert len(alarms(log)) == 1


async def test_future_alarm_after_restart_fires_on_time(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path, env=log) as rt:
            await rt.get(Alarmed, "a").arm(EPOCH + 100)
        await trio.sleep(30)
        async with nj.open_runtime(tmp_path, env=log) as rt:
            await trio.sleep(200)
        assert alarms(log) == [(EPOCH + 100, FIRST)]


class Flaky(nj.DurableObject):
    """An alarm that raises for its first ``ctx.env["fail"]`` runs (all, if None)."""

    namespace = "tests.test_alarms.Flaky"

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm_time(self) -> float | None:
        return self.ctx.storage.get_alarm()

    async def alarm(self, info: nj.AlarmInfo) -> None:
        runs = self.ctx.env["runs"]
        runs.append((nj.now(), info))
        fail = self.ctx.env["fail"]
        if fail is None or len(runs) <= fail:
            raise RuntimeError(f"boom {len(runs)}")


async def test_raising_alarm_is_retried_with_backoff_then_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env: dict[str, Any] = {"runs": [], "fail": None}
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            with rt.events.subscribe() as events:
                obj = rt.get(Flaky, "f")
                await obj.arm(EPOCH + 10)
                await trio.sleep(5000)
                expected_times = [10, 12, 16, 24, 40, 72, 136]  # gaps 2, 4, 8, 16, 32, 64
                assert env["runs"] == [
                    (EPOCH + t, nj.AlarmInfo(retry_count=n, is_retry=n > 0))
                    for n, t in enumerate(expected_times)
                ]
                assert await obj.alarm_time() is None
                assert rt.statistics().pending_alarms == 0
                received = []
                while True:
                    try:
                        received.append(events.receive_nowait())
                    except trio.WouldBlock:
                        break
            retries = [e for e in received if e.type == "alarm:retry"]
            assert [e.time for e in retries] == [EPOCH + t for t in expected_times[:-1]]
            assert [e.data["retry"] for e in retries] == [1, 2, 3, 4, 5, 6]
            failed = [e for e in received if e.type == "alarm:failed"]
            assert len(failed) == 1
            assert failed[0].namespace == Flaky.namespace
            assert failed[0].object_id == "f"
            assert failed[0].time == EPOCH + 136
            assert failed[0].data["retries"] == 6
            assert "boom 7" in failed[0].data["error"]


async def test_alarm_retry_stops_after_success(autojump_clock: trio.testing.MockClock) -> None:
    env: dict[str, Any] = {"runs": [], "fail": 2}
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            obj = rt.get(Flaky, "f")
            await obj.arm(EPOCH + 1)
            await trio.sleep(1000)
            assert env["runs"] == [
                (EPOCH + 1, FIRST),
                (EPOCH + 3, nj.AlarmInfo(retry_count=1, is_retry=True)),
                (EPOCH + 7, nj.AlarmInfo(retry_count=2, is_retry=True)),
            ]
            assert await obj.alarm_time() is None


async def test_set_alarm_during_retries_starts_afresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env: dict[str, Any] = {"runs": [], "fail": 1}
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            obj = rt.get(Flaky, "f")
            await obj.arm(EPOCH + 1)
            await trio.sleep(2)  # failed at +1, retry pending at +3
            assert await obj.alarm_time() == EPOCH + 3
            await obj.arm(EPOCH + 50)
            await trio.sleep(1000)
            assert env["runs"] == [(EPOCH + 1, FIRST), (EPOCH + 50, FIRST)]


class Rearming(nj.DurableObject):
    namespace = "tests.test_alarms.Rearming"

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm_time(self) -> float | None:
        return self.ctx.storage.get_alarm()

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.ctx.env.append((nj.now(), info))
        if len(self.ctx.env) < 4:
            self.ctx.storage.set_alarm(nj.now() + 5)


async def test_alarm_set_inside_alarm_fires_again(autojump_clock: trio.testing.MockClock) -> None:
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log, idle_timeout=2) as rt:
            obj = rt.get(Rearming, "r")
            await obj.arm(EPOCH + 10)
            await trio.sleep(1000)
            assert log == [(EPOCH + t, FIRST) for t in (10, 15, 20, 25)]
            assert await obj.alarm_time() is None


class Many(nj.DurableObject):
    namespace = "tests.test_alarms.Many"

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.ctx.env.setdefault(self.ctx.id, []).append((nj.now(), info))


async def test_thousands_of_alarms_each_fire_once_on_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Times are multiples of 1/16 s so that virtual-clock arithmetic is exact; many
    # objects share a time (4,000 alarms on 6,400 slots: several timer batches of 256
    # at once, and the limiter). Its speed is measured in benchmarks/, not here.
    rng = random.Random(20260509)
    times = {f"obj-{i}": EPOCH + 1 + rng.randrange(400 * 16) / 16 for i in range(4_000)}
    fired: dict[str, list[tuple[float, nj.AlarmInfo]]] = {}
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=fired) as rt:
            for object_id, when in times.items():
                await rt.get(Many, object_id).arm(when)
            assert rt.statistics().pending_alarms == 4_000
            assert fired == {}
            await trio.sleep(402)
            assert rt.statistics().pending_alarms == 0
    assert fired.keys() == times.keys()
    late = {oid: runs for oid, runs in fired.items() if runs != [(times[oid], FIRST)]}
    assert late == {}


async def test_an_alarm_run_in_flight_at_a_death_wakes_its_object_at_reopen(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # A death while an alarm run holds its flight-record slot (between jobs, say) leaves
    # the slot filled; the next runtime wakes that object at once instead of at the
    # run's fallback alarm. Simulated here: a slot taken and never released.
    log: list[Any] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path, env=log) as rt:
            await rt.get(Alarmed, "o").arm(EPOCH + 30)  # as a run's fallback would be
            await rt.get(Alarmed, "p").arm(EPOCH + 30)
            assert rt.engine.acquire_flight(Alarmed.namespace, "o") is not None
        await trio.sleep(5)
        async with nj.open_runtime(tmp_path, env=log) as rt:
            await trio.sleep(40)
    assert alarms(log, "o") == [(EPOCH + 5, FIRST)]
    assert alarms(log, "p") == [(EPOCH + 30, FIRST)]


class Counted(nj.DurableObject):
    """Counts its activations and logs its alarm runs into ``ctx.env`` (a Burst)."""

    namespace = "tests.test_alarms.Counted"

    async def on_start(self) -> None:
        self.ctx.env.starts[self.ctx.id] = self.ctx.env.starts.get(self.ctx.id, 0) + 1

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.ctx.env.runs.setdefault(self.ctx.id, []).append((nj.now(), info))
        await trio.sleep(self.ctx.env.work)


class Burst:
    def __init__(self, work: float) -> None:
        self.work = work  # how long each alarm run takes
        self.starts: dict[str, int] = {}
        self.runs: dict[str, list[tuple[float, nj.AlarmInfo]]] = {}


@pytest.mark.parametrize("work", [0, 1])
async def test_a_burst_of_due_alarms_activates_each_object_once(
    on_every_engine: str, autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch, work: float,
) -> None:
    # Far more objects due at once than may stay resident (issue 26: 5,000 overdue
    # objects with max_active 2,048 took ~6 activations each). An object activated to
    # run its due alarm runs it before it can be evicted for room, so each object is
    # activated exactly once: no other call or alarm wakes it, and after its run it is
    # never needed again. Counted where hosts start (attempts that failed count too).
    # With ``work``, each run takes a second: the alarm runs (64 at a time) fill
    # max_active with busy objects, and eviction reaches objects just started.
    hosts: dict[str, int] = {}
    run = ObjectHost.run

    async def counted_run(self: ObjectHost, **kwargs: Any) -> None:
        hosts[self.object_id] = hosts.get(self.object_id, 0) + 1
        await run(self, **kwargs)

    burst = Burst(work)
    n = 300
    times = {f"o{i:03d}": EPOCH + 100 + (i % 3) / 4 for i in range(n)}
    async with nj.open_runtime(engine.location, env=burst, max_active=8) as rt:
        # (The deadline covers the body only: on files, the runtime's exit may wait for
        # a catalog checkpoint in a worker thread, and the MockClock then jumps to it.)
        with trio.fail_after(HANG):
            for object_id, when in times.items():
                await rt.get(Counted, object_id).arm(when)
            await trio.sleep(90)  # every object left memory (idle_timeout 60 s)
            assert rt.statistics().active_objects == 0
            burst.starts.clear()
            monkeypatch.setattr(ObjectHost, "run", counted_run)
            await trio.sleep(20)
            assert rt.statistics().pending_alarms == 0
    if work:
        # 64 alarm runs at a time (the runtime's bound), a second each: none early,
        # in five waves, in due order.
        assert burst.runs.keys() == times.keys()
        assert all(len(runs) == 1 for runs in burst.runs.values())
        ran = sorted((runs[0][0], times[oid]) for oid, runs in burst.runs.items())
        assert [due for _at, due in ran] == sorted(times.values())
        waves = collections.Counter(at - EPOCH for at, _due in ran)
        assert sorted(waves.items()) == [(100, 64), (101, 64), (102, 64), (103, 64), (104, 44)]
    else:
        assert burst.runs == {oid: [(when, FIRST)] for oid, when in times.items()}
    assert burst.starts == dict.fromkeys(times, 1)
    assert hosts == dict.fromkeys(times, 1)


async def test_reads_of_the_alarm_index_stay_small_however_many_alarms_are_due(
    on_every_engine: str, autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 26: with every due alarm in flight, each delivery's end read the index past
    # all of them (5,000 overdue objects: 613 reads, 3.0 s of a 28.6 s cold fire). At
    # most 256 deliveries are in flight; the rest wait in the index, read again when
    # half have ended: no read asks for more than 256 rows, and all reads together
    # return a few rows per alarm (issue 26: before, reads asked for up to n + 256).
    burst = Burst(0)
    n = 1000
    times = {f"o{i:04d}": EPOCH + 100 + (i % 4) / 4 for i in range(n)}
    reads: list[tuple[int, int]] = []
    async with nj.open_runtime(engine.location, env=burst) as rt:
        with trio.fail_after(HANG):
            for object_id, when in times.items():
                await rt.get(Counted, object_id).arm(when)
            due = rt.engine.due

            def recorded(now: float, limit: int) -> list[tuple[str, str]]:
                keys = due(now, limit)
                reads.append((limit, len(keys)))
                return keys

            monkeypatch.setattr(rt.engine, "due", recorded)
            await trio.sleep(110)
            assert rt.statistics().pending_alarms == 0
    assert burst.runs == {oid: [(when, FIRST)] for oid, when in times.items()}
    assert max(limit for limit, _rows in reads) <= 256
    if engine.name != "postgres":
        # (On PostgreSQL each activation wakes the timer — the engine's open_object
        # says "the timer now serves this alarm" — so it reads once per ~2 objects,
        # each read still at most 256 rows: ~40 rows per alarm measured.)
        assert sum(rows for _limit, rows in reads) <= 3 * n  # (2 * n measured)


async def test_an_activation_that_fails_unexpectedly_is_reported_and_retried(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault of our own while activating an object for its alarm (not a database that
    will not open, not ``on_start`` raising: those are reported where they happen) was
    swallowed by the delivery; it hid the eviction bug of issue 26. It is an
    ``alarm:retry`` naming the error now, and the alarm runs at its backoff."""
    log: list[Any] = []
    real_open_slot = Runtime.open_slot
    broken = [True]

    async def open_slot(self: Runtime, host: ObjectHost, *, for_turn: bool = False) -> None:
        if host.for_alarm and broken and host.object_id == "a":
            broken.clear()
            raise AssertionError("a bug of ours")
        await real_open_slot(self, host, for_turn=for_turn)

    monkeypatch.setattr(Runtime, "open_slot", open_slot)
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=log, idle_timeout=1.0) as rt:
            retries: list[nj.Event] = []
            rt.events.add_listener(
                lambda e: retries.append(e) if e.type == "alarm:retry" else None)
            await rt.get(Alarmed, "a").arm(EPOCH + 10)
            await trio.sleep(100)
            assert [(e.time, e.data["retry"], e.data["delay"]) for e in retries] == [
                (EPOCH + 10, 1, 2.0)]
            assert "AssertionError" in retries[0].data["error"]
            assert "a bug of ours" in retries[0].data["error"]
            assert [entry[:3] for entry in log if entry[0] == "alarm"] == [
                ("alarm", "a", EPOCH + 12)]


# -- an alarm that raises a StorageError of its own code --------------------------------------


class Reader(nj.DurableObject):
    """A read-only method with a bug: it writes (TurnError, a StorageError)."""

    namespace = "tests.test_alarms.Reader"

    @nj.read_only
    async def peek(self) -> None:
        self.ctx.storage.put("oops", 1)


class BuggyAlarm(nj.DurableObject):
    """Its alarm calls ``Reader.peek``, whose bug raises TurnError every time; or, with
    ``raw_sql``, runs raw SQL (refused under PostgreSQL with a StorageError)."""

    namespace = "tests.test_alarms.BuggyAlarm"

    async def arm(self, when: float, raw_sql: bool = False) -> None:
        self.ctx.storage.put("raw_sql", raw_sql)
        self.ctx.storage.set_alarm(when)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.ctx.env.append((nj.now(), info))
        if self.ctx.storage.get("raw_sql"):
            self.ctx.storage.execute("SELECT 1")
        await self.ctx.get(Reader, "r").peek()


def _drain(channel: trio.MemoryReceiveChannel[nj.Event]) -> list[nj.Event]:
    out = []
    while True:
        try:
            out.append(channel.receive_nowait())
        except trio.WouldBlock:
            return out


async def _buggy_alarm_runs(location: Any, *, raw_sql: bool) -> list[nj.Event]:
    runs: list[tuple[float, nj.AlarmInfo]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(location, env=runs, stop_on=()) as rt:
            with rt.events.subscribe() as events:
                await rt.get(BuggyAlarm, "b").arm(EPOCH + 10, raw_sql)
                await trio.sleep(500)
                received = _drain(events)
    # The error the alarm saw is its code's own bug, not a fault of the platform: the
    # object's policy (2 s doubling, 6 retries), then dropped.
    assert runs == [(EPOCH + t, nj.AlarmInfo(retry_count=n, is_retry=n > 0))
                    for n, t in enumerate((10, 12, 16, 24, 40, 72, 136))]
    [failed] = [e for e in received if e.type == "alarm:failed"]
    assert failed.time == EPOCH + 136 and failed.data["retries"] == 6
    return received


async def test_an_alarm_that_raises_a_turn_error_of_its_own_is_dropped_after_six_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    [failed] = [e for e in await _buggy_alarm_runs(None, raw_sql=False)
                if e.type == "alarm:failed"]
    assert "TurnError" in failed.data["error"]


async def test_an_alarm_refused_raw_sql_on_postgresql_is_dropped_after_six_retries(
    pg_dsn: str, autojump_clock: trio.testing.MockClock,
) -> None:
    [failed] = [e for e in await _buggy_alarm_runs(pg_dsn, raw_sql=True)
                if e.type == "alarm:failed"]
    assert "belongs to the file engine" in failed.data["error"]


# -- a raising alarm, on every engine ------------------------------------------------------


class Failing(nj.DurableObject):
    """Its alarm records (now, info) in ``ctx.env`` and raises on every run."""

    namespace = "tests.test_alarms.Failing"

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm_time(self) -> float | None:
        return self.ctx.storage.get_alarm()

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.ctx.env.append((nj.now(), info))
        raise ConnectionError(f"down {len(self.ctx.env)}")


async def test_a_raising_alarm_is_retried_2_s_doubling_then_dropped_on_every_engine(
    on_every_engine: str, autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[float, nj.AlarmInfo]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=runs, stop_on=()) as rt:
            with rt.events.subscribe() as events:
                stub = rt.get(Failing, "f")
                await stub.arm(EPOCH + 10)
                await trio.sleep(300)
                received = _drain(events)
                assert await stub.alarm_time() is None
    times = [10, 12, 16, 24, 40, 72, 136]
    assert runs == [(EPOCH + t, nj.AlarmInfo(retry_count=n, is_retry=n > 0))
                    for n, t in enumerate(times)]
    [failed] = [e for e in received if e.type == "alarm:failed"]
    assert (failed.namespace, failed.object_id, failed.time) == (Failing.namespace, "f",
                                                                  EPOCH + 136)
    assert failed.data["retries"] == 6 and "down 7" in failed.data["error"]
