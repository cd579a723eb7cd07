"""Promises of DESIGN.md sections 3 and 4 at their edges: the alarm time rule for
exclusive jobs across a resume, the bound on dead letters when burials share a time,
the order of ``jobs.list()``, and the error types of the Lifecycle's options.

Every timer test runs under ``autojump_clock`` and asserts exact virtual times relative
to ``EPOCH``. Each test that shows a broken promise is marked ``xfail(strict=True)``
with the section and what goes wrong.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH, engine

import nursery_jobs as nj
from nursery_jobs import _clock


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


# A generous virtual-time bound: under autojump a hang jumps here and fails the test.
HANG = 100_000
NO_RETRY = nj.RetryOptions(max_attempts=1)


def rel() -> float:
    return nj.now() - EPOCH


class Side(nj.Capability):
    """A capability whose jobs are logged like the host's."""

    id = "side"

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.host.ctx.env["runs"].append(("side", ctx.job.id, rel()))

    async def push(self, job_id: str, **kwargs: Any) -> None:
        await self.lifecycle.jobs.push("run", id=job_id, **kwargs)


class Obj(nj.DurableObject):
    """A Lifecycle object that logs its jobs' runs in ``env["runs"]``; a job whose fn is
    ``"fail"`` raises."""

    namespace = "tests.test_semantics_review.Obj"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.side = Side()
        self.lifecycle = nj.Lifecycle.install(self, **self.env.get("install", {})).use(self.side)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env["runs"].append(("host", ctx.job.id, rel()))
        if ctx.job.fn == "fail":
            raise RuntimeError(f"{ctx.job.id} failed")
        if ctx.job.fn == "oom":
            await trio.sleep(1)
            raise MemoryError(f"{ctx.job.id} ran out of memory")

    async def push(self, fn: str, job_id: str, **kwargs: Any) -> None:
        await self.lifecycle.jobs.push(fn, id=job_id, **kwargs)

    async def push_side(self, job_id: str, **kwargs: Any) -> None:
        await self.side.push(job_id, **kwargs)

    async def push_in_transaction(self, fn: str, job_id: str, **kwargs: Any) -> None:
        with self.ctx.storage.transaction():
            self.ctx.storage.put("pushed", job_id)
            await self.lifecycle.jobs.push(fn, id=job_id, **kwargs)

    async def pause(self, owner: Any = None) -> None:
        await self.lifecycle.pause(owner)

    async def resume(self, owner: Any = None) -> None:
        await self.lifecycle.resume(owner)

    async def wake_at(self, time: float) -> None:
        """Set the alarm behind the Lifecycle's back (an early wake, as a stale alarm
        or a fallback gives)."""
        self.lifecycle.claim.set(time)

    async def listed(self) -> list[str]:
        return [job.id for job in self.lifecycle.jobs.list()]

    async def letters(self) -> list[str]:
        return [d.job.id for d in self.lifecycle.dead_letters()]


def new_env(**more: Any) -> dict[str, Any]:
    return {"runs": [], **more}


def alarm_of(rt: nj.Runtime, object_id: str = "o") -> float | None:
    found = engine.stored_alarm(rt, Obj.namespace, object_id)
    return None if found is None else found[0] - EPOCH


# -- exclusive jobs and the alarm time rule ------------------------------------------------


async def test_resuming_an_owner_with_an_exclusive_job_makes_it_decide_the_alarm(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = new_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Obj, "o")
            await obj.pause("side")
            await obj.push("run", "plain", time=EPOCH + 10)
            await obj.push_side("x", time=EPOCH + 100, exclusive=True)  # paused: no say
            assert alarm_of(rt) == 10
            await obj.resume("side")
            assert alarm_of(rt) == 100  # raised once the resume committed
            await trio.sleep(200)
            # Pending and no longer paused, the exclusive job alone decides when the
            # object wakes: the plain job does not run before it.
            assert env["runs"] == [("host", "plain", 100), ("side", "x", 100)]


async def test_an_exclusive_job_pushed_in_a_transaction_holds_back_an_earlier_plain_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = new_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Obj, "o")
            await obj.push("run", "plain", time=EPOCH + 10)
            await obj.push_in_transaction("run", "x", time=EPOCH + 100, exclusive=True)
            assert alarm_of(rt) == 100  # raised once the block committed
            await trio.sleep(200)
            assert env["runs"] == [("host", "plain", 100), ("host", "x", 100)]


async def test_an_exclusive_job_holds_back_an_earlier_plain_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The same pair without a pause: the plain job waits for the exclusive one's alarm.
    env = new_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Obj, "o")
            await obj.push("run", "plain", time=EPOCH + 10)
            await obj.push_side("x", time=EPOCH + 100, exclusive=True)
            assert alarm_of(rt) == 100
            await trio.sleep(200)
            assert env["runs"] == [("host", "plain", 100), ("side", "x", 100)]


async def test_an_early_wake_runs_nothing_while_an_exclusive_job_is_pending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Whatever set the alarm early, the alarm run honours the rule: nothing runs before
    # the exclusive job's time, and the run re-arms for it.
    env = new_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Obj, "o")
            await obj.push("run", "plain", time=EPOCH + 10)
            await obj.push_side("x", time=EPOCH + 100, exclusive=True)
            await obj.wake_at(EPOCH + 20)
            assert alarm_of(rt) == 20
            await trio.sleep(30)
            assert env["runs"] == []
            assert alarm_of(rt) == 100
            await trio.sleep(100)
            assert env["runs"] == [("host", "plain", 100), ("side", "x", 100)]


class Beat(nj.DurableObject):
    """An exclusive single-flight heartbeat: each run starts 10 s of tracked work and
    yields. ``on_alarm`` counts alarm runs, and disables the alarms past 100 of them so
    that a hot loop (which never lets virtual time move) ends."""

    namespace = "tests.test_semantics_review.Beat"

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


# -- cancelling a running task through the capabilities ------------------------------------


class Tasks(nj.Agent):
    """An Agent with a 100 s task; ``stop`` cancels it from an ``@nj.interleave`` method
    (the way DESIGN §3 gives to cancel a running job from a stub call)."""

    namespace = "tests.test_semantics_review.Tasks"

    async def long(self, payload: Any) -> None:
        self.ctx.env["runs"].append(("long", payload, rel()))
        await trio.sleep(100)
        self.ctx.env["runs"].append(("long done", payload, rel()))

    async def on_error(self, error: Exception, task: nj.TaskRecord) -> None:
        self.ctx.env["errors"].append((task.id, rel()))

    @nj.interleave
    async def stop(self, how: str, task_id: str) -> bool | int:
        if how == "dequeue":
            return await self.dequeue(task_id)
        if how == "cancel_schedule":
            return await self.cancel_schedule(task_id)
        assert how == "dequeue_all"
        return await self.dequeue_all()

    async def queue_each(self, *task_ids: str) -> None:
        """Queue a ``long`` task of each id (in one call: none starts before the last
        is queued)."""
        for task_id in task_ids:
            await self.queue("long", task_id, id=task_id)

    async def when(self) -> float:
        """When this call had the object."""
        return rel()

    async def left(self) -> tuple[list[str], list[str]]:
        return [t.id for t in self.list_schedules()], [d.job.id for d in self.dead_letters()]


async def _stop_a_running_task(how: str, kind: str) -> None:
    env: dict[str, Any] = {"runs": [], "errors": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Tasks, "t")
            if kind == "queued":
                await agent.queue("long", "p", id="L")
            else:
                await agent.schedule(0, "long", "p", id="L")
            await trio.sleep(5)
            assert env["runs"] == [("long", "p", 0)]
            assert await agent.stop(how, "L") in (True, 1)
            assert rel() == 5  # at once, not after the run
            await trio.sleep(200)
            assert env["runs"] == [("long", "p", 0)]  # cancelled: it never ended
            assert env["errors"] == []  # no retry, no dead letter, no on_error
            assert await agent.left() == ([], [])


async def test_dequeue_from_an_interleave_method_cancels_a_running_task_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await _stop_a_running_task("dequeue", "queued")


@pytest.mark.parametrize(("how", "kind"), [
    ("cancel_schedule", "scheduled"), ("cancel_schedule", "queued"), ("dequeue_all", "queued"),
])
async def test_cancel_schedule_and_dequeue_all_cancel_a_running_task_at_once(
    autojump_clock: trio.testing.MockClock, how: str, kind: str,
) -> None:
    await _stop_a_running_task(how, kind)


async def test_dequeue_all_from_an_interleave_method_cancels_the_run_and_the_queue_behind_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The run in progress is cancelled at once; the tasks queued behind it are deleted
    # before the alarm run starts the next (it hands the object over after a cancelled
    # job, as after any job).
    env: dict[str, Any] = {"runs": [], "errors": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Tasks, "t")
            await agent.queue_each("A", "B", "C")
            await trio.sleep(5)
            assert env["runs"] == [("long", "A", 0)]
            assert await agent.stop("dequeue_all", "") == 3
            assert rel() == 5
            await trio.sleep(500)
            assert env["runs"] == [("long", "A", 0)]
            assert await agent.left() == ([], [])


async def test_a_call_waiting_behind_a_cancelled_run_goes_before_the_next_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Fairness (DESIGN 2): between two jobs the alarm run hands the object to a waiting
    # call — after a job whose run was cancelled too.
    env: dict[str, Any] = {"runs": [], "errors": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Tasks, "t")
            await agent.queue_each("A", "B")
            await trio.sleep(5)
            served: list[float] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _append(served, agent.when()))
                await trio.sleep(1)  # (the call waits for the object: A's run holds it)
                assert served == []
                assert await agent.stop("dequeue", "A") is True
            assert served == [6]
            await trio.sleep(1)
            assert env["runs"] == [("long", "A", 0), ("long", "B", 6)]


async def _append(to: list[float], call: Any) -> None:
    to.append(await call)


async def test_cancel_schedule_from_an_interleave_method_tells_of_the_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env: dict[str, Any] = {"runs": [], "errors": []}
    events: list[tuple[str, dict[str, Any]]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            rt.events.add_listener(lambda e: events.append((e.type, e.data))
                                   if e.type in ("schedule:cancel", "job:cancelled") else None)
            agent = rt.get(Tasks, "t")
            await agent.schedule(3600, "long", "q", id="later")
            await agent.schedule(0, "long", "p", id="L")
            await trio.sleep(5)
            assert await agent.stop("cancel_schedule", "L") is True
            assert await agent.stop("cancel_schedule", "later") is True
            assert await agent.stop("cancel_schedule", "gone") is False
            assert [(kind, data["id"]) for kind, data in events] == [
                ("job:cancelled", "L"), ("schedule:cancel", "L"), ("schedule:cancel", "later")]
            assert events[1][1]["callback"] == "long"


# -- cron on the day a local hour repeats ----------------------------------------------------

NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def ny_text(t: float) -> str:
    local = dt.datetime.fromtimestamp(t, NEW_YORK)
    return f"{local:%m-%d %H:%M} {local.tzname()}"


class Crons(nj.DurableObject):
    namespace = "tests.test_semantics_review.Crons"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        fired: list[float] = ctx.env

        def tick(payload: Any, schedule: nj.Schedule) -> None:
            fired.append(nj.now())

        self.scheduler = nj.Scheduler({"tick": tick})
        self.lifecycle = nj.Lifecycle.install(self).use(self.scheduler)

    async def cron(self, expr: str) -> float:
        made = await self.scheduler.schedule(expr, "tick", id="c", tz="America/New_York")
        return made.time


async def test_a_cron_made_in_the_repeated_hour_fires_at_the_second_occurrence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 7 November 2027, New York: 02:00 EDT becomes 01:00 EST; 06:10 UTC is 01:10 EST,
    # in the second pass, after 01:30 EDT (05:30 UTC) and before 01:30 EST (06:30 UTC).
    now = dt.datetime(2027, 11, 7, 6, 10, tzinfo=dt.UTC).timestamp()
    _clock.pin_epoch(now - trio.current_time())
    fired: list[float] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=fired) as rt:
            assert ny_text(nj.now()) == "11-07 01:10 EST"
            first = await rt.get(Crons, "c").cron("30 1 * * *")
            assert ny_text(first) == "11-07 01:30 EST"
            await trio.sleep(3600)
            assert [ny_text(t) for t in fired] == ["11-07 01:30 EST"]


# -- dead letters ------------------------------------------------------------------------


async def test_the_oldest_dead_letter_goes_when_burials_share_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = new_env(install={"dead_letter_limit": 2})
    dropped: list[str] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            rt.events.add_listener(
                lambda e: dropped.append(e.data["id"])
                if e.type == "job:dead_letter_dropped" else None)
            obj = rt.get(Obj, "o")
            # Due at the same moment, they run (and fail) in push order: c, b, a.
            for job_id in ("c", "b", "a"):
                await obj.push("fail", job_id, time=EPOCH + 10, retry=NO_RETRY)
            await trio.sleep(20)
            assert [job_id for _, job_id, _ in env["runs"]] == ["c", "b", "a"]
            assert dropped == ["c"]
            assert sorted(await obj.letters()) == ["a", "b"]


async def test_dead_letters_buried_at_the_same_time_list_in_burial_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = new_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Obj, "o")
            for job_id in ("c", "b", "a"):
                await obj.push("fail", job_id, time=EPOCH + 10, retry=NO_RETRY)
            await trio.sleep(20)
            assert await obj.letters() == ["c", "b", "a"]


async def test_a_seal_of_recovery_loop_jobs_keeps_the_dead_letter_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = new_env(install={"dead_letter_limit": 1, "max_alarm_memory_limit_strikes": 1})
    dropped: list[str] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            rt.events.add_listener(
                lambda e: dropped.append(e.data["id"])
                if e.type == "job:dead_letter_dropped" else None)
            obj = rt.get(Obj, "o")
            await obj.push("oom", "r1", time=EPOCH + 10, recovery_loop=True)
            await obj.push("run", "r2", time=EPOCH + 500, recovery_loop=True)
            await trio.sleep(20)
            # The MemoryError at 11 resets the object at its first strike: sealed, both
            # recovery loops go to the dead letters, of which one is kept.
            assert [job_id for _, job_id, _ in env["runs"]] == ["r1"]
            assert await obj.listed() == []
            # Buried in run order, the older burial (r1) goes.
            assert await obj.letters() == ["r2"]
            assert dropped == ["r1"]


# -- listing ---------------------------------------------------------------------------


async def test_jobs_list_is_by_due_time(autojump_clock: trio.testing.MockClock) -> None:
    env = new_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Obj, "o")
            await obj.push("run", "later", delay=3600, priority=5)
            await obj.push("run", "soon", delay=10)
            await obj.push("run", "soon too", delay=10)  # the same time: push order
            assert await obj.listed() == ["soon", "soon too", "later"]


# -- argument errors ---------------------------------------------------------------------


class Configured(nj.DurableObject):
    """Installs a Lifecycle with the options in ``env`` (or uses what ``env`` names)."""

    namespace = "tests.test_semantics_review.Configured"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        options, use = ctx.env
        self.lifecycle = nj.Lifecycle.install(self, **options)
        if use is not None:
            self.lifecycle.use(use)

    async def ping(self) -> str:
        return "pong"


@pytest.mark.parametrize(("options", "use", "named"), [
    ({"max_alarm_memory_limit_strikes": 0}, None, "max_alarm_memory_limit_strikes"),
    ({"completion_group": 0}, None, "completion_group"),
    ({"dead_letter_limit": 0}, None, "dead_letter_limit"),
    ({"rng": "seed"}, None, "rng"),
    ({}, "not a capability", "use"),
])
async def test_a_bad_lifecycle_option_is_a_nursery_jobs_error_naming_it(
    autojump_clock: trio.testing.MockClock, options: dict[str, Any], use: Any, named: str,
) -> None:
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=(options, use)) as rt:
            with pytest.raises(nj.NurseryJobsError, match=named) as caught:
                await rt.get(Configured, "c").ping()
            assert isinstance(caught.value, (ValueError, TypeError))


def test_a_lifecycle_host_that_is_no_durable_object_is_a_nursery_jobs_error_naming_it() -> None:
    with pytest.raises(nj.NurseryJobsError, match="host must be a DurableObject") as caught:
        nj.Lifecycle.install("not an object")  # type: ignore[arg-type]
    assert isinstance(caught.value, TypeError)


class Queued(nj.DurableObject):
    namespace = "tests.test_semantics_review.Queued"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.queue = nj.Queue({"cb": lambda payload, item: None})
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def filter_by(self, how: str, callback: Any) -> tuple[str, bool, int]:
        """(error type or "no error", whether it is a typed argument error, items left)."""
        await self.queue.push("cb", 1, id="i")
        try:
            if how == "cancel_all":
                await self.queue.cancel_all(callback)
            else:
                self.queue.list(callback)
        except Exception as exc:
            typed = isinstance(exc, nj.NurseryJobsError) and isinstance(
                exc, (ValueError, TypeError)) and "callback" in str(exc)
            return type(exc).__name__, typed, len(self.queue.list())
        return "no error", False, len(self.queue.list())


@pytest.mark.parametrize("bad", [5, b"cb", ""])
@pytest.mark.parametrize("how", ["cancel_all", "list"])
async def test_a_queue_callback_filter_that_is_no_name_is_refused(
    autojump_clock: trio.testing.MockClock, how: str, bad: Any,
) -> None:
    async with nj.open_runtime(engine.location) as rt:
        error, typed, left = await rt.get(Queued, "q").filter_by(how, bad)
        assert typed, error
        assert left == 1
