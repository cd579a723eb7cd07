"""A stub call's arguments and result are copies through the payload codec, on every
engine (DESIGN section 2): what a caller mutates never reaches the object, a value the
codec refuses is refused at the call on every engine, and the library's records
(``Job``, ``QueueItem``...) travel as themselves."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio
from conftest import engine

import nursery_jobs as nj
from nursery_jobs import _call_codec, _codec
from nursery_jobs._errors import CallCodecError


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


async def _noop(payload: Any, item: nj.QueueItem) -> None:
    pass


class Keeper(nj.DurableObject):
    namespace = "tests.test_call_copies.Keeper"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.state: dict[str, Any] = {"items": [1, 2], "nested": {"k": "v"}}
        self.seen: list[Any] = []
        self.runs = 0
        self.queue = nj.Queue({"noop": _noop}, retry=nj.RetryOptions(max_attempts=2))
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def get_state(self) -> dict[str, Any]:
        return self.state

    async def keep(self, value: Any, *, also: Any = None) -> int:
        self.runs += 1
        self.seen.append(value)
        return self.runs

    async def show(self) -> tuple[list[Any], int]:
        return self.seen, self.runs

    async def run_count(self) -> int:
        return self.runs

    async def give(self, value: Any) -> Any:
        self.runs += 1
        return value

    async def unencodable(self) -> dict[str, Any]:
        self.runs += 1
        return {"ok": [1], "fn": print}

    async def push_job(self) -> nj.Job:
        return await self.lifecycle.jobs.push(
            "f", id="j1", delay=60, payload={"when": dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
                                             "tags": {"a", "b"}},
            retry=nj.RetryOptions(max_attempts=4, give_up_on=(KeyError,)), priority=3)

    async def get_job(self) -> nj.Job | None:
        return self.lifecycle.jobs.get("j1")

    async def push_item(self) -> nj.QueueItem:
        self.item = await self.queue.push("noop", {"n": [1, 2, 3]}, id="q1", priority=2)
        return self.item

    async def get_item(self) -> nj.QueueItem:
        return self.item  # (the item runs at once: the one push returned, again)


async def test_a_mutated_result_never_reaches_the_object() -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(engine.location, stop_on=()) as rt:
            stub = rt.get(Keeper, "k")
            got = await stub.get_state()
            got["items"].append(3)
            got["nested"]["k"] = "changed"
            got["new"] = True
            assert await stub.get_state() == {"items": [1, 2], "nested": {"k": "v"}}


async def test_a_mutated_argument_never_reaches_the_object() -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(engine.location, stop_on=()) as rt:
            stub = rt.get(Keeper, "k")
            sent = {"list": [1], "when": dt.date(2030, 1, 2)}
            await stub.keep(sent)
            sent["list"].append(2)
            assert await stub.show() == ([{"list": [1], "when": dt.date(2030, 1, 2)}], 1)


@pytest.mark.parametrize(("args", "kwargs", "part", "path", "type_name"), [
    ((lambda: None,), {}, "args[0]", "args[0]", "function"),
    ((1, {"ok": [trio.Event()]}), {}, "args[1]", "args[1]['ok'][0]", "trio.Event"),
    ((1,), {"also": object()}, "kwargs['also']", "kwargs['also']", "object"),
    (([1, ("ok", {"x": 1j})],), {}, "args[0]", "args[0][1][1]['x']", "complex"),
])
async def test_an_argument_the_codec_refuses_raises_codec_error_and_nothing_runs(
    args: tuple[Any, ...], kwargs: dict[str, Any], part: str, path: str, type_name: str
) -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(engine.location, stop_on=()) as rt:
            stub = rt.get(Keeper, "k")
            with pytest.raises(nj.CodecError) as info:
                await stub.keep(*args, **kwargs)
            error = info.value
            assert isinstance(error, CallCodecError) and isinstance(error, ValueError)
            assert error.method == "tests.test_call_copies.Keeper/k.keep()"
            assert error.part == part
            assert str(error).startswith(f"tests.test_call_copies.Keeper/k.keep(): {path}: ")
            assert repr(type_name) in str(error)
            assert await stub.run_count() == 0


async def test_a_result_the_codec_refuses_raises_codec_error_naming_the_result() -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(engine.location, stop_on=()) as rt:
            stub = rt.get(Keeper, "k")
            with pytest.raises(nj.CodecError) as info:
                await stub.unencodable()
            assert isinstance(info.value, CallCodecError) and info.value.part == "result"
            assert str(info.value) == ("tests.test_call_copies.Keeper/k.unencodable(): "
                                       "result['fn']: cannot encode object of type"
                                       " 'builtin_function_or_method'")
            assert await stub.run_count() == 1  # (it ran: a result exists only after)


async def test_a_returned_job_and_queue_item_round_trip_equal() -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(engine.location, stop_on=()) as rt:
            stub = rt.get(Keeper, "k")
            job = await stub.push_job()
            assert isinstance(job, nj.Job) and isinstance(job.retry, nj.RetryOptions)
            assert job == await stub.get_job()
            assert job.payload["tags"] == {"a", "b"}
            assert job.retry.give_up_on == ("builtins.KeyError",)
            item = await stub.push_item()
            assert isinstance(item, nj.QueueItem)
            assert item == await stub.get_item()
            assert item.payload == {"n": [1, 2, 3]} and item.priority == 2


async def test_scalars_and_records_travel_as_equal_values() -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(engine.location, stop_on=()) as rt:
            stub = rt.get(Keeper, "k")
            for value in (None, True, 7, 2**70, 1.5, "text", b"\x00bytes", (1, "a", None),
                          ((1, 2), [3]), nj.RetryOptions(max_attempts=2),
                          nj.Reschedule(1_900_000_000.0),
                          {"map": {1: "int key"}, "set": frozenset({1, 2})}):
                assert await stub.give(value) == value


def test_records_decode_only_to_registered_classes() -> None:
    text = _codec.encode_payload(nj.RetryOptions(max_attempts=2))
    assert text is not None and '"n":"RetryOptions"' in text
    assert _codec.decode_payload(text) == nj.RetryOptions(max_attempts=2)
    forged = '{"$t":"record","n":"os.system","v":{"command":"true"}}'
    with pytest.raises(nj.CodecError, match="unknown kind"):
        _codec.decode_payload(forged)
    with pytest.raises(nj.CodecError, match="malformed 'RetryOptions'"):
        _codec.decode_payload('{"$t":"record","n":"RetryOptions","v":{"max_attempts":0}}')
    with pytest.raises(nj.CodecError, match="malformed 'RetryOptions'"):
        _codec.decode_payload('{"$t":"record","n":"RetryOptions","v":{"nope":1}}')


def test_an_oversized_call_is_refused_on_every_path() -> None:
    big = "x" * (_codec.MAX_PAYLOAD_BYTES // 2)
    # Each argument alone fits; together they do not: refused as the envelope would be.
    with pytest.raises(CallCodecError) as info:
        _call_codec.copy_arguments((big, big, big), {}, "ns/o.m()")
    assert info.value.part == "arguments"
    with pytest.raises(CallCodecError) as info:
        _call_codec.copy_result([big, big, big], "ns/o.m()")
    assert info.value.part == "result"


def test_a_call_the_envelope_refuses_is_refused_by_the_local_copy_too() -> None:
    """Text holding a lone surrogate is written as ASCII escapes, where a character
    beyond the BMP takes 12 bytes (a surrogate pair), not 6: the local fast path let
    such a call through that the cross-host envelope (PostgreSQL) refuses as over 1 MiB."""
    text = "\U0001f600" * 100_000 + "\ud800"
    with pytest.raises(CallCodecError) as info:
        _call_codec.encode_call((text,), {}, (), "ns/o.m()")
    assert info.value.part == "arguments"
    with pytest.raises(CallCodecError) as info:
        _call_codec.copy_arguments((text,), {}, "ns/o.m()")
    assert info.value.part == "arguments"
    with pytest.raises(CallCodecError) as info:
        _call_codec.copy_result(text, "ns/o.m()")
    assert info.value.part == "result"
    fits = "\U0001f600" * 80_000 + "\ud800"  # (960,014 bytes: passes on every path)
    assert _call_codec.copy_arguments((fits,), {}, "ns/o.m()")[0] == (fits,)
    assert _call_codec.copy_result(fits, "ns/o.m()") == fits


@pytest.mark.parametrize("text", ['[[],{},5]', '[[],{},[],1,{"a":1}]', '[[1],{},null]'])
def test_a_forged_call_envelope_raises_codec_error(text: str) -> None:
    with pytest.raises(nj.CodecError, match="call envelope"):
        _call_codec.decode_call(text)
