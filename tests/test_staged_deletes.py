"""The deletes of finished jobs wait, staged, for their group's next savepoint or
commit (issue 14). They belong to the group: a group that is lost takes them with it,
so its jobs run again on storage as it was — and a counter still ends exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from fault_seam import FaultPlan, faulty_engine

import nursery_jobs as nj

JOBS = 5


class Counter(nj.DurableObject):
    namespace = "tests.staged.Counter"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.runs: list[str] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self, completion_group=64)

    async def fill(self) -> None:
        with self.ctx.storage.transaction():
            for i in range(JOBS):
                await self.lifecycle.jobs.push("count", id=f"j{i}", delay=1)

    async def state(self) -> tuple[int, list[str]]:
        return self.ctx.storage.get("n", 0), [job.id for job in self.lifecycle.jobs.list()]

    async def peek(self) -> list[str]:
        """A read inside the running job: it sees the finished jobs gone."""
        return [job.id for job in self.lifecycle.jobs.list()]

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.runs.append(ctx.job.id)
        self.ctx.storage.put("n", self.ctx.storage.get("n", 0) + 1)
        if ctx.job.id == "j3":
            # Reads see the staged deletes of j0..j2 (settled before the read).
            self.ctx.storage.put("seen", [job.id for job in self.lifecycle.jobs.list()])


def _fails_once(match: str, of: str = "Counter") -> FaultPlan:
    """The first ``match`` statement of the alarm run fails (the plan is enabled once
    the jobs are pushed)."""
    fired: list[bool] = []

    def when(label: str, sql: str, n: int) -> bool:
        if not fired and sql.lstrip().startswith(match):
            fired.append(True)
            return True
        return False

    return FaultPlan(message="disk I/O error", when=when, enabled=False,
                     counts=lambda label: of in label)


@pytest.mark.parametrize("statement", ["COMMIT", "DELETE FROM nj_jobs WHERE seq IN"])
def test_a_lost_group_takes_its_staged_deletes_with_it(tmp_path: Path, statement: str) -> None:
    plan = _fails_once(statement)
    runs: list[str] = []

    async def main() -> tuple[int, list[str], Any]:
        async with nj.open_runtime(faulty_engine(tmp_path / "data", plan), env=runs) as rt:
            obj = rt.get(Counter, "c")
            await obj.fill()
            plan.enabled = True
            await trio.sleep(30)  # the run, its failure, the retried run
            n, pending = await obj.state()
            seen = rt.active_instance(Counter.namespace, "c")
            assert seen is not None
            async with seen.ctx.turn():
                return n, pending, seen.ctx.storage.get("seen")

    n, pending, seen = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert plan.hits, "the fault never fired"
    assert pending == []
    assert n == JOBS  # exactly once: the lost group's jobs ran again on the old storage
    assert sorted(set(runs)) == [f"j{i}" for i in range(JOBS)]
    assert len(runs) > JOBS  # some ran twice (their first outcome was lost with the group)
    # A read in the run sees the staged deletes: what j3's last (kept) run read is what
    # had not finished by then — itself, and the jobs whose last run came after it.
    last = {job: index for index, job in enumerate(runs)}
    assert set(seen) == {job for job in last if last[job] >= last["j3"]}
    assert not {"j0", "j2"} & set(seen)


def test_a_group_rolled_back_by_a_read_keeps_its_jobs(tmp_path: Path) -> None:
    """j0..j2 finish (deletes staged); j3's first read fails and rolls the group back:
    j0..j2 ran on storage that is gone, so they must run again — not be deleted by the
    next transaction (the failed job's retry) that settles what was staged."""
    reads: list[int] = []

    def when(label: str, sql: str, n: int) -> bool:
        if sql.startswith("SELECT value FROM nj_kv"):
            reads.append(n)
            return len(reads) == 4  # j3's read of "n"
        return False

    plan = FaultPlan(message="disk I/O error", when=when, enabled=False, rolls_back=True,
                     counts=lambda label: "Counter" in label)
    runs: list[str] = []

    async def main() -> tuple[int, list[str]]:
        async with nj.open_runtime(faulty_engine(tmp_path / "data", plan), env=runs) as rt:
            obj = rt.get(Counter, "c")
            await obj.fill()
            plan.enabled = True
            await trio.sleep(30)
            return await obj.state()

    n, pending = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert plan.hits, "the fault never fired"
    assert pending == []
    assert n == JOBS
    assert runs[:4] == ["j0", "j1", "j2", "j3"]
    assert sorted(runs[4:]) == ["j0", "j1", "j2", "j3", "j4"]  # the lost group's jobs again


class Beside(nj.DurableObject):
    """A job and a call that would write into the same group, each pausing mid-way (the
    call waits for the job's turn instead)."""

    namespace = "tests.staged.Beside"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.env: dict[str, Any] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self) -> None:
        await self.lifecycle.jobs.push("j", id="j", delay=1)

    def _bump(self, key: str) -> None:
        self.ctx.storage.put(key, self.ctx.storage.get(key, 0) + 1)

    async def poke(self) -> None:
        self._bump("B")  # in its own turn: never in the alarm run's open group
        await self.env["hold"].wait()

    async def state(self) -> dict[str, int]:
        return {key: self.ctx.storage.get(key, 0) for key in ("A", "B", "C")}

    async def on_job(self, ctx: nj.JobContext) -> None:
        self._bump("A")
        await self.env["go"].wait()
        self._bump("C")


def test_a_call_made_while_a_job_whose_group_is_lost_runs_writes_after_it(
    tmp_path: Path,
) -> None:
    """A job's outcome cannot be recorded (a fault at its savepoint's release): the group
    is rolled back so the job runs again on storage as it was. A call made while the job
    ran waited for its turn (it was never part of that group), so its write stands and it
    reports success; the job's effects land exactly once."""
    plan = _fails_once("RELEASE nj_job", of="Beside")
    env: dict[str, Any] = {"go": trio.Event(), "hold": trio.Event()}

    async def main() -> tuple[BaseException | None, dict[str, int]]:
        async with nj.open_runtime(faulty_engine(tmp_path / "data", plan), env=env) as rt:
            obj = rt.get(Beside, "b")
            await obj.push()
            await trio.sleep(1.5)  # j runs: A written, waiting for "go"
            outcome: list[BaseException | None] = []

            async def poke() -> None:
                try:
                    await obj.poke()
                    outcome.append(None)
                except nj.StorageError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(poke)
                await trio.sleep(0.1)  # the call waits for the running job's turn
                plan.enabled = True
                env["go"].set()  # j writes C, returns; its release fails
                await trio.sleep(0.1)
                env["hold"].set()
            await trio.sleep(30)  # j runs again (with "go" set, straight through)
            return outcome[0], await obj.state()

    error, state = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert plan.hits and plan.hits[0][1] == "RELEASE nj_job"
    assert error is None
    assert state == {"A": 1, "B": 1, "C": 1}  # the job exactly once; the call's write too


class Reader(nj.DurableObject):
    """Jobs that write, and one that reads the queue inside its savepoint, then fails."""

    namespace = "tests.staged.Reader"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.runs: list[str] = ctx.env
        self.lifecycle = nj.Lifecycle.install(self, completion_group=64)

    async def fill(self) -> None:
        with self.ctx.storage.transaction():
            for i in range(JOBS):
                await self.lifecycle.jobs.push("count", id=f"j{i}", delay=1,
                                               retry=nj.RetryOptions(max_attempts=2,
                                                                     jitter=False))

    async def state(self) -> tuple[dict[str, int], list[str]]:
        counts = {f"j{i}": self.ctx.storage.get(f"j{i}", 0) for i in range(JOBS)}
        return counts, [job.id for job in self.lifecycle.jobs.list()]

    async def on_job(self, ctx: nj.JobContext) -> None:
        job = ctx.job.id
        self.runs.append(job)
        self.ctx.storage.put(job, self.ctx.storage.get(job, 0) + 1)  # opens its savepoint
        if job == "j3" and ctx.attempt == 1:
            # The read runs j0..j2's staged deletes, under j3's savepoint...
            assert [j.id for j in self.lifecycle.jobs.list()] == ["j3", "j4"]
            raise RuntimeError("j3 fails")  # ...which now rolls back, and them with it


def test_deletes_run_under_a_failing_jobs_savepoint_are_staged_again() -> None:
    """The deletes of finished jobs stay staged while the next job's savepoint opens (a
    job that writes costs no DELETE of its own). A read in that job runs them under its
    savepoint; when the job fails, the rollback undoes them too. They are staged again:
    the finished jobs never run twice, and the queue ends empty."""
    runs: list[str] = []

    async def main() -> tuple[dict[str, int], list[str]]:
        async with nj.open_runtime(env=runs) as rt:
            obj = rt.get(Reader, "r")
            await obj.fill()
            await trio.sleep(30)
            return await obj.state()

    counts, pending = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert runs == ["j0", "j1", "j2", "j3", "j4", "j3"]  # j3 once more, on its retry
    assert counts == {f"j{i}": 1 for i in range(JOBS)}  # exactly once, j3's failure undone
    assert pending == []
