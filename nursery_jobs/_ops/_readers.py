"""The reading the sources share: ``_CatalogReader`` (the catalog's queries) and
``_ObjectReader`` (objects' databases: one object's summary and detail, every object's
counts, cached while a database is unchanged, and dead letters), over connections a
source provides; and the sums and pages built from objects' counts and letters, which
PostgreSQL's ``PgReader`` shares.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, Literal

import attrs

from nursery_jobs._ops._inspect import (
    AlarmSummary,
    FoundLetter,
    JobTotals,
    LetterPage,
    ObjectCounts,
    ObjectDetail,
    ObjectPage,
    ObjectRow,
    ObjectSummary,
    State,
)
from nursery_jobs._ops._queries import (
    _ROW_SQL,
    _count,
    _filters,
    _object_counts,
    _object_row,
    _read_attempts,
    _read_dead_letters,
    _read_jobs,
)


class _CatalogReader:
    """Catalog queries shared by both sources (on a connection they provide)."""

    def _catalog(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _is_active(self, namespace: str, object_id: str) -> bool:
        return False

    def namespaces(self) -> list[tuple[str, int]]:
        with self._catalog() as conn:
            return [(str(ns), int(n)) for ns, n in conn.execute(
                "SELECT namespace, COUNT(*) FROM nj_objects GROUP BY namespace ORDER BY namespace"
            )]

    def alarm_summary(self, now: float) -> AlarmSummary:
        with self._catalog() as conn:
            objects = conn.execute("SELECT COUNT(*) FROM nj_objects").fetchone()[0]
            alarms, due = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(time <= ?), 0) FROM nj_alarms", (now,)
            ).fetchone()
            later = conn.execute(
                "SELECT MIN(time) FROM nj_alarms WHERE time > ?", (now,)
            ).fetchone()[0]
        return AlarmSummary(objects=int(objects), alarms=int(alarms), due=int(due),
                            next_alarm=None if later is None else float(later))

    def _page(
        self, namespace: str | None, search: str | None, only: str, now: float,
        offset: int, limit: int,
    ) -> ObjectPage:
        where, params = _filters(namespace, search, only, now)
        with self._catalog() as conn:
            total = conn.execute(
                "SELECT COUNT(*) FROM nj_objects o LEFT JOIN nj_alarms a"
                f" USING (namespace, object_id){where}", params
            ).fetchone()[0]
            rows = conn.execute(
                f"{_ROW_SQL}{where} ORDER BY o.namespace, o.object_id LIMIT ? OFFSET ?",
                [*params, limit, offset],
            ).fetchall()
        return ObjectPage(
            objects=[_object_row(r, self._is_active(r[0], r[1])) for r in rows],
            total=int(total), offset=offset, limit=limit,
        )

    def _rows(self, keys: list[tuple[str, str]]) -> list[ObjectRow]:
        with self._catalog() as conn:
            found = []
            for namespace, object_id in keys:
                row = conn.execute(
                    f"{_ROW_SQL} WHERE o.namespace = ? AND o.object_id = ?",
                    (namespace, object_id),
                ).fetchone()
                if row is not None:
                    found.append(_object_row(row, self._is_active(namespace, object_id)))
            return found

    def row(self, namespace: str, object_id: str) -> ObjectRow | None:
        rows = self._rows([(namespace, object_id)])
        return rows[0] if rows else None


def summary_of(row: ObjectRow, counts: ObjectCounts) -> ObjectSummary:
    """An object's summary from its counts (read already for every object)."""
    state: State = counts.state or ("active" if row.active else "evicted")
    return ObjectSummary(
        row=row, state=state, problem=counts.problem, lifecycle=counts.state is not None,
        jobs=counts.jobs, due=counts.due_jobs, running=counts.running_jobs,
        max_attempts=counts.max_attempts, dead_letters=counts.dead_letters,
        breaker_strikes=counts.breaker_strikes, paused=counts.paused)


def totals_of(counts: dict[tuple[str, str], ObjectCounts]) -> JobTotals:
    """Objects' counts, summed by namespace."""
    totals = JobTotals()
    for (namespace, _), c in counts.items():
        for into, n in ((totals.dead_letters, c.dead_letters),
                        (totals.due_jobs, c.due_jobs),
                        (totals.running_jobs, c.running_jobs),
                        (totals.paused_objects, int(bool(c.paused)))):
            into[namespace] = into.get(namespace, 0) + n
    return totals


def _matches(item: FoundLetter, needle: str) -> bool:
    """Whether ``needle`` (casefolded) is in the letter's object id, job id, function or
    error text."""
    letter = item.letter
    return any(needle in text.casefold()
               for text in (item.object_id, letter.id, letter.fn, letter.error))


def letter_page(found: list[FoundLetter], search: str | None, offset: int,
                limit: int) -> LetterPage:
    """``found`` filtered by ``search``, newest first, one page of it."""
    if search:
        needle = search.casefold()
        found = [item for item in found if _matches(item, needle)]
    found.sort(key=lambda item: (-item.letter.time, item.namespace, item.object_id,
                                 item.letter.owner, item.letter.id))
    end = None if limit < 0 else offset + limit
    return LetterPage(letters=found[offset:end], total=len(found), offset=offset, limit=limit)


class _ObjectReader:
    """Reads object databases: ``_object_db`` yields a connection (or a state) for an
    object the catalog (``row``) knows."""

    # Counts of objects whose database cannot have changed: (namespace, id) ->
    # (signature, counts). Only where ``_signature`` gives one (closed files).
    _counts_cache: dict[tuple[str, str], tuple[Any, ObjectCounts]]

    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage:
        raise NotImplementedError

    def _signature(self, row: ObjectRow) -> Any:
        """What changes whenever ``row``'s database may have (None: read it each time)."""
        return None

    def _counts(self, row: ObjectRow, now: float, *, strikes: bool = False) -> ObjectCounts:
        signature = self._signature(row)
        cache: dict[tuple[str, str], tuple[Any, ObjectCounts]] = self.__dict__.setdefault(
            "_counts_cache", {})
        key = (row.namespace, row.id)
        if signature is not None:
            known = cache.get(key)
            if known is not None and known[0] == signature and (
                    known[1].next_due is None or now < known[1].next_due) and (
                    not strikes or known[1].crash_strikes is not None):
                return known[1]
        with self._object_db(row) as (conn, state, problem):
            if conn is None:
                return ObjectCounts(state=state, problem=problem)
            try:
                counts = attrs.evolve(
                    _object_counts(conn, now, self._running_id(row), strikes=strikes),
                    state=state)
            except sqlite3.DatabaseError as exc:
                return ObjectCounts(state="damaged", problem=str(exc))
        if signature is not None:
            cache[key] = (signature, counts)
        return counts

    def object_counts(self, now: float, *, strikes: bool = False,
                      ) -> dict[tuple[str, str], ObjectCounts]:
        """Every object's counts (crash strikes too with ``strikes``: a scan of every
        job). Reads every object's database (one unchanged since, not again)."""
        return {(row.namespace, row.id): self._counts(row, now, strikes=strikes)
                for row in self.objects(limit=-1).objects}

    def job_totals(self, now: float) -> JobTotals:
        """Dead letters, due and running jobs and paused objects of every object, by
        namespace."""
        return totals_of(self.object_counts(now))

    def all_dead_letters(
        self, *, search: str | None = None, offset: int = 0, limit: int = 50,
        counts: dict[tuple[str, str], ObjectCounts] | None = None,
    ) -> LetterPage:
        """The dead letters of every object, newest first, those matching ``search``
        (in the object id, job id, function or error text). ``counts``: every object's,
        read already in this request (only objects with letters are opened then)."""
        found: list[FoundLetter] = []
        if counts is not None:
            rows = [row for ns, oid in sorted(k for k, c in counts.items() if c.dead_letters)
                    if (row := self.row(ns, oid)) is not None]
        else:
            cache: dict[tuple[str, str], tuple[Any, ObjectCounts]] = self.__dict__.get(
                "_counts_cache", {})
            rows = []
            for row in self.objects(limit=-1).objects:
                known = cache.get((row.namespace, row.id))
                if known is not None and not known[1].dead_letters and (
                        known[0] is not None and known[0] == self._signature(row)):
                    continue  # (unchanged since counted: none)
                rows.append(row)
        for row in rows:
            found += self._letters_of(row)
        return letter_page(found, search, offset, limit)

    def _letters_of(self, row: ObjectRow) -> list[FoundLetter]:
        """``row``'s dead letters (none where its database cannot be read)."""
        with self._object_db(row) as (conn, _state, _problem):
            if conn is None:
                return []
            try:
                letters = _read_dead_letters(conn, None)
            except sqlite3.DatabaseError:
                return []
        return [FoundLetter(namespace=row.namespace, object_id=row.id, letter=letter)
                for letter in letters]

    def row(self, namespace: str, object_id: str) -> ObjectRow | None:
        raise NotImplementedError

    def _object_db(
        self, row: ObjectRow
    ) -> contextlib.AbstractContextManager[tuple[sqlite3.Connection | None, State, str | None]]:
        raise NotImplementedError

    def _running_id(self, row: ObjectRow) -> str | None:
        return None

    def _running_started(self, row: ObjectRow) -> float | None:
        """When the job ``_running_id`` names started (None: not known)."""
        return None

    def summary(self, row: ObjectRow, now: float) -> ObjectSummary:
        with self._object_db(row) as (conn, state, problem):
            if conn is None:
                return ObjectSummary(row=row, state=state, problem=problem)
            try:
                return _count(conn, row, state, now, self._running_id(row))
            except sqlite3.DatabaseError as exc:
                return ObjectSummary(row=row, state="damaged", problem=str(exc))

    def detail(
        self, namespace: str, object_id: str, now: float, *, job_limit: int | None = None,
        letter_limit: int | None = None,
    ) -> ObjectDetail | None:
        row = self.row(namespace, object_id)
        if row is None:
            return None
        with self._object_db(row) as (conn, state, problem):
            if conn is None:
                return ObjectDetail(summary=ObjectSummary(row=row, state=state, problem=problem),
                                    jobs=[], dead_letters=[])
            try:
                running_id = self._running_id(row)
                return ObjectDetail(
                    summary=_count(conn, row, state, now, running_id),
                    jobs=_read_jobs(conn, job_limit, running_id, self._running_started(row)),
                    dead_letters=_read_dead_letters(conn, letter_limit),
                    attempts=_read_attempts(conn),
                )
            except sqlite3.DatabaseError as exc:
                return ObjectDetail(
                    summary=ObjectSummary(row=row, state="damaged", problem=str(exc)),
                    jobs=[], dead_letters=[],
                )
