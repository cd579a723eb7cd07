"""Timer benchmark: 10,000 objects with alarms spread over 10 s of real time.

Reports alarm lateness (p50/p99/max), the catalog's cost of an evicted object with a
pending alarm, and the resident memory per active object at 1k and 10k objects (each
measured in a fresh process): light objects (one key written) and busy ones (a 1 MiB
table read through, so the page cache is as full as the database allows).

Run: python benchmarks/timers.py [--objects N] [--spread S] [--json]
     [--memory-only | --lateness-only] [--dormant-after S]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import resource
import statistics
import subprocess
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

    async def fill(self, kib: int) -> None:
        """A database of ``kib`` KiB, read through once (a busy object's cache)."""
        db = self.ctx.storage
        db.execute("CREATE TABLE IF NOT EXISTS blob (id INTEGER PRIMARY KEY, v BLOB)")
        with db.transaction():
            for _ in range(kib):
                db.execute("INSERT INTO blob (v) VALUES (?)", (os.urandom(1024),))
        db.execute("SELECT sum(length(v)) FROM blob").fetchone()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def lateness(
    path: str, objects: int, spread: float, idle_timeout: float,
    dormant_after: float | None = None,
) -> dict[str, float]:
    LATENESS.clear()
    TARGET["n"] = objects
    ALL_FIRED.append(trio.Event())
    async with nj.open_runtime(path, idle_timeout=idle_timeout,
                               dormant_after=dormant_after) as rt:
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


# How long the memory probe's objects stay idle before it measures them dormant.
DORMANT_AFTER = 1.0


def live_rss(proc: psutil.Process) -> int:
    """The process's RSS once freed heap memory is handed back (glibc keeps what
    ``free`` returns, so RSS alone would show the high-water mark)."""
    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: RSS as it is
    return int(proc.memory_info().rss)


async def memory(path: str, objects: int, busy_kib: int = 0) -> dict[str, float]:
    """Resident memory per active object: ``objects`` objects activated and kept
    resident, each touched once (``busy_kib=0``) or holding a table of ``busy_kib`` KiB
    that it has read through (its page cache as full as its database allows).

    Measured twice in one process: with every database open (dormancy off while they
    are touched), then once each object, touched again, has been idle for
    ``DORMANT_AFTER`` (databases closed, objects still resident)."""
    proc = psutil.Process()
    async with nj.open_runtime(path, idle_timeout=3600, max_active=objects + 1,
                               dormant_after=DORMANT_AFTER) as rt:
        rt.dormant_after = None  # first: every database stays open
        await rt.get(Sleeper, "warm").touch()
        if busy_kib:
            await rt.get(Sleeper, "warm").fill(busy_kib)
        before = live_rss(proc)
        for i in range(objects):
            stub = rt.get(Sleeper, f"m{i}")
            await (stub.fill(busy_kib) if busy_kib else stub.touch())
        awake = live_rss(proc)
        active = rt.statistics().active_objects
        rt.dormant_after = DORMANT_AFTER  # now: idle objects close their databases
        for i in range(objects):
            await rt.get(Sleeper, f"m{i}").touch()
        # (A busy object's close checkpoints its 1 MiB of WAL: ~10 ms with the fsync.)
        deadline = time.monotonic() + DORMANT_AFTER + objects * 0.05 + 10
        asleep = 0
        while time.monotonic() < deadline and asleep < objects:
            await trio.sleep(0.5)
            asleep = sum(rt.active_database(Sleeper.namespace, f"m{i}") is None
                         for i in range(objects))
        dormant = live_rss(proc)
        resident = rt.statistics().active_objects
    return {"objects": objects, "busy_kib": busy_kib, "active": active,
            "bytes_per_object": (awake - before) / objects,
            "dormant_resident": resident, "dormant_objects": asleep,
            "dormant_bytes_per_object": (dormant - before) / objects}


def memory_probe(objects: int, busy_kib: int, where: str | None) -> dict[str, float]:
    """``memory`` in a fresh process (a process's heaps never shrink back)."""
    out = subprocess.run(
        [sys.executable, __file__, "--memory-probe", f"{objects},{busy_kib}"]
        + (["--dir", where] if where else []),
        check=True, capture_output=True, text=True,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def resident_limit() -> int:
    """How many objects the open-file limit lets stay resident (two files each)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return max(16, (soft - 256) // 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--spread", type=float, default=10.0)
    parser.add_argument("--cold-objects", type=int, default=2_000)
    parser.add_argument("--dir", default=None, help="where to put the data (default: tmp)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--lateness-only", action="store_true")
    parser.add_argument("--dormant-after", type=float, default=None,
                        help="the lateness runs' open_runtime(dormant_after=) (default: off)")
    parser.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        objects, busy = (int(x) for x in args.memory_probe.split(","))
        resident_limit()
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            row = trio.run(memory, os.path.join(tmp, "m"), objects, busy)
            catalog = os.path.getsize(os.path.join(tmp, "m", "catalog.sqlite3"))
            row["catalog_bytes_per_object"] = catalog / (objects + 1)
            json.dump(row, sys.stdout)
        return
    result: dict[str, object] = {}
    large = min(10_000, resident_limit() - 1)
    memory_rows = [] if args.lateness_only else [
        memory_probe(n, kib, args.dir) for n in (1_000, large) for kib in (0, 1024)
    ]
    result["memory"] = memory_rows
    if memory_rows:
        result["catalog_bytes_per_object"] = memory_rows[1]["catalog_bytes_per_object"]
    if not args.memory_only:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            result.update(trio.run(lateness, os.path.join(tmp, "warm"), args.objects,
                                   args.spread, 60.0, args.dormant_after))
            # Cold: every object is evicted after arming, so each alarm re-activates it
            # (opens its database) before it runs.
            cold = trio.run(lateness, os.path.join(tmp, "cold"), args.cold_objects,
                            args.spread, 0.2)
            result.update({f"cold_{k}": v for k, v in cold.items()})
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return
    if not args.memory_only:
        print(f"{args.objects} objects, alarms spread over {args.spread:.0f} s (real time);"
              f" at most {result['max_active']} resident (the open-file limit allows that"
              " many)")
        print(f"  lateness  p50 {result['p50_ms']:.2f} ms   p99 {result['p99_ms']:.2f} ms"
              f"   max {result['max_ms']:.2f} ms   (targets: p99 <= 5 ms, max <= 50 ms)")
        print(f"  cold ({args.cold_objects} objects evicted before their alarm): p50"
              f" {result['cold_p50_ms']:.2f} ms   p99 {result['cold_p99_ms']:.2f} ms"
              f"   max {result['cold_max_ms']:.2f} ms")
        print(f"  creating an object's database: {result['create_ms_per_object']:.2f} ms each")
    if not memory_rows:
        return
    print(f"  evicted object with a pending alarm: its catalog rows only"
          f" (~{result['catalog_bytes_per_object']:.0f} B of catalog per object)")
    print("  resident memory per active object (page cache: 1 MiB per object, 256 MiB for"
          " all):")
    for row in memory_rows:
        kind = "busy (1 MiB read)" if row["busy_kib"] else "light (one key)"
        print(f"    {int(row['objects']):>6} active, {kind:<18}"
              f" {row['bytes_per_object'] / 1024:8.0f} KiB per object open"
              f"  ({row['bytes_per_object'] * row['objects'] / 2**20:6.0f} MiB in all);"
              f" idle {DORMANT_AFTER:.0f} s ({int(row['dormant_objects'])} dormant,"
              f" {int(row['dormant_resident'])} resident):"
              f" {row['dormant_bytes_per_object'] / 1024:6.1f} KiB per object"
              f"  ({row['dormant_bytes_per_object'] * row['objects'] / 2**20:6.0f} MiB)")


if __name__ == "__main__":
    main()
