"""The stop signals of a runtime (DESIGN section 2, "Stopping"): caught for the whole
life of the runtime, its start and its shutdown included, so that a deploy never looks
like a crash.

The first signal in ``stop_on`` is a graceful stop of the runtime's block. A further
one (a supervisor that repeats SIGTERM, an operator who presses twice) does nothing
more: the stop it asks for is already under way, and the running jobs' cleanup is
theirs to bound (STYLE habit 7). Never the default action, which would kill the process
mid-cleanup and give its jobs a crash strike. A process that must die at once is sent
SIGKILL, which is a crash. The previous handlers come back only when everything is
stopped.

Unlike ``trio.open_signal_receiver``, nothing is redelivered when the handlers are
restored: a signal received while the runtime was open was its stop, however late.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import trio

from nursery_jobs._errors import RuntimeArgumentError
from nursery_jobs._events import EventBus


def check_stop_on(stop_on: object) -> tuple[signal.Signals, ...]:
    """The signals ``open_runtime(stop_on=...)`` names. Raises RuntimeArgumentError (a
    ValueError) naming the argument for anything but an iterable of valid signal
    numbers."""
    if isinstance(stop_on, (str, bytes)) or not isinstance(stop_on, Iterable):
        raise RuntimeArgumentError(f"stop_on must be a tuple of signals, got {stop_on!r}")
    signals = []
    for sig in stop_on:
        if isinstance(sig, bool) or not isinstance(sig, int) or sig not in signal.valid_signals():
            raise RuntimeArgumentError(
                f"stop_on: {sig!r} is not a signal (e.g. signal.SIGTERM)")
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise RuntimeArgumentError(f"stop_on: {signal.Signals(sig).name} cannot be caught")
        signals.append(signal.Signals(sig))
    return tuple(signals)


class StopSignals:
    """Which stop signal, if any, a runtime has received. ``caught`` installs the
    handlers; ``watch`` (a task of the runtime) turns the first signal into the
    cancellation of the runtime's block."""

    def __init__(self, signals: tuple[signal.Signals, ...]) -> None:
        self.signals = signals
        self.received: signal.Signals | None = None
        self._arrived = trio.Event()

    @contextmanager
    def caught(self) -> Iterator[None]:
        """Catch the stop signals until the block ends, then restore the previous
        handlers. Nothing is caught outside the main thread (Python allows handlers
        only there) or for ``stop_on=()``."""
        if not self.signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        token = trio.lowlevel.current_trio_token()

        def handler(signum: int, frame: FrameType | None) -> None:
            try:
                token.run_sync_soon(self._note, signum, idempotent=True)
            except trio.RunFinishedError:  # (Not while the block runs; kept harmless.)
                pass

        previous: dict[signal.Signals, Any] = {}
        try:
            for sig in self.signals:
                previous[sig] = signal.signal(sig, handler)
            yield
        finally:
            for sig, before in previous.items():
                # (None: a handler installed from C, which Python cannot reinstall.)
                signal.signal(sig, signal.SIG_DFL if before is None else before)

    def _note(self, signum: int) -> None:
        # (In Trio's run loop, between tasks: only what needs no task.)
        if self.received is None:
            self.received = signal.Signals(signum)
            self._arrived.set()

    async def watch(self, events: EventBus, stopping: trio.CancelScope) -> None:
        """Wait for the first stop signal; then cancel ``stopping`` (the block, which
        exits normally). Cancelled with the runtime's nursery: a signal after that
        meets a stop already under way."""
        await self._arrived.wait()
        assert self.received is not None
        name = self.received.name
        events.emit(
            "runtime:stopping", "", "", signal=name,
            _log=(logging.WARNING, "%s received: stopping gracefully (running jobs"
                  " are cancelled and run again at the next start)", (name,)))
        stopping.cancel(reason=f"{name}: a graceful stop")
