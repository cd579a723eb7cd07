"""Job-queue scaling: push N jobs to one object, then drain them; report the cost per
job at 1k, 10k and 100k queued. Per-job cost must stay flat (no O(n) work per job).

Run: python benchmarks/jobs.py [--sizes 1000,10000,100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import trio

import nursery_jobs as nj

DONE = trio.Event()


class Worker(nj.DurableObject):
    namespace = "bench.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.target = 0
        self.ran = 0

    async def fill(self, n: int) -> float:
        """Push n jobs in one transaction; return seconds taken."""
        t0 = time.perf_counter()
        with self.ctx.storage.transaction():
            for i in range(n):
                await self.lifecycle.jobs.push("noop", payload=i)
        return time.perf_counter() - t0

    async def push_one_by_one(self, n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            await self.lifecycle.jobs.push("noop", payload=i)
        return time.perf_counter() - t0

    async def expect(self, n: int) -> None:
        self.target, self.ran = n, 0

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.ran += 1
        if self.ran == self.target:
            DONE.set()
        return None


async def run_size(path: str, n: int) -> dict[str, float]:
    global DONE
    DONE = trio.Event()
    async with nj.open_runtime(path) as rt:
        worker = rt.get(Worker, f"w{n}")
        await worker.expect(n)
        fill = await worker.fill(n)
        t0 = time.perf_counter()
        await DONE.wait()
        drain = time.perf_counter() - t0
        single = await worker.push_one_by_one(min(n, 2000))
    return {"queued": n, "push_us": fill / n * 1e6, "dispatch_us": drain / n * 1e6,
            "durable_push_us": single / min(n, 2000) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--dir", default=None, help="where to put the data (default: tmp)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            rows.append(trio.run(run_size, os.path.join(tmp, str(n)), n))
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return
    print(f"{'queued':>8}  {'push in txn':>12}  {'dispatch':>10}  {'durable push':>13}")
    for r in rows:
        print(f"{r['queued']:>8}  {r['push_us']:>9.1f} µs  {r['dispatch_us']:>7.1f} µs"
              f"  {r['durable_push_us']:>10.1f} µs")


if __name__ == "__main__":
    main()
