"""A stub call's envelope: its arguments and result as payload text (``encode_call``,
``encode_result``: the cross-host envelope), and the copies every engine's stub call
makes through the payload codec (``copy_arguments``, ``copy_result``; DESIGN section 2).
"""

from __future__ import annotations

from typing import Any, Final

from nursery_jobs._codec import (
    MAX_PAYLOAD_BYTES,
    TAG,
    Refusal,
    decode_payload,
    encode_tree,
    tree_text,
)
from nursery_jobs._errors import CallCodecError, CodecError

__all__ = ["copy_arguments", "copy_result", "decode_call", "encode_call", "encode_result"]

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


def _call_refusal(method: str, part: str, refusal: Refusal) -> CallCodecError:
    return CallCodecError(f"{method}: {refusal.message(part)}", method, part)


def _encode_part(value: object, method: str, part: str) -> object:
    try:
        return encode_tree(value)
    except Refusal as refusal:
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
    if TAG in named:  # (**{"$t": ...}: as _encode_dict writes a dict it cannot key)
        keywords = {TAG: "map", "v": [x for pair in named.items() for x in pair]}
    envelope: list[object] = [positional, keywords, list(chain)]
    if place or trace is not None:
        envelope.append(1 if place else 0)
    if trace is not None:
        envelope.append(trace)
    text, size = tree_text(envelope)
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
    text, size = tree_text(_encode_part(value, method, "result"))
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
