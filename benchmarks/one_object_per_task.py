"""One durable object per task (issue 26): objects/s through the whole runtime, for
each layout side by side.

- create: ``rt.get(Task, id).start()`` — a new object whose Lifecycle pushes one job
  (durable when the call returns), ``--concurrency`` callers at once;
- cold fire: a fresh runtime (a new process) on the same data, every job overdue: from
  ``open_runtime`` until the last job has run (its completion committed as the runtime
  closes).

The fire phase moves the wall clock on by two hours (``_clock.set_wall_clock``) so that
every job pushed for one hour ahead is overdue, without waiting. Each figure is the
median of ``--repeats`` runs (range beside it), each in a fresh directory.

Run: python benchmarks/one_object_per_task.py [--sizes 1000,10000] [--layouts files,shared]
     [--concurrency 1] [--repeats 3] [--dir /work/nj-layout-bench] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import trio

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import nursery_jobs as nj  # noqa: E402
from nursery_jobs import _clock  # noqa: E402

DONE = {"n": 0, "target": 0}
ALL_DONE: list[trio.Event] = []


class Task(nj.DurableObject):
    namespace = "bench.Task"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def start(self) -> None:
        await self.lifecycle.jobs.push("run", delay=3600, payload={"n": 1})

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        DONE["n"] += 1
        if DONE["n"] == DONE["target"]:
            ALL_DONE[-1].set()
        return None


def location(layout: str, root: str) -> str:
    return root if layout == "files" else f"{layout}:{root}"


async def create(loc: str, n: int, concurrency: int) -> float:
    async with nj.open_runtime(loc) as rt:
        start = time.perf_counter()

        async def caller(k: int) -> None:
            for i in range(k, n, concurrency):
                await rt.get(Task, f"task-{i:07d}").start()

        async with trio.open_nursery() as nursery:
            for k in range(concurrency):
                nursery.start_soon(caller, k)
        return time.perf_counter() - start


async def fire(loc: str, n: int) -> float:
    DONE["n"], DONE["target"] = 0, n
    ALL_DONE.append(trio.Event())
    start = time.perf_counter()
    async with nj.open_runtime(loc):
        with trio.fail_after(600):
            await ALL_DONE[-1].wait()
    return time.perf_counter() - start


def count_activations() -> list[int]:
    """Count objects' activations (host starts, failed ones included) from now on."""
    from nursery_jobs._core._host import ObjectHost

    count, run = [0], ObjectHost.run

    async def counted(self: ObjectHost, **kwargs: object) -> None:
        count[0] += 1
        await run(self, **kwargs)  # type: ignore[arg-type]

    ObjectHost.run = counted  # type: ignore[method-assign]
    return count


def child(phase: str, loc: str, n: int, concurrency: int) -> None:
    """One phase in this (fresh) process; prints seconds of wall and CPU time, and
    activations per object."""
    activations = count_activations()
    cpu = time.process_time()
    if phase == "create":
        wall = trio.run(create, loc, n, concurrency)
    else:
        offset = 7200.0
        _clock.set_wall_clock(lambda: time.time() + offset)
        wall = trio.run(fire, loc, n)
    print(json.dumps({"wall": wall, "cpu": time.process_time() - cpu,
                      "activations": activations[0] / n}))


def run_phase(phase: str, loc: str, n: int, concurrency: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", phase, loc, str(n), str(concurrency)],
        capture_output=True, text=True, check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def summary(n: int, runs: list[dict[str, float]]) -> dict[str, float]:
    rates = sorted(n / r["wall"] for r in runs)
    return {"per_s": statistics.median(rates), "min": rates[0], "max": rates[-1],
            "cpu_s_per_1k": statistics.median(1000 * r["cpu"] / n for r in runs),
            "activations": statistics.median(r["activations"] for r in runs)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--layouts", default="files,shared")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/work/nj-layout-bench")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for layout in args.layouts.split(","):
            created, fired = [], []
            for _ in range(args.repeats):
                root = tempfile.mkdtemp(prefix="nj-opt-", dir=args.dir)
                try:
                    loc = location(layout, os.path.join(root, "data"))
                    created.append(run_phase("create", loc, n, args.concurrency))
                    fired.append(run_phase("fire", loc, n, args.concurrency))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
            row = {"layout": layout, "objects": n, "concurrency": args.concurrency,
                   "create": summary(n, created), "fire": summary(n, fired)}
            rows.append(row)
            if not args.json:
                c, f = row["create"], row["fire"]
                print(f"{layout:8} {n:>7} create {c['per_s']:>7,.0f}/s ({c['min']:,.0f}-"
                      f"{c['max']:,.0f}; cpu {c['cpu_s_per_1k']:.2f} s/1k)   cold fire"
                      f" {f['per_s']:>7,.0f}/s ({f['min']:,.0f}-{f['max']:,.0f}; cpu"
                      f" {f['cpu_s_per_1k']:.2f} s/1k; {f['activations']:.2f} activations"
                      " per object)", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
