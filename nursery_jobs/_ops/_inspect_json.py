"""The JSON shape of what ``_inspect`` reads: ``nursery-jobs inspect --json`` and the
dashboard's ``/api`` print the same records, and ``printable`` escapes ids for text."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Generator
from typing import Any, Final, Literal, cast

import attrs

from nursery_jobs._ops._inspect import (
    DataSource,
    DeadLetterInfo,
    JobInfo,
    ObjectDetail,
    ObjectSummary,
)
from nursery_jobs._ops._words import is_schedule, schedule_words

PREVIEW_CHARS: Final = 200  # characters of a payload shown in a report


# -- the JSON shape (``inspect --json`` and ``/api``) ----------------------------------------
class _Preview(reprlib.Repr):
    """``repr`` that never raises and whose work is bounded: an int past Python's
    int-to-str limit (a payload the codec round-trips, DESIGN 5) is shown by its size,
    and a container lists only what a preview can show. Any value whose repr fits a
    preview is shown as ``repr`` shows it."""

    def __init__(self) -> None:
        super().__init__()
        # (Each element takes 3 characters or more: a preview never shows more.)
        shown = PREVIEW_CHARS // 3
        self.maxlevel = 8
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = shown
        self.maxfrozenset = self.maxdeque = self.maxarray = shown
        self.maxstring = self.maxlong = self.maxother = PREVIEW_CHARS

    def repr_str(self, x: str, level: int) -> str:
        # (A head, as repr shows it: longer than any preview, so it is cut with "…".)
        return repr(x[:PREVIEW_CHARS + 1])

    def repr_int(self, x: int, level: int) -> str:
        digits = int(abs(x).bit_length() * _LOG10_2) + 1
        if digits <= PREVIEW_CHARS:
            return repr(x)
        return f"<int of ~{digits:,} digits>"


_LOG10_2: Final = math.log10(2)
_PREVIEW: Final = _Preview()


def preview(value: Any) -> str | None:
    if value is None:
        return None
    text = _PREVIEW.repr(value)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"


def job_json(job: JobInfo) -> dict[str, Any]:
    return {
        "id": job.id, "owner": job.owner, "fn": job.fn, "time": job.time,
        "priority": job.priority, "attempts": job.attempts, "max_attempts": job.max_attempts,
        "running": job.running, "running_since": job.running_since,
        "crash_strikes": job.crash_strikes, "created_at": job.created_at,
        "exclusive": job.exclusive, "singleflight": job.singleflight, "timeout": job.timeout,
        "payload": preview(job.payload["p"] if is_schedule(job.payload) else job.payload),
        "schedule": schedule_words(job.payload, job.time),  # (a Scheduler's, in words)
    }


def dead_letter_json(letter: DeadLetterInfo) -> dict[str, Any]:
    return {
        "owner": letter.owner, "id": letter.id, "fn": letter.fn, "error": letter.error,
        "attempts": letter.attempts, "reason": letter.reason, "time": letter.time,
        "payload": preview(letter.payload),
    }


def summary_json(summary: ObjectSummary) -> dict[str, Any]:
    row = summary.row
    return {
        "namespace": row.namespace, "id": row.id, "state": summary.state,
        "problem": summary.problem, "alarm": row.alarm, "alarm_retry": row.alarm_retry,
        "created_at": row.created_at, "lifecycle": summary.lifecycle,
        "counts": {"jobs": summary.jobs, "due": summary.due, "running": summary.running,
                   "dead_letters": summary.dead_letters},
        "max_attempts": summary.max_attempts, "breaker_strikes": summary.breaker_strikes,
        "paused": list(summary.paused),
    }


def detail_json(detail: ObjectDetail) -> dict[str, Any]:
    entry = summary_json(detail.summary)
    entry["jobs"] = [job_json(job) for job in detail.jobs]
    entry["dead_letters"] = [dead_letter_json(letter) for letter in detail.dead_letters]
    # Each job's and dead letter's recent failed attempts (oldest first).
    for item in (*entry["jobs"], *entry["dead_letters"]):
        item["failures"] = [attrs.asdict(a) for a in
                            detail.attempts.get((item["owner"], item["id"]), [])]
    return entry


def report_json(
    source: DataSource, now: float, *, namespace: str | None = None,
    search: str | None = None, only: Literal["all", "active", "due"] = "all",
    offset: int = 0, limit: int = 50, job_limit: int | None = None,
    letter_limit: int | None = None,
) -> dict[str, Any]:
    """A page of objects with their jobs and dead letters: what ``inspect --json``
    prints (every object) and ``/api/objects`` answers (a page)."""
    steps = report_steps(source, now, namespace=namespace, search=search, only=only,
                         offset=offset, limit=limit, job_limit=job_limit,
                         letter_limit=letter_limit)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return cast("dict[str, Any]", done.value)


def report_steps(
    source: DataSource, now: float, *, namespace: str | None = None,
    search: str | None = None, only: Literal["all", "active", "due"] = "all",
    offset: int = 0, limit: int = 50, job_limit: int | None = None,
    letter_limit: int | None = None,
) -> Generator[None, None, dict[str, Any]]:
    """``report_json``, one object a step (a step yields; the report is returned):
    ``Sliced.stepwise`` runs the steps in slices."""
    page = source.objects(namespace=namespace, search=search, only=only, now=now,
                          offset=offset, limit=limit)
    objects = []
    for row in page.objects:
        detail = source.detail(row.namespace, row.id, now, job_limit=job_limit,
                               letter_limit=letter_limit)
        if detail is not None:
            objects.append(detail_json(detail))
        yield
    return {"source": source.label, "live": source.live, "now": now, "total": page.total,
            "offset": page.offset, "limit": page.limit, "objects": objects}


def printable(text: str, *, backslashes: bool = True) -> str:
    """``text`` with control and other unprintable characters (and backslashes, unless
    ``backslashes`` is false: text that is a ``repr`` already) escaped, so an id or an
    error message cannot forge lines on a terminal."""
    if text.isprintable() and ("\\" not in text or not backslashes):
        return text
    out = []
    for ch in text:
        if ch == "\\" and backslashes:
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)
