"""An object's page, its tables: each job's state in words (due in / due ago, running for
how long and which attempt, paused), Scheduler jobs as their schedule in words, and each
failed job's (and dead letter's) recent attempts; and the object a request names
(``object_key``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from nursery_jobs._engines.files._catalog import MAX_OBJECT_ID_LENGTH, check_object_id
from nursery_jobs._errors import HttpError, ObjectIdError
from nursery_jobs._ops._inspect_json import preview
from nursery_jobs._ops._web_html import esc, when
from nursery_jobs._ops._words import is_schedule, schedule_words, span

if TYPE_CHECKING:
    from nursery_jobs._ops._inspect import AttemptInfo, DeadLetterInfo, JobInfo, ObjectDetail


def object_key(fields: Mapping[str, str], missing: str) -> tuple[str, str]:
    """The (namespace, object id) a page's query or an action's form names (``ns`` or
    ``namespace``, ``id``), checked as the runtime checks ids: a 400 for one that is
    missing (``missing`` says what to give), empty, too long or holds a NUL — before
    any source is read or any object looked for."""
    namespace, object_id = fields.get("ns") or fields.get("namespace"), fields.get("id")
    if not namespace or not object_id:
        raise HttpError(400, missing)
    if len(namespace) > MAX_OBJECT_ID_LENGTH:
        raise HttpError(400, f"namespace {namespace[:40]!r}... is {len(namespace)}"
                             f" characters; the limit is {MAX_OBJECT_ID_LENGTH}")
    if "\x00" in namespace:
        raise HttpError(400, f"namespace {namespace!r} holds a NUL character")
    try:
        check_object_id(object_id)
    except ObjectIdError as exc:
        raise HttpError(400, str(exc)) from None
    return namespace, object_id


def job_state(job: JobInfo, now: float, *, paused: bool) -> str:
    """What a job is doing now, in words (HTML)."""
    attempt = job.attempts + 1
    if job.running:
        took = (f" {span(now - job.running_since)}" if job.running_since is not None
                else "")
        return (f'<span class="badge b-active">running{took}</span>'
                f' <span class="muted">attempt {attempt} of {job.max_attempts}</span>')
    if paused:
        return '<span class="badge b-due">paused</span>'
    if job.time <= now:
        late = now - job.time
        text = "due now" if late < 0.5 else f"due {span(late)} ago"
        state = f'<span class="badge b-due">{text}</span>'
    else:
        state = f"due in {span(job.time - now)}"
    if job.attempts:
        state += f' <span class="muted">· retry: attempt {attempt} of {job.max_attempts}</span>'
    return f'<span title="{esc(job.time)}">{state}</span>'


def attempts_table(attempts: list[AttemptInfo], now: float) -> str:
    """A job's recent failed attempts, newest first."""
    rows = "".join(
        f"<tr><td class=num>#{a.attempt}</td><td>{when(a.started, now)}</td>"
        f"<td class=num>{esc(span(a.seconds))}</td><td class=err>{esc(a.error)}</td></tr>"
        for a in reversed(attempts)
    )
    return (f'<table class="attempts"><thead><tr><th class=num>attempt</th><th>started</th>'
            f"<th class=num>took</th><th>error</th></tr></thead><tbody>{rows}</tbody></table>")


def jobs_section(detail: ObjectDetail, now: float) -> str:
    paused = detail.summary.paused
    rows: list[str] = []
    schedules: list[str] = []
    for job in detail.jobs:
        failures = detail.attempts.get((job.owner, job.id), [])
        flags = " ".join(f'<span class="badge">{name}</span>'
                         for name in ("exclusive", "singleflight") if getattr(job, name))
        if job.timeout is not None:
            flags += f' <span class="badge">timeout {job.timeout:g} s</span>'
        if job.crash_strikes:
            flags += f' <span class="badge b-dead">{job.crash_strikes} crash strike(s)</span>'
        priority = "" if job.priority is None else str(job.priority)
        words = schedule_words(job.payload, job.time, now)
        payload = job.payload["p"] if is_schedule(job.payload) else job.payload
        what = (f"<td>{esc(words)}</td>" if words is not None
                else f"<td class=mono>{esc(preview(payload) or '')}</td>")
        row = (
            f"<tr><td class=mono>{esc(job.owner)}</td><td class=mono>{esc(job.id)}</td>"
            f"<td class=mono>{esc(job.fn)}</td>"
            f"<td>{job_state(job, now, paused=None in paused or job.owner in paused)}</td>"
            f"<td class=num>{priority}</td><td class=num>{job.attempts} /"
            f" {job.max_attempts}</td><td>{flags}</td>{what}</tr>"
        )
        if failures:
            row += (f'<tr class="sub"><td></td><td colspan=7>'
                    f"{attempts_table(failures, now)}</td></tr>")
        (schedules if words is not None else rows).append(row)
    head = ("<table><thead><tr><th>owner</th><th>id</th><th>fn</th><th>state</th>"
            "<th class=num>priority</th><th class=num>failed / max</th><th>flags</th>")
    out = []
    if schedules:
        out.append(f"<section><h2>Schedules</h2>{head}<th>schedule</th></tr></thead>"
                   f'<tbody>{"".join(schedules)}</tbody></table></section>')
    if not rows:
        rows.append('<tr><td colspan=8 class="muted">no queued jobs</td></tr>')
    more = ""
    if detail.summary.jobs > len(detail.jobs):
        more = (f'<p class="muted">showing the first {len(detail.jobs)} of'
                f" {detail.summary.jobs:,} jobs</p>")
    out.insert(0, f"<section><h2>Queued jobs</h2>{head}<th>payload</th></tr></thead>"
                  f'<tbody>{"".join(rows)}</tbody></table>{more}</section>')
    return "".join(out)


def letters_section(detail: ObjectDetail, now: float,
                    actions: Callable[[DeadLetterInfo], str]) -> str:
    rows = []
    for letter in detail.dead_letters:
        rows.append(
            f"<tr><td class=mono>{esc(letter.owner)}</td><td class=mono>{esc(letter.id)}"
            f"</td><td class=mono>{esc(letter.fn)}</td><td class=num>{letter.attempts}</td>"
            f"<td>{esc(letter.reason)}</td><td>{when(letter.time, now)}</td>"
            f'<td class="err">{esc(letter.error)}</td><td>{actions(letter)}</td></tr>'
        )
        failures = detail.attempts.get((letter.owner, letter.id), [])
        if failures:
            rows.append(f'<tr class="sub"><td></td><td colspan=7>'
                        f"{attempts_table(failures, now)}</td></tr>")
    if not rows:
        rows.append('<tr><td colspan=8 class="muted">no dead letters</td></tr>')
    return (
        "<section><h2>Dead letters</h2><table><thead><tr><th>owner</th><th>id</th>"
        "<th>fn</th><th class=num>attempts</th><th>reason</th><th>when</th><th>error</th>"
        f'<th></th></tr></thead><tbody>{"".join(rows)}</tbody></table></section>'
    )
