"""Review of the left-memory stand-ins (18a380a) and the idle host's wake event
(c0eecc5): what a reference kept past an object's activation gets, and the idle host's
wakes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import nursery_jobs as nj

KEPT: list[Any] = []


class Kept(nj.DurableObject):
    namespace = "tests.review_left.Kept"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def start(self) -> None:
        await self.lifecycle.jobs.push("run", delay=3600)

    async def keep(self) -> None:
        KEPT[:] = [self.lifecycle, self.ctx]

    async def on_job(self, ctx: nj.JobContext) -> None:
        return None


def _location(kind: str, tmp_path: Path) -> str | None:
    return {"files": str(tmp_path / "d"), "shared": f"shared:{tmp_path / 'd'}",
            "memory": None}[kind]


@pytest.mark.parametrize("kind", ["memory", "files", "shared"])
async def test_a_kept_context_in_a_turn_gets_a_typed_error_naming_the_object(
    kind: str, tmp_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    """Holding a turn of its (still standing) gate, a kept context's storage and
    Lifecycle reached the released connection: sqlite3.ProgrammingError "Cannot operate
    on a closed database", no NurseryJobsError and no object named (DESIGN section 7).
    Without a turn they got TurnError, which is why test_left_memory's push and
    set_alarm assertions passed before the stand-ins too."""
    KEPT.clear()
    async with nj.open_runtime(_location(kind, tmp_path), max_active=1) as rt:
        await rt.get(Kept, "a").start()
        await rt.get(Kept, "a").keep()
        await rt.get(Kept, "b").start()  # a leaves memory
        await trio.testing.wait_all_tasks_blocked()
        assert not rt.is_active(Kept.namespace, "a")
        lifecycle, ctx = KEPT
        KEPT.clear()
        left = r"tests\.review_left\.Kept/a has left memory"
        uses: list[Callable[[], object]] = [
            lambda: ctx.storage.get("x"),
            lambda: ctx.storage.put("x", 1),
            lambda: ctx.storage.execute("SELECT 1"),
            lambda: lifecycle.jobs.list(),
        ]
        for use in uses:
            with pytest.raises(nj.StorageError, match=left):  # no turn held
                use()
            async with ctx.turn():
                with pytest.raises(nj.StorageError, match=left):
                    use()
        async with ctx.turn():
            with pytest.raises(nj.StorageError, match=left):
                await lifecycle.jobs.push("late", delay=10)
        instance = await rt.activate(Kept, "a")
        assert isinstance(instance, Kept)
        async with instance.ctx.turn():  # nothing of the refused uses reached a's data
            assert [job.fn for job in instance.lifecycle.jobs.list()] == ["run"]


class Idle(nj.DurableObject):
    namespace = "tests.review_left.Idle"

    async def touch(self) -> None:
        self.ctx.storage.put("k", 1)


async def test_an_object_asked_to_doze_as_a_call_came_in_does_not_hold_a_file_it_was_counted_out_of(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """doze_now() asked an idle object to doze (DOZING) and a call came in before its
    task woke: the task saw it busy and went on waiting, still DOZING while awake. The
    runtime counts a DOZING object as asked already (``doze_pending``), so it asks no
    other; an activation waiting for a file then waited for that object's dormant_after
    (here 100 s) rather than for the end of the call."""
    import nursery_jobs._core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "open_file_budget", lambda: 3)
    monkeypatch.setattr(runtime_module, "default_max_active", lambda: 3)
    with trio.fail_after(3600):
        async with nj.open_runtime(tmp_path / "data", idle_timeout=3600,
                                   dormant_after=100) as rt:
            for name in ("a", "b", "c"):
                await rt.get(Idle, name).touch()
            host = rt._hosts[(Idle.namespace, "a")]
            # The race, made deterministic: asked to doze, then a call's work begins
            # before the object's task runs.
            assert host.doze_now()
            async with trio.open_nursery() as nursery:
                with host.working():
                    await trio.sleep(1)  # the task wakes meanwhile, finds it busy
                    nursery.start_soon(rt.get(Idle, "d").touch)  # waits for a file
                    await trio.sleep(1)
                ended = trio.current_time()  # the work ended: a's file may go
            assert trio.current_time() - ended < 10


async def test_an_idle_object_asked_to_leave_while_it_waits_to_doze_leaves(
    tmp_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    """The idle wake is an event (c0eecc5): asked to leave while its task is out of the
    idle scope's block (in ``_doze``, waiting for the runtime's dormancy lock), the object
    still leaves; and the idle scope's deadlines still fire (dormant_after, then
    idle_timeout)."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=50, dormant_after=1) as rt:
        await rt.get(Idle, "a").touch()
        host = rt._hosts[(Idle.namespace, "a")]
        async with rt.dormancy:
            await trio.sleep(2)  # a's dormant_after passed: its task waits for the lock
            assert not host.dormant and rt.dormancy.statistics().tasks_waiting == 1
            host.evict()
        await trio.sleep(0.1)
        assert not rt.is_active(Idle.namespace, "a")
        # The deadlines: b dozes after dormant_after, leaves after idle_timeout.
        await rt.get(Idle, "b").touch()
        await trio.sleep(1.5)
        assert rt.is_active(Idle.namespace, "b") and rt._hosts[(Idle.namespace, "b")].dormant
        await trio.sleep(50)
        assert not rt.is_active(Idle.namespace, "b")
