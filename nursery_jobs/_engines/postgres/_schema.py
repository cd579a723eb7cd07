"""The PostgreSQL engine's schema (created and versioned by the engine) and the generic
row form in which an object's working copy is stored.

Tables: ``nj_schema`` (one row: this schema's version and the object schema's), ``nj_hosts``
(one row per running host: heartbeat and flight list), ``nj_namespaces`` (class paths),
``nj_objects`` (registry, alarm index, lease: owner, epoch, lease_until; the stored
state's ``version``, bumped by every ship), ``nj_rows`` (every
row of every object's working copy, as JSON), ``nj_crashes`` (crash tokens) and ``nj_calls``
(calls forwarded between hosts).
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from nursery_jobs._engines._schema import SCHEMA_VERSION as OBJECT_SCHEMA_VERSION
from nursery_jobs._errors import StorageError

# 2: nj_objects.version (issue 22 #1), added in place to a version 1 database.
# 3: nj_calls.take_id (which take of the target host holds a running call: _calls),
# added in place to an older database.
PG_SCHEMA_VERSION: Final = 3

_DDL: Final = """
CREATE TABLE IF NOT EXISTS nj_schema (
    id int PRIMARY KEY CHECK (id = 1),
    version int NOT NULL,
    object_schema int NOT NULL
);
CREATE TABLE IF NOT EXISTS nj_hosts (
    host_id text PRIMARY KEY,
    started timestamptz NOT NULL DEFAULT now(),
    heartbeat timestamptz NOT NULL DEFAULT now(),
    flight jsonb NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS nj_namespaces (
    namespace text PRIMARY KEY,
    class_path text NOT NULL
);
CREATE TABLE IF NOT EXISTS nj_objects (
    namespace text NOT NULL,
    object_id text NOT NULL,
    class_path text NOT NULL,
    created_at float8 NOT NULL,
    alarm_time float8,
    alarm_retry int NOT NULL DEFAULT 0,
    owner text,
    epoch bigint NOT NULL DEFAULT 0,
    lease_until timestamptz,
    version bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, object_id)
);
ALTER TABLE nj_objects ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS nj_objects_alarm ON nj_objects (alarm_time)
    WHERE alarm_time IS NOT NULL;
CREATE INDEX IF NOT EXISTS nj_objects_owner ON nj_objects (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS nj_rows (
    namespace text NOT NULL,
    object_id text NOT NULL,
    tbl text NOT NULL,
    key text NOT NULL,
    data text NOT NULL,
    PRIMARY KEY (namespace, object_id, tbl, key)
);
CREATE TABLE IF NOT EXISTS nj_crashes (
    namespace text NOT NULL,
    object_id text NOT NULL,
    token text NOT NULL,
    started float8 NOT NULL,
    PRIMARY KEY (namespace, object_id, token)
);
CREATE TABLE IF NOT EXISTS nj_calls (
    id bigserial PRIMARY KEY,
    target text NOT NULL,
    caller text NOT NULL,
    namespace text NOT NULL,
    object_id text NOT NULL,
    class_path text NOT NULL,
    name text NOT NULL,
    payload text,
    state text NOT NULL DEFAULT 'pending',
    result text,
    created timestamptz NOT NULL DEFAULT now(),
    take_id bigint
);
ALTER TABLE nj_calls ADD COLUMN IF NOT EXISTS take_id bigint;
CREATE INDEX IF NOT EXISTS nj_calls_target ON nj_calls (target) WHERE state = 'pending'
"""

# Serialises schema creation between hosts starting at once.
_SCHEMA_LOCK: Final = 0x6E6A5F7363686D61  # "nj_schma"


def check_version(label: str, version: int, object_schema: int) -> None:
    """Refuse a schema newer than this code knows.

    Raises:
        StorageError: naming ``label`` and both versions.
    """
    if version > PG_SCHEMA_VERSION or object_schema > OBJECT_SCHEMA_VERSION:
        raise StorageError(
            f"{label} has nursery_jobs schema version {version} (objects {object_schema}),"
            f" newer than this nursery_jobs knows ({PG_SCHEMA_VERSION}, objects"
            f" {OBJECT_SCHEMA_VERSION}): upgrade nursery_jobs; nothing was written"
        )


def ensure_schema(conn: Any, label: str) -> None:
    """Create the schema on a new database, or check the version of an existing one.

    Raises:
        StorageError: the database holds a schema newer than this code knows (it is not
            touched).
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        exists = conn.execute("SELECT to_regclass('nj_schema') IS NOT NULL").fetchone()[0]
        if exists:
            row = conn.execute("SELECT version, object_schema FROM nj_schema").fetchone()
            if row is not None:
                version, object_schema = int(row[0]), int(row[1])
                check_version(f"the PostgreSQL database {label}", version, object_schema)
                if (version, object_schema) == (PG_SCHEMA_VERSION, OBJECT_SCHEMA_VERSION):
                    return
                # Older: the DDL below is idempotent, and the row records the versions
                # written from now on (rows of an older object schema load padded,
                # ``_copy.load_rows``), so an older nursery_jobs refuses the database.
        for statement in _DDL.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(
            "INSERT INTO nj_schema (id, version, object_schema) VALUES (1, %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET version = excluded.version,"
            " object_schema = excluded.object_schema",
            (PG_SCHEMA_VERSION, OBJECT_SCHEMA_VERSION),
        )


@attrs.frozen
class RowTable:
    """How the rows of one working-copy table are stored in ``nj_rows``: a key (its
    unique ``key_columns``; several as a JSON array) and the row as a JSON array of
    ``columns``."""

    name: str
    key_columns: tuple[str, ...]
    columns: tuple[str, ...]

    def key_of(self, prefix: str = "") -> str:
        """The key as a SQL expression (of ``NEW.``/``OLD.`` columns with a prefix)."""
        cols = [prefix + c for c in self.key_columns]
        return cols[0] if len(cols) == 1 else f"json_array({', '.join(cols)})"

    @property
    def key(self) -> str:
        return self.key_of()

    @property
    def select(self) -> str:
        return f"SELECT {self.key}, {', '.join(self.columns)} FROM {self.name}"

    @property
    def insert(self) -> str:
        marks = ", ".join("?" for _ in self.columns)
        return f"INSERT INTO {self.name} ({', '.join(self.columns)}) VALUES ({marks})"


ROW_TABLES: Final = (
    RowTable("nj_kv", ("key",), ("key", "value")),
    RowTable("nj_jobs", ("id",), (
        "seq", "id", "owner", "fn", "time", "payload", "max_attempts", "base_delay",
        "max_delay", "jitter", "singleflight", "hung_timeout", "exclusive", "recovery_loop",
        "created_at", "attempts", "running_since", "crash_strikes", "last_crash", "priority",
        "timeout", "give_up_on", "trace",
    )),
    RowTable("nj_dead_letters", ("owner", "id"),
             ("owner", "id", "job", "error", "attempts", "reason", "time", "seq")),
    RowTable("nj_meta", ("key",), ("key", "value")),
    RowTable("nj_attempts", ("owner", "id", "attempt"),
             ("owner", "id", "attempt", "started", "seconds", "error")),
)
TABLES_BY_NAME: Final = {table.name: table for table in ROW_TABLES}


def capture_sql(table: RowTable) -> list[str]:
    """TEMP triggers handing the key of every row a write changes to the copy's
    ``nj_capture(tbl, key)`` (``_copy.Captured``: a set in Python). A rolled-back write's
    key stays captured: a ship writes each captured key's current row, or its absence, so
    a superset of the changed keys ships the same state. (They inserted into a TEMP
    table, read back and emptied by every ship: a push and its snapshot 23.6 -> 15.4 us
    in a loop of their own, and three statements fewer a ship, measured.)"""
    new_key, old_key = table.key_of("NEW."), table.key_of("OLD.")
    name = table.name
    record = "SELECT nj_capture('{t}', {k}){where};"
    return [
        f"CREATE TEMP TRIGGER {name}_ins AFTER INSERT ON main.{name} BEGIN"
        f" {record.format(t=name, k=new_key, where='')} END",
        f"CREATE TEMP TRIGGER {name}_upd AFTER UPDATE ON main.{name} BEGIN"
        f" {record.format(t=name, k=old_key, where='')}"
        f" {record.format(t=name, k=new_key, where=f' WHERE {new_key} IS NOT {old_key}')}"
        " END",
        f"CREATE TEMP TRIGGER {name}_del AFTER DELETE ON main.{name} BEGIN"
        f" {record.format(t=name, k=old_key, where='')} END",
    ]
