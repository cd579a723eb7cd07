"""The PostgreSQL engine's options (DESIGN.md §9): ``lease_ttl`` and ``pool_size`` are
bounded, and a value out of bounds — of any size or type — is refused with the option
errors the runtime's own options raise (``ValueError``, ``TypeError``), naming the
option, before anything connects."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pg_support import opened

pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._core._location import engine_for
from nursery_jobs._engines.postgres._engine import (
    MAX_LEASE_TTL,
    MAX_POOL_SIZE,
    PostgresEngine,
)
from nursery_jobs._errors import safe_repr

NOWHERE = "postgresql://nobody@127.0.0.1:1/none"  # (nothing listens: nothing may connect)
HUGE = 10**400  # an int too large for a float (10**5000: too long for repr(), too)

BAD_LEASE_TTLS: list[Any] = [
    HUGE, -HUGE, 10**5000, float("nan"), math.inf, -math.inf, 0, -1.0, MAX_LEASE_TTL * 2,
    math.nextafter(MAX_LEASE_TTL, math.inf), True, False, "10", None, [10],
]
BAD_POOL_SIZES: list[Any] = [
    10**9, HUGE, MAX_POOL_SIZE + 1, 1, 0, -1, True, 8.0, float("nan"), math.inf, "8", None,
]


def short(value: Any) -> str:
    """A test id: a 400-digit int is no name."""
    text = safe_repr(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} chars)"


def refused(error: type[Exception], option: str, **options: Any) -> str:
    """The message of ``error``, which constructing an engine with ``options`` raises."""
    with pytest.raises(error) as info:
        PostgresEngine(NOWHERE, **options)
    message = str(info.value)
    assert option in message
    assert len(message) < 300  # (a 400-digit int is not quoted whole)
    return message


@pytest.mark.parametrize("value", BAD_LEASE_TTLS, ids=short)
def test_a_lease_ttl_out_of_bounds_is_refused(value: Any) -> None:
    message = refused(ValueError, "lease_ttl", lease_ttl=value)
    assert f"{MAX_LEASE_TTL:g}" in message  # (the bound is named)


@pytest.mark.parametrize("value", BAD_POOL_SIZES, ids=short)
def test_a_pool_size_out_of_bounds_is_refused(value: Any) -> None:
    message = refused(ValueError, "pool_size", pool_size=value)
    assert str(MAX_POOL_SIZE) in message


@pytest.mark.parametrize("value", [1, None, b"FULL", ["NORMAL"]], ids=short)
def test_a_synchronous_that_is_no_level_is_refused(value: Any) -> None:
    refused(ValueError, "synchronous", synchronous=value)


@pytest.mark.parametrize("value", [1, None, b"postgresql://x/y"], ids=short)
def test_an_address_that_is_no_str_is_refused(value: Any) -> None:
    with pytest.raises(TypeError, match="dsn"):
        PostgresEngine(value)


def test_the_bounds_themselves_are_taken() -> None:
    engine = PostgresEngine(NOWHERE, lease_ttl=MAX_LEASE_TTL, pool_size=MAX_POOL_SIZE)
    assert (engine.lease_ttl, engine.pool_size) == (MAX_LEASE_TTL, MAX_POOL_SIZE)
    assert PostgresEngine(NOWHERE, lease_ttl=1e-3, pool_size=2).lease_ttl == 1e-3
    assert PostgresEngine(NOWHERE, lease_ttl=int(MAX_LEASE_TTL)).lease_ttl == MAX_LEASE_TTL


def test_the_longest_lease_opens_on_the_server(pg_dsn: str) -> None:
    """The server takes the timeouts derived from the longest lease (up to 3 x lease_ttl,
    in ms: PostgreSQL's settings are ints)."""
    with opened(pg_dsn, lease_ttl=MAX_LEASE_TTL, pool_size=2) as engine:
        assert engine.lease_ttl == MAX_LEASE_TTL


@pytest.mark.parametrize(("option", "value"), [
    ("lease_ttl", HUGE), ("lease_ttl", float("nan")), ("pool_size", 10**9),
], ids=short)
def test_an_address_given_to_open_runtime_checks_the_options_too(
    option: str, value: Any
) -> None:
    with pytest.raises(ValueError, match=option):
        engine_for(NOWHERE, synchronous="NORMAL", **{option: value})


@pytest.mark.parametrize(("option", "value"), [("lease_ttl", HUGE), ("pool_size", 10**9)],
                         ids=short)
async def test_open_runtime_refuses_them_before_connecting(option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=option):
        async with nj.open_runtime(NOWHERE, **{option: value}):
            pass
