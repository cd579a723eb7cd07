"""``nursery_jobs.testing``: the ``nj_runtime`` fixture, ``run_until_idle`` and the
readers of an object's jobs and dead letters, used on two of the examples."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs import testing
from nursery_jobs.testing import EPOCH, dead_letters_of, jobs_of, run_until_idle

# The fixtures (installed, the package's pytest11 entry point registers them; tests here
# run from the source tree, so they take them by name, and autojump_clock with them).
nj_runtime = testing.nj_runtime
nj_runtime_options = testing.nj_runtime_options

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
pytest_plugins = ["pytester"]


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


upload_queue = load_example("upload_queue")
cleanup_agent = load_example("cleanup_agent")


class Worker(nj.DurableObject):
    namespace = "tests.test_testing_helpers.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.gate = trio.Event()

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "sleep":
            await trio.sleep(ctx.job.payload)
        elif ctx.job.fn == "fail":
            raise ValueError(f"bad input {ctx.job.payload!r}")
        elif ctx.job.fn == "wait":
            await self.gate.wait()
        self.ctx.storage.put(f"done:{ctx.job.id}", nj.now())
        return None

    async def done(self) -> dict[str, Any]:
        return self.ctx.storage.list("done:")


async def test_the_fixture_runs_in_memory_with_exact_times(
    autojump_clock: Any, nj_runtime: nj.Runtime
) -> None:
    assert nj_runtime.path is None
    assert nj.now() == EPOCH
    worker = nj_runtime.get(Worker, "w")
    await worker.push("plain", id="later", delay=10)
    await run_until_idle(nj_runtime)
    assert nj.now() == EPOCH  # nothing was due: the clock did not move
    (job,) = jobs_of(nj_runtime, Worker, "w")
    assert (job.id, job.time, job.attempts) == ("later", EPOCH + 10, 0)
    await trio.sleep(10)
    await run_until_idle(nj_runtime)
    assert await worker.done() == {"done:later": EPOCH + 10}
    assert jobs_of(nj_runtime, Worker.namespace, "w") == []


async def test_run_until_idle_waits_for_runs_in_flight(
    autojump_clock: Any, nj_runtime: nj.Runtime
) -> None:
    worker = nj_runtime.get(Worker, "w")
    await worker.push("sleep", id="a", payload=5)
    await worker.push("sleep", id="b", payload=2)
    await run_until_idle(nj_runtime)
    assert nj.now() == EPOCH + 7  # exactly when the last due job ended
    assert await worker.done() == {"done:a": EPOCH + 5, "done:b": EPOCH + 7}


async def test_run_until_idle_leaves_later_retries_alone(
    autojump_clock: Any, nj_runtime: nj.Runtime
) -> None:
    worker = nj_runtime.get(Worker, "w")
    retry = nj.RetryOptions(max_attempts=2, base_delay=30, max_delay=30, jitter=False)
    await worker.push("fail", id="f", payload=7, retry=retry)
    await run_until_idle(nj_runtime)
    assert nj.now() == EPOCH
    (job,) = jobs_of(nj_runtime, Worker, "w")
    assert (job.time, job.attempts) == (EPOCH + 30, 1)
    assert dead_letters_of(nj_runtime, Worker, "w") == []
    await trio.sleep(30)
    await run_until_idle(nj_runtime)
    (letter,) = dead_letters_of(nj_runtime, Worker, "w")
    assert (letter.id, letter.fn, letter.attempts, letter.payload) == ("f", "fail", 2, 7)
    assert letter.error == "ValueError: bad input 7"
    assert letter.time == EPOCH + 30


async def test_run_until_idle_names_a_deadlock(
    autojump_clock: Any, nj_runtime: nj.Runtime
) -> None:
    await nj_runtime.get(Worker, "w").push("wait")
    with pytest.raises(nj.NurseryJobsError, match="no deadline will wake"):
        await run_until_idle(nj_runtime)


class TestUploadQueueExample:
    """examples/upload_queue.py, driven in virtual time."""

    @pytest.fixture
    def service(self) -> Any:
        return upload_queue.StorageService()

    @pytest.fixture
    def nj_runtime_options(self, service: Any) -> dict[str, Any]:
        return {"env": service}

    async def test_a_failing_upload_is_a_dead_letter_until_requeued(
        self, autojump_clock: Any, nj_runtime: nj.Runtime, service: Any
    ) -> None:
        uploads = nj_runtime.get(upload_queue.UploadObject, "user-42")
        for name in ["cat.jpg", "notes.txt", "huge.iso"]:
            await uploads.enqueue_upload(name)
        assert [j.id for j in jobs_of(nj_runtime, upload_queue.UploadObject, "user-42")] == [
            "upload:cat.jpg", "upload:notes.txt", "upload:huge.iso"]
        await run_until_idle(nj_runtime)
        assert "notes.txt" in service.stored
        await trio.sleep(1)  # past every backoff still pending (at most 0.2 s each)
        await run_until_idle(nj_runtime)
        assert sorted(service.stored) == ["cat.jpg", "notes.txt"]
        assert jobs_of(nj_runtime, upload_queue.UploadObject, "user-42") == []
        (letter,) = dead_letters_of(nj_runtime, upload_queue.UploadObject, "user-42")
        assert (letter.owner, letter.id, letter.attempts) == ("queue", "upload:huge.iso", 3)
        assert letter.error == "ConnectionError: huge.iso: 413 payload too large"

        service.rejects.clear()
        assert await uploads.requeue_dead_letters() == 1
        await run_until_idle(nj_runtime)
        assert sorted(service.stored) == ["cat.jpg", "huge.iso", "notes.txt"]
        assert dead_letters_of(nj_runtime, upload_queue.UploadObject, "user-42") == []


class TestCleanupAgentExample:
    """examples/cleanup_agent.py: the job reschedules itself every period, exactly."""

    @pytest.fixture
    def nj_runtime_options(self) -> dict[str, Any]:
        return {"env": {"cleanup_period": 60.0}}

    async def test_the_cleanup_job_keeps_its_period(
        self, autojump_clock: Any, nj_runtime: nj.Runtime
    ) -> None:
        agent = nj_runtime.get(cleanup_agent.CleanupAgent, "sessions")
        await agent.add_session("short", ttl=30)
        await agent.add_session("long", ttl=3600)
        await agent.request_cleanup()
        await agent.request_cleanup()  # the stable id keeps one job
        (job,) = jobs_of(nj_runtime, cleanup_agent.CleanupAgent, "sessions")
        assert (job.id, job.time) == ("cleanup", EPOCH + 60)
        await trio.sleep(60)
        await run_until_idle(nj_runtime)
        assert await agent.sessions() == ["long"]
        (job,) = jobs_of(nj_runtime, cleanup_agent.CleanupAgent, "sessions")
        assert job.time == EPOCH + 120


def test_the_plugin_runs_nj_runtime_tests_under_autojump(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(textwrap.dedent("""
        import trio
        import nursery_jobs as nj
        from nursery_jobs.testing import EPOCH, run_until_idle

        async def test_virtual_time(nj_runtime):
            await trio.sleep(3600)          # instant under the autojump clock
            await run_until_idle(nj_runtime)
            assert nj.now() == EPOCH + 3600
    """))
    result = pytester.runpytest_subprocess(
        "-p", "no:nursery_jobs", "-p", "nursery_jobs.testing",
        "-o", "trio_mode=true", "-W", "error",
    )
    result.assert_outcomes(passed=1)


def test_without_pytest_trio_the_fixture_names_the_test_extra_in_one_line(
    pytester: pytest.Pytester,
) -> None:
    # pytest-trio disabled (as if not installed): the test fails at setup with one line
    # that names the extra, not with pytest's "async fixture" or strict-marker noise.
    pytester.makepyfile(textwrap.dedent("""
        async def test_needs_the_runtime(nj_runtime):
            raise AssertionError("never runs")

        def test_a_plain_test_is_left_alone():
            pass
    """))
    result = pytester.runpytest_subprocess(
        "-p", "no:trio", "-p", "no:nursery_jobs", "-p", "nursery_jobs.testing",
        "--strict-markers", "-W", "error",
    )
    result.assert_outcomes(passed=1, errors=1)
    line = "nj_runtime needs pytest-trio: pip install 'nursery_jobs[test]'"
    shown = [text for text in result.outlines if line in text]
    assert shown, result.outlines
    assert "never runs" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str()
