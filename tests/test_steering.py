"""Steering jobs (DESIGN.md §3 "Steering jobs"): a run's ``timeout``, ``jobs.cancel`` of a
running job, and ``RetryOptions(give_up_on=...)``.

Every timer test runs under ``autojump_clock`` and asserts exact virtual times, relative
to ``EPOCH``; every test runs on every engine.
"""

from __future__ import annotations

import math
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


class Env:
    def __init__(self) -> None:
        # (job id, what, time - EPOCH, attempt) in order: "start", "cancelled", "end".
        self.log: list[tuple[str, str, float, int]] = []
        self.events: list[nj.Event] = []
        self.errors: list[BaseException] = []
        self.raise_: BaseException | None = None
        self.cap_on_job_error = False

    def of(self, type: str) -> list[nj.Event]:
        return [e for e in self.events if e.type == type]

    def runs(self) -> list[tuple[str, float, int]]:
        return [(job_id, t, attempt) for job_id, what, t, attempt in self.log if what == "start"]


async def long_run(env: Env, ctx: nj.JobContext, seconds: float = 100) -> None:
    """A job that sleeps ``seconds``, logging when it starts, is cancelled or ends."""
    env.log.append((ctx.job.id, "start", rel(), ctx.attempt))
    try:
        await trio.sleep(seconds)
    except trio.Cancelled:
        env.log.append((ctx.job.id, "cancelled", rel(), ctx.attempt))
        raise
    env.log.append((ctx.job.id, "end", rel(), ctx.attempt))


async def tracked_sleep(env: Env, job_id: str) -> None:
    try:
        await trio.sleep(100)
    except trio.Cancelled:
        env.log.append((job_id, "work cancelled", rel(), 0))
        raise
    env.log.append((job_id, "work ended", rel(), 0))


class Steered(nj.DurableObject):
    namespace = "tests.test_steering.Steered"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)
        self.lifecycle.use(Watcher(self.env))

    async def push(self, fn: str, **kwargs: Any) -> nj.Job:
        return await self.lifecycle.jobs.push(fn, **kwargs)

    async def push_cap(self, fn: str, **kwargs: Any) -> nj.Job:
        cap = self.lifecycle.capabilities["watcher"]
        return await cap.lifecycle.jobs.push(fn, **kwargs)

    async def cancel(self, job_id: str) -> bool:
        return await self.lifecycle.jobs.cancel(job_id)

    @nj.interleave
    async def cancel_now(self, job_id: str) -> tuple[bool, float]:
        cancelled = await self.lifecycle.jobs.cancel(job_id)
        return cancelled, rel()

    @nj.interleave
    async def cancel_cap_now(self, job_id: str) -> tuple[bool, float]:
        cap = self.lifecycle.capabilities["watcher"]
        cancelled = await cap.lifecycle.jobs.cancel(job_id)
        return cancelled, rel()

    @nj.interleave
    async def cancel_from_a_task(self, job_id: str) -> None:
        """A background task (no turn) cancels, then enters a turn to note the result."""

        async def task() -> None:
            cancelled = await self.lifecycle.jobs.cancel(job_id)
            async with self.ctx.turn():
                self.ctx.storage.put("note", [cancelled, rel()])

        self.ctx.nursery.start_soon(task)
        await trio.lowlevel.checkpoint()

    async def hold(self, seconds: float) -> None:
        """A call that keeps the object's turn ``seconds`` long."""
        await trio.sleep(seconds)

    async def note(self) -> Any:
        return self.ctx.storage.get("note")

    async def jobs(self) -> list[nj.Job]:
        return self.lifecycle.jobs.list()

    async def dead_letters(self) -> list[nj.DeadLetter]:
        return self.lifecycle.dead_letters()

    async def storage_get(self, key: str) -> Any:
        return self.ctx.storage.get(key)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        return await run_fn(self, ctx)


async def run_fn(obj: Steered, ctx: nj.JobContext) -> nj.JobOutcome:
    env = obj.env
    fn = ctx.job.fn
    if fn == "long":
        obj.ctx.storage.put("written by " + ctx.job.id, True)  # undone by a cancel
        await long_run(env, ctx)
    elif fn == "short":
        env.log.append((ctx.job.id, "start", rel(), ctx.attempt))
    elif fn == "fail":
        env.log.append((ctx.job.id, "start", rel(), ctx.attempt))
        assert env.raise_ is not None
        raise env.raise_
    elif fn == "with work":
        assert obj.lifecycle.track_alarm_work(tracked_sleep, env, ctx.job.id)
        await long_run(env, ctx)
    elif fn == "fail in a nursery":
        env.log.append((ctx.job.id, "start", rel(), ctx.attempt))

        async def child(error: BaseException) -> None:
            raise error

        assert env.raise_ is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child, env.raise_)
            nursery.start_soon(child, Refused("another"))
    elif fn == "starts work":
        env.log.append((ctx.job.id, "start", rel(), ctx.attempt))
        assert obj.lifecycle.track_alarm_work(tracked_sleep, env, ctx.job.id)
    elif fn == "heartbeat":
        # Starts its work on the first run, then looks in every 30 s.
        env.log.append((ctx.job.id, "start", rel(), ctx.attempt))
        if not obj.ctx.storage.get("working"):
            obj.ctx.storage.put("working", True)
            assert obj.lifecycle.track_alarm_work(tracked_sleep, env, ctx.job.id)
        return nj.Reschedule(nj.now() + 30)
    elif fn == "stubborn":
        # Swallows its cancellation and returns as if it had finished.
        env.log.append((ctx.job.id, "start", rel(), ctx.attempt))
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            env.log.append((ctx.job.id, "cancelled", rel(), ctx.attempt))
        return None
    return None


class Watcher(nj.Capability):
    id = "watcher"

    def __init__(self, env: Env) -> None:
        self.env = env

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        host = self.host
        assert isinstance(host, Steered)
        return await run_fn(host, ctx)

    async def on_job_error(self, ctx: nj.JobContext, error: Exception) -> nj.JobOutcome:
        self.env.errors.append(error)
        self.env.log.append((ctx.job.id, "on_job_error", rel(), ctx.attempt))
        return None


def open_rt(env: Env) -> Any:
    rt = nj.open_runtime(engine.location, env=env)
    return rt


def listen(rt: nj.Runtime, env: Env) -> None:
    rt.events.add_listener(env.events.append)


# -- timeout -------------------------------------------------------------------------------


async def test_timeout_ends_a_run_at_its_deadline_and_the_retry_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    retry = nj.RetryOptions(max_attempts=2, base_delay=1, max_delay=1, jitter=False)
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            listen(rt, env)
            obj = rt.get(Steered, "o")
            pushed = await obj.push("long", id="j", timeout=5, retry=retry)
            assert pushed.timeout == 5.0
            assert [job.timeout for job in await obj.jobs()] == [5.0]
            await trio.sleep(200)
            # Attempt 1 from 0 to 5, the retry 1 s later, cut at 6 + 5.
            assert env.log == [
                ("j", "start", 0, 1), ("j", "cancelled", 5, 1),
                ("j", "start", 6, 2), ("j", "cancelled", 11, 2),
            ]
            [retried] = env.of("job:retry")
            assert retried.time == EPOCH + 5
            assert "JobTimeoutError" in retried.data["error"]
            [letter] = await obj.dead_letters()
            assert (letter.job.id, letter.attempts, letter.time) == ("j", 2, EPOCH + 11)
            assert letter.error.startswith("JobTimeoutError: ")
            assert "'j'" in letter.error and "timeout of 5 s" in letter.error
            assert letter.job.timeout == 5.0
            # The runs' writes were undone with them.
            assert await obj.storage_get("written by j") is None
            assert await obj.jobs() == []


async def test_a_run_within_its_timeout_completes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("long", id="j", timeout=100.5)
            await trio.sleep(200)
            assert env.log == [("j", "start", 0, 1), ("j", "end", 100, 1)]
            assert await obj.dead_letters() == []
            assert await obj.storage_get("written by j") is True


async def test_a_timeout_bounds_the_run_not_the_tracked_work_it_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("starts work", id="w", timeout=5)
            await trio.sleep(200)
            assert env.log == [("w", "start", 0, 1), ("w", "work ended", 100, 0)]
            assert await obj.dead_letters() == [] and await obj.jobs() == []


async def test_on_job_error_sees_the_timeout_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push_cap("long", id="c", timeout=2.5,
                               retry=nj.RetryOptions(max_attempts=1))
            await trio.sleep(200)
            assert env.log == [("c", "start", 0, 1), ("c", "cancelled", 2.5, 1),
                               ("c", "on_job_error", 2.5, 1)]
            [error] = env.errors
            assert isinstance(error, nj.JobTimeoutError)
            assert isinstance(error, nj.NurseryJobsError)
            assert (error.job_id, error.timeout) == ("c", 2.5)
            assert "'c'" in str(error) and "2.5 s" in str(error)
            # on_job_error returned None: a dead letter, as for any error.
            [letter] = await obj.dead_letters()
            assert letter.attempts == 1 and letter.error.startswith("JobTimeoutError")
            assert await obj.jobs() == []


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, -math.inf, "5", True, [5]])
async def test_invalid_timeout_raises_and_writes_nothing(
    autojump_clock: trio.testing.MockClock, bad: Any
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            kept = await obj.push("short", id="j", time=EPOCH + 100)
            with pytest.raises(nj.JobError, match="timeout") as info:
                await obj.push("short", id="j", time=EPOCH + 5, timeout=bad)
            assert isinstance(info.value, ValueError)
            assert "'j'" in str(info.value)
            assert await obj.jobs() == [kept]
            await trio.sleep(200)
            assert env.runs() == [("j", 100, 1)]


# -- cancel of a running job -------------------------------------------------------------


async def test_cancel_ends_a_running_job_at_once_and_nothing_runs_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            listen(rt, env)
            obj = rt.get(Steered, "o")
            await obj.push("long", id="j", retry=nj.RetryOptions(max_attempts=5))
            await trio.sleep(1)
            assert await obj.cancel_now("j") == (True, 1)
            assert env.log == [("j", "start", 0, 1), ("j", "cancelled", 1, 1)]
            assert await obj.jobs() == []
            await trio.sleep(199)
            assert env.log == [("j", "start", 0, 1), ("j", "cancelled", 1, 1)]
            assert await obj.jobs() == []
            assert await obj.dead_letters() == []
            assert env.of("job:retry") == [] and env.of("job:dead_letter") == []
            [event] = env.of("job:cancelled")
            assert (event.time, event.data["id"], event.data["owner"]) == (EPOCH + 1, "j", "host")
            # The run's writes went with it.
            assert await obj.storage_get("written by j") is None
            # A second cancel finds nothing.
            assert await obj.cancel_now("j") == (False, 200)


async def test_cancel_within_a_timeout_is_a_cancel_not_a_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            listen(rt, env)
            obj = rt.get(Steered, "o")
            await obj.push("long", id="j", timeout=5, retry=nj.RetryOptions(max_attempts=3))
            await trio.sleep(1)
            assert await obj.cancel_now("j") == (True, 1)
            await trio.sleep(100)
            assert env.log == [("j", "start", 0, 1), ("j", "cancelled", 1, 1)]
            assert env.of("job:retry") == [] and await obj.dead_letters() == []


async def test_a_cancelled_job_stays_gone_after_a_restart(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("long", id="j", time=EPOCH + 1)
            await trio.sleep(2)
            assert await obj.cancel_now("j") == (True, 2)
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Steered, "o")
            assert await obj.jobs() == []
            await trio.sleep(200)
            assert env.runs() == [("j", 1, 1)]
            assert await obj.dead_letters() == []


async def test_cancel_of_a_running_job_lets_the_other_due_jobs_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            # (Due later than now: each push is a call, which would wait for the turn
            # of a job already running.)
            await obj.push("long", id="a", time=EPOCH + 1)
            await obj.push("short", id="b", time=EPOCH + 1)
            await obj.push("short", id="c", time=EPOCH + 3)
            await trio.sleep(2)
            assert await obj.cancel_now("a") == (True, 2)
            await trio.sleep(100)
            assert env.runs() == [("a", 1, 1), ("b", 2, 1), ("c", 3, 1)]
            assert await obj.jobs() == []


async def test_cancel_from_a_background_task_that_then_takes_a_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("long", id="j")
            await trio.sleep(1)
            await obj.cancel_from_a_task("j")
            await trio.sleep(1)
            assert await obj.note() == [True, 1]
            assert env.log == [("j", "start", 0, 1), ("j", "cancelled", 1, 1)]
            await trio.sleep(200)
            assert env.runs() == [("j", 0, 1)]
            assert await obj.jobs() == [] and await obj.dead_letters() == []


async def test_cancel_of_a_running_capability_job_needs_its_owner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push_cap("long", id="c", timeout=10, retry=nj.RetryOptions(max_attempts=1))
            await trio.sleep(1)
            # The host's jobs.cancel does not reach the capability's job.
            assert await obj.cancel_now("c") == (False, 10)
            assert env.log[-2:] == [("c", "cancelled", 10, 1), ("c", "on_job_error", 10, 1)]
            # The capability's own does, at once.
            await obj.push_cap("long", id="d", time=EPOCH + 20)
            await trio.sleep(21 - rel())
            assert await obj.cancel_cap_now("d") == (True, 21)
            assert env.log[-2:] == [("d", "start", 20, 1), ("d", "cancelled", 21, 1)]
            await trio.sleep(100)
            assert env.log[-1] == ("d", "cancelled", 21, 1)
            assert [d.job.id for d in await obj.dead_letters()] == ["c"]


async def test_cancel_also_ends_the_tracked_work_the_job_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("with work", id="w")
            await trio.sleep(1.5)
            assert await obj.cancel_now("w") == (True, 1.5)
            await trio.sleep(1)
            assert sorted(env.log) == sorted([
                ("w", "start", 0, 1), ("w", "cancelled", 1.5, 1),
                ("w", "work cancelled", 1.5, 0),
            ])
            await trio.sleep(200)
            assert env.runs() == [("w", 0, 1)]
            assert await obj.jobs() == [] and await obj.dead_letters() == []


async def test_cancel_of_a_job_that_ignores_its_cancellation_still_deletes_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("stubborn", id="s", retry=nj.RetryOptions(max_attempts=3))
            await trio.sleep(1)
            assert await obj.cancel_now("s") == (True, 1)
            await trio.sleep(200)
            assert env.log == [("s", "start", 0, 1), ("s", "cancelled", 1, 1)]
            assert await obj.jobs() == [] and await obj.dead_letters() == []


async def test_cancel_of_a_queued_job_from_an_interleave_method(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            listen(rt, env)
            obj = rt.get(Steered, "o")
            await obj.push("short", id="q", time=EPOCH + 50)
            assert await obj.cancel_now("q") == (True, 0)
            assert await obj.cancel_now("missing") == (False, 0)
            assert await obj.jobs() == []
            await trio.sleep(100)
            assert env.runs() == []
            assert env.of("job:cancelled") == []  # (only a running job's cancel is an event)


async def test_a_call_waiting_behind_a_cancelled_run_goes_before_the_next_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Fairness (DESIGN 2): between two jobs the alarm run hands the object to a waiting
    # call — after a job whose run was cancelled too.
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("long", id="A", time=EPOCH + 1)
            await obj.push("long", id="B", time=EPOCH + 1)
            await trio.sleep(5)
            assert env.runs() == [("A", 1, 1)]
            served: list[float] = []

            async def call() -> None:
                await obj.hold(0)
                served.append(rel())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await trio.sleep(1)  # (the call waits for the object: A's run holds it)
                assert served == []
                assert await obj.cancel_now("A") == (True, 6)
            assert served == [6]
            await trio.sleep(1)
            assert env.runs() == [("A", 1, 1), ("B", 6, 1)]


async def test_cancel_from_inside_the_turn_keeps_its_behaviour(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("long", id="j")
            await trio.sleep(1)
            # A plain stub call waits for the object's turn: the run ends first (at
            # 100), then the cancel finds the job gone.
            assert await obj.cancel("j") is False
            assert rel() == 100
            assert env.log == [("j", "start", 0, 1), ("j", "end", 100, 1)]


# -- give_up_on ----------------------------------------------------------------------------


class Refused(ValueError):
    pass


@pytest.mark.parametrize("error", [ValueError("bad input"), Refused("refused")])
async def test_give_up_on_runs_exactly_once_then_dead_letters(
    autojump_clock: trio.testing.MockClock, error: BaseException
) -> None:
    env = Env()
    env.raise_ = error
    retry = nj.RetryOptions(max_attempts=5, give_up_on=(ValueError, KeyError))
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            listen(rt, env)
            obj = rt.get(Steered, "o")
            await obj.push("fail", id="g", retry=retry)
            await trio.sleep(100)
            assert env.runs() == [("g", 0, 1)]
            [letter] = await obj.dead_letters()
            assert (letter.job.id, letter.attempts) == ("g", 1)
            assert letter.job.retry.gives_up_on(error)
            assert env.of("job:retry") == []
            assert await obj.jobs() == []


@pytest.mark.parametrize(("error", "runs"), [(ValueError("v"), 1), (KeyError("k"), 3)])
async def test_give_up_on_an_exception_group_when_all_its_errors_match(
    autojump_clock: trio.testing.MockClock, error: BaseException, runs: int
) -> None:
    env = Env()
    env.raise_ = error
    retry = nj.RetryOptions(max_attempts=3, base_delay=1, max_delay=10, jitter=False,
                            give_up_on=(ValueError,))
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("fail in a nursery", id="n", retry=retry)
            await trio.sleep(100)
            assert len(env.runs()) == runs
            [letter] = await obj.dead_letters()
            assert letter.attempts == runs and "ExceptionGroup" in letter.error


async def test_an_error_not_given_up_on_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    env.raise_ = RuntimeError("transient")
    retry = nj.RetryOptions(max_attempts=3, base_delay=1, max_delay=10, jitter=False,
                            give_up_on=(ValueError,))
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("fail", id="g", retry=retry)
            await trio.sleep(100)
            assert env.runs() == [("g", 0, 1), ("g", 1, 2), ("g", 3, 3)]
            [letter] = await obj.dead_letters()
            assert letter.attempts == 3


async def test_give_up_on_lets_on_job_error_decide(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    env.raise_ = KeyError("k")
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push_cap("fail", id="g",
                               retry=nj.RetryOptions(max_attempts=4, give_up_on=(LookupError,)))
            await trio.sleep(100)
            assert env.log == [("g", "start", 0, 1), ("g", "on_job_error", 0, 1)]
            assert env.errors == [env.raise_]
            [letter] = await obj.dead_letters()
            assert letter.attempts == 1
            assert await obj.jobs() == []


async def test_give_up_on_a_timeout(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    retry = nj.RetryOptions(max_attempts=5, give_up_on=(nj.JobTimeoutError,))
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("long", id="t", timeout=4, retry=retry)
            await trio.sleep(100)
            assert env.log == [("t", "start", 0, 1), ("t", "cancelled", 4, 1)]
            [letter] = await obj.dead_letters()
            assert letter.attempts == 1 and letter.error.startswith("JobTimeoutError")


@pytest.mark.parametrize("bad", [
    ValueError("an instance"), 42, "NoDot", int, [object],
    # Strings that can name no class (they were stored, and matched nothing):
    "a.\x00b", "a.\ud800", "a. b", " a.B", "module.", ".Name", "a..B", "<locals>.B",
])
def test_bad_give_up_on_raises_a_typed_error(bad: Any) -> None:
    with pytest.raises(nj.JobError, match="give_up_on") as info:
        nj.RetryOptions(give_up_on=bad)
    assert isinstance(info.value, ValueError)


def test_give_up_on_names_round_trip_as_strings() -> None:
    class Local(Exception):
        pass

    names = nj.RetryOptions(give_up_on=(Local, "pkg.mod.Error")).give_up_on
    assert nj.RetryOptions(give_up_on=names).give_up_on == names
    assert nj.RetryOptions(give_up_on=names).gives_up_on(Local())


async def test_cancel_of_a_job_waiting_for_probation_cancels_it_at_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """y's job waits for x's (another object's) job on probation. Its alarm run held y's
    turn while it waited: the cancel waited the 96 s of x's run, y's job then ran all
    the same and the cancel returned False."""
    from probation_support import Suspect, strike_two

    env: dict[str, Any] = {}
    await strike_two(tmp_path, env)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(33)  # t = 35: x runs on probation since 31, y waits since 32
            assert env["log"][2:] == [("x", "start", 31.0)]
            y = rt.get(Suspect, "y")
            assert await y.ping() == 35.0  # calls do not wait behind x's run
            assert await y.cancel_now() == (True, 35.0)
            assert await y.jobs() == []
            await trio.sleep(200)
            assert env["log"][2:] == [("x", "start", 31.0), ("x", "end", 131.0)]


@pytest.mark.parametrize("how", ["interleave", "turn"])
async def test_cancel_between_runs_ends_the_tracked_work_the_job_started(
    autojump_clock: trio.testing.MockClock, how: str
) -> None:
    """A heartbeat job (its work goes on, it looks in every 30 s) cancelled between two
    runs: the job was deleted and its work ran on, orphaned, with nothing left to stop
    it."""
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("heartbeat", id="h")
            await trio.sleep(40)  # runs at 0 and 30; the work started at 0
            if how == "interleave":
                assert await obj.cancel_now("h") == (True, 40)
            else:
                assert await obj.cancel("h") is True
            await trio.sleep(200)
            assert env.log == [("h", "start", 0, 1), ("h", "start", 30, 1),
                               ("h", "work cancelled", 40, 0)]
            assert await obj.jobs() == []


async def test_a_job_that_swallows_its_timeout_still_timed_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A job that catches the Cancelled of its timeout and returns (a broad ``except``
    in a library): its result stood, as a clean run, its writes kept. The run was still
    going at its timeout: a failed attempt, as for ``jobs.cancel`` of such a job."""
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("stubborn", id="s", timeout=5, retry=nj.RetryOptions(max_attempts=1))
            await trio.sleep(100)
            assert env.log == [("s", "start", 0, 1), ("s", "cancelled", 5, 1)]
            [letter] = await obj.dead_letters()
            assert (letter.attempts, letter.time) == (1, EPOCH + 5)
            assert letter.error.startswith("JobTimeoutError")
            assert await obj.jobs() == []


async def test_cancel_waiting_behind_a_hand_over_ends_the_job_before_it_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The run hands the turn to a call after "first" (at 110) and waits to take it
    back; a cancel of "second" made meanwhile (112) waited behind the run, which then
    ran "second" for its whole 100 s; the cancel returned False at 215."""
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            listen(rt, env)
            obj = rt.get(Steered, "o")
            await obj.push("long", id="first", time=EPOCH + 10)
            await obj.push("long", id="second", time=EPOCH + 10)
            async with trio.open_nursery() as nursery:
                await trio.sleep(50)
                nursery.start_soon(obj.hold, 5)  # has the object from 110 to 115
                await trio.sleep(62)
                assert await obj.cancel_now("second") == (True, 115)
            assert env.log == [("first", "start", 10, 1), ("first", "end", 110, 1)]
            assert await obj.jobs() == []
            [event] = env.of("job:cancelled")
            assert (event.data["id"], event.time) == ("second", EPOCH + 115)
            await trio.sleep(200)
            assert env.runs() == [("first", 10, 1)]
            assert await obj.dead_letters() == []


async def test_cancel_waiting_behind_the_alarm_run_that_starts_the_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A call holds the object from 0 to 5; the alarm (due at 1) waits for it, and a
    cancel made at 2 waits behind the alarm run: the job must not start."""
    env = Env()
    with trio.fail_after(HANG):
        async with open_rt(env) as rt:
            obj = rt.get(Steered, "o")
            await obj.push("long", id="j", time=EPOCH + 1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(obj.hold, 5)
                await trio.sleep(2)
                assert await obj.cancel_now("j") == (True, 5)
            await trio.sleep(200)
            assert env.log == []
            assert await obj.jobs() == [] and await obj.storage_get("written by j") is None
