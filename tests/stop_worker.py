"""The worker process of tests/test_stopping.py: a runtime on a data directory with one
long job, stopped by a real SIGTERM (the default ``stop_on``).

Run: ``python tests/stop_worker.py DATA push|resume SECONDS``. ``push`` pushes job
"long" (it sleeps SECONDS); both modes then wait for it. Lines on stdout:
``up``, ``start <attempt>``, ``done``, ``exited`` (after the runtime's block).
"""

from __future__ import annotations

import sys

import trio

import nursery_jobs as nj


class Long(nj.DurableObject):
    namespace = "tests.stop_worker.Long"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self) -> None:
        await self.lifecycle.jobs.push("long", id="long")

    async def on_job(self, ctx: nj.JobContext) -> None:
        print(f"start {ctx.attempt}", flush=True)
        await trio.sleep(float(self.ctx.env))
        print("done", flush=True)


async def main(data: str, mode: str, seconds: str) -> None:
    async with nj.open_runtime(data, env=seconds) as rt:
        if mode == "push":
            await rt.get(Long, "l").push()
        print("up", flush=True)
        await trio.sleep(float(seconds) + 5)
    print("exited", flush=True)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:4])
