"""Issue 10 #9: Ctrl-C under load reaches the application as a plain KeyboardInterrupt,
never as ``BaseExceptionGroup([KeyboardInterrupt()])`` — with a real process, a real
SIGINT, and the Trio thread busy in jobs (where the signal lands inside a runtime
task, not in the application's own code)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("interrupt_worker.py")
ROOT = Path(__file__).parent.parent


def interrupt_under_load(tmp_path: Path, objects: int) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(tmp_path / "data"), str(objects)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.stderr else ""
        time.sleep(0.3)  # deep in the load
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("run", range(3))
def test_ctrl_c_under_load_is_a_plain_keyboard_interrupt(tmp_path: Path, run: int) -> None:
    done = interrupt_under_load(tmp_path, objects=64)
    # Python reports an uncaught KeyboardInterrupt by dying of SIGINT (shell: 130).
    assert done.returncode == -signal.SIGINT, done.stderr
    assert done.stderr.rstrip().endswith("KeyboardInterrupt"), done.stderr
    assert "ExceptionGroup" not in done.stderr, done.stderr


def test_lone_interrupt_finds_a_keyboard_interrupt_among_cancellations() -> None:
    import trio

    from nursery_jobs._errors import lone_interrupt

    ki = KeyboardInterrupt()
    cancelled = trio.Cancelled._create()
    nested = BaseExceptionGroup("runtime", [BaseExceptionGroup("object", [ki]), cancelled])
    assert lone_interrupt(nested) is ki
    assert lone_interrupt(BaseExceptionGroup("x", [cancelled])) is None
    # A real error beside it stays visible in its group.
    assert lone_interrupt(BaseExceptionGroup("x", [ki, RuntimeError("bug")])) is None
    assert lone_interrupt(
        BaseExceptionGroup("x", [ki, BaseExceptionGroup("y", [ValueError()])])
    ) is None
