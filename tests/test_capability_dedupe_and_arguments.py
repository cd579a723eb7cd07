"""The capabilities built on the Lifecycle (Queue, Scheduler, Agent) at their edges:
each test pins a documented promise (DESIGN.md §4, §7; README "Queue, Scheduler and
Agent") that a review found broken; the docstrings say what used to happen.

Timer tests run under ``autojump_clock`` with exact virtual times relative to ``EPOCH``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH, engine

import nursery_jobs as nj
from nursery_jobs import _clock


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


HANG = 1_000_000
HOUR = 3600


def rel() -> float:
    return nj.now() - EPOCH


class Env:
    def __init__(self) -> None:
        self.runs: list[tuple[str, float, Any]] = []
        self.on_start: Any = None
        self.errors: list[tuple[Exception, Any]] = []


class Sched(nj.DurableObject):
    """A Lifecycle object with a Queue and a Scheduler reporting to ``env``."""

    namespace = "tests.test_capabilities_edges.Sched"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        env = self.env

        async def tick(payload: Any, record: Any) -> None:
            env.runs.append(("tick", rel(), payload))

        async def again(payload: Any, schedule: nj.Schedule) -> None:
            # Poll again in 60 s unless a poll is already scheduled (a one-shot that
            # re-schedules itself idempotently).
            env.runs.append(("again", rel(), payload))
            await self.scheduler.schedule(60, "again", payload, idempotent=True)

        self.queue = nj.Queue({"tick": tick}, on_error=lambda e, i: env.errors.append((e, i)))
        self.scheduler = nj.Scheduler({"tick": tick, "again": again})
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue, self.scheduler)

    async def on_start(self) -> None:
        if self.env.on_start is not None:
            await self.env.on_start(self)

    async def ping(self) -> None:
        pass

    async def schedule(self, when: Any, callback: str, payload: Any = None,
                       **kwargs: Any) -> nj.Schedule:
        return await self.scheduler.schedule(when, callback, payload, **kwargs)

    async def every(self, seconds: Any, callback: str, payload: Any = None,
                    **kwargs: Any) -> nj.Schedule:
        return await self.scheduler.every(seconds, callback, payload, **kwargs)

    async def schedules(self) -> list[nj.Schedule]:
        return self.scheduler.list()

    async def push(self, callback: str, payload: Any = None, **kwargs: Any) -> nj.QueueItem:
        return await self.queue.push(callback, payload, **kwargs)

    async def attempt(self, what: str, *args: Any, **kwargs: Any) -> tuple[str, bool, int, Any]:
        """Call ``self.<what>(*args, **kwargs)``; return (error type, is a
        NurseryJobsError, jobs stored after, alarm after)."""
        target = {"schedule": self.scheduler.schedule, "every": self.scheduler.every,
                  "push": self.queue.push}[what]
        try:
            with trio.fail_after(5):
                await target(*args, **kwargs)
        except Exception as exc:
            kind, typed = type(exc).__name__, isinstance(exc, nj.NurseryJobsError)
        else:
            kind, typed = "no error", False
        return kind, typed, len(self.lifecycle.store.rows()), self.ctx.storage.get_alarm()


# -- Scheduler: runs skipped -----------------------------------------------------------------


async def _hourly_cron_with_an_id(obj: Sched) -> None:
    await obj.scheduler.schedule("0 * * * *", "tick", "hourly", id="hourly")


async def test_cron_with_a_stable_id_in_on_start_fires_after_an_eviction(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``schedule(cron, id=...)`` in ``on_start`` (the stable-id way to keep one row):
    the object is evicted between slots, the due slot's alarm re-activates it, its
    ``on_start`` upserts the same schedule — and the upsert re-times the row to the slot
    after *now*, so the due run never happens (every slot, forever)."""
    env = Env()
    env.on_start = _hourly_cron_with_an_id
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env, idle_timeout=60) as rt:
            await rt.get(Sched, "o").ping()  # 08:00: the first activation creates it
            [schedule] = await rt.get(Sched, "o").schedules()
            assert schedule.time == EPOCH + HOUR  # 09:00
            await trio.sleep(3 * HOUR + 1)
            # 09:00, 10:00, 11:00 were due; the object was asleep before each.
            assert [t for _, t, _ in env.runs] == [HOUR, 2 * HOUR, 3 * HOUR]


# -- Scheduler: a one-shot that re-schedules itself idempotently -----------------------------


async def test_a_one_shot_that_reschedules_itself_idempotently_runs_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The callback's ``schedule(60, ..., idempotent=True)`` is a dedupe hit on its own
    running row; it returns that row (due now) as "the schedule", then the run completes
    and deletes it: the chain stops silently."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Sched, "o")
            await obj.schedule(10, "again", "p", idempotent=True)
            await trio.sleep(200)
            assert [t for _, t, _ in env.runs] == [10, 70, 130, 190]


# -- Scheduler: idempotency by content -------------------------------------------------------


async def test_equal_payloads_dedupe_whatever_their_iteration_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``every()`` is idempotent by content (callback, payload, interval). Equal payloads
    whose iteration order differs ({1, 9} == {9, 1}; dicts built in another order) are
    encoded differently, so they name different schedules: rows pile up."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Sched, "o")
            a = await obj.every(60, "tick", {"ids": {1, 9}, "a": 1, "b": 2})
            b = await obj.every(60, "tick", {"b": 2, "a": 1, "ids": {9, 1}})
            assert a.payload == b.payload
            assert len(await obj.schedules()) == 1
            assert a.id == b.id


_RESTART_SCRIPT = textwrap.dedent(
    """
    import sys, trio, nursery_jobs as nj

    class O(nj.DurableObject):
        namespace = "review.O"
        def __init__(self, ctx):
            super().__init__(ctx)
            self.scheduler = nj.Scheduler({"report": lambda p, s: None})
            self.lifecycle = nj.Lifecycle.install(self).use(self.scheduler)
        async def on_start(self):
            # README: "await self.scheduler.every(300, 'report')  # idempotent: never piles up"
            await self.scheduler.every(300, "report", {"inboxes": {"main", "spam", "archive",
                                                                   "sent", "drafts"}})
        async def count(self):
            return len(self.scheduler.list())

    async def main():
        async with nj.open_runtime(sys.argv[1]) as rt:
            print(await rt.get(O, "o").count())

    trio.run(main)
    """
)


def test_every_in_on_start_with_a_set_payload_does_not_pile_up_across_restarts(
    tmp_path: Path,
) -> None:
    """A ``set`` is a documented payload type, but its iteration order (so its encoding,
    so the content id) depends on the process's string hash seed: each restart of the
    process makes a new row."""
    engine.skip_on("memory", "one run is enough (it restarts a files data directory)")
    script = tmp_path / "restart.py"
    script.write_text(_RESTART_SCRIPT)
    counts = []
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": str(Path(nj.__file__).parent.parent)}
        out = subprocess.run([sys.executable, str(script), str(tmp_path / "data")], env=env,
                             capture_output=True, text=True, timeout=60, check=True)
        counts.append(int(out.stdout.strip()))
    assert counts == [1, 1, 1]


# -- Scheduler: hostile intervals and delays -------------------------------------------------


_TINY_INTERVAL_SCRIPT = textwrap.dedent(
    """
    import trio, nursery_jobs as nj

    class O(nj.DurableObject):
        def __init__(self, ctx):
            super().__init__(ctx)
            self.scheduler = nj.Scheduler({"a": lambda p, s: None})
            self.lifecycle = nj.Lifecycle.install(self).use(self.scheduler)
        async def go(self):
            try:
                await self.scheduler.every(1e-300, "a")
            except nj.NurseryJobsError as exc:
                return "refused: " + type(exc).__name__

    async def main():
        async with nj.open_runtime() as rt:
            print(await rt.get(O, "o").go(), flush=True)
            await trio.sleep(0.5)   # the first run is due at once
        print("closed", flush=True)

    trio.run(main)
    """
)


def test_every_with_a_tiny_interval_is_refused_not_a_hang(tmp_path: Path) -> None:
    """``every(1e-300)`` passes the "> 0" check; ``anchor + 1e-300 == anchor``, so the
    first run is due at once, and ``next_grid_slot`` then loops forever adding
    ``1e-300`` to ``anchor`` (``while anchor + k * seconds <= after: k += 1``): the Trio
    loop of the whole runtime is held for good."""
    engine.skip_on("files", "engine-independent; runs once (memory)")
    script = tmp_path / "tiny.py"
    script.write_text(_TINY_INTERVAL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(nj.__file__).parent.parent)}
    try:
        out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, timeout=8)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"every(1e-300) hung the runtime (stdout so far: {exc.stdout!r})")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused"), out.stdout


@pytest.mark.parametrize(
    ("what", "args", "kwargs"),
    [
        ("schedule", (10**400, "tick"), {}),
        ("every", (10**400, "tick"), {}),
        ("schedule", (dt.timedelta(seconds=5), ["tick"]), {}),
        ("push", (["tick"],), {}),
        ("schedule", (5, "tick"), {"idempotent": "no"}),
    ],
    ids=["schedule huge int delay", "every huge int", "schedule callback a list",
         "queue callback a list",
         "schedule idempotent a str"],
)
async def test_hostile_arguments_get_a_typed_error_and_write_nothing(
    autojump_clock: trio.testing.MockClock, what: str, args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """DESIGN §7: every library error is a NurseryJobsError (argument errors also a
    ValueError/TypeError) naming what is wrong; nothing is written (no job, no alarm)."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            kind, typed, stored, alarm = await rt.get(Sched, "o").attempt(what, *args, **kwargs)
    assert (kind, typed, stored, alarm) == (kind, True, 0, None), (
        f"{kind} (NurseryJobsError: {typed}), {stored} jobs stored, alarm {alarm}")


def test_retry_options_past_what_sqlite_stores_are_refused() -> None:
    """max_attempts=2**63 used to pass, and a push with it lowered the object's alarm
    before its row overflowed SQLite's integer: refused when the options are made."""
    with pytest.raises(nj.JobError, match="max_attempts"):
        nj.RetryOptions(max_attempts=2**63)
    assert nj.RetryOptions(max_attempts=2**31 - 1).max_attempts == 2**31 - 1


# -- Queue -----------------------------------------------------------------------------------


class FakeWall:
    """A wall clock at ``EPOCH + trio time + offset``; the test steps the offset."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return EPOCH + trio.current_time() + self.offset


class Line(nj.DurableObject):
    """A Queue whose "block" callback holds the line until ``release`` is set."""

    namespace = "tests.test_capabilities_edges.Line"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env

        async def block(payload: Any, item: nj.QueueItem) -> None:
            self.env.runs.append(("block", rel(), payload))
            await trio.sleep(10)

        def tick(payload: Any, item: nj.QueueItem) -> None:
            self.env.runs.append(("tick", rel(), payload))

        self.queue = nj.Queue({"block": block, "tick": tick})
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def push(self, callback: str, payload: Any = None) -> None:
        await self.queue.push(callback, payload)


async def test_queue_items_run_in_push_order_after_the_wall_clock_steps_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """DESIGN §2: the runtime re-anchors when NTP steps the system clock; §4: queue items
    run in push order. An item's place in line is its push time (``time = now``), so an
    item pushed after a step back sorts before the items pushed earlier."""
    env = Env()
    wall = FakeWall()
    _clock.pin_epoch(None)
    _clock.set_wall_clock(wall)
    try:
        with trio.fail_after(HANG):
            async with nj.open_runtime(engine.location, env=env) as rt:
                line = rt.get(Line, "q")
                await line.push("block", 0)  # runs 0..10: the others wait in line
                await trio.sleep(1)
                await line.push("tick", "first")
                wall.offset -= 5.0  # NTP steps the system clock back 5 s
                await trio.sleep(2)  # re-anchored (at least once a second)
                await line.push("tick", "second")
                await trio.sleep(20)
        assert [p for _, _, p in env.runs] == [0, "first", "second"]
    finally:
        _clock.set_wall_clock(None)


class Renamed(nj.DurableObject):
    """A Queue whose callbacks come from ``env.callbacks`` (a redeploy drops one)."""

    namespace = "tests.test_capabilities_edges.Renamed"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        env = ctx.env

        def old(payload: Any, item: nj.QueueItem) -> None:
            raise RuntimeError("old fails")

        callbacks: dict[str, Any] = {"tick": lambda payload, item: None}
        if env.legacy:
            callbacks["old"] = old
        self.queue = nj.Queue(callbacks, retry=nj.RetryOptions(max_attempts=1))
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def push(self, callback: str, payload: Any = None, **kwargs: Any) -> None:
        await self.queue.push(callback, payload, **kwargs)

    async def requeue(self, item_id: str) -> str:
        try:
            await self.queue.requeue(item_id)
        except Exception as exc:
            return type(exc).__name__
        return "no error"

    async def state(self) -> tuple[list[str], list[str]]:
        return ([d.item.id for d in self.queue.dead_letters()],
                [i.id for i in self.queue.list()])


async def test_a_refused_queue_requeue_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``Queue.requeue(id)`` of a dead item whose callback is no longer registered raises
    ``UnknownCallbackError`` — after ``lifecycle.requeue`` has already deleted the dead
    letter and queued the item: the refusal loses the dead letter and queues a job that
    can only fail again."""
    env = Env()
    env.legacy = True  # type: ignore[attr-defined]
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env, idle_timeout=1) as rt:
            obj = rt.get(Renamed, "r")
            await obj.push("old", id="x")
            await trio.sleep(5)  # fails (one attempt), buried; then evicted
            assert await obj.state() == (["x"], [])
            env.legacy = False  # type: ignore[attr-defined]  # a redeploy: "old" is gone
            await trio.sleep(5)
            assert rt.statistics().active_objects == 0
            assert await obj.requeue("x") == "UnknownCallbackError"
            assert await obj.state() == (["x"], [])


# -- Agent -----------------------------------------------------------------------------------


class Helper(nj.Agent):
    namespace = "tests.test_capabilities_edges.Helper"

    async def work(self, payload: Any) -> None:
        self.ctx.env.runs.append(("work", rel(), payload))

    async def dead(self) -> int:
        return len(self.dead_letters())


@pytest.mark.parametrize("how", ["queue", "schedule", "every"])
async def test_agent_invalid_max_retries_is_a_nursery_jobs_error(
    autojump_clock: trio.testing.MockClock, how: str
) -> None:
    """DESIGN §7: all library errors derive from NurseryJobsError; ``agent_retry``
    raises a bare ``ValueError``."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            args = ("work",) if how == "queue" else (5, "work")
            with pytest.raises(nj.NurseryJobsError, match="max_retries"):
                await rt.get(Helper, "h").call(how, *args, max_retries=-1)


@pytest.mark.parametrize("name", ["__init__", "__delattr__"])
async def test_agent_refuses_dunder_methods_as_tasks(
    autojump_clock: trio.testing.MockClock, name: str
) -> None:
    """``_NOT_TASKS`` leaves out every name starting with ``__``, so ``__init__``,
    ``__delattr__``, ``__setattr__`` ... are accepted as task names (through a stub's
    ``queue`` call too): a name that is no task must be refused with
    ``UnknownCallbackError``, as ``destroy``, ``lifecycle`` or ``on_job`` are."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            with pytest.raises(nj.UnknownCallbackError):
                await rt.get(Helper, "h").queue(name, "_task_queue")


async def test_a_stub_caller_cannot_break_an_agent_through_a_dunder_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What the dunder gap costs: any stub caller queues ``__delattr__("_task_queue")``;
    once it runs, every later ``queue()`` of the object raises AttributeError."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Helper, "h")
            try:
                await agent.queue("__delattr__", "_task_queue")
            except nj.UnknownCallbackError:
                pass
            await trio.sleep(1)
            await agent.queue("work", 1)
            await trio.sleep(1)
            assert env.runs == [("work", 1, 1)]
