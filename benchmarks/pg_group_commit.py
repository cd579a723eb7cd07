"""PostgreSQL: many callers pushing into many objects on one host, one push per stub
call, each durable in PostgreSQL when its call returns (issue 26: group commit across
objects, target >= 10,000 pushes/s for 100 callers into 100 objects).

Run: NJ_POSTGRES_DSN=postgresql://... python benchmarks/pg_group_commit.py
         [--callers 100] [--per-caller 100] [--runs 3]

Creates a database on that server, measures, drops it. Prints per run the pushes/s,
the host's CPU per push (``time.process_time``), the server's (its backends for this
database, from /proc/<pid>/stat) and, where the engine counts them, the
ships per round trip; then the median and range. Uses only what every version of the
engine has (``ship_statistics`` where it exists), so it measures before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import trio

import nursery_jobs as nj
from nursery_jobs._engines.postgres._engine import PostgresEngine
from nursery_jobs.bench._pg import _dbname, _server_cpu, fresh_database
from nursery_jobs.bench._pg_host import HostBench, PgBenchObject


async def _run(dsn: str, callers: int, per_caller: int, prefix: str) -> dict[str, float]:
    engine = PostgresEngine(dsn)
    counted = hasattr(engine, "ship_statistics")
    async with nj.open_runtime(engine, env=HostBench("A")) as rt:
        stubs = [rt.get(PgBenchObject, f"{prefix}{i}") for i in range(callers)]
        for stub in stubs:
            await stub.ping()  # activation is not a push
        before = engine.ship_statistics() if counted else None

        async def caller(stub: Any) -> None:
            for i in range(per_caller):
                await stub.push_one(i)

        server0 = _server_cpu(_dbname(dsn))
        t0, cpu0, trio0 = time.perf_counter(), time.process_time(), time.thread_time()
        async with trio.open_nursery() as nursery:
            for stub in stubs:
                nursery.start_soon(caller, stub)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        trio_cpu = time.thread_time() - trio0  # the Trio thread's share of ``cpu``
        server = sum(c - server0.get(pid, 0.0)
                     for pid, c in _server_cpu(_dbname(dsn)).items())
        after = engine.ship_statistics() if counted else None
    pushes = callers * per_caller
    out = {"per_s": pushes / elapsed, "cpu_us": cpu / pushes * 1e6,
            "trio_cpu_us": trio_cpu / pushes * 1e6, "server_cpu_us": server / pushes * 1e6}
    if before is not None and after is not None:
        out["ships_per_round_trip"] = (after.ships - before.ships) / max(
            1, after.round_trips - before.round_trips)
        out["ships_per_push"] = (after.ships - before.ships) / pushes
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=100)
    parser.add_argument("--per-caller", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dsn", default=os.environ.get("NJ_POSTGRES_DSN"))
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn or NJ_POSTGRES_DSN is needed")
    results = []
    with fresh_database(args.dsn) as db:
        for run in range(args.runs):
            result = trio.run(_run, db, args.callers, args.per_caller, f"r{run}-")
            results.append(result)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v:,.1f}" for k, v in result.items()),
                  flush=True)
    load = [round(x, 2) for x in os.getloadavg()]
    for key in results[0]:
        values = [r[key] for r in results]
        print(f"{key}: median {statistics.median(values):,.1f}"
              f" ({min(values):,.1f} to {max(values):,.1f})")
    print(f"{args.callers} callers x {args.per_caller} pushes, load average {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
