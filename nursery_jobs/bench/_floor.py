"""The floors of the dispatch benchmark: nursery_jobs' own statements on its own schema,
with the pragmas of an object database, in plain sqlite3 with no Python around them.

What no change to our Python can beat. Set against the ceiling (``_harness.ceiling``),
a floor says how much of a gap is the schema and SQL (wider rows, more indexes, an
upsert, a savepoint per job that writes) and how much is the Python around them.
"""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import Final

from nursery_jobs._codec import encode_payload
from nursery_jobs._core._storage import KV_PUT
from nursery_jobs._core._transactions import _JOB
from nursery_jobs._engines._schema import prepare
from nursery_jobs._engines.files._catalog import _pragmas
from nursery_jobs._engines.files._engine import OBJECT_CACHE_KIB
from nursery_jobs._jobs._alarm_run import _DUE_BATCH
from nursery_jobs._jobs._store import DEFAULT_COMPLETION_GROUP
from nursery_jobs._jobs._table import DUE, UPSERT, finished_delete
from nursery_jobs._policy import DEFAULT_RETRY

SYNCHRONOUS: Final = {"normal": "NORMAL", "full": "FULL"}
# Pushes with a commit each, at most (as ``_harness._pushes``).
_PER_COMMIT_N: Final = 5000


def _object_database(path: Path, durability: str) -> sqlite3.Connection:
    """Open ``path`` as the files engine opens an object database (its pragmas, its
    schema), without the fault-translating connection class."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(_pragmas(str(path), synchronous=SYNCHRONOUS[durability], exclusive=True,
                                autocheckpoint=True, cache_kib=OBJECT_CACHE_KIB))
    prepare(conn, label="the floor")
    return conn


def _rows(n: int, now: float, delay: float) -> list[tuple[object, ...]]:
    """The parameters of ``n`` pushes of no-op jobs with default options, payload ``i``."""
    retry = DEFAULT_RETRY
    return [(f"{int(now * 1e6) + i:014x}000000benchtag", "host", "noop", now + delay + i * 1e-6,
             encode_payload(i), retry.max_attempts, retry.base_delay, retry.max_delay,
             retry.jitter, False, 30.0, False, False, now, 0, None, None, None) for i in range(n)]


def floors(directory: Path, n: int, durability: str) -> dict[str, float]:
    """Jobs per second of each floor: pushes (batched in one transaction, and one commit
    each), dispatch (read the due rows in batches, delete the finished ones in one
    statement, commit every completion group) and dispatch with a KV write per job (in
    the job's savepoint)."""
    out: dict[str, float] = {}
    now = time.time()

    conn = _object_database(directory / f"floor-push-{durability}.sqlite3", durability)
    rows = _rows(n, now, 3600.0)
    t0 = time.perf_counter()
    conn.execute("BEGIN")
    for params in rows:
        conn.execute(UPSERT, params)
    conn.execute("COMMIT")
    out["push_batched_per_s"] = n / (time.perf_counter() - t0)
    conn.close()

    conn = _object_database(directory / f"floor-push1-{durability}.sqlite3", durability)
    rows = _rows(min(n, _PER_COMMIT_N), now, 3600.0)
    t0 = time.perf_counter()
    for params in rows:
        conn.execute("BEGIN")
        conn.execute(UPSERT, params)
        conn.execute("COMMIT")
    out["push_per_call_per_s"] = len(rows) / (time.perf_counter() - t0)
    conn.close()

    for kv in (False, True):
        conn = _object_database(
            directory / f"floor-drain-{durability}-{int(kv)}.sqlite3", durability)
        conn.execute("BEGIN")
        conn.executemany(UPSERT, _rows(n, now, 0.0))
        conn.execute("COMMIT")
        out["kv_drain_per_s" if kv else "drain_per_s"] = n / _drain(conn, now + n, kv)
        conn.close()
    return out


def _drain(conn: sqlite3.Connection, now: float, kv: bool) -> float:
    """Seconds to dispatch every due job (as an alarm run does, with no-op jobs)."""
    # One read, one delete and one commit a group, as with the default completion group.
    assert _DUE_BATCH == DEFAULT_COMPLETION_GROUP
    delete = finished_delete(_DUE_BATCH)
    after: tuple[float, int] = (-math.inf, -1)
    t0 = time.perf_counter()
    while True:
        rows = conn.execute(DUE, (now, *after, _DUE_BATCH)).fetchall()
        if not rows:
            return time.perf_counter() - t0
        after = (rows[-1][4], rows[-1][0])
        conn.execute("BEGIN")
        if kv:
            for row in rows:
                conn.execute(f"SAVEPOINT {_JOB}")
                conn.execute(KV_PUT, ("count", row[5]))
                conn.execute(f"RELEASE {_JOB}")
        seqs = [row[0] for row in rows]
        conn.execute(finished_delete(len(seqs)) if len(seqs) != _DUE_BATCH else delete, seqs)
        conn.execute("COMMIT")
