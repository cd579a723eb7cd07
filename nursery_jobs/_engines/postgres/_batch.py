"""Group commit across a host's objects (issue 26): ships that arrive while a ship's
round trip is out wait, and go together in the next one — one statement, one
transaction, each object's fence checked in it (``_ops.ship_many``).

A lone ship goes at once, in its caller's task, exactly as before (one round trip of
``_ops.ship``). Ships that find one out queue; when it answers, the queue goes as one
batch from a Trio system task (no caller owns it: a caller cancelled meanwhile stops
waiting for its own outcome only), and so on until the queue is empty. At most one
round trip of the batcher is out at a time: under load a round trip carries every ship
that arrived during the one before (100 callers: ~100 ships a round trip, not 100 round
trips), and a lone caller waits for nobody.

Each caller is woken with its own outcome: SHIPPED, or FENCED / STALE for its object
alone (the fence of one object in a batch never refuses the others'), or the error of
the whole round trip (connection lost: every ship of the batch raises it, unknown
whether it committed, as one lone ship's would). An object appears at most once in a
batch (its ships are one at a time anyway: ``PgObject.sync``'s lock and ``Shipper``'s
``_ships_out``); a second change of an object already in the batch waits for the next.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import attrs
import trio

from nursery_jobs._engines.postgres._copy import Change
from nursery_jobs._errors import StorageError

# Ships in one round trip at most (the rest go in the next): bounds the statement's
# parameters and the time one batch holds its objects' row locks.
MAX_BATCH: Final = 512

Done = Callable[[], object]
# (changes, done) -> one outcome per change, in order; ``done`` is called (in the Trio
# thread) once the statement's worker thread has ended, answered or not.
SendBatch = Callable[[list[Change], Done], Awaitable[list[str]]]


@attrs.frozen(kw_only=True)
class ShipStatistics:
    """What a host's ships cost in round trips (``PostgresEngine.ship_statistics``)."""

    ships: int  # ships sent (each a change of one object)
    round_trips: int  # transactions that carried them
    largest_batch: int  # most ships in one round trip


class _Pending:
    __slots__ = ("abandoned", "batch", "change", "error", "finished", "outcome", "scope",
                 "task")

    def __init__(self, change: Change, finished: trio.Event) -> None:
        self.change = change
        self.finished = finished  # set once no statement carrying it is out
        # The caller, parked until its outcome (or error) is known and it is rescheduled
        # (no trio.Event per caller: its wait and set were ~5% of the Trio thread's CPU
        # per push with 100 callers, measured).
        self.task = trio.lowlevel.current_task()
        self.outcome: str | None = None
        self.error: BaseException | None = None
        # Its caller left (cancelled) or was woken: nobody to wake. (A caller that left
        # may stay queued until its ``_abandon``: ``_take`` passes it over.)
        self.abandoned = False
        self.batch: list[_Pending] | None = None
        self.scope: trio.CancelScope | None = None

    def abort(self, _: object) -> trio.lowlevel.Abort:
        """Its caller is cancelled while it waits (a method, not a closure: one object
        fewer held by every ship in flight, for the collector to walk)."""
        self.abandoned = True  # not to be woken: it is leaving
        return trio.lowlevel.Abort.SUCCEEDED

    def wake(self) -> None:
        if not self.abandoned:
            self.abandoned = True  # (woken once)
            trio.lowlevel.reschedule(self.task)


class ShipBatcher:
    """A host's ships, grouped into round trips (see the module docstring)."""

    def __init__(self, send: SendBatch, max_batch: int = MAX_BATCH) -> None:
        self._send = send
        self._max_batch = max_batch
        self._queue: list[_Pending] = []
        self._busy = False  # a round trip of this batcher is out
        self._ships = 0
        self._round_trips = 0
        self._largest = 0

    def statistics(self) -> ShipStatistics:
        return ShipStatistics(ships=self._ships, round_trips=self._round_trips,
                              largest_batch=self._largest)

    @property
    def queued(self) -> int:
        """Ships waiting for the round trip out to answer."""
        return len(self._queue)

    async def ship(self, change: Change, finished: trio.Event) -> str:
        """Ship ``change`` alone or with others; its outcome (SHIPPED, FENCED, STALE).
        ``finished`` is set once no statement carrying it is out (at once where it was
        never sent). Checkpoints.

        Raises:
            Exception: the round trip that carried it failed (whether it committed is
                unknown): the error of the send function, for every ship it carried.
        """
        if not self._busy and not self._queue:
            return await self._ship_alone(change, finished)
        pending = _Pending(change, finished)
        self._queue.append(pending)
        try:
            await trio.lowlevel.wait_task_rescheduled(pending.abort)
        except BaseException:
            self._abandon(pending)
            raise
        if pending.error is not None:
            raise pending.error
        assert pending.outcome is not None
        return pending.outcome

    async def _ship_alone(self, change: Change, finished: trio.Event) -> str:
        # In the caller's task, as before batching: a cancelled caller cancels its own
        # statement on the server (``Statements.run``).
        self._busy = True
        self._count(1)
        try:
            (outcome,) = await self._send([change], finished.set)
            return outcome
        finally:
            self._busy = False
            if self._queue:
                self._start()

    def _abandon(self, pending: _Pending) -> None:
        """Its caller stops waiting (cancelled)."""
        if pending.batch is None:  # still queued: it will not ship
            if pending in self._queue:  # (not where the run ended meanwhile)
                self._queue.remove(pending)
            pending.finished.set()
        elif pending.scope is not None and all(p.abandoned for p in pending.batch):
            # Nobody waits for this round trip any more: cancel its statement on the
            # server, as a lone cancelled caller's is.
            pending.scope.cancel()

    def _count(self, size: int) -> None:
        self._ships += size
        self._round_trips += 1
        self._largest = max(self._largest, size)

    def _take(self) -> list[_Pending]:
        """The next batch: the queue in order, each object once, at most ``max_batch``."""
        batch: list[_Pending] = []
        rest: list[_Pending] = []
        keys: set[tuple[str, str]] = set()
        for pending in self._queue:
            key = (pending.change.namespace, pending.change.object_id)
            if pending.abandoned:  # (left, not yet out of the queue: ``_abandon`` takes it)
                rest.append(pending)
            elif key in keys or len(batch) >= self._max_batch:
                rest.append(pending)
            else:
                keys.add(key)
                batch.append(pending)
        self._queue = rest
        scope = trio.CancelScope()  # (entered by ``_run_one``; cancelled by ``_abandon``)
        for pending in batch:
            pending.batch, pending.scope = batch, scope
        return batch

    def _start(self) -> None:
        self._busy = True
        trio.lowlevel.spawn_system_task(self._run, self._take(),
                                        name="nursery_jobs-pg-ship-batch")

    async def _run(self, batch: list[_Pending]) -> None:
        try:
            while batch:
                await self._run_one(batch)
                batch = self._take()
        finally:
            self._busy = False
            if self._queue:  # (left by a run cut short: the Trio run is ending)
                for pending in self._queue:
                    pending.error = StorageError("the Trio run ended before it shipped")
                    pending.finished.set()
                    pending.wake()
                self._queue = []

    async def _run_one(self, batch: list[_Pending]) -> None:
        scope = batch[0].scope
        assert scope is not None

        def done() -> None:
            for pending in batch:
                pending.finished.set()

        self._count(len(batch))
        outcomes: list[str] | None = None
        error: BaseException | None = None
        with scope:
            try:
                outcomes = await self._send([p.change for p in batch], done)
            except Exception as exc:
                error = exc
        if outcomes is None and error is None:  # cancelled: every caller had left
            error = StorageError("every caller of the round trip was cancelled")
        for i, pending in enumerate(batch):
            if outcomes is not None:
                pending.outcome = outcomes[i]
            else:
                pending.error = error
            pending.wake()
            # Answered: nothing cancels this round trip now. Each ship referred to its
            # batch, which referred to it: a cycle per ship, with its change and events,
            # that only the collector freed (~20% of the Trio thread's CPU with 100
            # callers, measured: 34 us a push, ~6 objects a push collected).
            pending.batch = pending.scope = None
