"""Diagnostics events: a best-effort fan-out to subscribers, listeners and the logger.

A fault in a consumer stays with that consumer (issue 10 #1): a subscriber whose
channel is closed is dropped; a listener that raises anything is logged once, counted,
and disabled after ``LISTENER_FAILURE_LIMIT`` failures in a row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final

import attrs
import trio

from nursery_jobs._clock import now
from nursery_jobs._errors import RuntimeArgumentError, describe_error, safe_repr

logger = logging.getLogger("nursery_jobs")

# Control characters in a log message, escaped: an object id, job id or error text with
# a newline would otherwise forge a log line of its own (issue 22 #10). C0 and C1
# controls, DEL, and the Unicode line and paragraph separators.
_ESCAPES: Final = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029",
}


class _EscapeControls(logging.Filter):
    """Escapes the control characters of every record of the library's loggers. One
    filter on the logger, not a call at each site: a site that forgets one argument
    would forge lines again. (A traceback attached to a record stays as it is: it is
    several lines by nature, and handlers print it after the message.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = message.translate(_ESCAPES)
        if escaped != message:
            record.msg, record.args = escaped, ()
        return True


for _name in ("nursery_jobs", "nursery_jobs.http"):
    logging.getLogger(_name).addFilter(_EscapeControls())

# A listener that raises this many times in a row is disabled. In a row, not in total:
# a runtime lives for months, and a total would in the end disable a listener that
# fails once a day; one that fails on every event is disabled after three.
LISTENER_FAILURE_LIMIT: Final = 3


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
     "listener:disabled", "catalog:rebuilt", "catalog:error", "object:quarantined",
     "storage:slow"}
)


class _Listener:
    __slots__ = ("failures", "fn", "logged")

    def __init__(self, fn: Callable[[Event], object]) -> None:
        self.fn = fn
        self.failures = 0  # in a row
        self.logged = False


class EventBus:
    """Delivers events to subscribers (bounded channels) and listeners; never blocks."""

    __slots__ = ("_disabled", "_listeners", "_subscribers", "dropped", "listener_errors")

    def __init__(self) -> None:
        self._subscribers: list[trio.MemorySendChannel[Event]] = []
        # Replaced, never mutated: emit iterates it while listeners add and remove.
        self._listeners: tuple[_Listener, ...] = ()
        self._disabled: list[Callable[[Event], object]] = []
        self.dropped = 0
        self.listener_errors = 0

    @contextmanager
    def subscribe(self, max_buffer: int = 1000) -> Iterator[trio.MemoryReceiveChannel[Event]]:
        """Yield a receive channel of events. A full buffer drops events (counted in
        ``dropped``) rather than block dispatch; a closed channel is dropped itself.
        Does not checkpoint."""
        send, receive = trio.open_memory_channel[Event](max_buffer)
        self._subscribers.append(send)
        try:
            with receive:
                yield receive
        finally:
            with suppress(ValueError):  # already dropped: its receiver was closed
                self._subscribers.remove(send)
            send.close()

    def add_listener(self, fn: Callable[[Event], object]) -> None:
        """Call ``fn(event)`` synchronously for every event. Whatever it raises is
        logged (the first time), counted in ``listener_errors``, and after
        ``LISTENER_FAILURE_LIMIT`` failures in a row the listener is disabled, with a
        ``listener:disabled`` event. Raises ``RuntimeArgumentError`` (a TypeError) if
        ``fn`` is not callable."""
        if not callable(fn):
            raise RuntimeArgumentError(
                f"add_listener() needs a callable taking an Event, got {safe_repr(fn, 80)}")
        self._listeners = (*self._listeners, _Listener(fn))

    def remove_listener(self, fn: Callable[[Event], object]) -> None:
        """Stop calling ``fn`` (a no-op if it was disabled). Raises
        ``RuntimeArgumentError`` (a ValueError) if ``fn`` is not a listener."""
        for listener in self._listeners:
            if listener.fn == fn:
                self._listeners = tuple(x for x in self._listeners if x is not listener)
                return
        for disabled in self._disabled:
            if disabled == fn:
                self._disabled.remove(disabled)
                return
        raise RuntimeArgumentError(f"remove_listener(): {safe_repr(fn)} is not a listener")

    def emit(
        self, type: str, namespace: str, object_id: str, *,
        _log: tuple[int, str, tuple[Any, ...]] | None = None,
        _exc_info: BaseException | None = None, **data: Any,
    ) -> None:
        """Publish an event. Does not checkpoint and never blocks.

        The event is also the incident's one log record: ``_log=(level, format, args)``
        words it (the library's own call sites), else it is logged as its type and data.
        ``_exc_info``: an error whose traceback the record carries (a fault of ours, or
        a crash of an object's own code).
        """
        if _log is not None:
            level, message, args = _log
            if logger.isEnabledFor(level):
                logger.log(level, message, *args, exc_info=_exc_info,
                           extra={"nj_event": type})
        else:
            level = logging.WARNING if type in _WARNING_TYPES else logging.DEBUG
            if logger.isEnabledFor(level):
                # safe_repr: a capability's event data may hold anything (issue 10 #2).
                logger.log(level, "%s %s/%s %s", type, namespace, object_id, safe_repr(data),
                           extra={"nj_event": type})
        if not self._subscribers and not self._listeners:
            return
        event = Event(type=type, namespace=namespace, object_id=object_id, data=data, time=now())
        closed = None
        for send in self._subscribers:
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                self.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                closed = [] if closed is None else closed
                closed.append(send)
        if closed is not None:
            self._drop_subscribers(closed)
        if self._listeners:
            self._call_listeners(event)

    def _drop_subscribers(self, closed: list[trio.MemorySendChannel[Event]]) -> None:
        """Forget subscribers whose receive channel is closed (their ``subscribe``
        block may go on, or never end)."""
        for send in closed:
            self._subscribers.remove(send)
            send.close()
            self.dropped += 1

    @trio.lowlevel.enable_ki_protection
    def _call_listeners(self, event: Event) -> None:
        # KI-protected: a real Ctrl-C arriving while a listener runs is delivered by
        # Trio to the main task (the application), never raised inside the listener.
        # So whatever a listener raises — KeyboardInterrupt, SystemExit, a Cancelled it
        # made — is its own fault, and is caught: emit is called from the middle of the
        # runtime's bookkeeping (after commits, while an alarm is re-timed), where an
        # escaping exception would leave that work half done or stop the runtime.
        for listener in self._listeners:
            try:
                listener.fn(event)
            except BaseException as exc:
                self._listener_failed(listener, event, exc)
            else:
                if listener.failures:
                    listener.failures = 0

    def _listener_failed(self, listener: _Listener, event: Event, error: BaseException) -> None:
        """Count a failure; log the first (with its traceback) and disable the listener
        at the limit. Later failures cost a counter, not a formatted traceback (a log
        record per failure made every emit 49x slower)."""
        self.listener_errors += 1
        listener.failures += 1
        if not listener.logged:
            listener.logged = True
            logger.error(
                "event listener %s raised %s on %s (logged once; disabled after %d"
                " failures in a row)", safe_repr(listener.fn), describe_error(error),
                event.type, LISTENER_FAILURE_LIMIT, exc_info=error,
            )
        if listener.failures >= LISTENER_FAILURE_LIMIT and listener in self._listeners:
            self._listeners = tuple(x for x in self._listeners if x is not listener)
            self._disabled.append(listener.fn)
            self.emit("listener:disabled", "", "", listener=safe_repr(listener.fn),
                      failures=listener.failures, error=describe_error(error))
