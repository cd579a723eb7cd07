"""The ship path of the PostgreSQL engine: a working copy's commits go to PostgreSQL as
fenced transactions (``_ops.ship``), one ship of an object at a time; ships of different
objects that arrive while one is out share the next round trip (``_batch``, group
commit). What a ship finds updates this host's lease on the object: trusted further,
dropped (fenced), or given up (stale: the object reloads).

Commits made outside calls and alarm runs ship from the background (``Shipper.loop``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import psycopg
import trio

from nursery_jobs._engines.base import EngineSite
from nursery_jobs._engines.postgres import _ops as ops
from nursery_jobs._engines.postgres._batch import ShipBatcher
from nursery_jobs._engines.postgres._copy import SHIPPED, STALE, Change
from nursery_jobs._engines.postgres._leases import lease_clock
from nursery_jobs._errors import ObjectFencedError, StorageError

if TYPE_CHECKING:
    from nursery_jobs._engines.postgres._copy import PgObject
    from nursery_jobs._engines.postgres._leases import Leases
    from nursery_jobs._engines.postgres._statements import Db

logger = logging.getLogger("nursery_jobs")

Key = tuple[str, str]

# Active objects' commits ship in the background at least this often (seconds), besides
# the output gate's syncs: a host's death re-runs at most this much completed work (the
# completion group's bound, in time: a long alarm run syncs only at its end).
SHIP_INTERVAL: Final = 0.05


class Shipper:
    """Ships the commits of this host's working copies (``ship``: each ``PgObject``'s),
    through the group-commit ``batcher``, and from the background (``loop``).

    It keeps the leases' ``held`` dict and ``trust`` / ``drop`` / ``release`` at hand (a
    ship is the hot path: no lookup through the engine)."""

    def __init__(self, host_id: str, lease_ttl: float, label: str, db: Db, leases: Leases,
                 active: dict[Key, PgObject]) -> None:
        self._host_id = host_id
        self._lease_ttl = lease_ttl
        self._label = label
        self._db = db
        self._held = leases.held
        self._trust = leases.trust
        self._drop = leases.drop
        self._release = leases.release
        self._active = active
        # Set when an active object has something to ship (see ``loop``).
        self._to_ship = trio.Event()
        self.passes = 0  # of the background loop
        # Per object, the end of its last ship abandoned by a cancelled caller (see ship).
        self._ships_out: dict[Key, trio.Event] = {}
        # Group commit: ships of many objects share round trips (issue 26).
        self.batcher = ShipBatcher(self._ship_batch)

    async def ship(self, change: Change) -> str:
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
            shipped = await self.batcher.ship(change, finished)
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
                    self._release(key[0], key[1], change.epoch)
        return shipped

    async def _ship_batch(self, changes: list[Change], finished: Callable[[], object]
                          ) -> list[str]:
        """One round trip of the ship batcher: a lone change as ``ops.ship``, several
        as ``ops.ship_many`` (one statement: each object's fence, each its outcome)."""
        if len(changes) == 1:
            return [await self._db(ops.ship, self._host_id, self._lease_ttl, changes[0],
                                   finished=finished)]
        return await self._db(ops.ship_many, self._host_id, self._lease_ttl, changes,
                              finished=finished)

    def closed(self, key: Key) -> None:
        """The object's copy closed: forget its last abandoned ship once that ended."""
        out = self._ships_out.get(key)
        if out is not None and out.is_set():
            del self._ships_out[key]

    def wake(self) -> None:
        """An active object has something to ship: wake the background loop."""
        self._to_ship.set()

    async def loop(self, site: EngineSite) -> None:
        """Ship commits made outside calls and alarm runs within ``SHIP_INTERVAL``.

        Asleep until an active object has something to ship: a working copy captured
        its first key since its last ship (``Captured``), an alarm was written,
        crash tokens cleared. Then it looks every ``SHIP_INTERVAL`` until nothing is
        left unshipped. (It looked every 50 ms while objects were resident: a test over
        two virtual days took minutes, measured.)"""
        while True:
            await self._to_ship.wait()
            self._to_ship = trio.Event()
            await trio.sleep(SHIP_INTERVAL)
            self.passes += 1
            for state in [s for s in self._active.values() if s.changed]:
                try:
                    await state.sync()
                except ObjectFencedError as exc:
                    site.fenced(*state.key, reason=exc.reason)
                except StorageError as exc:
                    logger.warning("%s", exc)
            if any(s.changed for s in self._active.values()):
                self._to_ship.set()
