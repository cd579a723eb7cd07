"""The runtime: stubs and calls, activation and eviction, object ids, the data
directory lock, shutdown, and the events channel."""

from __future__ import annotations

import os
import sqlite3
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from conftest import EPOCH, engine

import nursery_jobs as nj

# A generous virtual-time bound: under autojump a hang jumps here and fails the test.
HANG = 100_000


@attrs.define
class Env:
    """What objects report back to a test."""

    starts: list[tuple[str, float]] = attrs.Factory(list)
    evictions: list[tuple[str, float]] = attrs.Factory(list)
    storages: dict[str, nj.Storage] = attrs.Factory(dict)
    # What a call cannot carry (it copies through the codec): methods take a name.
    errors: dict[str, BaseException] = attrs.Factory(dict)
    gates: dict[str, trio.Event] = attrs.Factory(dict)


class Counter(nj.DurableObject):
    namespace = "tests.test_runtime.Counter"
    not_a_method = "a class attribute"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.calls_in_memory = 0
        self.instance_attr = 42

    async def on_start(self) -> None:
        env: Env = self.ctx.env
        env.starts.append((self.ctx.id, nj.now()))
        env.storages[self.ctx.id] = self.ctx.storage
        self.ctx.nursery.start_soon(self._watch_eviction)

    async def _watch_eviction(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.ctx.env.evictions.append((self.ctx.id, nj.now()))

    async def increment(self, by: int = 1) -> int:
        n = self.ctx.storage.get("n", 0) + by
        self.ctx.storage.put("n", n)
        self.calls_in_memory += 1
        return n

    async def memory(self) -> int:
        return self.calls_in_memory

    async def echo(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        await trio.lowlevel.checkpoint()
        return args, kwargs

    def double(self, x: int) -> int:
        return 2 * x

    async def identity(self) -> dict[str, Any]:
        return {"id": self.ctx.id, "namespace": self.ctx.namespace, "env": id(self.ctx.env)}

    async def fail(self, error: str) -> None:
        await trio.lowlevel.checkpoint()
        raise self.ctx.env.errors[error]

    def fail_sync(self, error: str) -> None:
        raise self.ctx.env.errors[error]

    async def hold(self, seconds: float) -> int:
        await trio.sleep(seconds)
        # The instance and the database are still there after the wait.
        self.ctx.storage.put("held", seconds)
        return self.calls_in_memory

    async def _private(self) -> str:
        return "secret"

    # Each half of an update runs with no await inside; the awaits come between.
    async def increment_between_awaits(self) -> None:
        await trio.lowlevel.checkpoint()
        n = self.ctx.storage.get("n", 0)
        self.ctx.storage.put("n", n + 1)
        await trio.lowlevel.checkpoint()

    async def read_then_write(self, gate: str) -> int:
        n = self.ctx.storage.get("n", 0)
        await self.ctx.env.gates[gate].wait()
        self.ctx.storage.put("n", n + 1)
        return n


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


# -- stubs and calls ------------------------------------------------------------------


async def test_stub_calls_and_return_values() -> None:
    env = Env()
    async with nj.open_runtime(env=env) as rt:
        stub = rt.get(Counter, "c1")
        assert "c1" in repr(stub)
        assert await stub.increment() == 1
        assert await stub.increment(5) == 6
        assert await stub.call("increment", by=10) == 16
        assert await stub.echo(1, "two", three=[3]) == ((1, "two"), {"three": [3]})
        assert await stub.call("echo") == ((), {})
        assert await stub.double(21) == 42  # a sync method works too
        assert await stub.identity() == {
            "id": "c1",
            "namespace": "tests.test_runtime.Counter",
            "env": id(env),
        }
        # A second stub for the same id reaches the same object.
        assert await rt.get(Counter, "c1").increment() == 17
        assert await stub.memory() == 4
        # A different id is a different object.
        assert await rt.get(Counter, "c2").increment() == 1
        assert [s[0] for s in env.starts] == ["c1", "c2"]


async def test_method_exceptions_reach_the_caller_unchanged() -> None:
    class Custom(Exception):
        pass

    env = Env()
    async with nj.open_runtime(env=env) as rt:
        stub = rt.get(Counter, "c")
        for method in ("fail", "fail_sync"):
            for error in (Custom("x"), KeyError("k"), nj.RpcError("not from the runtime")):
                env.errors["e"] = error  # (not copied through the codec)
                with pytest.raises(type(error)) as info:
                    await stub.call(method, "e")
                assert info.value is error
        # The object survives its method's errors.
        assert await stub.increment() == 1


async def test_rpc_errors() -> None:
    env = Env()
    async with nj.open_runtime(env=env) as rt:
        stub = rt.get(Counter, "c")
        for name in ("_private", "_watch_eviction", "__init__", "not_a_method",
                     "instance_attr", "calls_in_memory", "no_such_name", "ctx",
                     "on_start", "alarm"):
            with pytest.raises(nj.RpcError) as info:
                await stub.call(name)
            assert "c" in str(info.value) or name in str(info.value)
            assert isinstance(info.value, nj.NurseryJobsError)
            assert isinstance(info.value, TypeError)
        with pytest.raises(nj.RpcError):
            await stub._private()
        with pytest.raises(nj.RpcError):
            await stub.on_start()
        with pytest.raises(nj.RpcError):
            await stub.call(123)  # type: ignore[arg-type]
        # None of those reached the object: on_start ran once, nothing else did.
        assert len(env.starts) == 1
        assert await stub.memory() == 0


class WithProperty(nj.DurableObject):
    namespace = "tests.test_runtime.WithProperty"

    @property
    def count(self) -> int:
        # A property's getter is the object's code: reading storage here needs a turn.
        return int(self.ctx.storage.get("n", 0))

    @property
    def broken(self) -> int:
        raise KeyError("not a method")

    @classmethod
    def kind(cls) -> str:
        return cls.__name__

    @staticmethod
    def helper() -> int:
        return 1


async def test_a_stub_call_to_a_property_raises_rpc_error_without_running_it() -> None:
    async with nj.open_runtime() as rt:
        stub = rt.get(WithProperty, "p")
        for name in ("count", "broken", "helper"):
            with pytest.raises(nj.RpcError, match=f"WithProperty/p.{name} is not a method"):
                await stub.call(name)
        # A classmethod stays callable, as it always was.
        assert await stub.kind() == "WithProperty"


async def test_get_refuses_non_durable_object_classes() -> None:
    async with nj.open_runtime() as rt:
        for bad in (object, int, Counter(None)):  # type: ignore[arg-type]
            with pytest.raises(nj.RuntimeArgumentError, match="DurableObject subclass") as info:
                rt.get(bad, "x")  # type: ignore[arg-type]
            assert isinstance(info.value, TypeError)


OPEN_RUNTIME_BAD_OPTIONS: dict[str, dict[str, Any]] = {
    "idle_timeout -5": {"idle_timeout": -5},
    "dormant_after 0": {"dormant_after": 0},
    "max_active 0": {"max_active": 0},
    "turn_warning -1": {"turn_warning": -1},
    "durability 'fast'": {"durability": "fast"},
    "durability a list": {"durability": ["full"]},
    "memory_limit -1": {"memory_limit": -1},
    "memory_probe 5": {"memory_probe": 5},
    "stop_on a str": {"stop_on": ("SIGTERM",)},
    "stop_on SIGKILL": {"stop_on": (9,)},
    "http a str": {"http": "127.0.0.1:8000"},
    "http_writes 'yes'": {"http": ("127.0.0.1", 0), "http_writes": "yes"},
    "client_only 'yes'": {"client_only": "yes"},
    "lease_ttl for memory": {"lease_ttl": 5},
}


@pytest.mark.parametrize("case", sorted(OPEN_RUNTIME_BAD_OPTIONS))
async def test_a_bad_open_runtime_option_is_a_runtime_argument_error_naming_it(
    case: str,
) -> None:
    option = OPEN_RUNTIME_BAD_OPTIONS[case]
    name = list(option)[-1]
    with pytest.raises(nj.RuntimeArgumentError, match=name) as info:
        async with nj.open_runtime(**{"stop_on": (), **option}):
            pass
    # Also the ValueError and TypeError such checks raised before (DESIGN §7).
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


# -- activation and eviction ------------------------------------------------------------


async def test_on_start_runs_on_every_activation(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, idle_timeout=10) as rt:
            stub = rt.get(Counter, "c")
            await stub.increment()
            await stub.increment()
            assert env.starts == [("c", EPOCH)]
            await trio.sleep(100)
            await stub.increment()
            assert env.starts == [("c", EPOCH), ("c", EPOCH + 100)]


async def test_idle_eviction_after_idle_timeout_exactly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, idle_timeout=10) as rt:
            stub = rt.get(Counter, "c")
            assert await stub.increment() == 1
            await trio.sleep(3)
            assert await stub.increment() == 2  # a call restarts the idle clock
            await trio.sleep(9.5)
            assert env.evictions == []
            assert rt.statistics().active_objects == 1
            await trio.sleep(100)
            assert env.evictions == [("c", EPOCH + 13)]
            assert rt.statistics().active_objects == 0
            # Instance state is gone, storage is kept.
            assert await stub.increment() == 3
            assert await stub.memory() == 1
            assert len(env.starts) == 2


async def test_no_eviction_while_a_call_is_in_progress(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, idle_timeout=10) as rt:
            stub = rt.get(Counter, "c")
            await stub.increment()
            assert await stub.hold(35) == 1  # the same instance, after 35 s
            assert env.evictions == []
            await trio.sleep(100)
            assert env.evictions == [("c", EPOCH + 45)]


async def test_no_eviction_while_overlapping_calls_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, idle_timeout=10) as rt:
            stub = rt.get(Counter, "c")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stub.hold, 15)  # 0 .. 15
                await trio.sleep(10)
                nursery.start_soon(stub.hold, 15)  # waits for its turn from 10: 15 .. 30
            assert trio.current_time() == 30
            await trio.sleep(100)
            assert env.evictions == [("c", EPOCH + 40)]
            assert len(env.starts) == 1


async def test_a_call_arriving_at_the_idle_deadline_is_not_cut_off(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # The call and the idle deadline fall due at the same virtual instant; Trio runs
    # the woken tasks in either order, so repeat to see both. (On disk, so that a
    # database closed under the call makes its write fail.)
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path, env=env, idle_timeout=10) as rt:
            stub = rt.get(Counter, "c")
            for n in range(1, 41):
                assert await stub.increment() == n
                await trio.sleep(10)
                await stub.hold(5)  # writes to storage after its wait
            assert 1 <= len(env.starts) <= 40


async def test_object_activated_by_a_failing_call_is_still_evicted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, idle_timeout=10) as rt:
            with pytest.raises(nj.RpcError):
                await rt.get(Counter, "c").no_such_method()
            assert len(env.starts) == 1
            await trio.sleep(100)
            assert env.evictions == [("c", EPOCH + 10)]
            assert rt.statistics().active_objects == 0


async def test_max_active_evicts_the_least_recently_used_idle_object(
    autojump_clock: trio.testing.MockClock,
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, max_active=2) as rt:
            a, b, c = (rt.get(Counter, name) for name in "abc")
            await a.increment()
            await b.increment()
            await a.increment()  # a is now more recently used than b
            await c.increment()
            await settle()
            assert env.evictions == [("b", EPOCH)]
            assert rt.statistics().active_objects == 2
            await a.increment()
            await c.increment()
            assert [s[0] for s in env.starts] == ["a", "b", "c"]  # a and c stayed
            assert await a.memory() == 3
            await b.increment()  # the order was c, a: c is least recently used
            await settle()
            assert env.evictions == [("b", EPOCH), ("c", EPOCH)]
            assert await b.increment() == 3  # storage survived the eviction
            assert await b.memory() == 2
            assert rt.statistics().active_objects == 2


async def test_max_active_skips_busy_objects(autojump_clock: trio.testing.MockClock) -> None:
    env = Env()
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=env, max_active=2) as rt:
            a, b, c = (rt.get(Counter, name) for name in "abc")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.hold, 10)
                await settle()
                await b.increment()
                await c.increment()  # a is least recently used, but busy
                await settle()
                assert env.evictions == [("b", EPOCH)]
            assert env.evictions == [("b", EPOCH)]
            assert [s[0] for s in env.starts] == ["a", "b", "c"]


# -- interleaving -----------------------------------------------------------------------


async def test_calls_interleave_only_at_awaits(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(HANG):
        async with nj.open_runtime(env=Env()) as rt:
            stub = rt.get(Counter, "c")
            await stub.increment(0)

            async def hammer() -> None:
                for _ in range(200):
                    await stub.increment_between_awaits()

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(hammer)
            assert await stub.increment(0) == 1000


async def test_calls_take_turns_across_awaits(autojump_clock: trio.testing.MockClock) -> None:
    # The counterpart: an await between the read and the write does not let another
    # call in (the call holds the object's turn), so no update is lost.
    with trio.fail_after(HANG):
        env = Env()
        async with nj.open_runtime(env=env) as rt:
            stub = rt.get(Counter, "c")
            await stub.increment(0)
            gate = env.gates["g"] = trio.Event()
            results: list[int] = []

            async def call() -> None:
                results.append(await stub.read_then_write("g"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                nursery.start_soon(call)
                await settle()
                gate.set()
            assert results == [0, 1]
            assert await stub.increment(0) == 2


# -- object ids -------------------------------------------------------------------------


async def test_bad_object_ids() -> None:
    async with nj.open_runtime(env=Env()) as rt:
        for bad in ("", 42, None, b"bytes", "x" * 1025, "\ud800", "ok\udfffok"):
            with pytest.raises(nj.ObjectIdError) as info:
                rt.get(Counter, bad)  # type: ignore[arg-type]
            assert isinstance(info.value, ValueError)
            assert isinstance(info.value, nj.NurseryJobsError)
            # The error carries the id it refused (STYLE 23).
            assert info.value.object_id == bad and info.value.namespace is None
        assert await rt.get(Counter, "x" * 1024).increment() == 1


HOSTILE_IDS = [
    "../x",
    "a/b",
    ".",
    "..",
    "/",
    "/etc/passwd",
    "..\\..\\windows",
    "C:",
    " ",
    "objects",
    "catalog.sqlite3",
    "runtime.lock",
    "../" * 341 + "x",  # 1024 characters of traversal
    "é" * 1024,
    unicodedata.normalize("NFC", "café"),
    unicodedata.normalize("NFD", "café"),
    "\u202eevil",
    "🙂",
]


def count_object_dbs_confined(parent: Path, data: Path) -> int:
    """Check that nothing was created beside ``data`` in ``parent`` and that everything
    in ``data`` is a plain file or directory within it; return the object databases."""
    assert [p.name for p in parent.iterdir()] == [data.name]
    root = os.path.realpath(data)
    databases = 0
    for dirpath, dirnames, filenames in os.walk(data, followlinks=False):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            assert not os.path.islink(full), full
            assert os.path.realpath(full).startswith(root + os.sep), full
            if name.endswith(".sqlite3") and name != "catalog.sqlite3":
                assert os.path.dirname(full) == os.path.join(root, "objects"), full
                databases += 1
    return databases


async def test_hostile_ids_stay_inside_the_data_dir_and_never_collide(tmp_path: Path) -> None:
    assert unicodedata.normalize("NFC", "café") != unicodedata.normalize("NFD", "café")
    assert len(set(HOSTILE_IDS)) == len(HOSTILE_IDS)
    assert len(HOSTILE_IDS[12]) == 1024
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with nj.open_runtime(data, env=Env()) as rt:
            for n, object_id in enumerate(HOSTILE_IDS):
                assert await rt.get(Counter, object_id).increment(n + 1) == n + 1
            for n, object_id in enumerate(HOSTILE_IDS):
                assert await rt.get(Counter, object_id).increment(0) == n + 1
                assert (await rt.get(Counter, object_id).identity())["id"] == object_id
        assert count_object_dbs_confined(tmp_path, data) == len(HOSTILE_IDS)
        # Each id still has its own data after a restart.
        async with nj.open_runtime(data, env=Env()) as rt:
            for n, object_id in enumerate(HOSTILE_IDS):
                assert await rt.get(Counter, object_id).increment(0) == n + 1


@pytest.mark.parametrize("object_id", ["\0", "a\0b"])
async def test_an_object_id_with_a_nul_is_refused_on_every_engine(
    tmp_path: Path, object_id: str
) -> None:
    """PostgreSQL text cannot hold a NUL: refused on every engine alike (the same code
    must run on PostgreSQL), with nothing created."""
    async with nj.open_runtime(tmp_path / "data", env=Env()) as rt:
        with pytest.raises(nj.ObjectIdError, match="NUL") as info:
            rt.get(Counter, object_id)
        assert info.value.object_id == object_id
    assert list((tmp_path / "data" / "objects").iterdir()) == []


class LongIdCounter(nj.DurableObject):
    namespace = "tests.test_runtime.LongIdCounter"

    async def increment(self) -> int:
        n = int(self.ctx.storage.get("n", 0)) + 1
        self.ctx.storage.put("n", n)
        return n


# 1024 distinct CJK characters: 3,072 bytes of UTF-8 that do not compress.
LONG_CJK_ID = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1024))


async def test_an_object_id_of_1024_characters_works_on_every_engine(
    on_every_engine: str,
) -> None:
    # (PostgreSQL keys objects and rows by digests of their texts: a btree entry holds
    # at most 2,704 bytes, and this id is 3,072.)
    assert len(LONG_CJK_ID) == 1024
    async with nj.open_runtime(engine.location, stop_on=()) as rt:
        stub = rt.get(LongIdCounter, LONG_CJK_ID)
        assert await stub.increment() == 1
        assert await stub.increment() == 2


class OtherCounter(Counter):
    namespace = "tests.test_runtime.OtherCounter"


async def test_same_id_in_two_namespaces_is_two_objects(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path, env=Env()) as rt:
        assert await rt.get(Counter, "x").increment(1) == 1
        assert await rt.get(OtherCounter, "x").increment(10) == 10
        assert await rt.get(Counter, "x").increment(0) == 1


# -- the data directory lock ---------------------------------------------------------------

LOCKED_EXIT = 17
CHILD = f"""
import sys, trio, nursery_jobs as nj

async def main():
    try:
        async with nj.open_runtime(sys.argv[1]):
            pass
    except nj.RuntimeLockedError:
        return {LOCKED_EXIT}
    return 0

sys.exit(trio.run(main))
"""


async def run_child(path: Path) -> int:
    result = await trio.run_process(
        [sys.executable, "-c", CHILD, str(path)], check=False, capture_stderr=True
    )
    if result.returncode not in (0, LOCKED_EXIT):
        raise AssertionError(result.stderr.decode())
    return result.returncode


async def test_second_runtime_in_the_same_process_is_locked_out(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path, env=Env()) as rt:
        await rt.get(Counter, "c").increment()
        with pytest.raises(nj.RuntimeLockedError, match=str(tmp_path)):
            async with nj.open_runtime(tmp_path):
                pytest.fail("a second runtime opened a locked path")
        # The failed attempt did not disturb the first runtime.
        assert await rt.get(Counter, "c").increment() == 2
    async with nj.open_runtime(tmp_path, env=Env()) as rt:
        assert await rt.get(Counter, "c").increment() == 3


async def test_second_runtime_in_another_process_is_locked_out(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with nj.open_runtime(tmp_path, env=Env()) as rt:
            await rt.get(Counter, "c").increment()
            assert await run_child(tmp_path) == LOCKED_EXIT
        # Once closed, another process can open it.
        assert await run_child(tmp_path) == 0
        # And so can this one again, with the data intact.
        async with nj.open_runtime(tmp_path, env=Env()) as rt:
            assert await rt.get(Counter, "c").increment() == 2
            assert await run_child(tmp_path) == LOCKED_EXIT


# -- shutdown -----------------------------------------------------------------------------


async def test_body_exception_propagates_itself(tmp_path: Path) -> None:
    error = KeyError("from the body")
    env = Env()
    with pytest.raises(KeyError) as info:
        async with nj.open_runtime(tmp_path, env=env) as rt:
            await rt.get(Counter, "c").increment()
            raise error
    assert info.value is error
    assert env.evictions == [("c", env.evictions[0][1])]  # its nursery was cancelled
    with pytest.raises(sqlite3.ProgrammingError):
        env.storages["c"]._conn.execute("SELECT 1")  # its database was closed
    async with nj.open_runtime(tmp_path, env=Env()) as rt:
        assert await rt.get(Counter, "c").increment() == 2


async def test_body_exception_with_a_call_in_flight(autojump_clock: trio.testing.MockClock) -> None:
    error = ValueError("boom")
    with pytest.raises(ValueError) as info:
        async with nj.open_runtime(env=Env()) as rt:
            stub = rt.get(Counter, "c")
            await stub.increment()
            await rt.get(Counter, "alarmed").increment()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stub.hold, 100)
                await settle()
                nursery.cancel_scope.cancel()
            raise error
    assert info.value is error


async def test_cancellation_closes_everything(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    env = Env()
    with trio.fail_after(HANG):
        with trio.move_on_after(50) as scope:
            async with nj.open_runtime(tmp_path, env=env) as rt:
                stub = rt.get(Counter, "c")
                await stub.increment()
                await rt.get(Counter, "d").increment()
                await stub.hold(1000)  # cancelled at +50
        assert scope.cancelled_caught
        assert trio.current_time() == 50
        assert sorted(env.evictions) == [("c", EPOCH + 50), ("d", EPOCH + 50)]
        for storage in env.storages.values():
            with pytest.raises(sqlite3.ProgrammingError):
                storage._conn.execute("SELECT 1")
        with pytest.raises(nj.RuntimeClosedError):
            await stub.increment()
        async with nj.open_runtime(tmp_path, env=Env()) as rt:
            assert await rt.get(Counter, "c").increment() == 2
            # hold() never reached its write.
            assert await rt.get(Counter, "c").call("increment", 0) == 2


async def test_calls_after_close_raise_runtime_closed() -> None:
    env = Env()
    async with nj.open_runtime(env=env) as rt:
        stub = rt.get(Counter, "c")
        await stub.increment()
    with pytest.raises(sqlite3.ProgrammingError):
        env.storages["c"]._conn.execute("SELECT 1")  # in-memory databases are closed too
    with pytest.raises(nj.RuntimeClosedError) as info:
        await stub.increment()
    assert isinstance(info.value, nj.NurseryJobsError)
    with pytest.raises(nj.RuntimeClosedError):
        await rt.get(Counter, "new").increment()


# -- events -------------------------------------------------------------------------------


class Failing(nj.DurableObject):
    namespace = "tests.test_runtime.Failing"

    async def arm(self, when: float) -> None:
        self.ctx.storage.set_alarm(when)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        raise RuntimeError("always")


async def test_subscribers_and_listeners_receive_events(
    autojump_clock: trio.testing.MockClock,
) -> None:
    heard: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime() as rt:
            rt.events.add_listener(heard.append)
            with rt.events.subscribe() as events:
                await rt.get(Failing, "f").arm(EPOCH + 1)
                while True:
                    event = await events.receive()
                    if event.type == "alarm:failed":
                        break
            assert event.namespace == "tests.test_runtime.Failing"
            assert event.object_id == "f"
            assert event.time == EPOCH + 127  # 1 + 2 + 4 + 8 + 16 + 32 + 64
            assert event.data["retries"] == 6
            assert [e.type for e in heard] == ["alarm:retry"] * 6 + ["alarm:failed"]
            assert heard[-1] == event
            rt.events.remove_listener(heard.append)
            rt.events.emit("test:after", "ns", "id")
            assert len(heard) == 7


async def test_a_listener_that_raises_does_not_break_emit() -> None:
    heard: list[str] = []

    def bad(event: nj.Event) -> None:
        raise RuntimeError("listener bug")

    async with nj.open_runtime() as rt:
        rt.events.add_listener(bad)
        rt.events.add_listener(lambda e: heard.append(e.type))
        rt.events.emit("test:one", "ns", "id", x=1)
        assert heard == ["test:one"]


async def test_a_subscriber_that_never_reads_does_not_block(
    autojump_clock: trio.testing.MockClock,
) -> None:
    heard: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime() as rt:
            rt.events.add_listener(heard.append)
            with rt.events.subscribe(max_buffer=10) as slow:
                with rt.events.subscribe() as fast:
                    for n in range(5000):
                        rt.events.emit("test:flood", "ns", "id", n=n)
                    assert rt.statistics().events_dropped == 5000 - 10 + 5000 - 1000
                    assert [slow.receive_nowait().data["n"] for _ in range(10)] == list(range(10))
                    assert fast.receive_nowait().data["n"] == 0
            assert len(heard) == 5000
            # The runtime keeps working with a stuck subscriber attached.
            with rt.events.subscribe(max_buffer=1):
                await rt.get(Failing, "f").arm(EPOCH + 1)
                await trio.sleep(200)
            assert [e.type for e in heard[5000:]] == ["alarm:retry"] * 6 + ["alarm:failed"]
            assert rt.statistics().events_dropped == 5000 - 10 + 5000 - 1000 + 6


class Rung(nj.DurableObject):
    namespace = "tests.test_runtime.Rung"

    async def arm(self, at: float) -> None:
        self.ctx.storage.set_alarm(at)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        rung: list[str] = self.ctx.env
        rung.append(self.ctx.id)


async def test_an_object_evicted_before_its_activator_resumes_is_activated_again() -> None:
    # A real clock, an idle_timeout shorter than the stalls of the Trio thread: an
    # object just started can pass its idle deadline before the task that activated it
    # for its alarm resumes. That alarm must still run (it used to meet a closed nursery
    # and take the runtime down with RuntimeError).
    rung: list[str] = []
    async with nj.open_runtime(None, env=rung, idle_timeout=0.005) as rt:
        for i in range(30):
            await rt.get(Rung, f"r{i}").arm(nj.now() + 0.2)

        async def stall() -> None:
            while len(rung) < 30:
                time.sleep(0.01)  # noqa: ASYNC251  (the Trio thread held, each round)
                await trio.lowlevel.checkpoint()

        with trio.fail_after(30):
            await stall()
    assert sorted(rung) == sorted(f"r{i}" for i in range(30))
