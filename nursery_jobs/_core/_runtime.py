"""The runtime: an engine, the alarm timer, stubs, and one ObjectHost per active object.

A due alarm travels: the engine's alarm index -> ``Timer`` -> ``Runtime._deliver``
(activates the object if needed) -> ``ObjectHost.run_alarm`` -> the object's alarm
handler. The runtime knows nothing of the Lifecycle: a Lifecycle object simply claims
its own alarm (``ctx.claim_alarm``).
"""

from __future__ import annotations

import logging
import math
import os
import resource
import signal
import sqlite3
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, Protocol, TypeVar

import attrs
import psutil
import trio

from nursery_jobs import _call_codec, _clock, _codec
from nursery_jobs._core._alarm import Key, Timer, retry_unreachable
from nursery_jobs._core._host import ObjectHost, Phase
from nursery_jobs._core._limits import JobLimits, check_limits
from nursery_jobs._core._location import engine_for
from nursery_jobs._core._memory import MemoryWatch
from nursery_jobs._core._metrics import Metrics
from nursery_jobs._core._object import DurableObject, resolve_namespace
from nursery_jobs._core._signals import StopSignals, check_stop_on
from nursery_jobs._core._stall import StallWatch
from nursery_jobs._core._tracing import Tracing, tracing_for
from nursery_jobs._core._turns import (
    Place,
    SlowTurns,
    Ticket,
    adopt_chain,
    call_chain,
    call_place,
    forget_chain,
    in_chain,
    open_host_nursery,
)
from nursery_jobs._engines.base import Engine
from nursery_jobs._engines.files._catalog import check_object_id
from nursery_jobs._errors import (
    EngineError,
    ObjectFencedError,
    ObjectLeasedElsewhere,
    ObjectMoved,
    ObjectResetError,
    RpcError,
    RuntimeArgumentError,
    RuntimeClosedError,
    lone_interrupt,
    safe_repr,
)
from nursery_jobs._events import Event, EventBus
from nursery_jobs._policy import Limit, is_finite

logger = logging.getLogger("nursery_jobs")
T = TypeVar("T")

Durability = Literal["normal", "full"]
_SYNCHRONOUS: Final = {"normal": "NORMAL", "full": "FULL"}
# Alarm runs (activation included) allowed at once across the runtime.
_MAX_CONCURRENT_ALARMS: Final = 64
# Alarm deliveries in flight at once (``Timer``): enough that alarm runs never wait
# for one, few enough that a read of the alarm index stays small however many are due.
_MAX_DELIVERIES: Final = 4 * _MAX_CONCURRENT_ALARMS
# How often the memory watchdog samples the probe (when memory_limit is set).
MEMORY_CHECK_INTERVAL: Final = 0.1


# Open object databases kept by default when idle (``max_active=None``): an open one
# holds ~220 KiB, nearly all of it SQLite's (page cache, lookaside; a dormant resident
# object ~46 KiB, measured with /dev/shm, 2,000 objects). Bounded by the open-file limit
# alone, 20,000 overdue objects peaked at 2.27 GiB with 9,872 resident (issue 22.8);
# this bounds the idle ones at ~450 MiB whatever the limit. Busy objects are never held
# back by it (only by the open-file limit, ``open_file_budget``).
DEFAULT_OPEN_DATABASES: Final = 2048


def open_file_budget() -> int:
    """How many object databases may be open at once: what the open-file limit allows
    (two descriptors each, a margin for everything else)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 100_000
    return max(16, (soft - 256) // 2)


def default_max_active() -> int:
    """How many objects may stay resident (open, with dormancy on) when idle, by
    default: the open-file budget, at most ``DEFAULT_OPEN_DATABASES``."""
    return min(open_file_budget(), DEFAULT_OPEN_DATABASES)


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


# (A stub call may return them; Event lives beside the codec, which cannot import it.)
_codec.register_record(RuntimeStatistics, "RuntimeStatistics")
_codec.register_record(Event, "Event")

_STUB_TOKEN: Final = object()  # what only Runtime.get passes


class Stub:
    """A handle on an object by id; calls activate it. ``await stub.m(...)`` is
    ``await stub.call("m", ...)``."""

    __slots__ = ("_cls", "_id", "_ns", "_rt")

    def __init__(
        self, rt: Runtime, cls: type[DurableObject], object_id: str, *, _token: object = None
    ) -> None:
        if _token is not _STUB_TOKEN:
            raise TypeError("stubs are made by the runtime: use rt.get(cls, object_id)")
        self._rt = rt
        self._cls = cls
        self._ns = cls.namespace
        self._id = object_id

    def __repr__(self) -> str:
        return f"<Stub {self._ns}/{self._id!r}>"

    async def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call method ``name`` on the object, activating it if needed. Checkpoints.

        The arguments and the result are copied through the payload codec, on every
        engine (a call that works on one works on all); exceptions the method raises
        reach the caller as they are.

        Raises:
            CodecError: an argument (nothing ran) or the result cannot be encoded;
                ``CallCodecError.part`` says which.
        """
        if not isinstance(name, str):  # (before its place in line is looked up)
            await trio.lowlevel.checkpoint()
            raise RpcError(f"{self._ns}/{self._id}: method name must be a str, got"
                           f" {type(name).__name__}")
        if args or kwargs:
            copied, named = _call_codec.copy_arguments(args, kwargs, self._method(name))
        else:
            copied, named = args, kwargs
        place = call_place(self._cls, name)
        for _ in range(2):
            try:
                host, ticket = await self._rt._activate_in_line(
                    self._cls, self._ns, self._id, place=place)
            except ObjectLeasedElsewhere as moved:  # hook(pg): another host holds it
                # (It copies through the codec on its way: the original arguments go.)
                return await moved.forward_call(self._cls, self._id, name, args, kwargs,
                                                self.call, call_chain(),
                                                self._rt.trace_context())  # (tracing)
            try:
                result = await host.call(name, copied, named, ticket=ticket)
            except ObjectMoved as moved:
                # (hook(pg)) This host's lease lapsed before the method ran: the object
                # was dropped here; route the call again — once.
                error = moved
            else:
                if result is None:
                    return None
                return _call_codec.copy_result(result, self._method(name))
        raise ObjectFencedError(f"{self._ns}/{self._id}: {error}") from error

    def _method(self, name: str) -> str:
        return f"{self._ns}/{self._id}.{name}()"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        async def remote(*args: Any, **kwargs: Any) -> Any:
            return await self.call(name, *args, **kwargs)

        remote.__name__ = name
        return remote


class TracedStub(Stub):
    """The stub of a runtime with tracing on: each call in a span (``Tracing.call_span``).
    A class apart, so that a call without tracing pays nothing, not even a check."""

    __slots__ = ()

    async def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        tracing = self._rt.tracing
        assert tracing is not None
        with tracing.call_span(self._ns, self._id, name):
            return await super().call(name, *args, **kwargs)


class _StartFailed(Exception):
    """An object activated for its alarm failed to start (``Runtime._activate``) and
    the failure was reported where it happened (``ObjectHost.start_reported``, or the
    call that started it). Carries the start's error."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class Runtime:
    """Owns the engine, the timer and the active objects. Made by ``open_runtime``."""

    def __init__(
        self,
        engine: Engine,
        *,
        env: Any,
        idle_timeout: float,
        max_active: int | None,
        durability: Durability,
        memory_limit: int | None = None,
        memory_probe: Callable[[], float] | None = None,
        dormant_after: float | None = None,
        turn_warning: float = 10.0,
        limits: dict[str, Limit] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.engine = engine
        # open_runtime(tracing=...): spans for calls and job runs (None: off).
        self.tracing = tracing
        self.slow_turns = SlowTurns(turn_warning)
        self.memory_limit = memory_limit
        self.memory_probe = memory_probe or process_rss
        self.env = env
        self.idle_timeout = idle_timeout
        self.dormant_after = dormant_after
        self.dormancy = trio.Lock()
        # Unbounded would run out of file descriptors: by default keep resident what
        # the open-file limit allows (two per object, a margin for everything else).
        # An engine may keep fewer (``Engine.default_max_active``: the shared layout's).
        engine_bound = engine.default_max_active
        self.max_active = (max_active if max_active is not None
                           else engine_bound if engine_bound is not None
                           else default_max_active())
        # With dormancy on, that default bound counts open databases only: a dormant
        # object holds no file descriptor (see _evict_over_limit).
        self._bounds_open = max_active is None and dormant_after is not None
        self.durability = durability
        self.events = EventBus()
        self.metrics = Metrics(self.events)
        self.http_url: str | None = None  # where the dashboard listens (open_runtime http=)
        self.timer = Timer(engine, self._deliver, max_inflight=_MAX_DELIVERIES)
        self._hosts: OrderedDict[Key, ObjectHost] = OrderedDict()
        # How many of them are on their way out (asked to leave, or closing): counted,
        # not looked for. (A cold fire of 3,000 objects had ~57 at the front of
        # ``_hosts`` at every activation, each looked at by ``_evict_over_limit``.)
        self._departing = 0
        # The hosts whose database is open (or opening), least recently used first.
        self._open: OrderedDict[Key, ObjectHost] = OrderedDict()
        # Where objects' databases are files, how many may be open at once (whatever
        # state their objects are in), and the activations and wakes waiting for one.
        self._file_budget = open_file_budget() if engine.holds_files else None
        self._files_freed = trio.lowlevel.ParkingLot()
        self._nursery: trio.Nursery | None = None
        self._limiter = trio.CapacityLimiter(_MAX_CONCURRENT_ALARMS)
        self._closing = False
        # Work under suspicion of killing the process runs one at a time (the
        # Lifecycle holds it around jobs with crash strikes).
        self.probation = trio.Lock()
        # Permits per limited namespace (open_runtime(limits=...)); empty: no cost.
        self.limits = JobLimits(limits or {}, self._wake_limited, self._start_soon)

    def _wake_limited(self, namespace: str, object_id: str) -> None:
        """A permit of the namespace's limit is reserved for a held object: deliver its
        alarm now (its run takes the permit)."""
        if not self._closing:
            self.timer.deliver_now((namespace, object_id))

    def _start_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._nursery is not None and not self._closing:
            self._nursery.start_soon(fn, *args)

    @property
    def path(self) -> Any:
        """The data directory of a files engine (None for other engines)."""
        return getattr(self.engine, "path", None)

    # -- objects ------------------------------------------------------------------
    def get(self, cls: type[DurableObject], object_id: str) -> Stub:
        """Return a stub for object ``object_id`` of class ``cls``. No I/O; does not
        checkpoint."""
        if not (isinstance(cls, type) and issubclass(cls, DurableObject)):
            raise RuntimeArgumentError(f"get() needs a DurableObject subclass, got {cls!r}")
        # (tracing) with tracing on, stubs whose calls make spans
        stub = Stub if self.tracing is None else TracedStub
        return stub(self, cls, check_object_id(object_id), _token=_STUB_TOKEN)

    def host_closed(self, host: ObjectHost) -> None:
        if self._hosts.get(host.key) is host:
            del self._hosts[host.key]
        self.database_closed(host)

    def database_closed(self, host: ObjectHost) -> None:
        if self._open.get(host.key) is host:
            del self._open[host.key]
            if self._files_freed:
                self._files_freed.unpark()

    async def open_slot(self, host: ObjectHost, *, for_turn: bool = False) -> None:
        """Count ``host``'s database, about to open, as open. Where databases are
        files, wait while the open-file budget is spent — asking idle objects to doze or
        leave — rather than open one more (past it, opens fail with EMFILE and so does
        the application's own ``open()``). Checkpoints.

        ``for_turn``: the task that asks holds a turn of an object (a call or job of it
        calls this one), whose own file stays open until this answers. Where no open
        object can give a file up (every one is busy, maybe each waiting so), it opens
        past the budget: waiting could never end (the margin for other descriptors
        absorbs it). Activations by the timer or the application still wait."""
        await trio.lowlevel.checkpoint_if_cancelled()
        budget = self._file_budget
        if budget is not None and host.key not in self._open:
            while len(self._open) >= budget and host.phase is not Phase.CLOSED:
                wanted = len(self._open) - budget + 1
                if self._free_files(wanted) == wanted and for_turn:
                    break  # nobody to ask: a deadlock if the busy ones wait for us
                await self._files_freed.park()
        # Counted with no checkpoint since the look at the count (those that wake at
        # once must not all see the same free file).
        if host.phase is not Phase.CLOSED:
            self._open[host.key] = host
            self._open.move_to_end(host.key)
            self._evict_over_limit()
        await trio.lowlevel.cancel_shielded_checkpoint()

    def departing(self, host: ObjectHost, on: bool) -> None:
        self._departing += 1 if on else -1

    def host_idle(self, host: ObjectHost) -> None:
        if self._files_freed:  # someone waits for a file: an idle object gives one up
            self._free_files(len(self._files_freed))

    def _free_files(self, n: int) -> int:
        """Ask up to ``n`` idle objects, least recently used first, to close their
        databases: they doze (with dormancy on) or leave memory. One asked already
        counts. Returns how many of the ``n`` no object could be asked for. Does not
        checkpoint."""
        for host in list(self._open.values()):
            if n <= 0:
                break
            if host.doze_pending or host.leaving:
                n -= 1
            elif host.evictable:
                if self.dormant_after is None or not host.doze_now():
                    host.evict()  # (max_active: the open-file limit)
                n -= 1
        return max(n, 0)

    async def _activate(
        self, cls: type[DurableObject], namespace: str, object_id: str, *,
        for_alarm: bool = False, create: bool = True,
    ) -> ObjectHost:
        """Return the object's ready host, starting it (and ``on_start``) if needed.
        ``create=False``: only an object that is resident or stored (else
        ``UnknownObjectError``, nothing created)."""
        host, _ = await self._activate_in_line(cls, namespace, object_id,
                                               for_alarm=for_alarm, create=create)
        return host

    async def _activate_in_line(
        self, cls: type[DurableObject], namespace: str, object_id: str, *,
        for_alarm: bool = False, create: bool = True, place: Place | None = None,
    ) -> tuple[ObjectHost, Ticket | None]:
        """``_activate``, for a call or alarm run that takes the turn ``place`` (kind,
        holder; None: no turn). Where the object is starting, its place in the
        object's line is taken now, behind the startup (and before whatever arrives
        later): the ticket returned, which the caller takes or drops. Checkpoints."""
        key = (namespace, object_id)
        started: ObjectHost | None = None  # the host this task started, if any
        ticket: Ticket | None = None  # its place in the line of ``ticket.gate``
        try:
            while True:
                if self._closing or self._nursery is None:
                    raise RuntimeClosedError(
                        f"the runtime is closed; cannot reach {namespace}/{object_id}"
                    )
                host = self._hosts.get(key)
                if ticket is not None and (host is None or ticket.gate is not host.turns):
                    ticket.gate.drop(ticket)  # (that host is gone)
                    ticket = None
                if host is None:
                    host = ObjectHost(self, cls, namespace, object_id, for_alarm=for_alarm,
                                      for_turn=in_chain(), create=create)
                    self._hosts[key] = host
                    if place is not None:
                        ticket = host.turns.reserve(*place)  # (behind its startup)
                    try:
                        await self._nursery.start(host.run)
                    except BaseException as exc:
                        host.error = exc
                        host.handed_over = True  # (nobody is left to take it)
                        if for_alarm and host.start_reported and isinstance(exc, Exception):
                            raise _StartFailed(exc) from exc
                        raise
                    started = host
                    # Not returned as it is: a stalled loop (a job holding the Trio
                    # thread past idle_timeout) may have evicted it before this task
                    # resumed, and its nursery would refuse the alarm run (found by
                    # benchmarks/timers.py, idle_timeout 0.2 s). The loop below looks
                    # at its status again.
                    continue
                if host.serving:
                    self._hosts.move_to_end(key)
                    if key in self._open:
                        self._open.move_to_end(key)
                    if host is started:
                        # Taken: the caller's call or alarm run holds it from here, with
                        # no checkpoint between (``ObjectHost.call``, ``run_alarm``).
                        host.handed_over = True
                    return host, ticket
                if host.phase is Phase.STARTING:
                    if place is not None and ticket is None:
                        # In line now, behind the startup and whatever came before.
                        ticket = host.turns.reserve(*place)
                    await host.ready.wait()
                    if host.absent and create:
                        continue  # (an operator face's look that found nothing: this creates it)
                    if host.error is not None:
                        if for_alarm and isinstance(host.error, Exception):
                            # Another task's start (a call's: the timer delivers one
                            # alarm of an object at a time), whose caller got the error.
                            raise _StartFailed(host.error) from host.error
                        raise host.error
                else:
                    await host.closed.wait()
        except BaseException:
            if ticket is not None:
                ticket.gate.drop(ticket)
            raise

    def _evict_over_limit(self) -> None:
        if self._bounds_open:
            # The open-file limit's bound, with dormancy on: past it the least recently
            # used idle objects doze at once (one that may not doze leaves memory).
            self._free_files(len(self._open) - self.max_active)
            return
        if self.max_active is None:
            return
        # (Those on their way out already count as gone.)
        excess = len(self._hosts) - self.max_active - self._departing
        if excess <= 0:
            return
        for host in self._hosts.values():  # least recently used first
            if host.evictable:
                host.evict()  # (max_active)
                excess -= 1
                if excess == 0:
                    break

    # -- inspection (the dashboard, nursery_jobs.testing) --------------------------------
    def active_objects(self) -> list[Key]:
        """(namespace, object id) of every active object. Does not checkpoint."""
        return [key for key, host in self._hosts.items() if host.serving]

    def active_database(self, namespace: str, object_id: str) -> sqlite3.Connection | None:
        """The open database of an active object (read it on the Trio thread), or None:
        not active, or dormant (its file is closed; read that). Does not checkpoint."""
        host = self._hosts.get((namespace, object_id))
        state = None if host is None else host.state
        return None if state is None or state.dormant else state.conn

    def database_closing(self, namespace: str, object_id: str) -> bool:
        """Whether a dozing object's database is being closed right now (its file must
        not be opened meanwhile: closing another descriptor of it would drop this
        process's lock on it). Does not checkpoint."""
        host = self._hosts.get((namespace, object_id))
        state = None if host is None else host.state
        return state is not None and state.closing

    def is_active(self, namespace: str, object_id: str) -> bool:
        """Whether the object is in memory (awake or dormant). Does not checkpoint."""
        host = self._hosts.get((namespace, object_id))
        return host is not None and host.state is not None

    def active_instance(self, namespace: str, object_id: str) -> DurableObject | None:
        """The instance of an active object, or None. Does not checkpoint."""
        host = self._hosts.get((namespace, object_id))
        return None if host is None else host.instance

    async def activate(self, cls: type[DurableObject], object_id: str) -> DurableObject:
        """Activate an object (running its startup) and return its instance."""
        return await self.run_in(cls, object_id, "startup (rt.activate)", _itself,
                                 create=True)

    async def run_in(self, cls: type[DurableObject], object_id: str, holder: str,
                     fn: Callable[[DurableObject], Awaitable[T]], *,
                     namespace: str | None = None, create: bool = False) -> T:
        """``await fn(instance)`` in the object, as a write call of it runs
        (``ObjectHost.run_write``): resident and awake from activation to the end,
        startup first, in one write turn whose commits are durable when it returns.
        ``namespace`` is the object's (default the class's: a namespace served through
        its recorded class path may name another). For the operator faces (the
        dashboard's actions): an object that does not exist is not created, unless
        ``create`` (``rt.activate``). Checkpoints.

        Raises:
            UnknownObjectError: (not ``create``) no such object is resident or stored;
                nothing was created.
            ObjectResetError: the object was reset meanwhile.
            ObjectLeasedElsewhere: (PostgreSQL) another live host holds it.
            ObjectFencedError: (PostgreSQL) this host's lease went meanwhile; nothing
                written in the object shipped.
        """
        namespace = cls.namespace if namespace is None else namespace
        object_id = check_object_id(object_id)
        host = await self._activate(cls, namespace, object_id, create=create)
        state = host.state
        if state is not None and state.ships:
            try:
                state.admit()
            except ObjectFencedError:
                # (hook(pg)) This host's lease lapsed (as for a call, ``ObjectHost.call``):
                # the object was dropped here before anything ran; activate it again,
                # once (taken again here, or ObjectLeasedElsewhere).
                host = await self._activate(cls, namespace, object_id, create=create)
                if host.state is not None and host.state.ships:
                    host.state.admit()

        async def run() -> T:
            instance = host.instance
            if instance is None:
                raise ObjectResetError(f"{host.label} was reset during {holder}")
            return await fn(instance)

        result: T = await host.run_write(holder, run)
        return result

    @property
    def closing(self) -> bool:
        """Whether the runtime is shutting down (or has shut down)."""
        return self._closing

    def statistics(self) -> RuntimeStatistics:
        """Return a snapshot of the runtime's state. Does not checkpoint."""
        return RuntimeStatistics(
            active_objects=len(self._hosts),
            alarms_in_flight=len(self.timer.inflight),
            pending_alarms=self.engine.alarm_count(),
            events_dropped=self.events.dropped,
        )

    # -- what the engine may ask (EngineSite) ----------------------------------------
    def earliest_alarm(self) -> float:
        return self.timer.earliest_alarm()

    def wake_timer(self) -> None:
        self.timer.nudge()

    async def run_call(
        self, namespace: str, object_id: str, name: str, args: tuple[Any, ...],
        kwargs: dict[str, Any], chain: tuple[str, ...] = (), trace: str | None = None,
    ) -> Any:
        if self.tracing is not None:  # a span here, a child of the caller's (tracing)
            with self.tracing.served_call_span(namespace, object_id, name, trace):
                return await self._run_call(namespace, object_id, name, args, kwargs, chain)
        return await self._run_call(namespace, object_id, name, args, kwargs, chain)

    async def _run_call(
        self, namespace: str, object_id: str, name: str, args: tuple[Any, ...],
        kwargs: dict[str, Any], chain: tuple[str, ...],
    ) -> Any:
        cls = resolve_namespace(namespace, self.engine.class_path(namespace))
        if cls is None:
            raise RpcError(f"no class is registered for namespace {namespace!r} on this host")
        host, ticket = await self._activate_in_line(cls, namespace, object_id,
                                                    place=call_place(cls, name))
        # The call chain it came with: a call back into a turn it holds re-enters it.
        token = adopt_chain(chain)
        try:
            return await host.call(name, args, kwargs, ticket=ticket)
        finally:
            forget_chain(token)

    def serves(self, namespace: str, class_path: str | None) -> bool:
        return resolve_namespace(namespace, class_path) is not None

    def trace_context(self) -> str | None:
        """The current span's context to carry with a forwarded call (None: untraced)."""
        return None if self.tracing is None else self.tracing.push_context()

    def fenced(self, namespace: str, object_id: str, reason: str | None = None) -> None:
        host = self._hosts.get((namespace, object_id))
        if host is not None:
            host.fence(reason)

    def _clock_adjusted(self, drift: float) -> None:
        """The wall-clock anchor moved: the timer's deadline (on Trio's clock) is stale."""
        self.timer.nudge()
        self.events.emit("clock:adjusted", "", "", drift=drift)

    # -- alarms -------------------------------------------------------------------
    async def _deliver(self, key: Key) -> None:
        """Activate the object of a due alarm (if needed) and run its alarm."""
        namespace, object_id = key
        try:
            await self._activate_and_run(namespace, object_id)
        finally:
            if self.limits:
                # A permit reserved for this object that its run did not take goes on.
                self.limits.delivered(namespace, object_id)

    async def _activate_and_run(self, namespace: str, object_id: str) -> None:
        async with self._limiter:
            cls = resolve_namespace(namespace, self.engine.class_path(namespace))
            if cls is None:
                retry_unreachable(
                    self.engine, self.events, namespace, object_id, "alarm:orphaned",
                    f"no class is registered for namespace {namespace!r}; define or import it",
                )
                return
            try:
                host, ticket = await self._activate_in_line(
                    cls, namespace, object_id, for_alarm=True, place=("write", "alarm run"))
            except (RuntimeClosedError, _StartFailed):
                # Shutting down: the alarm stays as it is for the next run. A failed
                # start was reported where it failed: ObjectHost.run re-timed the alarm
                # (its database would not open, or on_start raised), or the call that
                # started the object got the error.
                return
            except Exception as exc:
                # Anything else is a fault of ours (an AssertionError here once hid the
                # eviction churn of issue 26): said, with its traceback, and retried.
                retry_unreachable(
                    self.engine, self.events, namespace, object_id, "alarm:retry",
                    f"its activation raised {safe_repr(exc)}", error=exc,
                )
                return
            await host.run_alarm(ticket)

    async def _memory_watchdog(self, watch: MemoryWatch) -> None:
        """Sample memory; over the limit, reset the objects whose alarm work grew it
        (``_memory.MemoryWatch``). Holds no host between samples: a reset object must
        be free to leave memory."""
        while True:
            await trio.sleep(MEMORY_CHECK_INTERVAL)
            watch.check(self._hosts.values())

    def _close(self) -> None:
        for host in list(self._hosts.values()):
            host.close()
        self.engine.close()


@asynccontextmanager
async def open_runtime(
    path: str | os.PathLike[str] | Engine | None = None,
    *,
    env: Any = None,
    idle_timeout: float = 60.0,
    dormant_after: float | None = None,
    max_active: int | None = None,
    durability: Durability = "normal",
    memory_limit: int | None = None,
    memory_probe: Callable[[], float] | None = None,
    http: tuple[str, int] | None = None,
    http_writes: bool = False,
    lease_ttl: float | None = None,
    pool_size: int | None = None,
    turn_warning: float = 10.0,
    limits: Mapping[str | type[DurableObject], Limit] | None = None,
    stop_on: Iterable[int] = (signal.SIGTERM,),
    client_only: bool = False,
    tracing: object = None,
) -> AsyncIterator[Runtime]:
    """Open a runtime on data directory ``path`` (None: everything in memory; or an
    ``Engine``). A ``scheme://`` address no engine serves raises ``EngineError``.

    With a ``postgresql://`` address this process is a host of that database's cluster
    (DESIGN section 9): ``lease_ttl`` (seconds, default 10) and ``pool_size`` (default 8)
    go to its ``PostgresEngine``; they are refused for any other location. With
    ``client_only=True`` (a ``postgresql://`` address only; ``EngineError`` naming it
    elsewhere) the runtime holds no object and claims no alarm: every call is forwarded
    to a host (``RpcError`` when none is running).

    Leaving the block stops the timer, cancels in-flight work and closes every
    database. Raises ``RuntimeLockedError`` if another runtime holds ``path``.

    An object idle for ``idle_timeout`` seconds leaves memory. With ``dormant_after``
    (seconds, shorter than ``idle_timeout``; a data directory only), an object idle
    that long stays resident but closes its database (~15 KiB instead of ~170 per
    object); its next call or alarm opens it again (~0.35 ms, which that call or alarm
    waits for). Off by default: an object touched every few dozen seconds then pays a
    reopen each time. An object whose connection was handed out (``storage.db``,
    ``storage.conn``) or given state (PRAGMA, ATTACH, TEMP), or that runs tasks of its
    own in its nursery, keeps its database open.

    With ``memory_limit`` (bytes), a watchdog samples ``memory_probe()`` (default:
    the process's RSS) every 0.1 s; over the limit, every object whose alarm work is
    running is reset, and its Lifecycle's circuit breaker records a strike.

    A turn of an object (a call, an alarm run, startup) held past ``turn_warning``
    seconds emits ``object:turn_slow`` once (``math.inf``: never).

    Opened in the main thread, the runtime turns the signals in ``stop_on`` (SIGTERM by
    default: what Docker, systemd and Kubernetes stop a process with) into a graceful
    stop of its block: running jobs are cancelled, keep their attempts, get no crash
    strike and run again at once on the next start; then the block exits normally.
    ``stop_on=()`` leaves signals to the application. The signals stay caught until
    everything is stopped: a further one while the jobs wind down does nothing more.

    ``limits={namespace or class: nj.Limit(concurrency=N, rate=(k, per_seconds))}``
    bounds how many of that namespace's jobs run at once in this runtime, and how many
    start in any ``per_seconds`` window (on PostgreSQL: per host). A held job stays due,
    in order, and uses up no attempt; a held object waits in line holding nothing else
    (no turn: calls to it do not wait; no alarm slot).

    With ``tracing`` (an OpenTelemetry ``TracerProvider``; the ``otel`` extra), stub
    calls and job runs make spans, and a push stores the current span's context with the
    job, so its run links to the trace that asked for it. Raises ``TracingError`` (a
    ``TypeError``) for a value that is no TracerProvider, ``MissingExtraError`` where
    OpenTelemetry is not installed; nothing is opened then.
    """
    signals = check_stop_on(stop_on)
    checked_limits = check_limits(limits)
    tracer = tracing_for(tracing)
    # (is_finite, not math.isfinite: an int too large for a float is refused, where
    # math.isfinite raised OverflowError.)
    if (isinstance(turn_warning, bool) or not isinstance(turn_warning, (int, float))
            or not (is_finite(turn_warning) or turn_warning == math.inf) or turn_warning <= 0):
        raise RuntimeArgumentError(
            f"turn_warning must be a number of seconds > 0 (inf: never warn), got"
            f" {turn_warning!r}")
    if memory_limit is not None and (
        isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float))
        or not (memory_limit > 0 and is_finite(memory_limit))
    ):
        raise RuntimeArgumentError(
            f"memory_limit must be a finite number of bytes > 0, got {memory_limit!r}")
    if memory_probe is not None and not callable(memory_probe):
        raise RuntimeArgumentError(
            f"memory_probe must be a callable returning bytes, got {memory_probe!r}")
    if not isinstance(idle_timeout, (int, float)) or isinstance(idle_timeout, bool) or not (
        idle_timeout > 0 and is_finite(idle_timeout)
    ):
        raise RuntimeArgumentError(
            f"idle_timeout must be a finite number of seconds > 0, got {idle_timeout!r}"
        )
    if dormant_after is not None and (
        not isinstance(dormant_after, (int, float)) or isinstance(dormant_after, bool)
        or not (dormant_after > 0 and is_finite(dormant_after))
    ):
        raise RuntimeArgumentError(
            f"dormant_after must be None or a finite number of seconds > 0, got"
            f" {dormant_after!r}"
        )
    if max_active is not None and (
        not isinstance(max_active, int) or isinstance(max_active, bool) or max_active < 1
    ):
        raise RuntimeArgumentError(f"max_active must be None or an int >= 1, got {max_active!r}")
    if not isinstance(durability, str) or durability not in _SYNCHRONOUS:
        raise RuntimeArgumentError(f"durability must be 'normal' or 'full', got {durability!r}")
    if not isinstance(client_only, bool):
        raise RuntimeArgumentError(f"client_only must be a bool, got {client_only!r}")
    if client_only and not _is_postgres(path):
        raise EngineError(
            f"client_only=True needs a postgresql:// address (a client forwards every call"
            f" to a host of that database), not {path!r}: a data directory or memory has"
            " no other host to run its objects")
    cluster: dict[str, Any] = {
        name: value for name, value in (("lease_ttl", lease_ttl), ("pool_size", pool_size))
        if value is not None}
    if client_only:
        cluster["client_only"] = True
    engine = engine_for(path, synchronous=_SYNCHRONOUS[durability], **cluster)
    rt = Runtime(engine, env=env, idle_timeout=float(idle_timeout), max_active=max_active,
                 durability=durability, memory_limit=memory_limit, memory_probe=memory_probe,
                 dormant_after=None if dormant_after is None else float(dormant_after),
                 turn_warning=float(turn_warning), limits=checked_limits, tracing=tracer)
    stop = StopSignals(signals)
    with stop.caught():  # (the whole life of the runtime: its start and shutdown too)
        engine.open(_clock.now())
        body_error: BaseException | None = None
        try:
            try:
                async with open_host_nursery() as nursery:
                    rt._nursery = nursery
                    nursery.start_soon(rt.timer.run, nursery)
                    nursery.start_soon(engine.serve, rt)
                    nursery.start_soon(_clock.run_anchor, rt._clock_adjusted)
                    nursery.start_soon(StallWatch(rt.events).run)
                    nursery.start_soon(rt.slow_turns.run)
                    if memory_limit is not None:
                        # (Its first sample now, before any task of the runtime has run.)
                        watch = MemoryWatch(memory_limit, rt.memory_probe)
                        watch.begin()
                        nursery.start_soon(rt._memory_watchdog, watch)
                    # A stop signal cancels the block, from its first moment on (one
                    # during the HTTP face's start: the block ends at once); it exits
                    # normally.
                    stopping = trio.CancelScope()
                    if stop.signals:
                        nursery.start_soon(stop.watch, rt.events, stopping)
                    try:
                        if http is not None:
                            await _http_face(rt, nursery, http, writes=http_writes)
                        with stopping:
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
                # Ctrl-C that landed in a runtime task (under load) reaches the caller plain.
                if (interrupt := lone_interrupt(group)) is not None:
                    raise interrupt from None
                raise
        finally:
            rt._closing = True
            rt._close()


def _is_postgres(location: object) -> bool:
    return isinstance(location, str) and location.partition("://")[0].lower() in (
        "postgresql", "postgres")


class HttpFace(Protocol):
    """Serves a runtime's dashboard, ``/metrics`` and ``/api`` from its nursery."""

    async def __call__(
        self, rt: Runtime, nursery: trio.Nursery, address: object, *, writes: bool
    ) -> None: ...


async def _no_http_face(
    rt: Runtime, nursery: trio.Nursery, address: object, *, writes: bool
) -> None:
    raise RuntimeError("no HTTP face is installed (import nursery_jobs, not its core alone)")


# The HTTP face lives in the operator floor above the runtime, which must not import
# it: ``nursery_jobs/__init__.py`` plugs it in with ``install_http_face``.
_http_face: HttpFace = _no_http_face


def install_http_face(face: HttpFace) -> None:
    """Make ``open_runtime(http=...)`` serve through ``face``."""
    global _http_face
    _http_face = face


async def _itself(instance: DurableObject) -> DurableObject:
    await trio.lowlevel.checkpoint()
    return instance


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
