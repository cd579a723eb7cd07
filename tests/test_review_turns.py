"""Turns, reviewed against DESIGN.md §2 "Turns — one task changes an object at a time":
lost updates across calls, alarm runs, background tasks and tracked work; arrival order
(calls, alarm runs, calls that arrive while the object starts); cancellation in line and
holding the turn; re-entry along the call chain (from a job, on the shared layout, into a
read turn, across hosts); who holds a turn (tasks started in nurseries of the holder's
own); storage without a turn; ``@nj.read_only`` and ``@nj.interleave``; fairness between
jobs; the alarm run's retry backoff.

Tests marked ``xfail(strict=True)`` are findings: the contract says one thing, the
runtime does another (the reason names both). Every timed test runs under
``autojump_clock`` and asserts exact virtual times (Trio time starts at 0), except the
cross-host ones, which run in real time (PostgreSQL I/O runs in threads).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from conftest import ENGINES, EPOCH, engine
from pg_support import eventually, fresh_database

import nursery_jobs as nj

HANG = 100_000


@attrs.define
class Env:
    """What a test and its objects share (the runtime's ``env``)."""

    log: list[Any] = attrs.Factory(list)
    errors: list[BaseException] = attrs.Factory(list)
    turns: list[tuple[str, float, float]] = attrs.Factory(list)
    flags: dict[str, trio.Event] = attrs.Factory(dict)

    def flag(self, name: str) -> trio.Event:
        return self.flags.setdefault(name, trio.Event())


@pytest.fixture(params=[*ENGINES, *([] if "shared" in ENGINES else ["shared"])])
def any_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Every engine, the shared layout among them."""
    if request.param == "postgres":
        with fresh_database() as dsn:
            engine.name, engine._dsn = "postgres", dsn
            try:
                yield "postgres"
            finally:
                engine.name, engine._dsn = "memory", None
        return
    engine.name, engine._root = request.param, tmp_path
    try:
        yield request.param
    finally:
        engine.name, engine._root = "memory", None


# -- lost updates: every kind of turn at once ----------------------------------------------

STEP = 0.25  # how long each read-await-write holds the turn (exact in binary)


class Tally(nj.DurableObject):
    """``n = get(); await; put(n + 1)`` from calls, jobs, tracked work and background
    tasks, each recording the span of virtual time it held the object."""

    namespace = "tests.review_turns.Tally"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def _bump(self, who: str) -> None:
        start = trio.current_time()
        n = self.ctx.storage.get("n", 0)
        await trio.sleep(STEP)
        self.ctx.storage.put("n", n + 1)
        self.env.turns.append((who, start, trio.current_time()))

    async def bump(self) -> None:
        await self._bump("call")

    async def push_jobs(self, count: int, time: float) -> None:
        for i in range(count):
            await self.lifecycle.jobs.push("bump", id=f"j{i}", time=time)

    async def spawn(self, count: int) -> None:
        for _ in range(count):
            self.ctx.nursery.start_soon(self._in_own_turn, "background")

    async def _in_own_turn(self, who: str) -> None:
        async with self.ctx.turn():
            await self._bump(who)

    async def on_job(self, ctx: nj.JobContext) -> None:
        assert self.lifecycle.track_alarm_work(self._in_own_turn, "tracked")
        await self._bump("job")

    @nj.read_only
    async def n(self) -> int:
        found: int = self.ctx.storage.get("n", 0)
        return found


@pytest.mark.usefixtures("on_every_engine")
async def test_calls_jobs_tracked_work_and_background_tasks_lose_no_update(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Five calls, five background tasks in ``ctx.turn()``, five jobs and the tracked
    work each job starts: twenty read-await-write increments, none lost, their turns
    back to back and never overlapping."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            tally = rt.get(Tally, "t")
            # Ten turns of calls and background tasks fill [0, 2.5); the jobs are due
            # at 2.5, just as they end.
            await tally.push_jobs(5, EPOCH + 10 * STEP)
            await tally.spawn(5)
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(tally.bump)
            await trio.sleep(20 * STEP)
            assert await tally.n() == 20
            kinds = sorted(who for who, _, _ in env.turns)
            assert kinds == ["background"] * 5 + ["call"] * 5 + ["job"] * 5 + ["tracked"] * 5
            spans = sorted((start, end) for _, start, end in env.turns)
            # One after another from 0 to 5 s: none began before the last one ended.
            assert spans == [(i * STEP, (i + 1) * STEP) for i in range(20)]


# -- arrival order -------------------------------------------------------------------------


class Line(nj.DurableObject):
    """Records who held the object when; a Lifecycle whose jobs do the same."""

    namespace = "tests.review_turns.Line"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def hold(self, name: str, seconds: float) -> None:
        self.env.log.append((name, trio.current_time()))
        self.ctx.storage.put("last", name)
        await trio.sleep(seconds)

    async def push(self, fn: str, time: float) -> None:
        await self.lifecycle.jobs.push(fn, id=fn, time=time)

    async def guarded(self, name: str, seconds: float) -> None:
        """Writes a plain key, then another inside a transaction held across an await."""
        self.env.log.append((name, trio.current_time()))
        self.ctx.storage.put("plain", name)
        with self.ctx.storage.transaction():
            self.ctx.storage.put("in_transaction", name)
            await trio.sleep(seconds)

    @nj.read_only
    async def peek(self, name: str, seconds: float = 0.0) -> Any:
        self.env.log.append((name, trio.current_time()))
        await trio.sleep(seconds)
        return self.ctx.storage.get("last")

    @nj.read_only
    async def keys(self) -> dict[str, Any]:
        return self.ctx.storage.list()

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env.log.append((ctx.job.fn, trio.current_time()))
        await trio.sleep(1)


async def test_an_alarm_run_takes_its_place_in_line_among_calls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An alarm due while a call holds the object waits in arrival order: after the call
    that holds it, before a call that came after it."""
    env = Env()

    async def later(at: float, *call: Any) -> None:
        await trio.sleep(at)
        await line.hold(*call)

    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=env) as rt:
            line = rt.get(Line, "l")
            await line.push("job", EPOCH + 1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(later, 0, "first", 2)  # holds [0, 2); the alarm is due at 1
                nursery.start_soon(later, 1.5, "second", 1)
            assert env.log == [("first", 0), ("job", 2), ("second", 3)]


class Starting(nj.DurableObject):
    """An object whose ``on_start`` awaits: calls that arrive meanwhile wait for it."""

    namespace = "tests.review_turns.Starting"

    async def on_start(self) -> None:
        await trio.sleep(1)

    async def visit(self, name: str) -> None:
        self.ctx.storage.put("order", [*self.ctx.storage.get("order", []), name])
        await trio.sleep(0.5)

    async def order(self) -> list[str]:
        return list(self.ctx.storage.get("order", []))


async def test_calls_that_arrive_while_the_object_starts_run_in_arrival_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Startup holds the object's turn; the calls that arrive during its 1 s ``on_start``
    (one every 10 ms, the first of them the one that activated it) wait for it in
    arrival order."""
    names = [f"c{i:02}" for i in range(20)]

    async def call(name: str, at: float) -> None:
        await trio.sleep(at)
        await stub.visit(name)

    with trio.fail_after(HANG):
        async with nj.open_runtime(None) as rt:
            stub = rt.get(Starting, "s")
            async with trio.open_nursery() as nursery:
                for i, name in enumerate(names):
                    nursery.start_soon(call, name, i * 0.01)
            assert trio.current_time() == 1 + 20 * 0.5
            assert await stub.order() == names


class SlowStart(nj.DurableObject):
    """A Lifecycle object whose ``on_start`` takes a second."""

    namespace = "tests.review_turns.SlowStart"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_start(self) -> None:
        await trio.sleep(1)

    async def push(self, time: float) -> None:
        await self.lifecycle.jobs.push("job", id="job", time=time)

    async def hold(self, name: str) -> None:
        self.env.log.append((name, trio.current_time()))
        await trio.sleep(1)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env.log.append(("job", trio.current_time()))
        await trio.sleep(1)


async def test_an_alarm_that_activates_the_object_runs_before_a_call_that_came_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The alarm at +10 activates the evicted object (``on_start`` takes 1 s); a call
    arriving at +10.5 waits for startup too, behind the alarm run: job at 11, call at 12."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=env, idle_timeout=2) as rt:
            slow = rt.get(SlowStart, "s")
            await slow.push(EPOCH + 10)  # returns at 1 (startup); evicted at 3
            await trio.sleep(9.5)
            await slow.hold("call")
            await trio.sleep(5)
            assert env.log == [("job", 11), ("call", 12)]


# -- cancellation --------------------------------------------------------------------------


async def test_a_caller_cancelled_in_line_leaves_it_and_the_next_one_goes_on_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A writer cancelled while it waits leaves the line: the call behind it runs as the
    holder ends, and the cancelled one never runs; a reader queued behind a cancelled
    writer joins the reader that holds the object at once."""
    env = Env()

    async def at(when: float, cancel_at: float, fn: Any, *args: Any) -> None:
        await trio.sleep(when)
        with trio.CancelScope(deadline=cancel_at):
            await fn(*args)

    never = float("inf")

    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=env) as rt:
            line = rt.get(Line, "l")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(at, 0, never, line.hold, "holder", 2)
                nursery.start_soon(at, 0.5, 1, line.hold, "cancelled", 1)
                nursery.start_soon(at, 0.75, never, line.hold, "next", 1)
            assert env.log == [("holder", 0), ("next", 2)]
            assert await line.peek("after") == "next"
            env.log.clear()
            start = trio.current_time()  # 3
            async with trio.open_nursery() as nursery:
                nursery.start_soon(at, 0, never, line.peek, "reader", 2)  # read: [3, 5)
                nursery.start_soon(at, 0.5, start + 1, line.hold, "writer", 1)
                nursery.start_soon(at, 0.75, never, line.peek, "late reader", 0)
            # The late reader waited behind the writer, not behind the first reader.
            assert [(name, when - start) for name, when in env.log] == [
                ("reader", 0), ("late reader", 1),
            ]


async def test_a_caller_cancelled_holding_the_turn_releases_it_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A call cancelled inside its turn gives the object up as it is cancelled: the call
    waiting behind it starts then, not when the cancelled call would have ended; the
    ``storage.transaction()`` it was in rolls back (the next call never sees it)."""
    env = Env()

    async def cancelled_at(deadline: float) -> None:
        with trio.CancelScope(deadline=deadline):
            await line.guarded("cancelled", 10)

    async def next_at(when: float) -> None:
        await trio.sleep(when)
        env.log.append(("next sees", await line.keys()))

    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=env) as rt:
            line = rt.get(Line, "l")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancelled_at, 1)
                nursery.start_soon(next_at, 0.5)
            assert trio.current_time() == 1
            assert env.log[0] == ("cancelled", 0)
            assert "in_transaction" not in env.log[1][1]


# -- who holds a turn --------------------------------------------------------------------


class Tasks(nj.DurableObject):
    """Starts tasks of its own in the ways a Trio program does."""

    namespace = "tests.review_turns.Tasks"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env

    def _put(self, key: str) -> None:
        try:
            self.ctx.storage.put(key, trio.current_time())
        except nj.TurnError as exc:
            self.env.errors.append(exc)

    async def start_service(self) -> None:
        """``await ctx.nursery.start(...)``: the task runs as the call's child until it
        reports started, then moves to the object's nursery."""
        await self.ctx.nursery.start(self._service)

    async def _service(self, task_status: trio.TaskStatus[None]) -> None:
        self._put("before_started")
        task_status.started()
        await trio.sleep(1)  # the call that started it has ended
        self._put("after_started")
        self.env.flag("done").set()

    async def start_pool(self) -> None:
        self.ctx.nursery.start_soon(self._pool)

    async def _pool(self) -> None:
        async with trio.open_nursery() as pool:  # opened before the turn is entered
            async with self.ctx.turn():
                pool.start_soon(self._worker)
                await trio.sleep(1)
        self.env.flag("done").set()

    async def _worker(self) -> None:
        await trio.sleep(0.5)
        self._put("worker")

    @nj.read_only
    async def keys(self) -> list[str]:
        return sorted(self.ctx.storage.list())


async def test_a_task_started_with_nursery_start_holds_the_turn_only_until_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A task a call starts with ``ctx.nursery.start()`` is the call's child until it
    reports started (it writes inside the call's turn); moved to the object's nursery it
    has outlived that turn and holds nothing."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=env) as rt:
            tasks = rt.get(Tasks, "t")
            await tasks.start_service()
            await env.flag("done").wait()
            assert [type(e) for e in env.errors] == [nj.TurnError]
            assert await tasks.keys() == ["before_started"]


async def test_a_task_started_in_the_holders_own_nursery_during_the_turn_holds_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A background task opens a worker nursery, enters ``ctx.turn()``, and starts a
    worker in it while it holds the turn: the worker writes inside that turn."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=env) as rt:
            tasks = rt.get(Tasks, "t")
            await tasks.start_pool()
            await env.flag("done").wait()
            assert env.errors == []
            assert await tasks.keys() == ["worker"]


# -- storage without a turn; read-only turns -------------------------------------------------


class Raw(nj.DurableObject):
    """Raw SQL: through ``storage.execute`` and through the ``storage.db`` handle taken
    in ``__init__`` (inside the startup turn), as sqlite-utils users keep it."""

    namespace = "tests.review_turns.Raw"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.db = ctx.storage.db

    @nj.read_only
    async def count_keys(self) -> int:
        return int(self.ctx.storage.execute("SELECT COUNT(*) FROM nj_kv").fetchone()[0])

    async def put(self, key: str) -> None:
        self.ctx.storage.put(key, 1)

    async def write_later_through_db(self) -> None:
        self.ctx.nursery.start_soon(self._write_through_db)

    async def _write_through_db(self) -> None:
        await trio.sleep(1)  # the call that started it has ended: no turn here
        try:
            self.db["notes"].insert({"text": "written without a turn"})
        except Exception as exc:
            self.env.errors.append(exc)
        self.env.flag("done").set()

    @nj.read_only
    async def keys(self) -> list[str]:
        return sorted(self.ctx.storage.list())

    async def tables(self) -> list[str]:
        return sorted(self.db.table_names())


async def test_a_read_only_method_reads_with_execute(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """Raw SQL that only reads is a read: a read-only method may run it."""
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path / "data", env=Env()) as rt:
            raw = rt.get(Raw, "r")
            await raw.put("k")
            assert await raw.count_keys() == 1


async def test_a_kept_db_handle_used_without_a_turn_raises_and_writes_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """Storage touched by a task that holds no turn raises TurnError and writes nothing,
    whichever way it is reached."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path / "data", env=env) as rt:
            raw = rt.get(Raw, "r")
            await raw.write_later_through_db()
            await env.flag("done").wait()
            assert [type(e) for e in env.errors] == [nj.TurnError]
            assert "notes" not in await raw.tables()


class RawReader(nj.DurableObject):
    """Raw SQL in read-only methods: reads through every handle, and writes that must
    raise."""

    namespace = "tests.review_turns.RawReader"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.conn = ctx.storage.conn  # kept from __init__

    async def put(self, key: str) -> None:
        self.ctx.storage.put(key, 1)
        self.ctx.storage.db["notes"].insert({"text": "made in a write turn"})

    @nj.read_only
    async def read_everything(self) -> tuple[int, list[str], int]:
        storage = self.ctx.storage
        return (storage.execute("SELECT COUNT(*) FROM nj_kv").fetchone()[0],
                [row["text"] for row in storage.db["notes"].rows],
                self.conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0])

    @nj.read_only
    async def try_writes(self) -> list[str]:
        storage = self.ctx.storage
        attempts: list[tuple[str, Any]] = [
            ("execute", lambda: storage.execute("DELETE FROM nj_kv")),
            ("db insert", lambda: storage.db["notes"].insert({"text": "sneaked"})),
            ("db create", lambda: storage.db["other"].insert({"x": 1})),
            ("kept conn", lambda: self.conn.execute("DELETE FROM notes")),
            ("cursor", lambda: self.conn.cursor().execute("DELETE FROM notes")),
        ]
        refused = []
        for name, attempt in attempts:
            try:
                attempt()
            except nj.TurnError:
                refused.append(name)
        return refused

    async def tables(self) -> list[str]:
        return sorted(self.ctx.storage.db.table_names())


async def test_raw_sql_in_a_read_only_method_reads_and_every_write_raises(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """In a read-only method raw SQL reads through ``storage.execute``, ``storage.db``
    and a connection kept from ``__init__``; a write through any of them raises
    ``TurnError`` and writes nothing; and a write turn after it writes as before (the
    connection is not left read-only)."""
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path / "data", env=Env()) as rt:
            raw = rt.get(RawReader, "r")
            await raw.put("k")
            assert await raw.read_everything() == (1, ["made in a write turn"], 1)
            assert await raw.try_writes() == [
                "execute", "db insert", "db create", "kept conn", "cursor"]
            assert await raw.read_everything() == (1, ["made in a write turn"], 1)
            assert "other" not in await raw.tables()
            await raw.put("k2")
            assert (await raw.read_everything())[0] == 2


class Careful(nj.DurableObject):
    """Read-only methods that try every other way to write."""

    namespace = "tests.review_turns.Careful"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    @nj.read_only
    async def push_a_job(self) -> None:
        await self.lifecycle.jobs.push("f", id="sneaked", delay=60)

    @nj.read_only
    async def open_a_transaction(self) -> None:
        with self.ctx.storage.transaction():
            pass

    @nj.read_only
    async def delete_a_key(self) -> bool:
        return self.ctx.storage.delete("k")

    @nj.read_only
    async def write_in_ctx_turn(self) -> None:
        async with self.ctx.turn():  # inside the read turn it holds: still read-only
            self.ctx.storage.put("k", "sneaked")

    async def put(self) -> None:
        self.ctx.storage.put("k", "kept")

    @nj.read_only
    async def state(self) -> tuple[Any, list[str]]:
        return self.ctx.storage.get("k"), [job.id for job in self.lifecycle.jobs.list()]

    async def on_job(self, ctx: nj.JobContext) -> None:
        return None


@pytest.mark.usefixtures("on_every_engine")
async def test_every_way_to_write_in_a_read_only_method_raises_and_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``jobs.push``, ``storage.transaction()``, ``storage.delete`` and a write inside
    ``ctx.turn()`` entered from a read-only method all raise TurnError; nothing changes."""
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location) as rt:
            careful = rt.get(Careful, "c")
            await careful.put()
            for attempt in (careful.push_a_job, careful.open_a_transaction,
                            careful.delete_a_key, careful.write_in_ctx_turn):
                with pytest.raises(nj.TurnError):
                    await attempt()
            assert await careful.state() == ("kept", [])
            assert engine.stored_alarm(rt, Careful.namespace, "c") is None


class Outside(nj.DurableObject):
    """A background task that tries every way into storage and the job table without a
    turn, then tells what it got."""

    namespace = "tests.review_turns.Outside"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def seed(self) -> None:
        self.ctx.storage.put("k", "kept")
        await self.lifecycle.jobs.push("f", id="j", delay=60)

    async def start_trying(self, raw: bool) -> None:
        self.ctx.nursery.start_soon(self._try_all, raw)

    async def _try_all(self, raw: bool) -> None:
        await trio.sleep(1)  # the call that started this task has ended
        storage, jobs = self.ctx.storage, self.lifecycle.jobs
        attempts: list[tuple[str, Any]] = [
            ("get", lambda: storage.get("k")), ("list", storage.list),
            ("put", lambda: storage.put("k", "sneaked")), ("delete", lambda: storage.delete("k")),
            ("get_alarm", storage.get_alarm), ("transaction", storage.transaction),
            ("jobs.get", lambda: jobs.get("j")), ("jobs.list", jobs.list),
            ("dead_letters", self.lifecycle.dead_letters),
        ]
        if raw:
            attempts += [("conn", lambda: storage.conn), ("db", lambda: storage.db),
                         ("execute", lambda: storage.execute("DELETE FROM nj_kv"))]
        for name, attempt in attempts:
            try:
                result = attempt()
                if name == "transaction":
                    with result:
                        storage.put("k", "sneaked")
            except Exception as exc:
                self.env.log.append((name, type(exc).__name__))
            else:
                self.env.log.append((name, "allowed"))
        for name, coro in [("jobs.push", lambda: jobs.push("f", id="sneaked")),
                           ("jobs.reschedule", lambda: jobs.reschedule("j", nj.now()))]:
            try:
                await coro()
            except Exception as exc:
                self.env.log.append((name, type(exc).__name__))
            else:
                self.env.log.append((name, "allowed"))
        self.env.flag("done").set()

    @nj.read_only
    async def state(self) -> tuple[Any, list[tuple[str, float]]]:
        return self.ctx.storage.get("k"), [(job.id, job.time) for job in self.lifecycle.jobs.list()]

    async def on_job(self, ctx: nj.JobContext) -> None:
        return None


@pytest.mark.usefixtures("on_every_engine")
async def test_every_way_into_storage_without_a_turn_raises_turn_error_and_changes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A background task outside any turn gets TurnError from every storage call, the
    job table's reads and writes, and (where raw SQL is allowed) the raw handles; the
    object's key and job are as they were."""
    env = Env()
    raw = engine.name in ("memory", "files")
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            outside = rt.get(Outside, "o")
            await outside.seed()
            await outside.start_trying(raw)
            await env.flag("done").wait()
            assert all(got == "TurnError" for _, got in env.log), env.log
            assert len(env.log) == (14 if raw else 11)
            assert await outside.state() == ("kept", [("j", EPOCH + 60)])


async def test_a_reader_that_comes_after_a_waiting_writer_waits_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Read turns run side by side only while no writer waits: a reader arriving after a
    waiting writer runs after that writer (no writer starves behind a stream of readers)."""
    env = Env()

    async def at(when: float, fn: Any, *args: Any) -> None:
        await trio.sleep(when)
        await fn(*args)

    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=env) as rt:
            line = rt.get(Line, "l")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(at, 0, line.peek, "r1", 2)
                nursery.start_soon(at, 0.5, line.peek, "r2", 2)  # beside r1: [0.5, 2.5)
                nursery.start_soon(at, 1, line.hold, "w", 1)  # after both: [2.5, 3.5)
                nursery.start_soon(at, 1.5, line.peek, "r3", 0)  # after w
            assert env.log == [("r1", 0), ("r2", 0.5), ("w", 2.5), ("r3", 3.5)]
            assert await line.peek("after") == "w"


# -- interleave methods ------------------------------------------------------------------


class Poller(nj.DurableObject):
    namespace = "tests.review_turns.Poller"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env

    async def hold(self, seconds: float) -> None:
        self.ctx.storage.put("state", "held")
        await trio.sleep(seconds)
        self.ctx.storage.put("state", "released")

    @nj.interleave
    async def poll(self) -> tuple[float, Any]:
        started = trio.current_time()
        async with self.ctx.turn():
            return started, self.ctx.storage.get("state")


async def test_an_interleave_call_runs_beside_a_held_turn_and_its_ctx_turn_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An interleave call made while a call holds the object starts at once (it holds no
    turn); its ``ctx.turn()`` waits for the holder and sees the holder's last write."""
    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=Env()) as rt:
            poller = rt.get(Poller, "p")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poller.hold, 2)
                await trio.sleep(0.5)
                assert await poller.poll() == (0.5, "released")
                assert trio.current_time() == 2


class Noter(nj.DurableObject):
    """An interleave call writes in ``ctx.turn()``, then waits (holding no turn) while a
    job holds the object with its group open."""

    namespace = "tests.review_turns.Noter"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, time: float) -> None:
        await self.lifecycle.jobs.push("hold", id="hold", time=time)

    @nj.interleave
    async def note(self) -> None:
        async with self.ctx.turn():
            self.ctx.storage.put("noted", True)
        await self.env.flag("job holds the object").wait()

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ctx.storage.put("job", True)  # (its group is open from here)
        self.env.flag("job holds the object").set()
        await trio.sleep(10)


async def test_an_interleave_calls_writes_are_durable_when_it_returns(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """The output gate holds for an interleave call too: what it wrote in its
    ``ctx.turn()`` has shipped when it returns, though a job opened its group on the
    object in between (under the shared layout a commit ships from the working copy;
    with a group open, nothing committed before it could ship)."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}", env=env) as rt:
            noter = rt.get(Noter, "n")
            await noter.push(EPOCH + 1)
            await trio.sleep(1 - trio.current_time())  # the job is due now
            await noter.note()
            assert trio.current_time() == 1  # (the job holds the object until 11)
            rows = rt.engine.object_rows(Noter.namespace, "n")  # type: ignore[attr-defined]
            assert [key for table, key, _ in rows if table == "nj_kv"] == ["noted"]


# -- re-entry ------------------------------------------------------------------------------


class Peer(nj.DurableObject):
    """Calls that come back along their chain, from calls and from jobs."""

    namespace = "tests.review_turns.Peer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def visit(self, peer: str, hops: int) -> list[str]:
        self.ctx.storage.put("visits", self.ctx.storage.get("visits", 0) + 1)
        if hops == 0:
            return [self.ctx.id]
        await trio.sleep(1)  # others' calls arrive while the chain holds the turns
        trail: list[str] = await self.ctx.get(Peer, peer).visit(self.ctx.id, hops - 1)
        return [self.ctx.id, *trail]

    async def note(self, text: str) -> None:
        self.ctx.storage.put("notes", [*self.ctx.storage.get("notes", []), text])

    async def call_back(self, peer: str) -> None:
        await self.ctx.get(Peer, peer).note("from the peer")

    @nj.read_only
    async def look(self, peer: str, hops: int) -> int:
        if hops == 0:
            found: int = self.ctx.storage.get("visits", 0)
            return found
        await trio.sleep(1)  # a writer arrives meanwhile and waits behind this read turn
        looked: int = await self.ctx.get(Peer, peer).look(self.ctx.id, hops - 1)
        return looked

    async def push(self, fn: str, time: float, **kwargs: Any) -> None:
        await self.lifecycle.jobs.push(fn, id=fn, time=time, **kwargs)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ctx.storage.put("notes", [*self.ctx.storage.get("notes", []), "job wrote"])
        await self.ctx.get(Peer, "b").call_back(self.ctx.id)  # A -> B -> A, from a job
        self.env.log.append(("job saw", list(self.ctx.storage.get("notes", []))))
        if ctx.job.fn == "fails":
            raise RuntimeError("the job fails after its call came back")

    @nj.read_only
    async def state(self) -> tuple[int, list[str]]:
        return self.ctx.storage.get("visits", 0), list(self.ctx.storage.get("notes", []))


@pytest.mark.usefixtures("any_engine")
async def test_a_chain_back_holds_the_turn_against_an_outside_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A -> B -> A -> B -> A completes, and an outside call to A made while the chain
    holds A waits for the chain's turn to end: re-entry is for the chain alone."""
    env = Env()

    async def outside() -> None:
        await trio.sleep(0.5)
        await a.note("outside")
        env.log.append(("outside done", trio.current_time()))

    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            a = rt.get(Peer, "a")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(outside)
                assert await a.visit("b", 4) == ["a", "b", "a", "b", "a"]
                chain_done = trio.current_time()
            assert chain_done == 4
            assert env.log == [("outside done", 4)]
            assert await a.state() == (3, ["outside"])
            assert await rt.get(Peer, "b").state() == (2, [])


@pytest.mark.usefixtures("any_engine")
async def test_a_chain_back_into_a_read_turn_runs_past_a_waiting_writer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A read-only A -> B -> A: the call coming back runs inside A's read turn, though a
    writer waits for A meanwhile (queued behind it, it would deadlock); the writer runs
    once the chain's turn ends."""
    env = Env()

    async def writer() -> None:
        await trio.sleep(0.5)
        await a.note("writer")
        env.log.append(("writer done", trio.current_time()))

    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            a = rt.get(Peer, "a")
            await a.note("first")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                assert await a.look("b", 2) == 0
                assert trio.current_time() == 2
            assert env.log == [("writer done", 2)]


@pytest.mark.usefixtures("any_engine")
@pytest.mark.parametrize("fn", ["succeeds", "fails"])
async def test_a_call_that_comes_back_to_a_job_runs_in_its_turn_and_commits_with_it(
    autojump_clock: trio.testing.MockClock, fn: str,
) -> None:
    """A job of A calls B, which calls A back: the call runs inside the job's turn (no
    deadlock behind the alarm run), the job sees its write, and the write commits with
    the job — or rolls back with it."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            a = rt.get(Peer, "a")
            await a.push(fn, EPOCH + 1, retry=nj.RetryOptions(max_attempts=1))
            await trio.sleep(2)
            assert env.log == [("job saw", ["job wrote", "from the peer"])]
            notes = ["job wrote", "from the peer"] if fn == "succeeds" else []
            assert await a.state() == (0, notes)


# -- re-entry across hosts (PostgreSQL, real time) -------------------------------------------


class Far(nj.DurableObject):
    """On the other host: calls Near back after its caller may have given up on it."""

    namespace = "tests.review_turns.Far"

    async def where(self) -> Any:
        return self.ctx.env

    async def call_back_later(self, near: str) -> None:
        await trio.sleep(0.5)
        await self.ctx.get(Near, near).mark()
        self.ctx.storage.put("told", True)  # Near said the mark is made

    async def told(self) -> Any:
        return self.ctx.storage.get("told")


# What Near's job 2 saw of the mark before and after its await (kept outside the object:
# the job fails, and its writes roll back).
OBSERVED: list[list[bool]] = []


class Near(nj.DurableObject):
    """Job 1 calls Far and gives up on it after 0.1 s; job 2 then holds the turn for 2 s,
    looks whether anything changed the object under it, and fails."""

    namespace = "tests.review_turns.Near"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def where(self) -> Any:
        return self.ctx.env

    async def push_both(self) -> None:
        await self.lifecycle.jobs.push("gives_up_on_far", id="1")
        await self.lifecycle.jobs.push("watches_then_fails", id="2",
                                       retry=nj.RetryOptions(max_attempts=1))

    async def mark(self) -> None:
        self.ctx.storage.put("marked", True)

    async def state(self) -> tuple[Any, int]:
        return self.ctx.storage.get("marked"), len(self.lifecycle.dead_letters())

    async def on_job(self, ctx: nj.JobContext) -> None:
        if ctx.job.fn == "gives_up_on_far":
            with trio.move_on_after(0.1):
                await self.ctx.get(Far, "far").call_back_later(self.ctx.id)
            return
        before = self.ctx.storage.get("marked", False)
        await trio.sleep(2)
        OBSERVED.append([before, self.ctx.storage.get("marked", False)])
        raise RuntimeError("job 2 fails: its writes roll back")


async def test_a_call_back_from_a_given_up_call_across_hosts_waits_for_the_next_job(
    pg_dsn: str,
) -> None:
    """Job 1 of Near (host A) calls Far (host B) and gives up on it; Far calls Near back
    0.5 s later, while job 2 holds Near: that call is no part of job 2's chain, so it waits
    for job 2's turn to end, and once it returns its write is Near's for good."""
    from nursery_jobs._engines.postgres._engine import PostgresEngine

    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as host_a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as host_b:
        near, far = host_a.get(Near, "near"), host_b.get(Far, "far")
        assert await near.where() == "A"
        assert await far.where() == "B"
        OBSERVED.clear()

        async def both_done() -> bool:
            return (await near.state())[1] == 1 and await far.told() is True

        await near.push_both()
        await eventually(both_done, 20)
        # Nothing changed Near under job 2, and the mark Far was told of is there.
        assert OBSERVED == [[False, False]]
        assert await near.state() == (True, 1)


async def test_a_call_back_from_a_given_up_call_waits_though_no_call_waited_between_jobs(
    pg_dsn: str,
) -> None:
    """As above, but nothing calls Near while its jobs run (there is no hand-over between
    job 1 and job 2): job 2 still holds the turn under a holding of its own, so the call
    back from job 1's given-up call waits for it."""
    from nursery_jobs._engines.postgres._engine import PostgresEngine

    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as host_a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as host_b:
        near, far = host_a.get(Near, "near"), host_b.get(Far, "far")
        assert await near.where() == "A"
        assert await far.where() == "B"
        OBSERVED.clear()

        async def far_told_and_job_2_done() -> bool:  # (asks Far alone, never Near)
            return bool(OBSERVED) and await far.told() is True

        await near.push_both()
        await eventually(far_told_and_job_2_done, 20)
        assert OBSERVED == [[False, False]]
        assert await near.state() == (True, 1)


# -- fairness ----------------------------------------------------------------------------


class Backlog(nj.DurableObject):
    namespace = "tests.review_turns.Backlog"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push_many(self, count: int, time: float) -> None:
        for i in range(count):
            await self.lifecycle.jobs.push("step", id=f"j{i:03}", time=time)

    @nj.read_only
    async def done(self) -> int:
        found: int = self.ctx.storage.get("done", 0)
        return found

    async def on_job(self, ctx: nj.JobContext) -> None:
        # Each job writes, then awaits (holding the turn) for 1 s.
        self.ctx.storage.put("done", self.ctx.storage.get("done", 0) + 1)
        await trio.sleep(1)


async def test_a_read_only_call_waits_for_one_job_not_for_the_backlog(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A read-only call made during the first of ten one-second jobs gets the object when
    that job ends (a read turn is admitted at the hand-over as a write turn is), and
    reads its write; one made during the third waits for the third alone."""
    with trio.fail_after(HANG):
        async with nj.open_runtime(None, env=Env()) as rt:
            backlog = rt.get(Backlog, "b")
            await backlog.push_many(10, EPOCH + 10)
            await trio.sleep(10.5)
            assert await backlog.done() == 1
            assert trio.current_time() == 11
            await trio.sleep(1.5)  # during the third job, [12, 13)
            assert await backlog.done() == 3
            assert trio.current_time() == 13



# -- due order ---------------------------------------------------------------------------


class Ordered(nj.DurableObject):
    namespace = "tests.review_turns.Ordered"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push_all(self, jobs: list[tuple[str, int, float]]) -> None:
        for job_id, priority, time in jobs:
            await self.lifecycle.jobs.push("f", id=job_id, priority=priority, time=time)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env.log.append(ctx.job.id)


@pytest.mark.usefixtures("on_every_engine")
async def test_due_jobs_run_by_priority_then_time_then_push_order_across_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """150 jobs, all overdue, pushed in a shuffled order with four priorities and five
    due times (many ties) in one call: the alarm run after it runs them in (priority
    descending, time, push order), across several batches of due rows."""
    rng = random.Random(7)
    jobs = [(f"j{i:03}", rng.choice([-1, 0, 1, 2]), EPOCH - rng.randint(1, 5))
            for i in range(150)]
    expected = [job_id for _, _, _, job_id in sorted(
        (-priority, time, push, job_id) for push, (job_id, priority, time) in enumerate(jobs))]
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            await rt.get(Ordered, "o").push_all(jobs)
            await trio.sleep(5)
            assert env.log == expected

# -- the alarm run's retry ---------------------------------------------------------------


class FailingStart(nj.Capability):
    """Its ``on_start`` fails at the second to eleventh activation (the first, a call's,
    starts)."""

    id = "failing_start"

    def __init__(self, env: Env) -> None:
        self.env = env

    async def on_start(self) -> None:
        self.env.log.append(("start", trio.current_time()))
        if 2 <= len(self.env.log) <= 11:
            raise RuntimeError("startup fails")

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env.log.append(("ran", trio.current_time()))


class Retried(nj.DurableObject):
    namespace = "tests.review_turns.Retried"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.cap = FailingStart(ctx.env)
        self.lifecycle = nj.Lifecycle.install(self).use(self.cap)

    async def push(self, time: float) -> None:
        await self.cap.lifecycle.jobs.push("f", id="j", time=time)


@pytest.mark.usefixtures("on_every_engine")
async def test_a_failing_alarm_run_is_retried_doubling_from_2_s_capped_at_5_minutes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Ten alarm runs in a row fail while the job remains: retried 2, 4, ... 256 s later,
    then every 300 s; the eleventh start succeeds and runs the job."""
    env = Env()
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env, idle_timeout=1) as rt:
            rt.events.add_listener(events.append)
            await rt.get(Retried, "r").push(EPOCH + 10)
            await trio.sleep(2000)
            retries = [(e.time - EPOCH, e.data["retry"], e.data["delay"])
                       for e in events if e.type == "alarm:retry"]
            delays = [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
            times = [10 + sum(delays[:i]) for i in range(10)]
            assert retries == [(t, i + 1, d)
                               for i, (t, d) in enumerate(zip(times, delays, strict=True))]
            assert env.log[-1] == ("ran", times[-1] + 300)
