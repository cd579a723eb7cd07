"""A capability written as a plain class: Audit records events durably and retries
delivery to a (flaky) sink, with its own jobs that the host cannot touch.

Run: python examples/audit_capability.py [data-dir]
"""

from __future__ import annotations

import sys

import trio

import nursery_jobs as nj


class Audit(nj.Capability):
    id = "audit"

    def __init__(self, sink: list[str], fail_first: int = 1) -> None:
        self.sink = sink
        self.failures_left = fail_first

    async def on_start(self) -> None:
        print("  audit capability started")

    async def record(self, message: str) -> None:
        await self.lifecycle.jobs.push(
            "deliver", payload={"message": message},
            retry=nj.RetryOptions(max_attempts=3, base_delay=0.05, max_delay=0.2),
        )

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if self.failures_left > 0:  # a flaky sink: the first delivery fails
            self.failures_left -= 1
            raise ConnectionError("audit sink unavailable")
        self.sink.append(f"{ctx.job.payload['message']} (attempt {ctx.attempt})")
        return None

    async def on_job_error(self, ctx: nj.JobContext, error: Exception) -> nj.JobOutcome:
        print(f"  giving up on {ctx.job.id}: {error}")
        return None  # kept as a dead letter


class Account(nj.DurableObject):
    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.delivered: list[str] = []
        self.audit = Audit(self.delivered)
        self.lifecycle = nj.Lifecycle.install(self).use(self.audit)

    async def withdraw(self, amount: int) -> None:
        await self.audit.record(f"withdraw {amount}")

    async def audit_log(self) -> list[str]:
        return list(self.delivered)


async def main(path: str) -> None:
    async with nj.open_runtime(path) as rt:
        account = rt.get(Account, "acct-1")
        await account.withdraw(30)
        await trio.sleep(0.5)
        print("audit log:", await account.audit_log())


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./data")
