"""Adversarial review of DESIGN.md §3 "Long work and memory limits" and §2 "Stopping".

Each test states a promise of the design; an ``xfail(strict=True)`` marks one the code
breaks today (the reason names what goes wrong). Everything runs under ``autojump_clock``
with the fake memory probe of ``test_breaker``.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH
from test_breaker import HANG, Breaker, Env, hog, runtime

import nursery_jobs as nj


class Ticker(Breaker):
    """A Breaker whose ``on_alarm`` starts leaky tracked work once per activation."""

    namespace = "tests.test_review_limits.Ticker"

    async def on_alarm(self) -> None:
        if getattr(self, "_started", False):
            return

        async def leak() -> None:
            await trio.sleep(1)
            self.env.go_over()
            await trio.sleep_forever()

        self._started = True
        assert self.lifecycle.track_alarm_work(leak)


async def tick(obj: Breaker, ctx: nj.JobContext) -> Any:
    return nj.Reschedule(nj.now() + 20)


@pytest.mark.xfail(strict=True, reason=(
    "DESIGN §3: a clean alarm run clears the breaker only when quiescent (no tracked work"
    " outstanding), but tracked work started from on_alarm (no job) is not in"
    " Lifecycle.tracked, so every run clears the count and a leak in on_alarm work is"
    " struck 1, 1, 1, ... and never sealed"))
async def test_on_alarm_tracked_work_outstanding_keeps_the_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env({"tick": tick})
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Ticker, "o")
            await obj.push("tick", id="t", time=EPOCH + 10)
            await trio.sleep(100)
            # Three alarm runs, each leaving its on_alarm work outstanding, each reset by
            # that work: consecutive resets, so strikes 1, 2 and then the seal.
            strikes = [e[2:] for e in env.hooks() if e[0] == "event"]
            assert strikes[:3] == [(1, False), (2, False), (3, True)], strikes
