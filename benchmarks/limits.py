"""Does a limited namespace's backlog slow the others? (issue 23, limits)

An unlimited namespace (``Fast``: M objects, K jobs each, pushed and run as fast as the
runtime goes) is timed alone, then beside a limited namespace (``Slow``,
``nj.Limit(concurrency=1)``) with a backlog of B objects, each holding a job due now that
runs for an hour once it gets its permit: one runs, B - 1 are held. A held object's
alarm run ends and it waits in line in the runtime, holding no alarm slot, no turn and
no timer entry, so Fast's rate should not move.

Run: PYTHONPATH=. python benchmarks/limits.py [--backlog 2000] [--objects 200] [--jobs 50]
     [--location DIR]   (default: in memory)
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import nursery_jobs as nj


class Env:
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.ran = 0
        self.done = trio.Event()
        self.slow_started = 0


class Fast(nj.DurableObject):
    namespace = "bench.limits.Fast"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push_many(self, count: int) -> None:
        for _ in range(count):
            await self.lifecycle.jobs.push("tick")

    async def on_job(self, ctx: nj.JobContext) -> None:
        env = self.env
        env.ran += 1
        if env.ran == env.expected:
            env.done.set()


class Slow(nj.DurableObject):
    namespace = "bench.limits.Slow"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self) -> None:
        await self.lifecycle.jobs.push("work", hung_timeout=7200)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env.slow_started += 1
        await trio.sleep(3600)


async def one_run(location: Any, backlog: int, objects: int, jobs: int) -> tuple[float, int]:
    """Fast's jobs per second beside a Slow backlog of ``backlog`` objects."""
    env = Env(objects * jobs)
    limits = {Slow: nj.Limit(concurrency=1)}
    async with nj.open_runtime(location, env=env, limits=limits, stop_on=(),
                               turn_warning=float("inf")) as rt:
        for i in range(backlog):
            await rt.get(Slow, f"s{i}").push()
        # Until the backlog is delivered: one runs, the rest are held, in line.
        held = rt.limits.get(Slow.namespace)
        assert held is not None
        while backlog and len(held.parked) < backlog - 1:  # noqa: ASYNC110 (a count, polled)
            await trio.sleep(0.05)
        fast = [rt.get(Fast, f"f{i}") for i in range(objects)]
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for stub in fast:
                nursery.start_soon(stub.push_many, jobs)
        await env.done.wait()
        elapsed = time.perf_counter() - started
    return objects * jobs / elapsed, env.slow_started


async def main_async(args: argparse.Namespace) -> None:
    rates: dict[int, list[float]] = {0: [], args.backlog: []}
    for repeat in range(args.repeats):
        for backlog in (0, args.backlog):
            if args.location is None:
                location = None
                rate, slow = await one_run(location, backlog, args.objects, args.jobs)
            else:
                with tempfile.TemporaryDirectory(dir=args.location) as tmp:
                    rate, slow = await one_run(Path(tmp) / "data", backlog, args.objects,
                                               args.jobs)
            rates[backlog].append(rate)
            print(f"run {repeat + 1}: backlog {backlog:>6}: {rate:>9,.0f} Fast jobs/s"
                  f" (Slow jobs started: {slow})", flush=True)
    alone = statistics.median(rates[0])
    beside = statistics.median(rates[args.backlog])
    print(f"median: alone {alone:,.0f} jobs/s; beside a backlog of {args.backlog:,} held"
          f" objects {beside:,.0f} jobs/s ({beside / alone - 1:+.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--location", default=None,
                        help="a directory for data directories (default: in memory)")
    logging.getLogger("nursery_jobs").setLevel(logging.ERROR)  # (backlog warnings)
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
