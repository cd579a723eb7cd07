"""Exactly-once local effects (DESIGN.md section 3) around a running job: calls, tracked
work and storage.transaction() blocks beside it. Each test pins a promise that the
shared-transaction model of earlier releases broke (the docstrings say how); under
turns (section 2) a call or a task waits for the job's turn, so most of them now hold
by construction, and they stay as the proof."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH, engine
from held_calls import ByRef, inside, run_held

import nursery_jobs as nj


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


Handler = Callable[[Any, nj.JobContext], Awaitable[Any]]
RETRY = nj.RetryOptions(max_attempts=3, base_delay=1.0, max_delay=1.0, jitter=False)


class Host(nj.DurableObject):
    namespace = "tests.test_exactly_once.Host"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(
            self, completion_group=self.env.get("group", 64)
        )

    async def run(self, ref: ByRef) -> ByRef:
        return await run_held(self, ref)  # (see ``inside``)

    async def on_job(self, ctx: nj.JobContext) -> Any:
        self.env["runs"].append((ctx.job.id, nj.now() - EPOCH, ctx.attempt))
        handler: Handler | None = self.env.get(ctx.job.fn)
        return None if handler is None else await handler(self, ctx)

    async def on_alarm(self) -> None:
        hook = self.env.get("on_alarm")
        if hook is not None:
            await hook(self)


def _bump(o: Host, key: str = "n") -> None:
    o.ctx.storage.put(key, o.ctx.storage.get(key, 0) + 1)


async def _push(o: Host, job_id: str, **kw: Any) -> None:
    await o.lifecycle.jobs.push(kw.pop("fn", "h"), id=job_id, **kw)


async def _get(o: Host, key: str = "n") -> Any:
    return o.ctx.storage.get(key, 0)


def _alarm(rt: nj.Runtime) -> float | None:
    found = engine.stored_alarm(rt, Host.namespace, "o")
    return None if found is None else found[0] - EPOCH


async def _count_then_fail_once(o: Host, ctx: nj.JobContext) -> None:
    """A counter job: +1, then (first attempt only) an await and a failure."""
    _bump(o)
    if ctx.attempt == 1:
        await trio.sleep(2)
        raise RuntimeError("attempt 1 fails after its write")


# -- a call commits the group while a job that wrote is awaiting ----------------------------


async def test_a_calls_rearm_never_commits_half_a_running_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """jobs.rearm() from a call (the Scheduler's dedupe hit does the same) flushes the
    group with JobStore.rearm -> flush -> commit_group, which RELEASEs the running job's
    savepoint: the job's write is committed though the job has not finished. The job
    then fails; its rollback finds no savepoint and the write stays; the retry counts
    again. (output_gate waits for a dirty job for exactly this reason.)"""
    env: dict[str, Any] = {"runs": [], "h": _count_then_fail_once}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1, retry=RETRY))
        await trio.sleep(1.5)  # J: n=1 written, asleep
        await inside(obj, lambda o: o.lifecycle.jobs.rearm())
        await trio.sleep(50)  # J fails at 3, retried at 4
        assert [r[2] for r in env["runs"]] == [1, 2]
        assert await inside(obj, _get) == 1  # exactly once; got 2


class Sched(Host):
    namespace = "tests.test_exactly_once_edges.Sched"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.scheduler = nj.Scheduler(callbacks={"tick": self._tick})
        self.lifecycle.use(self.scheduler)

    async def _tick(self, payload: Any, schedule: Any) -> None:
        pass

    async def every(self) -> None:
        await self.scheduler.every(1000, "tick")  # idempotent by content


async def test_a_scheduler_dedupe_hit_never_commits_half_a_running_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The same through the public Scheduler: ``every()`` called again (the documented
    on-every-activation pattern) while a host job has written and awaits."""
    env: dict[str, Any] = {"runs": [], "h": _count_then_fail_once}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Sched, "o")
        await obj.every()
        await inside(obj, lambda o: _push(o, "J", delay=1, retry=RETRY))
        await trio.sleep(1.5)
        await obj.every()  # a dedupe hit: jobs.rearm()
        await trio.sleep(50)
        assert [r[2] for r in env["runs"]] == [1, 2]
        assert await inside(obj, _get) == 1


async def test_tracked_work_ending_never_commits_half_a_running_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The heartbeat pattern: job W starts tracked work and reschedules itself; job J
    writes and awaits; W's work ends meanwhile (clear_marker + rearm in
    Lifecycle._tracked_work), which releases J's savepoint and commits the group. J
    fails: its write is not undone and its retry counts again."""

    async def work() -> None:
        await trio.sleep(1)

    async def heartbeat(o: Host, ctx: nj.JobContext) -> Any:
        o.lifecycle.track_alarm_work(work)
        return nj.Reschedule(nj.now() + 1000)

    env: dict[str, Any] = {"runs": [], "w": heartbeat, "h": _count_then_fail_once}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "W", fn="w", delay=1))
        await inside(obj, lambda o: _push(o, "J", delay=1, retry=RETRY))
        await trio.sleep(50)  # W at 1 (work to 2), J at 1 (fails at 3), J again at 4
        assert [(r[0], r[2]) for r in env["runs"]] == [("W", 1), ("J", 1), ("J", 2)]
        assert await inside(obj, _get) == 1  # got 2


async def test_a_calls_write_never_makes_a_failing_jobs_writes_stick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A call writes while a job that wrote awaits. (Sharing the job's transaction, the
    write once ended the job's savepoint: the job's write could no longer be undone, so
    its retry wrote again and the counter ended at 2; later the call was told its write
    was undone.) The call waits for the job's turn: the job fails and is undone alone,
    and the call's write, made after, stands."""
    env: dict[str, Any] = {"runs": [], "h": _count_then_fail_once}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1, retry=RETRY))
        await trio.sleep(1.5)
        await inside(obj, lambda o: trio_put(o, "other", 1))
        assert trio.current_time() == 3  # it waited for J's turn
        await trio.sleep(50)
        assert [r[2] for r in env["runs"]] == [1, 2]
        assert await inside(obj, _get) == 1  # J exactly once
        assert await inside(obj, lambda o: _get(o, "other")) == 1


async def test_a_calls_write_beside_a_job_that_then_succeeds_is_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The other way the job ends: it succeeds, and the call's write is kept with it
    (the call returns once the job has finished and the group is committed)."""

    async def count_slowly(o: Host, ctx: nj.JobContext) -> None:
        _bump(o)
        await trio.sleep(2)

    env: dict[str, Any] = {"runs": [], "h": count_slowly}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1))
        await trio.sleep(1.5)
        await inside(obj, lambda o: trio_put(o, "other", 1))
        assert trio.current_time() == 3  # the output gate waited for J
        assert await inside(obj, _get) == 1
        assert await inside(obj, lambda o: _get(o, "other")) == 1
        assert [r[0] for r in env["runs"]] == ["J"]


async def trio_put(o: Host, key: str, value: Any) -> None:
    o.ctx.storage.put(key, value)


# -- the alarm after a run that ends while a call's block is open ---------------------------


async def test_the_alarm_is_rearmed_after_a_run_that_ended_inside_a_calls_block(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """J reschedules itself 2 s out. While the host's on_alarm awaits, a call opens
    storage.transaction() and awaits in it: the run ends, its rearm finds the group
    uncommittable (a user block is open) and returns, leaving the run's fallback alarm
    (now + 30 s). The call's output gate commits the group but nobody re-arms: J runs
    30 s late."""

    async def again(o: Host, ctx: nj.JobContext) -> Any:
        if ctx.attempt == 1 and len(o.env["runs"]) == 1:
            return nj.Reschedule(nj.now() + 2)
        return None

    async def on_alarm(o: Host) -> None:
        if len(o.env["runs"]) == 1:
            await trio.sleep(1)

    env: dict[str, Any] = {"runs": [], "h": again, "on_alarm": on_alarm}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1))
        await trio.sleep(1.5)  # J ran at 1 (-> 3); on_alarm sleeps to 2

        async def block(o: Host) -> None:
            with o.ctx.storage.transaction():
                o.ctx.storage.put("x", 1)
                await trio.sleep(1)  # the run ends at 2 while this is open

        await inside(obj, block)  # ends at 2.5
        await trio.sleep(100)
        assert [(r[0], r[1]) for r in env["runs"]] == [("J", 1), ("J", 3)]




# -- supersession and replay that outlive a rollback ------------------------------------------


async def test_a_rolled_back_push_of_the_running_id_does_not_run_it_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A call pushes the running job's id inside storage.transaction() and the block
    rolls back: the push never happened, yet JobStore._touch already set ``superseded``
    and nothing clears it. J's clean outcome is discarded (finish -> clean), its row
    stays, _run_due readmits it: J runs a second time and counts twice."""

    async def job(o: Host, ctx: nj.JobContext) -> None:
        await trio.sleep(2)
        _bump(o)

    env: dict[str, Any] = {"runs": [], "h": job}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1))
        await trio.sleep(1.5)  # J asleep, nothing written yet

        async def block(o: Host) -> None:
            with o.ctx.storage.transaction():
                await _push(o, "J", delay=1000, payload="replacement")
                raise ValueError("roll the replacement back")

        with pytest.raises(ValueError):
            await inside(obj, block)
        await trio.sleep(100)
        assert await inside(obj, lambda o: _list(o)) == []
        assert env["runs"] == [("J", 1, 1)]  # got a second run of J at 3
        assert await inside(obj, _get) == 1


async def _list(o: Host) -> list[str]:
    return [job.id for job in o.lifecycle.jobs.list()]


async def test_a_push_the_job_rolled_back_itself_is_not_replayed_when_it_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A job pushes X inside its own storage.transaction(), which rolls back; the job
    then fails. JobStore.fail replays every mutation recorded in the job savepoint's
    generation — including the one its own block already undid: X appears and runs."""

    async def job(o: Host, ctx: nj.JobContext) -> None:
        try:
            with o.ctx.storage.transaction():
                await _push(o, "X", fn="x")
                raise ValueError("changed my mind")
        except ValueError:
            pass
        if ctx.attempt == 1:
            raise RuntimeError("attempt 1 fails")

    env: dict[str, Any] = {"runs": [], "h": job}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1, retry=RETRY))
        await trio.sleep(50)
        assert [r[0] for r in env["runs"]] == ["J", "J"]  # got J, X, J
        assert await inside(obj, lambda o: _list(o)) == []


async def test_a_requeue_refused_inside_the_group_keeps_its_dead_letter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """requeue of a dead letter whose id a pending job holds raises JobOwnershipError
    after JobTable.unbury deleted the letter. Outside a transaction ``atomic`` rolls the
    delete back; while an alarm run's group is open (a job awaits) ``writing`` joins the
    group with a nullcontext, the raise undoes nothing, and the group commits the
    delete: the dead letter is gone."""

    async def bad(o: Host, ctx: nj.JobContext) -> None:
        raise RuntimeError("bad")

    async def slow(o: Host, ctx: nj.JobContext) -> None:
        await trio.sleep(2)

    once = nj.RetryOptions(max_attempts=1)
    env: dict[str, Any] = {"runs": [], "bad": bad, "slow": slow}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "X", fn="bad", delay=1, retry=once))
        await trio.sleep(1.5)  # X buried
        await inside(obj, lambda o: _push(o, "X", fn="bad", delay=1000, retry=once))
        await inside(obj, lambda o: _push(o, "S", fn="slow", delay=1))
        await trio.sleep(1.5)  # S runs (asleep): the group is open

        async def requeue(o: Host) -> Any:
            return await o.lifecycle.requeue("X")

        with pytest.raises(nj.JobOwnershipError, match="is queued again") as info:
            await inside(obj, requeue)
        assert (info.value.job_id, info.value.owner, info.value.holder) == ("X", "host", None)
        await trio.sleep(10)
        letters = await inside(obj,
            lambda o: trio_value([d.job.id for d in o.lifecycle.dead_letters()]))
        assert letters == ["X"]  # got []


async def trio_value(value: Any) -> Any:
    await trio.lowlevel.checkpoint()
    return value


# -- on_job_error awaits while a call holds storage.transaction() -----------------------------


class Queued(nj.DurableObject):
    namespace = "tests.test_exactly_once_edges.Queued"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)
        self.queue = nj.Queue(callbacks={"work": self._work}, on_error=self._on_error,
                              retry=nj.RetryOptions(max_attempts=1))
        self.lifecycle.use(self.queue)

    async def _work(self, payload: Any, item: Any) -> None:
        self.env["runs"].append(nj.now() - EPOCH)
        raise RuntimeError("the item fails")

    async def _on_error(self, error: Exception, item: Any) -> None:
        self.env["errors"].append(nj.now() - EPOCH)
        await trio.sleep(1)  # e.g. report the failure somewhere

    async def enqueue(self) -> None:
        await self.queue.push("work", id="I")

    async def block(self) -> None:
        with self.ctx.storage.transaction():
            self.ctx.storage.put("x", 1)
            await trio.sleep(2)

    async def state(self) -> Any:
        return [d.job.id for d in self.lifecycle.dead_letters()], self.queue.list()


async def test_a_failed_item_whose_on_error_awaits_beside_a_calls_block_runs_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The item fails its last attempt; Queue.on_job_error awaits the user's on_error;
    a call opens storage.transaction() meanwhile. AlarmRunner._failed then calls
    store.bury without waiting for the block (as _run_job and _job_failed do): its
    check_write raises StorageError in the alarm run, the dead letter is never written
    and the attempt never recorded, and the retried alarm runs the item again."""
    env: dict[str, Any] = {"runs": [], "errors": []}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Queued, "o")
        await obj.enqueue()
        await trio.sleep(0.5)  # the item ran and failed at 0; on_error sleeps to 1
        await obj.block()  # 0.5 .. 2.5
        await trio.sleep(100)
        assert env["runs"] == [0]  # got a second run after the alarm's retry
        assert env["errors"] == [0]
        assert await obj.state() == (["I"], [])



class Later(nj.Capability):
    """A capability whose on_job_error awaits, then reschedules the job 100 s out."""

    id = "later"

    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env

    async def on_job(self, ctx: nj.JobContext) -> Any:
        self.env["runs"].append((ctx.job.id, nj.now() - EPOCH, ctx.attempt))
        raise RuntimeError("fails")

    async def on_job_error(self, ctx: nj.JobContext, error: Exception) -> Any:
        await trio.sleep(1)
        return nj.Reschedule(nj.now() + 100)


class WithLater(Host):
    namespace = "tests.test_exactly_once_edges.WithLater"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.later = Later(self.env)
        self.lifecycle.use(self.later)


async def test_an_on_job_error_outcome_never_lands_in_a_calls_block_that_rolls_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """AlarmRunner._failed applies on_job_error's Reschedule with store.finish, which
    (unlike bury) does not pass check_write, and nobody waits for the call's open block:
    the UPDATE lands inside the call's savepoint, the block rolls back, the outcome is
    gone and the job runs again at once instead of 100 s later."""
    env: dict[str, Any] = {"runs": []}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(WithLater, "o")

        async def push(o: WithLater) -> None:
            await o.later.lifecycle.jobs.push("f", id="L", delay=1,
                                              retry=nj.RetryOptions(max_attempts=1))

        await inside(obj, push)
        await trio.sleep(1.5)  # L failed at 1; on_job_error sleeps to 2

        async def block(o: Host) -> None:
            with o.ctx.storage.transaction():
                o.ctx.storage.put("x", 1)
                await trio.sleep(1)  # the outcome is applied at 2, in here
                raise ValueError("the block rolls back")

        with pytest.raises(ValueError):
            await inside(obj, block)
        await trio.sleep(50)
        assert env["runs"] == [("L", 1, 1)]  # got a second run long before 102




async def test_a_block_of_tracked_work_that_outlives_the_run_is_committed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """On_alarm tracks work that holds a storage.transaction() across the end of the
    run. (Sharing the run's connection, the run's final flush was skipped while the
    block was open, nothing committed the group afterwards, and the object's close
    rolled it back: the block's write, which its task saw commit, was lost, and job J,
    which had finished cleanly, ran again.) The work takes a turn of its own for its
    block: it waits for the run to end, and its block commits alone."""

    async def work(o: Host) -> None:
        async with o.ctx.turn():
            with o.ctx.storage.transaction():
                o.ctx.storage.put("w", 1)
                await trio.sleep(1)

    async def on_alarm(o: Host) -> None:
        if len(o.env["runs"]) == 1 and not o.env.get("tracked"):
            o.env["tracked"] = o.lifecycle.track_alarm_work(work, o)
            await trio.sleep(0.5)  # the work opens its block meanwhile

    async def job(o: Host, ctx: nj.JobContext) -> None:
        _bump(o)

    env: dict[str, Any] = {"runs": [], "h": job, "on_alarm": on_alarm}
    async with nj.open_runtime(engine.location, env=env, idle_timeout=5) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1))
        await trio.sleep(100)  # J at 1, the work to 2; idle from 2, evicted at 7
        assert env["tracked"] is True
        assert await inside(obj, lambda o: _get(o, "w")) == 1  # got 0
        assert [r[0] for r in env["runs"]] == ["J"]  # got J again at 31



async def test_disable_alarms_undone_by_a_failing_job_does_not_strand_its_jobs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A job calls lifecycle.disable_alarms() and then fails. The durable flag
    (nj_meta) was written in the job's savepoint and is rolled back with it, but
    JobStore.disable already set ``disabled`` in memory and deleted the alarm: the
    object's jobs (the job's own retry, K) never run, though storage says alarms are on."""

    async def job(o: Host, ctx: nj.JobContext) -> None:
        if ctx.attempt == 1:
            await o.lifecycle.disable_alarms()
            raise RuntimeError("teardown failed half-way")

    env: dict[str, Any] = {"runs": [], "h": job}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1, retry=RETRY))
        await inside(obj, lambda o: _push(o, "K", delay=10))
        await trio.sleep(100)
        ran = [(r[0], r[2]) for r in env["runs"]]
        durable = await inside(obj,
            lambda o: trio_value(o.lifecycle.store.meta("alarms_disabled")))
        # The disable was undone with the job that asked: its jobs run (K, with the
        # same handler, disables and fails once too). (Got once: ran [J 1], flag 0.)
        assert ran == [("J", 1), ("J", 2), ("K", 1), ("K", 2)] and durable == 0


async def test_a_failing_jobs_first_write_through_a_kept_storage_db_is_rolled_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A job whose first write goes through a ``storage.db`` (sqlite-utils) the object
    kept from an earlier call, then fails: the write is undone with it, as a
    ``storage`` write is (each raw statement asks for the turn and joins the job's
    savepoint; taking the handle inside the job did so before, a kept one did not), so
    its retry finds the table as it was and the row lands exactly once."""
    if engine.name in ("postgres", "shared"):
        pytest.skip(f"the {engine.name} engine refuses raw SQL (storage.db)")

    async def insert_then_fail_once(o: Host, ctx: nj.JobContext) -> None:
        o.env["db"]["notes"].insert({"job": ctx.job.id, "attempt": ctx.attempt})
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails after its write")

    async def notes(o: Host) -> list[dict[str, Any]]:
        return list(o.ctx.storage.db["notes"].rows)

    env: dict[str, Any] = {"runs": [], "h": insert_then_fail_once}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        async def keep_db(o: Host) -> None:
            o.env["db"] = o.ctx.storage.db
            o.env["db"]["notes"].create({"job": str, "attempt": int})

        await inside(obj, keep_db)
        await inside(obj, lambda o: _push(o, "J", delay=1, retry=RETRY))
        await trio.sleep(50)
        assert [r[2] for r in env["runs"]] == [1, 2]
        assert await inside(obj, notes) == [{"job": "J", "attempt": 2}]
