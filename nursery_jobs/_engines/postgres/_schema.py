"""The PostgreSQL engine's schema (created and versioned by the engine) and the generic
row form in which an object's working copy is stored.

Tables: ``nj_schema`` (one row: this schema's version and the object schema's), ``nj_hosts``
(one row per running host: heartbeat and flight list), ``nj_namespaces`` (class paths),
``nj_objects`` (registry, alarm index, lease: owner, epoch, lease_until; the stored
state's ``version``, bumped by every ship), ``nj_rows`` (every
row of every object's working copy, as JSON), ``nj_crashes`` (crash tokens) and ``nj_calls``
(calls forwarded between hosts).

An object's rows are keyed by ``okey``, a digest of its namespace and id, and a row of
``nj_rows`` by ``rkey``, one of its table and key (``nj_key``, the SQL function, and
``key_digest``, its twin here): stored columns generated from the texts, which stay in
plain columns. A btree index entry holds at most 2,704 bytes, and an id of 1,024
characters is up to 4,096 bytes of UTF-8 (DESIGN §2: any id up to 1,024 characters, on
every engine); a digest is 32. Every lookup of an object or a row goes through them.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import attrs

from nursery_jobs._engines._schema import SCHEMA_VERSION as OBJECT_SCHEMA_VERSION
from nursery_jobs._errors import StorageError

# 2: nj_objects.version (issue 22 #1), added in place to a version 1 database.
# 3: nj_calls.take_id (which take of the target host holds a running call: _calls),
# added in place to an older database.
# 4: nj_objects, nj_rows and nj_crashes keyed by digests (okey, rkey: the module's
# docstring), added in place to an older database (its primary keys swapped); readers of
# this version refuse an older one (a host of this version brings it up).
PG_SCHEMA_VERSION: Final = 4
KEYED_BY_DIGEST: Final = 4

# nj_key is declared IMMUTABLE (a generated column needs that) though convert_to is only
# STABLE: to UTF-8 from the database's encoding, which never changes for a database, its
# result depends on its arguments alone. (Not inlined, it costs ~4 µs a call: a stored
# row pays two; lookups pass key_digest's bytes instead.)
_DDL: Final = """
CREATE OR REPLACE FUNCTION nj_key(a text, b text) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT sha256(int4send(octet_length(convert_to(a, 'UTF8')))
        || convert_to(a, 'UTF8') || convert_to(b, 'UTF8')) $$;
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
    okey bytea GENERATED ALWAYS AS (nj_key(namespace, object_id)) STORED,
    PRIMARY KEY (okey)
);
ALTER TABLE nj_objects ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0;
ALTER TABLE nj_objects ADD COLUMN IF NOT EXISTS
    okey bytea GENERATED ALWAYS AS (nj_key(namespace, object_id)) STORED;
CREATE INDEX IF NOT EXISTS nj_objects_alarm ON nj_objects (alarm_time)
    WHERE alarm_time IS NOT NULL;
CREATE INDEX IF NOT EXISTS nj_objects_owner ON nj_objects (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS nj_rows (
    namespace text NOT NULL,
    object_id text NOT NULL,
    tbl text NOT NULL,
    key text NOT NULL,
    data text NOT NULL,
    okey bytea GENERATED ALWAYS AS (nj_key(namespace, object_id)) STORED,
    rkey bytea GENERATED ALWAYS AS (nj_key(tbl, key)) STORED,
    PRIMARY KEY (okey, rkey)
);
ALTER TABLE nj_rows ADD COLUMN IF NOT EXISTS
    okey bytea GENERATED ALWAYS AS (nj_key(namespace, object_id)) STORED;
ALTER TABLE nj_rows ADD COLUMN IF NOT EXISTS
    rkey bytea GENERATED ALWAYS AS (nj_key(tbl, key)) STORED;
CREATE TABLE IF NOT EXISTS nj_crashes (
    namespace text NOT NULL,
    object_id text NOT NULL,
    token text NOT NULL,
    started float8 NOT NULL,
    okey bytea GENERATED ALWAYS AS (nj_key(namespace, object_id)) STORED,
    PRIMARY KEY (okey, token)
);
ALTER TABLE nj_crashes ADD COLUMN IF NOT EXISTS
    okey bytea GENERATED ALWAYS AS (nj_key(namespace, object_id)) STORED;
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
# The primary keys of schema version 4 (a database made before it has them swapped in).
_DIGEST_KEYS: Final = (("nj_objects", ("okey",)), ("nj_rows", ("okey", "rkey")),
                       ("nj_crashes", ("okey", "token")))
# What the check at open compares with the server's ``nj_key``: a text past ASCII.
_KEY_SAMPLE: Final = ("ns.Ä", "漢字 id")


def key_digest(first: str, second: str) -> bytes:
    """``nj_key(first, second)`` as the server computes it: SHA-256 of the first text's
    length in bytes (4, big-endian), then both texts, in UTF-8. The length makes it
    one-to-one: ("ab", "c") and ("a", "bc") differ. Keys an object by (namespace, id),
    a stored row by (table, key). Does not block."""
    head = first.encode("utf-8")
    return hashlib.sha256(len(head).to_bytes(4, "big") + head + second.encode("utf-8")).digest()


def check_version(label: str, version: int, object_schema: int, *,
                  reader: bool = False) -> None:
    """Refuse a schema newer than this code knows; a ``reader`` (the operator faces,
    which never change the schema) also one older than ``KEYED_BY_DIGEST``, whose rows
    it cannot look up.

    Raises:
        StorageError: naming ``label`` and both versions.
    """
    if version > PG_SCHEMA_VERSION or object_schema > OBJECT_SCHEMA_VERSION:
        raise StorageError(
            f"{label} has nursery_jobs schema version {version} (objects {object_schema}),"
            f" newer than this nursery_jobs knows ({PG_SCHEMA_VERSION}, objects"
            f" {OBJECT_SCHEMA_VERSION}): upgrade nursery_jobs; nothing was written"
        )
    if reader and version < KEYED_BY_DIGEST:
        raise StorageError(
            f"{label} has nursery_jobs schema version {version}, older than this"
            f" nursery_jobs reads ({PG_SCHEMA_VERSION}): start a runtime of this version"
            " on it once (it brings the schema up in place); nothing was read or written"
        )


def ensure_schema(conn: Any, label: str) -> None:
    """Create the schema on a new database, check the version of an existing one, and
    bring an older one up in place (in one transaction: all of it or nothing).

    Raises:
        StorageError: the database holds a schema newer than this code knows (it is not
            touched), or its server computes ``nj_key`` otherwise than ``key_digest``.
    """
    _ensure_tables(conn, label)
    sample = conn.execute("SELECT nj_key(%s, %s)", _KEY_SAMPLE).fetchone()[0]
    if bytes(sample) != key_digest(*_KEY_SAMPLE):
        raise StorageError(
            f"the PostgreSQL database {label} computes the keys of objects (nj_key)"
            " otherwise than this nursery_jobs: is it a UTF8 database? nothing was written")


def _ensure_tables(conn: Any, label: str) -> None:
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
        for table, columns in _DIGEST_KEYS:
            _key_by(conn, table, columns)
        conn.execute(
            "INSERT INTO nj_schema (id, version, object_schema) VALUES (1, %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET version = excluded.version,"
            " object_schema = excluded.object_schema",
            (PG_SCHEMA_VERSION, OBJECT_SCHEMA_VERSION),
        )


def _key_by(conn: Any, table: str, columns: tuple[str, ...]) -> None:
    """Make ``columns`` the primary key of ``table`` if it is not (a database made
    before version 4, keyed by its texts): its old key is dropped, the new one built."""
    found = conn.execute(
        "SELECT c.conname, array_agg(a.attname::text ORDER BY k.n) FROM pg_constraint c"
        " CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)"
        " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum"
        " WHERE c.conrelid = %s::regclass AND c.contype = 'p' GROUP BY c.conname",
        (table,),
    ).fetchone()
    if found is not None and tuple(found[1]) == columns:
        return
    drop = "" if found is None else f'DROP CONSTRAINT "{found[0]}", '
    conn.execute(f"ALTER TABLE {table} {drop}ADD CONSTRAINT {table}_pkey"
                 f" PRIMARY KEY ({', '.join(columns)})")


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
