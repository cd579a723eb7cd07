"""Pins the public surface of ``nursery_jobs``: adding or removing a name is a decision."""

from __future__ import annotations
import __future__

import types

import nursery_jobs as nj

EXPECTED = [
    "Agent",
    "AlarmInfo",
    "AlarmOwnedError",
    "Capability",
    "CapabilityError",
    "CapabilityLifecycle",
    "CodecError",
    "DeadLetter",
    "DurableObject",
    "EngineError",
    "Event",
    "EventBus",
    "HttpBindError",
    "Job",
    "JobContext",
    "JobError",
    "JobOutcome",
    "JobOwnershipError",
    "JobTimeoutError",
    "Jobs",
    "Lifecycle",
    "Limit",
    "LimitError",
    "MemoryLimitContext",
    "NurseryJobsError",
    "ObjectContext",
    "ObjectFencedError",
    "ObjectIdError",
    "ObjectResetError",
    "Queue",
    "QueueDeadLetter",
    "QueueItem",
    "Reschedule",
    "RetryOptions",
    "RpcError",
    "Runtime",
    "RuntimeArgumentError",
    "RuntimeClosedError",
    "RuntimeLockedError",
    "RuntimeStatistics",
    "Schedule",
    "Scheduler",
    "Storage",
    "StorageError",
    "StorageKeyError",
    "Stub",
    "TaskInfo",
    "TaskRecord",
    "TimeArgumentError",
    "TurnError",
    "UnknownCallbackError",
    "YIELD",
    "interleave",
    "jitter",
    "now",
    "open_runtime",
    "read_only",
]


def public_names() -> set[str]:
    """Names a user sees on the package: not private, not a submodule, and not the
    ``annotations`` feature that ``from __future__ import annotations`` leaves behind."""
    return {
        name
        for name, value in vars(nj).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and value is not __future__.annotations
    }


def test_all_is_sorted() -> None:
    assert nj.__all__ == sorted(nj.__all__)
    assert len(set(nj.__all__)) == len(nj.__all__)


def test_all_is_the_pinned_list() -> None:
    assert nj.__all__ == EXPECTED


def test_all_matches_what_is_exported() -> None:
    assert set(nj.__all__) == public_names()
    for name in nj.__all__:
        assert getattr(nj, name) is not None


def test_public_classes_and_functions_report_the_public_module() -> None:
    """Defined in private modules, shown as ``nursery_jobs.X`` (as trio does)."""
    checked = 0
    for name in nj.__all__:
        value = getattr(nj, name)
        if isinstance(value, (type, types.FunctionType)):
            assert value.__module__ == "nursery_jobs", (name, value.__module__)
            assert value.__qualname__ == name, (name, value.__qualname__)
            checked += 1
    assert checked > 20


def test_errors_share_one_root() -> None:
    errors = [getattr(nj, n) for n in nj.__all__ if n.endswith("Error")]
    assert errors
    for error in errors:
        assert issubclass(error, nj.NurseryJobsError), error


def test_the_testing_helper_pins_the_epoch() -> None:
    import trio.testing

    import nursery_jobs.testing

    async def main() -> float:
        await trio.sleep(5)
        return nj.now()

    nursery_jobs.testing.pin_epoch(1_700_000_000.0)
    try:
        assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)) == (
            1_700_000_005.0
        )
    finally:
        nursery_jobs.testing.pin_epoch(None)


def test_runtime_views_cannot_be_built_by_accident() -> None:
    """Stubs come from rt.get, job views from the Lifecycle: built by hand, they refuse."""
    import pytest

    class Thing(nj.DurableObject):
        pass

    for make in (lambda: nj.Stub(None, Thing, "x"),  # type: ignore[arg-type]
                 lambda: nj.Jobs(None, "host"),  # type: ignore[arg-type]
                 lambda: nj.CapabilityLifecycle(None, "cap")):  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"made by|use "):
            make()
