"""The dashboard's HTML pieces: escaping, times, the page frame, badges and SVG charts
(server-rendered, no JavaScript)."""

from __future__ import annotations

import html
import math
import time
from typing import TYPE_CHECKING, Final
from urllib.parse import urlencode

from nursery_jobs._ops._inspect import is_postgres_address
from nursery_jobs._ops._inspect_json import printable
from nursery_jobs._ops._words import span

if TYPE_CHECKING:
    from nursery_jobs._ops._inspect import DataSource

REFRESH_SECONDS: Final = 5


# -- HTML -------------------------------------------------------------------------------
def esc(value: object) -> str:
    return html.escape(printable(str(value)), quote=True)


def when(t: float | None, now: float) -> str:
    """A time relative to now, with the UTC time in a tooltip."""
    if t is None:
        return '<span class="muted">—</span>'
    delta = t - now
    if abs(delta) > 10 * 365 * 86400:
        return f'<span title="{t!r}">{t:.3g}</span>'
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z"
    text = _duration(abs(delta))
    rel = f"in {text}" if delta > 0.0005 else ("now" if delta > -0.0005 else f"{text} ago")
    return f'<span title="{stamp}">{rel}</span>'


def _duration(seconds: float) -> str:
    return span(seconds)


def _q(**params: object) -> str:
    return urlencode({k: v for k, v in params.items() if v not in (None, "", 0, "all")})


_CSS: Final = """
:root { --fg:#1d2330; --muted:#6b7385; --line:#e3e6ee; --bg:#f6f7fb; --card:#fff;
  --accent:#3257d6; --ok:#1f8a4c; --warn:#b7791f; --bad:#c53030; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color:var(--fg); background:var(--bg); }
header { background:#141a2a; color:#fff; padding:10px 24px; display:flex; gap:16px;
  align-items:baseline; }
header h1 { font-size:17px; margin:0; font-weight:600; }
header .src { color:#aab3c9; font-family:ui-monospace, monospace; font-size:13px; }
header .right { margin-left:auto; color:#aab3c9; font-size:12px; }
main { padding:16px 24px 40px; max-width:1400px; }
a { color:var(--accent); text-decoration:none; } a:hover { text-decoration:underline; }
.cards { display:flex; gap:12px; flex-wrap:wrap; margin-bottom:14px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:8px 12px; min-width:96px; }
.card .n { font-size:19px; font-weight:600; } .card .l { color:var(--muted); font-size:12px; }
a.card { color:var(--fg); } a.card:hover { border-color:var(--accent); text-decoration:none; }
th a { color:var(--muted); }
.charts { display:flex; gap:12px; flex-wrap:wrap; margin-bottom:14px; }
.chart { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:8px 12px; }
.legend { flex-basis:100%; font-size:12px; display:flex; gap:14px; flex-wrap:wrap;
  align-items:center; }
.legend .swatch { display:inline-block; width:10px; height:10px; border-radius:2px;
  margin-right:4px; } .legend .window { margin-left:auto; }
.chart h3 { margin:0 0 4px; font-size:13px; font-weight:600; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:12px 14px; margin-bottom:14px; }
section h2 { font-size:15px; margin:0 0 8px; }
h2.mono { font-size:17px; margin:4px 0 12px; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line);
  vertical-align:top; }
th { font-size:12px; color:var(--muted); font-weight:600; }
tr:nth-child(even) td { background:#fafbfd; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
code, .mono { font-family:ui-monospace, SFMono-Regular, Menlo, monospace; font-size:12.5px; }
.muted { color:var(--muted); } .nw { white-space:nowrap; }
.badge { display:inline-block; padding:1px 7px; border-radius:10px; font-size:11.5px;
  font-weight:600; background:#eef0f6; color:var(--muted); }
.b-active { background:#e3f5ea; color:var(--ok); } .b-evicted { background:#eef0f6; }
.b-in-use, .b-due { background:#fdf3e1; color:var(--warn); }
.b-damaged, .b-missing, .b-dead { background:#fde8e8; color:var(--bad); }
.err { color:var(--bad); font-family:ui-monospace, monospace; font-size:12.5px;
  white-space:pre-wrap; word-break:break-word; }
form.filters { display:flex; gap:8px; flex-wrap:wrap; align-items:center; margin-bottom:10px; }
input, select, button { font:inherit; padding:4px 8px; border:1px solid var(--line);
  border-radius:6px; background:#fff; }
button { cursor:pointer; } button.danger { color:var(--bad); }
form.inline { display:inline; }
.chips a { margin-right:10px; } .chips a.on { font-weight:700; }
.pager { margin-top:8px; display:flex; gap:12px; align-items:center; }
tr.sub td { background:#fff8f8 !important; padding-top:0; }
table.attempts { width:auto; margin:2px 0 6px; }
table.attempts td, table.attempts th { border:0; padding:1px 8px; font-size:12px; }
.flash { background:#e3f5ea; border:1px solid #b6e3c6; padding:8px 12px; border-radius:6px;
  margin-bottom:12px; }
"""


def page(title: str, source: DataSource, now: float, body: str, *,
         refresh: bool = True) -> str:
    if source.live:
        mode = "live runtime"
    elif is_postgres_address(source.label):
        mode = "PostgreSQL · read-only"
    else:
        mode = "stopped data directory · read-only"
    meta = f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' if refresh else ""
    stamp = time.strftime("%H:%M:%S", time.gmtime(now))
    every = f" refreshes every {REFRESH_SECONDS} s ·" if refresh else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta name="viewport" content="width=device-width, initial-scale=1">{meta}'
        f"<title>{esc(title)} · nursery_jobs</title><style>{_CSS}</style></head><body>"
        f'<header><h1><a href="/" style="color:#fff">nursery_jobs</a></h1>'
        f'<span class="src">{esc(source.label)}</span><span class="badge">{mode}</span>'
        f'<span class="right">{stamp}Z ·{every}'
        f' <a href="/dead-letters" style="color:#aab3c9">dead letters</a> ·'
        f' <a href="/metrics" style="color:#aab3c9">/metrics</a> ·'
        f' <a href="/api/objects" style="color:#aab3c9">/api</a></span></header>'
        f"<main>{body}</main></body></html>"
    )


def paused_badge(paused: tuple[str | None, ...]) -> str:
    """A "paused" badge for an object whose jobs (or some owners' jobs) are paused."""
    if not paused:
        return ""
    owners = "" if None in paused else ": " + ", ".join(str(o) for o in paused)
    return f' <span class="badge b-due">paused{esc(owners)}</span>'


def _state_badge(state: str) -> str:
    return f'<span class="badge b-{state.replace(" ", "-")}">{esc(state)}</span>'


def _nice(value: float) -> float:
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * 10**exponent:
            return float(step * 10**exponent)
    return float(10 ** (exponent + 1))


def _tick(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.2g}"


