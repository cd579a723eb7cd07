"""The PostgreSQL engine's statements: run in worker threads, on pooled connections.

Blocking psycopg calls run in worker threads, at most ``pool_size`` at once. A caller
cancelled meanwhile does not wait for its statement: the statement is cancelled on the
server (issue 22 #4), and every statement gives up by itself after ``lock_timeout`` /
``statement_timeout`` (tied to ``lease_ttl``). A statement that has not answered within a
tenth of ``lease_ttl`` is a stall: one ``storage:slow`` event per stall (``watch_stalls``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

import psycopg
import trio
import trio.testing
from psycopg_pool import ConnectionPool, PoolTimeout

from nursery_jobs._engines.base import EngineSite
from nursery_jobs._engines.postgres._leases import lease_clock, lease_sleep
from nursery_jobs._errors import StorageError

logger = logging.getLogger("nursery_jobs")

T = TypeVar("T")

# Server-side limits on the engine's statements, as multiples of lease_ttl (issue 22 #4:
# a foreign LOCK TABLE held 45 s stalled every statement, and the pool, for 45 s). A
# lock wait outlasts idle_in_transaction_session_timeout (lease_ttl: the row locks of a
# host stopped inside a transaction, which a host taking its objects over waits out);
# no statement of the engine takes a sizeable share of lease_ttl when the server is
# healthy. (Callers' deadlines do not wait for either: their statements are cancelled.)
LOCK_TIMEOUT_SHARE: Final = 1.5
STATEMENT_TIMEOUT_SHARE: Final = 3.0
# A statement unanswered for this share of lease_ttl is a stall (``storage:slow``).
STALL_SHARE: Final = 0.1
# ... and at least this long (seconds): a tiny lease_ttl (tests) would call every busy
# moment of a loaded machine a stall.
STALL_MIN: Final = 0.25
STALL_TICK_MIN: Final = 0.02  # the stall watch looks at most this often (seconds)
# Seconds the server is given to take a cancel request of a cancelled caller's statement.
CANCEL_TIMEOUT: Final = 5.0
# MockClocks (tests) whose autojump is held off while database waits are out:
# id(clock) -> [waits out, the threshold to restore].
_CLOCK_HOLDS: dict[int, list[Any]] = {}


class Db(Protocol):
    """``Statements.run``, as its collaborators take it."""

    async def __call__(self, fn: Callable[..., T], *args: Any,
                       finished: Callable[[], object] | None = None) -> T: ...


class _Statement:
    """One statement out in a worker thread, which a cancelled caller cancels on the
    server. The lock keeps a cancel request from reaching the connection once the
    statement is done (the connection may serve another caller by then)."""

    __slots__ = ("cancelled", "conn", "lock", "sent")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: psycopg.Connection[Any] | None = None
        self.cancelled = False
        self.sent = False

    def attach(self, conn: psycopg.Connection[Any]) -> bool:
        """In the worker thread, before the statement: False if it is not wanted."""
        with self.lock:
            self.conn = conn
            self.sent = not self.cancelled
            return self.sent

    def refuse(self) -> bool:
        """In the Trio thread, once its caller gave up on it: it will not be sent from
        now on; whether it was (it may be running, or have run)."""
        with self.lock:
            self.cancelled = True
            return self.sent

    def detach(self) -> None:
        """In the worker thread, once the statement is done (waits for a cancel request
        under way: it must reach this statement or nothing)."""
        with self.lock:
            self.conn = None

    def cancel(self) -> None:
        """In a thread of its own: cancel the statement if it is still running."""
        with self.lock:
            self.cancelled = True
            if self.conn is not None:
                try:
                    self.conn.cancel_safe(timeout=CANCEL_TIMEOUT)
                except Exception as exc:  # the statement ends by its timeouts anyway
                    logger.debug("could not cancel a statement: %s", exc)


class Statements:
    """The connection pool, the worker threads that use it, and the stall watch over
    the statements out. ``pool`` is None until ``open`` and once the engine closes."""

    def __init__(self, label: str, lease_ttl: float, pool_size: int,
                 stopping: threading.Event) -> None:
        self._label = label
        self._lease_ttl = lease_ttl
        self._pool_size = pool_size
        self._stopping = stopping
        self.pool: ConnectionPool[Any] | None = None
        self._limiter = trio.CapacityLimiter(pool_size)
        # Statements out (id -> when sent, lease_clock), for the stall watch.
        self._inflight: dict[int, float] = {}
        self._inflight_wake = trio.Event()
        self._stall_after = max(lease_ttl * STALL_SHARE, STALL_MIN)
        self._slow_seen = -math.inf  # when a statement was last seen slow
        # When a statement last came back with an answer (not cancelled, not failed): a
        # stall ends only after one (a blocked statement its caller gave up on, then the
        # next one blocked behind the same lock, is one stall, not two).
        self._answered = -math.inf
        self._stalled_since: float | None = None

    def open(self, dsn: str, commit: str) -> None:
        """Open the pool: every connection with the engine's session settings. Blocks."""
        # A host stopped (SIGSTOP, a partition) between the statements of a transaction
        # would keep its row locks — after a renewal's UPDATE, on every object it holds
        # — for as long as its connection lives, and hosts taking those objects over
        # would wait for it. The server ends a transaction idle for the lease's length
        # (a live host never idles inside one: its statements run back to back).
        idle_ms = max(1, math.ceil(self._lease_ttl * 1000))
        lock_ms = max(1, math.ceil(self._lease_ttl * LOCK_TIMEOUT_SHARE * 1000))
        statement_ms = max(1, math.ceil(self._lease_ttl * STATEMENT_TIMEOUT_SHARE * 1000))

        def configure(conn: psycopg.Connection[Any]) -> None:
            conn.execute(f"SET synchronous_commit = {commit}")
            conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
            conn.execute(f"SET lock_timeout = {lock_ms}")
            conn.execute(f"SET statement_timeout = {statement_ms}")

        pool: ConnectionPool[Any] = ConnectionPool(
            dsn, min_size=2, max_size=self._pool_size, open=False,
            kwargs={"autocommit": True}, configure=configure, name="nursery_jobs",
        )
        try:
            pool.open(wait=True, timeout=10.0)
        except BaseException as exc:
            pool.close()
            if isinstance(exc, (psycopg.Error, PoolTimeout)):
                raise StorageError(f"cannot open PostgreSQL {self._label}: {exc}") from exc
            raise
        self.pool = pool

    async def run(self, fn: Callable[..., T], *args: Any,
                  finished: Callable[[], object] | None = None) -> T:
        """Run ``fn(conn, *args)`` on a pooled connection in a worker thread. Where the
        caller is cancelled meanwhile, the statement is cancelled on the server and the
        caller does not wait for it (whether it took effect is unknown to the caller:
        every caller handles that as it handles a lost answer). ``finished`` is called
        in the Trio thread once the worker thread is done with the statement, answered
        or abandoned."""
        pool = self.pool
        if pool is None:
            if finished is not None:
                finished()
            raise StorageError(f"the PostgreSQL engine on {self._label} is closed")
        statement = _Statement()
        token = trio.lowlevel.current_trio_token() if finished is not None else None

        def run() -> T:
            try:
                with pool.connection() as conn:
                    if not statement.attach(conn):
                        raise psycopg.errors.QueryCanceled("cancelled before it was sent")
                    try:
                        return fn(conn, *args)
                    finally:
                        statement.detach()
            finally:
                if token is not None and finished is not None:
                    # (the caller may be gone: this thread was abandoned)
                    with contextlib.suppress(trio.RunFinishedError):
                        token.run_sync_soon(finished)

        inflight = self._inflight
        if not inflight:
            self._inflight_wake.set()
        sent = lease_clock()
        inflight[id(statement)] = sent
        answered = False
        try:
            clock = trio.lowlevel.current_clock()
            if not isinstance(clock, trio.testing.MockClock):
                result = await trio.to_thread.run_sync(
                    run, limiter=self._limiter, abandon_on_cancel=True
                )
            else:
                result = await self._run_held(clock, run)
            answered = True
            return result
        except BaseException as exc:
            if statement.refuse():
                if isinstance(exc, trio.Cancelled):
                    trio.lowlevel.start_thread_soon(statement.cancel, _ignore)
            elif finished is not None:
                # Never sent, and never will be (a cancel while waiting for the limiter
                # or a connection: the worker thread may not even have started): no
                # statement is out. (The worker, if any, calls it again: harmless.)
                finished()
            raise
        finally:
            del inflight[id(statement)]
            done = lease_clock()
            if done - sent >= self._stall_after:
                self._slow_seen = done
            if answered:
                self._answered = done  # (a slow one answered counts: the stall is over)

    async def _run_held(self, clock: trio.testing.MockClock, run: Callable[[], T]) -> T:
        # Under a MockClock (tests), virtual time must not jump while we wait for the
        # database: autojump fires when every task is blocked, and a worker thread is
        # no task. Lift the threshold while any database wait is out (restored by the
        # last one). No task spins meanwhile: the CPU stays with the server.
        hold = _CLOCK_HOLDS.setdefault(id(clock), [0, clock.autojump_threshold])
        if hold[0] == 0:
            hold[1] = clock.autojump_threshold
            clock.autojump_threshold = math.inf
        hold[0] += 1
        try:
            return await trio.to_thread.run_sync(run, limiter=self._limiter,
                                                 abandon_on_cancel=True)
        finally:
            hold[0] -= 1
            if hold[0] == 0:
                clock.autojump_threshold = hold[1]
                del _CLOCK_HOLDS[id(clock)]

    async def watch_stalls(self, site: EngineSite) -> None:
        """Emit ``storage:slow`` once per stall: from the first statement unanswered for
        ``lease_ttl * STALL_SHARE`` until a statement is answered and that long passes
        with none out for a tick (a quarter of it) meanwhile."""
        after = self._stall_after
        tick = max(after / 4, STALL_TICK_MIN)
        while True:
            if not self._inflight and (self._stalled_since is None
                                       or self._answered < self._slow_seen):
                # (Stalled with nothing out and no answer since: only a statement sent
                # can end it.)
                self._inflight_wake = trio.Event()
                await self._inflight_wake.wait()
            await lease_sleep(tick, self._stopping)
            now = lease_clock()
            oldest = min(self._inflight.values(), default=now)
            # Once stalled, a statement out for a tick keeps the stall on: the next one
            # sent behind the same lock is not slow yet, but it is not answered either,
            # and a quick answer meanwhile (a lease renewal, another table) is no sign
            # that the lock went (one stall was two ``storage:slow`` events that way).
            if now - oldest >= (after if self._stalled_since is None else tick):
                self._slow_seen = now
            if now - self._slow_seen < after:
                if self._stalled_since is None:
                    self._stalled_since = oldest
                    waiting = len(self._inflight)
                    site.events.emit(
                        "storage:slow", "", "", seconds=round(now - oldest, 3),
                        statements=waiting, location=self._label,
                        _log=(logging.WARNING,
                              "PostgreSQL %s has not answered for %.1f s (%d statements"
                              " waiting: a lock held by another session, or the server"
                              " overloaded or out of reach); statements give up after"
                              " %.1f s waiting for a lock, %.1f s in all",
                              (self._label, now - oldest, waiting,
                               self._lease_ttl * LOCK_TIMEOUT_SHARE,
                               self._lease_ttl * STATEMENT_TIMEOUT_SHARE)))
            elif self._stalled_since is not None and self._answered >= self._slow_seen:
                logger.info("PostgreSQL %s answers again, after a stall of %.1f s",
                            self._label, self._slow_seen - self._stalled_since)
                self._stalled_since = None


def _ignore(_: object) -> None:
    """``start_thread_soon``'s deliver: the cancel thread reports nothing."""
