"""The benchmarks' quiet log: their deep queues are on purpose."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_backlog_warnings() -> Iterator[None]:
    """The benchmarks queue thousands of jobs on one object on purpose: the backlog and
    stall warnings that would flood stderr (one per object: 100 lines of them in the
    100-object row) are expected here. Errors still show; the logger's level is restored
    after (``main`` may run inside another program's process)."""
    log = logging.getLogger("nursery_jobs")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
