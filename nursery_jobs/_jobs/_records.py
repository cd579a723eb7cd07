"""Job records, retry options, outcomes, and the validation of job arguments."""

from __future__ import annotations

import datetime
import enum
import functools
import itertools
import math
import uuid
from typing import Any, Final, Literal

import attrs

from nursery_jobs import _clock, _codec
from nursery_jobs._errors import JobError, JobOwnershipError
from nursery_jobs._names import MAX_NAME_LENGTH, check_name
from nursery_jobs._policy import (
    DEFAULT_RETRY,
    RetryOptions,
    is_finite,
)

HOST: Final = "host"
MAX_JOB_ID_LENGTH: Final = MAX_NAME_LENGTH




@attrs.frozen(kw_only=True, slots=False)  # (a __dict__: rows become Jobs fast, _job_table)
class Job:
    """A job as stored: who owns it, what to run, when, and how."""

    id: str
    owner: str
    fn: str
    time: float
    payload: Any
    retry: RetryOptions
    singleflight: bool
    hung_timeout: float
    exclusive: bool
    recovery_loop: bool
    created_at: float
    priority: int = 0
    """Among due jobs, a higher priority runs first (the Queue's ``priority``)."""
    timeout: float | None = None
    """A run still going after this many seconds is cancelled: a failed attempt
    (``JobTimeoutError``)."""


@attrs.frozen(kw_only=True, slots=False)  # (attrs builds a __dict__ class's faster: one per run)
class JobContext:
    """Passed to ``on_job``: the job and which attempt this is (1-based, durable)."""

    job: Job
    attempt: int


_new_object = object.__new__


def checked_job(
    id: str, owner: str, fn: str, time: float, payload: Any, retry: RetryOptions,
    singleflight: bool, hung_timeout: float, exclusive: bool, recovery_loop: bool,
    created_at: float, priority: int, timeout: float | None = None,
) -> Job:
    """A ``Job`` of fields already checked (by a push's argument checks, or read back
    from our own table), built without attrs' frozen ``__init__``: one
    ``object.__setattr__`` per field cost ~1 µs on the push and dispatch paths."""
    job = _new_object(Job)
    job.__dict__.update(
        id=id, owner=owner, fn=fn, time=time, payload=payload, retry=retry,
        singleflight=singleflight, hung_timeout=hung_timeout, exclusive=exclusive,
        recovery_loop=recovery_loop, created_at=created_at, priority=priority,
        timeout=timeout,
    )
    return job


def job_context(job: Job, attempt: int) -> JobContext:
    """A run's ``JobContext``, built without attrs' frozen ``__init__`` (one
    ``object.__setattr__`` per field: 0.86 -> 0.35 µs, on the dispatch path)."""
    ctx = _new_object(JobContext)
    fields = ctx.__dict__
    fields["job"] = job
    fields["attempt"] = attempt
    return ctx


@attrs.frozen(kw_only=True)
class DeadLetter:
    """A job that ended without success: spent retries, or sealed by the breaker."""

    job: Job
    error: str
    attempts: int
    reason: str
    time: float


def _reschedule_time(value: float | datetime.datetime) -> float:
    try:
        return _clock.coerce_time(value, name="Reschedule.time")
    except (TypeError, ValueError) as exc:
        raise JobError(str(exc)) from None


@attrs.frozen
class Reschedule:
    """Outcome: keep the job and run it again at ``time`` (epoch seconds or aware
    datetime)."""

    time: float = attrs.field(converter=_reschedule_time)


class _Yield(enum.Enum):
    YIELD = "yield"

    def __repr__(self) -> str:
        return "nj.YIELD"


YIELD: Final = _Yield.YIELD
"""Outcome: the job stays due and the object wakes again at once (after other due jobs)."""

JobOutcome = Reschedule | _Yield | None

# Stub calls return these (DESIGN section 2: a call's result goes through the codec).
# (RetryOptions is defined on the ground floor, beside the codec, which it cannot import.)
for _record in (RetryOptions, Job, JobContext, DeadLetter, Reschedule):
    _codec.register_record(_record, _record.__name__)
del _record
MAX_PRIORITY: Final = 1000

# Column order of every SELECT that builds a JobRow.
CompletionKind = Literal["done", "retime", "retry", "bury", "drop"]


@attrs.frozen(kw_only=True)
class Completion:
    """What one run of a job comes to, as data: ``JobStore.complete`` applies it in the
    alarm run's group transaction.

    - ``done``: the job is deleted; ``retime``: it stays, due at ``time`` (a
      ``Reschedule``, or ``YIELD`` at its own time), attempts and strikes cleared;
    - ``retry``: a failed attempt with attempts left, due again at ``time``, having
      used ``attempts``; ``bury``: into the dead letters with ``error`` after
      ``attempts``; ``drop``: deleted, nobody can run it.

    ``kept``: the run's writes stand (a clean run) — or were undone (a failure, then
    ``on_job_error`` or the retry policy decided). ``marker``: when the tracked work in
    progress that a run of it started began (its running marker, ``retime`` and
    ``retry``), or None. ``started`` (wall clock) and ``seconds``: the
    failed attempt (``retry``, ``bury``), kept in the job's attempt history.
    """

    kind: CompletionKind
    kept: bool = True
    time: float = math.nan
    attempts: int = 0
    error: str = ""
    marker: float | None = None
    started: float = math.nan
    seconds: float = math.nan


# A clean run that returned None (nearly every run): one shared record, frozen, instead
# of one built per job (attrs' frozen ``__init__``, ~0.4 µs of a ~9 µs dispatch).
DONE: Final = Completion(kind="done")


def completion_of(
    job: Job, outcome: JobOutcome, *, kept: bool = True, marker: float | None = None
) -> Completion:
    """The completion an ``on_job`` (or ``on_job_error``) outcome stands for."""
    if outcome is None:
        return DONE if kept else Completion(kind="done", kept=False)
    time = outcome.time if isinstance(outcome, Reschedule) else job.time  # YIELD: its own
    return Completion(kind="retime", kept=kept, time=time, marker=marker)


def check_job_id(job_id: object, *, name: str = "id") -> str:
    if job_id.__class__ is not str or not job_id.isascii() or "\x00" in job_id or len(
            job_id) > MAX_JOB_ID_LENGTH:  # (the usual id, ASCII and short: one test each)
        check_name(job_id, f"job {name}", functools.partial(JobError, job_id=job_id),
                   max_length=MAX_JOB_ID_LENGTH)
    assert isinstance(job_id, str)
    if not job_id.strip():
        raise JobError(f"job {name} must be a non-blank string, got {job_id!r}",
                       job_id=job_id)
    return job_id


# Generated ids sort by creation: time in microseconds, a per-process counter and a
# per-process random tag. Jobs mostly complete in push order, so their deletions touch
# neighbouring pages of the id index; random UUIDs touched a new page each (measured:
# a group commit of 64 completions went from ~1 ms to ~0.2 ms).
_ID_TAG: Final = uuid.uuid4().hex[:8]
_id_counter = itertools.count()


def new_job_id(now: float) -> str:
    """A new job id for a push at epoch time ``now``."""
    return f"{int(now * 1e6):014x}{next(_id_counter) & 0xFFFFFF:06x}{_ID_TAG}"


def resolve_time(time: object, delay: object, now: float, *, job: str) -> float:
    if time is not None and delay is not None:
        raise JobError(f"job {job!r}: give time or delay, not both")
    if time is not None:
        try:
            return _clock.coerce_time(time, name=f"job {job!r}: time")
        except (TypeError, ValueError) as exc:
            raise JobError(str(exc)) from None
    if delay is not None:
        try:
            return now + _clock.coerce_delay(delay, name=f"job {job!r}: delay")
        except (TypeError, ValueError) as exc:
            raise JobError(str(exc)) from None
    return now


def check_fn(fn: object) -> str:
    """A job's fn: a name every engine can store (it is a column of the job's row)."""
    if fn.__class__ is str and fn and fn.isascii() and "\x00" not in fn:
        return fn  # (the usual fn: no call, on the push path)
    return check_name(fn, "job fn", JobError)


def check_hung_timeout(value: object, *, job: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        is_finite(value) and value >= 0
    ):
        raise JobError(f"job {job!r}: hung_timeout must be a finite number >= 0, got {value!r}")
    return float(value)


def check_timeout(value: object, *, job: str) -> float | None:
    """A run's ``timeout``: None, or a finite number of seconds > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        is_finite(value) and value > 0
    ):
        raise JobError(
            f"job {job!r}: timeout must be a finite number of seconds > 0, or None; got"
            f" {value!r}"
        )
    return float(value)


def check_retry(retry: object, *, job: str) -> RetryOptions:
    if retry is None:
        return DEFAULT_RETRY
    if not isinstance(retry, RetryOptions):
        raise JobError(f"job {job!r}: retry must be RetryOptions, got {retry!r}")
    return retry


def coerce_outcome(outcome: object) -> JobOutcome:
    """Return a valid outcome or raise ``JobError`` naming what was returned."""
    if outcome is None or outcome is YIELD or isinstance(outcome, Reschedule):
        return outcome
    raise JobError(f"invalid job outcome {outcome!r}: return None, nj.Reschedule(time) or nj.YIELD")


def ownership_error(owner: str, holder: str, job_id: str) -> JobOwnershipError:
    return JobOwnershipError(
        f"job id {job_id!r} already belongs to {holder!r}; {owner!r} cannot push, replace"
        " or cancel it (job ids are scoped to their owner)",
        job_id=job_id, owner=owner, holder=holder,
    )


def check_before(before: object) -> float | None:
    """A ``before=`` cutoff: None, epoch seconds or an aware datetime."""
    if before is None:
        return None
    try:
        return _clock.coerce_time(before, name="before")
    except (TypeError, ValueError) as exc:
        raise JobError(str(exc)) from None


def check_priority(priority: object, *, job: str) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
        -MAX_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise JobError(
            f"job {job!r}: priority must be an int in [-{MAX_PRIORITY}, {MAX_PRIORITY}],"
            f" got {priority!r}"
        )
    return priority
