"""The CleanupAgent: deletes expired sessions every minute through a durable job.

Run: python examples/cleanup_agent.py [data-dir]   (finishes in about 2 seconds: the
example shortens the minute to 0.5 s through ``env``)
"""

from __future__ import annotations

import sys

import trio

import nursery_jobs as nj


class CleanupAgent(nj.DurableObject):
    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self, max_alarm_memory_limit_strikes=3)
        self.period = float((ctx.env or {}).get("cleanup_period", 60.0))
        ctx.storage.execute(
            "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, expires_at REAL)"
        )

    async def add_session(self, session_id: str, ttl: float) -> None:
        self.ctx.storage.execute(
            "INSERT OR REPLACE INTO sessions VALUES (?, ?)", [session_id, nj.now() + ttl]
        )

    async def request_cleanup(self) -> None:
        # A stable id: asking twice keeps one job.
        await self.lifecycle.jobs.push(
            "delete_expired", delay=self.period, id="cleanup",
            retry=nj.RetryOptions(max_attempts=5),
        )

    async def sessions(self) -> list[str]:
        rows = self.ctx.storage.execute("SELECT id FROM sessions ORDER BY id").fetchall()
        return [r[0] for r in rows]

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn != "delete_expired":
            return None
        deleted = self.ctx.storage.execute(
            "DELETE FROM sessions WHERE expires_at < ?", [nj.now()]
        ).rowcount
        print(f"  cleanup at +{nj.now() - START:.1f}s deleted {deleted} session(s)")
        return nj.Reschedule(nj.now() + self.period)  # every period, durably


START = 0.0


async def main(path: str) -> None:
    global START
    async with nj.open_runtime(path, env={"cleanup_period": 0.5}) as rt:
        START = nj.now()
        agent = rt.get(CleanupAgent, "sessions")
        await agent.add_session("short", ttl=0.2)
        await agent.add_session("long", ttl=60)
        await agent.request_cleanup()
        await agent.request_cleanup()
        await trio.sleep(1.2)
        print("sessions left:", await agent.sessions())


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./data")
