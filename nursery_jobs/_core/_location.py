"""Which engine a runtime's location names: None (memory), a data directory, a
``postgresql://`` address, or an ``Engine`` given as is.

It sits above the engines, so that the engines never import one another."""

from __future__ import annotations

import os
from typing import Any

from nursery_jobs._engines.base import Engine
from nursery_jobs._engines.files._engine import FilesEngine
from nursery_jobs._engines.memory import MemoryEngine
from nursery_jobs._engines.shared._engine import SharedEngine
from nursery_jobs._errors import EngineError, RuntimeArgumentError


def engine_for(
    location: str | os.PathLike[str] | Engine | None, *, synchronous: str, **cluster: Any
) -> Engine:
    """The engine a runtime opens for ``location``: None → memory, a path → files,
    ``shared:<path>`` → the shared layout of a data directory, an ``Engine`` as
    given. A ``scheme://`` address no engine serves raises ``EngineError``
    (a path must never become a directory named ``postgresql:``). ``cluster`` options
    (``lease_ttl``, ``pool_size``) are for a ``postgresql://`` address only."""
    if cluster and not (
        isinstance(location, str) and location.partition("://")[0].lower()
        in ("postgresql", "postgres")
    ):
        raise RuntimeArgumentError(
            f"{', '.join(sorted(cluster))} apply to a postgresql:// address only, not to"
            f" {location!r}"
        )
    if location is None:
        return MemoryEngine(synchronous=synchronous)
    if isinstance(location, (str, os.PathLike)):
        text = os.fspath(location)
        if not isinstance(text, str):
            raise EngineError(f"a data directory must be a str path, got {location!r}")
        if text[:7].lower() == SHARED_PREFIX:
            return _shared(text, synchronous=synchronous)
        scheme, sep, _ = text.partition("://")
        if sep and scheme.lower() in ("postgresql", "postgres"):
            try:
                from nursery_jobs._engines.postgres._engine import PostgresEngine
            except ImportError as exc:
                raise EngineError(
                    f"a {scheme}:// address needs the PostgreSQL engine's driver ({exc}):"
                    " pip install 'nursery_jobs[postgres]'"
                ) from exc
            return PostgresEngine(text, synchronous=synchronous, **cluster)
        if sep and scheme and "/" not in scheme:
            raise EngineError(
                f"no engine for {scheme + '://'!r} addresses ({text[:80]!r}): give a data"
                " directory path, None for memory, or an Engine object"
            )
        return FilesEngine(text, synchronous=synchronous)
    for member in ("open_object", "due", "open", "close"):
        if not callable(getattr(location, member, None)):
            raise EngineError(
                f"open_runtime() takes a path, None or an Engine, got {location!r}"
            )
    return location


# ``shared:<directory>``: a data directory whose objects are rows of one database.
SHARED_PREFIX = "shared:"


def shared_path(text: str) -> str | None:
    """The directory a ``shared:<path>`` location names (``shared://./data`` and
    ``shared:///abs/path`` too; ``""`` for none), or None: not the shared layout."""
    if text[:len(SHARED_PREFIX)].lower() != SHARED_PREFIX:
        return None
    path = text[len(SHARED_PREFIX):]
    return path[2:] if path.startswith("//") else path


def _shared(text: str, *, synchronous: str) -> SharedEngine:
    path = shared_path(text)
    if not path:
        raise EngineError(
            f"{text!r} names no directory: give shared:<path>, e.g. shared:./data"
        )
    return SharedEngine(path, synchronous=synchronous)
