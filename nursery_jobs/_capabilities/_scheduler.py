"""The Scheduler capability: one-shot, cron and interval schedules, each one job.

Recurring schedules without a caller id get an id derived from their content, so
calling ``every()`` in ``on_start`` on every activation finds the same row (and keeps
its anchor) instead of piling up new ones. An interval fires on its grid, ``anchor +
k·seconds``; a cron expression is matched by ``cronsim`` against the wall clock of its
IANA zone (UTC by default), and each wall time found is placed in that zone by the
daylight-saving rules of DESIGN section 4 (``_slots``). With ``missed="skip"`` a
recurring schedule drops the slots it missed instead of running one catch-up.
"""

from __future__ import annotations

import builtins
import datetime
import hashlib
import logging
import zoneinfo
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import attrs

from nursery_jobs import _clock, _codec
from nursery_jobs._capabilities._queue import call_callback
from nursery_jobs._capabilities._slots import (
    DEFAULT_TZ,
    check_cron,
    check_tz,
    next_cron_time,
    next_grid_slot,
)
from nursery_jobs._codec import content_text
from nursery_jobs._errors import JobError, UnknownCallbackError, safe_repr
from nursery_jobs._jobs._capability import CallbackCapability
from nursery_jobs._jobs._records import (
    DeadLetter,
    Job,
    JobContext,
    JobOutcome,
    Reschedule,
    check_job_id,
    new_job_id,
)
from nursery_jobs._jobs._steering import Cancelled
from nursery_jobs._jobs._views import cancel_jobs
from nursery_jobs._policy import RetryOptions, is_finite

logger = logging.getLogger("nursery_jobs")

Kind = Literal["delayed", "scheduled", "cron", "interval"]
When = float | int | datetime.timedelta | datetime.datetime | str
# What a recurring schedule does with the slots it missed (down, or overrun): run one
# catch-up for all of them, or drop them and run at the first slot after now.
Missed = Literal["coalesce", "skip"]
# With missed="skip", a slot that has not started this long after its time (or by the
# time the next slot is due) was missed. Lateness within a running runtime (a job ahead
# of it in the same alarm, a claim poll) stays below it and is no reason to drop a run;
# a stop and start of the process is longer.
MISSED_GRACE: Final = 5.0


@attrs.frozen(kw_only=True)
class Schedule:
    """A stored schedule: what to call, and when it is next due.

    An interval schedule runs on the grid ``anchor + k·interval`` (k >= 1), where
    ``anchor`` is when ``every()`` created it; other kinds have no anchor. ``tz`` is the
    IANA zone whose wall clock a cron string is read in (``"UTC"`` for other kinds);
    ``missed`` what a recurring schedule does with missed slots (``"coalesce"`` or
    ``"skip"``).
    """

    id: str
    callback: str
    payload: Any
    kind: Kind
    time: float
    cron: str | None
    interval: float | None
    anchor: float | None
    created_at: float
    retry: RetryOptions
    tz: str = DEFAULT_TZ
    missed: Missed = "coalesce"


_codec.register_record(Schedule, "Schedule")  # (a stub call may return it)


def schedule_of(job: Job) -> Schedule:
    envelope = job.payload
    anchor: float | None = None
    if envelope["k"] == "interval":
        # Rows stored before anchors existed: the grid starts at their creation.
        anchor = envelope.get("a", job.created_at)
    return Schedule(
        id=job.id, callback=job.fn, payload=envelope["p"], kind=envelope["k"], time=job.time,
        cron=envelope.get("c"), interval=envelope.get("i"), anchor=anchor,
        created_at=job.created_at, retry=job.retry,
        # Rows stored before zones and missed policies: UTC, coalesce.
        tz=envelope.get("z", DEFAULT_TZ), missed=envelope.get("m", "coalesce"),
    )


# The shortest interval every() takes: shorter would spin the object (and below the
# float spacing of epoch times, ~2e-7 s, anchor + seconds == anchor: a slot never ahead).
MIN_INTERVAL: Final = 0.001


def _check_idempotent(value: object) -> bool:
    if not isinstance(value, bool):
        raise JobError(f"idempotent must be None or a bool, got {value!r}")
    return value


_MISSED: Final[dict[str, Missed]] = {"coalesce": "coalesce", "skip": "skip"}


def check_missed(missed: object) -> Missed:
    if not isinstance(missed, str) or missed not in _MISSED:
        raise JobError(f"missed must be 'coalesce' or 'skip', got {safe_repr(missed)}")
    return _MISSED[missed]


def _slot_after(schedule: Schedule, after: float, ran: float | None = None) -> float | None:
    """The first slot of a recurring ``schedule`` strictly after ``after`` (``ran``:
    the slot whose run it follows, if any); None for a one-shot."""
    if schedule.kind == "interval":
        assert schedule.interval is not None and schedule.anchor is not None
        return next_grid_slot(schedule.anchor, schedule.interval, after)
    if schedule.kind == "cron":
        assert schedule.cron is not None
        return next_cron_time(schedule.cron, after, schedule.tz, ran=ran)
    return None


class Scheduler(CallbackCapability):
    """``Scheduler(callbacks={name: fn}, retry=None, on_error=None, id="scheduler")``.

    ``fn(payload, schedule)`` may be sync or async.
    """

    kind = "Scheduler"

    def __init__(
        self,
        callbacks: Mapping[str, Callable[[Any, Schedule], Any]],
        *,
        retry: RetryOptions | None = None,
        on_error: Callable[[Exception, Schedule], Any] | None = None,
        id: str = "scheduler",
    ) -> None:
        super().__init__(callbacks, retry=retry, on_error=on_error, id=id)

    # -- the API ------------------------------------------------------------------------
    async def schedule(
        self,
        when: When,
        callback: str,
        payload: Any = None,
        *,
        id: str | None = None,
        retry: RetryOptions | None = None,
        idempotent: bool | None = None,
        tz: str | zoneinfo.ZoneInfo | None = None,
        missed: Missed = "coalesce",
    ) -> Schedule:
        """Schedule ``callback`` at ``when``: a delay in seconds, a ``timedelta``, an
        aware ``datetime``, or a 5-field cron string. Checkpoints.

        A cron string is read in IANA zone ``tz`` (default UTC) and follows its
        daylight-saving changes: ``"0 9 * * *"`` fires at 09:00 local time on both
        sides of a change; a local time that does not exist that day fires at the next
        existing minute, one that occurs twice fires once (at the first; at the second
        for a schedule made between them). ``missed="skip"`` (cron
        only) drops the slots missed while the process was down instead of running one
        catch-up (``"coalesce"``): the next run is the first slot after now.

        With ``id`` it is an upsert (a cron schedule whose content is unchanged keeps
        its next time). Without one, a cron schedule is idempotent by content —
        callback, payload, cron, zone and missed policy — (``idempotent=False`` opts
        out); a one-shot dedupes only with ``idempotent=True`` (not against itself
        while it runs). A dedupe hit returns the stored schedule and re-arms.

        Raises:
            JobError: a bad ``when``, ``tz`` or ``missed`` (``tz`` and
                ``missed="skip"`` with a one-shot too); nothing is written.
            UnknownCallbackError: ``callback`` is not registered.
        """
        now = _clock.fresh_now()  # a delay counts from the wall clock as it is now
        missed = check_missed(missed)
        cron: str | None = None
        kind: Kind
        if isinstance(when, str):
            cron = check_cron(when)
            zone = DEFAULT_TZ if tz is None else check_tz(tz)
            kind, time = "cron", next_cron_time(cron, now, zone)
        else:
            if tz is not None:
                raise JobError(
                    f"tz applies to a cron string only (its wall clock); when={safe_repr(when)}"
                    " is a moment already: drop tz, or pass an aware datetime in that zone"
                )
            if missed != "coalesce":
                raise JobError(
                    f"missed={missed!r} applies to recurring schedules (a cron string, or"
                    f" every()); when={safe_repr(when)} is a one-shot, which runs late"
                    " rather than never"
                )
            zone = DEFAULT_TZ
            if isinstance(when, datetime.datetime):
                try:
                    time = _clock.coerce_time(when, name="schedule when")
                except (TypeError, ValueError) as exc:
                    raise JobError(str(exc)) from None
                kind = "scheduled"
            else:
                try:
                    time = now + _clock.coerce_delay(when, name="schedule when")
                except (TypeError, ValueError) as exc:
                    raise JobError(str(exc)) from None
                kind = "delayed"
        recurring = kind == "cron"
        dedupe = recurring if idempotent is None else _check_idempotent(idempotent)
        return await self._upsert(kind, time, callback, payload, id=id, retry=retry,
                                  dedupe=dedupe, cron=cron, interval=None, tz=zone,
                                  missed=missed)

    async def every(
        self,
        seconds: float | datetime.timedelta,
        callback: str,
        payload: Any = None,
        *,
        id: str | None = None,
        retry: RetryOptions | None = None,
        idempotent: bool | None = None,
        missed: Missed = "coalesce",
    ) -> Schedule:
        """Run ``callback`` every ``seconds`` (> 0) on the grid ``anchor + k·seconds``,
        where the anchor is now: first at now + seconds. After a run, the next is the
        first grid slot after the moment it ended, so lateness and run time never shift
        later runs; slots missed while the process was down, or while a run overran,
        coalesce into one run — or, with ``missed="skip"``, are dropped: the next run
        is the first slot after now. Idempotent by content (callback, payload,
        interval, missed policy) unless ``idempotent=False``: a dedupe hit keeps the
        stored schedule, anchor included. With ``id`` it is an upsert: anchored anew
        when its content changed, kept (anchor included) when not. Checkpoints."""
        missed = check_missed(missed)
        if isinstance(seconds, datetime.timedelta):
            seconds = seconds.total_seconds()
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            is_finite(seconds) and seconds >= MIN_INTERVAL
        ):
            raise JobError(
                f"every(): seconds must be a finite number >= {MIN_INTERVAL}, got {seconds!r}"
            )
        interval = float(seconds)
        dedupe = True if idempotent is None else _check_idempotent(idempotent)
        anchor = _clock.fresh_now()
        return await self._upsert("interval", anchor + interval, callback, payload, id=id,
                                  retry=retry, dedupe=dedupe, cron=None, interval=interval,
                                  anchor=anchor, tz=DEFAULT_TZ, missed=missed)

    async def _upsert(
        self, kind: Kind, time: float, callback: str, payload: Any, *, id: str | None,
        retry: RetryOptions | None, dedupe: bool, cron: str | None, interval: float | None,
        tz: str, missed: Missed, anchor: float | None = None,
    ) -> Schedule:
        if not isinstance(callback, str):
            raise JobError(f"schedule callback must be a str (its name), got {callback!r}")
        if callback not in self.callbacks:
            raise UnknownCallbackError(
                f"unknown schedule callback {callback!r}: not registered on Scheduler"
                f" {self.id!r} (registered: {sorted(self.callbacks)})"
            )
        if retry is not None and not isinstance(retry, RetryOptions):
            raise JobError(f"schedule retry must be RetryOptions, got {retry!r}")
        envelope: dict[str, Any] = {"p": payload, "k": kind}
        if cron is not None:
            envelope["c"] = cron
        if interval is not None:
            envelope["i"] = interval
        if anchor is not None:
            envelope["a"] = anchor
        # Only what differs from the defaults is stored (rows from before the options
        # read as the defaults), and only that enters the content id (schedules without
        # the options keep the ids they had before them).
        options: dict[str, str] = {}
        if tz != DEFAULT_TZ:
            envelope["z"] = options["tz"] = tz
        if missed != "coalesce":
            envelope["m"] = options["missed"] = missed
        jobs = self.lifecycle.jobs
        if id is not None:
            job_id = check_job_id(id)
            existing = jobs.get(job_id)
            if (existing is not None and kind in ("cron", "interval")
                    and self._same(existing, kind, callback, cron, interval, payload, retry,
                                   tz, missed)):
                # Unchanged (on_start registering it on each activation): it keeps its
                # next time and anchor. Re-timed, the slot that is due now — the one whose
                # alarm activated the object — would be skipped, every time.
                await jobs.rearm()
                return schedule_of(existing)
        elif dedupe:
            # The content (not the time, nor the anchor) names the schedule: a second
            # identical call finds the first row and leaves it, its grid included.
            # content_text also refuses a bad payload here.
            # content_text: equal payloads give one text, whatever their dicts' order or
            # the hash seed of their sets (which differs from process to process).
            content = content_text([kind, callback, cron, interval, payload]
                                   + ([options] if options else []))
            job_id = "sched:" + hashlib.sha256(
                content.encode("utf-8", "surrogatepass")).hexdigest()[:32]
            existing = jobs.get(job_id)
            if existing is not None and not self._running(job_id, kind):
                await jobs.rearm()  # a dedupe hit still re-arms the alarm
                return schedule_of(existing)
        else:
            job_id = "sched:" + new_job_id(_clock.now())
        job = await jobs.push(
            callback, time=time, payload=envelope, id=job_id, retry=retry or self.retry,
            singleflight=kind == "interval",
        )
        schedule = schedule_of(job)
        self.lifecycle.emit("schedule:create", callback=callback, id=schedule.id)
        return schedule

    def _same(
        self, job: Job, kind: Kind, callback: str, cron: str | None, interval: float | None,
        payload: Any, retry: RetryOptions | None, tz: str, missed: Missed,
    ) -> bool:
        """Whether stored ``job`` is the schedule these arguments describe."""
        stored = schedule_of(job)
        return (stored.kind == kind and stored.callback == callback and stored.cron == cron
                and stored.interval == interval and stored.retry == (retry or self.retry)
                and stored.tz == tz and stored.missed == missed
                and content_text(stored.payload) == content_text(payload))

    def _running(self, job_id: str, kind: Kind) -> bool:
        """Whether ``job_id`` is a one-shot running now: its row goes when the run ends,
        so scheduling it again from its own callback is a new run, not a dedupe hit."""
        running = self.running
        return (kind in ("delayed", "scheduled") and running is not None
                and running.job.id == job_id)

    def get(self, id: str) -> Schedule | None:
        """Return schedule ``id``, or None. Does not checkpoint."""
        job = self.lifecycle.jobs.get(id)
        return None if job is None else schedule_of(job)

    def list(self) -> list[Schedule]:
        """Return every schedule, by next due time."""
        return [schedule_of(job) for job in self.lifecycle.jobs.list()]

    # -- dead letters ---------------------------------------------------------------
    def dead_letters(self) -> builtins.list[DeadLetter]:  # (list: the method above)
        """Schedules whose retries ran out, oldest first."""
        return self.lifecycle.dead_letters()

    async def requeue(self, id: str) -> Job | None:
        """Run dead letter ``id`` again, due now, with fresh attempts."""
        return await self.lifecycle.requeue(id)

    async def discard(self, id: str) -> bool:
        """Delete dead letter ``id``; return whether it existed. Checkpoints."""
        return await self.lifecycle.discard(id)

    async def discard_dead_letters(self, *, before: Any = None) -> int:
        """Delete the dead letters buried before ``before`` (None: all)."""
        return await self.lifecycle.discard_dead_letters(before=before)

    async def cancel(self, id: str) -> bool:
        """Delete schedule ``id``; return whether it existed. A run of it in progress is
        cancelled as ``jobs.cancel`` cancels one: at once where no turn is held (an
        ``@nj.interleave`` method). Checkpoints."""
        cancelled = await cancel_jobs(self.lifecycle.jobs, id=id)
        schedules_cancelled(self, cancelled)
        return bool(cancelled)

    # -- the capability hooks -----------------------------------------------------------
    def _next(self, schedule: Schedule, ran: float) -> JobOutcome:
        """The outcome of a finished run of slot ``ran``: the first slot after now, or
        done."""
        time = _slot_after(schedule, _clock.now(), ran)
        return None if time is None else Reschedule(time)

    def _skip(self, ctx: JobContext, schedule: Schedule) -> Reschedule | None:
        """With ``missed="skip"``, the outcome for a slot that was missed (not started
        within ``MISSED_GRACE`` of its time, or not before the next slot came due):
        the first slot after now, with no run. None for a slot to run. Retries (attempt
        2 on) are never skipped: their slot has started."""
        if schedule.missed != "skip" or ctx.attempt != 1:
            return None
        slot, now = ctx.job.time, _clock.now()
        following = _slot_after(schedule, slot)
        if following is None or (now <= slot + MISSED_GRACE and now < following):
            return None
        time = _slot_after(schedule, now, slot)
        assert time is not None
        self.lifecycle.emit("schedule:skip", callback=schedule.callback, id=schedule.id,
                            slot=slot, next=time)
        return Reschedule(time)

    async def on_job(self, ctx: JobContext) -> JobOutcome:
        schedule = schedule_of(ctx.job)
        skipped = self._skip(ctx, schedule)
        if skipped is not None:
            return skipped
        if ctx.attempt == 1:
            self.lifecycle.emit("schedule:execute", callback=schedule.callback, id=schedule.id)
        else:
            self.lifecycle.emit("schedule:retry", callback=schedule.callback, id=schedule.id,
                                attempt=ctx.attempt, max_attempts=schedule.retry.max_attempts)
        fn = self.callbacks.get(schedule.callback)
        if fn is None:
            raise UnknownCallbackError(
                f"schedule callback {schedule.callback!r} of {schedule.id!r} is no longer"
                " registered"
            )
        self.running = ctx
        try:
            await call_callback(fn, schedule.payload, schedule)
        finally:
            self.running = None
        return self._next(schedule, ctx.job.time)

    async def on_job_error(self, ctx: JobContext, error: Exception) -> JobOutcome:
        schedule = schedule_of(ctx.job)
        self.lifecycle.emit("schedule:error", callback=schedule.callback, id=schedule.id,
                            error=safe_repr(error), attempts=ctx.attempt)
        if self.on_error is not None:
            self.running = ctx
            try:
                await call_callback(self.on_error, error, schedule)
            except Exception:
                logger.exception("on_error of Scheduler %r failed for %r", self.id, schedule.id)
            finally:
                self.running = None
        # A recurring schedule goes on; a one-shot becomes a dead letter.
        return self._next(schedule, ctx.job.time)


def schedules_cancelled(scheduler: Scheduler, jobs: list[Cancelled]) -> None:
    """Tell of the schedules of ``scheduler`` among ``jobs``, just cancelled
    (``schedule:cancel``). Does not checkpoint."""
    for job in jobs:
        if job.owner == scheduler.id:
            scheduler.lifecycle.emit("schedule:cancel", callback=job.fn, id=job.id)
