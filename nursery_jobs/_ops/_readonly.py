"""Reading SQLite files without leaving anything behind: a database opened read-only with
no file created beside it and no lock a runtime would wait on, whether a runtime holds a
data directory, which layout a directory holds, and an object's database file as found
(its state, its signature).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from nursery_jobs._engines.files._rebuild import QUARANTINE
from nursery_jobs._errors import DataDirectoryError, ObjectInUseError, RuntimeLockedError
from nursery_jobs._ops._inspect import State

# -- reading SQLite without leaving anything behind --------------------------------------
# SQLite's POSIX lock bytes (os_unix.c): a process that has the database open holds a
# lock in the shared range.
_PENDING_BYTE: Final = 0x40000000
_SHARED_FIRST: Final = _PENDING_BYTE + 2
_SHARED_SIZE: Final = 510
_FLOCK: Final = "hhqqi4x"  # struct flock on Linux (64-bit off_t)


def _held_by_another_process(path: Path) -> bool:
    """Whether another process holds a SQLite lock on ``path`` (fcntl F_GETLK).

    Only for processes that have no SQLite connection of their own on the file: closing
    this descriptor drops every POSIX lock the process holds on it.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, _PENDING_BYTE,
                            _SHARED_FIRST + _SHARED_SIZE - _PENDING_BYTE, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        return bool(struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK)
    except OSError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_readonly(path: Path, *, probe: bool = True) -> Iterator[sqlite3.Connection]:
    """Open a SQLite database for reading without creating a file beside it and
    without waiting on a lock (``ObjectInUseError`` at once instead).

    A cleanly closed database has no ``-wal``: read it as immutable (no locks, no
    files). One with a ``-wal`` (its process died) would need a ``-shm`` beside it, and
    a read-only connection would create one or rewrite the one there: the pair is
    copied aside and read there instead.
    """
    wal = Path(f"{path}-wal")
    if not wal.exists():
        conn = sqlite3.connect(f"file:{_uri(path)}?mode=ro&immutable=1", uri=True,
                               timeout=0, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()
        return
    if probe and _held_by_another_process(path):
        raise ObjectInUseError(f"{path} is in use by another process")
    with tempfile.TemporaryDirectory(prefix="nursery-jobs-read-") as tmp:
        copy = Path(tmp) / "db.sqlite3"
        shutil.copyfile(path, copy)
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(wal, f"{copy}-wal")
        conn = sqlite3.connect(str(copy), timeout=0, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()


def _uri(path: Path) -> str:
    from urllib.parse import quote

    return quote(str(path.resolve()))


def runtime_running(data: Path) -> bool:
    """Whether a runtime holds ``data`` (its ``runtime.lock``). Creates nothing."""
    try:
        fd = os.open(data / "runtime.lock", os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False  # (not a data directory at all: the caller says so)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the probe's own lock
    return False


def check_files_directory(data: Path) -> None:
    """Refuse what is not a data directory of the files layout. Creates nothing.

    Raises:
        DataDirectoryError: no ``catalog.sqlite3`` (saying so where the directory holds
            the shared layout, which ``shared:<directory>`` names).
    """
    if (data / "catalog.sqlite3").is_file():
        return
    if (data / "shared.sqlite3").is_file():
        raise DataDirectoryError(f"{data} holds the shared layout (shared.sqlite3), not a"
                                 f" file per object: give it as shared:{data}")
    raise DataDirectoryError(f"{data} is not a nursery_jobs data directory"
                             " (no catalog.sqlite3)")


def check_shared_directory(data: Path) -> None:
    """Refuse what is not a data directory of the shared layout. Creates nothing.

    Raises:
        DataDirectoryError: no ``shared.sqlite3`` (saying so where the directory holds
            a file per object, which its path without ``shared:`` names).
    """
    if (data / "shared.sqlite3").is_file():
        return
    if (data / "catalog.sqlite3").is_file():
        raise DataDirectoryError(
            f"shared:{data} holds a file per object (catalog.sqlite3, objects/), not the"
            f" shared layout: give its path without 'shared:' ({data})")
    raise DataDirectoryError(f"shared:{data} is not a nursery_jobs data directory of the"
                             " shared layout (no shared.sqlite3)")


def refuse_if_running(data: Path) -> None:
    if runtime_running(data):
        raise RuntimeLockedError(
            f"{data} is in use by a running runtime (it holds {data / 'runtime.lock'})."
            " Stop it, or look at it live: open_runtime(..., http=('127.0.0.1', 8321))"
            " serves its dashboard at http://127.0.0.1:8321/"
        )


@contextlib.contextmanager
def _file_db(
    path: Path, *, probe: bool
) -> Iterator[tuple[sqlite3.Connection | None, State, str | None]]:
    if not path.exists():
        held = path.parent / QUARANTINE / path.name
        if held.exists():
            yield None, "quarantined", (f"damaged; moved to {held} — move it back to restore"
                                        " the object (its alarm is kept)")
        else:
            yield None, "missing", f"no database file {path.name}"
        return
    with contextlib.ExitStack() as stack:
        found: tuple[sqlite3.Connection | None, State, str | None]
        try:
            conn = stack.enter_context(open_readonly(path, probe=probe))
        except ObjectInUseError as exc:
            found = (None, "in use", str(exc))
        except sqlite3.DatabaseError as exc:
            found = (None, "damaged", f"{path.name}: {exc}")
        else:
            found = (conn, "evicted", None)
        yield found


def _file_signature(path: str, *, wal: bool = True) -> Any:
    """A database file's and its ``-wal``'s (inode, size, mtime): any write moves one.
    Without ``wal``: the file only (one closed by this process, its log checkpointed
    into it on close). (``os.stat`` of a string: pathlib's parsing cost more than the
    stat, measured.)"""
    out: list[tuple[int, int, int] | None] = []
    for name in (path, f"{path}-wal") if wal else (path,):
        try:
            st = os.stat(name)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)
