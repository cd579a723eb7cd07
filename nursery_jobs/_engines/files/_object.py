"""SqliteObject: the state of one object of the files or memory engine — its own SQLite
database, its alarm in the engine's catalog, its crash tokens — and, for a data
directory, the database's close while the object stays resident (``dormant_after``)
and its reopen in place.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio
import trio.testing

from nursery_jobs._engines._faults import GuardedConnection

if TYPE_CHECKING:
    from nursery_jobs._engines.files._engine import CatalogEngine

logger = logging.getLogger("nursery_jobs")


class SqliteObject:
    """An object's state in a SQLite database of its own (files or memory engine)."""

    __slots__ = ("_crashes", "_engine", "_reopen", "_thread_done", "alarm", "conn", "dormant",
                 "file", "namespace", "object_id")
    ships = False  # every commit is durable when it returns
    settled = True  # (nothing ever waits to ship)

    def admit(self) -> None:
        """Nothing else can take a data directory's object (the runtime's lock)."""

    def __init__(
        self, engine: CatalogEngine, conn: GuardedConnection, namespace: str, object_id: str,
        *, file: str, reopen: Callable[[GuardedConnection], None] | None,
    ) -> None:
        self._engine = engine
        self.conn = conn
        self.namespace = namespace
        self.object_id = object_id
        self.file = file
        # How to open the closed file again in place (None: an in-memory database,
        # kept open as long as its engine).
        self._reopen = reopen
        self.dormant = False  # the database is closed while the object stays resident
        # Set when the close running in a worker thread has finished.
        self._thread_done: trio.Event | None = None
        self._crashes: bool | None = None  # whether crash tokens were found (None: unread)
        self.alarm = engine.get_alarm(namespace, object_id)

    @property
    def closing(self) -> bool:
        return self._thread_done is not None

    @property
    def can_sleep(self) -> bool:
        return self._reopen is not None  # (an in-memory database is never closed)

    def write_alarm(self, time: float | None, retry: int) -> None:
        self._engine.write_alarm(self.namespace, self.object_id, time, retry)

    def crash_tokens(self) -> list[tuple[str, float]]:
        tokens = self._engine.catalog.crashes(self.namespace, self.object_id)
        self._crashes = bool(tokens)
        return tokens

    def clear_crash_tokens(self) -> None:
        # No write when there was nothing to clear: one catalog commit fewer per
        # activation, and none to fail on a full disk.
        if self._crashes is not False:
            self._engine.catalog.clear_crashes(self.namespace, self.object_id)
            self._crashes = False

    async def sync(self) -> None:
        await trio.lowlevel.checkpoint()  # every commit here is durable when it returns

    async def sleep(self) -> bool:
        """Close the database while the object stays resident (dormant). False, with
        nothing closed, where it cannot: an in-memory database, an open transaction,
        a damaged file. Checkpoints.

        The close checkpoints the WAL into the file, with an fsync (~1 ms here, and
        0.5 s seen on a loaded disk), so it runs in a worker thread (``sqlite3``
        releases the GIL there) and never holds up the Trio thread; nothing uses the
        connection meanwhile (it is dormant from the start), and ``wake`` waits for it.
        The reopen runs inline: ~0.35 ms, which its caller waits for anyway, where a
        thread's round trip made a call on a dormant object ~3x slower (measured)."""
        conn = self.conn
        if (self._reopen is None or self.dormant or conn.broken is not None
                or conn.in_transaction):
            await trio.lowlevel.checkpoint()
            return False
        self.dormant = True
        self._thread_done = closing = trio.Event()
        try:
            await _off_thread(conn.close)
        finally:
            self._thread_done = None
            closing.set()
        return True

    async def wake(self) -> None:
        """Open a dormant object's database again, in place (once a close still
        running has finished). Checkpoints.

        Raises:
            StorageFaultError: it cannot be opened (locked by another process since it
                was closed, moved away, damaged); it stays dormant.
        """
        if self._thread_done is not None:
            await self._thread_done.wait()
        if not self.dormant:
            await trio.lowlevel.checkpoint()
            return
        conn = self.conn
        if conn.broken is not None:
            await trio.lowlevel.checkpoint()
            conn.refuse("")
        assert self._reopen is not None
        self._reopen(conn)
        self.dormant = False
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        conn = self.conn
        if self.dormant:
            # Closed already: nothing to roll back, nothing to close. (After a reopen
            # that failed, the file gone, close() itself would raise.)
            if conn.broken is not None:
                self._engine.quarantine(self.namespace, self.object_id, self.file,
                                        conn.broken)
            return
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")  # never leave a half-written transaction behind
        except sqlite3.Error:
            logger.warning("rolling back the open transaction of %s/%s failed",
                           self.namespace, self.object_id, exc_info=True)
        if self._reopen is not None:
            conn.close()
        if conn.broken is not None:
            self._engine.quarantine(self.namespace, self.object_id, self.file, conn.broken)


async def _off_thread(fn: Callable[..., object], *args: object) -> None:
    """Run ``fn`` in a worker thread, waiting for it even if cancelled. Under a
    ``MockClock`` inline: a thread would let the autojump clock run on meanwhile."""
    if isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
        fn(*args)
        await trio.lowlevel.checkpoint()
    else:
        await trio.to_thread.run_sync(fn, *args)
