"""A storage seam for fault tests: a files engine whose connections raise chosen SQLite
errors on chosen statements, typed exactly as the runtime types a real one."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from nursery_jobs._engines._faults import GuardedConnection
from nursery_jobs._engines.files._engine import FilesEngine

CODES = {"disk I/O error": 10, "database or disk is full": 13,
         "database disk image is malformed": 11, "database is locked": 5}


@attrs.define
class FaultPlan:
    """Which statements fail: ``when(label, sql, n)`` where ``n`` counts the statements
    of connections whose label ``counts`` accepts (1-based). ``hits`` records the
    statements that failed."""

    message: str = "disk I/O error"
    when: Callable[[str, str, int], bool] = lambda label, sql, n: False
    counts: Callable[[str], bool] = lambda label: True
    n: int = 0
    hits: list[tuple[str, str, int]] = attrs.Factory(list)
    enabled: bool = True
    # As SQLite does on some I/O errors: the failing statement rolls the whole
    # transaction back before it raises.
    rolls_back: bool = False

    def check(self, conn: GuardedConnection, sql: str) -> None:
        if not self.enabled or not self.counts(conn.label):
            return
        self.n += 1
        if not self.when(conn.label, sql, self.n):
            return
        self.hits.append((conn.label, sql, self.n))
        exc = (sqlite3.DatabaseError if "malformed" in self.message
               else sqlite3.OperationalError)(self.message)
        exc.sqlite_errorcode = CODES[self.message]  # type: ignore[attr-defined]
        if self.rolls_back and conn.in_transaction:
            sqlite3.Connection.execute(conn, "ROLLBACK")
        error = conn.fault(exc, sql)
        assert error is not None
        raise error from exc


def faulty_connection(plan: FaultPlan) -> type[GuardedConnection]:
    class FaultyConnection(GuardedConnection):
        def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
            if self.broken is None:
                plan.check(self, sql)
            return super().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
            if self.broken is None:
                plan.check(self, sql)
            return super().executemany(sql, parameters)

        def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
            if self.broken is None:
                plan.check(self, sql_script)
            return super().executescript(sql_script)

        def commit(self) -> None:
            if self.broken is None and self.in_transaction:
                plan.check(self, "COMMIT")
            super().commit()

    return FaultyConnection


def faulty_engine(path: str | os.PathLike[str], plan: FaultPlan) -> FilesEngine:
    engine = FilesEngine(path, synchronous="NORMAL")
    engine.connection_class = faulty_connection(plan)
    return engine


_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("BEGIN")
conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()
print("holding", flush=True)
sys.stdin.readline()
conn.rollback()
conn.close()
"""


@contextmanager
def held_by_another_process(path: Path) -> Iterator[Callable[[], None]]:
    """Another process holds a read transaction on the database ``path`` (its lock)
    until the ``release`` this yields is called, or the block ends. Synchronous: the
    process answers at once, and a Trio process API would let an autojump clock run."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "holding\n"
        stdin = holder.stdin

        def release() -> None:
            if holder.poll() is None:
                stdin.write("done\n")
                stdin.flush()
                holder.wait(10)

        try:
            yield release
        finally:
            release()
