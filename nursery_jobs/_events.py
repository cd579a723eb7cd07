"""Diagnostics events: a best-effort fan-out to subscribers, listeners and the logger."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from ._clock import now

logger = logging.getLogger("nursery_jobs")


@attrs.frozen(kw_only=True)
class Event:
    """One diagnostics event."""

    type: str
    namespace: str
    object_id: str
    data: dict[str, Any]
    time: float


_WARNING_TYPES = frozenset(
    {"alarm:failed", "job:backlog_warning", "job:slow_dispatch", "alarm:memory_limit_reset",
     "queue:error", "schedule:error", "job:dead_letter", "job:crash_strike",
     "catalog:rebuilt", "catalog:error", "object:quarantined"}  # nj-faults hook: last line
)


class EventBus:
    """Delivers events to subscribers (bounded channels) and listeners; never blocks."""

    __slots__ = ("_listeners", "_subscribers", "dropped")

    def __init__(self) -> None:
        self._subscribers: list[trio.MemorySendChannel[Event]] = []
        self._listeners: list[Callable[[Event], object]] = []
        self.dropped = 0

    @contextmanager
    def subscribe(self, max_buffer: int = 1000) -> Iterator[trio.MemoryReceiveChannel[Event]]:
        """Yield a receive channel of events. A full buffer drops events (counted in
        ``dropped``) rather than block dispatch. Does not checkpoint."""
        send, receive = trio.open_memory_channel[Event](max_buffer)
        self._subscribers.append(send)
        try:
            with receive:
                yield receive
        finally:
            self._subscribers.remove(send)
            send.close()

    def add_listener(self, fn: Callable[[Event], object]) -> None:
        """Call ``fn(event)`` synchronously for every event; its errors are logged."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Event], object]) -> None:
        """Stop calling ``fn``."""
        self._listeners.remove(fn)

    def emit(self, type: str, namespace: str, object_id: str, **data: Any) -> None:
        """Publish an event. Does not checkpoint and never blocks."""
        level = logging.WARNING if type in _WARNING_TYPES else logging.DEBUG
        if logger.isEnabledFor(level):
            logger.log(level, "%s %s/%s %r", type, namespace, object_id, data)
        if not self._subscribers and not self._listeners:
            return
        event = Event(type=type, namespace=namespace, object_id=object_id, data=data, time=now())
        for send in self._subscribers:
            try:
                send.send_nowait(event)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self.dropped += 1
        for fn in list(self._listeners):
            try:
                fn(event)
            except Exception:
                logger.exception("event listener %r failed on %s", fn, type)
