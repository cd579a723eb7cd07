"""Helpers for testing code built on nursery_jobs.

Under ``trio.testing.MockClock`` Trio time starts at 0; pin the epoch and every time the
library computes is exact. The ``nj_runtime`` fixture does it for you (with pytest-trio;
the plugin is registered through the ``pytest11`` entry point and runs such tests under
an autojump ``MockClock``; without it, import the fixture and take ``autojump_clock``)::

    async def test_reminder(nj_runtime):              # MockClock(autojump_threshold=0)
        await nj_runtime.get(Reminders, "ada").remind_in(60)
        await run_until_idle(nj_runtime)               # nothing due now, nothing in flight
        assert nj.now() == EPOCH                       # exact: the clock jumps only to deadlines
        await trio.sleep(60)
        await run_until_idle(nj_runtime)
        assert jobs_of(nj_runtime, Reminders, "ada") == []

The fixture needs pytest and pytest-trio, which the ``test`` extra brings:
``pip install 'nursery_jobs[test]'``. Without pytest-trio, a test that takes
``nj_runtime`` fails at setup with one line that says so.

Override the ``nj_runtime_options`` fixture to pass ``open_runtime`` arguments (``env``,
``idle_timeout``...). Without pytest, ``open_test_runtime()`` does the same.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import trio
import trio.testing

from nursery_jobs import _clock
from nursery_jobs._clock import pin_epoch as pin_epoch
from nursery_jobs._core._object import DurableObject
from nursery_jobs._core._runtime import Runtime, open_runtime
from nursery_jobs._errors import NurseryJobsError
from nursery_jobs._ops._inspect import DeadLetterInfo, JobInfo
from nursery_jobs._ops._sources import RuntimeSource

__all__ = [
    "EPOCH",
    "DeadLetterInfo",
    "JobInfo",
    "dead_letters_of",
    "jobs_of",
    "open_test_runtime",
    "pin_epoch",
    "run_under_autojump",
    "run_until_idle",
]

EPOCH: Final = 1_800_000_000.0
"""What ``nj.now()`` reads at Trio time 0 under ``nj_runtime`` / ``open_test_runtime``."""


@asynccontextmanager
async def open_test_runtime(
    path: Any = None, *, epoch: float = EPOCH, **options: Any
) -> AsyncIterator[Runtime]:
    """``open_runtime(path, **options)`` (in memory by default) with this Trio run's
    epoch pinned, so that ``nj.now() == epoch + trio.current_time()``. Use it under
    ``MockClock(autojump_threshold=0)`` for exact times."""
    _clock.set_epoch(epoch)
    async with open_runtime(path, **options) as rt:
        yield rt


async def run_until_idle(rt: Runtime) -> None:
    """Return once no alarm of ``rt`` is due now and none is in flight: every due alarm
    run (and what it made due meanwhile) has finished. Under a MockClock the clock
    moves only to the deadlines the runs wait for, so ``nj.now()`` stays exact.

    Raises:
        NurseryJobsError: under a MockClock, alarm runs are in flight but wait on
            something no timer will ever wake (a deadlock in the test).
    """
    source = RuntimeSource(rt)
    while True:
        await trio.testing.wait_all_tasks_blocked()
        if not source.busy(_clock.now()):
            return
        wait = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if math.isinf(wait):
            if isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
                raise NurseryJobsError(
                    "run_until_idle: alarm runs are in flight, but every task waits on"
                    " something no deadline will wake (nothing else runs in this test)"
                )
            wait = 0.01  # a real clock: something outside (I/O) may still wake them
        # (A deadline that has just passed, not yet processed, reads as negative.)
        await trio.sleep(max(wait, 0.0))


def _namespace(cls_or_namespace: type[DurableObject] | str) -> str:
    if isinstance(cls_or_namespace, str):
        return cls_or_namespace
    return cls_or_namespace.namespace


def jobs_of(
    rt: Runtime, cls_or_namespace: type[DurableObject] | str, object_id: str
) -> list[JobInfo]:
    """The queued jobs of an object (every owner), in due order, read from its database
    whether it is active or evicted. Does not activate it; does not checkpoint."""
    detail = RuntimeSource(rt).detail(_namespace(cls_or_namespace), object_id, _clock.now())
    return [] if detail is None else detail.jobs


def dead_letters_of(
    rt: Runtime, cls_or_namespace: type[DurableObject] | str, object_id: str
) -> list[DeadLetterInfo]:
    """The dead letters of an object (every owner), newest first. Does not activate it;
    does not checkpoint."""
    detail = RuntimeSource(rt).detail(_namespace(cls_or_namespace), object_id, _clock.now())
    return [] if detail is None else detail.dead_letters


def run_under_autojump(fn: Any, *args: Any, clock: Any = None, **kwargs: Any) -> Any:
    """``trio.run`` with ``MockClock(autojump_threshold=0)`` unless a clock is given:
    the runner the plugin gives pytest-trio for tests that take ``nj_runtime``."""
    if clock is None:
        clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(fn, *args, clock=clock, **kwargs)


try:
    import pytest
except ImportError:  # pragma: no cover - pytest is only needed for the fixtures
    pass
else:

    NEEDS_PYTEST_TRIO: Final = "nj_runtime needs pytest-trio: pip install 'nursery_jobs[test]'"

    def _uses_nj_runtime(item: pytest.Item) -> bool:
        return "nj_runtime" in getattr(item, "fixturenames", ())

    def _has_pytest_trio(config: pytest.Config) -> bool:
        # pytest-trio registers itself as "trio" (its pytest11 entry point); `-p no:trio`
        # or an uninstalled package leaves it out.
        return config.pluginmanager.hasplugin("trio")

    def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
        # pytest-trio takes the clock from the test's own arguments only; a test that
        # takes nj_runtime runs under an autojump MockClock unless it asks for a clock.
        # Without pytest-trio there is no `trio` marker to add (strict markers refuse
        # it): pytest_runtest_setup below fails those tests with one line instead.
        if not _has_pytest_trio(config):
            return
        for item in items:
            if _uses_nj_runtime(item):
                item.add_marker(pytest.mark.trio(run=run_under_autojump), append=False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(item: pytest.Item) -> None:
        # Before any fixture is set up: without pytest-trio the async fixture would fail
        # with pytest's own, longer complaint about async fixtures and tests.
        if _uses_nj_runtime(item) and not _has_pytest_trio(item.config):
            pytest.fail(NEEDS_PYTEST_TRIO, pytrace=False)

    @pytest.fixture
    def nj_runtime_options() -> dict[str, Any]:
        """Keyword arguments for ``open_runtime`` in ``nj_runtime``; override it."""
        return {}

    @pytest.fixture
    async def nj_runtime(nj_runtime_options: dict[str, Any]) -> AsyncIterator[Runtime]:
        """An in-memory runtime under ``MockClock(autojump_threshold=0)`` with the epoch
        pinned to ``EPOCH`` (needs pytest-trio: the ``test`` extra)."""
        if not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
            raise NurseryJobsError(
                "nj_runtime runs under a MockClock: load the nursery_jobs pytest plugin"
                " (installed with the package, or -p nursery_jobs.testing), or take the"
                " autojump_clock fixture in the test too"
            )
        async with open_test_runtime(**nj_runtime_options) as rt:
            yield rt
