"""``nursery-jobs inspect postgresql://...``: a PostgreSQL engine's database, read-only.

``PgSource`` is a ``DataSource`` over one read-only, repeatable-read transaction (one
consistent snapshot; the server refuses any write in it). It creates nothing: no schema,
no host row, no lease. The object registry and alarms are copied into an in-memory
catalog with the files engine's shape, and each object's rows into an in-memory working
copy when it is asked about, so every count and record comes from the same readers as
for a data directory. Leases (owner host, epoch, lease_until) are shown beside them.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any, Literal

import attrs

from nursery_jobs._engines.postgres._copy import load_copy
from nursery_jobs._engines.postgres._schema import check_version
from nursery_jobs._errors import DataDirectoryError, StorageError
from nursery_jobs._ops._inspect import ObjectPage, ObjectRow, State, _ObjectReader


@attrs.frozen(kw_only=True)
class LeaseInfo:
    """Who holds an object: ``live`` while ``lease_until`` is in the future."""

    owner: str | None
    epoch: int
    lease_until: float | None
    live: bool


@attrs.frozen(kw_only=True)
class HostInfo:
    host_id: str
    started: float
    heartbeat: float
    leases: int


def is_postgres_address(text: str) -> bool:
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in ("postgresql", "postgres")


class PgSource(_ObjectReader):
    """A PostgreSQL engine's database, read in one read-only snapshot. Close it."""

    def __init__(self, dsn: str) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise StorageError(
                f"inspecting a PostgreSQL database needs its driver ({exc}):"
                " pip install 'nursery_jobs[postgres]'"
            ) from exc
        from nursery_jobs._engines.postgres._engine import _safe_label

        self._label = _safe_label(dsn)
        try:
            self._pg = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to PostgreSQL {self._label}: {exc}") from exc
        try:
            self._pg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._check_schema()
            self._catalog_db = self._load_catalog()
        except psycopg.Error as exc:
            self._pg.close()
            raise StorageError(f"cannot read PostgreSQL {self._label}: {exc}") from exc
        except BaseException:
            self._pg.close()
            raise

    def close(self) -> None:
        self._pg.close()
        self._catalog_db.close()

    def __enter__(self) -> PgSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def label(self) -> str:
        return self._label

    @property
    def live(self) -> bool:
        return False

    # -- reading ------------------------------------------------------------------------
    def _check_schema(self) -> None:
        exists = self._pg.execute("SELECT to_regclass('nj_schema') IS NOT NULL").fetchone()
        row = None
        if exists is not None and exists[0]:
            row = self._pg.execute("SELECT version, object_schema FROM nj_schema").fetchone()
        if row is None:
            raise DataDirectoryError(
                f"{self._label} is not a nursery_jobs database (no nj_schema row)")
        check_version(self._label, int(row[0]), int(row[1]))

    def _load_catalog(self) -> sqlite3.Connection:
        rows = self._pg.execute(
            "SELECT namespace, object_id, class_path, created_at, alarm_time, alarm_retry,"
            " owner, epoch, extract(epoch FROM lease_until), lease_until > now()"
            " FROM nj_objects"
        ).fetchall()
        self.leases: dict[tuple[str, str], LeaseInfo] = {}
        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE TABLE nj_objects (namespace TEXT, object_id TEXT, file TEXT,"
                     " class_path TEXT, created_at REAL, PRIMARY KEY (namespace, object_id))")
        conn.execute("CREATE TABLE nj_alarms (namespace TEXT, object_id TEXT, time REAL,"
                     " retry INTEGER, PRIMARY KEY (namespace, object_id))")
        for ns, oid, cp, created, alarm, retry, owner, epoch, until, live in rows:
            conn.execute("INSERT INTO nj_objects VALUES (?, ?, '', ?, ?)",
                         (ns, oid, cp, float(created)))
            if alarm is not None:
                conn.execute("INSERT INTO nj_alarms VALUES (?, ?, ?, ?)",
                             (ns, oid, float(alarm), int(retry)))
            self.leases[(ns, oid)] = LeaseInfo(
                owner=owner, epoch=int(epoch),
                lease_until=None if until is None else float(until), live=bool(live))
        self.hosts = [
            HostInfo(host_id=h, started=float(s), heartbeat=float(b), leases=int(n))
            for h, s, b, n in self._pg.execute(
                "SELECT h.host_id, extract(epoch FROM h.started),"
                " extract(epoch FROM h.heartbeat), count(o.owner) FROM nj_hosts h"
                " LEFT JOIN nj_objects o ON o.owner = h.host_id"
                " AND o.lease_until > now() GROUP BY h.host_id ORDER BY h.host_id"
            )
        ]
        return conn

    @contextlib.contextmanager
    def _catalog(self) -> Iterator[sqlite3.Connection]:
        yield self._catalog_db

    def _is_active(self, namespace: str, object_id: str) -> bool:
        lease = self.leases.get((namespace, object_id))
        return lease is not None and lease.live

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        if only == "active":
            page = self._page(namespace, search, "all", now, 0, -1)
            live = [r for r in page.objects if r.active]
            end = None if limit < 0 else offset + limit
            return ObjectPage(objects=live[offset:end], total=len(live), offset=offset,
                              limit=limit)
        return self._page(namespace, search, only, now, offset, limit)

    @contextlib.contextmanager
    def _object_db(
        self, row: ObjectRow
    ) -> Iterator[tuple[sqlite3.Connection | None, State, str | None]]:
        label = f"{row.namespace}/{row.id}"
        state: State = "active" if row.active else "evicted"
        stored: list[tuple[str, str]] = self._pg.execute(
            "SELECT tbl, data FROM nj_rows WHERE namespace = %s AND object_id = %s",
            (row.namespace, row.id),
        ).fetchall()
        try:
            conn = load_copy(label, stored)
        except (StorageError, ValueError, TypeError, sqlite3.Error) as exc:
            # Rows this code cannot load (hand-edited, another version): say so, go on.
            yield None, "damaged", f"{label}: stored rows cannot be read: {exc}"
            return
        try:
            yield conn, state, None
        finally:
            conn.close()


def lease_json(lease: LeaseInfo | None) -> dict[str, Any] | None:
    return None if lease is None else attrs.asdict(lease)


def hosts_json(source: PgSource) -> list[dict[str, Any]]:
    return [attrs.asdict(h) for h in source.hosts]

