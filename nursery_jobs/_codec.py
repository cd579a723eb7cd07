"""The payload codec: tagged JSON text for job payloads and stub calls, and the one
cattrs converter for records.

Values JSON cannot hold exactly are written as ``{"$t": <tag>, "v": ...}`` objects. The
library's public records (``Job``, ``QueueItem``...) are registered by the floors that
define them (``register_record``) and written as ``{"$t": "record", "n": <name>, "v":
{field: value}}``; text decodes only to a registered class, never to an arbitrary one.
A stub call's arguments and result are copied through this codec on every engine
(``copy_arguments``, ``copy_result``; ``encode_call`` is the cross-host envelope).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum
from typing import Any, Final
from uuid import UUID
from zoneinfo import ZoneInfo

import attrs
import cattrs

from nursery_jobs._errors import CallCodecError, CodecError, describe_error, safe_repr

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "converter",
    "copy_arguments",
    "copy_result",
    "decode_call",
    "decode_payload",
    "encode_call",
    "encode_payload",
    "encode_result",
    "register_record",
]

MAX_PAYLOAD_BYTES: Final = 1_048_576
"""The largest encoded payload, in bytes of UTF-8 (1 MiB)."""

_TAG: Final = "$t"

# Containers deeper than this are refused. Each level can cost two levels of JSON (a tagged
# object and its list) and, on 3.11, the C json scanner shares the Python recursion limit
# (1000) with whatever stack the caller already has; 200 keeps decoding well clear of it.
_MAX_DEPTH: Final = 200
_TOO_DEEP: Final = f"containers nested deeper than {_MAX_DEPTH} levels"

# Ints at least this large are written as hex: int -> decimal str is capped by
# sys.set_int_max_str_digits (4300 digits by default, and it can be lowered to 640).
# 2**2000 has 603 digits, so the cap can never be hit whatever it is set to; hex is exempt.
_BIG_INT: Final = 1 << 2000


# Built once: json.dumps/json.loads build a new encoder/decoder on every call given options,
# and JSONEncoder.encode builds a new C encoder per call too; the prebuilt C encoder halves
# the cost of a small payload. check_circular is off because _encode has already refused
# cycles. Lone surrogates cannot be stored as UTF-8; escaped as \udXXX they are plain ASCII,
# and the decoder turns the escapes back into the same lone surrogates.
def _json_encoder(ensure_ascii: bool) -> Callable[[object], str]:
    options = json.JSONEncoder(
        ensure_ascii=ensure_ascii, separators=(",", ":"), allow_nan=False, check_circular=False
    )
    # The C accelerator, as json.encoder itself finds it; None when there is none.
    make: Any = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return options.encode
    escape: Any = getattr(
        json.encoder, "c_encode_basestring_ascii" if ensure_ascii else "c_encode_basestring"
    )
    chunks = make(None, options.default, escape, None, ":", ",", False, False, False)
    return lambda tree: "".join(chunks(tree, 0))


_to_text: Final = _json_encoder(ensure_ascii=False)
_to_ascii_text: Final = _json_encoder(ensure_ascii=True)


class _Refusal(Exception):
    """A value cannot be encoded.

    On the way out each container adds its path step and itself, innermost first.
    """

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.parts: list[str] = []
        self.containers: list[object] = []

    def add(self, container: object, part: str) -> None:
        self.containers.append(container)
        self.parts.append(part)

    def message(self, root: str = "payload") -> str:
        parts = self.parts[::-1]
        if self.problem == _TOO_DEEP:
            # A cycle is only ever found as nesting too deep (the walk keeps no set of
            # containers in progress, which saves a third of its time); the path taken shows
            # whether the same container came back.
            seen: set[int] = set()
            for step, container in enumerate(reversed(self.containers)):
                if id(container) in seen:
                    name = type(container).__name__
                    return (f"{_render_path(parts[:step], root)}: cycle: this {name}"
                            " contains itself")
                seen.add(id(container))
        return f"{_render_path(parts, root)}: {self.problem}"


# --- encoding ------------------------------------------------------------------------------


def encode_payload(value: object) -> str | None:
    """Encode a payload as compact JSON text; ``None`` encodes to ``None`` (SQL NULL).

    Does not checkpoint.

    Raises:
        CodecError: the payload holds a value of an unsupported type, a cycle, containers
            nested more than 200 deep, or encodes to more than 1 MiB.
    """
    if value is None:
        return None
    try:
        tree = _encode(value, 0)
    except _Refusal as refusal:
        raise CodecError(refusal.message()) from None
    except RecursionError:
        raise CodecError("payload: nested too deeply to encode from this stack depth") from None
    text, size = _text_of(tree)
    if size > MAX_PAYLOAD_BYTES:
        raise CodecError(
            f"payload: encoded size {size:,} bytes exceeds the limit of "
            f"{MAX_PAYLOAD_BYTES:,} bytes (1 MiB)"
        )
    return text


def _text_of(tree: object) -> tuple[str, int]:
    """The JSON text of a tree and its size in bytes of UTF-8."""
    text = _to_text(tree)
    if text.isascii():
        return text, len(text)
    try:
        return text, len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a str holds a lone surrogate
        text = _to_ascii_text(tree)
        return text, len(text)


def _encode(value: Any, depth: int) -> object:
    """Return a JSON-native tree for ``value``, refusing what cannot round-trip."""
    t = type(value)
    # Exact type checks: subclasses (IntEnum, StrEnum, OrderedDict...) must not pass as the
    # base type, or they would decode as something else. bool is its own exact type.
    if t is str or t is bool or value is None:
        return value
    if t is int:
        if -_BIG_INT < value < _BIG_INT:
            return value
        return {_TAG: "int", "v": format(value, "x")}
    if t is float:
        if math.isfinite(value):
            return value
        return {_TAG: "float", "v": repr(value)}  # 'nan', 'inf' or '-inf'
    handler = _ENCODERS.get(t)
    if handler is None:
        raise _Refusal(_cannot_encode(value))
    return handler(value, depth)


# The container loops below pass these item types through without a call to _encode: a
# call per item is most of the cost of a flat payload.
_AS_IS: Final = frozenset({str, bool, type(None)})


def _encode_items(value: Any, depth: int) -> list[object]:
    """Encode the items of a list, tuple, set or frozenset, in iteration order."""
    if depth >= _MAX_DEPTH:
        raise _Refusal(_TOO_DEEP)
    depth += 1
    out: list[object] = []
    item: object = None
    try:
        for item in value:
            out.append(item if type(item) in _AS_IS else _encode(item, depth))
    except _Refusal as refusal:
        if type(value) is list or type(value) is tuple:
            refusal.add(value, f"[{len(out)}]")  # the items before it were all appended
        else:
            refusal.add(value, f"<element {_short_repr(item)}>")
        raise
    return out


def _encode_tuple(value: Any, depth: int) -> object:
    return {_TAG: "tuple", "v": _encode_items(value, depth)}


def _encode_set(value: Any, depth: int) -> object:
    return {_TAG: "set", "v": _encode_items(value, depth)}


def _encode_frozenset(value: Any, depth: int) -> object:
    return {_TAG: "frozenset", "v": _encode_items(value, depth)}


def _encode_dict(value: dict[Any, Any], depth: int) -> object:
    """A JSON object while every key is a str other than the tag; else a flat pair list.

    One pass: on the first key that a JSON object cannot hold, the entries done so far are
    moved into the pair list and the same iterator carries on.
    """
    if depth >= _MAX_DEPTH:
        raise _Refusal(_TOO_DEEP)
    depth += 1
    out: dict[str, object] = {}
    key: object = None
    in_key = False
    items = iter(value.items())
    try:
        for key, item in items:
            if type(key) is not str or key == _TAG:
                break
            out[key] = item if type(item) in _AS_IS else _encode(item, depth)
        else:
            return out
        # Pair mode, starting with the entry that broke the loop above.
        pairs: list[object] = []
        for done in out.items():
            pairs.extend(done)
        in_key = True
        pairs.append(_encode(key, depth))
        in_key = False
        pairs.append(_encode(item, depth))
        for key, item in items:
            in_key = True
            pairs.append(_encode(key, depth))
            in_key = False
            pairs.append(_encode(item, depth))
    except _Refusal as refusal:
        if in_key:
            refusal.add(value, f"<key {_short_repr(key)}>")
        else:
            refusal.add(value, f"[{_short_repr(key)}]")
        raise
    return {_TAG: "map", "v": pairs}


def _encode_datetime(value: datetime, depth: int) -> object:
    # isoformat keeps the UTC offset (seconds and microseconds too), so any other tzinfo
    # decodes as a fixed-offset datetime.timezone. A ZoneInfo zone also keeps its key, and the
    # decoder puts the same wall time and fold back in that zone: datetimes sharing a tzinfo
    # compare by wall time, so restoring the instant would not be equal across a DST gap.
    tz = value.tzinfo
    try:  # (a tzinfo is user code: its utcoffset may raise, or be a day or more off)
        text = value.isoformat()
        offset = None if tz is None else value.utcoffset()
    except Exception as exc:
        raise _Refusal(
            f"a datetime whose tzinfo ({safe_repr(tz, 60)}) gives no usable UTC offset:"
            f" {describe_error(exc, 200)}"
        ) from None
    encoded: dict[str, object] = {_TAG: "datetime", "v": text}
    if type(tz) is ZoneInfo and tz.key is not None:
        encoded["z"] = tz.key
    elif tz is not None:
        if offset is not None and offset.microseconds:
            # 3.11's fromisoformat drops an offset like +00:00:00.000001; keep it exactly.
            encoded["o"] = [offset.days, offset.seconds, offset.microseconds]
    if value.fold:
        encoded["fold"] = 1
    return encoded


def _encode_date(value: date, depth: int) -> object:
    return {_TAG: "date", "v": value.isoformat()}


def _encode_timedelta(value: timedelta, depth: int) -> object:
    return {_TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}


def _encode_decimal(value: Decimal, depth: int) -> object:
    return {_TAG: "decimal", "v": str(value)}  # exact, incl. NaN, sNaN, Infinity, -0


def _encode_uuid(value: UUID, depth: int) -> object:
    return {_TAG: "uuid", "v": str(value)}


def _encode_bytes(value: bytes, depth: int) -> object:
    return {_TAG: "bytes", "v": base64.b64encode(value).decode("ascii")}


def _encode_pattern(value: re.Pattern[Any], depth: int) -> object:
    source = value.pattern
    encoded = _encode_bytes(source, depth) if type(source) is bytes else source
    return {_TAG: "pattern", "v": encoded, "flags": value.flags}


_ENCODERS: Final[dict[type, Callable[[Any, int], object]]] = {
    dict: _encode_dict,
    list: _encode_items,
    tuple: _encode_tuple,
    set: _encode_set,
    frozenset: _encode_frozenset,
    datetime: _encode_datetime,
    date: _encode_date,
    timedelta: _encode_timedelta,
    Decimal: _encode_decimal,
    UUID: _encode_uuid,
    bytes: _encode_bytes,
    re.Pattern: _encode_pattern,
}


# --- records ---------------------------------------------------------------------------
# The library's public records a payload may hold (a stub call returns them): name ->
# class, and class -> (name, (attribute, init argument) of each field). The floors that
# define records fill it at import (this module is the ground floor: it imports none).
_RECORDS: Final[dict[str, type]] = {}
_RECORD_FIELDS: Final[dict[type, tuple[str, tuple[tuple[str, str], ...]]]] = {}


def register_record(cls: type, name: str) -> None:
    """Let payloads hold instances of the attrs record ``cls``, written with ``name``
    (and decoded only to ``cls``). Each field must hold a payload value. Does not
    checkpoint.

    Raises:
        TypeError: ``cls`` is not an attrs class.
        ValueError: ``name`` is registered for another class.
    """
    if not attrs.has(cls):
        raise TypeError(f"register_record: {_type_name(cls)} is not an attrs class")
    held = _RECORDS.get(name)
    if held is not None and held is not cls and _type_name(held) != _type_name(cls):
        raise ValueError(f"register_record: {name!r} is already {_type_name(held)}")
    if held is not None:
        _ENCODERS.pop(held, None)
        _RECORD_FIELDS.pop(held, None)
    fields = tuple((a.name, a.alias) for a in attrs.fields(cls) if a.init)
    _RECORDS[name] = cls
    _RECORD_FIELDS[cls] = (name, fields)
    _ENCODERS[cls] = _encode_record


def _encode_record(value: Any, depth: int) -> object:
    if depth >= _MAX_DEPTH:
        raise _Refusal(_TOO_DEEP)
    depth += 1
    name, fields = _RECORD_FIELDS[type(value)]
    out: dict[str, object] = {}
    attribute = ""
    try:
        for attribute, init in fields:
            item = getattr(value, attribute)
            out[init] = item if type(item) in _AS_IS else _encode(item, depth)
    except _Refusal as refusal:
        refusal.add(value, f".{attribute}")
        raise
    return {_TAG: "record", "n": name, "v": out}


def _type_name(t: type) -> str:
    if t.__module__ == "builtins":
        return t.__qualname__
    return f"{t.__module__}.{t.__qualname__}"


def _cannot_encode(value: object) -> str:
    message = f"cannot encode object of type {_type_name(type(value))!r}"
    if isinstance(value, Enum):
        message += " (enum members are refused; store their value)"
    elif isinstance(value, (int, float, str, bytes, list, tuple, dict, set, frozenset)):
        message += " (subclasses of built-in types are refused)"
    return message


def _short_repr(value: object) -> str:
    text = safe_repr(value)  # (a datetime key's repr holds its tzinfo's: user code)
    return text if len(text) <= 60 else text[:57] + "..."


def _render_path(parts: list[str], root: str = "payload") -> str:
    path = root + "".join(parts)
    return path if len(path) <= 300 else path[:200] + "..." + path[-80:]


def content_text(value: object) -> str:
    """A text of ``value`` that is the same for equal values: dict entries and set
    members in sorted order (by their own canonical text), whatever the insertion order
    or the hash seed. For content hashes (the Scheduler's dedupe), never for storage.

    Raises:
        CodecError: as ``encode_payload``.
    """
    text = encode_payload(value)
    if text is None:
        return "null"
    return _canonical_json(_canonical(json.loads(text)))


def _canonical(tree: Any) -> Any:
    """Sort a JSON-native tree's unordered parts: object keys (by ``_canonical_json``),
    the members of a set or frozenset, and the entries of a map with non-str keys."""
    if type(tree) is list:
        return [_canonical(item) for item in tree]
    if type(tree) is not dict:
        return tree
    kind = tree.get(_TAG)
    if kind in ("set", "frozenset"):
        return {_TAG: kind, "v": sorted((_canonical(m) for m in tree["v"]), key=_canonical_json)}
    if kind == "map":
        flat = tree["v"]
        pairs = sorted(((_canonical(k), _canonical(v)) for k, v in zip(flat[::2], flat[1::2],
                                                                       strict=True)),
                       key=lambda pair: _canonical_json(pair[0]))
        return {_TAG: "map", "v": [x for pair in pairs for x in pair]}
    return {key: _canonical(item) for key, item in tree.items()}


def _canonical_json(tree: Any) -> str:
    # (As encode_payload writes it where nothing needed sorting: the same hashes as
    # before for such payloads.)
    return json.dumps(tree, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- decoding ------------------------------------------------------------------------------


def decode_payload(text: str | None) -> object:
    """Decode text made by :func:`encode_payload`; ``None`` decodes to ``None``.

    Does not checkpoint.

    Raises:
        CodecError: the text is not a payload this codec wrote.
    """
    if text is None:
        return None
    try:
        # The scanner alone skips JSONDecoder.decode's two whitespace regex matches (a third
        # of the cost of a small payload); anything it does not consume whole, e.g. text
        # with surrounding whitespace or an error, goes through decode() for its checks.
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            end = -1
        if end == len(text):
            return value
        return _DECODER.decode(text)
    except CodecError:
        raise
    except Exception as exc:  # whatever malformed text makes a constructor raise
        raise CodecError(f"payload text cannot be decoded: {exc}") from exc


def _decode_object(obj: dict[str, Any]) -> object:
    """json object_hook: only objects holding the tag key need any work."""
    if _TAG not in obj:
        return obj
    decoder = _DECODERS.get(obj[_TAG])
    if decoder is None:
        raise CodecError(f"payload text has an unknown tag {obj[_TAG]!r}")
    return decoder(obj["v"], obj)


def _expect(value: object, t: type, tag: str) -> Any:
    if type(value) is not t:
        raise CodecError(f"payload text has a malformed {tag!r} value: {_short_repr(value)}")
    return value


def _decode_map(v: object, obj: dict[str, Any]) -> object:
    flat = _expect(v, list, "map")
    if len(flat) % 2:
        raise CodecError("payload text has a 'map' with an odd number of items")
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def _decode_int(v: object, obj: dict[str, Any]) -> object:
    return int(_expect(v, str, "int"), 16)


def _decode_float(v: object, obj: dict[str, Any]) -> object:
    if v not in ("nan", "inf", "-inf"):
        raise CodecError(f"payload text has a malformed 'float' value: {_short_repr(v)}")
    return float(_expect(v, str, "float"))


def _decode_datetime(v: object, obj: dict[str, Any]) -> object:
    value = datetime.fromisoformat(_expect(v, str, "datetime"))
    zone = obj.get("z")
    if zone is not None:
        value = value.replace(tzinfo=ZoneInfo(_expect(zone, str, "datetime")))
    offset = obj.get("o")
    if offset is not None:
        value = value.replace(tzinfo=timezone(_decode_timedelta(offset, obj)))
    if obj.get("fold"):
        value = value.replace(fold=1)
    return value


def _decode_timedelta(v: object, obj: dict[str, Any]) -> timedelta:
    days, seconds, microseconds = _expect(v, list, "timedelta")
    return timedelta(days=days, seconds=seconds, microseconds=microseconds)


def _decode_pattern(v: object, obj: dict[str, Any]) -> object:
    if type(v) is not str and type(v) is not bytes:
        raise CodecError(f"payload text has a malformed 'pattern' value: {_short_repr(v)}")
    return re.compile(v, _expect(obj["flags"], int, "pattern"))


def _decode_record(v: object, obj: dict[str, Any]) -> object:
    name = obj.get("n")
    cls = _RECORDS.get(name) if type(name) is str else None
    if cls is None:
        raise CodecError(f"payload text holds a record of an unknown kind: {_short_repr(name)}")
    fields = _expect(v, dict, "record")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"payload text holds a malformed {name!r} record: {exc}") from None


def _refuse_constant(name: str) -> object:
    raise CodecError(f"payload text holds the non-JSON constant {name}")


_DECODERS: Final[dict[str, Callable[[Any, dict[str, Any]], object]]] = {
    "map": _decode_map,
    "int": _decode_int,
    "float": _decode_float,
    "tuple": lambda v, obj: tuple(_expect(v, list, "tuple")),
    "set": lambda v, obj: set(_expect(v, list, "set")),
    "frozenset": lambda v, obj: frozenset(_expect(v, list, "frozenset")),
    "datetime": _decode_datetime,
    "date": lambda v, obj: date.fromisoformat(_expect(v, str, "date")),
    "timedelta": _decode_timedelta,
    "decimal": lambda v, obj: Decimal(_expect(v, str, "decimal")),
    "uuid": lambda v, obj: UUID(_expect(v, str, "uuid")),
    "bytes": lambda v, obj: base64.b64decode(_expect(v, str, "bytes"), validate=True),
    "pattern": _decode_pattern,
    "record": _decode_record,
}

_DECODER: Final = json.JSONDecoder(object_hook=_decode_object, parse_constant=_refuse_constant)
# The C scanner that JSONDecoder.decode calls (typeshed does not declare the attribute).
_scan: Final[Callable[[str, int], tuple[object, int]]] = _DECODER.scan_once  # type: ignore[attr-defined]


# --- stub calls ----------------------------------------------------------------------------
# A call's arguments and result are copied through the codec on every engine (DESIGN
# section 2). Immutable scalars, and flat tuples of them, need no copy: a typical call
# passes them as they are (an upper bound on their encoded size keeps the 1 MiB limit
# the same on every path). Ints of 64 bits at most: a larger one is costed exactly by
# the encoder.
_SMALL_INT: Final = 1 << 63
_SCALAR_COST: Final = 32  # a float's repr, a tagged 'inf', true, null: at most this


def _plain_cost(value: object) -> int:
    """An upper bound on the encoded size of an immutable value that needs no copy
    (None, bool, int, float, str, bytes, or a flat tuple of them); -1 for any other."""
    t = type(value)
    if t is str:
        # (At most \uXXXX\uXXXX per char: text holding a lone surrogate is written as
        # ASCII, where a char beyond the BMP is a surrogate pair; 6 let such calls
        # through locally that the cross-host envelope refuses.)
        return 12 * len(value) + 2  # type: ignore[arg-type]
    if t is int:
        return _SCALAR_COST if -_SMALL_INT < value < _SMALL_INT else -1  # type: ignore[operator]
    if t is float or t is bool or value is None:
        return _SCALAR_COST
    if t is bytes:
        return 4 * len(value) // 3 + _SCALAR_COST  # type: ignore[arg-type]
    if t is tuple:
        cost = _SCALAR_COST
        for item in value:  # type: ignore[attr-defined]
            if type(item) is tuple:
                return -1
            item_cost = _plain_cost(item)
            if item_cost < 0:
                return -1
            cost += item_cost + 1
        return cost
    return -1


def _call_refusal(method: str, part: str, refusal: _Refusal) -> CallCodecError:
    return CallCodecError(f"{method}: {refusal.message(part)}", method, part)


def _encode_part(value: object, method: str, part: str) -> object:
    try:
        return _encode(value, 0)
    except _Refusal as refusal:
        raise _call_refusal(method, part, refusal) from None
    except RecursionError:
        raise CallCodecError(f"{method}: {part}: nested too deeply to encode from this stack"
                             " depth", method, part) from None


def encode_call(
    args: tuple[Any, ...], kwargs: dict[str, Any], chain: tuple[str, ...], method: str,
    *, place: bool = False, trace: str | None = None,
) -> str:
    """The envelope of a stub call ``method`` (``ns/id.name()``, for messages): its
    arguments and call chain, as payload text; ``place``: the host it is sent to takes
    the object if nobody holds it (a call from a ``client_only`` runtime); ``trace``:
    the caller's span context (tracing on), so the call's span there is its child. Does
    not checkpoint.

    Raises:
        CallCodecError: an argument cannot be encoded (``part`` says which:
            ``args[0]``, ``kwargs['by']``), or all of them encode to more than 1 MiB.
    """
    positional = [_encode_part(arg, method, f"args[{i}]") for i, arg in enumerate(args)]
    named: dict[str, object] = {
        key: _encode_part(value, method, f"kwargs[{key!r}]") for key, value in kwargs.items()
    }
    keywords: object = named
    if _TAG in named:  # (**{"$t": ...}: as _encode_dict writes a dict it cannot key)
        keywords = {_TAG: "map", "v": [x for pair in named.items() for x in pair]}
    envelope: list[object] = [positional, keywords, list(chain)]
    if place or trace is not None:
        envelope.append(1 if place else 0)
    if trace is not None:
        envelope.append(trace)
    text, size = _text_of(envelope)
    if size > MAX_PAYLOAD_BYTES:
        raise CallCodecError(
            f"{method}: the arguments encode to {size:,} bytes, over the limit of"
            f" {MAX_PAYLOAD_BYTES:,} bytes (1 MiB)", method, "arguments")
    return text


def decode_call(
    text: str,
) -> tuple[tuple[Any, ...], dict[str, Any], tuple[str, ...], bool, str | None]:
    """Arguments, keyword arguments, call chain, ``place`` and ``trace`` of an envelope
    from ``encode_call``.

    Raises:
        CodecError: the text is not such an envelope.
    """
    envelope = decode_payload(text)
    if type(envelope) is not list or not 2 <= len(envelope) <= 5:
        raise CodecError("call envelope: not [args, kwargs, chain]")
    args, kwargs, *rest = envelope
    # (Each part checked: a forged row's chain of 5 raised TypeError, not CodecError.)
    chain = rest[0] if rest else []
    if (type(args) is not list or type(kwargs) is not dict or type(chain) is not list
            or any(type(turn) is not str for turn in chain)
            or (len(rest) > 1 and rest[1] not in (0, 1))
            or (len(rest) > 2 and type(rest[2]) is not str)):
        raise CodecError("call envelope: not [args, kwargs, chain, place, trace]")
    trace = rest[2] if len(rest) > 2 else None
    return tuple(args), kwargs, tuple(chain), len(rest) > 1 and rest[1] == 1, trace


def copy_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], method: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's arguments as the object receives them: a copy through the codec, or
    themselves where they are immutable scalars. Does not checkpoint.

    Raises:
        CallCodecError: as ``encode_call``.
    """
    cost = 0
    for arg in args:
        arg_cost = _plain_cost(arg)
        if arg_cost < 0:
            break
        cost += arg_cost
    else:
        for key, value in kwargs.items():
            value_cost = _plain_cost(value)
            if value_cost < 0:
                break
            cost += value_cost + 12 * len(key) + 4
        else:
            if cost <= MAX_PAYLOAD_BYTES - 64:
                return args, kwargs
    copied, named, *_ = decode_call(encode_call(args, kwargs, (), method))
    return copied, named


def encode_result(value: object, method: str) -> str | None:
    """The result of a stub call ``method`` as payload text (None for None).

    Raises:
        CallCodecError: the result cannot be encoded (``part`` is ``result``).
    """
    if value is None:
        return None
    text, size = _text_of(_encode_part(value, method, "result"))
    if size > MAX_PAYLOAD_BYTES:
        raise CallCodecError(
            f"{method}: the result encodes to {size:,} bytes, over the limit of"
            f" {MAX_PAYLOAD_BYTES:,} bytes (1 MiB)", method, "result")
    return text


def copy_result(value: object, method: str) -> object:
    """A call's result as the caller receives it: a copy through the codec, or itself
    where it is an immutable scalar. Does not checkpoint.

    Raises:
        CallCodecError: as ``encode_result``.
    """
    if 0 <= _plain_cost(value) <= MAX_PAYLOAD_BYTES:
        return value
    return decode_payload(encode_result(value, method))


# --- the converter for records -------------------------------------------------------------

converter: Final = cattrs.Converter()
"""The library's one cattrs converter (never the global one), with strict scalar hooks.

Structuring never coerces: ``"false"`` is not a bool and ``"3"`` is not an int. The only
conversions are int -> float (lossless for the values records hold) and the ints 0 and 1 ->
bool (SQLite stores booleans as 0/1). Payload types such as ``datetime`` unstructure to
themselves; :func:`encode_payload` stores them.
"""


def _strict(t: type) -> Callable[[object, object], Any]:
    def structure(value: object, _: object) -> Any:
        if type(value) is not t:
            raise CodecError(
                f"expected {_type_name(t)}, got {_type_name(type(value))}: {_short_repr(value)}"
            )
        return value

    structure.__name__ = f"structure_{t.__name__}"
    return structure


def _structure_float(value: object, _: object) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise CodecError(f"expected float, got {_type_name(type(value))}: {_short_repr(value)}")


def _structure_bool(value: object, _: object) -> bool:
    if type(value) is bool:
        return value
    if type(value) is int and (value == 0 or value == 1):
        return bool(value)
    raise CodecError(f"expected bool, got {_type_name(type(value))}: {_short_repr(value)}")


def _is_pattern(t: object) -> bool:
    return t is re.Pattern or getattr(t, "__origin__", None) is re.Pattern


def _structure_pattern(value: object, _: object) -> re.Pattern[Any]:
    if type(value) is re.Pattern:
        return value
    if type(value) is str:
        try:
            return re.compile(value)
        except re.error as exc:
            raise CodecError(f"expected a regular expression, got {value!r}: {exc}") from exc
    raise CodecError(f"expected re.Pattern or str, got {_type_name(type(value))}")


for _t in (str, int, bytes, datetime, date, timedelta, Decimal, UUID):
    converter.register_structure_hook(_t, _strict(_t))
converter.register_structure_hook(float, _structure_float)
converter.register_structure_hook(bool, _structure_bool)
converter.register_structure_hook_func(_is_pattern, _structure_pattern)
converter.register_unstructure_hook_func(_is_pattern, lambda pattern: pattern)
del _t
