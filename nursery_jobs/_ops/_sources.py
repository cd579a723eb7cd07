"""The SQLite sources: ``OfflineSource`` reads a stopped data directory, and
``RuntimeSource`` a running runtime — the one place outside the core that reads the
runtime's internals — with the dashboard's write actions on it (requeue, discard).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from nursery_jobs import _clock
from nursery_jobs._errors import UnknownObjectError
from nursery_jobs._ops._inspect import ObjectPage, ObjectRow, State
from nursery_jobs._ops._readonly import (
    _file_db,
    _file_signature,
    check_files_directory,
    open_readonly,
)
from nursery_jobs._ops._slices import _FileSource

if TYPE_CHECKING:
    from nursery_jobs._core._runtime import Runtime


class StoppedSource(_FileSource):
    """A data directory no runtime holds, of either layout: nothing is live and no
    object is active."""

    @property
    def live(self) -> bool:
        return False

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        if only == "active":
            return ObjectPage(objects=[], total=0, offset=offset, limit=limit)
        return self._page(namespace, search, only, now, offset, limit)


class OfflineSource(StoppedSource):
    """A stopped data directory, read-only. Creates no file; runs nothing."""

    def __init__(self, data: str | os.PathLike[str]) -> None:
        self.data = Path(data)
        check_files_directory(self.data)

    @property
    def label(self) -> str:
        return str(self.data)

    def _catalog(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return open_readonly(self.data / "catalog.sqlite3")

    def _object_db(
        self, row: ObjectRow
    ) -> contextlib.AbstractContextManager[tuple[sqlite3.Connection | None, State, str | None]]:
        return _file_db(self.data / "objects" / row.file, probe=True)

    def _signature(self, row: ObjectRow) -> Any:
        return _file_signature(f"{self.data}/objects/{row.file}")


class RuntimeSource(_FileSource):
    """A running runtime, read in its own process (on the Trio thread; every call is
    synchronous and runs between the runtime's statements).

    The one place outside the core that reads the runtime's internals: the catalog
    connection, the hosts of active objects (their databases are locked exclusively,
    so their own connection is the only way in), the in-memory databases of a
    ``path=None`` runtime, and the id of the job an alarm run is executing. A job an
    active object completed may show until its completion group commits.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @property
    def label(self) -> str:
        return str(self.rt.engine.label)

    @property
    def live(self) -> bool:
        return True

    @contextlib.contextmanager
    def _catalog(self) -> Iterator[sqlite3.Connection]:
        catalog = getattr(self.rt.engine, "catalog", None)
        if catalog is None:
            raise UnknownObjectError(
                f"the dashboard reads the files and memory engines; {self.label} has no catalog"
            )
        yield catalog.conn

    def _is_active(self, namespace: str, object_id: str) -> bool:
        return self.rt.is_active(namespace, object_id)

    def active_keys(self) -> list[tuple[str, str]]:
        return self.rt.active_objects()

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        if only != "active":
            return self._page(namespace, search, only, now, offset, limit)
        keys = sorted(
            key for key in self.rt.active_objects()
            if (not namespace or key[0] == namespace) and (not search or search in key[1])
        )
        end = None if limit < 0 else offset + limit
        return ObjectPage(objects=self._rows(keys[offset:end]), total=len(keys),
                          offset=offset, limit=limit)

    def _signature(self, row: ObjectRow) -> Any:
        # An open database: its connection's count of changed rows moves with every
        # write (a rolled-back one too). An evicted object's file changes only when it
        # is activated again (this runtime holds the directory).
        conn = self._host_conn(row.namespace, row.id)
        if conn is None and self.rt.path is None:
            conn = self.rt.engine.database(row.namespace, row.id)  # type: ignore[attr-defined]
        if conn is not None:
            return ("open", id(conn), conn.total_changes, self._running_id(row))
        if self.rt.is_active(row.namespace, row.id):
            return None  # (dormant or closing: read it each time)
        assert self.rt.path is not None
        return _file_signature(f"{self.rt.path}/objects/{row.file}", wal=False)

    def _host_conn(self, namespace: str, object_id: str) -> sqlite3.Connection | None:
        return self.rt.active_database(namespace, object_id)

    @contextlib.contextmanager
    def _object_db(
        self, row: ObjectRow
    ) -> Iterator[tuple[sqlite3.Connection | None, State, str | None]]:
        conn = self._host_conn(row.namespace, row.id)
        if conn is not None:
            yield conn, "active", None
            return
        if self.rt.path is not None and self.rt.is_active(row.namespace, row.id):
            if self.rt.database_closing(row.namespace, row.id):
                # Its close still runs (checkpointing, in a worker thread): opening the
                # file now, then closing it, would drop this process's lock on it.
                yield None, "active", "closing its database (dozing): look again shortly"
                return
            # Dormant: resident, its file closed (read as an evicted one's is).
            with _file_db(self.rt.path / "objects" / row.file, probe=False) as found:
                conn, state, problem = found
                yield conn, "active" if state == "evicted" else state, problem
            return
        if self.rt.path is None:
            memory = self.rt.engine.database(row.namespace, row.id)  # type: ignore[attr-defined]
            if memory is None:
                yield None, "missing", "no in-memory database"
            else:
                yield memory, "evicted", None
            return
        # Evicted: the file is closed, and nothing else in this process can open it
        # while this synchronous read runs (no lock probe: see _readonly._held_by_another_process).
        with _file_db(self.rt.path / "objects" / row.file, probe=False) as found:
            yield found

    def _lifecycle(self, namespace: str, object_id: str) -> Any:
        instance = self.rt.active_instance(namespace, object_id)
        return None if instance is None else _lifecycle_of(instance)

    def _running_id(self, row: ObjectRow) -> str | None:
        lifecycle = self._lifecycle(row.namespace, row.id)
        return None if lifecycle is None else lifecycle.store.running_id

    def _running_started(self, row: ObjectRow) -> float | None:
        lifecycle = self._lifecycle(row.namespace, row.id)
        found = None if lifecycle is None else lifecycle.running_for()
        return None if found is None else _clock.now() - found[1]

    # -- what the test helpers need -----------------------------------------------------
    def busy(self, now: float) -> bool:
        """Whether an alarm is in flight or due at ``now``."""
        return bool(self.rt.timer.inflight) or bool(self.rt.engine.due(now, 1))

    # -- the dashboard's write actions (only with http_writes) ---------------------------
    async def requeue(self, namespace: str, object_id: str, owner: str, job_id: str) -> bool:
        """Requeue a dead letter through the object's Lifecycle, as a write call of the
        object (activating it if it exists; durable when it returns)."""

        async def requeue(lifecycle: Any) -> bool:
            return await lifecycle.requeue(job_id, owner=owner) is not None

        return await self._in_lifecycle(namespace, object_id, "dashboard requeue", requeue)

    async def discard(self, namespace: str, object_id: str, owner: str, job_id: str) -> bool:
        """Delete a dead letter through the object's job table, as a write call of the
        object (activating it if it exists; durable when it returns)."""

        async def discard(lifecycle: Any) -> bool:
            return bool(await lifecycle.discard(job_id, owner=owner))

        return await self._in_lifecycle(namespace, object_id, "dashboard discard", discard)

    async def _in_lifecycle(self, namespace: str, object_id: str, holder: str,
                            fn: Callable[[Any], Awaitable[bool]]) -> bool:
        """``await fn(lifecycle)`` in a write turn of the object (``Runtime.run_in``:
        resident from activation to the end, so that no eviction comes in between; an
        object that does not exist is not created: ``UnknownObjectError``)."""
        from nursery_jobs._core._object import resolve_namespace

        cls = resolve_namespace(namespace, self.rt.engine.class_path(namespace))
        if cls is None:
            raise UnknownObjectError(f"no class is registered for namespace {namespace!r}",
                                     namespace=namespace, object_id=object_id)

        async def run(instance: Any) -> bool:
            lifecycle = _lifecycle_of(instance)
            if lifecycle is None:
                raise UnknownObjectError(f"{namespace}/{object_id} has no Lifecycle",
                                         namespace=namespace, object_id=object_id)
            return await fn(lifecycle)

        return await self.rt.run_in(cls, object_id, holder, run, namespace=namespace)


def _lifecycle_of(instance: object) -> Any:
    """The Lifecycle an object installed, or None."""
    from nursery_jobs._jobs._lifecycle import Lifecycle

    for value in vars(instance).values():
        if isinstance(value, Lifecycle):
            return value
    return None
