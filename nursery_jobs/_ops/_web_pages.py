"""The dashboard's HTML pages (``Pages``): the home page and an object's page, with the
summary and the object detail the ``/api`` documents share, rendered from one data
source and what a live runtime adds (``Live``); and the query parameters pages read,
bounded. The app that routes to them and serves them is ``_web``."""

from __future__ import annotations

import html
import logging
import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, cast
from urllib.parse import urlencode

import attrs

from nursery_jobs._core._metrics import MetricsSnapshot
from nursery_jobs._errors import (
    HttpError,
    UnknownObjectError,
)
from nursery_jobs._ops._inspect import (
    DataSource,
    DeadLetterInfo,
    ObjectCounts,
    ObjectDetail,
    ObjectRow,
    ObjectSummary,
)
from nursery_jobs._ops._inspect_json import printable
from nursery_jobs._ops._listing import FILTERS, SORTS, list_objects
from nursery_jobs._ops._prometheus import LiveCounters
from nursery_jobs._ops._readers import summary_of
from nursery_jobs._ops._web_charts import ChartData, charts
from nursery_jobs._ops._web_html import (
    _q,
    _state_badge,
    esc,
    page,
    paused_badge,
    when,
)
from nursery_jobs._ops._web_object import jobs_section, letters_section, object_key
from nursery_jobs._ops._words import event_value

if TYPE_CHECKING:
    from nursery_jobs._events import Event


logger = logging.getLogger("nursery_jobs.http")

Only = Literal["all", "active", "due"]
T = TypeVar("T")

PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 500
# Bounds of query parameters: a page number, an integer at all, rows of a kind.
MAX_PAGE: Final = 10**9
MAX_QUERY_INT: Final = 10**12
MAX_ROWS: Final = 10_000
OBJECT_JOB_LIMIT: Final = 500
HOME_LETTERS: Final = 10  # the newest dead letters the home page shows


@attrs.frozen(kw_only=True)
class Live:
    """What a live runtime adds to one response, read on the Trio thread before the
    page reads its source (perhaps in a worker thread, where the runtime's state must
    not be touched). Empty for a stopped data directory or ``serve``."""

    counters: dict[str, Any] | None = None
    totals: dict[str, int] | None = None
    live_counters: LiveCounters | None = None  # for /metrics
    metrics: MetricsSnapshot | None = None  # for /metrics
    events: list[Event] | None = None  # newest first; None: no recorder
    charts: ChartData | None = None


def page_args(query: dict[str, str]) -> tuple[str | None, str | None, Only, int, int]:
    only = query.get("only", "all")
    if only not in ("all", "active", "due"):
        raise HttpError(400, f"only must be all, active or due, not {only!r}")
    limit = min(max(query_int(query, "limit", PAGE_SIZE), 1), MAX_PAGE_SIZE)
    offset = min(max(query_int(query, "page", 1) - 1, 0), MAX_PAGE) * limit
    return (query.get("ns") or None, query.get("q") or None, cast(Only, only), offset,
            limit)


class Pages:
    """One response's pages, from one source (read where ``SourceAccess.read`` runs
    it) and the live state read before (``Live``)."""

    def __init__(self, source: DataSource, live: Live, *, writes: bool, token: str) -> None:
        self.source = source
        self.live = live
        self.writes = writes
        self.token = token

    def detail(self, query: dict[str, str], now: float, job_limit: int) -> ObjectDetail:
        namespace, object_id = object_key(query, "give ns and id")
        detail = self.source.detail(namespace, object_id, now, job_limit=job_limit,
                                    letter_limit=job_limit)
        if detail is None:
            raise HttpError(404, str(UnknownObjectError.absent(namespace, object_id,
                                                               self.source.label)))
        return detail

    def summary(self, now: float) -> dict[str, Any]:
        alarms = self.source.alarm_summary(now)
        out: dict[str, Any] = {
            "source": self.source.label, "live": self.source.live, "now": now,
            "objects": alarms.objects, "alarms": alarms.alarms, "alarms_due": alarms.due,
            "next_alarm": alarms.next_alarm,
        }
        if self.live.counters is not None:
            out.update(self.live.counters)
        if self.live.totals is not None:
            out["totals"] = self.live.totals
        return out

    # -- pages ----------------------------------------------------------------------------
    def dashboard(self, query: dict[str, str], now: float) -> str:
        only = query.get("only", "all")
        if only not in FILTERS:
            raise HttpError(400, f"only must be one of {', '.join(FILTERS)}, not {only!r}")
        sort = query.get("sort", "id")
        if sort not in SORTS:
            raise HttpError(400, f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
        namespace, search, _, offset, limit = page_args({**query, "only": "all"})
        source = self.source
        summary = self.summary(now)
        summary["counts"] = counts = source.object_counts(now, strikes=only == "strikes")
        listing = list_objects(source, namespace=namespace, search=search, only=only,
                               sort=sort, descending=query.get("desc") == "1", now=now,
                               offset=offset, limit=limit, counts=counts)
        # (from the counts read for the cards: no second read of the page's objects)
        summaries = [summary_of(row, counts.get((row.namespace, row.id), ObjectCounts()))
                     for row in listing.objects]
        parts = [self._cards(summary, now), self._charts(now, query)]
        parts.append(self._namespaces(namespace, only))
        parts.append(self._objects_table(listing.objects, summaries, now, query, listing.total,
                                         offset, limit))
        parts.append(self._newest_dead_letters(now, counts))
        if self.live.events is not None:
            parts.append(self._events_section(now))
        return page("dashboard", source, now, "".join(parts))

    def _cards(self, summary: dict[str, Any], now: float) -> str:
        """The header cards; each links to the objects (or letters) it counts."""
        counts: dict[tuple[str, str], ObjectCounts] = summary.get("counts", {})
        running, failing, letters, paused = _memo(self.source, "card sums", lambda: (
            sum(c.running_jobs for c in counts.values()),
            sum(c.failing_jobs for c in counts.values()),
            sum(c.dead_letters for c in counts.values()),
            sum(bool(c.paused) for c in counts.values())))
        cards: list[tuple[str, str, str | None]] = [
            ("objects", f"{summary['objects']:,}", "/")]
        if "active" in summary:
            cards.append(("active", f"{summary['active']:,}", "/?only=active"))
            cards.append(("alarm runs in flight", f"{summary['alarms_in_flight']:,}", None))
        cards += [
            ("alarms due now", f"{summary['alarms_due']:,}", "/?only=due"),
            ("running jobs", f"{running:,}", "/?only=running"),
            ("failing jobs", f"{failing:,}", "/?only=failing"),
            ("dead letters", f"{letters:,}", "/dead-letters"),
            ("paused objects", f"{paused:,}", "/?only=paused"),
            ("next alarm", when(summary["next_alarm"], now), None),
        ]
        totals = summary.get("totals")
        if totals:
            # (crash strikes: counted as they happen; the filter finds the objects — a
            # count of struck jobs now would scan every job on every page view)
            cards += [("jobs run", f"{totals['dispatched']:,}", None),
                      ("failed attempts", f"{totals['failed']:,}", None),
                      ("retries", f"{totals['retried']:,}", None),
                      ("crash strikes", f"{totals['crash_strikes']:,}", "/?only=strikes"),
                      ("breaker trips", f"{totals['breaker_trips']:,}", "/?only=strikes")]
        out = []
        for label, value, link in cards:
            card = f'<div class="n">{value}</div><div class="l">{esc(label)}</div>'
            out.append(f'<a class="card" href="{link}">{card}</a>' if link
                       else f'<div class="card">{card}</div>')
        return '<div class="cards">' + "".join(out) + "</div>"

    def _charts(self, now: float, query: dict[str, str]) -> str:
        if self.live.charts is None:
            return ('<p class="muted">Charts of dispatch rate, failures and alarm lateness'
                    " need a live runtime: <code>open_runtime(..., http=(\"127.0.0.1\","
                    " 8321))</code>.</p>")
        return charts(self.live.charts, now,
                      {k: v for k, v in query.items() if k in ("ns", "only", "q")})

    def _namespaces(self, current: str | None, only: str) -> str:
        namespaces = self.source.namespaces()
        total = sum(n for _, n in namespaces)
        chips = [f'<a class="{"on" if not current else ""}" href="/?{_q(only=only)}">all'
                 f" ({total:,})</a>"]
        for ns, n in namespaces[:50]:
            chips.append(f'<a class="{"on" if ns == current else ""}"'
                         f' href="/?{_q(ns=ns, only=only)}">{esc(ns)} ({n:,})</a>')
        if len(namespaces) > 50:
            chips.append(f'<span class="muted">… {len(namespaces) - 50} more</span>')
        return f'<section><h2>Namespaces</h2><div class="chips">{"".join(chips)}</div></section>'

    def _objects_table(
        self, rows: list[ObjectRow], summaries: list[ObjectSummary], now: float,
        query: dict[str, str], total: int, offset: int, limit: int,
    ) -> str:
        only = query.get("only", "all")
        options = "".join(
            f'<option value="{v}"{" selected" if v == only else ""}>{label}</option>'
            for v, label in FILTERS.items()
        )
        keep = "".join(f'<input type="hidden" name="{k}" value="{esc(query[k])}">'
                       for k in ("sort", "desc") if query.get(k))
        filters = (
            '<form class="filters" method="get" action="/">'
            f'<input name="ns" placeholder="namespace" value="{esc(query.get("ns", ""))}">'
            f'<input name="q" placeholder="id contains" value="{esc(query.get("q", ""))}">'
            f'<select name="only">{options}</select>{keep}'
            "<button>Filter</button></form>"
        )
        body = []
        for s in summaries:
            row = s.row
            link = f"/object?{_q(ns=row.namespace, id=row.id)}"
            due = f'<span class="badge b-due">{s.due}</span>' if s.due else "0"
            dead = (f'<span class="badge b-dead">{s.dead_letters}</span>'
                    if s.dead_letters else "0")
            problem = f'<div class="err">{esc(s.problem)}</div>' if s.problem else ""
            paused = paused_badge(s.paused)
            retry = (f' <span class="muted">(retry {row.alarm_retry})</span>'
                     if row.alarm_retry else "")
            body.append(
                f"<tr><td>{esc(row.namespace)}</td><td><a class=mono href=\"{esc(link)}\">"
                f"{esc(row.id)}</a>{problem}</td><td>{_state_badge(s.state)}{paused}</td>"
                f"<td>{when(row.alarm, now)}{retry}</td><td class=num>{s.jobs}</td>"
                f"<td class=num>{due}</td><td class=num>{s.running}</td>"
                f"<td class=num>{s.max_attempts}</td><td class=num>{dead}</td>"
                f"<td class=num>{s.breaker_strikes}</td></tr>"
            )
        if not body:
            body.append('<tr><td colspan=10 class="muted">no objects</td></tr>')
        page_no = offset // limit + 1
        pages = max(math.ceil(total / limit), 1)
        nav = []
        base = {k: v for k, v in query.items() if k != "page"}
        if page_no > 1:
            nav.append(f'<a href="/?{urlencode({**base, "page": page_no - 1})}">← previous</a>')
        nav.append(f'<span class="muted">page {page_no} of {pages:,} · {total:,} object(s)'
                   "</span>")
        if page_no < pages:
            nav.append(f'<a href="/?{urlencode({**base, "page": page_no + 1})}">next →</a>')
        sort, descending = query.get("sort", "id"), query.get("desc") == "1"
        heads = []
        for key, (label, _) in SORTS.items():
            flip = "1" if key == sort and not descending else ""
            arrow = (" ▼" if descending else " ▲") if key == sort else ""
            href = "/?" + urlencode({**{k: v for k, v in base.items()
                                        if k not in ("sort", "desc")},
                                     "sort": key, **({"desc": flip} if flip else {})})
            cls = "" if key in ("ns", "id", "state", "alarm") else " class=num"
            heads.append(f'<th{cls}><a href="{esc(href)}">{esc(label)}{arrow}</a></th>')
        title = "Objects" if only == "all" else f"Objects {esc(FILTERS[only])}"
        return (
            f"<section><h2>{title}</h2>{filters}<table><thead><tr>{''.join(heads)}</tr>"
            f'</thead><tbody>{"".join(body)}</tbody></table>'
            f'<div class="pager">{"".join(nav)}</div></section>'
        )

    def _newest_dead_letters(self, now: float,
                             counts: dict[tuple[str, str], ObjectCounts]) -> str:
        found = self.source.all_dead_letters(limit=HOME_LETTERS, counts=counts)
        rows = []
        for item in found.letters:
            letter = item.letter
            link = f"/object?{_q(ns=item.namespace, id=item.object_id)}"
            rows.append(
                f"<tr><td>{when(letter.time, now)}</td>"
                f'<td><a class=mono href="{esc(link)}">{esc(item.namespace)}/'
                f"{esc(item.object_id)}</a></td><td class=mono>{esc(letter.owner)}/"
                f"{esc(letter.id)}</td><td class=mono>{esc(letter.fn)}</td>"
                f"<td class=num>{letter.attempts}</td>"
                f'<td class="err">{esc(letter.error)}</td></tr>'
            )
        if not rows:
            rows.append('<tr><td colspan=6 class="muted">no dead letters</td></tr>')
        more = (f'<p><a href="/dead-letters">all {found.total:,} dead letters, searchable →</a>'
                "</p>")
        return (
            f"<section><h2>Newest dead letters (of {found.total:,})</h2><table><thead><tr>"
            "<th>when</th><th>object</th><th>job</th><th>fn</th><th class=num>attempts</th>"
            f'<th>error</th></tr></thead><tbody>{"".join(rows)}</tbody></table>{more}'
            "</section>"
        )

    def _events_section(self, now: float) -> str:
        rows = []
        for event in self.live.events or []:
            data = ", ".join(f"{k}={event_value(v)}" for k, v in event.data.items())
            link = f"/object?{_q(ns=event.namespace, id=event.object_id)}"
            rows.append(
                f"<tr><td>{when(event.time, now)}</td><td><code>{esc(event.type)}</code></td>"
                f'<td><a class=mono href="{esc(link)}">{esc(event.namespace)}/'
                f"{esc(event.object_id)}</a></td><td class=mono>"
                # (event data holds reprs: their backslashes are shown as they are)
                f"{html.escape(printable(data, backslashes=False))}</td></tr>"
            )
        if not rows:
            rows.append('<tr><td colspan=4 class="muted">no events yet</td></tr>')
        return (
            "<section><h2>Recent events</h2><table><thead><tr><th>when</th><th>type</th>"
            f'<th>object</th><th>data</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            "</section>"
        )

    def object_page(self, query: dict[str, str], now: float) -> str:
        detail = self.detail(query, now, OBJECT_JOB_LIMIT)
        s = detail.summary
        row = s.row
        flash = ""
        if query.get("done"):
            flash = f'<div class="flash">{esc(query["done"])}</div>'
        state = _state_badge(s.state) + paused_badge(s.paused)
        facts = [("state", state), ("alarm", when(row.alarm, now)),
                 ("alarm retries", str(row.alarm_retry)), ("jobs", str(s.jobs)),
                 ("due", str(s.due)), ("running", str(s.running)),
                 ("dead letters", str(s.dead_letters)),
                 ("breaker strikes", str(s.breaker_strikes)),
                 ("class", f"<code>{esc(row.class_path)}</code>"),
                 ("created", when(row.created_at, now))]
        cards = '<div class="cards">' + "".join(
            f'<div class="card"><div class="n" style="font-size:16px">{v}</div>'
            f'<div class="l">{esc(k)}</div></div>' for k, v in facts) + "</div>"
        if s.problem:
            cards += f'<p class="err">{esc(s.problem)}</p>'
        body = (
            f'<p><a href="/">← all objects</a></p><h2 class=mono>{esc(row.namespace)}/'
            f"{esc(row.id)}</h2>{flash}{cards}{jobs_section(detail, now)}"
            f"{letters_section(detail, now, partial(self._actions, row))}"
        )
        return page(f"{row.namespace}/{row.id}", self.source, now, body,
                    refresh=not self.writes)

    def _actions(self, row: ObjectRow, letter: DeadLetterInfo) -> str:
        if not self.writes:
            return ""
        hidden = "".join(
            f'<input type="hidden" name="{k}" value="{html.escape(v, quote=True)}">'
            for k, v in (("ns", row.namespace), ("id", row.id), ("owner", letter.owner),
                         ("job", letter.id), ("token", self.token))
        )
        return (f'<form class="inline" method="post" action="/actions/requeue">{hidden}'
                "<button>Requeue</button></form> "
                f'<form class="inline" method="post" action="/actions/discard">{hidden}'
                '<button class="danger">Discard</button></form>')


def _memo(source: DataSource, key: str, fn: Callable[[], T]) -> T:
    """``fn()``, once per read of every object that loads share (its ``memo``)."""
    memos: dict[Any, Any] | None = getattr(source, "memo", None)
    if memos is None:
        return fn()
    if key not in memos:
        memos[key] = fn()
    return cast("T", memos[key])


def query_int(query: dict[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer, not {raw!r}") from None
    if not -MAX_QUERY_INT <= value <= MAX_QUERY_INT:  # (SQLite's integers stop at 2**63)
        raise HttpError(400, f"{name} is out of range: {raw!r}")
    return value


def query_count(query: dict[str, str], name: str, default: int) -> int:
    """How many rows of a kind to show: 0 to ``MAX_ROWS`` (a negative LIMIT is no limit
    to SQLite, and every row would be rendered on the Trio thread)."""
    value = query_int(query, name, default)
    if not 0 <= value <= MAX_ROWS:
        raise HttpError(400, f"{name} must be between 0 and {MAX_ROWS}, not {value}")
    return value


