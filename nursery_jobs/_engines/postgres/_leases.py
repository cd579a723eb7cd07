"""This host's leases under the PostgreSQL engine: which objects it holds (``owner``,
``epoch``, ``lease_until`` on their ``nj_objects`` rows), until when each is known to
hold, their renewal, and their release.

A lease is trusted for ``LEASE_TRUST`` of ``lease_ttl`` after the statement that took or
renewed it was sent, on a clock that runs on while this process is stopped
(``lease_clock``); a job or call starts on a copy only while its lease is trusted
(``Leases.admit``). Releases, and alarm writes of objects this host does not run, go in
the background (``Leases.release_loop``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import psycopg
import trio
import trio.testing

from nursery_jobs._engines.base import EngineSite
from nursery_jobs._engines.postgres import _ops as ops
from nursery_jobs._errors import ObjectFencedError

if TYPE_CHECKING:
    from nursery_jobs._engines.postgres._alarms import AlarmIndex
    from nursery_jobs._engines.postgres._calls import CallRouter
    from nursery_jobs._engines.postgres._copy import PgObject
    from nursery_jobs._engines.postgres._statements import Db

logger = logging.getLogger("nursery_jobs")

Key = tuple[str, str]

# A lease is trusted for this share of lease_ttl after the statement that took or
# renewed it was sent (the rest absorbs clock-rate differences with the server).
LEASE_TRUST: Final = 0.9
_BOOTTIME: Final = getattr(time, "CLOCK_BOOTTIME", None)
# Every this many renewals (about a minute at the default lease_ttl) the host deletes
# dead hosts' rows and abandoned call rows older than CALL_MAX_AGE seconds (_ops.sweep).
SWEEP_EVERY: Final = 20
CALL_MAX_AGE: Final = 600.0


def lease_clock() -> float:
    """Seconds on a clock that keeps running while this process is stopped or the
    machine sleeps (CLOCK_BOOTTIME where there is one): the server's clock, which ends
    leases, runs on meanwhile. Not Trio's clock: a MockClock's virtual time is not the
    server's."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


async def lease_sleep(seconds: float, stopping: threading.Event) -> None:
    """Sleep ``seconds`` of real time: leases end on the server's clock. (Under a
    MockClock, Trio's virtual time may stand still while real time runs — a busy
    test — and a lease renewed on it would lapse; a thread waits instead, until
    ``stopping`` is set at the latest.)"""
    if not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
        await trio.sleep(seconds)
        return
    await trio.to_thread.run_sync(stopping.wait, seconds, abandon_on_cancel=True)


class Leases:
    """The leases this host holds (``held``: key -> epoch) and until when each is
    trusted (``trusted``: key -> lease_clock time); their renewal, and the queue of
    releases and alarm writes the background sends.

    ``held`` and ``trusted`` are never replaced (``close`` empties them): the ship path
    keeps ``held`` at hand. ``site`` is the runtime's once the engine serves."""

    def __init__(self, host_id: str, lease_ttl: float, label: str, db: Db,
                 alarms: AlarmIndex, active: dict[Key, PgObject],
                 stopping: threading.Event) -> None:
        self._host_id = host_id
        self._lease_ttl = lease_ttl
        self._label = label
        self._db = db
        self._alarms = alarms
        self._active = active
        self._stopping = stopping
        self.site: EngineSite | None = None
        self.held: dict[Key, int] = {}  # leases this host holds: key -> epoch
        # Until when (lease_clock) each held lease is known to hold: the send time of the
        # last statement that took, renewed or shipped under it, plus LEASE_TRUST * ttl.
        self.trusted: dict[Key, float] = {}
        self._releases: list[tuple[str, str, int]] = []
        self._alarm_writes: list[tuple[str, str, float, int]] = []
        self._release_event = trio.Event()

    def holds(self, namespace: str, object_id: str) -> bool:
        return (namespace, object_id) in self.held

    def drop(self, key: Key) -> None:
        self.held.pop(key, None)
        self.trusted.pop(key, None)
        self._alarms.discard(key)

    def clear(self) -> None:
        self.held.clear()
        self.trusted.clear()

    def hold(self, key: Key, epoch: int, sent: float) -> bool:
        """A statement sent at ``sent`` took the lease on ``key`` at ``epoch`` (a take
        or a claim): hold and trust it, unless a newer one of this host's is held
        already — the answers of its takes and claims come back in any order, and an
        older one set back would make the live copy look lapsed (``admit``)."""
        if epoch <= self.held.get(key, -1):
            return False
        self.held[key] = epoch
        self.trust(key, sent)
        return True

    def trust(self, key: Key, sent: float) -> None:
        """A statement sent at ``sent`` took or extended the lease on ``key``: the
        server's ``lease_until`` is at least ``ttl`` past that."""
        until = sent + self._lease_ttl * LEASE_TRUST
        if until > self.trusted.get(key, -math.inf):
            self.trusted[key] = until

    def admit(self, key: Key, epoch: int) -> None:
        """Before a job or a call of ``key`` starts on its copy opened under lease
        ``epoch``: is that lease known to hold? A host that was paused (SIGSTOP, a
        stalled loop, a partition) past its lease may find, when it runs again, jobs due
        on objects another host has taken since; the fence refuses their writes, but the
        jobs must not even start (their external effects would run twice). So the object
        is dropped here as fenced, before its renewal could tell; if the lease did hold,
        the object is simply activated again. The lease must be the copy's own: this
        host's claim may have taken the object again meanwhile (a newer epoch, trusted)
        while the copy of the lapsed one is still open."""
        if self.held.get(key) == epoch and lease_clock() < self.trusted.get(key, -math.inf):
            return
        held = self.held.get(key)
        if held is not None and held != epoch:
            reason = (f"this host's lease on it (epoch {epoch}) lapsed and the object was"
                      f" taken again since (epoch {held}); its copy of the lapsed lease is"
                      " dropped")
        else:
            # Not "taken over": a lone host whose renewals PostgreSQL did not answer in
            # time (a foreign lock, an outage) lands here too (issue 22 #4).
            reason = (f"this host's lease on it was not renewed within lease_ttl"
                      f" ({self._lease_ttl} s: PostgreSQL slow or out of reach, or this"
                      " host paused); another host may take it over")
        if self.site is not None and key in self._active:
            self.site.fenced(*key, reason=reason)
        raise ObjectFencedError(
            f"{key[0]}/{key[1]}: {reason}; so no job or call of it starts on that copy",
            reason=reason,
        )

    # -- renewals ------------------------------------------------------------------------
    async def renew_loop(self, site: EngineSite, calls: CallRouter) -> None:
        renewals = 0
        while True:
            await lease_sleep(self._lease_ttl / 3, self._stopping)
            renewals += 1
            if renewals % SWEEP_EVERY == 0:
                await self._sweep()
            before = dict(self.held)
            sent = lease_clock()
            try:
                held = await self._db(ops.renew, self._host_id, self._lease_ttl,
                                      list(before.items()))
            except psycopg.Error as exc:
                logger.warning("cannot renew the leases of host %s: %s", self._host_id, exc)
                continue
            for key, epoch in before.items():
                if held.get(key) != epoch and self.held.get(key) == epoch:
                    self.drop(key)
                    if key in self._active:
                        site.fenced(*key)
            for key, epoch in held.items():
                if self.held.get(key) == epoch:
                    self.trust(key, sent)
            # Calls whose notification was missed, and those a failed take may have
            # taken (after the renewal is applied: a poll that fails must not undo it).
            try:
                await calls.poll()
            except psycopg.Error as exc:
                logger.warning("cannot look for forwarded calls on %s: %s", self._label, exc)

    async def _sweep(self) -> None:
        try:
            hosts, calls = await self._db(ops.sweep, self._lease_ttl, CALL_MAX_AGE)
        except psycopg.Error as exc:
            logger.warning("cannot sweep dead hosts and old calls on %s: %s", self._label, exc)
            return
        if hosts or calls:
            logger.info("swept %d dead host rows and %d abandoned call rows on %s",
                        hosts, calls, self._label)

    # -- releases and alarm writes, in the background -------------------------------------
    def release(self, namespace: str, object_id: str, epoch: int) -> None:
        """Give the lease up (``release_loop`` sends it)."""
        self._releases.append((namespace, object_id, epoch))
        self._release_event.set()

    def write_alarm(self, namespace: str, object_id: str, time: float, retry: int) -> None:
        """Store an alarm (``release_loop`` sends it)."""
        self._alarm_writes.append((namespace, object_id, time, retry))
        self._release_event.set()

    async def release_loop(self, released: Callable[[], None]) -> None:
        """Send the releases and alarm writes queued, then call ``released`` (the claim
        loop looks again)."""
        while True:
            await self._release_event.wait()
            self._release_event = trio.Event()
            releases, self._releases = self._releases, []
            writes, self._alarm_writes = self._alarm_writes, []
            try:
                if writes:
                    await self._db(ops.set_alarm, self._host_id, writes)
                if releases:
                    await self._db(ops.release, self._host_id, releases)
            except psycopg.Error as exc:
                # The leases expire by themselves; the alarms are retried by the timer.
                logger.warning("cannot release leases on %s: %s", self._label, exc)
            released()
