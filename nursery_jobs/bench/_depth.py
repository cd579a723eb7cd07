"""Depth rows of ``nursery-jobs bench --depth``: the rates of the first N jobs of a
queue N, 200k and 1,000,000 deep, side by side (issue 26: depth must not cost).

Each depth gets a fresh object, paused, filled with due no-op jobs in batched
transactions. Then, in that order: pushes of N more jobs (batched in one transaction)
and of up to 5,000 (one commit each) into the deep queue, an hour out; and, from the
resume, dispatch of the first N due jobs. ``prioritized``: one job of priority 1, an
hour out, is queued first (a Queue with priorities: it made every due read sort the
queue). Rates are wall-clock jobs/s; ``cpu`` figures are the process's CPU seconds per
job (``time.process_time``), steadier on a shared machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Final

import trio

import nursery_jobs as nj

from ._harness import BenchObject, _Bench

# Pushed per transaction while filling (one giant transaction would hold its whole
# WAL; a user filling a queue batches).
_FILL_BATCH: Final = 10_000
_PER_CALL_N: Final = 5_000
DEPTHS: Final = (200_000, 1_000_000)


class DepthObject(BenchObject):
    """The benchmark object, filled while paused."""

    namespace = "nursery_jobs.bench.depth"

    async def fill_due(self, n: int) -> None:
        with self.ctx.storage.transaction():
            for i in range(n):
                await self.lifecycle.jobs.push("noop", payload=i)

    async def push_prioritized(self) -> None:
        await self.lifecycle.jobs.push("noop", payload=-1, priority=1, delay=3600)

    async def checkpoint(self) -> None:
        """Empty the WAL, so no measurement inherits a checkpoint of the fill's pages (a
        cost per byte written, not per depth: it fell inside some windows and not others)."""
        self.ctx.storage.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def pause(self) -> None:
        await self.lifecycle.pause()

    async def resume(self) -> None:
        await self.lifecycle.resume()


async def _one_depth(path: Path, depth: int, n: int, prioritized: bool) -> dict[str, float]:
    bench = _Bench()
    bench.target = n
    out: dict[str, float] = {"depth": depth}
    async with nj.open_runtime(path, env=bench, durability="normal") as rt:
        obj = rt.get(DepthObject, "deep")
        await obj.pause()  # nothing runs while the queue fills
        if prioritized:
            await obj.push_prioritized()
        for start in range(0, depth, _FILL_BATCH):
            await obj.fill_due(min(_FILL_BATCH, depth - start))
        await obj.checkpoint()
        # Pushes into the deep queue (an hour out: they stay queued behind the rest).
        c0, t0 = time.process_time(), time.perf_counter()
        await obj.push_batched(n)
        out["push_batched_per_s"] = n / (time.perf_counter() - t0)
        out["push_batched_cpu_us"] = (time.process_time() - c0) / n * 1e6
        per_call = min(n, _PER_CALL_N)
        c0, t0 = time.process_time(), time.perf_counter()
        await obj.push_each(per_call)
        out["push_per_call_per_s"] = per_call / (time.perf_counter() - t0)
        out["push_per_call_cpu_us"] = (time.process_time() - c0) / per_call * 1e6
        # Dispatch of the first n due jobs.
        c0, t0 = time.process_time(), time.perf_counter()
        await obj.resume()
        await bench.done.wait()
        out["dispatch_per_s"] = n / (time.perf_counter() - t0)
        out["dispatch_cpu_us"] = (time.process_time() - c0) / n * 1e6
    return out


def depth_rows(directory: Path, n: int, depths: tuple[int, ...] = DEPTHS,
               progress: Any = None, *, prioritized: bool = False) -> list[dict[str, float]]:
    """One row per depth (the first at ``n`` deep): push and dispatch rates of ``n`` jobs."""
    rows = []
    for depth in (n, *(d for d in depths if d != n)):
        rows.append(trio.run(_one_depth, directory / f"nj-depth-{depth}", depth, n,
                             prioritized))
        if progress is not None:
            progress.step(f"nursery_jobs at depth {depth:,}")
    return rows


def render_depth(rows: list[dict[str, float]]) -> list[str]:
    """The depth table: each depth's rates and CPU per job, and their ratio to the
    shallowest's (dispatch / push batched / push per call)."""
    base = rows[0]
    head = (f"{'queue depth':<12}{'dispatch':>11}{'cpu':>8}{'push batched':>14}{'cpu':>8}"
            f"{'push per call':>15}{'cpu':>8}{'vs first (d/pb/pc)':>21}")
    lines = [head, "-" * len(head)]
    for row in rows:
        ratios = "/".join(f"{row[k] / base[k]:.0%}" for k in
                          ("dispatch_per_s", "push_batched_per_s", "push_per_call_per_s"))
        lines.append(
            f"{int(row['depth']):<12,}{row['dispatch_per_s']:>9,.0f}/s"
            f"{row['dispatch_cpu_us']:>6.1f}µs{row['push_batched_per_s']:>12,.0f}/s"
            f"{row['push_batched_cpu_us']:>6.1f}µs{row['push_per_call_per_s']:>13,.0f}/s"
            f"{row['push_per_call_cpu_us']:>6.1f}µs{ratios:>21}")
    return lines
