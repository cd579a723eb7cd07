"""The files engine's catalog checkpoint loop: it checkpoints the catalog's WAL in a
lull once it has grown, and sleeps while the catalog is quiet (it once looked every
second: ~176,000 passes over two virtual days of a cron test)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs._engines.files import _engine as files_engine
from nursery_jobs._engines.files._catalog import Catalog
from nursery_jobs._engines.files._engine import FilesEngine


class Later(nj.DurableObject):
    namespace = "tests.catalog.Later"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def later(self, delay: float) -> None:
        await self.lifecycle.jobs.push("run", delay=delay)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        return None


async def test_a_quiet_catalog_is_not_looked_at(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    with trio.fail_after(3 * 3600):  # (virtual seconds)
        async with nj.open_runtime(tmp_path, idle_timeout=86400.0) as rt:
            engine = rt.engine
            assert isinstance(engine, FilesEngine)
            await rt.get(Later, "a").later(7200)  # an alarm two hours out
            await trio.sleep(2.5)  # the passes of the writes above (and of the opening)
            before = engine.catalog_passes()
            await trio.sleep(3600)
            assert engine.catalog_passes() == before
            # A write wakes it: one pass a second later.
            await rt.get(Later, "b").later(7200)
            await trio.sleep(1.5)
            assert engine.catalog_passes() == before + 1


async def test_a_grown_wal_is_checkpointed_in_a_lull_then_the_loop_sleeps(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(files_engine, "CHECKPOINT_WAL_BYTES", 1)
    checkpoints: list[str] = []
    real = Catalog.checkpoint

    def counted(path: str) -> None:
        checkpoints.append(path)  # (in a worker thread)
        real(path)

    monkeypatch.setattr(Catalog, "checkpoint", staticmethod(counted))
    with trio.fail_after(3 * 3600):
        async with nj.open_runtime(tmp_path, idle_timeout=86400.0) as rt:
            await rt.get(Later, "a").later(7200)  # no alarm within a second: a lull
            await trio.sleep(3)
            # The checkpoint runs in a worker thread, which the virtual clock does not
            # wait for: give it real time, blocking the run loop so that the clock
            # cannot jump meanwhile.
            for _ in range(400):
                if checkpoints:
                    break
                time.sleep(0.005)  # noqa: ASYNC251
            assert len(checkpoints) >= 1
            await trio.sleep(30)  # (the opening's and the push's passes may each take one)
            time.sleep(0.3)  # noqa: ASYNC251
            await trio.lowlevel.checkpoint()
            done = len(checkpoints)
            await trio.sleep(3600)
            assert len(checkpoints) == done  # nothing written since: nothing to do
