"""The examples run as scripts in a subprocess (real time, a fresh data directory) and
print what they should. Each takes a few seconds at most."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Script -> lines its output must hold.
EXPECTED = {
    "upload_queue.py": [
        "retrying upload:cat.jpg (attempt 2 of 3)",
        "gave up on huge.iso: huge.iso: 413 payload too large",
        "dead letters: ['huge.iso (3 attempts, last error: ConnectionError: huge.iso: 413"
        " payload too large)']",
        "requeued: 1",
        "stored: ['cat.jpg', 'dog.jpg', 'huge.iso', 'notes.txt', 'report.pdf']",
        "dead letters left: 0",
    ],
    "reminders_agent.py": [
        "schedules: 4",
        "reminder: stretch your legs",
        "reminder: drink some water",
        "inbox check #1",
        "schedules after restart: 2",
    ],
    "batch_processor.py": [
        "request-1: 2000 items queued as 8 batches",
        "request-1/3 failed (ConnectionError('batch 3: worker went away')); retry in 1 s",
        "request-1 complete: 2000 items in 8 batches, sum 1999000,"
        " batch order [0, 1, 2, 4, 5, 6, 7, 3]",
    ],
}


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_and_reports(script: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), str(data)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    for line in EXPECTED[script]:
        assert line in done.stdout, f"{line!r} missing from:\n{done.stdout}\n{done.stderr}"
    # Durable state went to the data directory given on the command line.
    assert (data / "catalog.sqlite3").exists()
    assert not (tmp_path / "data" / "data").exists()
