"""A ship's cost on PostgreSQL follows the rows it carries, not the rows the object holds
(issue 26: depth does not cost). Its ``DELETE`` of changed keys joined ``nj_rows`` to the
keys' array, and with statistics that did not know the object was deep (a table not yet
analyzed, or one deep object among many small ones) PostgreSQL read every row of the
object for each ship: with the generic plan psycopg's prepared statements get, every row
once per deleted key (89 ms a ship at 5,000 rows; dispatch of one object 20,000 jobs deep
fell to ~580 jobs/s). Rows read are counted (``pg_stat_xact_user_tables``), never timed.
"""

from __future__ import annotations

from typing import Any

import pytest
from pg_support import opened

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

from nursery_jobs._engines.postgres import _ops as pg_ops
from nursery_jobs._engines.postgres._copy import SHIPPED, Change

NS = "tests.Deep"
CP = "tests.test_postgres_ship_plans:Deep"
ROWS = 5_000
DELETED = 64


def rows_read(conn: Any) -> int:
    """Rows of ``nj_rows`` this connection's open transaction has read so far."""
    (read,) = conn.execute(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
        " FROM pg_stat_xact_user_tables WHERE relname = 'nj_rows'"
    ).fetchone()
    return int(read)


@pytest.mark.parametrize("plans", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("many", [False, True], ids=["ship", "ship_many"])
async def test_a_ship_deleting_a_few_keys_of_a_deep_object_reads_only_those(
    pg_dsn: str, plans: str, many: bool,
) -> None:
    with opened(pg_dsn) as engine:
        state = await engine.open_object(NS, "deep", CP)
        state.conn.execute("BEGIN")
        state.conn.executemany("INSERT INTO nj_kv VALUES (?, '1')",
                               [(f"k{i:05}",) for i in range(ROWS)])
        state.conn.execute("COMMIT")
        await state.sync()  # ROWS rows stored; nj_rows never analyzed
        change = Change(
            NS, "deep", state.epoch, keys=[], upserts=[],
            deletes=[("nj_kv", f"k{i:05}") for i in range(DELETED)],
            alarm=None, clear_crashes=False, version=state.version,
        )
        with psycopg.connect(pg_dsn) as conn:
            conn.prepare_threshold = 0  # prepared at once, as the engine's are after 5 uses
            conn.execute(f"SET plan_cache_mode = {plans}")
            before = rows_read(conn)
            if many:
                outcome = pg_ops.ship_many(conn, engine.host_id, 10.0, [change])[0]
            else:
                outcome = pg_ops.ship(conn, engine.host_id, 10.0, change)
            read = rows_read(conn) - before
            left = conn.execute("SELECT count(*) FROM nj_rows WHERE object_id = 'deep'"
                                " AND tbl = 'nj_kv'").fetchone()[0]
            conn.rollback()
        assert outcome == SHIPPED
        assert left == ROWS - DELETED
        # Each deleted key found by its own index search (and the row read once more to
        # delete it); the object's other 4,936 rows untouched.
        assert read <= 2 * DELETED, f"a ship of {DELETED} deletes read {read} rows"


async def test_a_lone_ship_is_planned_once_not_on_every_execution(pg_dsn: str) -> None:
    # Under the server's default plan_cache_mode (auto), PostgreSQL keeps re-planning a
    # prepared statement whose generic plan it estimates dearer than its custom plans:
    # the lone ship's was (the custom plans saw each array's length), and planning it
    # was ~180 µs of its ~300 µs of server CPU. Plans are counted, never timed.
    with opened(pg_dsn) as engine:
        state = await engine.open_object(NS, "lone", CP)
        version = state.version
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SET plan_cache_mode = auto")
            for n in range(12):
                change = Change(
                    NS, "lone", state.epoch, keys=[],
                    upserts=[("nj_kv", f"k{n}", f'["k{n}", "1"]')],
                    deletes=[("nj_kv", f"k{n - 1}")] if n else [],
                    alarm=None, clear_crashes=False, version=version,
                )
                assert pg_ops.ship(conn, engine.host_id, 10.0, change) == SHIPPED
                version = change.shipped_version
            plans = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%%WITH fence AS%%'").fetchall()
    assert plans, "the ship was not prepared"
    generic = sum(g for g, _ in plans)
    custom = sum(c for _, c in plans)
    # psycopg prepares it after 5 uses; PostgreSQL tries 5 custom plans before it
    # settles on the generic one.
    assert generic > 0 and custom <= 5 * len(plans), plans
