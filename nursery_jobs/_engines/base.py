"""The engine seam: where objects' state and the alarm index live.

A runtime reaches its data only through an ``Engine``; an object's host reaches its
object's state only through the ``ObjectState`` the engine opened for it. Engines:

- files (``files._engine.FilesEngine``): a data directory — ``catalog.sqlite3`` (objects
  registry, alarm index, crash tokens), one SQLite file per object, the flight record;
- shared (``shared._engine.SharedEngine``, ``shared:<directory>``): every object as rows
  of one SQLite database, loaded into a working copy on activation, shipped per commit;
- memory (``memory.MemoryEngine``, ``path=None``): the files engine's shape, in memory;
- PostgreSQL (``postgres._engine.PostgresEngine``, section 9 of the design): working
  copies in memory, shipped per commit, leases fenced by an epoch.

Every object's working database is a ``sqlite3.Connection`` with the schema of
``_schema``: the Lifecycle, Queue, Scheduler and Agent run unchanged on any engine.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nursery_jobs._events import EventBus


class FlightSlot(Protocol):
    """Where one alarm run notes the work it is doing, so that a process death is
    attributed to that work (crash strikes). Writing must survive SIGKILL and cost
    microseconds."""

    def record(self, token: str, started: float) -> None:
        """Note the work about to start.

        Raises:
            ObjectFencedError: (engines with leases) the object's lease is not known to
                hold any more: the work must not start; the object is fenced.
        """

    def clear(self) -> None: ...


def _released() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.close()
    return conn


# What an object's parts hold in place of its connection once it left memory (a closed
# connection: a late use raises ``sqlite3.ProgrammingError``, as a closed file's does).
# They let go of the real one at once, so that the shared layout can hand its working
# copy to the next object without waiting for the cycle collector (``CopyPool``).
RELEASED: sqlite3.Connection = _released()


class ObjectState(Protocol):
    """One active object's state, as its engine opened it."""

    @property
    def ships(self) -> bool:
        """Whether commits become durable only with ``sync`` (an engine that ships
        them elsewhere); False where every commit is durable when it returns."""

    @property
    def settled(self) -> bool:
        """Whether ``sync`` would find nothing to do: nothing committed waits to ship
        and no ship is in flight (True where commits do not ship). Does not
        checkpoint."""

    @property
    def conn(self) -> sqlite3.Connection:
        """The object's working database (autocommit; ``_schema`` applied)."""

    @property
    def alarm(self) -> tuple[float, int] | None:
        """(time, retry count) of the object's alarm when it was opened."""

    def write_alarm(self, time: float | None, retry: int) -> None:
        """Set (or with None, delete) the object's alarm in the alarm index. Durable
        when it returns (files) or with the next ``sync`` (engines that ship)."""

    def crash_tokens(self) -> list[tuple[str, float]]:
        """(token, started) of the work this object was doing when a process died."""

    def clear_crash_tokens(self) -> None:
        """The object has accounted for its crash tokens: forget them."""

    def admit(self) -> None:
        """Before a call runs: raise ``ObjectFencedError`` if this host may have lost
        the object (a lease not known to hold; the object is then dropped here). A
        no-op where nothing else can take it. Does not checkpoint."""

    async def sync(self) -> None:
        """Make every commit so far durable (the output gate). Checkpoints.

        Raises:
            ObjectFencedError: another host took the object over; nothing was written.
        """

    @property
    def dormant(self) -> bool:
        """Whether the database is closed while the object stays resident."""

    @property
    def can_sleep(self) -> bool:
        """Whether ``sleep`` can ever close it (a file of a data directory can)."""

    @property
    def closing(self) -> bool:
        """Whether a ``sleep``'s close is still running (in a worker thread): the file
        must not be touched meanwhile."""

    async def sleep(self) -> bool:
        """Close the database of an idle object that stays resident; False (nothing
        closed) where it cannot be (in memory, a working copy, a transaction open).
        Checkpoints."""

    async def wake(self) -> None:
        """Open a dormant object's database again, in place (the same ``conn``); a
        no-op when it is open. Checkpoints.

        Raises:
            StorageFaultError: it cannot be opened; it stays dormant.
        """

    def close(self) -> None:
        """Roll back any open transaction and release the database."""


class Engine(Protocol):
    """Where a runtime keeps objects, their databases, alarms and crash tokens."""

    @property
    def label(self) -> str:
        """What to call this engine's data in messages: a path or an address."""

    @property
    def holds_files(self) -> bool:
        """Whether an open object holds file descriptors (its database file and WAL):
        the runtime then keeps open databases within the open-file limit."""

    @property
    def default_max_active(self) -> int | None:
        """How many idle objects stay resident under ``open_runtime(max_active=None)``
        (None: what the open-file limit allows, ``default_max_active()``)."""

    def open(self, now: float) -> None:
        """Take the data (the directory lock), recover what a dead process left (its
        flight record becomes crash tokens, and their objects wake at ``now``)."""

    def close(self) -> None:
        """Release everything; idempotent."""

    async def serve(self, site: EngineSite) -> None:
        """The engine's background work (checkpoints, leases, forwarded calls); runs
        until cancelled."""

    # -- objects --------------------------------------------------------------------
    async def open_object(self, namespace: str, object_id: str, class_path: str, *,
                          create: bool = True) -> ObjectState:
        """Register the object (once) and open its working database. Checkpoints.

        ``create=False`` (the operator faces): open it only if it is stored, else
        raise ``UnknownObjectError`` (``UnknownObjectError.absent``) having stored
        nothing — no registry row, no database, no namespace record.
        """

    def destroy_object(self, namespace: str, object_id: str) -> None:
        """Delete the object's database, registry row, alarm and crash tokens."""

    def class_path(self, namespace: str) -> str | None:
        """The ``module:QualName`` recorded for a namespace, if any."""

    # -- the alarm index (the timer's side) -----------------------------------------------
    def due(self, now: float, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` (namespace, object_id) whose alarm is due at ``now``,
        earliest first."""

    def next_alarm_after(self, now: float) -> float | None:
        """The earliest alarm later than ``now``, or None."""

    def get_alarm(self, namespace: str, object_id: str) -> tuple[float, int] | None:
        """(time, retry count) of an object's alarm, or None."""

    def set_alarm(self, namespace: str, object_id: str, time: float, retry: int) -> None:
        """Set the alarm of an object that is not active (it could not be activated)."""

    def alarm_count(self) -> int: ...

    # -- the flight record --------------------------------------------------------------
    def acquire_flight(self, namespace: str, object_id: str) -> FlightSlot | None:
        """A slot for one alarm run of the object, or None if all are taken."""

    def release_flight(self, slot: FlightSlot) -> None: ...


class EngineSite(Protocol):
    """What an engine may ask of the runtime that opened it."""

    events: EventBus  # nj-faults hook: where an engine reports storage faults

    def earliest_alarm(self) -> float:
        """The time the timer sleeps until (``inf`` when no alarm is pending)."""

    def wake_timer(self) -> None:
        """Look at the alarm index again now (another host changed it)."""

    async def run_call(
        self, namespace: str, object_id: str, name: str, args: tuple[Any, ...],
        kwargs: dict[str, Any], chain: tuple[str, ...] = (), trace: str | None = None,
    ) -> Any:
        """Run a call forwarded from another host on the object here, as a local stub
        call would (activating it if needed); its exception propagates. ``chain`` is the
        caller's call chain (the turns it holds, by id): a call back into one of them
        re-enters it. ``trace`` is the caller's span context (W3C trace context as JSON),
        the parent of the call's span here when tracing is on."""

    def fenced(self, namespace: str, object_id: str, reason: str | None = None) -> None:
        """Another host took the object over (or ``reason``, in words: why this host
        may no longer run it): cancel its scope and drop it, now."""

    def serves(self, namespace: str, class_path: str | None) -> bool:
        """Whether this runtime can resolve ``namespace`` to a class (its registry, or
        ``class_path`` imported): an engine shared by hosts claims alarms of those
        namespaces only."""
