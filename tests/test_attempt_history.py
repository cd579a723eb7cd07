"""A job's failed attempts are kept (``nj_attempts``: when, how long, the error), the last
five of each, for a queued job and for its dead letter; a job that then succeeds, is
cancelled, requeued or discarded takes its history with it; a job that never fails
writes none. Read as the operator's faces read them (``RuntimeSource.detail``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from conftest import EPOCH, engine

import nursery_jobs as nj
from nursery_jobs._ops._inspect import AttemptInfo
from nursery_jobs._ops._offline import requeue_offline, requeue_postgres
from nursery_jobs._ops._offline_shared import requeue_shared
from nursery_jobs._ops._queries import _read_attempts
from nursery_jobs.testing import run_until_idle


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


class Flaky(nj.DurableObject):
    """``fail:N`` jobs raise on their first N attempts (taking 0.5 s each), then pass;
    ``hang:N`` jobs then run until cancelled."""

    namespace = "tests.test_attempt_history.Flaky"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def cancel(self, job_id: str) -> bool:
        return await self.lifecycle.jobs.cancel(job_id)

    @nj.interleave
    async def cancel_running(self, job_id: str) -> bool:
        # (without the object's turn, which the alarm run holds: the run is cancelled)
        return await self.lifecycle.jobs.cancel(job_id)

    @nj.interleave
    async def attempts_now(self) -> list[int]:
        """The attempts kept, read beside a running job (no turn)."""
        return sorted(a.attempt for found in _read_attempts(self.lifecycle.store.conn).values()
                      for a in found)

    async def requeue(self, job_id: str) -> None:
        await self.lifecycle.requeue(job_id)

    async def discard(self, job_id: str) -> None:
        await self.lifecycle.discard(job_id)

    async def attempts(self) -> dict[str, list[dict[str, Any]]]:
        # (as dicts: a call's result is a copy through the codec, which carries the
        # public records only)
        found = _read_attempts(self.lifecycle.store.conn)
        return {job_id: [attrs.asdict(a) for a in attempts]
                for (_, job_id), attempts in found.items()}

    async def dead(self) -> list[Any]:
        return self.lifecycle.dead_letters()

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn.startswith(("fail:", "hang:")) and ctx.attempt <= int(ctx.job.fn[5:]):
            await trio.sleep(0.5)
            raise ValueError(f"attempt {ctx.attempt} of {ctx.job.id}")
        if ctx.job.fn.startswith("hang:"):  # then runs until cancelled
            await trio.sleep_forever()
        return None


def retry(n: int) -> nj.RetryOptions:
    return nj.RetryOptions(max_attempts=n, base_delay=10.0, max_delay=10.0, jitter=False)


async def history(rt: nj.Runtime, object_id: str) -> dict[str, list[AttemptInfo]]:
    """The object's attempt history as the operator's faces read it, from its database
    (on PostgreSQL the working copy, whose rows ship as they are)."""
    found = await rt.get(Flaky, object_id).attempts()
    return {job_id: [AttemptInfo(**a) for a in attempts] for job_id, attempts in found.items()}


async def settle(rt: nj.Runtime, seconds: float) -> None:
    await trio.sleep(seconds)
    await run_until_idle(rt)


async def test_failed_attempts_are_kept_the_last_five(autojump_clock: trio.abc.Clock) -> None:
    async with nj.open_runtime(engine.location) as rt:
        flaky = rt.get(Flaky, "f")
        start = trio.current_time()
        await flaky.push("fail:9", id="dies", retry=retry(7))
        await flaky.push("fine", id="fine")
        await settle(rt, 200)
        (kept,) = (await history(rt, "f")).values()
        assert [a.attempt for a in kept] == [3, 4, 5, 6, 7]
        assert [a.error for a in kept] == [f"ValueError: attempt {n} of dies"
                                           for n in (3, 4, 5, 6, 7)]
        # Attempt n started 10.5 s after attempt n - 1 (0.5 s running, 10 s backoff).
        assert [a.started - EPOCH - start for a in kept] == [21.0, 31.5, 42.0, 52.5, 63.0]
        assert [a.seconds for a in kept] == [0.5] * 5
        assert [d.job.id for d in (await flaky.dead())] == ["dies"]

        requeued = trio.current_time()
        await flaky.requeue("dies")  # a fresh start: the old history goes
        await settle(rt, 200)
        again = (await history(rt, "f"))["dies"]
        assert [a.attempt for a in again] == [3, 4, 5, 6, 7]
        assert [a.started - EPOCH - requeued for a in again] == [21.0, 31.5, 42.0, 52.5, 63.0]
        await flaky.discard("dies")
        assert (await history(rt, "f")) == {}


async def test_a_job_that_succeeds_or_is_cancelled_takes_its_history(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with nj.open_runtime(engine.location) as rt:
        flaky = rt.get(Flaky, "f")
        await flaky.push("fail:2", id="recovers", retry=retry(5))
        await flaky.push("fail:9", id="cancelled", retry=retry(5))
        await settle(rt, 15)
        assert {k: [a.attempt for a in v] for k, v in (await history(rt, "f")).items()} == {
            "recovers": [1, 2], "cancelled": [1, 2]}
        await settle(rt, 15)  # attempt 3 of "recovers" passes
        assert list(await history(rt, "f")) == ["cancelled"]
        assert await flaky.cancel("cancelled")
        assert (await history(rt, "f")) == {}


async def test_jobs_that_never_fail_write_no_history(autojump_clock: trio.abc.Clock) -> None:
    async with nj.open_runtime(engine.location) as rt:
        flaky = rt.get(Flaky, "f")
        for n in range(20):
            await flaky.push("fine", id=f"j{n}")
        await run_until_idle(rt)
        assert (await history(rt, "f")) == {}


async def test_a_running_job_cancelled_takes_its_history(autojump_clock: trio.abc.Clock) -> None:
    # jobs.cancel of a job while it runs (its third attempt) deleted the job but kept
    # its attempt rows: the history of a job that no longer exists, kept for good.
    async with nj.open_runtime(engine.location) as rt:
        flaky = rt.get(Flaky, "f")
        await flaky.push("hang:2", id="hangs", retry=retry(5))
        await trio.sleep(25)  # attempts 1 and 2 failed; attempt 3 runs (from 21 s)
        assert await flaky.attempts_now() == [1, 2]
        with trio.fail_after(5):
            assert await flaky.cancel_running("hangs")
        assert (await history(rt, "f")) == {}

async def test_a_job_replaced_by_a_push_of_its_id_starts_afresh(
    autojump_clock: trio.abc.Clock,
) -> None:
    # A push of the same id replaces the job with attempts 0: the old job's history
    # went on showing as the new one's, and stayed for good once the new one passed at
    # its first attempt (only a job that failed before forgot its rows).
    async with nj.open_runtime(engine.location) as rt:
        flaky = rt.get(Flaky, "f")
        await flaky.push("fail:9", id="x", retry=retry(5))
        await settle(rt, 15)
        assert [a.attempt for a in (await history(rt, "f"))["x"]] == [1, 2]
        await flaky.push("fine", id="x", delay=50.0)
        assert (await history(rt, "f")) == {}  # the new job has failed no attempt
        await settle(rt, 60)
        assert (await history(rt, "f")) == {}


async def test_a_dead_letter_requeued_offline_starts_afresh(
    autojump_clock: trio.abc.Clock, tmp_path: Path,
) -> None:
    # ``nursery-jobs requeue`` (a stopped data directory, or PostgreSQL) moved the row
    # back with attempts 0 but kept the letter's attempt rows: its next failure
    # overwrote attempt 1 and showed the old attempt 2 beside it.
    where = engine.durable(tmp_path)
    async with nj.open_runtime(where) as rt:
        await rt.get(Flaky, "f").push("fail:9", id="dies", retry=retry(2))
        await settle(rt, 20)
        assert [a.attempt for a in (await history(rt, "f"))["dies"]] == [1, 2]
    now = EPOCH + trio.current_time()
    if engine.name == "shared":
        requeue_shared(where.removeprefix("shared:"), Flaky.namespace, "f", "dies",
                       owner="host", now=now)
    elif isinstance(where, str):
        requeue_postgres(where, Flaky.namespace, "f", "dies", owner="host", now=now)
    else:
        requeue_offline(where, Flaky.namespace, "f", "dies", owner="host", now=now)
    async with nj.open_runtime(where) as rt:
        await rt.get(Flaky, "f").attempts()  # (wakes it: the requeued job runs)
        await trio.sleep(1)  # its attempt 1 failed; attempt 2 is due in 10 s
        assert [a.attempt for a in (await history(rt, "f"))["dies"]] == [1]
