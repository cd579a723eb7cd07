"""Storage faults: SQLite errors that are the file's or the disk's, not the caller's SQL.

A disk that is full or read-only, a file that is damaged, locked by another process or
failing I/O surfaces as a ``StorageFaultError`` (a ``StorageError``) that names the
object and the file, never as a raw ``sqlite3`` error. Errors in the caller's own SQL
(a missing table, a constraint) stay what they are::

    StorageError
     └─ StorageFaultError (also sqlite3.DatabaseError)   .label .file .cause

``GuardedConnection`` is the connection class of every database the runtime opens: it
types faults as they are raised, rolls back a transaction whose COMMIT failed (left
open, every later write of the object would join it and never commit), and, once the
file of an object is found damaged, refuses every statement until the object leaves
memory and its file is moved to ``objects/quarantine/``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from typing import Any, Final

from nursery_jobs._errors import Cause, StorageFaultError

# Primary result codes (https://sqlite.org/rescode.html) that are the storage's fault.
_CAUSES: Final[dict[int, Cause]] = {
    3: "readonly",   # SQLITE_PERM
    5: "locked",     # SQLITE_BUSY
    6: "locked",     # SQLITE_LOCKED
    8: "readonly",   # SQLITE_READONLY
    10: "io",        # SQLITE_IOERR
    11: "corrupt",   # SQLITE_CORRUPT
    13: "full",      # SQLITE_FULL
    14: "cantopen",  # SQLITE_CANTOPEN
    26: "corrupt",   # SQLITE_NOTADB
}
# For errors made without a result code (fault injection, old Pythons).
_MESSAGES: Final[tuple[tuple[str, Cause], ...]] = (
    ("disk is full", "full"),
    ("readonly", "readonly"),
    ("read-only", "readonly"),
    ("is locked", "locked"),
    ("malformed", "corrupt"),
    ("not a database", "corrupt"),
    ("disk i/o error", "io"),
    ("unable to open", "cantopen"),
)
# Less free space than this on the filesystem of a failing file: it is full.
_NEARLY_FULL: Final = 64 * 1024
_EXPLAIN: Final[dict[Cause, str]] = {
    "full": "the disk is full",
    "readonly": "the file or its directory is read-only",
    "denied": "permission denied: this process may not write the file or its directory",
    "locked": "locked by another process (a backup, the sqlite3 shell, an unclosed"
              " connection)",
    "corrupt": "the file is damaged",
    "io": "the disk reported an I/O error",
    "cantopen": "the file cannot be opened",
    "missing": "the file is missing",
}


def fault_cause(exc: BaseException) -> Cause | None:
    """The storage fault ``exc`` is, or None for an error of the SQL itself."""
    if isinstance(exc, StorageFaultError):
        return exc.cause
    if not isinstance(exc, sqlite3.DatabaseError):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in _CAUSES:
        return _CAUSES[code & 0xFF]
    text = str(exc).lower()
    for fragment, cause in _MESSAGES:
        if fragment in text:
            return cause
    return None


def fault_error(
    exc: BaseException, *, label: str, file: str, cause: Cause | None = None, doing: str = ""
) -> StorageFaultError:
    """The typed error for storage fault ``exc`` of ``label``'s database ``file``."""
    if isinstance(exc, StorageFaultError) and cause is None:
        return exc
    cause = cause or _refine(fault_cause(exc) or "io", file)
    what = f" while {doing}" if doing else ""
    return StorageFaultError(
        f"the database of {label} ({file}){what}: {_EXPLAIN[cause]} ({exc})",
        label=label, file=file, cause=cause,
    )


def _refine(cause: Cause, file: str) -> Cause:
    """SQLite reports a read-only filesystem, a file or directory this process may not
    write, or a full disk, as an I/O error or a failure to open when it cannot create a
    side file (``-wal``), and a permission problem as a read-only database: ask the
    filesystem what it is (a permission problem was named "disk I/O error", issue 22
    #9)."""
    if cause not in ("io", "cantopen", "readonly") or file in ("", ":memory:"):
        return cause
    directory = os.path.dirname(file) or "."
    try:
        stats = os.statvfs(directory)
    except OSError:
        return cause
    if stats.f_flag & os.ST_RDONLY:
        return "readonly"
    if not os.access(directory, os.W_OK) or (
        os.path.exists(file) and not os.access(file, os.W_OK)
    ):
        return "denied"
    if cause != "readonly" and stats.f_bavail * stats.f_frsize < _NEARLY_FULL:
        return "full"
    return cause


class GuardedConnection(sqlite3.Connection):
    """A connection that turns storage faults into ``StorageFaultError``.

    ``label`` and ``file`` name what messages name; ``broken`` is set once the file is
    found damaged: every later statement but ROLLBACK is refused with that error.
    """

    label: str = "?"
    file: str = "?"
    broken: StorageFaultError | None = None
    quarantines = False  # an object's database: refused once found damaged
    # Failed statements that left no transaction open: SQLite rolls a transaction back
    # on some faults (I/O, full disk), and a COMMIT that fails is rolled back here.
    # Whoever holds work back for an open transaction (``JobTable``'s staged deletes)
    # compares this count to know that transaction is gone.
    rollbacks: int = 0

    def name(self, label: str, file: str, *, quarantines: bool = False) -> None:
        self.label = label
        self.file = file
        self.quarantines = quarantines

    def fault(self, exc: sqlite3.Error, sql: str = "") -> StorageFaultError | None:
        """Type ``exc`` raised by ``sql``; None if it is the SQL's own error."""
        try:
            return self._fault(exc, sql)
        finally:
            if not self.in_transaction:
                self.rollbacks += 1

    def _fault(self, exc: sqlite3.Error, sql: str) -> StorageFaultError | None:
        if fault_cause(exc) is None:
            return None
        error = fault_error(exc, label=self.label, file=self.file)
        if error.cause == "corrupt" and self.quarantines:
            self.broken = error
        if self.in_transaction and sql.lstrip()[:6].upper() == "COMMIT":
            # A transaction that cannot commit is dead: left open, the next write of
            # the object would join it (as if it were the caller's) and never commit.
            try:
                sqlite3.Connection.execute(self, "ROLLBACK")
            except sqlite3.Error:
                pass
        return error

    def refuse(self, sql: str) -> None:
        broken = self.broken
        if broken is not None and sql.lstrip()[:8].upper() != "ROLLBACK":
            raise StorageFaultError(
                f"{broken} -- the object is answered with this error until it leaves"
                " memory; its file is then moved to objects/quarantine/",
                label=broken.label, file=broken.file, cause=broken.cause,
            )

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if self.broken is not None:
            self.refuse(sql)
        try:
            return sqlite3.Connection.execute(self, sql, parameters)
        except sqlite3.DatabaseError as exc:
            error = self.fault(exc, sql)
            if error is None:
                raise
            raise error from exc

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        if self.broken is not None:
            self.refuse(sql)
        try:
            return sqlite3.Connection.executemany(self, sql, parameters)
        except sqlite3.DatabaseError as exc:
            error = self.fault(exc, sql)
            if error is None:
                raise
            raise error from exc

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        if self.broken is not None:
            self.refuse(sql_script)
        try:
            return sqlite3.Connection.executescript(self, sql_script)
        except sqlite3.DatabaseError as exc:
            error = self.fault(exc)
            if error is None:
                raise
            raise error from exc

    def commit(self) -> None:
        if self.broken is not None:
            self.refuse("COMMIT")
        try:
            sqlite3.Connection.commit(self)
        except sqlite3.DatabaseError as exc:
            error = self.fault(exc, "COMMIT")
            if error is None:
                raise
            raise error from exc
