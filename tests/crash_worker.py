"""The worker process of tests/test_crash.py: a runtime on a data directory, doing jobs.

Run: ``python tests/crash_worker.py CONFIG.json [key=json-value ...]`` (the extra
arguments override config keys for this run). The config holds:

- ``data``, ``log``: the data directory and the log file (appended to by every run);
- ``objects``: object ids; ``jobs``: jobs per object (ids ``<object>-<nnnn>``);
- ``sleep``: ``[lo, hi]`` — each job sleeps uniform(lo, hi) s of runtime time;
- ``group``: the Lifecycle's ``completion_group`` (null: the library default);
- ``poison``: ``[object, index]`` — that job kills its own process (SIGKILL) on every
  run, or null;
- ``heartbeat``: seconds, or null. If set, every job is a heartbeat instead: it starts
  long work (``work <job> <pid> <t>``, then sleeps forever) with ``track_alarm_work`` if
  this activation has none, and returns ``Reschedule(now + heartbeat)``;
- ``marks``: if true, a task calls ``mark(n)`` (n: ``time.monotonic_ns()``, increasing
  across worker processes) on the first object every few ms, which
  stores ``n`` and returns; ``mark <n>`` is logged once the call returned (the output
  gate: the value must be durable by then);
- ``clock_rate``: 1 runs on the real clock. Above 1 the runtime's clock runs that much
  faster than real time (a ``trio.testing.MockClock`` with that rate), anchored so that
  runtime time is ``origin + rate * (real time - origin)`` in every run: one continuous
  clock across restarts, where the 30 s, 60 s ... crash-strike delays pass in a fraction
  of the real time. Nothing else changes: the kills, files and recovery are real.

The workload is pushed on the first run only (a marker file says it was). Every line of
the log is written with one ``os.write`` on an ``O_APPEND`` descriptor — atomic, and in
the page cache, which outlives a SIGKILL of this process (no fsync needed):

    up <pid> <t>                         the runtime is open and the workload pushed
    start <job> <pid> <attempt> <t>      on_job began
    work <job> <pid> <t>                 a heartbeat started its tracked work
    done <job> <pid> <attempt> <t>       on_job is about to return None (job complete)
    mark <n> <pid> <t>                   a call that stored n returned
    strike <job> <pid> <strikes> <sealed> <t>   a job:crash_strike event
    term <pid> <t>                       SIGTERM/SIGINT: leaving the runtime gracefully
    finished <pid> <t>                   no alarm left: every job completed or sealed

``<t>`` is the runtime's clock (``nj.now()``). The process exits 0 when it finishes or
after SIGTERM/SIGINT, which the runtime turns into a graceful stop (``stop_on``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs import _clock

LOG_FD = -1


def note(*parts: object) -> None:
    line = " ".join(str(p) for p in (*parts, f"{nj.now():.6f}")) + "\n"
    os.write(LOG_FD, line.encode())


class Worker(nj.DurableObject):
    namespace = "crash_worker.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.cfg: dict[str, Any] = ctx.env
        group = self.cfg.get("group")
        if group is None:
            self.lifecycle = nj.Lifecycle.install(self)
        else:
            self.lifecycle = nj.Lifecycle.install(self, completion_group=group)
        self.working = False

    async def add(self, jobs: list[tuple[str, str]]) -> None:
        """Push this object's workload once: atomically, with a mark saying it was (a
        death while another object's workload is pushed must not push this one again:
        that would replace jobs that ran, and reset their crash strikes)."""
        storage = self.ctx.storage
        with storage.transaction():
            if storage.get("workload-pushed"):
                return
            for job_id, fn in jobs:
                await self.lifecycle.jobs.push(fn, id=job_id)
            storage.put("workload-pushed", True)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        pid = os.getpid()
        note("start", ctx.job.id, pid, ctx.attempt)
        if ctx.job.fn == "beat":
            if not self.working:
                self.working = True
                self.lifecycle.track_alarm_work(self._work, ctx.job.id)
            note("done", ctx.job.id, pid, ctx.attempt)
            return nj.Reschedule(nj.now() + self.cfg["heartbeat"])
        # A local effect per job: the counter must end at exactly the number of jobs,
        # however often the process is killed (its write commits with the outcome).
        storage = self.ctx.storage
        storage.put("count", storage.get("count", 0) + 1)
        lo, hi = self.cfg["sleep"]
        await trio.sleep(random.uniform(lo, hi))
        if ctx.job.fn == "poison":
            os.kill(pid, signal.SIGKILL)
        note("done", ctx.job.id, pid, ctx.attempt)
        return None

    async def mark(self, n: int) -> None:
        self.ctx.storage.put("mark", n)

    async def _work(self, job_id: str) -> None:
        note("work", job_id, os.getpid())
        await trio.sleep_forever()


def on_event(event: nj.Event) -> None:
    if event.type == "job:crash_strike":
        data = event.data
        note("strike", data["id"], os.getpid(), data["strikes"], int(data["sealed"]))
    elif event.type == "runtime:stopping":
        note("term", os.getpid())


async def push_workload(rt: nj.Runtime, cfg: dict[str, Any]) -> None:
    poison = cfg.get("poison")
    for object_id in cfg["objects"]:
        jobs = []
        for i in range(cfg["jobs"]):
            fn = "poison" if poison == [object_id, i] else "work"
            if cfg.get("heartbeat"):
                fn = "beat"
            jobs.append((f"{object_id}-{i:04d}", fn))
        await rt.get(Worker, object_id).add(jobs)


async def call_marks(rt: nj.Runtime, cfg: dict[str, Any]) -> None:
    obj = rt.get(Worker, cfg["objects"][0])
    while True:
        # Increasing across worker processes too (one clock for the whole machine), so
        # the stored mark is at least any mark a killed worker saw returned.
        n = time.monotonic_ns()
        await obj.mark(n)
        os.write(LOG_FD, f"mark {n} {os.getpid()} {nj.now():.6f}\n".encode())
        await trio.sleep(0.003)


async def run(cfg: dict[str, Any]) -> None:
    rate = float(cfg.get("clock_rate", 1))
    if rate != 1:
        origin = float(cfg["clock_origin"])
        _clock.set_epoch(origin + rate * (time.time() - origin) - trio.current_time())
    data = Path(cfg["data"])
    marker = data / "workload-pushed"
    async with trio.open_nursery() as nursery:
        # SIGTERM and SIGINT are the runtime's graceful stop (stop_on): its block exits
        # normally, "term" noted from its runtime:stopping event.
        # ``layout``: "files" (a file per object, the default) or "shared" (one database).
        location = f"shared:{data}" if cfg.get("layout") == "shared" else data
        async with nj.open_runtime(location, env=cfg,
                                   stop_on=(signal.SIGTERM, signal.SIGINT)) as rt:
            rt.events.add_listener(on_event)
            if not marker.exists():
                await push_workload(rt, cfg)
                marker.touch()
            note("up", os.getpid())
            if cfg.get("marks"):
                nursery.start_soon(call_marks, rt, cfg)
            while True:
                stats = rt.statistics()
                if stats.pending_alarms == 0 and stats.alarms_in_flight == 0:
                    break
                await trio.sleep(0.02 * rate)
            note("finished", os.getpid())
        nursery.cancel_scope.cancel(reason="finished")


def main() -> None:
    global LOG_FD
    cfg = json.loads(Path(sys.argv[1]).read_text())
    for arg in sys.argv[2:]:
        key, _, value = arg.partition("=")
        cfg[key] = json.loads(value)
    LOG_FD = os.open(cfg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    rate = float(cfg.get("clock_rate", 1))
    clock = None if rate == 1 else trio.testing.MockClock(rate=rate)
    trio.run(run, cfg, clock=clock)


if __name__ == "__main__":
    main()
