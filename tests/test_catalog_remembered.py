"""The catalog's reads answered from what an earlier read found (issue 26, the cold
fire): class paths per namespace, the alarms the timer's ``due`` read (for the
``get_alarm`` of the objects it opens next) and crash tokens while none is stored. Each
is checked against its statement over random sequences of registrations, alarm writes,
crashes and rolled-back ships."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import pytest

from nursery_jobs._engines.files._catalog import Catalog


def _catalog() -> tuple[Catalog, sqlite3.Connection]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    return Catalog(conn), conn


def _truth(conn: sqlite3.Connection, ns: str, oid: str) -> Any:
    path = conn.execute("SELECT class_path FROM nj_objects WHERE namespace = ? LIMIT 1",
                        (ns,)).fetchone()
    alarm = conn.execute("SELECT time, retry FROM nj_alarms WHERE namespace = ?"
                         " AND object_id = ?", (ns, oid)).fetchone()
    crashes = conn.execute("SELECT token, started FROM nj_crashes WHERE namespace = ?"
                           " AND object_id = ?", (ns, oid)).fetchall()
    return (None if path is None else path[0],
            None if alarm is None else (float(alarm[0]), int(alarm[1])),
            [(str(t), float(s)) for t, s in crashes])


@pytest.mark.parametrize("seed", range(20))
def test_the_catalogs_remembered_reads_answer_as_its_statements(seed: int) -> None:
    rng = random.Random(seed)
    catalog, conn = _catalog()
    keys = [(ns, oid) for ns in ("n1", "n2") for oid in ("a", "b", "c")]
    for _ in range(150):
        ns, oid = rng.choice(keys)
        op = rng.randrange(9)
        if op == 0:
            catalog.register(ns, oid, rng.choice(["m:A", "m:B"]), 1.0)
        elif op == 1:
            catalog.forget(ns, oid)
        elif op == 2:
            catalog.set_alarm(ns, oid, float(rng.randrange(20)), rng.randrange(3))
        elif op == 3:
            catalog.delete_alarm(ns, oid)
        elif op == 4:
            catalog.due(float(rng.randrange(25)), rng.randrange(1, 6))
        elif op == 5:
            catalog.add_crashes([(ns, oid, rng.choice(["", "t1", "t2"]), 3.0)], 4.0)
        elif op == 6:
            catalog.clear_crashes(ns, oid)
        elif op == 7:
            # A ship's transaction that rolls back (the shared layout's).
            conn.execute("BEGIN IMMEDIATE")
            catalog.register(ns, oid, rng.choice(["m:A", "m:C"]), 1.0)
            catalog.set_alarm(ns, oid, 99.0, 0)
            conn.execute("ROLLBACK")
        else:
            catalog.adopt(ns, oid, rng.choice(["m:A", "m:B"]), 1.0,
                          rng.choice([None, 2.0, 50.0]))
        for ns2, oid2 in keys:
            assert (catalog.class_path(ns2), catalog.get_alarm(ns2, oid2),
                    catalog.crashes(ns2, oid2)) == _truth(conn, ns2, oid2), (seed, op)


def test_a_catalog_opened_with_crash_tokens_reads_them() -> None:
    catalog, conn = _catalog()
    catalog.add_crashes([("n", "o", "t", 1.0)], 2.0)
    assert Catalog(conn).crashes("n", "o") == [("t", 1.0)]
    assert catalog.crashes("n", "o") == [("t", 1.0)]
