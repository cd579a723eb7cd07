"""The dashboard's write actions (requeue, discard a dead letter) run as a write call of
the object does: the object stays resident and awake from activation to the end of the
action, and what the action wrote is durable (shipped, where commits ship) when it
returns — the answer "requeued" is never ahead of the storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs._ops._sources import RuntimeSource
from nursery_jobs.testing import run_until_idle

ONCE = nj.RetryOptions(max_attempts=1)


class Mailer(nj.DurableObject):
    namespace = "tests.test_dashboard_actions.Mailer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def letters(self) -> list[str]:
        return [d.job.id for d in self.lifecycle.dead_letters()]

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "fail" and (self.ctx.env or {}).get("fail", True):
            raise ConnectionError("smtp down")
        return None


async def _dead_letter(rt: nj.Runtime, object_id: str) -> None:
    await rt.get(Mailer, object_id).push("fail", id="bounce", retry=ONCE)
    await run_until_idle(rt)
    assert await rt.get(Mailer, object_id).letters() == ["bounce"]


@pytest.mark.parametrize("action", ["requeue", "discard"])
async def test_actions_side_by_side_each_keep_their_object_resident(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, action: str,
) -> None:
    # Ten actions at once with room for one resident object: each activation evicts
    # the least recently used idle object. An action that let go of its object between
    # activating it and entering its turn found it evicted (a StorageError naming it).
    async with nj.open_runtime(tmp_path / "data", max_active=1, env={"fail": True}) as rt:
        ids = [f"news-{i}" for i in range(10)]
        for object_id in ids:
            await _dead_letter(rt, object_id)
        rt.env["fail"] = False
        source = RuntimeSource(rt)
        done: dict[str, bool] = {}

        async def act(object_id: str) -> None:
            done[object_id] = await getattr(source, action)(
                Mailer.namespace, object_id, "host", "bounce")

        async with trio.open_nursery() as nursery:
            for object_id in ids:
                nursery.start_soon(act, object_id)
        assert done == dict.fromkeys(ids, True)
        await run_until_idle(rt)
        for object_id in ids:
            assert await rt.get(Mailer, object_id).letters() == []


async def test_a_requeue_is_shipped_when_it_returns(pg_dsn: str) -> None:
    """PostgreSQL: the dead letter is gone from the database when the action returns
    (an action that only committed in the working copy left it to the ship loop)."""
    from pg_support import eventually, sql

    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn, env={"fail": True}) as rt:
            await rt.get(Mailer, "news").push("fail", id="bounce", retry=ONCE)

            async def letters_shipped() -> int:
                rows = sql(pg_dsn, "SELECT count(*) FROM nj_rows WHERE object_id = 'news'"
                                   " AND tbl = 'nj_dead_letters'")
                return int(rows[0][0])

            async def shipped() -> bool:
                return await letters_shipped() == 1

            await eventually(shipped)
            rt.env["fail"] = False
            source = RuntimeSource(rt)
            assert await source.discard(Mailer.namespace, "news", "host", "bounce") is True
            # (No await in between: the ship loop cannot have run.)
            assert await letters_shipped() == 0
