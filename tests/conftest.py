from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_support import pg_dsn  # noqa: F401  (the fresh-PostgreSQL-database fixture)

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
