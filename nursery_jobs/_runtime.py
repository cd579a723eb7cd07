"""The runtime: the catalog, the alarm timer, stubs, and one ObjectHost per active object.

A due alarm travels: catalog row -> timer task -> ``_deliver`` (activates the object if
needed) -> ``ObjectHost.run_alarm`` -> the object's alarm handler. The runtime knows
nothing of the Lifecycle: a Lifecycle object simply installs its own alarm handler.
"""

from __future__ import annotations

import fcntl
import inspect
import logging
import math
import os
import resource
import sqlite3
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, Literal

import attrs
import psutil
import trio

from . import _clock
from ._catalog import Catalog, check_object_id, connect, object_file_name
from ._errors import (
    ObjectResetError,
    RpcError,
    RuntimeClosedError,
    RuntimeLockedError,
    StorageError,
)
from ._events import EventBus
from ._flight import FlightRecord
from ._metrics import Metrics  # nj-hook: metrics
from ._object import (
    AlarmInfo,
    DurableObject,
    ObjectContext,
    class_path,
    durable_object_retry_delay,
    resolve_namespace,
)
from ._storage import Storage

logger = logging.getLogger("nursery_jobs")

Key = tuple[str, str]
Durability = Literal["normal", "full"]
_SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}
# Due alarms fetched per timer pass, beyond those already in flight.
_TIMER_BATCH = 256
# Alarm runs (activation included) allowed at once across the runtime.
_MAX_CONCURRENT_ALARMS = 64
# Delay before retrying the alarm of an object whose class is not importable.
_ORPHAN_RETRY = 60.0
# The catalog's WAL is checkpointed off the Trio thread when it passes this size.
CHECKPOINT_INTERVAL = 1.0
CHECKPOINT_WAL_BYTES = 4 * 1024 * 1024
CHECKPOINT_WAL_MAX = 256 * 1024 * 1024
# How often the memory watchdog samples the probe (when memory_limit is set).
MEMORY_CHECK_INTERVAL = 0.1


def default_max_active() -> int:
    """How many objects may be resident by default: what the open-file limit allows."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 100_000
    return max(16, (soft - 256) // 2)


def process_rss() -> int:
    """The default memory probe: this process's resident set size, in bytes."""
    return int(psutil.Process().memory_info().rss)


@attrs.frozen(kw_only=True)
class RuntimeStatistics:
    """A snapshot of the runtime's state, from ``Runtime.statistics()``."""

    active_objects: int
    alarms_in_flight: int
    pending_alarms: int
    events_dropped: int


class _AlarmSlot:
    """The ``storage`` view of one host's alarm."""

    __slots__ = ("_host",)

    def __init__(self, host: ObjectHost) -> None:
        self._host = host

    def get(self) -> float | None:
        return self._host.alarm_time

    def set(self, time: float) -> None:
        self._host.write_alarm(time, 0)

    def delete(self) -> None:
        self._host.write_alarm(None, 0)

    def write_through(self, time: float | None) -> None:
        """Write the alarm to the catalog even if the cached time says it is there."""
        self._host.write_alarm(time, 0, force=True)


class ObjectHost:
    """One active object: its task, nursery, cancel scope, database and instance."""

    __slots__ = (
        "_alarm_work",
        "_busy",
        "_destroy",
        "_idle_scope",
        "_work_scopes",
        "alarm_retry",
        "alarm_time",
        "alarm_version",
        "closed",
        "cls",
        "conn",
        "ctx",
        "error",
        "instance",
        "key",
        "memory_reset",
        "namespace",
        "object_id",
        "ready",
        "reset_reason",
        "runtime",
        "scope",
        "state",
    )

    def __init__(
        self, runtime: Runtime, cls: type[DurableObject], namespace: str, object_id: str
    ) -> None:
        self.runtime = runtime
        self.cls = cls
        self.namespace = namespace
        self.object_id = object_id
        self.key: Key = (namespace, object_id)
        self.state: Literal["starting", "ready", "closing", "closed"] = "starting"
        self.ready = trio.Event()
        self.closed = trio.Event()
        self.error: BaseException | None = None
        self.instance: DurableObject | None = None
        self.ctx: ObjectContext | None = None
        self.conn: sqlite3.Connection | None = None
        self.scope = trio.CancelScope()
        self._idle_scope = trio.CancelScope()
        self._work_scopes: set[trio.CancelScope] = set()
        self._busy = 0
        self._destroy = False
        self.reset_reason: str | None = None
        self.memory_reset = False
        self._alarm_work = 0
        self.alarm_time: float | None = None
        self.alarm_retry = 0
        self.alarm_version = 0

    # -- the object's task --------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        rt = self.runtime
        start_error: Exception | None = None
        try:
            self.conn = rt._open_object_db(self)
            alarm = rt.catalog.get_alarm(self.namespace, self.object_id)
            if alarm is not None:
                self.alarm_time, self.alarm_retry = alarm
            with self.scope:
                async with trio.open_nursery() as nursery:
                    try:
                        storage = Storage(self.conn, _AlarmSlot(self))
                        self.ctx = ObjectContext(
                            id=self.object_id,
                            namespace=self.namespace,
                            storage=storage,
                            nursery=nursery,
                            env=rt.env,
                            runtime=rt,
                            host=self,
                        )
                        self.instance = self.cls(self.ctx)
                        await self.instance.on_start()
                    except Exception as exc:
                        start_error = exc
                        if self.ctx is not None:
                            # An alarm that activated us retries by the object's policy.
                            rt._start_failures[self.key] = self.ctx._alarm_retry_delay
                        nursery.cancel_scope.cancel(reason="on_start failed")
                    else:
                        self.state = "ready"
                        # Start the idle clock now: an activation whose call never
                        # runs (RpcError) would otherwise stay resident forever.
                        self._idle_scope.deadline = trio.current_time() + rt.idle_timeout
                        self.ready.set()
                        task_status.started()
                        await self._wait_until_idle()
                        nursery.cancel_scope.cancel(reason="evicted: idle")
        except Exception as exc:
            if self.state == "starting":
                raise
            # A task the object started in its nursery crashed: the object is reset.
            logger.exception("object %s/%s crashed", self.namespace, self.object_id)
            rt.events.emit("object:error", self.namespace, self.object_id, error=repr(exc))
        finally:
            self._close()
        if start_error is not None:
            raise start_error

    async def _wait_until_idle(self) -> None:
        while True:
            with self._idle_scope:
                await trio.sleep_forever()
            # The deadline may have passed just as a call came in: stay while busy.
            if self._busy == 0 or self.scope.cancel_called:
                self.state = "closing"
                return
            self._idle_scope = trio.CancelScope()

    def _close(self) -> None:
        self.state = "closed"
        self.ready.set()
        rt = self.runtime
        if rt._hosts.get(self.key) is self:
            del rt._hosts[self.key]
        if self.conn is not None:
            rt._close_object_db(self.key, self.conn)
            self.conn = None
        if self._destroy:
            rt._destroy_object(self)
        self.instance = None
        self.closed.set()

    # -- work accounting ----------------------------------------------------------
    @contextmanager
    def working(self, *, alarm: bool = False) -> Iterator[trio.CancelScope]:
        """Run a block as work of this object: it holds off eviction, and a reset of
        the object cancels it (``scope.cancelled_caught`` tells). ``alarm=True`` marks
        alarm work (an alarm run, tracked work): what the memory watchdog resets."""
        scope = trio.CancelScope()
        self._busy += 1
        self._alarm_work += alarm
        self._idle_scope.deadline = math.inf
        self._work_scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._work_scopes.discard(scope)
            self._busy -= 1
            self._alarm_work -= alarm
            if self._busy == 0:
                if self._destroy:
                    self._idle_scope.cancel(reason="destroyed")
                else:
                    self._idle_scope.deadline = trio.current_time() + self.runtime.idle_timeout

    def evict(self, reason: str = "evicted") -> None:
        """Ask an idle object to leave memory."""
        self._idle_scope.cancel(reason=reason)

    def destroy(self) -> None:
        """Delete the object's database, registry row and alarm as soon as its current
        work ends; its next activation starts empty. Does not checkpoint."""
        self._destroy = True
        if self._busy == 0:
            self._idle_scope.cancel(reason="destroyed")

    @property
    def running_alarm_work(self) -> bool:
        return self._alarm_work > 0

    def reset(self, reason: str, *, memory: bool = False) -> None:
        """Cancel everything the object is doing and drop it from memory."""
        if self.reset_reason is not None:
            return
        self.reset_reason = reason
        self.memory_reset = memory
        for scope in list(self._work_scopes):
            scope.cancel(reason=reason)
        self.scope.cancel(reason=reason)
        self.state = "closing" if self.state != "closed" else "closed"

    @property
    def busy(self) -> bool:
        return self._busy > 0

    # -- calls ------------------------------------------------------------------------
    def _method(self, name: object) -> Any:
        if not isinstance(name, str):
            raise RpcError(f"method name must be a str, got {type(name).__name__}")
        label = f"{self.namespace}/{self.object_id}.{name}"
        if name.startswith("_"):
            raise RpcError(f"{label}: names starting with '_' cannot be called through a stub")
        if name in self.cls._rpc_hidden:
            raise RpcError(f"{label}: {name}() is a runtime hook, not callable through a stub")
        fn = getattr(self.instance, name, None)
        if not inspect.ismethod(fn):
            raise RpcError(f"{label} is not a method of {self.cls.__qualname__}")
        return fn

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fn = self._method(name)
        with self.working() as scope:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            else:
                await trio.lowlevel.checkpoint()
        if scope.cancelled_caught:
            raise ObjectResetError(
                f"{self.namespace}/{self.object_id} was reset during {name}()"
            )
        return result

    # -- the alarm ----------------------------------------------------------------
    def write_alarm(self, time: float | None, retry: int, *, force: bool = False) -> None:
        """Set (``time``) or delete (None) the alarm, durably, and tell the timer.
        Skips the write when the cached alarm already says so, unless ``force``."""
        self.alarm_version += 1
        if time == self.alarm_time and retry == self.alarm_retry and not force:
            return
        catalog = self.runtime.catalog
        if time is None:
            catalog.delete_alarm(self.namespace, self.object_id)
        else:
            catalog.set_alarm(self.namespace, self.object_id, time, retry)
        self.alarm_time = time
        self.alarm_retry = retry
        if time is not None:
            self.runtime._alarm_lowered(time)

    async def run_alarm(self) -> None:
        """Run the alarm handler as a task of the object's own nursery and wait for it:
        a shutdown then cancels it before the object's database closes, so its cleanup
        still has the database."""
        assert self.ctx is not None
        if self.alarm_time is not None:  # nj-hook: metrics
            self.runtime.metrics.alarm_delivered(_clock.now() - self.alarm_time)
        done = trio.Event()
        # Busy from delivery on: were the idle deadline to pass before the task starts,
        # the object would be evicted (its nursery cancelled) and the alarm would begin
        # its work in a closing object, then be cut off at the first checkpoint.
        self._busy += 1
        self._idle_scope.deadline = math.inf
        try:
            self.ctx.nursery.start_soon(self._alarm_task, done)
        except BaseException:
            self._busy -= 1
            raise
        await done.wait()

    async def _alarm_task(self, done: trio.Event) -> None:
        self._busy -= 1  # handed over: working() below holds the object from here
        try:
            assert self.ctx is not None and self.instance is not None
            retry = self.alarm_retry
            handler = self.ctx._alarm_handler or self.instance.alarm
            version = self.alarm_version
            failure: Exception | None = None
            flight = self.runtime.flight.acquire(self.namespace, self.object_id)
            self.ctx._flight = flight
            scope: trio.CancelScope | None = None
            try:
                with self.working(alarm=True) as scope:
                    try:
                        await handler(AlarmInfo(retry_count=retry, is_retry=retry > 0))
                    except Exception as exc:
                        failure = exc
            finally:
                self.ctx._flight = None
                if flight is not None:
                    self.runtime.flight.release(flight)
                if (scope is not None and scope.cancel_called and self.memory_reset
                        and self.ctx._alarm_handler is None):
                    # A plain object has no breaker: a reset is a failed alarm run. Done
                    # here, on the way out: the reset cancels the object's own scope too,
                    # so the Cancelled goes on past this scope rather than stop at it.
                    self.alarm_failed(ObjectResetError(self.reset_reason), retry)
            assert scope is not None
            if scope.cancelled_caught:
                return  # reset: a Lifecycle's breaker decided what happens to its alarm
            if failure is None:
                if self.alarm_version == version:
                    self.write_alarm(None, 0)
                return
            self.alarm_failed(failure, retry, self.ctx._alarm_retry_delay)
        finally:
            done.set()

    def alarm_failed(
        self, failure: BaseException, retry: int, retry_delay: Any = durable_object_retry_delay
    ) -> None:
        """Re-time the alarm for a retry, or drop it when the retries are spent."""
        delay = retry_delay(retry)
        if delay is None:
            logger.error(
                "alarm of %s/%s failed after %d retries; dropping it",
                self.namespace, self.object_id, retry, exc_info=failure,
            )
            self.runtime.events.emit(
                "alarm:failed", self.namespace, self.object_id, retries=retry, error=repr(failure)
            )
            self.write_alarm(None, 0)
            return
        logger.warning(
            "alarm of %s/%s raised %r; retry %d in %.1f s",
            self.namespace, self.object_id, failure, retry + 1, delay,
        )
        self.runtime.events.emit(
            "alarm:retry", self.namespace, self.object_id, retry=retry + 1, delay=delay,
            error=repr(failure),
        )
        self.write_alarm(_clock.now() + delay, retry + 1)


class Stub:
    """A handle on an object by id; calls activate it. ``await stub.m(...)`` is
    ``await stub.call("m", ...)``."""

    __slots__ = ("_cls", "_id", "_ns", "_rt")

    def __init__(self, rt: Runtime, cls: type[DurableObject], object_id: str) -> None:
        self._rt = rt
        self._cls = cls
        self._ns = cls.namespace
        self._id = object_id

    def __repr__(self) -> str:
        return f"<Stub {self._ns}/{self._id!r}>"

    async def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call method ``name`` on the object, activating it if needed. Checkpoints."""
        host = await self._rt._activate(self._cls, self._ns, self._id)
        return await host.call(name, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        async def remote(*args: Any, **kwargs: Any) -> Any:
            return await self.call(name, *args, **kwargs)

        remote.__name__ = name
        return remote


class Runtime:
    """Owns the catalog, the timer and the active objects. Made by ``open_runtime``."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        env: Any,
        idle_timeout: float,
        max_active: int | None,
        durability: Durability,
        memory_limit: int | None = None,
        memory_probe: Callable[[], float] | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.memory_limit = memory_limit
        self.memory_probe = memory_probe or process_rss
        self.env = env
        self.idle_timeout = idle_timeout
        # Unbounded would run out of file descriptors: by default keep resident what
        # the open-file limit allows (two per object, a margin for everything else).
        self.max_active = default_max_active() if max_active is None else max_active
        self.durability = durability
        self.events = EventBus()
        self.metrics = Metrics(self.events)  # nj-hook: metrics
        self.http_url: str | None = None  # nj-hook: dashboard (set by _web.start_http)
        self._synchronous = _SYNCHRONOUS[durability]
        self._hosts: OrderedDict[Key, ObjectHost] = OrderedDict()
        self._memory_dbs: dict[Key, sqlite3.Connection] = {}
        self._inflight: set[Key] = set()
        self._nursery: trio.Nursery | None = None
        self._limiter = trio.CapacityLimiter(_MAX_CONCURRENT_ALARMS)
        self._timer_scope: trio.CancelScope | None = None
        self._timer_target = math.inf
        self._lock_fd: int | None = None
        self._closing = False
        # Work under suspicion of killing the process runs one at a time (the
        # Lifecycle holds it around jobs with crash strikes).
        self.probation = trio.Lock()
        # The alarm retry policy of objects whose on_start just failed (set up by their
        # __init__, e.g. a Lifecycle's): an alarm that activated one retries by it.
        self._start_failures: dict[Key, Callable[[int], float | None]] = {}
        self.catalog: Catalog

    # -- opening and closing ------------------------------------------------------
    def _open(self) -> None:
        if self.path is None:
            self.catalog = Catalog(connect(":memory:", synchronous=self._synchronous))
            self.flight = FlightRecord(None, _MAX_CONCURRENT_ALARMS)
            return
        (self.path / "objects").mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / "runtime.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeLockedError(
                f"{self.path} is in use by another runtime (in this or another process)"
            ) from None
        self._lock_fd = fd
        try:
            self.catalog = Catalog(
                connect(str(self.path / "catalog.sqlite3"), synchronous=self._synchronous,
                        autocheckpoint=False)
            )
            self.flight = FlightRecord(self.path / "flight.rec", _MAX_CONCURRENT_ALARMS)
        except BaseException:
            self._unlock()
            raise
        # Work the last process on this path was doing when it died: hand it to the
        # objects (durably) before the record is wiped.
        crashed = self.flight.recover()
        if crashed:
            logger.warning("%d alarm run(s) were in flight when the last process on %s died",
                           len(crashed), self.path)
            self.catalog.add_crashes(crashed, _clock.now())
        self.flight.wipe()

    def _close(self) -> None:
        for host in list(self._hosts.values()):
            host._close()
        for conn in self._memory_dbs.values():
            conn.close()
        self._memory_dbs.clear()
        with suppress(AttributeError):
            self.catalog.close()
        with suppress(AttributeError):
            self.flight.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _open_object_db(self, host: ObjectHost) -> sqlite3.Connection:
        file = self.catalog.register(
            host.namespace, host.object_id, class_path(host.cls), _clock.now()
        )
        if self.path is None:
            conn = self._memory_dbs.get(host.key)
            if conn is None:
                conn = self._memory_dbs[host.key] = connect(":memory:", synchronous="OFF")
            return conn
        try:
            return connect(str(self.path / "objects" / file), synchronous=self._synchronous,
                           exclusive=True)
        except sqlite3.OperationalError as exc:
            raise StorageError(
                f"cannot open the database of {host.namespace}/{host.object_id}: {exc}."
                f" {len(self._hosts)} objects are open, two file descriptors each: lower"
                f" max_active (now {self.max_active}) or raise the open-file limit"
            ) from exc

    def _destroy_object(self, host: ObjectHost) -> None:
        self.catalog.forget(host.namespace, host.object_id)
        if self.path is None:
            conn = self._memory_dbs.pop(host.key, None)
            if conn is not None:
                conn.close()
        else:
            file = self.path / "objects" / object_file_name(host.namespace, host.object_id)
            for suffix in ("", "-wal", "-shm"):
                with suppress(FileNotFoundError):
                    os.unlink(f"{file}{suffix}")
        self.events.emit("object:destroyed", host.namespace, host.object_id)

    def _close_object_db(self, key: Key, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")  # never leave a half-written transaction behind
        if self.path is not None:
            conn.close()

    # -- objects ------------------------------------------------------------------
    def get(self, cls: type[DurableObject], object_id: str) -> Stub:
        """Return a stub for object ``object_id`` of class ``cls``. No I/O; does not
        checkpoint."""
        if not (isinstance(cls, type) and issubclass(cls, DurableObject)):
            raise TypeError(f"get() needs a DurableObject subclass, got {cls!r}")
        return Stub(self, cls, check_object_id(object_id))

    async def _activate(
        self, cls: type[DurableObject], namespace: str, object_id: str, *,
        for_alarm: bool = False,
    ) -> ObjectHost:
        """Return the object's ready host, starting it (and ``on_start``) if needed."""
        key = (namespace, object_id)
        while True:
            if self._closing or self._nursery is None:
                raise RuntimeClosedError(
                    f"the runtime is closed; cannot reach {namespace}/{object_id}"
                )
            host = self._hosts.get(key)
            if host is None:
                host = ObjectHost(self, cls, namespace, object_id)
                self._hosts[key] = host
                self._evict_over_limit()
                try:
                    await self._nursery.start(host.run)
                except BaseException as exc:
                    host.error = exc
                    if not for_alarm:
                        self._start_failures.pop(key, None)
                    raise
                return host
            if host.state == "ready":
                self._hosts.move_to_end(key)
                return host
            if host.state == "starting":
                await host.ready.wait()
                if host.error is not None:
                    raise host.error
            else:
                await host.closed.wait()

    def _evict_over_limit(self) -> None:
        if self.max_active is None or len(self._hosts) <= self.max_active:
            return
        excess = len(self._hosts) - self.max_active
        for host in self._hosts.values():  # least recently used first
            if excess == 0:
                break
            if host.state == "ready" and not host.busy:
                host.evict("evicted: max_active")
                excess -= 1

    @property
    def closing(self) -> bool:
        """Whether the runtime is shutting down (or has shut down)."""
        return self._closing

    async def _checkpointer(self) -> None:
        """Checkpoint the catalog's WAL from a worker thread once it has grown, so no
        commit on the Trio thread ever stalls on a checkpoint's fsync. A checkpoint's
        fsync can still hold up writes to the same filesystem (measured: p99 lateness
        401 ms), so it waits for a lull (no alarm due within a second) unless the WAL
        has grown past CHECKPOINT_WAL_MAX. (A thread can only let a MockClock jump
        ahead here, where nothing waits on its result.)"""
        assert self.path is not None
        catalog = self.path / "catalog.sqlite3"
        wal = self.path / "catalog.sqlite3-wal"
        while True:
            await trio.sleep(CHECKPOINT_INTERVAL)
            try:
                size = wal.stat().st_size
            except FileNotFoundError:
                continue
            lull = self._timer_target - _clock.now() > CHECKPOINT_INTERVAL
            if (size >= CHECKPOINT_WAL_BYTES and lull) or size >= CHECKPOINT_WAL_MAX:
                await trio.to_thread.run_sync(Catalog.checkpoint, str(catalog))

    async def _memory_watchdog(self) -> None:
        """Sample memory; over the limit, reset every object whose alarm work runs."""
        assert self.memory_limit is not None
        while True:
            await trio.sleep(MEMORY_CHECK_INTERVAL)
            used = self.memory_probe()
            if used <= self.memory_limit:
                continue
            victims = [h for h in self._hosts.values()
                       if h.state == "ready" and h.running_alarm_work]
            if not victims:
                continue
            logger.error("memory %d > limit %d: resetting %d object(s) running alarm work",
                         used, self.memory_limit, len(victims))
            for host in victims:
                host.reset(f"memory limit exceeded ({used:.0f} > {self.memory_limit})",
                           memory=True)

    def statistics(self) -> RuntimeStatistics:
        """Return a snapshot of the runtime's state. Does not checkpoint."""
        return RuntimeStatistics(
            active_objects=len(self._hosts),
            alarms_in_flight=len(self._inflight),
            pending_alarms=self.catalog.alarm_count(),
            events_dropped=self.events.dropped,
        )

    # -- the timer ----------------------------------------------------------------
    def _alarm_lowered(self, time: float) -> None:
        if time < self._timer_target and self._timer_scope is not None:
            self._timer_target = time
            self._timer_scope.deadline = _clock.to_trio_time(time)

    async def _timer(self) -> None:
        """Sleep until the earliest alarm; hand each due alarm to ``_deliver``."""
        assert self._nursery is not None
        inflight = self._inflight
        while True:
            now = _clock.now()
            started = 0
            for namespace, object_id, _time, _retry in self.catalog.due(
                now, len(inflight) + _TIMER_BATCH
            ):
                key = (namespace, object_id)
                if key not in inflight:
                    inflight.add(key)
                    self._nursery.start_soon(self._deliver, key)
                    started += 1
            if started:
                await trio.lowlevel.checkpoint()
                continue
            # Every due alarm is in flight; sleep until a later one, or until an
            # alarm is lowered (a push, or an alarm run that ended still due).
            target = self.catalog.next_after(now)
            self._timer_target = math.inf if target is None else target
            deadline = math.inf if target is None else _clock.to_trio_time(target)
            with trio.CancelScope(deadline=deadline) as self._timer_scope:
                await trio.sleep_forever()
            self._timer_scope = None
            self._timer_target = -math.inf

    async def _deliver(self, key: Key) -> None:
        namespace, object_id = key
        host: ObjectHost | None = None
        try:
            async with self._limiter:
                cls = resolve_namespace(namespace, self.catalog.class_path(namespace))
                if cls is None:
                    self._orphaned(key)
                    return
                try:
                    host = await self._activate(cls, namespace, object_id, for_alarm=True)
                except RuntimeClosedError:
                    return  # shutting down: the alarm stays as it is for the next run
                except Exception as exc:
                    if not self._closing:
                        self._activation_failed(key, cls, exc)
                    return
                await host.run_alarm()
        finally:
            inflight_done = key in self._inflight
            self._inflight.discard(key)
            if inflight_done and not self._closing:
                alarm = (
                    host.alarm_time
                    if host is not None and host.state == "ready"
                    else (self.catalog.get_alarm(namespace, object_id) or (None,))[0]
                )
                if alarm is not None:
                    self._alarm_lowered(alarm)

    def _orphaned(self, key: Key) -> None:
        namespace, object_id = key
        logger.error(
            "alarm of %s/%s is due but no class is registered for namespace %r; "
            "define or import it; retrying in %.0f s",
            namespace, object_id, namespace, _ORPHAN_RETRY,
        )
        self.events.emit("alarm:orphaned", namespace, object_id, namespace_=namespace)
        alarm = self.catalog.get_alarm(namespace, object_id)
        retry = 0 if alarm is None else alarm[1]
        self.catalog.set_alarm(namespace, object_id, _clock.now() + _ORPHAN_RETRY, retry)

    def _activation_failed(self, key: Key, cls: type[DurableObject], exc: Exception) -> None:
        """An alarm could not activate its object (``on_start`` raised): retry later,
        by the retry policy the object set up in ``__init__`` if it got that far."""
        namespace, object_id = key
        alarm = self.catalog.get_alarm(namespace, object_id)
        if alarm is None:
            self._start_failures.pop(key, None)
            return
        retry_delay = self._start_failures.pop(key, durable_object_retry_delay)
        ghost = ObjectHost(self, cls, namespace, object_id)
        ghost.alarm_time, ghost.alarm_retry = alarm
        ghost.alarm_failed(exc, alarm[1], retry_delay)


@asynccontextmanager
async def open_runtime(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Any = None,
    idle_timeout: float = 60.0,
    max_active: int | None = None,
    durability: Durability = "normal",
    memory_limit: int | None = None,
    memory_probe: Callable[[], float] | None = None,
    http: tuple[str, int] | None = None,  # nj-hook: dashboard
    http_writes: bool = False,  # nj-hook: dashboard
) -> AsyncIterator[Runtime]:
    """Open a runtime on data directory ``path`` (None: everything in memory).

    Leaving the block stops the timer, cancels in-flight work and closes every
    database. Raises ``RuntimeLockedError`` if another runtime holds ``path``.

    With ``memory_limit`` (bytes), a watchdog samples ``memory_probe()`` (default:
    the process's RSS) every 0.1 s; over the limit, every object whose alarm work is
    running is reset, and its Lifecycle's circuit breaker records a strike.

    With ``http=(host, port)`` the runtime serves its dashboard, ``/metrics`` and
    ``/api`` there (the ``web`` extra); ``http_writes=True`` allows requeueing and
    discarding dead letters from it.
    """
    if memory_limit is not None and (
        isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float))
        or not (memory_limit > 0 and math.isfinite(memory_limit))
    ):
        raise ValueError(f"memory_limit must be a number of bytes > 0, got {memory_limit!r}")
    if memory_probe is not None and not callable(memory_probe):
        raise TypeError(f"memory_probe must be a callable returning bytes, got {memory_probe!r}")
    if not isinstance(idle_timeout, (int, float)) or isinstance(idle_timeout, bool) or not (
        idle_timeout > 0 and math.isfinite(idle_timeout)
    ):
        raise ValueError(
            f"idle_timeout must be a finite number of seconds > 0, got {idle_timeout!r}"
        )
    if max_active is not None and (
        not isinstance(max_active, int) or isinstance(max_active, bool) or max_active < 1
    ):
        raise ValueError(f"max_active must be None or an int >= 1, got {max_active!r}")
    if durability not in _SYNCHRONOUS:
        raise ValueError(f"durability must be 'normal' or 'full', got {durability!r}")
    rt = Runtime(path, env=env, idle_timeout=float(idle_timeout), max_active=max_active,
                 durability=durability, memory_limit=memory_limit, memory_probe=memory_probe)
    rt._open()
    body_error: BaseException | None = None
    try:
        try:
            async with trio.open_nursery() as nursery:
                rt._nursery = nursery
                nursery.start_soon(rt._timer)
                if rt.path is not None:
                    nursery.start_soon(rt._checkpointer)
                if memory_limit is not None:
                    nursery.start_soon(rt._memory_watchdog)
                try:
                    if http is not None:  # nj-hook: dashboard
                        from ._web import start_http

                        await start_http(rt, nursery, http, writes=http_writes)
                    yield rt
                except BaseException as exc:
                    body_error = exc
                    raise
                finally:
                    rt._closing = True
                    nursery.cancel_scope.cancel(reason="runtime closing")
        except BaseExceptionGroup as group:
            # The body's own error (or Ctrl-C) reaches the caller as itself, not
            # wrapped in the runtime's nursery group; anything else stays grouped.
            if body_error is not None and _only(group, body_error):
                raise body_error from None
            raise
    finally:
        rt._closing = True
        rt._close()


def _only(group: BaseExceptionGroup[BaseException], error: BaseException) -> bool:
    """Whether ``group`` holds nothing but ``error`` and Cancelled, at any depth.

    (Not ``group.subgroup(pred)``: it tests ``pred`` on the group itself first, and
    the group is never ``error``, so it always came back whole.)
    """
    for exc in group.exceptions:
        if exc is error or isinstance(exc, trio.Cancelled):
            continue
        if isinstance(exc, BaseExceptionGroup) and _only(exc, error):
            continue
        return False
    return True
