"""The long-work examples run as scripts in a subprocess (real time, a fresh data
directory) and print what they should: the import heartbeat resumes from its checkpoint
after a restart; the PDF summariser (one object per request) summarises the good files
and dead-letters the corrupt ones after their retries."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(script: str, tmp_path: Path) -> str:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), str(data)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert (data / "catalog.sqlite3").exists()  # durable state went to data-dir
    return done.stdout


def test_import_heartbeat_resumes_from_its_checkpoint_after_a_restart(tmp_path: Path) -> None:
    out = run_example("import_heartbeat.py", tmp_path)
    deploy = re.search(r"deploy: stopping the runtime at (\d+)/60 rows", out)
    done = re.search(
        r"imported 60 rows of 60: started at row 0, resumed from the checkpoint at row (\d+)$",
        out, re.MULTILINE,
    )
    assert deploy and done, out
    # Resumed from the last committed batch: past the start, not past what the
    # stopped runtime had committed.
    assert 0 < int(done[1]) <= int(deploy[1]) + 5, out
    assert f"heartbeat: no import in this activation; starting at row {done[1]}" in out
    assert "heartbeat: import complete (60 rows); the heartbeat stops" in out


def test_pdf_summariser_summarises_and_dead_letters_after_retries(tmp_path: Path) -> None:
    out = run_example("pdf_summariser.py", tmp_path)
    assert "queued 20 summarise requests, one object each" in out, out
    # 7 flaky files time out once; 2 corrupt ones fail all 3 attempts (2 retries each).
    assert "11 attempts failed and were retried" in out, out
    assert "summarised 18 of 20; 2 in the dead letters:" in out, out
    for doc in ("doc-07", "doc-13"):
        assert (f"  {doc}: ValueError: s3://inbox/{doc}.pdf: not a PDF (bad xref table)"
                " (3 attempts)") in out, out
    assert len(re.findall(r"\(attempt 2\)$", out, re.MULTILINE)) == 7, out
    assert "objects in memory once idle: 0" in out, out
