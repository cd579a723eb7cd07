"""A host process of tests/test_postgres_cluster.py: one runtime on the PostgreSQL
engine, one of several sharing a database (DESIGN.md section 9).

Run: ``python tests/pg_cluster_worker.py CONFIG.json SLOT``. ``SLOT`` names the host's
place in the cluster (``h0``, ``h1`` ...); a restarted host keeps its slot and gets a new
pid and a new engine host id. The config holds:

- ``dsn``, ``log``: the database and the log file (appended to by every host);
- ``lease_ttl``: the engine's lease (seconds); ``idle_timeout``: the runtime's;
- ``workload``: ``{object id: number of jobs}`` — on start, a host pushes the workload of
  the objects in ``shares[SLOT]`` (once per object: ``Worker.add`` is atomic and marks
  the object as pushed, so a restarted host pushes nothing twice);
- ``lead``, ``spread``: job ``k`` of ``n`` is due at ``t0 + spread * k / n`` where ``t0`` is
  ``lead`` s after the host pushes it (a stream of work, not one burst, so that the kills
  and the pause land while jobs run);
- ``sleep``: ``[lo, hi]`` — each job sleeps uniform(lo, hi) s after its write;
- ``hold``: object ids this host activates (a call) once it is up, so that it holds
  their leases (the cross-host call test);
- ``calls``: if true, once up the host calls ``bump`` on a random object of the
  workload every few tens of ms, wherever that object lives.

Every log line is one ``os.write`` on an ``O_APPEND`` descriptor (atomic; it survives a
SIGKILL of the process):

    up <slot> <pid> <host_id> <t>                      runtime open, workload pushed
    start <slot> <pid> <object> <job> <epoch> <attempt> <t>   on_job began, under that lease
    done <slot> <pid> <object> <job> <epoch> <attempt> <t>    on_job returns (job complete)
    event <slot> <pid> <type> <object> <t>             object:fenced, job:crash_strike
    call <slot> <pid> <object> <value> <served by> <t> a bump call returned
    callerr <slot> <pid> <object> <error type> <t>     a bump call raised
    term <slot> <pid> <t>                              SIGTERM: leaving gracefully

``<epoch>`` is the lease epoch of the activation that runs the job: a start under an
epoch older than the object's current one is a start by a host that lost the object.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import trio

import nursery_jobs as nj
from nursery_jobs._engines.postgres._engine import PostgresEngine

LOG_FD = -1
SLOT = "?"
RUNTIME: nj.Runtime | None = None


def note(*parts: object) -> None:
    line = " ".join(str(p) for p in (*parts, f"{nj.now():.6f}")) + "\n"
    os.write(LOG_FD, line.encode())


def lease_epoch(namespace: str, object_id: str) -> int:
    """The lease epoch this process holds the object under (test-only: read from the
    runtime's host of the object; -1 when it has none)."""
    assert RUNTIME is not None
    host = RUNTIME._hosts.get((namespace, object_id))
    state = None if host is None else host.state
    return int(getattr(state, "epoch", -1))


class Worker(nj.DurableObject):
    namespace = "pg_cluster_worker.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.cfg: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def add(self, jobs: list[tuple[str, float]]) -> None:
        """Push this object's workload once, atomically, with a mark saying it was."""
        storage = self.ctx.storage
        with storage.transaction():
            if storage.get("pushed"):
                return
            for job_id, time in jobs:
                await self.lifecycle.jobs.push("count", id=job_id, time=time)
            storage.put("pushed", len(jobs))

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        pid, oid = os.getpid(), self.ctx.id
        epoch = lease_epoch(self.ctx.namespace, oid)
        note("start", SLOT, pid, oid, ctx.job.id, epoch, ctx.attempt)
        # The local effect: it commits with the job's outcome, so the counter must end
        # at exactly the number of jobs, however often hosts die or are fenced.
        storage = self.ctx.storage
        storage.put("count", storage.get("count", 0) + 1)
        lo, hi = self.cfg["sleep"]
        await trio.sleep(random.uniform(lo, hi))
        note("done", SLOT, pid, oid, ctx.job.id, epoch, ctx.attempt)
        return None

    async def bump(self) -> tuple[int, str]:
        """Count a call (in its own key, apart from the jobs' counter) and return the
        new count and the host that ran it. A value returned is durable (the output
        gate), so no two calls can ever return the same value."""
        value = int(self.ctx.storage.get("calls", 0)) + 1
        self.ctx.storage.put("calls", value)
        return value, SLOT

    async def report(self) -> dict[str, Any]:
        """What the test checks at the end, read through the API."""
        return {
            "pushed": self.ctx.storage.get("pushed"),
            "count": self.ctx.storage.get("count", 0),
            "calls": self.ctx.storage.get("calls", 0),
            "jobs": [job.id for job in self.lifecycle.jobs.list()],
            "dead": [letter.job.id for letter in self.lifecycle.dead_letters()],
        }

    async def whoami(self) -> str:
        return SLOT

    async def add_count(self, by: int) -> int:
        value = int(self.ctx.storage.get("count", 0)) + by
        self.ctx.storage.put("count", value)
        return value

    async def fail(self, text: str) -> None:
        raise KeyError(text)

    async def relay(self, object_id: str) -> tuple[str, str, int]:
        """Call ``object_id`` from this object's host: (this host, the host that ran the
        call, the object's count)."""
        target = self.ctx.get(Worker, object_id)
        return SLOT, await target.whoami(), await target.add_count(0)


def on_event(event: nj.Event) -> None:
    if event.type in ("object:fenced", "job:crash_strike"):
        note("event", SLOT, os.getpid(), event.type, event.object_id)


async def push_share(rt: nj.Runtime, cfg: dict[str, Any]) -> None:
    t0, spread = nj.now() + float(cfg["lead"]), float(cfg["spread"])
    for object_id in cfg["shares"].get(SLOT, []):
        n = int(cfg["workload"][object_id])
        jobs = [(f"{object_id}-{k:04d}", t0 + spread * k / n) for k in range(n)]
        while True:
            try:
                await rt.get(Worker, object_id).add(jobs)
                break
            except nj.RpcError:
                # The host that took the call died (a restarted host pushing again, a
                # kill): the call may or may not have run. It is idempotent: again.
                await trio.sleep(0.1)


async def call_around(rt: nj.Runtime, cfg: dict[str, Any]) -> None:
    objects = sorted(cfg["workload"])
    pid = os.getpid()
    while True:
        object_id = random.choice(objects)
        try:
            value, served = await rt.get(Worker, object_id).bump()
        except Exception as exc:
            note("callerr", SLOT, pid, object_id, type(exc).__name__)
        else:
            note("call", SLOT, pid, object_id, value, served)
        await trio.sleep(random.uniform(0.02, 0.06))


async def run(cfg: dict[str, Any]) -> None:
    global RUNTIME
    engine = PostgresEngine(cfg["dsn"], lease_ttl=cfg["lease_ttl"])
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def cancel_on_signal() -> None:
                async for _ in signals:
                    note("term", SLOT, os.getpid())
                    nursery.cancel_scope.cancel(reason="SIGTERM")
                    return

            nursery.start_soon(cancel_on_signal)
            # (stop_on=(): this worker turns SIGTERM into cancellation itself, above.)
            async with nj.open_runtime(engine, env=cfg, stop_on=(),
                                       idle_timeout=cfg.get("idle_timeout", 60.0)) as rt:
                RUNTIME = rt
                rt.events.add_listener(on_event)
                await push_share(rt, cfg)
                for object_id in cfg.get("hold", {}).get(SLOT, []):
                    await rt.get(Worker, object_id).whoami()
                note("up", SLOT, os.getpid(), engine.host_id)
                if cfg.get("calls"):
                    nursery.start_soon(call_around, rt, cfg)
                await trio.sleep_forever()


def main() -> None:
    global LOG_FD, SLOT
    cfg = json.loads(Path(sys.argv[1]).read_text())
    SLOT = sys.argv[2]
    LOG_FD = os.open(cfg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    trio.run(run, cfg)


if __name__ == "__main__":
    main()
