"""The worker process of tests/test_faults_interrupt.py: a runtime under load (many
objects whose jobs burn CPU and stay due), waiting to be interrupted.

Run: ``python tests/interrupt_worker.py DATA OBJECTS``. Prints ``ready`` once every
object has run a job, then runs until SIGINT. Whatever reaches the top is Python's to
report: a plain KeyboardInterrupt exits by the SIGINT signal (return code -2).
"""

from __future__ import annotations

import sys

import trio

import nursery_jobs as nj

WARM: set[str] = set()
GO = trio.Event()  # set once everything is pushed: the load starts together
READY = trio.Event()
OBJECTS = 0


class Busy(nj.DurableObject):
    namespace = "interrupt_worker.Busy"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def add(self) -> None:
        for i in range(4):
            await self.lifecycle.jobs.push("spin", id=f"spin-{i}")

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        await GO.wait()
        n = 0
        for i in range(20_000):  # ~1 ms of pure Python: where a SIGINT lands
            n += i
        WARM.add(self.ctx.id)
        if len(WARM) == OBJECTS:
            READY.set()
        return nj.YIELD  # stays due: the load never ends


async def main(data: str, objects: int) -> None:
    async with nj.open_runtime(data) as rt:
        for i in range(objects):
            await rt.get(Busy, f"o{i}").add()
        GO.set()
        await READY.wait()
        print("ready", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    OBJECTS = int(sys.argv[2])
    trio.run(main, sys.argv[1], OBJECTS)
