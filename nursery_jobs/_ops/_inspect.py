"""What an operator sees: the records the faces show, and the seam they read them through.

``DataSource`` is the one seam the CLI, the dashboard and the test helpers read through,
and ``SourceAccess`` says where a face may read it: ``Inline`` on the Trio thread (SQLite
files and memory: microseconds), or, for PostgreSQL (``_inspect_pg``), in a worker thread
inside one snapshot. ``OfflineSource`` (``_sources``) reads a stopped data directory
without creating a file or taking a lock a runtime would wait on; ``RuntimeSource``
(``_sources``) reads a running runtime, and is the only code outside the core that
touches the runtime's internals (keep it that way: after a restructure of the core, this
class is what changes). ``_offline`` holds the writes (requeue, pause, resume) on a data
directory and on PostgreSQL, ``_offline_shared`` on the shared layout.

The shared layout (``_inspect_shared``): ``SharedSource`` reads a stopped directory and
``SharedRuntimeSource`` (a ``RuntimeSource``) a running one; both load an object's
stored rows as PostgreSQL's ``PgReader`` does (``_stored_rows``).

How the SQLite sources read: ``_readonly`` opens a database file without leaving anything
behind, ``_queries`` holds the SQL on a catalog and on one object's database,
``_readers`` the reading the sources share, and ``_slices`` the reads of every object in
slices of the Trio thread's time (the dashboard's ``Sliced``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import attrs
import trio

State = Literal["active", "evicted", "in use", "missing", "damaged", "quarantined"]
T = TypeVar("T")


# -- records --------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class ObjectRow:
    """An object as the catalog knows it (no object database is opened for this)."""

    namespace: str
    id: str
    file: str
    class_path: str
    created_at: float
    alarm: float | None
    alarm_retry: int
    active: bool


@attrs.frozen(kw_only=True)
class ObjectPage:
    """One page of objects, in (namespace, id) order."""

    objects: list[ObjectRow]
    total: int
    offset: int
    limit: int


@attrs.frozen(kw_only=True)
class JobInfo:
    """A queued job. ``priority`` is None where the table has no priority column (a
    Queue item's time then still carries its priority: shown as stored)."""

    id: str
    owner: str
    fn: str
    time: float
    priority: int | None
    attempts: int
    max_attempts: int
    running: bool
    running_since: float | None
    crash_strikes: int
    created_at: float
    exclusive: bool
    singleflight: bool
    payload: Any
    timeout: float | None = None
    """Seconds a run may last (``push(timeout=)``); None: no limit, or a table from
    before the column."""


@attrs.frozen(kw_only=True)
class DeadLetterInfo:
    """A dead letter: the job that ended without success, and why."""

    owner: str
    id: str
    fn: str
    error: str
    attempts: int
    reason: str
    time: float
    payload: Any


@attrs.frozen(kw_only=True)
class AttemptInfo:
    """A failed attempt of a job (the last few are kept, for a job and a dead letter)."""

    attempt: int
    started: float
    seconds: float
    error: str


@attrs.frozen(kw_only=True)
class ObjectSummary:
    """Counts from one object's database (opened once, briefly)."""

    row: ObjectRow
    state: State
    problem: str | None = None
    lifecycle: bool = False
    jobs: int = 0
    due: int = 0
    running: int = 0
    max_attempts: int = 0
    dead_letters: int = 0
    breaker_strikes: int = 0
    # Paused owners (``lifecycle.pause``); None among them: the whole object is paused.
    paused: tuple[str | None, ...] = ()


@attrs.frozen(kw_only=True)
class ObjectDetail:
    """One object's jobs and dead letters (up to the limits asked for)."""

    summary: ObjectSummary
    jobs: list[JobInfo]
    dead_letters: list[DeadLetterInfo]
    # (owner, job id) -> its recent failed attempts, oldest first
    attempts: dict[tuple[str, str], list[AttemptInfo]] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class JobTotals:
    """Counts across every object (not only active ones), by namespace: what the
    metrics' gauges and an alert read."""

    dead_letters: dict[str, int] = attrs.Factory(dict)
    due_jobs: dict[str, int] = attrs.Factory(dict)
    running_jobs: dict[str, int] = attrs.Factory(dict)
    paused_objects: dict[str, int] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class ObjectCounts:
    """One object's share of ``JobTotals`` (due: waiting to run, not running);
    ``next_due``: the earliest job not due at the time counted (the counts hold until
    then while the database is unchanged)."""

    dead_letters: int = 0
    due_jobs: int = 0
    running_jobs: int = 0
    paused: tuple[str | None, ...] = ()  # paused owners (None: the whole object)
    next_due: float | None = None
    jobs: int = 0
    failing_jobs: int = 0  # jobs with failed attempts (kept in nj_attempts), to retry
    crash_strikes: int | None = None  # jobs with a crash strike (None: not counted)
    max_attempts: int = 0  # the most failed attempts of a job (as kept in nj_attempts)
    breaker_strikes: int = 0
    state: State | None = None  # as read (None: not opened)
    problem: str | None = None


@attrs.frozen(kw_only=True)
class FoundLetter:
    """A dead letter and the object that holds it."""

    namespace: str
    object_id: str
    letter: DeadLetterInfo


@attrs.frozen(kw_only=True)
class LetterPage:
    """One page of the dead letters of every object, newest first."""

    letters: list[FoundLetter]
    total: int
    offset: int
    limit: int


@attrs.frozen(kw_only=True)
class AlarmSummary:
    objects: int
    alarms: int
    due: int
    next_alarm: float | None


class DataSource(Protocol):
    """What the operator's faces read. Every method is synchronous and cheap: nothing
    here opens more object databases than the objects it is asked about."""

    @property
    def label(self) -> str: ...
    @property
    def live(self) -> bool: ...
    def namespaces(self) -> list[tuple[str, int]]: ...
    def alarm_summary(self, now: float) -> AlarmSummary: ...
    def objects(
        self, *, namespace: str | None = None, search: str | None = None,
        only: Literal["all", "active", "due"] = "all", now: float = 0.0,
        offset: int = 0, limit: int = 50,
    ) -> ObjectPage: ...
    def summary(self, row: ObjectRow, now: float) -> ObjectSummary: ...
    def detail(
        self, namespace: str, object_id: str, now: float, *, job_limit: int | None = None,
        letter_limit: int | None = None,
    ) -> ObjectDetail | None: ...
    def job_totals(self, now: float) -> JobTotals: ...
    def object_counts(self, now: float, *, strikes: bool = False,
                      ) -> dict[tuple[str, str], ObjectCounts]: ...
    def all_dead_letters(
        self, *, search: str | None = None, offset: int = 0, limit: int = 50,
        counts: dict[tuple[str, str], ObjectCounts] | None = None,
    ) -> LetterPage: ...


@runtime_checkable
class SourceAccess(Protocol):
    """Where a face reads its ``DataSource``: ``await access.read(fn)`` returns
    ``fn(source)``, called where the source's reads may block — so ``fn`` reads the
    source only, never a runtime's live state (read that before, on the Trio thread)."""

    @property
    def label(self) -> str: ...

    async def read(self, fn: Callable[[DataSource], T]) -> T: ...


class Inline:
    """A ``SourceAccess`` to a source read on the Trio thread (SQLite: each read takes
    microseconds, and runs between the runtime's statements)."""

    def __init__(self, source: DataSource) -> None:
        self.source = source

    @property
    def label(self) -> str:
        return self.source.label

    async def read(self, fn: Callable[[DataSource], T]) -> T:
        """``fn(source)``, on the Trio thread. Checkpoints."""
        await trio.lowlevel.checkpoint()
        return fn(self.source)


def is_postgres_address(text: str) -> bool:
    """Whether a location is a ``postgresql://`` (or ``postgres://``) address."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in ("postgresql", "postgres")
