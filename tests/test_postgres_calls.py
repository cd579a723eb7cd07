"""Calls forwarded between hosts on PostgreSQL (DESIGN.md §9 "Calls across hosts"): how
an answer comes back (small ones in the notification, big ones through the call row),
what a missed notification costs (nothing but time: the row is polled), what cancelling
the caller does (the wait ends; the running call runs on, once). Two runtimes in one
process on a fresh database (``pg_dsn``); real time.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest
import trio
from pg_support import eventually, sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._call_codec import encode_call
from nursery_jobs._engines.postgres import _calls as calls
from nursery_jobs._engines.postgres._calls import channel
from nursery_jobs._engines.postgres._engine import PostgresEngine

BIG = 20_000  # characters: over what a notification carries (8,000 bytes)


class Echo(nj.DurableObject):
    namespace = "tests.pg_calls.Echo"
    started: ClassVar[trio.Event | None] = None

    async def host_of(self) -> Any:
        return self.ctx.env

    async def text(self, size: int) -> str:
        return "é" * size

    async def nothing(self) -> None:
        return None

    async def fail(self, size: int) -> None:
        raise KeyError("x" * size)

    async def bump(self) -> int:
        value = int(self.ctx.storage.get("n", 0)) + 1
        self.ctx.storage.put("n", value)
        return value

    async def slow_bump(self, seconds: float) -> int:
        if Echo.started is not None:
            Echo.started.set()
        await trio.sleep(seconds)
        return await self.bump()

    async def read(self) -> int:
        return int(self.ctx.storage.get("n", 0))


async def _rows_gone(dsn: str) -> None:
    await eventually(lambda: sql(dsn, "SELECT count(*) FROM nj_calls")[0][0] == 0)


async def _listening(dsn: str, engine: Any) -> None:
    """Until the listening thread of ``engine`` listens on its call channel (its
    connection's last statement: it has not taken a call yet)."""
    listen = f'LISTEN "{channel(engine.host_id)}"'
    await eventually(lambda: sql(dsn, "SELECT count(*) FROM pg_stat_activity"
                                      " WHERE query = %s", (listen,))[0][0] == 1)


async def test_small_and_big_answers_and_errors_arrive_and_leave_no_row(pg_dsn: str) -> None:
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Echo, "e").host_of() == "A"
        stub = b.get(Echo, "e")
        assert await stub.host_of() == "A"
        assert await stub.text(3) == "ééé"
        assert await stub.text(BIG) == "é" * BIG  # through the row
        assert await stub.nothing() is None
        with pytest.raises(KeyError, match="xxx"):
            await stub.fail(3)
        with pytest.raises(KeyError) as big_error:
            await stub.fail(BIG)
        assert big_error.value.args == ("x" * BIG,)
        # Every answered call row is deleted by its caller (not left to the sweep).
        await _rows_gone(pg_dsn)


async def test_a_missed_answer_notification_is_recovered_from_the_row(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller's listener loses every answer notification (a reconnect): its check of
    the call row finds the answer there, and the call ran once."""
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Echo, "e").bump() == 1
        engine: Any = b.engine
        mine = channel(engine.host_id)
        listener = engine._listener
        notified = listener._notified

        def deaf(chan: str, payload: str) -> None:
            if chan == mine and not payload.startswith("c"):
                return  # an answer to one of B's calls: lost
            notified(chan, payload)

        monkeypatch.setattr(listener, "_notified", deaf)
        with trio.fail_after(10):
            assert await b.get(Echo, "e").bump() == 2
            assert await b.get(Echo, "e").text(3) == "ééé"
            assert await b.get(Echo, "e").text(BIG) == "é" * BIG
        assert await a.get(Echo, "e").read() == 2
        await _rows_gone(pg_dsn)


async def test_a_call_whose_notification_was_missed_is_found_by_polling(pg_dsn: str) -> None:
    """A call row written without a notification (the holder's listener was
    reconnecting) is taken by the holder's poll and run once."""
    async with nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=1.0), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=1.0), env="B") as b:
        assert await a.get(Echo, "e").bump() == 1
        holder: Any = a.engine
        caller: Any = b.engine
        payload = encode_call((), {}, (), "tests.pg_calls.Echo/e.bump()")
        sql(pg_dsn, "INSERT INTO nj_calls (target, caller, namespace, object_id, class_path,"
            " name, payload) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (holder.host_id, caller.host_id, Echo.namespace, "e",
             f"{Echo.__module__}.{Echo.__qualname__}", "bump", payload))
        await eventually(lambda: sql(pg_dsn, "SELECT state, result FROM nj_calls")
                         in ([("ok", "2")], []))

        async def ran() -> bool:
            return await a.get(Echo, "e").read() == 2

        await eventually(ran)
        await trio.sleep(0.5)
        assert await a.get(Echo, "e").read() == 2  # once


@pytest.mark.parametrize("path", ["listener", "poll"])
async def test_a_take_whose_answer_was_lost_still_runs_the_call_once(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch, path: str,
) -> None:
    """The holder's take of a call commits, but its connection drops before the answer
    comes back (it cannot tell whether the take landed): the row is ``running``, and
    only this host may run it. It looks again once reconnected and runs it, once; the
    caller gets its answer (it waited for as long as the holder lived)."""
    import nursery_jobs._engines.postgres._listen as pg_listen

    lost: list[list[int]] = []
    real_take, real_pending = calls.take, calls._pending

    def take_then_lose(conn: Any, me: str, call_ids: list[int], take_id: int) -> Any:
        taken = real_take(conn, me, call_ids, take_id)
        if not lost:
            lost.append(call_ids)
            raise psycopg.OperationalError("the connection was lost (test)")
        return taken

    # (A lease of 3 s, not 1: under load a renewal a second late let B take the object
    # itself, and the call never travelled — the take under test never ran.)
    async with nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=3.0), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=3.0), env="B") as b:
        assert await a.get(Echo, "e").bump() == 1
        if path == "listener":  # the listening thread takes the call it hears of
            monkeypatch.setattr(pg_listen, "take", take_then_lose)
            # No poll takes it first (the one after each renewal found it pending,
            # under load, before the listener heard of it: 1 run in 27 here), and the
            # call is sent once the listener listens (or it is a poll's to take).
            monkeypatch.setattr(calls, "_pending",
                                lambda conn, me: real_pending(conn, me) if lost else [])
            await _listening(pg_dsn, a.engine)
        else:  # a poll takes it (its notification was missed)
            monkeypatch.setattr(calls, "take", take_then_lose)
            monkeypatch.setattr(a.engine._calls, "serving", False)  # (not the listener)
        with trio.fail_after(15):
            assert await b.get(Echo, "e").bump() == 2
        assert lost
        await trio.sleep(0.5)
        assert await a.get(Echo, "e").read() == 2  # once


async def test_a_lost_take_runs_its_call_though_a_poll_saw_the_call_pending(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll reads the pending calls just before the listener's take lands, and that
    take's answer is lost; the poll's answer is read after the failed take was noted.
    The poll took the call for one no take had landed on and forgot the failed take; its
    own take found the call running: nobody ran it, and the caller waited for as long
    as the holder lived (this failed at ``fail_after``)."""
    import nursery_jobs._engines.postgres._listen as pg_listen

    looked, noted = threading.Event(), threading.Event()
    stage: list[str] = []
    real_take, real_pending = pg_listen.take, calls._pending

    async with nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=3.0), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn, lease_ttl=3.0), env="B") as b:
        assert await a.get(Echo, "e").bump() == 1
        holder: Any = a.engine
        router = holder._calls
        trio_token = trio.lowlevel.current_trio_token()

        def take_then_lose(conn: Any, me: str, *args: Any) -> Any:
            if stage:
                return real_take(conn, me, *args)
            stage.append("looking")
            trio_token.run_sync_soon(router.incoming_send.send_nowait, calls.POLL)
            assert looked.wait(10)  # a poll has read the call as pending
            real_take(conn, me, *args)  # lands
            raise psycopg.OperationalError("the connection was lost (test)")

        def pending_then_wait(conn: Any, me: str) -> Any:
            if me == holder.host_id and not stage:
                return []  # (the call is the listener's to take first)
            found = real_pending(conn, me)
            if me == holder.host_id and stage == ["looking"]:
                stage.append("looked")
                looked.set()
                assert noted.wait(10)  # read once the failed take is noted
            return found

        real_failed = router.take_failed

        def noting(*args: Any) -> None:
            real_failed(*args)
            noted.set()

        monkeypatch.setattr(pg_listen, "take", take_then_lose)
        monkeypatch.setattr(calls, "_pending", pending_then_wait)
        monkeypatch.setattr(router, "take_failed", noting)
        await _listening(pg_dsn, holder)
        with trio.fail_after(15):
            assert await b.get(Echo, "e").bump() == 2
        assert stage == ["looking", "looked"]
        await trio.sleep(0.5)
        assert await a.get(Echo, "e").read() == 2  # once


async def test_cancelling_the_caller_leaves_the_running_call_to_finish_once(
    pg_dsn: str,
) -> None:
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Echo, "e").bump() == 1
        Echo.started = trio.Event()
        try:
            with trio.move_on_after(10) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(b.get(Echo, "e").slow_bump, 0.5)
                    await Echo.started.wait()  # running on A
                    nursery.cancel_scope.cancel(reason="the caller gives up")
            assert not scope.cancelled_caught
        finally:
            Echo.started = None

        async def bumped_once() -> bool:
            return await a.get(Echo, "e").read() == 2

        await eventually(bumped_once)
        await trio.sleep(0.2)
        assert await a.get(Echo, "e").read() == 2
        # The next call is served as before.
        assert await b.get(Echo, "e").bump() == 3


@pytest.mark.parametrize(("state", "result"), [
    ("ok", None), ("ok", '"a b  c"'), ("ok", ""), ("error", "QUJD"), ("moved", None),
    ("ok", '"' + "é" * 3_000 + '"'),
])
def test_an_answer_that_fits_travels_in_its_notification(state: str, result: str | None) -> None:
    note = calls.answer_note(42, state, result)
    assert len(note.encode()) < 8_000
    assert calls._read_answer(note) == (42, (state, result))


def test_a_big_answer_is_left_in_the_row() -> None:
    note = calls.answer_note(42, "ok", '"' + "é" * 4_000 + '"')  # 8,002 bytes
    assert note == "r42"
    assert calls._read_answer(note) == (42, None)
    assert calls._read_answer("c42") is None
    assert calls.announced_call("c42") == 42
    assert calls.announced_call("a42 ok -") is None
