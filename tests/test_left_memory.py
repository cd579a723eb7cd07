"""An object that left memory lets go of its host (issue 26): the instance and its
Lifecycle refer to one another, a cycle only the collector frees, and before this the
cycle held the host, its task, nursery, scopes and engine state too (~65 objects an
activation; the collector took ~20% of the CPU of creating an object). A reference kept
past the activation gets a typed error instead of reaching a non-resident object."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import nursery_jobs as nj

KEPT: list[Any] = []


class Keeper(nj.DurableObject):
    namespace = "tests.left.Keeper"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def start(self) -> None:
        await self.lifecycle.jobs.push("run", delay=3600, payload={"n": 1})

    async def keep(self) -> None:
        KEPT[:] = [self.lifecycle, self.ctx]

    async def job_ids(self) -> list[str]:
        return [job.fn for job in self.lifecycle.jobs.list()]

    async def on_job(self, ctx: nj.JobContext) -> None:
        return None


@contextmanager
def saved_garbage() -> Iterator[list[Any]]:
    """What the cycle collector finds meanwhile (collector off, then one collection)."""
    gc.collect()
    gc.disable()
    found: list[Any] = []
    try:
        yield found
    finally:
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.extend(gc.garbage)
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()


LOCATIONS = ["files", "shared", "memory"]


def _location(kind: str, tmp_path: Path) -> str | None:
    return {"files": str(tmp_path / "d"), "shared": f"shared:{tmp_path / 'd'}",
            "memory": None}[kind]


@pytest.mark.parametrize("kind", LOCATIONS)
async def test_an_evicted_activation_leaves_only_its_instance_cycle_to_the_collector(
    kind: str, tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with nj.open_runtime(_location(kind, tmp_path), max_active=1) as rt:
            await rt.get(Keeper, "warm").start()
            await rt.get(Keeper, "warm-2").start()
            with saved_garbage() as garbage:
                for i in range(5):
                    await rt.get(Keeper, f"k-{i}").start()  # each evicts the one before
                await trio.testing.wait_all_tasks_blocked()
    kinds = {type(x).__name__ for x in garbage}
    # The host, its trio task and nursery, its scopes and the engine's state of the
    # object were freed when the object left, by reference counting.
    for name in ("ObjectHost", "Task", "Nursery", "CancelScope", "CancelStatus",
                 "coroutine", "SharedObject", "FileObject", "MemoryObject"):
        assert name not in kinds, (name, kind)


async def test_a_lifecycle_kept_past_its_activation_is_refused_with_a_typed_error(
    tmp_path: Path,
) -> None:
    KEPT.clear()
    with trio.fail_after(30):
        async with nj.open_runtime(f"shared:{tmp_path / 'd'}", max_active=1) as rt:
            await rt.get(Keeper, "a").start()
            await rt.get(Keeper, "a").keep()
            await rt.get(Keeper, "b").start()  # a leaves memory
            await trio.testing.wait_all_tasks_blocked()
            assert not rt.is_active(Keeper.namespace, "a")
            lifecycle, ctx = KEPT
            with pytest.raises(nj.StorageError, match=r"tests\.left\.Keeper/a has left memory"):
                ctx.claim_alarm("x", lambda info: None, None)
            with pytest.raises(nj.StorageError, match=r"tests\.left\.Keeper/a has left memory"):
                ctx.nursery.start_soon(trio.sleep, 0)
            with pytest.raises(nj.StorageError):
                await lifecycle.jobs.push("late", delay=10)
            with pytest.raises(nj.StorageError):
                ctx.storage.set_alarm(10.0)
            KEPT.clear()
            # Nothing of the refused writes reached a's data.
            assert await rt.get(Keeper, "a").job_ids() == ["run"]
