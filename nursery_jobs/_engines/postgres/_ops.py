"""The PostgreSQL engine's statements, as blocking functions of a psycopg connection
(autocommit) that the engine runs in worker threads. One function, one round trip or
one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs

from nursery_jobs._engines.postgres._copy import (
    FENCED,
    SHIPPED,
    STALE,
    Change,
    load_copy,
    take_captured,
)
from nursery_jobs._engines.postgres._schema import key_digest

Key = tuple[str, str]
Conn = Any  # psycopg.Connection[Any]: psycopg is an optional dependency
T = TypeVar("T")


@attrs.frozen
class Taken:
    """The lease of an object this host just took, and the object's stored state."""

    epoch: int
    version: int  # of the stored state read: the base of this host's first ship
    alarm: tuple[float, int] | None
    rows: list[tuple[str, str]]
    tokens: list[tuple[str, float]]


@attrs.frozen
class Claimed:
    namespace: str
    object_id: str
    epoch: int
    alarm: tuple[float, int]
    class_path: str


def _inherit_crashes(conn: Conn, taken: list[tuple[str, str, str]]) -> None:
    """Objects taken over from a host whose lease expired: the work its last shipped
    flight list shows running on them becomes their crash tokens."""
    owners = {owner for _, _, owner in taken}
    flights = dict(conn.execute(
        "SELECT host_id, flight FROM nj_hosts WHERE host_id = ANY(%s)", (list(owners),)
    ).fetchall())
    wanted = {(ns, oid, owner) for ns, oid, owner in taken}
    tokens = []
    for owner in owners:
        for entry in flights.get(owner) or []:
            ns, oid, token, started = entry
            if token and (ns, oid, owner) in wanted:
                tokens.append((ns, oid, token, float(started)))
    if tokens:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO nj_crashes (namespace, object_id, token, started)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING", tokens,
            )


def take(
    conn: Conn, me: str, ttl: float, namespace: str, object_id: str, class_path: str,
    now: float, create: bool = True,
) -> Taken | str | None:
    """Register the object, take its lease (epoch + 1) if it is free, expired or ours,
    and read its state; or return the live owner's host id. ``create=False``: an
    object that is not registered is not (None, nothing written).

    Pipelined: the registration and the lease check travel in one round trip, the
    lease and the state reads in another (8 round trips before: ~5 ms of a ~10 ms
    activation here)."""
    with conn.pipeline(), conn.transaction():
        if create:
            conn.execute(
                "INSERT INTO nj_namespaces (namespace, class_path) VALUES (%s, %s)"
                " ON CONFLICT (namespace) DO UPDATE SET class_path = excluded.class_path"
                " WHERE nj_namespaces.class_path <> excluded.class_path",
                (namespace, class_path),
            )
            conn.execute(
                "INSERT INTO nj_objects (namespace, object_id, class_path, created_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (namespace, object_id, class_path, now),
            )
        okey = key_digest(namespace, object_id)
        found = conn.execute(
            "SELECT owner, lease_until IS NULL OR lease_until < now() FROM nj_objects"
            " WHERE okey = %s FOR UPDATE", (okey,),
        ).fetchone()
        if found is None:
            return None
        owner, free = found
        if owner is not None and owner != me:
            if not free:
                return str(owner)
            _inherit_crashes(conn, [(namespace, object_id, owner)])
        leased = conn.execute(
            "UPDATE nj_objects SET owner = %s, epoch = epoch + 1,"
            " lease_until = now() + make_interval(secs => %s)"
            " WHERE okey = %s RETURNING epoch, alarm_time, alarm_retry, version",
            (me, ttl, okey),
        )
        stored = conn.execute("SELECT tbl, data FROM nj_rows WHERE okey = %s", (okey,))
        crashes = conn.execute("SELECT token, started FROM nj_crashes WHERE okey = %s",
                               (okey,))
        epoch, alarm_time, alarm_retry, version = leased.fetchone()
        rows = stored.fetchall()
        tokens = crashes.fetchall()
    alarm = None if alarm_time is None else (float(alarm_time), int(alarm_retry))
    return Taken(epoch=int(epoch), version=int(version), alarm=alarm, rows=rows,
                 tokens=[(str(t), float(s)) for t, s in tokens])


# The fence: the lease (owner, epoch) and the base (version) the change was made on.
# ``deleted`` finds each deleted key by its own search of the primary key (the LATERAL
# subquery, kept from being flattened into a join by OFFSET 0) and deletes the rows it
# found by their ctid. Written as a join of nj_rows to the keys' array, it let the
# planner read every row of the object per ship (or per deleted key, in the generic
# plan of a prepared statement) whenever statistics did not know the object was deep:
# a table not analyzed yet, one deep object among small ones; 89 ms a ship at 5,000
# rows, dispatch of one object 20,000 deep at ~580 jobs/s (tests/test_postgres_ship_plans.py).
# (Only the lease holder writes an object's rows, so no other transaction moves a row
# between the search and the delete.)
# Each array is read through a sub-select (``(SELECT %(dt)b::text[])``): a custom plan
# then cannot see the arrays' lengths either, so the generic plan is no dearer and the
# server settles on it after five executions. Seeing them, it judged the generic plan
# dearer and re-planned every execution under plan_cache_mode = auto: ~180 µs of a lone
# ship's server CPU (~370 -> ~150-200 µs a ship, measured; test_postgres_ship_plans).
# The last SELECT reads the snapshot from before the fence's UPDATE: where the fence
# refused, it tells a lost lease (no row of this host at this epoch) from a lost base
# (the lease holds, but the stored version is not the one this host built on).
_SHIP = """
WITH fence AS (
    UPDATE nj_objects SET
        alarm_time = CASE WHEN %(set_alarm)s THEN %(time)s ELSE alarm_time END,
        alarm_retry = CASE WHEN %(set_alarm)s THEN %(retry)s ELSE alarm_retry END,
        lease_until = greatest(lease_until, now() + make_interval(secs => %(ttl)s)),
        version = version + 1
    WHERE okey = %(okey)s AND owner = %(me)s AND epoch = %(epoch)s
        AND version BETWEEN %(version)s AND %(version)s + %(unsure)s
    RETURNING version
), deleted AS (
    DELETE FROM nj_rows WHERE EXISTS (SELECT FROM fence) AND ctid = ANY (ARRAY(
        SELECT r.ctid FROM unnest((SELECT %(dr)b::bytea[])) AS d(rkey)
        CROSS JOIN LATERAL (SELECT ctid FROM nj_rows WHERE okey = %(okey)s
            AND rkey = d.rkey OFFSET 0) AS r))
), upserted AS (
    INSERT INTO nj_rows (namespace, object_id, tbl, key, data)
    SELECT %(ns)s, %(oid)s, u.tbl, u.key, u.data
    FROM unnest((SELECT %(ut)b::text[]), (SELECT %(uk)b::text[]), (SELECT %(ud)b::text[]))
        AS u(tbl, key, data)
    WHERE EXISTS (SELECT FROM fence)
    ON CONFLICT (okey, rkey) DO UPDATE SET data = excluded.data
), crashes AS (
    DELETE FROM nj_crashes WHERE %(clear)s AND EXISTS (SELECT FROM fence)
        AND okey = %(okey)s
)
SELECT (SELECT version FROM fence), (SELECT version FROM nj_objects
    WHERE okey = %(okey)s AND owner = %(me)s AND epoch = %(epoch)s)
"""


def ship(conn: Conn, me: str, ttl: float, change: Change) -> str:
    """Write one commit of a working copy if this host still holds the object's lease
    at ``change.epoch`` and the stored state is ``change.version`` (one statement, one
    transaction; the stored version moves on by one, ``change.shipped_version``); return SHIPPED,
    FENCED (the lease is gone: another host holds the object, or may) or STALE (the
    lease holds but the stored state is not the version the change was made on:
    PostgreSQL lost its last commits — a server crash under ``synchronous_commit = off``).
    A base up to ``change.unsure`` versions newer is accepted: the ships before this one
    whose outcome their caller never learned (cancelled, answer lost), each ended before
    this one started, and this one carries again every row they carried.)"""
    alarm = change.alarm
    params = {
        "set_alarm": alarm is not None,
        "time": None if alarm is None else alarm[0],
        "retry": 0 if alarm is None else alarm[1],
        "ttl": ttl, "ns": change.namespace, "oid": change.object_id, "me": me,
        "okey": key_digest(change.namespace, change.object_id),
        "epoch": change.epoch, "version": change.version, "unsure": change.unsure,
        "dr": [key_digest(t, k) for t, k in change.deletes],
        "ut": [t for t, _, _ in change.upserts], "uk": [k for _, k, _ in change.upserts],
        "ud": [d for _, _, d in change.upserts], "clear": change.clear_crashes,
    }
    written, stored = conn.execute(_SHIP, params).fetchone()
    if written is not None:
        change.shipped_version = int(written)
        return SHIPPED
    return FENCED if stored is None else STALE


# Many objects' ships in one statement (group commit, issue 26): ``s`` numbers the
# changes; ``fence`` is ``_SHIP``'s fence for each of them at once (an object whose
# lease or base is gone is simply not in it); rows, alarms and crash tokens are written
# for the objects in ``fence`` only (deleted keys found one by one, as in ``_SHIP``).
# The last SELECT tells, per change, the version written, or (the snapshot from before
# the fence) a lost lease from a lost base.
_SHIP_MANY = """
WITH s AS (
    SELECT * FROM unnest(%(i)b::int[], %(ns)b::text[], %(oid)b::text[], %(okey)b::bytea[],
        %(epoch)b::bigint[], %(version)b::bigint[], %(unsure)b::bigint[],
        %(set_alarm)b::bool[], %(time)b::float8[], %(retry)b::int[], %(clear)b::bool[])
        AS s(i, ns, oid, okey, epoch, version, unsure, set_alarm, time, retry, clear)
), fence AS (
    UPDATE nj_objects o SET
        alarm_time = CASE WHEN s.set_alarm THEN s.time ELSE o.alarm_time END,
        alarm_retry = CASE WHEN s.set_alarm THEN s.retry ELSE o.alarm_retry END,
        lease_until = greatest(o.lease_until, now() + make_interval(secs => %(ttl)s)),
        version = o.version + 1
    FROM s
    WHERE o.okey = s.okey AND o.owner = %(me)s
        AND o.epoch = s.epoch AND o.version BETWEEN s.version AND s.version + s.unsure
    RETURNING s.i, s.ns, s.oid, s.okey, s.clear, o.version
), deleted AS (
    DELETE FROM nj_rows WHERE ctid = ANY (ARRAY(
        SELECT r.ctid FROM fence f
        JOIN unnest(%(di)b::int[], %(dr)b::bytea[]) AS d(i, rkey) ON d.i = f.i
        CROSS JOIN LATERAL (SELECT ctid FROM nj_rows WHERE okey = f.okey
            AND rkey = d.rkey OFFSET 0) AS r))
), upserted AS (
    INSERT INTO nj_rows (namespace, object_id, tbl, key, data)
    SELECT f.ns, f.oid, u.tbl, u.key, u.data
    FROM fence f JOIN unnest(%(ui)b::int[], %(ut)b::text[], %(uk)b::text[], %(ud)b::text[])
        AS u(i, tbl, key, data) ON u.i = f.i
    ON CONFLICT (okey, rkey) DO UPDATE SET data = excluded.data
), crashes AS (
    DELETE FROM nj_crashes c USING fence f WHERE f.clear AND c.okey = f.okey
)
SELECT s.i, f.version, o.version
FROM s LEFT JOIN fence f ON f.i = s.i
    LEFT JOIN nj_objects o ON o.okey = s.okey AND o.owner = %(me)s AND o.epoch = s.epoch
"""
# A batch that deadlocks with another of the host's own multi-row statements (a renewal,
# a release: their row order is the planner's) is retried this many times; the one
# PostgreSQL aborts has written nothing.
SHIP_MANY_DEADLOCK_RETRIES = 3
DEADLOCK = "40P01"  # SQLSTATE deadlock_detected


def ship_many(conn: Conn, me: str, ttl: float, changes: list[Change]) -> list[str]:
    """``ship`` for several objects at once (each at most once), in one statement and
    one transaction: each object's fence is checked as ``ship`` checks it, and refuses
    that object's change alone (FENCED or STALE for it; the others are written). Sets
    ``shipped_version`` of each change written; returns the outcomes in order."""
    params: dict[str, Any] = {
        "me": me, "ttl": ttl, "i": [], "ns": [], "oid": [], "okey": [], "epoch": [],
        "version": [], "unsure": [], "set_alarm": [], "time": [], "retry": [], "clear": [],
        "di": [], "dr": [], "ui": [], "ut": [], "uk": [], "ud": [],
    }
    # In key order: row locks taken in one order by every batch of every host.
    order = sorted(range(len(changes)),
                   key=lambda n: (changes[n].namespace, changes[n].object_id))
    for n in order:
        change = changes[n]
        alarm = change.alarm
        params["i"].append(n)
        params["ns"].append(change.namespace)
        params["oid"].append(change.object_id)
        params["okey"].append(key_digest(change.namespace, change.object_id))
        params["epoch"].append(change.epoch)
        params["version"].append(change.version)
        params["unsure"].append(change.unsure)
        params["set_alarm"].append(alarm is not None)
        params["time"].append(None if alarm is None else alarm[0])
        params["retry"].append(0 if alarm is None else alarm[1])
        params["clear"].append(change.clear_crashes)
        for tbl, key in change.deletes:
            params["di"].append(n)
            params["dr"].append(key_digest(tbl, key))
        for tbl, key, data in change.upserts:
            params["ui"].append(n)
            params["ut"].append(tbl)
            params["uk"].append(key)
            params["ud"].append(data)
    for attempt in range(SHIP_MANY_DEADLOCK_RETRIES + 1):
        try:
            rows = conn.execute(_SHIP_MANY, params).fetchall()
            break
        except Exception as exc:  # (psycopg is optional: its error is known by SQLSTATE)
            if getattr(exc, "sqlstate", None) != DEADLOCK or attempt == SHIP_MANY_DEADLOCK_RETRIES:
                raise
    outcomes = [FENCED] * len(changes)
    for n, written, stored in rows:
        if written is not None:
            changes[n].shipped_version = int(written)
            outcomes[n] = SHIPPED
        elif stored is not None:
            outcomes[n] = STALE
    return outcomes


def claim(
    conn: Conn, me: str, ttl: float, now: float, limit: int, served: list[str],
    skipped: list[str],
) -> tuple[list[Claimed], float | None, list[tuple[str, str]]]:
    """Take the leases of up to ``limit`` objects of the namespaces ``served`` whose
    alarm is due at ``now`` and that no live host leases (SKIP LOCKED: hosts claiming
    at once take different objects); also return the earliest alarm of the unleased
    objects of those namespaces left, and (namespace, class path) of the namespaces
    with due alarms that are neither ``served`` nor ``skipped`` (for this host to
    resolve before it claims any of them)."""
    with conn.transaction():
        rows = conn.execute(
            "WITH due AS (SELECT okey, owner AS old_owner FROM nj_objects"
            "  WHERE alarm_time <= %(now)s AND (owner IS NULL OR lease_until < now())"
            "  AND owner IS DISTINCT FROM %(me)s AND namespace = ANY(%(served)s)"
            "  ORDER BY alarm_time LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
            " UPDATE nj_objects o SET owner = %(me)s, epoch = o.epoch + 1,"
            "  lease_until = now() + make_interval(secs => %(ttl)s)"
            " FROM due WHERE o.okey = due.okey"
            " RETURNING o.namespace, o.object_id, o.epoch, o.alarm_time, o.alarm_retry,"
            "  o.class_path, due.old_owner",
            {"now": now, "me": me, "limit": limit, "ttl": ttl, "served": served},
        ).fetchall()
        taken = [(ns, oid, old) for ns, oid, _, _, _, _, old in rows if old is not None]
        if taken:
            _inherit_crashes(conn, taken)
        # Not this host's own objects (their alarms are served by its timer), even with
        # a lapsed lease: the claim above skips them, and a due one here would make the
        # claim loop spin without sleeping until the next renewal.
        (next_time,) = conn.execute(
            "SELECT min(alarm_time) FROM nj_objects WHERE alarm_time IS NOT NULL"
            " AND (owner IS NULL OR lease_until < now()) AND owner IS DISTINCT FROM %s"
            " AND namespace = ANY(%s)",
            (me, served),
        ).fetchone()
        unknown = conn.execute(
            "SELECT namespace, min(class_path) FROM nj_objects WHERE alarm_time <= %s"
            " AND (owner IS NULL OR lease_until < now()) AND owner IS DISTINCT FROM %s"
            " AND NOT (namespace = ANY(%s)) GROUP BY namespace LIMIT 100",
            (now, me, served + skipped),
        ).fetchall()
    claimed = [
        Claimed(namespace=ns, object_id=oid, epoch=int(epoch),
                alarm=(float(time), int(retry)), class_path=cp)
        for ns, oid, epoch, time, retry, cp, _ in rows
    ]
    return (claimed, None if next_time is None else float(next_time),
            [(str(ns), str(cp)) for ns, cp in unknown])


def is_stored(conn: Conn, namespace: str, object_id: str) -> bool:
    """Whether the object is registered (a ``client_only`` operator face's look)."""
    return conn.execute(
        "SELECT 1 FROM nj_objects WHERE okey = %s", (key_digest(namespace, object_id),),
    ).fetchone() is not None


def locate(conn: Conn, namespace: str, object_id: str, ttl: float) -> str | None:
    """Where a ``client_only`` runtime sends a call: the live host that leases the
    object, else any live host (which takes it), else None."""
    row = conn.execute(
        "SELECT owner FROM nj_objects WHERE okey = %s"
        " AND owner IS NOT NULL AND lease_until >= now()", (key_digest(namespace, object_id),),
    ).fetchone()
    if row is not None:
        return str(row[0])
    row = conn.execute(
        "SELECT host_id FROM nj_hosts WHERE heartbeat >= now() - make_interval(secs => %s)"
        " ORDER BY random() LIMIT 1", (ttl,),
    ).fetchone()
    return None if row is None else str(row[0])


def renew(
    conn: Conn, me: str, ttl: float, leases: list[tuple[Key, int]]
) -> dict[Key, int]:
    """Extend the leases this host holds (``leases``: key and epoch; one statement) and
    its heartbeat; return those it still holds.

    Rows that name this host as owner but that it does not hold (a release that failed,
    a take whose answer was lost) are not renewed: once expired they are released here,
    so that any host — this one too, whose claims skip its own rows — claims their
    alarms.
    """
    leases = sorted(leases)  # row locks in key order, as ``ship_many`` takes them
    with conn.transaction():
        conn.execute(
            "INSERT INTO nj_hosts (host_id) VALUES (%s)"
            " ON CONFLICT (host_id) DO UPDATE SET heartbeat = now()", (me,)
        )
        rows = conn.execute(
            "UPDATE nj_objects o SET lease_until = now() + make_interval(secs => %s)"
            " FROM unnest(%s::bytea[], %s::bigint[]) AS h(okey, epoch)"
            " WHERE o.okey = h.okey AND o.epoch = h.epoch"
            " AND o.owner = %s RETURNING o.namespace, o.object_id, o.epoch",
            (ttl, [key_digest(*k) for k, _ in leases], [epoch for _, epoch in leases], me),
        ).fetchall()
        orphans = conn.execute(
            "UPDATE nj_objects SET owner = NULL, lease_until = NULL"
            " WHERE owner = %s AND lease_until < now() RETURNING alarm_time", (me,),
        ).fetchall()
        if any(time is not None for (time,) in orphans):
            conn.execute("NOTIFY nj_alarm")
    return {(ns, oid): int(epoch) for ns, oid, epoch in rows}


def release(conn: Conn, me: str, leases: list[tuple[str, str, int]]) -> None:
    """Give up leases (at the epochs given: a lease taken again since stays)."""
    leases = sorted(leases)  # row locks in key order, as ``ship_many`` takes them
    rows = conn.execute(
        "UPDATE nj_objects o SET owner = NULL, lease_until = NULL"
        " FROM unnest(%s::bytea[], %s::bigint[]) AS r(okey, epoch)"
        " WHERE o.okey = r.okey AND o.epoch = r.epoch"
        " AND o.owner = %s RETURNING o.alarm_time",
        ([key_digest(ns, oid) for ns, oid, _ in leases], [epoch for _, _, epoch in leases],
         me),
    ).fetchall()
    if any(time is not None for (time,) in rows):
        conn.execute("NOTIFY nj_alarm")


def release_all(conn: Conn, me: str) -> None:
    """Shutdown: give up every lease and the host row."""
    with conn.transaction():
        conn.execute(
            "UPDATE nj_objects SET owner = NULL, lease_until = NULL WHERE owner = %s", (me,)
        )
        conn.execute("DELETE FROM nj_hosts WHERE host_id = %s", (me,))
        conn.execute("NOTIFY nj_alarm")


def ship_flight(conn: Conn, me: str, entries: list[list[Any]]) -> None:
    conn.execute(
        "UPDATE nj_hosts SET flight = %s::jsonb WHERE host_id = %s", (json.dumps(entries), me)
    )


def set_alarm(
    conn: Conn, me: str, alarms: list[tuple[str, str, float, int]]
) -> None:
    """Re-time the alarms of objects this host could not activate."""
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(
            "UPDATE nj_objects SET alarm_time = %s, alarm_retry = %s WHERE okey = %s"
            " AND (owner IS NULL OR owner = %s OR lease_until < now())",
            [(time, retry, key_digest(ns, oid), me) for ns, oid, time, retry in alarms],
        )


def destroy(conn: Conn, me: str, namespace: str, object_id: str) -> None:
    """Delete an object's rows, unless another live host holds it now."""
    okey = key_digest(namespace, object_id)
    with conn.transaction():
        gone = conn.execute(
            "DELETE FROM nj_objects WHERE okey = %s"
            " AND (owner IS NULL OR owner = %s OR lease_until < now()) RETURNING 1",
            (okey, me),
        ).fetchone()
        if gone is None:
            return
        for table in ("nj_rows", "nj_crashes"):
            conn.execute(f"DELETE FROM {table} WHERE okey = %s", (okey,))


def sweep(conn: Conn, ttl: float, call_max_age: float) -> tuple[int, int]:
    """Delete what dead hosts and finished calls leave behind; return (hosts, calls)
    deleted.

    - A host row whose heartbeat is older than ``10 * ttl`` and that no object names as
      its owner (a lapsed owner's row carries the flight list that becomes the crash
      tokens of whoever takes its objects over: it stays until then).
    - A call row older than ``call_max_age`` seconds that is answered (its caller
      collects answers within seconds) or whose caller or target host row is gone
      (nobody will take it or collect it).
    """
    with conn.transaction():
        hosts = conn.execute(
            "DELETE FROM nj_hosts h WHERE heartbeat < now() - make_interval(secs => %s)"
            " AND NOT EXISTS (SELECT FROM nj_objects o WHERE o.owner = h.host_id)",
            (10 * ttl,),
        ).rowcount
        calls = conn.execute(
            "DELETE FROM nj_calls c WHERE created < now() - make_interval(secs => %s)"
            " AND (state IN ('ok', 'error', 'moved')"
            "  OR NOT EXISTS (SELECT FROM nj_hosts h WHERE h.host_id = c.caller)"
            "  OR NOT EXISTS (SELECT FROM nj_hosts h WHERE h.host_id = c.target))",
            (call_max_age,),
        ).rowcount
    return int(hosts), int(calls)


# -- what the operator faces need (inspect, serve, the dashboard, requeue) ---------------------
def read_only(conn: Conn, fn: Callable[[Conn], T]) -> T:
    """``fn(conn)`` inside one read-only, repeatable-read transaction: one consistent
    snapshot of every table, in which the server refuses any write."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return fn(conn)


@attrs.frozen
class Held:
    """An object a live host leases: it was not edited."""

    owner: str
    seconds_left: float


@attrs.frozen
class Edit(Generic[T]):
    """What an edit of a working copy gives back: its result, and the time to lower the
    object's alarm to (None: leave it)."""

    result: T
    alarm: float | None = None


# An edit waits this long for the object's row lock (a host's ship or take holds it for
# a statement or two) before it gives up.
EDIT_LOCK_TIMEOUT = "5s"


def edit_unheld(
    conn: Conn, namespace: str, object_id: str,
    edit: Callable[[sqlite3.Connection], Edit[T]],
) -> Edit[T] | Held | None:
    """Edit the stored state of an object no live host leases, from outside any host
    (``nursery-jobs requeue``), as one transaction; None if there is no such object.

    Under the object's row lock: a live lease is left alone (``Held``: nothing is read
    or written). Otherwise the object's rows are loaded into a working copy and
    ``edit`` runs on it; if it changed rows, they are written back with the object's
    lease taken away from whoever held it last — ``epoch + 1``, no owner — so a host
    whose lease lapsed (paused, partitioned) finds every later write of its refused by
    the fence and drops the object, and the next host to take it loads these rows. The
    work such a host's flight list shows running becomes crash tokens, as when another
    host takes an object over. A lowered alarm notifies the hosts' claim loops.
    """
    okey = key_digest(namespace, object_id)
    with conn.transaction():
        conn.execute(f"SET LOCAL lock_timeout = '{EDIT_LOCK_TIMEOUT}'")
        found = conn.execute(
            "SELECT owner, lease_until IS NOT NULL AND lease_until >= now(),"
            " extract(epoch FROM lease_until - now()) FROM nj_objects"
            " WHERE okey = %s FOR UPDATE", (okey,),
        ).fetchone()
        if found is None:
            return None
        owner, live, left = found
        if live:
            return Held(owner=str(owner), seconds_left=float(left))
        rows = conn.execute("SELECT tbl, data FROM nj_rows WHERE okey = %s",
                            (okey,)).fetchall()
        copy = load_copy(f"{namespace}/{object_id}", rows, captured=_nothing)
        try:
            done = edit(copy)
            _, upserts, deletes = take_captured(copy, copy.captured)
        finally:
            copy.close()
        if not upserts and not deletes:
            return done
        if owner is not None:
            _inherit_crashes(conn, [(namespace, object_id, owner)])
        with conn.cursor() as cur:
            if deletes:
                cur.executemany(
                    "DELETE FROM nj_rows WHERE okey = %s AND rkey = %s",
                    [(okey, key_digest(tbl, key)) for tbl, key in deletes],
                )
            if upserts:
                cur.executemany(
                    "INSERT INTO nj_rows (namespace, object_id, tbl, key, data)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (okey, rkey)"
                    " DO UPDATE SET data = excluded.data",
                    [(namespace, object_id, tbl, key, data) for tbl, key, data in upserts],
                )
        conn.execute(
            "UPDATE nj_objects SET owner = NULL, lease_until = NULL, epoch = epoch + 1,"
            " version = version + 1,"
            " alarm_retry = CASE WHEN %(t)s::float8 < alarm_time OR alarm_time IS NULL"
            "  THEN 0 ELSE alarm_retry END,"
            " alarm_time = least(alarm_time, %(t)s::float8) WHERE okey = %(okey)s",
            {"t": done.alarm, "okey": okey},
        )
        if done.alarm is not None:
            conn.execute("NOTIFY nj_alarm")
    return done


def _nothing() -> None:
    """An offline edit's copy ships here, in its own transaction: no loop to wake."""
