"""Edge cases found in review: staged (group-committed) outcomes survive a failed
on_alarm and a rolled-back user transaction; an exclusive push never raises the alarm
before it commits, and replacing an exclusive job with a plain one lowers it."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH
from held_calls import inside
from test_lifecycle import HANG, Host, alarm, make_env

import nursery_jobs as nj


class FailingOnAlarm(Host):
    """A Host whose ``on_alarm`` raises on the first alarm run only."""

    namespace = "tests.test_review_findings.FailingOnAlarm"

    async def on_alarm(self) -> None:
        self.env.log.append(("on_alarm", self.ctx.id, nj.now() - EPOCH))
        if self.env.state.setdefault("on_alarm_failures", 0) == 0:
            self.env.state["on_alarm_failures"] = 1
            raise RuntimeError("on_alarm failed once")


async def test_failed_on_alarm_does_not_rerun_completed_jobs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A job that completed cleanly (outcome staged, not yet committed) must not run
    again just because the host's ``on_alarm`` raised afterwards: no crash happened."""
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            obj = rt.get(FailingOnAlarm, "o")
            await obj.push("a", id="a", time=EPOCH + 10)
            await trio.sleep(100)  # first run fails in on_alarm; retried 2 s later
            assert [e for e in env.log if e[0] == "on_alarm"] != []
            assert env.ran() == [("a", 10)]
            assert await obj.jobs() == []


async def test_rolled_back_push_does_not_undo_staged_completions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Job ``a`` completes (its delete staged). Job ``b`` then pushes inside a
    ``storage.transaction()`` that rolls back. The push applies ``a``'s staged delete
    inside that transaction and forgets it; the rollback brings ``a`` back, so it runs a
    second time though nothing crashed."""

    async def b(obj: Host, ctx: nj.JobContext) -> Any:
        with pytest.raises(RuntimeError), obj.ctx.storage.transaction():
            await obj.lifecycle.jobs.push("c", id="c", time=EPOCH + 500)
            raise RuntimeError("abort")
        return None

    env = make_env({"b": b})
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("a", id="a", time=EPOCH + 10)
            await obj.push("b", id="b", time=EPOCH + 10)
            await trio.sleep(100)
            assert env.ran() == [("a", 10), ("b", 10)]
            assert await obj.jobs() == []


async def test_rolled_back_exclusive_push_does_not_raise_the_alarm(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An exclusive push inside a transaction that rolls back must not leave the
    alarm raised above a pending job (the job would then run late)."""
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("p", id="p", time=EPOCH + 10)
            assert alarm(rt) == 10

            async def rolled_back(o: Host) -> None:
                with pytest.raises(RuntimeError), o.ctx.storage.transaction():
                    await o.lifecycle.jobs.push("e", id="e", time=EPOCH + 1000,
                                                exclusive=True)
                    raise RuntimeError("abort")

            await inside(obj, rolled_back)
            assert [j.id for j in await obj.jobs()] == ["p"]
            assert alarm(rt) == 10
            await trio.sleep(100)
            assert env.ran() == [("p", 10)]


async def test_replacing_exclusive_job_in_transaction_lowers_the_alarm(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Replacing exclusive job ``x`` (due at 1000) with a plain ``x`` due at 10, inside
    a committed transaction: the push is durable when it returns only if the alarm is
    at or below 10; it stays at 1000 and the job runs 990 s late."""
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("x", id="x", time=EPOCH + 1000, exclusive=True)
            assert alarm(rt) == 1000

            async def replace(o: Host) -> None:
                with o.ctx.storage.transaction():
                    await o.lifecycle.jobs.push("x", id="x", time=EPOCH + 10)

            await inside(obj, replace)
            stored = await obj.get_job("x")
            assert stored is not None and not stored.exclusive and stored.time == EPOCH + 10
            assert alarm(rt) is not None and alarm(rt) <= 10
            await trio.sleep(100)
            assert env.ran() == [("x", 10)]
