"""One object per task, the alarm as the scheduler: a PDF summariser.

Each summarise request is its own object (its id is the document's), holding one job:
``summarise``. Nothing polls a shared queue. The request pushes the job with a jittered
delay (``nj.jitter``), so that a burst of requests does not wake every object in the
same millisecond, and the runtime's timer wakes each object when its alarm is due. The
summariser is slow and flaky: a timeout is retried (a durable re-time of the job, with
backoff), a corrupt file fails every attempt and ends in the object's dead letters,
where an operator can inspect it and ``requeue`` it.

Run: python examples/pdf_summariser.py [data-dir]   (about 2 seconds)
"""

from __future__ import annotations

import random
import sys
from typing import Any

import trio

import nursery_jobs as nj

DOCUMENTS = 20
CORRUPT = {"doc-07", "doc-13"}  # fail on every attempt
FLAKY = {f"doc-{n:02d}" for n in range(0, DOCUMENTS, 3)}  # time out on the first attempt
START_DELAY = 0.5  # production: minutes; spread by up to half again
RETRY = nj.RetryOptions(max_attempts=3, base_delay=0.05, max_delay=0.2)


class SummariserTimeout(Exception):
    pass


async def summarise(url: str, attempt: int) -> str:
    """A slow, flaky summariser (a model behind an HTTP API, say)."""
    await trio.sleep(random.uniform(0.1, 0.3))
    name = url.rsplit("/", 1)[-1].removesuffix(".pdf")
    if name in CORRUPT:
        raise ValueError(f"{url}: not a PDF (bad xref table)")
    if name in FLAKY and attempt == 1:
        raise SummariserTimeout(f"{url}: summariser timed out")
    return f"{random.choice(['quarterly results', 'a lease', 'a thesis'])}, 3 pages"


class PdfSummary(nj.DurableObject):
    """The summary of one document."""

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def request(self, url: str) -> float:
        """Ask for a summary; returns the delay it will start after."""
        self.ctx.storage.put("url", url)
        self.ctx.storage.delete("summary")
        delay = nj.jitter(START_DELAY, 0.5)
        # A stable id: asking twice keeps one job.
        await self.lifecycle.jobs.push("summarise", id="summarise", delay=delay,
                                       payload={"url": url}, retry=RETRY)
        return delay

    async def status(self) -> dict[str, Any]:
        letters = self.lifecycle.dead_letters()
        if letters:
            return {"state": "failed", "error": letters[0].error,
                    "attempts": letters[0].attempts}
        summary = self.ctx.storage.get("summary")
        if summary is not None:
            return {"state": "done", "summary": summary}
        return {"state": "queued"}

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn != "summarise":
            return None
        summary = await summarise(ctx.job.payload["url"], ctx.attempt)
        self.ctx.storage.put("summary", summary)
        note = "" if ctx.attempt == 1 else f" (attempt {ctx.attempt})"
        print(f"  {self.ctx.id}: {summary}{note}")
        return None


async def main(path: str) -> None:
    async with nj.open_runtime(path, idle_timeout=1.0) as rt:
        retries: list[nj.Event] = []
        rt.events.add_listener(lambda e: retries.append(e) if e.type == "job:retry" else None)
        ids = [f"doc-{n:02d}" for n in range(DOCUMENTS)]
        delays = [await rt.get(PdfSummary, i).request(f"s3://inbox/{i}.pdf") for i in ids]
        print(f"queued {len(ids)} summarise requests, one object each; they start"
              f" {min(delays):.2f}-{max(delays):.2f} s from now")
        with trio.fail_after(30):
            while True:
                statuses = {i: await rt.get(PdfSummary, i).status() for i in ids}
                if all(s["state"] != "queued" for s in statuses.values()):
                    break
                await trio.sleep(0.1)
        failed = {i: s for i, s in statuses.items() if s["state"] == "failed"}
        print(f"{len(retries)} attempts failed and were retried")
        print(f"summarised {len(ids) - len(failed)} of {len(ids)};"
              f" {len(failed)} in the dead letters:")
        for object_id, status in sorted(failed.items()):
            print(f"  {object_id}: {status['error']} ({status['attempts']} attempts)")
        await trio.sleep(1.5)
        print(f"objects in memory once idle: {rt.statistics().active_objects}")


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./data")
