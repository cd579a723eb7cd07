"""Startup runs once per activation, before the first call or alarm run it serves, and
re-arms the alarm from the queue (DESIGN §4; issue: capability startup on a request)."""

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


class Recorder(nj.Capability):
    id = "rec"

    def __init__(self, log: list[Any], fail: set[int]) -> None:
        self.log = log
        self.fail = fail

    async def on_start(self) -> None:
        n = sum(1 for entry in self.log if entry[0] == "start") + 1
        self.log.append(("start", nj.now() - EPOCH))
        if n in self.fail:
            raise RuntimeError(f"start {n} failed")

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.log.append(("job", ctx.job.id, nj.now() - EPOCH))


class Starter(nj.DurableObject):
    namespace = "tests.test_startup.Starter"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        log, fail = ctx.env
        self.cap = Recorder(log, fail)
        self.lifecycle = nj.Lifecycle.install(self).use(self.cap)

    async def hello(self) -> str:
        self.cap.log.append(("hello", nj.now() - EPOCH))
        return "hi"

    @nj.read_only
    async def peek(self) -> str:
        self.cap.log.append(("peek", nj.now() - EPOCH))
        return "seen"

    async def push(self, job_id: str, at: float) -> None:
        await self.cap.lifecycle.jobs.push("f", id=job_id, time=EPOCH + at)


async def test_a_call_that_wakes_the_object_runs_startup_first_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[Any] = []
    async with nj.open_runtime(engine.location, env=(log, set()), idle_timeout=5) as rt:
        obj = rt.get(Starter, "s")
        assert await obj.hello() == "hi"
        assert await obj.hello() == "hi"
        await trio.sleep(10)  # evicted: the next call is a new activation
        await obj.hello()
    assert log == [("start", 0), ("hello", 0), ("hello", 0), ("start", 10), ("hello", 10)]


async def test_a_failing_startup_fails_the_call_and_the_next_call_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[Any] = []
    async with nj.open_runtime(engine.location, env=(log, {1})) as rt:
        obj = rt.get(Starter, "s")
        with pytest.raises(RuntimeError, match="start 1 failed"):
            await obj.hello()
        await trio.sleep(1)
        assert await obj.hello() == "hi"
    assert log == [("start", 0), ("start", 1), ("hello", 1)]


async def test_a_call_re_arms_an_alarm_the_index_lost(
    autojump_clock: trio.testing.MockClock, tmp_path: Any
) -> None:
    """The alarm index is rebuilt from the queue when an object activates: a lost
    alarm row comes back at the first call, and the job runs on time."""
    log: list[Any] = []
    location = engine.durable(tmp_path)
    async with nj.open_runtime(location, env=(log, set()), idle_timeout=1) as rt:
        obj = rt.get(Starter, "s")
        await obj.push("j", 50)
        await trio.sleep(5)  # evicted
        engine.lose_alarm(rt, Starter.namespace, "s")  # lost behind its back
        assert engine.stored_alarm(rt, Starter.namespace, "s") is None
        await obj.hello()
        assert engine.stored_alarm(rt, Starter.namespace, "s") == (EPOCH + 50, 0)
        await trio.sleep(60)
    assert ("job", "j", 50) in log


async def test_a_failing_startup_fails_a_read_only_call_and_the_next_one_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A read-only call runs the startup at its place in line too: its error is the
    call's, and the next read-only call runs the startup again, then reads."""
    log: list[Any] = []
    async with nj.open_runtime(engine.location, env=(log, {1})) as rt:
        obj = rt.get(Starter, "s")
        with pytest.raises(RuntimeError, match="start 1 failed"):
            await obj.peek()
        await trio.sleep(1)
        assert await obj.peek() == "seen"
        assert await obj.peek() == "seen"
    assert log == [("start", 0), ("start", 1), ("peek", 1), ("peek", 1)]
