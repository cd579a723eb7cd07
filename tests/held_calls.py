"""Calls a test makes into an object while one of its jobs holds the object's turn, and
test access to an object's internals through a stub call.

A stub call copies its arguments and result through the payload codec (DESIGN section
2), so functions and live objects cannot travel in one. ``inside(stub, fn)`` runs
``fn(instance)`` in a call of the object's ``run`` method (``run_held``) and hands
``fn`` and its result over by reference: a ``ByRef`` record travels instead.

Under turns (DESIGN section 2) a call made while a job runs waits for that job; calls
made "while it runs" can only come from the job itself. So the job serves the test's
calls (``serve_calls``, in its own turn: each is a re-entrant stub call) and the test
sends them through ``Held``, which looks like a stub.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import outcome
import trio

import nursery_jobs as nj
from nursery_jobs import _codec


@attrs.frozen(kw_only=True)
class ByRef:
    """A value left in this process's ``_HELD``; the record is what a call copies."""

    key: int


_codec.register_record(ByRef, "tests.held_calls.ByRef")
_HELD: dict[int, Any] = {}
_keys = itertools.count()


def by_ref(value: Any) -> ByRef:
    """Leave ``value`` here; the returned record fetches it (once) with ``held``."""
    key = next(_keys)
    _HELD[key] = value
    return ByRef(key=key)


def held(ref: ByRef) -> Any:
    return _HELD.pop(ref.key)


async def inside(stub: nj.Stub, fn: Callable[[Any], Any]) -> Any:
    """``fn(instance)`` (awaited if it returns an awaitable) inside a stub call of the
    object's ``run`` method, which is ``run_held``."""
    return held(await stub.call("run", by_ref(fn)))


async def run_held(instance: Any, ref: ByRef) -> ByRef:
    """The body of a test object's ``run(self, ref)``: see ``inside``."""
    result = held(ref)(instance)
    if isinstance(result, Awaitable):
        result = await result
    return by_ref(result)


async def serve_calls(calls: trio.MemoryReceiveChannel[Any], stub: nj.Stub | None) -> None:
    """Run each call received on ``calls`` through ``stub``, inside the current turn."""
    async for name, args, kwargs, reply in calls:
        assert stub is not None
        reply.send_nowait(await outcome.acapture(stub.call, name, *args, **kwargs))


class Held:
    """The object as its running job sees it: each call runs inside the job's turn."""

    def __init__(self, calls: trio.MemorySendChannel[Any]) -> None:
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            reply, result = trio.open_memory_channel[Any](1)
            await self._calls.send((name, args, kwargs, reply))
            return (await result.receive()).unwrap()

        return call
