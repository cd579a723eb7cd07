"""Crash recovery with real processes and real SIGKILL (DESIGN.md §3 "Durability and speed",
"Long work and memory limits").

A worker process (``tests/crash_worker.py``) runs a runtime on a data directory and logs
every job start and completion to an append-only file; this module kills it with
SIGKILL at random moments, checks every database with ``PRAGMA integrity_check`` while
it is dead, restarts it, and finally lets it finish. The log then has to tell the story
the design promises: no job lost, re-runs only where a death allows them, crash strikes
per job, a poison job sealed, and a SIGTERM that costs nothing.

Marks: ``crash`` (the short versions, run in CI) and ``soak`` (the long ones, deselected
by default: ``pytest -m soak``).

Real time: a job that was running at a kill is delayed min(300, 30 x strikes) s, and the
library has no knob to shorten that. The strict test runs on the real clock (its kills
all land within 30 s, so each job is struck at most once, and the final run waits out
one 30 s delay — which it also checks). The others run the worker's clock 20x faster
than real time (``clock_rate``, see the worker), anchored to one continuous timeline
across restarts: the delays are the library's own, they just pass quicker.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.abc
import trio.testing

import nursery_jobs as nj

WORKER = Path(__file__).with_name("crash_worker.py")
KILLED = -signal.SIGKILL


@attrs.frozen
class Line:
    kind: str
    job: str | None  # the job id for start/done/strike
    pid: int
    fields: tuple[str, ...]  # what follows the pid, less the time
    time: float

    @property
    def object_id(self) -> str:
        assert self.job is not None
        return self.job.rsplit("-", 1)[0]


@attrs.define
class Campaign:
    """One data directory, one worker config, and every run of the worker on it."""

    dir: Path
    config: dict[str, Any]
    # (pid, return code) of every run, in order.
    runs: list[tuple[int, int]] = attrs.Factory(list)
    rng: random.Random = attrs.Factory(random.Random)

    @classmethod
    def create(cls, tmp_path: Path, **config: Any) -> Campaign:
        config = {
            "data": str(tmp_path / "data"),
            "log": str(tmp_path / "jobs.log"),
            "group": 1,
            "poison": None,
            "clock_rate": 1,
            "clock_origin": time.time(),
            **config,
        }
        (tmp_path / "config.json").write_text(json.dumps(config))
        seed = random.randrange(2**32)
        print(f"campaign seed {seed}")  # shown on failure
        return cls(tmp_path, config, rng=random.Random(seed))

    @property
    def data(self) -> Path:
        return Path(self.config["data"])

    @property
    def job_ids(self) -> set[str]:
        return {f"{o}-{i:04d}" for o in self.config["objects"] for i in range(self.config["jobs"])}

    def start(self, **overrides: Any) -> subprocess.Popen[bytes]:
        n = len(self.runs)
        args = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
        stderr = open(self.dir / f"worker-{n}.err", "wb")
        with stderr:
            return subprocess.Popen(
                [sys.executable, str(WORKER), str(self.dir / "config.json"), *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            )

    def wait_for(self, proc: subprocess.Popen[bytes], kind: str, count: int = 1,
                 timeout: float = 30.0) -> bool:
        """Wait until the log holds ``count`` lines of ``kind`` from this process (True),
        or the process exits first (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for line in self.lines() if line.pid == proc.pid
                   and line.kind == kind) >= count:
                return True
            if proc.poll() is not None:
                return False
            time.sleep(0.005)
        self.stop(proc)
        raise AssertionError(f"worker {proc.pid} logged no {kind!r} within {timeout} s"
                             f"{self.stderr()}")

    def kill(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGKILL the worker (unless it already exited); return its exit code."""
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        return self.ended(proc, proc.wait(timeout=30))

    def ended(self, proc: subprocess.Popen[bytes], code: int) -> int:
        self.runs.append((proc.pid, code))
        check_integrity(self.data)
        return code

    def finish(self, timeout: float, **overrides: Any) -> int:
        """Run the worker to the end (it exits when no alarm is left)."""
        proc = self.start(**overrides)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(proc)
            raise AssertionError(f"the worker did not finish within {timeout} s"
                                 f"{self.stderr()}") from None
        return self.ended(proc, code)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def stderr(self) -> str:
        last = sorted(self.dir.glob("worker-*.err"))[-1:]
        return "".join(f"\n--- {p.name}:\n{p.read_text()[-3000:]}" for p in last)

    def lines(self) -> list[Line]:
        path = Path(self.config["log"])
        if not path.exists():
            return []
        out = []
        for raw in path.read_text().splitlines():
            parts = raw.split()
            if parts[0] in ("start", "done", "strike", "work", "mark"):
                out.append(Line(parts[0], parts[1], int(parts[2]), tuple(parts[3:-1]),
                                float(parts[-1])))
            else:
                out.append(Line(parts[0], None, int(parts[1]), tuple(parts[2:-1]),
                                float(parts[-1])))
        return out

    def killed_pids(self) -> list[int]:
        return [pid for pid, code in self.runs if code == KILLED]

    def run_index(self) -> dict[int, int]:
        return {pid: i for i, (pid, _) in enumerate(self.runs)}

    def db_rows(self, sql: str) -> list[tuple[Any, ...]]:
        """``sql`` over every object database (read-only, while no worker runs)."""
        if self.config.get("layout") == "shared":
            return shared_rows(self.data, sql)
        rows: list[tuple[Any, ...]] = []
        for path in sorted((self.data / "objects").glob("*.sqlite3")):
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows += conn.execute(sql).fetchall()
            finally:
                conn.close()
        return rows


def shared_rows(data: Path, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` over every object of a shared-layout directory: each object's stored rows
    loaded into a database of the object schema (read-only on the shared database)."""
    from nursery_jobs._engines._schema import prepare
    from nursery_jobs._engines.postgres._copy import load_rows

    shared = sqlite3.connect(f"file:{data / 'shared.sqlite3'}?mode=ro", uri=True)
    try:
        stored: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
        for ns, oid, tbl, row in shared.execute(
                "SELECT namespace, object_id, tbl, data FROM nj_rows"):
            stored[ns, oid].append((tbl, row))
    finally:
        shared.close()
    rows: list[tuple[Any, ...]] = []
    for (ns, oid), object_rows in sorted(stored.items()):
        conn = sqlite3.connect(":memory:", isolation_level=None)
        try:
            prepare(conn, label=f"{ns}/{oid}")
            load_rows(conn, f"{ns}/{oid}", object_rows)
            rows += conn.execute(sql).fetchall()
        finally:
            conn.close()
    return rows


def check_integrity(data: Path) -> None:
    """``PRAGMA integrity_check`` on the catalog and every object database (or the
    shared database), opened read-only (so nothing here checkpoints or rewrites the
    files the worker reopens)."""
    paths = [data / "catalog.sqlite3", data / "shared.sqlite3",
             *sorted((data / "objects").glob("*.sqlite3"))]
    for path in paths:
        if not path.exists():
            continue
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)], path
        finally:
            conn.close()


def kill_at_random(c: Campaign, kills: int, after: tuple[float, float]) -> int:
    """Start the worker ``kills`` times and SIGKILL it uniform(*after) s after it is up.
    Returns how many kills landed (a worker that finished first ends the series)."""
    landed = 0
    for _ in range(kills):
        proc = c.start()
        if c.wait_for(proc, "up"):
            time.sleep(c.rng.uniform(*after))
        if c.kill(proc) != KILLED:
            break
        landed += 1
    return landed


# -- what every campaign must show -----------------------------------------------------------------


def check_no_job_lost(c: Campaign, *, sealed: set[str] | None = None) -> None:
    sealed = sealed or set()
    lines = c.lines()
    done = {line.job for line in lines if line.kind == "done"}
    assert done == c.job_ids - sealed, sorted(c.job_ids - sealed - done)[:20]
    assert c.runs[-1][1] == 0 and lines[-1].kind == "finished"
    # Nothing left in any queue; the only dead letters are the sealed jobs.
    assert c.db_rows("SELECT id FROM nj_jobs") == []
    assert {row[0] for row in c.db_rows("SELECT id FROM nj_dead_letters")} == sealed


def check_one_job_at_a_time(c: Campaign) -> None:
    """Within a run, an object's jobs never overlap: at most one start without its done,
    and only as the object's last line before the run ended."""
    by_run: dict[tuple[int, str], list[Line]] = defaultdict(list)
    for line in c.lines():
        if line.kind in ("start", "done"):
            by_run[line.pid, line.object_id].append(line)
    for (_pid, _obj), lines in by_run.items():
        for i, line in enumerate(lines):
            if line.kind == "start" and i + 1 < len(lines):
                following = lines[i + 1]
                assert (following.kind, following.job) == ("done", line.job), lines[i:i + 2]


def last_job_before_each_kill(c: Campaign) -> Counter[str]:
    """For each job, the number of killed runs in which it was its object's last job
    (its last start or done line is the object's last line in that run)."""
    killed = set(c.killed_pids())
    last: dict[tuple[int, str], str] = {}
    for line in c.lines():
        if line.kind in ("start", "done") and line.pid in killed:
            last[line.pid, line.object_id] = line.job  # type: ignore[assignment]
    return Counter(last.values())


def rerun_counts(c: Campaign) -> Counter[str]:
    starts = Counter(line.job for line in c.lines() if line.kind == "start")
    return Counter({job: n - 1 for job, n in starts.items() if n > 1})


def check_strict_reruns(c: Campaign) -> None:
    """With completion_group=1, what the design promises about re-runs, as strong as it
    is promised.

    Every completion is committed before the object's next job starts, and which job
    runs is recorded (the flight record) before it starts. So a job can run again only
    because of a kill that caught it either *in flight* (a start without a done: the
    kill landed inside ``on_job``) or *just completed* (its done is the object's last
    line in that run: the kill landed between the done line and the commit of the
    outcome, which no test can tell apart from a kill after the commit). Both cases make
    it the object's last job of that run. Hence, per job:

        runs - 1  <=  number of killed runs in which it was its object's last job

    A job done earlier in a killed run, or a job of a run that ended cleanly, never
    runs again. (A kill can also catch a job after its flight record is written but
    before its start line; that job then has one start line in all, and is fine.)
    """
    allowed = last_job_before_each_kill(c)
    for job, extra in rerun_counts(c).items():
        assert extra <= allowed[job], (job, extra, allowed[job])


def check_struck_jobs(c: Campaign, *, real_time: bool) -> int:
    """Every job caught in flight by a kill (a start without a done in a killed run) is
    given a crash strike by a later run, and runs again after it — on the real clock,
    no sooner than 30 s x strikes after the strike. Returns the number of strikes."""
    lines = c.lines()
    killed = set(c.killed_pids())
    order = c.run_index()
    open_starts: dict[tuple[int, str], str] = {}
    for line in lines:
        if line.pid in killed and line.kind == "start":
            open_starts[line.pid, line.job] = line.job  # type: ignore[index,assignment]
        elif line.pid in killed and line.kind == "done":
            open_starts.pop((line.pid, line.job), None)  # type: ignore[arg-type]
    strikes = [line for line in lines if line.kind == "strike"]
    for (pid, job) in open_starts:
        assert any(s.job == job and order[s.pid] > order[pid] for s in strikes), (job, pid)
    for i, strike in enumerate(lines):
        if strike.kind != "strike":
            continue
        count, sealed = int(strike.fields[0]), strike.fields[1] == "1"
        assert not sealed
        rerun = next(line for line in lines[i:] if line.kind == "start" and line.job == strike.job)
        if real_time:
            # The job's new time is (the moment its object recovered) + 30 x strikes;
            # the strike line is written a few ms after that moment.
            assert rerun.time >= strike.time + 30.0 * count - 0.5, (strike, rerun)
    return len(strikes)


# -- 1. random kills: nothing lost, re-runs only where a death allows ------------------------------


def run_strict_campaign(tmp_path: Path, *, objects: int, jobs: int, kills: int,
                        sleep: tuple[float, float], after: tuple[float, float],
                        layout: str = "files") -> Campaign:
    c = Campaign.create(tmp_path, objects=[f"o{i}" for i in range(objects)], jobs=jobs,
                        sleep=list(sleep), group=1, layout=layout)
    started = time.monotonic()
    landed = kill_at_random(c, kills, after)
    assert landed == kills, "the workload ended before every kill landed: make it longer"
    # A job struck at the last restart waits 30 s (real) before it runs again.
    c.finish(timeout=120)
    check_no_job_lost(c)
    check_one_job_at_a_time(c)
    check_strict_reruns(c)
    strikes = check_struck_jobs(c, real_time=True)
    # Per-job strikes: kills that hit different jobs never add up to a seal.
    assert c.db_rows("SELECT id FROM nj_dead_letters") == []
    print(f"{kills} kills, {strikes} crash strikes, {sum(rerun_counts(c).values())} re-runs,"
          f" {time.monotonic() - started:.1f} s")
    return c


# The storage layouts of a data directory: a file per object, or one shared database.
LAYOUTS = ["files", "shared"]


@pytest.mark.crash
@pytest.mark.parametrize("layout", [
    "files",
    # (~35 s; the shorter campaigns below run on it in CI: -m soak runs this one too)
    pytest.param("shared", marks=pytest.mark.soak),
])
def test_random_kills_lose_nothing_and_rerun_only_jobs_caught_by_a_kill(
    tmp_path: Path, layout: str,
) -> None:
    run_strict_campaign(tmp_path, objects=5, jobs=60, kills=5, sleep=(0.01, 0.04),
                        after=(0.1, 0.5), layout=layout)


@pytest.mark.soak
@pytest.mark.parametrize("layout", LAYOUTS)
def test_soak_random_kills_lose_nothing_and_rerun_only_jobs_caught_by_a_kill(
    tmp_path: Path, layout: str,
) -> None:
    run_strict_campaign(tmp_path, objects=20, jobs=100, kills=50, sleep=(0.05, 0.15),
                        after=(0.05, 0.4), layout=layout)


@pytest.mark.crash
@pytest.mark.parametrize("layout", LAYOUTS)
def test_random_kills_with_grouped_completions_rerun_at_most_a_group(tmp_path: Path,
                                                                     layout: str) -> None:
    """With the default completion_group (64), a death may re-run up to 64 completed jobs
    per object (their outcomes were waiting for one commit) — and no more."""
    group = 64
    # Short jobs (1-3 ms of real time), so that a run completes well over 64 per object.
    c = Campaign.create(tmp_path, objects=[f"o{i}" for i in range(4)], jobs=800,
                        sleep=[0.02, 0.06], group=None, clock_rate=20, layout=layout)
    landed = kill_at_random(c, 5, (0.1, 0.4))
    assert landed == 5
    c.finish(timeout=60)
    check_no_job_lost(c)
    check_one_job_at_a_time(c)
    check_struck_jobs(c, real_time=False)
    lines = c.lines()
    order = c.run_index()
    later_starts: dict[str, list[int]] = defaultdict(list)
    for line in lines:
        if line.kind == "start":
            later_starts[line.job].append(order[line.pid])  # type: ignore[index]
    rerun_completed = 0
    for pid in c.killed_pids():
        done_here: dict[str, list[str]] = defaultdict(list)
        for line in lines:
            if line.pid == pid and line.kind == "done":
                done_here[line.object_id].append(line.job)  # type: ignore[arg-type]
        for obj, done in done_here.items():
            # Completed in this run, yet started again in a later one.
            again = [job for job in done if any(i > order[pid] for i in later_starts[job])]
            assert len(again) <= group, (pid, obj, len(again))
            rerun_completed += len(again)
    # Any other re-run is a job caught in flight: at most one per object per kill.
    in_flight = last_job_before_each_kill(c)
    assert c.db_rows("SELECT id FROM nj_dead_letters") == []
    print(f"completed jobs run again after a kill: {rerun_completed};"
          f" re-runs in all: {sum(rerun_counts(c).values())}; objects x kills:"
          f" {len(c.config['objects']) * landed}; last-job-at-a-kill: {sum(in_flight.values())}")


@pytest.mark.crash
@pytest.mark.parametrize("layout", LAYOUTS)
def test_local_effects_are_exactly_once_across_random_kills(tmp_path: Path,
                                                            layout: str) -> None:
    """Each job increments a counter in its object's storage. The increment commits with
    the job's outcome (the group transaction), so however often the process is killed —
    mid-job, or with a group of completions not yet committed — each counter ends at
    exactly the number of jobs. Calls that returned are durable (the output gate)."""
    jobs = 800
    c = Campaign.create(tmp_path, objects=[f"o{i}" for i in range(3)], jobs=jobs,
                        sleep=[0.02, 0.06], group=None, clock_rate=20, marks=True,
                        layout=layout)
    landed = kill_at_random(c, 6, (0.1, 0.4))
    assert landed >= 4
    # The marks (values of calls that returned; they increase across processes) of the
    # last killed process that had any: under load a worker can be killed before its
    # first call returns.
    lines = c.lines()
    marks_per_kill = [
        [int(line.job) for line in lines  # type: ignore[arg-type]
         if line.kind == "mark" and line.pid == pid]
        for pid in c.killed_pids()
    ]
    marks_before_a_kill = [marks for marks in marks_per_kill if marks]
    assert marks_before_a_kill
    c.finish(timeout=90, marks=False)
    check_no_job_lost(c)
    counts = c.db_rows("SELECT value FROM nj_kv WHERE key = 'count'")
    assert sorted(int(v) for (v,) in counts) == [jobs] * 3, counts
    # The last call that returned before that kill left its value behind.
    (stored,) = c.db_rows("SELECT value FROM nj_kv WHERE key = 'mark'")
    assert int(stored[0]) >= max(marks_before_a_kill[-1])
    reruns = sum(rerun_counts(c).values())
    print(f"kills: {landed}; job re-runs: {reruns}; counters: {counts}")


# -- 2. a poison job is sealed; the others finish --------------------------------------------------


@pytest.mark.crash
def test_a_job_that_kills_its_process_is_sealed_after_three_crash_strikes(
    tmp_path: Path,
) -> None:
    poison = "p-0005"
    c = Campaign.create(tmp_path, objects=["p", "h1", "h2", "h3"], jobs=30,
                        sleep=[0.2, 0.6], poison=["p", 5], clock_rate=20)
    deaths = 0
    while True:
        proc = c.start()
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            c.stop(proc)
            raise AssertionError(f"worker hung{c.stderr()}") from None
        c.ended(proc, code)
        if code == 0:
            break
        assert code == KILLED  # by the poison job itself
        deaths += 1
        assert deaths <= 3, "the poison job was not sealed after three crash strikes"
    assert deaths == 3
    lines = c.lines()
    assert [line.pid for line in lines if line.kind == "start" and line.job == poison] == [
        pid for pid, _ in c.runs[:3]
    ]
    assert [line.fields for line in lines if line.kind == "strike" and line.job == poison] == [
        ("1", "0"), ("2", "0"), ("3", "1"),
    ]
    check_no_job_lost(c, sealed={poison})
    check_one_job_at_a_time(c)
    [(reason, error, attempts)] = c.db_rows(
        "SELECT reason, error, attempts FROM nj_dead_letters")
    assert (reason, attempts) == ("crash", 0)
    assert "3 process deaths" in error
    # Only the poison job was sealed. The healthy jobs caught in flight by its deaths got
    # a strike each, and finished. A healthy job struck beside it falls due again at the
    # same moment as the poison; had it run beside it again it would have died with it
    # again (and been sealed at the third death) — so no healthy job may have a second
    # strike.
    healthy = [line for line in lines if line.kind == "strike" and line.job != poison]
    assert [line.fields for line in healthy] == [("1", "0")] * len(healthy)
    print(f"healthy jobs struck by the poison's deaths: {sorted(s.job for s in healthy)}")


# -- 3. SIGTERM: a graceful shutdown costs nothing -------------------------------------------------


@pytest.mark.crash
def test_sigterm_with_jobs_in_flight_exits_fast_and_they_all_rerun(tmp_path: Path) -> None:
    c = Campaign.create(tmp_path, objects=["a", "b", "c"], jobs=3, sleep=[60, 60])
    proc = c.start()
    assert c.wait_for(proc, "start", count=3)  # one long job in flight per object
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=10)
    took = time.monotonic() - sent
    c.ended(proc, code)
    assert code == 0, c.stderr()
    assert took < 2.0, took
    first = c.lines()
    assert [line.kind for line in first if line.kind in ("done", "term")] == ["term"]
    in_flight = {line.job for line in first if line.kind == "start"}
    assert len(in_flight) == 3
    # Nothing counts as a crash: no crash tokens in the catalog.
    catalog = sqlite3.connect(f"file:{c.data / 'catalog.sqlite3'}?mode=ro", uri=True)
    try:
        assert catalog.execute("SELECT * FROM nj_crashes").fetchall() == []
    finally:
        catalog.close()
    assert c.db_rows("SELECT id FROM nj_jobs WHERE attempts != 0 OR crash_strikes != 0"
                     " OR running_since IS NOT NULL") == []

    assert c.finish(timeout=30, sleep=[0.01, 0.02]) == 0
    check_no_job_lost(c)
    lines = c.lines()
    second = [line for line in lines if line.pid == c.runs[1][0]]
    up = next(line for line in second if line.kind == "up")
    assert not [line for line in lines if line.kind == "strike"]
    reruns = [line for line in second if line.kind == "start" and line.job in in_flight]
    # Each ran again at once (they stayed due), as attempt 1 (no attempt used up).
    assert sorted(line.job for line in reruns) == sorted(in_flight)
    assert all(line.fields == ("1",) for line in reruns)
    assert all(line.time - up.time < 1.0 for line in reruns)


# -- 4. tracked work: a death during it is a crash strike of the job that started it


@pytest.mark.crash
def test_a_kill_during_tracked_work_strikes_the_heartbeat_job(tmp_path: Path) -> None:
    """A heartbeat starts long work once, then (every 0.2 s) finds it running and only
    reschedules itself. A kill between heartbeats, while the work runs, must still be
    charged to the heartbeat job: its running marker stays until the work ends, also
    through the later heartbeats that did not start it."""
    c = Campaign.create(tmp_path, objects=["w"], jobs=1, sleep=[0, 0], heartbeat=0.2)
    proc = c.start()
    assert c.wait_for(proc, "done", count=3)  # the work runs; two later heartbeats
    time.sleep(0.05)  # between heartbeats (a heartbeat's run takes microseconds)
    assert c.kill(proc) == KILLED
    lines = c.lines()
    assert [line.kind for line in lines].count("work") == 1  # started once, still running
    assert lines[-1].kind == "done"  # no heartbeat was in flight at the kill
    proc = c.start()
    try:
        assert c.wait_for(proc, "strike", timeout=10)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert c.ended(proc, proc.wait(timeout=10)) == 0
    [strike] = [line for line in c.lines() if line.kind == "strike"]
    assert (strike.job, strike.fields) == ("w-0000", ("1", "0"))


# -- 5. a race the crash tests found ---------------------------------------------------------------


class Once(nj.DurableObject):
    namespace = "tests.test_crash.Once"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, time: float) -> None:
        await self.lifecycle.jobs.push("f", id="j", time=time)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.ctx.env.append(("start", ctx.attempt))
        await trio.sleep(1)
        self.ctx.env.append(("done", ctx.attempt))
        return None


class SlowDelivery(trio.abc.Instrument):
    """Once armed, moves the clock on by ``seconds`` just as the next alarm task is
    spawned: an alarm delivery that took that long in real time."""

    def __init__(self, clock: trio.testing.MockClock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.armed = False

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if self.armed and task.name.endswith("_alarm_task"):
            self.armed = False
            self.clock.jump(self.seconds)


async def test_an_alarm_delivered_as_the_idle_timeout_ends_runs_its_job_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by the poison test: a job struck twice is delayed 60 s, the default idle
    # timeout, so its object (idle since its crash recovery) is evicted just as the job
    # falls due. The eviction must not cut off a job the alarm already started.
    # Trio runs a batch of tasks in random order, so this tries it 40 times.
    slow = SlowDelivery(autojump_clock, 0.5)
    trio.lowlevel.add_instrument(slow)
    try:
        for _ in range(40):
            log: list[tuple[str, int]] = []
            async with nj.open_runtime(env=log, idle_timeout=60) as rt:
                # The call ends now, so the object's idle deadline is now + 60; the job
                # falls due 0.2 s before it, and its delivery takes 0.5 s.
                await rt.get(Once, "o").push(nj.now() + 59.8)
                slow.armed = True
                await trio.sleep(65)
            assert log == [("start", 1), ("done", 1)]
    finally:
        trio.lowlevel.remove_instrument(slow)
