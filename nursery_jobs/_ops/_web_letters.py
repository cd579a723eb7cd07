"""The dead letters of every object, as one view: ``/api/dead-letters`` (JSON) and
``/dead-letters`` (its HTML), searchable with ``?q=`` (object id, job id, function, error
text), newest first, paginated; with writes allowed, requeue or discard one letter or
every letter that matches."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

from nursery_jobs._ops._inspect_json import preview, printable
from nursery_jobs._ops._web_html import _q, esc, page, when

if TYPE_CHECKING:
    from nursery_jobs._ops._inspect import DataSource, FoundLetter, LetterPage

LETTERS_PER_PAGE: Final = 50


def letter_json(item: FoundLetter) -> dict[str, Any]:
    letter = item.letter
    return {"namespace": item.namespace, "object_id": item.object_id, "owner": letter.owner,
            "id": letter.id, "fn": letter.fn, "error": letter.error,
            "attempts": letter.attempts, "reason": letter.reason, "time": letter.time,
            # (a payload that is not text — a number, a list — as its repr: printable()
            # takes text, and an int payload made this page a 500)
            "payload": (printable(letter.payload) if isinstance(letter.payload, str)
                        else preview(letter.payload))}


def letters_json(found: LetterPage, search: str | None) -> dict[str, Any]:
    return {"q": search or "", "total": found.total, "offset": found.offset,
            "limit": found.limit, "letters": [letter_json(item) for item in found.letters]}


def _hidden(fields: dict[str, str]) -> str:
    return "".join(f'<input type="hidden" name="{k}" value="{html.escape(v, quote=True)}">'
                   for k, v in fields.items())


def _row_actions(item: FoundLetter, token: str, search: str) -> str:
    fields = _hidden({"ns": item.namespace, "id": item.object_id, "owner": item.letter.owner,
                      "job": item.letter.id, "token": token, "back": "dead-letters",
                      "q": search})
    return (f'<form class="inline" method="post" action="/actions/requeue">{fields}'
            "<button>Requeue</button></form> "
            f'<form class="inline" method="post" action="/actions/discard">{fields}'
            '<button class="danger">Discard</button></form>')


def letters_page(found: LetterPage, source: DataSource, now: float, *, search: str,
                 writes: bool, token: str, done: str = "") -> str:
    """The ``/dead-letters`` page of ``found``."""
    flash = f'<div class="flash">{esc(done)}</div>' if done else ""
    form = (
        '<form class="filters" method="get" action="/dead-letters">'
        f'<input name="q" size="40" placeholder="object id, job id, function or error text"'
        f' value="{esc(search)}"><button>Search</button>'
        + (' <a href="/dead-letters">clear</a>' if search else "") + "</form>"
    )
    bulk = ""
    if writes and found.total:
        fields = _hidden({"q": search, "token": token})
        what = f"all {found.total:,} matching" if search else f"all {found.total:,}"
        bulk = (
            f'<p><form class="inline" method="post" action="/actions/requeue-matching">'
            f"{fields}<button>Requeue {what}</button></form> "
            f'<form class="inline" method="post" action="/actions/discard-matching">'
            f'{fields}<button class="danger">Discard {what}</button></form></p>'
        )
    rows = []
    for item in found.letters:
        letter = item.letter
        link = f"/object?{_q(ns=item.namespace, id=item.object_id)}"
        actions = _row_actions(item, token, search) if writes else ""
        rows.append(
            f"<tr><td class=nw>{when(letter.time, now)}</td>"
            f'<td class=nw><a class=mono href="{esc(link)}">{esc(item.namespace)}/'
            f"{esc(item.object_id)}</a></td><td class='mono nw'>{esc(letter.owner)}/"
            f"{esc(letter.id)}</td><td class=mono>{esc(letter.fn)}</td>"
            f"<td class=num>{letter.attempts}</td><td>{esc(letter.reason)}</td>"
            f'<td class="err">{esc(letter.error)}</td><td class=nw>{actions}</td></tr>'
        )
    if not rows:
        none = "no dead letter matches" if search else "no dead letters"
        rows.append(f'<tr><td colspan=8 class="muted">{none}</td></tr>')
    limit = max(found.limit, 1)
    page_no = found.offset // limit + 1
    pages = max(math.ceil(found.total / limit), 1)
    base = {"q": search} if search else {}
    nav = []
    if page_no > 1:
        nav.append(f'<a href="/dead-letters?{urlencode({**base, "page": page_no - 1})}">'
                   "← newer</a>")
    nav.append(f'<span class="muted">page {page_no} of {pages:,} · {found.total:,}'
               " dead letter(s)</span>")
    if page_no < pages:
        nav.append(f'<a href="/dead-letters?{urlencode({**base, "page": page_no + 1})}">'
                   "older →</a>")
    title = "Dead letters of every object"
    if search:
        title += f" matching “{esc(search)}”"
    body = (
        f'<p><a href="/">← all objects</a></p>{flash}<section><h2>{title}</h2>{form}{bulk}'
        "<table><thead><tr><th>when</th><th>object</th><th>job</th><th>fn</th>"
        "<th class=num>attempts</th><th>reason</th><th>error</th><th></th></tr></thead>"
        f'<tbody>{"".join(rows)}</tbody></table><div class="pager">{"".join(nav)}</div>'
        "</section>"
    )
    return page("dead letters", source, now, body, refresh=not writes)
