"""The PostgreSQL engine's background ship loop (commits made outside calls and alarm
runs): asleep while nothing waits to ship, and a commit it must carry reaches
PostgreSQL within ``SHIP_INTERVAL``. It once looked every 50 ms for as long as objects
were resident: under MockClock, a virtual day was ~1.7 million passes."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
import trio.testing
from background_writes import put_later
from pg_support import sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._engines.postgres._engine import PostgresEngine
from nursery_jobs._engines.postgres._ship import SHIP_INTERVAL


class Note(nj.DurableObject):
    namespace = "tests.pg_ship.Note"

    async def put(self, value: str) -> None:
        self.ctx.storage.put("v", value)

    async def put_later(self, delay: float, hold: float = 0.0) -> None:
        """A task of the object's own puts ``bg`` after ``delay``, in a transaction held
        open ``hold`` seconds: a commit made outside calls and alarm runs."""
        put_later(self.ctx, delay, hold)


def stored_keys(dsn: str, object_id: str) -> list[Any]:
    return [key for (key,) in sql(
        dsn, "SELECT key FROM nj_rows WHERE namespace = %s AND object_id = %s"
        " AND tbl = 'nj_kv' ORDER BY key", (Note.namespace, object_id))]


async def test_an_idle_host_does_not_look_for_commits_to_ship(
    autojump_clock: trio.testing.MockClock, pg_dsn: str,
) -> None:
    with trio.fail_after(3600):  # (virtual seconds)
        async with nj.open_runtime(pg_dsn, idle_timeout=86400.0) as rt:
            engine = rt.engine
            assert isinstance(engine, PostgresEngine)
            await rt.get(Note, "n").put("v")
            await trio.sleep(1)
            before = engine.ship_loop_passes()
            await trio.sleep(300)
            assert rt.is_active(Note.namespace, "n")
            assert engine.ship_loop_passes() == before  # it was 6,000 more


async def test_a_commit_outside_calls_ships_within_the_interval(
    autojump_clock: trio.testing.MockClock, pg_dsn: str,
) -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn) as rt:
            for hold, oid in ((0.0, "quick"), (1.0, "held")):
                start = trio.current_time()
                await rt.get(Note, oid).put_later(10.0, hold)
                await trio.sleep_until(start + 10.0 + hold - 0.001)
                assert stored_keys(pg_dsn, oid) == []  # not committed yet
                await trio.sleep_until(start + 10.0 + hold + SHIP_INTERVAL + 0.001)
                # The ship is a round trip in a worker thread, which the virtual clock
                # does not wait for: look until it has landed, blocking the run loop in
                # real time (so no later pass can start meanwhile).
                for _ in range(300):
                    if stored_keys(pg_dsn, oid):
                        break
                    time.sleep(0.01)  # noqa: ASYNC251
                assert stored_keys(pg_dsn, oid) == ["bg"]
