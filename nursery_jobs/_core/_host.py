"""ObjectHost: one active object — its task, nursery, cancel scope, state and instance.

The host runs calls and alarm runs as work of the object (``working``), closes its
database when it dozes (``dormant_after``), evicts it when idle, and hands the one owner
of its alarm an ``AlarmClaim`` (``_host_claim.HostClaim``).
"""

from __future__ import annotations

import enum
import inspect
import logging
import math
import sqlite3
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import trio

from nursery_jobs import _clock
from nursery_jobs._core._alarm import AlarmHandler, ObjectAlarm, Timer, retry_unreachable
from nursery_jobs._core._host_claim import HostClaim
from nursery_jobs._core._metrics import Metrics
from nursery_jobs._core._object import AlarmInfo, DurableObject, ObjectContext, class_path
from nursery_jobs._core._storage import Storage
from nursery_jobs._core._transactions import ObjectTransactions
from nursery_jobs._core._turns import (
    SlowTurns,
    Ticket,
    TurnGate,
    in_chain,
    interleave_gate,
    method_turn,
    open_host_nursery,
)
from nursery_jobs._engines.base import RELEASED
from nursery_jobs._errors import (
    AlarmOwnedError,
    ObjectFencedError,
    ObjectMoved,
    ObjectResetError,
    RpcError,
    StorageError,
    StorageFaultError,
    UnknownObjectError,
    safe_repr,
    sole_leaf,
)
from nursery_jobs._events import EventBus
from nursery_jobs._policy import LOCKED_RETRY, Backoff

if TYPE_CHECKING:
    from nursery_jobs._core._limits import JobLimits
    from nursery_jobs._core._runtime import Stub
    from nursery_jobs._core._tracing import Tracing
    from nursery_jobs._engines.base import Engine, FlightSlot, ObjectState

logger = logging.getLogger("nursery_jobs")

# How long an object leaving memory waits for its last commits to ship (PostgreSQL).
LAST_SHIP_TIMEOUT: Final = 5.0


class Phase(enum.Enum):
    """Where an object's host is in its life; every change goes through
    ``ObjectHost._to`` (``_MOVES`` lists the allowed ones). How busy it is, is counted
    apart (``busy``: calls, alarm runs, tracked work in progress)."""

    STARTING = "starting"  # opening its database, constructing the instance, on_start
    ACTIVE = "active"  # serving calls and alarms
    DOZING = "dozing"  # asked to close its database now and stay (the open-file bound)
    LEAVING = "leaving"  # asked to leave memory (evicted, destroyed) once idle
    CLOSING = "closing"  # its scope is cancelled: its tasks end, then its database closes
    CLOSED = "closed"


_MOVES: Final = {
    Phase.STARTING: {Phase.ACTIVE, Phase.CLOSING, Phase.CLOSED},
    Phase.ACTIVE: {Phase.DOZING, Phase.LEAVING, Phase.CLOSING, Phase.CLOSED},
    Phase.DOZING: {Phase.ACTIVE, Phase.LEAVING, Phase.CLOSING, Phase.CLOSED},
    Phase.LEAVING: {Phase.ACTIVE, Phase.CLOSING, Phase.CLOSED},
    Phase.CLOSING: {Phase.CLOSED},
    Phase.CLOSED: set(),
}
# The phases in which a host serves calls and alarms.
SERVING: Final = frozenset({Phase.ACTIVE, Phase.DOZING, Phase.LEAVING})
# The phases of a host on its way out of memory (``HostSite.departing``).
DEPARTING: Final = frozenset({Phase.LEAVING, Phase.CLOSING})


@attrs.frozen(kw_only=True)
class Reset:
    """Why an object was reset (everything it did cancelled, dropped from memory)."""

    reason: str
    memory: bool = False  # the memory watchdog, or a MemoryError in its alarm work
    fenced: bool = False  # another host took it over: nothing more is written here


class HostSite(Protocol):
    """What a host needs of its runtime."""

    engine: Engine
    timer: Timer
    events: EventBus
    metrics: Metrics
    env: Any
    idle_timeout: float
    # Idle this long, a resident object closes its database (None: never).
    dormant_after: float | None
    # Held while an object closes its database: one at a time (see ObjectHost._doze).
    dormancy: trio.Lock
    probation: trio.Lock
    slow_turns: SlowTurns
    limits: JobLimits  # (open_runtime(limits=...))
    tracing: Tracing | None  # open_runtime(tracing=...); None: off

    def get(self, cls: type[DurableObject], object_id: str) -> Stub: ...
    def host_closed(self, host: ObjectHost) -> None: ...
    # A resident object's database was closed (it dozed), or is about to be opened (its
    # activation or wake waits here while the open-file budget is spent).
    def database_closed(self, host: ObjectHost) -> None: ...
    async def open_slot(self, host: ObjectHost, *, for_turn: bool = False) -> None: ...
    # Its last work ended (an object waiting for the budget may take its file).
    def host_idle(self, host: ObjectHost) -> None: ...
    # It is on its way out of memory (LEAVING or CLOSING: ``on``), or no longer is.
    def departing(self, host: ObjectHost, on: bool) -> None: ...


class ObjectHost:
    """One active object."""

    __slots__ = (
        "_alarm_work",
        "_busy",
        "_destroy",
        "_given",
        "_idle_scope",
        "_idle_since",
        "_idle_wake",
        "_startup",
        "_startup_ticket",
        "_work_scopes",
        "absent",
        "alarm",
        "closed",
        "cls",
        "create",
        "ctx",
        "error",
        "flight",
        "for_alarm",
        "for_turn",
        "handed_over",
        "instance",
        "key",
        "memory_mark",
        "namespace",
        "object_id",
        "phase",
        "ready",
        "reset_cause",
        "scope",
        "site",
        "start_reported",
        "state",
        "transactions",
        "turns",
    )

    def __init__(
        self, site: HostSite, cls: type[DurableObject], namespace: str, object_id: str, *,
        for_alarm: bool, for_turn: bool = False, create: bool = True,
    ) -> None:
        self.site = site
        self.cls = cls
        self.namespace = namespace
        self.object_id = object_id
        self.key = (namespace, object_id)
        self.for_alarm = for_alarm
        # False (an operator face's activation): open the object only if it is stored
        # (``Engine.open_object``). ``absent``: it was not, and nothing was created —
        # a call that waited for this start creates it as calls do.
        self.create = create
        self.absent = False
        # Activated by a task holding an object's turn (``Runtime.open_slot``).
        self.for_turn = for_turn
        self.phase = Phase.STARTING
        # Whether the task that activated it has taken it (``Runtime._activate``). Until
        # then the runtime does not ask it to leave or doze for room: started, it waits
        # for that task to resume and begin its call or alarm run, and evicted in
        # between it would only be activated again (issue 26: a burst of due alarms
        # took ~6 activations per object).
        self.handed_over = False
        self.ready = trio.Event()
        self.closed = trio.Event()
        self.error: BaseException | None = None
        # A failed start for an alarm that ``run`` reported and re-timed the alarm for
        # (its database would not open, on_start raised); any other is a fault of ours.
        self.start_reported = False
        self.instance: DurableObject | None = None
        self.ctx: ObjectContext | None = None
        self.state: ObjectState | None = None
        self.alarm: ObjectAlarm | None = None
        self.flight: FlightSlot | None = None
        self.scope = trio.CancelScope()
        # Idle, the object's task waits for ``_idle_wake`` (asked to leave or doze) or the
        # idle scope's deadline (dormant_after, idle_timeout; moved as work comes and
        # goes). An event, not a cancel of the scope: a cancel delivered Cancelled
        # through the wait (~5% of creating an object whose arrival evicts another).
        self._idle_scope = trio.CancelScope()
        self._idle_wake = trio.Event()
        self._idle_since = math.inf  # when the last work ended
        self._work_scopes: set[trio.CancelScope] = set()
        self._busy = 0
        self._destroy = False  # delete its data once its work ends (then it leaves)
        self._alarm_work = 0
        # The memory sample before its current alarm work began (``_memory``).
        self.memory_mark: float | None = None
        self.transactions: ObjectTransactions | None = None
        # One task changes the object at a time: calls, alarm runs and startup take turns.
        # (Its emit holds the event bus, not this host: see ``close``.)
        self.turns = TurnGate(self.label, slow=site.slow_turns,
                              emit=partial(_turn_slow, site.events, namespace, object_id))
        # Startup's place, first in line from the moment the host exists: whatever
        # arrives while it starts stands in line behind it (``Runtime._activate_in_line``).
        self._startup_ticket = self.turns.reserve("write", "startup (on_start)")
        # Run before the first call of the activation (the Lifecycle's startup).
        self._startup: list[Callable[[], Awaitable[None]]] | None = None
        self._given: HostClaim | None = None  # the claim of its alarm (``_claim``)
        self.reset_cause: Reset | None = None

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.object_id}"

    # -- the object's task --------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        site = self.site
        start_error: Exception | None = None
        try:
            await site.open_slot(self, for_turn=self.for_turn)
            try:
                # (create= only where it is False: an engine of the application's that
                # predates it still opens objects for calls and alarms)
                if self.create:
                    state = await site.engine.open_object(
                        self.namespace, self.object_id, class_path(self.cls))
                else:
                    state = await site.engine.open_object(
                        self.namespace, self.object_id, class_path(self.cls), create=False)
                self.state = state
            except Exception as exc:
                self.absent = not self.create and isinstance(exc, UnknownObjectError)
                if self.for_alarm:
                    retry_unreachable(site.engine, site.events, self.namespace,
                                      self.object_id, "alarm:retry", f"it cannot be opened: {exc}")
                    self.start_reported = True
                raise
            self.alarm = ObjectAlarm(state, site.timer, site.events, self.namespace,
                                     self.object_id)
            with self.scope:
                async with open_host_nursery() as nursery:
                    try:
                        self.transactions = tx = ObjectTransactions(state.conn, self.label,
                                                                    self.turns)
                        storage = Storage(state.conn, self.alarm, tx)
                        self.ctx = ObjectContext(
                            id=self.object_id, namespace=self.namespace, storage=storage,
                            nursery=nursery, env=site.env, events=site.events,
                            stubs=site.get, claim=self._claim, turns=self.turns,
                        )
                        async with self.turns.turn("write", "startup (on_start)",
                                                   ticket=self._startup_ticket):
                            self.instance = self.cls(self.ctx)
                            await self.instance.on_start()
                    except Exception as exc:
                        start_error = exc
                        if self.for_alarm:
                            # The alarm that activated us retries by the policy the
                            # object's __init__ chose (a Lifecycle's, say).
                            self.alarm.failed(exc, self.alarm.retry)
                            self.start_reported = True
                        nursery.cancel_scope.cancel(reason="on_start failed")
                    else:
                        self._to(Phase.ACTIVE)
                        # Start the idle clock now: an activation whose call never
                        # runs (RpcError) would otherwise stay resident forever.
                        self._idle_scope.deadline = self._idle_deadline()
                        self.ready.set()
                        task_status.started()
                        await self._wait_until_idle()
                        nursery.cancel_scope.cancel(reason="evicted: idle")
        except Exception as exc:
            if self.phase is Phase.STARTING:
                self.error = exc  # (see the finally clause)
                raise
            # A task the object started in its nursery crashed: the object is reset.
            # One incident, one record (the event's, with the traceback); its error is
            # the task's own exception, not the nursery's group around it.
            crash = safe_repr(sole_leaf(exc))
            site.events.emit("object:error", self.namespace, self.object_id, error=crash,
                             _log=(logging.ERROR, "object %s crashed: %s", (self.label, crash)),
                             _exc_info=exc)
        finally:
            self.turns.drop(self._startup_ticket)  # (it never started: open_object failed)
            if start_error is not None:
                # Set before close() wakes the calls waiting for this start
                # (``Runtime._activate``), so that each of them hears its error. (Set
                # only by the starting task once it resumed, a waiter heard it or
                # started the object again by the scheduler's order.)
                self.error = start_error
            await self._ship_before_close()
            self.close()
        if start_error is not None:
            raise start_error

    # -- idle: dozing (dormant_after) and leaving memory (idle_timeout) ------------------
    async def _wait_until_idle(self) -> None:
        while True:
            with self._idle_scope:
                await self._idle_wake.wait()
            if (not self._idle_wake.is_set() and self._busy == 0
                    and trio.current_time() < self._first_due()):
                # The deadline of earlier work: work since then moved the idle clock on
                # and left the scope's deadline as it was (``working``).
                self._idle_scope = trio.CancelScope(deadline=self._deadline())
                continue
            if (self.phase is not Phase.LEAVING and not self.scope.cancel_called
                    and self._busy == 0
                    and trio.current_time() < self._idle_since + self.site.idle_timeout):
                # Idle for dormant_after, not yet for idle_timeout (or asked to doze).
                await self._doze()
                if self.phase is Phase.DOZING:
                    self._to(Phase.ACTIVE)
                self._idle_scope = trio.CancelScope(
                    deadline=math.inf if self._busy else self._deadline()
                )
                self._idle_wake = trio.Event()
                if self.leaving:  # (asked meanwhile)
                    self._idle_wake.set()
                continue
            # The deadline may have passed just as a call came in: stay while busy.
            if self._busy == 0 or self.scope.cancel_called:
                self._to(Phase.CLOSING)
                return
            # Asked to leave or doze as work came in: it stays, awake, and may be asked
            # again. (Left DOZING, it counted as asked already, ``doze_pending``: the
            # runtime asked no other object for a file until its dormant_after.)
            if self.phase is Phase.LEAVING or self.phase is Phase.DOZING:
                self._to(Phase.ACTIVE)
            self._idle_scope = trio.CancelScope()
            self._idle_wake = trio.Event()

    def _idle_deadline(self) -> float:
        """Work just ended: when to doze (close the database), or leave memory."""
        self._idle_since = trio.current_time()
        return self._deadline()

    def _deadline(self) -> float:
        """When to doze, if that is still ahead; else when to leave memory. Both count
        from the end of the last work."""
        due = self._first_due()
        return due if trio.current_time() < due else self._idle_since + self.site.idle_timeout

    def _first_due(self) -> float:
        """When the idle object is due to doze (dormancy on, its database open), else
        to leave memory, passed or not."""
        after, state = self.site.dormant_after, self.state
        if (after is not None and after < self.site.idle_timeout and state is not None
                and not state.dormant):
            return self._idle_since + after
        return self._idle_since + self.site.idle_timeout

    async def _doze(self) -> None:
        """Close the database of an object idle for ``dormant_after``; it stays resident
        (task, instance, in-memory state) and its next work opens it again. A resident
        object holds ~15 KiB instead of ~170 (benchmarks/timers.py). Not while it
        has tasks of its own in its nursery, or its connection was handed out or holds
        state of its own (``Storage.keeps_connection``). One object at a time,
        runtime-wide: each close checkpoints its WAL with an fsync (in a worker thread,
        ~1 ms here), and a burst of objects going idle together must not become a burst
        of fsyncs."""
        async with self.site.dormancy:
            state, ctx = self.state, self.ctx
            if (state is None or ctx is None or self._busy or self.phase is Phase.LEAVING
                    or self.scope.cancel_called or ctx.nursery.child_tasks
                    or ctx.storage.keeps_connection()):
                return
            try:
                if await state.sleep():
                    self.site.database_closed(self)
            except sqlite3.Error as exc:
                logger.warning("closing the database of idle %s failed: %s", self.label, exc)

    def doze_now(self) -> bool:
        """Ask an idle object to close its database now, staying resident (the runtime's
        open-file bound, with dormancy on). False where it may not doze (see
        ``_doze``): the caller evicts it instead. Does not checkpoint."""
        state, ctx = self.state, self.ctx
        if (state is None or ctx is None or not state.can_sleep or state.dormant or self._busy
                or self.phase is not Phase.ACTIVE or ctx.nursery.child_tasks
                or ctx.storage.keeps_connection()):
            return False
        self._to(Phase.DOZING)
        self._idle_wake.set()
        return True

    @property
    def doze_pending(self) -> bool:
        """Asked to doze (``doze_now``), not yet dozed."""
        return self.phase is Phase.DOZING

    @property
    def dormant(self) -> bool:
        """Whether the object's database is closed while it stays resident."""
        state = self.state
        return state is not None and state.dormant

    async def awaken(self) -> None:
        """Open a dormant object's database again (~0.35 ms). A file another process
        locked while it was closed is tried again with backoff (``LOCKED_RETRY``, as an
        activation's open is). Called by work of the object (``working``: it holds off
        dozing and eviction meanwhile). Checkpoints.

        Raises:
            StorageFaultError: it cannot be opened; the object stays dormant.
        """
        state = self.state
        attempt = 0
        # (The state is looked at again after each wait: a reset meanwhile closes it.)
        while state is not None and state is self.state and state.dormant:
            # (Run by the task of the call or alarm run that wakes it.)
            await self.site.open_slot(self, for_turn=in_chain())
            if state is not self.state or not state.dormant:
                continue  # (a reset closed it, or another task woke it meanwhile)
            try:
                await state.wake()
                break
            except StorageFaultError as exc:
                self.site.database_closed(self)
                delay = LOCKED_RETRY.delay(attempt) if exc.cause == "locked" else None
                if delay is None:
                    raise
            except BaseException:
                # Cancelled (waiting for a close still in its thread): still dormant,
                # it holds no file; counted as open it would stay so until it left.
                if state is self.state and state.dormant:
                    self.site.database_closed(self)
                raise
            await trio.sleep(delay)
            attempt += 1
        else:
            await trio.lowlevel.checkpoint()

    async def _ship_before_close(self) -> None:
        """Where commits ship (PostgreSQL), ship what is committed before the working
        copy goes: a graceful shutdown or eviction must not lose completed jobs (their
        commits could not ship while a running job held its group open). Shielded, at
        most ``LAST_SHIP_TIMEOUT``; a failure is logged (the next holder runs those jobs
        again, at least once)."""
        state = self.state
        if state is None or not state.ships or state.settled or (
                self.reset_cause is not None and self.reset_cause.fenced):
            return  # (nothing to ship; a fenced host writes nothing)
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + LAST_SHIP_TIMEOUT
            try:
                await state.sync()
            except Exception as exc:
                logger.warning("%s: its last commits could not ship before it left memory:"
                               " %s", self.label, exc)
        if scope.cancelled_caught:
            logger.warning("%s: its last commits did not ship within %.0f s", self.label,
                           LAST_SHIP_TIMEOUT)

    def close(self) -> None:
        """Release the object's state and leave the runtime. Idempotent."""
        if self.phase is Phase.CLOSED:
            return
        self._to(Phase.CLOSED)
        self.ready.set()
        if self.state is not None:
            self.state.close()
            self.state = None
            # Its parts let go of the connection now: the instance, its capabilities
            # and this host refer to one another, and only the cycle collector would
            # free them (a pooled working copy waits for that: ``CopyPool``).
            if self.transactions is not None:
                self.transactions.release(RELEASED)
            if self.ctx is not None:
                self.ctx.storage.release(RELEASED)
        # ...and of this host, its nursery and its state: the instance and its
        # capabilities refer to one another (a cycle), and what they hold (the context,
        # the claim, the alarm) kept the host, its scopes, its nursery, its task and the
        # engine's state for the cycle collector too, ~65 objects an activation, ~30
        # now (issue 26: the collector took ~20% of a create's CPU). A late use of
        # what they let go of raises ``StorageError`` (``_left``).
        if self._given is not None:
            self._given.release()
        if self.ctx is not None:
            self.ctx.release()
        if self.alarm is not None:
            self.alarm.release()
        self.site.host_closed(self)
        if self._destroy:
            self.site.engine.destroy_object(self.namespace, self.object_id)
            self.site.events.emit("object:destroyed", self.namespace, self.object_id)
        self.instance = None
        self.closed.set()

    # -- work accounting ----------------------------------------------------------
    def working(self, *, alarm: bool = False) -> Work:
        """Run a block as work of this object: it holds off eviction, and a reset of
        the object cancels it (``scope.cancelled_caught`` tells). ``alarm=True`` marks
        alarm work (an alarm run, tracked work): what the memory watchdog resets."""
        return Work(self, alarm)

    def _work_began(self, scope: trio.CancelScope, alarm: bool) -> None:
        self._busy += 1
        self._alarm_work += alarm
        # The idle deadline stays as it is: passing meanwhile, it finds the object busy
        # (``_wait_until_idle``), and the end of the work moves it only where it must
        # come sooner. Each move is a Trio heap operation, ~4 us; a call made two.
        self._work_scopes.add(scope)

    def _work_ended(self, scope: trio.CancelScope, alarm: bool) -> None:
        self._work_scopes.discard(scope)
        self._busy -= 1
        self._alarm_work -= alarm
        if self._alarm_work == 0:
            self.memory_mark = None
        if self._busy == 0:
            if self._destroy:
                self._leave()
            else:
                due = self._idle_deadline()
                if due < self._idle_scope.deadline:
                    self._idle_scope.deadline = due
                self.site.host_idle(self)

    def evict(self) -> None:
        """Ask an idle object to leave memory."""
        self._leave()

    def destroy(self) -> None:
        """Delete the object's data as soon as its current work ends; its next
        activation starts empty."""
        self._destroy = True
        if self._busy == 0:
            self._leave()

    def _leave(self) -> None:
        if self.phase is Phase.ACTIVE or self.phase is Phase.DOZING:  # (once: LEAVING stays)
            self._to(Phase.LEAVING)
            self._idle_wake.set()

    def _to(self, phase: Phase) -> None:
        """The one place the host's phase changes."""
        assert phase in _MOVES[self.phase], (self.label, self.phase, phase)
        out = phase in DEPARTING
        if out is not (self.phase in DEPARTING):
            self.site.departing(self, out)
        self.phase = phase

    @property
    def leaving(self) -> bool:
        """Whether it was asked to leave memory once idle."""
        return self.phase is Phase.LEAVING

    @property
    def serving(self) -> bool:
        """Whether it serves calls and alarms (active, dozing or leaving once idle)."""
        return self.phase in SERVING

    @property
    def evictable(self) -> bool:
        """Whether the runtime may ask it to leave or doze for room: serving and not
        asked yet, idle, and taken by the task that activated it (``handed_over``)."""
        return (self._busy == 0 and self.handed_over
                and (self.phase is Phase.ACTIVE or self.phase is Phase.DOZING))

    @property
    def running_alarm_work(self) -> bool:
        return self._alarm_work > 0

    @property
    def busy(self) -> bool:
        return self._busy > 0

    def reset(self, reason: str, *, memory: bool = False, fenced: bool = False) -> None:
        """Cancel everything the object is doing and drop it from memory."""
        if self.reset_cause is not None:
            return
        self.reset_cause = Reset(reason=reason, memory=memory, fenced=fenced)
        for scope in list(self._work_scopes):
            scope.cancel(reason=reason)
        self.scope.cancel(reason=reason)
        if self.phase not in (Phase.CLOSING, Phase.CLOSED):
            self._to(Phase.CLOSING)

    # -- calls ------------------------------------------------------------------------
    def _method(self, name: object) -> Any:
        if not isinstance(name, str):
            raise RpcError(f"method name must be a str, got {type(name).__name__}")
        label = f"{self.label}.{name}"
        if name.startswith("_"):
            raise RpcError(f"{label}: names starting with '_' cannot be called through a stub")
        if name in self.cls._rpc_hidden:
            raise RpcError(f"{label}: {name}() is a runtime hook, not callable through a stub")
        # Looked up on the class, unbound: a property's getter (any descriptor's) is the
        # object's code, which runs in a turn, never here to find out what the name is.
        found = inspect.getattr_static(self.cls, name, None)
        if not (inspect.isfunction(found) or isinstance(found, classmethod)):
            raise RpcError(f"{label} is not a method of {self.cls.__qualname__}")
        return found.__get__(self.instance, self.cls)

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                   ticket: Ticket | None = None) -> Any:
        """Run method ``name`` in the object, in the turn ``ticket`` stands for if given
        (the place in line the call took while the object started; taken or dropped
        here). Checkpoints.

        Raises:
            ObjectMoved: the object may have moved to another host before the method
                ran (nothing of it ran here); the stub routes the call again.
        """
        try:
            return await self._call(name, args, kwargs, ticket)
        finally:
            if ticket is not None:
                self.turns.drop(ticket)

    async def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                    ticket: Ticket | None) -> Any:
        fn = self._method(name)
        if self.state is not None and self.state.ships:
            try:
                self.state.admit()
            except ObjectFencedError as exc:
                await trio.lowlevel.checkpoint()
                raise ObjectMoved(str(exc)) from exc
        kind = method_turn(fn)
        run = partial(_run, fn, args, kwargs)
        if kind == "write":
            return await self.run_write(f"call {name}()", run, ticket=ticket)
        turns = self.turns
        with self.working() as scope:
            if self.dormant:
                await self.awaken()
            if kind == "read":
                block = turns.turn("read", f"call {name}()", ticket=ticket)
                async with block:
                    if self._startup:
                        # Its turn is a writing one (admitted so at the call's place in
                        # line, ``runs_startup``, or re-entered): the startup runs first.
                        await self._gated(self.call_startup)
                    if block.runs_startup:
                        block.end_startup()
                    # Gated too: a write call that raised or was cancelled, or a task's
                    # ctx.turn(), may have left commits unshipped that this call reads.
                    result = await self._gated(run)
            else:  # @nj.interleave: no turn (it enters ctx.turn() to write)
                if self._startup:
                    async with turns.turn("write", "startup"):
                        await self._gated(self.call_startup)
                # Each of its ctx.turn() blocks ships before it ends (the gate here
                # would come after a later turn could have opened a group).
                token = interleave_gate.set(self._gate_failed)
                try:
                    result = await self._gated(run)
                finally:
                    interleave_gate.reset(token)
        if scope.cancelled_caught:
            raise ObjectResetError(f"{self.label} was reset during {name}()")
        return result

    async def run_write(self, holder: str, fn: Callable[[], Awaitable[Any]], *,
                        ticket: Ticket | None = None) -> Any:
        """``await fn()`` as a write call of the object runs: resident and awake from
        here to its end, in one write turn with startup. Writes outside the alarm run's
        group commit as they are made; where commits ship (PostgreSQL, the shared
        layout) they ship before the turn ends, also when ``fn`` raised (``_gated``). So
        what the caller is told has happened is durable (the output gate), and nothing
        else has run in the object since. (A call that re-entered a job's turn commits
        with the job.) Checkpoints.

        Raises:
            ObjectResetError: the object was reset meanwhile.
        """
        with self.working() as scope:
            if self.dormant:
                await self.awaken()
            async with self.turns.turn("write", holder, ticket=ticket):
                # (``_gated``, inlined: this is every write call's path.)
                try:
                    if self._startup:
                        await self.call_startup()
                    result = await fn()
                except Exception:
                    await self._gate_failed()
                    raise
                await self.sync()
        if scope.cancelled_caught:
            raise ObjectResetError(f"{self.label} was reset during {holder}")
        return result

    async def _gated(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """``await fn()``, then the output gate: what the object has committed is
        durable before the caller hears of the call — also when ``fn`` raised, since a
        call is not rolled back (its writes commit as they are made): no caller may hear
        of a write, or read one, that a crash or a fence could still take back. (A
        cancelled call's commits ship with the next call's gate, or the ship loop.)
        Called holding the call's turn where it has one: an alarm run could otherwise
        open its group in between, and what is committed would wait for that group.
        Checkpoints.

        Raises:
            ObjectFencedError, StorageError: the commits could not ship (after ``fn``
                raised: chained to its error).
        """
        try:
            result = await fn()
        except Exception:
            await self._gate_failed()
            raise
        await self.sync()
        return result

    async def _gate_failed(self) -> None:
        """The output gate of a call that raised (``_gated``), and of an interleave
        call's ``ctx.turn()``: a reset object ships nothing. Checkpoints where
        something is to ship."""
        if self.reset_cause is None:  # (a reset or fenced object ships nothing)
            await self.sync()

    def on_startup(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``hook`` before the first call of this activation (and before its alarm
        work, by the owner's choice)."""
        if self._startup is None:
            self._startup = []
        self._startup.append(hook)
        self.turns.startup_pending = True

    async def call_startup(self) -> None:
        """Run the startup hooks (once per activation, until they succeed)."""
        if self._startup:
            for hook in self._startup:
                await hook()
            self._startup = None
            self.turns.startup_pending = False
        else:
            await trio.lowlevel.checkpoint()

    async def sync(self) -> None:
        """Make the object's commits durable on an engine that ships them. Checkpoints
        only where something is to ship: its callers checkpoint (a call's turn, the
        push that wrote), and a call's output gate after a push that shipped already
        saves a pass of the scheduler (issue 26: ~13 a create).

        Raises:
            ObjectFencedError: another host took the object over; it is dropped here.
        """
        state = self.state
        if state is not None and state.ships and not state.settled:
            try:
                await state.sync()
            except ObjectFencedError as exc:
                self.fence(exc.reason)
                raise

    def fence(self, reason: str | None = None) -> None:
        """Another host holds the object now (or ``reason``: why this host may no longer
        run it): stop everything here, write nothing."""
        if self.reset_cause is None:
            said = reason or "taken over by another host"
            self.site.events.emit(
                "object:fenced", self.namespace, self.object_id, reason=said,
                _log=(logging.WARNING, "%s: %s; dropping it here", (self.label, said)))
        self.reset(f"fenced: {reason or 'another host took the object over'}", fenced=True)

    # -- the alarm ----------------------------------------------------------------
    def _claim(self, owner: str, handler: AlarmHandler, policy: Backoff) -> HostClaim:
        assert self.alarm is not None
        if self.alarm.owner is not None:
            raise AlarmOwnedError(
                f"the alarm of {self.label} is already claimed by the {self.alarm.owner}",
                namespace=self.namespace, object_id=self.object_id, owner=self.alarm.owner)
        self.alarm.owner = owner
        self.alarm.handler = handler
        self.alarm.policy = policy
        self._given = HostClaim(self)
        return self._given

    async def run_alarm(self, ticket: Ticket | None = None) -> None:
        """Run the alarm handler as a task of the object's own nursery and wait for it:
        a shutdown then cancels it before the object's database closes, so its cleanup
        still has the database. ``ticket``: the place in line the delivery took while
        the object started (taken or dropped here)."""
        try:
            await self._run_alarm(ticket)
        finally:
            if ticket is not None:
                self.turns.drop(ticket)

    async def _run_alarm(self, ticket: Ticket | None) -> None:
        assert self.ctx is not None
        done = trio.Event()
        # Busy from delivery on: were the idle deadline to pass before the task starts,
        # the object would be evicted (its nursery cancelled) and the alarm would begin
        # its work in a closing object, then be cut off at the first checkpoint. (Busy,
        # a deadline that passes is waited out: ``_wait_until_idle``.)
        self._busy += 1
        try:
            self.ctx.nursery.start_soon(self._alarm_task, done, ticket)
        except RuntimeError:
            # Its nursery is closed to new arrivals: the object is going away (a task of
            # it raised, a Ctrl-C among them) between the delivery and here. The alarm
            # stays in the index for its next activation.
            self._busy -= 1
            await trio.lowlevel.checkpoint()
            return
        except BaseException:
            self._busy -= 1
            raise
        await done.wait()

    async def _alarm_task(self, done: trio.Event, ticket: Ticket | None) -> None:
        self._busy -= 1  # handed over: working() below holds the object from here
        try:
            assert self.alarm is not None and self.instance is not None
            alarm = self.alarm
            retry = alarm.retry
            if alarm.time is not None:
                self.site.metrics.alarm_delivered(self.namespace, _clock.now() - alarm.time)
            handler = alarm.handler or self.instance.alarm
            version = alarm.version
            failure: Exception | None = None
            self.flight = self.site.engine.acquire_flight(self.namespace, self.object_id)
            scope: trio.CancelScope | None = None
            try:
                with self.working(alarm=True) as scope:
                    try:
                        if self.dormant:
                            await self.awaken()
                        async with self.turns.turn("write", "alarm run", ticket=ticket):
                            await handler(AlarmInfo(retry_count=retry, is_retry=retry > 0))
                    except Exception as exc:
                        failure = exc
                        if not scope.cancel_called:
                            # Re-timed now, not after the ship below (it checkpoints
                            # where commits ship): a call that has the object meanwhile
                            # (its startup re-arms the alarm) keeps what it set, as on
                            # the file engine, and the retry ships with this run.
                            alarm.failed(failure, retry)
                    try:
                        await self.sync()
                    except ObjectFencedError:
                        # Another host holds the object now; self.sync() fenced it (one
                        # incident, object:fenced): nothing of this run is to be recorded.
                        return
                    except StorageError as exc:
                        # PostgreSQL out of reach: the run's commits stay in the working
                        # copy and ship with the next sync (the engine's ship loop
                        # retries); the object goes on. (Raised, it crashed the object
                        # and its working copy was thrown away.)
                        logger.warning("%s: shipping the alarm run's writes failed; they"
                                       " ship later: %s", self.label, exc)
            finally:
                if self.flight is not None:
                    self.site.engine.release_flight(self.flight)
                    self.flight = None
                cause = self.reset_cause
                if (scope is not None and scope.cancel_called and cause is not None
                        and cause.memory and alarm.handler is None):
                    # A plain object has no breaker: a reset is a failed alarm run. Done
                    # here, on the way out: the reset cancels the object's own scope too,
                    # so the Cancelled goes on past this scope rather than stop at it.
                    alarm.failed(ObjectResetError(cause.reason), retry)
            assert scope is not None
            if scope.cancelled_caught:
                return  # reset: a Lifecycle's breaker decided what happens to its alarm
            if failure is None and alarm.version == version:
                alarm.write(None, 0)
        finally:
            done.set()


async def _run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a method, sync or async. Checkpoints."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    await trio.lowlevel.checkpoint()
    return result


def _turn_slow(events: EventBus, namespace: str, object_id: str, seconds: float,
               holder: str) -> None:
    events.emit(
        "object:turn_slow", namespace, object_id, seconds=seconds, holder=holder,
        _log=(logging.WARNING, "%s/%s: a turn (%s) has held the object for %.1f s; other"
              " calls and its alarm wait for it", (namespace, object_id, holder, seconds)))


class Work:
    """A block of an object's work (``ObjectHost.working``): its cancel scope, entered
    for the block. A class, not a ``@contextmanager``: every call passes through it
    (the generator's cost, ~1 µs a call, measured)."""

    __slots__ = ("_alarm", "_host", "scope")

    def __init__(self, host: ObjectHost, alarm: bool) -> None:
        self._host = host
        self._alarm = alarm
        self.scope = trio.CancelScope()

    def __enter__(self) -> trio.CancelScope:
        scope = self.scope
        self._host._work_began(scope, self._alarm)
        try:
            scope.__enter__()
        except BaseException:
            self._host._work_ended(scope, self._alarm)
            raise
        return scope

    def __exit__(self, *exc_info: Any) -> bool:
        try:
            return self.scope.__exit__(*exc_info)
        finally:
            self._host._work_ended(self.scope, self._alarm)
