"""The Lifecycle job queue (DESIGN.md §3, start of §4): the alarm time rule, ordering,
stable ids and ownership, outcomes, retries and dead letters, single-flight, events,
durability across eviction and restarts, argument checks, and capabilities.

Every timer test runs under ``autojump_clock`` and asserts exact virtual times. Times in
the logs are relative to ``EPOCH`` (``nj.now() - EPOCH``); the offsets used are dyadic
fractions, so the arithmetic is exact.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from conftest import EPOCH, engine
from held_calls import ByRef, inside, run_held

import nursery_jobs as nj


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


# A generous virtual-time bound: under autojump a hang jumps here and fails the test.
HANG = 100_000


class DrawRng(random.Random):
    """A jitter source whose ``uniform`` is ``draw`` (injected with install(rng=...))."""

    def __init__(self, draw: Callable[[float, float], float]) -> None:
        super().__init__()
        self.draw = draw

    def uniform(self, a: float, b: float) -> float:
        return self.draw(a, b)


@pytest.fixture
def exact_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full-jitter backoff always draws its upper bound, so retry times are exact."""
    monkeypatch.setattr(Host, "rng", DrawRng(lambda a, b: b))


# -- the test object and capability ------------------------------------------------------

Handler = Callable[[Any, nj.JobContext], Awaitable[Any]]


class Env:
    """Shared between the test and its objects (passed as the runtime's ``env``)."""

    def __init__(
        self,
        handlers: dict[str, Handler] | None = None,
        caps: Callable[[], list[nj.Capability]] | None = None,
    ) -> None:
        # (owner, job id, time - EPOCH, attempt, payload) per job run, in run order.
        self.runs: list[tuple[str, str, float, int, Any]] = []
        # Other things that happened, in order: ("start", id, t), ("on_alarm", id, t), ...
        self.log: list[tuple[Any, ...]] = []
        self.handlers = handlers or {}
        self.caps = caps or (lambda: [])
        self.events: list[nj.Event] = []
        self.state: dict[str, Any] = {}

    async def handle(self, obj: Any, owner: str, ctx: nj.JobContext) -> Any:
        job = ctx.job
        self.runs.append((owner, job.id, rel(), ctx.attempt, job.payload))
        handler = self.handlers.get(job.fn)
        if handler is None:
            return None
        return await handler(obj, ctx)

    def ran(self) -> list[tuple[str, float]]:
        """(job id, time) of every run."""
        return [(job_id, t) for _owner, job_id, t, _attempt, _payload in self.runs]

    def of(self, type: str) -> list[nj.Event]:
        return [e for e in self.events if e.type == type]


def rel() -> float:
    return nj.now() - EPOCH


class Host(nj.DurableObject):
    """A Lifecycle object whose jobs are handled by ``env.handlers[fn]``."""

    namespace = "tests.test_lifecycle.Host"
    rng: random.Random | None = None  # the retry jitter source (tests inject one)

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self, rng=self.rng)
        self.lifecycle.use(*self.env.caps())

    async def on_start(self) -> None:
        self.env.log.append(("start", self.ctx.id, rel()))

    async def push(self, fn: str, **kwargs: Any) -> nj.Job:
        return await self.lifecycle.jobs.push(fn, **kwargs)

    async def cancel(self, job_id: str) -> bool:
        return await self.lifecycle.jobs.cancel(job_id)

    async def reschedule(self, job_id: str, time: Any) -> bool:
        return await self.lifecycle.jobs.reschedule(job_id, time)

    async def jobs(self) -> list[nj.Job]:
        return self.lifecycle.jobs.list()

    async def get_job(self, job_id: str) -> nj.Job | None:
        return self.lifecycle.jobs.get(job_id)

    async def dead_letters(self) -> list[nj.DeadLetter]:
        return self.lifecycle.dead_letters()

    async def run(self, ref: ByRef) -> ByRef:
        """Run a function inside the object (test access to its internals): ``inside``."""
        return await run_held(self, ref)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        result: nj.JobOutcome = await self.env.handle(self, "host", ctx)
        return result

    async def on_alarm(self) -> None:
        self.env.log.append(("on_alarm", self.ctx.id, rel()))


class Cap(nj.Capability):
    """A capability whose jobs go through ``env.handlers`` like the host's."""

    def __init__(self, cap_id: str, env: Env) -> None:
        self.id = cap_id  # type: ignore[misc]
        self.env = env

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        result: nj.JobOutcome = await self.env.handle(self, self.id, ctx)
        return result


def with_caps(*ids: str) -> Callable[[Env], Callable[[], list[nj.Capability]]]:
    return lambda env: lambda: [Cap(cap_id, env) for cap_id in ids]


def make_env(handlers: dict[str, Handler] | None = None, caps: tuple[str, ...] = ()) -> Env:
    env = Env(handlers)
    env.caps = with_caps(*caps)(env)
    return env


def cap(obj: Host, cap_id: str) -> Cap:
    found = obj.lifecycle.capabilities[cap_id]
    assert isinstance(found, Cap)
    return found


def alarm(rt: nj.Runtime, object_id: str = "o") -> float | None:
    """The object's alarm in the runtime catalog, relative to EPOCH."""
    found = engine.stored_alarm(rt, Host.namespace, object_id)
    return None if found is None else found[0] - EPOCH


def listen(rt: nj.Runtime, env: Env) -> None:
    rt.events.add_listener(env.events.append)


# -- the alarm time rule ---------------------------------------------------------------


async def test_alarm_is_the_earliest_job_across_owners(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env(caps=("a", "b"))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("h", id="h", time=EPOCH + 50)
            assert alarm(rt) == 50
            await inside(obj, lambda o: cap(o, "a").lifecycle.jobs.push(
                "x", id="ca", time=EPOCH + 20))
            assert alarm(rt) == 20
            await inside(obj, lambda o: cap(o, "b").lifecycle.jobs.push(
                "x", id="cb", time=EPOCH + 80))
            assert alarm(rt) == 20
            assert await inside(obj, lambda o: cap(o, "a").lifecycle.jobs.cancel("ca")) is True
            # Raised again to the next job, which belongs to another owner.
            assert alarm(rt) == 50
            await trio.sleep(100)
            assert [(owner, job, t) for owner, job, t, _, _ in env.runs] == [
                ("host", "h", 50),
                ("b", "cb", 80),
            ]
            assert alarm(rt) is None


@pytest.mark.parametrize("exclusive_first", [True, False])
async def test_exclusive_job_time_wins_over_an_earlier_plain_job(
    autojump_clock: trio.testing.MockClock, exclusive_first: bool
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            if exclusive_first:
                await obj.push("x", id="excl", time=EPOCH + 60, exclusive=True)
                await obj.push("p", id="plain", time=EPOCH + 10)
            else:
                await obj.push("p", id="plain", time=EPOCH + 10)
                assert alarm(rt) == 10
                await obj.push("x", id="excl", time=EPOCH + 60, exclusive=True)
            # The exclusive job alone decides when the object wakes (unclamped: later
            # than the plain job).
            assert alarm(rt) == 60
            await obj.push("p", id="plain2", time=EPOCH + 5)
            assert alarm(rt) == 60
            await trio.sleep(59)
            assert env.runs == []
            await trio.sleep(2)
            # At +60 every due job runs, in (time, push order).
            assert env.ran() == [("plain2", 60), ("plain", 60), ("excl", 60)]
            assert alarm(rt) is None


async def test_exclusive_job_cancelled_gives_the_alarm_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("p", id="plain", time=EPOCH + 10)
            await obj.push("x", id="excl", time=EPOCH + 60, exclusive=True)
            assert alarm(rt) == 60
            assert await obj.cancel("excl") is True
            assert alarm(rt) == 10
            await trio.sleep(100)
            assert env.ran() == [("plain", 10)]


async def test_same_time_jobs_run_fifo_by_push_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env(caps=("c",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            # Ids in reverse alphabetical order, owners mixed, one anonymous: only the
            # push order may decide.
            await obj.push("f", id="z", time=EPOCH + 10)
            await inside(obj, lambda o: cap(o, "c").lifecycle.jobs.push(
                "f", id="y", time=EPOCH + 10))
            anonymous = await obj.push("f", time=EPOCH + 10)
            await obj.push("f", id="b", time=EPOCH + 10)
            await obj.push("f", id="a", time=EPOCH + 10)
            await obj.push("f", id="early", time=EPOCH + 9)
            await trio.sleep(20)
            assert env.ran() == [
                ("early", 9),
                ("z", 10),
                ("y", 10),
                (anonymous.id, 10),
                ("b", 10),
                ("a", 10),
            ]


async def test_stable_id_replaces_in_place(autojump_clock: trio.testing.MockClock) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            first = await obj.push("old", id="x", time=EPOCH + 10, payload=1)
            assert first.created_at == EPOCH
            await obj.push("f", id="y", time=EPOCH + 20)
            await trio.sleep(3)
            second = await obj.push("new", id="x", time=EPOCH + 20, payload=2)
            # One row; the replacement keeps the creation time (and push position).
            assert second.created_at == EPOCH
            jobs = await obj.jobs()
            assert [(j.id, j.fn, j.time, j.payload, j.created_at) for j in jobs] == [
                ("x", "new", EPOCH + 20, 2, EPOCH),
                ("y", "f", EPOCH + 20, None, EPOCH),
            ]
            assert await obj.get_job("x") == second
            # The alarm follows the replacement up, not just down.
            assert alarm(rt) == 20
            await trio.sleep(100)
            assert [(job, t, payload) for _, job, t, _, payload in env.runs] == [
                ("x", 20, 2),
                ("y", 20, None),
            ]
            assert await obj.jobs() == []


async def test_replacement_keeps_a_retried_job_from_inheriting_attempts(
    autojump_clock: trio.testing.MockClock, exact_jitter: None
) -> None:
    async def fail(obj: Any, ctx: nj.JobContext) -> Any:
        raise RuntimeError("boom")

    env = make_env({"fail": fail})
    retry = nj.RetryOptions(max_attempts=3, base_delay=4, max_delay=4)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("fail", id="x", time=EPOCH + 10, retry=retry)
            await trio.sleep(12)  # attempt 1 at +10, attempt 2 due at +14
            await obj.push("fail", id="x", time=EPOCH + 20, retry=retry)
            await trio.sleep(100)
            # A fresh job: three attempts again, from 1.
            assert [(t, a) for _, _, t, a, _ in env.runs] == [
                (10, 1), (20, 1), (24, 2), (28, 3),
            ]
            assert [d.attempts for d in await obj.dead_letters()] == [3]


async def test_an_exclusive_job_of_a_capability_holds_back_an_earlier_plain_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env(caps=("side",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("p", id="plain", time=EPOCH + 10)
            await inside(obj, lambda o: cap(o, "side").lifecycle.jobs.push(
                "x", id="x", time=EPOCH + 100, exclusive=True))
            assert alarm(rt) == 100
            await trio.sleep(200)
            assert [(owner, job_id, t) for owner, job_id, t, _, _ in env.runs] == [
                ("host", "plain", 100), ("side", "x", 100)]


async def test_an_early_wake_runs_nothing_while_an_exclusive_job_is_pending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Whatever set the alarm early (a stale alarm, a fallback), the alarm run honours
    # the rule: nothing runs before the exclusive job's time, and it re-arms for it.
    env = make_env(caps=("side",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("p", id="plain", time=EPOCH + 10)
            await inside(obj, lambda o: cap(o, "side").lifecycle.jobs.push(
                "x", id="x", time=EPOCH + 100, exclusive=True))
            # Behind the Lifecycle's back:
            await inside(obj, lambda o: trio_value(o.lifecycle.claim.set(EPOCH + 20)))
            assert alarm(rt) == 20
            await trio.sleep(30)
            assert env.runs == []
            assert alarm(rt) == 100
            await trio.sleep(100)
            assert [(owner, job_id, t) for owner, job_id, t, _, _ in env.runs] == [
                ("host", "plain", 100), ("side", "x", 100)]


async def test_jobs_list_is_by_due_time_then_push_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # DESIGN 3: list() -> list[Job] (by due time); run order would put priority first.
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("f", id="later", delay=3600, priority=5)
            await obj.push("f", id="soon", delay=10)
            await obj.push("f", id="soon too", delay=10)  # the same time: push order
            assert [job.id for job in await obj.jobs()] == ["soon", "soon too", "later"]


# -- ownership ---------------------------------------------------------------------------


@pytest.mark.parametrize("holder", ["host", "cap"])
async def test_cross_owner_push_raises_and_leaves_the_job_untouched(
    autojump_clock: trio.testing.MockClock, holder: str
) -> None:
    env = make_env(caps=("cap",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")

            def jobs_of(o: Host, who: str) -> nj.Jobs:
                return o.lifecycle.jobs if who == "host" else cap(o, who).lifecycle.jobs

            other = "cap" if holder == "host" else "host"

            async def setup(o: Host) -> nj.Job:
                return await jobs_of(o, holder).push(
                    "mine", id="shared", time=EPOCH + 30, payload="kept"
                )

            original = await inside(obj, setup)

            async def intrude(o: Host) -> None:
                await jobs_of(o, other).push("theirs", id="shared", time=EPOCH + 5, payload="x")

            with pytest.raises(nj.JobOwnershipError, match="shared") as info:
                await inside(obj, intrude)
            assert isinstance(info.value, ValueError)
            assert (info.value.job_id, info.value.owner, info.value.holder) == (
                "shared", other, holder)

            async def check(o: Host) -> None:
                assert jobs_of(o, holder).get("shared") == original
                assert jobs_of(o, other).get("shared") is None
                assert jobs_of(o, other).list() == []
                # Cancel and reschedule are scoped too: not found, nothing changed.
                assert await jobs_of(o, other).cancel("shared") is False
                assert await jobs_of(o, other).reschedule("shared", EPOCH + 1) is False
                assert jobs_of(o, holder).get("shared") == original

            await inside(obj, check)
            assert alarm(rt) == 30
            await trio.sleep(100)
            assert [(owner, job, t, payload) for owner, job, t, _, payload in env.runs] == [
                (holder, "shared", 30, "kept"),
            ]


async def test_cancel_and_reschedule_return_values(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            assert await obj.cancel("nope") is False
            assert await obj.reschedule("nope", EPOCH + 5) is False
            assert alarm(rt) is None
            await obj.push("f", id="a", time=EPOCH + 10)
            await obj.push("f", id="b", time=EPOCH + 20)
            assert await obj.reschedule("a", EPOCH + 40) is True
            assert alarm(rt) == 20  # raised: a no longer comes first
            assert (await obj.get_job("a")).time == EPOCH + 40  # type: ignore[union-attr]
            when = dt.datetime.fromtimestamp(EPOCH + 30, tz=dt.timezone(dt.timedelta(hours=-3)))
            assert await obj.reschedule("b", when) is True
            assert alarm(rt) == 30
            assert await obj.cancel("b") is True
            assert await obj.cancel("b") is False
            assert await obj.reschedule("b", EPOCH + 1) is False
            assert alarm(rt) == 40
            await trio.sleep(100)
            assert env.ran() == [("a", 40)]
            assert await obj.cancel("a") is False  # done: gone
            assert alarm(rt) is None


async def test_past_and_omitted_times_run_at_the_next_alarm(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await trio.sleep(5)

            async def push_three(o: Host) -> nj.Job:  # (in one turn: none runs before all are in)
                now_job = await o.lifecycle.jobs.push("f", id="now")
                await o.lifecycle.jobs.push("f", id="past", time=EPOCH - 100)
                await o.lifecycle.jobs.push("f", id="delay", delay=dt.timedelta(seconds=2.5))
                return now_job

            now_job = await inside(obj, push_three)
            assert now_job.time == EPOCH + 5
            await trio.sleep(10)
            assert env.ran() == [("past", 5), ("now", 5), ("delay", 7.5)]


# -- outcomes ----------------------------------------------------------------------------


async def test_yield_runs_again_at_once_after_the_other_due_jobs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def split(obj: Any, ctx: nj.JobContext) -> Any:
        env.state["splits"] = n = env.state.get("splits", 0) + 1
        return nj.YIELD if n < 3 else None

    env = make_env({"split": split})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("split", id="a", time=EPOCH + 10)
            await obj.push("f", id="b", time=EPOCH + 10)
            await obj.push("f", id="c", time=EPOCH + 11)
            await trio.sleep(10.5)
            # At +10: a yields, then b, then a again at once (a new alarm run, same
            # virtual time), and once more; c's time has not come.
            assert env.ran() == [("a", 10), ("b", 10), ("a", 10), ("a", 10)]
            assert [attempt for _, _, _, attempt, _ in env.runs] == [1, 1, 1, 1]
            assert [e[0] for e in env.log if e[0] == "on_alarm"] == ["on_alarm"] * 3
            await trio.sleep(10)
            assert env.ran()[-1] == ("c", 11)
            assert await obj.jobs() == []


async def test_reschedule_outcome_keeps_the_job(autojump_clock: trio.testing.MockClock) -> None:
    async def again(obj: Any, ctx: nj.JobContext) -> Any:
        n = len(env.runs)
        if n == 1:
            return nj.Reschedule(nj.now() + 7)
        if n == 2:  # an aware datetime works as well
            return nj.Reschedule(dt.datetime.fromtimestamp(nj.now() + 3.5, tz=dt.UTC))
        return None

    env = make_env({"again": again})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            pushed = await obj.push("again", id="r", time=EPOCH + 10, payload={"k": 1})
            await trio.sleep(12)
            kept = await obj.get_job("r")
            assert kept is not None
            assert kept.time == EPOCH + 17
            assert (kept.payload, kept.created_at, kept.fn) == ({"k": 1}, EPOCH, "again")
            assert alarm(rt) == 17
            await trio.sleep(100)
            assert [(t, attempt) for _, _, t, attempt, _ in env.runs] == [
                (10, 1), (17, 1), (20.5, 1),
            ]
            assert pushed.id == "r"
            assert await obj.jobs() == []
            assert alarm(rt) is None


async def test_a_change_of_the_running_job_is_undone_when_the_run_then_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A run's push of its own id is one of its writes: when the run then fails, the push
    goes with them (exactly once), and the job is retried as it was: attempt 2, the old
    payload, nothing at the pushed time."""

    async def work(obj: Host, ctx: nj.JobContext) -> Any:
        if len(env.runs) > 1:
            return None
        await obj.lifecycle.jobs.push("work", id="j", time=EPOCH + 30, payload=2)
        raise RuntimeError("boom")

    env = make_env({"work": work})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("work", id="j", time=EPOCH + 10, payload=1)
            await trio.sleep(100)
            [(first, a1, p1), (second, a2, p2)] = [
                (t, attempt, payload) for _, _, t, attempt, payload in env.runs
            ]
            assert (first, a1, p1) == (10, 1, 1)
            assert 10 <= second < 10.1 and (a2, p2) == (2, 1)  # RetryOptions' first backoff
            assert await obj.jobs() == []
            assert await obj.dead_letters() == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # A same-id push during the run wins over the run's outcome ...
        ("push", [(10, 1, 1), (30, 1, 2)]),
        ("push_then_reschedule", [(10, 1, 1), (30, 1, 2)]),
        # ... and so does a reschedule or a cancel.
        ("reschedule", [(10, 1, 1), (40, 1, 1)]),
        ("cancel", [(10, 1, 1)]),
    ],
)
async def test_change_of_the_running_job_during_its_run_wins(
    autojump_clock: trio.testing.MockClock,
    exact_jitter: None,
    change: str,
    expected: list[tuple[float, int, int]],
) -> None:
    async def work(obj: Host, ctx: nj.JobContext) -> Any:
        if len(env.runs) > 1:
            return None
        jobs = obj.lifecycle.jobs
        if change.startswith("push"):
            await jobs.push("work", id="j", time=EPOCH + 30, payload=2)
        elif change == "reschedule":
            assert await jobs.reschedule("j", EPOCH + 40) is True
        else:
            assert await jobs.cancel("j") is True
        if change in ("push_then_reschedule", "cancel"):
            return nj.Reschedule(EPOCH + 15)
        return None

    env = make_env({"work": work})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("work", id="j", time=EPOCH + 10, payload=1)
            await trio.sleep(100)
            assert [(t, attempt, payload) for _, _, t, attempt, payload in env.runs] == expected
            assert await obj.jobs() == []
            assert await obj.dead_letters() == []
            assert alarm(rt) is None


@pytest.mark.parametrize("change", ["reschedule", "cancel"])
async def test_a_job_that_changes_a_later_due_job_is_heeded(
    autojump_clock: trio.testing.MockClock, change: str
) -> None:
    async def first(obj: Host, ctx: nj.JobContext) -> Any:
        if change == "reschedule":
            assert await obj.lifecycle.jobs.reschedule("b", EPOCH + 50) is True
        else:
            assert await obj.lifecycle.jobs.cancel("b") is True

    env = make_env({"first": first})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("first", id="a", time=EPOCH + 10)
            await obj.push("f", id="b", time=EPOCH + 10)
            await trio.sleep(100)
            # b was due when the alarm run began; it is re-read before it runs.
            assert env.ran() == ([("a", 10), ("b", 50)] if change == "reschedule"
                                 else [("a", 10)])


async def test_self_rescheduling_job_keeps_its_retries(
    autojump_clock: trio.testing.MockClock, exact_jitter: None
) -> None:
    # A job that moves itself with jobs.reschedule() (instead of returning Reschedule)
    # ran cleanly each time: its attempts must not pile up across those runs.
    async def beat(obj: Host, ctx: nj.JobContext) -> Any:
        if len(env.runs) <= 3:
            assert await obj.lifecycle.jobs.reschedule("hb", nj.now() + 10)
            return None
        if ctx.attempt == 1:
            raise RuntimeError("one bad beat")
        return None

    env = make_env({"beat": beat})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("beat", id="hb", time=EPOCH + 10,
                           retry=nj.RetryOptions(max_attempts=2, base_delay=1, max_delay=1))
            await trio.sleep(100)
            assert [(t, a) for _, _, t, a, _ in env.runs] == [
                (10, 1), (20, 1), (30, 1), (40, 1), (41, 2),
            ]
            assert await obj.dead_letters() == []
            assert await obj.jobs() == []


async def test_invalid_outcome_is_a_failure_of_that_job(
    autojump_clock: trio.testing.MockClock, exact_jitter: None
) -> None:
    async def bad(obj: Any, ctx: nj.JobContext) -> Any:
        return 42 if ctx.attempt == 1 else "nope"

    env = make_env({"bad": bad})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            await obj.push("bad", id="bad", time=EPOCH + 10,
                           retry=nj.RetryOptions(max_attempts=2, base_delay=2))
            await obj.push("f", id="fine", time=EPOCH + 10)
            await obj.push("f", id="later", time=EPOCH + 11)
            await trio.sleep(100)
            # The alarm went on: the next job ran in the same run, no alarm retry.
            assert [(job, t, a) for _, job, t, a, _ in env.runs] == [
                ("bad", 10, 1), ("fine", 10, 1), ("later", 11, 1), ("bad", 12, 2),
            ]
            assert env.of("alarm:retry") == []
            assert [e.data["attempt"] for e in env.of("job:retry")] == [1]
            [letter] = await obj.dead_letters()
            assert letter.job.id == "bad"
            assert letter.attempts == 2
            assert "invalid job outcome" in letter.error
            assert "'nope'" in letter.error


async def test_on_alarm_runs_after_the_jobs(autojump_clock: trio.testing.MockClock) -> None:
    env = make_env(caps=("c",))

    async def logging_handler(obj: Any, ctx: nj.JobContext) -> Any:
        env.log.append(("job", ctx.job.id, rel()))

    env.handlers["f"] = logging_handler
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("f", id="a", time=EPOCH + 10)
            await inside(obj, lambda o: cap(o, "c").lifecycle.jobs.push(
                "f", id="b", time=EPOCH + 10))
            await trio.sleep(20)
            assert [e for e in env.log if e[0] != "start"] == [
                ("job", "a", 10),
                ("job", "b", 10),
                ("on_alarm", "o", 10),
            ]


# -- retries and dead letters -------------------------------------------------------------


async def test_retry_timing_and_attempt_numbers(
    autojump_clock: trio.testing.MockClock, exact_jitter: None
) -> None:
    async def fail(obj: Any, ctx: nj.JobContext) -> Any:
        raise RuntimeError(f"boom {ctx.attempt}")

    env = make_env({"fail": fail})
    # Bounds: min(1.5, 0.5 * 2**(n-1)) = 0.5, 1.0, 1.5, 1.5 after attempts 1..4.
    retry = nj.RetryOptions(max_attempts=5, base_delay=0.5, max_delay=1.5)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            await obj.push("fail", id="r", time=EPOCH + 10, retry=retry)
            await trio.sleep(10.75)
            # The wait is a durable re-time of the job, not a sleep in the alarm.
            job = await obj.get_job("r")
            assert job is not None and job.time == EPOCH + 11.5
            assert alarm(rt) == 11.5
            await trio.sleep(100)
            assert [(t, attempt) for _, _, t, attempt, _ in env.runs] == [
                (10, 1), (10.5, 2), (11.5, 3), (13, 4), (14.5, 5),
            ]
            retries = env.of("job:retry")
            assert [(e.time - EPOCH, e.data["attempt"], e.data["delay"]) for e in retries] == [
                (10, 1, 0.5), (10.5, 2, 1.0), (11.5, 3, 1.5), (13, 4, 1.5),
            ]
            assert await obj.jobs() == []
            assert alarm(rt) is None


async def test_retry_delay_is_drawn_from_the_full_jitter_range(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        draws.append((a, b))
        return a  # the low end: the retry is due at once

    monkeypatch.setattr(Host, "rng", DrawRng(uniform))

    async def fail(obj: Any, ctx: nj.JobContext) -> Any:
        raise RuntimeError("boom")

    env = make_env({"fail": fail})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("fail", id="r", time=EPOCH + 10)  # default RetryOptions
            await trio.sleep(100)
            assert draws == [(0.0, 0.1), (0.0, 0.2)]
            assert [(t, attempt) for _, _, t, attempt, _ in env.runs] == [
                (10, 1), (10, 2), (10, 3),
            ]
            assert [d.attempts for d in await obj.dead_letters()] == [3]


async def test_retries_do_not_block_other_due_jobs(
    autojump_clock: trio.testing.MockClock, exact_jitter: None
) -> None:
    async def fail(obj: Any, ctx: nj.JobContext) -> Any:
        raise RuntimeError("boom")

    env = make_env({"fail": fail})
    retry = nj.RetryOptions(max_attempts=3, base_delay=10, max_delay=10)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("fail", id="a", time=EPOCH + 10, retry=retry)
            await obj.push("f", id="b", time=EPOCH + 10)
            await obj.push("f", id="c", time=EPOCH + 11)
            await trio.sleep(100)
            assert env.ran() == [("a", 10), ("b", 10), ("c", 11), ("a", 20), ("a", 30)]


async def test_dead_letter_after_the_last_attempt(
    autojump_clock: trio.testing.MockClock, exact_jitter: None
) -> None:
    async def fail(obj: Any, ctx: nj.JobContext) -> Any:
        raise KeyError(f"missing {ctx.attempt}")

    env = make_env({"fail": fail})
    retry = nj.RetryOptions(max_attempts=2, base_delay=1, max_delay=1)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            pushed = await obj.push("fail", id="d", time=EPOCH + 10, payload=[1, 2], retry=retry)
            await trio.sleep(100)
            assert [(t, a) for _, _, t, a, _ in env.runs] == [(10, 1), (11, 2)]
            [letter] = await obj.dead_letters()
            # The job as it stood at its last attempt (re-timed for it).
            assert letter.job == attrs.evolve(pushed, time=EPOCH + 11)
            assert letter.attempts == 2
            assert letter.error == "KeyError: 'missing 2'"
            assert letter.reason == "failed"
            assert letter.time == EPOCH + 11
            assert await obj.jobs() == []
            assert alarm(rt) is None
            [event] = env.of("job:dead_letter")
            assert (event.time, event.data["id"], event.data["attempts"]) == (EPOCH + 11, "d", 2)


class Guarded(Cap):
    """A capability with an ``on_job_error`` hook that returns ``env.state["outcome"]``."""

    async def on_job_error(self, ctx: nj.JobContext, error: Exception) -> nj.JobOutcome:
        self.env.log.append(("on_job_error", ctx.job.id, rel(), ctx.attempt, repr(error)))
        outcome = self.env.state["outcome"]
        if callable(outcome):
            outcome = outcome()
        result: nj.JobOutcome = outcome
        return result


@pytest.mark.parametrize("outcome", ["reschedule", "none", "raises"])
async def test_on_job_error_outcome_is_honoured(
    autojump_clock: trio.testing.MockClock, exact_jitter: None, outcome: str
) -> None:
    async def fail(obj: Any, ctx: nj.JobContext) -> Any:
        if len(env.runs) <= 2:
            raise RuntimeError(f"boom {ctx.attempt}")

    def hook_outcome() -> nj.JobOutcome:
        if outcome == "reschedule":
            return nj.Reschedule(nj.now() + 100)
        if outcome == "raises":
            raise RuntimeError("the hook failed too")
        return None

    env = Env({"fail": fail})
    env.caps = lambda: [Guarded("g", env)]
    env.state["outcome"] = hook_outcome
    retry = nj.RetryOptions(max_attempts=2, base_delay=1, max_delay=1)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await inside(obj, lambda o: cap(o, "g").lifecycle.jobs.push(
                "fail", id="j", time=EPOCH + 10, retry=retry))
            await trio.sleep(500)
            hooks = [e for e in env.log if e[0] == "on_job_error"]
            assert hooks == [("on_job_error", "j", 11, 2, "RuntimeError('boom 2')")]
            if outcome == "reschedule":
                # The job stays, runs at the time the hook chose, with fresh attempts.
                assert [(t, a) for _, _, t, a, _ in env.runs] == [(10, 1), (11, 2), (111, 1)]
                assert await obj.dead_letters() == []
            else:
                assert [(t, a) for _, _, t, a, _ in env.runs] == [(10, 1), (11, 2)]
                [letter] = await obj.dead_letters()
                assert (letter.job.id, letter.job.owner, letter.attempts) == ("j", "g", 2)
                assert letter.error == "RuntimeError: boom 2"
                assert await inside(obj,
                    lambda o: trio_value(cap(o, "g").lifecycle.dead_letters())
                ) == [letter]
            assert await obj.jobs() == []
            assert alarm(rt) is None


async def trio_value(value: Any) -> Any:
    await trio.lowlevel.checkpoint()
    return value


async def test_attempt_counts_across_retries_and_survives_a_restart(
    autojump_clock: trio.testing.MockClock, exact_jitter: None, tmp_path: Path
) -> None:
    async def flaky(obj: Any, ctx: nj.JobContext) -> Any:
        if ctx.attempt < 3:
            raise RuntimeError(f"boom {ctx.attempt}")

    env = make_env({"flaky": flaky})
    retry = nj.RetryOptions(max_attempts=3, base_delay=10, max_delay=20)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("flaky", id="j", time=EPOCH + 10, retry=retry)
            await trio.sleep(15)  # attempt 1 failed at +10; attempt 2 due at +20
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(5)
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:  # attempt 3 due at +40
            await trio.sleep(100)
            assert [(t, a) for _, _, t, a, _ in env.runs] == [(10, 1), (20, 2), (40, 3)]
            assert await rt.get(Host, "o").jobs() == []
            assert await rt.get(Host, "o").dead_letters() == []


# -- single-flight -------------------------------------------------------------------------


async def test_singleflight_skips_while_in_progress_and_resets_when_hung(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def beat(obj: Host, ctx: nj.JobContext) -> Any:
        env.log.append(("tracked", obj.lifecycle.track_alarm_work(trio.sleep, 100), rel()))
        return nj.Reschedule(nj.now() + 5)

    env = make_env({"beat": beat})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            await obj.push("beat", id="s", time=EPOCH + 10, singleflight=True, hung_timeout=20)
            await obj.push("f", id="p", time=EPOCH + 15)
            await trio.sleep(12)
            assert env.ran() == [("s", 10)]
            # Next due at +15, but in flight since +10: the plain job decides.
            assert alarm(rt) == 15
            await trio.sleep(4)
            # At +15 s was due but its work still runs: skipped.
            assert env.ran() == [("s", 10), ("p", 15)]
            # In flight counts from started + hung_timeout.
            assert alarm(rt) == 30
            assert env.of("job:hung_reset") == []
            await trio.sleep(15)
            assert env.ran() == [("s", 10), ("p", 15), ("s", 30)]
            [reset] = env.of("job:hung_reset")
            assert (reset.time, reset.data["id"], reset.data["age"]) == (EPOCH + 30, "s", 20)
            assert [e for e in env.log if e[0] == "tracked"] == [
                ("tracked", True, 10), ("tracked", True, 30),
            ]
            assert alarm(rt) == 50
            job = await obj.get_job("s")
            assert job is not None and job.time == EPOCH + 35


async def test_singleflight_runs_once_its_work_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def beat(obj: Host, ctx: nj.JobContext) -> Any:
        if len(env.runs) == 1:
            assert obj.lifecycle.track_alarm_work(trio.sleep, 8)
            return nj.Reschedule(nj.now() + 5)
        return None

    env = make_env({"beat": beat})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            await obj.push("beat", id="s", time=EPOCH + 10, singleflight=True, hung_timeout=20)
            await trio.sleep(100)
            # Due at +15, in progress until its work ends at +18: it runs then.
            assert env.ran() == [("s", 10), ("s", 18)]
            assert env.of("job:hung_reset") == []
            assert alarm(rt) is None


async def test_track_alarm_work_outside_an_alarm_returns_false(
    autojump_clock: trio.testing.MockClock,
) -> None:
    done: list[float] = []

    async def work() -> None:
        done.append(rel())

    env = make_env(caps=("c",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")

            async def outside(o: Host) -> tuple[bool, bool]:
                return (
                    o.lifecycle.track_alarm_work(work),
                    cap(o, "c").lifecycle.track_alarm_work(work),
                )

            assert await inside(obj, outside) == (False, False)
            await trio.sleep(10)
            assert done == []


# -- events --------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [9, 10])
async def test_backlog_warning_at_ten_due_jobs_of_one_owner(
    autojump_clock: trio.testing.MockClock, count: int
) -> None:
    env = make_env(caps=("c",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            for i in range(count):
                await obj.push("f", id=f"h{i}", time=EPOCH + 10)

            async def cap_jobs(o: Host) -> None:
                for i in range(count - 1):  # always one short of the host
                    await cap(o, "c").lifecycle.jobs.push("f", id=f"c{i}", time=EPOCH + 10)

            await inside(obj, cap_jobs)
            await trio.sleep(20)
            assert len(env.runs) == 2 * count - 1
            warnings = env.of("job:backlog_warning")
            if count < 10:
                assert warnings == []
            else:
                [event] = warnings
                assert (event.time, event.data) == (EPOCH + 10, {"owner": "host", "count": 10})


async def test_backlog_warning_once_per_backlog_not_per_alarm(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22 #10: a drain of 100k jobs over many alarm runs printed 4,793 warnings.
    A backlog is warned of when it builds up; again only after it has cleared (an alarm
    run found fewer than ten due jobs of that owner) and built up again."""
    caplog.set_level(logging.WARNING, "nursery_jobs")
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            # Alarm runs at 10, 11 and 12 each find 20 due jobs (one backlog); the run
            # at 13 finds 5 (it cleared); the run at 14 finds 20 again (a new one).
            for at, count in ((10, 20), (11, 20), (12, 20), (13, 5), (14, 20)):
                for i in range(count):
                    await obj.push("f", id=f"j{at}-{i}", time=EPOCH + at)
            await trio.sleep(20)
            assert len(env.runs) == 85
            warnings = env.of("job:backlog_warning")
            assert [(e.time - EPOCH, e.data) for e in warnings] == [
                (10, {"owner": "host", "count": 20}), (14, {"owner": "host", "count": 20})]
            logged = [r for r in caplog.records if "due jobs of" in r.getMessage()]
            assert len(logged) == 2


async def test_backlog_warning_counts_the_first_window_of_a_deep_queue(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26: counting every due job read the whole backlog at each alarm run's start
    (309 ms at 1,000,000 deep). The count stops at ``BACKLOG_WINDOW`` due jobs (by due
    time), and the log says the backlog is at least that deep; the warning still comes
    once, and every job runs."""
    from nursery_jobs._jobs._table import BACKLOG_WINDOW

    caplog.set_level(logging.WARNING, "nursery_jobs")
    env = make_env()
    deep = BACKLOG_WINDOW + 5
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")

            async def fill(o: Host) -> None:
                with o.ctx.storage.transaction():
                    for i in range(deep):
                        await o.lifecycle.jobs.push("f", id=f"j{i}", time=EPOCH + 10)

            await inside(obj, fill)
            await trio.sleep(20)
            assert len(env.runs) == deep
            [event] = env.of("job:backlog_warning")
            assert (event.time - EPOCH, event.data) == (10, {"owner": "host",
                                                            "count": BACKLOG_WINDOW})
            [logged] = [r.getMessage() for r in caplog.records
                        if "due jobs of" in r.getMessage()]
            assert f"{BACKLOG_WINDOW:,} or more due jobs of 'host'" in logged


async def test_slow_dispatch_event(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def slow(obj: Any, ctx: nj.JobContext) -> Any:
        await trio.sleep(ctx.job.payload)

    env = make_env({"slow": slow})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            await obj.push("slow", id="quick", time=EPOCH + 10, payload=4.5, hung_timeout=5)
            await obj.push("slow", id="slow", time=EPOCH + 10, payload=12, hung_timeout=5)
            await obj.push("slow", id="slow2", time=EPOCH + 40, payload=3, hung_timeout=2)
            await trio.sleep(100)
            assert env.ran() == [("quick", 10), ("slow", 14.5), ("slow2", 40)]
            assert [(e.time - EPOCH, e.data["id"], e.data["threshold"])
                    for e in env.of("job:slow_dispatch")] == [
                (19.5, "slow", 5), (42, "slow2", 2),
            ]
            assert any(
                r.levelno == logging.WARNING and "hung_timeout" in r.getMessage()
                and "'slow'" in r.getMessage()
                for r in caplog.records
            )


async def test_slow_dispatch_event_once_per_slow_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Quick jobs that never checkpoint come first in a fresh object's first alarm run;
    # the slow one after them must still give exactly one event.
    async def slow(obj: Any, ctx: nj.JobContext) -> Any:
        if ctx.job.payload:
            await trio.sleep(ctx.job.payload)

    env = make_env({"slow": slow})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            for i in range(3):
                await obj.push("slow", id=f"q{i}", time=EPOCH + 10, payload=0, hung_timeout=5)
            await obj.push("slow", id="s", time=EPOCH + 10, payload=12, hung_timeout=5)
            await obj.push("slow", id="s2", time=EPOCH + 30, payload=8, hung_timeout=5)
            await trio.sleep(100)
            assert [(e.time - EPOCH, e.data["id"]) for e in env.of("job:slow_dispatch")] == [
                (15, "s"), (35, "s2"),
            ]


async def test_one_slow_dispatch_watchdog_per_object_while_its_alarm_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def watchdogs(o: Host) -> int:
        return sum("SlowDispatchWatch" in task.name for task in o.ctx.nursery.child_tasks)

    seen: list[int] = []

    async def count(obj: Any, ctx: nj.JobContext) -> None:
        await trio.lowlevel.checkpoint()
        seen.append(watchdogs(obj))

    env = make_env({"count": count})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            for i in range(5):  # jobs that never checkpoint, in one alarm run
                await obj.push("f", id=f"q{i}", time=EPOCH + 10)
            await obj.push("count", id="count", time=EPOCH + 10)
            await trio.sleep(20)
            assert len(env.runs) == 6 and seen == [1]

            async def after_the_run(o: Host) -> int:
                await trio.lowlevel.checkpoint()
                return watchdogs(o)

            # It ends with the run: an idle object keeps no task of its own.
            assert await inside(obj, after_the_run) == 0


# -- missing handlers ------------------------------------------------------------------------


class Bare(nj.DurableObject):
    """A Lifecycle host without ``on_job``."""

    namespace = "tests.test_lifecycle.Bare"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> nj.Job:
        return await self.lifecycle.jobs.push(fn, **kwargs)

    async def jobs(self) -> list[nj.Job]:
        return self.lifecycle.jobs.list()


async def test_host_job_without_on_job_is_dropped_with_a_log(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            obj = rt.get(Bare, "b")
            await obj.push("orphan", id="lost", time=EPOCH + 10)
            await obj.push("orphan", id="lost2", time=EPOCH + 10)
            await trio.sleep(20)
            assert await obj.jobs() == []
            assert engine.stored_alarm(rt, Bare.namespace, "b") is None
            errors = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 2
            assert "'lost'" in errors[0].getMessage() and "'orphan'" in errors[0].getMessage()
            assert [(e.time, e.data["id"]) for e in env.of("job:dropped")] == [
                (EPOCH + 10, "lost"), (EPOCH + 10, "lost2"),
            ]


class Silent(nj.Capability):
    """A capability that does not override ``on_job``."""

    id = "silent"


async def test_capability_job_without_on_job_is_dropped_with_a_log(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    env = make_env()
    env.caps = lambda: [Silent(), Cap("c", env)]
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")

            async def push(o: Host) -> None:
                await o.lifecycle.capabilities["silent"].lifecycle.jobs.push(
                    "f", id="s", time=EPOCH + 10)
                await cap(o, "c").lifecycle.jobs.push("f", id="c", time=EPOCH + 10)

            await inside(obj, push)
            await trio.sleep(20)
            # Dropped; the next job of the run still ran.
            assert env.ran() == [("c", 10)]
            assert await inside(obj,
                lambda o: trio_value(o.lifecycle.store.rows())) == []
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1 and "'s'" in errors[0] and "'silent'" in errors[0]


async def test_job_of_a_missing_capability_is_dropped_with_a_log(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    env = make_env(caps=("gone",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Host, "o")
            await inside(obj, lambda o: cap(o, "gone").lifecycle.jobs.push(
                "f", id="g", time=EPOCH + 10))
            await obj.push("f", id="h", time=EPOCH + 10)
        env.caps = lambda: []  # redeployed without the capability
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(20)
            assert env.ran() == [("h", 10)]
            assert await inside(rt.get(Host, "o"),
                lambda o: trio_value(o.lifecycle.store.rows())) == []
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1 and "'g'" in errors[0] and "'gone'" in errors[0]


# -- durability ------------------------------------------------------------------------------


async def test_jobs_survive_eviction_and_run_on_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env(caps=("c",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env, idle_timeout=1) as rt:
            obj = rt.get(Host, "o")
            await obj.push("f", id="h", time=EPOCH + 100, payload="host")
            await inside(obj, lambda o: cap(o, "c").lifecycle.jobs.push(
                "f", id="c", time=EPOCH + 100.5, payload="cap"))
            await trio.sleep(5)
            assert rt.statistics().active_objects == 0  # evicted at +1
            assert alarm(rt) == 100
            await trio.sleep(200)
            assert [(owner, job, t, payload) for owner, job, t, _, payload in env.runs] == [
                ("host", "h", 100, "host"),
                ("c", "c", 100.5, "cap"),
            ]
            assert env.log[:2] == [("start", "o", 0), ("start", "o", 100)]
            assert alarm(rt) is None
            assert rt.statistics().active_objects == 0


async def test_jobs_survive_a_restart_and_run_on_time(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = make_env(caps=("c",))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("f", id="late", time=EPOCH + 100)
            await obj.push("f", id="soon", time=EPOCH + 20, payload={"n": 1})
            await inside(obj, lambda o: cap(o, "c").lifecycle.jobs.push(
                "f", id="c", time=EPOCH + 20))
        await trio.sleep(50)  # down while "soon" and "c" fall due
        assert env.runs == []
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            assert alarm(rt) == 20
            await trio.sleep(1)
            # Overdue jobs run at once on reopen, in (time, push order).
            assert env.ran() == [("soon", 50), ("c", 50)]
            assert env.runs[0][4] == {"n": 1}
            assert alarm(rt) == 100
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(100)
            assert env.ran() == [("soon", 50), ("c", 50), ("late", 100)]
            assert alarm(rt) is None
            assert await rt.get(Host, "o").jobs() == []


async def test_runtime_shutdown_during_a_job_uses_no_attempt(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async def long(obj: Any, ctx: nj.JobContext) -> Any:
        if len(env.runs) == 1:
            await trio.sleep(100)
        else:
            raise RuntimeError("fails after the restart")

    env = make_env({"long": long})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            await obj.push("long", id="j", time=EPOCH + 10,
                           retry=nj.RetryOptions(max_attempts=1))
            await trio.sleep(15)
            assert env.ran() == [("j", 10)]
        # Graceful shutdown at +15: the job stays, the alarm is not lost.
        assert env.of("job:dead_letter") == []
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            listen(rt, env)
            await trio.sleep(100)
            # The same (only) attempt again: the shutdown used none, and no crash strike.
            assert [a for _, _, _, a, _ in env.runs] == [1, 1]
            # It stayed due: the object wakes as soon as the runtime reopens.
            assert env.ran() == [("j", 10), ("j", 15)]
            assert env.of("job:crash_strike") == []
            [letter] = await rt.get(Host, "o").dead_letters()
            assert letter.attempts == 1
            assert await rt.get(Host, "o").jobs() == []


# -- arguments -------------------------------------------------------------------------------

NAIVE = dt.datetime(2027, 1, 1, 12, 0)
BAD_PUSHES: dict[str, Callable[[], tuple[Any, dict[str, Any]]]] = {
    "empty fn": lambda: ("", {}),
    "fn not a str": lambda: (42, {}),
    "nan time": lambda: ("f", {"time": math.nan}),
    "inf time": lambda: ("f", {"time": math.inf}),
    "-inf time": lambda: ("f", {"time": -math.inf}),
    "naive datetime": lambda: ("f", {"time": NAIVE}),
    "time and delay": lambda: ("f", {"delay": 1}),
    "nan delay": lambda: ("f", {"time": None, "delay": math.nan}),
    "negative delay": lambda: ("f", {"time": None, "delay": -1}),
    "max_attempts 0": lambda: ("f", {"retry": nj.RetryOptions(max_attempts=0)}),
    "negative base_delay": lambda: ("f", {"retry": nj.RetryOptions(base_delay=-0.5)}),
    "negative max_delay": lambda: ("f", {"retry": nj.RetryOptions(max_delay=-1)}),
    "retry not RetryOptions": lambda: ("f", {"retry": {"max_attempts": 2}}),
    "blank id": lambda: ("f", {"id": "   "}),
    "empty id": lambda: ("f", {"id": ""}),
    "negative hung_timeout": lambda: ("f", {"hung_timeout": -1}),
    "singleflight not a bool": lambda: ("f", {"singleflight": "yes"}),
}


@pytest.mark.parametrize("case", BAD_PUSHES)
async def test_invalid_push_raises_and_writes_nothing(
    autojump_clock: trio.testing.MockClock, case: str
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            for existing in (None, EPOCH + 100):
                if existing is not None:
                    await obj.push("keep", id="keep", time=existing)
                before = await obj.jobs()
                with pytest.raises(nj.JobError) as info:
                    fn, kwargs = BAD_PUSHES[case]()  # (RetryOptions refuses at once)
                    await obj.push(fn, **{"id": "keep", "time": EPOCH + 5, **kwargs})
                assert isinstance(info.value, ValueError)
                if case.endswith(" id"):  # (the error carries the id it refused)
                    assert info.value.job_id == BAD_PUSHES[case]()[1]["id"]
                assert await obj.jobs() == before
                assert alarm(rt) == (None if existing is None else 100)
            await trio.sleep(200)
            assert env.ran() == [("keep", 100)]


def _cycle() -> Any:
    items: list[Any] = [1]
    items.append(items)
    return {"items": items}


BAD_PAYLOADS: dict[str, Callable[[], Any]] = {
    "object": object,
    "function": lambda: (lambda: None),
    "cycle": _cycle,
    "nested instance": lambda: {"a": [1, {"b": Env()}]},
}


@pytest.mark.parametrize("kind", BAD_PAYLOADS)
async def test_bad_payload_raises_codec_error_and_writes_nothing(
    autojump_clock: trio.testing.MockClock, kind: str
) -> None:
    payload = BAD_PAYLOADS[kind]()
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            with pytest.raises(nj.CodecError):
                await obj.push("f", id="j", time=EPOCH + 5, payload=payload)
            assert await obj.jobs() == []
            assert alarm(rt) is None
            kept = await obj.push("f", id="j", time=EPOCH + 100, payload="ok")
            with pytest.raises(nj.CodecError):
                await obj.push("f", id="j", time=EPOCH + 5, payload=payload)
            assert await obj.jobs() == [kept]
            assert alarm(rt) == 100


async def test_oversized_payload_raises_codec_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            with pytest.raises(nj.CodecError):
                await obj.push("f", id="j", payload="x" * (1024 * 1024 + 1))
            assert await obj.jobs() == []
            assert alarm(rt) is None


@pytest.mark.parametrize("when", [math.nan, math.inf, NAIVE, "soon"])
async def test_invalid_reschedule_time_raises_and_changes_nothing(
    autojump_clock: trio.testing.MockClock, when: Any
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            kept = await obj.push("f", id="j", time=EPOCH + 100)
            with pytest.raises(nj.JobError) as info:
                await obj.reschedule("j", when)
            assert info.value.job_id == "j"
            assert await obj.jobs() == [kept]
            assert alarm(rt) == 100


def test_retry_options_validation() -> None:
    for bad in ({"max_attempts": 0}, {"max_attempts": -1}, {"max_attempts": 1.5},
                {"max_attempts": True}, {"base_delay": -1}, {"max_delay": -0.1},
                {"base_delay": math.nan}, {"max_delay": math.inf}):
        with pytest.raises(nj.JobError):
            nj.RetryOptions(**bad)
    assert nj.RetryOptions() == nj.RetryOptions(max_attempts=3, base_delay=0.1, max_delay=3.0)
    assert nj.RetryOptions(max_attempts=1, base_delay=0, max_delay=0).max_attempts == 1


async def test_storage_set_alarm_is_refused_on_a_lifecycle_object(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("f", id="j", time=EPOCH + 50)

            async def meddle(o: Host) -> None:
                for refused in (lambda: o.ctx.storage.set_alarm(EPOCH + 5),
                                o.ctx.storage.delete_alarm):
                    with pytest.raises(nj.AlarmOwnedError) as info:
                        refused()
                    # The message names the object, the error carries it (DESIGN §7).
                    assert f"the Lifecycle owns the alarm of {Host.namespace}/o" in str(
                        info.value)
                    assert (info.value.namespace, info.value.object_id,
                            info.value.owner) == (Host.namespace, "o", "Lifecycle")
                assert o.ctx.storage.get_alarm() == EPOCH + 50

            await inside(obj, meddle)
            assert alarm(rt) == 50
            await trio.sleep(100)
            assert env.ran() == [("j", 50)]


class Configured(nj.DurableObject):
    """Installs a Lifecycle with the options in ``env`` (and uses what ``env`` names)."""

    namespace = "tests.test_lifecycle.Configured"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        options, use = ctx.env
        self.lifecycle = nj.Lifecycle.install(self, **options)
        if use is not None:
            self.lifecycle.use(use)

    async def ping(self) -> str:
        return "pong"


@pytest.mark.parametrize(("options", "use", "named"), [
    ({"max_alarm_memory_limit_strikes": 0}, None, "max_alarm_memory_limit_strikes"),
    ({"completion_group": 0}, None, "completion_group"),
    ({"dead_letter_limit": 0}, None, "dead_letter_limit"),
    ({"rng": "seed"}, None, "rng"),
    ({}, "not a capability", "use"),
])
async def test_a_bad_lifecycle_option_is_a_nursery_jobs_error_naming_it(
    autojump_clock: trio.testing.MockClock, options: dict[str, Any], use: Any, named: str,
) -> None:
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=(options, use)) as rt:
            with pytest.raises(nj.NurseryJobsError, match=named) as caught:
                await rt.get(Configured, "c").ping()
            assert isinstance(caught.value, (ValueError, TypeError))


def test_a_lifecycle_host_that_is_no_durable_object_is_refused_naming_it() -> None:
    with pytest.raises(nj.NurseryJobsError, match="host must be a DurableObject") as caught:
        nj.Lifecycle.install("not an object")  # type: ignore[arg-type]
    assert isinstance(caught.value, TypeError)


# -- capabilities ----------------------------------------------------------------------------


async def test_use_refuses_a_duplicate_id_and_use_after_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=make_env(caps=("a", "a"))) as rt:
            with pytest.raises(nj.CapabilityError, match="'a'"):
                await rt.get(Host, "dup").jobs()
        async with nj.open_runtime(engine.location, env=make_env(caps=("host",))) as rt:
            with pytest.raises(nj.CapabilityError, match="'host'"):
                await rt.get(Host, "named-host").jobs()
        env = make_env(caps=("a",))
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")

            async def check(o: Host) -> None:
                # Startup ran before this call (once per activation): too late to add.
                assert o.lifecycle.started
                with pytest.raises(nj.CapabilityError, match="before startup"):
                    o.lifecycle.use(Cap("c", env))
                assert list(o.lifecycle.capabilities) == ["a"]

            await inside(obj, check)


async def test_capability_sees_only_its_own_jobs(autojump_clock: trio.testing.MockClock) -> None:
    env = make_env(caps=("a", "b"))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")

            async def check(o: Host) -> None:
                host_job = await o.lifecycle.jobs.push("f", id="h", time=EPOCH + 10)
                a_job = await cap(o, "a").lifecycle.jobs.push("f", id="a1", time=EPOCH + 20)
                a_job2 = await cap(o, "a").lifecycle.jobs.push("f", id="a2", time=EPOCH + 5)
                b_job = await cap(o, "b").lifecycle.jobs.push("f", id="b1", time=EPOCH + 30)
                assert o.lifecycle.jobs.list() == [host_job]
                assert cap(o, "a").lifecycle.jobs.list() == [a_job2, a_job]
                assert cap(o, "b").lifecycle.jobs.list() == [b_job]
                assert cap(o, "a").lifecycle.jobs.get("h") is None
                assert cap(o, "a").lifecycle.jobs.get("b1") is None
                assert o.lifecycle.jobs.get("a1") is None
                assert cap(o, "b").lifecycle.jobs.get("b1") == b_job
                assert (a_job.owner, b_job.owner, host_job.owner) == ("a", "b", "host")

            await inside(obj, check)
            await trio.sleep(50)
            assert [(owner, job, t) for owner, job, t, _, _ in env.runs] == [
                ("a", "a2", 5), ("host", "h", 10), ("a", "a1", 20), ("b", "b1", 30),
            ]


class FailingStart(Cap):
    async def on_start(self) -> None:
        self.env.state["starts"] = n = self.env.state.get("starts", 0) + 1
        if n in (2, 3):  # the first activation (a call) starts; the next two fail
            raise RuntimeError(f"start {n} failed")


async def test_failing_startup_retries_the_alarm_run_with_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    env.caps = lambda: [FailingStart("fs", env)]
    with trio.fail_after(HANG):
        # Evicted a second after the push: the alarm at +10 activates it afresh.
        async with nj.open_runtime(engine.location, env=env, idle_timeout=1) as rt:
            listen(rt, env)
            obj = rt.get(Host, "o")
            await obj.push("f", id="j", time=EPOCH + 10)
            await trio.sleep(11)
            assert rt.engine.get_alarm(Host.namespace, "o") == (EPOCH + 12, 1)
            await trio.sleep(100)
            # 2 s doubling: failed at +10 and +12, started and ran the job at +16.
            assert env.ran() == [("j", 16)]
            assert [(e.time - EPOCH, e.data["retry"]) for e in env.of("alarm:retry")] == [
                (10, 1), (12, 2),
            ]
            assert alarm(rt) is None


async def test_fallback_alarm_is_set_while_jobs_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def peek(obj: Host, ctx: nj.JobContext) -> Any:
        env.log.append(("alarm during run", rel(), obj.ctx.storage.get_alarm() - EPOCH))

    env = make_env({"peek": peek})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("peek", id="a", time=EPOCH + 10)
            await obj.push("peek", id="b", time=EPOCH + 100)
            await trio.sleep(200)
            # If the run dies the object wakes again at least 30 s later, never never.
            assert [e for e in env.log if e[0] == "alarm during run"] == [
                ("alarm during run", 10, 40), ("alarm during run", 100, 130),
            ]


# -- transactions ----------------------------------------------------------------------------


async def test_push_in_a_transaction_commits_with_other_writes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")

            async def together(o: Host) -> None:
                storage = o.ctx.storage
                # A push inside a transaction checkpoints (as every async call does): the
                # object's turn keeps other tasks out of the open transaction.
                with storage.transaction():
                    storage.put("k", 1)
                    await o.lifecycle.jobs.push("f", id="a", time=EPOCH + 10)
                    await o.lifecycle.jobs.push("f", id="a", time=EPOCH + 12)  # replace
                    await o.lifecycle.jobs.push("f", id="b", time=EPOCH + 11)

            await inside(obj, together)
            assert await inside(obj, lambda o: trio_value(o.ctx.storage.get("k"))) == 1
            assert [(j.id, j.time - EPOCH) for j in await obj.jobs()] == [("b", 11), ("a", 12)]
            assert alarm(rt) is not None and alarm(rt) <= 11  # type: ignore[operator]
            await trio.sleep(20)
            assert env.ran() == [("b", 11), ("a", 12)]


async def test_rolled_back_transaction_leaves_no_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            kept = await obj.push("f", id="keep", time=EPOCH + 50)

            async def rolled_back(o: Host) -> None:
                storage = o.ctx.storage
                with pytest.raises(RuntimeError, match="abort"), storage.transaction():
                    storage.put("k", 1)
                    await o.lifecycle.jobs.push("f", id="a", time=EPOCH + 10)
                    await o.lifecycle.jobs.push("g", id="keep", time=EPOCH + 20)
                    raise RuntimeError("abort")

            await inside(obj, rolled_back)
            assert await inside(obj, lambda o: trio_value(o.ctx.storage.get("k"))) is None
            assert await obj.jobs() == [kept]
            await trio.sleep(100)
            # An early wake is harmless; nothing of the rolled-back pushes runs.
            assert env.ran() == [("keep", 50)]
            assert alarm(rt) is None


async def test_an_exclusive_job_pushed_in_a_transaction_raises_the_alarm_once_committed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Inside the block the push may only lower the alarm (a rollback would leave the
    # plain job behind a raised one); once the block commits, the exclusive job alone
    # decides when the object wakes.
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("p", id="plain", time=EPOCH + 10)

            async def together(o: Host) -> None:
                with o.ctx.storage.transaction():
                    o.ctx.storage.put("pushed", "x")
                    await o.lifecycle.jobs.push("x", id="x", time=EPOCH + 100,
                                                exclusive=True)

            await inside(obj, together)
            assert alarm(rt) == 100
            await trio.sleep(200)
            assert env.ran() == [("plain", 100), ("x", 100)]


async def test_disable_alarms_keeps_the_jobs(autojump_clock: trio.testing.MockClock) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("f", id="j", time=EPOCH + 10)
            await inside(obj, lambda o: o.lifecycle.disable_alarms())
            assert alarm(rt) is None
            await trio.sleep(50)
            assert env.runs == []
            assert [j.id for j in await obj.jobs()] == ["j"]


@pytest.mark.parametrize("change", ["cancel", "reschedule"])
async def test_rolled_back_cancel_or_reschedule_keeps_the_alarm(
    autojump_clock: trio.testing.MockClock, change: str
) -> None:
    env = make_env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("f", id="a", time=EPOCH + 10)
            await obj.push("f", id="b", time=EPOCH + 50)

            async def rolled_back(o: Host) -> None:
                with (
                    pytest.raises(RuntimeError, match="abort"),
                    o.ctx.storage.transaction(),
                ):
                    if change == "cancel":
                        assert await o.lifecycle.jobs.cancel("a") is True
                    else:
                        assert await o.lifecycle.jobs.reschedule("a", EPOCH + 80) is True
                    raise RuntimeError("abort")

            await inside(obj, rolled_back)
            assert [j.id for j in await obj.jobs()] == ["a", "b"]
            # The alarm is never above a pending job's time: a is still due at +10.
            assert alarm(rt) is not None and alarm(rt) <= 10  # type: ignore[operator]
            await trio.sleep(100)
            assert env.ran() == [("a", 10), ("b", 50)]


async def test_dead_letter_requeue_runs_again_with_fresh_attempts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def fail_once(obj: Any, ctx: nj.JobContext) -> Any:
        if len(env.runs) == 1:
            raise RuntimeError("boom")

    env = make_env({"fail_once": fail_once})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("fail_once", id="d", time=EPOCH + 10, payload="p",
                           retry=nj.RetryOptions(max_attempts=1))
            await trio.sleep(20)
            assert len(await obj.dead_letters()) == 1
            job = await inside(obj, lambda o: o.lifecycle.requeue("d"))
            assert (job.id, job.time, job.payload) == ("d", EPOCH + 20, "p")
            assert await inside(obj, lambda o: o.lifecycle.requeue("d")) is None
            assert await obj.dead_letters() == []
            await trio.sleep(10)
            assert [(t, a) for _, _, t, a, _ in env.runs] == [(10, 1), (20, 1)]
            assert await obj.jobs() == []


async def test_disable_alarms_during_a_run_stops_after_that_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def stop(obj: Host, ctx: nj.JobContext) -> Any:
        await obj.lifecycle.disable_alarms()

    env = make_env({"stop": stop})
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Host, "o")
            await obj.push("stop", id="a", time=EPOCH + 10)
            await obj.push("f", id="b", time=EPOCH + 10)
            await trio.sleep(100)
            assert env.ran() == [("a", 10)]
            assert [j.id for j in await obj.jobs()] == ["b"]
            assert alarm(rt) is None
