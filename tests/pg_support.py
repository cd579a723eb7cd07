"""PostgreSQL for tests: the server named by ``NJ_POSTGRES_DSN`` and a fresh database
per test.

Without ``NJ_POSTGRES_DSN`` a PostgreSQL test is skipped (with that reason); under ``CI``
it fails instead, as it does when the server cannot be reached. Drop a fresh database into
any runtime test::

    def test_x(pg_dsn: str) -> None: ...            # the fixture (import it from here)
    with fresh_database() as dsn: ...               # or the context manager
    async with nj.open_runtime(dsn) as rt: ...
"""

from __future__ import annotations

import os
import secrets
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

DSN_ENV = "NJ_POSTGRES_DSN"


def server_dsn() -> str:
    """The server's address; skips (or, under CI, fails) the test without one."""
    dsn = os.environ.get(DSN_ENV)
    if not dsn:
        message = f"{DSN_ENV} is not set: no PostgreSQL server to test against"
        if os.environ.get("CI"):
            pytest.fail(message + " (required under CI)")
        pytest.skip(message)
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"psycopg is not installed: {exc}")
        pytest.skip(f"psycopg is not installed: {exc}")
    return dsn


def database_dsn(dsn: str, dbname: str) -> str:
    """``dsn`` with its database replaced by ``dbname`` (a ``postgresql://`` URL)."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"{DSN_ENV} must be a postgresql:// URL, got {dsn!r}")
    return parts._replace(path="/" + dbname).geturl()


@contextmanager
def fresh_database() -> Iterator[str]:
    """Create ``nj_test_<random>``, yield its address, drop it (forcing out any
    connection left behind)."""
    import psycopg

    dsn = server_dsn()
    name = f"nj_test_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.fail(f"cannot connect to PostgreSQL at {DSN_ENV}={dsn!r}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield database_dsn(dsn, name)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """The address of a fresh database, dropped after the test."""
    with fresh_database() as dsn:
        yield dsn


async def eventually(predicate: Callable[[], Any], seconds: float = 10.0) -> None:
    """Wait (real time) until ``predicate()`` (or its awaited result) is true."""
    import inspect

    import trio

    with trio.fail_after(seconds):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return
            await trio.sleep(0.02)


def sql(dsn: str, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """Run one statement on its own autocommit connection; its rows (or [])."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


@contextmanager
def opened(dsn: str, now: float = 1_800_000_000.0, **kwargs: Any) -> Iterator[Any]:
    """A ``PostgresEngine`` on ``dsn``, opened at epoch ``now``, closed after."""
    from nursery_jobs._engines.postgres._engine import PostgresEngine

    engine = PostgresEngine(dsn, **kwargs)
    engine.open(now)
    try:
        yield engine
    finally:
        engine.close()
