"""The HTTP face: a dashboard, ``/metrics`` and ``/api`` as a small ASGI app on
hypercorn's Trio worker (the ``web`` extra). Server-rendered HTML and SVG, no
JavaScript.

Read-only unless started with ``writes=True``: then dead letters can be requeued or
discarded with a POST that carries the server's per-process token (in the page's form)
and, from a browser, an ``Origin`` of this server — a synchronizer token plus an origin
check, so another site cannot forge the request. Bound to loopback, the server also
refuses requests whose ``Host`` is not a loopback name (DNS rebinding).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import secrets
import sqlite3
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar
from urllib.parse import parse_qs

import trio

from nursery_jobs import _clock
from nursery_jobs._core._metrics import Metrics
from nursery_jobs._errors import (
    DataDirectoryError,
    HttpError,
    ObjectFencedError,
    ObjectInUseError,
    ObjectLeasedElsewhere,
    ObjectResetError,
    RuntimeArgumentError,
    RuntimeClosedError,
    StorageError,
    UnknownObjectError,
)
from nursery_jobs._ops._inspect import (
    DataSource,
    Inline,
    LetterPage,
    SourceAccess,
)
from nursery_jobs._ops._inspect_json import detail_json, report_json, report_steps
from nursery_jobs._ops._inspect_shared import runtime_source
from nursery_jobs._ops._listen import serve_app
from nursery_jobs._ops._prometheus import CONTENT_TYPE, LiveCounters, exposition, read_scrape
from nursery_jobs._ops._slices import Sliced, _FileSource
from nursery_jobs._ops._sources import RuntimeSource
from nursery_jobs._ops._web_charts import SAMPLE_INTERVAL, window_of
from nursery_jobs._ops._web_charts import Recorder as SampleRecorder
from nursery_jobs._ops._web_html import (
    _q,
)
from nursery_jobs._ops._web_letters import LETTERS_PER_PAGE, letters_json, letters_page
from nursery_jobs._ops._web_object import object_key
from nursery_jobs._ops._web_pages import (
    MAX_PAGE,
    MAX_PAGE_SIZE,
    Live,
    Pages,
    page_args,
    query_count,
    query_int,
)

if TYPE_CHECKING:
    from nursery_jobs._core._runtime import Runtime
    from nursery_jobs._events import Event

logger = logging.getLogger("nursery_jobs.http")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Only = Literal["all", "active", "due"]
T = TypeVar("T")

# An action that arrives as the runtime closes (the dashboard still serving).
_SHUTTING_DOWN: Final = "{}: the runtime is shutting down; nothing was done"
RECENT_EVENTS: Final = 200
MAX_BODY: Final = 16 * 1024
# Pages built at once (each reads every object, in slices): more loads queue, so 100
# concurrent loads cost the runtime what 2 do, not 50 times as much.
PAGE_BUILDS: Final = 2


# -- what a live runtime adds: recent events and chart samples ------------------------------
class Recorder(SampleRecorder):
    """Keeps the recent events and, every ``SAMPLE_INTERVAL``, a sample of the metrics
    (for the dashboard's charts, ``_web_charts``)."""

    def __init__(self, metrics: Metrics, interval: float = SAMPLE_INTERVAL) -> None:
        super().__init__(metrics, interval)
        self.events: deque[Event] = deque(maxlen=RECENT_EVENTS)

    def on_event(self, event: Event) -> None:
        self.events.append(event)


# -- the ASGI app --------------------------------------------------------------------------
class Response:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: str | bytes, content_type: str,
                 headers: Iterable[tuple[str, str]] = ()) -> None:
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.headers = [("content-type", content_type), *headers]


def _html(body: str, status: int = 200) -> Response:
    return Response(status, body, "text/html; charset=utf-8")


def _json(value: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(value, ensure_ascii=True, default=repr, indent=1),
                    "application/json")


def _text(body: str, status: int = 200) -> Response:
    return Response(status, body, "text/plain; charset=utf-8")


_SECURITY_HEADERS: Final = [
    ("content-security-policy", "default-src 'none'; style-src 'unsafe-inline';"
     " img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cache-control", "no-store"),
]


# The pages that read the data source.
_SOURCE_PAGES: Final = frozenset({"/", "/object", "/metrics", "/api", "/api/objects",
                                  "/api/object", "/api/summary", "/dead-letters",
                                  "/api/dead-letters"})


def _needs(path: str, query: dict[str, str]) -> dict[str, bool]:
    """What page ``path`` reads of every object (for ``Sliced.read``)."""
    if path == "/":
        return {"counts": True, "strikes": query.get("only") == "strikes", "letters": True}
    if path in ("/metrics", "/api/summary"):
        return {"counts": True}
    if path in ("/dead-letters", "/api/dead-letters"):
        return {"letters": True}
    return {}


class Dashboard:
    """The ASGI app: one data source, read through a ``SourceAccess`` (plus metrics
    and recent events when live).

    A request reads the live runtime's state (counters, metrics, events) on the Trio
    thread first, then renders its page inside ``access.read``, which may run it in a
    worker thread (PostgreSQL): the page reads the source only.
    """

    def __init__(
        self, access: SourceAccess, *, clock: Callable[[], float],
        metrics: Metrics | None = None, recorder: Recorder | None = None,
        writer: RuntimeSource | None = None, loopback_only: bool = True,
        counters: Callable[[float], dict[str, Any]] | None = None,
    ) -> None:
        self.access = access
        self.clock = clock
        self.metrics = metrics
        self.recorder = recorder
        self.writer = writer
        self.loopback_only = loopback_only
        self.counters = counters
        self.token = secrets.token_urlsafe(32)
        self.limiter = trio.CapacityLimiter(PAGE_BUILDS)

    async def _read(self, fn: Callable[[DataSource], Any], *, now: float,
                    needs: dict[str, bool]) -> Any:
        """``fn(source)``, at most ``PAGE_BUILDS`` at once; a ``Sliced`` source reads what
        ``needs`` names (every object's counts, strikes, dead letters) in slices first."""
        if isinstance(self.access, Sliced):
            return await self.access.read(fn, now=now, limiter=self.limiter, **needs)
        async with self.limiter:
            return await self.access.read(fn)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        head = scope.get("method") == "HEAD"
        try:
            response = await self.handle(scope, receive)
        except HttpError as exc:
            response = _text(str(exc) + "\n", exc.status)
        except ObjectInUseError as exc:  # (a stopped directory another process took)
            response = _text(f"{exc}; try again once it is free\n", 503)
        except (DataDirectoryError, sqlite3.DatabaseError) as exc:
            response = _text(f"cannot read the data directory: {exc}\n", 503)
        except StorageError as exc:  # (PostgreSQL unreachable, or the runtime closing)
            response = _text(f"{exc}\n", 503)
        except Exception:
            logger.exception("dashboard request %s %s failed", scope.get("method"),
                             scope.get("path"))
            response = _text("internal error (see the nursery_jobs.http log)\n", 500)
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(k.encode(), v.encode())
                                for k, v in (*response.headers, *_SECURITY_HEADERS,
                                             ("content-length", str(len(response.body))))]})
        await send({"type": "http.response.body", "body": b"" if head else response.body})

    async def handle(self, scope: Scope, receive: Receive) -> Response:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if self.loopback_only and not _loopback_host(host):
            raise HttpError(421, f"this dashboard answers to loopback names only, not {host!r}")
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        path = scope["path"]
        method = scope["method"]
        if method == "POST":
            form = await self._form(receive, headers)
            return await self.post(path, form, headers, host)
        if method not in ("GET", "HEAD"):
            raise HttpError(405, "method not allowed")
        now = self.clock()
        if path == "/api/events":
            return _json(self.events_json())
        if path == "/favicon.ico":
            return Response(204, b"", "image/x-icon")
        if path not in _SOURCE_PAGES:
            raise HttpError(404, f"no page {path!r}")
        if path in ("/api", "/api/objects") and isinstance(self.access, Sliced):
            # (a page of objects, each read whole: up to 500, read in slices)
            namespace, search, only, offset, limit = page_args(query)
            report = await self.access.stepwise(partial(
                report_steps, now=now, namespace=namespace, search=search, only=only,
                offset=offset, limit=limit, job_limit=query_count(query, "jobs", 100),
                letter_limit=query_count(query, "letters", 100)), limiter=self.limiter)
            return _json(report)
        began = time.perf_counter()
        live = self._live(path, now, query)
        if isinstance(self.access, Sliced):
            self.access.charge(time.perf_counter() - began)
        response: Response = await self._read(partial(self._render, path, query, now, live),
                                              now=now, needs=_needs(path, query))
        return response

    def _render(self, path: str, query: dict[str, str], now: float, live: Live,
                source: DataSource) -> Response:
        view = Pages(source, live, writes=self.writer is not None, token=self.token)
        if path == "/":
            return _html(view.dashboard(query, now))
        if path == "/object":
            return _html(view.object_page(query, now))
        if path == "/metrics":
            scrape = read_scrape(source, now, live.live_counters, live.metrics)
            return Response(200, exposition(scrape), CONTENT_TYPE)
        if path in ("/api", "/api/objects"):
            namespace, search, only, offset, limit = page_args(query)
            return _json(report_json(source, now, namespace=namespace, search=search,
                                     only=only, offset=offset, limit=limit,
                                     job_limit=query_count(query, "jobs", 100),
                                     letter_limit=query_count(query, "letters", 100)))
        if path in ("/dead-letters", "/api/dead-letters"):
            search = query.get("q") or None
            limit = min(max(query_int(query, "limit", LETTERS_PER_PAGE), 1), MAX_PAGE_SIZE)
            offset = min(max(query_int(query, "page", 1) - 1, 0), MAX_PAGE) * limit
            found = source.all_dead_letters(search=search, offset=offset, limit=limit)
            if path == "/api/dead-letters":
                return _json(letters_json(found, search))
            return _html(letters_page(found, source, now, search=search or "",
                                      writes=view.writes, token=self.token,
                                      done=query.get("done", "")))
        if path == "/api/object":
            detail = view.detail(query, now, query_count(query, "jobs", 1000))
            return _json(detail_json(detail))
        assert path == "/api/summary"
        out = view.summary(now)
        out["due_jobs_by_namespace"] = source.job_totals(now).due_jobs  # (every object's)
        return _json(out)

    def _live(self, path: str, now: float, query: dict[str, str]) -> Live:
        """What the live runtime adds to page ``path``, read now (on the Trio thread)."""
        counters = None
        if self.counters is not None and path in ("/", "/metrics", "/api/summary"):
            counters = self.counters(now)
        live_counters = snapshot = None
        if path == "/metrics":
            if counters is not None:
                live_counters = LiveCounters(
                    active_by_namespace=counters["active_by_namespace"],
                    alarms_in_flight=counters["alarms_in_flight"],
                    events_dropped=counters["events_dropped"])
            if self.metrics is not None:
                snapshot = self.metrics.snapshot()
        events = data = None
        if self.recorder is not None and path == "/":
            events = list(reversed(self.recorder.events))[:30]
            data = self.recorder.chart_data(window_of(query), query.get("ns") or None)
        return Live(counters=counters,
                    totals=None if self.metrics is None else self.metrics.totals(),
                    live_counters=live_counters, metrics=snapshot, events=events,
                    charts=data)

    def events_json(self) -> list[dict[str, Any]]:
        if self.recorder is None:
            return []
        return [{"type": e.type, "namespace": e.namespace, "id": e.object_id,
                 "time": e.time, "data": e.data} for e in reversed(self.recorder.events)]

    # -- writes ---------------------------------------------------------------------------
    async def _form(self, receive: Receive, headers: dict[str, str]) -> dict[str, str]:
        ctype = headers.get("content-type", "").split(";")[0].strip()
        if ctype != "application/x-www-form-urlencoded":
            raise HttpError(415, "POST a form (application/x-www-form-urlencoded)")
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                raise HttpError(413, "form too large")
            if not message.get("more_body"):
                break
        return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}

    async def post(self, path: str, form: dict[str, str], headers: dict[str, str],
                   host: str) -> Response:
        if self.writer is None:
            raise HttpError(403, "this dashboard is read-only"
                                 " (open_runtime(..., http_writes=True) allows writes)")
        origin = headers.get("origin")
        if origin is not None and origin != f"http://{host}":
            raise HttpError(403, f"cross-origin POST refused (Origin {origin!r})")
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            raise HttpError(403, f"cross-site POST refused (Sec-Fetch-Site {site!r})")
        if not hmac.compare_digest(form.get("token", "").encode(), self.token.encode()):
            raise HttpError(403, "missing or wrong form token: reload the page")
        if path in ("/actions/requeue-matching", "/actions/discard-matching"):
            return await self._post_matching(path, form.get("q", ""))
        for field in ("ns", "id", "owner", "job"):
            if field not in form:
                raise HttpError(400, f"missing form field {field!r}")
        namespace, object_id = object_key(form, "give the form fields ns and id")
        owner, job = form["owner"], form["job"]
        try:
            if path == "/actions/requeue":
                done = await self.writer.requeue(namespace, object_id, owner, job)
                verb = "requeued (due now)"
            elif path == "/actions/discard":
                done = await self.writer.discard(namespace, object_id, owner, job)
                verb = "discarded"
            else:
                raise HttpError(404, f"no action {path!r}")
        except UnknownObjectError as exc:
            raise HttpError(404, str(exc)) from None
        except ObjectLeasedElsewhere as exc:
            # (PostgreSQL) Another live host holds it: its working copy is the object's
            # state; a write from here would go behind its back.
            raise HttpError(409, f"{exc}: requeue or discard it on that host's dashboard"
                                 " (or here once that host has let it go)") from None
        except ObjectFencedError as exc:
            # (PostgreSQL) This host's copy was resident, but its lease (or its base)
            # is gone: the fence refused the action's writes; the object was dropped.
            raise HttpError(409, f"{exc}; nothing was written, and the object was dropped"
                                 " here: try again, here or on the dashboard of the host"
                                 " that holds it now") from None
        except ObjectResetError as exc:
            # Dropped from memory meanwhile (fenced, a memory reset): the action may
            # not have run, or not to its end.
            raise HttpError(503, f"{exc}: look at the object again, and try again if"
                                 " the dead letter is still there") from None
        except RuntimeClosedError as exc:
            raise HttpError(503, _SHUTTING_DOWN.format(exc)) from None
        message = f"{owner}/{job} {verb}" if done else f"no dead letter {owner}/{job}"
        if form.get("back") == "dead-letters":
            message = f"{namespace}/{object_id}: {message}"
            return _see(f"/dead-letters?{_q(q=form.get('q', ''), done=message)}")
        return _see(f"/object?{_q(ns=namespace, id=object_id, done=message)}")

    async def _post_matching(self, path: str, search: str) -> Response:
        """Requeue or discard every dead letter that ``search`` matches (all of them
        without one), object by object; a letter another host holds is left, and
        counted."""
        assert self.writer is not None
        found: LetterPage = await self._read(
            lambda source: source.all_dead_letters(search=search or None, limit=-1),
            now=self.clock(), needs={"letters": True})
        done = left = 0
        for item in found.letters:
            try:
                if path == "/actions/requeue-matching":
                    ok = await self.writer.requeue(item.namespace, item.object_id,
                                                   item.letter.owner, item.letter.id)
                else:
                    ok = await self.writer.discard(item.namespace, item.object_id,
                                                   item.letter.owner, item.letter.id)
            except (UnknownObjectError, ObjectLeasedElsewhere, ObjectFencedError,
                    ObjectResetError):
                ok = False
            except RuntimeClosedError as exc:
                raise HttpError(503, f"{exc}: the runtime is shutting down; {done:,} done"
                                     " before it, the rest left") from None
            done += ok
            left += not ok
        verb = "requeued (due now)" if path == "/actions/requeue-matching" else "discarded"
        message = f"{done:,} dead letter(s) {verb}"
        if left:
            message += f"; {left:,} left (gone meanwhile, or held by another host)"
        return _see(f"/dead-letters?{_q(q=search, done=message)}")


def _see(location: str) -> Response:
    return Response(303, f"see {location}\n", "text/plain", [("location", location)])


def _loopback_host(host: str) -> bool:
    """Whether a Host header (``name[:port]``, ``[v6][:port]``) names this machine."""
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    else:
        name = host.rsplit(":", 1)[0]
    return _loopback_name(name)


def _loopback_name(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# -- serving -------------------------------------------------------------------------------
def _check_address(address: object) -> tuple[str, int]:
    if (not isinstance(address, tuple) or len(address) != 2
            or not isinstance(address[0], str) or isinstance(address[1], bool)
            or not isinstance(address[1], int) or not 0 <= address[1] <= 65535):
        raise RuntimeArgumentError(f"http must be a (host, port) tuple, e.g. ('127.0.0.1', 8321);"
                        f" got {address!r}")
    return address[0], address[1]


def _is_loopback_bind(host: str) -> bool:
    """Whether the address bound is a loopback one (a bare address: ``::1`` has no port
    to split off; it read as not loopback, which turned the Host check off)."""
    return _loopback_name(host.strip("[]"))


async def start_http(rt: Runtime, nursery: trio.Nursery, address: object, *,
                     writes: bool) -> None:
    """Serve ``rt``'s dashboard from its own nursery; sets ``rt.http_url``."""
    from nursery_jobs._ops._inspect_pg import PgRuntimeAccess, postgres_engine

    host, port = _check_address(address)
    if not isinstance(writes, bool):
        raise RuntimeArgumentError(f"http_writes must be a bool, got {writes!r}")
    # (The shared layout: an active object read from its working copy, the others from
    # their stored rows; see ``_inspect_shared``.)
    source = runtime_source(rt)
    pg = postgres_engine(rt.engine)
    # PostgreSQL: the whole database (every host's objects), read in the engine's pool.
    access: SourceAccess = Sliced(source) if pg is None else PgRuntimeAccess(pg)
    recorder = Recorder(rt.metrics, SAMPLE_INTERVAL)
    rt.events.add_listener(recorder.on_event)
    recorder.sample(_clock.now())

    def counters(now: float) -> dict[str, Any]:
        stats = rt.statistics()
        active: dict[str, int] = {}
        for namespace, _ in source.active_keys():
            active[namespace] = active.get(namespace, 0) + 1
        return {"active": stats.active_objects, "alarms_in_flight": stats.alarms_in_flight,
                "events_dropped": stats.events_dropped, "active_by_namespace": active}

    app = Dashboard(access, clock=_clock.now, metrics=rt.metrics, recorder=recorder,
                    writer=source if writes else None, loopback_only=_is_loopback_bind(host),
                    counters=counters)
    rt.http_url = await nursery.start(serve_app, app, (host, port))
    nursery.start_soon(recorder.run)
    logger.info("dashboard of %s at %s%s", access.label, rt.http_url,
                " (writes allowed)" if writes else "")


async def serve_offline(
    source: DataSource | SourceAccess, address: tuple[str, int], *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a stopped data directory's dashboard (a ``DataSource``), or a PostgreSQL
    database's (``_inspect_pg.PgDatabase``), read-only: ``nursery-jobs serve``."""
    host, port = _check_address(address)
    access = (source if isinstance(source, SourceAccess)
              else Sliced(source) if isinstance(source, _FileSource) else Inline(source))
    app = Dashboard(access, clock=time.time, loopback_only=_is_loopback_bind(host))
    await serve_app(app, (host, port), task_status=task_status)
