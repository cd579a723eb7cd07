"""The fault sweep (issue 10): ``disk I/O error`` on the Nth statement of one object's
database, for every N over a short workload — push, run, retry, dead letter, reopen —
once (transient) and from N on until cleared (persistent).

Each run passes when: every fault ends as a typed ``StorageError`` to the caller or a
retry (never a raw ``sqlite3`` error, never a dead runtime); nothing hangs (each step
under ``trio.fail_after(5)``); the other object's identical workload is untouched; and,
once the fault clears, the workload completes with nothing accepted lost (every push
that returned is done or dead-lettered as its job says).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from fault_seam import FaultPlan, faulty_engine

import nursery_jobs as nj

JOBS = ("ok", "flaky", "bad")
AFTER_REOPEN = ("after",)
# What each job ends as once every fault has cleared.
FINAL = {"done": ["after", "flaky", "ok"], "pending": [], "dead": ["bad"], "runs": [1]}


class Worker(nj.DurableObject):
    namespace = "tests.sweep.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self, completion_group=4)

    async def push(self, job_id: str) -> None:
        retry = nj.RetryOptions(max_attempts=2 if job_id == "bad" else 3, base_delay=1.0,
                                max_delay=1.0, jitter=False)
        await self.lifecycle.jobs.push("work", id=job_id, retry=retry)

    async def state(self) -> dict[str, list[str]]:
        return {
            "done": sorted(k.removeprefix("done:") for k in self.ctx.storage.list("done:")),
            "pending": sorted(job.id for job in self.lifecycle.jobs.list()),
            "dead": sorted(letter.job.id for letter in self.lifecycle.dead_letters()),
            "runs": sorted(set(self.ctx.storage.list("runs:").values())),
        }

    async def on_job(self, ctx: nj.JobContext) -> None:
        job_id = ctx.job.id
        if job_id == "bad" or (job_id == "flaky" and ctx.attempt == 1):
            raise RuntimeError(f"{job_id} fails (attempt {ctx.attempt})")
        self.ctx.storage.put(f"done:{job_id}", ctx.attempt)
        # Exactly-once local effects: each job's count ends at 1, whatever failed.
        self.ctx.storage.put(f"runs:{job_id}", self.ctx.storage.get(f"runs:{job_id}", 0) + 1)


@attrs.define
class Outcome:
    errors: list[BaseException] = attrs.Factory(list)  # what steps raised
    retries: int = 0  # alarm:retry and job:retry events of the faulty object
    crashes: list[str] = attrs.Factory(list)  # object:error events
    dropped: int = 0  # alarm:failed events
    accepted: set[str] = attrs.Factory(set)  # pushes of "a" that returned
    other: dict[str, Any] = attrs.Factory(dict)  # the state of object "b"


async def _step(outcome: Outcome, fn: Any, *args: Any) -> bool:
    with trio.fail_after(5):
        try:
            await fn(*args)
        except nj.NurseryJobsError as exc:
            outcome.errors.append(exc)
            return False
        except Exception as exc:  # a raw error: recorded, and the run fails
            outcome.errors.append(exc)
            return False
    return True


def _listen(rt: Any, outcome: Outcome) -> None:
    def on_event(event: nj.Event) -> None:
        if event.object_id != "a":
            return
        if event.type in ("alarm:retry", "job:retry"):
            outcome.retries += 1
        elif event.type == "object:error":
            outcome.crashes.append(str(event.data.get("error")))
        elif event.type == "alarm:failed":
            outcome.dropped += 1

    rt.events.add_listener(on_event)


async def workload(data: Path, plan: FaultPlan) -> Outcome:
    """The faulty phase: both objects run the same work; only "a" has faults."""
    outcome = Outcome()
    async with nj.open_runtime(faulty_engine(data, plan)) as rt:
        _listen(rt, outcome)
        for job_id in JOBS:
            for oid in ("a", "b"):
                if await _step(outcome, rt.get(Worker, oid).push, job_id) and oid == "a":
                    outcome.accepted.add(job_id)
        await trio.sleep(10)  # run, retry, dead letter
    async with nj.open_runtime(faulty_engine(data, plan)) as rt:  # reopen
        _listen(rt, outcome)
        for job_id in AFTER_REOPEN:
            for oid in ("a", "b"):
                if await _step(outcome, rt.get(Worker, oid).push, job_id) and oid == "a":
                    outcome.accepted.add(job_id)
        await trio.sleep(10)
        with trio.fail_after(5):
            outcome.other = await rt.get(Worker, "b").state()
    return outcome


async def recover(data: Path, plan: FaultPlan, outcome: Outcome) -> dict[str, Any]:
    """The fault has cleared: push again what was refused, wait for the work to end."""
    plan.enabled = False
    async with nj.open_runtime(faulty_engine(data, plan)) as rt:
        for job_id in JOBS + AFTER_REOPEN:
            if job_id not in outcome.accepted:
                with trio.fail_after(5):
                    await rt.get(Worker, "a").push(job_id)
        with trio.fail_after(1000):
            while True:
                state: dict[str, Any] = await rt.get(Worker, "a").state()
                if state == FINAL:
                    return state
                await trio.sleep(5)  # polls virtual time


def count_statements(tmp: Path) -> int:
    plan = FaultPlan(counts=lambda label: label.endswith("/a"))

    async def main() -> None:
        await workload(tmp, plan)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return plan.n


def _check(n: int, mode: str, plan: FaultPlan, outcome: Outcome, raw_logs: list[str]) -> None:
    where = f"{mode} fault at statement {n} ({plan.hits[:1]})"
    for error in outcome.errors:
        assert isinstance(error, nj.StorageError), f"{where}: a step raised {error!r}"
    assert not outcome.dropped, f"{where}: an alarm was dropped"
    for crash in outcome.crashes:
        assert "StorageFaultError" in crash, f"{where}: the object crashed with {crash}"
    if plan.hits:
        assert outcome.errors or outcome.retries or outcome.crashes, (
            f"{where}: the fault went unnoticed")
    assert outcome.other == FINAL, f"{where}: the other object was affected: {outcome.other}"
    assert not raw_logs, f"{where}: a raw sqlite3 error was logged: {raw_logs[:1]}"


class _RawErrors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, nj.StorageError):
            self.found.append(f"{record.getMessage()}: {exc!r}")


def sweep(
    tmp_path: Path, statements: list[int], modes: tuple[str, ...],
    message: str = "disk I/O error",
) -> int:
    handler = _RawErrors()
    logger = logging.getLogger("nursery_jobs")
    logger.addHandler(handler)
    runs = 0
    try:
        for mode in modes:
            for n in statements:
                data = tmp_path / f"{mode}-{n}"
                plan = FaultPlan(
                    message=message,
                    counts=lambda label: label.endswith("/a"),
                    when=(lambda label, sql, i, n=n: i >= n) if mode == "persistent"
                    else (lambda label, sql, i, n=n: i == n),
                    rolls_back=mode == "rollback",
                )
                handler.found.clear()

                async def main(
                    data: Path = data, plan: FaultPlan = plan, n: int = n, mode: str = mode
                ) -> None:
                    outcome = await workload(data, plan)
                    _check(n, mode, plan, outcome, handler.found)
                    await recover(data, plan, outcome)

                trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
                runs += 1
    finally:
        logger.removeHandler(handler)
    return runs


def test_fault_sweep_every_statement(tmp_path: Path) -> None:
    total = count_statements(tmp_path / "count")
    assert total > 50  # the workload reaches every step
    runs = sweep(tmp_path, list(range(1, total + 1)), ("transient", "persistent", "rollback"))
    assert runs == 3 * total


@pytest.mark.soak
@pytest.mark.parametrize("message", ["database or disk is full", "database is locked"])
def test_fault_sweep_soak(tmp_path: Path, message: str) -> None:
    """Longer: the whole sweep again with the disk full, and with the file locked."""
    total = count_statements(tmp_path / "count")
    runs = sweep(tmp_path, list(range(1, total + 1)), ("transient", "persistent"), message)
    assert runs == 2 * total
