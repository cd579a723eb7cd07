"""The memory-limit circuit breaker (DESIGN.md §3 "Long work and memory limits").

The runtime's watchdog samples ``memory_probe()`` every 0.1 s; the fake probe here goes
over the limit once, at the first sample after a job raises ``env.over``. So a breach is
detected at a sample of the watchdog's grid, and every time that follows from it is
computed from that sample time exactly as the library computes it
(``EPOCH + breach + delay``), then compared with ``==``. Each breach is also checked to
be *the first* sample at or after the moment the job went over (no sample is missed).

Everything runs under ``autojump_clock``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from conftest import EPOCH

import nursery_jobs as nj
from nursery_jobs._jobs._strikes import STRIKES_KEY

HANG = 100_000
LIMIT = 1_000_000
# One watchdog period: a breach is seen at most this long after it starts.
PERIOD = 0.1

Handler = Callable[[Any, nj.JobContext], Awaitable[Any]]


class Env:
    """Shared by the test, its objects and the fake memory probe."""

    def __init__(self, handlers: dict[str, Handler] | None = None) -> None:
        self.handlers = handlers or {}
        # (object id, job id, trio time, attempt) of every job run.
        self.runs: list[tuple[str, str, float, int]] = []
        # Events, hook calls and other happenings, in the order they happened.
        self.log: list[tuple[Any, ...]] = []
        self.events: list[nj.Event] = []
        # Every instance ever built: (object id, instance).
        self.instances: list[tuple[str, Any]] = []
        # The fake probe: over the limit at the next sample after ``over`` is raised.
        self.over = False
        self.raised_at: list[float] = []
        self.samples: list[float] = []
        self.breaches: list[float] = []

    def go_over(self) -> None:
        self.over = True
        self.raised_at.append(trio.current_time())

    def probe(self) -> int:
        now = trio.current_time()
        self.samples.append(now)
        if self.over:
            self.over = False
            self.breaches.append(now)
            return 2 * LIMIT
        return LIMIT // 2

    def listen(self, rt: nj.Runtime) -> None:
        def on_event(event: nj.Event) -> None:
            self.events.append(event)
            if event.type == "alarm:memory_limit_reset":
                self.log.append(("event", event.object_id, event.data["strikes"],
                                 event.data["sealed"]))

        rt.events.add_listener(on_event)

    def of(self, type: str) -> list[nj.Event]:
        return [e for e in self.events if e.type == type]

    def ran(self, object_id: str = "o") -> list[tuple[str, float]]:
        """(job id, time relative to EPOCH) of the runs of one object."""
        return [(job, t) for obj, job, t, _ in self.runs if obj == object_id]

    def hooks(self, object_id: str = "o") -> list[tuple[Any, ...]]:
        """The reset events and hook calls of one object, in order."""
        return [entry for entry in self.log
                if entry[0] in ("event", "capability", "host") and entry[1] == object_id]

    def first_sample_at_or_after(self, t: float) -> float:
        return min(s for s in self.samples if s >= t)


class Watcher(nj.Capability):
    """A capability that only records the memory-limit hook."""

    id = "watcher"

    def __init__(self, env: Env) -> None:
        self.env = env

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        return None

    async def on_memory_limit(self, ctx: nj.MemoryLimitContext) -> None:
        self.env.log.append(("capability", self.host.ctx.id, ctx))
        await trio.lowlevel.checkpoint()  # hooks may await: they run shielded


class Breaker(nj.DurableObject):
    """A Lifecycle object whose jobs run ``env.handlers[fn]`` (none: complete)."""

    namespace = "tests.test_breaker.Breaker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.env.instances.append((ctx.id, self))
        self.lifecycle = nj.Lifecycle.install(self)
        self.lifecycle.use(Watcher(self.env))

    async def push(self, fn: str, **kwargs: Any) -> nj.Job:
        return await self.lifecycle.jobs.push(fn, **kwargs)

    async def get_job(self, job_id: str) -> nj.Job | None:
        return self.lifecycle.jobs.get(job_id)

    async def jobs(self) -> dict[str, float]:
        """Job id -> due time relative to EPOCH."""
        return {job.id: job.time - EPOCH for job in self.lifecycle.jobs.list()}

    async def dead_letters(self) -> list[nj.DeadLetter]:
        return sorted(self.lifecycle.dead_letters(), key=lambda d: d.job.id)

    async def strikes(self) -> int:
        """The durable strike count, as stored."""
        return self.lifecycle.store.meta(STRIKES_KEY)

    async def nap(self, seconds: float) -> str:
        await trio.sleep(seconds)
        return "slept"

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.env.runs.append((self.ctx.id, ctx.job.id, nj.now() - EPOCH, ctx.attempt))
        handler = self.env.handlers.get(ctx.job.fn)
        if handler is None:
            return None
        result: nj.JobOutcome = await handler(self, ctx)
        return result

    async def on_alarm_memory_limit(self, ctx: nj.MemoryLimitContext) -> None:
        self.env.log.append(("host", self.ctx.id, ctx))


async def hog(obj: Breaker, ctx: nj.JobContext) -> Any:
    """Go over the memory limit and stay in the job until reset."""
    obj.env.go_over()
    await trio.sleep_forever()


def runtime(env: Env, **kwargs: Any) -> Any:
    return nj.open_runtime(env=env, memory_limit=LIMIT, memory_probe=env.probe, **kwargs)


def rel(trio_time: float, delay: float = 0.0) -> float:
    """``EPOCH + trio_time + delay`` relative to EPOCH, rounded as the library's epoch
    times are (a time relative to EPOCH is exact only once it went through an epoch)."""
    return EPOCH + trio_time + delay - EPOCH


def detected(env: Env, n: int) -> float:
    """The n-th breach (trio time), checked to be the watchdog's first sample at or
    after the moment the job went over."""
    assert len(env.breaches) > n, env.breaches
    breach = env.breaches[n]
    assert breach == env.first_sample_at_or_after(env.raised_at[n])
    assert env.raised_at[n] <= breach <= env.raised_at[n] + PERIOD + 1e-9
    return breach


# -- strikes, delays and the seal ------------------------------------------------------------


async def test_strikes_delay_then_the_third_seals(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env({"hog": hog})
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Breaker, "o")
            await obj.push("hog", id="j", time=EPOCH + 10)
            # Unrelated, due after it all. (An unrelated job that ran in between would
            # be a clean alarm run, which clears the count: see the next test.)
            await obj.push("f", id="u2", time=EPOCH + 1000)
            await obj.push("r", id="r1", time=EPOCH + 20, recovery_loop=True)
            await obj.push("r", id="r2", time=EPOCH + 50, recovery_loop=True)
            await obj.push("r", id="r3", time=EPOCH + 500, recovery_loop=True)
            j0 = await obj.get_job("j")

            # Strike 1: j goes over at +10, the watchdog sees it at the next sample.
            await trio.sleep(12)
            t1 = detected(env, 0)
            assert t1 == pytest.approx(10.1)
            next1 = EPOCH + t1 + 30
            assert await obj.strikes() == 1
            jobs = await obj.jobs()
            # The running job and the recovery-loop job due earlier move to now + 30;
            # a recovery-loop job due later and the unrelated jobs do not.
            assert jobs == {"j": next1 - EPOCH, "r1": next1 - EPOCH, "r2": 50, "r3": 500,
                            "u2": 1000}
            j1 = await obj.get_job("j")
            r1_1 = await obj.get_job("r1")
            assert j1 is not None and j1.time == next1 and r1_1 is not None
            assert r1_1.time == next1
            assert env.hooks() == [
                ("event", "o", 1, False),
                ("capability", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=next1, executing=j0, purged_recovery_loop_jobs=[])),
                ("host", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=next1, executing=j0, purged_recovery_loop_jobs=[])),
            ]
            assert env.ran() == [("j", 10)]

            # Strike 2: j runs again at next1 (before r1, pushed later) and goes over.
            await trio.sleep(next1 - EPOCH + 1 - trio.current_time())
            t2 = detected(env, 1)
            assert t2 == pytest.approx(40.2, abs=0.11)
            next2 = EPOCH + t2 + 60
            assert await obj.strikes() == 2
            assert await obj.jobs() == {"u2": 1000, "r3": 500, "j": next2 - EPOCH,
                                        "r1": next2 - EPOCH, "r2": next2 - EPOCH}
            j2 = await obj.get_job("j")
            r1_2, r2_2, r3_2 = [await obj.get_job(i) for i in ("r1", "r2", "r3")]
            assert j2 is not None and j2.time == next2
            assert env.hooks()[3:] == [
                ("event", "o", 2, False),
                ("capability", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=next2, executing=j1, purged_recovery_loop_jobs=[])),
                ("host", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=next2, executing=j1, purged_recovery_loop_jobs=[])),
            ]

            # Strike 3 seals: j and every recovery-loop job (r3 too, due much later)
            # go to the dead letters; the count starts again; u2 stays.
            await trio.sleep(next2 - EPOCH + 1 - trio.current_time())
            t3 = detected(env, 2)
            assert t3 == pytest.approx(100.3, abs=0.21)
            assert env.hooks()[6:] == [
                ("event", "o", 3, True),
                ("capability", "o", nj.MemoryLimitContext(
                    sealed=True, next_time=None, executing=j2,
                    purged_recovery_loop_jobs=[r1_2, r2_2, r3_2])),
                ("host", "o", nj.MemoryLimitContext(
                    sealed=True, next_time=None, executing=j2,
                    purged_recovery_loop_jobs=[r1_2, r2_2, r3_2])),
            ]
            assert await obj.jobs() == {"u2": 1000}
            assert await obj.strikes() == 0
            letters = await obj.dead_letters()
            assert [(d.job.id, d.reason, d.attempts, d.time) for d in letters] == [
                (i, "memory_limit", 0, EPOCH + t3) for i in ("j", "r1", "r2", "r3")
            ]
            [event] = [e for e in env.of("alarm:memory_limit_reset") if e.data["sealed"]]
            assert (event.data["strikes"], event.data["limit"]) == (3, 3)
            # No recovery-loop job ever ran; every run of j was attempt 1.
            assert [(job, attempt) for _, job, _, attempt in env.runs] == [
                ("j", 1), ("j", 1), ("j", 1),
            ]
            await trio.sleep(1000)
            # j ran at exactly the times it was moved to; u2 ran on time, untouched.
            assert env.ran() == [("j", 10), ("j", next1 - EPOCH), ("j", next2 - EPOCH),
                                 ("u2", 1000)]

            # The count was cleared by the seal: the next breach is strike 1 again.
            await obj.push("hog", id="k", time=EPOCH + 2100)
            await trio.sleep(2101 - trio.current_time())
            t4 = detected(env, 3)
            assert env.hooks()[-3][2:] == (1, False)
            k = await obj.get_job("k")
            assert k is not None and k.time == EPOCH + t4 + 30


def hog_first(runs: int = 1) -> Handler:
    """A job that goes over the limit on its first ``runs`` runs, then completes."""
    seen: dict[str, int] = {}

    async def handler(obj: Breaker, ctx: nj.JobContext) -> Any:
        seen[ctx.job.id] = seen.get(ctx.job.id, 0) + 1
        if seen[ctx.job.id] <= runs:
            await hog(obj, ctx)
        return None

    return handler


async def test_a_clean_alarm_run_clears_the_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env({"hog_once": hog_first(), "hog": hog})
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Breaker, "o")
            await obj.push("hog_once", id="j", time=EPOCH + 10)
            await trio.sleep(12)
            t1 = detected(env, 0)
            assert await obj.strikes() == 1
            # j's second run, at +t1+30, is clean and quiescent: the count clears.
            await trio.sleep(50)
            assert env.ran() == [("j", 10), ("j", rel(t1, 30))]
            assert await obj.strikes() == 0
            await obj.push("hog", id="k", time=EPOCH + 100)
            await trio.sleep(60)
            t2 = detected(env, 1)
            # Strike 1 again, with the first delay (30 s, not 60 s).
            assert [e[2:] for e in env.hooks() if e[0] == "event"] == [(1, False), (1, False)]
            k = await obj.get_job("k")
            assert k is not None and k.time == EPOCH + t2 + 30
            assert await obj.strikes() == 1


async def test_a_clean_run_with_tracked_work_outstanding_does_not_clear_the_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def start_work(obj: Breaker, ctx: nj.JobContext) -> Any:
        if len(env.ran()) == 1:
            await hog(obj, ctx)
        assert obj.lifecycle.track_alarm_work(trio.sleep, 5)
        return None

    env = Env({"work": start_work, "hog": hog})
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Breaker, "o")
            await obj.push("work", id="j", time=EPOCH + 10)
            await obj.push("hog", id="k", time=EPOCH + 60)
            await trio.sleep(12)
            t1 = detected(env, 0)
            # j's second run (at +t1+30) ends clean, but its tracked work is still
            # going: not quiescent, the count stays. k then goes over: strike 2.
            await trio.sleep(60)
            assert env.ran() == [("j", 10), ("j", rel(t1, 30)), ("k", 60)]
            detected(env, 1)
            assert [e[2:] for e in env.hooks() if e[0] == "event"] == [(1, False), (2, False)]
            assert await obj.strikes() == 2


# -- what the breaker leaves alone ---------------------------------------------------------


async def test_unrelated_jobs_and_other_objects_keep_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def long(obj: Breaker, ctx: nj.JobContext) -> Any:
        await trio.sleep(1)

    env = Env({"hog": hog, "long": long})
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            a, b, c = (rt.get(Breaker, i) for i in ("a", "b", "c"))
            await a.push("hog", id="j", time=EPOCH + 10)
            # Due with j, pushed after it: it did not run when the run was reset.
            await a.push("f", id="same-time", time=EPOCH + 10)
            await a.push("f", id="later", time=EPOCH + 12)
            # b: jobs before, around and after the breach; idle at the breach itself.
            for t in (5, 10.5, 20):
                await b.push("f", id=f"b{t}", time=EPOCH + t)
            # c: an object running alarm work at the breach is reset too.
            await c.push("long", id="c-long", time=EPOCH + 9.5)
            async with trio.open_nursery() as nursery:
                # A call into b spans the breach; calls are not alarm work.
                async def call_b() -> None:
                    assert await b.nap(3) == "slept"
                    env.log.append(("call returned", "b", nj.now() - EPOCH))

                await trio.sleep(9)
                nursery.start_soon(call_b)
                await trio.sleep(30)
            t1 = detected(env, 0)
            assert 10 < t1 < 10.5
            # The unrelated job of a is untouched: still due at +10, it runs as soon as
            # a is back (at the breach); the later one runs on time.
            assert env.ran("a") == [("j", 10), ("same-time", rel(t1)), ("later", 12)]
            # (b10.5 waits for the call that holds b's turn from 9 to 12.)
            assert env.ran("b") == [("b5", 5), ("b10.5", 12), ("b20", 20)]
            assert ("call returned", "b", 12) in env.log
            # b was never reset: one instance, no strike, no hook, no event.
            assert [i for i, _ in env.instances].count("b") == 1
            assert await b.strikes() == 0 and env.hooks("b") == []
            # c was running alarm work at the breach: reset, its own strike, its job moved.
            assert env.hooks("c")[0] == ("event", "c", 1, False)
            assert await c.jobs() == {"c-long": rel(t1, 30)}
            assert [i for i, _ in env.instances].count("c") == 2  # one more for the call
            assert await a.jobs() == {"j": rel(t1, 30)}
            assert await b.jobs() == {}


async def test_a_breach_during_tracked_work_counts_against_its_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def work(obj: Breaker) -> None:
        await trio.sleep(5)
        obj.env.go_over()
        await trio.sleep_forever()

    async def heartbeat(obj: Breaker, ctx: nj.JobContext) -> Any:
        if obj.ctx.id == "o" and len(env.ran()) == 1:
            assert obj.lifecycle.track_alarm_work(work, obj)
        return nj.Reschedule(nj.now() + 30)

    env = Env({"heartbeat": heartbeat})
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Breaker, "o")
            await obj.push("heartbeat", id="j", time=EPOCH + 10)
            await obj.push("f", id="r", time=EPOCH + 20, recovery_loop=True)
            j0 = await obj.get_job("j")
            await trio.sleep(12)
            # The alarm run ended at +10 (j rescheduled itself to +40); only the work
            # runs when it goes over at +15.
            assert env.ran() == [("j", 10)]
            await trio.sleep(4)
            t1 = detected(env, 0)
            assert t1 == pytest.approx(15.1)
            next1 = EPOCH + t1 + 30
            # j (which started the work) moves from +40 to now + 30; so does the
            # recovery-loop job due earlier.
            assert await obj.jobs() == {"j": next1 - EPOCH, "r": next1 - EPOCH}
            assert await obj.strikes() == 1
            assert env.hooks() == [
                ("event", "o", 1, False),
                ("capability", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=next1, executing=j0, purged_recovery_loop_jobs=[])),
                ("host", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=next1, executing=j0, purged_recovery_loop_jobs=[])),
            ]
            await trio.sleep(40)
            # The heartbeat goes on from its new time, in a new instance.
            assert env.ran() == [("j", 10), ("j", next1 - EPOCH), ("r", next1 - EPOCH)]
            assert [i for i, _ in env.instances] == ["o", "o"]


async def test_one_reset_seen_by_two_flows_counts_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def heartbeat(obj: Breaker, ctx: nj.JobContext) -> Any:
        assert obj.lifecycle.track_alarm_work(trio.sleep_forever)
        return nj.Reschedule(nj.now() + 100)

    env = Env({"heartbeat": heartbeat, "hog": hog})
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Breaker, "o")
            await obj.push("heartbeat", id="j", time=EPOCH + 10)
            await obj.push("hog", id="k", time=EPOCH + 15)
            j0, k0 = await obj.get_job("j"), await obj.get_job("k")
            await trio.sleep(20)
            t1 = detected(env, 0)
            next1 = EPOCH + t1 + 30
            # The alarm run (k) and j's tracked work both saw the reset: one strike,
            # one event, and each flow moved its own job and called the hooks with it.
            assert await obj.strikes() == 1
            assert len(env.of("alarm:memory_limit_reset")) == 1
            assert await obj.jobs() == {"j": next1 - EPOCH, "k": next1 - EPOCH}
            host_calls = [entry[2] for entry in env.hooks() if entry[0] == "host"]
            assert sorted(host_calls, key=lambda ctx: ctx.executing.id) == [
                nj.MemoryLimitContext(sealed=False, next_time=next1, executing=job,
                                      purged_recovery_loop_jobs=[])
                for job in (j0, k0)
            ]
            assert env.hooks()[0] == ("event", "o", 1, False)


# -- MemoryError ---------------------------------------------------------------------------------


async def test_memory_error_in_a_job_resets_the_object(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def greedy(obj: Breaker, ctx: nj.JobContext) -> Any:
        obj.in_memory = "lost on reset"  # type: ignore[attr-defined]
        if len(env.ran()) == 1:
            await trio.sleep(2)
            raise MemoryError()
        return None

    env = Env({"greedy": greedy})
    with trio.fail_after(HANG):
        # No watchdog at all: the MemoryError alone resets the object.
        async with nj.open_runtime(env=env) as rt:
            env.listen(rt)
            obj = rt.get(Breaker, "o")
            await obj.push("greedy", id="j", time=EPOCH + 10)
            await obj.push("f", id="other", time=EPOCH + 20)
            j0 = await obj.get_job("j")
            await trio.sleep(13)
            assert env.ran() == [("j", 10)]
            assert await obj.strikes() == 1
            # Reset at +12: the instance (and its in-memory state) is gone; the stub
            # call at +13 built a new one.
            [(_, first), (_, second)] = env.instances
            assert getattr(first, "in_memory", None) == "lost on reset"
            assert not hasattr(second, "in_memory")
            assert await obj.jobs() == {"j": 42, "other": 20}
            assert env.hooks() == [
                ("event", "o", 1, False),
                ("capability", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=EPOCH + 42, executing=j0,
                    purged_recovery_loop_jobs=[])),
                ("host", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=EPOCH + 42, executing=j0,
                    purged_recovery_loop_jobs=[])),
            ]
            assert "MemoryError" in env.of("alarm:memory_limit_reset")[0].data["error"]
            await trio.sleep(8)
            # The unrelated job ran on time, in a clean run: that cleared the count.
            assert await obj.strikes() == 0
            await trio.sleep(30)
            # The reset used up no attempt; no dead letter.
            assert [(job, t, attempt) for _, job, t, attempt in env.runs] == [
                ("j", 10, 1), ("other", 20, 1), ("j", 42, 1),
            ]
            assert await obj.dead_letters() == []
            assert await obj.strikes() == 0


async def test_memory_error_in_tracked_work_resets_the_object(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def work() -> None:
        await trio.sleep(3)
        raise MemoryError("tracked")

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
            j0 = await obj.get_job("j")
            await trio.sleep(14)
            # The work failed at +13: the job that started it moves to +43 (from +110).
            assert await obj.jobs() == {"j": 43}
            assert await obj.strikes() == 1
            # Reset at +13; the stub call at +14 built a new instance.
            assert [i for i, _ in env.instances] == ["o", "o"]
            assert env.hooks()[1:] == [
                ("capability", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=EPOCH + 43, executing=j0,
                    purged_recovery_loop_jobs=[])),
                ("host", "o", nj.MemoryLimitContext(
                    sealed=False, next_time=EPOCH + 43, executing=j0,
                    purged_recovery_loop_jobs=[])),
            ]
            assert env.of("alarm:tracked_work_failed") == []
            await trio.sleep(30)
            assert env.ran() == [("j", 10), ("j", 43)]


# -- a plain DurableObject -----------------------------------------------------------------------


class Plain(nj.DurableObject):
    """No Lifecycle: its alarm is retried like a Durable Object's (2 s doubling)."""

    namespace = "tests.test_breaker.Plain"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.env.instances.append((ctx.id, self))

    async def arm(self, time: float) -> None:
        self.ctx.storage.set_alarm(time)

    async def get_alarm(self) -> float | None:
        return self.ctx.storage.get_alarm()

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.env.log.append(("alarm", nj.now() - EPOCH, info.retry_count, info.is_retry, self))
        if info.retry_count == 0:
            self.env.go_over()
            await trio.sleep_forever()


async def test_a_plain_object_whose_alarm_runs_is_reset_and_its_alarm_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with runtime(env) as rt:
            env.listen(rt)
            obj = rt.get(Plain, "p")
            await obj.arm(EPOCH + 10)
            await trio.sleep(20)
            t1 = detected(env, 0)
            [(_, t_first, n_first, is_retry_first, first),
             (_, t_retry, n_retry, is_retry, second)] = env.log
            assert (t_first, n_first, is_retry_first) == (10, 0, False)
            assert (n_retry, is_retry) == (1, True)
            # Reset at the breach (a new instance runs the retry), retried 2 s later.
            assert t_retry == rel(t1, 2)
            assert first is not second
            [retry] = env.of("alarm:retry")
            assert (retry.data["retry"], retry.data["delay"]) == (1, 2.0)
            assert "memory limit" in retry.data["error"]
            assert await obj.get_alarm() is None
            assert env.of("alarm:memory_limit_reset") == []  # no Lifecycle, no breaker
