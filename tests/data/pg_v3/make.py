"""How ``rows.json`` was made: objects written by nursery_jobs with PostgreSQL schema
version 3 (the release before rows were keyed by digests), dumped table by table.

Run with a nursery_jobs whose ``_engines/postgres/_schema.py`` says
``PG_SCHEMA_VERSION: Final = 3`` on the path, against an empty database::

    PYTHONPATH=<that checkout> python tests/data/pg_v3/make.py postgresql://.../empty

``tests/test_postgres_engine.py`` loads ``schema.sql`` and these rows into a fresh
database and opens it with the current code (the migration to version 4).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psycopg
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs import _clock

EPOCH = 1_800_000_000.0  # (tests/conftest.py's)


class Keeper(nj.DurableObject):
    namespace = "tests.pg_v3.Keeper"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def add(self, by: int) -> int:
        n = int(self.ctx.storage.get("n", 0)) + by
        self.ctx.storage.put("n", n)
        return n

    async def push(self, fn: str, id: str, delay: float) -> None:
        await self.lifecycle.jobs.push(fn, id=id, delay=delay,
                                       retry=nj.RetryOptions(max_attempts=1))

    async def on_job(self, ctx: nj.JobContext) -> None:
        if ctx.job.fn == "fail":
            raise RuntimeError("it fails")
        self.ctx.storage.put("ran", ctx.job.id)


class Plain(nj.DurableObject):
    namespace = "tests.pg_v3.Plain"

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.ctx.storage.put("alarmed", nj.now())


async def write(dsn: str) -> None:
    async with nj.open_runtime(dsn, stop_on=()) as rt:
        keeper = rt.get(Keeper, "k-1")
        await keeper.add(41)
        await keeper.push("fail", "bad", 1)  # a dead letter at EPOCH + 1
        await keeper.push("later", "later", 1000)  # due at EPOCH + 1000
        await trio.sleep(10)
        await rt.get(Keeper, "ключ ✓").add(7)
        await rt.get(Plain, "p").arm(EPOCH + 500)


def dump(dsn: str) -> dict[str, list[list[Any]]]:
    tables = {
        "nj_namespaces": "namespace, class_path",
        "nj_objects": "namespace, object_id, class_path, created_at, alarm_time,"
                      " alarm_retry, epoch, version",
        "nj_rows": "namespace, object_id, tbl, key, data",
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {table: [list(row) for row in conn.execute(
                    f"SELECT {columns} FROM {table} ORDER BY 1, 2")]
                for table, columns in tables.items()}


def main(dsn: str) -> None:
    from nursery_jobs._engines.postgres._schema import PG_SCHEMA_VERSION

    assert PG_SCHEMA_VERSION == 3, "run it with the nursery_jobs of schema version 3"
    _clock.pin_epoch(EPOCH)
    trio.run(write, dsn, clock=trio.testing.MockClock(autojump_threshold=0))
    out = Path(__file__).with_name("rows.json")
    out.write_text(json.dumps(dump(dsn), indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
