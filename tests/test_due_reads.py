"""The alarm run's reads of due jobs (``JobTable.next_due``, ``due_counts``): run order
across priorities, paused owners and batches, and reads whose cost does not grow with
the queue's depth (issue 26) — each statement on an index in its own order, never a sort
of the whole queue. Plans are checked with EXPLAIN QUERY PLAN, not timed."""

from __future__ import annotations

import math
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
from nursery_jobs._jobs._table import Cursor, JobRow, JobTable
from nursery_jobs._policy import DEFAULT_RETRY

NOW = 1_000.0


class RecordingConnection(sqlite3.Connection):
    """Remembers every statement it runs, with its parameters."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.statements.append((sql, tuple(parameters)))
        return super().execute(sql, parameters)


def table_of(jobs: list[tuple[str, float, int]]) -> tuple[JobTable, RecordingConnection]:
    """A table holding a job per (owner, time, priority), pushed in that order."""
    conn = sqlite3.connect(":memory:", isolation_level=None, factory=RecordingConnection)
    assert isinstance(conn, RecordingConnection)
    prepare(conn, label="test")
    table = JobTable(conn)
    for i, (owner, time, priority) in enumerate(jobs):
        table.upsert(checked_job(f"j{i}", owner, "f", time, None, DEFAULT_RETRY, False,
                                 30.0, False, False, 0.0, priority), None)
    conn.statements.clear()
    return table, conn


def read_all(table: JobTable, batch: int) -> list[str]:
    """Every due job's id, read as an alarm run reads them: batches after a cursor."""
    ids: list[str] = []
    cursor: Cursor = _START
    while True:
        rows = table.next_due(NOW, cursor, batch)
        if not rows:
            return ids
        assert len(rows) <= batch
        ids += [row.job.id for row in rows]
        last: JobRow = rows[-1]
        cursor = (-last.job.priority, last.job.time, last.seq)


def model(jobs: list[tuple[str, float, int]], held: frozenset[str | None]) -> list[str]:
    due = [(-priority, time, i) for i, (owner, time, priority) in enumerate(jobs)
           if time <= NOW and owner not in held and None not in held]
    return [f"j{i}" for _p, _t, i in sorted(due)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_due_jobs_come_in_run_order_across_priorities_and_batches(
    seed: int, batch: int
) -> None:
    rng = random.Random(seed)
    priorities = [0] if seed % 3 == 0 else [-2, -1, 0, 0, 0, 1, 5]
    jobs = [(rng.choice(["host", "a", "b"]), float(rng.choice([10, 20, 20, 30, 2000])),
             rng.choice(priorities)) for _ in range(rng.randrange(0, 150))]
    table, _conn = table_of(jobs)
    for held in (frozenset(), frozenset({"a"}), frozenset({"a", "b"}), frozenset({None})):
        table.hold(held)
        assert read_all(table, batch) == model(jobs, held), held


def plans(conn: sqlite3.Connection, statements: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
    explain = sqlite3.Connection.execute  # (not recorded)
    return [row[3] for sql, params in statements
            for row in explain(conn, "EXPLAIN QUERY PLAN " + sql, params).fetchall()]


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("held", [frozenset(), frozenset({"a"})])
def test_due_reads_never_sort_the_queue(prioritized: bool, held: frozenset[str]) -> None:
    """Each statement of ``next_due`` searches an index in the order it returns rows:
    no temporary sort of every due row, however deep the queue (one prioritized job made
    the old single query sort them all, for every batch)."""
    jobs = [("host", float(i % 50), 0) for i in range(2_000)]
    if prioritized:
        jobs += [("host", 5.0, 3), ("a", 6.0, -1)]
    table, conn = table_of(jobs)
    table.hold(held)
    conn.execute("ANALYZE")  # (the planner's choice with statistics, as after a long life)
    conn.statements.clear()
    assert len(read_all(table, 64)) == len(model(jobs, held))
    steps = plans(conn, conn.statements)
    assert steps
    for step in steps:
        assert "TEMP B-TREE" not in step, step
        assert "INDEX" in step, step  # never a scan of the table itself


def test_backlog_counts_read_a_bounded_window() -> None:
    table, _conn = table_of([("host", 1.0, 0)] * 30 + [("a", 2.0, 0)] * 5 + [("b", 3.0, 0)] * 5)
    assert sorted(table.due_counts(NOW)) == [("a", 5), ("b", 5), ("host", 30)]
    assert sorted(table.due_counts(NOW, window=33)) == [("a", 3), ("host", 30)]
    table.hold(frozenset({"host"}))
    assert sorted(table.due_counts(NOW, window=6)) == [("a", 5), ("b", 1)]
    assert math.isfinite(NOW)


class _Ran:
    def __init__(self, expected: int) -> None:
        self.payloads: list[Any] = []
        self.expected = expected
        self.all_ran = trio.Event()


class _Reader(nj.DurableObject):
    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.ran: _Ran = ctx.env

    async def push_three(self) -> None:
        with self.ctx.storage.transaction():
            for i in range(3):
                await self.lifecycle.jobs.push("f", payload=i)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ran.payloads.append(ctx.job.payload)
        if len(self.ran.payloads) == self.ran.expected:
            self.ran.all_ran.set()


async def test_an_alarm_run_reads_what_fits_one_batch_once(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock,
) -> None:
    """A batch shorter than the run's batch size held every due job: the run does not
    read again to find nothing (that read was two statements of every alarm run)."""
    batches: list[int] = []
    next_due = JobTable.next_due

    def counted(self: JobTable, now: float, after: Cursor, limit: int = 1) -> list[JobRow]:
        rows = next_due(self, now, after, limit)
        batches.append(len(rows))
        return rows

    monkeypatch.setattr(JobTable, "next_due", counted)
    ran = _Ran(3)
    async with nj.open_runtime(None, env=ran) as rt:
        await rt.get(_Reader, "r").push_three()
        with trio.fail_after(60):
            await ran.all_ran.wait()
        await trio.sleep(1)  # (the run's end, and anything after it)
    assert ran.payloads == [0, 1, 2]
    assert batches == [3]
