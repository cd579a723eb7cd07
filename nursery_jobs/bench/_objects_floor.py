"""The floor of "one object per task" (issue 26) for two storage layouts, with plain
sqlite3 and none of nursery_jobs' code around it but its object schema:

- ``files``: today's layout — a SQLite file (with WAL) per object plus the catalog.
  Create: open a new file (exclusive lock, WAL), apply the schema, insert one job,
  commit, close; register the object and its alarm in the catalog (one commit).
  Cold fire: open the file, read the due job, delete it, commit, close; delete the
  alarm from the catalog.
- ``shared``: every object's rows in one shared database (``nj_rows`` keyed by
  (namespace, object_id, tbl, key) as the PostgreSQL engine stores them, the registry
  and alarm index in ``nj_objects``), one WAL, commits grouped across the objects
  created (or fired) in the same moment: ``--batch`` objects per transaction.
  Create: insert the object's registry row (its alarm a column) and its job row.
  Cold fire: read the object's rows, delete its job row, clear its alarm.
- ``shared+copy``: ``shared`` plus what an engine must add per object on top of the
  storage: an in-memory working copy (the object schema, change-capture triggers) built
  on activation, the job inserted into it / the loaded rows read back from it, the
  changed rows read back out for the ship, the copy closed. ``--copy`` picks how the
  copy is built: ``ddl`` (the schema's DDL run per object, as the PostgreSQL engine does
  today), ``image`` (``Connection.deserialize`` of a prepared empty database) or ``pool``
  (a copy is wiped when its object leaves memory and kept for the next object: the
  schema is parsed once per pooled copy, not once per object).

Each figure is objects/s, the median of ``--repeats`` runs (range beside it), wall and
CPU time; each run in a fresh directory. The machine is shared: numbers swing.
Memory: RSS per resident working copy (``--memory``), in a fresh process.

Run (this module's ``main``): python benchmarks/layout_floor.py
     [--sizes 1000,10000,100000] [--dirs /work/x,/dev/shm]
     [--batch 100] [--repeats 3] [--files-max 10000] [--synchronous NORMAL] [--json]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from nursery_jobs._engines._schema import _INDEXES, _TABLES, SCHEMA_VERSION
from nursery_jobs._engines.postgres._schema import ROW_TABLES, capture_sql

NS = "bench.Task"
JOB_COLUMNS = ROW_TABLES[1].columns
SCHEMA_SCRIPT = (f"BEGIN IMMEDIATE; {_TABLES}; {_INDEXES};"
                 f" PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
CATALOG = """
CREATE TABLE IF NOT EXISTS nj_objects (namespace TEXT NOT NULL, object_id TEXT NOT NULL,
    file TEXT NOT NULL, class_path TEXT NOT NULL, created_at REAL NOT NULL,
    created INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (namespace, object_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nj_alarms (namespace TEXT NOT NULL, object_id TEXT NOT NULL,
    time REAL NOT NULL, retry INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, object_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nj_alarms_time ON nj_alarms (time);
"""
SHARED = """
CREATE TABLE IF NOT EXISTS nj_objects (namespace TEXT NOT NULL, object_id TEXT NOT NULL,
    class_path TEXT NOT NULL, created_at REAL NOT NULL, alarm_time REAL,
    alarm_retry INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (namespace, object_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nj_objects_alarm ON nj_objects (alarm_time)
    WHERE alarm_time IS NOT NULL;
CREATE TABLE IF NOT EXISTS nj_rows (namespace TEXT NOT NULL, object_id TEXT NOT NULL,
    tbl TEXT NOT NULL, key TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (namespace, object_id, tbl, key)) WITHOUT ROWID;
"""


def job_row(i: int) -> tuple[Any, ...]:
    """One job as the Lifecycle pushes it (23 columns of ``nj_jobs``)."""
    return (1, f"job-{i}", "tasks", "run", 1.0, f'{{"p":{{"n":{i}}}}}', 10, 1.0, 300.0, 1,
            0, 300.0, 0, 0, 0.5, 0, None, 0, None, 0, None, None, None)


def pragmas(conn: sqlite3.Connection, synchronous: str, *, exclusive: bool) -> None:
    script = []
    if exclusive:
        script.append("PRAGMA locking_mode=EXCLUSIVE")
    script += [f"PRAGMA synchronous={synchronous}", "PRAGMA cache_size=-8192",
               "PRAGMA wal_autocheckpoint=10000", "PRAGMA journal_mode=WAL"]
    conn.executescript(";".join(script))


def oid(i: int) -> str:
    return f"task-{i:07d}"


# -- layout (a): a file per object ----------------------------------------------------------
def files_create(root: str, n: int, sync: str, batch: int) -> None:
    os.makedirs(f"{root}/objects", exist_ok=True)
    cat = sqlite3.connect(f"{root}/catalog.sqlite3", isolation_level=None)
    pragmas(cat, sync, exclusive=False)
    cat.executescript(CATALOG)
    for i in range(n):
        name = hashlib.sha256(f"{NS}:{oid(i)}".encode()).hexdigest()[:40] + ".sqlite3"
        cat.execute("INSERT INTO nj_objects VALUES (?, ?, ?, ?, ?, 0)",
                    (NS, oid(i), name, "m:C", 0.5))
        conn = sqlite3.connect(f"{root}/objects/{name}", isolation_level=None)
        pragmas(conn, sync, exclusive=True)
        conn.executescript(SCHEMA_SCRIPT)
        cat.execute("UPDATE nj_objects SET created = 1 WHERE namespace = ? AND object_id = ?",
                    (NS, oid(i)))
        conn.execute(f"INSERT INTO nj_jobs ({', '.join(JOB_COLUMNS)}) VALUES"
                     f" ({', '.join('?' * len(JOB_COLUMNS))})", job_row(i))
        cat.execute("INSERT OR REPLACE INTO nj_alarms VALUES (?, ?, 1.0, 0)", (NS, oid(i)))
        conn.close()
    cat.close()


def files_fire(root: str, n: int, sync: str, batch: int) -> None:
    cat = sqlite3.connect(f"{root}/catalog.sqlite3", isolation_level=None)
    pragmas(cat, sync, exclusive=False)
    while True:
        due = cat.execute("SELECT a.namespace, a.object_id, o.file FROM nj_alarms a JOIN"
                          " nj_objects o USING (namespace, object_id) WHERE a.time <= 2.0"
                          " ORDER BY a.time LIMIT 100").fetchall()
        if not due:
            break
        for ns, object_id, name in due:
            conn = sqlite3.connect(f"{root}/objects/{name}", isolation_level=None)
            pragmas(conn, sync, exclusive=True)
            conn.execute("BEGIN")
            seq = conn.execute("SELECT seq FROM nj_jobs WHERE time <= 2.0 ORDER BY time"
                               " LIMIT 1").fetchone()[0]
            conn.execute("DELETE FROM nj_jobs WHERE seq = ?", (seq,))
            conn.execute("COMMIT")
            conn.close()
            cat.execute("DELETE FROM nj_alarms WHERE namespace = ? AND object_id = ?",
                        (ns, object_id))
    cat.close()


# -- layout (b): one shared database ---------------------------------------------------------
def open_shared(root: str, sync: str) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{root}/shared.sqlite3", isolation_level=None)
    pragmas(conn, sync, exclusive=True)
    conn.executescript(SHARED)
    return conn


class Copies:
    """How a working copy is built (None: no copy, the storage floor alone)."""

    def __init__(self, how: str | None) -> None:
        self.how = how
        self.free: list[sqlite3.Connection] = []
        self.captured: dict[int, set[tuple[str, str]]] = {}  # id(copy) -> its keys
        if how == "image":
            conn = self._ddl()
            self.image = conn.serialize()
            conn.close()

    def _ddl(self) -> sqlite3.Connection:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        conn.executescript(SCHEMA_SCRIPT)
        return conn

    def open(self) -> sqlite3.Connection | None:
        if self.how is None:
            return None
        if self.free:
            return self.free.pop()
        if self.how in ("ddl", "pool"):
            conn = self._ddl()
        else:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.deserialize(self.image)
        conn.executescript("".join(s + ";" for t in ROW_TABLES for s in capture_sql(t)))
        keys = self.captured[id(conn)] = set()
        conn.create_function("nj_capture", 2, lambda tbl, key: keys.add((tbl, key)))
        return conn

    def take(self, conn: sqlite3.Connection) -> list[tuple[str, str]]:
        """The keys the copy captured, forgotten."""
        keys = self.captured[id(conn)]
        taken = list(keys)
        keys.clear()
        return taken

    def close(self, conn: sqlite3.Connection) -> None:
        """Done with a copy: ``pool`` wipes it and keeps it for the next object (its
        parsed schema, triggers and prepared statements kept); the others close it."""
        if self.how != "pool":
            del self.captured[id(conn)]
            conn.close()
            return
        conn.execute("BEGIN")
        for table in WIPE:
            conn.execute(table)
        conn.execute("COMMIT")
        self.captured[id(conn)].clear()
        self.free.append(conn)


WIPE = [f"DELETE FROM main.{t.name}" for t in ROW_TABLES]
INSERT_JOB = (f"INSERT INTO nj_jobs ({', '.join(JOB_COLUMNS)}) VALUES"
              f" ({', '.join('?' * len(JOB_COLUMNS))})")


def shared_create(root: str, n: int, sync: str, batch: int, copies: Copies) -> None:
    db = open_shared(root, sync)
    for start in range(0, n, batch):
        rows = []
        for i in range(start, min(n, start + batch)):
            copy = copies.open()
            if copy is None:
                data = json.dumps(job_row(i))
            else:  # the push in the copy, and the changed row read out for the ship
                copy.execute(INSERT_JOB, job_row(i))
                keys = copies.take(copy)
                row = copy.execute(f"SELECT {', '.join(JOB_COLUMNS)} FROM nj_jobs"
                                   " WHERE id = ?", (keys[0][1],)).fetchone()
                data = json.dumps(row)
                copies.close(copy)
            rows.append((oid(i), data))
        db.execute("BEGIN")
        db.executemany("INSERT INTO nj_objects VALUES (?, ?, 'm:C', 0.5, 1.0, 0)",
                       [(NS, o) for o, _ in rows])
        db.executemany("INSERT INTO nj_rows VALUES (?, ?, 'nj_jobs', ?, ?)",
                       [(NS, o, f"job-{o}", d) for o, d in rows])
        db.execute("COMMIT")
    db.close()


def shared_fire(root: str, n: int, sync: str, batch: int, copies: Copies) -> None:
    db = open_shared(root, sync)
    while True:
        due = db.execute("SELECT namespace, object_id FROM nj_objects WHERE alarm_time <= 2.0"
                         " ORDER BY alarm_time LIMIT ?", (batch,)).fetchall()
        if not due:
            break
        done = []
        for ns, object_id in due:
            rows = db.execute("SELECT tbl, key, data FROM nj_rows WHERE namespace = ? AND"
                              " object_id = ?", (ns, object_id)).fetchall()
            copy = copies.open()
            if copy is None:
                key = next(k for t, k, _ in rows if t == "nj_jobs")
            else:  # load, claim the due job, delete it, capture the change
                copy.execute("BEGIN")
                copy.executemany(INSERT_JOB, [json.loads(d) for t, _, d in rows
                                              if t == "nj_jobs"])
                copy.execute("COMMIT")
                copies.take(copy)
                seq = copy.execute("SELECT seq FROM nj_jobs WHERE time <= 2.0 ORDER BY time"
                                   " LIMIT 1").fetchone()[0]
                copy.execute("DELETE FROM nj_jobs WHERE seq = ?", (seq,))
                key = copies.take(copy)[0][1]
                copies.close(copy)
            done.append((ns, object_id, key))
        db.execute("BEGIN")
        db.executemany("DELETE FROM nj_rows WHERE namespace = ? AND object_id = ? AND"
                       " tbl = 'nj_jobs' AND key = ?", done)
        db.executemany("UPDATE nj_objects SET alarm_time = NULL WHERE namespace = ? AND"
                       " object_id = ?", [(ns, o) for ns, o, _ in done])
        db.execute("COMMIT")
    db.close()


# -- measuring ---------------------------------------------------------------------------------
def timed(fn: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(layout: str, base: str, n: int, sync: str, batch: int, repeats: int,
            copy: str) -> dict[str, Any]:
    results: dict[str, list[tuple[float, float]]] = {"create": [], "fire": []}
    for _ in range(repeats):
        root = tempfile.mkdtemp(prefix="nj-layout-", dir=base)
        try:
            if layout == "files":
                create = functools.partial(files_create, root, n, sync, batch)
                fire = functools.partial(files_fire, root, n, sync, batch)
            else:
                copies = Copies(copy if layout == "shared+copy" else None)
                create = functools.partial(shared_create, root, n, sync, batch, copies)
                fire = functools.partial(shared_fire, root, n, sync, batch, copies)
            results["create"].append(timed(create))
            os.sync()  # the fire starts cold as to dirty pages
            results["fire"].append(timed(fire))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {}
    for phase, runs in results.items():
        rates = sorted(n / wall for wall, _ in runs)
        cpu_rates = sorted(n / cpu for _, cpu in runs if cpu > 0)
        out[phase] = {"per_s": statistics.median(rates), "min": rates[0], "max": rates[-1],
                      "cpu_per_s": statistics.median(cpu_rates) if cpu_rates else None}
    return out


def resident_memory(how: str, count: int) -> float:
    """RSS bytes per resident working copy holding one job, in a fresh process."""
    code = (
        "import psutil, gc;"
        "from nursery_jobs.bench._objects_floor import Copies, INSERT_JOB, job_row;"
        f"c = Copies({how!r}); p = psutil.Process(); gc.collect();"
        " before = p.memory_info().rss;"
        f"held = [c.open() for _ in range({count})];"
        "[h.execute(INSERT_JOB, job_row(i)) for i, h in enumerate(held)];"
        "gc.collect(); print((p.memory_info().rss - before) / len(held))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--dirs", default="/work/nj-layout-bench,/dev/shm")
    parser.add_argument("--layouts", default="files,shared,shared+copy")
    parser.add_argument("--copy", default="image", choices=("ddl", "image", "pool"))
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--files-max", type=int, default=10000,
                        help="the files layout runs only up to this many objects")
    parser.add_argument("--synchronous", default="NORMAL")
    parser.add_argument("--memory", type=int, default=0,
                        help="also measure RSS per resident working copy with N copies")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for base in args.dirs.split(","):
        os.makedirs(base, exist_ok=True)
        for n in (int(s) for s in args.sizes.split(",")):
            for layout in args.layouts.split(","):
                if layout == "files" and n > args.files_max:
                    continue
                res = measure(layout, base, n, args.synchronous, args.batch, args.repeats,
                              args.copy)
                row = {"dir": base, "objects": n, "layout": layout, "batch": args.batch,
                       "synchronous": args.synchronous,
                       "copy": args.copy if layout == "shared+copy" else None, **res}
                rows.append(row)
                if not args.json:
                    c, f = res["create"], res["fire"]
                    print(f"{base:24} {n:>7} {layout:12} create {c['per_s']:>9,.0f}/s"
                          f" ({c['min']:,.0f}-{c['max']:,.0f}, cpu {c['cpu_per_s']:,.0f}/s)"
                          f"  fire {f['per_s']:>9,.0f}/s ({f['min']:,.0f}-{f['max']:,.0f},"
                          f" cpu {f['cpu_per_s']:,.0f}/s)", flush=True)
    if args.memory:
        for how in ("ddl", "image", "pool"):
            per = resident_memory(how, args.memory)
            rows.append({"resident_bytes_per_copy": per, "copy": how})
            if not args.json:
                print(f"RSS per resident working copy ({how}): {per / 1024:,.1f} KiB")
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
