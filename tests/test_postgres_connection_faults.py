"""The PostgreSQL engine (DESIGN.md §9) at its edges: each test pins a promise that a
review found broken on PostgreSQL, in process, on a fresh database (``pg_dsn``); real
time.
Connection drops are made with ``pg_terminate_backend`` (what a server restart, a
failover or a proxy does to a host's connections).
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import pytest
import trio
from pg_support import sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._engines.postgres._engine import PostgresEngine


def terminate(dsn: str, pids: list[int] | None = None) -> None:
    """Drop connections to the test database: those of ``pids``, or all but this one."""
    if pids is None:
        sql(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()")
    else:
        sql(dsn, "SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) AS t(p)", (pids,))


# -- 1. a forwarded call gets ObjectMoved ---------------------------------------------------
class Counter(nj.DurableObject):
    namespace = "tests.pg_edges.Counter"

    async def increment(self, by: int = 1) -> int:
        value = int(self.ctx.storage.get("n", 0)) + by
        self.ctx.storage.put("n", value)
        return value

    async def host_of(self) -> Any:
        return self.ctx.env


def _hold_object_rows(dsn: str, seconds: float, held: threading.Event) -> None:
    """A slow moment of the server: the object rows stay locked for ``seconds`` (the
    holder's renewal waits, so its lease goes unconfirmed past LEASE_TRUST)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1 FROM nj_objects FOR UPDATE")
        held.set()
        time.sleep(seconds)
        conn.rollback()


async def test_a_forwarded_call_never_gets_object_moved_from_the_holder(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ObjectMoved never reaches a caller (Stub.call routes the call
    again). A call forwarded to a host whose lease is not confirmed right now (its
    renewal is late) is refused by ``admit`` there; that refusal must travel back as
    "moved", not as the call's exception."""
    import nursery_jobs._engines.postgres._engine as engine_pg

    monkeypatch.setattr(engine_pg, "OWNER_HINT_TTL", 60.0)  # B keeps forwarding to A
    ttl = 1.0
    async with nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=ttl), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=ttl), env="B") as b:
        assert await a.get(Counter, "c").increment() == 1
        assert await b.get(Counter, "c").host_of() == "A"  # forwarded; B keeps the hint
        held = threading.Event()
        locker = threading.Thread(target=_hold_object_rows, args=(pg_dsn, 2.0, held))
        locker.start()
        try:
            await trio.to_thread.run_sync(held.wait)
            await trio.sleep(1.2 * ttl)  # A's renewal is stuck past LEASE_TRUST * ttl
            with trio.fail_after(15):
                assert await b.get(Counter, "c").increment() == 2
        finally:
            await trio.to_thread.run_sync(locker.join)


# -- 2. the output gate's ship is skipped when a job starts writing meanwhile ------------------
class Gate(nj.DurableObject):
    namespace = "tests.pg_edges.Gate"
    started: ClassVar[trio.Event]
    go: ClassVar[trio.Event]

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        Gate.started.set()
        await Gate.go.wait()
        self.ctx.storage.put("job-" + ctx.job.id, 1)  # the job writes, then works on
        await trio.sleep(0.5)

    async def push(self, job_id: str) -> None:
        await self.lifecycle.jobs.push("f", id=job_id)

    @nj.interleave  # (the running job waits for it: it must not wait for the job)
    async def poke(self, key: str) -> None:
        Gate.go.set()
        async with self.ctx.turn():  # after the job; the run goes on once it leaves
            self.ctx.storage.put(key, "told")


async def test_a_calls_write_is_in_postgresql_when_it_returns_beside_a_running_job(
    pg_dsn: str,
) -> None:
    """The output gate (§3, §9: "durable" meaning "committed in PostgreSQL"): when a
    call returns, its writes are committed in PostgreSQL. ``PgObject.sync`` takes its
    lock (a schedule point) and then skips the ship if a transaction is open: a job
    that writes in that moment opens the group, and the call returns unshipped."""
    unshipped = []
    async with nj.open_runtime(pg_dsn) as rt:
        g = rt.get(Gate, "g")
        for i in range(10):
            Gate.started, Gate.go = trio.Event(), trio.Event()
            await g.push(f"j{i}")
            await Gate.started.wait()
            await g.poke(f"poke-{i}")  # told success
            if not sql(pg_dsn, "SELECT 1 FROM nj_rows WHERE key = %s", (f"poke-{i}",)):
                unshipped.append(i)
            await trio.sleep(0.6)
    assert unshipped == []


# -- 3. a graceful shutdown loses completed jobs' completions ---------------------------------
class Batch(nj.DurableObject):
    namespace = "tests.pg_edges.Batch"
    runs: ClassVar[list[str]] = []
    slow_started: ClassVar[trio.Event]

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self, completion_group=1)

    async def on_job(self, ctx: nj.JobContext) -> None:
        Batch.runs.append(ctx.job.id)
        if ctx.job.id == "slow":
            Batch.slow_started.set()
            await trio.sleep(30)

    async def push(self, job_id: str, at: float) -> None:
        await self.lifecycle.jobs.push("f", id=job_id, time=at)


async def test_a_graceful_shutdown_during_a_long_job_does_not_rerun_completed_jobs(
    pg_dsn: str,
) -> None:
    """completion_group=1 commits each completion; a graceful shutdown "is no failure"
    (§3): only the job it cut off runs again (as on the files engine). On PostgreSQL
    the completions committed before the long job never ship (the ship loop and
    ``sync`` skip while the long job's group is open, and closing the working copy
    ships nothing), so every completed job of the run runs again."""
    Batch.runs, Batch.slow_started = [], trio.Event()
    async with nj.open_runtime(pg_dsn) as rt:
        b = rt.get(Batch, "b")
        at = nj.now() + 0.5
        for i in range(5):
            await b.push(f"quick-{i}", at)
        await b.push("slow", at)
        with trio.fail_after(10):
            await Batch.slow_started.wait()
        await trio.sleep(0.3)  # well past SHIP_INTERVAL
    assert Batch.runs == [*(f"quick-{i}" for i in range(5)), "slow"]
    async with nj.open_runtime(pg_dsn) as rt:
        Batch.slow_started = trio.Event()
        await rt.activate(Batch, "b")
        with trio.fail_after(10):
            await Batch.slow_started.wait()
    assert Batch.runs == [*(f"quick-{i}" for i in range(5)), "slow", "slow"]


# -- 4. a dropped connection at an alarm run's end crashes the object; its job runs again ----
class Dropper(nj.DurableObject):
    namespace = "tests.pg_edges.Dropper"
    runs: ClassVar[list[str]] = []
    dsn: ClassVar[str] = ""

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        Dropper.runs.append(ctx.job.id)
        self.ctx.storage.put("n", self.ctx.storage.get("n", 0) + 1)
        terminate(Dropper.dsn)  # the server drops the host's connections meanwhile

    async def push(self, job_id: str) -> None:
        await self.lifecycle.jobs.push("f", id=job_id, delay=0.3)

    async def ping(self) -> None:
        pass


async def test_a_dropped_connection_at_an_alarm_runs_end_neither_crashes_nor_reruns(
    pg_dsn: str,
) -> None:
    """``PgObject.sync`` documents StorageError as "the changes ship next time", but
    ``ObjectHost._alarm_task`` lets it out of the run: the object crashes
    (``object:error``), its working copy — the completed job's outcome and write — is
    thrown away, and the job runs again; no host died."""
    Dropper.runs, Dropper.dsn = [], pg_dsn
    events: list[str] = []
    async with nj.open_runtime(pg_dsn) as rt:
        rt.events.add_listener(lambda event: events.append(event.type))
        async with trio.open_nursery() as nursery:  # the pool grows to its size
            for i in range(30):
                nursery.start_soon(rt.get(Dropper, f"warm{i}").ping)
        await rt.get(Dropper, "d").push("once")
        await trio.sleep(2.0)
    assert Dropper.runs == ["once"]
    assert "object:error" not in events
    async with nj.open_runtime(pg_dsn) as rt:
        await rt.activate(Dropper, "d")
        await trio.sleep(1.0)
    assert Dropper.runs == ["once"]  # ran once, not again on the next activation
    assert sql(pg_dsn, "SELECT data FROM nj_rows WHERE object_id = 'd' AND key = 'n'") == [
        ('["n", "1"]',)]


# -- 5. a NUL in a storage key wedges the object's shipping for good ---------------------------
class KV(nj.DurableObject):
    namespace = "tests.pg_edges.KV"

    async def put(self, key: str, value: Any) -> None:
        self.ctx.storage.put(key, value)


async def test_a_nul_in_a_storage_key_does_not_wedge_the_object(pg_dsn: str) -> None:
    """A hostile key ("a\\x00b": a valid str, stored fine by SQLite) cannot go into a
    PostgreSQL text column. The failed ship is restored into the change set, so every
    later sync of the object fails the same way: each call gets StorageError and none
    of its writes ever reaches PostgreSQL (they go at eviction). The same for a job id
    with a NUL (and it would stall the host's flight list: jsonb refuses \\u0000)."""
    async with nj.open_runtime(pg_dsn) as rt:
        kv = rt.get(KV, "o")
        await kv.put("ok", 1)
        with pytest.raises(nj.NurseryJobsError):
            await kv.put("bad\x00key", 2)  # refused (or stored): either is fine
        await kv.put("ok", 3)  # ...but the object must go on working
    assert sql(pg_dsn, "SELECT data FROM nj_rows WHERE key = 'ok'") == [('["ok", "3"]',)]


# -- 6. a forwarded call's wait that hits a dropped connection raises psycopg's error ----------
class Remote(nj.DurableObject):
    namespace = "tests.pg_edges.Remote"
    dsn: ClassVar[str] = ""
    pids: ClassVar[list[int] | None] = None

    async def host_of(self) -> Any:
        return self.ctx.env

    async def bump(self) -> int:
        n = self.ctx.storage.get("n", 0) + 1
        self.ctx.storage.put("n", n)
        terminate(Remote.dsn, Remote.pids)
        return n


async def test_a_forwarded_call_over_a_dropped_connection_raises_a_typed_error(
    pg_dsn: str,
) -> None:
    """§9: a forwarded call raises "the same exceptions (RpcError for transport
    failures, typed)". ``CallRouter.forward`` lets psycopg's own errors out of its
    database waits (``_check``, ``_collect``, ``_send``)."""
    Remote.dsn, Remote.pids = pg_dsn, None
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Remote, "r").host_of() == "A"
        assert await b.get(Remote, "r").host_of() == "A"
        with trio.fail_after(15):
            try:
                await b.get(Remote, "r").bump()
            except nj.NurseryJobsError:
                pass  # RpcError / StorageError: typed, as promised


# -- 7. a forwarded call whose answer was lost waits for ever -----------------------------------
async def test_a_forwarded_call_whose_answer_was_lost_does_not_wait_forever(
    pg_dsn: str,
) -> None:
    """The holder ran the call, but its answer (``_pg_calls._answer``) hit a dropped
    connection: it is logged and never sent again. The call row stays 'running', the
    holder stays alive and keeps its lease, so the caller's checks (``forward``) wait
    for ever — the caller is wedged, not told (RpcError) nor answered."""
    Remote.dsn = pg_dsn
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Remote, "r").host_of() == "A"
        assert await b.get(Remote, "r").host_of() == "A"
        pool: Any = a.engine._statements.pool  # type: ignore[attr-defined]
        Remote.pids = [conn.info.backend_pid for conn in list(pool._pool)]  # A's only
        try:
            with trio.move_on_after(10) as waited:
                try:
                    await b.get(Remote, "r").bump()
                except nj.NurseryJobsError:
                    pass
            assert not waited.cancelled_caught, (
                f"the caller still waits; calls: {sql(pg_dsn, 'SELECT state FROM nj_calls')}")
        finally:
            Remote.pids = None
