"""A job that raises a BaseException is that job's failure, never a poison pill for the
runtime (issue: faults are contained, point 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH

import nursery_jobs as nj

NO_JITTER = nj.RetryOptions(max_attempts=2, base_delay=1.0, jitter=False)


class Custom(BaseException):
    """A BaseException subclass of the user's own."""


def make_cancelled() -> BaseException:
    return trio.Cancelled._create()  # what a job could build itself


RAISES: dict[str, Any] = {
    "GeneratorExit": GeneratorExit,
    "custom BaseException": Custom,
    "a Cancelled it made": make_cancelled,
    "a BaseExceptionGroup": lambda: BaseExceptionGroup("many", [Custom(), ValueError()]),
}


class Poison(nj.DurableObject):
    namespace = "tests.test_faults_jobs.Poison"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env["runs"].append((ctx.job.id, ctx.attempt, nj.now() - EPOCH))
        if ctx.job.fn == "bad":
            raise self.env["raise"]()

    async def push(self, job_id: str, fn: str, at: float = 0) -> None:
        await self.lifecycle.jobs.push(fn, id=job_id, time=EPOCH + at, retry=NO_JITTER)

    async def letters(self) -> list[tuple[str, str, int]]:
        return [(d.job.id, d.reason, d.attempts) for d in self.lifecycle.dead_letters()]

    async def jobs(self) -> list[tuple[str, float]]:
        return [(j.id, j.time - EPOCH) for j in self.lifecycle.jobs.list()]


@pytest.mark.parametrize("what", RAISES)
async def test_a_base_exception_from_a_job_is_its_own_failure(
    autojump_clock: trio.testing.MockClock, what: str
) -> None:
    env: dict[str, Any] = {"runs": [], "raise": RAISES[what]}
    with trio.fail_after(1000):
        async with nj.open_runtime(env=env) as rt:
            obj = rt.get(Poison, "p")
            await obj.push("bad", "bad", at=1)
            await obj.push("good", "good", at=1)
            await trio.sleep(10)
            # Two attempts (1 s apart), then a dead letter; the job behind it ran at once.
            assert env["runs"] == [("bad", 1, 1), ("good", 1, 1), ("bad", 2, 2)]
            [(job_id, reason, attempts)] = await obj.letters()
            assert (job_id, reason, attempts) == ("bad", "failed", 2)
            await obj.push("after", "good", at=20)  # the runtime still runs
            await trio.sleep(20)
            assert env["runs"][-1] == ("after", 1, 20)


async def test_keyboard_interrupt_from_a_job_stops_once_with_a_strike_and_seals_at_three(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env: dict[str, Any] = {"runs": [], "raise": KeyboardInterrupt}
    async with nj.open_runtime(tmp_path, env=env) as rt:
        await rt.get(Poison, "p").push("bad", "bad", at=1)
        await rt.get(Poison, "p").push("good", "good", at=500)
    for death in (1, 2, 3):
        with pytest.raises(KeyboardInterrupt):  # plain, not a group
            with trio.fail_after(2000):
                async with nj.open_runtime(tmp_path, env=env):
                    await trio.sleep_forever()
        assert env["runs"][-1][0] == "bad" and len(env["runs"]) == death
        if death < 3:
            async with nj.open_runtime(tmp_path, env=env) as rt:
                jobs = dict(await rt.get(Poison, "p").jobs())
                # Delayed by its crash strikes (30, 60 s), no attempt used.
                assert jobs["bad"] == pytest.approx(env["runs"][-1][2] + 30 * death)
    with trio.fail_after(2000):
        async with nj.open_runtime(tmp_path, env=env) as rt:
            letters = await rt.get(Poison, "p").letters()
            assert letters == [("bad", "crash", 0)]
            await trio.sleep(1000)
    assert [r[0] for r in env["runs"]] == ["bad", "bad", "bad", "good"]
