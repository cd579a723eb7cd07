"""A memory reset frees the object, and the breaker strikes only what grew (issue 22.2).

The probe here reports what live instances hold: the sum of ``held`` over the instances
a weak set still sees. So a reset that leaves the dropped instance reachable (through
the closed host, its context, the job store, the alarm handler, a stub the application
keeps) keeps the process "over the limit", as RSS did, and the healthy neighbour is
struck again and again. Everything runs under ``autojump_clock``.
"""

from __future__ import annotations

import gc
import subprocess
import sys
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
        if ctx.job.fn == "burst":  # grows once, at its start, then holds it
            self.blob.append(b"x" * 1000)
            self.held += 2 * LIMIT
            await trio.sleep_forever()
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


async def test_a_leak_that_grew_before_the_first_sample_is_reset_at_that_sample(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A job due when the runtime opens grows memory before the watchdog's first sample
    (0.1 s): its growth counts from the memory at the watch's start, not from that
    first sample (which blamed nobody, and the job held the memory forever)."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, memory_limit=LIMIT, memory_probe=env.probe) as rt:
            reset_at: list[float] = []
            rt.events.add_listener(
                lambda e: reset_at.append(trio.current_time())
                if e.type == "alarm:memory_limit_reset" else None)
            await rt.get(Hog, "early").push("burst", id="burst")
            await trio.sleep(0.05)
            assert [(obj, t) for obj, _, t in env.runs] == [("early", 0.0)]
            assert env.probe() == 2 * LIMIT and reset_at == []
            await trio.sleep(1)
            assert reset_at == [0.1]  # at the first sample
            assert env.probe() == 0


_BALLAST = """
import gc, sys, trio, trio.testing
import nursery_jobs as nj
from nursery_jobs._core._runtime import process_rss

class Ballast(nj.DurableObject):
    namespace = "tests.test_memory_reset.Ballast"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.ballast = b""
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn, **kwargs):
        return await self.lifecycle.jobs.push(fn, **kwargs)

    async def on_job(self, ctx):
        self.ballast = b"x" * (200 << 20)  # touched: resident, not lazily zeroed
        await trio.sleep_forever()

async def main():
    gc.collect()
    limit = process_rss() + (100 << 20)
    resets = []
    async with nj.open_runtime(memory_limit=limit) as rt:
        rt.events.add_listener(
            lambda e: resets.append(e.object_id) if e.type == "alarm:memory_limit_reset" else None)
        await rt.get(Ballast, "b").push("hold", id="hold", delay=1)
        await trio.sleep(5)
        print(resets, process_rss() < limit)

trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
"""


def test_the_process_rss_falls_back_under_the_limit_after_a_reset() -> None:
    # In a process of its own: in a long-lived one (the test session), a freed heap
    # chunk may take the 200 MB without the RSS growing at all.
    done = subprocess.run([sys.executable, "-c", _BALLAST], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "['b'] True", done.stdout
