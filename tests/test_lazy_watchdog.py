"""The slow-dispatch watchdog starts when a job first waits for something (issue 26:
a task started and cancelled per alarm run was ~7% of a cold fire's CPU). A job that
never waits cannot be seen running by any task, so it needs none; one that waits is
watched from its start, as before (tests/test_lifecycle.py: the events and their
times). ``_watched`` passes everything through to the job as ``await`` does."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs._jobs._slow_dispatch import SlowDispatchWatch
from nursery_jobs._jobs._slow_dispatch import watched as _watched


class _Jobs(nj.DurableObject):
    namespace = "tests.test_lazy_watchdog.Jobs"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.ran: list[str] = ctx.env

    async def push(self, *fns: str) -> None:
        with self.ctx.storage.transaction():
            for i, fn in enumerate(fns):
                await self.lifecycle.jobs.push(fn, id=f"{fn}{i}", delay=10, hung_timeout=5)

    async def on_job(self, ctx: nj.JobContext) -> None:
        if ctx.job.fn == "waits":
            await trio.sleep(1)
        elif ctx.job.fn == "slow":
            await trio.sleep(8)
        self.ran.append(ctx.job.id)


@pytest.mark.parametrize(("fns", "watchdogs", "slow"), [
    (("quick", "quick"), 0, []),
    (("quick", "waits", "quick"), 1, []),
    # (One that has told of a slow job ends: the next job that waits starts another.)
    (("quick", "slow", "waits"), 2, ["slow1"]),
])
async def test_a_watchdog_starts_only_for_a_run_whose_job_waits(
    fns: tuple[str, ...], watchdogs: int, slow: list[str],
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock,
) -> None:
    started: list[int] = []
    watchdog = SlowDispatchWatch._watchdog

    async def counted(self: SlowDispatchWatch) -> None:
        started.append(1)
        await watchdog(self)

    monkeypatch.setattr(SlowDispatchWatch, "_watchdog", counted)
    ran: list[str] = []
    events: list[Any] = []
    async with nj.open_runtime(None, env=ran) as rt:
        rt.events.add_listener(events.append)
        await rt.get(_Jobs, "j").push(*fns)
        await trio.sleep(40)
    assert ran == [f"{fn}{i}" for i, fn in enumerate(fns)]
    assert len(started) == watchdogs
    assert [e.data["id"] for e in events if e.type == "job:slow_dispatch"] == slow


def _drive(awaitable: Any, sends: list[Any], throw_at: int = -1,
           error: BaseException | None = None) -> tuple[list[Any], Any]:
    """Step a coroutine as a scheduler would; return what it yielded and its end."""
    yielded: list[Any] = []

    async def outer() -> Any:
        return await awaitable

    coro = outer()
    value: Any = None
    step = 0
    while True:
        try:
            if step == throw_at:
                assert error is not None
                out = coro.throw(error)
            else:
                out = coro.send(value)
        except StopIteration as done:
            return yielded, ("returned", done.value)
        except BaseException as exc:  # (what comes out is the result here)
            return yielded, ("raised", type(exc), str(exc))
        yielded.append(out)
        value = sends[step] if step < len(sends) else None
        step += 1


class _Trap:
    def __init__(self, name: str) -> None:
        self.name = name

    def __await__(self) -> Any:
        return (yield self.name)


async def _job(fail: bool = False) -> Any:
    got = [await _Trap("a")]
    try:
        got.append(await _Trap("b"))
    except KeyError as exc:
        got.append(f"caught {exc}")
        got.append(await _Trap("c"))
    if fail:
        raise ValueError(got)
    return got


@pytest.mark.parametrize(("fail", "throw_at"), [(False, -1), (True, -1), (False, 2),
                                                (True, 2), (False, 1)])
def test_watched_passes_values_and_exceptions_through_as_await(
    fail: bool, throw_at: int,
) -> None:
    error = KeyError("k") if throw_at == 2 else RuntimeError("thrown at the first wait")
    waits: list[int] = []
    plain = _drive(_job(fail), [1, 2, 3], throw_at, error)
    watched = _drive(_watched(_job(fail), lambda: waits.append(1)), [1, 2, 3], throw_at, error)
    assert watched == plain
    assert waits == [1]


def test_a_job_that_never_waits_is_never_watched() -> None:
    async def quick() -> int:
        return 7

    waits: list[int] = []
    assert _drive(_watched(quick(), lambda: waits.append(1)), []) == ([], ("returned", 7))
    assert waits == []


def test_closing_a_watched_job_closes_it() -> None:
    closed: list[bool] = []

    async def job() -> None:
        try:
            await _Trap("a")
        finally:
            closed.append(True)

    outer = _watched(job(), lambda: None)  # (a generator-based coroutine)
    assert outer.send(None) == "a"
    outer.close()
    assert closed == [True]
