"""Timer benchmark: 10,000 objects with alarms spread over 10 s of real time.

Reports alarm lateness (p50/p99/max), the catalog's cost of an evicted object with a
pending alarm, and the resident memory of an active object with an open database.

Run: python benchmarks/timers.py [--objects N] [--spread S] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import psutil
import trio

import nursery_jobs as nj

LATENESS: list[float] = []
DUE: dict[str, float] = {}
TARGET = {"n": 0}
ALL_FIRED: list[trio.Event] = []


class Sleeper(nj.DurableObject):
    namespace = "bench.Sleeper"

    async def arm(self, at: float) -> None:
        self.ctx.storage.set_alarm(at)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        LATENESS.append(nj.now() - DUE[self.ctx.id])
        if len(LATENESS) == TARGET["n"]:
            ALL_FIRED[-1].set()

    async def touch(self) -> None:
        self.ctx.storage.put("k", 1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def lateness(path: str, objects: int, spread: float, idle_timeout: float) -> dict[str, float]:
    LATENESS.clear()
    TARGET["n"] = objects
    ALL_FIRED.append(trio.Event())
    async with nj.open_runtime(path, idle_timeout=idle_timeout) as rt:
        # Creating an object's database costs a few fsyncs (switching a new file to
        # WAL); do it first, then arm the alarms relative to a start after that.
        t0 = time.perf_counter()
        for i in range(objects):
            await rt.get(Sleeper, f"o{i}").touch()
        created = time.perf_counter() - t0
        t1 = time.perf_counter()
        start = nj.now() + 1.0 + 0.2 * created  # arming resident objects is ~5x faster
        # Armed latest-first: if more objects exist than may be resident (max_active,
        # bounded by the open-file limit), the least recently used ones evicted are
        # those whose alarms come last, as in a service whose busiest objects stay warm.
        for i in reversed(range(objects)):
            oid = f"o{i}"
            DUE[oid] = start + spread * i / objects
            await rt.get(Sleeper, oid).arm(DUE[oid])
        armed = time.perf_counter() - t1
        max_active = rt.max_active
        with trio.fail_after(spread + 120):
            await ALL_FIRED[-1].wait()
    ms = [x * 1000 for x in LATENESS]
    return {"alarms": len(ms), "p50_ms": pct(ms, 0.50), "p99_ms": pct(ms, 0.99),
            "max_ms": max(ms), "mean_ms": statistics.fmean(ms),
            "create_ms_per_object": created / objects * 1000,
            "arm_ms_per_object": armed / objects * 1000, "max_active": max_active,
            "armed_late": nj.now() > start}


async def memory(path: str, objects: int) -> dict[str, float]:
    proc = psutil.Process()
    async with nj.open_runtime(path, idle_timeout=3600) as rt:
        await rt.get(Sleeper, "warm").touch()
        gc.collect()
        before = proc.memory_info().rss
        for i in range(objects):
            await rt.get(Sleeper, f"m{i}").touch()
        gc.collect()
        after = proc.memory_info().rss
        rows = sum(1 for _ in rt.catalog.objects())
    return {"active_object_kb": (after - before) / objects / 1024, "registered": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--spread", type=float, default=10.0)
    parser.add_argument("--cold-objects", type=int, default=2_000)
    parser.add_argument("--dir", default=None, help="where to put the data (default: tmp)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        # Memory first, in a process that has not yet grown its heaps.
        result = trio.run(memory, os.path.join(tmp, "memory"), 500)
        catalog = os.path.getsize(os.path.join(tmp, "memory", "catalog.sqlite3"))
        result["catalog_bytes_per_object"] = catalog / max(result.pop("registered"), 1)
        result.update(trio.run(lateness, os.path.join(tmp, "warm"), args.objects, args.spread,
                               60.0))
        # Cold: every object is evicted after arming, so each alarm re-activates it
        # (opens its database) before it runs.
        cold = trio.run(lateness, os.path.join(tmp, "cold"), args.cold_objects, args.spread, 0.2)
        result.update({f"cold_{k}": v for k, v in cold.items()})
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return
    print(f"{args.objects} objects, alarms spread over {args.spread:.0f} s (real time);"
          f" at most {result['max_active']} resident (the open-file limit allows that many)")
    print(f"  lateness  p50 {result['p50_ms']:.2f} ms   p99 {result['p99_ms']:.2f} ms"
          f"   max {result['max_ms']:.2f} ms   (targets: p99 <= 5 ms, max <= 50 ms)")
    print(f"  cold ({args.cold_objects} objects evicted before their alarm): p50"
          f" {result['cold_p50_ms']:.2f} ms   p99 {result['cold_p99_ms']:.2f} ms"
          f"   max {result['cold_max_ms']:.2f} ms")
    print(f"  creating an object's database: {result['create_ms_per_object']:.2f} ms each")
    print(f"  evicted object with a pending alarm: its catalog rows only"
          f" (~{result['catalog_bytes_per_object']:.0f} B of catalog per object)")
    print(f"  active object with an open database: {result['active_object_kb']:.0f} KB RSS"
          " (target <= 200 KB)")


if __name__ == "__main__":
    main()
