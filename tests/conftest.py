from __future__ import annotations

import pytest

from nursery_jobs import _clock

# Under MockClock, Trio time starts at 0: pin the epoch so nj.now() == EPOCH + trio time.
EPOCH = 1_800_000_000.0


@pytest.fixture(autouse=True)
async def _pinned_epoch(request: pytest.FixtureRequest) -> None:
    if "autojump_clock" in request.fixturenames or "mock_clock" in request.fixturenames:
        _clock.set_epoch(EPOCH)
