"""The object the PostgreSQL benchmark measures, and a host process for it.

``python -m nursery_jobs.bench._pg_host DSN`` opens a runtime on DSN and obeys one JSON
command a line on stdin, answering each with one JSON line on stdout: the benchmark's
other hosts (scaling, the host a cross-host call reaches, the host killed for failover).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

import trio

import nursery_jobs as nj
from nursery_jobs._engines.postgres._engine import PostgresEngine

FAR: float = 3600.0  # delay of jobs that must stay queued for the whole measurement


class HostBench:
    """What one process's bench objects share: the starting gun and the counts."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.go = trio.Event()
        self.done = trio.Event()
        self.count = 0
        self.target = 0
        self.go_wall = 0.0
        self.go_cpu = 0.0
        self.last_wall = 0.0
        self.last_cpu = 0.0
        self.marks: list[float] = []
        self.marks_wanted = 0
        self.marked = trio.Event()

    def start(self) -> None:
        self.go_wall, self.go_cpu = time.time(), time.process_time()
        self.go.set()


class PgBenchObject(nj.DurableObject):
    """A Lifecycle object whose no-op jobs wait for the starting gun, then count."""

    namespace = "nursery_jobs.bench.pg"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.bench: HostBench = ctx.env

    async def fill(self, n: int) -> None:
        """A gate job, then ``n`` no-op jobs, all due now, in one commit."""
        with self.ctx.storage.transaction():
            await self.lifecycle.jobs.push("gate")
            for i in range(n):
                await self.lifecycle.jobs.push("noop", payload=i)

    async def push_one(self, i: int) -> None:
        await self.lifecycle.jobs.push("noop", payload=i, delay=FAR)

    async def push_batched(self, n: int) -> None:
        with self.ctx.storage.transaction():
            for i in range(n):
                await self.lifecycle.jobs.push("noop", payload=i, delay=FAR)

    async def load(self, jobs: int, kv: int) -> None:
        """Queued jobs and KV rows for the activation measurement (one commit)."""
        with self.ctx.storage.transaction():
            for i in range(jobs):
                await self.lifecycle.jobs.push("noop", payload=i, delay=FAR)
            for i in range(kv):
                self.ctx.storage.put(f"k{i}", {"i": i, "text": "x" * 40})

    async def mark(self, at: float) -> None:
        """A job due at wall time ``at`` that records when (and where) it ran."""
        await self.lifecycle.jobs.push("mark", time=at)

    async def ping(self) -> str:
        return self.bench.name

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        bench = self.bench
        fn = ctx.job.fn
        if fn == "noop":
            bench.count += 1
            if bench.count == bench.target:
                bench.last_wall, bench.last_cpu = time.time(), time.process_time()
                bench.done.set()
        elif fn == "gate":
            await bench.go.wait()
        elif fn == "mark":
            bench.marks.append(time.time())
            if len(bench.marks) >= bench.marks_wanted:
                bench.marked.set()
        return None


# -- the host process -----------------------------------------------------------------
async def _serve(dsn: str, lease_ttl: float, name: str) -> None:
    bench = HostBench(name)
    engine = PostgresEngine(dsn, lease_ttl=lease_ttl)

    def answer(**fields: Any) -> None:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()

    async with nj.open_runtime(engine, env=bench) as rt:
        answer(ready=True, host_id=engine.host_id)
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            op = command["op"]
            if op == "fill":  # gate + per_object jobs on each object, run after "go"
                objects, per_object = command["objects"], command["per_object"]
                bench.target += len(objects) * per_object
                for object_id in objects:
                    await rt.get(PgBenchObject, object_id).fill(per_object)
                answer(ok=True)
            elif op == "go":
                bench.start()
                await bench.done.wait()
                answer(count=bench.count, go_wall=bench.go_wall, go_cpu=bench.go_cpu,
                       last_wall=bench.last_wall, last_cpu=bench.last_cpu)
            elif op == "hold":  # activate objects here (they stay: idle_timeout 60 s)
                for object_id in command["objects"]:
                    await rt.get(PgBenchObject, object_id).ping()
                answer(ok=True)
            elif op == "mark":  # a job due at "at" on each object (this host holds them)
                for object_id in command["objects"]:
                    await rt.get(PgBenchObject, object_id).mark(command["at"])
                answer(ok=True)
            elif op == "quit":
                break
            else:
                answer(error=f"unknown op {op!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nursery_jobs.bench._pg_host")
    parser.add_argument("dsn")
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--name", default="host")
    args = parser.parse_args(argv)
    logging.getLogger("nursery_jobs").setLevel(logging.ERROR)  # as in _pg: expected backlogs
    trio.run(_serve, args.dsn, args.lease_ttl, args.name)
    return 0


if __name__ == "__main__":
    # Run from the module's own name, not __main__: the other hosts import the bench
    # object by its class path.
    from nursery_jobs.bench._pg_host import main as _main

    sys.exit(_main())
