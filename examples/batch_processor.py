"""A batch processor Agent: a large request is split into batches, one queued task
each. The batches run one at a time, in order, from the object's alarm; the caller gets
an answer at once and asks for progress while they run. A batch that fails is retried
1 s later without holding up the batches behind it.

Run: python examples/batch_processor.py [data-dir]   (about 2 s: ``BATCH_SECONDS`` of
pretend work per batch, plus one retry)
"""

from __future__ import annotations

import sys
from typing import Any

import trio

import nursery_jobs as nj

BATCH_SIZE = 250
BATCH_SECONDS = 0.08
# A transient failure, once, at this batch: its retry comes 1 s later, after the rest.
FLAKY_BATCHES = {3}
START = 0.0


def stamp() -> str:
    return f"[{nj.now() - START:4.2f}s]"


class BatchProcessor(nj.Agent):
    async def submit(self, request_id: str, items: list[int]) -> int:
        """Split ``items`` into batches and queue them; return how many."""
        batches = [items[i:i + BATCH_SIZE] for i in range(0, len(items), BATCH_SIZE)]
        # The state and the tasks commit together: no half-submitted request.
        with self.ctx.storage.transaction():
            self.ctx.storage.put(f"request:{request_id}", {
                "items": len(items), "batches": len(batches), "done": [], "total": 0,
            })
            for n, batch in enumerate(batches):
                await self.queue("process_batch", {"request": request_id, "n": n,
                                                   "items": batch}, id=f"{request_id}/{n}")
        return len(batches)

    async def process_batch(self, payload: dict[str, Any]) -> None:
        request, n, items = payload["request"], payload["n"], payload["items"]
        await trio.sleep(BATCH_SECONDS)  # the work
        if n in FLAKY_BATCHES:
            FLAKY_BATCHES.discard(n)
            raise ConnectionError(f"batch {n}: worker went away")
        key = f"request:{request}"
        state = self.ctx.storage.get(key)
        state["done"].append(n)
        state["total"] += sum(items)
        self.ctx.storage.put(key, state)
        print(f"{stamp()} {request}: batch {n} done ({len(state['done'])}/{state['batches']})")

    async def progress(self, request_id: str) -> dict[str, Any]:
        state: dict[str, Any] = self.ctx.storage.get(f"request:{request_id}")
        waiting = [t for t in self.list_schedules() if t.id.startswith(f"{request_id}/")]
        return {**state, "waiting": len(waiting),
                "retrying": [t.id for t in waiting if t.attempts]}


def show_failures(event: nj.Event) -> None:
    if event.type == "job:retry":
        print(f"{stamp()} {event.data['id']} failed ({event.data['error']});"
              f" retry in {event.data['delay']:g} s")


async def main(path: str) -> None:
    global START
    async with nj.open_runtime(path) as rt:
        START = nj.now()
        rt.events.add_listener(show_failures)
        processor = rt.get(BatchProcessor, "reports")
        items = list(range(2000))
        batches = await processor.submit("request-1", items)
        print(f"{stamp()} request-1: {len(items)} items queued as {batches} batches")
        while True:
            await trio.sleep(0.3)
            state = await processor.progress("request-1")
            percent = 100 * len(state["done"]) // state["batches"]
            print(f"{stamp()} progress: {percent}% ({state['waiting']} waiting,"
                  f" retrying: {state['retrying']})")
            if state["waiting"] == 0:
                break
        print(f"request-1 complete: {state['items']} items in {state['batches']} batches,"
              f" sum {state['total']}, batch order {state['done']}")


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./data")
