"""Runtimes on the PostgreSQL engine (DESIGN.md §9): the same API — stubs, storage KV,
Lifecycle jobs, Queue, Scheduler — and calls between two hosts. Real time (PostgreSQL
I/O runs in threads), short delays."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from pg_support import eventually

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._engines.postgres._engine import PostgresEngine


class Counter(nj.DurableObject):
    namespace = "tests.pg.Counter"

    async def increment(self, by: int = 1) -> int:
        value = int(self.ctx.storage.get("n", 0)) + by
        self.ctx.storage.put("n", value)
        return value

    async def read(self) -> int:
        return int(self.ctx.storage.get("n", 0))

    async def host_of(self) -> Any:
        return self.ctx.env

    async def fail(self) -> None:
        raise KeyError("no such thing")

    async def raw_sql(self) -> None:
        self.ctx.storage.execute("SELECT 1")


class Worker(nj.DurableObject):
    """Jobs, a Queue and a Scheduler on one Lifecycle; runs are recorded in storage."""

    namespace = "tests.pg.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.queue = nj.Queue({"item": self._item})
        self.scheduler = nj.Scheduler({"tick": self._tick})
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue, self.scheduler)

    def _log(self, entry: str) -> None:
        storage = self.ctx.storage
        storage.put("log", [*storage.get("log", []), entry])

    async def on_job(self, ctx: nj.JobContext) -> None:
        if ctx.job.fn == "flaky" and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        self._log(f"job:{ctx.job.id}:{ctx.attempt}")

    async def _item(self, payload: Any, item: nj.QueueItem) -> None:
        self._log(f"item:{payload}")

    async def _tick(self, payload: Any, schedule: Any) -> None:
        self._log("tick")

    async def push(self, job_id: str, fn: str = "plain", delay: float = 0.0) -> None:
        await self.lifecycle.jobs.push(
            fn, id=job_id, delay=delay, retry=nj.RetryOptions(base_delay=0.05, jitter=False)
        )

    async def enqueue(self, payload: str) -> None:
        await self.queue.push("item", payload)

    async def every(self, seconds: float) -> None:
        await self.scheduler.every(seconds, "tick", id="ticker")

    async def log(self) -> list[str]:
        return list(self.ctx.storage.get("log", []))


async def wait_for(predicate: Any, seconds: float = 10.0) -> None:
    await eventually(predicate, seconds)


async def test_kv_survives_restart_and_raw_sql_is_refused(pg_dsn: str) -> None:
    async with nj.open_runtime(pg_dsn) as rt:
        c = rt.get(Counter, "c1")
        assert await c.increment(2) == 2
        assert await c.increment() == 3
        with pytest.raises(nj.StorageError, match="PostgreSQL engine"):
            await c.raw_sql()
    async with nj.open_runtime(pg_dsn) as rt:
        assert await rt.get(Counter, "c1").read() == 3


async def test_jobs_queue_and_scheduler_run_and_persist(pg_dsn: str) -> None:
    async with nj.open_runtime(pg_dsn, idle_timeout=0.2) as rt:
        w = rt.get(Worker, "w1")
        await w.push("a")
        await w.push("b", fn="flaky")
        await w.enqueue("x")
        await w.enqueue("y")
        await w.every(0.3)

        async def done() -> bool:
            log = await w.log()
            return {"job:a:1", "job:b:2", "item:x", "item:y"} <= set(log) and "tick" in log

        await wait_for(done)
        log = await w.log()
        assert log.index("item:x") < log.index("item:y")
        # Evicted (idle_timeout) and claimed again from PostgreSQL by its alarm.
        await w.push("later", delay=0.5)
        await trio.sleep(0.3)

        async def later() -> bool:
            return "job:later:1" in await w.log()

        await wait_for(later)
    async with nj.open_runtime(pg_dsn) as rt:
        # The scheduler's alarm brings the object back on a new runtime.
        w = rt.get(Worker, "w1")
        count = (await w.log()).count("tick")

        async def ticked() -> bool:
            return (await w.log()).count("tick") > count

        await wait_for(ticked)


async def test_a_call_reaches_the_host_that_holds_the_object(pg_dsn: str) -> None:
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Counter, "c").increment() == 1
        stub = b.get(Counter, "c")
        assert await stub.host_of() == "A"  # ran on A, which holds the lease
        assert await stub.increment(5) == 6
        assert await a.get(Counter, "c").read() == 6
        with pytest.raises(KeyError, match="no such thing"):
            await stub.fail()
        # An object nobody holds is activated by the caller's host.
        assert await b.get(Counter, "d").host_of() == "B"
        assert await a.get(Counter, "d").host_of() == "B"


async def test_cancelling_a_forwarded_call_cancels_the_wait(pg_dsn: str) -> None:
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        await a.get(Counter, "c").increment()
        with trio.move_on_after(0.001):
            await b.get(Counter, "c").increment()
        assert await b.get(Counter, "c").read() in (1, 2)


async def test_a_call_to_a_dead_hosts_object_is_served_once_its_lease_expires(
    pg_dsn: str,
) -> None:
    async with nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=1.0), env="B") as b:
        async with nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=1.0), env="A") as a:
            await a.get(Counter, "c").increment()
            engine: Any = a.engine
            # A "dies": it stops renewing and never releases its leases.
            engine._statements.pool, pool = None, engine._statements.pool
            a._nursery.cancel_scope.cancel()  # type: ignore[union-attr]
        pool.close()
        with psycopg.connect(pg_dsn) as conn:
            owner = conn.execute("SELECT owner FROM nj_objects").fetchone()
        assert owner == (engine.host_id,)
        with trio.fail_after(10):
            assert await b.get(Counter, "c").increment() == 2
        assert await b.get(Counter, "c").host_of() == "B"


async def test_a_call_after_the_holder_released_the_object_is_served_by_the_caller(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import nursery_jobs._engines.postgres._engine as engine_pg

    # The caller's hint of where the object lives outlasts the test: only the holder's
    # answer ("moved") can send the call back to the caller.
    monkeypatch.setattr(engine_pg, "OWNER_HINT_TTL", 60.0)
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A", idle_timeout=0.3) as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Counter, "c").increment() == 1
        assert await b.get(Counter, "c").host_of() == "A"  # forwarded; B keeps the hint

        def released() -> bool:
            with psycopg.connect(pg_dsn) as conn:
                return conn.execute("SELECT owner FROM nj_objects").fetchone() == (None,)

        await wait_for(released)  # A evicted the idle object and gave up its lease
        assert await b.get(Counter, "c").host_of() == "B"
        assert await b.get(Counter, "c").read() == 1
        assert await a.get(Counter, "c").host_of() == "B"


class Bouncer(nj.DurableObject):
    """Calls a peer that calls back: A -> B -> A, each object held by another host."""

    namespace = "tests.pg.Bouncer"

    async def where(self) -> Any:
        return self.ctx.env

    async def bounce(self, peer: str, hops: int) -> list[str]:
        self.ctx.storage.put("visits", self.ctx.storage.get("visits", 0) + 1)
        if hops == 0:
            return [f"{self.ctx.id}@{self.ctx.env}"]
        trail: list[str] = await self.ctx.get(Bouncer, peer).bounce(self.ctx.id, hops - 1)
        return [f"{self.ctx.id}@{self.ctx.env}", *trail]

    async def visits(self) -> int:
        found: int = self.ctx.storage.get("visits", 0)
        return found


async def test_a_call_chain_back_across_hosts_reenters_the_held_turn(pg_dsn: str) -> None:
    """A (held by host A) calls B (held by host B), which calls A back: the call chain
    travels with the forwarded calls, so the call back runs inside A's held turn instead
    of waiting for it (a deadlock)."""
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Bouncer, "a").where() == "A"
        assert await b.get(Bouncer, "b").where() == "B"
        with trio.fail_after(20):
            trail = await a.get(Bouncer, "a").bounce("b", 4)
        assert trail == ["a@A", "b@B", "a@A", "b@B", "a@A"]
        assert await a.get(Bouncer, "a").visits() == 3
        assert await b.get(Bouncer, "b").visits() == 2
