"""A foreign lock on the engine's PostgreSQL tables (issue 22 #4): deadlines hold (a
cancelled caller's statement is cancelled on the server), the stall is reported once
(``storage:slow``), statements give up by themselves (``lock_timeout`` /
``statement_timeout``), and the runtime heals when the lock goes. Real time: a stall is
the server's, on its clock (no MockClock); kept short."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio.testing
from pg_support import eventually, sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj


class Counter(nj.DurableObject):
    namespace = "tests.pg.StallCounter"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ctx.storage.put(f"ran:{ctx.job.id}", True)

    async def increment(self) -> int:
        value = int(self.ctx.storage.get("n", 0)) + 1
        self.ctx.storage.put("n", value)
        return value

    async def push(self, job_id: str) -> None:
        await self.lifecycle.jobs.push("work", id=job_id)

    async def ran(self, job_id: str) -> bool:
        return bool(self.ctx.storage.get(f"ran:{job_id}", False))


@contextmanager
def foreign_lock(dsn: str, table: str = "nj_rows", at_most: float = 8.0) -> Iterator[None]:
    """Another session holds ``LOCK TABLE <table> IN ACCESS EXCLUSIVE MODE`` — from a
    thread of its own, for ``at_most`` seconds at most, so that code which cannot honour a
    deadline fails the test late instead of hanging it."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(dsn) as conn:
            conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(at_most)
            conn.rollback()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


def test_the_engines_connections_carry_lock_and_statement_timeouts(pg_dsn: str) -> None:
    from pg_support import opened

    with opened(pg_dsn, lease_ttl=6) as engine:
        assert engine._statements.pool is not None
        with engine._statements.pool.connection() as conn:
            got = [conn.execute(f"SHOW {name}").fetchone()[0]
                   for name in ("lock_timeout", "statement_timeout")]
    assert got == ["9s", "18s"]


async def test_a_deadline_holds_under_a_foreign_lock_and_the_runtime_heals(
    pg_dsn: str, caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[nj.Event] = []
    async with nj.open_runtime(pg_dsn) as rt:
        rt.events.add_listener(events.append)
        active = rt.get(Counter, "active")
        assert await active.increment() == 1
        with foreign_lock(pg_dsn):
            # An active object: the call's writes cannot ship.
            started = time.monotonic()
            with pytest.raises(trio.TooSlowError), trio.fail_after(3):
                await active.increment()
            assert time.monotonic() - started < 3.5
            # An object to activate: its rows cannot be read.
            started = time.monotonic()
            with pytest.raises(trio.TooSlowError), trio.fail_after(3):
                await rt.get(Counter, "fresh").increment()
            assert time.monotonic() - started < 3.5
        # One stall, one event; never called a takeover (one host here).
        slow = [e for e in events if e.type == "storage:slow"]
        assert len(slow) == 1, slow
        assert slow[0].data["seconds"] >= 1.0 and slow[0].data["statements"] >= 1
        assert not [e for e in events if e.type == "object:fenced"]
        assert "another host" not in caplog.text
        # Healed: calls work again (the cancelled call's write shipped meanwhile or
        # ships now: cancelling it cancels the wait, not the write) and jobs run.
        with trio.fail_after(10):
            assert await active.increment() == 3
            assert await rt.get(Counter, "fresh").increment() == 1
            await active.push("j1")
            await eventually(lambda: active.ran("j1"))
        assert len([e for e in events if e.type == "storage:slow"]) == 1
    # Everything the healed runtime said it did is in PostgreSQL.
    assert sql(pg_dsn, "SELECT object_id, count(*) FROM nj_rows WHERE tbl = 'nj_kv'"
                       " GROUP BY object_id ORDER BY object_id") == [("active", 2), ("fresh", 1)]


async def test_a_statement_blocked_past_lock_timeout_gives_up_by_itself(pg_dsn: str) -> None:
    # lease_ttl 0.4 s: lock_timeout 0.6 s. A call whose object cannot be read fails with
    # a StorageError naming the object, no deadline needed.
    async with nj.open_runtime(pg_dsn, lease_ttl=0.4) as rt:
        with foreign_lock(pg_dsn):
            started = time.monotonic()
            with trio.fail_after(5), pytest.raises(nj.StorageError, match="lock timeout"):
                await rt.get(Counter, "c").increment()
            assert time.monotonic() - started < 1.5
        with trio.fail_after(5):
            assert await rt.get(Counter, "c").increment() == 1


async def test_a_lone_host_whose_renewals_stall_never_calls_it_a_takeover(
    pg_dsn: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # lease_ttl 1 s: the lease is trusted for 0.9 s after its last renewal. Renewals
    # wait on the foreign lock; the object is dropped when its lease is no longer known
    # to hold — for that reason, not "taken over by another host" (there is none).
    events: list[nj.Event] = []
    async with nj.open_runtime(pg_dsn, lease_ttl=1.0) as rt:
        rt.events.add_listener(events.append)
        c = rt.get(Counter, "c")
        assert await c.increment() == 1
        with foreign_lock(pg_dsn, "nj_objects"):
            await trio.sleep(1.2)  # past the lease's trust
            with pytest.raises(trio.TooSlowError), trio.fail_after(1):
                await c.increment()  # dropped here; its reactivation waits on the lock
        fenced = [e.data["reason"] for e in events if e.type == "object:fenced"]
        assert len(fenced) == 1 and "not renewed within lease_ttl" in fenced[0], fenced
        assert "taken over by another host" not in caplog.text
        with trio.fail_after(10):
            assert await c.increment() == 2  # healed: taken back, reloaded


class _Conn:
    def cancel_safe(self, timeout: float) -> None:
        pass  # (the statement's thread is abandoned; the gate releases it)


class _Pool:
    @contextmanager
    def connection(self) -> Iterator[_Conn]:
        yield _Conn()


class _Events:
    def __init__(self) -> None:
        self.slow: list[dict[str, object]] = []

    def emit(self, type_: str, namespace: str, object_id: str, **data: object) -> None:
        assert type_ == "storage:slow"
        self.slow.append(data)


async def test_a_stall_is_one_while_the_next_statement_waits_behind_the_same_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stall watch on a clock of the test's: a statement blocked behind a lock
    (a ship) is given up by its caller; a statement on another table answers at once (a
    lease take), and the next one sent behind the same lock (the activation's read)
    waits. Until it had waited the whole threshold, the watch took the quick answer to
    mean the server answers again: one stall, two ``storage:slow`` events (CI, in
    test_a_deadline_holds_under_a_foreign_lock_and_the_runtime_heals)."""
    from nursery_jobs._engines.postgres import _statements

    now = [0.0]
    permits_send, permits = trio.open_memory_channel[None](0)

    async def sleep(seconds: float, stopping: threading.Event) -> None:
        await permits.receive()  # (the test moves the clock, then lets a tick run)

    async def tick_at(when: float) -> None:
        now[0] = when
        await permits_send.send(None)
        await trio.testing.wait_all_tasks_blocked()

    monkeypatch.setattr(_statements, "lease_clock", lambda: now[0])
    monkeypatch.setattr(_statements, "lease_sleep", sleep)
    statements = _statements.Statements("db", 10.0, 4, threading.Event())  # 1 s: a stall
    statements.pool = _Pool()  # type: ignore[assignment]
    events = _Events()
    site: Any = types.SimpleNamespace(events=events)
    locked = threading.Event()

    def behind_the_lock(conn: _Conn) -> None:
        locked.wait(10)

    async def blocked(scope: trio.CancelScope, done: trio.Event | None = None) -> None:
        with scope:
            await statements.run(behind_the_lock)
        if done is not None:
            done.set()

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(statements.watch_stalls, site)
                ship, read = trio.CancelScope(), trio.CancelScope()
                nursery.start_soon(blocked, ship)
                await trio.testing.wait_all_tasks_blocked()
                for step in range(1, 9):  # 0.25 s ticks to 2 s: slow from 1 s
                    await tick_at(step / 4)
                assert len(events.slow) == 1
                ship.cancel()  # (its caller gives up on it)
                await trio.testing.wait_all_tasks_blocked()
                now[0] = 2.05
                await statements.run(lambda conn: None)  # answered at once
                now[0] = 2.1
                answered = trio.Event()
                nursery.start_soon(blocked, read, answered)  # behind the same lock
                await trio.testing.wait_all_tasks_blocked()
                for step in range(9, 17):  # to 4 s: the read waits 1.9 s
                    await tick_at(step / 4)
                assert len(events.slow) == 1, events.slow  # (it was 2)
                locked.set()  # the lock goes: the read is answered
                await answered.wait()
                await trio.testing.wait_all_tasks_blocked()
                for step in range(17, 21):  # a second with none out
                    await tick_at(step / 4)
                assert statements._stalled_since is None  # the stall is over
                locked.clear()  # a stall later is a stall of its own
                nursery.start_soon(blocked, trio.CancelScope())
                await trio.testing.wait_all_tasks_blocked()
                for step in range(21, 25):
                    await tick_at(step / 4)
                assert len(events.slow) == 2, events.slow
                nursery.cancel_scope.cancel()
    finally:
        locked.set()
