"""The flight record: which work each running alarm is doing, kept where a SIGKILL
cannot erase it.

A memory-mapped file of fixed slots, one per alarm run in progress. Writing a slot is a
memory copy into the page cache (microseconds, where a SQLite commit costs ~100 µs) and
survives the death of the process, though not a power loss. When a runtime opens the
path again, the slots still filled name the work that a dead process was doing.

Faults it contains (issue 10 #3, #6): the file's blocks are allocated before it is
mapped, so a full disk is a ``StorageError`` naming the file, never a SIGBUS at the first
write to an unbacked page; a slot that does not parse is ignored with a warning.

Every valid id is recorded (DESIGN 3): one too long for its slot (an id is up to 1024
characters, up to 4096 bytes of UTF-8) is written as its digest (``name_digest``: a NUL,
which no name holds, and a fixed-size hash), which the reader resolves back to the id:
an object id against the registered objects (``resolve_owners``), a job id against the
object's jobs (``_jobs/_strikes``). An id that fits is written as it is.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import mmap
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from nursery_jobs._errors import StorageError, describe_error
from nursery_jobs._names import is_digest, name_digest

logger = logging.getLogger("nursery_jobs")

SLOT_SIZE: Final = 4096
# A slot: u32 length of what follows (0 = empty), then the owner as JSON
# ([namespace, object_id]), a NUL, the start time (f64) and the token (UTF-8).
_LENGTH = struct.Struct("<I")
_STARTED = struct.Struct("<d")
_HEAD: Final = _LENGTH.size
_MAX_ENTRY = SLOT_SIZE - _HEAD
# What an owner leaves of its slot at least: room for a start time and a digested token.
_ROOM: Final = _STARTED.size + len(name_digest("").encode())
# Bound once: a job's record is on the dispatch path (a record and a clear: 1.8 -> 0.7 µs).
_pack_length = _LENGTH.pack_into
_pack_started = _STARTED.pack_into
# posix_fallocate errors that mean "not supported here" (then zeros are written).
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


class FlightSlot:
    """One alarm run's slot: ``record(token, started)`` before work starts,
    ``clear()`` after. While the slot is held, even between pieces of work, it names
    its object with an empty token: a death then still wakes that object at once."""

    __slots__ = ("_body", "_buf", "_data", "_idle", "_limit", "_offset")

    def __init__(self, buf: mmap.mmap | bytearray, offset: int, owner: bytes):
        """``owner``: the slot's owner part (``_owner``)."""
        self._buf = buf
        self._offset = offset
        self._body = offset + _LENGTH.size + len(owner)
        self._data = self._body + _STARTED.size  # where the token goes
        self._limit = offset + SLOT_SIZE
        self._idle = len(owner) + _STARTED.size  # the entry with an empty token
        buf[offset + _LENGTH.size:self._body] = owner
        _STARTED.pack_into(buf, self._body, 0.0)
        _LENGTH.pack_into(buf, offset, self._idle)

    def record(self, token: str, started: float) -> None:
        """Note that the work named ``token`` starts (at epoch ``started``). A memory
        write of a few bytes; does not checkpoint."""
        data = token.encode()
        start = self._data
        end = start + len(data)
        if end > self._limit:
            # A job id too long for what the owner left of the slot: its digest, which
            # always fits (``acquire`` leaves room for it).
            data = name_digest(token).encode()
            end = start + len(data)
        buf, offset = self._buf, self._offset
        # The entry first, its length last: a death in between leaves an empty slot.
        _pack_length(buf, offset, 0)
        _pack_started(buf, self._body, started)
        buf[start:end] = data
        _pack_length(buf, offset, end - offset - _HEAD)

    def clear(self) -> None:
        """Note that no work is running (the alarm run still is). Does not checkpoint."""
        _pack_length(self._buf, self._offset, self._idle)


class FlightRecord:
    """The slots of one runtime, in ``<data dir>/flight.rec`` (or in memory)."""

    def __init__(self, path: Path | None, slots: int) -> None:
        self._size = slots * SLOT_SIZE
        self._free = list(range(slots - 1, -1, -1))
        self._file: int | None = None
        self._buf: mmap.mmap | bytearray
        self._path = path
        if path is None:
            self._buf = bytearray(self._size)
            return
        self._path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _allocate(fd, path, self._size)
            self._buf = mmap.mmap(fd, self._size)
        except BaseException:
            os.close(fd)
            raise
        self._file = fd

    def recover(self) -> list[tuple[str, str, str, float]]:
        """Return (namespace, object_id, token, started) of every filled slot: work
        that was running when the last process on this path died. A slot that does
        not parse (a torn or foreign file) is ignored, with one warning for them all."""
        found = []
        garbage = []
        for index in range(self._size // SLOT_SIZE):
            offset = index * SLOT_SIZE
            (length,) = _LENGTH.unpack_from(self._buf, offset)
            if length == 0:
                continue
            try:
                if length > _MAX_ENTRY:
                    raise ValueError(f"length {length} > {_MAX_ENTRY}")
                start = offset + _LENGTH.size
                found.append(_parse(bytes(self._buf[start:start + length])))
            except ValueError as exc:
                garbage.append(f"slot {index}: {exc}")
        if garbage:
            logger.warning(
                "flight record %s: ignored %d unreadable slot(s) (%s%s)",
                self._path or "in memory", len(garbage), "; ".join(garbage[:5]),
                "; ..." if len(garbage) > 5 else "",
            )
        return found

    def wipe(self) -> None:
        """Empty every slot (after the recovered entries are stored elsewhere)."""
        self._buf[:] = bytes(self._size)

    def acquire(self, namespace: str, object_id: str) -> FlightSlot | None:
        """Take a free slot for an alarm run, or None if all are taken. An id too long
        for the slot is written as its digest (the object id first, then the
        namespace), so that the slot always has room for a job's digest."""
        if not self._free:
            return None
        return FlightSlot(self._buf, self._free.pop() * SLOT_SIZE,
                          _fitting_owner(namespace, object_id))

    def release(self, slot: FlightSlot) -> None:
        _LENGTH.pack_into(self._buf, slot._offset, 0)
        self._free.append(slot._offset // SLOT_SIZE)

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()
        if self._file is not None:
            os.close(self._file)
            self._file = None


def _fitting_owner(namespace: str, object_id: str) -> bytes:
    """The owner part of a slot of the object, leaving ``_ROOM`` in the slot."""
    owner = _owner(namespace, object_id)
    if len(owner) + _ROOM <= _MAX_ENTRY:
        return owner  # (every id up to ~4000 bytes)
    owner = _owner(namespace, name_digest(object_id))
    if len(owner) + _ROOM <= _MAX_ENTRY:
        return owner
    return _owner(name_digest(namespace), name_digest(object_id))


def resolve_owners(
    entries: list[tuple[str, str, str, float]], objects: Iterable[tuple[str, str]]
) -> list[tuple[str, str, str, float]]:
    """``entries`` (from ``recover``) with each digested namespace or object id
    replaced by the id of the registered object (from ``objects``) it digests. An entry
    that names no registered object is dropped with a warning (there is nothing of it
    to wake). Reads ``objects`` only when an entry holds a digest."""
    if not any(is_digest(ns) or is_digest(oid) for ns, oid, _, _ in entries):
        return entries
    known: dict[tuple[str, str], tuple[str, str]] = {}
    for namespace, object_id in objects:
        if len(_owner(namespace, object_id)) + _ROOM > _MAX_ENTRY:  # (digested)
            names = json.loads(_fitting_owner(namespace, object_id)[:-1])
            known[(names[0], names[1])] = (namespace, object_id)
    resolved = []
    for namespace, object_id, token, started in entries:
        if is_digest(namespace) or is_digest(object_id):
            found = known.get((namespace, object_id))
            if found is None:
                logger.warning("flight record: dropped an entry naming no registered "
                               "object (its id was too long for a slot)")
                continue
            namespace, object_id = found
        resolved.append((namespace, object_id, token, started))
    return resolved


def _owner(namespace: str, object_id: str) -> bytes:
    """The owner part of an entry: ``[namespace, object_id]`` as UTF-8 JSON, and a NUL
    (JSON escapes NUL, so the first NUL ends it). Ids with nothing JSON escapes are
    joined as ``json.dumps`` would write them (~0.4 µs, where it took ~3: an alarm
    run's slot is made for every activation of a cold fire)."""
    if _PLAIN(namespace) and _PLAIN(object_id):
        return f'["{namespace}", "{object_id}"]\0'.encode()
    return json.dumps([namespace, object_id], ensure_ascii=False).encode() + b"\0"


# A string ``json.dumps(..., ensure_ascii=False)`` writes as it is, between quotes: no
# quote, backslash or control character (those it escapes).
_PLAIN: Final = re.compile(r'[^"\\\x00-\x1f]*').fullmatch


def _parse(entry: bytes) -> tuple[str, str, str, float]:
    """One slot's entry as (namespace, object_id, token, started); ``ValueError``
    saying what is wrong if it is not one."""
    owner, sep, rest = entry.partition(b"\0")
    if not sep or len(rest) < _STARTED.size:
        raise ValueError("truncated entry")
    try:
        names = json.loads(owner)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"owner is not JSON ({describe_error(exc, 80)})") from None
    if not (isinstance(names, list) and len(names) == 2
            and all(isinstance(name, str) and name for name in names)):
        raise ValueError("owner is not [namespace, object_id]")
    (started,) = _STARTED.unpack_from(rest)
    if not math.isfinite(started):
        raise ValueError(f"start time {started!r}")
    try:
        token = rest[_STARTED.size:].decode()
    except UnicodeDecodeError:
        raise ValueError("token is not UTF-8") from None
    return names[0], names[1], token, started


def _allocate(fd: int, path: Path, size: int) -> None:
    """Give the file ``size`` bytes of real blocks before it is mapped. A write to a
    mapped page the filesystem cannot back kills the process with SIGBUS; allocating
    first turns a full disk into an error here. Keeps what the file holds."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except AttributeError:  # not on this platform (macOS)
        pass
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise _no_space(path, size, exc) from exc
    # Unsupported here: write every byte (the old ones back, zeros past the end).
    data = os.pread(fd, size, 0)
    data += bytes(size - len(data))
    try:
        written = 0
        while written < size:
            written += os.pwrite(fd, data[written:], written)
    except OSError as exc:
        raise _no_space(path, size, exc) from exc


def _no_space(path: Path, size: int, error: OSError) -> StorageError:
    return StorageError(
        f"cannot allocate the flight record {path} ({size} bytes) — "
        f"{error.strerror or describe_error(error)}; free space on that filesystem"
    )
