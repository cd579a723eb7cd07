"""Objects rows of ``nursery-jobs bench --objects`` (issue 26: one durable object per
task): objects/s through the whole runtime for each layout, beside that layout's floor
(``_objects_floor``: plain sqlite3, the same schema, no runtime around it).

- create: ``rt.get(Task, id).start()`` — a new object whose Lifecycle pushes one job for
  an hour later (durable when the call returns), one caller;
- cold fire: a fresh runtime (a new process) on the same data, every job overdue: from
  ``open_runtime`` until the last job has run (its completion committed as the runtime
  closes);
- memory: RSS per resident object (what creating them added, over the objects still in
  memory at the end) and per dormant object (a runtime opened over N objects whose
  alarms are an hour away, against one over an empty directory).

Each phase runs in a process of its own (``python -m nursery_jobs.bench._objects
--child``), so a run starts cold. The fire phase moves the wall clock on by two hours
(``_clock.set_wall_clock``) so that every job is overdue without waiting.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import nursery_jobs as nj
from nursery_jobs import _clock

from . import _objects_floor as floor
from ._progress import Progress

LAYOUTS = ("files", "shared")
SIZES = (1_000, 10_000)
_FIRE_OFFSET = 7200.0
_done = {"n": 0, "target": 0}
_all_done: list[trio.Event] = []


class Task(nj.DurableObject):
    namespace = "nursery_jobs.bench.Task"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def start(self) -> None:
        await self.lifecycle.jobs.push("run", delay=3600, payload={"n": 1})

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        _done["n"] += 1
        if _done["n"] == _done["target"]:
            _all_done[-1].set()
        return None


def location(layout: str, root: str) -> str:
    return root if layout == "files" else f"{layout}:{root}"


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


async def _create(loc: str, n: int) -> dict[str, float]:
    async with nj.open_runtime(loc) as rt:
        before = _rss()
        start = time.perf_counter()
        for i in range(n):
            await rt.get(Task, f"task-{i:07d}").start()
        wall = time.perf_counter() - start
        resident = rt.statistics().active_objects
        return {"wall": wall, "resident": resident,
                "rss_per_resident": (_rss() - before) / max(1, resident)}


async def _fire(loc: str, n: int) -> dict[str, float]:
    _done["n"], _done["target"] = 0, n
    _all_done.append(trio.Event())
    start = time.perf_counter()
    async with nj.open_runtime(loc):
        with trio.fail_after(600):
            await _all_done[-1].wait()
    return {"wall": time.perf_counter() - start}


async def _dormant(loc: str) -> dict[str, float]:
    async with nj.open_runtime(loc) as rt:
        await trio.sleep(0.5)  # the timer has read the index and sleeps to the next alarm
        return {"rss": _rss(), "active": rt.statistics().active_objects}


def _count_activations() -> list[int]:
    """Count objects' activations (host starts, failed ones included) from now on: a
    burst of due alarms must activate each object once (issue 26 found ~1.8 at 10k)."""
    from nursery_jobs._core._host import ObjectHost

    count, run = [0], ObjectHost.run

    async def counted(self: ObjectHost, **kwargs: object) -> None:
        count[0] += 1
        await run(self, **kwargs)  # type: ignore[arg-type]

    ObjectHost.run = counted  # type: ignore[method-assign]
    return count


def _child(phase: str, loc: str, n: int) -> None:
    """One phase in this (fresh) process; prints its figures, CPU time and activations
    per object included."""
    activations = _count_activations()
    cpu = time.process_time()
    if phase == "create":
        out = trio.run(_create, loc, n)
    elif phase == "fire":
        _clock.set_wall_clock(lambda: time.time() + _FIRE_OFFSET)
        out = trio.run(_fire, loc, n)
    else:
        out = trio.run(_dormant, loc)
    print(json.dumps({**out, "cpu": time.process_time() - cpu,
                      "activations": activations[0] / max(1, n)}))


def _phase(phase: str, loc: str, n: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-m", "nursery_jobs.bench._objects", "--child", phase, loc, str(n)],
        capture_output=True, text=True, check=False, timeout=1800,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"objects bench, {phase} of {n} at {loc}: exit"
                           f" {proc.returncode}: {tail}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _summary(n: int, runs: list[dict[str, float]]) -> dict[str, float]:
    rates = sorted(n / r["wall"] for r in runs)
    return {"per_s": statistics.median(rates), "min": rates[0], "max": rates[-1],
            "cpu_s_per_1k": statistics.median(1000 * r["cpu"] / n for r in runs),
            "activations": statistics.median(r["activations"] for r in runs)}


def _floor(layout: str, base: Path, n: int, repeats: int) -> dict[str, Any]:
    """The layout's floor: ``files`` as is, ``shared`` with a pooled working copy per object
    and commits of 100 objects (``_objects_floor``)."""
    name = "files" if layout == "files" else "shared+copy"
    return floor.measure(name, str(base), n, "NORMAL", 100, repeats, "pool")


def object_rows(directory: Path, sizes: tuple[int, ...], repeats: int,
                progress: Progress, layouts: tuple[str, ...] = LAYOUTS) -> list[dict[str, Any]]:
    """Create, cold fire and memory for each size and layout, with the floor beside."""
    rows = []
    for n in sizes:
        for layout in layouts:
            created, fired, dormant = [], [], []
            for _ in range(repeats):
                root = tempfile.mkdtemp(prefix="nj-objects-", dir=directory)
                try:
                    empty = location(layout, os.path.join(root, "empty"))
                    loc = location(layout, os.path.join(root, "data"))
                    created.append(_phase("create", loc, n))
                    base_rss = _phase("dormant", empty, 0)["rss"]
                    dormant.append(_phase("dormant", loc, n)["rss"] - base_rss)
                    fired.append(_phase("fire", loc, n))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
            rows.append({
                "layout": layout, "objects": n, "create": _summary(n, created),
                "fire": _summary(n, fired),
                "rss_per_resident": statistics.median(r["rss_per_resident"] for r in created),
                "resident": created[0]["resident"],
                "rss_dormant_total": statistics.median(dormant),
                "rss_per_dormant": statistics.median(dormant) / n,
                "floor": _floor(layout, directory, n, repeats)})
            progress.step(f"objects: {layout}, {n:,}")
    return rows


def _dormant_cell(row: dict[str, Any]) -> str:
    # Below a MiB in all, two processes' RSS differ by more than the objects weigh.
    if abs(row["rss_dormant_total"]) < 1 << 20:
        return "< noise"
    return f"{row['rss_per_dormant']:,.0f}"


def render_objects(rows: list[dict[str, Any]]) -> list[str]:
    head = (f"{'layout':<8}{'objects':>9}{'create':>10}{'floor':>10}{'ratio':>7}"
            f"{'cold fire':>11}{'floor':>10}{'ratio':>7}{'KiB/resident':>14}{'B/dormant':>11}")
    lines = [head, "-" * len(head)]
    for row in rows:
        create, fire, fl = row["create"], row["fire"], row["floor"]
        lines.append(
            f"{row['layout']:<8}{row['objects']:>9,}{create['per_s']:>8,.0f}/s"
            f"{fl['create']['per_s']:>8,.0f}/s{create['per_s'] / fl['create']['per_s']:>7.2f}"
            f"{fire['per_s']:>9,.0f}/s{fl['fire']['per_s']:>8,.0f}/s"
            f"{fire['per_s'] / fl['fire']['per_s']:>7.2f}"
            f"{row['rss_per_resident'] / 1024:>14,.1f}{_dormant_cell(row):>11}")
    lines.append("(runtime: one caller, median of the runs; CPU s per 1k objects, and"
                 " activations per object in the cold fire: "
                 + "; ".join(f"{r['layout']} {r['objects']:,} create"
                             f" {r['create']['cpu_s_per_1k']:.2f}, fire"
                             f" {r['fire']['cpu_s_per_1k']:.2f},"
                             f" {r['fire']['activations']:.2f}" for r in rows) + ")")
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
