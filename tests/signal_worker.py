"""The worker process of tests/test_stopping.py's Ctrl-C and exit-status tests: a
runtime on a data directory with one CPU-bound job (pure Python, no checkpoint: where a
real SIGINT lands).

Run: ``python tests/signal_worker.py DATA push|resume|exit SECONDS``. ``push`` pushes
job "spin" (it spins SECONDS); ``resume`` waits for the job pushed before; ``exit``
pushes a job that raises ``SystemExit(3)``. Lines on stdout: ``up``, ``start
<attempt>``, ``done``, then ``dead <count of dead letters>``.
"""

from __future__ import annotations

import sys
import time

import trio

import nursery_jobs as nj

DONE = trio.Event()


class Spin(nj.DurableObject):
    namespace = "tests.signal_worker.Spin"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str) -> None:
        await self.lifecycle.jobs.push(fn, id="spin")

    async def dead(self) -> int:
        return len(self.lifecycle.dead_letters())

    async def on_job(self, ctx: nj.JobContext) -> None:
        print(f"start {ctx.attempt}", flush=True)
        if ctx.job.fn == "exit":
            raise SystemExit(3)
        end = time.monotonic() + float(self.ctx.env)
        n = 0
        while time.monotonic() < end:  # CPU-bound: Ctrl-C lands in here
            n += 1
        print("done", flush=True)
        DONE.set()


async def main(data: str, mode: str, seconds: str) -> None:
    async with nj.open_runtime(data, env=seconds) as rt:
        if mode in ("push", "exit"):
            await rt.get(Spin, "s").push("spin" if mode == "push" else "exit")
        print("up", flush=True)
        with trio.move_on_after(float(seconds) + 20):
            await DONE.wait()
        print(f"dead {await rt.get(Spin, 's').dead()}", flush=True)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:4])
