"""The flight record: which work each running alarm is doing, kept where a SIGKILL
cannot erase it.

A memory-mapped file of fixed slots, one per alarm run in progress. Writing a slot is a
memory copy into the page cache (microseconds, where a SQLite commit costs ~100 µs) and
survives the death of the process, though not a power loss. When a runtime opens the
path again, the slots still filled name the work that a dead process was doing.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Final

SLOT_SIZE: Final = 4096
# A slot: u32 length of what follows (0 = empty), then the owner as JSON
# ([namespace, object_id]), a NUL, the start time (f64) and the token (UTF-8).
_LENGTH = struct.Struct("<I")
_STARTED = struct.Struct("<d")
_MAX_ENTRY = SLOT_SIZE - _LENGTH.size


class FlightSlot:
    """One alarm run's slot: ``record(token, started)`` before work starts,
    ``clear()`` after. While the slot is held, even between pieces of work, it names
    its object with an empty token: a death then still wakes that object at once."""

    __slots__ = ("_body", "_buf", "_idle", "_offset")

    def __init__(self, buf: mmap.mmap | bytearray, offset: int, namespace: str, object_id: str):
        self._buf = buf
        self._offset = offset
        owner = json.dumps([namespace, object_id]).encode() + b"\0"
        self._body = offset + _LENGTH.size + len(owner)
        self._idle = len(owner) + _STARTED.size  # the entry with an empty token
        buf[offset + _LENGTH.size:self._body] = owner
        _STARTED.pack_into(buf, self._body, 0.0)
        _LENGTH.pack_into(buf, offset, self._idle)

    def record(self, token: str, started: float) -> None:
        """Note that the work named ``token`` starts (at epoch ``started``). A memory
        write of a few bytes; does not checkpoint."""
        data = token.encode()
        end = self._body + _STARTED.size + len(data)
        if end > self._offset + SLOT_SIZE:
            raise ValueError(f"flight record token too long ({len(data)} bytes)")
        buf = self._buf
        # The entry first, its length last: a death in between leaves an empty slot.
        _LENGTH.pack_into(buf, self._offset, 0)
        _STARTED.pack_into(buf, self._body, started)
        buf[self._body + _STARTED.size:end] = data
        _LENGTH.pack_into(buf, self._offset, end - self._offset - _LENGTH.size)

    def clear(self) -> None:
        """Note that no work is running (the alarm run still is). Does not checkpoint."""
        _LENGTH.pack_into(self._buf, self._offset, self._idle)


class FlightRecord:
    """The slots of one runtime, in ``<data dir>/flight.rec`` (or in memory)."""

    def __init__(self, path: Path | None, slots: int) -> None:
        self._size = slots * SLOT_SIZE
        self._free = list(range(slots - 1, -1, -1))
        self._file: int | None = None
        self._buf: mmap.mmap | bytearray
        if path is None:
            self._buf = bytearray(self._size)
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < self._size:
                os.ftruncate(fd, self._size)
            self._buf = mmap.mmap(fd, self._size)
        except BaseException:
            os.close(fd)
            raise
        self._file = fd

    def recover(self) -> list[tuple[str, str, str, float]]:
        """Return (namespace, object_id, token, started) of every filled slot: work
        that was running when the last process on this path died."""
        found = []
        for offset in range(0, self._size, SLOT_SIZE):
            (length,) = _LENGTH.unpack_from(self._buf, offset)
            if not 0 < length <= _MAX_ENTRY:
                continue
            entry = bytes(self._buf[offset + _LENGTH.size:offset + _LENGTH.size + length])
            owner, sep, rest = entry.partition(b"\0")
            if not sep or len(rest) < _STARTED.size:
                continue
            try:
                namespace, object_id = json.loads(owner)
                token = rest[_STARTED.size:].decode()
            except ValueError:
                continue
            (started,) = _STARTED.unpack_from(rest)
            found.append((str(namespace), str(object_id), token, started))
        return found

    def wipe(self) -> None:
        """Empty every slot (after the recovered entries are stored elsewhere)."""
        self._buf[:] = bytes(self._size)

    def acquire(self, namespace: str, object_id: str) -> FlightSlot | None:
        """Take a free slot for an alarm run, or None if all are taken."""
        if not self._free:
            return None
        return FlightSlot(self._buf, self._free.pop() * SLOT_SIZE, namespace, object_id)

    def release(self, slot: FlightSlot) -> None:
        _LENGTH.pack_into(self._buf, slot._offset, 0)
        self._free.append(slot._offset // SLOT_SIZE)

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()
        if self._file is not None:
            os.close(self._file)
            self._file = None
