"""The library's one cattrs converter for records (``Job``, dead letters...), with
strict scalar hooks: what the payload codec stores, it structures back without coercion.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

import cattrs

from nursery_jobs._codec import short_repr, type_name
from nursery_jobs._errors import CodecError

__all__ = ["converter"]

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
                f"expected {type_name(t)}, got {type_name(type(value))}: {short_repr(value)}"
            )
        return value

    structure.__name__ = f"structure_{t.__name__}"
    return structure


def _structure_float(value: object, _: object) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise CodecError(f"expected float, got {type_name(type(value))}: {short_repr(value)}")


def _structure_bool(value: object, _: object) -> bool:
    if type(value) is bool:
        return value
    if type(value) is int and (value == 0 or value == 1):
        return bool(value)
    raise CodecError(f"expected bool, got {type_name(type(value))}: {short_repr(value)}")


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
    raise CodecError(f"expected re.Pattern or str, got {type_name(type(value))}")


for _t in (str, int, bytes, datetime, date, timedelta, Decimal, UUID):
    converter.register_structure_hook(_t, _strict(_t))
converter.register_structure_hook(float, _structure_float)
converter.register_structure_hook(bool, _structure_bool)
converter.register_structure_hook_func(_is_pattern, _structure_pattern)
converter.register_unstructure_hook_func(_is_pattern, lambda pattern: pattern)
del _t
