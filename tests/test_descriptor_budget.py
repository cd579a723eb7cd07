"""The open-file budget holds whatever state objects are in (issue 22.5).

``max_active=None`` means what the open-file limit allows. Every open object database
counts against that budget — busy, idle, asked to doze but not dozed yet — and an
object that would go past it waits for a database to close, instead of opening one
more (with dormancy on, 2,327 databases were open against a budget of 1,920: "cannot
be opened" 40,699 times, and the application's own ``open()`` failed). The budget is
patched down to 3 here; what is counted is the process's real open files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import EPOCH

import nursery_jobs as nj

HANG = 100_000


def open_object_files(data: Path) -> int:
    """Object databases (not their WAL) this process holds open under ``data``."""
    objects = str(data / "objects")
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(objects) and target.endswith(".sqlite3"):
            count += 1
    return count


class Worker(nj.DurableObject):
    namespace = "tests.test_descriptor_budget.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, **kwargs: Any) -> None:
        await self.lifecycle.jobs.push("work", **kwargs)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.env["most"] = max(self.env["most"], open_object_files(self.env["data"]))
        await trio.sleep(1)  # busy: it may neither doze nor leave meanwhile
        self.env["done"].append(self.ctx.id)
        return None


@pytest.mark.parametrize("dormant_after", [None, 0.5])
async def test_busy_objects_never_open_more_databases_than_the_budget(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    dormant_after: float | None,
) -> None:
    import nursery_jobs._core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "default_max_active", lambda: 3)
    data = tmp_path / "data"
    env: dict[str, Any] = {"data": data, "most": 0, "done": []}
    errors: list[nj.Event] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(data, env=env, idle_timeout=3600,
                                   dormant_after=dormant_after) as rt:
            rt.events.add_listener(
                lambda e: errors.append(e) if e.type in ("alarm:retry", "object:error")
                else None)
            for i in range(12):
                await rt.get(Worker, f"w{i}").push(time=EPOCH + 10)
            await trio.sleep(60)
            assert sorted(env["done"], key=lambda s: int(s[1:])) == [f"w{i}" for i in range(12)]
            assert env["most"] <= 3
            assert open_object_files(data) <= 3
            assert errors == []
