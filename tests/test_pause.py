"""Pausing an object's jobs (DESIGN.md §3, "Steering jobs"): ``lifecycle.pause`` /
``resume`` / ``paused``, per object or per owner, durable in the object's ``nj_meta``.

Paused jobs stay due, do not wake the object (its alarm ignores them), and pushes are
accepted; ``resume`` runs what is due at once. Every engine; exact virtual times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH, engine

import nursery_jobs as nj


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


HANG = 100_000


def rel() -> float:
    return nj.now() - EPOCH


class Audit(nj.Capability):
    id = "audit"

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.host.ctx.env.append(("audit", ctx.job.id, rel()))

    async def push(self, fn: str, delay: float, **options: Any) -> None:
        await self.lifecycle.jobs.push(fn, delay=delay, id=fn, **options)

    async def pause(self) -> None:
        await self.lifecycle.pause()

    async def resume(self) -> None:
        await self.lifecycle.resume()


class Paused(nj.DurableObject):
    namespace = "tests.test_pause.Paused"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.runs: list[tuple[str, str, float]] = ctx.env
        self.audit = Audit()
        self.lifecycle = nj.Lifecycle.install(self).use(self.audit)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.runs.append(("host", ctx.job.id, rel()))

    async def push(self, job_id: str, delay: float) -> None:
        await self.lifecycle.jobs.push("run", delay=delay, id=job_id)

    async def push_audit(self, job_id: str, delay: float, **options: Any) -> None:
        await self.audit.push(job_id, delay, **options)

    async def pause(self, owner: Any = None) -> None:
        await self.lifecycle.pause(owner)

    async def resume(self, owner: Any = None) -> None:
        await self.lifecycle.resume(owner)

    async def pause_audit(self) -> None:
        await self.audit.pause()

    async def resume_audit(self) -> None:
        await self.audit.resume()

    async def paused(self) -> list[str | None]:
        return sorted(self.lifecycle.paused(), key=lambda o: (o is not None, o or ""))

    async def audit_paused(self) -> list[str | None]:
        return sorted(self.audit.lifecycle.paused(), key=lambda o: (o is not None, o or ""))


def alarm_of(rt: nj.Runtime, object_id: str) -> float | None:
    found = engine.stored_alarm(rt, Paused.namespace, object_id)
    return None if found is None else found[0] - EPOCH


async def test_a_pause_survives_a_restart_and_resume_runs_what_is_due_at_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    runs: list[tuple[str, str, float]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=runs) as rt:
            obj = rt.get(Paused, "a")
            await obj.push("j1", 10)
            await obj.pause()
            assert await obj.paused() == [None]
            await trio.sleep(20)
        assert runs == []
        async with nj.open_runtime(engine.durable(tmp_path), env=runs) as rt:
            obj = rt.get(Paused, "a")
            await trio.sleep(80)  # t = 100
            assert runs == []
            assert await obj.paused() == [None]
            await obj.push("j2", 0)  # pushes are accepted while paused
            await trio.sleep(1)
            assert runs == []
            await obj.resume()  # t = 101
            await trio.sleep(1)
            assert runs == [("host", "j1", 101.0), ("host", "j2", 101.0)]
            assert await obj.paused() == []


async def test_paused_jobs_do_not_wake_the_object(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[str, str, float]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=runs, idle_timeout=5) as rt:
            obj = rt.get(Paused, "a")
            await obj.push("j1", 10)
            assert alarm_of(rt, "a") == 10.0
            await obj.pause("host")
            assert alarm_of(rt, "a") is None  # the alarm ignores paused jobs
            await obj.push_audit("a1", 30)
            assert alarm_of(rt, "a") == 30.0
            await obj.push("j2", 5)  # a paused owner's push does not lower the alarm
            assert alarm_of(rt, "a") == 30.0
            await trio.sleep(100)
            assert runs == [("audit", "a1", 30.0)]
            assert alarm_of(rt, "a") is None
            assert not rt.is_active(Paused.namespace, "a")  # nothing woke it since


async def test_resuming_an_owner_with_an_exclusive_job_makes_it_decide_the_alarm(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[str, str, float]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=runs) as rt:
            obj = rt.get(Paused, "a")
            await obj.pause("audit")
            await obj.push("plain", 10)
            await obj.push_audit("x", 100, exclusive=True)  # paused: it has no say
            assert alarm_of(rt, "a") == 10
            await obj.resume("audit")
            assert alarm_of(rt, "a") == 100  # raised once the resume committed
            await trio.sleep(200)
            # Pending and no longer paused, the exclusive job alone decides when the
            # object wakes: the plain job does not run before it.
            assert runs == [("host", "plain", 100), ("audit", "x", 100)]


async def test_a_pause_of_one_owner_leaves_the_others_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[str, str, float]] = []
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=runs) as rt:
            rt.events.add_listener(events.append)
            obj = rt.get(Paused, "a")
            await obj.pause_audit()  # a capability's pause is its own owner's
            assert await obj.paused() == ["audit"]
            assert await obj.audit_paused() == ["audit"]
            await obj.push("j1", 10)
            await obj.push_audit("a1", 10)
            await obj.push_audit("a2", 20)
            await trio.sleep(50)
            assert runs == [("host", "j1", 10.0)]
            await obj.resume_audit()  # t = 50
            await trio.sleep(1)
            assert runs == [("host", "j1", 10.0), ("audit", "a1", 50.0), ("audit", "a2", 50.0)]
            assert [(e.type, e.data["owner"], e.time - EPOCH) for e in events
                    if e.type.startswith("object:")] == [
                ("object:paused", "audit", 0.0), ("object:resumed", "audit", 50.0)]


async def test_a_pause_of_all_holds_every_owner_and_resume_of_all_clears_owners(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[str, str, float]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=runs) as rt:
            obj = rt.get(Paused, "a")
            await obj.pause("audit")
            await obj.pause()
            assert await obj.paused() == [None, "audit"]
            await obj.push("j1", 10)
            await obj.push_audit("a1", 10)
            await trio.sleep(20)
            await obj.resume("audit")  # the object-wide pause still holds it
            await trio.sleep(5)
            assert runs == []
            await obj.resume()  # t = 25: everything
            await trio.sleep(1)
            assert sorted(runs) == [("audit", "a1", 25.0), ("host", "j1", 25.0)]
            assert await obj.paused() == []


@pytest.mark.parametrize("owner", [5, "", "nobody", b"host"])
async def test_pause_of_a_bad_owner_is_refused_and_writes_nothing(
    autojump_clock: trio.testing.MockClock, owner: Any
) -> None:
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=[]) as rt:
            obj = rt.get(Paused, "a")
            for call in (obj.pause, obj.resume):
                with pytest.raises(nj.CapabilityError, match="owner"):
                    await call(owner)
            assert await obj.paused() == []


async def test_a_pause_lands_while_a_job_waits_for_probation_and_holds_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """y's job waits for x's (another object's) job on probation. The pause waited for
    y's turn until x's run ended (96 s), and y's job ran then, paused or not."""
    from probation_support import Suspect, strike_two

    env: dict[str, Any] = {}
    await strike_two(tmp_path, env)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(33)  # t = 35: x runs on probation since 31, y waits since 32
            y = rt.get(Suspect, "y")
            assert await y.pause() == 35.0
            await trio.sleep(200)  # x ends at 131; y stays paused
            assert env["log"][2:] == [("x", "start", 31.0), ("x", "end", 131.0)]
            assert await y.jobs() == ["j"]
            assert await y.resume() == 235.0
            await trio.sleep(5)
            assert env["log"][4:] == [("y", "start", 235.0), ("y", "end", 236.0)]
