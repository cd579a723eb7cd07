"""Quick start: a durable counter with an alarm, and a job queue.

Run: python examples/quickstart.py [data-dir]
"""

from __future__ import annotations

import sys

import trio

import nursery_jobs as nj


class Counter(nj.DurableObject):
    """A counter whose value survives restarts, with a reminder alarm."""

    async def increment(self, by: int = 1) -> int:
        n = self.ctx.storage.get("n", 0) + by
        self.ctx.storage.put("n", n)
        return n

    async def remind_in(self, seconds: float) -> None:
        self.ctx.storage.set_alarm(nj.now() + seconds)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        print(f"  alarm of {self.ctx.id}: n is {self.ctx.storage.get('n', 0)}")


class Mailer(nj.DurableObject):
    """An object with a Lifecycle: jobs are durable, retried and run in order."""

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def send_later(self, to: str, delay: float) -> str:
        job = await self.lifecycle.jobs.push("send", delay=delay, payload={"to": to})
        return job.id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        print(f"  sending mail to {ctx.job.payload['to']} (attempt {ctx.attempt})")
        sent = self.ctx.storage.get("sent", [])
        self.ctx.storage.put("sent", [*sent, ctx.job.payload["to"]])
        return None

    async def sent(self) -> list[str]:
        return list(self.ctx.storage.get("sent", []))


async def main(path: str) -> None:
    async with nj.open_runtime(path) as rt:
        counter = rt.get(Counter, "user-42")
        print("counter:", await counter.increment(2))
        await counter.remind_in(0.2)

        mailer = rt.get(Mailer, "newsletter")
        await mailer.send_later("ada@example.com", 0.1)
        await mailer.send_later("grace@example.com", 0.3)
        await trio.sleep(0.6)
        print("sent:", await mailer.sent())


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./data")
