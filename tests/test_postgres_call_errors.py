"""An exception raised by a call forwarded to another host comes back typed — as data,
never pickled (DESIGN.md §9 "Calls across hosts": same exceptions; README: nothing is
ever pickled). An answer is text that anyone able to ``NOTIFY`` on the caller's channel,
or to write ``nj_calls``, can forge: reading it must never run code."""

from __future__ import annotations

import base64
import os
import pickle
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio
from pg_support import eventually, sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._engines.postgres._calls import answer_note, channel
from nursery_jobs._engines.postgres._engine import PostgresEngine


class QuotaExceeded(Exception):
    """A user's exception with state of its own beside its message."""

    def __init__(self, message: str, *, limit: int = 0) -> None:
        super().__init__(message)
        self.limit = limit


class Unreadable(Exception):
    """Its args hold what the payload codec cannot carry."""


class Unprintable(Exception):
    """Its args hold what the codec cannot carry, and its ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


class Irreducible(Exception):
    """Its ``__reduce__`` raises (a pickle of it would fail too)."""

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("cannot reduce an Irreducible")


class Fragile(nj.DurableObject):
    namespace = "tests.pg_call_errors.Fragile"
    started: ClassVar[trio.Event | None] = None

    async def here(self) -> Any:
        return self.ctx.env

    async def key_error(self) -> None:
        raise KeyError("missing", 3)

    async def quota(self) -> None:
        raise QuotaExceeded("over quota", limit=10)

    async def library_error(self) -> None:
        raise nj.JobError("bad job")

    async def turn_error(self) -> None:
        raise nj.TurnError("no turn held", object_label="ns/x")

    async def unreadable(self) -> None:
        raise Unreadable(object())

    async def os_error(self) -> None:
        raise FileNotFoundError(2, "No such file or directory", "/nowhere")

    async def huge(self) -> None:
        raise ValueError("x" * 2_000_000)

    async def unprintable(self) -> None:
        raise Unprintable(object())

    async def irreducible(self) -> None:
        raise Irreducible("a")

    async def group(self) -> None:
        raise ExceptionGroup("in a nursery", [KeyError("k"), QuotaExceeded("q", limit=2)])

    async def stuck(self, seconds: float) -> str:
        if Fragile.started is not None:
            Fragile.started.set()
        await trio.sleep(seconds)
        return "done"


async def test_exceptions_come_back_typed_with_their_args_and_state(pg_dsn: str) -> None:
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Fragile, "f").here() == "A"
        stub = b.get(Fragile, "f")
        assert await stub.here() == "A"  # (forwarded: A holds it)
        with pytest.raises(KeyError) as key_error:
            await stub.key_error()
        assert key_error.value.args == ("missing", 3)
        with pytest.raises(QuotaExceeded) as quota:
            await stub.quota()
        assert (str(quota.value), quota.value.limit) == ("over quota", 10)
        with pytest.raises(nj.JobError, match="bad job"):
            await stub.library_error()
        with pytest.raises(nj.TurnError, match="no turn held") as turn_error:
            await stub.turn_error()
        assert turn_error.value.object_label == "ns/x"
        with pytest.raises(FileNotFoundError) as missing:
            await stub.os_error()
        assert (missing.value.errno, missing.value.filename) == (2, "/nowhere")
        # What the codec cannot carry comes back as an RpcError naming what was raised.
        with pytest.raises(nj.RpcError, match=r"raised .*Unreadable"):
            await stub.unreadable()


@pytest.mark.parametrize(("method", "says"), [
    ("huge", "raised ValueError: xxx"),
    ("unprintable", "raised Unprintable"),
    ("irreducible", "raised Irreducible: a"),
])
async def test_an_exception_that_cannot_travel_is_an_rpc_error_and_the_owner_serves_on(
    pg_dsn: str, method: str, says: str,
) -> None:
    """One the codec cannot carry, however it fails to (over 1 MiB, a ``__str__`` that
    raises, a ``__reduce__`` that raises), comes back as an RpcError naming it, cut to a
    bounded length; the host that ran the call serves on (the error escaped its answer,
    crashing its runtime, and the caller waited for an answer that never came)."""
    with trio.fail_after(30):
        async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
                nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
            assert await a.get(Fragile, "f").here() == "A"
            with pytest.raises(nj.RpcError, match=says) as raised:
                await getattr(b.get(Fragile, "f"), method)()
            assert f"Fragile/f.{method}()" in str(raised.value)
            assert len(str(raised.value)) < 3_000  # (cut: ERROR_TEXT_LIMIT)
            assert await b.get(Fragile, "f").here() == "A"  # (still A's, serving)


async def test_an_exception_group_comes_back_as_a_group_of_its_exceptions(
    pg_dsn: str,
) -> None:
    """A method whose nursery raised: the group comes back an ExceptionGroup of the same
    exceptions, typed, as on one host (``except*`` works across hosts); it was an
    RpcError."""
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Fragile, "f").here() == "A"
        with pytest.raises(ExceptionGroup) as raised:
            await b.get(Fragile, "f").group()
        group = raised.value
        assert group.message == "in a nursery"
        key, quota = group.exceptions
        assert type(key) is KeyError and key.args == ("k",)
        assert type(quota) is QuotaExceeded and quota.limit == 2


async def test_a_forged_answer_runs_no_code(pg_dsn: str, tmp_path: Path) -> None:
    """A pickle put in an answer notification, as anyone who may NOTIFY can: the caller
    gets an RpcError, and the pickle's code never ran."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.mkdir, (str(marker),))

    forged = base64.b64encode(pickle.dumps(Evil())).decode()
    Fragile.started = trio.Event()
    try:
        async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
                nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
            assert await a.get(Fragile, "f").here() == "A"
            caught: list[BaseException] = []

            async def call() -> None:
                try:
                    await b.get(Fragile, "f").stuck(30)
                except Exception as exc:
                    caught.append(exc)

            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call)
                    await Fragile.started.wait()
                    [(call_id,)] = sql(pg_dsn, "SELECT id FROM nj_calls")
                    note = answer_note(call_id, "error", forged)
                    sql(pg_dsn, "SELECT pg_notify(%s, %s)",
                        (channel(b.engine.host_id), note))  # type: ignore[attr-defined]
                    await eventually(lambda: bool(caught))
                    nursery.cancel_scope.cancel()
            assert not marker.exists(), "the forged pickle ran"
            assert isinstance(caught[0], nj.RpcError), caught
            assert "cannot read" in str(caught[0])
    finally:
        Fragile.started = None


NOT_LOADED = "no exception class this host has loaded"


@pytest.mark.parametrize(("record", "says"), [
    ('{"type": "os:system", "args": ["touch /tmp/x"], "state": {}}', NOT_LOADED),
    ('{"type": "builtins:SystemExit", "args": [1], "state": {}}', NOT_LOADED),
    ('{"type": "evil_module_never_imported:Boom", "args": [], "state": {}}', NOT_LOADED),
    ('{"type": "builtins:ValueError", "args": "x", "state": {}}', "cannot read"),
    ('{"$t": "record", "n": "os.system", "v": []}', "cannot read"),
    ("gASVAAAA", "cannot read"),  # (base64 of a pickle's opening bytes)
    (None, "cannot read"),
])
def test_answer_text_that_is_no_exception_record_is_an_rpc_error(
    record: str | None, says: str,
) -> None:
    from nursery_jobs._engines.postgres._calls import _load_error

    error = _load_error(record, "ns/o.m()")
    assert isinstance(error, nj.RpcError) and says in str(error), error
    assert "ns/o.m()" in str(error)


def test_an_exception_record_round_trips() -> None:
    from nursery_jobs._engines.postgres._calls import _dump_error, _load_error

    error = _load_error(_dump_error(QuotaExceeded("over", limit=3), "l"), "l")
    assert type(error) is QuotaExceeded and error.limit == 3 and str(error) == "over"


def test_a_forged_record_runs_no_lookup_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The class is looked up in namespaces as they stand: a module's ``__getattr__``
    (a lazy import, as ``concurrent.futures`` and ``dateutil`` have) or a property of an
    object on the way never runs (they ran: getattr)."""
    import types

    from nursery_jobs._engines.postgres._calls import _load_error

    ran: list[str] = []
    lazy = types.ModuleType("nj_test_lazy_module")

    def module_getattr(name: str) -> Any:
        ran.append(f"__getattr__({name})")
        return KeyError

    class Holder:
        @property
        def error(self) -> type[Exception]:
            ran.append("property")
            return KeyError

    lazy.__getattr__ = module_getattr  # type: ignore[method-assign]
    lazy.holder = Holder()  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, lazy.__name__, lazy)
    for kind in ("nj_test_lazy_module:Anything", "nj_test_lazy_module:holder.error"):
        record = f'{{"type": "{kind}", "args": ["x"], "state": {{}}}}'
        error = _load_error(record, "ns/o.m()")
        assert isinstance(error, nj.RpcError) and NOT_LOADED in str(error), error
    assert ran == []


def test_a_forged_records_text_is_cut_and_its_state_retypes_nothing() -> None:
    from nursery_jobs._engines.postgres._calls import _load_error

    huge = "y" * 500_000
    error = _load_error(f'{{"type": "nowhere:{huge}", "args": ["{huge}"], "state": {{}}}}',
                        "ns/o.m()")
    assert isinstance(error, nj.RpcError) and len(str(error)) < 3_000, len(str(error))
    # State keys that name the machinery: the instance's dict holds them, nothing more.
    error = _load_error('{"type": "builtins:KeyError", "args": ["k"], "state":'
                        ' {"__class__": "os", "__dict__": 1, "args": [1]}}', "ns/o.m()")
    assert type(error) is KeyError and error.args == ("k",)
