"""The Queue capability (DESIGN.md §4): FIFO within a priority, higher priority first,
stable ids replaced in place (keeping their position, superseding a run in flight), a
failing item never blocking the next, retries, dead letters and requeue, argument checks,
cancel, and durability across a restart.

Every timer test runs under ``autojump_clock`` and asserts exact virtual times relative
to ``EPOCH``. A "gate" item holds the queue (items run one at a time) while a test lines
up the items behind it, so the order they run in is the queue's decision alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
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


def rel() -> float:
    return nj.now() - EPOCH


class Env:
    """Shared between a test and its objects (passed as the runtime's ``env``)."""

    def __init__(self, retry: nj.RetryOptions | None = None) -> None:
        self.retry = retry
        # (callback, item id, time - EPOCH, payload) per callback run, in run order.
        self.runs: list[tuple[str, str, float, Any]] = []
        # (error, item, time - EPOCH) per on_error call.
        self.errors: list[tuple[Exception, nj.QueueItem, float]] = []
        self.events: list[nj.Event] = []
        self.gate = trio.Event()
        self.gate_entered = trio.Event()
        self.failing = True
        self.finished: list[tuple[str, Any, float]] = []
        # QueueItem.attempt as each run of the "flaky" callback saw it.
        self.attempts: list[int] = []
        # Calls the test makes while the gate item holds the object (see ``Held``).
        self.calls_in, self.calls_out = trio.open_memory_channel[Any](0)
        self.stub: nj.Stub | None = None

    def record(self, callback: str, payload: Any, item: nj.QueueItem) -> None:
        assert item.callback == callback and item.payload == payload
        self.runs.append((callback, item.id, rel(), payload))

    def ran(self) -> list[tuple[str, Any]]:
        """(item id, payload) of every run."""
        return [(item_id, payload) for _cb, item_id, _t, payload in self.runs]

    def of(self, type: str) -> list[tuple[float, dict[str, Any]]]:
        return [(e.time - EPOCH, e.data) for e in self.events if e.type == type]

    def callbacks(self) -> dict[str, Any]:
        env = self

        async def rec(payload: Any, item: nj.QueueItem) -> None:
            env.record("rec", payload, item)

        def rec_sync(payload: Any, item: nj.QueueItem) -> str:
            env.record("rec_sync", payload, item)
            return "a sync result is ignored"

        async def other(payload: Any, item: nj.QueueItem) -> None:
            env.record("other", payload, item)

        async def gate(payload: Any, item: nj.QueueItem) -> None:
            env.record("gate", payload, item)
            env.gate_entered.set()
            await env.serve_until_the_gate_opens()

        async def fail(payload: Any, item: nj.QueueItem) -> None:
            env.record("fail", payload, item)
            if env.failing:
                raise RuntimeError(f"boom {payload}")

        async def flaky(payload: Any, item: nj.QueueItem) -> None:
            # Fails on its first attempt only: the item says which attempt it is.
            env.record("flaky", payload, item)
            env.attempts.append(item.attempt)
            if item.attempt == 1:
                raise RuntimeError(f"first attempt of {payload}")

        async def slow(payload: Any, item: nj.QueueItem) -> None:
            # The first version of an item blocks on the gate; a replacement does not.
            env.record("slow", payload, item)
            if payload == "old":
                env.gate_entered.set()
                await env.serve_until_the_gate_opens()
                if env.failing:
                    raise RuntimeError("the superseded run failed")
            env.finished.append(("slow", payload, rel()))

        return {"rec": rec, "rec_sync": rec_sync, "other": other, "gate": gate, "fail": fail,
                "slow": slow, "flaky": flaky}

    async def on_error(self, error: Exception, item: nj.QueueItem) -> None:
        self.errors.append((error, item, rel()))

    async def serve_until_the_gate_opens(self) -> None:
        """While a callback holds the object's turn (until ``gate`` is set), run the calls
        the test sends through ``Held`` inside that turn: calls made "while an item
        runs" can only come from the running job itself (DESIGN section 2, Turns)."""
        async with trio.open_nursery() as nursery:

            nursery.start_soon(serve_calls, self.calls_out, self.stub)
            await self.gate.wait()
            nursery.cancel_scope.cancel()


class Uploads(nj.DurableObject):
    """A Lifecycle object with one Queue whose callbacks come from ``env``."""

    namespace = "tests.test_queue.Uploads"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        env: Env = ctx.env
        env.stub = ctx.get(Uploads, ctx.id)
        self.queue = nj.Queue(env.callbacks(), retry=env.retry, on_error=env.on_error)
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def push(self, callback: str, payload: Any = None, **kwargs: Any) -> nj.QueueItem:
        return await self.queue.push(callback, payload, **kwargs)

    async def push_all(self, pushes: list[tuple[str, Any, dict[str, Any]]]) -> None:
        """Several pushes in one turn: none of them runs before the last is in."""
        for callback, payload, kwargs in pushes:
            await self.queue.push(callback, payload, **kwargs)

    async def get(self, item_id: str) -> nj.QueueItem | None:
        return self.queue.get(item_id)

    async def items(self, callback: str | None = None) -> list[nj.QueueItem]:
        return self.queue.list(callback)

    async def cancel(self, item_id: str) -> bool:
        return await self.queue.cancel(item_id)

    async def cancel_all(self, callback: str | None = None) -> int:
        return await self.queue.cancel_all(callback)

    async def dead_letters(self) -> list[nj.QueueDeadLetter]:
        return self.queue.dead_letters()

    async def requeue(self, item_id: str) -> nj.QueueItem | None:
        return await self.queue.requeue(item_id)


def ids(items: list[nj.QueueItem]) -> list[str]:
    return [item.id for item in items]


async def hold_the_queue(obj: nj.Stub, env: Env) -> Held:
    """Start a "gate" item and wait until it runs: the queue is busy until env.gate;
    meanwhile the object is reached through the ``Held`` returned (inside the gate's
    turn)."""
    await obj.push("gate", id="gate")
    await env.gate_entered.wait()
    return Held(env.calls_in)


def alarm(rt: nj.Runtime, object_id: str = "o") -> float | None:
    found = engine.stored_alarm(rt, Uploads.namespace, object_id)
    return None if found is None else found[0] - EPOCH


def listen(rt: nj.Runtime, env: Env) -> None:
    rt.events.add_listener(env.events.append)


# -- order ---------------------------------------------------------------------------------


async def test_items_run_one_at_a_time_in_push_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            held = await hold_the_queue(obj, env)
            # Ids against the alphabet, sync and async callbacks mixed, one anonymous.
            await held.push("rec", "1", id="z")
            await held.push("rec_sync", "2", id="y")
            anonymous = await held.push("rec", "3")
            await held.push("other", "4", id="a")
            await trio.sleep(5)
            # Nothing else runs while the gate item runs: one at a time.
            assert env.ran() == [("gate", None)]
            env.gate.set()
            await trio.sleep(1)
            assert env.ran() == [
                ("gate", None), ("z", "1"), ("y", "2"), (anonymous.id, "3"), ("a", "4"),
            ]
            # Pushed at 5 (while the gate held the queue), all ran at once when it opened.
            assert {t for _, _, t, _ in env.runs[1:]} == {5}
            assert await obj.items() == []
            assert alarm(rt) is None


async def test_higher_priority_runs_first_and_fifo_within_a_priority(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            held = await hold_the_queue(obj, env)
            await trio.sleep(1)
            for item_id, priority in [
                ("a0", 0), ("hi", 5), ("b0", 0), ("hi2", 5), ("top", 1000), ("c0", 0),
                ("one", 1),
            ]:
                item = await held.push("rec", item_id, id=item_id, priority=priority)
                assert item.priority == priority
                await trio.sleep(1)  # pushed at different times: only priority may decide
            # list() is in run order (the running gate item ahead of the later
            # priority-0 items).
            assert ids(await held.items()) == ["top", "hi", "hi2", "one", "gate", "a0", "b0",
                                              "c0"]
            env.gate.set()
            await trio.sleep(1)
            assert [item_id for item_id, _ in env.ran()] == [
                "gate", "top", "hi", "hi2", "one", "a0", "b0", "c0",
            ]
            # Every item was due at once, whatever its priority.
            assert {t for _, _, t, _ in env.runs[1:]} == {8}
            assert await obj.items() == []


async def test_negative_priority_runs_after_priority_zero(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            held = await hold_the_queue(obj, env)
            for item_id, priority in [("low", -1), ("a0", 0), ("bottom", -1000), ("b0", 0)]:
                await held.push("rec", item_id, id=item_id, priority=priority)
                await trio.sleep(1)
            env.gate.set()
            await trio.sleep(10)
            assert [item_id for item_id, _ in env.ran()] == ["gate", "a0", "b0", "low",
                                                               "bottom"]
            assert [t for _, _, t, _ in env.runs[1:]] == [4, 4, 4, 4]


async def test_a_higher_priority_push_overtakes_a_due_backlog(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            # The gate and a backlog, all due when the alarm run starts at 0.
            await obj.push_all([("gate", None, {"id": "gate"})]
                               + [("rec", f"n{n}", {"id": f"n{n}"}) for n in range(3)])
            await env.gate_entered.wait()
            held = Held(env.calls_in)
            await trio.sleep(100)
            await held.push("rec", "urgent", id="urgent", priority=1)
            env.gate.set()
            await trio.sleep(1)
            assert [item_id for item_id, _ in env.ran()] == ["gate", "urgent", "n0", "n1",
                                                               "n2"]


# -- stable ids ------------------------------------------------------------------------------


async def test_stable_id_replaces_in_place_keeping_its_position(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            listen(rt, env)
            held = await hold_the_queue(obj, env)
            a = await held.push("rec", "A", id="a")
            b = await held.push("rec", "B", id="b")
            await held.push("rec", "C", id="c")
            await trio.sleep(3)
            b2 = await held.push("rec", "B'", id="b")
            # One item, replaced: new payload, same creation time, same place in line.
            assert (b2.id, b2.payload, b2.created_at) == ("b", "B'", b.created_at)
            assert await held.get("b") == b2
            assert ids(await held.items()) == ["gate", "a", "b", "c"]
            assert await held.get("a") == a
            env.gate.set()
            await trio.sleep(1)
            assert env.ran() == [("gate", None), ("a", "A"), ("b", "B'"), ("c", "C")]
            assert [data["id"] for _, data in env.of("queue:create")] == [
                "gate", "a", "b", "c", "b",
            ]


async def test_replacing_a_running_item_runs_the_new_payload_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    env.failing = False
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            listen(rt, env)
            await obj.push("slow", "old", id="s")
            await env.gate_entered.wait()
            held = Held(env.calls_in)
            await trio.sleep(2)
            await held.push("slow", "new", id="s")
            await held.push("rec", "behind", id="behind")
            await trio.sleep(2)
            env.gate.set()
            await trio.sleep(1)
            # The old run finished, but its result (delete the item) was discarded: the
            # replacement runs too, once, at the next alarm, still ahead of the item
            # pushed behind it.
            assert env.ran() == [("s", "old"), ("s", "new"), ("behind", "behind")]
            assert env.finished == [("slow", "old", 4), ("slow", "new", 4)]
            assert await obj.items() == []
            assert env.of("queue:retry") == [] and env.of("queue:error") == []
            await trio.sleep(100)
            assert len(env.runs) == 3


async def test_a_run_that_replaces_its_item_then_fails_is_undone_with_its_replacement(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A replacement pushed during a run comes from the run's own turn: if the run then
    fails, the replacement is undone with the rest of its writes (exactly once), and the
    failure is the item's, as if it had never pushed."""
    env = Env(retry=nj.RetryOptions(max_attempts=1))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            listen(rt, env)
            await obj.push("slow", "old", id="s")
            await env.gate_entered.wait()
            held = Held(env.calls_in)
            await held.push("slow", "new", id="s")
            env.gate.set()  # the old run now raises: its last attempt
            await trio.sleep(1)
            assert env.ran() == [("s", "old")]
            assert env.finished == []
            [letter] = await obj.dead_letters()
            assert (letter.item.id, letter.item.payload) == ("s", "old")
            assert [data["id"] for _, data in env.of("queue:error")] == ["s"]
            assert await obj.items() == []


# -- failures, retries, dead letters -----------------------------------------------------------


async def test_a_failing_item_does_not_block_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env(retry=nj.RetryOptions(max_attempts=3, base_delay=4, max_delay=100, jitter=False))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            listen(rt, env)
            held = await hold_the_queue(obj, env)
            await held.push("fail", "f", id="f")
            await held.push("rec", "n1", id="n1")
            await held.push("rec", "n2", id="n2")
            env.gate.set()
            await trio.sleep(2)
            await obj.push("rec", "n3", id="n3")  # pushed while "f" waits for its retry
            await trio.sleep(100)
            assert [(item_id, t) for _, item_id, t, _ in env.runs] == [
                ("gate", 0), ("f", 0), ("n1", 0), ("n2", 0), ("n3", 2),
                ("f", 4), ("f", 12),  # backoff 4 s, then 8 s
            ]
            assert env.of("queue:retry") == [
                (4, {"callback": "fail", "id": "f", "attempt": 2, "max_attempts": 3}),
                (12, {"callback": "fail", "id": "f", "attempt": 3, "max_attempts": 3}),
            ]
            assert env.of("queue:error") == [
                (12, {"callback": "fail", "id": "f", "error": "RuntimeError('boom f')",
                      "attempts": 3}),
            ]


async def test_an_item_knows_its_attempt(autojump_clock: trio.testing.MockClock) -> None:
    env = Env(retry=nj.RetryOptions(max_attempts=3, base_delay=2, jitter=False))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            pushed = await obj.push("flaky", "x", id="f")
            # Outside a run an item has no attempt being run.
            assert pushed.attempt == 0
            await trio.sleep(10)
            # Failed on the first attempt, passed on the second (after 2 s).
            assert env.attempts == [1, 2]
            assert [(item_id, t) for _, item_id, t, _ in env.runs] == [("f", 0), ("f", 2)]
            assert await obj.items() == []
            assert await obj.dead_letters() == []


async def test_dead_letter_on_error_and_requeue(autojump_clock: trio.testing.MockClock) -> None:
    env = Env(retry=nj.RetryOptions(max_attempts=2, base_delay=1, jitter=False))
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            listen(rt, env)
            pushed = await obj.push("fail", {"file": "a.bin"}, id="up-1")
            await trio.sleep(10)
            assert [(item_id, t) for _, item_id, t, _ in env.runs] == [("up-1", 0), ("up-1", 1)]
            # Terminal failure: the event, on_error(error, item), and a dead letter.
            assert env.of("queue:error") == [
                (1, {"callback": "fail", "id": "up-1",
                     "error": "RuntimeError(\"boom {'file': 'a.bin'}\")", "attempts": 2}),
            ]
            [(error, item, t)] = env.errors
            assert isinstance(error, RuntimeError) and str(error) == "boom {'file': 'a.bin'}"
            # The item as its last attempt ran: the second.
            assert item == attrs.evolve(pushed, attempt=2) and t == 1
            assert await obj.items() == []
            [letter] = await obj.dead_letters()
            assert letter == nj.QueueDeadLetter(
                item=pushed, error="RuntimeError: boom {'file': 'a.bin'}", attempts=2,
                time=EPOCH + 1,
            )
            assert alarm(rt) is None
            # Fixed: requeue runs it again, with fresh attempts, and the letter is gone.
            env.failing = False
            requeued = await obj.requeue("up-1")
            assert requeued is not None
            assert (requeued.id, requeued.callback, requeued.payload) == (
                "up-1", "fail", {"file": "a.bin"})
            assert await obj.dead_letters() == []
            await trio.sleep(1)
            assert [(item_id, t) for _, item_id, t, _ in env.runs][2:] == [("up-1", 10)]
            assert len(env.of("queue:retry")) == 1  # only the first life's retry
            assert len(env.errors) == 1
            assert await obj.items() == []
            assert await obj.requeue("up-1") is None
            assert await obj.requeue("never-queued") is None


async def test_on_error_that_raises_still_keeps_the_dead_letter(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    env = Env(retry=nj.RetryOptions(max_attempts=1))

    async def broken(error: Exception, item: nj.QueueItem) -> None:
        raise ValueError("on_error is broken")

    env.on_error = broken  # type: ignore[method-assign]
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            await obj.push("fail", 1, id="x")
            await obj.push("rec", 2, id="y")
            await trio.sleep(1)
            assert env.ran() == [("x", 1), ("y", 2)]
            assert [d.item.id for d in await obj.dead_letters()] == ["x"]
    assert "on_error of Queue 'queue' failed for item 'x'" in caplog.text


# -- arguments -------------------------------------------------------------------------------


async def test_unknown_callback_raises_at_push_and_stores_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            listen(rt, env)
            with pytest.raises(nj.UnknownCallbackError, match="'nope'") as info:
                await obj.push("nope", 1, id="n")
            assert isinstance(info.value, ValueError) and isinstance(info.value, LookupError)
            assert await obj.items() == []
            assert await obj.get("n") is None
            assert alarm(rt) is None
            assert env.of("queue:create") == []
            await trio.sleep(10)
            assert env.runs == []


BAD_PUSHES: dict[str, dict[str, Any]] = {
    "empty id": {"id": ""},
    "blank id": {"id": "   "},
    "id not a str": {"id": 7},
    "retry not RetryOptions": {"retry": {"max_attempts": 2}},
    "retry a number": {"retry": 3},
    "priority a float": {"priority": 1.5},
    "priority a bool": {"priority": True},
    "priority too high": {"priority": 10**6},
    "priority too low": {"priority": -(10**6)},
}


@pytest.mark.parametrize("case", BAD_PUSHES)
async def test_invalid_push_raises_value_error_and_stores_nothing(
    autojump_clock: trio.testing.MockClock, case: str
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            listen(rt, env)
            held = await hold_the_queue(obj, env)
            kept = await held.push("rec", "kept", id="keep")
            before = await held.items()
            with pytest.raises(ValueError) as info:
                await held.push("other", "bad", **{"id": "keep", **BAD_PUSHES[case]})
            assert isinstance(info.value, nj.NurseryJobsError)
            assert await held.items() == before
            assert await held.get("keep") == kept
            assert len(env.of("queue:create")) == 2
            env.gate.set()
            await trio.sleep(1)
            assert env.ran() == [("gate", None), ("keep", "kept")]


async def test_unencodable_payload_raises_codec_error_and_stores_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            with pytest.raises(nj.CodecError):
                await obj.push("rec", object(), id="x")
            assert await obj.items() == []
            assert alarm(rt) is None


# -- get, list, cancel -------------------------------------------------------------------------


async def test_get_list_cancel_and_cancel_all(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            obj = rt.get(Uploads, "o")
            held = await hold_the_queue(obj, env)
            a1 = await held.push("rec", 1, id="a1")
            await held.push("rec", 2, id="a2")
            b1 = await held.push("other", 3, id="b1")
            await held.push("rec", 4, id="a3", priority=2)
            await held.push("rec", 5, id="a4")
            assert a1 == nj.QueueItem(id="a1", callback="rec", payload=1, priority=0,
                                      created_at=EPOCH, retry=nj.RetryOptions())
            assert await held.get("a1") == a1
            assert await held.get("missing") is None
            # list(callback) filters, in run order (priority first).
            assert ids(await held.items("rec")) == ["a3", "a1", "a2", "a4"]
            assert await held.items("other") == [b1]
            assert await held.items("fail") == []
            assert ids(await held.items()) == ["a3", "gate", "a1", "a2", "b1", "a4"]
            assert await held.cancel("a2") is True
            assert await held.cancel("a2") is False
            assert await held.cancel("never") is False
            assert await held.cancel_all("rec") == 3
            assert ids(await held.items()) == ["gate", "b1"]
            assert await held.cancel_all("rec") == 0
            assert await held.cancel_all("other") == 1
            # Every callback's items at any priority, the running one included (its run
            # finishes; its outcome is discarded). All in one turn: nothing starts
            # in the middle of cancel_all.
            await held.push("rec", 6, id="c1", priority=-1)
            await held.push("other", 7, id="c2", priority=-1)
            assert await held.cancel_all() == 3
            env.gate.set()
            await trio.sleep(10)
            assert env.ran() == [("gate", None)]
            assert await obj.cancel_all() == 0
            assert await obj.items() == []
            assert alarm(rt) is None


class Queued(nj.DurableObject):
    namespace = "tests.test_queue.Queued"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.queue = nj.Queue({"cb": lambda payload, item: None})
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def filter_by(self, how: str, callback: Any) -> tuple[str, bool, int]:
        """(error type or "no error", whether it is a typed argument error, items left)."""
        await self.queue.push("cb", 1, id="i")
        try:
            if how == "cancel_all":
                await self.queue.cancel_all(callback)
            else:
                self.queue.list(callback)
        except Exception as exc:
            typed = isinstance(exc, nj.NurseryJobsError) and isinstance(
                exc, (ValueError, TypeError)) and "callback" in str(exc)
            return type(exc).__name__, typed, len(self.queue.list())
        return "no error", False, len(self.queue.list())


# A callback filter that is no name would match nothing: refused, as the Agent's
# list_queued and dequeue_all refuse one, naming the argument (DESIGN 7).
@pytest.mark.parametrize("bad", [5, b"cb", ""])
@pytest.mark.parametrize("how", ["cancel_all", "list"])
async def test_a_queue_callback_filter_that_is_no_name_is_refused(
    autojump_clock: trio.testing.MockClock, how: str, bad: Any,
) -> None:
    async with nj.open_runtime(engine.location) as rt:
        error, typed, left = await rt.get(Queued, "q").filter_by(how, bad)
        assert typed, error
        assert left == 1


# -- durability ----------------------------------------------------------------------------------


async def test_waiting_items_survive_a_restart_in_order(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Uploads, "o")
            await obj.push_all([
                ("rec", "high", {"id": "high", "priority": 1}), ("gate", None, {"id": "gate"}),
                ("rec", "one", {"id": "one"}), ("rec", "two", {"id": "two"}),
            ])
            await env.gate_entered.wait()
        # A graceful shutdown while the gate item runs: it stays due, with its attempt.
        env.gate.set()
        async with nj.open_runtime(engine.durable(tmp_path), env=env) as rt:
            obj = rt.get(Uploads, "o")
            assert ids(await obj.items()) == ["gate", "one", "two"]
            await trio.sleep(100)
            # The object wakes at once, and the gate item runs again (the shutdown used
            # no attempt) in its place in line.
            assert [(item_id, t) for _, item_id, t, _ in env.runs] == [
                ("high", 0), ("gate", 0), ("gate", 0), ("one", 0), ("two", 0),
            ]
            assert await obj.items() == []
