"""The dispatch benchmark behind ``nursery-jobs bench`` and ``benchmarks/dispatch.py``.

In one run, on one disk: the plain-sqlite3 ceiling (insert a job row, claim it, delete
it; per job and in batches of 100), the floors (our own SQL with no Python around it,
``_floor``), nursery_jobs (pushes, dispatch of no-op jobs on one
object and on 100 objects, with durability "normal" and "full", and the latency of a
job pushed for now and of a 100 ms timer), and the peers, each in its own subprocess.
``--engine postgres`` runs the PostgreSQL benchmark instead (``_pg``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import nursery_jobs as nj
from nursery_jobs._core._runtime import Durability

from ._floor import SYNCHRONOUS, floors
from ._progress import Progress
from ._quiet import quiet_backlog_warnings

PEERS = ("huey", "persistqueue", "dbos", "apscheduler")
# Jobs per peer run, at most: the slowest peers would take minutes at our N. Rates are
# per second, so a smaller N compares fairly (its own figures are printed with it).
PEER_N = {"huey": 5000, "persistqueue": 5000, "dbos": 2000, "apscheduler": 500}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the ceiling: plain sqlite3 ---------------------------------------------------------
def ceiling(directory: Path, n: int, durability: str) -> dict[str, float]:
    """Plain sqlite3 doing the same durable work: insert a job; claim it; delete it."""
    results: dict[str, float] = {}
    for mode, batch in (("per_job", 1), ("batch_100", 100)):
        path = directory / f"ceiling-{durability}-{mode}.sqlite3"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute(f"PRAGMA synchronous={SYNCHRONOUS[durability]}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE jobs (seq INTEGER PRIMARY KEY, id TEXT UNIQUE, time REAL,"
            " payload TEXT, running REAL)"
        )
        conn.execute("CREATE INDEX jobs_time ON jobs (time)")
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            conn.execute("BEGIN")
            for i in range(start, min(n, start + batch)):
                conn.execute("INSERT INTO jobs (id, time, payload) VALUES (?, ?, ?)",
                             (f"job-{i}", time.time(), str(i)))
            conn.execute("COMMIT")
        t1 = time.perf_counter()
        while True:
            rows = conn.execute(
                "SELECT seq FROM jobs WHERE time <= ? ORDER BY time LIMIT ?", (time.time(), batch)
            ).fetchall()
            if not rows:
                break
            conn.execute("BEGIN")
            for (seq,) in rows:
                conn.execute("UPDATE jobs SET running = ? WHERE seq = ?", (time.time(), seq))
            if batch == 1:  # per job: the claim commits before the work, as a queue must
                conn.execute("COMMIT")
                conn.execute("BEGIN")
            for (seq,) in rows:
                conn.execute("DELETE FROM jobs WHERE seq = ?", (seq,))
            conn.execute("COMMIT")
        t2 = time.perf_counter()
        conn.close()
        results[f"{mode}_enqueue_per_s"] = n / (t1 - t0)
        results[f"{mode}_drain_per_s"] = n / (t2 - t1)
    return results


# -- nursery_jobs -------------------------------------------------------------------------
class BenchObject(nj.DurableObject):
    """A Lifecycle object whose no-op jobs wait for the starting gun, then count."""

    namespace = "nursery_jobs.bench"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.bench: _Bench = ctx.env

    async def push_each(self, n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            await self.lifecycle.jobs.push("noop", payload=i, delay=3600)
        return time.perf_counter() - t0

    async def push_batched(self, n: int) -> float:
        t0 = time.perf_counter()
        with self.ctx.storage.transaction():
            for i in range(n):
                await self.lifecycle.jobs.push("noop", payload=i, delay=3600)
        return time.perf_counter() - t0

    async def fill(self, n: int, fn: str = "noop") -> None:
        with self.ctx.storage.transaction():
            await self.lifecycle.jobs.push("gate")
            for i in range(n):
                await self.lifecycle.jobs.push(fn, payload=i)

    async def push_now(self, fn: str, delay: float | None = None) -> None:
        self.bench.pushed = trio.current_time() + (delay or 0.0)
        await self.lifecycle.jobs.push(fn, delay=delay)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        bench = self.bench
        fn = ctx.job.fn
        if fn == "noop" or fn == "kv":
            if fn == "kv":  # one local effect per job, committed with its outcome
                self.ctx.storage.put("count", bench.count)
            bench.count += 1
            if bench.count == bench.target:
                bench.done.set()
        elif fn == "gate":
            await bench.go.wait()
        else:  # "latency"
            bench.latencies.append(trio.current_time() - bench.pushed)
            bench.done.set()
        return None


class _Bench:
    def __init__(self) -> None:
        self.go = trio.Event()
        self.done = trio.Event()
        self.count = 0
        self.target = 0
        self.pushed = 0.0
        self.latencies: list[float] = []


async def _pushes(path: Path, n: int, durability: Durability) -> dict[str, float]:
    async with nj.open_runtime(path, env=_Bench(), durability=durability) as rt:
        obj = rt.get(BenchObject, "pushes")
        c0 = time.process_time()
        each = await obj.push_each(min(n, 5000))
        c1 = time.process_time()
        batched = await obj.push_batched(n)
        c2 = time.process_time()
    return {"push_per_call_per_s": min(n, 5000) / each, "push_batched_per_s": n / batched,
            "push_per_call_cpu_us": (c1 - c0) / min(n, 5000) * 1e6,
            "push_batched_cpu_us": (c2 - c1) / n * 1e6}


async def _dispatch(
    path: Path, objects: int, n: int, durability: Durability, fn: str = "noop"
) -> tuple[float, float]:
    """Jobs/s (wall clock) and the process's CPU µs per job, from the starting gun."""
    bench = _Bench()
    per_object = n // objects
    bench.target = per_object * objects
    async with nj.open_runtime(path, env=bench, durability=durability) as rt:
        for i in range(objects):
            await rt.get(BenchObject, f"o{i}").fill(per_object, fn)
        await trio.sleep(0.05)  # every object's alarm run is now parked on its gate job
        t0, c0 = time.perf_counter(), time.process_time()
        bench.go.set()
        await bench.done.wait()
        return (bench.target / (time.perf_counter() - t0),
                (time.process_time() - c0) / bench.target * 1e6)


async def _latency(path: Path, samples: int, delay: float | None) -> dict[str, float]:
    bench = _Bench()
    async with nj.open_runtime(path, env=bench) as rt:
        obj = rt.get(BenchObject, "latency")
        for _ in range(samples):
            bench.done = trio.Event()
            await obj.push_now("latency", delay)
            await bench.done.wait()
            await trio.sleep(0.005)  # idle again before the next sample
    ms = [x * 1000 for x in bench.latencies]
    return {"p50_ms": _pct(ms, 0.5), "p99_ms": _pct(ms, 0.99), "samples": len(ms)}


def ours(directory: Path, n: int, progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {}
    durabilities: tuple[Durability, ...] = ("normal", "full")
    for durability in durabilities:
        out[f"pushes_{durability}"] = trio.run(
            _pushes, directory / f"nj-push-{durability}", n, durability)
        progress.step(f"nursery_jobs pushes ({durability})")
        for objects in (1, 100):
            key = f"dispatch_{objects}x_{durability}"
            out[f"{key}_per_s"], out[f"{key}_cpu_us"] = trio.run(
                _dispatch, directory / f"nj-{objects}-{durability}", objects, n, durability)
            progress.step(f"nursery_jobs dispatch {objects} object(s) ({durability})")
    out["dispatch_1x_kv_normal_per_s"], out["dispatch_1x_kv_normal_cpu_us"] = trio.run(
        _dispatch, directory / "nj-kv-normal", 1, n, "normal", "kv")
    progress.step("nursery_jobs dispatch, a KV write per job (normal)")
    out["latency_now"] = trio.run(_latency, directory / "nj-latency", 200, None)
    out["latency_timer_100ms"] = trio.run(_latency, directory / "nj-timer", 20, 0.1)
    progress.step("nursery_jobs latency")
    return out


# -- peers ----------------------------------------------------------------------------------
def peer(name: str, directory: Path, n: int, durability: str) -> dict[str, Any]:
    """Run one peer in its own interpreter, as its docs run it."""
    workdir = directory / f"peer-{name}-{durability}"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "nursery_jobs.bench._peers", name, "--n", str(n),
             "--dir", str(workdir), "--durability", durability],
            capture_output=True, text=True, timeout=600, check=False,
        )
    except subprocess.TimeoutExpired:
        return {"peer": name, "error": "timed out after 600 s"}
    try:
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"peer": name, "error": f"exit {proc.returncode}: {tail}"}
    return result


def peers_available() -> list[str]:
    import importlib.util

    modules = {"huey": "huey", "persistqueue": "persistqueue", "dbos": "dbos",
               "apscheduler": "apscheduler"}
    return [p for p in PEERS if importlib.util.find_spec(modules[p]) is not None]


def peers_note() -> str | None:
    """One line naming the peers that are not installed, and the extra that brings them;
    None when every peer is there."""
    missing = [p for p in PEERS if p not in peers_available()]
    if not missing:
        return None
    extra = "pip install 'nursery_jobs[bench]'"
    if len(missing) == len(PEERS):
        return f"no peer installed: {extra}"
    return f"not measured, not installed: {', '.join(missing)}: {extra}"


# -- the report -----------------------------------------------------------------------------
def run(n: int, directory: Path | None, with_peers: bool, progress_enabled: bool,
        depths: tuple[int, ...] = (), object_sizes: tuple[int, ...] = (),
        runs: int = 1) -> dict[str, Any]:
    """Every figure of the report; with ``depths``, also the rates of the first ``n``
    jobs of a queue ``n`` deep and of each of ``depths`` deep (``_depth``); with
    ``object_sizes``, one object per task at those counts (``_objects``, ``runs`` each);
    with ``runs`` > 1, the hot path against its floor ``runs`` times (``_hot``)."""
    available = peers_available() if with_peers else []
    # Steps: 2 ceilings, 8 of ours (``ours``), the hot path's runs, the peers, the depths
    # (the first at n), the objects rows (one per size and layout).
    progress = Progress(2 + 8 + (runs if runs > 1 else 0) + len(available)
                        + (len({n, *depths}) if depths else 0) + 2 * len(object_sizes),
                        progress_enabled)
    tmp = Path(tempfile.mkdtemp(prefix="nj-bench-", dir=directory))
    try:
        with quiet_backlog_warnings():
            return _run(tmp, n, with_peers, available, progress, depths, object_sizes, runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(tmp: Path, n: int, with_peers: bool, available: list[str], progress: Progress,
         depths: tuple[int, ...], object_sizes: tuple[int, ...], runs: int) -> dict[str, Any]:
    """``run`` in ``tmp``."""
    report: dict[str, Any] = {"n": n, "disk": str(tmp), "python": sys.version.split()[0],
                              "nursery_jobs": nj.__version__, "ceiling": {}, "peers": {}}
    for durability in ("normal", "full"):
        report["ceiling"][durability] = ceiling(tmp, n, durability)
        progress.step(f"sqlite3 ceiling ({durability})")
    report["floor"] = floors(tmp, n, "normal")
    report["ours"] = ours(tmp, n, progress)
    if runs > 1:
        from ._hot import hot_path_runs  # (it builds on this module's bench object)

        report["hot"] = hot_path_runs(tmp, n, runs, progress)
    if depths:
        from ._depth import depth_rows  # (it builds on this module's bench object)

        report["depth"] = depth_rows(tmp, n, depths, progress)
    if object_sizes:
        from ._objects import object_rows

        report["objects"] = object_rows(tmp, object_sizes, runs, progress)
    for name in available:
        # No peer offers WAL with synchronous=NORMAL (each commits with an fsync, in
        # its own settings): one run each, at its durable settings.
        report["peers"][name] = peer(name, tmp, min(n, PEER_N[name]), "full")
        progress.step(f"peer {name}")
    note = peers_note() if with_peers else None
    if note is not None:
        report["peers_note"] = note
    return report


def _fmt_rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}/s"


def render(report: dict[str, Any]) -> str:
    ours_ = report["ours"]
    lines = [f"nursery_jobs {report['nursery_jobs']} dispatch benchmark — N = {report['n']:,},"
             f" Python {report['python']}, one disk, SQLite WAL", ""]
    # cpu/op: the process's CPU time per push or job (normal), steadier than the rates
    # on a shared machine.
    head = (f"{'what':<48}{'normal':>12}{'full':>12}{'vs ceiling':>12}{'vs floor':>10}"
            f"{'cpu/op':>10}")
    lines += [head, "-" * len(head)]
    ceil, floor = report["ceiling"], report["floor"]

    def row(label: str, normal: float, full: float | None, ceiling_value: float | None,
            floor_value: float | None = None, cpu_us: float | None = None) -> None:
        ratio = "" if ceiling_value is None else f"{normal / ceiling_value:.0%}"
        of_floor = "" if floor_value is None else f"{normal / floor_value:.0%}"
        cpu = "" if cpu_us is None else f"{cpu_us:.1f}µs"
        lines.append(f"{label:<48}{_fmt_rate(normal):>12}{_fmt_rate(full):>12}{ratio:>12}"
                     f"{of_floor:>10}{cpu:>10}")

    normal = ceil["normal"]
    enqueue_1, drain_1 = normal["per_job_enqueue_per_s"], normal["per_job_drain_per_s"]
    enqueue, drain = normal["batch_100_enqueue_per_s"], normal["batch_100_drain_per_s"]
    row("sqlite3 ceiling: enqueue, commit per job", enqueue_1,
        ceil["full"]["per_job_enqueue_per_s"], None)
    row("sqlite3 ceiling: claim+delete, per job", drain_1, ceil["full"]["per_job_drain_per_s"],
        None)
    row("sqlite3 ceiling: enqueue, batches of 100", enqueue,
        ceil["full"]["batch_100_enqueue_per_s"], None)
    row("sqlite3 ceiling: claim+delete, batches of 100", drain,
        ceil["full"]["batch_100_drain_per_s"], None)
    # Floors: our own statements, schema and pragmas, no Python around them (``_floor``).
    row("floor, our SQL: push, a commit each", floor["push_per_call_per_s"], None, enqueue_1)
    row("floor, our SQL: push, batched", floor["push_batched_per_s"], None, enqueue)
    row("floor, our SQL: dispatch", floor["drain_per_s"], None, drain)
    row("floor, our SQL: dispatch, a KV write a job", floor["kv_drain_per_s"], None, drain)
    pushes = ours_["pushes_normal"], ours_["pushes_full"]
    row("nursery_jobs: push, one durable push per call", pushes[0]["push_per_call_per_s"],
        pushes[1]["push_per_call_per_s"], enqueue_1, floor["push_per_call_per_s"],
        pushes[0].get("push_per_call_cpu_us"))
    row("nursery_jobs: push, batched in a transaction", pushes[0]["push_batched_per_s"],
        pushes[1]["push_batched_per_s"], enqueue, floor["push_batched_per_s"],
        pushes[0].get("push_batched_cpu_us"))
    row("nursery_jobs: dispatch, 1 object x N", ours_["dispatch_1x_normal_per_s"],
        ours_["dispatch_1x_full_per_s"], drain, floor["drain_per_s"],
        ours_.get("dispatch_1x_normal_cpu_us"))
    row("nursery_jobs: dispatch, 100 objects x N/100", ours_["dispatch_100x_normal_per_s"],
        ours_["dispatch_100x_full_per_s"], drain, floor["drain_per_s"],
        ours_.get("dispatch_100x_normal_cpu_us"))
    row("nursery_jobs: dispatch, 1 object, a KV write a job",
        ours_["dispatch_1x_kv_normal_per_s"], None, drain, floor["kv_drain_per_s"],
        ours_.get("dispatch_1x_kv_normal_cpu_us"))
    now, timer = ours_["latency_now"], ours_["latency_timer_100ms"]
    lines += ["", f"latency of a job pushed for now (idle runtime): p50 {now['p50_ms']:.3f} ms,"
              f" p99 {now['p99_ms']:.3f} ms ({now['samples']} samples)",
              f"lateness of a 100 ms timer: p50 {timer['p50_ms']:.3f} ms,"
              f" p99 {timer['p99_ms']:.3f} ms ({timer['samples']} samples)"]
    if report.get("hot"):
        from ._hot import render_hot

        lines += ["", f"the hot path against its floor, {len(report['hot'])} runs (each: the"
                  " floors, then nursery_jobs, durability normal; ratio of the two in each run):",
                  *render_hot(report["hot"])]
    if report.get("depth"):
        from ._depth import render_depth

        lines += ["", f"the first {report['n']:,} jobs of a deep queue (durability normal;"
                  " cpu: process CPU time per job):", *render_depth(report["depth"])]
    if report.get("objects"):
        from ._objects import render_objects

        lines += ["", "one object per task: objects/s created (a job each) and fired cold,"
                  " beside the layout's floor (plain sqlite3):", *render_objects(report["objects"])]
    if report["peers"]:
        ours_normal, ours_full = ours_["dispatch_1x_normal_per_s"], ours_["dispatch_1x_full_per_s"]
        lines += ["", "peers, each in its own process at its own durable settings (printed below):",
                  f"{'peer (N)':<22}{'enqueue':>12}{'drain':>12}{'timer p50':>11}"
                  f"{'timer p99':>11}{'ours normal/peer':>18}{'ours full/peer':>16}"]
        for name, result in report["peers"].items():
            label = f"{name} ({result.get('n', '?')})"
            if "error" in result:
                lines.append(f"{label:<22}error: {result['error']}")
                continue
            timer_ = result.get("timer_lateness_ms") or {}
            drain = result.get("drain_per_s")
            p50 = f"{timer_['p50']:.1f} ms" if timer_ else "n/a"
            p99 = f"{timer_['p99']:.1f} ms" if timer_ else "n/a"
            ratios = (f"{ours_normal / drain:>17.1f}x{ours_full / drain:>15.1f}x"
                      if drain else "")
            lines.append(f"{label:<22}{_fmt_rate(result.get('enqueue_per_s')):>12}"
                         f"{_fmt_rate(drain):>12}{p50:>11}{p99:>11}{ratios}")
            notes = [f"{k}: {v}" for k, v in result.items() if k.endswith("note")]
            if result.get("settings"):
                notes.append(f"settings: {result['settings']}")
            lines += [f"    {note}" for note in notes]
    if report.get("peers_note"):
        lines += ["", report["peers_note"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nursery-jobs bench", description="Measure dispatch throughput against the"
        " plain-sqlite3 ceiling and the peers, in one run on one disk; or, with --engine"
        " postgres, the PostgreSQL engine against a plain-psycopg ceiling.")
    parser.add_argument("-n", type=int, default=None,
                        help="jobs per measurement (default 20,000; 600 with --quick)")
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite",
                        help="the engine to measure (default: sqlite)")
    parser.add_argument("--dsn", default=os.environ.get("NJ_POSTGRES_DSN"),
                        help="postgres: the server (a database is created there and dropped;"
                        " default: $NJ_POSTGRES_DSN)")
    parser.add_argument("--runs", type=int, default=None,
                        help="postgres: runs of every figure (default 3; 1 with --quick);"
                        " sqlite: runs of the hot path against its floor, each the floors"
                        " then nursery_jobs, with the median and range of each ratio, and"
                        " of each --objects row (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="postgres: a smoke test with tiny N (not figures to quote)")
    parser.add_argument("--lease-ttl", type=float, default=None,
                        help="postgres: lease_ttl of the failover hosts (default 2 s)")
    parser.add_argument("--calls-only", action="store_true",
                        help="postgres: measure only the cross-host call latency")
    parser.add_argument("--dir", type=Path, default=None,
                        help="sqlite: where to put the databases (default: the temp dir)")
    parser.add_argument("--no-peers", action="store_true", help="sqlite: skip the peers")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--depth", action="store_true",
                        help="sqlite: also push and dispatch the first N jobs of queues"
                        " 200,000 and 1,000,000 deep, beside a queue N deep (about a"
                        " minute more, and ~1 GB of disk)")
    parser.add_argument("--objects", action="store_true",
                        help="sqlite: also one object per task, files and shared layouts:"
                        " objects/s created and fired cold beside each layout's floor, and"
                        " memory per resident and dormant object (minutes: ~100 objects/s"
                        " in files on a slow disk)")
    parser.add_argument("--object-sizes", default="1000,10000",
                        help="sqlite: the object counts of --objects (default 1000,10000)")
    args = parser.parse_args(argv)
    if args.engine == "postgres":
        if args.depth or args.objects:
            parser.error("--depth and --objects apply to the sqlite engine only")
        try:
            import psycopg  # noqa: F401  (the postgres extra; _pg imports it)
        except ImportError as exc:
            print(f"nursery-jobs bench: --engine postgres needs the PostgreSQL driver ({exc}):"
                  " pip install 'nursery_jobs[postgres]'", file=sys.stderr)
            return 2
        from ._pg import main as pg_main

        return pg_main(args.dsn, args.n, args.runs, args.quick, args.lease_ttl, args.json,
                       parser.error, calls_only=args.calls_only)
    for given, option in ((args.lease_ttl, "--lease-ttl"),
                          (args.quick or None, "--quick"),
                          (args.calls_only or None, "--calls-only")):
        if given is not None:
            parser.error(f"{option} applies to --engine postgres only")
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: no such directory (create it first)")
    n = 20_000 if args.n is None else args.n
    if n < 100:
        parser.error("-n must be at least 100")
    from ._depth import DEPTHS

    try:
        sizes = tuple(int(s) for s in args.object_sizes.split(","))
    except ValueError:
        parser.error(f"--object-sizes: a comma-separated list of counts, not"
                     f" {args.object_sizes!r}")
    if any(size < 1 for size in sizes):
        parser.error("--object-sizes: every count must be at least 1")
    runs = 1 if args.runs is None else args.runs
    if runs < 1:
        parser.error("--runs must be at least 1")
    report = run(n, args.dir, not args.no_peers, progress_enabled=True,
                 depths=DEPTHS if args.depth else (),
                 object_sizes=sizes if args.objects else (), runs=runs)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0
