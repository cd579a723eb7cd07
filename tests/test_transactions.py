"""Interleavings of a running job with calls that write or hold a storage.transaction()
(found by review): a job's outcome and writes stay together, a rolled-back push never
runs, a call's push is never undone by a job's rollback, attempts are counted."""

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


class Host(nj.DurableObject):
    namespace = "tests.test_transactions.Host"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def run(self, ref: ByRef) -> ByRef:
        return await run_held(self, ref)  # (see ``inside``)

    async def on_job(self, ctx: nj.JobContext) -> Any:
        self.env["runs"].append((ctx.job.id, nj.now() - EPOCH, ctx.attempt))
        handler: Handler | None = self.env.get(ctx.job.fn)
        return None if handler is None else await handler(self, ctx)


async def _push(o: Host, job_id: str, **kw: Any) -> None:
    await o.lifecycle.jobs.push(kw.pop("fn", "h"), id=job_id, **kw)


async def test_an_outcome_never_lands_in_a_call_block_that_rolls_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def job(o: Host, ctx: nj.JobContext) -> None:
        o.ctx.storage.put("n", o.ctx.storage.get("n", 0) + 1)
        await trio.sleep(2)

    env: dict[str, Any] = {"runs": [], "h": job}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1))
        await trio.sleep(1.5)  # J runs (asleep)

        async def block(o: Host) -> None:
            with o.ctx.storage.transaction():
                o.ctx.storage.put("x", 1)
                await trio.sleep(5)  # J finishes meanwhile
                raise ValueError("the block rolls back")

        with pytest.raises(ValueError):
            await inside(obj, block)
        await trio.sleep(200)

        async def state(o: Host) -> Any:
            return o.ctx.storage.get("n"), o.lifecycle.jobs.list(), o.ctx.storage.get("x")

        assert await inside(obj, state) == (1, [], None)
    assert env["runs"] == [("J", 1, 1)]  # once: its outcome committed with its write


async def test_a_push_rolled_back_with_its_block_never_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env: dict[str, Any] = {"runs": []}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")

        async def block(o: Host) -> None:
            with o.ctx.storage.transaction():
                await _push(o, "Y")  # due now: the alarm fires while the block is open
                await trio.sleep(5)
                raise ValueError("roll back the push")

        with pytest.raises(ValueError):
            await inside(obj, block)
        await trio.sleep(10)
        assert await inside(obj, lambda o: _list(o)) == []
    assert env["runs"] == []


async def _list(o: Host) -> list[str]:
    return [job.id for job in o.lifecycle.jobs.list()]


async def test_a_failing_job_never_undoes_a_calls_push(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def job(o: Host, ctx: nj.JobContext) -> None:
        if ctx.attempt > 1:
            return
        await _push(o, "X", fn="x", delay=1000, payload="from job")
        await trio.sleep(2)  # a call pushes X meanwhile
        o.ctx.storage.put("a", 1)
        raise RuntimeError("job fails")

    env: dict[str, Any] = {"runs": [], "h": job}
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1))
        await trio.sleep(1.5)
        await inside(obj, lambda o: _push(o, "X", fn="x", delay=1000, payload="from call"))

        async def state(o: Host) -> Any:
            found = o.lifecycle.jobs.get("X")
            return None if found is None else found.payload, o.ctx.storage.get("a")

        await trio.sleep(5)
        assert await inside(obj, state) == ("from call", None)


async def test_a_job_failing_while_a_call_block_is_open_counts_its_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def job(o: Host, ctx: nj.JobContext) -> None:
        await trio.sleep(2)
        if ctx.attempt == 1:
            raise RuntimeError("job fails")

    env: dict[str, Any] = {"runs": [], "h": job}
    retry = nj.RetryOptions(max_attempts=3, base_delay=1.0, jitter=False)
    async with nj.open_runtime(engine.location, env=env) as rt:
        obj = rt.get(Host, "o")
        await inside(obj, lambda o: _push(o, "J", delay=1, retry=retry))
        await trio.sleep(1.5)

        async def block(o: Host) -> None:
            with o.ctx.storage.transaction():
                o.ctx.storage.put("x", 1)
                await trio.sleep(5)

        await inside(obj, block)
        await trio.sleep(50)
    # Attempt 1 failed at 3 and waited for the block (to 6.5); attempt 2 ran 1 s later.
    assert [(job_id, attempt) for job_id, _, attempt in env["runs"]] == [("J", 1), ("J", 2)]
