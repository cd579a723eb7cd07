from __future__ import annotations

import collections
import enum
import json
import math
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nursery_jobs._codec import (
    _MAX_DEPTH,
    MAX_PAYLOAD_BYTES,
    decode_payload,
    encode_payload,
)
from nursery_jobs._converter import converter
from nursery_jobs._errors import CodecError, NurseryJobsError


def assert_same(out: Any, expected: Any) -> None:
    """Equal, and of the same type all the way down (bool is not int, tuple is not list)."""
    assert type(out) is type(expected), (out, expected)
    if isinstance(expected, float):
        if math.isnan(expected):
            assert math.isnan(out)
        else:
            assert out == expected
            assert math.copysign(1.0, out) == math.copysign(1.0, expected)  # keeps -0.0
    elif isinstance(expected, Decimal):
        assert str(out) == str(expected)  # exact: Decimal("1.0") == Decimal("1.00")
    elif isinstance(expected, datetime):
        assert out == expected
        assert out.utcoffset() == expected.utcoffset()
        assert out.fold == expected.fold
        assert out.tzinfo == expected.tzinfo
    elif isinstance(expected, (list, tuple)):
        assert len(out) == len(expected)
        for a, b in zip(out, expected, strict=True):
            assert_same(a, b)
    elif isinstance(expected, dict):
        # The codec keeps insertion order, so items pair up one to one.
        assert len(out) == len(expected)
        for (ka, va), (kb, vb) in zip(out.items(), expected.items(), strict=True):
            assert_same(ka, kb)
            assert_same(va, vb)
    elif isinstance(expected, (set, frozenset)):
        assert out == expected
        originals = {item: item for item in expected}
        for item in out:
            assert_same(item, originals[item])
    else:
        assert out == expected


def round_trip(value: Any) -> Any:
    text = encode_payload(value)
    if text is None:
        assert value is None  # stored as NULL
    else:
        text.encode("utf-8")  # storable in SQLite as UTF-8 text
    return decode_payload(text)


def check(value: Any) -> None:
    assert_same(round_trip(value), value)


def nested_lists(levels: int) -> list[Any]:
    root: list[Any] = []
    node = root
    for _ in range(levels - 1):
        child: list[Any] = []
        node.append(child)
        node = child
    return root


IST = timezone(timedelta(hours=5, minutes=30))

SCALARS = [
    True,
    False,
    0,
    -7,
    2**63,
    -(2**64) - 1,
    10**5000,
    -(10**5000),
    1.5,
    0.0,
    -0.0,
    1e308,
    5e-324,
    math.inf,
    -math.inf,
    "",
    "plain",
    "héllo wörld ✓ 🎉",
    "line\nbreak\x00nul",
    "$t",
    datetime(2024, 2, 29, 23, 59, 59, 999_999),
    datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=IST),
    datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(-timedelta(hours=9, minutes=30, seconds=15))),
    datetime(2024, 1, 2, tzinfo=UTC),
    datetime(2000, 1, 1, tzinfo=timezone(timedelta(microseconds=1))),
    datetime(2000, 1, 1, tzinfo=timezone(-timedelta(seconds=59, microseconds=7))),
    date(1, 1, 1),
    date(9999, 12, 31),
    timedelta(0),
    timedelta(days=-3, seconds=5, microseconds=7),
    timedelta.max,
    Decimal("1.10"),
    Decimal("-0"),
    Decimal("1E+400"),
    Decimal("Infinity"),
    Decimal("-Infinity"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    b"",
    b"\x00\xff binary \x80",
    re.compile(r"^a+(?P<b>b)$", re.IGNORECASE | re.MULTILINE | re.VERBOSE),
    re.compile(rb"\x00+", re.DOTALL),
    re.compile("plain"),
]


@pytest.mark.parametrize("value", SCALARS, ids=lambda v: type(v).__name__)
async def test_scalar_round_trips_with_type(value: Any) -> None:
    check(value)


@pytest.mark.parametrize("value", SCALARS, ids=lambda v: type(v).__name__)
async def test_scalar_round_trips_nested(value: Any) -> None:
    check([value, {"k": value}, (value,)])


async def test_none_is_stored_as_null() -> None:
    assert encode_payload(None) is None
    assert decode_payload(None) is None
    check([None, {"a": None}])


async def test_nan_round_trips() -> None:
    out = round_trip(math.nan)
    assert type(out) is float and math.isnan(out)
    out = round_trip([math.nan, {"x": (math.nan,)}])
    assert math.isnan(out[0]) and math.isnan(out[1]["x"][0])
    out = round_trip(Decimal("NaN"))
    assert type(out) is Decimal and out.is_nan()
    assert round_trip(Decimal("sNaN")).is_snan()


async def test_natives_are_plain_compact_json() -> None:
    value = {"user": 42, "path": "a/b", "ok": True, "x": None, "f": 1.5, "l": [1, "é"]}
    text = encode_payload(value)
    assert text == '{"user":42,"path":"a/b","ok":true,"x":null,"f":1.5,"l":[1,"é"]}'
    assert json.loads(text) == value


async def test_bool_and_int_keep_their_types() -> None:
    check([True, 1, False, 0, 1.0])
    check({"a": True, "b": 1})
    check({True: "t", 2: "i", 3.5: "f"})


async def test_tuple_and_list_are_distinct() -> None:
    check((1, [2, (3, [4])], ()))
    check([(), [], ((),)])
    assert round_trip((1, 2)) == (1, 2)
    assert round_trip([1, 2]) == [1, 2]


async def test_sets_and_frozensets() -> None:
    check({1, 2, 3})
    check(frozenset({"a", frozenset({1})}))
    check({(1, 2), (3, "x"), ()})
    check(set())
    check(frozenset())
    check({frozenset({(1, (2,))})} | {frozenset()})


async def test_dicts_with_non_string_keys() -> None:
    check({(1, 2): "tuple", 3: "int", frozenset({"a"}): "frozenset", "s": "str"})
    check({None: 1, False: 2, 2.5: 3, b"k": 4, date(2024, 1, 1): 5})
    check({("nested", (1, frozenset({2}))): {(3,): [4]}})
    check({uuid.UUID(int=7): Decimal("2.5")})


async def test_dict_with_tag_key_round_trips() -> None:
    check({"$t": "tuple", "v": [1, 2]})
    check({"$t": "datetime", "v": "2024-01-01T00:00:00"})
    check([{"a": {"$t": 1}}, {"$t": {"$t": {"$t": None}}}])
    # Key order is kept when the dict switches to pairs part way through.
    check({"a": 1, "b": [2], "$t": 3, "c": 4, 5: 6})


async def test_huge_ints() -> None:
    for value in (10**5000, -(10**5000), 2**2000, 2**2000 - 1, -(2**2000), -(2**2000) + 1):
        check(value)
        check({"n": [value]})
    check(10**100_000)


async def test_huge_ints_under_the_lowest_digit_limit() -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        for value in (10**639 - 1, 10**639, 10**700, 2**2000 - 1, 2**2000):
            check(value)
    finally:
        sys.set_int_max_str_digits(old)


async def test_datetimes_keep_offset_and_zone() -> None:
    aware = datetime(2024, 6, 1, 12, 0, tzinfo=IST)
    out = round_trip(aware)
    assert out.utcoffset() == timedelta(hours=5, minutes=30)
    assert out.hour == 12
    naive = datetime(2024, 6, 1, 12, 0)
    assert round_trip(naive).tzinfo is None
    # A ZoneInfo zone keeps its key, its wall time and its fold, even in a gap or an overlap.
    for value in (
        datetime(2024, 7, 1, 9, 30, tzinfo=ZoneInfo("Europe/Paris")),
        datetime(2024, 3, 31, 2, 30, tzinfo=ZoneInfo("Europe/Paris")),  # does not exist
        datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York")),
    ):
        out = round_trip(value)
        check(value)
        assert out.tzinfo is ZoneInfo(value.tzinfo.key)
        assert (out.hour, out.minute, out.fold) == (value.hour, value.minute, value.fold)


def test_an_uncached_zones_repeated_hour_keeps_its_instant_not_its_equality() -> None:
    """A datetime decodes into ``ZoneInfo(key)``, the cached instance. One whose zone was
    another instance (``ZoneInfo.no_cache``) keeps its key, wall time, fold and instant;
    but in a repeated hour Python (PEP 495) makes every comparison of datetimes in two
    different tzinfo objects unequal — even with a copy of itself — so equality there is
    not what a round trip can give (README: payloads)."""
    zone = ZoneInfo.no_cache("Europe/Berlin")
    value = datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=zone)
    back = round_trip(value)
    assert type(back) is datetime and back.tzinfo is ZoneInfo("Europe/Berlin")
    assert (back.replace(tzinfo=None), back.fold) == (value.replace(tzinfo=None), 1)
    assert back.timestamp() == value.timestamp() and back.utcoffset() == value.utcoffset()
    # Python's rule, not the codec's: the same instant in another instance of the zone.
    assert value != value.replace(tzinfo=ZoneInfo.no_cache("Europe/Berlin"))
    assert back != value
    # Outside a repeated hour it compares equal, as datetimes of two zones do.
    later = value.replace(hour=5, fold=0)
    assert round_trip(later) == later


async def test_lone_surrogates_round_trip() -> None:
    check("a\ud800b")
    check({"\udfff": ["\ud83d", ("x\udc00",)]})


async def test_nested_combination() -> None:
    value = {
        "when": datetime(2024, 1, 2, 3, 4, 5, tzinfo=IST),
        "rows": [(1, b"\x01", Decimal("0.1")), {uuid.UUID(int=1): {timedelta(hours=1)}}],
        "flags": frozenset({re.compile("x").pattern}),
        (1, "k"): [{"$t": [10**5000, -0.0, math.inf]}],
        "pattern": re.compile(r"\d+", re.ASCII),
        "dates": {date(2020, 2, 29): None},
    }
    check(value)


async def test_max_depth_round_trips() -> None:
    check(nested_lists(_MAX_DEPTH))
    value: Any = ()
    for level in range(_MAX_DEPTH - 1):
        value = (value, "x") if level % 2 else {level: value, "k": [1]}
    check(value)


# --- refusals --------------------------------------------------------------------------------


def _function() -> None:
    pass


class Plain:
    pass


@attrs.frozen
class Record:
    x: int


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    LOW = 1


class MyStr(str):
    pass


class MyDict(dict[str, int]):
    pass


REFUSED = [
    (_function, "function"),
    (lambda: 0, "function"),
    (Plain(), "Plain"),
    (Record(1), "Record"),
    (Colour.RED, "Colour"),
    (Level.LOW, "Level"),
    (MyStr("x"), "MyStr"),
    (MyDict(a=1), "MyDict"),
    (collections.OrderedDict(a=1), "OrderedDict"),
    (bytearray(b"x"), "bytearray"),
    (print, "builtin_function_or_method"),
    (object(), "object"),
    (range(3), "range"),
    (iter([1]), "list_iterator"),
]


@pytest.mark.parametrize(("value", "name"), REFUSED, ids=lambda v: type(v).__name__)
async def test_refused_types(value: Any, name: str) -> None:
    with pytest.raises(CodecError, match=f"cannot encode object of type '[^']*{name}'"):
        encode_payload(value)
    with pytest.raises(CodecError, match=name):
        encode_payload({"nested": [value]})


async def test_codec_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        encode_payload(lambda: 0)
    assert issubclass(CodecError, NurseryJobsError)


async def test_error_names_the_path() -> None:
    with pytest.raises(CodecError) as info:
        encode_payload({"a": [1, 2, lambda: 0]})
    assert str(info.value) == "payload['a'][2]: cannot encode object of type 'function'"

    with pytest.raises(CodecError, match=r"^payload\[1\]\['x'\]\[0\]: .*'object'"):
        encode_payload([0, {"x": (object(),)}])
    with pytest.raises(CodecError, match=r"^payload\[\(1, 2\)\]: .*Plain'"):
        encode_payload({(1, 2): Plain()})
    with pytest.raises(CodecError, match=r"^payload\['s'\]<element .*'function'"):
        encode_payload({"s": {_function}})
    with pytest.raises(CodecError, match=r"^payload<key \(1, .*\)>\[1\]: .*'function'"):
        encode_payload({(1, _function): "v"})


async def test_cycle_in_list() -> None:
    value: list[Any] = [1]
    value.append([value])
    with pytest.raises(CodecError, match=r"^payload\[1\]\[0\]: cycle"):
        encode_payload(value)


async def test_cycle_in_dict() -> None:
    value: dict[str, Any] = {}
    value["self"] = value
    with pytest.raises(CodecError, match=r"^payload\['self'\]: cycle"):
        encode_payload(value)
    inner: dict[str, Any] = {}
    outer = {"t": (inner,)}
    inner["back"] = outer
    with pytest.raises(CodecError, match="cycle"):
        encode_payload(outer)


async def test_shared_but_acyclic_values_are_fine() -> None:
    shared = [1, 2]
    check({"a": shared, "b": shared, "c": (shared, shared)})


@pytest.mark.parametrize("kind", ["list", "tuple", "dict", "map"])
async def test_deep_nesting_is_refused(kind: str) -> None:
    value: Any = 0
    for _ in range(10_000):
        if kind == "list":
            value = [value]
        elif kind == "tuple":
            value = (value,)
        elif kind == "dict":
            value = {"k": value}
        else:
            value = {1: value}
    with pytest.raises(CodecError, match="nested deeper"):
        encode_payload(value)


def _at_stack_depth(frames: int, fn: Any) -> Any:
    return fn() if frames <= 0 else _at_stack_depth(frames - 1, fn)


async def test_deep_caller_stack_gives_codec_error_not_recursion_error() -> None:
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back
    room = sys.getrecursionlimit() - depth - 60
    value = nested_lists(_MAX_DEPTH)
    text = encode_payload(value)
    with pytest.raises(CodecError, match="nested too deeply"):
        _at_stack_depth(room, lambda: encode_payload(value))
    with pytest.raises(CodecError, match="recursion"):
        _at_stack_depth(room, lambda: decode_payload(text))


async def test_one_level_too_deep_is_refused() -> None:
    with pytest.raises(CodecError, match="nested deeper"):
        encode_payload(nested_lists(_MAX_DEPTH + 1))


async def test_oversized_payload() -> None:
    # The limit counts UTF-8 bytes of the encoded text; a str adds its two quotes.
    assert len(encode_payload("x" * (MAX_PAYLOAD_BYTES - 2)) or "") == MAX_PAYLOAD_BYTES
    with pytest.raises(CodecError, match="1,048,577 bytes"):
        encode_payload("x" * (MAX_PAYLOAD_BYTES - 1))
    half = (MAX_PAYLOAD_BYTES - 2) // 2
    encode_payload("é" * half)
    with pytest.raises(CodecError, match="exceeds the limit of 1,048,576 bytes"):
        encode_payload("é" * (half + 1))
    with pytest.raises(CodecError, match="bytes"):
        encode_payload({"blob": b"\x00" * MAX_PAYLOAD_BYTES})


# --- decoding errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[1,]",
        "1 2",
        "NaN",
        "-Infinity",
        '{"$t":"nope","v":1}',
        '{"$t":"tuple"}',
        '{"$t":"tuple","v":3}',
        '{"$t":"map","v":[1]}',
        '{"$t":"map","v":[[1],2]}',
        '{"$t":"float","v":"1.5"}',
        '{"$t":"int","v":"xyz"}',
        '{"$t":"datetime","v":"yesterday"}',
        '{"$t":"datetime","v":"2024-01-01T00:00:00","z":"Not/AZone"}',
        '{"$t":"decimal","v":"one"}',
        '{"$t":"bytes","v":"!!"}',
        '{"$t":"uuid","v":"u"}',
        '{"$t":"timedelta","v":[1,2]}',
        '{"$t":"pattern","v":"(","flags":0}',
        "[" * 10_000 + "]" * 10_000,
        '{"a":' * 10_000 + "1" + "}" * 10_000,
    ],
)
async def test_malformed_text(text: str) -> None:
    with pytest.raises(CodecError):
        decode_payload(text)


async def test_surrounding_whitespace_is_accepted() -> None:
    assert decode_payload('  {"a": [1, 2]}\n') == {"a": [1, 2]}


# --- the converter ----------------------------------------------------------------------------


async def test_converter_is_private() -> None:
    import cattrs

    assert converter is not cattrs.global_converter


@pytest.mark.parametrize(
    ("value", "t"),
    [
        ("false", bool),
        (2, bool),
        (1.0, bool),
        ("3", int),
        (True, int),
        (3.0, int),
        (1, str),
        (b"x", str),
        ("1.5", float),
        (True, float),
        (5, bytes),
        ("2024-01-01", date),
        ("(", re.Pattern),
        (3, re.Pattern),
    ],
)
async def test_converter_structure_is_strict(value: Any, t: type) -> None:
    with pytest.raises(CodecError):
        converter.structure(value, t)


async def test_converter_structures_exact_values() -> None:
    assert converter.structure(True, bool) is True
    assert converter.structure(0, bool) is False  # SQLite stores booleans as 0/1
    assert converter.structure(3, float) == 3.0
    assert type(converter.structure(3, float)) is float
    assert converter.structure("x", str) == "x"
    pattern = re.compile("a+", re.I)
    assert converter.structure(pattern, re.Pattern) is pattern
    assert converter.structure("a+", re.Pattern[str]) == re.compile("a+")


@attrs.frozen(kw_only=True)
class Sample:
    name: str
    count: int
    ratio: float
    on: bool
    when: datetime
    pattern: re.Pattern[str]
    tags: frozenset[str]


async def test_converter_records_round_trip_through_the_codec() -> None:
    record = Sample(
        name="n",
        count=3,
        ratio=0.5,
        on=False,
        when=datetime(2024, 1, 1, tzinfo=IST),
        pattern=re.compile("x+", re.I),
        tags=frozenset({"a"}),
    )
    text = encode_payload(converter.unstructure(record))
    assert converter.structure(decode_payload(text), Sample) == record


async def test_converter_rejects_a_bad_record() -> None:
    with pytest.raises(Exception) as info:
        converter.structure(
            {
                "name": "n",
                "count": "3",
                "ratio": 0.5,
                "on": "false",
                "when": None,
                "pattern": "x",
                "tags": [],
            },
            Sample,
        )
    assert any(isinstance(e, CodecError) for e in _leaves(info.value))


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


# --- property ---------------------------------------------------------------------------------

texts = st.text() | st.builds(lambda a, b: a + "\ud800" + b, st.text(), st.text())
ints = st.integers() | st.integers(min_value=2**1990, max_value=2**2100).map(lambda n: -n)
fixed_zones = st.builds(
    timezone, st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23))
)
hashable_leaves = (
    st.none()
    | st.booleans()
    | ints
    | st.floats(allow_nan=False)
    | texts
    | st.binary()
    | st.dates()
    | st.datetimes(timezones=st.none() | fixed_zones | st.timezones())
    | st.timedeltas()
    | st.decimals(allow_nan=False)
    | st.uuids()
)
hashables = st.recursive(
    hashable_leaves,
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
leaves = hashable_leaves | st.sampled_from(
    [re.compile("a+"), re.compile(rb"[\x00-\x7f]", re.S), re.compile("x", re.I | re.M)]
)
payloads = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(texts, inner, max_size=4)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads)
async def test_round_trip_property(value: Any) -> None:
    out = round_trip(value)
    assert out == value
    assert_same(out, value)
