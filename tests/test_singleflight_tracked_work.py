"""Single-flight across tracked work (DESIGN §3): "skip the job while a previous run of
it is still in progress (e.g. tracked work); a run older than hung_timeout counts as
hung", and "an in-flight single-flight job counts from started + hung_timeout" for the
alarm. A job's id names it across its rows: a job that completed (its row deleted) or
was dead-lettered while the tracked work its run started goes on, then is pushed or
requeued again under that id, is held by that work as a replaced job is.

Timer tests under ``autojump_clock``, exact virtual times relative to ``EPOCH``; every
test runs on every engine (conftest.ENGINES).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH, engine

import nursery_jobs as nj

HANG = 100_000
# Never reached in these tests unless a test says otherwise: a hung run is not the point.
LONG = 1000.0


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


def rel() -> float:
    return nj.now() - EPOCH


async def tracked_sleep(log: list[Any], who: str, seconds: float) -> None:
    await trio.sleep(seconds)
    log.append((who, "work ended", rel()))


class Other(nj.Capability):
    """Another owner, whose jobs only log their runs."""

    id = "other"

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.host.ctx.env["log"].append((ctx.job.id, "run", rel(), "other"))

    async def push(self, job_id: str) -> None:
        await self.lifecycle.jobs.push("note", id=job_id, singleflight=True, hung_timeout=LONG)


class Worker(nj.DurableObject):
    """A Lifecycle object whose jobs do what their ``fn`` says (``payload``: how long
    the tracked work they start runs); ``env`` is a dict with a ``log`` list."""

    namespace = "tests.test_singleflight_tracked_work.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.log: list[Any] = ctx.env["log"]
        self.other = Other()
        self.lifecycle = nj.Lifecycle.install(self).use(self.other)

    async def push(self, fn: str, **kwargs: Any) -> None:
        await self.lifecycle.jobs.push(fn, **kwargs)

    async def push_other(self, job_id: str) -> None:
        await self.other.push(job_id)

    async def requeue(self, job_id: str) -> bool:
        return await self.lifecycle.requeue(job_id) is not None

    async def job_ids(self) -> list[str]:
        return [job.id for job in self.lifecycle.jobs.list()]

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        fn, job = ctx.job.fn, ctx.job
        self.log.append((job.id, "run", rel(), fn))
        if fn == "start work":  # ... and complete (the row is deleted)
            assert self.lifecycle.track_alarm_work(tracked_sleep, self.log, job.id, job.payload)
        elif fn == "start work, then fail":
            assert self.lifecycle.track_alarm_work(tracked_sleep, self.log, job.id, job.payload)
            raise RuntimeError("failed after starting its work")
        elif fn == "start work, look in later":  # (payload: the work's length per run)
            seconds = job.payload[len(runs(self.log)) - 1]
            assert self.lifecycle.track_alarm_work(tracked_sleep, self.log, job.id, seconds)
            return nj.Reschedule(nj.now() + 5)
        return None


def runs(log: list[Any]) -> list[tuple[str, float, str]]:
    """(job id, time, fn) of each run in the log."""
    return [(e[0], e[2], e[3]) for e in log if e[1] == "run"]


def stored_alarm(rt: nj.Runtime) -> float | None:
    found = engine.stored_alarm(rt, Worker.namespace, "o")
    return None if found is None else found[0] - EPOCH


def options(hung_timeout: float = LONG, **more: Any) -> dict[str, Any]:
    return {"id": "s", "singleflight": True, "hung_timeout": hung_timeout, **more}


async def test_a_job_pushed_again_after_it_completed_waits_for_its_tracked_work(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The run at 0 starts work (0 - 100) and completes: the row is deleted. Pushed
    again at 10, due now, the job is held by that work and runs when it ends."""
    env: dict[str, Any] = {"log": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Worker, "o")
            await obj.push("start work", payload=100, **options())
            await trio.sleep(10)
            assert await obj.job_ids() == []  # (completed while its work goes on)
            await obj.push("note", **options())
            await trio.sleep(40)  # to 50
            assert runs(env["log"]) == [("s", 0, "start work")]
            # In flight since 0: the alarm counts from started + hung_timeout.
            assert stored_alarm(rt) == LONG
            await trio.sleep(100)  # to 150
            assert runs(env["log"]) == [("s", 0, "start work"), ("s", 100, "note")]
            assert ("s", "work ended", 100) in env["log"]
            assert stored_alarm(rt) is None


async def test_a_job_pushed_again_beside_hung_work_runs_at_its_hung_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """As above with hung_timeout=20: the work that started at 0 counts as hung at 20,
    and the pushed job runs then (job:hung_reset), not at 10."""
    env: dict[str, Any] = {"log": []}
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            rt.events.add_listener(events.append)
            obj = rt.get(Worker, "o")
            await obj.push("start work", payload=100, **options(hung_timeout=20))
            await trio.sleep(10)
            await obj.push("note", **options(hung_timeout=20))
            await trio.sleep(40)  # to 50
            assert runs(env["log"]) == [("s", 0, "start work"), ("s", 20, "note")]
            [reset] = [e for e in events if e.type == "job:hung_reset"]
            assert (reset.time - EPOCH, reset.data["id"], reset.data["age"]) == (20, "s", 20)


async def test_a_dead_letter_requeued_waits_for_the_tracked_work_of_its_last_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The last attempt (at 0) starts work (0 - 100) and fails: a dead letter. Requeued
    at 10, due now, the job is held by that work and runs when it ends."""
    env: dict[str, Any] = {"log": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Worker, "o")
            await obj.push("start work, then fail", payload=100,
                           **options(retry=nj.RetryOptions(max_attempts=1)))
            await trio.sleep(10)
            assert await obj.job_ids() == []
            assert await obj.requeue("s") is True
            await trio.sleep(40)  # to 50
            assert runs(env["log"]) == [("s", 0, "start work, then fail")]
            await trio.sleep(60)  # to 110
            # (its work ended at 100, the requeued run started more work then)
            assert runs(env["log"]) == [("s", 0, "start work, then fail"),
                                        ("s", 100, "start work, then fail")]


async def test_another_owners_job_of_a_reused_id_is_not_held_by_that_work(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The work belongs to the host's job ``s``; a capability's job ``s`` pushed after
    the host's completed is another job (an owner sees only its own jobs): it runs at
    once."""
    env: dict[str, Any] = {"log": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Worker, "o")
            await obj.push("start work", payload=100, **options())
            await trio.sleep(10)
            await obj.push_other("s")
            await trio.sleep(1)
            assert runs(env["log"]) == [("s", 0, "start work"), ("s", 10, "other")]


async def test_work_that_ends_first_leaves_the_job_held_by_the_work_that_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two runs' work of one job, the later ending first: the job stays held by the
    earlier, which goes on. Run 1 at 0 starts work (0 - 100); counted hung at 20
    (hung_timeout=20), run 2 starts work (20 - 30). Pushed again at 22 with
    hung_timeout=1000, the job must not run when the work of run 2 ends (30), beside
    the work of run 1: it runs when that ends (100)."""
    env: dict[str, Any] = {"log": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Worker, "o")
            await obj.push("start work, look in later", payload=[100, 10],
                           **options(hung_timeout=20))
            await trio.sleep(21)
            assert runs(env["log"]) == [("s", 0, "start work, look in later"),
                                        ("s", 20, "start work, look in later")]
            await obj.push("note", **options())
            await trio.sleep(39)  # to 60
            assert ("s", "work ended", 30) in env["log"]
            assert runs(env["log"])[2:] == []
            await trio.sleep(50)  # to 110
            assert runs(env["log"])[2:] == [("s", 100, "note")]


class Beat(nj.DurableObject):
    """An exclusive single-flight heartbeat: each run starts 10 s of tracked work and
    yields. ``on_alarm`` counts alarm runs, and disables the alarms past 100 of them so
    that a hot loop (which never lets virtual time move) ends."""

    namespace = "tests.test_singleflight_tracked_work.Beat"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.env["runs"].append(rel())

        async def work() -> None:
            await trio.sleep(10)

        self.lifecycle.track_alarm_work(work)
        return nj.YIELD

    async def on_alarm(self) -> None:
        self.env["alarms"].append(rel())
        if len(self.env["alarms"]) > 100:
            await self.lifecycle.disable_alarms()

    async def push(self) -> None:
        await self.lifecycle.jobs.push("beat", id="beat", time=EPOCH + 10, singleflight=True,
                                       exclusive=True)


async def test_an_exclusive_single_flight_job_in_flight_does_not_spin_the_alarm(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # An in-flight single-flight job counts from started + hung_timeout, an exclusive
    # one too: due and in flight, it must not re-fire the alarm at once (101 alarm runs
    # at one instant before).
    env: dict[str, Any] = {"runs": [], "alarms": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            await rt.get(Beat, "b").push()
            await trio.sleep(15)
            # One run at 10; its work goes on until 20, so nothing wakes the object
            # before then (its alarm is at started + hung_timeout = 40, or the work's end).
            assert env["runs"] == [10]
            assert len(env["alarms"]) == 1
            stored = engine.stored_alarm(rt, Beat.namespace, "b")
            assert stored is not None and stored[0] - EPOCH == 40
            await trio.sleep(10)
            # The work ended at 20 (its marker cleared, the alarm re-armed): the next beat.
            assert env["runs"] == [10, 20]
            assert env["alarms"] == [10, 20]
