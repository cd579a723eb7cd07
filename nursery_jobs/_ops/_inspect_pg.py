"""The operator faces on a PostgreSQL engine's database: what ``inspect``, ``serve`` and a
host's own dashboard read, and how an address is shown.

``PgReader`` is a ``DataSource`` over a connection inside one read-only, repeatable-read
transaction (``_ops.read_only``: one consistent snapshot; the server refuses any write in
it). It creates nothing — no schema, no host row, no lease. The registry, alarms and
leases are queried where they are (``nj_objects``); an object's rows are loaded into an
in-memory working copy when it is asked about, so every count and record comes from the
same readers as for a data directory. Its reads block:

- ``PgSource``: ``nursery-jobs inspect`` holds one snapshot for the whole report;
- ``PgDatabase`` (``nursery-jobs serve``: a connection of its own, no runtime) and
  ``PgRuntimeAccess`` (a host's ``open_runtime(dsn, http=...)``: the engine's pool) are
  the dashboard's ``SourceAccess``: a fresh snapshot per request, in a worker thread.

Every face shows the whole database (every host's objects), as PostgreSQL holds it: an
active object's commits reach it within the engine's ship interval (50 ms).

A row changed outside nursery_jobs (no JSON, a number field that holds none) is its
object's fault, as in a data directory: that object is shown ``damaged``, the row named
(``_stored_rows``, shared with the shared layout's readers), and every other object is
read and counted as before (``_counted``).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast
from urllib.parse import unquote

import attrs
import trio

from nursery_jobs._engines.postgres import _ops as pg_ops
from nursery_jobs._engines.postgres._schema import TABLES_BY_NAME, check_version, key_digest
from nursery_jobs._errors import DataDirectoryError, StorageError
from nursery_jobs._jobs._table import PAUSED_ALL, PAUSED_PREFIX
from nursery_jobs._ops._inspect import (
    AlarmSummary,
    DataSource,
    DeadLetterInfo,
    FoundLetter,
    JobTotals,
    LetterPage,
    ObjectCounts,
    ObjectPage,
    ObjectRow,
)
from nursery_jobs._ops._queries import STRIKES_KEY, _payload
from nursery_jobs._ops._readers import _ObjectReader, letter_page, totals_of
from nursery_jobs._ops._stored_rows import StoredRows

if TYPE_CHECKING:
    from nursery_jobs._engines.postgres._engine import PostgresEngine

Conn = Any  # psycopg.Connection[Any]: psycopg is an optional dependency
T = TypeVar("T")
Key = tuple[str, str]  # (namespace, object id)


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


# -- addresses ------------------------------------------------------------------------------
_QUERY_PASSWORD = re.compile(r"(^|[?&])(password=)[^&#]*", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def _split(dsn: str) -> tuple[str, str, str, str] | None:
    """(``scheme://``, user info, ``@`` + the rest up to the query, ``?query#...``) of a
    URI; None for a key=value string. The user info runs to the last ``@`` before the
    query: a password may hold an unescaped ``/`` or ``@`` (libpq would refuse it, but
    the message must not show it either)."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return None
    query = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
    at = rest.rfind("@", 0, query)
    if at == -1:
        return scheme + sep, "", rest[:query], rest[query:]
    return scheme + sep, rest[:at], rest[at:query], rest[query:]


def address_label(dsn: str) -> str:
    """``dsn`` as given, with its password (``user:password@`` or a ``password=``
    parameter) shown as ``***``: never rebuilt (``urlunsplit`` drops a slash of an
    unknown scheme's ``//``), never the password."""
    parts = _split(dsn)
    if parts is None:
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)  # (a key=value connection string)
    head, userinfo, middle, query = parts
    user, colon, _ = userinfo.partition(":")
    return (head + user + (":***" if colon else "") + middle
            + _QUERY_PASSWORD.sub(r"\1\2***", query))


def secrets_of(location: str) -> list[str]:
    """The password strings a location carries (as typed and percent-decoded), to
    mask wherever a message may quote them (libpq quotes a bad URI's tokens)."""
    parts = _split(location)
    if parts is None:
        found = [m.group(2).strip("'") for m in _KEYWORD_PASSWORD.finditer(location)]
    else:
        found = [parts[1].partition(":")[2]]
        for item in re.split(r"[?&#]", parts[3]):
            key, _, value = item.partition("=")
            if key.lower() == "password":
                found.append(value)
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


# -- reading ------------------------------------------------------------------------------
_ROW_SQL = (
    "SELECT namespace, object_id, class_path, created_at, alarm_time, alarm_retry, owner,"
    " epoch, extract(epoch FROM lease_until), coalesce(lease_until >= now(), false)"
    " FROM nj_objects"
)
# Byte order, as SQLite's catalog sorts: the same pages on every engine.
_ORDER = ' ORDER BY namespace COLLATE "C", object_id COLLATE "C"'


def _filters(
    namespace: str | None, search: str | None, only: str, now: float
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if namespace:
        clauses.append("namespace = %s")
        params.append(namespace)
    if search:
        clauses.append("strpos(object_id, %s) > 0")
        params.append(search)
    if only == "due":
        clauses.append("alarm_time <= %s")
        params.append(now)
    elif only == "active":
        clauses.append("lease_until >= now()")
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _rows_of(table: str, only: list[Key] | None) -> tuple[str, list[Any]]:
    """A FROM item ``r`` (namespace, object_id, key, data): the stored rows of ``table``
    of the objects ``only`` (None: of every object), and its parameters."""
    if only is None:
        return "(SELECT namespace, object_id, key, data FROM nj_rows WHERE tbl = %s) r", [
            table]
    # (OFFSET 0 fences the subquery: no clause of the query around it, whose casts fail
    # on a row changed outside nursery_jobs, is pushed below the join that keeps only
    # the objects asked for.)
    return ("(SELECT n.namespace, n.object_id, n.key, n.data FROM nj_rows n"
            " JOIN unnest(%s::bytea[]) AS k(okey) ON n.okey = k.okey WHERE n.tbl = %s"
            " OFFSET 0) r", [[key_digest(*key) for key in only], table])


class PgReader(StoredRows, _ObjectReader):
    """A ``DataSource`` over ``conn``, inside a snapshot its caller holds open
    (``_ops.read_only``). Blocks on every read: use it in a worker thread. Close it
    (its in-memory database; not the connection: its caller's)."""

    def __init__(self, conn: Conn, *, label: str, live: bool) -> None:
        self._pg = conn
        self._label = label
        self._live = live
        self._rows: dict[tuple[str, str], ObjectRow] = {}
        self.leases: dict[tuple[str, str], LeaseInfo] = {}
        self._flights: dict[str, list[Any]] | None = None

    @property
    def label(self) -> str:
        return self._label

    @property
    def live(self) -> bool:
        return self._live

    def check_schema(self) -> None:
        """Refuse a database that is not a nursery_jobs one, or one newer than this
        code. Creates nothing.

        Raises:
            DataDirectoryError: no ``nj_schema`` row.
            StorageError: a newer schema.
        """
        exists = self._pg.execute("SELECT to_regclass('nj_schema') IS NOT NULL").fetchone()
        row = None
        if exists is not None and exists[0]:
            row = self._pg.execute("SELECT version, object_schema FROM nj_schema").fetchone()
        if row is None:
            raise DataDirectoryError(
                f"{self._label} is not a nursery_jobs database (no nj_schema row)")
        check_version(self._label, int(row[0]), int(row[1]), reader=True)

    # -- the registry, alarms and leases ----------------------------------------------------
    def _row(self, found: tuple[Any, ...]) -> ObjectRow:
        ns, oid, class_path, created, alarm, retry, owner, epoch, until, live = found
        row = ObjectRow(
            namespace=ns, id=oid, file="", class_path=class_path, created_at=float(created),
            alarm=None if alarm is None else float(alarm), alarm_retry=int(retry or 0),
            active=bool(live),
        )
        self._rows[(ns, oid)] = row
        self.leases[(ns, oid)] = LeaseInfo(
            owner=owner, epoch=int(epoch), lease_until=None if until is None else float(until),
            live=bool(live))
        return row

    def namespaces(self) -> list[tuple[str, int]]:
        return [(str(ns), int(n)) for ns, n in self._pg.execute(
            'SELECT namespace, count(*) FROM nj_objects GROUP BY namespace'
            ' ORDER BY namespace COLLATE "C"')]

    def alarm_summary(self, now: float) -> AlarmSummary:
        objects, alarms, due, later = self._pg.execute(
            "SELECT count(*), count(alarm_time), count(*) FILTER (WHERE alarm_time <= %s),"
            " min(alarm_time) FILTER (WHERE alarm_time > %s) FROM nj_objects", (now, now),
        ).fetchone()
        return AlarmSummary(objects=int(objects), alarms=int(alarms), due=int(due),
                            next_alarm=None if later is None else float(later))

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        where, params = _filters(namespace, search, only, now)
        (total,) = self._pg.execute(f"SELECT count(*) FROM nj_objects{where}",
                                    params).fetchone()
        found = self._pg.execute(
            f"{_ROW_SQL}{where}{_ORDER} LIMIT %s OFFSET %s",
            [*params, None if limit < 0 else limit, offset],
        ).fetchall()
        return ObjectPage(objects=[self._row(r) for r in found], total=int(total),
                          offset=offset, limit=limit)

    def row(self, namespace: str, object_id: str) -> ObjectRow | None:
        known = self._rows.get((namespace, object_id))
        if known is not None:
            return known  # (read in this snapshot already)
        found = self._pg.execute(f"{_ROW_SQL} WHERE okey = %s",
                                 (key_digest(namespace, object_id),)).fetchone()
        return None if found is None else self._row(found)

    def lease(self, namespace: str, object_id: str) -> LeaseInfo | None:
        if (namespace, object_id) not in self.leases:
            self.row(namespace, object_id)
        return self.leases.get((namespace, object_id))

    def hosts(self) -> list[HostInfo]:
        return [
            HostInfo(host_id=h, started=float(s), heartbeat=float(b), leases=int(n))
            for h, s, b, n in self._pg.execute(
                "SELECT h.host_id, extract(epoch FROM h.started),"
                " extract(epoch FROM h.heartbeat), count(o.owner) FROM nj_hosts h"
                " LEFT JOIN nj_objects o ON o.owner = h.host_id"
                " AND o.lease_until >= now() GROUP BY h.host_id ORDER BY h.host_id"
            )
        ]

    # -- across every object (in SQL: no working copy per object) ----------------------------
    def object_counts(self, now: float, *, strikes: bool = True,
                      ) -> dict[tuple[str, str], ObjectCounts]:
        """Every object's counts, in SQL over ``nj_rows`` (running: marked in its row, or
        in its live holder's shipped flight list); crash strikes always (the server
        reads every row anyway, in its own process). An object with a row the SQL
        cannot read (changed outside nursery_jobs: no JSON, a time that is no number)
        is counted alone, through its working copy, as the SQLite readers count it
        (damaged, naming the row); every other object is still counted in SQL."""
        keys = [(str(ns), str(oid)) for ns, oid in self._pg.execute(
            "SELECT namespace, object_id FROM nj_objects" + _ORDER)]
        flights: set[tuple[str, str, str]] = set()
        for (flight,) in self._pg.execute(
            "SELECT h.flight FROM nj_hosts h WHERE EXISTS (SELECT 1 FROM nj_objects o"
            " WHERE o.owner = h.host_id AND o.lease_until >= now())"
        ):
            flights.update((str(ns), str(oid), str(token))
                           for ns, oid, token, _started in (flight or []) if token)
        return self._counted(now, keys, flights, whole=True)

    def _counted(self, now: float, keys: list[Key], flights: set[tuple[str, str, str]], *,
                 whole: bool = False) -> dict[Key, ObjectCounts]:
        """The counts of ``keys`` (``whole``: of every object) in SQL, in a savepoint;
        where a row of them does not cast (the savepoint undoes just that), the counts
        of each half of them, down to the one object whose rows fail, which is read
        whole. One damaged object among N costs about 2 log2(N) counts of shrinking
        halves, not a working copy per object."""
        psycopg = _driver()
        try:
            with self._pg.transaction():  # (a savepoint of the snapshot's transaction)
                return self._counts_in_sql(now, keys, None if whole else keys, flights)
        except psycopg.DataError:
            if len(keys) > 1:
                half = len(keys) // 2
                return {**self._counted(now, keys[:half], flights),
                        **self._counted(now, keys[half:], flights)}
        found: dict[Key, ObjectCounts] = {}
        for key in keys:  # (no more than one)
            row = self.row(*key)
            if row is not None:
                found[key] = self._counts(row, now, strikes=True)
        return found

    def _counts_in_sql(self, now: float, keys: list[Key], only: list[Key] | None,
                       flights: set[tuple[str, str, str]]) -> dict[Key, ObjectCounts]:
        """The counts of ``keys`` in SQL over the rows of the objects ``only`` (None:
        of every object, ``keys`` being every one).

        Raises:
            psycopg.DataError: a row of them that does not cast (the transaction is
                aborted: the caller's savepoint undoes it).
        """
        columns = TABLES_BY_NAME["nj_jobs"].columns
        at = {name: columns.index(name) for name in
              ("time", "running_since", "attempts", "crash_strikes")}
        found: dict[Key, dict[str, Any]] = {key: {} for key in keys}
        jobs, job_params = _rows_of("nj_jobs", only)
        running = {(str(ns), str(oid), str(job)) for ns, oid, job in self._pg.execute(
            f"SELECT namespace, object_id, key FROM {jobs}"
            " WHERE data::jsonb->>%s IS NOT NULL", [*job_params, at["running_since"]])}
        running.update(flights if only is None else
                       (f for f in flights if (f[0], f[1]) in found))
        # (jsonb -> float8 and -> int: a field that is no number — a string, null, out
        # of range — is refused, not read as one.)
        for ns, oid, count, due, later, failing, struck, attempts in self._pg.execute(
            "SELECT namespace, object_id, count(*),"
            " count(*) FILTER (WHERE t <= %s AND r IS NULL), min(t) FILTER (WHERE t > %s),"
            " count(*) FILTER (WHERE a > 0), count(*) FILTER (WHERE c > 0),"
            " coalesce(max(a), 0) FROM (SELECT namespace, object_id,"
            " (data::jsonb->%s)::float8 AS t, data::jsonb->>%s AS r,"
            " (data::jsonb->%s)::int AS a, (data::jsonb->%s)::int AS c"
            f" FROM {jobs}) j GROUP BY namespace, object_id",
            [now, now, at["time"], at["running_since"], at["attempts"], at["crash_strikes"],
             *job_params],
        ):
            found.setdefault((str(ns), str(oid)), {}).update(
                jobs=int(count), due_jobs=int(due), failing_jobs=int(failing),
                crash_strikes=int(struck), max_attempts=int(attempts),
                next_due=None if later is None else float(later))
        letters, letter_params = _rows_of("nj_dead_letters", only)
        for ns, oid, n in self._pg.execute(
            f"SELECT namespace, object_id, count(*) FROM {letters}"
            " GROUP BY namespace, object_id", letter_params,
        ):
            found.setdefault((str(ns), str(oid)), {})["dead_letters"] = int(n)
        meta, meta_params = _rows_of("nj_meta", only)
        for ns, oid, key, value in self._pg.execute(
            "SELECT namespace, object_id, key, CASE WHEN key = %s THEN"
            f" (data::jsonb->1)::int END FROM {meta} WHERE key IN (%s, %s) OR key LIKE %s",
            [STRIKES_KEY, *meta_params, PAUSED_ALL, STRIKES_KEY, PAUSED_PREFIX + "%"],
        ):
            entry = found.setdefault((str(ns), str(oid)), {})
            if key == PAUSED_ALL or key.startswith(PAUSED_PREFIX):
                owner = None if key == PAUSED_ALL else key[len(PAUSED_PREFIX):]
                entry["paused"] = (*entry.get("paused", ()), owner)
            else:
                entry["breaker_strikes"] = int(value or 0)
        for ns, oid, _job in running:
            entry = found.setdefault((ns, oid), {})
            entry["running_jobs"] = entry.get("running_jobs", 0) + 1
        if running:  # (a job running by its flight list is not due: it runs)
            marked = sorted(running)
            for ns, oid, n in self._pg.execute(
                f"SELECT r.namespace, r.object_id, count(*) FROM {jobs} JOIN"
                " unnest(%s::text[], %s::text[], %s::text[]) AS f(ns, oid, k)"
                " ON r.namespace = f.ns AND r.object_id = f.oid AND r.key = f.k"
                " WHERE (r.data::jsonb->%s)::float8 <= %s"
                " AND r.data::jsonb->>%s IS NULL GROUP BY r.namespace, r.object_id",
                [*job_params, [k[0] for k in marked], [k[1] for k in marked],
                 [k[2] for k in marked], at["time"], now, at["running_since"]],
            ):
                found[(str(ns), str(oid))]["due_jobs"] -= int(n)
        return {key: ObjectCounts(**entry) for key, entry in found.items()}

    def job_totals(self, now: float) -> JobTotals:
        """Dead letters, due and running jobs and paused objects of every object, by
        namespace."""
        return totals_of(self.object_counts(now))

    def all_dead_letters(
        self, *, search: str | None = None, offset: int = 0, limit: int = 50,
        counts: dict[tuple[str, str], ObjectCounts] | None = None,
    ) -> LetterPage:
        """The dead letters of every object, newest first, those matching ``search``."""
        columns = TABLES_BY_NAME["nj_dead_letters"].columns
        found = []
        for ns, oid, data in self._pg.execute(
            "SELECT namespace, object_id, data FROM nj_rows WHERE tbl = 'nj_dead_letters'"
        ):
            try:
                values = dict(zip(columns, json.loads(data), strict=False))
                record = _payload(values["job"])
                fn, payload = "?", None
                if isinstance(record, dict):
                    fn = str(record.get("fn", "?"))
                    payload = _payload(record.get("payload"))
                letter = DeadLetterInfo(
                    owner=str(values["owner"]), id=str(values["id"]), fn=fn,
                    error=str(values["error"]), attempts=int(values["attempts"]),
                    reason=str(values["reason"]), time=float(values["time"]),
                    payload=payload)
            except (ValueError, TypeError, KeyError):
                continue  # (a row this code cannot read: the object's page says so)
            found.append(FoundLetter(namespace=str(ns), object_id=str(oid), letter=letter))
        return letter_page(found, search, offset, limit)

    # -- an object's rows --------------------------------------------------------------------
    def _stored_rows(self, row: ObjectRow) -> list[tuple[str, str, str]]:
        return self._pg.execute(  # type: ignore[no-any-return]
            "SELECT tbl, key, data FROM nj_rows WHERE okey = %s",
            (key_digest(row.namespace, row.id),),
        ).fetchall()

    def _running_id(self, row: ObjectRow) -> str | None:
        """The job the holder's last shipped flight list shows running (shipped every
        ≤ 20 ms while it changes)."""
        lease = self.leases.get((row.namespace, row.id))
        if lease is None or not lease.live or lease.owner is None:
            return None
        if self._flights is None:
            self._flights = {str(h): list(f or []) for h, f in self._pg.execute(
                "SELECT host_id, flight FROM nj_hosts")}
        for entry in self._flights.get(lease.owner, []):
            ns, oid, token, _started = entry
            if token and (ns, oid) == (row.namespace, row.id):
                return str(token)
        return None

    def _running_started(self, row: ObjectRow) -> float | None:
        if self._running_id(row) is None or self._flights is None:
            return None
        lease = self.leases[(row.namespace, row.id)]
        for ns, oid, token, started in self._flights.get(str(lease.owner), []):
            if token and (ns, oid) == (row.namespace, row.id):
                return float(started)
        return None


def _driver() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise StorageError(
            f"reading a PostgreSQL database needs its driver ({exc}):"
            " pip install 'nursery_jobs[postgres]'"
        ) from exc
    return psycopg


def connect_driver(dsn: str, label: str) -> tuple[Any, Conn]:
    """psycopg, and an autocommit connection to ``dsn``.

    Raises:
        StorageError: no driver (the postgres extra), or the server cannot be reached.
    """
    psycopg = _driver()
    try:
        return psycopg, psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StorageError(f"cannot connect to PostgreSQL {label}: {exc}") from exc


class PgSource(PgReader):
    """``nursery-jobs inspect``: one read-only snapshot for a whole report. Close it."""

    def __init__(self, dsn: str) -> None:
        label = address_label(dsn)
        psycopg, conn = connect_driver(dsn, label)
        super().__init__(conn, label=label, live=False)
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self.check_schema()
        except psycopg.Error as exc:
            conn.close()
            raise StorageError(f"cannot read PostgreSQL {label}: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        super().close()
        self._pg.close()

    def __enter__(self) -> PgSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PgDatabase:
    """``nursery-jobs serve``'s ``SourceAccess``: a fresh snapshot per request on one
    connection of its own (reconnected when it breaks), read in a worker thread, one
    request at a time. No runtime, no host row, no lease. Close it.

    Raises (on construction):
        StorageError: PostgreSQL cannot be reached, or its schema is newer.
        DataDirectoryError: the database is not a nursery_jobs one.
    """

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._label = address_label(dsn)
        self._limiter = trio.CapacityLimiter(1)
        self._conn: Conn | None = None
        try:
            self._snapshot(lambda source: source.check_schema())  # fail fast, typed
        except BaseException:
            self.close()
            raise

    @property
    def label(self) -> str:
        return self._label

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def read(self, fn: Callable[[DataSource], T]) -> T:
        """``fn(source)`` in a fresh snapshot, in a worker thread. Checkpoints.

        Raises:
            StorageError: PostgreSQL could not be read.
        """
        return await trio.to_thread.run_sync(self._snapshot, fn, limiter=self._limiter)

    def _snapshot(self, fn: Callable[[PgReader], T]) -> T:
        psycopg = _driver()
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            self._conn = connect_driver(self._dsn, self._label)[1]
        try:
            return pg_ops.read_only(self._conn, partial(_read, fn, self._label, False))
        except psycopg.Error as exc:
            raise StorageError(f"cannot read PostgreSQL {self._label}: {exc}") from exc


class PgRuntimeAccess:
    """A host's ``SourceAccess`` (``open_runtime(dsn, http=...)``): a fresh snapshot per
    request on a connection of the engine's pool, in a worker thread."""

    def __init__(self, engine: PostgresEngine) -> None:
        self._engine = engine
        self._label = address_label(engine.dsn)

    @property
    def label(self) -> str:
        return self._label

    async def read(self, fn: Callable[[DataSource], T]) -> T:
        """``fn(source)`` in a fresh snapshot, in a worker thread. Checkpoints.

        Raises:
            StorageError: PostgreSQL could not be read (or the runtime has closed).
        """
        return await self._engine.read(partial(_read, fn, self._label, True))


def _read(fn: Callable[[PgReader], T], label: str, live: bool, conn: Conn) -> T:
    """``fn`` of a ``PgReader`` on ``conn`` (in the snapshot open on it)."""
    reader = PgReader(conn, label=label, live=live)
    try:
        return fn(reader)
    finally:
        reader.close()


def postgres_engine(engine: object) -> PostgresEngine | None:
    """``engine`` if it is a ``PostgresEngine`` (without importing its driver when no
    runtime has)."""
    module = sys.modules.get("nursery_jobs._engines.postgres._engine")
    if module is None or not isinstance(engine, module.PostgresEngine):
        return None
    return cast("PostgresEngine", engine)


def lease_json(lease: LeaseInfo | None) -> dict[str, Any] | None:
    return None if lease is None else attrs.asdict(lease)


def hosts_json(source: PgReader) -> list[dict[str, Any]]:
    return [attrs.asdict(h) for h in source.hosts()]
