from __future__ import annotations

import os
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
# PostgreSQL joins with NJ_TEST_ENGINES=memory,files,postgres (a fresh database per test,
# tests/pg_support.py). Not yet by default: under MockClock these suites do not all pass
# on it yet (the engine's own suites, tests/test_postgres_*.py, run in CI).
ENGINES = os.environ.get("NJ_TEST_ENGINES", "memory,files").split(",")


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
        return self._root / "data"

    def durable(self, tmp_path: Path) -> Any:
        """A location that survives reopening (memory tests reopen on files)."""
        return self._dsn if self._dsn is not None else tmp_path / "durable"


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
