"""The flight list of a host under the PostgreSQL engine: the jobs its alarm runs are
running, shipped to its ``nj_hosts`` row (``_ops.ship_flight``). A host that dies leaves
its list behind: the host taking an object over turns the object's entry into a crash
token (a strike for that death)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import psycopg
import trio

from nursery_jobs._engines.postgres import _ops as ops

if TYPE_CHECKING:
    from nursery_jobs._engines.postgres._statements import Db

logger = logging.getLogger("nursery_jobs")

# The flight list ships at most this often while it changes (seconds): a job that kills
# its host sooner than this after it starts may get no crash strike for that death.
FLIGHT_INTERVAL: Final = 0.02


class Flight:
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


class FlightList:
    """This host's flight slots ([namespace, object_id, token, started] each: a token
    while a job runs), and the loop that ships the list when it changes."""

    def __init__(self, host_id: str, db: Db) -> None:
        self._host_id = host_id
        self._db = db
        self._flights: dict[int, list[Any]] = {}
        self._dirty = False
        self._event = trio.Event()

    def acquire(self, namespace: str, object_id: str, admit: Callable[[], None]) -> Flight:
        """A slot for an alarm run of the object; ``admit`` checks its lease."""
        slot = Flight([namespace, object_id, "", 0.0], self._changed, admit)
        self._flights[id(slot)] = slot.entry
        return slot

    def release(self, slot: Any) -> None:
        entry = self._flights.pop(id(slot), None)
        if entry is not None and entry[2]:
            self._changed()

    def _changed(self) -> None:
        if not self._dirty:
            self._dirty = True
            self._event.set()

    async def loop(self) -> None:
        while True:
            await self._event.wait()
            self._event = trio.Event()
            self._dirty = False
            entries = [list(e) for e in self._flights.values() if e[2]]
            try:
                await self._db(ops.ship_flight, self._host_id, entries)
            except psycopg.Error as exc:
                logger.warning("cannot ship the flight list of host %s: %s", self._host_id, exc)
                self._changed()
            await trio.sleep(FLIGHT_INTERVAL)
