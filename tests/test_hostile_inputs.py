"""Hostile arguments to every public entry point: a typed error (a NurseryJobsError that
is also a ValueError or TypeError), and nothing written."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import trio
from pg_support import fresh_database

import nursery_jobs as nj


class Target(nj.DurableObject):
    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.queue = nj.Queue({"a": lambda payload, item: None})
        self.scheduler = nj.Scheduler({"a": lambda payload, schedule: None})
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue, self.scheduler)

    async def attempt(self, case: str) -> tuple[str, bool, bool, int, float | None]:
        """Run one hostile call; return (error type, is NurseryJobsError, is
        ValueError/TypeError, jobs stored after, alarm after)."""
        before = self.ctx.storage.get_alarm()
        try:
            result = ASYNC_CASES[case](self) if case in ASYNC_CASES else SYNC_CASES[case](self)
            if isinstance(result, Awaitable):
                await result
        except Exception as exc:
            kind = type(exc).__name__
            typed = isinstance(exc, nj.NurseryJobsError)
            argument = isinstance(exc, (ValueError, TypeError))
        else:
            kind, typed, argument = "no error", False, False
        assert self.ctx.storage.get_alarm() == before
        stored = len(self.lifecycle.jobs.list()) + len(self.queue.list())
        return kind, typed, argument, stored, self.ctx.storage.get_alarm()


class NoOffset(dt.tzinfo):
    """A tzinfo whose utcoffset is not implemented (the base class's)."""


class TooFar(dt.tzinfo):
    def utcoffset(self, when: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(hours=30)


NO_OFFSET = NoOffset()  # type: ignore[abstract]
TOO_FAR = TooFar()  # type: ignore[abstract]

ASYNC_CASES: dict[str, Callable[[Target], Awaitable[Any]]] = {
    "fn not a str": lambda t: t.lifecycle.jobs.push(123),  # type: ignore[arg-type]
    "empty fn": lambda t: t.lifecycle.jobs.push(""),
    "payload object": lambda t: t.lifecycle.jobs.push("f", payload=object()),
    "payload function": lambda t: t.lifecycle.jobs.push("f", payload=print),
    "payload too big": lambda t: t.lifecycle.jobs.push("f", payload="x" * (1 << 20)),
    "time a str": lambda t: t.lifecycle.jobs.push("f", time="2024"),  # type: ignore[arg-type]
    "time nan": lambda t: t.lifecycle.jobs.push("f", time=math.nan),
    "time inf": lambda t: t.lifecycle.jobs.push("f", time=math.inf),
    "naive datetime": lambda t: t.lifecycle.jobs.push("f", time=dt.datetime(2030, 1, 1)),
    "time a datetime whose tzinfo has no utcoffset": lambda t: t.lifecycle.jobs.push(
        "f", time=dt.datetime(2030, 1, 1, tzinfo=NO_OFFSET)),
    "time a datetime whose tzinfo is 30 h off": lambda t: t.lifecycle.jobs.push(
        "f", time=dt.datetime(2030, 1, 1, tzinfo=TOO_FAR)),
    "time and delay": lambda t: t.lifecycle.jobs.push("f", time=1.0, delay=1.0),
    "negative delay": lambda t: t.lifecycle.jobs.push("f", delay=-1),
    "blank id": lambda t: t.lifecycle.jobs.push("f", id="  "),
    "id not a str": lambda t: t.lifecycle.jobs.push("f", id=5),  # type: ignore[arg-type]
    "id too long": lambda t: t.lifecycle.jobs.push("f", id="x" * 1025),
    "negative hung_timeout": lambda t: t.lifecycle.jobs.push("f", hung_timeout=-1),
    "timeout 0": lambda t: t.lifecycle.jobs.push("f", timeout=0),
    "timeout nan": lambda t: t.lifecycle.jobs.push("f", timeout=math.nan),
    "timeout a huge int": lambda t: t.lifecycle.jobs.push("f", timeout=10**400),
    "timeout a str": lambda t: t.lifecycle.jobs.push("f", timeout="5"),  # type: ignore[arg-type]
    "singleflight a str": lambda t: t.lifecycle.jobs.push("f", singleflight="yes"),  # type: ignore[arg-type]
    "retry a dict": lambda t: t.lifecycle.jobs.push("f", retry={"max_attempts": 2}),  # type: ignore[arg-type]
    "reschedule nan": lambda t: t.lifecycle.jobs.reschedule("x", math.nan),
    "cancel an int": lambda t: t.lifecycle.jobs.cancel(5),  # type: ignore[arg-type]
    "queue unknown callback": lambda t: t.queue.push("nope"),
    "queue blank id": lambda t: t.queue.push("a", id=""),
    "queue float priority": lambda t: t.queue.push("a", priority=1.5),  # type: ignore[arg-type]
    "queue huge priority": lambda t: t.queue.push("a", priority=10**6),
    "cron with 4 fields": lambda t: t.scheduler.schedule("*/5 * * *", "a"),
    "cron out of range": lambda t: t.scheduler.schedule("99 * * * *", "a"),
    "every 0": lambda t: t.scheduler.every(0, "a"),
    "every inf": lambda t: t.scheduler.every(math.inf, "a"),
    "schedule a list": lambda t: t.scheduler.schedule([1], "a"),  # type: ignore[arg-type]
    "schedule unknown callback": lambda t: t.scheduler.schedule(5, "nope"),
    "id with a NUL": lambda t: t.lifecycle.jobs.push("f", id="a\0b"),
    "delay a huge int": lambda t: t.lifecycle.jobs.push("f", delay=10**400),
    "every 1e-300": lambda t: t.scheduler.every(1e-300, "a"),
    "every a huge int": lambda t: t.scheduler.every(10**400, "a"),
    "schedule idempotent a str": lambda t: t.scheduler.schedule(5, "a", idempotent="no"),  # type: ignore[arg-type]
    "queue callback a list": lambda t: t.queue.push(["a"]),  # type: ignore[arg-type]
    "cron tz unknown": lambda t: t.scheduler.schedule("0 9 * * *", "a", tz="Nowhere/Atall"),
    "cron tz a path": lambda t: t.scheduler.schedule("0 9 * * *", "a", tz="../../etc/passwd"),
    "cron tz an int": lambda t: t.scheduler.schedule("0 9 * * *", "a", tz=1),  # type: ignore[arg-type]
    "cron tz a fixed offset": lambda t: t.scheduler.schedule(
        "0 9 * * *", "a", tz=dt.UTC),  # type: ignore[arg-type]
    "cron tz a lone surrogate": lambda t: t.scheduler.schedule("0 9 * * *", "a", tz="\ud800"),
    "tz for a delay": lambda t: t.scheduler.schedule(5, "a", tz="Europe/Berlin"),
    "every missed unknown": lambda t: t.scheduler.every(5, "a", missed="later"),  # type: ignore[arg-type]
    "cron missed a bool": lambda t: t.scheduler.schedule("0 9 * * *", "a", missed=True),  # type: ignore[arg-type]
    "missed skip for a one-shot": lambda t: t.scheduler.schedule(5, "a", missed="skip"),
}
SYNC_CASES: dict[str, Callable[[Target], Any]] = {
    "storage key an int": lambda t: t.ctx.storage.put(5, 1),  # type: ignore[arg-type]
    "storage key empty": lambda t: t.ctx.storage.put("", 1),
    "storage key with a NUL": lambda t: t.ctx.storage.put("a\0b", 1),
    "storage key a lone surrogate": lambda t: t.ctx.storage.put("a\udc80", 1),
    "RetryOptions max_attempts 2**63": lambda t: nj.RetryOptions(max_attempts=2**63),
    "storage value a function": lambda t: t.ctx.storage.put("k", print),
    "set_alarm on a Lifecycle object": lambda t: t.ctx.storage.set_alarm(5),
    "Reschedule of a str": lambda t: nj.Reschedule("soon"),  # type: ignore[arg-type]
    "RetryOptions max_attempts 0": lambda t: nj.RetryOptions(max_attempts=0),
    "RetryOptions negative base": lambda t: nj.RetryOptions(base_delay=-1),
    "RetryOptions give_up_on an int": lambda t: nj.RetryOptions(give_up_on=5),
    "RetryOptions give_up_on an instance": lambda t: nj.RetryOptions(
        give_up_on=(ValueError("x"),)),
    "jitter of a negative base": lambda t: nj.jitter(-1),
    "jitter of a huge int base": lambda t: nj.jitter(10**400),
    "jitter of a huge int fraction": lambda t: nj.jitter(1, 10**400),
}


@pytest.mark.parametrize("case", sorted(ASYNC_CASES) + sorted(SYNC_CASES))
async def test_a_hostile_argument_gets_a_typed_error_and_writes_nothing(case: str) -> None:
    with trio.fail_after(10):
        async with nj.open_runtime() as rt:
            kind, typed, argument, stored, _alarm = await rt.get(Target, "t").attempt(case)
    assert typed, f"{case}: {kind} is not a NurseryJobsError"
    assert argument or kind == "AlarmOwnedError", f"{case}: {kind} is no ValueError/TypeError"
    assert stored == 0


@pytest.mark.parametrize("bad", [None, "", "x" * 1025, "\ud800", 5, b"bytes"])
async def test_a_hostile_object_id_gets_object_id_error(bad: Any) -> None:
    async with nj.open_runtime() as rt:
        with pytest.raises(nj.ObjectIdError):
            rt.get(Target, bad)


@pytest.mark.parametrize("option", ["idle_timeout", "dormant_after", "memory_limit",
                                    "turn_warning"])
@pytest.mark.parametrize("bad", [10**400, math.nan], ids=["a huge int", "nan"])
async def test_an_open_runtime_option_no_float_holds_is_refused_naming_it(
    tmp_path: Any, option: str, bad: Any
) -> None:
    """An int too large for a float is no finite number of seconds (or bytes): refused as
    a ValueError naming the option, as NaN is, not an OverflowError; nothing is opened."""
    with pytest.raises(ValueError, match=option):
        async with nj.open_runtime(tmp_path / "data", **{option: bad}):
            pass
    assert not (tmp_path / "data").exists()


# -- storage keys: bounded as ids are, on every engine -------------------------------------


class Keys(nj.DurableObject):
    """Runs one KV call with the key it is given, and reports what came of it."""

    namespace = "tests.test_hostile_inputs.Keys"

    async def attempt(self, call: str, char: str, length: int) -> str:
        storage, key = self.ctx.storage, char * length  # (a call's arguments hold 1 MiB)
        try:
            if call == "get":
                storage.get(key)
            elif call == "put":
                storage.put(key, 1)
            elif call == "delete":
                storage.delete(key)
            else:
                storage.list(key)
        except nj.StorageKeyError as exc:
            assert isinstance(exc, ValueError)
            return str(exc)
        return "no error"

    async def round_trip(self, key: str) -> tuple[Any, dict[str, Any]]:
        self.ctx.storage.put(key, "kept")
        return self.ctx.storage.get(key), self.ctx.storage.list(key[:10])

    async def stored(self) -> dict[str, Any]:
        return self.ctx.storage.list()


@pytest.fixture(params=["memory", "files", "shared", "postgres"])
def key_location(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """A durable location of each engine (memory: None)."""
    if request.param == "postgres":
        with fresh_database() as dsn:
            yield dsn
    elif request.param == "shared":
        yield f"shared:{tmp_path / 'data'}"
    else:
        yield None if request.param == "memory" else tmp_path / "data"


@pytest.mark.parametrize("call", ["get", "put", "delete", "list"])
async def test_a_storage_key_longer_than_an_id_is_refused_naming_its_length_on_every_engine(
    key_location: Any, call: str
) -> None:
    """A key (or a ``list`` prefix) over 1024 characters, as a job or object id, raises
    ``StorageKeyError`` naming its length and the limit; nothing is written."""
    with trio.fail_after(30):
        async with nj.open_runtime(key_location) as rt:
            keys = rt.get(Keys, "k")
            message = await keys.attempt(call, "x", 2_000_000)
            assert "2000000" in message and "1024" in message, message
            assert "storage key" in message
            assert "1025" in await keys.attempt(call, "é", 1025)
            assert await keys.stored() == {}


async def test_a_storage_key_of_1024_characters_is_kept_on_every_engine(
    key_location: Any,
) -> None:
    """The longest key is stored, read, listed and survives a restart of the runtime."""
    key = "k" * 1024
    with trio.fail_after(30):
        async with nj.open_runtime(key_location) as rt:
            assert await rt.get(Keys, "k").round_trip(key) == ("kept", {key: "kept"})
        if key_location is not None:
            async with nj.open_runtime(key_location) as rt:
                assert await rt.get(Keys, "k").stored() == {key: "kept"}
