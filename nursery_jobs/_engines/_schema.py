"""The schema of an object's database, its version, and the migrations between versions.

Every engine gives an object a SQLite database with this schema (the PostgreSQL engine
as an in-memory working copy). The version is ``PRAGMA user_version``:

- 0 with no tables: a new database (created at the current version);
- 0 with tables: written by release 0.1 (Queue priority folded into the due time);
- 2: priority is a column of ``nj_jobs``;
- 3: ``nj_jobs`` has ``timeout``, ``give_up_on`` and ``trace`` (the pushing span's
  context); ``nj_attempts`` keeps the recent failed attempts of each job;
- 4: ``nj_dead_letters`` has ``seq``, the order of burial (letters buried at one time
  tie on ``time``; the oldest is the one the bound drops). Letters buried before have
  none (NULL): they keep their order by time, before every letter buried since.

A database with a newer version than this code knows is refused, never written.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Final

from nursery_jobs._codec import decode_payload
from nursery_jobs._errors import StorageError

SCHEMA_VERSION: Final = 4

_TABLES = """
CREATE TABLE IF NOT EXISTS nj_kv (key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nj_jobs (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    fn TEXT NOT NULL,
    time REAL NOT NULL,
    payload TEXT,
    max_attempts INTEGER NOT NULL,
    base_delay REAL NOT NULL,
    max_delay REAL NOT NULL,
    jitter INTEGER NOT NULL,
    singleflight INTEGER NOT NULL,
    hung_timeout REAL NOT NULL,
    exclusive INTEGER NOT NULL,
    recovery_loop INTEGER NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    running_since REAL,
    crash_strikes INTEGER NOT NULL DEFAULT 0,
    last_crash REAL,
    priority INTEGER NOT NULL DEFAULT 0,
    timeout REAL,
    give_up_on TEXT,
    trace TEXT
);
CREATE TABLE IF NOT EXISTS nj_dead_letters (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    job TEXT NOT NULL,
    error TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    reason TEXT NOT NULL,
    time REAL NOT NULL,
    seq INTEGER,
    PRIMARY KEY (owner, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nj_meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nj_attempts (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    started REAL NOT NULL,
    seconds REAL NOT NULL,
    error TEXT NOT NULL,
    PRIMARY KEY (owner, id, attempt)
) WITHOUT ROWID
"""
# Columns added to a table after it was first created (version: column definition), at
# the end of its columns.
_ADDED_COLUMNS: Final = {
    "nj_jobs": {
        "priority": "INTEGER NOT NULL DEFAULT 0",  # 2
        "timeout": "REAL",  # 3
        "give_up_on": "TEXT",  # 3
        "trace": "TEXT",  # 3
    },
    "nj_dead_letters": {"seq": "INTEGER"},  # 4
}

_INDEXES = """
CREATE INDEX IF NOT EXISTS nj_jobs_due ON nj_jobs (time);
CREATE INDEX IF NOT EXISTS nj_jobs_exclusive ON nj_jobs (time) WHERE exclusive = 1;
CREATE INDEX IF NOT EXISTS nj_jobs_running ON nj_jobs (running_since)
    WHERE running_since IS NOT NULL;
CREATE INDEX IF NOT EXISTS nj_jobs_priority ON nj_jobs (priority DESC, time, seq)
    WHERE priority != 0;
CREATE INDEX IF NOT EXISTS nj_dead_letters_time ON nj_dead_letters (time);
CREATE INDEX IF NOT EXISTS nj_dead_letters_burial ON nj_dead_letters (seq, time)
"""

# Release 0.1 folded a Queue item's priority into its due time:
# time = position - (priority + 1000) * 1e9, payload {"p": ..., "pr": priority, "pos": position}.
_V1_PRIORITY_SPAN: Final = 1e9
_V1_MAX_PRIORITY: Final = 1000


def prepare(conn: sqlite3.Connection, *, label: str) -> None:
    """Bring the database on ``conn`` to ``SCHEMA_VERSION`` (create or migrate in place).

    Raises:
        StorageError: the database was written by a newer version of nursery_jobs, or
            is not a database this code can read.
    """
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except StorageError:
        raise  # typed already (a GuardedConnection): locked, damaged, disk full...
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"cannot read the database of {label}: {exc}") from exc
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"the database of {label} has schema version {version}, newer than this"
            f" nursery_jobs knows ({SCHEMA_VERSION}): upgrade nursery_jobs; the file was"
            " not touched"
        )
    existing = {
        row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    statements = f"{_TABLES}; {_INDEXES}; PRAGMA user_version = {SCHEMA_VERSION}"
    try:
        if "nj_jobs" in existing:
            conn.execute("BEGIN IMMEDIATE")  # the migration and the rest: all or nothing
            _add_columns(conn, existing)
            if version < 2:
                _migrate_priority_column(conn)
            for statement in statements.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("COMMIT")
        else:
            # One script, not a statement each: ``execute`` would keep each CREATE's
            # compiled program in the connection's statement cache for the object's
            # life (~34 KiB per resident object, measured), for statements that never
            # run again.
            conn.executescript(f"BEGIN IMMEDIATE; {statements}; COMMIT;")
    except BaseException:
        if conn.in_transaction:  # (a fault may have rolled it back already)
            conn.execute("ROLLBACK")
        raise


def _add_columns(conn: sqlite3.Connection, existing: set[str]) -> None:
    """Add the columns of later versions that the ``existing`` tables lack."""
    for table, added in _ADDED_COLUMNS.items():
        if table not in existing:
            continue  # (created whole below)
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for name, definition in added.items():
            if name not in columns:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")


def _migrate_priority_column(conn: sqlite3.Connection) -> None:
    """0.1 -> 2: Queue items' real due times back (the column is added before)."""
    rows = conn.execute("SELECT seq, time, payload FROM nj_jobs WHERE owner != 'host'").fetchall()
    for seq, time, payload in rows:
        try:
            envelope = decode_payload(payload)
        except Exception:
            continue
        if not (isinstance(envelope, dict) and {"p", "pr", "pos"} <= envelope.keys()):
            continue
        priority, position = envelope["pr"], envelope["pos"]
        if not (isinstance(priority, int) and isinstance(position, (int, float))):
            continue
        encoded = position - (priority + _V1_MAX_PRIORITY) * _V1_PRIORITY_SPAN
        if not math.isclose(encoded, time, abs_tol=1e-3):
            continue
        conn.execute(
            "UPDATE nj_jobs SET time = ?, priority = ? WHERE seq = ?",
            (float(position), priority, seq),
        )
