from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_support import fresh_database, pg_dsn  # noqa: F401  (the fresh-PostgreSQL-database fixture)

from nursery_jobs import _clock

# Under MockClock, Trio time starts at 0: pin the epoch so nj.now() == EPOCH + trio time.
EPOCH = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _pinned_epoch(request: pytest.FixtureRequest) -> Iterator[None]:
    if "autojump_clock" in request.fixturenames or "mock_clock" in request.fixturenames:
        _clock.pin_epoch(EPOCH)
        try:
            yield
        finally:
            _clock.pin_epoch(None)
    else:
        yield


# -- engines -----------------------------------------------------------------------------
# The Lifecycle, Queue, Scheduler and Agent suites run on every engine: each module holds
# ``_on_every_engine = on_every_engine`` (an autouse fixture parametrized by engine) and
# opens its runtimes with ``nj.open_runtime(engine.location, ...)``; tests that reopen a
# data directory use ``engine.durable(tmp_path)``. A new engine joins by adding a param.
# PostgreSQL is one of the engines by default: a fresh database per test on the server
# NJ_POSTGRES_DSN names (tests/pg_support.py); without it these params skip with that
# reason, and under CI they fail instead (pg_support.server_dsn). NJ_TEST_ENGINES picks
# engines explicitly (e.g. "memory,files" for a quick run). The shared layout
# (``shared:<dir>``, opt-in) runs them with NJ_TEST_ENGINES=shared; by default it runs
# tests/test_shared_layout.py and the SIGKILL campaigns of tests/test_crash.py only (its
# long-span slowness, a ship loop that looked every 50 ms, is fixed: another engine param
# would add ~8% CPU to CI, not yet taken).
# A test session started in the background of a non-interactive shell (``cmd &``)
# inherits SIGINT ignored (POSIX), and so would every worker it starts: Python then
# installs no KeyboardInterrupt handler, and the Ctrl-C tests would hang or lose it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ENGINES = os.environ.get("NJ_TEST_ENGINES", "memory,files,postgres").split(",")

# Why tests are skipped on PostgreSQL (and only there).
VIRTUAL_DAY_OF_POLLING = (
    "a virtual day under MockClock is ~90,000 one-second claim polls plus renewals, about"
    " 150,000 PostgreSQL round trips (~3 min, half of the whole PG suite); the cron"
    " arithmetic it checks is engine-independent, and the PG alarm path is covered by the"
    " shorter cron and every tests"
)


class EngineUnderTest:
    """Where the current test's runtimes live."""

    name = "memory"
    _root: Path | None = None
    _dsn: str | None = None

    @property
    def location(self) -> Any:
        """A fresh runtime's location: None (memory), a data directory, or a database."""
        if self.name == "memory":
            return None
        if self._dsn is not None:
            return self._dsn
        assert self._root is not None
        if self.name == "shared":
            return f"shared:{self._root / 'data'}"
        return self._root / "data"

    def durable(self, tmp_path: Path) -> Any:
        """A location that survives reopening (memory tests reopen on files)."""
        if self.name == "shared":
            return f"shared:{tmp_path / 'durable'}"
        return self._dsn if self._dsn is not None else tmp_path / "durable"

    def stored_alarm(self, rt: Any, namespace: str, object_id: str) -> tuple[float, int] | None:
        """An object's alarm as its engine stores it, resident or not.

        The files and memory engines keep every alarm in their catalog
        (``rt.engine.get_alarm``). The PostgreSQL engine's local index holds only the
        alarms of the objects this host leases; an object it released keeps its alarm
        on its ``nj_objects`` row, read here (what any host's claim loop will see).
        """
        found: tuple[float, int] | None = rt.engine.get_alarm(namespace, object_id)
        if not hasattr(rt.engine, "dsn") or found is not None:
            return found  # (a test may open its own files runtime under any param)
        import psycopg

        with psycopg.connect(rt.engine.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT alarm_time, alarm_retry FROM nj_objects"
                " WHERE namespace = %s AND object_id = %s AND owner IS DISTINCT FROM %s",
                (namespace, object_id, rt.engine.host_id),
            ).fetchone()
        if row is None or row[0] is None:
            return None
        return float(row[0]), int(row[1])

    def skip_on(self, name: str, reason: str) -> None:
        """Skip the running test on engine ``name`` (only there), saying why."""
        if self.name == name:
            pytest.skip(f"not on {name}: {reason}")

    def lose_alarm(self, rt: Any, namespace: str, object_id: str) -> None:
        """Delete an object's alarm from the engine's index behind the object's back
        (a lost alarm row): the catalog row (files, memory), or on PostgreSQL the
        stored alarm and this host's local index entry."""
        if not hasattr(rt.engine, "dsn"):
            rt.engine.catalog.delete_alarm(namespace, object_id)
            if hasattr(rt.engine, "_unshipped"):  # shared: and what it has not shipped
                rt.engine._unshipped.pop((namespace, object_id), None)
            return
        import psycopg

        rt.engine._alarms.discard((namespace, object_id))
        with psycopg.connect(rt.engine.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE nj_objects SET alarm_time = NULL, alarm_retry = 0"
                " WHERE namespace = %s AND object_id = %s", (namespace, object_id),
            )


engine = EngineUnderTest()


@pytest.fixture(params=ENGINES)
def on_every_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    engine.name = request.param
    engine._root = tmp_path
    try:
        if request.param == "postgres":
            with fresh_database() as dsn:
                engine._dsn = dsn
                yield request.param
        else:
            yield request.param
    finally:
        engine.name, engine._root, engine._dsn = "memory", None, None
