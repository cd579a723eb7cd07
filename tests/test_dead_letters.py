"""Dead letters everywhere they are kept can be listed, requeued and discarded, and are
bounded per object (DESIGN §4: ``dead_letter_limit``, ``job:dead_letter_dropped``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH, engine

import nursery_jobs as nj
from nursery_jobs._engines.files._catalog import object_file_name


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


NO_RETRY = nj.RetryOptions(max_attempts=1)


class Box(nj.DurableObject):
    namespace = "tests.test_dead_letters.Box"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.queue = nj.Queue({"fail": self.fail}, retry=NO_RETRY)
        self.lifecycle = nj.Lifecycle.install(self, dead_letter_limit=ctx.env).use(self.queue)

    async def fail(self, payload: Any, item: nj.QueueItem) -> None:
        raise RuntimeError(f"{item.id} failed")

    async def on_job(self, ctx: nj.JobContext) -> None:
        raise RuntimeError(f"host {ctx.job.id} failed")

    async def push_host(self, job_id: str) -> None:
        await self.lifecycle.jobs.push("f", id=job_id, retry=NO_RETRY)

    async def push_hosts(self, *job_ids: str, time: float) -> None:
        """Push host jobs due at ``time``, in one call (none runs before the last is
        pushed)."""
        for job_id in job_ids:
            await self.lifecycle.jobs.push("f", id=job_id, time=time, retry=NO_RETRY)

    async def push_item(self, item_id: str) -> None:
        await self.queue.push("fail", None, id=item_id)

    async def letters(self) -> list[tuple[str, str]]:
        return [(d.job.owner, d.job.id) for d in self.lifecycle.dead_letters()]

    async def queue_letters(self) -> list[str]:
        return [d.item.id for d in self.queue.dead_letters()]

    async def discard(self, job_id: str) -> bool:
        return await self.lifecycle.discard(job_id)

    async def queue_discard(self, item_id: str) -> bool:
        return await self.queue.discard(item_id)

    async def discard_all(self, before: Any = None) -> int:
        return await self.lifecycle.discard_dead_letters(before=before)

    async def queue_discard_all(self) -> int:
        return await self.queue.discard_dead_letters()


async def test_discard_one_and_discard_before_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(engine.location, env=100) as rt:
        box = rt.get(Box, "b")
        await box.push_host("h1")
        await box.push_item("q1")
        await trio.sleep(10)
        await box.push_host("h2")
        await box.push_item("q2")
        await trio.sleep(10)
        assert await box.letters() == [("host", "h1"), ("queue", "q1"), ("host", "h2"),
                                       ("queue", "q2")]
        # Scoped: the host cannot discard the Queue's letter by id, the Queue can.
        assert await box.discard("q1") is False
        assert await box.queue_discard("q1") is True
        assert await box.queue_discard("q1") is False
        # Everything buried before t=5 (h1), across owners.
        assert await box.discard_all(before=EPOCH + 5) == 1
        assert await box.letters() == [("host", "h2"), ("queue", "q2")]
        assert await box.queue_discard_all() == 1
        assert await box.letters() == [("host", "h2")]
        with pytest.raises(nj.JobError):
            await box.discard_all(before="yesterday")
        assert await box.discard_all() == 1
        assert await box.letters() == []


async def test_dead_letters_are_bounded_and_the_oldest_dropped_with_an_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dropped: list[nj.Event] = []
    async with nj.open_runtime(engine.location, env=3) as rt:
        rt.events.add_listener(
            lambda e: dropped.append(e) if e.type == "job:dead_letter_dropped" else None)
        box = rt.get(Box, "b")
        for i in range(5):
            await box.push_host(f"h{i}")
            await trio.sleep(1)
        assert await box.letters() == [("host", "h2"), ("host", "h3"), ("host", "h4")]
        assert [(e.data["id"], e.data["limit"]) for e in dropped] == [("h0", 3), ("h1", 3)]


def _as_schema_3(location: Any, namespace: str, object_id: str) -> None:
    """Store an object's dead letters as object schema 3 did: without ``seq``."""
    where = (namespace, object_id)
    if isinstance(location, str) and location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as pg:
            for key, data in pg.execute(
                "SELECT key, data FROM nj_rows WHERE namespace = %s AND object_id = %s"
                " AND tbl = 'nj_dead_letters'", where,
            ).fetchall():
                pg.execute("UPDATE nj_rows SET data = %s WHERE namespace = %s AND object_id = %s"
                           " AND tbl = 'nj_dead_letters' AND key = %s",
                           (json.dumps(json.loads(data)[:7]), *where, key))
            pg.execute("UPDATE nj_schema SET object_schema = 3")
        return
    if isinstance(location, str) and location.startswith("shared:"):
        conn = sqlite3.connect(Path(location[len("shared:"):]) / "shared.sqlite3")
        for key, data in conn.execute(
            "SELECT key, data FROM nj_rows WHERE namespace = ? AND object_id = ?"
            " AND tbl = 'nj_dead_letters'", where,
        ).fetchall():
            conn.execute("UPDATE nj_rows SET data = ? WHERE namespace = ? AND object_id = ?"
                         " AND tbl = 'nj_dead_letters' AND key = ?",
                         (json.dumps(json.loads(data)[:7]), *where, key))
    else:
        conn = sqlite3.connect(Path(location) / "objects" / object_file_name(*where))
        conn.execute("DROP INDEX nj_dead_letters_burial")
        conn.execute("ALTER TABLE nj_dead_letters DROP COLUMN seq")
        conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()


async def test_letters_stored_by_schema_3_keep_their_place_before_later_burials(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    # Schema 4 orders letters by their burial sequence; those buried before it have
    # none, and stay oldest (by their time), on every engine.
    location = engine.durable(tmp_path)
    async with nj.open_runtime(location, env=10) as rt:
        box = rt.get(Box, "b")
        await box.push_host("old-b")
        await trio.sleep(10)
        await box.push_host("old-a")
        await trio.sleep(10)
    _as_schema_3(location, Box.namespace, "b")
    dropped: list[str] = []
    async with nj.open_runtime(location, env=2) as rt:
        rt.events.add_listener(
            lambda e: dropped.append(e.data["id"]) if e.type == "job:dead_letter_dropped"
            else None)
        box = rt.get(Box, "b")
        assert await box.letters() == [("host", "old-b"), ("host", "old-a")]
        await box.push_host("new")
        await trio.sleep(10)
        assert await box.letters() == [("host", "old-a"), ("host", "new")]
        assert dropped == ["old-b"]
    if isinstance(location, Path):
        conn = sqlite3.connect(location / "objects" / object_file_name(Box.namespace, "b"))
        try:
            assert conn.execute("PRAGMA user_version").fetchone() == (4,)
            assert conn.execute("SELECT id, seq FROM nj_dead_letters ORDER BY seq").fetchall(
                ) == [("old-a", None), ("new", 1)]
        finally:
            conn.close()


async def test_the_oldest_dead_letter_goes_when_burials_share_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dropped: list[str] = []
    async with nj.open_runtime(engine.location, env=2) as rt:
        rt.events.add_listener(
            lambda e: dropped.append(e.data["id"]) if e.type == "job:dead_letter_dropped"
            else None)
        box = rt.get(Box, "b")
        # Due at the same moment, they run (and fail) in push order, in one alarm run:
        # buried at one time, c first.
        await box.push_hosts("c", "b", "a", time=EPOCH + 10)
        await trio.sleep(20)
        assert dropped == ["c"]
        assert await box.letters() == [("host", "b"), ("host", "a")]


async def test_dead_letters_buried_at_the_same_time_list_in_burial_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(engine.location, env=100) as rt:
        box = rt.get(Box, "b")
        await box.push_hosts("c", "b", "a", time=EPOCH + 10)
        await trio.sleep(20)
        # Oldest first: in the order they were buried, not by (owner, id).
        assert await box.letters() == [("host", "c"), ("host", "b"), ("host", "a")]


class Sealed(nj.DurableObject):
    """Sealed at its first memory reset, keeping one dead letter; its job "oom" runs
    out of memory a second after it starts."""

    namespace = "tests.test_dead_letters.Sealed"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.runs: list[str] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self, max_alarm_memory_limit_strikes=1,
                                              dead_letter_limit=1)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.runs.append(ctx.job.id)
        if ctx.job.fn == "oom":
            await trio.sleep(1)
            raise MemoryError(f"{ctx.job.id} ran out of memory")

    async def push_loop(self, fn: str, job_id: str, time: float) -> None:
        await self.lifecycle.jobs.push(fn, id=job_id, time=time, recovery_loop=True)

    async def state(self) -> tuple[list[str], list[str]]:
        return ([job.id for job in self.lifecycle.jobs.list()],
                [d.job.id for d in self.lifecycle.dead_letters()])


async def test_a_seal_of_recovery_loop_jobs_keeps_the_dead_letter_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[str] = []
    dropped: list[str] = []
    async with nj.open_runtime(engine.location, env=runs) as rt:
        rt.events.add_listener(
            lambda e: dropped.append(e.data["id"]) if e.type == "job:dead_letter_dropped"
            else None)
        obj = rt.get(Sealed, "s")
        await obj.push_loop("oom", "r1", EPOCH + 10)
        await obj.push_loop("run", "r2", EPOCH + 500)
        await trio.sleep(20)
        # The MemoryError at 11 resets the object at its first strike: sealed, both
        # recovery loops go to the dead letters (in run order), of which one is kept.
        assert runs == ["r1"]
        assert await obj.state() == ([], ["r2"])
        assert dropped == ["r1"]


async def test_a_bad_dead_letter_limit_is_refused(autojump_clock: trio.testing.MockClock) -> None:
    async with nj.open_runtime(engine.location, env=0) as rt:
        with pytest.raises(ValueError, match="dead_letter_limit"):
            await rt.get(Box, "b").letters()


class Garbled(nj.DurableObject):
    namespace = "tests.test_dead_letters.Garbled"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.runs: list[float] = []

    async def push(self, attempts: int) -> None:
        await self.lifecycle.jobs.push("f", id="j", retry=nj.RetryOptions(
            max_attempts=attempts, base_delay=1, max_delay=1, jitter=False))

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.runs.append(trio.current_time())
        raise ValueError("bad \ud800 text\udcff")  # (lone surrogates: no UTF-8 holds them)

    async def letters(self) -> list[tuple[str, str, int]]:
        return [(d.job.id, d.error, d.attempts) for d in self.lifecycle.dead_letters()]

    async def state(self) -> tuple[list[float], list[str]]:
        return self.runs, [job.id for job in self.lifecycle.jobs.list()]


@pytest.mark.parametrize("attempts", [1, 2])
async def test_an_error_text_with_lone_surrogates_is_stored_escaped(
    autojump_clock: trio.testing.MockClock, attempts: int,
) -> None:
    """A job's error text is stored (attempts, dead letters) with its lone surrogates
    escaped: raw, the write raised UnicodeEncodeError and the alarm run failed again and
    again, the job never leaving the queue."""
    alarm_failures: list[nj.Event] = []
    with trio.fail_after(1000):
        async with nj.open_runtime(engine.location, stop_on=()) as rt:
            rt.events.add_listener(
                lambda e: alarm_failures.append(e) if e.type == "alarm:failed" else None)
            box = rt.get(Garbled, "g")
            await box.push(attempts)
            await trio.sleep(30)
            assert await box.letters() == [
                ("j", "ValueError: bad \\ud800 text\\udcff", attempts)]
            runs, pending = await box.state()
            assert pending == [] and alarm_failures == []
            assert runs == [0.0, 1.0][:attempts]
