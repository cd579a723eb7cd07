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
    from nursery_jobs._ops._inspect import RuntimeSource

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
