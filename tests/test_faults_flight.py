"""The flight record under faults: a full disk (issue 10 #6) is a ``StorageError``
naming the file, never a SIGBUS; a garbage slot (issue 10 #3) is ignored with a warning;
ids too long for a slot never stop an alarm.

The full disk is real where the test may mount a small tmpfs (root), and injected
(``os.posix_fallocate`` raising ENOSPC) everywhere.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs._engines.files._flight import SLOT_SIZE, FlightRecord, resolve_owners
from nursery_jobs._names import name_digest

WORKER = Path(__file__).with_name("flight_worker.py")
ROOT = Path(__file__).parent.parent
SLOTS = 64
RECORD_BYTES = SLOTS * SLOT_SIZE  # what a runtime's flight record takes (256 KiB)


# -- a real full disk ----------------------------------------------------------------------


@pytest.fixture
def almost_full(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs with 160 KiB left: room for the catalog, not the flight record."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True, text=True, check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or 'refused'}")
    try:
        stat = os.statvfs(mnt)
        free = stat.f_bavail * stat.f_frsize
        (mnt / "filler").write_bytes(bytes(free - 160 * 1024))
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_a_storage_error_naming_the_file(almost_full: Path) -> None:
    path = almost_full / "flight.rec"
    with pytest.raises(nj.StorageError, match=r"flight\.rec") as caught:
        FlightRecord(path, SLOTS)
    assert str(path) in str(caught.value)
    assert "No space left on device" in str(caught.value)


def test_a_runtime_on_a_full_disk_exits_with_the_typed_error(almost_full: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(WORKER), str(almost_full / "data")],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != -signal.SIGBUS, "killed by SIGBUS"
    assert done.returncode == 1, done.stderr
    assert "nursery_jobs.StorageError" in done.stderr, done.stderr
    assert str(almost_full / "data" / "flight.rec") in done.stderr


def test_a_runtime_opens_once_space_is_freed(almost_full: Path) -> None:
    data = almost_full / "data"
    with pytest.raises(nj.StorageError):
        trio.run(_open_and_close, data)
    (almost_full / "filler").unlink()
    trio.run(_open_and_close, data)  # recovers by itself once the cause goes away
    assert (data / "flight.rec").stat().st_size == RECORD_BYTES


async def _open_and_close(data: Path) -> None:
    async with nj.open_runtime(data):
        pass


# -- an injected full disk -----------------------------------------------------------------


def _enospc(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _unsupported(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))


def test_fallocate_enospc_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    with pytest.raises(nj.StorageError, match="No space left on device") as caught:
        FlightRecord(tmp_path / "flight.rec", SLOTS)
    assert str(tmp_path / "flight.rec") in str(caught.value)


async def test_open_runtime_on_a_full_disk_raises_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    with pytest.raises(nj.StorageError, match=r"flight\.rec"):
        async with nj.open_runtime(tmp_path / "data"):
            pytest.fail("opened")
    monkeypatch.undo()
    async with nj.open_runtime(tmp_path / "data"):  # the lock was released
        pass


def test_without_fallocate_zeros_are_written_and_a_full_disk_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "posix_fallocate", _unsupported)
    written: list[int] = []
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        written.append(len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    record = FlightRecord(tmp_path / "flight.rec", SLOTS)
    record.close()
    assert sum(written) == RECORD_BYTES
    assert (tmp_path / "flight.rec").stat().st_blocks * 512 >= RECORD_BYTES  # not sparse

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(nj.StorageError, match="No space left on device"):
        FlightRecord(tmp_path / "other.rec", SLOTS)


@pytest.mark.parametrize("how", ["fallocate", "unsupported", "absent"])
def test_allocating_keeps_what_the_record_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:
    path = tmp_path / "flight.rec"
    record = FlightRecord(path, SLOTS)
    slot = record.acquire("ns", "obj")
    assert slot is not None
    slot.record("job-1", 1_800_000_000.5)
    record.close()  # as a SIGKILL leaves it
    if how == "unsupported":
        monkeypatch.setattr(os, "posix_fallocate", _unsupported)
    elif how == "absent":
        monkeypatch.delattr(os, "posix_fallocate")
    again = FlightRecord(path, SLOTS)
    assert again.recover() == [("ns", "obj", "job-1", 1_800_000_000.5)]
    again.close()


# -- garbage slots -------------------------------------------------------------------------

_LENGTH = struct.Struct("<I")
_STARTED = struct.Struct("<d")


def _entry(owner: bytes, started: float = 1.5, token: bytes = b"job") -> bytes:
    return owner + b"\0" + _STARTED.pack(started) + token


GARBAGE = {
    "length past the slot": None,
    "no NUL": b'["ns", "obj"]' + _STARTED.pack(1.0),
    "truncated start time": b'["ns", "obj"]\0abc',
    "bad JSON": _entry(b'["ns", "obj"'),
    "owner not UTF-8": _entry(b'["ns\xff", "obj"]'),
    "owner a number": _entry(b"5"),
    "owner a string": _entry(b'"ab"'),
    "owner a dict": _entry(b'{"a": 1, "b": 2}'),
    "owner of three": _entry(b'["a", "b", "c"]'),
    "owner not strings": _entry(b"[1, 2]"),
    "owner with null": _entry(b'["ns", null]'),
    "empty object id": _entry(b'["ns", ""]'),
    "deeply nested": _entry(b"[" * 2000 + b"]" * 2000),
    "NaN start": _entry(b'["ns", "obj"]', math.nan),
    "infinite start": _entry(b'["ns", "obj"]', math.inf),
    "token not UTF-8": _entry(b'["ns", "obj"]', token=b"\xff\xfe"),
}


def _write(buf: bytearray, index: int, entry: bytes | None) -> None:
    offset = index * SLOT_SIZE
    if entry is None:
        _LENGTH.pack_into(buf, offset, SLOT_SIZE * 2)
        return
    _LENGTH.pack_into(buf, offset, len(entry))
    buf[offset + 4:offset + 4 + len(entry)] = entry


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_a_garbage_slot_is_ignored_with_a_warning(
    kind: str, caplog: pytest.LogCaptureFixture,
) -> None:
    record = FlightRecord(None, 4)
    buf = record._buf
    assert isinstance(buf, bytearray)
    good = record.acquire("ns", "good")
    assert good is not None
    good.record("job-a", 1_800_000_000.25)  # slot 0
    _write(buf, 2, GARBAGE[kind])
    with caplog.at_level(logging.WARNING, "nursery_jobs"):
        assert record.recover() == [("ns", "good", "job-a", 1_800_000_000.25)]
    (warning,) = caplog.records
    assert "ignored 1 unreadable slot(s)" in warning.getMessage()
    assert "slot 2" in warning.getMessage()


def test_many_garbage_slots_make_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    record = FlightRecord(None, SLOTS)
    buf = record._buf
    assert isinstance(buf, bytearray)
    buf[:] = os.urandom(len(buf))  # a foreign file
    with caplog.at_level(logging.WARNING, "nursery_jobs"):
        assert record.recover() == []
    assert len(caplog.records) == 1


def test_a_runtime_opens_over_a_garbage_flight_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    data = tmp_path / "data"
    trio.run(_open_and_close, data)
    (data / "flight.rec").write_bytes(os.urandom(RECORD_BYTES))
    with caplog.at_level(logging.WARNING, "nursery_jobs"):
        trio.run(_open_and_close, data)
    assert any("unreadable slot" in r.getMessage() for r in caplog.records)
    assert (data / "flight.rec").read_bytes() == bytes(RECORD_BYTES)  # wiped


# -- ids too long for a slot ---------------------------------------------------------------

LONG = "\U0001f600" * 1024  # 1024 characters, 4096 bytes of UTF-8


class Host(nj.DurableObject):
    namespace = "tests.test_faults_flight.Host"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def add(self, job_id: str) -> None:
        await self.lifecycle.jobs.push("f", id=job_id)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        ran: list[tuple[str, int]] = self.ctx.env
        ran.append((self.ctx.id[:3], len(ctx.job.id)))
        return None


@pytest.mark.parametrize("path", [None, "data"])
async def test_ids_too_long_for_a_slot_still_run(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, path: str | None,
) -> None:
    ran: list[tuple[str, int]] = []
    events: list[nj.Event] = []
    with trio.fail_after(100):
        async with nj.open_runtime(None if path is None else tmp_path / path, env=ran) as rt:
            rt.events.add_listener(events.append)
            await rt.get(Host, LONG).add("short")
            await rt.get(Host, "o").add(LONG)
            await rt.get(Host, "p").add("plain")
            await trio.sleep(1)
            flight = rt.engine.flight._buf  # type: ignore[attr-defined]
            assert len(flight) == RECORD_BYTES  # never grown by an oversized write
    assert sorted(ran) == sorted([(LONG[:3], 5), ("o", 1024), ("p", 5)])
    assert "alarm:retry" not in [e.type for e in events]


def test_a_slot_never_writes_past_itself_and_names_every_id() -> None:
    """An id too long for its slot is written as its digest (a NUL and a hash), which
    the reader resolves against the registered objects; a job id's digest is resolved
    against the object's jobs (``_strikes``)."""
    record = FlightRecord(None, 5)
    buf = record._buf
    assert isinstance(buf, bytearray)
    for namespace, object_id, token, started in [
        ("ns", "o", "j", 2.0), ("ns", LONG, LONG, 3.0), (LONG, LONG, "k", 4.0),
        ("ns", "x" * 2000, "y" * 3000, 5.0), ("ns", "gone" + LONG, "z", 6.0),
    ]:
        slot = record.acquire(namespace, object_id)
        assert slot is not None
        slot.record(token, started)
    assert len(buf) == 5 * SLOT_SIZE
    found = record.recover()
    assert ("ns", "o", "j", 2.0) in found  # (what fits is written as it is)
    assert ("ns", name_digest(LONG), name_digest(LONG), 3.0) in found
    assert (name_digest(LONG), name_digest(LONG), "k", 4.0) in found
    assert ("ns", "x" * 2000, name_digest("y" * 3000), 5.0) in found
    registered = [("ns", "o"), ("ns", LONG), (LONG, LONG), ("ns", "x" * 2000), ("ns", "p")]
    assert sorted(resolve_owners(found, registered)) == sorted([
        ("ns", "o", "j", 2.0), ("ns", LONG, name_digest(LONG), 3.0), (LONG, LONG, "k", 4.0),
        ("ns", "x" * 2000, name_digest("y" * 3000), 5.0),  # ("gone": not registered)
    ])
