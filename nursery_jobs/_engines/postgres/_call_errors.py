"""The exception of a call across hosts, as data: what the host that ran the call writes
for the exception it raised (``dump_error``), and what the caller rebuilds from that
(``load_error``). Never a pickle: an answer can be forged by anyone who may NOTIFY on
the caller's channel or write ``nj_calls``, so reading one runs no code but an exception
class's own ``__init__``, and only of a class this process has imported already.

An exception travels as the first of these records that rebuilds it, as the caller
will, with its type and its text (checked by rebuilding it on the host that raised it):

1. itself: its class, its args and attributes as a pickle would rebuild it (its
   ``__reduce__``'s: a class that drops a live handle for a pickle drops it here too),
   its ``__cause__``, and the exceptions it holds (a group's, one in an arg or an
   attribute: a library error holding psycopg's) each as a record of its own;
2. without the attributes the payload codec cannot carry (a note on it names them);
3. built from its message alone, where its args cannot be carried (``decimal``'s
   signals hold classes) and that gives the same text (a note says so);
4. else a ``RemoteError`` naming its class and message.

A group keeps the members that can travel; one that cannot is a ``RemoteError`` in it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any, Final

import psycopg
from psycopg.pq import DiagnosticField

from nursery_jobs._codec import decode_payload, encode_payload
from nursery_jobs._errors import ERROR_TEXT_LIMIT, RemoteError, RpcError, describe_error

# Causes and held exceptions travel this deep, and this many in one answer at most (a
# chain of causes can be a cycle; an exception can hold itself, twice).
MAX_NESTING: Final = 8
MAX_RECORDS: Final = 256

_FIELDS: Final = frozenset({"type", "args", "state"})
_OPTIONAL: Final = frozenset({"group", "cause", "held"})
_REMOTE: Final = f"{RemoteError.__module__}:{RemoteError.__qualname__}"
# psycopg's errors keep the server's diagnostics (sqlstate, constraint, detail...) in a
# dict keyed by an IntEnum, which the codec refuses: they travel keyed by number.
_DIAGNOSTICS: Final = {int(field): field for field in DiagnosticField}


def dump_error(exc: BaseException, label: str) -> str:
    """``exc`` as answer text (the best record, see the module's docstring); ``label``
    names the call (``ns/id.name()``). Never raises: whatever of the exception fails
    (its size, its ``__str__``, its ``__reduce__``), the caller gets an answer, and an
    error escaping here would end this host's call router."""
    try:
        text = encode_payload(_travelling(exc, label, 0, [MAX_RECORDS]))
    except Exception:  # (all of it together over 1 MiB)
        text = encode_payload(_remote(exc, label))
    assert text is not None
    return text


def load_error(text: str | None, label: str) -> BaseException:
    """The exception an answer carries (``dump_error``): a ``RemoteError`` naming one
    whose class this process has not loaded, an ``RpcError`` for text that is no such
    record. Runs no code but the exception classes' own ``__init__``: a class is only
    looked up among the modules this process has imported, in their namespaces as they
    stand (nothing is imported for it, no module ``__getattr__`` runs), and must be an
    ``Exception``."""
    try:
        return _rebuilt(decode_payload(text), label, 0)
    except _Unknown as unknown:
        return unknown.error(label)
    except Exception as exc:
        return RpcError(f"{label} raised an exception this host cannot read:"
                        f" {describe_error(exc)}")


# -- the host that raised it -------------------------------------------------------------
def _travelling(exc: BaseException, label: str, depth: int, left: list[int]) -> dict[str, Any]:
    """The first record of ``exc`` that rebuilds it, or a ``RemoteError``'s. ``left``:
    how many more records this answer may hold."""
    left[0] -= 1
    if depth < MAX_NESTING and left[0] >= 0:  # (a RemoteError at MAX_NESTING)
        try:
            for record in _records(exc, label, depth, left):
                if _rebuilds(record, exc, label):
                    return record
        except Exception:  # (a __reduce__ or __str__ that raises, a hostile __eq__...)
            pass
    return _remote(exc, label)


def _records(exc: BaseException, label: str, depth: int,
             left: list[int]) -> Iterator[dict[str, Any]]:
    """Records of ``exc``, the most faithful first."""
    cls = type(exc)
    record: dict[str, Any] = {"type": f"{cls.__module__}:{cls.__qualname__}"}
    state: dict[str, Any]
    if isinstance(exc, BaseExceptionGroup):
        args: list[Any] = [exc.message]
        state = dict(vars(exc))
        record["group"] = [_travelling(sub, label, depth + 1, left) for sub in exc.exceptions]
    else:
        # The arguments and state it is built again from, as a pickle would rebuild it:
        # its ``__reduce__``'s where that names its class (an OSError's args carry its
        # filename; psycopg's state drops its connection), else ``args`` and its dict.
        reduced = exc.__reduce__()
        ours = isinstance(reduced, tuple) and len(reduced) >= 2 and reduced[0] is cls
        args = list(reduced[1] if ours else exc.args)
        kept = reduced[2] if ours and len(reduced) > 2 else None
        state = dict(kept if isinstance(kept, dict) else vars(exc))
    if isinstance(exc, psycopg.Error) and isinstance(state.get("_info"), dict):
        state["_info"] = {int(k): v for k, v in state["_info"].items()
                          if isinstance(k, int) and v is not None}
    held: list[list[Any]] = []
    for part, items in (("args", enumerate(args)), ("state", state.items())):
        for key, value in list(items):
            if isinstance(value, BaseException):
                held.append([part, key, _travelling(value, label, depth + 1, left)])
    for part, key, _ in held:
        (args if part == "args" else state)[key] = None
    if held:
        record["held"] = held
    if isinstance(exc.__cause__, BaseException):
        record["cause"] = _travelling(exc.__cause__, label, depth + 1, left)
    yield {**record, "args": args, "state": state}
    held_keys = {key for part, key, _ in held if part == "state"}
    carried = {key: value for key, value in state.items()
               if key in held_keys or _carried(value)}
    dropped = sorted(set(state) - set(carried))
    lost = f"its attributes {', '.join(dropped)}" if dropped else ""
    if dropped:
        yield {**record, "args": args, "state": _noted(
            carried, f"(crossed hosts without {lost}: the payload codec cannot carry them)")}
    if "group" not in record:
        text = str(exc)
        record.pop("held", None)
        if held_keys:  # (those it held in its args are gone with them)
            record["held"] = [entry for entry in held if entry[0] == "state"]
        yield {**record, "args": [text], "state": _noted(
            carried, "(rebuilt from its message on crossing hosts: the payload codec"
                     f" cannot carry its args{' nor ' + lost if lost else ''})")}


def _carried(value: object) -> bool:
    try:
        encode_payload(value)
    except Exception:
        return False
    return True


def _noted(state: dict[str, Any], note: str) -> dict[str, Any]:
    notes = state.get("__notes__")
    return {**state, "__notes__": [*notes, note] if isinstance(notes, list) else [note]}


def _rebuilds(record: dict[str, Any], exc: BaseException, label: str) -> bool:
    """Whether the caller will rebuild ``record`` as ``exc``: its type, its text."""
    try:
        back = _rebuilt(decode_payload(encode_payload(record)), label, 0)
    except Exception:
        return False
    return type(back) is type(exc) and _text(back) == _text(exc)


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as failure:
        return f"\0(str() failed: {type(failure).__qualname__})"


def _remote(exc: BaseException, label: str) -> dict[str, Any]:
    """The record of a ``RemoteError`` naming ``exc``."""
    try:
        cls = type(exc)
        name = (cls.__qualname__ if cls.__module__ == "builtins"
                else f"{cls.__module__}.{cls.__qualname__}")
    except Exception:  # (a metaclass with a hostile __qualname__)
        name = "object"
    message = _text(exc).removeprefix("\0")
    if len(message) > ERROR_TEXT_LIMIT:
        message = f"{message[:ERROR_TEXT_LIMIT]}... ({len(message)} chars)"
    return {"type": _REMOTE, "args": [f"{label} raised {describe_error(exc)}", label, name,
                                      message], "state": {}}


# -- the caller ----------------------------------------------------------------------------
class _Unknown(Exception):
    """A record names no ``Exception`` class loaded here."""

    def __init__(self, kind: str, args: list[Any]) -> None:
        super().__init__(kind)
        module, _, qualname = kind.partition(":")
        self.type_name = qualname if module == "builtins" else f"{module}.{qualname}"
        self.message = ", ".join(map(str, args))

    def error(self, label: str) -> RemoteError:
        named = f"{self.type_name}: {self.message}"
        if len(named) > ERROR_TEXT_LIMIT:  # (a forged answer's may be a MiB)
            named = f"{named[:ERROR_TEXT_LIMIT]}... ({len(named)} chars)"
        return RemoteError(f"{label} raised {named}: no exception class this host has"
                           " loaded", label, self.type_name[:ERROR_TEXT_LIMIT],
                           self.message[:ERROR_TEXT_LIMIT])


def _rebuilt(record: object, label: str, depth: int) -> Exception:
    if depth > MAX_NESTING:
        raise ValueError("exception records nested too deeply")
    if not isinstance(record, dict) or not _FIELDS <= set(record) <= _FIELDS | _OPTIONAL:
        raise ValueError("not an exception record")
    kind, args, state = record["type"], record["args"], record["state"]
    group, cause, held = record.get("group"), record.get("cause"), record.get("held", [])
    if (not isinstance(kind, str) or not isinstance(args, list) or not isinstance(state, dict)
            or not (group is None or (isinstance(group, list) and len(args) == 1))
            or not isinstance(held, list)):
        raise ValueError("not an exception record")
    found = _loaded_class(kind)
    if not (isinstance(found, type) and issubclass(found, Exception)):
        raise _Unknown(kind, args)
    args, state = list(args), dict(state)
    for entry in held:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ValueError("not an exception record")
        part, key, sub = entry
        if part == "args" and type(key) is int and 0 <= key < len(args):
            args[key] = _nested(sub, label, depth)
        elif part == "state" and type(key) is str:
            state[key] = _nested(sub, label, depth)
        else:
            raise ValueError("not an exception record")
    if group is not None:
        args = [args[0], [_nested(sub, label, depth) for sub in group]]
    try:
        exc = found(*args)
    except TypeError:
        # Its ``__init__`` takes what ``args`` lacks (keyword-only state, say): built
        # as a pickle of it would be without its ``__reduce__``, its attributes set below.
        exc = found.__new__(found, *args)
        exc.args = tuple(args)
    exc.__dict__.update(state)
    if isinstance(exc, psycopg.Error) and isinstance(state.get("_info"), dict):
        exc.__dict__["_info"] = {_DIAGNOSTICS[k]: v for k, v in state["_info"].items()
                                 if k in _DIAGNOSTICS and type(v) is bytes}
    if cause is not None:
        exc.__cause__ = _nested(cause, label, depth)
    return exc


def _nested(record: object, label: str, depth: int) -> Exception:
    """An exception a record holds (a cause, a group's member...); one of a class not
    loaded here is a ``RemoteError`` in its place."""
    try:
        return _rebuilt(record, label, depth + 1)
    except _Unknown as unknown:
        return unknown.error(label)


def _loaded_class(kind: str) -> object:
    """What ``kind`` (``module:Qual.Name``) names in a module this process has imported,
    or None: looked up in the namespaces of the module and of the classes on the way
    as they stand (dict lookups: no module ``__getattr__``, property or lazy load runs,
    nothing is imported)."""
    module_name, _, qualname = kind.partition(":")
    module = sys.modules.get(module_name)
    if not isinstance(module, types.ModuleType):
        return None
    # (object.__getattribute__: a lazily loaded module's own would load it.)
    names: Mapping[str, object] = object.__getattribute__(module, "__dict__")
    found: object = None
    for part in qualname.split("."):
        found = names.get(part)
        if not isinstance(found, type):
            return None
        names = found.__dict__
    return found
