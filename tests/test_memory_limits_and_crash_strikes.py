"""DESIGN §3 "Long work and memory limits" and §2 "Stopping": the breaker's count and
tracked work, out of memory however it arrives, resets that move only their own job, the
hooks of a seal, crash strikes across deaths and graceful stops.

Each test states a promise of the design; an ``xfail(strict=True)`` marks one the code
breaks today (the reason names what goes wrong). Everything runs under ``autojump_clock``
with the fake memory probe of ``test_breaker``.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH
from test_breaker import HANG, Breaker, Env, runtime

import nursery_jobs as nj


class Ticker(Breaker):
    """A Breaker whose ``on_alarm`` starts leaky tracked work once per activation."""

    namespace = "tests.test_memory_limits_and_crash_strikes.Ticker"

    async def on_alarm(self) -> None:
        if getattr(self, "_started", False):
            return

        async def leak() -> None:
            await trio.sleep(1)
            self.env.go_over()
            await trio.sleep_forever()

        self._started = True
        assert self.lifecycle.track_alarm_work(leak)


async def tick(obj: Breaker, ctx: nj.JobContext) -> Any:
    return nj.Reschedule(nj.now() + 20)


async def test_on_alarm_tracked_work_outstanding_keeps_the_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env({"tick": tick})
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Ticker, "o")
            await obj.push("tick", id="t", time=EPOCH + 10)
            await trio.sleep(100)
            # Three alarm runs, each leaving its on_alarm work outstanding, each reset by
            # that work: consecutive resets, so strikes 1, 2 and then the seal.
            strikes = [e[2:] for e in env.hooks() if e[0] == "event"]
            assert strikes[:3] == [(1, False), (2, False), (3, True)], strikes


async def _raise_memory_error() -> None:
    await trio.sleep(2)
    raise MemoryError("in a child task")


async def test_a_memory_error_from_a_nursery_in_a_job_resets_the_object(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def greedy(obj: Breaker, ctx: nj.JobContext) -> Any:
        if len(env.ran()) == 1:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_raise_memory_error)
        return None

    env = Env({"greedy": greedy})
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            env.listen(rt)
            obj = rt.get(Breaker, "o")
            await obj.push("greedy", id="j", time=EPOCH + 10)
            await trio.sleep(13)
            # As a bare MemoryError (test_breaker): strike 1, the job moved to +12+30,
            # no attempt used.
            assert len(env.of("alarm:memory_limit_reset")) == 1
            assert await obj.strikes() == 1
            assert await obj.jobs() == {"j": 42}
            await trio.sleep(40)
            assert [(job, t, attempt) for _, job, t, attempt in env.runs] == [
                ("j", 10, 1), ("j", 42, 1)]


async def test_a_memory_error_from_a_nursery_in_tracked_work_resets_the_object(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def work() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_raise_memory_error)

    async def heartbeat(obj: Breaker, ctx: nj.JobContext) -> Any:
        if len(env.ran()) == 1:
            assert obj.lifecycle.track_alarm_work(work)
        return nj.Reschedule(nj.now() + 100)

    env = Env({"heartbeat": heartbeat})
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env) as rt:
            env.listen(rt)
            obj = rt.get(Breaker, "o")
            await obj.push("heartbeat", id="j", time=EPOCH + 10)
            await trio.sleep(14)
            assert env.of("alarm:tracked_work_failed") == []
            assert await obj.strikes() == 1
            # The work failed at +12: the job that started it moves to +42 (from +110).
            assert await obj.jobs() == {"j": 42}


class Quitter(nj.DurableObject):
    """Its job ``bad`` asks the process to stop (SystemExit); it records the hooks."""

    namespace = "tests.test_memory_limits_and_crash_strikes.Quitter"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env["runs"].append((ctx.job.id, ctx.attempt, nj.now() - EPOCH))
        if ctx.job.fn == "bad":
            raise SystemExit(3)

    async def on_alarm_memory_limit(self, ctx: nj.MemoryLimitContext) -> None:
        self.env["hooks"].append((ctx.sealed, None if ctx.executing is None
                                  else ctx.executing.id))

    async def push(self, job_id: str, fn: str, at: float) -> None:
        await self.lifecycle.jobs.push(fn, id=job_id, time=EPOCH + at)

    async def letters(self) -> list[tuple[str, str]]:
        return [(d.job.id, d.reason) for d in self.lifecycle.dead_letters()]


async def test_a_job_sealed_by_its_own_system_exit_calls_the_hooks(
    autojump_clock: trio.testing.MockClock, tmp_path: Any
) -> None:
    env: dict[str, Any] = {"runs": [], "hooks": []}
    async with nj.open_runtime(tmp_path, env=env) as rt:
        await rt.get(Quitter, "q").push("bad", "bad", at=1)
    for _ in range(3):
        with pytest.raises(SystemExit):
            with trio.fail_after(2000):
                async with nj.open_runtime(tmp_path, env=env):
                    await trio.sleep_forever()
    with trio.fail_after(2000):
        async with nj.open_runtime(tmp_path, env=env) as rt:
            assert await rt.get(Quitter, "q").letters() == [("bad", "crash")]
            await trio.sleep(10)
    assert len(env["runs"]) == 3
    assert env["hooks"] == [(True, "bad")]


class Stopper(nj.DurableObject):
    """``flaky`` fails its first attempt, then hangs while ``env['hang']``; ``quit``
    raises SystemExit on its first run, then hangs while ``env['hang']``."""

    namespace = "tests.test_memory_limits_and_crash_strikes.Stopper"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        runs = self.env["runs"]
        runs.append((ctx.job.id, ctx.attempt, nj.now() - EPOCH))
        if ctx.job.fn == "flaky" and len(runs) == 1:
            raise ValueError("first attempt")
        if ctx.job.fn == "quit" and len(runs) == 1:
            raise SystemExit(3)
        if self.env["hang"]:
            await trio.sleep_forever()

    async def push(self, job_id: str, fn: str, at: float) -> None:
        await self.lifecycle.jobs.push(
            fn, id=job_id, time=EPOCH + at,
            retry=nj.RetryOptions(max_attempts=3, base_delay=1.0, jitter=False))

    async def state(self, job_id: str) -> tuple[float, int, int] | None:
        row = self.lifecycle.store.row(job_id)
        return None if row is None else (row.job.time - EPOCH, row.attempts, row.crash_strikes)


async def test_a_graceful_stop_keeps_the_attempt_and_the_job_reruns_at_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Any
) -> None:
    env: dict[str, Any] = {"runs": [], "hang": True}
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path, env=env) as rt:
            await rt.get(Stopper, "s").push("j", "flaky", at=1)
            await trio.sleep(10)  # attempt 1 failed at +1; attempt 2 hangs from +2
        assert env["runs"] == [("j", 1, 1), ("j", 2, 2)]
        await trio.sleep(100)
        env["hang"] = False
        async with nj.open_runtime(tmp_path, env=env) as rt:
            await trio.sleep(1)
            # Run again at once, as attempt 2 again (the stop used up no attempt).
            assert env["runs"][2:] == [("j", 2, 110)]
            assert await rt.get(Stopper, "s").state("j") is None


async def test_a_graceful_stop_of_a_job_on_probation_keeps_its_crash_strike(
    autojump_clock: trio.testing.MockClock, tmp_path: Any
) -> None:
    env: dict[str, Any] = {"runs": [], "hang": True}
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path, env=env) as rt:
            await rt.get(Stopper, "s").push("j", "quit", at=1)
        with pytest.raises(SystemExit):
            async with nj.open_runtime(tmp_path, env=env):
                await trio.sleep_forever()
        assert env["runs"] == [("j", 1, 1)]
        async with nj.open_runtime(tmp_path, env=env) as rt:
            assert await rt.get(Stopper, "s").state("j") == (31, 0, 1)
            await trio.sleep(40)  # runs at +31 (strike 1: 30 s), hangs; then a stop
        assert env["runs"][1:] == [("j", 1, 31)]
        async with nj.open_runtime(tmp_path, env=env) as rt:
            stub = rt.get(Stopper, "s")
            state = await stub.state("j")
            # Its strike kept, no new one, due as it was (at once).
            assert state is not None and state[1:] == (0, 1) and state[0] <= 41
        env["hang"] = False
        async with nj.open_runtime(tmp_path, env=env) as rt:
            await trio.sleep(1)
            assert env["runs"][2:] == [("j", 1, 41)]
            assert await rt.get(Stopper, "s").state("j") is None


class Worker(nj.Capability):
    """A capability whose job ``x`` starts leaky tracked work and completes."""

    id = "worker"

    def __init__(self, env: Env) -> None:
        self.env = env

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        env = self.env

        async def leak() -> None:
            await trio.sleep(5)
            env.go_over()
            await trio.sleep_forever()

        assert self.host.lifecycle.track_alarm_work(leak)  # type: ignore[attr-defined]
        return None


class Shared(Breaker):
    namespace = "tests.test_memory_limits_and_crash_strikes.Shared"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.worker = Worker(self.env)
        self.lifecycle.use(self.worker)

    async def push_worker(self, job_id: str, at: float) -> None:
        await self.worker.lifecycle.jobs.push("leak", id=job_id, time=EPOCH + at)


async def test_tracked_work_of_a_capability_job_never_moves_the_hosts_job_of_that_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Shared, "o")
            await obj.push_worker("x", at=10)
            await trio.sleep(12)  # the capability's x ran at +10 and completed
            assert await obj.jobs() == {}
            await obj.push("later", id="x", time=EPOCH + 100)
            await trio.sleep(10)  # its work went over at +15: reset, strike 1
            assert len(env.of("alarm:memory_limit_reset")) == 1
            # The host's own x is no job of that work: it stays where it was pushed.
            assert await obj.jobs() == {"x": 100}


class Heart(nj.DurableObject):
    """A heartbeat job: starts work (that runs until the process dies) once per
    activation, reschedules itself every 10 s."""

    namespace = "tests.test_memory_limits_and_crash_strikes.Heart"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)
        self.working = False

    async def push(self, at: float) -> None:
        await self.lifecycle.jobs.push("hb", id="hb", time=EPOCH + at)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.env["runs"].append(nj.now() - EPOCH)
        if not self.working:
            self.working = True
            assert self.lifecycle.track_alarm_work(trio.sleep_forever)
        return nj.Reschedule(nj.now() + 10)

    async def state(self) -> tuple[float, int, int, list[str]] | None:
        row = self.lifecycle.store.row("hb")
        letters = [d.reason for d in self.lifecycle.dead_letters()]
        return None if row is None else (row.job.time - EPOCH, row.attempts,
                                          row.crash_strikes, letters)


def killed_copy(source: Any, target: Any) -> None:
    """What a SIGKILL of the runtime on ``source`` would leave, as ``target``: its files
    as they are now (no write is half done between two Trio checkpoints)."""
    shutil.copytree(source, target,
                    ignore=shutil.ignore_patterns("runtime.lock", "*-shm"))


@pytest.mark.xfail(strict=True, reason=(
    "DESIGN §3: a process death during a job's tracked work is a crash strike of that"
    " job, sealed at the limit (the OOM killer's loop); the heartbeat's next run on"
    " probation restarts the work and reschedules itself, which clears the strike"
    " (JobTable.later) while that work still runs: every death is strike 1, never a seal"))
async def test_deaths_during_a_heartbeats_tracked_work_add_up_to_a_seal(
    autojump_clock: trio.testing.MockClock, tmp_path: Any
) -> None:
    env: dict[str, Any] = {"runs": []}
    seen = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path / "0", env=env) as rt:
            await rt.get(Heart, "h").push(at=1)
            await trio.sleep(5)  # hb ran at +1, its work runs
            killed_copy(tmp_path / "0", tmp_path / "1")
        for death in (1, 2, 3):
            async with nj.open_runtime(tmp_path / str(death), env=env) as rt:
                seen.append(await rt.get(Heart, "h").state())
                await trio.sleep(400)  # hb runs again (on probation), its work too
                killed_copy(tmp_path / str(death), tmp_path / str(death + 1))
    # Strike 1 (30 s), strike 2 (60 s), then the seal: three deaths in that work.
    assert [s[2] if s else None for s in seen[:2]] == [1, 2], seen
    assert seen[2] is None, seen


class Flaky(nj.Capability):
    """Its ``on_start`` fails while ``env['fail_start']`` is above 0 (counting down)."""

    id = "flaky"

    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env

    async def on_start(self) -> None:
        if self.env["fail_start"] > 0:
            self.env["fail_start"] -= 1
            raise RuntimeError("on_start failed once")


class Doomed(nj.DurableObject):
    """Its job hangs (until the process dies); it records the memory-limit hooks."""

    namespace = "tests.test_memory_limits_and_crash_strikes.Doomed"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)
        self.lifecycle.use(Flaky(self.env))

    async def push(self, at: float) -> None:
        await self.lifecycle.jobs.push("hang", id="j", time=EPOCH + at)

    async def on_job(self, ctx: nj.JobContext) -> None:
        await trio.sleep_forever()

    async def on_alarm_memory_limit(self, ctx: nj.MemoryLimitContext) -> None:
        self.env["hooks"].append((ctx.sealed, None if ctx.executing is None
                                  else ctx.executing.id))

    async def letters(self) -> list[str]:
        return [d.job.id for d in self.lifecycle.dead_letters()]


async def test_the_seal_hook_of_a_crashed_job_survives_a_failing_on_start(
    autojump_clock: trio.testing.MockClock, tmp_path: Any
) -> None:
    env: dict[str, Any] = {"hooks": [], "fail_start": 0}
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path / "0", env=env) as rt:
            await rt.get(Doomed, "d").push(at=1)
            await trio.sleep(5)
            killed_copy(tmp_path / "0", tmp_path / "1")
        for death in (1, 2):
            async with nj.open_runtime(tmp_path / str(death), env=env) as rt:
                await trio.sleep(400)  # j runs again after its strike's delay, and hangs
                killed_copy(tmp_path / str(death), tmp_path / str(death + 1))
        env["fail_start"] = 1
        async with nj.open_runtime(tmp_path / "3", env=env) as rt:
            await trio.sleep(100)  # the alarm run is retried (2 s): on_start then works
            assert await rt.get(Doomed, "d").letters() == ["j"]
    assert env["fail_start"] == 0
    assert env["hooks"] == [(True, "j")]


async def test_a_death_in_a_retry_uses_no_attempt_and_delays_it_by_its_strike(
    autojump_clock: trio.testing.MockClock, tmp_path: Any
) -> None:
    env: dict[str, Any] = {"runs": [], "hang": True}
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path / "0", env=env) as rt:
            await rt.get(Stopper, "s").push("j", "flaky", at=1)
            await trio.sleep(5)  # attempt 1 failed at +1; attempt 2 hangs from +2
            killed_copy(tmp_path / "0", tmp_path / "1")
        assert env["runs"] == [("j", 1, 1), ("j", 2, 2)]
        env["hang"] = False
        async with nj.open_runtime(tmp_path / "1", env=env) as rt:
            # Crash strike 1: 30 s from the start, its attempt count as it was (1).
            assert await rt.get(Stopper, "s").state("j") == (35, 1, 1)
            await trio.sleep(40)
            assert env["runs"][2:] == [("j", 2, 35)]
            assert await rt.get(Stopper, "s").state("j") is None
