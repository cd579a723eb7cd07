"""The alarm a cold run writes (DESIGN §2, Turns; §3, Durability): the fallback while it
runs, then the next due job's time (or none), with no write in between; a due job that
``on_start`` pushes still gets the backup alarm. Files layout, whose index the writes are
spied on; exact virtual times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH

import nursery_jobs as nj
from nursery_jobs._engines.files._engine import CatalogEngine

HANG = 100_000


class Cold(nj.DurableObject):
    namespace = "tests.test_cold_run_alarm.Cold"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, job_id: str, time: float) -> None:
        await self.lifecycle.jobs.push("f", id=job_id, time=time)

    async def on_start(self) -> None:
        if self.ctx.env.get("push_on_start"):
            self.ctx.env["push_on_start"] = False
            await self.lifecycle.jobs.push("f", id="from-start")

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.ctx.env["ran"].append((ctx.job.id, nj.now() - EPOCH))
        self.ctx.env["alarm_while_running"].append(self.ctx.env["index"]())
        return None


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float | None]]:
    """Every alarm write that reaches the index: (object id, time relative to EPOCH)."""
    log: list[tuple[str, float | None]] = []
    original = CatalogEngine.write_alarm

    def spy(self: CatalogEngine, namespace: str, object_id: str, time: float | None,
            retry: int) -> None:
        log.append((object_id, None if time is None else time - EPOCH))
        original(self, namespace, object_id, time, retry)

    monkeypatch.setattr(CatalogEngine, "write_alarm", spy)
    return log


def _env() -> dict[str, Any]:
    return {"ran": [], "alarm_while_running": [], "push_on_start": False,
            "index": lambda: None}


async def _down_while_due(data: Path, env: dict[str, Any], **later: float) -> None:
    """Push "a" (due at +10) and the jobs of ``later`` (id: time), then stay down while
    "a" falls due (until +100)."""
    async with nj.open_runtime(data, env=env) as rt:
        for job_id, time in {"a": EPOCH + 10, **later}.items():
            await rt.get(Cold, "o").push(job_id, time)
    await trio.sleep(100)


def _watch_index(rt: Any, env: dict[str, Any]) -> None:
    env["index"] = lambda: rt.engine.catalog.get_alarm(Cold.namespace, "o")


async def test_a_cold_run_writes_the_fallback_then_the_next_alarm(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
    writes: list[tuple[str, float | None]],
) -> None:
    env = _env()
    with trio.fail_after(HANG):
        await _down_while_due(tmp_path / "data", env, b=EPOCH + 500)
        writes.clear()
        async with nj.open_runtime(tmp_path / "data", env=env) as rt:
            _watch_index(rt, env)
            await trio.sleep(1)
            assert env["ran"] == [("a", 100)]
            # While "a" ran, the index held the fallback: a death then re-runs the
            # object 30 s later, never at once in a loop.
            assert env["alarm_while_running"] == [(EPOCH + 130, 0)]
            # The fallback, then "b"'s time: nothing between (the Lifecycle's start
            # lowered it to "a"'s time, then the backup raised it again).
            assert writes == [("o", 130), ("o", 500)]


async def test_a_due_job_pushed_by_on_start_gets_the_backup_alarm(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
    writes: list[tuple[str, float | None]],
) -> None:
    env = _env()
    with trio.fail_after(HANG):
        await _down_while_due(tmp_path / "data", env)
        env["push_on_start"] = True
        async with nj.open_runtime(tmp_path / "data", env=env) as rt:
            _watch_index(rt, env)
            await trio.sleep(1)
            assert env["ran"] == [("a", 100), ("from-start", 100)]
            assert env["alarm_while_running"] == [(EPOCH + 130, 0)] * 2
            assert writes[-1] == ("o", None)
