"""Reads of an object's tables answered from what an earlier read found (issue 26, the
cold fire): the queue's facts during an alarm run (``JobTable.facts``) and ``nj_meta`` as
a new table's first read found it. Each is checked against the statement it stands for,
over random sequences of writes, rollbacks and pauses: a remembered answer must never
differ from a fresh read. (The catalog's: tests/test_catalog_remembered.py.)"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs._engines._schema import prepare
from nursery_jobs._jobs._alarm_run import _START
from nursery_jobs._jobs._records import checked_job
from nursery_jobs._jobs._table import JobTable
from nursery_jobs._policy import DEFAULT_RETRY

NOWS = (5.0, 15.0, 25.0, 1_000.0)


def _conn() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    prepare(conn, label="test")
    return conn


def _job(rng: random.Random, i: int) -> Any:
    return checked_job(
        f"j{rng.randrange(8)}" if rng.random() < 0.7 else f"n{i}",
        rng.choice(["host", "a", "b"]), "f", float(rng.choice([1, 10, 20, 30, 2000])), None,
        DEFAULT_RETRY, rng.random() < 0.3, 30.0, rng.random() < 0.2, False, 0.0,
        rng.choice([0, 0, 0, 1, -1]))


def _answers(table: JobTable) -> Any:
    return (
        table.next_alarm_time(0.0),
        [table.has_due(now) for now in NOWS],
        [row.job.id for row in table.running()],
        [row.job.id for now in NOWS for row in table.next_due(now, _START, 64)],
    )


def _write(rng: random.Random, table: JobTable, conn: sqlite3.Connection, i: int) -> None:
    ids = [row[0] for row in conn.execute("SELECT id FROM nj_jobs")] or ["none"]
    op = rng.randrange(7)
    if op == 0:
        table.upsert(_job(rng, i), None)
    elif op == 1:
        table.delete(rng.choice(["host", "a", "b"]), rng.choice(ids))
    elif op == 2:
        table.retime(rng.choice(["host", "a", "b"]), rng.choice(ids), float(rng.randrange(40)))
    elif op == 3:
        table.set_marker(rng.choice(ids), float(rng.randrange(40)))
    elif op == 4:
        conn.execute("UPDATE nj_jobs SET running_since = NULL")
    elif op == 5:
        # Not through the table: a statement of its own on the connection.
        conn.execute("UPDATE nj_jobs SET time = time + 7 WHERE id = ?", (rng.choice(ids),))
    else:
        table.finished(rng.randrange(1, i + 2))  # (staged: settled by the next read)


@pytest.mark.parametrize("seed", range(25))
def test_remembered_facts_answer_as_a_fresh_read(seed: int) -> None:
    rng = random.Random(seed)
    conn = _conn()
    remembering, fresh = JobTable(conn), JobTable(conn)
    remembering.remembers = True
    for i in range(80):
        step = rng.randrange(6)
        if step == 0:
            held = frozenset(rng.sample(["host", "a", "b", None], rng.randrange(3)))
            remembering.hold(held)
            fresh.hold(held)
        elif step == 1:
            # Written, then rolled back: what the facts read before it stands again.
            conn.execute("BEGIN")
            _write(rng, remembering, conn, i)
            assert _answers(remembering) == _answers(fresh)
            conn.execute("ROLLBACK")
            remembering.drop_staged()
        elif step == 2:
            conn.execute("BEGIN")
            conn.execute("SAVEPOINT s")
            _write(rng, remembering, conn, i)
            remembering.settle()
            conn.execute("ROLLBACK TO s")
            conn.execute("COMMIT")
        else:
            _write(rng, remembering, conn, i)
        assert _answers(remembering) == _answers(fresh), (seed, i, step)
    remembering.forget_facts()
    assert _answers(remembering) == _answers(fresh)


def test_facts_are_read_once_while_nothing_changes() -> None:
    conn = _conn()
    table = JobTable(conn)
    table.upsert(_job(random.Random(1), 0), None)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    table.remembers = True
    for _ in range(3):
        assert _answers(table) == _answers(table)
    assert sum("EXISTS (SELECT 1 FROM nj_jobs WHERE priority" in s for s in statements) == 1
    assert not any("running_since IS NOT NULL ORDER BY" in s for s in statements)
    table.forget_facts()
    statements.clear()
    table.has_due(10.0)
    table.next_alarm_time(0.0)
    assert len(statements) == 2  # (outside an alarm run: a statement each, as ever)


def _meta_rows(conn: sqlite3.Connection, rows: dict[str, int]) -> None:
    conn.execute("DELETE FROM nj_meta")
    conn.executemany("INSERT INTO nj_meta (key, value) VALUES (?, ?)", list(rows.items()))


@pytest.mark.parametrize("rows", [
    {}, {"alarms_disabled": 1}, {"memory_limit_strikes": 2, "paused:a": 1},
    {"paused": 1, "paused:b": 1, "alarms_disabled": 0, "pausedx": 1},
])
def test_a_new_tables_first_reads_of_nj_meta_are_one_statement(rows: dict[str, int]) -> None:
    conn = _conn()
    _meta_rows(conn, rows)
    expected = (JobTable(conn).meta("alarms_disabled"), JobTable(conn).paused(),
                JobTable(conn).meta("memory_limit_strikes"))
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    table = JobTable(conn)
    got = (table.meta("alarms_disabled"), table.paused(),
           table.first_meta("memory_limit_strikes"))
    assert got == expected
    assert statements == ["SELECT key, value FROM nj_meta"]
    # The first reads are over: every read is a statement again, and sees writes.
    assert table.first_meta("memory_limit_strikes") is None
    table.set_meta("memory_limit_strikes", 7)
    assert table.meta("memory_limit_strikes") == 7


def test_first_reads_of_nj_meta_end_with_any_other_read_or_a_change() -> None:
    conn = _conn()
    _meta_rows(conn, {"memory_limit_strikes": 1})
    table = JobTable(conn)
    assert table.meta("alarms_disabled") == 0
    conn.execute("UPDATE nj_meta SET value = 2")  # (a change the table did not make)
    assert table.meta("memory_limit_strikes") == 2
    assert table.first_meta("memory_limit_strikes") is None
    other = JobTable(conn)
    assert other.meta("alarms_disabled") == 0
    other.rows()
    assert other.first_meta("memory_limit_strikes") is None
    assert JobTable(conn).first_meta("memory_limit_strikes") is None  # (nothing read yet)


# -- the alarm run ---------------------------------------------------------------------


class _Cold(nj.DurableObject):
    namespace = "tests.test_remembered_reads.Cold"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.ran: list[str] = ctx.env

    async def push(self, n: int) -> None:
        with self.ctx.storage.transaction():
            for i in range(n):
                await self.lifecycle.jobs.push("f", id=f"j{i}", delay=30)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ran.append(ctx.job.id)


@pytest.mark.parametrize("jobs", [1, 12, 64, 70])
async def test_a_cold_objects_alarm_run_counts_its_backlog_from_its_first_batch(
    jobs: int, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock,
) -> None:
    """A first batch shorter than a batch holds every due job: the backlog is counted
    from it (no ``due_counts`` statement); a full one still asks the table."""
    counted: list[float] = []
    due_counts = JobTable.due_counts

    def counting(self: JobTable, now: float, window: int = 10_000) -> list[tuple[str, int]]:
        counted.append(now)
        return due_counts(self, now, window)

    monkeypatch.setattr(JobTable, "due_counts", counting)
    ran: list[str] = []
    events: list[Any] = []
    async with nj.open_runtime(None, env=ran, idle_timeout=5) as rt:
        rt.events.add_listener(events.append)
        await rt.get(_Cold, "c").push(jobs)
        await trio.sleep(60)  # evicted after 5 s; its alarm at 30 s starts it cold
    assert sorted(ran) == sorted(f"j{i}" for i in range(jobs))
    assert len(counted) == (1 if jobs >= 64 else 0)
    warned = [e.data for e in events if e.type == "job:backlog_warning"]
    assert warned == ([] if jobs < 10 else [{"owner": "host", "count": jobs}])
