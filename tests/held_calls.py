"""Calls a test makes into an object while one of its jobs holds the object's turn.

Under turns (DESIGN section 2) a call made while a job runs waits for that job; calls
made "while it runs" can only come from the job itself. So the job serves the test's
calls (``serve_calls``, in its own turn: each is a re-entrant stub call) and the test
sends them through ``Held``, which looks like a stub.
"""

from __future__ import annotations

from typing import Any

import outcome
import trio

import nursery_jobs as nj


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
