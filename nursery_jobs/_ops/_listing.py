"""The dashboard's object list: filtered by what the objects are doing (running, failing,
paused, with dead letters or crash strikes), sorted by any column, ids in natural order
(user-2 before user-10)."""

from __future__ import annotations

import functools
import math
import re
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from nursery_jobs._ops._inspect import ObjectCounts, ObjectPage, ObjectRow

if TYPE_CHECKING:
    from collections.abc import Callable

    from nursery_jobs._ops._inspect import DataSource

_NUMBER = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=65536)
def natural_key(text: str) -> tuple[Any, ...]:
    """``text`` split into text and numbers, so that user-2 sorts before user-10
    (cached: a page sorts every object's id)."""
    parts = _NUMBER.split(text)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


# Filter -> its label. The first three the catalog answers; the others need every
# object's counts (``DataSource.object_counts``).
FILTERS: Final = {
    "all": "all objects", "active": "active (in memory)", "due": "alarm due",
    "running": "running a job", "failing": "failing (retrying)", "paused": "paused",
    "dead": "with dead letters", "strikes": "with crash strikes",
}
_BY_COUNTS: Final[dict[str, Callable[[ObjectCounts], bool]]] = {
    "running": lambda c: c.running_jobs > 0,
    "failing": lambda c: c.failing_jobs > 0,
    "paused": lambda c: bool(c.paused),
    "dead": lambda c: c.dead_letters > 0,
    "strikes": lambda c: bool(c.crash_strikes) or c.breaker_strikes > 0,
}
# Sort key -> (column heading, key of a row and its counts).
SORTS: Final[dict[str, tuple[str, Callable[[ObjectRow, ObjectCounts], Any]]]] = {
    "ns": ("namespace", lambda r, c: (natural_key(r.namespace), natural_key(r.id))),
    "id": ("id", lambda r, c: (natural_key(r.id), natural_key(r.namespace))),
    "state": ("state", lambda r, c: (not r.active, bool(c.paused))),
    "alarm": ("alarm", lambda r, c: math.inf if r.alarm is None else r.alarm),
    "jobs": ("jobs", lambda r, c: c.jobs),
    "due": ("due", lambda r, c: c.due_jobs),
    "running": ("running", lambda r, c: c.running_jobs),
    "attempts": ("max attempts", lambda r, c: c.max_attempts),
    "dead": ("dead letters", lambda r, c: c.dead_letters),
    "strikes": ("breaker strikes", lambda r, c: c.breaker_strikes),
}
_CATALOG_SORTS: Final = frozenset({"ns", "id", "alarm", "state"})


def list_objects(
    source: DataSource, *, namespace: str | None, search: str | None, only: str,
    sort: str, descending: bool, now: float, offset: int, limit: int,
    counts: dict[tuple[str, str], ObjectCounts] | None = None,
) -> ObjectPage:
    """One page of the objects that ``only`` keeps, in ``sort`` order (``counts``: every
    object's, read already; with crash strikes for the ``strikes`` filter)."""
    # (A source read for many loads keeps its memo: the list is sorted once for all.)
    memo: dict[Any, Any] | None = getattr(source, "memo", None)
    memo_key = ("list_objects", namespace, search, only, sort, descending,
                now if only == "due" else None)
    if memo is not None and memo_key in memo:
        rows = memo[memo_key]
        return ObjectPage(objects=rows[offset:offset + limit], total=len(rows),
                          offset=offset, limit=limit)
    base = cast(Literal["all", "active", "due"], only if only in ("all", "active", "due")
                else "all")
    rows = source.objects(namespace=namespace, search=search, only=base, now=now,
                          limit=-1).objects
    if counts is None:
        counts = {}
        if only in _BY_COUNTS or sort not in _CATALOG_SORTS:
            counts = source.object_counts(now, strikes=only == "strikes")
    none = ObjectCounts()
    if only in _BY_COUNTS:
        keep = _BY_COUNTS[only]
        rows = [r for r in rows if keep(counts.get((r.namespace, r.id), none))]
    key = SORTS[sort][1]
    if sort not in ("ns", "id"):  # (then ties stay in natural order: sort is stable)
        rows.sort(key=lambda r: (natural_key(r.namespace), natural_key(r.id)))
    rows.sort(key=lambda r: key(r, counts.get((r.namespace, r.id), none)), reverse=descending)
    if memo is not None:
        memo[memo_key] = rows
    return ObjectPage(objects=rows[offset:offset + limit], total=len(rows), offset=offset,
                      limit=limit)
