"""An exception raised by a call forwarded to another host comes back typed — as data,
never pickled (DESIGN.md §9 "Calls across hosts": same exceptions; README: nothing is
ever pickled). An answer is text that anyone able to ``NOTIFY`` on the caller's channel,
or to write ``nj_calls``, can forge: reading it must never run code."""

from __future__ import annotations

import base64
import decimal
import ipaddress
import json
import os
import pickle
import socket
import subprocess
import uuid
import zoneinfo
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio
from pg_support import eventually, sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._engines.postgres._calls import answer_note, channel
from nursery_jobs._engines.postgres._engine import PostgresEngine
from nursery_jobs._errors import RemoteError


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

    async def unreadable_key(self) -> None:
        raise KeyError(object())

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
        # Args the codec cannot carry: rebuilt from its message, where that gives the
        # same text (said in a note); else a RemoteError naming the class and message.
        with pytest.raises(Unreadable) as unreadable:
            await stub.unreadable()
        assert str(unreadable.value).startswith("<object object at 0x")
        assert "rebuilt from its message" in unreadable.value.__notes__[-1]
        with pytest.raises(RemoteError, match=r"raised KeyError: <object object") as remote:
            await stub.unreadable_key()
        assert remote.value.type_name == "KeyError"
        assert remote.value.method == "tests.pg_call_errors.Fragile/f.unreadable_key()"
        assert remote.value.message.startswith("<object object at 0x")


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
    ('{"type": "builtins:KeyError", "args": ["k"], "state": {},'
     ' "held": [["args", 5, {"type": "builtins:KeyError", "args": [], "state": {}}]]}',
     "cannot read"),
    ('{"type": "builtins:KeyError", "args": ["k"], "state": {}, "cause": "os:system"}',
     "cannot read"),
    ('{"type": "builtins:KeyError", "args": ["k"], "state": {}, "pickle": "gASV"}',
     "cannot read"),
    (None, "cannot read"),
])
def test_answer_text_that_is_no_exception_record_is_an_rpc_error(
    record: str | None, says: str,
) -> None:
    from nursery_jobs._engines.postgres._call_errors import load_error as _load_error

    error = _load_error(record, "ns/o.m()")
    assert isinstance(error, nj.RpcError) and says in str(error), error
    assert "ns/o.m()" in str(error)


def test_an_exception_record_round_trips() -> None:
    from nursery_jobs._engines.postgres._call_errors import dump_error as _dump_error
    from nursery_jobs._engines.postgres._call_errors import load_error as _load_error

    error = _load_error(_dump_error(QuotaExceeded("over", limit=3), "l"), "l")
    assert type(error) is QuotaExceeded and error.limit == 3 and str(error) == "over"


def test_a_forged_record_runs_no_lookup_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The class is looked up in namespaces as they stand: a module's ``__getattr__``
    (a lazy import, as ``concurrent.futures`` and ``dateutil`` have) or a property of an
    object on the way never runs (they ran: getattr)."""
    import types

    from nursery_jobs._engines.postgres._call_errors import load_error as _load_error

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
    from nursery_jobs._engines.postgres._call_errors import load_error as _load_error

    huge = "y" * 500_000
    error = _load_error(f'{{"type": "nowhere:{huge}", "args": ["{huge}"], "state": {{}}}}',
                        "ns/o.m()")
    assert isinstance(error, nj.RpcError) and len(str(error)) < 3_000, len(str(error))
    # State keys that name the machinery: the instance's dict holds them, nothing more.
    error = _load_error('{"type": "builtins:KeyError", "args": ["k"], "state":'
                        ' {"__class__": "os", "__dict__": 1, "args": [1]}}', "ns/o.m()")
    assert type(error) is KeyError and error.args == ("k",)


# -- errors of the database and the standard library (issue: they came back RpcError) --
class OrderNotSaved(nj.StorageError):
    """A library error's subclass that holds the database's error as an attribute."""

    def __init__(self, message: str, error: Exception) -> None:
        super().__init__(message)
        self.error = error


def _duplicate_key(dsn: str) -> None:
    """Raise the UniqueViolation of a real INSERT (blocks)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE orders (id int CONSTRAINT orders_pk PRIMARY KEY)")
        conn.execute("INSERT INTO orders VALUES (1)")
        conn.execute("INSERT INTO orders VALUES (1)")


class Ledger(nj.DurableObject):
    namespace = "tests.pg_call_errors.Ledger"

    async def here(self) -> Any:
        return self.ctx.env

    async def insert(self, dsn: str, how: str) -> None:
        try:
            await trio.to_thread.run_sync(_duplicate_key, dsn)
        except psycopg.errors.UniqueViolation as exc:
            if how == "raw":
                raise
            if how == "from":
                raise nj.StorageError("order 1 not saved") from exc
            if how == "held":
                raise OrderNotSaved("order 1 not saved", exc) from None
            raise ExceptionGroup("in a nursery", [exc, KeyError(object())]) from None

    async def decimal(self, text: str) -> Any:
        return Decimal(1) / Decimal(text)


def _is_the_duplicate(error: BaseException) -> None:
    assert type(error) is psycopg.errors.UniqueViolation, repr(error)
    assert str(error).startswith("duplicate key value violates unique constraint")
    assert error.sqlstate == "23505"
    assert (error.diag.constraint_name, error.diag.table_name) == ("orders_pk", "orders")
    assert error.diag.message_detail == "Key (id)=(1) already exists."


async def test_database_and_decimal_errors_come_back_typed(pg_dsn: str) -> None:
    """A psycopg error raised in the method (or held, or chained, by a library error),
    and decimal's signals, came back a bare RpcError: the codec refused their parts (an
    error's diagnostics keyed by an IntEnum, a signal's list of classes)."""
    async with nj.open_runtime(PostgresEngine(pg_dsn), env="A") as a, \
            nj.open_runtime(PostgresEngine(pg_dsn), env="B") as b:
        assert await a.get(Ledger, "l").here() == "A"
        stub = b.get(Ledger, "l")
        assert await stub.here() == "A"  # (forwarded: A holds it)
        with pytest.raises(psycopg.errors.UniqueViolation) as raw:
            await stub.insert(pg_dsn, "raw")
        _is_the_duplicate(raw.value)
        with pytest.raises(nj.StorageError, match="order 1 not saved") as chained:
            await stub.insert(pg_dsn, "from")
        assert type(chained.value) is nj.StorageError
        _is_the_duplicate(chained.value.__cause__)  # type: ignore[arg-type]
        with pytest.raises(OrderNotSaved, match="order 1 not saved") as held:
            await stub.insert(pg_dsn, "held")
        _is_the_duplicate(held.value.error)
        with pytest.raises(ExceptionGroup) as group:
            await stub.insert(pg_dsn, "group")
        duplicate, key = group.value.exceptions
        _is_the_duplicate(duplicate)  # (one of a group that cannot travel whole)
        assert type(key) is RemoteError and key.type_name == "KeyError"
        with pytest.raises(decimal.InvalidOperation) as invalid:
            await stub.decimal("x")
        assert type(invalid.value) is decimal.InvalidOperation
        assert str(invalid.value) == "[<class 'decimal.ConversionSyntax'>]"
        with pytest.raises(ZeroDivisionError) as by_zero:
            await stub.decimal("0")
        assert type(by_zero.value) is decimal.DivisionByZero


def _raised(fn: Any, *args: Any, **kwargs: Any) -> BaseException:
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return exc
    raise AssertionError(f"{fn} raised nothing")


STDLIB_ERRORS = [
    _raised(Decimal, "x"),
    _raised(lambda: Decimal(1) / Decimal(0)),
    _raised(json.loads, "{"),
    _raised(b"\xff".decode),
    _raised(subprocess.run, ["false"], check=True),
    _raised(datetime.fromisoformat, "nope"),
    _raised(ipaddress.ip_address, "nope"),
    _raised(uuid.UUID, "nope"),
    _raised(open, "/nonexistent/nowhere"),
    _raised(zoneinfo.ZoneInfo, "Nowhere/Nothing"),
    socket.gaierror(-2, "Name or service not known"),
    KeyError("k"),
    ValueError(Decimal("1.5"), b"raw"),
]


@pytest.mark.parametrize("error", STDLIB_ERRORS, ids=lambda e: type(e).__qualname__)
def test_stdlib_errors_come_back_as_themselves(error: Exception) -> None:
    from nursery_jobs._engines.postgres._call_errors import dump_error, load_error

    back = load_error(dump_error(error, "ns/o.m()"), "ns/o.m()")
    assert type(back) is type(error) and str(back) == str(error), (back, error)


def _library_errors() -> list[Exception]:
    from nursery_jobs import _errors as e

    return [
        e.NurseryJobsError("any"), e.ObjectIdError("bad id 'x'", object_id="x"),
        e.ObjectIdError("namespace ''", namespace=""), e.TimeArgumentError("delay=-1"),
        e.StorageKeyError("key 3"), e.CodecError("payload[0]: no"),
        e.CallCodecError("ns/o.m(): args[0]: no", "ns/o.m()", "args[0]"),
        e.RuntimeLockedError("held"), e.RuntimeClosedError("closed"),
        e.EngineError("ftp://x"), e.DataLayoutError("layout", path="/d", layout="shared"),
        e.TracingError("no provider"), e.MissingExtraError("tracing", "otel"),
        e.StorageError("cannot open"),
        e.StorageFaultError("disk full", label="ns/o", file="/d/o.db", cause="full"),
        e.DataDirectoryAccessError("read-only", path="/d", cause="readonly"),
        e.TurnError("no turn", object_label="ns/o"),
        e.ObjectFencedError("ns/o fenced", reason="lease not renewed"),
        e.RpcError("ns/o._private"), e.ObjectResetError("reset"),
        e.AlarmOwnedError("owned", namespace="ns", object_id="o", owner="Lifecycle"),
        e.JobError("bad job", job_id="j"),
        e.JobOwnershipError("owned job", job_id="j", owner="queue", holder="host"),
        e.JobTimeoutError("job j after 5 s", job_id="j", timeout=5.0),
        e.CapabilityError("twice"), e.LifecycleArgumentError("lifecycle"), e.LimitError("limit"),
        e.RuntimeArgumentError("max_active must be None or an int >= 1, got 0"),
        e.UnknownCallbackError("no callback"), e.DataDirectoryError("not one"),
        e.UnknownObjectError("ns/o"), e.ObjectInUseError("in use"),
        e.ObjectHeldError("ns", "o", "host-1", 3.0), e.HttpError(403, "writes are off"),
        e.HttpBindError("127.0.0.1", 8321, OSError(98, "Address already in use")),
        e.DamagedJobError("job 'j' of ns/o: its payload does not decode", "j", "host", "ns/o"),
        RemoteError("ns/o.m() raised X: y", "ns/o.m()", "X", "y"),
    ]


def test_every_library_error_comes_back_with_its_type_message_and_data() -> None:
    from nursery_jobs import _errors
    from nursery_jobs._engines.postgres._call_errors import dump_error, load_error

    errors = _library_errors()
    signals = {_errors.ObjectLeasedElsewhere, _errors.ObjectMoved}  # (never a caller's)
    every = {cls for cls in vars(_errors).values() if isinstance(cls, type)
             and issubclass(cls, _errors.NurseryJobsError)} - signals
    assert every <= {type(error) for error in errors}, "a library error without a sample"
    for error in errors:
        back = load_error(dump_error(error, "ns/o.m()"), "ns/o.m()")
        assert type(back) is type(error) and str(back) == str(error), (back, error)
        assert _data(back) == _data(error), type(error)


def _data(error: BaseException) -> dict[str, object]:
    """An exception's attributes, one it holds (``HttpBindError.cause``) as its type and
    args: a rebuilt exception is equal to none but itself."""
    return {k: (type(v), v.args) if isinstance(v, BaseException) else v
            for k, v in vars(error).items()}


def test_causes_and_held_exceptions_travel_bounded() -> None:
    """A cycle of causes, an exception that holds itself: carried ``MAX_NESTING`` deep
    (a RemoteError there), and a record nested deeper is refused; a member or cause
    of a class the caller has not loaded is a RemoteError in its place."""
    from nursery_jobs._engines.postgres._call_errors import (
        MAX_NESTING,
        dump_error,
        load_error,
    )

    first, second = ValueError("first"), KeyError("second")
    first.__cause__, second.__cause__ = second, first
    back: BaseException | None = load_error(dump_error(first, "ns/o.m()"), "ns/o.m()")
    chain = []
    while back is not None:
        chain.append(back)
        back = back.__cause__
    assert [type(e) for e in chain[:4]] == [ValueError, KeyError, ValueError, KeyError]
    assert len(chain) == MAX_NESTING + 1 and type(chain[-1]) is RemoteError
    selfish = QuotaExceeded("me", limit=1)
    selfish.me = selfish  # type: ignore[attr-defined]
    back = load_error(dump_error(selfish, "ns/o.m()"), "ns/o.m()")
    assert type(back) is QuotaExceeded and type(back.me) is QuotaExceeded  # type: ignore[attr-defined]
    record = '{"type": "builtins:KeyError", "args": ["k"], "state": {}}'
    for _ in range(MAX_NESTING + 1):
        record = f'{{"type": "builtins:KeyError", "args": ["k"], "state": {{}}, "cause": {record}}}'
    too_deep = load_error(record, "ns/o.m()")
    assert type(too_deep) is nj.RpcError and "cannot read" in str(too_deep)
    group = load_error(
        '{"type": "builtins:ExceptionGroup", "args": ["g"], "state": {}, "group": ['
        '{"type": "builtins:KeyError", "args": ["k"], "state": {},'
        ' "cause": {"type": "nowhere:Gone", "args": ["why"], "state": {}}},'
        '{"type": "nowhere:Missing", "args": ["m"], "state": {}}]}', "ns/o.m()")
    assert type(group) is ExceptionGroup
    key, missing = group.exceptions
    assert type(key) is KeyError and type(key.__cause__) is RemoteError
    assert type(missing) is RemoteError
    assert (missing.type_name, missing.message) == ("nowhere.Missing", "m")
