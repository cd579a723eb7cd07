"""Stopping a runtime (DESIGN section 2, "Stopping"): the signals in ``stop_on``
(SIGTERM by default) are a graceful stop of the runtime's block, never a crash: running
jobs are cancelled, keep their attempts, get no crash strike and run again at once on
the next start, and the block exits normally."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

import nursery_jobs as nj

WORKER = Path(__file__).with_name("stop_worker.py")


class Sleeper(nj.DurableObject):
    namespace = "tests.test_stopping.Sleeper"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.env: Log = ctx.env

    async def push(self) -> None:
        await self.lifecycle.jobs.push("sleep", id="sleep")

    async def jobs(self) -> list[str]:
        return [job.id for job in self.lifecycle.jobs.list()]

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env.append(f"start {ctx.attempt}")
        self.env.started.set()
        await trio.sleep(100)
        self.env.append("done")


class Log(list[str]):
    """What the jobs did, and an event set when one starts."""

    def __init__(self) -> None:
        super().__init__()
        self.started = trio.Event()


async def test_stop_on_empty_leaves_signals_to_the_application(tmp_path: Path) -> None:
    """``stop_on=()``: the runtime installs no handler; the application's stays."""
    with trio.open_signal_receiver(signal.SIGUSR1) as received:
        async with nj.open_runtime(None, stop_on=()):
            os.kill(os.getpid(), signal.SIGUSR1)
            with trio.fail_after(5):
                async for signum in received:
                    assert signum == signal.SIGUSR1
                    break


class Cleaner(nj.DurableObject):
    """Job "clean": when cancelled, it raises SIGTERM again (a supervisor repeating it)
    from its cleanup, then checkpoints."""

    namespace = "tests.test_stopping.Cleaner"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.env: Log = ctx.env

    async def push(self) -> None:
        await self.lifecycle.jobs.push("clean", id="clean")

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.env.started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            signal.raise_signal(signal.SIGTERM)
            with trio.CancelScope(shield=True):
                await trio.lowlevel.checkpoint()
                self.env.append("cleaned")
            raise


@pytest.fixture
def app_handler() -> Iterator[list[int]]:
    """The application's own SIGTERM handler, recording what reaches it."""
    reached: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: reached.append(signum))
    try:
        yield reached
    finally:
        signal.signal(signal.SIGTERM, before)


async def test_a_second_sigterm_while_jobs_wind_down_is_caught_and_does_nothing_more(
    app_handler: list[int],
) -> None:
    """The stop signals stay the runtime's until everything is stopped: one raised from
    a job's cleanup, after the block has ended, neither reaches the previous handler
    (the default one kills the process) nor changes the stop; the previous handler is
    back afterwards."""
    log = Log()
    reached_body_end = False
    async with nj.open_runtime(None, env=log) as rt:
        await rt.get(Cleaner, "c").push()
        with trio.fail_after(5):
            await log.started.wait()
        signal.raise_signal(signal.SIGTERM)
        await trio.sleep_forever()
        reached_body_end = True
    assert not reached_body_end and log == ["cleaned"]
    assert app_handler == []
    signal.raise_signal(signal.SIGTERM)
    assert app_handler == [signal.SIGTERM]


async def test_sigterm_while_the_http_face_starts_stops_the_block_at_once(
    app_handler: list[int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal while ``open_runtime(http=...)`` starts its face is already the
    runtime's: the block is stopped from its first moment."""
    from nursery_jobs._core import _runtime

    async def face(rt: object, nursery: trio.Nursery, address: object, *,
                   writes: bool) -> None:
        signal.raise_signal(signal.SIGTERM)
        await trio.lowlevel.checkpoint()

    monkeypatch.setattr(_runtime, "_http_face", face)
    entered = False
    with trio.fail_after(5):
        async with nj.open_runtime(None, http=("127.0.0.1", 0)):
            entered = True
            await trio.sleep_forever()
    assert entered and app_handler == []


@pytest.mark.parametrize("bad", ["SIGTERM", [signal.SIGKILL], [999], [True], 15])
async def test_bad_stop_on_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="stop_on"):
        async with nj.open_runtime(None, stop_on=bad):  # type: ignore[arg-type]
            pass


@pytest.mark.crash
def test_a_real_sigterm_during_a_long_job_exits_at_once_and_the_job_reruns(
    tmp_path: Path,
) -> None:
    """What a container stop does: SIGTERM to the process during a 30 s job. It exits 0
    within seconds; the next start runs the job again at once, as the same attempt,
    with no crash strike."""
    data = str(tmp_path / "data")

    def run(mode: str, seconds: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(WORKER), data, mode, seconds],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    first = run("push", "30")
    assert first.stdout is not None
    lines = [first.stdout.readline().strip() for _ in range(2)]
    assert sorted(lines) == ["start 1", "up"], lines
    stopped_at = time.monotonic()
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    assert time.monotonic() - stopped_at < 10
    assert out.split() == ["exited"]
    assert "crash" not in err.lower()

    started = time.monotonic()
    second = run("resume", "0.2")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert "start 1" in out and "done" in out, out
    assert "crash" not in err.lower(), err
    assert time.monotonic() - started < 10  # at once, not after a 30 s strike delay


SIGNAL_WORKER = Path(__file__).with_name("signal_worker.py")


class Lines:
    """The stdout lines of a process, read by a thread: wait for one with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [self.queue.put(line.strip()) for line in stdout],
                         daemon=True).start()

    def next(self, timeout: float) -> str:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None


def test_ctrl_c_during_a_cpu_bound_job_is_no_strike_three_times_over(tmp_path: Path) -> None:
    """Issue 22 #3: a KeyboardInterrupt that lands inside a CPU-bound job's code was a
    crash strike for the job, and three Ctrl-Cs sealed a healthy job. A signal is never
    the job's failure: no strike, no attempt used, the job runs again at once."""
    data = str(tmp_path / "data")

    def run(mode: str, seconds: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(SIGNAL_WORKER), data, mode, seconds],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    for n in range(3):
        proc = run("push" if n == 0 else "resume", "60")
        lines = Lines(proc)
        # At once: a strike would delay the job by 30 s (60 s after two).
        assert sorted([lines.next(10), lines.next(10)]) == ["start 1", "up"]
        time.sleep(0.2)  # deep in the spin
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGINT, err
        assert err.rstrip().endswith("KeyboardInterrupt"), err
        assert "strike" not in err.lower() and "ExceptionGroup" not in err, err
    last = run("resume", "0.2")
    out, err = last.communicate(timeout=60)
    assert last.returncode == 0, err
    assert out.split("\n")[:4] == ["up", "start 1", "done", "dead 0"], out
    assert "strike" not in err.lower(), err


def test_system_exit_from_a_job_exits_with_its_status(tmp_path: Path) -> None:
    """Issue 22 #3: ``SystemExit(3)`` raised by a job escaped as a nested exception
    group, and the process exited 1."""
    done = subprocess.run(
        [sys.executable, str(SIGNAL_WORKER), str(tmp_path / "data"), "exit", "1"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert "ExceptionGroup" not in done.stderr, done.stderr
    assert done.stdout.split() == ["up", "start", "1"], done.stdout
