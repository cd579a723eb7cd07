"""Issue 10 #2: an exception whose ``__str__`` / ``__repr__`` raises is the failure of
the job (or alarm) that raised it — retried, then dead-lettered or dropped — and never
blocks the jobs behind it or the runtime. Errors are formatted by ``describe_error`` /
``safe_repr`` (``nursery_jobs._errors``), which never raise."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH

import nursery_jobs as nj
from nursery_jobs._errors import describe_error, safe_repr

HANG = 100_000


class Unprintable(Exception):
    """Both of its formatters raise."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ exploded")


class Huge(Exception):
    def __str__(self) -> str:
        return "x" * 1_000_000

    def __repr__(self) -> str:
        return "y" * 1_000_000


class Recursive(Exception):
    def __str__(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return repr(self)


class NotAString(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]

    def __repr__(self) -> str:
        return None  # type: ignore[return-value]


# -- the formatters ------------------------------------------------------------------------


def test_describe_error_of_a_plain_exception_is_type_and_message() -> None:
    assert describe_error(KeyError("missing")) == "KeyError: 'missing'"
    assert describe_error(RuntimeError()) == "RuntimeError"
    assert safe_repr(RuntimeError("boom")) == "RuntimeError('boom')"


@pytest.mark.parametrize("cls", [Unprintable, Recursive, NotAString])
def test_formatters_fall_back_to_the_type_name(cls: type[Exception]) -> None:
    text = describe_error(cls())
    assert text.startswith(cls.__qualname__)
    assert "failed" in text
    rep = safe_repr(cls())
    assert rep.startswith(f"<{cls.__qualname__}")
    assert "failed" in rep


def test_formatters_cap_huge_texts() -> None:
    text = describe_error(Huge())
    assert text.startswith("Huge: xxx")
    assert len(text) < 2_100
    assert "1000006 chars" in text or "chars" in text
    assert len(safe_repr(Huge())) < 2_100


# -- a Lifecycle job -----------------------------------------------------------------------


class Host(nj.DurableObject):
    namespace = "tests.test_faults_errors.Host"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def add(self, fn: str, job_id: str) -> None:
        retry = nj.RetryOptions(max_attempts=3, base_delay=1, max_delay=1, jitter=False)
        await self.lifecycle.jobs.push(fn, id=job_id, retry=retry)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        env: list[tuple[str, float]] = self.ctx.env
        env.append((ctx.job.id, nj.now() - EPOCH))
        if ctx.job.fn == "bad":
            raise Unprintable()
        return None

    async def letters(self) -> list[nj.DeadLetter]:
        return self.lifecycle.dead_letters()


async def test_a_job_with_an_unprintable_error_is_retried_then_dead_lettered(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG, "nursery_jobs")
    ran: list[tuple[str, float]] = []
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=ran) as rt:
            rt.events.add_listener(events.append)
            host = rt.get(Host, "h")
            await host.add("bad", "bad")
            await host.add("good", "good-1")
            await host.add("good", "good-2")
            await trio.sleep(100)
            letters = await host.letters()
    # Three attempts, one second apart; the jobs behind it ran at once.
    assert ran == [("bad", 0), ("good-1", 0), ("good-2", 0), ("bad", 1), ("bad", 2)]
    assert [(d.job.id, d.attempts) for d in letters] == [("bad", 3)]
    assert letters[0].error.startswith("Unprintable")
    types = [e.type for e in events]
    assert types.count("job:retry") == 2
    assert types.count("job:dead_letter") == 1
    assert "alarm:retry" not in types  # the alarm run itself never failed
    for event in events:
        for value in event.data.values():
            assert not isinstance(value, BaseException)
    # Logging never choked on the error (it would print "--- Logging error ---").
    assert "Logging error" not in capsys.readouterr().err
    assert any("Unprintable" in r.getMessage() for r in caplog.records)


# -- a Queue item --------------------------------------------------------------------------


class Uploads(nj.DurableObject):
    namespace = "tests.test_faults_errors.Uploads"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.ran: list[tuple[str, float]] = ctx.env["ran"]
        self.errors: list[str] = ctx.env["errors"]
        retry = nj.RetryOptions(max_attempts=2, base_delay=1, max_delay=1, jitter=False)
        self.queue = nj.Queue({"bad": self._bad, "good": self._good}, retry=retry,
                              on_error=self._on_error)
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def _bad(self, payload: Any, item: nj.QueueItem) -> None:
        self.ran.append((item.id, nj.now() - EPOCH))
        raise Unprintable()

    async def _good(self, payload: Any, item: nj.QueueItem) -> None:
        self.ran.append((item.id, nj.now() - EPOCH))

    async def _on_error(self, error: Exception, item: nj.QueueItem) -> None:
        self.errors.append(type(error).__name__)

    async def push(self, callback: str, item_id: str) -> None:
        await self.queue.push(callback, id=item_id)

    async def letters(self) -> list[tuple[str, int, str]]:
        return [(d.item.id, d.attempts, d.error) for d in self.queue.dead_letters()]


async def test_a_queue_item_with_an_unprintable_error_never_blocks_the_queue(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str],
) -> None:
    ran: list[tuple[str, float]] = []
    errors: list[str] = []
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env={"ran": ran, "errors": errors}) as rt:
            rt.events.add_listener(events.append)
            q = rt.get(Uploads, "q")
            await q.push("bad", "bad")
            await q.push("good", "good-1")
            await q.push("good", "good-2")
            await trio.sleep(100)
            letters = await q.letters()
    assert ran == [("bad", 0), ("good-1", 0), ("good-2", 0), ("bad", 1)]
    assert [(i, n) for i, n, _ in letters] == [("bad", 2)]
    assert letters[0][2].startswith("Unprintable")
    assert errors == ["Unprintable"]
    (error_event,) = [e for e in events if e.type == "queue:error"]
    assert isinstance(error_event.data["error"], str)
    assert "Unprintable" in error_event.data["error"]
    assert "alarm:retry" not in [e.type for e in events]
    assert "Logging error" not in capsys.readouterr().err


# -- a plain object's alarm ----------------------------------------------------------------


class Plain(nj.DurableObject):
    namespace = "tests.test_faults_errors.Plain"

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        ran: list[tuple[str, float]] = self.ctx.env
        ran.append((self.ctx.id, nj.now() - EPOCH))
        if self.ctx.id == "bad":
            raise Unprintable()


async def test_a_plain_alarm_with_an_unprintable_error_retries_then_drops(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str],
) -> None:
    ran: list[tuple[str, float]] = []
    events: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=ran) as rt:
            rt.events.add_listener(events.append)
            await rt.get(Plain, "bad").arm(EPOCH + 1)
            await rt.get(Plain, "good").arm(EPOCH + 1)
            await rt.get(Plain, "later").arm(EPOCH + 200)
            await trio.sleep(300)
            assert rt.engine.get_alarm(Plain.namespace, "bad") is None
    bad = [t for who, t in ran if who == "bad"]
    assert bad == [1, 3, 7, 15, 31, 63, 127]  # 2 s doubling, six retries
    assert ("good", 1) in ran
    assert ("later", 200) in ran
    types = [e.type for e in events if e.object_id == "bad"]
    assert types == ["alarm:retry"] * 6 + ["alarm:failed"]
    assert all(isinstance(e.data["error"], str) for e in events if e.object_id == "bad")
    assert "object:error" not in types
    assert "Logging error" not in capsys.readouterr().err


# -- a Scheduler one-shot and an Agent task ------------------------------------------------


class Tasks(nj.Agent):
    namespace = "tests.test_faults_errors.Tasks"

    async def bad(self, payload: Any) -> None:
        ran: list[tuple[str, float]] = self.ctx.env
        ran.append(("bad", nj.now() - EPOCH))
        raise Unprintable()

    async def good(self, payload: Any) -> None:
        ran: list[tuple[str, float]] = self.ctx.env
        ran.append((payload, nj.now() - EPOCH))

    async def add(self) -> None:
        await self.schedule(1, "bad", max_retries=1)
        await self.schedule(1, "good", "scheduled")
        await self.queue("bad", max_retries=1)
        await self.queue("good", "queued")

    async def letters(self) -> list[tuple[str, str]]:
        return [(d.job.fn, d.error) for d in self.lifecycle.dead_letters()]


async def test_agent_tasks_with_unprintable_errors_are_dead_lettered(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str],
) -> None:
    ran: list[tuple[str, float]] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=ran) as rt:
            agent = rt.get(Tasks, "a")
            await agent.add()
            await trio.sleep(100)
            letters = await agent.letters()
    assert ("queued", 0) in ran
    assert ("scheduled", 1) in ran
    assert [name for name, _ in ran].count("bad") == 4  # two tasks, two deliveries each
    assert len(letters) == 2
    assert all(error.startswith("Unprintable") for _, error in letters)
    assert "Logging error" not in capsys.readouterr().err
