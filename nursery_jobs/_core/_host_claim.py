"""HostClaim: the ``AlarmClaim`` an object's host hands the one owner of its alarm (a
Lifecycle): the alarm, the object's work and resets, its flight slot, its transactions
and its startup hooks, without reaching into the host."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import trio

from nursery_jobs._core._left import Left

if TYPE_CHECKING:
    from nursery_jobs._core._alarm import JobPermits, ObjectAlarm
    from nursery_jobs._core._host import ObjectHost, Reset
    from nursery_jobs._core._metrics import Metrics
    from nursery_jobs._core._tracing import Tracing
    from nursery_jobs._core._transactions import ObjectTransactions
    from nursery_jobs._core._turns import TurnGate
    from nursery_jobs._engines.base import FlightSlot


class HostClaim:
    """The ``AlarmClaim`` a host hands the owner of its alarm."""

    __slots__ = ("_host",)

    def __init__(self, host: ObjectHost) -> None:
        self._host = host

    def release(self) -> None:
        """The object left memory: let go of its host (``ObjectHost.close``); a late use
        raises ``StorageError``."""
        self._host = cast("ObjectHost", Left(self._host.label, "alarm and work"))

    def _alarm(self) -> ObjectAlarm:
        alarm = self._host.alarm
        assert alarm is not None
        return alarm

    def get(self) -> float | None:
        return self._alarm().time

    def set(self, time: float) -> None:
        self._alarm().write(time, 0)

    def delete(self) -> None:
        self._alarm().write(None, 0)

    def write_through(self, time: float | None) -> None:
        self._alarm().write(time, 0, force=True)

    def working(self, *, alarm: bool = False) -> Any:
        return self._host.working(alarm=alarm)

    def reset(self, reason: str, *, memory: bool = False) -> None:
        self._host.reset(reason, memory=memory)

    @property
    def reset_cause(self) -> Reset | None:
        return self._host.reset_cause

    @property
    def flight(self) -> FlightSlot | None:
        return self._host.flight

    @property
    def probation(self) -> trio.Lock:
        return self._host.site.probation

    @property
    def limit(self) -> JobPermits | None:
        return self._host.site.limits.get(self._host.namespace)

    def crash_tokens(self) -> list[tuple[str, float]]:
        state = self._host.state
        return [] if state is None else state.crash_tokens()

    def clear_crash_tokens(self) -> None:
        state = self._host.state
        if state is not None:
            state.clear_crash_tokens()

    @property
    def turns(self) -> TurnGate:
        return self._host.turns

    @property
    def transactions(self) -> ObjectTransactions:
        tx = self._host.transactions
        assert tx is not None
        return tx

    def destroy(self) -> None:
        self._host.destroy()

    def on_startup(self, hook: Callable[[], Awaitable[None]]) -> None:
        self._host.on_startup(hook)

    @property
    def metrics(self) -> Metrics:
        return self._host.site.metrics

    @property
    def tracing(self) -> Tracing | None:
        return self._host.site.tracing

    @property
    def ships(self) -> bool:
        state = self._host.state
        return state is not None and state.ships

    async def sync(self) -> None:
        await self._host.sync()
