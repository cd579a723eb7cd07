"""A property test of the Lifecycle queue against a simple in-memory model.

Hypothesis draws a sequence of operations — push (stable ids from a small pool, or
anonymous), cancel, reschedule, clock advance, runtime restart (with or without time
passing while it is down) — and runs it in one Trio run under ``MockClock`` autojump,
on a fresh data directory. The model predicts every job run: which push, at which virtual
time, in which order. So the test checks that nothing is lost (every pushed job that is
neither cancelled nor replaced runs exactly once), nothing runs early (or, while the
runtime is up, late), and order is kept (due jobs run in (time, first-push) order).

Operations happen at half-second offsets and jobs are due on whole seconds, so no
operation ever races a job run at the same virtual time.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from nursery_jobs import _clock

EPOCH = 1_800_000_000.0
IDS = ("a", "b", "c", "d")


class Modelled(nj.DurableObject):
    namespace = "tests.test_lifecycle_model.Modelled"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, job_id: str | None, time: float, token: int) -> nj.Job:
        return await self.lifecycle.jobs.push("run", id=job_id, time=time, payload=token)

    async def cancel(self, job_id: str) -> bool:
        return await self.lifecycle.jobs.cancel(job_id)

    async def reschedule(self, job_id: str, time: float) -> bool:
        return await self.lifecycle.jobs.reschedule(job_id, time)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.ctx.env.append((ctx.job.id, ctx.job.payload, nj.now() - EPOCH))
        return None


# Operations. Times are whole seconds ahead of the next whole second (never "now").
push_op = st.tuples(st.just("push"), st.sampled_from((None, *IDS)), st.integers(0, 3))
cancel_op = st.tuples(st.just("cancel"), st.sampled_from(IDS))
reschedule_op = st.tuples(st.just("reschedule"), st.sampled_from(IDS), st.integers(0, 3))
advance_op = st.tuples(st.just("advance"), st.sampled_from([1, 2, 3, 5, 8]))
restart_op = st.tuples(st.just("restart"), st.sampled_from([0, 0, 1, 4, 10]))
operations = st.lists(
    st.one_of(push_op, push_op, cancel_op, reschedule_op, advance_op, advance_op, restart_op),
    min_size=15,
    max_size=60,
)


@attrs.define
class Pending:
    token: int
    time: float  # relative to EPOCH
    seq: int  # first push of this id while pending: FIFO among same-time jobs


@attrs.define
class Model:
    now: float = 0.5
    pending: dict[str, Pending] = attrs.Factory(dict)
    runs: list[tuple[str, int, float]] = attrs.Factory(list)
    seq: int = 0

    def push(self, job_id: str, time: float, token: int) -> None:
        old = self.pending.get(job_id)
        if old is not None:
            self.pending[job_id] = Pending(token, time, old.seq)  # replaced in place
        else:
            self.seq += 1
            self.pending[job_id] = Pending(token, time, self.seq)

    def cancel(self, job_id: str) -> bool:
        return self.pending.pop(job_id, None) is not None

    def reschedule(self, job_id: str, time: float) -> bool:
        job = self.pending.get(job_id)
        if job is None:
            return False
        job.time = time
        return True

    def run_until(self, until: float, *, up: bool) -> None:
        """Jobs due by ``until`` run: on time while up, all at ``until`` if down."""
        due = sorted(
            ((p.time, p.seq, job_id, p.token) for job_id, p in self.pending.items()
             if p.time <= until),
        )
        for time, _seq, job_id, token in due:
            self.runs.append((job_id, token, time if up else until))
            del self.pending[job_id]
        self.now = until


async def drive(ops: list[tuple[Any, ...]], path: str) -> None:
    _clock.set_epoch(EPOCH)
    log: list[tuple[str, int, float]] = []
    model = Model()
    token = 0
    async with trio.open_nursery() as nursery:
        # A runtime is opened and closed by a task of its own, so "restart" can close it.
        async def serve(task_status: trio.TaskStatus[tuple[nj.Runtime, trio.Event]]) -> None:
            done = trio.Event()
            async with nj.open_runtime(path, env=log, idle_timeout=3) as rt:
                task_status.started((rt, done))
                await done.wait()

        rt, stop = await nursery.start(serve)
        await trio.sleep(0.5)  # operations at k + 0.5, jobs due on whole seconds
        for op in ops:
            obj = rt.get(Modelled, "m")
            kind = op[0]
            if kind == "push":
                _, job_id, ahead = op
                token += 1
                when = math.ceil(model.now) + ahead
                job = await obj.push(job_id, EPOCH + when, token)
                if job_id is None:
                    assert job.id not in IDS
                else:
                    assert job.id == job_id
                model.push(job.id, when, token)
            elif kind == "cancel":
                assert await obj.cancel(op[1]) == model.cancel(op[1])
            elif kind == "reschedule":
                when = math.ceil(model.now) + op[2]
                assert await obj.reschedule(op[1], EPOCH + when) == model.reschedule(op[1], when)
            elif kind == "advance":
                await trio.sleep(op[1])
                model.run_until(model.now + op[1], up=True)
            else:  # restart, down for op[1] seconds
                stop.set()
                await trio.testing.wait_all_tasks_blocked()
                down = op[1]
                if down:
                    await trio.sleep(down)
                rt, stop = await nursery.start(serve)
                model.run_until(model.now + down, up=False)
            assert trio.current_time() == model.now
            # Let a reopened runtime run what is overdue (same virtual time).
            await trio.testing.wait_all_tasks_blocked()
            assert log == model.runs, (op, log, model.runs)
        # Drain: everything still pending runs on time.
        await trio.sleep(20)
        model.run_until(model.now + 20, up=True)
        assert log == model.runs
        assert model.pending == {}
        stop.set()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_queue_matches_the_model(ops: list[tuple[Any, ...]]) -> None:
    path = tempfile.mkdtemp(prefix="nj-model-")
    try:
        trio.run(drive, ops, path, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        shutil.rmtree(path, ignore_errors=True)
