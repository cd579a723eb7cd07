"""Dormant objects (``dormant_after``) at their edges: activation of a dormant object,
eviction while it waits for its file, connection state a reopen would lose, cursors kept
between calls. Each was a bug found by review (the docstrings say what it did). Times
are exact virtual times under the autojump clock."""

from __future__ import annotations

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
    namespace = "tests.dormancy_review.Note"

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


def dormant(rt: Any, cls: type[nj.DurableObject], object_id: str) -> bool:
    """Resident, with its database closed."""
    return bool(rt.is_active(cls.namespace, object_id)
                and rt.active_database(cls.namespace, object_id) is None)


def object_file(data: Path, cls: type[nj.DurableObject], object_id: str) -> Path:
    return data / "objects" / object_file_name(cls.namespace, object_id)


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
        note = rt.get(Note, "a")
        await note.execute(sql)
        await note.execute("INSERT INTO scratch VALUES (1)")
        await trio.sleep(2)
        assert await note.execute("SELECT x FROM scratch") == [(1,)]
        assert not dormant(rt, Note, "a")


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
        await rt.get(Note, "a").add()
        await trio.sleep(2)
        assert dormant(rt, Note, "a")
        outcome: list[object] = []

        async def activate_a() -> None:
            try:
                outcome.append(type(await rt.activate(Note, "a")))
            except Exception as exc:
                outcome.append(type(exc))  # (the type only: no traceback keeps the host)

        with held_by_another_process(object_file(data, Note, "a")) as release:
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(activate_a)
                await trio.sleep(0.01)
                # max_active: evicts a, which nothing marks as busy meanwhile (were
                # activate's wake work of the object, a would stay).
                assert await rt.get(Note, "b").add() == (1, 1)
                await trio.sleep_until(start + 0.1)
                release()  # a's awaken tries again at +0.15
        # Nothing of the evicted host keeps the file open: a's next call opens it.
        with trio.fail_after(HANG):
            assert (await rt.get(Note, "a").add())[0] == 2
        # Either answer is fine (a fresh activation's instance, or a typed error); a
        # bare AssertionError is not.
        assert outcome == [Note] or issubclass(outcome[0], nj.NurseryJobsError), outcome


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
        note = rt.get(Note, "a")
        await note.execute(sql)
        await trio.sleep(2)
        assert not dormant(rt, Note, "a")
        assert await note.execute("PRAGMA foreign_keys") == [(1,)]


async def test_an_object_that_only_reads_and_drops_its_cursors_still_dozes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The checks above keep only what needs it open: plain reads and writes through
    storage.execute, cursors read to the end and dropped, leave the object free to doze."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600, dormant_after=1) as rt:
        note = rt.get(Note, "a")
        await note.execute("CREATE TABLE t (x)")
        await note.execute("INSERT INTO t VALUES (1)")
        assert await note.execute("SELECT x FROM t") == [(1,)]
        await trio.sleep(2)
        assert dormant(rt, Note, "a")
        assert await note.execute("SELECT x FROM t") == [(1,)]
