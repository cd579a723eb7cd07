"""Jobs on probation for the steering tests: two objects whose jobs each took their
process down once (a ``KeyboardInterrupt`` raised by the job: a crash strike, then the
runtime stops), so on the next start both run on probation, one at a time per runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import EPOCH, engine

import nursery_jobs as nj


def rel() -> float:
    return nj.now() - EPOCH


class Suspect(nj.DurableObject):
    """Its job ``j`` sleeps ``payload`` seconds, or stops the process if ``env["die"]``
    names this object."""

    namespace = "tests.probation_support.Suspect"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        env = self.env
        env["log"].append((self.ctx.id, "start", rel()))
        if env.get("die") == self.ctx.id:
            env["die"] = None
            raise KeyboardInterrupt  # the job's own act: a crash strike
        await trio.sleep(ctx.job.payload)
        env["log"].append((self.ctx.id, "end", rel()))

    async def push(self, at: float, seconds: float) -> None:
        await self.lifecycle.jobs.push("j", id="j", time=EPOCH + at, payload=seconds)

    @nj.interleave
    async def cancel_now(self) -> tuple[bool, float]:
        return await self.lifecycle.jobs.cancel("j"), rel()

    async def pause(self) -> float:
        await self.lifecycle.pause()
        return rel()

    async def resume(self) -> float:
        await self.lifecycle.resume()
        return rel()

    async def jobs(self) -> list[str]:
        return [job.id for job in self.lifecycle.jobs.list()]

    async def ping(self) -> float:
        return rel()


async def strike_two(tmp_path: Path, env: dict[str, Any]) -> None:
    """Object x's job (100 s long) takes its process down at t=1, then y's (1 s) at t=2:
    each has one crash strike and is due again 30 s later (x at 31, y at 32)."""
    env.setdefault("log", [])
    for name, at, seconds in (("x", 1, 100), ("y", 2, 1)):
        env["die"] = name
        with pytest.raises(KeyboardInterrupt):
            async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
                await rt.get(Suspect, name).push(at, seconds)
                await trio.sleep_forever()
    assert env["log"] == [("x", "start", 1.0), ("y", "start", 2.0)]
