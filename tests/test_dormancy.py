"""Dormant objects: an object idle for ``dormant_after`` closes its database and stays
resident (its task, its instance, its in-memory state); its next call or alarm opens
the database again. Times are exact virtual times under the autojump clock."""
# The real-clock test polls the runtime's state, which has no event to wait on.
# ruff: noqa: ASYNC110

from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from fault_seam import held_by_another_process

import nursery_jobs as nj
from nursery_jobs._engines.files._catalog import object_file_name

HANG = 100_000


class Note(nj.DurableObject):
    namespace = "tests.dormancy.Note"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.calls = 0  # in memory only: survives dormancy, not eviction
        self.alarms: list[float] = []

    async def on_start(self) -> None:
        if self.ctx.env is not None:
            self.ctx.env.setdefault("starts", []).append((self.ctx.id, trio.current_time()))

    async def add(self, by: int = 1) -> tuple[int, int]:
        n = self.ctx.storage.get("n", 0) + by
        self.ctx.storage.put("n", n)
        self.calls += 1
        return n, self.calls

    async def arm(self, delay: float) -> None:
        self.ctx.storage.set_alarm(nj.now() + delay)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.alarms.append(trio.current_time())
        self.ctx.storage.put("alarmed", len(self.alarms))

    async def read(self, key: str) -> Any:
        return self.ctx.storage.get(key)

    async def use_db(self) -> int:
        self.ctx.storage.db.execute("CREATE TABLE IF NOT EXISTS t (x)")
        return len(self.ctx.storage.db.table_names())

    async def set_pragma(self) -> None:
        self.ctx.storage.execute("PRAGMA foreign_keys = ON")

    async def pragma(self) -> int:
        return int(self.ctx.storage.execute("PRAGMA foreign_keys").fetchone()[0])

    async def start_background(self) -> None:
        self.ctx.nursery.start_soon(trio.sleep_forever)


class Counter(nj.DurableObject):
    namespace = "tests.dormancy.Counter"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.ran: list[float] = []

    async def push(self, delay: float) -> None:
        await self.lifecycle.jobs.push("count", delay=delay)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ran.append(trio.current_time())
        self.ctx.storage.put("n", self.ctx.storage.get("n", 0) + 1)

    async def read(self) -> int:
        return int(self.ctx.storage.get("n", 0))


def dormant(rt: Any, cls: type[nj.DurableObject], object_id: str) -> bool:
    """Resident, with its database closed."""
    return bool(rt.is_active(cls.namespace, object_id)
                and rt.active_database(cls.namespace, object_id) is None)


async def at(time: float) -> None:
    """Sleep until ``time``, then let every task due then run (no virtual time passes)."""
    await trio.sleep_until(time)
    await trio.testing.wait_all_tasks_blocked()
    assert trio.current_time() == time


def object_file(data: Path, cls: type[nj.DurableObject], object_id: str) -> Path:
    return data / "objects" / object_file_name(cls.namespace, object_id)


def file_is_free(path: Path) -> bool:
    """Whether another connection can take the file's write lock (the runtime holds
    an open object's file with locking_mode=EXCLUSIVE)."""
    conn = sqlite3.connect(path, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


async def test_an_idle_object_closes_its_database_and_its_next_call_reopens_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    env: dict[str, Any] = {}
    data = tmp_path / "data"
    async with nj.open_runtime(data, env=env, idle_timeout=60, dormant_after=10) as rt:
        note = rt.get(Note, "a")
        start = trio.current_time()
        assert await note.add() == (1, 1)
        await at(start + 10 - 0.001)
        assert not dormant(rt, Note, "a")
        assert not file_is_free(object_file(data, Note, "a"))
        await at(start + 10)
        assert dormant(rt, Note, "a")
        assert file_is_free(object_file(data, Note, "a"))  # closed: its lock released
        # Its next call opens it again: storage and in-memory state are both there.
        await at(start + 15)
        assert await note.add(2) == (3, 2)
        assert not dormant(rt, Note, "a")
        assert env["starts"] == [("a", start)]  # never re-activated
        # Dormant again dormant_after after that call, evicted idle_timeout after it.
        await at(start + 25 - 0.001)
        assert not dormant(rt, Note, "a")
        await at(start + 25)
        assert dormant(rt, Note, "a")
        await at(start + 75 - 0.001)
        assert rt.is_active(Note.namespace, "a")
        await at(start + 75)
        assert not rt.is_active(Note.namespace, "a")
        assert await note.read("n") == 3
        assert len(env["starts"]) == 2


async def test_a_dormant_objects_alarm_runs_on_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with nj.open_runtime(tmp_path / "data", idle_timeout=60, dormant_after=1) as rt:
        note = rt.get(Note, "a")
        start = trio.current_time()
        await note.arm(30)
        await trio.sleep(2)
        assert dormant(rt, Note, "a")
        await trio.sleep(30)
        assert await note.read("alarmed") == 1
        instance = await rt.activate(Note, "a")
        assert isinstance(instance, Note) and instance.alarms == [start + 30]


async def test_a_lifecycle_object_runs_its_jobs_exactly_once_across_dormancy(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with nj.open_runtime(tmp_path / "data", idle_timeout=600, dormant_after=1) as rt:
        counter = rt.get(Counter, "c")
        start = trio.current_time()
        for delay in (5, 20, 40):
            await counter.push(delay)
        for _ in range(3):
            await trio.sleep(15)
        assert await counter.read() == 3
        instance = await rt.activate(Counter, "c")
        assert isinstance(instance, Counter)
        assert instance.ran == [start + 5, start + 20, start + 40]
        # rt.activate woke it (its caller uses the instance at once); idle again, it
        # dozes again.
        now = trio.current_time()
        assert not dormant(rt, Counter, "c")
        await at(now + 1)
        assert dormant(rt, Counter, "c")


@pytest.mark.parametrize("pin", ["use_db", "set_pragma", "start_background"])
async def test_an_object_whose_connection_has_state_of_its_own_stays_open(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, pin: str
) -> None:
    async with nj.open_runtime(tmp_path / "data", idle_timeout=60, dormant_after=1) as rt:
        note = rt.get(Note, "a")
        await note.call(pin)
        await trio.sleep(30)
        assert not dormant(rt, Note, "a")
        if pin == "set_pragma":
            assert await note.pragma() == 1  # what it set lasts the activation
        # A plain object beside it does go dormant.
        await rt.get(Note, "b").add()
        await trio.sleep(2)
        assert dormant(rt, Note, "b")




async def test_a_dormant_file_locked_by_another_process_fails_the_call_typed_and_heals(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "data"
    async with nj.open_runtime(data, idle_timeout=3600, dormant_after=1) as rt:
        note = rt.get(Note, "a")
        await note.add()
        await trio.sleep(2)
        assert dormant(rt, Note, "a")
        with held_by_another_process(object_file(data, Note, "a")) as release:
            start = trio.current_time()
            with pytest.raises(nj.StorageError) as info:
                await note.add()
            # Tried again in Trio sleeps (50 ms doubling, 4 retries) before failing.
            assert trio.current_time() - start == pytest.approx(0.05 + 0.1 + 0.2 + 0.4)
            assert getattr(info.value, "cause", None) == "locked"
            assert "tests.dormancy.Note/a" in str(info.value)
            release()
        assert await note.add() == (2, 2)  # healed: nothing of the failed call ran


async def test_a_dormant_objects_alarm_retries_while_its_file_is_locked(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "data"
    async with nj.open_runtime(data, idle_timeout=3600, dormant_after=1) as rt:
        retries: list[nj.Event] = []
        rt.events.add_listener(lambda e: retries.append(e) if e.type == "alarm:retry" else None)
        note = rt.get(Note, "a")
        start = trio.current_time()
        await note.arm(10)
        await trio.sleep(2)
        assert dormant(rt, Note, "a")
        with held_by_another_process(object_file(data, Note, "a")) as release:
            await trio.sleep_until(start + 12)
            assert [e.object_id for e in retries] == ["a"]  # failed once, retried in 2 s
            release()
        await trio.sleep(5)
        instance = await rt.activate(Note, "a")
        assert isinstance(instance, Note)
        assert instance.alarms == [pytest.approx(start + 10 + 0.75 + 2)]
        assert await note.read("alarmed") == 1


async def test_a_dormant_objects_file_that_went_away_is_not_recreated_empty(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "data"
    async with nj.open_runtime(data, idle_timeout=3600, dormant_after=1) as rt:
        note = rt.get(Note, "a")
        await note.add()
        await trio.sleep(2)
        path = object_file(data, Note, "a")
        os.replace(path, tmp_path / "aside")
        with pytest.raises(nj.StorageError) as info:
            await note.add()
        assert getattr(info.value, "cause", None) == "missing"
        assert not path.exists()
        os.replace(tmp_path / "aside", path)  # an operator puts it back
        assert await note.add() == (2, 2)


@pytest.mark.parametrize("leave", ["evicted", "runtime closes"])
async def test_a_dormant_object_whose_file_is_still_gone_leaves_memory_cleanly(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, leave: str
) -> None:
    """A reopen that failed leaves the connection unusable: its eviction, or the
    runtime's exit, must not fail on it (it did: close() raised ProgrammingError and
    the runtime died on its way out)."""
    data = tmp_path / "data"
    async with nj.open_runtime(data, idle_timeout=60, dormant_after=1) as rt:
        note = rt.get(Note, "a")
        await note.add()
        await trio.sleep(2)
        os.replace(object_file(data, Note, "a"), tmp_path / "aside")
        with pytest.raises(nj.StorageError):
            await note.add()
        if leave == "evicted":
            await trio.sleep(61)
            assert not rt.is_active(Note.namespace, "a")
            assert await rt.get(Note, "b").add() == (1, 1)  # the runtime carries on
    assert not object_file(data, Note, "a").exists()  # nothing recreated on the way out


async def test_dormant_after_is_checked_and_none_keeps_databases_open(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    for bad in (0, -1, math.nan, math.inf, True, "10"):
        with pytest.raises(ValueError, match="dormant_after"):
            async with nj.open_runtime(tmp_path / "bad", dormant_after=bad):  # type: ignore[arg-type]
                pass
    assert not (tmp_path / "bad").exists()
    async with nj.open_runtime(tmp_path / "data", idle_timeout=60, dormant_after=None) as rt:
        await rt.get(Note, "a").add()
        await trio.sleep(59)
        assert not dormant(rt, Note, "a")
    # In memory there is no file to reopen: never dormant.
    async with nj.open_runtime(None, idle_timeout=60, dormant_after=1) as rt:
        await rt.get(Note, "a").add()
        await trio.sleep(59)
        assert not dormant(rt, Note, "a")
        assert await rt.get(Note, "a").add() == (2, 2)


async def test_the_dashboard_reads_a_dormant_object_as_active(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from nursery_jobs._ops._sources import RuntimeSource

    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1) as rt:
        counter = rt.get(Counter, "c")
        await counter.push(3600)
        await trio.sleep(2)
        assert dormant(rt, Counter, "c")
        detail = RuntimeSource(rt).detail(Counter.namespace, "c", nj.now())
        assert detail is not None
        assert detail.summary.state == "active" and detail.summary.row.active
        assert [job.fn for job in detail.jobs] == ["count"]
        assert dormant(rt, Counter, "c")  # reading did not wake it
        with trio.fail_after(HANG):
            assert await counter.read() == 0


async def test_on_a_real_clock_the_close_runs_in_a_thread_and_a_call_waits_for_it(
    tmp_path: Path,
) -> None:
    # No MockClock: the close (a WAL checkpoint with an fsync) runs in a worker thread.
    async with nj.open_runtime(tmp_path / "data", idle_timeout=60, dormant_after=0.05) as rt:
        note = rt.get(Note, "a")
        for round in range(1, 4):
            assert await note.add() == (round, round)
            with trio.fail_after(10):
                while not dormant(rt, Note, "a"):
                    await trio.sleep(0.01)
        # A call made the moment it starts to close waits for the close, then reopens.
        await note.add()
        with trio.fail_after(10):
            while not dormant(rt, Note, "a"):
                await trio.lowlevel.checkpoint()
        assert await note.add() == (5, 5)


async def test_a_relative_data_directory_stays_where_it_was_opened_after_a_chdir(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process changes directory while the runtime is open: a dormant object opens
    its own file again, and an object activated later is created in the data directory
    the runtime opened, never under the new working directory."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    async with nj.open_runtime("data", idle_timeout=60, dormant_after=1) as rt:
        assert await rt.get(Note, "a").add() == (1, 1)
        await trio.sleep(2)
        assert dormant(rt, Note, "a")
        monkeypatch.chdir(tmp_path / "elsewhere")
        assert await rt.get(Note, "a").add() == (2, 2)  # its file, opened again
        assert await rt.get(Note, "b").add() == (1, 1)  # a new object, in the same place
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert object_file(tmp_path / "data", Note, "b").exists()


async def test_with_dormancy_the_default_bound_counts_open_databases_and_dozes_the_oldest(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_active=None means what the open-file limit allows. A dormant object holds no
    file descriptor, so with dormancy on that bound counts open databases: past it the
    least recently used idle object dozes at once and stays resident (without dormancy
    it is evicted). An object that may not doze (its connection pinned) is evicted."""
    import nursery_jobs._core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "default_max_active", lambda: 3)
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600,
                               dormant_after=1000) as rt:
        assert rt.max_active == 3
        for name in "abcde":
            await rt.get(Note, name).add()
        await trio.sleep(0.01)  # (the dozes asked for run in the objects' tasks)
        assert [dormant(rt, Note, n) for n in "abcde"] == [True, True, False, False, False]
        assert all(rt.is_active(Note.namespace, n) for n in "abcde")  # all resident
        # a is used again: it opens, and now c is the least recently used open one.
        assert await rt.get(Note, "a").add() == (2, 2)
        await trio.sleep(0.01)
        assert [dormant(rt, Note, n) for n in "abcde"] == [False, True, True, False, False]
        # A pinned object cannot doze: past the bound it leaves memory instead.
        await rt.get(Note, "d").use_db()
        await rt.get(Note, "e").add()
        await rt.get(Note, "a").add()  # open, least recently used first: d, e, a
        await rt.get(Note, "f").add()
        await trio.sleep(0.01)
        assert not rt.is_active(Note.namespace, "d")
        assert [dormant(rt, Note, n) for n in "abcef"] == [False, True, True, False, False]


async def test_without_dormancy_the_default_bound_still_evicts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nursery_jobs._core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "default_max_active", lambda: 3)
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600) as rt:
        for name in "abcde":
            await rt.get(Note, name).add()
        await trio.sleep(0.01)
        assert [rt.is_active(Note.namespace, n) for n in "abcde"] == [
            False, False, True, True, True]


async def test_an_explicit_max_active_bounds_resident_objects_dormant_or_not(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1,
                               max_active=3) as rt:
        for name in "abcde":
            await rt.get(Note, name).add()
            await trio.sleep(2)  # each dozes before the next comes
        assert [rt.is_active(Note.namespace, n) for n in "abcde"] == [
            False, False, True, True, True]


async def test_where_objects_cannot_doze_the_default_bound_evicts_as_before(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory engine keeps its databases open for good: with dormant_after set, the
    default bound still evicts the least recently used idle object."""
    import nursery_jobs._core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "default_max_active", lambda: 3)
    async with nj.open_runtime(None, idle_timeout=3600, dormant_after=1000) as rt:
        for name in "abcde":
            await rt.get(Note, name).add()
        await trio.sleep(0.01)
        assert [rt.is_active(Note.namespace, n) for n in "abcde"] == [
            False, False, True, True, True]


# -- activation, connection state and cursors of dormant objects --------------------

class SqlNote(nj.DurableObject):
    namespace = "tests.dormancy_review.SqlNote"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.calls = 0

    async def add(self, by: int = 1) -> tuple[int, int]:
        n = self.ctx.storage.get("n", 0) + by
        self.ctx.storage.put("n", n)
        self.calls += 1
        return n, self.calls

    async def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self.ctx.storage.execute(sql, params).fetchall()]


class Flaky(nj.Capability):
    """A capability whose on_start fails the first time (a transient fault)."""

    id = "flaky"

    def __init__(self) -> None:
        self.tries = 0

    async def on_start(self) -> None:
        self.tries += 1
        if self.tries == 1:
            raise RuntimeError("transient")
        await trio.lowlevel.checkpoint()


class Flakey(nj.DurableObject):
    namespace = "tests.dormancy_review.Flakey"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self).use(Flaky())

    async def on_job(self, ctx: nj.JobContext) -> None:
        pass

    async def ping(self) -> str:
        return "pong"


async def test_activate_on_a_dormant_object_whose_startup_is_pending_opens_it_first(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """rt.activate() wakes a dormant object before it runs the startup hooks (the
    Lifecycle's re-arm from nj_jobs): it ran them first, on the closed connection, and
    failed with an untyped sqlite3.ProgrammingError."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1) as rt:
        obj = rt.get(Flakey, "f")
        with pytest.raises(RuntimeError, match="transient"):
            await obj.ping()  # the startup failed: it runs again before the next work
        await trio.sleep(2)
        assert dormant(rt, Flakey, "f")
        instance = await rt.activate(Flakey, "f")  # raised ProgrammingError
        assert isinstance(instance, Flakey) and instance.lifecycle.started
        assert not dormant(rt, Flakey, "f")


@pytest.mark.parametrize("sql", [
    "CREATE TABLE temp.scratch (x)",  # a TEMP table, by its schema name
    "-- scratch space\nCREATE TEMP TABLE scratch (x)",  # after a comment
    "/* scratch */ CREATE TEMP TABLE scratch (x)",
])
async def test_a_temp_table_however_spelled_keeps_the_database_open(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, sql: str
) -> None:
    """A TEMP table made as ``temp.name`` or after a comment keeps the connection open
    (the doze looks for TEMP objects and attached databases in the connection itself).
    It was missed by a prefix match: the object dozed and the table and its rows were
    gone (OperationalError: no such table)."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1) as rt:
        note = rt.get(SqlNote, "a")
        await note.execute(sql)
        await note.execute("INSERT INTO scratch VALUES (1)")
        await trio.sleep(2)
        assert await note.execute("SELECT x FROM scratch") == [(1,)]
        assert not dormant(rt, SqlNote, "a")


async def test_a_dormant_object_evicted_while_activate_waits_on_its_lock_is_not_reopened(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """rt.activate() wakes a dormant object as work of the object, so while it retries a
    file another process holds (LOCKED_RETRY) the object stays resident. It used to be
    evictable meanwhile (here by max_active): the retry then reopened the connection of
    the closed host, which kept the file locked, and activate() failed with a bare
    AssertionError."""
    data = tmp_path / "data"
    async with nj.open_runtime(data, idle_timeout=3600, dormant_after=1, max_active=1) as rt:
        await rt.get(SqlNote, "a").add()
        await trio.sleep(2)
        assert dormant(rt, SqlNote, "a")
        outcome: list[object] = []

        async def activate_a() -> None:
            try:
                outcome.append(type(await rt.activate(SqlNote, "a")))
            except Exception as exc:
                outcome.append(type(exc))  # (the type only: no traceback keeps the host)

        with held_by_another_process(object_file(data, SqlNote, "a")) as release:
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(activate_a)
                await trio.sleep(0.01)
                # max_active: evicts a, which nothing marks as busy meanwhile (were
                # activate's wake work of the object, a would stay).
                assert await rt.get(SqlNote, "b").add() == (1, 1)
                await trio.sleep_until(start + 0.1)
                release()  # a's awaken tries again at +0.15
        # Nothing of the evicted host keeps the file open: a's next call opens it.
        with trio.fail_after(HANG):
            assert (await rt.get(SqlNote, "a").add())[0] == 2
        # Either answer is fine (a fresh activation's instance, or a typed error); a
        # bare AssertionError is not.
        assert outcome == [SqlNote] or issubclass(outcome[0], nj.NurseryJobsError), outcome


class Slow(nj.Capability):
    """A capability whose on_start takes a while (it awaits something outside)."""

    id = "slow"

    async def on_start(self) -> None:
        await trio.sleep(2)


class SlowStart(nj.DurableObject):
    namespace = "tests.dormancy_review.SlowStart"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self).use(Slow())

    async def on_job(self, ctx: nj.JobContext) -> None:
        pass


async def test_an_object_does_not_doze_while_activate_runs_its_startup(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """rt.activate() runs the startup hooks as work of the object (as a stub call
    does): an object whose startup awaits longer than dormant_after used to doze in the
    middle of it, and the startup failed on the closed connection."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1) as rt:
        instance = await rt.activate(SlowStart, "s")
        assert isinstance(instance, SlowStart) and instance.lifecycle.started


class Pager(nj.DurableObject):
    """Pages through its keys with a cursor kept between calls."""

    namespace = "tests.dormancy_review.Pager"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.cursor: sqlite3.Cursor | None = None

    async def fill(self, n: int) -> None:
        for i in range(n):
            self.ctx.storage.put(f"k{i:03}", i)

    async def next_key(self) -> str | None:
        if self.cursor is None:
            self.cursor = self.ctx.storage.execute("SELECT key FROM nj_kv ORDER BY key")
        row = self.cursor.fetchone()
        return None if row is None else str(row[0])

    async def put(self, key: str) -> None:
        self.ctx.storage.put(key, 1)

    async def drop_cursor(self) -> None:
        self.cursor = None


async def test_a_cursor_kept_between_calls_does_not_lock_the_object_out_of_its_file(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A cursor of storage.execute() still alive keeps the connection open. An object
    that kept a half-read cursor used to doze: the close left a zombie handle holding
    the file's lock, and every later call failed 'locked by another process' (it was
    this process) for as long as the instance stayed resident."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1) as rt:
        pager = rt.get(Pager, "p")
        await pager.fill(5)
        assert [await pager.next_key(), await pager.next_key()] == ["k000", "k001"]
        await trio.sleep(2)
        assert not dormant(rt, Pager, "p")
        await pager.put("other")  # (raised StorageFaultError, locked)
        assert await pager.next_key() == "k002"  # kept open: the page goes on
        # Once the cursor is gone, the object dozes again when idle.
        await pager.drop_cursor()
        await trio.sleep(2)
        assert dormant(rt, Pager, "p")
        await pager.put("another")


@pytest.mark.parametrize("sql", ["/* on */ PRAGMA foreign_keys = ON",
                                 "-- on\n  pragma foreign_keys = ON"])
async def test_a_pragma_after_a_comment_keeps_the_database_open(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, sql: str
) -> None:
    """A PRAGMA's setting cannot be seen in the connection later: the statement itself
    is recognised, after leading comments too (a reopen would lose the setting)."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1) as rt:
        note = rt.get(SqlNote, "a")
        await note.execute(sql)
        await trio.sleep(2)
        assert not dormant(rt, SqlNote, "a")
        assert await note.execute("PRAGMA foreign_keys") == [(1,)]


async def test_an_object_that_only_reads_and_drops_its_cursors_still_dozes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The checks above keep only what needs it open: plain reads and writes through
    storage.execute, cursors read to the end and dropped, leave the object free to doze."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1) as rt:
        note = rt.get(SqlNote, "a")
        await note.execute("CREATE TABLE t (x)")
        await note.execute("INSERT INTO t VALUES (1)")
        assert await note.execute("SELECT x FROM t") == [(1,)]
        await trio.sleep(2)
        assert dormant(rt, SqlNote, "a")
        assert await note.execute("SELECT x FROM t") == [(1,)]
