"""README's promises about itself: every Python example runs as shown (in a subprocess,
in a fresh directory), every link points at a file or heading that exists, and the
Quick start's test command is the one `.ci/run` runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _block(marker: str) -> str:
    found = [b for b in BLOCKS if marker in b]
    assert len(found) == 1, f"{len(found)} README blocks hold {marker!r}"
    return found[0]


def _run(script: str, cwd: Path) -> str:
    (cwd / "example.py").write_text(script)
    done = subprocess.run([sys.executable, "example.py"], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_python_block_compiles() -> None:
    assert len(BLOCKS) >= 7
    for block in BLOCKS:
        compile(block, "README.md", "exec")


# What a block must hold to be run by a test below.
RUN_BY_A_TEST = ("class Counter(", "class Mailer(", "class Uploads(", "class Notes(",
                 "class CleanupAgent(", "class Importer(", "class Signup(",
                 "sleep_forever()                    #", "nj_runtime")


def test_every_block_is_run_by_a_test_or_says_why_not() -> None:
    for block in BLOCKS:
        tested = [marker for marker in RUN_BY_A_TEST if marker in block]
        assert len(tested) == 1 or (not tested and block.startswith("# not run: ")), block


def test_the_durable_object_keeps_its_count(tmp_path: Path) -> None:
    block = _block("class Counter(")
    assert _run(block, tmp_path).split() == ["2"]
    assert _run(block, tmp_path).split() == ["4"]      # "Run it twice: it prints 2, then 4"


def test_the_job_runs(tmp_path: Path) -> None:
    out = _run(_block("class Mailer("), tmp_path)
    assert out.splitlines() == ["sending to ada@example.com (attempt 1)"]


def test_the_callback_examples_define_their_classes(tmp_path: Path) -> None:
    block = _block("class Uploads(")
    _run(block + "\nassert issubclass(Reminders, nj.Agent)\n", tmp_path)
    _run(_block("class Notes("), tmp_path)
    _run(_block("class CleanupAgent("), tmp_path)


def test_the_steering_example_times_out_gives_up_and_cancels(tmp_path: Path) -> None:
    out = _run(_block("class Importer("), tmp_path)
    assert out.splitlines() == ["imported quick", "stopped: True",
                                "['slow: JobTimeoutError after 1 attempt']"]


def test_the_tracing_example_links_the_run_to_the_push(tmp_path: Path) -> None:
    block = _block("class Signup(")
    out = _run(block, tmp_path)
    shown = block.split("trio.run(main)\n")[1]  # the output, as comments under the run
    assert sorted(out.splitlines()) == sorted(line.removeprefix("# ")
                                              for line in shown.splitlines())
    assert "job welcome CONSUMER ['example.Signup.register']" in out.splitlines()


def test_sigterm_stops_the_runtime_and_the_program_goes_on(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(_block("sleep_forever()                    #"))
    proc = subprocess.Popen([sys.executable, "example.py"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "serving\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out == "stopped cleanly\n"


def test_the_testing_example_passes_under_pytest(tmp_path: Path) -> None:
    block = _block("nj_runtime")
    assert block.startswith("# test_reminders.py\n")
    (tmp_path / "test_reminders.py").write_text(block)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "no:nursery_jobs", "-p", "nursery_jobs.testing", "-W", "error"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def _slug(heading: str) -> str:
    # GitHub's anchors: lower case, punctuation dropped, spaces to hyphens.
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md", "docs/performance.md"])
def test_every_link_points_at_something_that_exists(doc: str) -> None:
    path = ROOT / doc
    text = path.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"https?://", link):
            continue
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.exists(), f"{doc}: {link} points at no file"
        if anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", file.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"{doc}: no heading for {link}"
    for named in set(re.findall(r"`((?:examples|benchmarks|docs|tests)/[\w./]+)`", text)):
        assert (ROOT / named).exists(), f"{doc} names {named}, which does not exist"


def test_the_quick_start_test_command_is_what_ci_runs() -> None:
    start = README.index("Run the tests:")
    command = re.search(r"```sh\n(.*?)\n```", README[start:], flags=re.S)
    assert command is not None
    venv, install, test = (part.strip() for part in command.group(1).split("&&"))
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert venv in ci[ci.index(next(line for line in ci if "venv" in line))]
    assert any(line.endswith(install.split("pip install -q ")[1]) for line in ci
               if "pip install" in line)
    assert test in ci, f"{test!r} is not a line of .ci/run"
