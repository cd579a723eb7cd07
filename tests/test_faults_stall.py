"""Issue 10 #8: a job that blocks the Trio thread is noticed by the loop-stall watchdog,
which emits ``runtime:stalled {seconds, object, job, where}`` naming it, and logs it once
per stall. These run on the real clock (a stall is real time); under a MockClock the
watchdog stays off."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import trio
import trio.testing

import nursery_jobs as nj


class Blocker(nj.DurableObject):
    namespace = "tests.test_faults_stall.Blocker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def add(self, job_id: str, fn: str) -> None:
        await self.lifecycle.jobs.push(fn, id=job_id)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        done: trio.Event = self.ctx.env["done"]
        if ctx.job.fn == "block":
            time.sleep(0.6)  # noqa: ASYNC251 — the fault under test: holds the Trio thread
        elif ctx.job.fn == "await-then-block":
            await trio.sleep(0.1)  # meanwhile another object's job starts and waits
            time.sleep(0.6)  # noqa: ASYNC251
        elif ctx.job.fn == "wait":
            await trio.sleep(0.5)
        self.ctx.env["finished"].append(ctx.job.id)
        if len(self.ctx.env["finished"]) == self.ctx.env["expect"]:
            done.set()
        return None


def stalls(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "stalled" in r.getMessage()
            or "has not run" in r.getMessage()]


async def run_jobs(jobs: list[tuple[str, str, str]]) -> list[nj.Event]:
    env = {"done": trio.Event(), "finished": [], "expect": len(jobs)}
    events: list[nj.Event] = []
    with trio.fail_after(10):
        async with nj.open_runtime(env=env) as rt:
            rt.events.add_listener(events.append)
            for object_id, job_id, fn in jobs:
                await rt.get(Blocker, object_id).add(job_id, fn)
            await env["done"].wait()  # type: ignore[attr-defined]
            await trio.sleep(0.1)  # a tick after the stall
    return [e for e in events if e.type == "runtime:stalled"]


async def test_a_job_that_blocks_the_loop_is_named(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "nursery_jobs")
    (event,) = await run_jobs([("b", "sleepy", "block")])
    assert event.namespace == Blocker.namespace
    assert event.object_id == "b"
    assert event.data["object"] == f"{Blocker.namespace}/b"
    assert event.data["job"] == "sleepy"
    assert 0.4 < event.data["seconds"] < 5
    assert "test_faults_stall.py" in event.data["where"]
    assert "on_job" in event.data["where"]
    (record,) = stalls(caplog)  # logged once
    assert "sleepy" in record.getMessage()
    assert f"{Blocker.namespace}/b" in record.getMessage()


async def test_the_job_that_blocks_is_named_not_the_last_one_started() -> None:
    # "a" starts, awaits; "z" starts after it and awaits; then "a" blocks.
    (event,) = await run_jobs([("a", "culprit", "await-then-block"),
                               ("z", "innocent", "wait")])
    assert (event.object_id, event.data["job"]) == ("a", "culprit")


async def test_back_to_back_blocking_jobs_are_two_stalls_each_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 22 #11: two jobs that each hold the loop, one right after the other (no
    checkpoint between them), were one stall of their sum naming one of them."""
    caplog.set_level(logging.WARNING, "nursery_jobs")
    first, second = await run_jobs([("b", "first", "block"), ("b", "second", "block")])
    assert (first.data["job"], second.data["job"]) == ("first", "second")
    for event in (first, second):
        assert event.object_id == "b"
        assert 0.4 < event.data["seconds"] < 1.0, event.data
    logged = stalls(caplog)
    assert len(logged) == 2
    assert "'first'" in logged[0].getMessage() and "'second'" in logged[1].getMessage()


class PlainBlocker(nj.DurableObject):
    namespace = "tests.test_faults_stall.PlainBlocker"

    async def arm(self) -> None:
        self.ctx.storage.set_alarm(nj.now())

    async def alarm(self, info: nj.AlarmInfo) -> None:
        time.sleep(0.4)  # noqa: ASYNC251
        self.ctx.env.set()


async def test_a_plain_alarm_that_blocks_is_named() -> None:
    done = trio.Event()
    events: list[nj.Event] = []
    with trio.fail_after(10):
        async with nj.open_runtime(env=done) as rt:
            rt.events.add_listener(events.append)
            await rt.get(PlainBlocker, "p").arm()
            await done.wait()
            await trio.sleep(0.1)
    (event,) = [e for e in events if e.type == "runtime:stalled"]
    assert (event.object_id, event.data["job"]) == ("p", None)


async def test_a_busy_but_responsive_loop_is_no_stall(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"done": trio.Event(), "finished": [], "expect": 30}
    events: list[nj.Event] = []
    async with nj.open_runtime(env=env) as rt:
        rt.events.add_listener(events.append)
        for i in range(30):
            await rt.get(Blocker, f"w{i}").add("j", "wait")
        await env["done"].wait()  # type: ignore[attr-defined]
    assert [e for e in events if e.type == "runtime:stalled"] == []
    assert stalls(caplog) == []


async def test_the_watchdog_stays_off_under_a_mock_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Only threads this test's runtime started: another test's runtime (in this worker
    # process) may have left its watchdog still ending, which failed this by name alone.
    before = set(threading.enumerate())
    async with nj.open_runtime():
        await trio.sleep(3600)  # a 50 ms tick would be 72,000 autojumps
        assert not [t for t in threading.enumerate()
                    if t not in before and t.name == "nursery_jobs stall watchdog"]
        assert trio.current_time() == 3600


async def test_the_thread_ends_with_the_runtime() -> None:
    async with nj.open_runtime():
        await trio.sleep(0.06)
        (thread,) = [t for t in threading.enumerate()
                     if t.name == "nursery_jobs stall watchdog"]
    await trio.to_thread.run_sync(thread.join, 2.0)
    assert not thread.is_alive()
