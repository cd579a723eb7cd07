"""The one rule for a name that becomes stored text (an object or job id, a storage key,
a job fn, a namespace, a capability id, a callback name): a str that every engine can
store (DESIGN 2). PostgreSQL text holds neither NUL nor a lone surrogate, and UTF-8
holds no lone surrogate, so no engine takes a name one of them would refuse."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Final

# The longest object id, job id or storage key, in characters (DESIGN 2: "the same
# holds for job ids and storage keys"). A bound, so that no name is megabytes of text
# that every read of its row, every index and every shipped row carries.
MAX_NAME_LENGTH: Final = 1024


def check_name(
    value: object,
    what: str,
    error: Callable[[str], Exception],
    *,
    max_length: int | None = None,
    allow_empty: bool = False,
) -> str:
    """Return ``value`` if it is a name every engine can store, else raise ``error``
    (a typed error of the caller's) whose message names ``what`` and says why.

    Hot (every push checks its id and fn): ``isascii`` is O(1) on a CPython str, so an
    ASCII name costs a type check, a length and one NUL scan; only non-ASCII text is
    encoded to find a lone surrogate.
    """
    if (value.__class__ is str and value and value.isascii() and "\x00" not in value
            and (max_length is None or len(value) <= max_length)):
        return value  # (nearly every name: one test each)
    if not isinstance(value, str):
        raise error(f"{what} must be a str, got {type(value).__name__}")
    if not value and not allow_empty:
        raise error(f"{what} must be a non-empty string")
    if max_length is not None and len(value) > max_length:
        raise error(
            f"{what} {value[:40]!r}... is {len(value)} characters; the limit is {max_length}"
        )
    if "\x00" in value:
        raise error(f"{what} {value!r} holds a NUL character; no engine can store it")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise error(
                f"{what} {value!r} holds a lone surrogate; it cannot be stored as UTF-8"
            ) from None
    return value


def name_digest(name: str) -> str:
    """A fixed-size stand-in for ``name`` where a name does not fit (a flight-record
    slot): a NUL, which marks it as no name holds one, and a hash of the name."""
    return "\x00" + hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


def is_digest(text: str) -> bool:
    """Whether ``text`` is a ``name_digest`` (no name starts with a NUL)."""
    return text.startswith("\x00")
