"""The PostgreSQL engine's housekeeping: the local alarm index of held objects (a heap),
and the sweep of dead hosts' rows and abandoned call rows."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
from pg_support import eventually, opened, sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

from nursery_jobs._engines.postgres import _ops as ops  # noqa: E402
from nursery_jobs._events import EventBus  # noqa: E402

NOW = 1_800_000_000.0


def test_the_local_alarm_index_answers_like_a_scan(pg_dsn: str) -> None:
    """Random moves, removals and re-adds: ``due`` and ``next_alarm_after`` agree with a
    plain scan of the alarms at every step (stale heap entries never count)."""
    rng = random.Random(12)
    with opened(pg_dsn) as engine:
        alarms: dict[tuple[str, str], float] = {}
        for step in range(3000):
            key = ("ns", f"o{rng.randrange(200)}")
            if rng.random() < 0.2:
                engine._alarms.discard(key)  # the object closed or its alarm went
                alarms.pop(key, None)
            else:
                time = float(rng.randrange(100))
                engine._leases.held[key] = 1
                engine.set_alarm(*key, time, 0)
                alarms[key] = time
            now = float(rng.randrange(-1, 101))
            expected = sorted((t, k) for k, t in alarms.items() if t <= now)[:10]
            assert engine.due(now, 10) == [k for _, k in expected], step
            later = [t for t in alarms.values() if t > now]
            assert engine.next_alarm_after(now) == (min(later) if later else None), step
        assert len(engine._alarms.heap) <= 2 * len(engine._alarms) + 65


def test_sweep_deletes_dead_hosts_and_abandoned_calls_only(pg_dsn: str) -> None:
    with opened(pg_dsn, lease_ttl=1.0) as engine:
        me = engine.host_id
        old = "now() - interval '1 hour'"
        sql(pg_dsn, f"INSERT INTO nj_hosts (host_id, heartbeat) VALUES ('dead', {old}),"
                    f" ('dead-owner', {old}), ('quiet', now() - interval '5 seconds')")
        # An object still names dead-owner: its flight list is a future crash token.
        sql(pg_dsn, "INSERT INTO nj_objects (namespace, object_id, class_path, created_at,"
                    " owner, epoch, lease_until) VALUES ('ns', 'o', 'm:C', 0,"
                    " 'dead-owner', 1, now() - interval '1 hour')")
        calls = [  # (caller, target, state, age): deleted?
            (me, me, "ok", "1 hour", True),             # answered, never collected
            (me, me, "error", "1 minute", False),       # answered, not old yet
            ("dead", me, "pending", "1 hour", True),    # its caller is gone
            (me, "dead", "pending", "1 hour", True),    # its target is gone
            (me, "dead-owner", "running", "1 hour", False),  # target row kept: call too
            (me, me, "running", "1 hour", False),       # both alive: may still run
        ]
        for caller, target, state, age, _ in calls:
            sql(pg_dsn, "INSERT INTO nj_calls (target, caller, namespace, object_id,"
                        " class_path, name, state, created) VALUES (%s, %s, 'ns', 'o',"
                        f" 'm:C', 'f', %s, now() - interval '{age}')",
                (target, caller, state))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert ops.sweep(conn, 1.0, 600.0) == (1, 3)
        assert sorted(r[0] for r in sql(pg_dsn, "SELECT host_id FROM nj_hosts")) == sorted(
            [me, "dead-owner", "quiet"])
        left = sql(pg_dsn, "SELECT caller, target, state FROM nj_calls ORDER BY id")
        assert left == [(c, t, s) for c, t, s, _, gone in calls if not gone]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert ops.sweep(conn, 1.0, 600.0) == (0, 0)


class Site:
    events: Any = EventBus()

    def earliest_alarm(self) -> float:
        return float("inf")

    def wake_timer(self) -> None:
        pass

    async def run_call(self, *args: Any) -> Any:
        raise AssertionError("no calls here")

    def fenced(self, namespace: str, object_id: str, reason: str | None = None) -> None:
        pass

    def serves(self, namespace: str, class_path: str | None) -> bool:
        return True


async def test_a_serving_host_sweeps_a_dead_host_row(pg_dsn: str) -> None:
    # lease_ttl 0.3 s: a renewal every 0.1 s, a sweep every SWEEP_EVERY renewals (2 s),
    # and a host is dead after 10 * 0.3 s without a heartbeat.
    with opened(pg_dsn, lease_ttl=0.3) as engine:
        sql(pg_dsn, "INSERT INTO nj_hosts (host_id, heartbeat)"
                    " VALUES ('dead', now() - interval '1 minute')")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.serve, Site())
            await eventually(lambda: sql(
                pg_dsn, "SELECT count(*) FROM nj_hosts WHERE host_id = 'dead'") == [(0,)])
            nursery.cancel_scope.cancel(reason="test over")
        assert sql(pg_dsn, "SELECT host_id FROM nj_hosts") == [(engine.host_id,)]
