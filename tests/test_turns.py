"""Turns (DESIGN.md §2 "Turns"): one task changes an object at a time. A stub call, an
alarm run and startup each hold the object's turn across their awaits, so no update is
lost and no caller reads a write that is later rolled back; a call that comes back along
its own call chain re-enters the turn; ``@nj.read_only`` methods share the object,
``@nj.interleave`` methods hold no turn; a task outside any turn enters one with
``ctx.turn()`` or gets ``nj.TurnError``; an alarm run hands the turn to a waiting call
between jobs; a turn held past ``turn_warning`` emits ``object:turn_slow``.

Every test runs under ``autojump_clock``: a deadlock jumps to its ``fail_after`` bound and
fails there, and times are exact virtual times (Trio time starts at 0).

Classes whose methods carry ``@nj.read_only`` or ``@nj.interleave`` are built by a
function, so that each test that needs them fails on its own while those names are new.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from conftest import EPOCH, engine

import nursery_jobs as nj


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


# A generous virtual-time bound for tests that sleep; deadlock tests use a tight one.
HANG = 100_000

# The fairness test's backlog of jobs, all due at once.
BACKLOG = 3_000


@attrs.define
class Env:
    """What the test and its objects share (the runtime's ``env``)."""

    ready: trio.Event = attrs.Factory(trio.Event)
    done: trio.Event = attrs.Factory(trio.Event)
    flags: dict[str, trio.Event] = attrs.Factory(dict)
    errors: list[BaseException] = attrs.Factory(list)
    log: list[Any] = attrs.Factory(list)
    jobs_run: int = 0

    def flag(self, name: str) -> trio.Event:
        return self.flags.setdefault(name, trio.Event())


# -- the test objects --------------------------------------------------------------------


class Counter(nj.DurableObject):
    """Reads, awaits, then writes: the shape that loses updates without turns."""

    namespace = "tests.test_turns.Counter"

    async def slow_increment(self) -> int:
        n = self.ctx.storage.get("n", 0)
        await trio.sleep(0.25)
        self.ctx.storage.put("n", n + 1)
        return n + 1

    async def hold(self, key: str, seconds: float) -> None:
        self.ctx.storage.put(key, "held")
        await trio.sleep(seconds)
        self.ctx.storage.put(key, "released")

    async def get(self, key: str) -> Any:
        return self.ctx.storage.get(key)


class Account(nj.DurableObject):
    """A Lifecycle object whose jobs are named by what they do."""

    namespace = "tests.test_turns.Account"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> nj.Job:
        return await self.lifecycle.jobs.push(fn, **kwargs)

    async def push_many(self, fn: str, count: int, time: float) -> None:
        for _ in range(count):
            await self.lifecycle.jobs.push(fn, time=time)

    async def balance(self) -> int:
        found: int = self.ctx.storage.get("balance", 0)
        return found

    async def jobs_run_so_far(self) -> int:
        return self.env.jobs_run

    async def dead_letters(self) -> list[nj.DeadLetter]:
        return self.lifecycle.dead_letters()

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "deposit_then_fail":
            self.ctx.storage.put("balance", 100)
            self.env.ready.set()
            await trio.sleep(5)
            raise RuntimeError("the deposit fails after writing")
        if ctx.job.fn == "count":
            self.env.jobs_run += 1
            if self.env.jobs_run == 1:
                # The first job of the backlog holds the turn for a second: a call made
                # meanwhile is surely waiting when it ends.
                self.env.ready.set()
                await trio.sleep(1)
            if self.env.jobs_run == BACKLOG:
                self.env.done.set()
        if ctx.job.fn == "slow":
            # Holds the turn for 3 s: past a turn_warning of 2 s.
            self.env.jobs_run += 1
            self.env.ready.set()
            await trio.sleep(3)
        if ctx.job.fn == "finish_once_waited_for":
            # Holds the turn until the interleave method is waiting for it.
            self.env.ready.set()
            await self.env.flag("waiting").wait()
            self.ctx.storage.put("state", "finished")
            self.env.done.set()
        return None


class Chain(nj.DurableObject):
    """Calls itself, or a peer that calls back, through stubs."""

    namespace = "tests.test_turns.Chain"

    async def nest(self, depth: int) -> int:
        self.ctx.storage.put("depth", depth)
        if depth < 3:
            await self.ctx.get(Chain, self.ctx.id).nest(depth + 1)
        # The inner calls wrote inside this turn: their writes are visible here.
        found: int = self.ctx.storage.get("depth")
        return found

    async def bounce(self, peer: str, hops: int) -> list[str]:
        self.ctx.storage.put("visits", self.ctx.storage.get("visits", 0) + 1)
        if hops == 0:
            return [self.ctx.id]
        trail: list[str] = await self.ctx.get(Chain, peer).bounce(self.ctx.id, hops - 1)
        return [self.ctx.id, *trail]

    async def visits(self) -> int:
        found: int = self.ctx.storage.get("visits", 0)
        return found


class Spawner(nj.DurableObject):
    """Starts background work in ``ctx.nursery`` that outlives the call's turn."""

    namespace = "tests.test_turns.Spawner"

    async def spawn(self, *, in_turn: bool) -> None:
        self.ctx.nursery.start_soon(self._background, in_turn)

    async def _background(self, in_turn: bool) -> None:
        env: Env = self.ctx.env
        await trio.sleep(1)  # the call that started this task has ended: no turn here
        try:
            if in_turn:
                async with self.ctx.turn():
                    self.ctx.storage.put("k", "written")
            else:
                try:
                    self.ctx.storage.put("k", "written")
                except Exception as exc:
                    env.errors.append(exc)
                self.ctx.storage.get("k")
        except Exception as exc:
            env.errors.append(exc)
        finally:
            env.done.set()

    async def get(self, key: str) -> Any:
        return self.ctx.storage.get(key)


def reader_class() -> type[nj.DurableObject]:
    class Reader(nj.DurableObject):
        """Read-only methods next to a writing one."""

        namespace = "tests.test_turns.Reader"

        @nj.read_only
        async def meet(self, mine: str, theirs: str) -> Any:
            env: Env = self.ctx.env
            env.flag(mine).set()
            await env.flag(theirs).wait()
            return self.ctx.storage.get("k")

        @nj.read_only
        async def peek(self) -> Any:
            return self.ctx.storage.get("k")

        @nj.read_only
        async def sneak_a_write(self) -> None:
            self.ctx.storage.put("k", "sneaked")

        async def hold(self, seconds: float) -> None:
            self.ctx.storage.put("k", "held")
            await trio.sleep(seconds)
            self.ctx.storage.put("k", "released")

    return Reader


def waiter_class() -> type[nj.DurableObject]:
    class Waiter(Account):
        """An Account whose interleave methods run beside its jobs."""

        namespace = "tests.test_turns.Waiter"

        @nj.interleave
        async def wait_for_job(self) -> Any:
            self.env.flag("waiting").set()
            await self.env.done.wait()
            async with self.ctx.turn():
                return self.ctx.storage.get("state")

        @nj.interleave
        async def touch_without_turn(self) -> Any:
            return self.ctx.storage.get("state")

    return Waiter


class Handle(nj.DurableObject):
    """Keeps ``storage.conn`` from ``__init__`` (the startup turn), and a cursor, a blob
    and iterdump's lines it got in a call, then uses one of them in a task that holds no
    turn (``HANDLE_PATHS``)."""

    namespace = "tests.test_turns.Handle"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.conn = ctx.storage.conn  # kept from __init__
        self.kept: dict[str, Any] = {}

    async def fill(self, path: str) -> None:
        """Make table ``t``; keep what ``path`` uses later (only that: an open cursor
        or blob would hold up a backup)."""
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER, b BLOB)")
        self.conn.executemany("INSERT INTO t VALUES (?, zeroblob(4))", [(n,) for n in range(3)])
        if "cursor" in path:
            self.kept["cursor"] = self.conn.execute("SELECT n FROM t ORDER BY n")
            assert self.kept["cursor"].fetchone() == (0,)  # the rest is read later
        if "blob" in path:
            self.kept["blob"] = self.conn.blobopen("t", "b", 1)
        if "lines" in path:
            self.kept["dump"] = self.conn.iterdump()

    async def use_later(self, path: str) -> None:
        self.ctx.nursery.start_soon(self._use, path)

    async def _use(self, path: str) -> None:
        await trio.sleep(1)  # the call that started this task has ended: no turn here
        try:
            HANDLE_PATHS[path](self)
        except Exception as exc:
            self.env.errors.append(exc)
        finally:
            self.env.done.set()

    async def seen(self) -> tuple[list[Any], bytes, Any, bool]:
        """The rows of ``t``, the first blob, whether the row factory is the default,
        and whether a function ``f`` was registered."""
        rows = [tuple(row) for row in self.conn.execute("SELECT n FROM t ORDER BY n")]
        blob = self.conn.execute("SELECT b FROM t WHERE rowid = 1").fetchone()[0]
        try:
            self.conn.execute("SELECT f()")
            registered = True
        except sqlite3.OperationalError:
            registered = False
        return rows, blob, self.conn.row_factory is None, registered


def _backup(handle: Handle) -> None:
    with contextlib.closing(sqlite3.connect(":memory:")) as target:
        handle.conn.backup(target)


def _with_conn(handle: Handle) -> None:
    with handle.conn:
        pass


# Every way from a kept ``storage.conn`` (and what it handed out) into the connection.
HANDLE_PATHS: dict[str, Callable[[Handle], Any]] = {
    "execute": lambda h: h.conn.execute("DELETE FROM t"),
    "executemany": lambda h: h.conn.executemany("DELETE FROM t WHERE n = ?", [(0,)]),
    "executescript": lambda h: h.conn.executescript("DELETE FROM t;"),
    "taking a cursor": lambda h: h.conn.cursor(),
    "a new cursor's execute": lambda h: h.conn.cursor().execute("DELETE FROM t"),
    "commit": lambda h: h.conn.commit(),
    "rollback": lambda h: h.conn.rollback(),
    "with conn": _with_conn,
    "iterdump": lambda h: list(h.conn.iterdump()),
    "backup": _backup,
    "create_function": lambda h: h.conn.create_function("f", 0, lambda: 1),
    "blobopen": lambda h: h.conn.blobopen("t", "b", 1),
    "in_transaction": lambda h: h.conn.in_transaction,
    "set row_factory": lambda h: setattr(h.conn, "row_factory", sqlite3.Row),
    "fetchone of a kept cursor": lambda h: h.kept["cursor"].fetchone(),
    "fetchall of a kept cursor": lambda h: h.kept["cursor"].fetchall(),
    "fetchmany of a kept cursor": lambda h: h.kept["cursor"].fetchmany(2),
    "iterating a kept cursor": lambda h: list(h.kept["cursor"]),
    "next of a kept cursor": lambda h: next(h.kept["cursor"]),
    "a kept cursor's execute": lambda h: h.kept["cursor"].execute("DELETE FROM t"),
    "reading a kept blob": lambda h: h.kept["blob"].read(),
    "writing a kept blob": lambda h: h.kept["blob"].write(b"ab"),
    "writing a kept blob by index": lambda h: h.kept["blob"].__setitem__(0, 7),
    "iterating kept iterdump lines": lambda h: list(h.kept["dump"]),
}


class SlowCapability(nj.Capability):
    """A capability whose ``on_start`` (part of the Lifecycle's startup) takes a second."""

    id = "slow"

    async def on_start(self) -> None:
        await trio.sleep(1)


def starting_class() -> type[nj.DurableObject]:
    class Starting(nj.DurableObject):
        """``on_start`` takes a second, the Lifecycle's startup another; each call logs
        when it runs and holds its turn for a second."""

        namespace = "tests.test_turns.Starting"

        def __init__(self, ctx: nj.ObjectContext) -> None:
            super().__init__(ctx)
            self.env: Env = ctx.env
            self.lifecycle = nj.Lifecycle.install(self).use(SlowCapability())

        async def on_start(self) -> None:
            await trio.sleep(1)

        @nj.read_only
        async def look(self, name: str) -> None:
            self.env.log.append((name, trio.current_time()))
            await trio.sleep(1)

        async def write(self, name: str) -> None:
            self.env.log.append((name, trio.current_time()))
            await trio.sleep(1)

    return Starting


class Slow(nj.DurableObject):
    namespace = "tests.test_turns.Slow"

    async def take(self, seconds: float) -> None:
        await trio.sleep(seconds)


# -- no lost update, no dirty read -------------------------------------------------------


async def test_concurrent_read_await_write_calls_lose_no_update(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Fifty concurrent calls that read, await, then write all count: they take turns."""
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location) as rt:
            counter = rt.get(Counter, "c")
            async with trio.open_nursery() as nursery:
                for _ in range(50):
                    nursery.start_soon(counter.slow_increment)
            assert await counter.get("n") == 50
            # One turn after another, each holding it across its 0.25 s await.
            assert trio.current_time() == 50 * 0.25


async def test_calls_wait_for_the_turn_in_arrival_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Calls that arrive while a turn is held run after it, in the order they came."""
    order: list[str] = []

    async def call(name: str, at: float) -> None:
        await trio.sleep(at)
        await counter.hold(name, 1)
        order.append(name)

    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location) as rt:
            counter = rt.get(Counter, "c")
            async with trio.open_nursery() as nursery:
                for name, at in [("first", 0), ("third", 0.5), ("second", 0.25)]:
                    nursery.start_soon(call, name, at)
            assert order == ["first", "second", "third"]
            assert trio.current_time() == 3


async def test_a_call_never_reads_a_write_that_is_rolled_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A call made while a job that wrote awaits waits for its turn, and sees the rollback."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            account = rt.get(Account, "a")
            await account.push("deposit_then_fail", retry=nj.RetryOptions(max_attempts=1))
            await env.ready.wait()  # the job has written 100 and now awaits
            wrote_at = trio.current_time()
            assert await account.balance() == 0
            # The call waited out the job's turn (5 s), not a moment less.
            assert trio.current_time() == wrote_at + 5
            [dead] = await account.dead_letters()
            assert dead.job.fn == "deposit_then_fail"
            assert await account.balance() == 0


# -- re-entry ---------------------------------------------------------------------------


async def test_an_object_calling_itself_reenters_its_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A call through an object's own stub runs inside the caller's turn: no deadlock."""
    with trio.fail_after(5):
        async with nj.open_runtime(engine.location) as rt:
            assert await rt.get(Chain, "a").nest(0) == 3


async def test_a_call_chain_back_to_an_object_reenters_its_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A → B → A → B → A completes: each call comes back along its own chain."""
    with trio.fail_after(5):
        async with nj.open_runtime(engine.location) as rt:
            a = rt.get(Chain, "a")
            assert await a.bounce("b", 4) == ["a", "b", "a", "b", "a"]
            assert await a.visits() == 3
            assert await rt.get(Chain, "b").visits() == 2


@pytest.mark.parametrize(("arrivals", "expected"), [
    ([("look", "reader", 0), ("write", "writer", 0.5)], [("reader", 2), ("writer", 3)]),
    ([("write", "writer", 0), ("look", "reader", 0.5)], [("writer", 2), ("reader", 3)]),
    ([("look", "reader 1", 0), ("look", "reader 2", 0.25), ("write", "writer", 0.5)],
     [("reader 1", 2), ("reader 2", 2), ("writer", 3)]),
], ids=["read then write", "write then read", "two reads then write"])
async def test_calls_that_arrive_while_the_object_starts_run_in_arrival_order(
    autojump_clock: trio.testing.MockClock, arrivals: list[tuple[str, str, float]],
    expected: list[tuple[str, float]],
) -> None:
    """Calls that arrive while the object starts (``on_start`` from 0 to 1, then the
    Lifecycle's startup to 2) run in arrival order, a read-only call first too: it runs
    the startup at its place in line, and read-only calls next to each other in line
    still run side by side."""
    starting = starting_class()
    env = Env()

    async def call(method: str, name: str, at: float) -> None:
        await trio.sleep(at)
        await stub.call(method, name)

    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            stub = rt.get(starting, "s")
            async with trio.open_nursery() as nursery:
                for method, name, at in arrivals:
                    nursery.start_soon(call, method, name, at)
            assert env.log == expected


# -- read-only methods --------------------------------------------------------------------


async def test_read_only_calls_run_side_by_side(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two read-only calls that each wait for the other both complete."""
    reader = reader_class()
    env = Env()
    results: list[Any] = []

    async def meet(mine: str, theirs: str) -> None:
        results.append(await stub.meet(mine, theirs))

    with trio.fail_after(5):
        async with nj.open_runtime(engine.location, env=env) as rt:
            stub = rt.get(reader, "r")
            await stub.hold(0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(meet, "a", "b")
                nursery.start_soon(meet, "b", "a")
            assert results == ["released", "released"]
            assert trio.current_time() == 0


async def test_read_only_call_waits_for_an_open_writing_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A read-only call never runs while a writing turn is open: it sees its end."""
    reader = reader_class()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location) as rt:
            stub = rt.get(reader, "r")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stub.hold, 1)
                await trio.sleep(0.5)
                assert await stub.peek() == "released"
                assert trio.current_time() == 1


async def test_a_write_in_a_read_only_method_raises_and_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A write inside a read-only method raises TurnError, and nothing is written."""
    reader = reader_class()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location) as rt:
            stub = rt.get(reader, "r")
            with pytest.raises(nj.TurnError):
                await stub.sneak_a_write()
            assert await stub.peek() is None


# -- interleave methods -------------------------------------------------------------------


async def test_an_interleave_method_waits_for_an_event_a_running_job_sets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An interleave call runs beside the job holding the turn (it would deadlock in one)."""
    waiter = waiter_class()
    env = Env()
    with trio.fail_after(5):
        async with nj.open_runtime(engine.location, env=env) as rt:
            stub = rt.get(waiter, "w")
            await stub.push("finish_once_waited_for")
            await env.ready.wait()  # the job holds the turn until the call waits
            assert await stub.wait_for_job() == "finished"


async def test_an_interleave_method_touching_storage_without_a_turn_raises(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An interleave method holds no turn: storage outside ``ctx.turn()`` raises TurnError."""
    waiter = waiter_class()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=Env()) as rt:
            with pytest.raises(nj.TurnError):
                await rt.get(waiter, "w").touch_without_turn()


# -- tasks outside a turn ----------------------------------------------------------------


async def test_a_background_task_without_a_turn_gets_turn_error_and_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A task in ``ctx.nursery`` that outlived its call holds no turn: storage refuses it."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            stub = rt.get(Spawner, "s")
            await stub.spawn(in_turn=False)
            await env.done.wait()
            # Both the write and the read were refused.
            assert [type(e) for e in env.errors] == [nj.TurnError, nj.TurnError]
            assert await stub.get("k") is None


@pytest.mark.parametrize("path", list(HANDLE_PATHS))
async def test_every_way_into_a_kept_connection_without_a_turn_raises_and_touches_nothing(
    autojump_clock: trio.testing.MockClock, path: str,
) -> None:
    """``storage.conn`` kept from ``__init__``, and the cursors, blobs and iterators it
    handed out in a turn: used by a task that holds none, each raises TurnError, and
    nothing is read or written (the rows, the blob, the row factory and the functions
    of the connection are as they were)."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            stub = rt.get(Handle, "h")
            await stub.fill(path)
            await stub.use_later(path)
            await env.done.wait()
            assert [type(e) for e in env.errors] == [nj.TurnError], env.errors
            assert await stub.seen() == ([(0,), (1,), (2,)], bytes(4), True, False)


async def test_a_background_task_writes_inside_ctx_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The same background task that enters ``ctx.turn()`` writes, and the write lasts."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            stub = rt.get(Spawner, "s")
            await stub.spawn(in_turn=True)
            await env.done.wait()
            assert env.errors == []
            assert await stub.get("k") == "written"


# -- fairness ------------------------------------------------------------------------------


async def test_a_call_waits_for_one_job_not_for_the_backlog(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A call made while a 3,000-job backlog runs gets the turn after the running job."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            account = rt.get(Account, "a")
            await account.push_many("count", BACKLOG, EPOCH + 10)
            await env.ready.wait()  # at +10 the first job runs, holding the turn to +11
            ran_when_called = await account.jobs_run_so_far()
            # It waited for the one job that held the turn, and for no other.
            assert (ran_when_called, trio.current_time()) == (1, 11)
            await env.done.wait()  # the rest of the backlog runs on after the call
            assert trio.current_time() == 11


# -- the slow-turn warning -------------------------------------------------------------------


async def test_a_turn_held_past_turn_warning_emits_turn_slow_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A turn held past ``turn_warning`` emits one ``object:turn_slow``, when it passes it."""
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, turn_warning=2.0) as rt:
            rt.events.add_listener(events.append)
            slow = rt.get(Slow, "s")
            await slow.take(1.5)  # under the warning: nothing
            await slow.take(5)  # held from 1.5 to 6.5: one event, at 3.5
            [event] = [e for e in events if e.type == "object:turn_slow"]
            assert (event.namespace, event.object_id) == (Slow.namespace, "s")
            assert event.time == EPOCH + 3.5
            assert event.data["seconds"] == 2.0
            assert "take" in str(event.data["holder"])


# -- the error ----------------------------------------------------------------------------


async def test_turn_error_is_a_storage_error_whose_message_names_the_fix(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``nj.TurnError`` is exported, is a StorageError, and says to use ``ctx.turn()``."""
    assert "TurnError" in nj.__all__
    assert issubclass(nj.TurnError, nj.StorageError)
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            await rt.get(Spawner, "object-7").spawn(in_turn=False)
            await env.done.wait()
    error = env.errors[0]
    assert isinstance(error, nj.TurnError)
    assert "ctx.turn()" in str(error)
    assert "object-7" in str(error)


async def test_each_slow_turn_warns_once_and_quick_ones_never(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Back-to-back slow turns each get their own ``object:turn_slow``; a stream of quick
    turns, however long it lasts in all, gets none."""
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, turn_warning=2.0) as rt:
            rt.events.add_listener(events.append)
            slow = rt.get(Slow, "s")
            for _ in range(30):
                await slow.take(0.5)  # 15 s of turns, none of them slow
            await slow.take(3)  # from 15 to 18: warned at 17
            await slow.take(3)  # from 18 to 21: warned at 20
            times = [e.time - EPOCH for e in events if e.type == "object:turn_slow"]
            assert times == [17, 20]


async def test_a_slow_job_after_a_hand_over_is_warned_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A hand-over ends the alarm run's holding: the turn it takes back is a new one, so a
    second slow job of the same run gets its own ``object:turn_slow``."""
    env = Env()
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env, turn_warning=2.0) as rt:
            rt.events.add_listener(events.append)
            account = rt.get(Account, "a")
            await account.push_many("slow", 2, EPOCH + 10)
            await env.ready.wait()  # at +10 the first job holds the turn to +13
            await trio.sleep(1)
            # The call waits for the first job; the run hands the turn over at +13.
            assert await account.jobs_run_so_far() == 1
            assert trio.current_time() == 13
            await trio.sleep(10)  # the second job holds the turn from +13 to +16
            assert await account.jobs_run_so_far() == 2
            slow = [(e.time - EPOCH, e.data["holder"]) for e in events
                    if e.type == "object:turn_slow"]
            assert [when for when, _ in slow] == [12, 15], slow
