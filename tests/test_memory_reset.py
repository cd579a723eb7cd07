"""A memory reset frees the object, and the breaker strikes only what grew (issue 22.2).

The probe here reports what live instances hold: the sum of ``held`` over the instances
a weak set still sees. So a reset that leaves the dropped instance reachable (through
the closed host, its context, the job store, the alarm handler, a stub the application
keeps) keeps the process "over the limit", as RSS did, and the healthy neighbour is
struck again and again. Everything runs under ``autojump_clock``.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import trio
import trio.testing
from conftest import EPOCH

import nursery_jobs as nj

LIMIT = 100
HANG = 10_000


def referrers(ref: weakref.ref[Any]) -> list[str]:
    """What still refers to the instance (two levels up, frames left out)."""
    obj = ref()
    out = []
    for first in gc.get_referrers(obj):
        if type(first).__name__ == "frame":
            continue
        ups = [type(up).__name__ for up in gc.get_referrers(first)
               if type(up).__name__ != "frame"]
        out.append(f"{type(first).__name__} <- {ups}")
    return out


class Env:
    def __init__(self) -> None:
        self.live: weakref.WeakSet[Any] = weakref.WeakSet()
        self.runs: list[tuple[str, str, float]] = []
        self.resets: list[tuple[str, int]] = []

    def probe(self) -> int:
        return sum(obj.held for obj in list(self.live))


class Hog(nj.DurableObject):
    namespace = "tests.test_memory_reset.Hog"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.env.live.add(self)
        self.held = 0
        self.blob: list[bytes] = []
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> nj.Job:
        return await self.lifecycle.jobs.push(fn, **kwargs)

    async def dead_letters(self) -> list[nj.DeadLetter]:
        return self.lifecycle.dead_letters()

    async def jobs(self) -> list[str]:
        return [job.id for job in self.lifecycle.jobs.list()]

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.env.runs.append((self.ctx.id, ctx.job.id, trio.current_time()))
        if ctx.job.fn == "leak":  # grows by 10 every 0.1 s until reset
            while True:
                self.blob.append(b"x" * 1000)
                self.held += 10
                await trio.sleep(0.1)
        await trio.sleep(0.5)  # healthy: half a second of work, no growth
        return None


async def test_after_a_memory_reset_nothing_refers_to_the_instance(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, memory_limit=LIMIT, memory_probe=env.probe) as rt:
            rt.events.add_listener(
                lambda e: env.resets.append((e.object_id, e.data["strikes"]))
                if e.type == "alarm:memory_limit_reset" else None)
            stub = rt.get(Hog, "leaky")  # the application keeps its stub
            await stub.push("leak", id="leak", time=EPOCH + 1)
            [first] = list(env.live)
            ref = weakref.ref(first)
            del first
            await trio.sleep(3)
            assert env.resets == [("leaky", 1)]
            gc.collect()
            assert ref() is None, referrers(ref)
            assert env.probe() == 0
            assert await stub.jobs() == ["leak"]  # moved out by the strike, not lost


async def test_a_healthy_neighbour_is_never_struck_for_the_leak(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, memory_limit=LIMIT, memory_probe=env.probe) as rt:
            rt.events.add_listener(
                lambda e: env.resets.append((e.object_id, e.data["strikes"]))
                if e.type == "alarm:memory_limit_reset" else None)
            leaky, healthy = rt.get(Hog, "leaky"), rt.get(Hog, "healthy")
            await leaky.push("leak", id="leak", time=EPOCH + 1)
            for i in range(3):
                await healthy.push("work", id=f"w{i}", time=EPOCH + 2 + i)
            await trio.sleep(200)
            # The leak crossed the limit at ~2 s while w0 ran beside it, without growing:
            # only the leaking object is reset, and the healthy jobs all complete.
            assert [obj for obj, _ in env.resets] == ["leaky"] * len(env.resets)
            assert env.resets[:3] == [("leaky", 1), ("leaky", 2), ("leaky", 3)]
            assert [job for obj, job, _ in env.runs if obj == "healthy"] == ["w0", "w1", "w2"]
            assert await healthy.dead_letters() == []
            assert [d.job.id for d in await leaky.dead_letters()] == ["leak"]


class Ballast(nj.DurableObject):
    """A job that takes 200 MB of real memory and holds it until reset."""

    namespace = "tests.test_memory_reset.Ballast"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.ballast = b""
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> nj.Job:
        return await self.lifecycle.jobs.push(fn, **kwargs)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.ballast = b"x" * (200 << 20)  # touched: resident, not lazily zeroed
        await trio.sleep_forever()


async def test_the_process_rss_falls_back_under_the_limit_after_a_reset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from nursery_jobs._core._runtime import process_rss

    gc.collect()
    limit = process_rss() + (100 << 20)
    resets: list[str] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(memory_limit=limit) as rt:
            rt.events.add_listener(
                lambda e: resets.append(e.object_id)
                if e.type == "alarm:memory_limit_reset" else None)
            await rt.get(Ballast, "b").push("hold", id="hold", time=EPOCH + 1)
            await trio.sleep(5)
            assert resets == ["b"]
            assert process_rss() < limit
