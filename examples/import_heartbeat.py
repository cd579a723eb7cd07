"""The ImportAgent heartbeat: long work kept alive by a job that re-arms itself.

A job, ``import_heartbeat``, runs every ``HEARTBEAT`` seconds (30 s in production; the
demo shortens it to 0.3 s through ``env``). Each run:

1. if this activation has no import running, start one from the checkpoint kept in
   storage, and track it with ``track_alarm_work`` (it runs under the alarm's
   memory-limit protection, and a reset or crash during it counts against this job);
2. return ``Reschedule(now + HEARTBEAT)``.

The import itself writes its rows and its checkpoint in one transaction per batch, so
whatever stops it — an eviction, a deploy, a crash — the next heartbeat in a new
activation picks it up from the last committed batch.

The demo starts an import of 60 rows, leaves the runtime half-way through (a deploy:
the import is cancelled), opens it again, and lets the next heartbeat resume it.

Run: python examples/import_heartbeat.py [data-dir]   (about 3 seconds)
"""

from __future__ import annotations

import sys
from typing import Any

import trio

import nursery_jobs as nj

BATCH = 5
BATCH_TIME = 0.1  # fetching and writing one batch


class ImportAgent(nj.DurableObject):
    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.heartbeat = float((ctx.env or {}).get("heartbeat", 30.0))
        self.importing = False  # in memory: it dies with the activation
        ctx.storage.execute("CREATE TABLE IF NOT EXISTS rows (n INTEGER PRIMARY KEY, v TEXT)")

    async def start_import(self, source: str, rows: int) -> None:
        self.ctx.storage.put("import", {"source": source, "rows": rows, "done": 0})
        self.ctx.storage.put("import_starts", [])
        # A recovery loop: if the object keeps being reset for memory, the breaker
        # delays (and at last seals) the heartbeat rather than restart it forever.
        await self.lifecycle.jobs.push("import_heartbeat", id="import", recovery_loop=True)

    async def progress(self) -> dict[str, Any]:
        state = self.ctx.storage.get("import")
        count = self.ctx.storage.execute("SELECT COUNT(*) FROM rows").fetchone()[0]
        return {"done": state["done"], "rows": state["rows"], "stored": count,
                "starts": self.ctx.storage.get("import_starts")}

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn != "import_heartbeat":
            return None
        state = self.ctx.storage.get("import")
        if state is None or state["done"] >= state["rows"]:
            say(f"heartbeat: import complete ({state['done']} rows); the heartbeat stops")
            if "finished" in (self.ctx.env or {}):
                self.ctx.env["finished"].set()  # tell the demo
            return None
        if not self.importing:
            self.importing = True
            self.lifecycle.track_alarm_work(self._import)
            starts = self.ctx.storage.get("import_starts", [])
            self.ctx.storage.put("import_starts", [*starts, state["done"]])
            say(f"heartbeat: no import in this activation; starting at row {state['done']}")
        else:
            say(f"heartbeat: import running, {state['done']}/{state['rows']} rows")
        return nj.Reschedule(nj.now() + self.heartbeat)

    async def _import(self) -> None:
        # Tracked work holds no turn of the object: it fetches outside one (calls and
        # heartbeats go on meanwhile) and takes a turn to read and record progress.
        storage = self.ctx.storage
        try:
            while True:
                async with self.ctx.turn():
                    state = storage.get("import")
                start, end = state["done"], min(state["done"] + BATCH, state["rows"])
                if start >= end:
                    return
                await trio.sleep(BATCH_TIME)  # fetch the batch from state["source"]
                async with self.ctx.turn():
                    with storage.transaction():  # the rows and the checkpoint together
                        storage.db["rows"].insert_all(
                            ({"n": n, "v": f"{state['source']}#{n}"} for n in range(start, end)),
                            replace=True,
                        )
                        storage.put("import", {**state, "done": end})
        finally:
            self.importing = False


START = 0.0


def say(text: str) -> None:
    print(f"  +{nj.now() - START:4.1f}s {text}")


async def main(path: str) -> None:
    global START
    env = {"heartbeat": 0.3, "finished": trio.Event()}
    async with nj.open_runtime(path, env=env) as rt:
        START = nj.now()
        agent = rt.get(ImportAgent, "import-1")
        await agent.start_import("s3://bucket/export.csv", rows=60)
        await trio.sleep(0.75)
        before = await agent.progress()
        print(f"deploy: stopping the runtime at {before['done']}/{before['rows']} rows")
    async with nj.open_runtime(path, env=env) as rt:
        agent = rt.get(ImportAgent, "import-1")
        print("restarted")
        with trio.fail_after(30):
            await env["finished"].wait()
        state = await agent.progress()
        first, *resumed = state["starts"]
        print(f"imported {state['stored']} rows of {state['rows']}: started at row {first},"
              f" resumed from the checkpoint at row {', '.join(map(str, resumed))}")


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./data")
