"""Reading every object without holding the Trio thread: ``_FileSource`` (a SQLite
source read in slices), ``_Prefetched`` (what such a read found) and ``Sliced`` (the
dashboard's ``SourceAccess`` to it, which shares and paces those reads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from time import perf_counter
from typing import Any, Final, Literal, TypeVar, cast

import trio
import trio.testing

from nursery_jobs._ops._inspect import (
    AlarmSummary,
    DataSource,
    FoundLetter,
    JobTotals,
    LetterPage,
    ObjectCounts,
    ObjectDetail,
    ObjectPage,
    ObjectRow,
    ObjectSummary,
)
from nursery_jobs._ops._queries import _ROW_SQL, _object_row
from nursery_jobs._ops._readers import _CatalogReader, _ObjectReader, letter_page, totals_of

T = TypeVar("T")


# -- reading every object without holding the Trio thread --------------------------------
# A page over every object (its counts, its dead letters) reads one database per object:
# 3,000 objects held the runtime's loop ~430 ms in one piece. ``Sliced`` reads them in
# slices of about ``SLICE_SECONDS`` of work, with a checkpoint between slices, then
# renders the page from what it read (``_Prefetched``): the loop is never held longer
# than a slice (plus the page's own rendering, which reads no object database).
SLICE_SECONDS: Final = 0.002
CATALOG_CHUNK: Final = 500  # catalog rows read per statement (between checkpoints)


# Of the loop's time, about the most that pages built from reads of every object take
# while loads keep coming: each second of the loop a page spent (reading in slices,
# rendering, its live counters) holds the next read of every object back 1 / PAGE_SHARE
# seconds (a load still waits for a read that starts after it came).
PAGE_SHARE: Final = 0.05
PACE_LIMIT: Final = 2.0  # seconds a load waits for the pace at most (a first, cold read)

_KnownRow = tuple[tuple[str, str], bool, ObjectRow]


def _same_row(row: ObjectRow, raw: tuple[Any, ...]) -> bool:
    """Whether a catalog row (``_ROW_SQL``) says what ``row`` says (its key aside)."""
    _, _, file, class_path, created_at, alarm, retry = raw
    return (row.file == file and row.class_path == class_path
            and row.created_at == float(created_at)
            and row.alarm == (None if alarm is None else float(alarm))
            and row.alarm_retry == int(retry or 0))


class _Slicer:
    """Checkpoints once about ``SLICE_SECONDS`` of work has run since the last one;
    ``work``: the seconds worked between checkpoints so far."""

    def __init__(self) -> None:
        self.work = 0.0
        self.start = perf_counter()
        self.deadline = self.start + SLICE_SECONDS

    async def tick(self, *, force: bool = False) -> None:
        now = perf_counter()
        if force or now >= self.deadline:
            self.work += now - self.start
            await trio.lowlevel.checkpoint()
            self.start = perf_counter()
            self.deadline = self.start + SLICE_SECONDS

    def total(self) -> float:
        return self.work + perf_counter() - self.start


class _FileSource(_CatalogReader, _ObjectReader):
    """A source of SQLite databases (a data directory, or a runtime's files or memory
    databases), readable in slices (``Sliced``)."""

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def live(self) -> bool:
        raise NotImplementedError

    async def rows_in_slices(self, slicer: _Slicer | None = None,
                             ) -> list[tuple[tuple[str, str], ObjectRow]]:
        """Every object's (namespace, id) and catalog row, in (namespace, id) order,
        ``CATALOG_CHUNK`` rows a statement with a checkpoint between statements."""
        rows: list[tuple[tuple[str, str], ObjectRow]] = []
        after: tuple[str, str] | None = None
        # The entries of the last pass, reused where unchanged: they live across the
        # pass's checkpoints, so new ones each time reach the collector's oldest
        # generation and set off full collections (50-100 ms with 3,000 objects,
        # measured). (namespace, id) -> (that key, active, ObjectRow)
        known: dict[tuple[str, str], _KnownRow] = self.__dict__.get("_known_rows", {})
        kept: dict[tuple[str, str], _KnownRow] = {}
        while True:
            with self._catalog() as conn:
                if after is None:
                    found = conn.execute(
                        f"{_ROW_SQL} ORDER BY o.namespace, o.object_id LIMIT ?",
                        (CATALOG_CHUNK,)).fetchall()
                else:
                    found = conn.execute(
                        f"{_ROW_SQL} WHERE (o.namespace, o.object_id) > (?, ?)"
                        " ORDER BY o.namespace, o.object_id LIMIT ?",
                        (*after, CATALOG_CHUNK)).fetchall()
            for raw in found:
                active = self._is_active(raw[0], raw[1])
                was = known.get((raw[0], raw[1]))
                if was is None or was[1] != active or not _same_row(was[2], raw):
                    row = _object_row(raw, active)
                    was = ((row.namespace, row.id), active, row)
                kept[was[0]] = was
                rows.append((was[0], was[2]))
            if len(found) < CATALOG_CHUNK:
                self.__dict__["_known_rows"] = kept
                return rows
            after = (found[-1][0], found[-1][1])
            await (slicer or _Slicer()).tick(force=True)

    async def prefetch(self, now: float, *, strikes: bool = False,
                       letters: bool = False) -> _Prefetched:
        """Every object's counts (and with ``letters`` the dead letters of those that
        have some), read in slices of about ``SLICE_SECONDS``: between two slices the
        runtime runs. Each object is read whole in one slice (as ``object_counts``
        reads it); objects read in different slices are read at different moments."""
        slicer = _Slicer()
        rows = await self.rows_in_slices(slicer)
        counts: dict[tuple[str, str], ObjectCounts] = {}
        for key, row in rows:
            counts[key] = self._counts(row, now, strikes=strikes)
            await slicer.tick()
        found: list[FoundLetter] | None = None
        if letters:
            found = []
            for key, row in rows:
                if counts[key].dead_letters:
                    found += self._letters_of(row)
                    await slicer.tick()
        return _Prefetched(self, [row for _, row in rows], counts, strikes=strikes,
                           letters=found, work=slicer.total())


class _Prefetched:
    """A ``DataSource`` whose reads over every object were made already (``prefetch``):
    the catalog's rows, every object's counts and perhaps every dead letter. The rest is
    read from ``source`` (one object, or the catalog's small aggregates)."""

    def __init__(self, source: _FileSource, rows: list[ObjectRow],
                 counts: dict[tuple[str, str], ObjectCounts], *, strikes: bool,
                 letters: list[FoundLetter] | None, work: float = 0.0) -> None:
        self.source = source
        self.work = work  # seconds of the loop the read took
        self.rows = rows
        self.counts = counts
        self.strikes = strikes
        self.letters = letters
        # What the pages rendered from this read computed over every object (the
        # object list in an order): loads that share the read share these too.
        self.memo: dict[Any, Any] = {}

    @property
    def label(self) -> str:
        return self.source.label

    @property
    def live(self) -> bool:
        return self.source.live

    def namespaces(self) -> list[tuple[str, int]]:
        if "namespaces" not in self.memo:
            found: dict[str, int] = {}
            for row in self.rows:
                found[row.namespace] = found.get(row.namespace, 0) + 1
            self.memo["namespaces"] = sorted(found.items())
        return list(self.memo["namespaces"])

    def alarm_summary(self, now: float) -> AlarmSummary:
        return self.source.alarm_summary(now)

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        if only == "active":  # (the runtime's resident objects: at most max_active)
            return self.source.objects(namespace=namespace,
                                       search=search, only=only, now=now, offset=offset,
                                       limit=limit)
        rows = [row for row in self.rows
                if (not namespace or row.namespace == namespace)
                and (not search or search in row.id)
                and (only != "due" or (row.alarm is not None and row.alarm <= now))]
        end = None if limit < 0 else offset + limit
        return ObjectPage(objects=rows[offset:end], total=len(rows), offset=offset,
                          limit=limit)

    def summary(self, row: ObjectRow, now: float) -> ObjectSummary:
        return self.source.summary(row, now)

    def detail(
        self, namespace: str, object_id: str, now: float, *, job_limit: int | None = None,
        letter_limit: int | None = None,
    ) -> ObjectDetail | None:
        return self.source.detail(namespace, object_id, now, job_limit=job_limit,
                                  letter_limit=letter_limit)

    def job_totals(self, now: float) -> JobTotals:
        if "job_totals" not in self.memo:
            self.memo["job_totals"] = totals_of(self.counts)
        return self.memo["job_totals"]  # type: ignore[no-any-return]

    def object_counts(self, now: float, *, strikes: bool = False,
                      ) -> dict[tuple[str, str], ObjectCounts]:
        if strikes and not self.strikes:  # (not prefetched: read now, in one piece)
            return self.source.object_counts(now, strikes=True)
        return self.counts

    def all_dead_letters(
        self, *, search: str | None = None, offset: int = 0, limit: int = 50,
        counts: dict[tuple[str, str], ObjectCounts] | None = None,
    ) -> LetterPage:
        if self.letters is None:
            return self.source.all_dead_letters(search=search, offset=offset, limit=limit,
                                                counts=self.counts)
        return letter_page(list(self.letters), search, offset, limit)

    def row(self, namespace: str, object_id: str) -> ObjectRow | None:
        return self.source.row(namespace, object_id)


class Sliced:
    """A ``SourceAccess`` to a SQLite source read on the Trio thread, where a page that
    reads every object (``read(fn, now=..., counts=True)``) reads them in slices first
    (``_FileSource.prefetch``), then calls ``fn`` on what was read.

    Loads that wait while such a read runs share the next one (it starts after they
    arrived, so each still sees every write made before it asked): 20 clients loading
    pages cost about one read of every object at a time, not 20."""

    def __init__(self, source: _FileSource) -> None:
        self.source = source
        # (strikes, letters) -> a lock that one read of every object holds, the reads
        # started so far, and the newest read's (number, result).
        self._locks: dict[tuple[bool, bool], trio.Lock] = {}
        self._started: dict[tuple[bool, bool], int] = {}
        self._newest: dict[tuple[bool, bool], tuple[int, _Prefetched]] = {}
        self._next_read = 0.0  # (perf_counter) when the next read may begin

    @property
    def label(self) -> str:
        return self.source.label

    async def read(self, fn: Callable[[DataSource], T], *, now: float | None = None,
                   counts: bool = False, strikes: bool = False, letters: bool = False,
                   limiter: trio.CapacityLimiter | None = None) -> T:
        """``fn(source)`` on the Trio thread; with ``counts`` (or ``letters``) and
        ``now``, every object's counts (and dead letters) read in slices before, by
        this call or by one that started after it was made. ``limiter``: held by each
        read of every object (and by a call that reads none, while it runs ``fn``).
        Checkpoints."""
        if now is None or not (counts or letters):
            async with contextlib.AsyncExitStack() as stack:
                if limiter is not None:
                    await stack.enter_async_context(limiter)
                await trio.lowlevel.checkpoint()
                return fn(cast("DataSource", self.source))
        key = (strikes, letters)
        arrived = self._started.get(key, 0)  # (reads started before this call)
        # Loads of one kind wait here (holding no token of ``limiter``: that bounds
        # the reads under way, of different kinds).
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            newest = self._newest.get(key)
            if newest is not None and newest[0] > arrived:
                found = newest[1]  # (started after this call was made: shared)
                await trio.lowlevel.checkpoint()
            else:
                await self._paced()
                async with contextlib.AsyncExitStack() as stack:
                    if limiter is not None:
                        await stack.enter_async_context(limiter)
                    number = self._started[key] = self._started.get(key, 0) + 1
                    began = perf_counter()
                    found = await self.source.prefetch(now, strikes=strikes,
                                                       letters=letters)
                    self._newest[key] = (number, found)
                    self._charge(found.work, began)
            if not lock.statistics().tasks_waiting:
                # (No load waits for it: not kept, with every dead letter it holds.)
                self._newest.pop(key, None)
        began = perf_counter()
        try:
            return fn(found)
        finally:
            self._charge(perf_counter() - began, began)

    def charge(self, seconds: float) -> None:
        """Counts ``seconds`` of the loop spent on a page (its live counters, say)
        against the pace of the reads of every object (``PAGE_SHARE``)."""
        self._charge(seconds, perf_counter() - seconds)

    def _charge(self, work: float, began: float) -> None:
        # (A leaky bucket: work done at once by reads of different kinds adds up, so
        # together they stay within the share. A cold first read waits PACE_LIMIT.)
        start = max(self._next_read, began)
        self._next_read = start + min(work / PAGE_SHARE,
                                      perf_counter() - start + PACE_LIMIT)

    async def stepwise(self, steps: Callable[[DataSource], Generator[None, None, T]], *,
                       limiter: trio.CapacityLimiter | None = None) -> T:
        """What ``steps(source)`` returns, its steps (each yields) run in slices of about
        ``SLICE_SECONDS`` with a checkpoint between slices (``limiter`` held)."""
        async with contextlib.AsyncExitStack() as stack:
            if limiter is not None:
                await stack.enter_async_context(limiter)
            await trio.lowlevel.checkpoint()
            running = steps(cast("DataSource", self.source))
            slicer = _Slicer()
            while True:
                try:
                    next(running)
                except StopIteration as done:
                    self._charge(slicer.total(), perf_counter() - slicer.total())
                    return cast("T", done.value)
                await slicer.tick()

    async def _paced(self) -> None:
        """Waits until a read of every object may begin (``PAGE_SHARE``). Not under a
        ``MockClock``: the pace is real time, which a virtual clock does not measure."""
        wait = self._next_read - perf_counter()
        if wait > 0 and not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
            await trio.sleep(wait)
