"""The event bus (DESIGN.md §6) under faults (issue 10 #1, the listener part): a listener
that raises anything is logged once, counted and disabled after
``LISTENER_FAILURE_LIMIT`` failures in a row; it never kills the runtime and never makes
every emit slow. A subscriber whose channel is closed is dropped."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH

import nursery_jobs as nj
from nursery_jobs._events import LISTENER_FAILURE_LIMIT, EventBus

HANG = 100_000


class Custom(BaseException):
    pass


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ exploded")


def _cancelled() -> BaseException:
    return trio.Cancelled._create()


RAISES = {
    "Exception": lambda: RuntimeError("listener bug"),
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": lambda: SystemExit(3),
    "GeneratorExit": GeneratorExit,
    "custom BaseException": Custom,
    "trio.Cancelled": _cancelled,
    "unprintable": Unprintable,
}


class Raiser:
    """A listener that raises ``make()`` (every time, or every other time), and whose
    own repr raises too."""

    def __init__(self, make: Any, every: int = 1) -> None:
        self.make = make
        self.every = every
        self.calls = 0

    def __call__(self, event: nj.Event) -> None:
        self.calls += 1
        if self.calls % self.every == 0:
            raise self.make()

    def __repr__(self) -> str:
        raise RuntimeError("listener repr exploded")


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("kind", list(RAISES))
async def test_a_raising_listener_is_logged_once_counted_and_disabled(
    kind: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    heard: list[str] = []
    bad = Raiser(RAISES[kind])
    async with nj.open_runtime() as rt:
        with rt.events.subscribe() as channel:
            rt.events.add_listener(bad)
            rt.events.add_listener(lambda e: heard.append(e.type))
            for n in range(100):
                rt.events.emit("test:one", "ns", "id", n=n)
            assert bad.calls == LISTENER_FAILURE_LIMIT
            assert rt.events.listener_errors == LISTENER_FAILURE_LIMIT
            assert heard.count("test:one") == 100
            assert heard[-1] == "test:one"
            disabled = [e for e in heard if e == "listener:disabled"]
            assert len(disabled) == 1
            received = []
            while True:
                try:
                    received.append(channel.receive_nowait())
                except trio.WouldBlock:
                    break
            assert [e.data["n"] for e in received if e.type == "test:one"] == list(range(100))
            (event,) = [e for e in received if e.type == "listener:disabled"]
            assert event.data["failures"] == LISTENER_FAILURE_LIMIT
            assert "Raiser" in event.data["listener"]
            # Disabled: removing it is a no-op, not a ValueError.
            rt.events.remove_listener(bad)
    logged = records(caplog)
    # One record for the first failure (with its traceback), one for the disabling.
    assert len(logged) == 2, [r.getMessage() for r in logged]
    assert logged[0].exc_info is not None
    assert "listener:disabled" in logged[1].getMessage()
    assert "Logging error" not in capsys.readouterr().err


async def test_a_listener_that_fails_now_and_then_is_counted_not_disabled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky = Raiser(lambda: RuntimeError("every other event"), every=2)
    async with nj.open_runtime() as rt:
        rt.events.add_listener(flaky)
        for n in range(100):
            rt.events.emit("test:one", "ns", "id", n=n)
        assert flaky.calls == 100
        assert rt.events.listener_errors == 50
        rt.events.remove_listener(flaky)
        rt.events.emit("test:one", "ns", "id", n=100)
        assert flaky.calls == 100
    assert len(records(caplog)) == 1  # the first failure only


async def test_remove_listener_of_an_unknown_listener_raises() -> None:
    bus = EventBus()
    with pytest.raises(nj.RuntimeArgumentError, match="not a listener") as info:
        bus.remove_listener(print)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad", [5, None, "print"])
async def test_add_listener_refuses_what_is_not_callable(bad: Any) -> None:
    async with nj.open_runtime(stop_on=()) as rt:
        with pytest.raises(nj.RuntimeArgumentError, match="add_listener") as info:
            rt.events.add_listener(bad)
        assert isinstance(info.value, TypeError)
        rt.events.emit("test:one", "ns", "id")  # nothing was added that could fail
        assert rt.events.listener_errors == 0


class Host(nj.DurableObject):
    namespace = "tests.test_events.Host"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def add(self, n: int) -> None:
        for i in range(n):
            await self.lifecycle.jobs.push("work", id=f"j{i}", delay=i)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        done: list[tuple[str, float]] = self.ctx.env
        done.append((ctx.job.id, nj.now() - EPOCH))
        if ctx.job.id == "j1":
            raise RuntimeError("retry me")  # a job:retry event, heard by the listeners
        return None


@pytest.mark.parametrize("kind", list(RAISES))
async def test_a_raising_listener_never_stops_the_runtime(
    kind: str, autojump_clock: trio.testing.MockClock,
) -> None:
    done: list[tuple[str, float]] = []
    bad = Raiser(RAISES[kind])
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=done) as rt:
            rt.events.add_listener(bad)
            await rt.get(Host, "h").add(5)
            await trio.sleep(10)
    # j1 failed three times (two job:retry events, a job:dead_letter): the listener
    # heard those three, and was disabled.
    assert sorted(job for job, _ in done) == ["j0", "j1", "j1", "j1", "j2", "j3", "j4"]
    assert bad.calls == LISTENER_FAILURE_LIMIT


def test_ctrl_c_during_a_listener_still_reaches_the_application() -> None:
    """A real SIGINT that arrives while a listener runs is Trio's to deliver (to the main
    task, at its next checkpoint), not the listener's error to swallow. (A plain
    ``trio.run``: under pytest-trio the main task is the plugin's, not the test's.)"""

    def interrupted(event: nj.Event) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between these bytecodes
            pass

    async def main() -> None:
        async with nj.open_runtime() as rt:
            rt.events.add_listener(interrupted)
            rt.events.emit("test:one", "ns", "id")
            assert rt.events.listener_errors == 0
            await trio.sleep(1)
            pytest.fail("the KeyboardInterrupt was lost")

    with pytest.raises(KeyboardInterrupt):
        trio.run(main)


async def test_a_subscriber_whose_channel_was_closed_is_dropped() -> None:
    async with nj.open_runtime() as rt:
        bus = rt.events
        with bus.subscribe() as live, bus.subscribe() as gone:
            gone.close()
            bus.emit("test:one", "ns", "id")
            bus.emit("test:two", "ns", "id")
            assert bus.dropped == 1  # counted once, then forgotten
            assert len(bus._subscribers) == 1
            assert [live.receive_nowait().type for _ in range(2)] == ["test:one", "test:two"]
        assert bus._subscribers == []  # leaving both blocks is clean


async def test_an_abandoned_subscription_is_dropped() -> None:
    async with nj.open_runtime() as rt:
        bus = rt.events
        subscription = bus.subscribe()
        channel = subscription.__enter__()
        assert len(bus._subscribers) == 1
        del subscription, channel  # never exited: the generator is collected
        bus.emit("test:one", "ns", "id")
        assert bus._subscribers == []


async def test_listeners_added_or_removed_during_emit() -> None:
    bus = EventBus()
    heard: list[str] = []

    def late(event: nj.Event) -> None:
        heard.append("late " + event.type)

    def adder(event: nj.Event) -> None:
        heard.append("adder " + event.type)
        bus.remove_listener(adder)
        bus.add_listener(late)

    bus.add_listener(adder)
    async with nj.open_runtime():  # nj.now() needs a running clock
        bus.emit("a", "ns", "id")
        bus.emit("b", "ns", "id")
    assert heard == ["adder a", "late b"]


async def test_event_data_that_cannot_be_printed_is_still_logged(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG, "nursery_jobs")
    async with nj.open_runtime() as rt:
        rt.events.emit("test:odd", "ns", "id", value=Unprintable())
    (record,) = [r for r in caplog.records if "test:odd" in r.getMessage()]
    assert "repr() failed" in record.getMessage()
    assert "Logging error" not in capsys.readouterr().err


class Failing(nj.DurableObject):
    """A Lifecycle object whose jobs fail with the text they are given."""

    namespace = "tests.test_events.Failing"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, job_id: str, text: str) -> None:
        await self.lifecycle.jobs.push("fail", id=job_id, payload=text,
                                       retry=nj.RetryOptions(max_attempts=1))

    async def on_job(self, ctx: nj.JobContext) -> None:
        raise ValueError(ctx.job.payload)


FORGED = "x\nCRITICAL nursery_jobs: forged line"


async def test_control_characters_are_escaped_in_every_log_record(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 22 #10: an object id with a newline forged a log line. Ids, job ids and
    error text are escaped in the log message; the event keeps its data raw."""
    caplog.set_level(logging.DEBUG, "nursery_jobs")
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime() as rt:
            rt.events.add_listener(events.append)
            await rt.get(Failing, FORGED).push(f"job{FORGED}", f"error{FORGED}\r\x1b[2J")
            await trio.sleep(5)
            rt.events.emit("test:custom", "ns", FORGED, text=FORGED)
    records = [r for r in caplog.records if r.name.startswith("nursery_jobs")]
    named = [r.getMessage() for r in records if "forged line" in r.getMessage()]
    assert len(named) == 2  # the dead letter, the custom event
    for message in named:
        assert "\n" not in message and "\r" not in message and "\x1b" not in message
        assert "x\\nCRITICAL" in message
    # An error message with a newline names its job with the newline escaped too.
    assert any("job" + "x\\nCRITICAL" in m and "error" + "x\\nCRITICAL" in m for m in named)
    # The events keep what they carry, raw.
    dead = [e for e in events if e.type == "job:dead_letter"]
    assert dead and dead[0].object_id == FORGED
    assert dead[0].data["id"] == f"job{FORGED}"
    (custom,) = [e for e in events if e.type == "test:custom"]
    assert (custom.object_id, custom.data) == (FORGED, {"text": FORGED})


# -- one incident, one record ---------------------------------------------------------------


class Crashy(nj.DurableObject):
    """Starts a background task in its own nursery, or tracked alarm work, that crashes."""

    namespace = "tests.test_events.Crashy"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def start_crash(self) -> None:
        async def crash() -> None:
            await trio.sleep(1)
            raise RuntimeError("background boom")

        self.ctx.nursery.start_soon(crash)

    async def push_work(self) -> None:
        await self.lifecycle.jobs.push("work")

    async def on_job(self, ctx: nj.JobContext) -> None:
        async def work() -> None:
            await trio.sleep(1)
            raise RuntimeError("tracked boom")

        self.lifecycle.track_alarm_work(work)


def _drain(channel: trio.MemoryReceiveChannel[nj.Event]) -> list[nj.Event]:
    out = []
    while True:
        try:
            out.append(channel.receive_nowait())
        except trio.WouldBlock:
            return out


@pytest.mark.parametrize(("start", "event", "boom"), [
    ("start_crash", "object:error", "background boom"),
    ("push_work", "alarm:tracked_work_failed", "tracked boom"),
])
async def test_a_crash_of_the_objects_own_task_is_one_error_record_naming_its_exception(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
    start: str, event: str, boom: str,
) -> None:
    caplog.set_level(logging.DEBUG, logger="nursery_jobs")
    with trio.fail_after(HANG):
        async with nj.open_runtime() as rt:
            with rt.events.subscribe() as events:
                await rt.get(Crashy, "c").call(start)
                await trio.sleep(5)
                [crashed] = [e for e in _drain(events) if e.type == event]
    # The event's error is the task's own exception, not the nursery's group around it.
    assert crashed.data["error"] == repr(RuntimeError(boom))
    about_it = [r for r in caplog.records if r.name == "nursery_jobs" and any(
        word in r.getMessage() for word in (boom, "crash", event))]
    assert len(about_it) == 1, [r.getMessage() for r in about_it]
    [record] = about_it
    assert record.levelno == logging.ERROR and getattr(record, "nj_event", None) == event
    assert record.exc_info is not None  # (the traceback rides on the one record)


# -- a slow subscriber never blocks dispatch ----------------------------------------------


class Ticker(nj.DurableObject):
    namespace = "tests.test_events.Ticker"

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.ctx.env.append((self.ctx.id, nj.now()))
        self.ctx.events.emit("test:tick", self.ctx.namespace, self.ctx.id, at=nj.now())


async def test_a_subscriber_that_never_reads_never_delays_an_alarm_or_another_subscriber(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs: list[tuple[str, float]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=runs) as rt:
            with rt.events.subscribe(max_buffer=2) as stuck, rt.events.subscribe() as reader:
                for i in range(10):
                    await rt.get(Ticker, f"t{i}").arm(EPOCH + 1 + i)
                await trio.sleep(20)
                # Every alarm ran at its exact time while the first buffer sat full.
                assert runs == [(f"t{i}", EPOCH + 1 + i) for i in range(10)]
                ticks = [e for e in _drain(reader) if e.type == "test:tick"]
                assert [(e.namespace, e.object_id, e.time, e.data) for e in ticks] == [
                    (Ticker.namespace, f"t{i}", EPOCH + 1 + i, {"at": EPOCH + 1 + i})
                    for i in range(10)]
                assert len(_drain(stuck)) == 2
                assert rt.events.dropped > 0
                assert rt.statistics().events_dropped == rt.events.dropped
