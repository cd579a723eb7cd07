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


class Idle(nj.DurableObject):
    namespace = "tests.test_descriptor_budget.Idle"

    async def touch(self) -> None:
        self.ctx.storage.put("k", 1)


async def test_idle_objects_are_bounded_by_default_whatever_the_open_file_limit(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An open object database holds ~220 KiB: by default at most DEFAULT_OPEN_DATABASES
    idle ones stay (patched to 10 here), even where the open-file limit allows far more;
    busy objects are held back only by the open-file limit."""
    import nursery_jobs._core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "DEFAULT_OPEN_DATABASES", 10)
    assert runtime_module.open_file_budget() > 10
    async with nj.open_runtime(tmp_path / "data", idle_timeout=3600) as rt:
        assert rt.max_active == 10
        for i in range(30):
            await rt.get(Idle, f"i{i}").touch()
        await trio.sleep(0.01)
        resident = [i for i in range(30) if rt.is_active(Idle.namespace, f"i{i}")]
        assert resident == list(range(20, 30))
        assert open_object_files(tmp_path / "data") == 10


@pytest.mark.parametrize("dormant_after", [None, 0.5])
async def test_busy_objects_never_open_more_databases_than_the_budget(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    dormant_after: float | None,
) -> None:
    import nursery_jobs._core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "open_file_budget", lambda: 3)
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


class Relay(nj.DurableObject):
    namespace = "tests.test_descriptor_budget.Relay"

    async def relay(self, to: str) -> str:
        # Holds its database open (a call in progress) while it waits for another object.
        return str(await self.ctx.get(Echo, to).echo(self.ctx.id))


class Echo(nj.DurableObject):
    namespace = "tests.test_descriptor_budget.Echo"

    async def echo(self, value: str) -> str:
        return f"echo {value}"


@pytest.mark.parametrize("dormant", [False, True])
async def test_calls_between_objects_never_deadlock_when_every_file_is_held_by_a_caller(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    dormant: bool,
) -> None:
    """Every budgeted file is held by an object whose call waits for another object
    (not active, or dormant: its file closed): none of them can give its file up before
    that object answers, so that object opens past the budget rather than wait forever
    (a deadlock)."""
    import nursery_jobs._core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "open_file_budget", lambda: 3)
    monkeypatch.setattr(runtime_module, "default_max_active", lambda: 3)
    answers: list[str] = []
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path / "data", idle_timeout=3600,
                                   dormant_after=0.5 if dormant else None) as rt:
            if dormant:
                for i in range(3):
                    await rt.get(Echo, f"e{i}").echo("first")
                await trio.sleep(1)
                assert open_object_files(tmp_path / "data") == 0
                assert all(rt.is_active(Echo.namespace, f"e{i}") for i in range(3))
            start = trio.current_time()

            async def relay(i: int) -> None:
                answers.append(await rt.get(Relay, f"r{i}").relay(f"e{i}"))

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(relay, i)
            assert sorted(answers) == ["echo r0", "echo r1", "echo r2"]
            assert trio.current_time() == start


async def test_a_wake_cancelled_while_the_database_opens_gives_its_file_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call to a dormant object, cancelled while its database is still being opened
    again (waiting for a close in a worker thread to finish), leaves the object dormant
    and no longer counted as open: the file it never opened is free for another."""
    from nursery_jobs._engines.files._object import SqliteObject

    wake = SqliteObject.wake
    slow = trio.Event()

    async def slow_wake(self: SqliteObject) -> None:
        if not slow.is_set():
            await trio.sleep(10)  # (as a close still running in its thread)
        await wake(self)

    monkeypatch.setattr(SqliteObject, "wake", slow_wake)
    with trio.fail_after(HANG):
        async with nj.open_runtime(tmp_path / "data", idle_timeout=3600,
                                   dormant_after=0.5) as rt:
            echo = rt.get(Echo, "e")
            await echo.echo("first")
            await trio.sleep(1)
            assert rt.is_active(Echo.namespace, "e") and rt.active_database(
                Echo.namespace, "e") is None  # dormant
            with trio.move_on_after(1):
                await echo.echo("cut off")
            assert ("tests.test_descriptor_budget.Echo", "e") not in rt._open
            slow.set()
            assert await echo.echo("again") == "echo again"
            assert ("tests.test_descriptor_budget.Echo", "e") in rt._open
