"""A turn that writes and then fails (DESIGN.md §2 "Turns", §3 "Exactly-once local
effects"): what becomes of its writes, and who may see them.

- A *job* that writes (KV, ``execute``, ``db``, ``jobs.push``) and then raises, times
  out or is cancelled is rolled back: nothing of it is seen by a call waiting for the
  turn or by a read-only call after, nothing reaches the engine's durable store (the
  object's file, the shared database, PostgreSQL's tables) while it runs or after, the
  job it pushed never runs, the alarm it lowered does not stand, and a restart finds
  none of it.
- A *stub call*, startup and a plain object's ``alarm()`` are not rolled back: their
  writes commit as they are made (a push and ``set_alarm`` are durable when they
  return), so a raising or cancelled call's writes stand — on every engine alike, across
  a restart. Promised for them: no caller hears of the call, or reads what it wrote,
  before that is durable (the output gate), so nobody reads a write that a crash or a
  fence takes back.

Every engine, the shared layout included. Exact virtual times under ``autojump_clock``
(Trio time starts at 0).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from conftest import ENGINES, engine

import nursery_jobs as nj

pytestmark = pytest.mark.parametrize(
    "on_every_engine", [*ENGINES, *(["shared"] if "shared" not in ENGINES else [])],
    indirect=True,
)


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


HANG = 10_000
# How long a failing turn holds the object between its writes and its failure.
HOLD = 2.0
# Where the failing turn's push or set_alarm puts its wake-up, from when it wrote.
LATER = 10.0
ONCE = nj.RetryOptions(max_attempts=1)


class Boom(Exception):
    """What the failing turns raise."""


@attrs.define
class Env:
    wrote: trio.Event = attrs.Factory(trio.Event)
    ran: list[tuple[str, float]] = attrs.Factory(list)  # (what, trio time)
    fail_start: int = 0  # how many startups (on_start) still fail
    wake: float = 0.0  # (trio time) when the failing turn's push or set_alarm wakes it
    fail_alarm: bool = False  # whether a plain object's next alarm() fails


def _raw() -> bool:
    """Whether the engine takes raw SQL on the object's tables (``execute``, ``db``)."""
    return engine.name in ("memory", "files")


def _write_everything(storage: nj.Storage, *, push_or_alarm: str) -> None:
    """The writes a failing turn makes before it fails."""
    storage.put("k", "dirty")
    if _raw():
        storage.execute("CREATE TABLE t (x)")
        storage.execute("INSERT INTO t VALUES (1)")
        storage.db["t2"].insert({"x": 1})
    if push_or_alarm == "alarm":
        storage.set_alarm(nj.now() + LATER)


async def _call_fails(env: Env, storage: nj.Storage, how: str,
                      write: Callable[[], Awaitable[None]]) -> None:
    """The body of a failing call. ``raises``: it writes, then raises. ``sleeps_then_raises``:
    it writes, sleeps ``HOLD``, writes ``last``, raises. ``cancelled``: it holds the turn
    for ``HOLD`` (callers arrive and wait), writes, and waits until its caller cancels it.
    Every write it makes before ``last`` it makes at once (no checkpoint in between)."""
    if how == "cancelled":
        await trio.sleep(HOLD)
    env.wake = trio.current_time() + LATER
    await write()
    if how == "sleeps_then_raises":
        await trio.sleep(HOLD)
    storage.put("last", "dirty")
    env.wrote.set()
    if how == "cancelled":
        await trio.sleep_forever()
    raise Boom(f"fails ({how}) after writing")


async def _fail(how: str) -> None:
    if how != "raises":
        await trio.sleep(HOLD if how == "sleeps_then_raises" else 1_000)
    raise Boom(f"fails ({how}) after writing")


class Readers:
    """What every test object answers."""

    ctx: nj.ObjectContext

    async def get(self, key: str) -> Any:  # a writing turn's read
        return self.ctx.storage.get(key)

    @nj.read_only
    async def peek(self, key: str) -> Any:
        return self.ctx.storage.get(key)

    async def tables(self) -> list[str]:  # (a write turn: ``execute`` needs one)
        if not _raw():
            return []
        rows = self.ctx.storage.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('t', 't2')"
            " ORDER BY name")
        return [name for (name,) in rows]


class Ledger(Readers, nj.DurableObject):
    """A Lifecycle object: its failing jobs, and its failing calls that push."""

    namespace = "tests.test_failing_turns.Ledger"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> None:
        await self.lifecycle.jobs.push(fn, **kwargs)

    async def job_ids(self) -> list[str]:
        return [job.id for job in self.lifecycle.jobs.list()]

    async def dead(self) -> list[str]:
        return [dead.job.id for dead in self.lifecycle.dead_letters()]

    @nj.interleave
    async def cancel(self, job_id: str) -> bool:
        return await self.lifecycle.jobs.cancel(job_id)

    async def write_then_fail(self, how: str) -> None:
        # (``last``, written after the push, which ships what came before it: only the
        # call's own output gate makes it durable.)
        await _call_fails(self.env, self.ctx.storage, how, self._write)

    async def _write(self) -> None:
        _write_everything(self.ctx.storage, push_or_alarm="push")
        await self.lifecycle.jobs.push("pushed", id="pushed", time=nj.now() + LATER)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.env.ran.append((ctx.job.id, trio.current_time()))
        if ctx.job.fn == "write_then_fail":
            await self._write()
            self.env.wrote.set()
            await _fail(ctx.job.payload)
        return None


class Plain(Readers, nj.DurableObject):
    """An object without a Lifecycle: its failing calls set its alarm."""

    namespace = "tests.test_failing_turns.Plain"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env

    async def write_then_fail(self, how: str) -> None:
        await _call_fails(self.env, self.ctx.storage, how, self._write)

    async def _write(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()  # (an async def checkpoints)
        _write_everything(self.ctx.storage, push_or_alarm="alarm")

    @nj.interleave
    async def write_in_turn_then_fail(self) -> None:
        async with self.ctx.turn():
            self.ctx.storage.put("k", "dirty")
        raise Boom("fails after its turn wrote")

    async def arm(self, delay: float) -> None:
        self.ctx.storage.set_alarm(nj.now() + delay)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        self.env.ran.append((f"alarm {info.retry_count}", trio.current_time()))
        if self.env.fail_alarm:
            self.env.fail_alarm = False
            self.ctx.storage.put("k", "dirty")
            self.ctx.storage.set_alarm(nj.now() + LATER)
            raise Boom("the alarm fails after writing")


# -- what a reader outside the runtime sees --------------------------------------------


def _outside(rt: nj.Runtime, cls: type[nj.DurableObject], oid: str) -> set[str] | None:
    """The object's KV keys and job ids (``"job:<id>"``) as the engine's durable store
    holds them now, read from outside the runtime (None: no outside reader)."""
    ns = cls.namespace
    if engine.name == "postgres":
        import psycopg

        with psycopg.connect(rt.engine.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT tbl, key FROM nj_rows WHERE namespace = %s AND object_id = %s"
                " AND tbl IN ('nj_kv', 'nj_jobs')", (ns, oid)).fetchall()
    elif engine.name == "shared":
        rows = _read(rt.engine.database,
                     "SELECT tbl, key FROM nj_rows WHERE namespace = ? AND object_id = ?"
                     " AND tbl IN ('nj_kv', 'nj_jobs')", (ns, oid))
    else:
        # (Memory has no outside; a files object's file is locked while it is open:
        # its commits are durable as they are made, and a restart shows what stands.)
        return None
    return {key if tbl == "nj_kv" else f"job:{key}" for tbl, key in rows}


def _outside_alarm(rt: nj.Runtime, cls: type[nj.DurableObject], oid: str) -> float | None:
    """The object's alarm as the engine's durable store holds it now (Trio time)."""
    ns = cls.namespace
    if engine.name == "postgres":
        import psycopg

        with psycopg.connect(rt.engine.dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT alarm_time FROM nj_objects WHERE namespace = %s"
                                " AND object_id = %s", (ns, oid)).fetchall()
    else:
        where = (rt.engine.database if engine.name == "shared"
                 else rt.engine.path / "catalog.sqlite3")
        rows = _read(where, "SELECT time FROM nj_alarms WHERE namespace = ? AND"
                     " object_id = ?", (ns, oid))
    if not rows or rows[0][0] is None:
        return None
    return float(rows[0][0]) - (nj.now() - trio.current_time())


def _read(path: Path, sql: str, params: tuple[Any, ...]) -> list[Any]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _assert_durable(rt: nj.Runtime, cls: type[nj.DurableObject], *keys: str) -> None:
    found = _outside(rt, cls, "o")
    if found is not None:
        assert set(keys) <= found, f"not durable yet: {set(keys) - found}"


# -- a failing job is rolled back ---------------------------------------------------------

JOB_FAILURES = ["raises", "sleeps_then_raises", "times_out", "is_cancelled"]


@pytest.mark.parametrize("how", JOB_FAILURES)
async def test_a_failing_jobs_writes_are_rolled_back_and_never_seen(
    how: str, autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """The job puts, runs raw SQL, pushes a job due in ``LATER`` (lowering the alarm),
    then fails ``how``: calls that waited for its turn find none of it, nothing of it
    ever reaches the durable store, its push never runs, and the alarm is off."""
    env = Env()
    seen: dict[str, tuple[Any, float]] = {}
    location = engine.location if engine.name == "memory" else engine.durable(tmp_path)
    with trio.fail_after(HANG):
        async with nj.open_runtime(location, env=env) as rt:
            ledger = rt.get(Ledger, "o")
            await ledger.push("write_then_fail", id="failing", delay=1, retry=ONCE,
                              payload=how, timeout=HOLD if how == "times_out" else None)
            await env.wrote.wait()
            wrote = trio.current_time()
            assert env.ran == [("failing", 1.0)] and wrote == 1.0
            # While it runs, nothing of it is outside the object.
            assert not ({"k", "job:pushed"} & (_outside(rt, Ledger, "o") or set()))

            async def call(name: str, at: float) -> None:
                await trio.sleep_until(wrote + at)
                seen[name] = (await getattr(ledger, name)("k"), trio.current_time() - wrote)

            async with trio.open_nursery() as nursery:
                # Both wait for the job's turn (the reader behind the writer, in
                # arrival order), and find what was there before it.
                nursery.start_soon(call, "get", 0.5)
                nursery.start_soon(call, "peek", 1.0)
                if how == "is_cancelled":
                    await trio.sleep_until(wrote + HOLD)
                    assert await ledger.cancel("failing")
            ended = 0.5 if how == "raises" else HOLD
            assert seen == {"get": (None, ended), "peek": (None, 1.0 if how == "raises" else HOLD)}
            assert await ledger.tables() == []
            assert await ledger.job_ids() == []  # its push went with it
            assert await ledger.dead() == ([] if how == "is_cancelled" else ["failing"])
            assert _outside(rt, Ledger, "o") in (None, set())
            if engine.name != "memory":
                assert _outside_alarm(rt, Ledger, "o") is None
            # The job it pushed never runs, and nothing wakes the object for it.
            await trio.sleep_until(wrote + LATER + 1)
            assert env.ran == [("failing", 1.0)]
        if engine.name == "memory":
            return
        async with nj.open_runtime(location, env=env) as rt:
            ledger = rt.get(Ledger, "o")
            assert await ledger.get("k") is None
            assert await ledger.tables() == []
            assert await ledger.job_ids() == []
            await trio.sleep(LATER)
            assert env.ran == [("failing", 1.0)]


async def test_a_failing_jobs_retry_finds_the_storage_as_it_was(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its retry starts from before the failed attempt: a counter it bumps by one ends at
    one, and the job the failed attempt pushed was never there."""

    class Counter(Ledger):
        namespace = "tests.test_failing_turns.Counter"

        async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
            self.env.ran.append((f"{ctx.job.id} {ctx.attempt}", trio.current_time()))
            n = self.ctx.storage.get("n", 0)
            self.ctx.storage.put("n", n + 1)
            await self.lifecycle.jobs.push("pushed", id=f"pushed by {ctx.attempt}",
                                           time=nj.now() + LATER)
            self.ctx.storage.put("attempt saw", n)
            if ctx.attempt == 1:
                await trio.sleep(HOLD)
                raise Boom("the first attempt fails")
            return None

    env = Env()
    retry = nj.RetryOptions(max_attempts=2, base_delay=1.0, max_delay=1.0, jitter=False)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            counter = rt.get(Counter, "o")
            await counter.push("count", id="count", delay=1, retry=retry)
            await trio.sleep_until(1 + HOLD + 1 + 0.5)
            assert env.ran == [("count 1", 1.0), ("count 2", 1.0 + HOLD + 1.0)]
            assert await counter.peek("n") == 1
            assert await counter.peek("attempt saw") == 0
            assert await counter.job_ids() == ["pushed by 2"]


# -- a failing call's writes stand, durable before anyone hears of them --------------------

CALL_FAILURES = ["raises", "sleeps_then_raises", "cancelled"]


@pytest.mark.parametrize("cls", [Plain, Ledger], ids=["set_alarm", "push"])
@pytest.mark.parametrize("how", CALL_FAILURES)
async def test_a_failing_calls_writes_stand_and_are_durable_before_anyone_hears(
    how: str, cls: type[Plain | Ledger], autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
) -> None:
    """The call puts, runs raw SQL, sets the alarm or pushes a job, puts ``last``, and
    fails ``how`` (see ``_call_fails``), while a read-only and a write call wait for its
    turn: the failing caller and both readers hear of it only once it is durable, and
    it stands across a restart (its alarm or job wakes the object on time)."""
    env = Env()
    seen: dict[str, tuple[Any, float]] = {}
    location = engine.location if engine.name == "memory" else engine.durable(tmp_path)
    with trio.fail_after(HANG):
        async with nj.open_runtime(location, env=env) as rt:
            stub = rt.get(cls, "o")
            await stub.get("k")  # (activated)
            start = trio.current_time()

            async def failing(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    with pytest.raises(Boom):
                        await stub.write_then_fail(how)
                    # Told it raised: what it wrote is durable (the output gate).
                    _assert_durable(rt, cls, "k", "last")
                    if engine.name != "memory":
                        assert _outside_alarm(rt, cls, "o") == env.wake
                    seen["failing"] = (None, trio.current_time() - start)

            async def call(name: str, at: float) -> None:
                await trio.sleep_until(start + at)
                seen[name] = (await getattr(stub, name)("last"), trio.current_time() - start)
                # What it read is durable when it hears it.
                _assert_durable(rt, cls, "k", "last")

            async with trio.open_nursery() as nursery:
                scope = await nursery.start(failing)
                nursery.start_soon(call, "peek", 0.5)
                nursery.start_soon(call, "get", 1.0)
                if how == "cancelled":
                    await env.wrote.wait()
                    scope.cancel(reason="the caller gives up on it")  # (as it waits)
            if how == "raises":
                assert seen == {"failing": (None, 0), "peek": ("dirty", 0.5),
                                "get": ("dirty", 1.0)}
            else:
                assert seen == {**({} if how == "cancelled" else {"failing": (None, HOLD)}),
                                "peek": ("dirty", HOLD), "get": ("dirty", HOLD)}
            assert await stub.tables() == (["t", "t2"] if _raw() else [])
            if cls is Ledger:
                assert await stub.job_ids() == ["pushed"]
                assert _outside(rt, cls, "o") in (None, {"k", "last", "job:pushed"})
            else:
                assert _outside(rt, cls, "o") in (None, {"k", "last"})
            if engine.name != "memory":
                assert _outside_alarm(rt, cls, "o") == env.wake
        if engine.name == "memory":
            return
        async with nj.open_runtime(location, env=env) as rt:
            stub = rt.get(cls, "o")
            assert await stub.get("k") == "dirty"
            assert await stub.tables() == (["t", "t2"] if _raw() else [])
            await trio.sleep_until(env.wake + 1)
            what = "pushed" if cls is Ledger else "alarm 0"
            assert env.ran == [(what, env.wake)]


# -- startup and a plain object's alarm: they stand as well --------------------------------


async def test_a_failing_plain_alarms_writes_stand_and_its_retry_is_durable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``alarm()`` writes, sets the alarm and raises: its put stands, and the runtime's
    retry (2 s) replaces the alarm it set, durably before anyone reads the put."""
    env = Env(fail_alarm=True)
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=env) as rt:
            plain = rt.get(Plain, "o")
            await plain.arm(1)
            await trio.sleep_until(1.5)
            assert env.ran == [("alarm 0", 1.0)]
            assert await plain.peek("k") == "dirty"
            _assert_durable(rt, Plain, "k")
            if engine.name != "memory":
                assert _outside_alarm(rt, Plain, "o") == 1.0 + 2
            await trio.sleep_until(1.0 + 2 + LATER)
            assert env.ran == [("alarm 0", 1.0), ("alarm 1", 3.0)]


class Starter(Readers, nj.DurableObject):
    """Its ``on_start`` writes, then fails while ``env.fail_start`` says so."""

    namespace = "tests.test_failing_turns.Starter"

    async def on_start(self) -> None:
        env: Env = self.ctx.env
        self.ctx.storage.put("starts", self.ctx.storage.get("starts", 0) + 1)
        if env.fail_start:
            env.fail_start -= 1
            await trio.sleep(HOLD)
            raise Boom("on_start fails after writing")


async def test_a_failing_on_starts_writes_stand_and_are_durable_before_the_caller_hears(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    env = Env(fail_start=1)
    seen: list[tuple[str, Any, float]] = []
    location = engine.location if engine.name == "memory" else engine.durable(tmp_path)
    with trio.fail_after(HANG):
        async with nj.open_runtime(location, env=env) as rt:
            stub = rt.get(Starter, "o")

            async def call(name: str, at: float) -> None:
                await trio.sleep(at)
                try:
                    result: Any = await getattr(stub, name)("starts")
                except Boom:
                    result = "Boom"
                _assert_durable(rt, Starter, "starts")
                seen.append((name, result, trio.current_time()))

            async with trio.open_nursery() as nursery:
                # The call that started the object and the one that waited for its
                # start both hear the failed start, at its end.
                nursery.start_soon(call, "get", 0)
                nursery.start_soon(call, "peek", 0.5)
            assert sorted(seen) == [("get", "Boom", HOLD), ("peek", "Boom", HOLD)]
            # The next call starts the object again, on what the failed start wrote.
            assert await stub.peek("starts") == 2
            _assert_durable(rt, Starter, "starts")
        if engine.name != "memory":
            async with nj.open_runtime(location, env=env) as rt:
                assert await rt.get(Starter, "o").get("starts") == 3


class Capped(Readers, nj.DurableObject):
    """A Lifecycle object with a capability whose ``on_start`` writes, then fails while
    ``env.fail_start`` says so."""

    namespace = "tests.test_failing_turns.Capped"

    class Audit(nj.Capability):
        id = "audit"

        async def on_start(self) -> None:
            host = self.host
            env: Env = host.ctx.env
            storage = host.ctx.storage
            failing = env.fail_start > 0
            if failing:
                env.fail_start -= 1
                await trio.sleep(HOLD)
            # (Written just before it raises: no ship loop pass ships it meanwhile.)
            storage.put("starts", storage.get("starts", 0) + 1)
            if failing:
                raise Boom("the capability's on_start fails after writing")

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: Env = ctx.env
        self.lifecycle = nj.Lifecycle.install(self).use(Capped.Audit())

    async def push(self, fn: str, **kwargs: Any) -> None:
        await self.lifecycle.jobs.push(fn, **kwargs)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.env.ran.append((ctx.job.id, trio.current_time()))
        return None


async def test_a_failing_lifecycle_startups_writes_stand_and_are_durable_before_anyone_hears(
    autojump_clock: trio.testing.MockClock, tmp_path: Path,
) -> None:
    """The Lifecycle's startup (a capability's ``on_start``) fails after writing: in a
    read-only call that started the object, then in an alarm run."""
    env = Env(fail_start=1)
    location = engine.location if engine.name == "memory" else engine.durable(tmp_path)
    with trio.fail_after(HANG):
        async with nj.open_runtime(location, env=env, idle_timeout=0.5) as rt:
            capped = rt.get(Capped, "o")
            with pytest.raises(Boom):
                await capped.peek("starts")
            assert trio.current_time() == HOLD
            _assert_durable(rt, Capped, "starts")
            await capped.push("job", id="job", delay=5)  # (startup succeeds: 2 starts)
            pushed = trio.current_time()
            await trio.sleep(1)  # it left memory: its alarm starts it
            assert not rt.is_active(Capped.namespace, "o")
            env.fail_start = 1
            await trio.sleep_until(pushed + 5 + HOLD / 2)
            assert rt.is_active(Capped.namespace, "o")  # (its startup fails at +5 +HOLD)
            # A read-only call waits out the failing startup, then starts the object
            # itself (this time startup succeeds) and reads every start.
            assert await capped.peek("starts") == 4
            wrote = pushed + 5 + HOLD
            assert trio.current_time() == wrote
            _assert_durable(rt, Capped, "starts")
            # Started, the object runs what is due at once.
            await trio.sleep_until(wrote + 1)
            assert env.ran == [("job", wrote)]


async def test_a_failing_interleave_calls_writes_are_durable_before_its_caller_hears(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(HANG):
        async with nj.open_runtime(engine.location, env=Env()) as rt:
            plain = rt.get(Plain, "o")
            with pytest.raises(Boom):
                await plain.write_in_turn_then_fail()
            _assert_durable(rt, Plain, "k")
            assert trio.current_time() == 0
            assert await plain.peek("k") == "dirty"
