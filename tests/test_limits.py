"""Limits per namespace (DESIGN.md §3, "Steering jobs"): ``open_runtime(limits={ns:
nj.Limit(concurrency=N, rate=(k, per_seconds))})`` bounds how many of a namespace's jobs
run at once in this runtime and how many start in any ``per_seconds`` window. A held job
stays due, in order, and uses up no attempt; a held object holds nothing the rest of the
runtime needs. Exact virtual times.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH, engine

import nursery_jobs as nj


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


HANG = 100_000


def rel() -> float:
    return nj.now() - EPOCH


class Env:
    def __init__(self, jobs: int = 0) -> None:
        self.jobs = jobs  # how many jobs end before ``done`` is set
        self.done = trio.Event()
        self.running = 0
        self.most = 0
        self.started: list[tuple[str, float, int]] = []  # (object, time, attempt)
        self.ended: list[tuple[str, float]] = []


class Worker(nj.DurableObject):
    """Each job sleeps ``payload`` seconds."""

    namespace = "tests.test_limits.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        env = self.env
        env.started.append((self.ctx.id, rel(), ctx.attempt))
        env.running += 1
        env.most = max(env.most, env.running)
        try:
            await trio.sleep(ctx.job.payload)
        finally:
            env.running -= 1
        env.ended.append((self.ctx.id, rel()))
        if len(env.ended) == env.jobs:
            env.done.set()

    async def push(self, seconds: float, **kwargs: Any) -> None:
        await self.lifecycle.jobs.push("work", payload=seconds, **kwargs)

    async def ping(self) -> float:
        return rel()

    def dead_letters(self) -> int:
        return len(self.lifecycle.dead_letters())


class Other(Worker):
    namespace = "tests.test_limits.Other"


async def test_a_concurrency_limit_of_3_runs_12_jobs_in_4_rounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env(12)
    limits = {Worker: nj.Limit(concurrency=3)}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env, limits=limits) as rt:
            for i in range(12):
                await rt.get(Worker, f"w{i:02}").push(10)
            await env.done.wait()
    assert max(t for _o, t in env.ended) == 40.0
    assert env.most == 3
    assert sorted(t for _o, t, _a in env.started) == [0.0] * 3 + [10.0] * 3 + [20.0] * 3 + [
        30.0] * 3
    # Held objects wait in line: the first three pushed run first.
    assert sorted(o for o, t, _a in env.started if t == 0.0) == ["w00", "w01", "w02"]


async def test_a_rate_of_2_per_second_never_starts_3_in_any_second(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env(10)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env,
                                   limits={Worker.namespace: nj.Limit(rate=(2, 1.0))}) as rt:
            for i in range(7):
                await rt.get(Worker, f"w{i}").push(0.25)
            one = rt.get(Worker, "many")  # one object's own jobs are limited too
            for _ in range(3):
                await one.push(0)
            await env.done.wait()
    starts = sorted(t for _o, t, _a in env.started)
    assert starts == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    for t in starts:
        assert sum(1 for u in starts if t <= u < t + 1.0) <= 2


async def test_a_held_job_uses_no_attempt_and_calls_do_not_wait_for_the_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env,
                                   limits={Worker: nj.Limit(concurrency=1)}) as rt:
            await rt.get(Worker, "a").push(10)
            held = rt.get(Worker, "b")
            await held.push(1, retry=nj.RetryOptions(max_attempts=1))
            await trio.sleep(5)
            assert env.started == [("a", 0.0, 1)]
            assert await held.ping() == 5.0  # a held object serves calls at once
            await trio.sleep(20)
            assert env.started == [("a", 0.0, 1), ("b", 10.0, 1)]
            assert env.ended == [("a", 10.0), ("b", 11.0)]
            assert await held.dead_letters() == 0


async def test_an_unlimited_namespace_runs_on_time_beside_a_limited_backlog(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env,
                                   limits={Worker: nj.Limit(concurrency=1)}) as rt:
            for i in range(100):
                await rt.get(Worker, f"w{i:03}").push(100)
            other = rt.get(Other, "o")
            await other.push(0, delay=5, id="x")
            await other.push(0, delay=7, id="y")
            await trio.sleep(50)
    assert [(o, t) for o, t, _a in env.started if o == "o"] == [("o", 5.0), ("o", 7.0)]
    assert [(o, t) for o, t, _a in env.started if o != "o"] == [("w000", 0.0)]


@pytest.mark.parametrize(("kwargs", "argument"), [
    ({}, "concurrency"),
    ({"concurrency": 0}, "concurrency"),
    ({"concurrency": True}, "concurrency"),
    ({"concurrency": 2.0}, "concurrency"),
    ({"rate": 2}, "rate"),
    ({"rate": (0, 1.0)}, "rate"),
    ({"rate": (2, 0)}, "rate"),
    ({"rate": (2, float("inf"))}, "rate"),
    ({"rate": (2, float("nan"))}, "rate"),
    ({"rate": (2.5, 1.0)}, "rate"),
    ({"rate": (1, 2, 3)}, "rate"),
])
def test_bad_limits_are_refused_naming_the_argument(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(nj.LimitError, match=argument) as caught:
        nj.Limit(**kwargs)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("limits", [
    [("ns", nj.Limit(concurrency=1))],
    {"": nj.Limit(concurrency=1)},
    {3: nj.Limit(concurrency=1)},
    {int: nj.Limit(concurrency=1)},
    {"ns": 3},
    {Worker: nj.Limit(concurrency=1), Worker.namespace: nj.Limit(concurrency=2)},
])
async def test_bad_limits_of_open_runtime_are_refused_at_open(limits: Any) -> None:
    with pytest.raises(nj.LimitError, match="limits"):
        async with nj.open_runtime(engine.location, limits=limits):
            pytest.fail("opened")


def test_a_limit_is_a_frozen_record() -> None:
    limit = nj.Limit(concurrency=2, rate=(5, 1))
    assert limit.rate == (5, 1.0)
    assert limit == nj.Limit(concurrency=2, rate=(5, 1.0))
    with pytest.raises(AttributeError):
        limit.concurrency = 3  # type: ignore[misc]


async def test_a_rate_window_opens_exactly_when_its_oldest_start_leaves_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """0.1 + 0.7 - 0.7 < 0.1 in floats: the window task woke at 0.1 + 0.7, still found
    the start of 0.1 inside the window and asked to wake again at the same instant — a
    spin that stopped virtual time (the held object never ran, the test hung)."""
    from nursery_jobs._core._limits import NamespaceLimit

    woken: list[tuple[str, float]] = []
    waits: list[tuple[Any, tuple[Any, ...]]] = []
    limit = NamespaceLimit("ns", nj.Limit(rate=(1, 0.7)),
                           lambda object_id: woken.append((object_id, trio.current_time())),
                           lambda fn, *args: waits.append((fn, args)))
    await trio.sleep(0.1)
    assert limit.try_acquire("a")
    limit.release()  # (a short job: the rate, not the concurrency, holds the next)
    assert not limit.try_acquire("b")
    limit.park("b")
    [(fn, (at,))] = waits
    assert at == 0.1 + 0.7
    await fn(at)
    assert woken == [("b", 0.1 + 0.7)]
    assert len(waits) == 1  # no second wait at the same instant
    assert limit.try_acquire("b")


class SlowAlarm(Worker):
    """A host ``on_alarm()`` that takes a second (after the jobs of each alarm run)."""

    namespace = "tests.test_limits.SlowAlarm"

    async def on_alarm(self) -> None:
        await trio.sleep(1)


async def test_a_permit_freed_while_a_held_object_finishes_its_alarm_run_reaches_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """b is held at 0 and joins the line at 1, when its on_alarm() ends; a's permit came
    free at 0.5, so it was reserved for b at once — while b's delivery was still in
    flight. That delivery handed the unused permit back at its end, b was out of the
    line by then, and its job waited for the fallback alarm: it ran at 31, not 1."""
    env = Env(2)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env,
                                   limits={SlowAlarm: nj.Limit(concurrency=1)}) as rt:
            await rt.get(SlowAlarm, "a").push(0.5)
            await rt.get(SlowAlarm, "b").push(0)
            await env.done.wait()
    assert env.started == [("a", 0.0, 1), ("b", 1.0, 1)]
    assert env.ended == [("a", 0.5), ("b", 1.0)]
