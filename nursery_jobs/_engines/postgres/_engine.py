"""The PostgreSQL engine (design section 9): every runtime that opens the same database
is a host of one cluster; PostgreSQL is the only coordinator.

- An object runs on the host holding its lease (``owner``, ``epoch``, ``lease_until`` on
  its ``nj_objects`` row: ``_leases``); its state is a working copy (``_copy``) whose
  commits ship as fenced transactions (``_ship``); ships of different objects that arrive
  while one is out share the next round trip (``_batch``, group commit).
- The timer reads a local alarm index: the alarms of the objects this host holds
  (``_alarms``). The serve task claims due objects nobody holds (``_alarms.Claims``),
  renews the leases, releases evicted objects, ships the flight list (``_flights``) and
  runs forwarded calls (``_calls``). One listening connection (a thread: ``_listen``)
  wakes it early.
- Blocking psycopg calls run in worker threads, at most ``pool_size`` at once; a caller
  cancelled meanwhile does not wait for its statement, and a stalled server is reported
  (``_statements``).
- A host claims the alarms of the namespaces its runtime resolves to a class only; one
  it cannot resolve is logged once and left to the hosts that can.
- ``client_only``: the runtime registers no host row, holds no object and claims no
  alarm; it sends every call to the host holding the object, or to any live host,
  which takes it (``_ops.locate``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any, Final, NoReturn, TypeVar

import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict

from nursery_jobs import _clock
from nursery_jobs._engines.base import EngineSite
from nursery_jobs._engines.postgres import _ops as ops
from nursery_jobs._engines.postgres._alarms import AlarmIndex, Claims
from nursery_jobs._engines.postgres._batch import ShipStatistics
from nursery_jobs._engines.postgres._calls import CallRouter
from nursery_jobs._engines.postgres._copy import PgObject, load_copy
from nursery_jobs._engines.postgres._flights import Flight, FlightList
from nursery_jobs._engines.postgres._leases import Leases, lease_clock
from nursery_jobs._engines.postgres._listen import Listener
from nursery_jobs._engines.postgres._schema import ensure_schema
from nursery_jobs._engines.postgres._ship import Shipper
from nursery_jobs._engines.postgres._statements import LOCK_TIMEOUT_SHARE, Statements
from nursery_jobs._errors import (
    ObjectLeasedElsewhere,
    RpcError,
    RuntimeArgumentError,
    StorageError,
    UnknownObjectError,
    safe_repr,
)

logger = logging.getLogger("nursery_jobs")

T = TypeVar("T")
Key = tuple[str, str]

_COMMIT: Final = {"NORMAL": "off", "FULL": "on"}
# A host forwarding calls to an object another host holds remembers that host this long
# (seconds) instead of asking PostgreSQL before every call (a transaction: ~0.9 ms of a
# ~4 ms forwarded call in `nursery-jobs bench --engine postgres`). A stale answer costs
# little: the old holder answers "moved", or stops answering, and the call asks again.
OWNER_HINT_TTL: Final = 1.0
# The longest lease (seconds): a dead host's objects wait this long for another host.
# The server timeouts derived from it (up to 3 x lease_ttl, in ms) must fit PostgreSQL's
# int settings (at most ~24.8 days); a day is far past any sensible lease.
MAX_LEASE_TTL: Final = 86_400.0
# The most connections (each a server process, and a worker thread here) one host's pool
# opens: past it a host would exhaust the server (``max_connections`` is 100 by default,
# for every host together) before it ran anything faster.
MAX_POOL_SIZE: Final = 256


class PostgresEngine:
    """Objects, alarms and leases in a PostgreSQL database shared by many hosts.

    Args:
        dsn: a ``postgresql://`` address (or any libpq connection string).
        lease_ttl: seconds a host's lease on an object lasts without renewal (renewed
            every ``lease_ttl / 3``); a dead host's objects move after this long. At
            most ``MAX_LEASE_TTL`` (a day).
        pool_size: connections (and worker threads) for PostgreSQL I/O, from 2 to
            ``MAX_POOL_SIZE`` (256).
        synchronous: "NORMAL" (``synchronous_commit = off``: a commit survives the
            host's death, not the server's) or "FULL" (``on``).
        client_only: hold no object, claim no alarm: every call goes to a host.

    Raises:
        ValueError: an option out of its bounds (of any size or type: nothing is
            converted before it is checked). Nothing connects before ``open``.
        TypeError: ``dsn`` is no str, ``client_only`` no bool.
    """

    holds_files = False  # (see Engine.holds_files)
    default_max_active = None  # (see Engine.default_max_active)

    def __init__(
        self, dsn: str, *, lease_ttl: float = 10.0, pool_size: int = 8,
        synchronous: str = "NORMAL", client_only: bool = False,
    ) -> None:
        if not isinstance(dsn, str):
            raise RuntimeArgumentError(
                f"dsn must be a str (a postgresql:// address), got {safe_repr(dsn, 80)}")
        # (Compared, never converted first: an int too large for a float compares exactly
        # with the bounds, where float() raised OverflowError; NaN is no number > 0.)
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, (int, float)) or not (
            0 < lease_ttl <= MAX_LEASE_TTL
        ):
            raise RuntimeArgumentError(
                f"lease_ttl must be a number of seconds > 0 and <= {MAX_LEASE_TTL:g},"
                f" got {safe_repr(lease_ttl, 80)}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or not (
            2 <= pool_size <= MAX_POOL_SIZE
        ):
            raise RuntimeArgumentError(
                f"pool_size must be an int from 2 to {MAX_POOL_SIZE}, got"
                f" {safe_repr(pool_size, 80)}")
        commit = _COMMIT.get(synchronous.upper()) if isinstance(synchronous, str) else None
        if commit is None:
            raise RuntimeArgumentError(
                f"synchronous must be 'NORMAL' or 'FULL', got {safe_repr(synchronous, 80)}")
        if not isinstance(client_only, bool):
            raise RuntimeArgumentError(f"client_only must be a bool, got {client_only!r}")
        self.client_only = client_only
        self.dsn = dsn
        self.lease_ttl = float(lease_ttl)
        self.pool_size = pool_size
        self._commit = commit
        self.host_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._label = _safe_label(dsn)
        self._stopping = threading.Event()
        # Every statement goes through ``Statements.run`` (bound once: the ship path's
        # too, which must not gain a call layer).
        self._statements = Statements(self._label, self.lease_ttl, pool_size, self._stopping)
        self._db = self._statements.run
        self._active: dict[Key, PgObject] = {}
        self._alarms = AlarmIndex()  # the alarms of held objects
        self._leases = Leases(self.host_id, self.lease_ttl, self._label, self._db,
                              self._alarms, self._active, self._stopping)
        self._shipper = Shipper(self.host_id, self.lease_ttl, self._label, self._db,
                                self._leases, self._active)
        self._elsewhere: dict[Key, tuple[str, float]] = {}  # key -> (holder, hint expiry)
        self._classes: dict[str, str] = {}
        self._claims = Claims(self.host_id, self.lease_ttl, self._label, self._db,
                              self._leases, self._alarms, self._active, self._classes)
        self._flights = FlightList(self.host_id, self._db)
        self._site: EngineSite | None = None
        self._calls = CallRouter(self.host_id, self._db, self._leases.holds)
        self._listener = Listener(self.dsn, commit, self.lease_ttl, self.host_id, self._label,
                                  self._calls, self._claims.wake, self._stopping)

    @property
    def label(self) -> str:
        return self._label

    # -- opening and closing -----------------------------------------------------------
    def open(self, now: float) -> None:
        """Connect, create or check the schema, and register this host. Blocks."""
        lock_ms = max(1, math.ceil(self.lease_ttl * LOCK_TIMEOUT_SHARE * 1000))
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
        self._statements.open(self.dsn, self._commit)

    def close(self) -> None:
        """Stop listening, give up every lease, leave the cluster. Idempotent."""
        self._stopping.set()
        self._listener.join(timeout=5.0)
        statements = self._statements
        pool, statements.pool = statements.pool, None
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
        self._leases.clear()
        self._alarms.clear()

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
    async def open_object(self, namespace: str, object_id: str, class_path: str, *,
                          create: bool = True) -> PgObject:
        key = (namespace, object_id)
        label = f"{namespace}/{object_id}"
        self._classes[namespace] = class_path
        if not self.client_only:
            self._claims.served.add(namespace)  # (its class is in hand: the call's)
        hint = self._elsewhere.get(key)
        if hint is not None and key not in self._leases.held and trio.current_time() < hint[1]:
            await trio.lowlevel.checkpoint()
            raise ObjectLeasedElsewhere(label, hint[0], self._forwarder(
                key, hint[0], class_path, place=self.client_only))
        if self.client_only:
            await self._send_to_host(key, label, class_path, create=create)
        sent = lease_clock()
        try:
            taken = await self._db(ops.take, self.host_id, self.lease_ttl, namespace,
                                   object_id, class_path, _clock.now(), create)
        except psycopg.Error as exc:
            raise StorageError(f"cannot open {label} on PostgreSQL {self._label}: {exc}") from exc
        if taken is None:
            raise UnknownObjectError.absent(namespace, object_id, self._label)
        if isinstance(taken, str):
            self._leases.drop(key)
            if len(self._elsewhere) >= 10_000:
                self._elsewhere.clear()
            self._elsewhere[key] = (taken, trio.current_time() + OWNER_HINT_TTL)
            raise ObjectLeasedElsewhere(label, taken, self._forwarder(key, taken, class_path))
        try:
            conn = load_copy(label, taken.rows, captured=self._shipper.wake)
        except BaseException:
            self._leases.release(namespace, object_id, taken.epoch)
            raise
        state = PgObject(key, taken.epoch, conn, taken.alarm, taken.tokens,
                         ship=self._shipper.ship, to_ship=self._shipper.wake,
                         on_close=self._state_closed, on_alarm=self._local_alarm,
                         admit=functools.partial(self._leases.admit, key, taken.epoch),
                         version=taken.version)
        self._leases.hold(key, taken.epoch, sent)
        self._active[key] = state
        if taken.alarm is None:
            self._alarms.discard(key)
        else:
            self._alarms.put(key, taken.alarm)
            if self._site is not None:
                self._site.wake_timer()  # the timer now serves this alarm
        return state

    async def _send_to_host(self, key: Key, label: str, class_path: str, *,
                            create: bool) -> NoReturn:
        """(client_only) Raise ``ObjectLeasedElsewhere`` for the host that holds the
        object, or any live host, which takes it.

        Raises:
            RpcError: no host is running on this database.
            StorageError: PostgreSQL cannot be read.
            UnknownObjectError: ``create=False`` and the object is not registered.
        """
        try:
            if not create and not await self._db(ops.is_stored, key[0], key[1]):
                raise UnknownObjectError.absent(key[0], key[1], self._label)
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

    def _local_alarm(self, state: PgObject, time: float | None, retry: int) -> None:
        if self._active.get(state.key) is not state:
            return
        if time is None:
            self._alarms.discard(state.key)
        else:
            self._alarms.put(state.key, (time, retry))

    def _state_closed(self, state: PgObject) -> None:
        key = state.key
        self._shipper.closed(key)
        if self._active.get(key) is state:
            del self._active[key]
        leases = self._leases
        if leases.held.get(key) == state.epoch:
            leases.drop(key)
            leases.release(key[0], key[1], state.epoch)

    def destroy_object(self, namespace: str, object_id: str) -> None:
        # Blocks the Trio thread for one transaction: rare, and a queued delete could
        # race the object's next activation.
        pool = self._statements.pool
        if pool is None:
            return
        try:
            with pool.connection() as conn:
                ops.destroy(conn, self.host_id, namespace, object_id)
        except psycopg.Error as exc:
            logger.error("could not delete %s/%s on %s: %s", namespace, object_id,
                         self._label, exc)

    def class_path(self, namespace: str) -> str | None:
        return self._classes.get(namespace)

    # -- ships ---------------------------------------------------------------------------
    def ship_statistics(self) -> ShipStatistics:
        """Ships sent by this host so far, and the round trips that carried them."""
        return self._shipper.batcher.statistics()

    def ship_loop_passes(self) -> int:
        """Passes of the background ship loop so far (it sleeps while nothing waits to
        ship). Does not checkpoint."""
        return self._shipper.passes

    # -- the alarm index: this host's held objects ----------------------------------------
    def due(self, now: float, limit: int) -> list[tuple[str, str]]:
        return self._alarms.due(now, limit)

    def next_alarm_after(self, now: float) -> float | None:
        return self._alarms.next_after(now)

    def get_alarm(self, namespace: str, object_id: str) -> tuple[float, int] | None:
        return self._alarms.get((namespace, object_id))

    def set_alarm(self, namespace: str, object_id: str, time: float, retry: int) -> None:
        key = (namespace, object_id)
        if key in self._leases.held:
            self._alarms.put(key, (time, retry))
        self._leases.write_alarm(namespace, object_id, time, retry)

    def alarm_count(self) -> int:
        return len(self._alarms)

    # -- the flight list -------------------------------------------------------------
    def acquire_flight(self, namespace: str, object_id: str) -> Flight:
        key = (namespace, object_id)
        state = self._active.get(key)  # (the copy the alarm run runs on)
        epoch = -1 if state is None else state.epoch
        return self._flights.acquire(namespace, object_id,
                                     functools.partial(self._leases.admit, key, epoch))

    def release_flight(self, slot: Any) -> None:
        self._flights.release(slot)

    # -- background work -------------------------------------------------------------
    async def serve(self, site: EngineSite) -> None:
        self._site = self._leases.site = site
        self._listener.start(trio.lowlevel.current_trio_token())
        if self.client_only:
            # No lease, alarm, flight or write of its own: only answers to its calls
            # (the listener) arrive, and their rows are deleted.
            await self._calls.tidy()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._leases.renew_loop, site, self._calls)
            nursery.start_soon(self._claims.loop, site)
            nursery.start_soon(self._flights.loop)
            nursery.start_soon(self._leases.release_loop, self._claims.wake)
            nursery.start_soon(self._shipper.loop, site)
            nursery.start_soon(self._calls.serve, site, self._classes)
            nursery.start_soon(self._calls.tidy)
            nursery.start_soon(self._statements.watch_stalls, site)


def _safe_label(dsn: str) -> str:
    """The address without its password, for messages."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "postgresql://?"
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{info.get('host', '')}{port}/{info.get('dbname', '')}"
