"""The shared layout (``open_runtime("shared:<dir>")``, issue 26): every object of a data
directory kept as rows of one SQLite database, loaded into a working copy on activation
and shipped on each commit. (The Lifecycle, Queue, Scheduler and Agent suites run on it
as the ``shared`` engine; the SIGKILL campaigns of test_crash.py run on it too.)"""

from __future__ import annotations

import gc
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from background_writes import put_later

import nursery_jobs as nj
from nursery_jobs._engines.files._catalog import Catalog
from nursery_jobs._engines.shared._engine import SHIP_INTERVAL, SharedEngine
from nursery_jobs._engines.shared._object import CopyPool, SharedObject
from nursery_jobs._errors import DataLayoutError

STALE: list[Any] = []  # a storage handle kept past its object's life (test 4)


class Note(nj.DurableObject):
    namespace = "tests.shared.Note"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def put(self, value: str) -> None:
        self.ctx.storage.put("v", value)

    async def get(self) -> Any:
        return self.ctx.storage.get("v")

    async def keys(self) -> list[str]:
        return sorted(self.ctx.storage.list())

    async def keep_handle(self) -> None:
        STALE.append(self.ctx.storage.conn)
        # What the pool guards against: a reference to the copy itself that outlives
        # the object (the runtime's own, a task's); the public handle above refuses.
        STALE.append(self.ctx.storage._conn)

    async def later(self, at: float) -> None:
        await self.lifecycle.jobs.push("run", time=at, id="j")

    async def raw(self) -> None:
        self.ctx.storage.execute("SELECT 1")

    async def raw_db(self) -> None:
        self.ctx.storage.db  # noqa: B018

    async def on_job(self, ctx: nj.JobContext) -> None:
        return None

    async def put_later(self, delay: float, hold: float = 0.0) -> None:
        """A task of the object's own puts ``bg`` after ``delay``, in a transaction held
        open ``hold`` seconds: a commit made outside calls and alarm runs."""
        put_later(self.ctx, delay, hold)


async def test_objects_are_rows_of_one_database_and_come_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{data}") as rt:
            for i in range(3):
                await rt.get(Note, f"n{i}").put(f"value {i}")
    assert (data / "shared.sqlite3").exists()
    assert not (data / "objects").exists()  # no file per object
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{data}") as rt:
            assert [await rt.get(Note, f"n{i}").get() for i in range(3)] == [
                "value 0", "value 1", "value 2"]
            assert isinstance(rt.engine, SharedEngine)
            assert rt.engine.object_rows(Note.namespace, "n1") == [
                ("nj_kv", "v", '["v", "\\"value 1\\""]')]


async def test_raw_sql_is_refused_naming_the_layout(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}") as rt:
            for call in (rt.get(Note, "n").raw, rt.get(Note, "n").raw_db):
                with pytest.raises(nj.StorageError, match="shared layout"):
                    await call()


@pytest.mark.parametrize("location", ["shared:", "shared://"])
async def test_a_shared_location_without_a_directory_is_refused(
    tmp_path: Path, location: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(nj.EngineError, match="names no directory"):
        async with nj.open_runtime(location):
            pass  # pragma: no cover
    assert list(await trio.Path(tmp_path).iterdir()) == []  # nothing written


@pytest.mark.parametrize(("first", "then", "holds"), [
    ("shared:{}", "{}", "shared"), ("{}", "shared:{}", "files"),
])
async def test_a_directory_is_opened_with_the_layout_it_was_created_with(
    tmp_path: Path, first: str, then: str, holds: str,
) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with nj.open_runtime(first.format(data)) as rt:
            await rt.get(Note, "n").put("kept")
        before = sorted(p.name for p in await trio.Path(data).iterdir())
        with pytest.raises(DataLayoutError, match="nothing was written") as caught:
            async with nj.open_runtime(then.format(data)):
                pass  # pragma: no cover
        assert (caught.value.path, caught.value.layout) == (str(data), holds)
        assert isinstance(caught.value, nj.EngineError)
        assert sorted(p.name for p in await trio.Path(data).iterdir()) == before
        async with nj.open_runtime(first.format(data)) as rt:
            assert await rt.get(Note, "n").get() == "kept"


async def test_a_ship_writes_the_rows_and_the_alarm_in_one_transaction(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{data}") as rt:
            at = nj.now() + 3600
            await rt.get(Note, "n").later(at)
            # What another reader of the shared database sees once the call returned.
            reader = sqlite3.connect(f"file:{data / 'shared.sqlite3'}?mode=ro", uri=True)
            try:
                alarm = reader.execute("SELECT time FROM nj_alarms WHERE object_id = 'n'"
                                       ).fetchall()
                jobs = reader.execute("SELECT key FROM nj_rows WHERE object_id = 'n' AND"
                                      " tbl = 'nj_jobs'").fetchall()
            finally:
                reader.close()
    assert alarm == [(at,)]
    assert jobs == [("j",)]


async def test_a_copy_still_referenced_never_reaches_another_object(tmp_path: Path) -> None:
    """A working copy is reused once its object left memory — but only once nothing else
    refers to it: a storage handle kept past the object's life must never see, or
    write, the next object's rows."""
    STALE.clear()
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}", max_active=1) as rt:
            engine = rt.engine
            assert isinstance(engine, SharedEngine)
            await rt.get(Note, "a").put("a's")
            await rt.get(Note, "a").keep_handle()
            await rt.get(Note, "b").put("b's")  # a is evicted (max_active=1)
            assert not rt.is_active(Note.namespace, "a")
            stale, handle = STALE.pop(), STALE.pop()
            gc.collect()  # (a's host and storage were a cycle: only ``stale`` is left)
            await trio.testing.wait_all_tasks_blocked()  # (b's eviction of a is over)
            await rt.get(Note, "c").put("c's")  # b leaves; a's copy is still referred to
            assert rt.active_database(Note.namespace, "c") is not stale
            # The public handle asks for a's turn as each statement runs: a is gone, so
            # it refuses (and writes nothing anywhere).
            with pytest.raises(nj.StorageError, match="Note/a has left memory"):
                handle.execute("INSERT INTO nj_kv (key, value) VALUES ('x', '1')")
            stale.execute("INSERT INTO nj_kv (key, value) VALUES ('x', '1')")
            assert await rt.get(Note, "c").keys() == ["v"]
            await trio.testing.wait_all_tasks_blocked()
            del stale, handle
            gc.collect()
            built = engine._pool.built
            await rt.get(Note, "d").put("d's")  # takes a copy that nothing refers to
            assert engine._pool.built == built  # (a's, at least, is free now)
            assert await rt.get(Note, "d").keys() == ["v"]  # wiped: nothing of a, b or x
            assert await rt.get(Note, "a").get() == "a's"


async def test_an_evicted_objects_copy_is_reused_without_the_cycle_collector(
    tmp_path: Path,
) -> None:
    """An object's parts (its host, instance, Lifecycle, job store and table, storage,
    transactions) refer to one another; once it leaves memory they let go of its
    working copy at once, so the next activation takes it from the pool without
    waiting for a garbage collection (issue 26: half of the copies after eviction were
    built anew, ~0.6 ms each). A part used after that raises, and reaches no copy."""
    gc.collect()
    gc.disable()
    try:
        with trio.fail_after(30):
            async with nj.open_runtime(f"shared:{tmp_path / 'data'}", max_active=1) as rt:
                engine = rt.engine
                assert isinstance(engine, SharedEngine)
                await rt.get(Note, "a").later(1e12)  # a job store, a table, an alarm
                a = rt.active_instance(Note.namespace, "a")
                assert a is not None
                left_behind = a.ctx.storage  # (kept, as a careless caller might)
                # Each evicts the one before (max_active=1), whose copy is back in the
                # pool once its eviction is over: a copy is built only while the one
                # evicted at the same time is still on its way out (at most two in all).
                for name in "bcdef":
                    await rt.get(Note, name).put(f"{name}'s")
                    await trio.testing.wait_all_tasks_blocked()
                assert not rt.is_active(Note.namespace, "a")
                assert engine._pool.built <= 2
                assert engine._pool.reused >= 4
                assert await rt.get(Note, "f").keys() == ["v"]
                with pytest.raises(sqlite3.ProgrammingError):
                    left_behind._conn.execute("SELECT 1")
    finally:
        gc.enable()


async def test_an_alarm_an_active_object_moved_is_seen_before_it_ships(
    tmp_path: Path,
) -> None:
    """The timer reads the shared database's alarm index, and what active objects
    wrote and did not ship yet (it ships with their rows): a lowered alarm is due at
    once, a deleted one is not."""
    engine = SharedEngine(tmp_path / "data", synchronous="NORMAL")
    engine.open(0.0)
    try:
        engine.catalog.set_alarm("ns", "stored", 50.0, 0)
        state = await engine.open_object("ns", "stored", "m:C")
        other = await engine.open_object("ns", "moved", "m:C")
        assert engine.due(100.0, 10) == [("ns", "stored")]
        other.write_alarm(10.0, 0)
        state.write_alarm(None, 0)
        assert engine.due(100.0, 10) == [("ns", "moved")]
        assert engine.get_alarm("ns", "stored") is None
        assert engine.get_alarm("ns", "moved") == (10.0, 0)
        assert engine.next_alarm_after(5.0) == 10.0
        assert engine.catalog.get_alarm("ns", "stored") == (50.0, 0)  # not shipped yet
        await state.sync()
        await other.sync()
        assert engine.catalog.get_alarm("ns", "stored") is None
        assert engine.catalog.get_alarm("ns", "moved") == (10.0, 0)
        assert engine._unshipped == {}
    finally:
        engine.close()


async def test_an_idle_runtime_does_not_look_for_commits_to_ship(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """The ship loop sleeps until a working copy captures a write (or an alarm or a
    crash token changes): it once looked every 50 ms for as long as objects were
    resident, 72,000 passes a virtual hour (a cron test across two days took minutes)."""
    with trio.fail_after(3 * 3600):  # (virtual seconds)
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}", idle_timeout=86400.0
                                   ) as rt:
            engine = rt.engine
            assert isinstance(engine, SharedEngine)
            note = rt.get(Note, "n")
            await note.put("v")
            await note.later(nj.now() + 7200)  # a job an hour after the hour below
            await trio.sleep(1)
            before = engine.statistics()
            await trio.sleep(3600)
            after = engine.statistics()
            assert rt.is_active(Note.namespace, "n")
            assert after.ship_passes == before.ship_passes
            assert after.ships == before.ships


async def test_a_commit_outside_calls_ships_within_the_interval(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """A task the object started commits outside any call: its rows ship within
    ``SHIP_INTERVAL`` of the commit, also when its transaction was open across a pass
    of the ship loop (that pass could ship nothing of it)."""
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}") as rt:
            engine = rt.engine
            assert isinstance(engine, SharedEngine)
            for hold, oid in ((0.0, "quick"), (1.0, "held")):
                start = trio.current_time()
                await rt.get(Note, oid).put_later(10.0, hold)
                await trio.sleep_until(start + 10.0 + hold - 0.001)
                assert engine.object_rows(Note.namespace, oid) == []  # not committed
                await trio.sleep_until(start + 10.0 + hold + SHIP_INTERVAL + 0.001)
                assert engine.object_rows(Note.namespace, oid) == [
                    ("nj_kv", "bg", '["bg", "\\"put\\""]')]


async def test_the_dashboard_serves_the_shared_layout(tmp_path: Path) -> None:
    # It refused (EngineError): its pages read object files the layout does not have,
    # and would have counted objects out of memory as zero. They read the shared
    # database now (tests/test_operator_faces_shared.py).
    async with nj.open_runtime(f"shared:{tmp_path / 'data'}", http=("127.0.0.1", 0)) as rt:
        assert rt.http_url is not None and rt.http_url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("command", [
    ("inspect",), ("inspect", "--json"), ("requeue", "ns", "obj", "job"),
    ("pause", "ns", "obj"), ("resume", "ns", "obj"), ("serve", "--port", "0"),
])
def test_the_cli_on_a_shared_location_that_holds_nothing_says_so_in_one_line(
    tmp_path: Path, command: tuple[str, ...], capsys: pytest.CaptureFixture[str],
) -> None:
    from nursery_jobs import cli

    code = cli.main([command[0], f"shared:{tmp_path}", *command[1:]])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "no shared.sqlite3" in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("location", ["shared:", "shared://", "SHARED:"])
def test_the_cli_on_a_shared_location_that_names_no_directory_reads_nothing(
    tmp_path: Path, location: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Not the current directory: ``shared:`` names none."""
    from nursery_jobs import cli

    monkeypatch.chdir(tmp_path)
    for args in (["inspect", location], ["pause", location, "ns", "obj"]):
        code = cli.main(args)
        out, err = capsys.readouterr()
        assert (code, out) == (2, "")
        assert err.count("\n") == 1 and "names no directory" in err, err
    assert list(tmp_path.iterdir()) == []


async def test_by_default_idle_objects_past_the_pool_leave_and_hand_their_copies_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``max_active=None`` the shared layout keeps as many idle objects resident as
    its pool holds copies (not the 2,048 open databases of a data directory): past
    that, each new object evicts the least recently used idle one and takes its working
    copy, rather than building one (~650 us of statement compiles on first use, issue
    26). A files runtime keeps its own default."""
    monkeypatch.setattr(SharedEngine, "default_max_active", 4)
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}") as rt:
            engine = rt.engine
            assert isinstance(engine, SharedEngine)
            assert rt.max_active == 4
            for i in range(10):
                await rt.get(Note, f"n{i}").put(f"{i}'s")
            assert len(rt.active_objects()) <= 5  # (one may still be on its way out)
            assert engine._pool.built <= 5
            assert engine._pool.reused >= 5
            assert await rt.get(Note, "n0").get() == "0's"  # evicted, and back
    async with nj.open_runtime(tmp_path / "files") as rt:
        assert rt.max_active > 4


async def test_the_ship_loop_looks_only_at_objects_that_noted_something(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """The ship loop looks at the objects whose copies captured a write (or that wrote
    an alarm), not at every resident one (issue 26: with 2,048 resident, 3,000 creates
    made 175,000 looks). Loading an object's rows into a pooled copy, and wiping the
    copy first, ship nothing and wake nothing."""
    with trio.fail_after(600):  # (virtual seconds)
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}", max_active=1,
                                   idle_timeout=86400.0) as rt:
            engine = rt.engine
            assert isinstance(engine, SharedEngine)
            await rt.get(Note, "a").put("a's")
            await rt.get(Note, "b").put("b's")
            await trio.sleep(1)
            before = engine.statistics()
            for name in "abab":  # each activation wipes the other's copy, loads its rows
                assert await rt.get(Note, name).get() == f"{name}'s"
            await trio.sleep(1)
            after = engine.statistics()
            assert after.copies_reused > before.copies_reused
            assert (after.ship_passes, after.ships) == (before.ship_passes, before.ships)
            rt.max_active = 8
            for name in "cde":
                await rt.get(Note, name).put(f"{name}'s")
            await trio.sleep(1)
            assert len(rt.active_objects()) >= 4
            looked: list[object] = []
            changed = SharedObject.changed
            SharedObject.changed = property(  # type: ignore[method-assign]
                lambda self: looked.append(self) or changed.fget(self))
            try:
                await rt.get(Note, "b").put_later(1.0)  # a commit outside calls
                await trio.sleep(1.0 + 2 * SHIP_INTERVAL)
            finally:
                SharedObject.changed = changed  # type: ignore[method-assign]
            assert engine.object_rows(Note.namespace, "b")[0][:2] == ("nj_kv", "bg")
            assert {getattr(s, "label", None) for s in looked} <= {f"{Note.namespace}/b"}


async def test_a_sync_with_nothing_new_still_waits_for_a_ship_in_flight() -> None:
    """``sync`` returns at once when nothing was written since the last ship (no lock:
    ~13 -> ~4.5 us, issue 26), but not while a ship is in flight: the caller's commit
    may be in it, and must be durable when its sync returns."""
    shipped = trio.Event()
    release = trio.Event()

    async def ship(change: Any) -> str:
        await release.wait()
        shipped.set()
        return "shipped"

    with _lone_object(ship) as (conn, state):
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('k', '1')")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(state.sync)  # takes the write, ships it (held)
            await trio.testing.wait_all_tasks_blocked()
            assert not state.changed  # taken: nothing new to ship
            with trio.move_on_after(0.05):
                await state.sync()
                raise AssertionError("returned before the ship in flight finished")
            release.set()
            await state.sync()
            assert shipped.is_set()
        await state.sync()  # nothing written, nothing in flight: at once


async def test_a_new_object_is_registered_by_its_first_ship(tmp_path: Path) -> None:
    """A new object reads nothing more of the shared database (it holds nothing of an
    unregistered object) and is registered by its first ship, in that transaction: a
    create commits once (issue 26). One that never writes leaves nothing behind; one
    that writes is there, with its rows, for the next runtime."""
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}") as rt:
            engine = rt.engine
            assert isinstance(engine, SharedEngine)
            assert engine._conn is not None
            writes = engine._conn.total_changes
            assert await rt.get(Note, "reader").get() is None
            assert engine._conn.total_changes == writes  # nothing written for it
            await rt.get(Note, "writer").put("w's")
            registered = engine._conn.execute(
                "SELECT namespace, object_id FROM nj_objects ORDER BY object_id").fetchall()
            assert registered == [(Note.namespace, "writer")]
            assert engine.statistics().ships == 1
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}") as rt:
            assert await rt.get(Note, "writer").get() == "w's"
            assert await rt.get(Note, "reader").get() is None


async def test_a_sync_cancelled_while_it_waits_for_a_ship_in_flight_keeps_its_change() -> None:
    """A sync takes what is committed, then waits for the ship in flight; cancelled in
    that wait, what it took ships with the next sync (it was dropped: the copy forgot
    those keys, and nothing shipped them until they changed again)."""
    release = trio.Event()
    shipped: list[list[str]] = []

    async def ship(change: Any) -> str:
        await release.wait()
        shipped.append(sorted(key for _tbl, key, _data in change.upserts))
        return "shipped"

    with _lone_object(ship) as (conn, state):
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('first', '1')")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(state.sync)
            await trio.testing.wait_all_tasks_blocked()
            conn.execute("INSERT INTO nj_kv (key, value) VALUES ('second', '2')")
            with trio.move_on_after(0.05):
                await state.sync()  # takes 'second', waits for the lock, is cancelled
            release.set()
        await state.sync()
        assert shipped == [["first"], ["second"]]


async def test_a_create_ships_once_and_syncs_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call whose method shipped already (a push makes itself durable) has nothing
    left for its output gate, nor has its object when it leaves memory: neither syncs
    the copy again (each was a pass of the scheduler, issue 26)."""
    syncs: list[str] = []
    real_sync = SharedObject.sync

    async def sync(self: SharedObject) -> None:
        syncs.append(self.label)
        await real_sync(self)

    monkeypatch.setattr(SharedObject, "sync", sync)
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}", max_active=1) as rt:
            await rt.get(Note, "a").later(1e12)  # the push ships
            assert syncs == [f"{Note.namespace}/a"]
            await rt.get(Note, "b").get()  # a leaves memory, with nothing to ship
            assert not rt.is_active(Note.namespace, "a")
            assert syncs == [f"{Note.namespace}/a"]
            await rt.get(Note, "b").put("b's")  # a write the output gate ships
            assert syncs == [f"{Note.namespace}/a", f"{Note.namespace}/b"]
            assert await rt.get(Note, "a").get() is None


async def test_objects_on_their_way_out_are_counted_not_looked_for(tmp_path: Path) -> None:
    """``max_active`` counts the objects already leaving memory as gone; the runtime
    keeps their number rather than walking past them at every activation (a cold fire
    of 3,000 had ~57 in front of the first one it could evict, issue 26). The count
    stays what the hosts' phases say, and residency stays bounded."""
    from nursery_jobs._core._host import DEPARTING

    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}", max_active=5) as rt:
            for i in range(40):
                await rt.get(Note, f"n{i}").put("v")
                hosts = list(rt._hosts.values())
                assert rt._departing == sum(h.phase in DEPARTING for h in hosts)
                assert len(hosts) - rt._departing <= 5
            await trio.testing.wait_all_tasks_blocked()
            assert rt._departing == 0
            assert len(rt.active_objects()) == 5
            assert await rt.get(Note, "n0").get() == "v"


async def test_an_unregistered_object_starts_with_no_crash_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Crash tokens left for an id the registry does not hold (a run whose jobs never
    shipped, so were never durable; or an object destroyed since) are not its new
    activation's: it reads none (one read fewer a create), and a destroy clears them."""
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'data'}") as rt:
            engine = rt.engine
            assert isinstance(engine, SharedEngine)
            assert engine._conn is not None
            engine._conn.execute(
                "INSERT INTO nj_crashes (namespace, object_id, token, started)"
                " VALUES (?, 'new', 'tok', 1.0)", (Note.namespace,))
            read: list[str] = []
            crashes = Catalog.crashes

            def counted(self: Catalog, namespace: str, object_id: str) -> Any:
                read.append(object_id)
                return crashes(self, namespace, object_id)

            monkeypatch.setattr(Catalog, "crashes", counted)
            await rt.get(Note, "new").put("v")
            assert read == []
            engine.destroy_object(Note.namespace, "new")
            assert engine._conn.execute(
                "SELECT COUNT(*) FROM nj_crashes WHERE object_id = 'new'").fetchone() == (0,)


async def test_only_objects_stored_with_crash_tokens_read_them_on_activation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Crash tokens are only added as the engine opens (from the dead process's flight
    record): an activation reads them only for the objects that held some then, and
    those get them."""
    location = f"shared:{tmp_path / 'data'}"
    with trio.fail_after(30):
        async with nj.open_runtime(location) as rt:
            for object_id in ("crashed", "clean"):
                await rt.get(Note, object_id).put("v")
        conn = sqlite3.connect(tmp_path / "data" / "shared.sqlite3")
        with conn:
            conn.execute("INSERT INTO nj_crashes (namespace, object_id, token, started)"
                         " VALUES (?, 'crashed', 'tok', 1.0)", (Note.namespace,))
        conn.close()
        read: list[tuple[str, list[Any]]] = []
        crashes = Catalog.crashes

        def counted(self: Catalog, namespace: str, object_id: str) -> Any:
            tokens = crashes(self, namespace, object_id)
            read.append((object_id, tokens))
            return tokens

        monkeypatch.setattr(Catalog, "crashes", counted)
        async with nj.open_runtime(location) as rt:
            assert await rt.get(Note, "clean").get() == "v"
            assert read == []
            assert await rt.get(Note, "crashed").get() == "v"
            assert read == [("crashed", [("tok", 1.0)])]


@contextmanager
def _lone_object(
    ship: Callable[[Any], Awaitable[str]],
) -> Iterator[tuple[sqlite3.Connection, SharedObject]]:
    """A shared object outside any engine, on a pooled copy, shipping with ``ship``."""
    pool = CopyPool(lambda state: None)
    conn = pool.take("t/o", [])
    state = SharedObject(("t", "o"), conn, None, [], ship=ship, on_close=lambda s: None,
                         on_alarm=lambda *a: None, give_back=pool.give_back,
                         note=lambda s: None)
    try:
        yield conn, state
    finally:
        state.close()
        pool.close()
