"""The payload codec: tagged JSON text for job payloads, stored values and stub calls.
(The stub-call envelope is ``_call_codec``; the one cattrs converter for records,
``_converter``.)

Values JSON cannot hold exactly are written as ``{"$t": <tag>, "v": ...}`` objects. The
library's public records (``Job``, ``QueueItem``...) are registered by the floors that
define them (``register_record``) and written as ``{"$t": "record", "n": <name>, "v":
{field: value}}``; text decodes only to a registered class, never to an arbitrary one.
A stub call's arguments and result are copied through this codec on every engine
(``_call_codec``).
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

from nursery_jobs._errors import CodecError, describe_error, safe_repr

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "TAG",
    "Refusal",
    "content_text",
    "decode_payload",
    "encode_payload",
    "encode_tree",
    "register_record",
    "short_repr",
    "tree_text",
    "type_name",
]

MAX_PAYLOAD_BYTES: Final = 1_048_576
"""The largest encoded payload, in bytes of UTF-8 (1 MiB)."""

TAG: Final = "$t"

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


class Refusal(Exception):
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
    except Refusal as refusal:
        raise CodecError(refusal.message()) from None
    except RecursionError:
        raise CodecError("payload: nested too deeply to encode from this stack depth") from None
    text, size = tree_text(tree)
    if size > MAX_PAYLOAD_BYTES:
        raise CodecError(
            f"payload: encoded size {size:,} bytes exceeds the limit of "
            f"{MAX_PAYLOAD_BYTES:,} bytes (1 MiB)"
        )
    return text


def encode_tree(value: object) -> object:
    """A JSON-native tree for ``value`` (``tree_text`` writes it). Does not checkpoint.

    Raises:
        Refusal: a value cannot be encoded (``Refusal.message`` says where and why).
        RecursionError: nested too deeply for this stack.
    """
    return _encode(value, 0)


def tree_text(tree: object) -> tuple[str, int]:
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
        return {TAG: "int", "v": format(value, "x")}
    if t is float:
        if math.isfinite(value):
            return value
        return {TAG: "float", "v": repr(value)}  # 'nan', 'inf' or '-inf'
    handler = _ENCODERS.get(t)
    if handler is None:
        raise Refusal(_cannot_encode(value))
    return handler(value, depth)


# The container loops below pass these item types through without a call to _encode: a
# call per item is most of the cost of a flat payload.
_AS_IS: Final = frozenset({str, bool, type(None)})


def _encode_items(value: Any, depth: int) -> list[object]:
    """Encode the items of a list, tuple, set or frozenset, in iteration order."""
    if depth >= _MAX_DEPTH:
        raise Refusal(_TOO_DEEP)
    depth += 1
    out: list[object] = []
    item: object = None
    try:
        for item in value:
            out.append(item if type(item) in _AS_IS else _encode(item, depth))
    except Refusal as refusal:
        if type(value) is list or type(value) is tuple:
            refusal.add(value, f"[{len(out)}]")  # the items before it were all appended
        else:
            refusal.add(value, f"<element {short_repr(item)}>")
        raise
    return out


def _encode_tuple(value: Any, depth: int) -> object:
    return {TAG: "tuple", "v": _encode_items(value, depth)}


def _encode_set(value: Any, depth: int) -> object:
    return {TAG: "set", "v": _encode_items(value, depth)}


def _encode_frozenset(value: Any, depth: int) -> object:
    return {TAG: "frozenset", "v": _encode_items(value, depth)}


def _encode_dict(value: dict[Any, Any], depth: int) -> object:
    """A JSON object while every key is a str other than the tag; else a flat pair list.

    One pass: on the first key that a JSON object cannot hold, the entries done so far are
    moved into the pair list and the same iterator carries on.
    """
    if depth >= _MAX_DEPTH:
        raise Refusal(_TOO_DEEP)
    depth += 1
    out: dict[str, object] = {}
    key: object = None
    in_key = False
    items = iter(value.items())
    try:
        for key, item in items:
            if type(key) is not str or key == TAG:
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
    except Refusal as refusal:
        if in_key:
            refusal.add(value, f"<key {short_repr(key)}>")
        else:
            refusal.add(value, f"[{short_repr(key)}]")
        raise
    return {TAG: "map", "v": pairs}


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
        raise Refusal(
            f"a datetime whose tzinfo ({safe_repr(tz, 60)}) gives no usable UTC offset:"
            f" {describe_error(exc, 200)}"
        ) from None
    encoded: dict[str, object] = {TAG: "datetime", "v": text}
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
    return {TAG: "date", "v": value.isoformat()}


def _encode_timedelta(value: timedelta, depth: int) -> object:
    return {TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}


def _encode_decimal(value: Decimal, depth: int) -> object:
    return {TAG: "decimal", "v": str(value)}  # exact, incl. NaN, sNaN, Infinity, -0


def _encode_uuid(value: UUID, depth: int) -> object:
    return {TAG: "uuid", "v": str(value)}


def _encode_bytes(value: bytes, depth: int) -> object:
    return {TAG: "bytes", "v": base64.b64encode(value).decode("ascii")}


def _encode_pattern(value: re.Pattern[Any], depth: int) -> object:
    source = value.pattern
    encoded = _encode_bytes(source, depth) if type(source) is bytes else source
    return {TAG: "pattern", "v": encoded, "flags": value.flags}


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
        raise TypeError(f"register_record: {type_name(cls)} is not an attrs class")
    held = _RECORDS.get(name)
    if held is not None and held is not cls and type_name(held) != type_name(cls):
        raise ValueError(f"register_record: {name!r} is already {type_name(held)}")
    if held is not None:
        _ENCODERS.pop(held, None)
        _RECORD_FIELDS.pop(held, None)
    fields = tuple((a.name, a.alias) for a in attrs.fields(cls) if a.init)
    _RECORDS[name] = cls
    _RECORD_FIELDS[cls] = (name, fields)
    _ENCODERS[cls] = _encode_record


def _encode_record(value: Any, depth: int) -> object:
    if depth >= _MAX_DEPTH:
        raise Refusal(_TOO_DEEP)
    depth += 1
    name, fields = _RECORD_FIELDS[type(value)]
    out: dict[str, object] = {}
    attribute = ""
    try:
        for attribute, init in fields:
            item = getattr(value, attribute)
            out[init] = item if type(item) in _AS_IS else _encode(item, depth)
    except Refusal as refusal:
        refusal.add(value, f".{attribute}")
        raise
    return {TAG: "record", "n": name, "v": out}


def type_name(t: type) -> str:
    if t.__module__ == "builtins":
        return t.__qualname__
    return f"{t.__module__}.{t.__qualname__}"


def _cannot_encode(value: object) -> str:
    message = f"cannot encode object of type {type_name(type(value))!r}"
    if isinstance(value, Enum):
        message += " (enum members are refused; store their value)"
    elif isinstance(value, (int, float, str, bytes, list, tuple, dict, set, frozenset)):
        message += " (subclasses of built-in types are refused)"
    return message


def short_repr(value: object) -> str:
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
    kind = tree.get(TAG)
    if kind in ("set", "frozenset"):
        return {TAG: kind, "v": sorted((_canonical(m) for m in tree["v"]), key=_canonical_json)}
    if kind == "map":
        flat = tree["v"]
        pairs = sorted(((_canonical(k), _canonical(v)) for k, v in zip(flat[::2], flat[1::2],
                                                                       strict=True)),
                       key=lambda pair: _canonical_json(pair[0]))
        return {TAG: "map", "v": [x for pair in pairs for x in pair]}
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
    if TAG not in obj:
        return obj
    decoder = _DECODERS.get(obj[TAG])
    if decoder is None:
        raise CodecError(f"payload text has an unknown tag {obj[TAG]!r}")
    return decoder(obj["v"], obj)


def _expect(value: object, t: type, tag: str) -> Any:
    if type(value) is not t:
        raise CodecError(f"payload text has a malformed {tag!r} value: {short_repr(value)}")
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
        raise CodecError(f"payload text has a malformed 'float' value: {short_repr(v)}")
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
        raise CodecError(f"payload text has a malformed 'pattern' value: {short_repr(v)}")
    return re.compile(v, _expect(obj["flags"], int, "pattern"))


def _decode_record(v: object, obj: dict[str, Any]) -> object:
    name = obj.get("n")
    cls = _RECORDS.get(name) if type(name) is str else None
    if cls is None:
        raise CodecError(f"payload text holds a record of an unknown kind: {short_repr(name)}")
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
