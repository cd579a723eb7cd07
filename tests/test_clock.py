"""Time follows the wall clock (DESIGN.md §2 "Time"): the anchor ``epoch0`` is compared
with the wall clock at least once a second and whenever the runtime's timer wakes; past
50 ms of drift it moves, the timer re-arms for the alarms now due at their wall times,
and ``clock:adjusted {drift}`` is emitted. A pinned epoch never moves.

The unit tests run under ``autojump_clock`` with a fake wall clock that follows Trio's
clock until a test steps it; one test steps a wall clock in a real subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH

import nursery_jobs as nj
from nursery_jobs import _clock

HANG = 100_000
WORKER = Path(__file__).with_name("clock_worker.py")


class FakeWall:
    """A wall clock at ``EPOCH + trio time + offset``; tests step the offset."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return EPOCH + trio.current_time() + self.offset


@pytest.fixture
def wall() -> Iterator[FakeWall]:
    """An unpinned epoch, read from a fake wall clock."""
    fake = FakeWall()
    _clock.pin_epoch(None)
    _clock.set_wall_clock(fake)
    try:
        yield fake
    finally:
        _clock.set_wall_clock(None)


@pytest.fixture
def pinned_wall() -> Iterator[FakeWall]:
    """A fake wall clock under the pinned epoch of the test suite."""
    fake = FakeWall()
    _clock.set_wall_clock(fake)
    try:
        yield fake
    finally:
        _clock.set_wall_clock(None)


class Alarmed(nj.DurableObject):
    """A plain object: ``arm(time)`` sets its alarm; each alarm run is recorded."""

    namespace = "tests.test_clock.Alarmed"

    async def arm(self, time: float) -> None:
        self.ctx.storage.set_alarm(time)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        env: Runs = self.ctx.env
        env.runs.append((self.ctx.id, trio.current_time(), nj.now()))


class Runs:
    def __init__(self) -> None:
        # (object id, trio time, nj.now()) per alarm run.
        self.runs: list[tuple[str, float, float]] = []
        # (trio time, drift) per clock:adjusted event.
        self.adjusted: list[tuple[float, float]] = []

    def listen(self, rt: nj.Runtime) -> None:
        def on_event(event: nj.Event) -> None:
            if event.type == "clock:adjusted":
                assert (event.namespace, event.object_id) == ("", "")
                self.adjusted.append((trio.current_time(), event.data["drift"]))

        rt.events.add_listener(on_event)


async def step_at(wall: FakeWall, when: float, by: float) -> None:
    await trio.sleep_until(when)
    wall.offset += by


# -- re-anchoring in a runtime -----------------------------------------------------------------


async def test_a_step_forward_fires_an_absolute_time_at_its_wall_time(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    env = Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt, trio.open_nursery() as nursery:
            env.listen(rt)
            assert nj.now() == EPOCH
            await rt.get(Alarmed, "a").arm(EPOCH + 8)
            # Stepped +5 s between two once-a-second checks: seen at the one at 2.
            nursery.start_soon(step_at, wall, 1.5, 5.0)
            await trio.sleep(20)
            assert env.adjusted == [(2.0, 5.0)]
            assert _clock.epoch() == EPOCH + 5
            # Due at wall time EPOCH + 8: Trio time 3 once re-anchored, not 8.
            assert env.runs == [("a", 3.0, EPOCH + 8)]


async def test_a_step_back_delays_an_absolute_time_to_its_wall_time(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    env = Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt, trio.open_nursery() as nursery:
            env.listen(rt)
            await rt.get(Alarmed, "a").arm(EPOCH + 8)
            nursery.start_soon(step_at, wall, 1.5, -5.0)
            await trio.sleep(20)
            assert env.adjusted == [(2.0, -5.0)]
            assert env.runs == [("a", 13.0, EPOCH + 8)]


class Delayed(nj.DurableObject):
    """A Lifecycle object: ``push(delay)`` pushes a job; each run is recorded."""

    namespace = "tests.test_clock.Delayed"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, delay: float) -> None:
        await self.lifecycle.jobs.push("f", id="d", delay=delay)

    async def on_job(self, ctx: nj.JobContext) -> None:
        env: Runs = self.ctx.env
        env.runs.append((self.ctx.id, trio.current_time(), nj.now()))


async def test_a_delay_pushed_after_a_step_back_counts_from_its_push(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    """Issue 22 #11: the wall clock steps back 5 s at 1.5, the runtime's check at 2
    notices; a ``delay=1`` pushed in between (1.75) fired at +6 s, measured from a
    ``now()`` the step had made stale. A push with a delay reads the wall clock."""
    env = Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt, trio.open_nursery() as nursery:
            env.listen(rt)
            nursery.start_soon(step_at, wall, 1.5, -5.0)
            await trio.sleep(1.75)
            await rt.get(Delayed, "d").push(1)
            await trio.sleep(20)
            assert env.adjusted == [(1.75, -5.0)]  # noticed by the push
            assert env.runs == [("d", 2.75, EPOCH - 5 + 2.75)]


async def test_the_timer_re_anchors_when_it_wakes(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    env = Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt, trio.open_nursery() as nursery:
            env.listen(rt)
            await rt.get(Alarmed, "early").arm(EPOCH + 1.75)
            await rt.get(Alarmed, "late").arm(EPOCH + 8)
            nursery.start_soon(step_at, wall, 1.5, 5.0)
            await trio.sleep(20)
            # The timer wakes for "early" at 1.75, before the check at 2: it re-anchors
            # at once (and runs "early", overdue by the new clock).
            assert env.adjusted == [(1.75, 5.0)]
            assert env.runs == [("early", 1.75, EPOCH + 6.75), ("late", 3.0, EPOCH + 8)]


async def test_drift_up_to_50_ms_leaves_the_anchor(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    env = Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            env.listen(rt)
            await rt.get(Alarmed, "a").arm(EPOCH + 10)
            await trio.sleep(1.5)
            wall.offset = 0.046875  # (times in this test are exact binary fractions)
            await trio.sleep(2)
            assert env.adjusted == []
            assert _clock.epoch() == EPOCH
            wall.offset = 0.0625
            await trio.sleep(1)
            assert env.adjusted == [(4.0, 0.0625)]
            assert _clock.epoch() == EPOCH + 0.0625
            await trio.sleep(10)
            assert env.runs == [("a", 9.9375, EPOCH + 10)]


async def test_every_runtime_of_the_run_hears_of_an_adjustment(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    # The anchor belongs to the Trio run: one runtime's check moves it for both, and
    # both must re-arm their timers and emit the event.
    first, second = Runs(), Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=first) as rt1, nj.open_runtime(env=second) as rt2:
            first.listen(rt1)
            second.listen(rt2)
            await rt1.get(Alarmed, "one").arm(EPOCH + 8)
            await rt2.get(Alarmed, "two").arm(EPOCH + 9)
            await trio.sleep(1.5)
            wall.offset = 5.0
            await trio.sleep(10)
            assert first.adjusted == second.adjusted == [(2.0, 5.0)]
            assert first.runs == [("one", 3.0, EPOCH + 8)]
            assert second.runs == [("two", 4.0, EPOCH + 9)]


async def test_a_pinned_epoch_is_never_re_anchored(
    autojump_clock: trio.testing.MockClock, pinned_wall: FakeWall
) -> None:
    env = Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            env.listen(rt)
            await rt.get(Alarmed, "a").arm(EPOCH + 8)
            await trio.sleep(1.5)
            pinned_wall.offset = 5.0
            await trio.sleep(10_000)  # and no once-a-second task spins meanwhile
            assert env.adjusted == []
            assert env.runs == [("a", 8.0, EPOCH + 8)]
            assert _clock.reanchor() is None
            assert pinned_wall.reads == 0


async def test_set_epoch_pins_the_run(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    _clock.set_epoch(EPOCH - 100)
    env = Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            env.listen(rt)
            await trio.sleep(5)
            wall.offset = 5.0
            await trio.sleep(5)
            assert nj.now() == EPOCH - 90
            assert env.adjusted == []


async def test_a_mock_clock_is_not_dragged_to_the_system_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Unpinned, reading the real wall clock: virtual time runs far ahead of it, which
    # is no drift to correct.
    _clock.pin_epoch(None)
    env = Runs()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            env.listen(rt)
            epoch = _clock.epoch()
            await rt.get(Alarmed, "a").arm(epoch + 1000)
            await trio.sleep(2000)
            assert _clock.epoch() == epoch
            assert env.adjusted == []
            assert env.runs == [("a", 1000.0, epoch + 1000)]


# -- reanchor() itself -------------------------------------------------------------------------


async def test_reanchor_moves_the_anchor_past_the_threshold_only(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    assert nj.now() == EPOCH
    assert _clock.reanchor() is None
    wall.offset = -0.046875
    assert _clock.reanchor() is None
    wall.offset = -0.25
    assert _clock.reanchor() == -0.25
    assert _clock.epoch() == EPOCH - 0.25
    assert _clock.reanchor() is None  # moved: no drift left
    await trio.sleep(7)
    assert nj.now() == EPOCH + 6.75
    assert _clock.to_trio_time(EPOCH + 10) == 10.25


async def test_run_anchor_checks_once_a_second_and_tells_its_listener(
    autojump_clock: trio.testing.MockClock, wall: FakeWall
) -> None:
    drifts: list[tuple[float, float]] = []
    with trio.fail_after(HANG):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                _clock.run_anchor, lambda drift: drifts.append((trio.current_time(), drift))
            )
            await trio.sleep(0.5)
            reads = wall.reads
            await trio.sleep(3)  # checks at 1, 2, 3
            assert wall.reads - reads == 3
            wall.offset = 1.0
            await trio.sleep(1)  # the check at 4
            # A re-anchor from elsewhere (a timer wake) is heard too.
            await trio.sleep(0.25)
            wall.offset = 3.0
            assert _clock.reanchor() == 2.0
            assert drifts == [(4.0, 1.0), (4.75, 2.0)]
            nursery.cancel_scope.cancel()
    # Gone with its task: a later re-anchor tells nobody.
    wall.offset = 4.0
    assert _clock.reanchor() == 1.0
    assert len(drifts) == 2


# -- a real process ----------------------------------------------------------------------------


def test_a_wall_clock_step_in_a_real_process() -> None:
    # An alarm 8 s out by the wall clock; the wall clock steps +5 s after 1 s. Trio's
    # clock never sees the step: anchored once, the alarm would run 8 s after the start.
    result = subprocess.run(
        [sys.executable, str(WORKER), "1.0", "5.0", "8.0"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    ran: dict[str, Any] = json.loads(result.stdout)
    [drift] = ran["drifts"]
    assert 4.9 < drift < 5.1
    # It ran at its wall time (within timer lateness), by the wall clock and by now().
    assert 0 <= ran["wall"] - ran["due"] < 1.5
    assert 0 <= ran["now"] - ran["due"] < 1.5
    # About 3 s after the start, not 8.
    assert 2.5 < ran["after"] < 6


# -- nj.jitter -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [("5",), (None,), (True,), (Decimal(5),), (5, "0.5"), (5, None), (5, Decimal("0.5"))],
    ids=["base str", "base None", "base bool", "base Decimal", "fraction str",
         "fraction None", "fraction Decimal"],
)
def test_a_bad_jitter_argument_is_a_time_argument_error_naming_it(args: tuple[Any, ...]) -> None:
    name = "base" if len(args) == 1 else "fraction"
    with pytest.raises(nj.TimeArgumentError, match=f"jitter: {name} "):
        nj.jitter(*args)


@pytest.mark.parametrize("args", [(1e308, 10.0), (1.7e308, 1.0), (10**300, 10**300)])
def test_jitter_past_the_largest_float_is_refused(args: tuple[Any, ...]) -> None:
    with pytest.raises(nj.TimeArgumentError, match="past the largest float"):
        nj.jitter(*args)


def test_jitter_spreads_a_base_by_its_fraction() -> None:
    values = [nj.jitter(10, 0.5) for _ in range(200)] + [nj.jitter(Fraction(10), 0.5)]
    assert all(10.0 <= v <= 15.0 for v in values)
    assert nj.jitter(7, 0) == 7.0 and nj.jitter(0) == 0.0
