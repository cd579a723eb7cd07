"""The PostgreSQL engine (design section 9): every runtime that opens the same database
is a host of one cluster; PostgreSQL is the only coordinator.

- An object runs on the host holding its lease (``owner``, ``epoch``, ``lease_until`` on
  its ``nj_objects`` row); its state is a working copy (``_pg_copy``) whose commits ship
  as fenced transactions (``_pg_ops.ship``); ships of different objects that arrive while
  one is out share the next round trip (``_pg_batch``, group commit).
- The timer reads a local alarm index: the alarms of the objects this host holds. The
  serve task claims due objects nobody holds (``_pg_ops.claim``), renews the leases,
  releases evicted objects, ships the flight list and runs forwarded calls
  (``_pg_calls``). One listening connection (a thread) wakes it early.
- Blocking psycopg calls run in worker threads, at most ``pool_size`` at once. A caller
  cancelled meanwhile does not wait for its statement: the statement is cancelled on the
  server (issue 22 #4), and every statement gives up by itself after ``lock_timeout`` /
  ``statement_timeout`` (tied to ``lease_ttl``). A statement that has not answered
  within a tenth of ``lease_ttl`` is a stall: one ``storage:slow`` event per stall.
- A host claims the alarms of the namespaces its runtime resolves to a class only; one
  it cannot resolve is logged once and left to the hosts that can.
- ``client_only``: the runtime registers no host row, holds no object and claims no
  alarm; it sends every call to the host holding the object, or to any live host,
  which takes it (``_pg_ops.locate``).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, NoReturn, TypeVar

import psycopg
import trio
import trio.testing
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from nursery_jobs import _clock
from nursery_jobs._engines.base import EngineSite
from nursery_jobs._engines.postgres import _ops as ops
from nursery_jobs._engines.postgres._batch import ShipBatcher, ShipStatistics
from nursery_jobs._engines.postgres._calls import POLL, CallRouter, announced_call, channel, take
from nursery_jobs._engines.postgres._copy import (
    SHIPPED,
    STALE,
    Change,
    PgObject,
    load_copy,
)
from nursery_jobs._engines.postgres._schema import ensure_schema
from nursery_jobs._errors import ObjectFencedError, ObjectLeasedElsewhere, RpcError, StorageError

logger = logging.getLogger("nursery_jobs")

T = TypeVar("T")
Key = tuple[str, str]

# The claim loop looks for due, unleased objects at least this often (seconds).
POLL_INTERVAL: Final = 1.0
# Objects claimed per statement, and claimed but not yet activated at most.
CLAIM_BATCH: Final = 64
MAX_UNACTIVATED: Final = 256
# The flight list ships at most this often while it changes (seconds): a job that kills
# its host sooner than this after it starts may get no crash strike for that death.
FLIGHT_INTERVAL: Final = 0.02
# Active objects' commits ship in the background at least this often (seconds), besides
# the output gate's syncs: a host's death re-runs at most this much completed work (the
# completion group's bound, in time: a long alarm run syncs only at its end).
SHIP_INTERVAL: Final = 0.05
# Every this many renewals (about a minute at the default lease_ttl) the host deletes
# dead hosts' rows and abandoned call rows older than CALL_MAX_AGE seconds (_pg_ops.sweep).
SWEEP_EVERY: Final = 20
CALL_MAX_AGE: Final = 600.0
_COMMIT: Final = {"NORMAL": "off", "FULL": "on"}
# A lease is trusted for this share of lease_ttl after the statement that took or
# renewed it was sent (the rest absorbs clock-rate differences with the server).
LEASE_TRUST: Final = 0.9
_BOOTTIME: Final = getattr(time, "CLOCK_BOOTTIME", None)
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


def lease_clock() -> float:
    """Seconds on a clock that keeps running while this process is stopped or the
    machine sleeps (CLOCK_BOOTTIME where there is one): the server's clock, which ends
    leases, runs on meanwhile. Not Trio's clock: a MockClock's virtual time is not the
    server's."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()
# A host forwarding calls to an object another host holds remembers that host this long
# (seconds) instead of asking PostgreSQL before every call (a transaction: ~0.9 ms of a
# ~4 ms forwarded call in `nursery-jobs bench --engine postgres`). A stale answer costs
# little: the old holder answers "moved", or stops answering, and the call asks again.
OWNER_HINT_TTL: Final = 1.0
# A namespace this host cannot resolve to a class is looked at again after this many
# seconds (a module imported since, a class defined later); logged the first time only.
UNSERVED_RECHECK: Final = 60.0
# MockClocks (tests) whose autojump is held off while database waits are out:
# id(clock) -> [waits out, the threshold to restore].
_CLOCK_HOLDS: dict[int, list[Any]] = {}


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


class _Flight:
    """A flight slot: the job an alarm run is running, shipped with the host's list."""

    __slots__ = ("_admit", "_changed", "entry")

    def __init__(self, entry: list[Any], changed: Callable[[], None],
                 admit: Callable[[], None]) -> None:
        self.entry = entry
        self._changed = changed
        self._admit = admit

    def record(self, token: str, started: float) -> None:
        """Note the job about to start; refuse it (ObjectFencedError) where this host's
        lease on the object is not known to hold."""
        self._admit()
        self.entry[2] = token
        self.entry[3] = started
        self._changed()

    def clear(self) -> None:
        self.entry[2] = ""
        self._changed()


class PostgresEngine:
    """Objects, alarms and leases in a PostgreSQL database shared by many hosts.

    Args:
        dsn: a ``postgresql://`` address (or any libpq connection string).
        lease_ttl: seconds a host's lease on an object lasts without renewal (renewed
            every ``lease_ttl / 3``); a dead host's objects move after this long.
        pool_size: connections (and worker threads) for PostgreSQL I/O.
        synchronous: "NORMAL" (``synchronous_commit = off``: a commit survives the
            host's death, not the server's) or "FULL" (``on``).
        client_only: hold no object, claim no alarm: every call goes to a host.
    """

    holds_files = False  # (see Engine.holds_files)
    default_max_active = None  # (see Engine.default_max_active)

    def __init__(
        self, dsn: str, *, lease_ttl: float = 10.0, pool_size: int = 8,
        synchronous: str = "NORMAL", client_only: bool = False,
    ) -> None:
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, (int, float)) or not (
            0 < lease_ttl < math.inf
        ):
            raise ValueError(f"lease_ttl must be a finite number of seconds > 0, got {lease_ttl!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 2:
            raise ValueError(f"pool_size must be an int >= 2, got {pool_size!r}")
        commit = _COMMIT.get(synchronous.upper())
        if commit is None:
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        if not isinstance(client_only, bool):
            raise TypeError(f"client_only must be a bool, got {client_only!r}")
        self.client_only = client_only
        self.dsn = dsn
        self.lease_ttl = float(lease_ttl)
        self.pool_size = pool_size
        self._commit = commit
        self.host_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._label = _safe_label(dsn)
        self._pool: ConnectionPool[Any] | None = None
        self._limiter = trio.CapacityLimiter(pool_size)
        self._held: dict[Key, int] = {}  # leases this host holds: key -> epoch
        # Until when (lease_clock) each held lease is known to hold: the send time of the
        # last statement that took, renewed or shipped under it, plus LEASE_TRUST * ttl.
        self._trusted: dict[Key, float] = {}
        self._active: dict[Key, PgObject] = {}
        # Set when an active object has something to ship (see ``_ship_loop``).
        self._to_ship = trio.Event()
        self._ship_passes = 0
        self._elsewhere: dict[Key, tuple[str, float]] = {}  # key -> (holder, hint expiry)
        self._alarms: dict[Key, tuple[float, int]] = {}  # the alarms of held objects
        # The same alarms as a heap of (time, key), for ``due`` and ``next_alarm_after``
        # without a scan of every held object. Entries go stale when an alarm moves or
        # goes (an entry counts only while ``_alarms`` has that time for its key); the
        # heap is rebuilt when stale entries outnumber live ones.
        self._alarm_heap: list[tuple[float, Key]] = []
        # Per object, the end of its last ship abandoned by a cancelled caller (see _ship).
        self._ships_out: dict[Key, trio.Event] = {}
        # Group commit: ships of many objects share round trips (issue 26).
        self._batcher = ShipBatcher(self._ship_batch)
        self._classes: dict[str, str] = {}
        # Namespaces whose alarms this host claims (its runtime resolves them), and
        # those it does not: namespace -> when (Trio time) to look at it again.
        self._served: set[str] = set()
        self._unserved: dict[str, float] = {}
        self._unserved_logged: set[str] = set()
        self._flights: dict[int, list[Any]] = {}
        self._flight_dirty = False
        self._flight_event = trio.Event()
        self._releases: list[tuple[str, str, int]] = []
        self._alarm_writes: list[tuple[str, str, float, int]] = []
        self._release_event = trio.Event()
        self._claim_wake = trio.Event()
        self._site: EngineSite | None = None
        self._calls = CallRouter(self.host_id, self._db, self._holds)
        self._stopping = threading.Event()
        self._listener: threading.Thread | None = None
        # Statements out (id -> when sent, lease_clock), for the stall watch.
        self._inflight: dict[int, float] = {}
        self._inflight_wake = trio.Event()
        self._stall_after = max(self.lease_ttl * STALL_SHARE, STALL_MIN)
        self._slow_seen = -math.inf  # when a statement was last seen slow
        self._stalled_since: float | None = None

    @property
    def label(self) -> str:
        return self._label

    # -- opening and closing -----------------------------------------------------------
    def open(self, now: float) -> None:
        """Connect, create or check the schema, and register this host. Blocks."""
        commit = self._commit
        # A host stopped (SIGSTOP, a partition) between the statements of a transaction
        # would keep its row locks — after a renewal's UPDATE, on every object it holds
        # — for as long as its connection lives, and hosts taking those objects over
        # would wait for it. The server ends a transaction idle for the lease's length
        # (a live host never idles inside one: its statements run back to back).
        idle_ms = max(1, math.ceil(self.lease_ttl * 1000))
        lock_ms = max(1, math.ceil(self.lease_ttl * LOCK_TIMEOUT_SHARE * 1000))
        statement_ms = max(1, math.ceil(self.lease_ttl * STATEMENT_TIMEOUT_SHARE * 1000))

        def configure(conn: psycopg.Connection[Any]) -> None:
            conn.execute(f"SET synchronous_commit = {commit}")
            conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
            conn.execute(f"SET lock_timeout = {lock_ms}")
            conn.execute(f"SET statement_timeout = {statement_ms}")

        try:
            # One connection first: a server that cannot be reached fails at once
            # (the pool would retry until its timeout).
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f"SET lock_timeout = {lock_ms}")
                ensure_schema(conn, self._label)
                if not self.client_only:  # (a client is no host: no call is sent to it)
                    conn.execute("INSERT INTO nj_hosts (host_id) VALUES (%s)",
                                 (self.host_id,))
                self._classes.update(
                    conn.execute("SELECT namespace, class_path FROM nj_namespaces").fetchall()
                )
        except psycopg.Error as exc:
            raise StorageError(f"cannot open PostgreSQL {self._label}: {exc}") from exc
        pool: ConnectionPool[Any] = ConnectionPool(
            self.dsn, min_size=2, max_size=self.pool_size, open=False,
            kwargs={"autocommit": True}, configure=configure, name="nursery_jobs",
        )
        try:
            pool.open(wait=True, timeout=10.0)
        except BaseException as exc:
            pool.close()
            if isinstance(exc, (psycopg.Error, PoolTimeout)):
                raise StorageError(f"cannot open PostgreSQL {self._label}: {exc}") from exc
            raise
        self._pool = pool

    def close(self) -> None:
        """Stop listening, give up every lease, leave the cluster. Idempotent."""
        self._stopping.set()
        if self._listener is not None:
            self._listener.join(timeout=5.0)
            self._listener = None
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            with pool.connection(timeout=5.0) as conn:
                ops.release_all(conn, self.host_id)
        except Exception as exc:
            logger.warning("could not release the leases of host %s on %s: %s",
                           self.host_id, self._label, exc)
        finally:
            pool.close()
        self._held.clear()
        self._trusted.clear()
        self._alarms.clear()
        self._alarm_heap.clear()

    async def _db(self, fn: Callable[..., T], *args: Any,
                  finished: Callable[[], object] | None = None) -> T:
        """Run ``fn(conn, *args)`` on a pooled connection in a worker thread. Where the
        caller is cancelled meanwhile, the statement is cancelled on the server and the
        caller does not wait for it (whether it took effect is unknown to the caller:
        every caller handles that as it handles a lost answer). ``finished`` is called
        in the Trio thread once the worker thread is done with the statement, answered
        or abandoned."""
        pool = self._pool
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
        try:
            clock = trio.lowlevel.current_clock()
            if not isinstance(clock, trio.testing.MockClock):
                return await trio.to_thread.run_sync(
                    run, limiter=self._limiter, abandon_on_cancel=True
                )
            return await self._db_held(clock, run)
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
            if lease_clock() - sent >= self._stall_after:
                self._slow_seen = lease_clock()

    async def _db_held(self, clock: trio.testing.MockClock, run: Callable[[], T]) -> T:
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

    async def read(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` in one read-only, repeatable-read transaction (a consistent
        snapshot) on a pooled connection, in a worker thread: what the operator faces
        (the dashboard, ``/api``, ``/metrics``) read while this host runs. ``fn`` must
        not touch the runtime (it runs outside the Trio thread). Checkpoints.

        Raises:
            StorageError: PostgreSQL could not be read (or the engine is closed).
        """
        try:
            return await self._db(ops.read_only, fn)
        except psycopg.Error as exc:
            raise StorageError(f"cannot read PostgreSQL {self._label}: {exc}") from exc

    # -- objects ----------------------------------------------------------------------
    async def open_object(self, namespace: str, object_id: str, class_path: str) -> PgObject:
        key = (namespace, object_id)
        label = f"{namespace}/{object_id}"
        self._classes[namespace] = class_path
        if not self.client_only:
            self._served.add(namespace)  # (its class is in hand: the call's)
        hint = self._elsewhere.get(key)
        if hint is not None and key not in self._held and trio.current_time() < hint[1]:
            await trio.lowlevel.checkpoint()
            raise ObjectLeasedElsewhere(label, hint[0], self._forwarder(
                key, hint[0], class_path, place=self.client_only))
        if self.client_only:
            await self._send_to_host(key, label, class_path)
        sent = lease_clock()
        try:
            taken = await self._db(ops.take, self.host_id, self.lease_ttl, namespace,
                                   object_id, class_path, _clock.now())
        except psycopg.Error as exc:
            raise StorageError(f"cannot open {label} on PostgreSQL {self._label}: {exc}") from exc
        if isinstance(taken, str):
            self._drop(key)
            if len(self._elsewhere) >= 10_000:
                self._elsewhere.clear()
            self._elsewhere[key] = (taken, trio.current_time() + OWNER_HINT_TTL)
            raise ObjectLeasedElsewhere(label, taken, self._forwarder(key, taken, class_path))
        try:
            conn = load_copy(label, taken.rows, captured=self._wake_ship_loop)
        except BaseException:
            self._releases.append((namespace, object_id, taken.epoch))
            self._release_event.set()
            raise
        state = PgObject(key, taken.epoch, conn, taken.alarm, taken.tokens, ship=self._ship,
                         to_ship=self._wake_ship_loop,
                         on_close=self._state_closed, on_alarm=self._local_alarm,
                         admit=functools.partial(self._admit, key, taken.epoch),
                         version=taken.version)
        self._hold(key, taken.epoch, sent)
        self._active[key] = state
        if taken.alarm is None:
            self._alarms.pop(key, None)
        else:
            self._index_alarm(key, taken.alarm)
            if self._site is not None:
                self._site.wake_timer()  # the timer now serves this alarm
        return state

    async def _send_to_host(self, key: Key, label: str, class_path: str) -> NoReturn:
        """(client_only) Raise ``ObjectLeasedElsewhere`` for the host that holds the
        object, or any live host, which takes it.

        Raises:
            RpcError: no host is running on this database.
            StorageError: PostgreSQL cannot be read.
        """
        try:
            target = await self._db(ops.locate, key[0], key[1], self.lease_ttl)
        except psycopg.Error as exc:
            raise StorageError(f"cannot reach {label} on PostgreSQL {self._label}: {exc}"
                               "; nothing ran") from exc
        if target is None:
            raise RpcError(
                f"{label}: no host is running on PostgreSQL {self._label}; this runtime is"
                " client_only (it runs no object): start a runtime without client_only"
                " there; nothing ran")
        self._elsewhere[key] = (target, trio.current_time() + OWNER_HINT_TTL)
        raise ObjectLeasedElsewhere(label, target,
                                    self._forwarder(key, target, class_path, place=True))

    def _forwarder(
        self, key: Key, target: str, class_path: str, *, place: bool = False
    ) -> Callable[..., Any]:
        """``ObjectLeasedElsewhere.forward`` for a call to ``key`` at host ``target``:
        where the call finds the object gone from there, forget the hint first."""

        async def fresh(again: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            self._elsewhere.pop(key, None)
            return await again(*args, **kwargs)

        async def forward(cls: Any, object_id: str, name: str, args: tuple[Any, ...],
                          kwargs: dict[str, Any], again: Callable[..., Any],
                          chain: tuple[str, ...], trace: str | None = None) -> Any:
            try:
                return await self._calls.forward(
                    target, cls, object_id, name, args, kwargs,
                    functools.partial(fresh, again), class_path=class_path, chain=chain,
                    place=place, trace=trace,
                )
            except RpcError:
                self._elsewhere.pop(key, None)
                raise

        return forward

    def _holds(self, namespace: str, object_id: str) -> bool:
        return (namespace, object_id) in self._held

    def _drop(self, key: Key) -> None:
        self._held.pop(key, None)
        self._trusted.pop(key, None)
        self._alarms.pop(key, None)

    def _hold(self, key: Key, epoch: int, sent: float) -> bool:
        """A statement sent at ``sent`` took the lease on ``key`` at ``epoch`` (a take
        or a claim): hold and trust it, unless a newer one of this host's is held
        already — the answers of its takes and claims come back in any order, and an
        older one set back would make the live copy look lapsed (``_admit``)."""
        if epoch <= self._held.get(key, -1):
            return False
        self._held[key] = epoch
        self._trust(key, sent)
        return True

    def _trust(self, key: Key, sent: float) -> None:
        """A statement sent at ``sent`` took or extended the lease on ``key``: the
        server's ``lease_until`` is at least ``ttl`` past that."""
        until = sent + self.lease_ttl * LEASE_TRUST
        if until > self._trusted.get(key, -math.inf):
            self._trusted[key] = until

    def _admit(self, key: Key, epoch: int) -> None:
        """Before a job or a call of ``key`` starts on its copy opened under lease
        ``epoch``: is that lease known to hold? A host that was paused (SIGSTOP, a
        stalled loop, a partition) past its lease may find, when it runs again, jobs due
        on objects another host has taken since; the fence refuses their writes, but the
        jobs must not even start (their external effects would run twice). So the object
        is dropped here as fenced, before its renewal could tell; if the lease did hold,
        the object is simply activated again. The lease must be the copy's own: this
        host's claim may have taken the object again meanwhile (a newer epoch, trusted)
        while the copy of the lapsed one is still open."""
        if self._held.get(key) == epoch and lease_clock() < self._trusted.get(key, -math.inf):
            return
        held = self._held.get(key)
        if held is not None and held != epoch:
            reason = (f"this host's lease on it (epoch {epoch}) lapsed and the object was"
                      f" taken again since (epoch {held}); its copy of the lapsed lease is"
                      " dropped")
        else:
            # Not "taken over": a lone host whose renewals PostgreSQL did not answer in
            # time (a foreign lock, an outage) lands here too (issue 22 #4).
            reason = (f"this host's lease on it was not renewed within lease_ttl"
                      f" ({self.lease_ttl} s: PostgreSQL slow or out of reach, or this"
                      " host paused); another host may take it over")
        if self._site is not None and key in self._active:
            self._site.fenced(*key, reason=reason)
        raise ObjectFencedError(
            f"{key[0]}/{key[1]}: {reason}; so no job or call of it starts on that copy",
            reason=reason,
        )

    async def _ship(self, change: Change) -> str:
        key = (change.namespace, change.object_id)
        # A ship abandoned by its cancelled caller may still be out: the next one waits
        # for it to end (at most the statement timeout), so that ships of an object
        # never overlap — the base a ship accepts (``Change.unsure``) is then made by
        # the ships before it, never by an older one landing after it.
        out = self._ships_out.get(key)
        if out is not None:
            await out.wait()
        self._ships_out[key] = finished = trio.Event()
        sent = lease_clock()
        try:
            shipped = await self._batcher.ship(change, finished)
        except psycopg.Error as exc:
            raise StorageError(
                f"cannot ship the writes of {key[0]}/{key[1]} to PostgreSQL"
                f" {self._label}: {exc}. They are kept on this host and ship with its next"
                " sync (lost only if this host stops first): a call that is not"
                " idempotent should not simply be repeated"
            ) from exc
        if self._ships_out.get(key) is finished:
            del self._ships_out[key]  # (it ended: its answer came back)
        if self._held.get(key) == change.epoch:
            if shipped == SHIPPED:
                self._trust(key, sent)  # the ship extended the lease
            else:
                self._drop(key)
                if shipped == STALE:
                    # The lease holds, the base is gone: give the lease up (the state's
                    # close finds it dropped) so that the object reloads at once — on
                    # its next use, or its alarm's claim.
                    self._releases.append((key[0], key[1], change.epoch))
                    self._release_event.set()
        return shipped

    async def _ship_batch(self, changes: list[Change], finished: Callable[[], object]
                          ) -> list[str]:
        """One round trip of the ship batcher: a lone change as ``ops.ship``, several
        as ``ops.ship_many`` (one statement: each object's fence, each its outcome)."""
        if len(changes) == 1:
            return [await self._db(ops.ship, self.host_id, self.lease_ttl, changes[0],
                                   finished=finished)]
        return await self._db(ops.ship_many, self.host_id, self.lease_ttl, changes,
                              finished=finished)

    def ship_statistics(self) -> ShipStatistics:
        """Ships sent by this host so far, and the round trips that carried them."""
        return self._batcher.statistics()

    def _local_alarm(self, state: PgObject, time: float | None, retry: int) -> None:
        if self._active.get(state.key) is not state:
            return
        if time is None:
            self._alarms.pop(state.key, None)
        else:
            self._index_alarm(state.key, (time, retry))

    def _state_closed(self, state: PgObject) -> None:
        key = state.key
        out = self._ships_out.get(key)
        if out is not None and out.is_set():
            del self._ships_out[key]
        if self._active.get(key) is state:
            del self._active[key]
        if self._held.get(key) == state.epoch:
            self._drop(key)
            self._releases.append((key[0], key[1], state.epoch))
            self._release_event.set()

    def destroy_object(self, namespace: str, object_id: str) -> None:
        # Blocks the Trio thread for one transaction: rare, and a queued delete could
        # race the object's next activation.
        if self._pool is None:
            return
        try:
            with self._pool.connection() as conn:
                ops.destroy(conn, self.host_id, namespace, object_id)
        except psycopg.Error as exc:
            logger.error("could not delete %s/%s on %s: %s", namespace, object_id,
                         self._label, exc)

    def class_path(self, namespace: str) -> str | None:
        return self._classes.get(namespace)

    # -- the alarm index: this host's held objects ----------------------------------------
    def _index_alarm(self, key: Key, alarm: tuple[float, int]) -> None:
        old = self._alarms.get(key)
        self._alarms[key] = alarm
        if old is not None and old[0] == alarm[0]:
            return  # the heap entry for this time is live already
        heap = self._alarm_heap
        heapq.heappush(heap, (alarm[0], key))
        if len(heap) > 2 * len(self._alarms) + 64:
            self._alarm_heap = heap = [(t, k) for k, (t, _) in self._alarms.items()]
            heapq.heapify(heap)

    def _live(self, time: float, key: Key) -> bool:
        alarm = self._alarms.get(key)
        return alarm is not None and alarm[0] == time

    def due(self, now: float, limit: int) -> list[tuple[str, str]]:
        # Walk the heap's subtree of entries <= now (every other entry's children are
        # later still): the cost is the number of due entries, not of held objects.
        heap, found, stack = self._alarm_heap, [], [0]
        while stack:
            i = stack.pop()
            if i >= len(heap) or heap[i][0] > now:
                continue
            if self._live(*heap[i]):
                found.append(heap[i])
            stack += (2 * i + 1, 2 * i + 2)
        return [key for _, key in heapq.nsmallest(limit, set(found))]

    def next_alarm_after(self, now: float) -> float | None:
        heap, best, stack = self._alarm_heap, math.inf, [0]
        while stack:
            i = stack.pop()
            if i >= len(heap) or heap[i][0] >= best:
                continue
            time, key = heap[i]
            if time > now and self._live(time, key):
                best = time  # its children are no earlier
                continue
            stack += (2 * i + 1, 2 * i + 2)
        return None if best == math.inf else best

    def get_alarm(self, namespace: str, object_id: str) -> tuple[float, int] | None:
        return self._alarms.get((namespace, object_id))

    def set_alarm(self, namespace: str, object_id: str, time: float, retry: int) -> None:
        key = (namespace, object_id)
        if key in self._held:
            self._index_alarm(key, (time, retry))
        self._alarm_writes.append((namespace, object_id, time, retry))
        self._release_event.set()

    def alarm_count(self) -> int:
        return len(self._alarms)

    # -- the flight list -------------------------------------------------------------
    def acquire_flight(self, namespace: str, object_id: str) -> _Flight:
        key = (namespace, object_id)
        state = self._active.get(key)  # (the copy the alarm run runs on)
        epoch = -1 if state is None else state.epoch
        slot = _Flight([namespace, object_id, "", 0.0], self._flight_changed,
                       functools.partial(self._admit, key, epoch))
        self._flights[id(slot)] = slot.entry
        return slot

    def release_flight(self, slot: Any) -> None:
        entry = self._flights.pop(id(slot), None)
        if entry is not None and entry[2]:
            self._flight_changed()

    def _flight_changed(self) -> None:
        if not self._flight_dirty:
            self._flight_dirty = True
            self._flight_event.set()

    # -- background work -------------------------------------------------------------
    async def serve(self, site: EngineSite) -> None:
        self._site = site
        token = trio.lowlevel.current_trio_token()
        self._listener = threading.Thread(
            target=self._listen, args=(token,), name="nursery_jobs-listen", daemon=True
        )
        self._listener.start()
        if self.client_only:
            # No lease, alarm, flight or write of its own: only answers to its calls
            # (the listener) arrive, and their rows are deleted.
            await self._calls.tidy()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._renew_loop, site)
            nursery.start_soon(self._claim_loop, site)
            nursery.start_soon(self._flight_loop)
            nursery.start_soon(self._release_loop)
            nursery.start_soon(self._ship_loop, site)
            nursery.start_soon(self._calls.serve, site, self._classes)
            nursery.start_soon(self._calls.tidy)
            nursery.start_soon(self._watch_stalls, site)

    async def _watch_stalls(self, site: EngineSite) -> None:
        """Emit ``storage:slow`` once per stall: from the first statement unanswered for
        ``lease_ttl * STALL_SHARE`` until that long passes with no slow statement."""
        after = self._stall_after
        tick = max(after / 4, STALL_TICK_MIN)
        while True:
            if not self._inflight and self._stalled_since is None:
                self._inflight_wake = trio.Event()
                await self._inflight_wake.wait()
            await self._lease_sleep(tick)
            now = lease_clock()
            oldest = min(self._inflight.values(), default=now)
            if now - oldest >= after:
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
                               self.lease_ttl * LOCK_TIMEOUT_SHARE,
                               self.lease_ttl * STATEMENT_TIMEOUT_SHARE)))
            elif self._stalled_since is not None:
                logger.info("PostgreSQL %s answers again, after a stall of %.1f s",
                            self._label, self._slow_seen - self._stalled_since)
                self._stalled_since = None

    async def _renew_loop(self, site: EngineSite) -> None:
        renewals = 0
        while True:
            await self._lease_sleep(self.lease_ttl / 3)
            renewals += 1
            if renewals % SWEEP_EVERY == 0:
                await self._sweep()
            before = dict(self._held)
            sent = lease_clock()
            try:
                held = await self._db(ops.renew, self.host_id, self.lease_ttl,
                                      list(before.items()))
            except psycopg.Error as exc:
                logger.warning("cannot renew the leases of host %s: %s", self.host_id, exc)
                continue
            for key, epoch in before.items():
                if held.get(key) != epoch and self._held.get(key) == epoch:
                    self._drop(key)
                    if key in self._active:
                        site.fenced(*key)
            for key, epoch in held.items():
                if self._held.get(key) == epoch:
                    self._trust(key, sent)
            # Calls whose notification was missed, and those a failed take may have
            # taken (after the renewal is applied: a poll that fails must not undo it).
            try:
                await self._calls.poll()
            except psycopg.Error as exc:
                logger.warning("cannot look for forwarded calls on %s: %s", self._label, exc)

    async def _lease_sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of real time: leases end on the server's clock. (Under a
        MockClock, Trio's virtual time may stand still while real time runs — a busy
        test — and a lease renewed on it would lapse; a thread waits instead.)"""
        if not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
            await trio.sleep(seconds)
            return
        await trio.to_thread.run_sync(self._stopping.wait, seconds, abandon_on_cancel=True)

    async def _sweep(self) -> None:
        try:
            hosts, calls = await self._db(ops.sweep, self.lease_ttl, CALL_MAX_AGE)
        except psycopg.Error as exc:
            logger.warning("cannot sweep dead hosts and old calls on %s: %s", self._label, exc)
            return
        if hosts or calls:
            logger.info("swept %d dead host rows and %d abandoned call rows on %s",
                        hosts, calls, self._label)

    async def _claim_loop(self, site: EngineSite) -> None:
        while True:
            room = max(0, min(CLAIM_BATCH, MAX_UNACTIVATED - (len(self._held) - len(self._active))))
            sent = lease_clock()
            unknown: list[tuple[str, str]] = []
            try:
                claimed, next_time, unknown = await self._db(
                    ops.claim, self.host_id, self.lease_ttl, _clock.now(), room,
                    sorted(self._served), self._skipped_namespaces(),
                )
            except psycopg.Error as exc:
                logger.warning("cannot claim due objects on %s: %s", self._label, exc)
                claimed, next_time = [], None
            for c in claimed:
                key = (c.namespace, c.object_id)
                if not self._hold(key, c.epoch, sent):
                    continue  # (taken again meanwhile by an activation: its alarm stands)
                self._index_alarm(key, c.alarm)
                self._classes.setdefault(c.namespace, c.class_path)
            if claimed:
                site.wake_timer()
                if len(claimed) == room:
                    await trio.lowlevel.checkpoint()
                    continue
            if self._learn_namespaces(site, unknown):
                await trio.lowlevel.checkpoint()
                continue  # a namespace it serves has due alarms: claim them now
            delay = POLL_INTERVAL
            if next_time is not None:
                delay = min(delay, max(0.0, next_time - _clock.now()))
            with trio.move_on_after(delay):
                await self._claim_wake.wait()
            self._claim_wake = trio.Event()

    def _skipped_namespaces(self) -> list[str]:
        """The namespaces this host does not serve, until it looks at them again."""
        now = trio.current_time()
        for namespace in [ns for ns, until in self._unserved.items() if until <= now]:
            del self._unserved[namespace]
        return sorted(self._unserved)

    def _learn_namespaces(self, site: EngineSite, found: list[tuple[str, str]]) -> bool:
        """Sort namespaces with due alarms that this host has not looked at into those
        it serves and those it does not (one log line per namespace, the first time);
        whether any is served."""
        served = False
        for namespace, class_path in found:
            self._classes.setdefault(namespace, class_path)
            if site.serves(namespace, self._classes.get(namespace)):
                self._served.add(namespace)
                self._unserved_logged.discard(namespace)
                served = True
                continue
            self._unserved[namespace] = trio.current_time() + UNSERVED_RECHECK
            if namespace not in self._unserved_logged:
                self._unserved_logged.add(namespace)
                logger.warning(
                    "alarms of namespace %r are due, but no class is registered for it on"
                    " host %s (class path %r does not import here): this host leaves them to"
                    " hosts that have it", namespace, self.host_id, class_path)
        return served

    async def _ship_loop(self, site: EngineSite) -> None:
        """Ship commits made outside calls and alarm runs within ``SHIP_INTERVAL``.

        Asleep until an active object has something to ship: a working copy captured
        its first key since its last ship (``FIRST_CAPTURE``), an alarm was written,
        crash tokens cleared. Then it looks every ``SHIP_INTERVAL`` until nothing is
        left unshipped. (It looked every 50 ms while objects were resident: a test over
        two virtual days took minutes, measured.)"""
        while True:
            await self._to_ship.wait()
            self._to_ship = trio.Event()
            await trio.sleep(SHIP_INTERVAL)
            self._ship_passes += 1
            for state in [s for s in self._active.values() if s.changed]:
                try:
                    await state.sync()
                except ObjectFencedError as exc:
                    site.fenced(*state.key, reason=exc.reason)
                except StorageError as exc:
                    logger.warning("%s", exc)
            if any(s.changed for s in self._active.values()):
                self._to_ship.set()

    def _wake_ship_loop(self) -> None:
        self._to_ship.set()

    def ship_loop_passes(self) -> int:
        """Passes of the background ship loop so far (it sleeps while nothing waits to
        ship). Does not checkpoint."""
        return self._ship_passes

    async def _flight_loop(self) -> None:
        while True:
            await self._flight_event.wait()
            self._flight_event = trio.Event()
            self._flight_dirty = False
            entries = [list(e) for e in self._flights.values() if e[2]]
            try:
                await self._db(ops.ship_flight, self.host_id, entries)
            except psycopg.Error as exc:
                logger.warning("cannot ship the flight list of host %s: %s", self.host_id, exc)
                self._flight_changed()
            await trio.sleep(FLIGHT_INTERVAL)

    async def _release_loop(self) -> None:
        while True:
            await self._release_event.wait()
            self._release_event = trio.Event()
            releases, self._releases = self._releases, []
            writes, self._alarm_writes = self._alarm_writes, []
            try:
                if writes:
                    await self._db(ops.set_alarm, self.host_id, writes)
                if releases:
                    await self._db(ops.release, self.host_id, releases)
            except psycopg.Error as exc:
                # The leases expire by themselves; the alarms are retried by the timer.
                logger.warning("cannot release leases on %s: %s", self._label, exc)
            self._claim_wake.set()

    # -- notifications (a thread with one connection) -----------------------------------
    def _listen(self, token: trio.lowlevel.TrioToken) -> None:
        mine = channel(self.host_id)
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    # It takes calls: committed as the pool's statements are (with the
                    # server's synchronous_commit on, each take waited ~3 ms for a WAL
                    # flush), and bounded as they are (a take stuck on a lock would hold
                    # up every notification; it fails, and this reconnects and polls).
                    conn.execute(f"SET synchronous_commit = {self._commit}")
                    for setting, share in (("lock_timeout", LOCK_TIMEOUT_SHARE),
                                           ("statement_timeout", STATEMENT_TIMEOUT_SHARE)):
                        ms = max(1, math.ceil(self.lease_ttl * share * 1000))
                        conn.execute(f"SET {setting} = {ms}")
                    conn.execute("LISTEN nj_alarm")
                    conn.execute(f'LISTEN "{mine}"')
                    token.run_sync_soon(self._notified, "", "listening")
                    while not self._stopping.is_set():
                        calls = []
                        for note in conn.notifies(timeout=0.2, stop_after=1):
                            call_id = announced_call(note.payload) if note.channel == mine \
                                else None
                            if call_id is not None and self._calls.serving:
                                calls.append(call_id)
                            else:
                                token.run_sync_soon(self._notified, note.channel,
                                                    note.payload)
                        if calls:
                            # Taken here, on this connection, as soon as heard: a hop
                            # to a worker thread and the pool would cost more than the
                            # statement (issue 26).
                            try:
                                taken = take(conn, self.host_id, calls)
                            except psycopg.Error:
                                # It may have landed; the poll after reconnecting
                                # looks (``CallRouter.take_failed``).
                                token.run_sync_soon(self._calls.take_failed, calls)
                                raise
                            token.run_sync_soon(self._calls.taken, taken)
            except trio.RunFinishedError:
                return
            except psycopg.Error as exc:
                if self._stopping.is_set():
                    return
                logger.warning("listening on %s failed (%s); reconnecting", self._label, exc)
                self._stopping.wait(1.0)

    def _notified(self, chan: str, payload: str) -> None:
        if chan == "nj_alarm" or payload == "listening":
            self._claim_wake.set()
            if payload == "listening":  # (re)connected: calls sent meanwhile wait
                self._calls.incoming_send.send_nowait(POLL)
            return
        call_id = announced_call(payload)
        if call_id is not None:
            self._calls.incoming_send.send_nowait(call_id)
        else:
            self._calls.heard(payload)


def _ignore(_: object) -> None:
    """``start_thread_soon``'s deliver: the cancel thread reports nothing."""


def _safe_label(dsn: str) -> str:
    """The address without its password, for messages."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "postgresql://?"
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{info.get('host', '')}{port}/{info.get('dbname', '')}"
