"""A write an object's own background task makes outside calls and alarm runs, for the
tests of the loops that ship such writes (the shared layout, the PostgreSQL engine)."""

from __future__ import annotations

import trio

import nursery_jobs as nj


def put_later(ctx: nj.ObjectContext, delay: float, hold: float = 0.0) -> None:
    """Start a task in the object's nursery that puts ``bg`` after ``delay``, in its own
    turn and a transaction held open ``hold`` seconds. Does not checkpoint."""

    async def put() -> None:
        await trio.sleep(delay)
        async with ctx.turn():
            with ctx.storage.transaction():
                ctx.storage.put("bg", "put")
                await trio.sleep(hold)

    ctx.nursery.start_soon(put)
