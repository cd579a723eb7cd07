"""The Agent (DESIGN.md §4): dispatch by method name, the ``on_task`` fallback, private
methods schedulable but not callable through a stub, unknown names refused at once,
retries 1, 2, 4, 8, 16 s then a dead letter and ``on_error``, handlers that change their
own schedules, ``list_schedules`` records, ``cancel_schedule``, queued-task management
(``get_queued``, ``list_queued``, ``dequeue``, ``dequeue_all``) and ``destroy``.

Every timer test runs under ``autojump_clock`` and asserts exact virtual times relative
to ``EPOCH``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH, engine
from held_calls import Held, serve_calls

import nursery_jobs as nj


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


# A generous virtual-time bound: under autojump a hang jumps here and fails the test.
HANG = 100_000
HOUR = 3600


def rel() -> float:
    return nj.now() - EPOCH


class Env:
    """Shared between a test and its agents (passed as the runtime's ``env``)."""

    def __init__(self) -> None:
        # (task name, time - EPOCH, payload, attempt or None) per task run, in run order.
        self.runs: list[tuple[str, float, Any, int | None]] = []
        # (error, task, time - EPOCH) per on_error call.
        self.errors: list[tuple[Exception, nj.TaskRecord, float]] = []
        self.events: list[nj.Event] = []
        # Calls the test makes while the "nap" task holds the object (see ``Held``).
        self.calls_in, self.calls_out = trio.open_memory_channel[Any](0)
        self.napping = trio.Event()
        self.stub: nj.Stub | None = None

    async def serve(self) -> None:
        """Run the calls the test sends through ``Held``, inside the current task's turn:
        calls made "while a task runs" can only come from that task (DESIGN section 2)."""
        await serve_calls(self.calls_out, self.stub)

    def record(self, name: str, payload: Any, attempt: int | None = None) -> None:
        self.runs.append((name, rel(), payload, attempt))

    def ran(self) -> list[tuple[str, float, Any]]:
        return [(name, t, payload) for name, t, payload, _ in self.runs]

    def times(self, name: str) -> list[float]:
        return [t for n, t, _, _ in self.runs if n == name]

    def of(self, type: str) -> list[nj.Event]:
        return [e for e in self.events if e.type == type]


class Worker(nj.Agent):
    """An Agent whose tasks report to ``env``; no ``on_task`` override."""

    namespace = "tests.test_agent.Worker"
    not_a_method = "a class attribute"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.env.stub = ctx.get(Worker, ctx.id)
        self.counter = 0  # an instance attribute: not a task either

    # -- tasks --
    async def work(self, payload: Any) -> None:
        self.env.record("work", payload)

    def sync_work(self, payload: Any) -> str:
        self.env.record("sync_work", payload)
        return "ignored"

    async def flaky(self, payload: Any) -> None:
        self.env.record("flaky", payload)
        raise RuntimeError(f"flaky {payload}")

    async def _secret(self, payload: Any) -> None:
        self.env.record("_secret", payload)

    async def stop_after_three(self, task_id: str) -> None:
        self.env.record("stop_after_three", task_id)
        if len(self.env.times("stop_after_three")) == 3:
            assert await self.cancel_schedule(task_id) is True

    async def chain(self, n: int) -> None:
        self.env.record("chain", n)
        if n < 3:
            await self.schedule(5, "chain", n + 1, id="chain")

    async def spawn(self, payload: Any) -> None:
        self.env.record("spawn", payload)
        await self.queue("work", "spawned now")
        await self.schedule(5, "work", "spawned later", id="later")

    async def retune(self, payload: Any) -> None:
        self.env.record("retune", payload)
        if len(self.env.times("retune")) == 1:
            await self.every(3, "retune", payload, id="r")

    async def nap(self, seconds: float) -> None:
        self.env.record("nap", seconds)
        self.env.napping.set()
        with trio.move_on_after(seconds):
            await self.env.serve()  # the test's calls meanwhile (``Held``)

    async def counted(self, payload: Any) -> None:
        # A task method sees its task, and which attempt this is (fails on the first).
        info = self.current_task
        assert info is not None and info.name == "counted"
        self.env.record("counted", (info.id, payload), info.attempt)
        if info.attempt == 1:
            raise RuntimeError("first attempt fails")

    async def cancel_then_fail(self, payload: Any) -> None:
        self.env.record("cancel_then_fail", payload)
        assert await self.cancel_schedule("cf") is True
        raise RuntimeError("fails after cancelling itself")

    # -- hooks --
    async def on_error(self, error: Exception, task: nj.TaskRecord) -> None:
        self.env.errors.append((error, task, rel()))

    # -- test access --
    async def put(self, key: str, value: Any) -> None:
        self.ctx.storage.put(key, value)

    async def read(self, key: str) -> Any:
        return self.ctx.storage.get(key)

    async def dead_letters(self) -> list[nj.DeadLetter]:
        return self.lifecycle.dead_letters()

    async def destroy_and_look(self) -> tuple[Any, list[nj.Job]]:
        await self.destroy()
        return self.ctx.storage.get("k"), self.lifecycle.jobs.list()

    async def outside_a_task(self) -> bool:
        return self.current_task is None

    async def schedule_secret(self, when: float) -> str:
        return await self.schedule(when, "_secret", "from inside")


class Fallback(nj.Agent):
    """An Agent that handles unknown task names in ``on_task``."""

    namespace = "tests.test_agent.Fallback"

    async def known(self, payload: Any) -> None:
        self.ctx.env.record("known", payload)

    async def on_task(self, name: str, payload: Any, info: nj.TaskInfo) -> None:
        assert info.name == name
        self.ctx.env.record(f"on_task:{name}", (info.id, payload), info.attempt)
        if payload == "fail twice" and info.attempt <= 2:
            raise RuntimeError(f"attempt {info.attempt} fails")


def alarm(rt: nj.Runtime, cls: type[nj.DurableObject] = Worker, object_id: str = "w") -> Any:
    found = engine.stored_alarm(rt, cls.namespace, object_id)
    return None if found is None else found[0] - EPOCH


def listen(rt: nj.Runtime, env: Env) -> None:
    rt.events.add_listener(env.events.append)


# -- dispatch ---------------------------------------------------------------------------------


async def test_tasks_call_the_method_of_their_name(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            queued = await agent.queue("work", {"n": 1})
            assert isinstance(queued, str) and queued
            assert await agent.queue("sync_work", [1, 2], id="sync") == "sync"
            assert await agent.schedule(5, "work", "in 5", id="five") == "five"
            assert await agent.schedule(dt.timedelta(seconds=7), "work", "td") != "five"
            assert await agent.schedule(
                dt.datetime.fromtimestamp(EPOCH + 9, dt.UTC), "sync_work", "at 9") != "five"
            assert await agent.every(10, "work", "beat", id="beat") == "beat"
            await trio.sleep(25)
            assert env.ran() == [
                ("work", 0, {"n": 1}), ("sync_work", 0, [1, 2]), ("work", 5, "in 5"),
                ("work", 7, "td"), ("sync_work", 9, "at 9"), ("work", 10, "beat"),
                ("work", 20, "beat"),
            ]


async def test_on_task_handles_names_without_a_method(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Fallback, "f")
            await agent.queue("known", "k")
            await agent.queue("missing", "fail twice", id="m")
            await agent.schedule(5, "later", "x", id="l")
            await trio.sleep(10)
            assert env.runs == [
                ("known", 0, "k", None),
                ("on_task:missing", 0, ("m", "fail twice"), 1),
                ("on_task:missing", 1, ("m", "fail twice"), 2),  # retried after 1 s
                ("on_task:missing", 3, ("m", "fail twice"), 3),  # then 2 s
                ("on_task:later", 5, ("l", "x"), 1),
            ]


async def test_private_methods_run_when_scheduled_but_not_through_a_stub(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            with pytest.raises(nj.RpcError):
                await agent._secret("direct")
            with pytest.raises(nj.RpcError):
                await agent.call("_secret", "direct")
            await agent.schedule(5, "_secret", "scheduled")
            await agent.queue("_secret", "queued")
            await agent.schedule_secret(7)
            await trio.sleep(10)
            assert env.ran() == [("_secret", 0, "queued"), ("_secret", 5, "scheduled"),
                                 ("_secret", 7, "from inside")]


@pytest.mark.parametrize("hook", ["on_task", "on_error", "on_job", "on_start", "alarm"])
async def test_agent_hooks_are_not_callable_through_a_stub(
    autojump_clock: trio.testing.MockClock, hook: str
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            with pytest.raises(nj.RpcError, match=hook):
                await rt.get(Worker, "w").call(hook, "x", None, None)
            assert env.runs == [] and env.errors == []


UNKNOWN = ["nope", "not_a_method", "counter", "destroy", "queue", "every", "on_task",
           "on_job", "on_error", "lifecycle", "ctx", "env", "", "get_queued", "list_queued",
           "dequeue", "dequeue_all"]


@pytest.mark.parametrize("name", UNKNOWN)
@pytest.mark.parametrize("how", ["queue", "schedule", "every"])
async def test_a_name_that_is_no_task_is_refused_at_once(
    autojump_clock: trio.testing.MockClock, name: str, how: str
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            args = (name,) if how == "queue" else (5, name)
            with pytest.raises(nj.UnknownCallbackError) as info:
                await agent.call(how, *args, "payload", id="t")
            assert repr(name) in str(info.value) and "Worker" in str(info.value)
            assert await agent.list_schedules() == []
            assert alarm(rt) is None
            # With an on_task override the same name is accepted (and handled there).
            fallback = rt.get(Fallback, "f")
            if name:
                await fallback.call(how, *args, "payload", id="t")
                await trio.sleep(6)
                assert [n for n, _, _, _ in env.runs] == [f"on_task:{name}"]


# -- retries ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_retries", "offsets"),
    [
        (5, [0, 1, 3, 7, 15, 31]),  # the default: waits of 1, 2, 4, 8, 16 s
        (0, [0]),
        (2, [0, 1, 3]),
        (10, [0, 1, 3, 7, 15, 31, 63, 127, 255, 511, 811]),  # the wait caps at 300 s
    ],
)
@pytest.mark.parametrize("how", ["queue", "schedule"])
async def test_retries_back_off_exactly_then_dead_letter_and_on_error(
    autojump_clock: trio.testing.MockClock, how: str, max_retries: int, offsets: list[int]
) -> None:
    env = Env()
    start = 0 if how == "queue" else 10
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            kwargs = {} if max_retries == 5 else {"max_retries": max_retries}
            if how == "queue":
                await agent.queue("flaky", "p", id="f", **kwargs)
            else:
                await agent.schedule(10, "flaky", "p", id="f", **kwargs)
            await trio.sleep(2000)
            assert env.times("flaky") == [start + t for t in offsets]
            last = start + offsets[-1]
            [(error, task, t)] = env.errors
            assert isinstance(error, RuntimeError) and str(error) == "flaky p" and t == last
            assert task == nj.TaskRecord(
                id="f", name="flaky", payload="p", due=EPOCH + last, every=None,
                attempts=max_retries + 1, max_retries=max_retries, created_at=EPOCH,
            )
            [letter] = await agent.dead_letters()
            assert (letter.job.id, letter.attempts, letter.error) == (
                "f", max_retries + 1, "RuntimeError: flaky p")
            assert await agent.list_schedules() == []
            assert alarm(rt) is None


@pytest.mark.parametrize("max_retries", [-1, True, 1.5, "5"])
async def test_invalid_max_retries_raises_and_stores_nothing(
    autojump_clock: trio.testing.MockClock, max_retries: Any
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            for how, args in [("queue", ("work",)), ("schedule", (5, "work")),
                              ("every", (5, "work"))]:
                with pytest.raises(ValueError, match="max_retries"):
                    await agent.call(how, *args, max_retries=max_retries)
            assert await agent.list_schedules() == []
            assert alarm(rt) is None


@pytest.mark.parametrize("how", ["queue", "schedule", "every"])
async def test_a_task_method_sees_its_attempt(
    autojump_clock: trio.testing.MockClock, how: str
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            if how == "queue":
                await agent.queue("counted", "p", id="c")
            elif how == "schedule":
                await agent.schedule(0, "counted", "p", id="c")
            else:
                await agent.every(10, "counted", "p", id="c")
            await trio.sleep(12)
            start = 10 if how == "every" else 0
            assert env.runs[:2] == [("counted", start, ("c", "p"), 1),
                                    ("counted", start + 1, ("c", "p"), 2)]
            assert await agent.outside_a_task() is True


async def test_schedule_and_every_take_a_zone_and_a_missed_policy(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # EPOCH is 08:00 UTC, 09:00 in Berlin (CET).
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.schedule("1 10 * * *", "work", "berlin", id="b", tz="Europe/Berlin")
            await agent.schedule("1 10 * * *", "work", "utc", id="u")
            await agent.every(10, "work", "beat", id="e", missed="skip")
            assert {r.id: r.due - EPOCH for r in await agent.list_schedules()} == {
                "b": HOUR + 60, "u": 2 * HOUR + 60, "e": 10}
            await trio.sleep(25)
        await trio.sleep(70)  # down from 25 to 95: the slots 30 ... 90 are dropped
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            await trio.sleep(10)
        assert env.ran() == [("work", 10, "beat"), ("work", 20, "beat"),
                             ("work", 100, "beat")]
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            agent = rt.get(Worker, "w")
            for kwargs in ({"tz": "Mars/Olympus_Mons"}, {"missed": "later"}):
                with pytest.raises(nj.JobError, match=next(iter(kwargs))):
                    await agent.schedule("0 9 * * *", "work", id="bad", **kwargs)
            with pytest.raises(nj.JobError, match="missed"):
                await agent.every(10, "work", id="bad", missed="later")
            assert await agent.get_queued("bad") is None
            assert "bad" not in [r.id for r in await agent.list_schedules()]


# -- handlers that change schedules ----------------------------------------------------------------


async def test_a_handler_may_cancel_its_own_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.every(10, "stop_after_three", "s", id="s")
            await trio.sleep(100)
            assert env.times("stop_after_three") == [10, 20, 30]
            assert await agent.list_schedules() == []
            assert alarm(rt) is None


async def test_a_handler_that_cancels_itself_then_fails_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its cancel is one of its writes: a failing run is undone whole (exactly once), so
    the task is retried as if it had not cancelled itself, then dead-lettered."""
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.queue("cancel_then_fail", None, id="cf")
            await trio.sleep(100)
            assert env.times("cancel_then_fail") == [0, 1, 3, 7, 15, 31]
            assert [task.id for _, task, _ in env.errors] == ["cf"]
            assert [letter.job.id for letter in await agent.dead_letters()] == ["cf"]
            assert await agent.list_schedules() == []


async def test_a_one_shot_handler_may_reschedule_its_own_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.schedule(10, "chain", 1, id="chain")
            await trio.sleep(100)
            # Each run's "done" is discarded for the schedule it left.
            assert env.ran() == [("chain", 10, 1), ("chain", 15, 2), ("chain", 20, 3)]
            assert await agent.list_schedules() == []


async def test_an_interval_handler_may_change_its_own_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.every(10, "retune", "r", id="r")
            await trio.sleep(20)
            # Its first run re-schedules "r" every 3 s: that wins over "next in 10 s".
            assert env.times("retune") == [10, 13, 16, 19]
            [task] = await agent.list_schedules()
            assert (task.id, task.every, task.due) == ("r", 3.0, EPOCH + 22)


async def test_a_handler_may_schedule_new_tasks(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.queue("spawn", None)
            await trio.sleep(10)
            assert env.ran() == [("spawn", 0, None), ("work", 0, "spawned now"),
                                 ("work", 5, "spawned later")]


# -- listing and cancelling ------------------------------------------------------------------------


async def test_list_schedules_records(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.queue("flaky", "q", id="q")  # fails at 0: attempt 2 due at 1
            await agent.schedule(30, "work", {"s": 1}, id="s", max_retries=2)
            await agent.every(60, "work", "e", id="e", max_retries=0)
            cron = await agent.schedule("0 9 * * *", "sync_work", None)
            await trio.sleep(0.5)
            assert await agent.list_schedules() == [
                nj.TaskRecord(id="q", name="flaky", payload="q", due=EPOCH + 1, every=None,
                              attempts=1, max_retries=5, created_at=EPOCH),
                nj.TaskRecord(id="s", name="work", payload={"s": 1}, due=EPOCH + 30,
                              every=None, attempts=0, max_retries=2, created_at=EPOCH),
                nj.TaskRecord(id="e", name="work", payload="e", due=EPOCH + 60, every=60.0,
                              attempts=0, max_retries=0, created_at=EPOCH),
                nj.TaskRecord(id=cron, name="sync_work", payload=None, due=EPOCH + 3600,
                              every=None, attempts=0, max_retries=5, created_at=EPOCH),
            ]


async def test_list_schedules_during_a_run_omits_tasks_already_done(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.schedule(100, "work", "later", id="later")
            await agent.queue("work", "a", id="a")
            await agent.queue("work", "b", id="b")
            await agent.queue("nap", 10, id="nap")
            await env.napping.wait()
            await trio.sleep(5)  # "a" and "b" are done; "nap" runs until 10
            assert [t.id for t in await Held(env.calls_in).list_schedules()] == ["nap", "later"]
            await trio.sleep(10)
            assert [t.id for t in await agent.list_schedules()] == ["later"]


async def test_cancel_schedule(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            agent = rt.get(Worker, "w")
            assert await agent.cancel_schedule("unknown") is False
            await agent.queue("flaky", "q", id="q")  # waiting for its retry
            await agent.schedule(30, "work", "s", id="s")
            await agent.every(10, "work", "e", id="e")
            await trio.sleep(0.5)
            assert await agent.cancel_schedule("q") is True
            assert await agent.cancel_schedule("s") is True
            assert await agent.cancel_schedule("s") is False
            assert [t.id for t in await agent.list_schedules()] == ["e"]
            assert alarm(rt) == 10
            assert await agent.cancel_schedule("e") is True
            assert alarm(rt) is None
            await trio.sleep(100)
            assert env.ran() == [("flaky", 0, "q")]
            assert [e.data["id"] for e in env.of("schedule:cancel")] == ["s", "e"]


# -- queued tasks ---------------------------------------------------------------------------------


async def test_get_and_list_queued_tasks(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            # Held up by a task that naps, so the others stay queued behind it (queued
            # from inside its turn, as only the running task can meanwhile).
            await agent.queue("nap", 10, id="nap")
            await env.napping.wait()
            agent = Held(env.calls_in)
            await trio.sleep(1)
            await agent.queue("work", {"n": 1}, id="a", max_retries=2)
            await trio.sleep(1)
            b = await agent.queue("sync_work", [2])
            await agent.queue("work", "c", id="c")
            await agent.schedule(5, "work", "scheduled", id="s")
            item = await agent.get_queued("a")
            assert item == nj.QueueItem(
                id="a", callback="work", payload={"n": 1}, priority=0, created_at=EPOCH + 1,
                retry=nj.RetryOptions(max_attempts=3, base_delay=1.0, max_delay=300.0,
                                      jitter=False),
            )
            # Scheduled tasks are not queued ones.
            assert await agent.get_queued("s") is None
            assert await agent.get_queued("nope") is None
            # In run order, the running task included until it ends.
            assert [i.id for i in await agent.list_queued()] == ["nap", "a", b, "c"]
            assert [i.id for i in await agent.list_queued("work")] == ["a", "c"]
            assert [i.id for i in await agent.list_queued(method="sync_work")] == [b]
            assert await agent.list_queued("flaky") == []
            await trio.sleep(20)
            agent = rt.get(Worker, "w")
            assert await agent.list_queued() == []
            assert await agent.get_queued("a") is None


async def test_dequeue_removes_one_queued_task(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            await rt.get(Worker, "w").queue("nap", 10, id="nap")
            await env.napping.wait()
            agent = Held(env.calls_in)  # (reached from inside the nap's turn until it ends)
            await agent.queue("work", "a", id="a")
            await agent.queue("work", "b", id="b")
            await agent.schedule(5, "work", "scheduled", id="s")
            await trio.sleep(1)
            assert await agent.dequeue("a") is True
            assert await agent.dequeue("a") is False
            assert await agent.dequeue("never") is False
            # A scheduled task is left alone: dequeue is for queued tasks.
            assert await agent.dequeue("s") is False
            assert [i.id for i in await agent.list_queued()] == ["nap", "b"]
            await trio.sleep(20)
            # One task at a time: the nap holds up both until 10, then queue order.
            assert env.ran() == [("nap", 0, 10), ("work", 10, "b"), ("work", 10, "scheduled")]


async def test_dequeue_a_task_waiting_for_its_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.queue("flaky", "f", id="f")  # fails at 0; retry due at 1
            await trio.sleep(0.5)
            assert [i.id for i in await agent.list_queued()] == ["f"]
            assert await agent.dequeue("f") is True
            await trio.sleep(100)
            assert env.times("flaky") == [0]
            assert env.errors == []
            assert await agent.dead_letters() == []
            assert alarm(rt) is None


async def test_dequeue_all_and_by_method(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            await rt.get(Worker, "w").queue("nap", 10, id="nap")
            await env.napping.wait()
            agent = Held(env.calls_in)  # (reached from inside the nap's turn until it ends)
            await trio.sleep(1)
            for n in range(3):
                await agent.queue("work", n, id=f"w{n}")
                await agent.queue("sync_work", n, id=f"s{n}")
            await agent.every(5, "work", "beat", id="beat")
            assert await agent.dequeue_all("work") == 3
            assert await agent.dequeue_all("work") == 0
            assert await agent.dequeue_all("nope") == 0
            assert [i.id for i in await agent.list_queued()] == ["nap", "s0", "s1", "s2"]
            # Every queued task, the running one included (its run finishes, nothing
            # comes after it); the schedule stays.
            assert await agent.dequeue_all() == 4
            assert await agent.list_queued() == []
            assert [t.id for t in await agent.list_schedules()] == ["beat"]
            agent = rt.get(Worker, "w")
            await trio.sleep(14)
            # The beat due at 6 waits for the nap, then keeps to its grid (1 + 5k).
            assert env.ran() == [("nap", 0, 10), ("work", 10, "beat"), ("work", 11, "beat")]


@pytest.mark.parametrize(
    ("method", "args"),
    [("get_queued", (5,)), ("get_queued", ("",)), ("dequeue", (None,)), ("dequeue", (" ",)),
     ("list_queued", (5,)), ("list_queued", ("",)), ("dequeue_all", (["work"],)),
     ("dequeue_all", ("",))],
)
async def test_queued_task_arguments_are_checked(
    autojump_clock: trio.testing.MockClock, method: str, args: tuple[Any, ...]
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Worker, "w")
            await agent.queue("flaky", "f", id="f")
            with pytest.raises(nj.JobError) as info:
                await agent.call(method, *args)
            assert isinstance(info.value, ValueError)
            assert [i.id for i in await agent.list_queued()] == ["f"]


# -- destroy ------------------------------------------------------------------------------------


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "disk"])
async def test_destroy_leaves_an_empty_object(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, on_disk: bool
) -> None:
    env = Env()
    path = tmp_path if on_disk else None
    with trio.fail_after(HANG):
        async with nj.open_runtime(path, env=env) as rt:
            listen(rt, env)
            agent = rt.get(Worker, "w")
            other = rt.get(Worker, "other")
            await agent.put("k", "v")
            await other.put("k", "kept")
            await agent.every(10, "work", "beat", id="beat")
            await agent.schedule(100, "work", "later", id="later")
            await agent.queue("flaky", "f", id="f", max_retries=0)  # a dead letter
            await trio.sleep(15)
            assert env.ran() == [("flaky", 0, "f"), ("work", 10, "beat")]
            [file] = [f for ns, oid, f in rt.engine.catalog.objects()
                      if (ns, oid) == (Worker.namespace, "w")]
            if on_disk:
                assert (tmp_path / "objects" / file).exists()
            await agent.destroy()
            await trio.sleep(1)
            # Gone: registry row, alarm and (on disk) the database files.
            assert [e.object_id for e in env.of("object:destroyed")] == ["w"]
            assert alarm(rt) is None
            assert (Worker.namespace, "w") not in {
                (ns, oid) for ns, oid, _ in rt.engine.catalog.objects()}
            if on_disk:
                assert [f.name for f in (tmp_path / "objects").iterdir()
                        if f.name.startswith(file)] == []
            # The next activation starts empty.
            assert await agent.read("k") is None
            assert await agent.list_schedules() == []
            assert await agent.dead_letters() == []
            assert await other.read("k") == "kept"
            await trio.sleep(200)
            assert env.ran() == [("flaky", 0, "f"), ("work", 10, "beat")]
        if on_disk:
            async with nj.open_runtime(path, env=env) as rt:
                assert alarm(rt) is None
                assert await rt.get(Worker, "w").read("k") is None
                assert await rt.get(Worker, "other").read("k") == "kept"


async def test_destroy_runs_through_an_exclusive_job_after_the_call_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            listen(rt, env)
            agent = rt.get(Worker, "w")
            await agent.put("k", "v")
            await agent.every(10, "work", "beat", id="beat")
            # Deferred: the call returns with the object intact, and the destroy job
            # (exclusive: it alone decides the alarm) due at once.
            value, jobs = await agent.destroy_and_look()
            assert value == "v"
            assert [(j.fn, j.exclusive, j.time) for j in jobs] == [
                ("nj:destroy", True, EPOCH)]
            assert alarm(rt) == 0
            await trio.sleep(1)
            assert len(env.of("object:destroyed")) == 1
            assert await agent.read("k") is None


# -- cancelling a running task from an @nj.interleave method ------------------------------


class Tasks(nj.Agent):
    """An Agent with a 100 s task; ``stop`` cancels it from an ``@nj.interleave`` method
    (the way DESIGN §3 gives to cancel a running job from a stub call)."""

    namespace = "tests.test_agent.Tasks"

    async def long(self, payload: Any) -> None:
        self.ctx.env["runs"].append(("long", payload, rel()))
        await trio.sleep(100)
        self.ctx.env["runs"].append(("long done", payload, rel()))

    async def on_error(self, error: Exception, task: nj.TaskRecord) -> None:
        self.ctx.env["errors"].append((task.id, rel()))

    @nj.interleave
    async def stop(self, how: str, task_id: str) -> bool | int:
        if how == "dequeue":
            return await self.dequeue(task_id)
        if how == "cancel_schedule":
            return await self.cancel_schedule(task_id)
        assert how == "dequeue_all"
        return await self.dequeue_all()

    async def queue_each(self, *task_ids: str) -> None:
        """Queue a ``long`` task of each id (in one call: none starts before the last
        is queued)."""
        for task_id in task_ids:
            await self.queue("long", task_id, id=task_id)

    async def left(self) -> tuple[list[str], list[str]]:
        return [t.id for t in self.list_schedules()], [d.job.id for d in self.dead_letters()]


async def _stop_a_running_task(how: str, kind: str) -> None:
    env: dict[str, Any] = {"runs": [], "errors": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Tasks, "t")
            if kind == "queued":
                await agent.queue("long", "p", id="L")
            else:
                await agent.schedule(0, "long", "p", id="L")
            await trio.sleep(5)
            assert env["runs"] == [("long", "p", 0)]
            assert await agent.stop(how, "L") in (True, 1)
            assert rel() == 5  # at once, not after the run
            await trio.sleep(200)
            assert env["runs"] == [("long", "p", 0)]  # cancelled: it never ended
            assert env["errors"] == []  # no retry, no dead letter, no on_error
            assert await agent.left() == ([], [])


async def test_dequeue_from_an_interleave_method_cancels_a_running_task_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await _stop_a_running_task("dequeue", "queued")


@pytest.mark.parametrize(("how", "kind"), [
    ("cancel_schedule", "scheduled"), ("cancel_schedule", "queued"), ("dequeue_all", "queued"),
])
async def test_cancel_schedule_and_dequeue_all_cancel_a_running_task_at_once(
    autojump_clock: trio.testing.MockClock, how: str, kind: str,
) -> None:
    await _stop_a_running_task(how, kind)


async def test_dequeue_all_from_an_interleave_method_cancels_the_run_and_the_queue_behind_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The run in progress is cancelled at once; the tasks queued behind it are deleted
    # before the alarm run starts the next (it hands the object over after a cancelled
    # job, as after any job).
    env: dict[str, Any] = {"runs": [], "errors": []}
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            agent = rt.get(Tasks, "t")
            await agent.queue_each("A", "B", "C")
            await trio.sleep(5)
            assert env["runs"] == [("long", "A", 0)]
            assert await agent.stop("dequeue_all", "") == 3
            assert rel() == 5
            await trio.sleep(500)
            assert env["runs"] == [("long", "A", 0)]
            assert await agent.left() == ([], [])


async def test_cancel_schedule_from_an_interleave_method_tells_of_the_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env: dict[str, Any] = {"runs": [], "errors": []}
    events: list[tuple[str, dict[str, Any]]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            rt.events.add_listener(lambda e: events.append((e.type, e.data))
                                   if e.type in ("schedule:cancel", "job:cancelled") else None)
            agent = rt.get(Tasks, "t")
            await agent.schedule(3600, "long", "q", id="later")
            await agent.schedule(0, "long", "p", id="L")
            await trio.sleep(5)
            assert await agent.stop("cancel_schedule", "L") is True
            assert await agent.stop("cancel_schedule", "later") is True
            assert await agent.stop("cancel_schedule", "gone") is False
            assert [(kind, data["id"]) for kind, data in events] == [
                ("job:cancelled", "L"), ("schedule:cancel", "L"), ("schedule:cancel", "later")]
            assert events[1][1]["callback"] == "long"
