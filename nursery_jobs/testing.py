"""Helpers for testing code built on nursery_jobs.

Under ``trio.testing.MockClock`` Trio time starts at 0; pin the epoch and every time the
library computes is exact::

    @pytest.fixture(autouse=True)
    def exact_times():
        nursery_jobs.testing.pin_epoch(1_800_000_000.0)   # nj.now() == this + trio time
        yield
        nursery_jobs.testing.pin_epoch(None)
"""

from __future__ import annotations

from ._clock import pin_epoch as pin_epoch

__all__ = ["pin_epoch"]
