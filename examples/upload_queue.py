"""The UploadObject from the Queue docs, in Python: uploads queued durably and run one
at a time; a flaky upload is retried with backoff without holding up the others; a file
that keeps failing is kept as a dead letter (the reference drops it) and requeued once
the cause is fixed.

Run: python examples/upload_queue.py [data-dir]   (under a second: the retry waits are
shortened through ``RETRY`` below)
"""

from __future__ import annotations

import sys
from typing import Any

import trio

import nursery_jobs as nj

# Production would wait longer between attempts; the demo keeps them short.
RETRY = nj.RetryOptions(max_attempts=3, base_delay=0.05, max_delay=0.2)
START = 0.0


def stamp() -> str:
    return f"[{nj.now() - START:4.2f}s]"


class StorageService:
    """Stands in for the remote store: the first attempt at each photo fails (a flaky
    network), and files in ``rejects`` fail until the service is fixed."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.rejects = {"huge.iso"}
        self.stored: list[str] = []

    async def put(self, name: str) -> None:
        self.attempts[name] = attempt = self.attempts.get(name, 0) + 1
        await trio.sleep(0.01)  # the request
        if name in self.rejects:
            raise ConnectionError(f"{name}: 413 payload too large")
        if name.endswith(".jpg") and attempt == 1:
            raise ConnectionError(f"{name}: connection reset by peer")
        self.stored.append(name)


class UploadObject(nj.DurableObject):
    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.service: StorageService = ctx.env
        self.queue = nj.Queue(
            callbacks={"process_upload": self.process_upload},
            retry=RETRY,
            on_error=self.upload_failed,
        )
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def enqueue_upload(self, file_name: str) -> str:
        # Durable when it returns; the upload itself runs from the object's alarm. The
        # stable id makes a repeated enqueue of the same file replace the first.
        item = await self.queue.push(
            "process_upload", {"file_name": file_name}, id=f"upload:{file_name}"
        )
        return item.id

    async def process_upload(self, payload: dict[str, Any], item: nj.QueueItem) -> None:
        name = payload["file_name"]
        await self.service.put(name)
        self.ctx.storage.put(item.id, {"stored_at": nj.now()})
        print(f"{stamp()} stored {name}")

    async def upload_failed(self, error: Exception, item: nj.QueueItem) -> None:
        print(f"{stamp()} gave up on {item.payload['file_name']}: {error}")

    async def pending(self) -> list[str]:
        return [item.payload["file_name"] for item in self.queue.list()]

    async def dead_letters(self) -> list[str]:
        return [
            f"{d.item.payload['file_name']} ({d.attempts} attempts, last error: {d.error})"
            for d in self.queue.dead_letters()
        ]

    async def requeue_dead_letters(self) -> int:
        requeued = 0
        for letter in self.queue.dead_letters():
            if await self.queue.requeue(letter.item.id) is not None:
                requeued += 1
        return requeued


def show_retries(event: nj.Event) -> None:
    if event.type == "queue:retry":
        data = event.data
        print(f"{stamp()} retrying {data['id']} (attempt {data['attempt']} of"
              f" {data['max_attempts']})")


async def drained(uploads: nj.Stub) -> None:
    """Poll the object until its queue is empty (a caller outside the object sees it only
    through its stub)."""
    with trio.fail_after(10):
        while True:
            if not await uploads.pending():
                return
            await trio.sleep(0.02)


async def main(path: str) -> None:
    global START
    service = StorageService()
    async with nj.open_runtime(path, env=service) as rt:
        START = nj.now()
        rt.events.add_listener(show_retries)
        uploads = rt.get(UploadObject, "user-42")
        for name in ["cat.jpg", "notes.txt", "huge.iso", "dog.jpg", "report.pdf"]:
            await uploads.enqueue_upload(name)
        print(f"{stamp()} queued: {await uploads.pending()}")
        await drained(uploads)
        print("dead letters:", await uploads.dead_letters())

        print(f"{stamp()} the storage service raises its size limit; requeueing")
        service.rejects.clear()
        print("requeued:", await uploads.requeue_dead_letters())
        await drained(uploads)
        print("stored:", sorted(service.stored))
        print("dead letters left:", len(await uploads.dead_letters()))


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./data")
