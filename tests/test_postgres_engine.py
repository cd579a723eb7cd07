"""The PostgreSQL engine on its own (DESIGN.md §9): schema and version refusal, the
working copy and its shipping, leases and the epoch fence, crash tokens on takeover."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from pg_support import eventually, opened, sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._core._location import engine_for
from nursery_jobs._engines._schema import SCHEMA_VERSION as OBJECT_SCHEMA_VERSION
from nursery_jobs._engines.postgres import _ops as pg_ops
from nursery_jobs._engines.postgres._engine import PostgresEngine
from nursery_jobs._engines.postgres._schema import PG_SCHEMA_VERSION, key_digest
from nursery_jobs._errors import EngineError, ObjectFencedError, ObjectLeasedElsewhere, StorageError
from nursery_jobs._events import EventBus

NOW = 1_800_000_000.0
NS = "tests.Thing"
CP = "tests.test_postgres_engine:Thing"


def expire_leases(dsn: str) -> None:
    sql(dsn, "UPDATE nj_objects SET lease_until = now() - interval '1 second'")


class Site:
    """An EngineSite that records what the engine asks."""

    def __init__(self) -> None:
        self.events = EventBus()
        self.fenced_keys: list[tuple[str, str]] = []
        self.woken = 0

    def earliest_alarm(self) -> float:
        return float("inf")

    def wake_timer(self) -> None:
        self.woken += 1

    async def run_call(self, *args: Any) -> Any:
        raise AssertionError("no calls here")

    def fenced(self, namespace: str, object_id: str, reason: str | None = None) -> None:
        self.fenced_keys.append((namespace, object_id))

    def serves(self, namespace: str, class_path: str | None) -> bool:
        return True  # (every namespace: the engine's claims are what these tests see)


@asynccontextmanager
async def serving(engine: PostgresEngine, site: Any) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.serve, site)
        yield
        nursery.cancel_scope.cancel()


def test_addresses_route_to_the_postgres_engine(pg_dsn: str) -> None:
    engine = engine_for(pg_dsn, synchronous="NORMAL")
    assert isinstance(engine, PostgresEngine)
    assert isinstance(engine_for(pg_dsn.replace("postgresql://", "postgres://"),
                                 synchronous="FULL"), PostgresEngine)


def test_without_psycopg_the_address_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "nursery_jobs._engines.postgres._engine", raising=False)
    with pytest.raises(EngineError, match=r"pip install 'nursery_jobs\[postgres\]'"):
        engine_for("postgresql://u@h/db", synchronous="NORMAL")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="lease_ttl"):
        PostgresEngine("postgresql://x/y", lease_ttl=0)
    with pytest.raises(ValueError, match="pool_size"):
        PostgresEngine("postgresql://x/y", pool_size=1)


def test_open_runtime_passes_cluster_options_to_the_engine_only() -> None:
    engine = engine_for("postgresql://x/y", synchronous="NORMAL", lease_ttl=2.5, pool_size=3)
    assert isinstance(engine, PostgresEngine)
    assert (engine.lease_ttl, engine.pool_size) == (2.5, 3)
    with pytest.raises(ValueError, match="lease_ttl"):
        engine_for("postgresql://x/y", synchronous="NORMAL", lease_ttl=-1)
    for location in (None, "./data", "notpostgresql://x"):
        with pytest.raises(ValueError, match="apply to a postgresql:// address only"):
            engine_for(location, synchronous="NORMAL", lease_ttl=2.0)


async def test_open_runtime_refuses_cluster_options_without_a_cluster(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="pool_size apply to a postgresql"):
        async with nj.open_runtime(tmp_path / "data", pool_size=4):
            pass
    assert not (tmp_path / "data").exists()


def test_an_unreachable_server_is_a_storage_error_without_the_password() -> None:
    engine = PostgresEngine("postgresql://u:secret@127.0.0.1:1/nope?connect_timeout=1")
    with pytest.raises(StorageError, match=r"postgresql://u@127\.0\.0\.1:1/nope") as info:
        engine.open(NOW)
    assert "secret" not in str(info.value)


def test_schema_is_created_and_a_newer_one_refused(pg_dsn: str) -> None:
    current = [(PG_SCHEMA_VERSION, OBJECT_SCHEMA_VERSION)]
    with opened(pg_dsn):
        pass
    assert sql(pg_dsn, "SELECT version, object_schema FROM nj_schema") == current
    with opened(pg_dsn):  # an existing schema of this version is fine
        pass
    sql(pg_dsn, "UPDATE nj_schema SET object_schema = 2")  # older objects: brought up
    with opened(pg_dsn):
        pass
    assert sql(pg_dsn, "SELECT version, object_schema FROM nj_schema") == current
    # A version 2 database (no nj_calls.take_id) is brought up in place.
    sql(pg_dsn, "ALTER TABLE nj_calls DROP COLUMN take_id")
    sql(pg_dsn, "UPDATE nj_schema SET version = 2")
    with opened(pg_dsn):
        pass
    assert sql(pg_dsn, "SELECT version, object_schema FROM nj_schema") == current
    assert sql(pg_dsn, "SELECT count(*) FROM information_schema.columns"
                       " WHERE table_name = 'nj_calls' AND column_name = 'take_id'") == [(1,)]
    sql(pg_dsn, "UPDATE nj_schema SET version = 99")
    with pytest.raises(StorageError, match=r"schema version 99 \(objects 4\), newer than"):
        PostgresEngine(pg_dsn).open(NOW)
    assert sql(pg_dsn, "SELECT version FROM nj_schema") == [(99,)]
    assert sql(pg_dsn, "SELECT count(*) FROM nj_hosts") == [(0,)]


# -- version 4: objects and rows keyed by digests ------------------------------------------------
# A database that nursery_jobs of schema version 3 made and wrote (tests/data/pg_v3/: its
# schema, and the rows of two Keepers and a Plain object, dumped by make.py there).
V3 = Path(__file__).with_name("data") / "pg_v3"
V3_COLUMNS = {
    "nj_namespaces": "namespace, class_path",
    "nj_objects": "namespace, object_id, class_path, created_at, alarm_time, alarm_retry,"
                  " epoch, version",
    "nj_rows": "namespace, object_id, tbl, key, data",
}
# 1,024 distinct CJK characters: 3,072 bytes of UTF-8, past a btree entry's 2,704.
LONG_ID = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1024))


class Keeper(nj.DurableObject):
    namespace = "tests.pg_v3.Keeper"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def add(self, by: int) -> int:
        n = int(self.ctx.storage.get("n", 0)) + by
        self.ctx.storage.put("n", n)
        return n

    async def read(self, key: str) -> Any:
        return self.ctx.storage.get(key)

    async def letters(self) -> list[str]:
        return [letter.job.id for letter in self.lifecycle.dead_letters()]

    async def push(self, fn: str, id: str, delay: float) -> None:
        await self.lifecycle.jobs.push(fn, id=id, delay=delay)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ctx.storage.put("ran", ctx.job.id)


class Plain(nj.DurableObject):
    namespace = "tests.pg_v3.Plain"

    async def read(self, key: str) -> Any:
        return self.ctx.storage.get(key)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.ctx.storage.put("alarmed", nj.now())


def load_version_3(dsn: str) -> None:
    rows = json.loads((V3 / "rows.json").read_text())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute((V3 / "schema.sql").read_text())
        for table, records in rows.items():
            columns = V3_COLUMNS[table]
            marks = ", ".join(["%s"] * len(columns.split(",")))
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", records)


def primary_keys(dsn: str) -> dict[str, list[str]]:
    return dict(sql(dsn, "SELECT c.conrelid::regclass::text, array_agg(a.attname::text"
                         " ORDER BY k.n) FROM pg_constraint c"
                         " CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)"
                         " JOIN pg_attribute a ON a.attrelid = c.conrelid"
                         " AND a.attnum = k.attnum WHERE c.contype = 'p'"
                         " AND c.conrelid::regclass::text IN ('nj_objects', 'nj_rows',"
                         " 'nj_crashes') GROUP BY 1"))


async def test_a_version_3_database_is_keyed_by_digests_in_place_and_keeps_its_objects(
    pg_dsn: str, autojump_clock: trio.testing.MockClock,
) -> None:
    load_version_3(pg_dsn)
    sql(pg_dsn, "INSERT INTO nj_crashes VALUES ('tests.pg_v3.Keeper', 'gone', 't', 1.0)")
    assert sql(pg_dsn, "SELECT version FROM nj_schema") == [(3,)]
    assert primary_keys(pg_dsn)["nj_rows"] == ["namespace", "object_id", "tbl", "key"]
    with trio.fail_after(100_000):
        async with nj.open_runtime(pg_dsn, stop_on=()) as rt:
            assert sql(pg_dsn, "SELECT version, object_schema FROM nj_schema") == [
                (PG_SCHEMA_VERSION, OBJECT_SCHEMA_VERSION)]
            # Every object kept its state, its jobs, its dead letters and its alarm.
            keeper = rt.get(Keeper, "k-1")
            assert await keeper.add(1) == 42
            assert await keeper.letters() == ["bad"]
            assert await rt.get(Keeper, "ключ ✓").add(1) == 8
            await trio.sleep(1001)  # (EPOCH + 1000: the Keeper's job; + 500: the alarm)
            assert await keeper.read("ran") == "later"
            assert await rt.get(Plain, "p").read("alarmed") == 1_800_000_500.0
            # What version 3 refused: an id of 1,024 characters and 3,072 bytes, and a
            # job id alike.
            long = rt.get(Keeper, LONG_ID)
            assert await long.add(1) == 1
            await long.push("long", LONG_ID, 0)
            await trio.sleep(1)
            assert await long.read("ran") == LONG_ID
    assert primary_keys(pg_dsn) == {"nj_objects": ["okey"], "nj_rows": ["okey", "rkey"],
                                    "nj_crashes": ["okey", "token"]}
    # Each key is the digest of its texts (the server's nj_key, and key_digest here).
    assert sql(pg_dsn, "SELECT count(*) FROM nj_rows WHERE okey <> nj_key(namespace,"
                       " object_id) OR rkey <> nj_key(tbl, key)") == [(0,)]
    assert [bytes(k) for (k,) in sql(pg_dsn, "SELECT okey FROM nj_crashes")] == [
        key_digest("tests.pg_v3.Keeper", "gone")]
    with opened(pg_dsn):  # opened again: nothing more to do
        pass
    assert sql(pg_dsn, "SELECT version FROM nj_schema") == [(PG_SCHEMA_VERSION,)]


def test_the_operator_faces_refuse_a_version_3_database_they_cannot_read(
    pg_dsn: str, capsys: pytest.CaptureFixture[str],
) -> None:
    from nursery_jobs import cli

    load_version_3(pg_dsn)
    assert cli.main(["inspect", pg_dsn]) == 2
    assert "schema version 3, older than this nursery_jobs reads" in capsys.readouterr().err
    assert sql(pg_dsn, "SELECT version FROM nj_schema") == [(3,)]  # untouched


async def test_the_working_copy_ships_commits_and_reloads(pg_dsn: str) -> None:
    with opened(pg_dsn) as a:
        state = await a.open_object(NS, "o1", CP)
        assert state.ships and state.alarm is None
        conn = state.conn
        conn.execute("INSERT INTO nj_kv VALUES ('a', '1'), ('b', '2'), ('gone', '3')")
        conn.execute("DELETE FROM nj_kv WHERE key = 'gone'")
        conn.execute(
            "INSERT INTO nj_jobs (id, owner, fn, time, payload, max_attempts, base_delay,"
            " max_delay, jitter, singleflight, hung_timeout, exclusive, recovery_loop,"
            " created_at) VALUES ('j1', 'host', 'f', 5.5, '[1]', 3, 1, 60, 1, 0, 30, 0, 0, 1)"
        )
        conn.execute(
            "INSERT INTO nj_dead_letters (owner, id, job, error, attempts, reason, time, seq)"
            " VALUES ('host', 'd1', '{}', 'err', 3, 'failed', 2, 1)"
        )
        conn.execute("INSERT INTO nj_meta VALUES ('memory_limit_strikes', 2)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO nj_kv VALUES ('rolled', 'back')")
        conn.execute("ROLLBACK")
        state.write_alarm(NOW + 5, 1)
        await state.sync()
        assert sql(pg_dsn, "SELECT alarm_time, alarm_retry FROM nj_objects") == [(NOW + 5, 1)]
        conn.execute("UPDATE nj_kv SET value = '9' WHERE key = 'b'")
        await state.sync()
        state.close()
    with opened(pg_dsn) as b:
        state = await b.open_object(NS, "o1", CP)
        conn = state.conn
        assert conn.execute("SELECT * FROM nj_kv ORDER BY key").fetchall() == [
            ("a", "1"), ("b", "9")]
        assert conn.execute("SELECT seq, id, time, payload, jitter FROM nj_jobs").fetchall() == [
            (1, "j1", 5.5, "[1]", 1)]
        assert conn.execute("SELECT owner, id, attempts, seq FROM nj_dead_letters").fetchall(
            ) == [("host", "d1", 3, 1)]
        assert conn.execute("SELECT * FROM nj_meta").fetchall() == [("memory_limit_strikes", 2)]
        assert state.alarm == (NOW + 5, 1)
        conn.execute("DELETE FROM nj_dead_letters")
        await state.sync()
        assert sql(pg_dsn, "SELECT count(*) FROM nj_rows WHERE tbl = 'nj_dead_letters'") == [(0,)]
        state.close()


async def test_a_live_lease_sends_the_caller_elsewhere(pg_dsn: str) -> None:
    with opened(pg_dsn) as a, opened(pg_dsn) as b:
        await a.open_object(NS, "o1", CP)
        with pytest.raises(ObjectLeasedElsewhere) as info:
            await b.open_object(NS, "o1", CP)
        assert info.value.owner == a.host_id


async def test_a_taken_over_object_refuses_the_old_hosts_writes(pg_dsn: str) -> None:
    with opened(pg_dsn, lease_ttl=30) as a, opened(pg_dsn) as b:
        old = await a.open_object(NS, "o1", CP)
        old.conn.execute("INSERT INTO nj_kv VALUES ('k', 'a1')")
        await old.sync()
        expire_leases(pg_dsn)  # a is paused past its lease
        new = await b.open_object(NS, "o1", CP)
        assert new.epoch == old.epoch + 1
        old.conn.execute("UPDATE nj_kv SET value = 'zombie' WHERE key = 'k'")
        old.conn.execute("INSERT INTO nj_kv VALUES ('z', 'zombie')")
        old.write_alarm(NOW + 1, 0)
        with pytest.raises(ObjectFencedError, match="another host took the object over"):
            await old.sync()
        assert sql(pg_dsn, "SELECT key, data FROM nj_rows ORDER BY key") == [
            ("k", '["k", "a1"]')]
        assert sql(pg_dsn, "SELECT alarm_time, owner FROM nj_objects") == [(None, b.host_id)]
        new.conn.execute("UPDATE nj_kv SET value = 'b1' WHERE key = 'k'")
        await new.sync()
        assert sql(pg_dsn, "SELECT data FROM nj_rows") == [('["k", "b1"]',)]


async def test_renewal_finds_a_lost_lease_and_fences_the_object(pg_dsn: str) -> None:
    site = Site()
    with opened(pg_dsn, lease_ttl=0.3) as a:
        async with serving(a, site):
            await a.open_object(NS, "o1", CP)
            await trio.sleep(0.5)  # renewed meanwhile: still a's
            assert site.fenced_keys == []
            # Another host takes it over (as after a pause longer than the lease).
            sql(pg_dsn, "UPDATE nj_objects SET owner = 'other', epoch = epoch + 1")
            await eventually(lambda: site.fenced_keys)
            assert site.fenced_keys == [(NS, "o1")]


async def test_eviction_and_shutdown_release_leases(pg_dsn: str) -> None:
    with opened(pg_dsn) as a:
        async with serving(a, Site()):
            state = await a.open_object(NS, "o1", CP)
            await a.open_object(NS, "o2", CP)
            state.close()
            await eventually(lambda: sql(
                pg_dsn, "SELECT owner FROM nj_objects WHERE object_id = 'o1'") == [(None,)])
    assert sql(pg_dsn, "SELECT owner FROM nj_objects WHERE object_id = 'o2'") == [(None,)]
    assert sql(pg_dsn, "SELECT count(*) FROM nj_hosts") == [(0,)]


async def test_due_unleased_objects_are_claimed_once(pg_dsn: str) -> None:
    with opened(pg_dsn) as a:
        for oid in ("o1", "o2", "later"):
            state = await a.open_object(NS, oid, CP)
            state.write_alarm(nj.now() + (1000 if oid == "later" else -1), 0)
            await state.sync()
            state.close()
    site_b, site_c = Site(), Site()
    with opened(pg_dsn) as b, opened(pg_dsn) as c:
        async with serving(b, site_b), serving(c, site_c):
            await eventually(lambda: len(b.due(nj.now(), 10)) + len(c.due(nj.now(), 10)) >= 2)
            await trio.sleep(0.2)
            due = sorted(b.due(nj.now(), 10) + c.due(nj.now(), 10))
            assert due == [(NS, "o1"), (NS, "o2")]
            assert b.next_alarm_after(nj.now()) is None
            assert c.next_alarm_after(nj.now()) is None


async def test_a_copy_opened_under_a_lapsed_lease_is_not_admitted_after_a_new_claim(
    pg_dsn: str,
) -> None:
    """A host paused past its lease resumes: meanwhile another host took the object
    (epoch 2) and died, and this host's claim takes it again (epoch 3) — while its copy
    of epoch 1 is still open, with an alarm run on it. The new lease is trusted, but not
    for that copy: neither a call nor a job starts on it (found by the cluster test
    under load: 152 jobs started by a resumed host on copies of a lost lease)."""
    site = Site()
    with opened(pg_dsn, lease_ttl=1.0) as a:
        async with serving(a, site):
            old = await a.open_object(NS, "o", CP)
            assert old.epoch == 1
            old.admit()  # (the lease it was opened under holds)
            sql(pg_dsn, "UPDATE nj_objects SET owner = 'ghost', epoch = 2,"
                " lease_until = now() - interval '1 second', alarm_time = 0")
            await eventually(lambda: sql(pg_dsn, "SELECT owner, epoch FROM nj_objects")
                             == [(a.host_id, 3)])
            await eventually(lambda: a._leases.held.get((NS, "o")) == 3)
            with pytest.raises(ObjectFencedError):
                old.admit()
            with pytest.raises(ObjectFencedError):
                a.acquire_flight(NS, "o").record("job-1", NOW)


async def test_a_claim_answered_after_a_newer_take_leaves_the_newer_lease(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim loop claims a due object (epoch 2) while an activation on this host
    takes it (epoch 3); the claim's answer comes back last. The engine keeps epoch 3:
    the copy opened under it is admitted (the stale answer made it look lapsed, and
    its jobs did not run: a flaky lifecycle test on PostgreSQL under CI load)."""
    with opened(pg_dsn) as b:
        state = await b.open_object(NS, "o", CP)
        state.write_alarm(nj.now() - 1, 0)
        await state.sync()
        state.close()  # released: epoch 1, due, nobody's
    claimed, answer, answered = threading.Event(), threading.Event(), threading.Event()
    real_claim = pg_ops.claim

    def slow_answer(*args: Any) -> Any:
        result = real_claim(*args)
        if result[0] and not claimed.is_set():  # (the first that claimed something)
            claimed.set()
            answer.wait(10)
            answered.set()
        return result

    monkeypatch.setattr(pg_ops, "claim", slow_answer)
    with opened(pg_dsn) as a:
        async with serving(a, Site()):
            await trio.to_thread.run_sync(claimed.wait, 10)
            assert sql(pg_dsn, "SELECT epoch FROM nj_objects") == [(2,)]
            state = await a.open_object(NS, "o", CP)
            assert state.epoch == 3
            answer.set()
            await trio.to_thread.run_sync(answered.wait, 10)
            await trio.sleep(0.2)  # (the claim loop applies the answer)
            assert a._leases.held.get((NS, "o")) == 3
            state.admit()


async def test_renewals_hold_the_lease_while_the_call_poll_fails(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each renewal also looks for forwarded calls; a failure of that look must not
    throw the renewal away (it did: the lease lapsed here, and the object with it)."""
    async def failing_poll() -> None:
        raise psycopg.OperationalError("the poll failed (test)")

    with opened(pg_dsn, lease_ttl=1.0) as a:
        monkeypatch.setattr(a._calls, "poll", failing_poll)
        async with serving(a, Site()):
            state = await a.open_object(NS, "o", CP)
            await trio.sleep(2.5)  # 2.5 lease_ttl: the lease holds only if renewed
            state.admit()


async def test_a_dead_hosts_running_job_becomes_a_crash_token(pg_dsn: str) -> None:
    with opened(pg_dsn) as a, opened(pg_dsn) as b:
        async with serving(a, Site()):
            await a.open_object(NS, "o1", CP)
            slot = a.acquire_flight(NS, "o1")
            slot.record("job-7", NOW + 0.5)
            await eventually(lambda: sql(
                pg_dsn, "SELECT jsonb_array_length(flight) FROM nj_hosts WHERE host_id = %s",
                (a.host_id,)) == [(1,)])
        a._statements.pool, pool = None, a._statements.pool  # a dies: nothing released
        expire_leases(pg_dsn)
        state = await b.open_object(NS, "o1", CP)
        assert state.crash_tokens() == [("job-7", NOW + 0.5)]
        state.clear_crash_tokens()
        await state.sync()
        assert sql(pg_dsn, "SELECT count(*) FROM nj_crashes") == [(0,)]
        assert pool is not None
        pool.close()


async def test_a_job_row_stored_by_object_schema_2_loads_with_the_new_columns_empty(
    pg_dsn: str,
) -> None:
    with opened(pg_dsn) as a:
        state = await a.open_object(NS, "old-row", CP)
        state.close()
    # The 20 columns object schema 2 stored, as its JSON array.
    row = [7, "j1", "host", "f", 5.5, None, 3, 0.1, 3.0, 1, 0, 30.0, 0, 0, 1.0, 0, None, 0,
           None, 0]
    sql(pg_dsn, "INSERT INTO nj_rows VALUES (%s, %s, 'nj_jobs', 'j1', %s)",
        (NS, "old-row", json.dumps(row)))
    with opened(pg_dsn) as b:
        state = await b.open_object(NS, "old-row", CP)
        assert state.conn.execute(
            "SELECT id, priority, timeout, give_up_on, trace FROM nj_jobs"
        ).fetchall() == [("j1", 0, None, None, None)]
        state.close()
