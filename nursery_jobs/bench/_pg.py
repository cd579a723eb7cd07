"""``nursery-jobs bench --engine postgres``: the PostgreSQL engine measured against a
plain-psycopg ceiling, in one run, on a database the benchmark creates and drops.

Figures (each the median and range of ``runs`` runs, the runs interleaved so that noise
from other work on the machine spreads over every figure): the ceiling (claim+delete of
no-op jobs in batches of 100 over one connection); dispatch on one host, one object and
100 objects; one, two and three host processes on 300 objects, with the CPU each process
and the server used; pushes per call and batched, and 100 callers pushing into 100
objects at once (group commit), with the host's and the server's CPU per push;
cross-host call latency; activation of
an object with 100 jobs and 100 KV rows; failover after a SIGKILL.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict

import nursery_jobs as nj
from nursery_jobs._engines.postgres._engine import PostgresEngine, _safe_label

from ._pg_host import HostBench, PgBenchObject
from ._progress import Progress
from ._quiet import quiet_backlog_warnings

SCALE_OBJECTS = 300
MANY_OBJECTS = 100
# Targets from the issue (#12).
TARGET_DISPATCH_PER_S = 10_000
TARGET_VS_CEILING = 0.3
TARGET_CALL_P50_MS = 2.0  # issue 26 (it was 3 ms)
# Issue 26: 100 callers pushing into 100 objects, one push per call, on one host.
CONCURRENT_CALLERS = 100
TARGET_CONCURRENT_PUSH_PER_S = 10_000
_TABLES = "nj_objects, nj_rows, nj_crashes, nj_calls, nj_hosts"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, Any]:
    """Median and range of one figure's runs."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


# -- the database -----------------------------------------------------------------------
def _with_dbname(dsn: str, dbname: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme in ("postgresql", "postgres"):
        return parts._replace(path="/" + dbname).geturl()
    return f"{dsn} dbname={dbname}"  # a key=value connection string


@contextmanager
def fresh_database(dsn: str) -> Iterator[str]:
    """Create ``nj_bench_<random>`` on the server of ``dsn``; yield its address; drop it."""
    import psycopg

    name = f"nj_bench_{secrets.token_hex(5)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield _with_dbname(dsn, name)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _reset(dsn: str) -> None:
    """Empty the engine's tables between measurements (no runtime is open)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('nj_objects') IS NOT NULL").fetchone()
        if exists and exists[0]:
            conn.execute(f"TRUNCATE {_TABLES}")


# -- CPU accounting (Linux /proc; empty elsewhere) -------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _server_cpu(dbname: str) -> dict[int, float]:
    """CPU seconds of the server's backends connected to ``dbname``, by pid."""
    found: dict[int, float] = {}
    if not os.path.isdir("/proc"):
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if cmdline.startswith(b"postgres: ") and f" {dbname} ".encode() in cmdline:
            cpu = _proc_cpu(int(entry))
            if cpu is not None:
                found[int(entry)] = cpu
    return found


def _load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: how busy the machine was besides us."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return float(sum(values) - idle), float(sum(values))


class _CpuWindow:
    """CPU used by this database's server backends and by the machine over a window."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname
        self.server0 = _server_cpu(dbname)
        self.machine0 = _machine_cpu()
        self.wall0 = time.perf_counter()

    def close(self) -> dict[str, float]:
        wall = time.perf_counter() - self.wall0
        server1 = _server_cpu(self.dbname)
        server = sum(cpu - self.server0.get(pid, 0.0) for pid, cpu in server1.items())
        busy1, total1 = _machine_cpu()
        total = total1 - self.machine0[1]
        machine = (busy1 - self.machine0[0]) / total if total else 0.0
        return {"server_cpu": server / wall if wall else 0.0,
                "machine_busy": machine * (os.cpu_count() or 1)}


# -- the ceiling: plain psycopg ---------------------------------------------------------
def ceiling(dsn: str, n: int) -> dict[str, float]:
    """Plain psycopg, one connection, ``synchronous_commit = off`` (our durability
    "normal"): enqueue in batches of 100, then claim+delete in batches of 100."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("DROP TABLE IF EXISTS bench_jobs")
        conn.execute("CREATE TABLE bench_jobs (id bigserial PRIMARY KEY, time float8 NOT NULL,"
                     " payload text)")
        conn.execute("CREATE INDEX bench_jobs_time ON bench_jobs (time)")
        t0 = time.perf_counter()
        for start in range(0, n, 100):
            now = time.time()
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany("INSERT INTO bench_jobs (time, payload) VALUES (%s, %s)",
                                [(now, str(i)) for i in range(start, min(n, start + 100))])
        t1 = time.perf_counter()
        done = 0
        while True:
            rows = conn.execute(
                "DELETE FROM bench_jobs WHERE id IN (SELECT id FROM bench_jobs"
                " WHERE time <= %s ORDER BY time LIMIT 100 FOR UPDATE SKIP LOCKED)"
                " RETURNING id, payload", (time.time(),),
            ).fetchall()
            if not rows:
                break
            done += len(rows)
        t2 = time.perf_counter()
        conn.execute("DROP TABLE bench_jobs")
    if done != n:
        raise RuntimeError(f"the ceiling drained {done} of {n} jobs")
    return {"enqueue_per_s": n / (t1 - t0), "claim_delete_per_s": n / (t2 - t1)}


# -- one host, in this process ----------------------------------------------------------
async def _dispatch(dsn: str, dbname: str, objects: int, n: int) -> dict[str, float]:
    bench = HostBench("A")
    per_object = n // objects
    bench.target = per_object * objects
    async with nj.open_runtime(dsn, env=bench) as rt:
        for i in range(objects):
            await rt.get(PgBenchObject, f"d{i}").fill(per_object)
        await trio.sleep(0.1)  # every object's alarm run is now parked on its gate job
        window = _CpuWindow(dbname)
        t0 = time.perf_counter()
        bench.start()
        await bench.done.wait()
        elapsed = time.perf_counter() - t0
        cpu = window.close()
    host_cpu = (bench.last_cpu - bench.go_cpu) / elapsed
    return {"per_s": bench.target / elapsed, "host_cpu": host_cpu,
            "server_cpu": cpu["server_cpu"],
            "other_cpu": max(0.0, cpu["machine_busy"] - host_cpu - cpu["server_cpu"])}


async def _pushes(dsn: str, per_call: int, batched: int) -> dict[str, float]:
    async with nj.open_runtime(dsn, env=HostBench("A")) as rt:
        obj = rt.get(PgBenchObject, "pushes")
        await obj.ping()  # activation is not a push
        t0 = time.perf_counter()
        for i in range(per_call):
            await obj.push_one(i)  # returns once the push is committed in PostgreSQL
        t1 = time.perf_counter()
        await obj.push_batched(batched)
        t2 = time.perf_counter()
    return {"per_call_per_s": per_call / (t1 - t0), "batched_per_s": batched / (t2 - t1)}


async def concurrent_pushes(dsn: str, callers: int, per_caller: int) -> dict[str, float]:
    """``callers`` tasks, each pushing ``per_caller`` jobs into its own object, one push
    per stub call (each durable in PostgreSQL when its call returns): the ships of
    different objects share round trips (group commit, issue 26). CPU per push: this
    process's (all threads, and the Trio thread's share) and the server backends' of
    this database (their /proc/<pid>/stat, 0 where there is no /proc)."""
    engine = PostgresEngine(dsn)
    dbname = _dbname(dsn)
    async with nj.open_runtime(engine, env=HostBench("A")) as rt:
        stubs = [rt.get(PgBenchObject, f"c{i}") for i in range(callers)]
        for stub in stubs:
            await stub.ping()  # activation is not a push
        before = engine.ship_statistics()

        async def caller(stub: Any) -> None:
            for i in range(per_caller):
                await stub.push_one(i)

        server0 = _server_cpu(dbname)
        t0, cpu0, trio0 = time.perf_counter(), time.process_time(), time.thread_time()
        async with trio.open_nursery() as nursery:
            for stub in stubs:
                nursery.start_soon(caller, stub)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        trio_cpu = time.thread_time() - trio0  # the Trio thread's share of ``cpu``
        server = sum(c - server0.get(pid, 0.0) for pid, c in _server_cpu(dbname).items())
        after = engine.ship_statistics()
    pushes = callers * per_caller
    trips = after.round_trips - before.round_trips
    return {"per_s": pushes / elapsed, "cpu_us": cpu / pushes * 1e6,
            "trio_cpu_us": trio_cpu / pushes * 1e6,
            "server_cpu_us": server / pushes * 1e6,
            "ships_per_round_trip": (after.ships - before.ships) / trips if trips else 0.0}


def _dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn).get("dbname", ""))


async def _activation(dsn: str, objects: int) -> dict[str, float]:
    async with nj.open_runtime(dsn, env=HostBench("A")) as rt:
        for i in range(objects):
            await rt.get(PgBenchObject, f"a{i}").load(100, 100)
    ms = []
    async with nj.open_runtime(dsn, env=HostBench("A")) as rt:  # nothing resident
        for i in range(objects):
            t0 = time.perf_counter()
            await rt.get(PgBenchObject, f"a{i}").ping()
            ms.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": _pct(ms, 0.5), "p99_ms": _pct(ms, 0.99)}


# -- other hosts: subprocesses ------------------------------------------------------------
class _Host:
    """A host process (``_pg_host``), driven one JSON line at a time."""

    def __init__(self, dsn: str, name: str, lease_ttl: float = 10.0) -> None:
        self.name = name
        self.log: IO[str] = tempfile.TemporaryFile("w+")  # closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nursery_jobs.bench._pg_host", dsn, "--name", name,
             "--lease-ttl", str(lease_ttl)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
        )
        try:
            self.ready = self.read()
        except BaseException:
            self.stop()
            raise

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            tail = self.log.read().strip().splitlines()[-5:]
            raise RuntimeError(f"bench host {self.name} exited {self.proc.wait()}: "
                               + " | ".join(tail))
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"bench host {self.name}: {answer['error']}")
        return answer

    def ask(self, **command: Any) -> dict[str, Any]:
        self.send(**command)
        return self.read()

    def cpu(self) -> float | None:
        return _proc_cpu(self.proc.pid)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.log.close()


@contextmanager
def _hosts(dsn: str, count: int, lease_ttl: float = 10.0) -> Iterator[list[_Host]]:
    hosts: list[_Host] = []
    try:
        for i in range(count):
            hosts.append(_Host(dsn, f"H{i + 1}", lease_ttl))
        yield hosts
    finally:
        for host in hosts:
            host.stop()


def scaling(dsn: str, dbname: str, host_count: int, n: int) -> dict[str, Any]:
    """``host_count`` host processes share 300 objects (object i on host i mod count),
    each with a gate job and ``n / 300`` no-op jobs; the starting gun goes to all at once."""
    per_object = max(1, n // SCALE_OBJECTS)
    with _hosts(dsn, host_count) as hosts:
        for h, host in enumerate(hosts):
            host.send(op="fill", per_object=per_object,
                      objects=[f"s{i}" for i in range(h, SCALE_OBJECTS, host_count)])
        for host in hosts:
            host.read()
        time.sleep(0.2)  # every alarm run parked on its gate
        window = _CpuWindow(dbname)
        for host in hosts:
            host.send(op="go")
        results = [host.read() for host in hosts]
        cpu = window.close()
    host_cpu = [(r["last_cpu"] - r["go_cpu"]) / (r["last_wall"] - r["go_wall"])
                for r in results]
    start = min(r["go_wall"] for r in results)
    end = max(r["last_wall"] for r in results)
    total = sum(r["count"] for r in results)
    return {
        "per_s": total / (end - start),
        "host_cpu": host_cpu, "server_cpu": cpu["server_cpu"],
        "other_cpu": max(0.0, cpu["machine_busy"] - sum(host_cpu) - cpu["server_cpu"]),
    }


async def _call_latency(dsn: str, samples: int) -> dict[str, float]:
    async with nj.open_runtime(dsn, env=HostBench("A")) as rt:
        stub = rt.get(PgBenchObject, "remote")
        for _ in range(5):  # warm up: connections, the first forward
            where = await stub.ping()
        if where != "B":
            raise RuntimeError(f"the call ran on host {where!r}, not on host B")
        ms = []
        for _ in range(samples):
            t0 = time.perf_counter()
            await stub.ping()
            ms.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": _pct(ms, 0.5), "p99_ms": _pct(ms, 0.99)}


def call_latency(dsn: str, samples: int) -> dict[str, float]:
    """Host A (this process) calls an object that host B (a subprocess) holds."""
    with _named_host(dsn, "B") as b:
        b.ask(op="hold", objects=["remote"])
        return trio.run(_call_latency, dsn, samples)


@contextmanager
def _named_host(dsn: str, name: str, lease_ttl: float = 10.0) -> Iterator[_Host]:
    host = _Host(dsn, name, lease_ttl)
    try:
        yield host
    finally:
        host.stop()


async def _survive(dsn: str, lease_ttl: float, objects: int,
                   arm_and_kill: Callable[[], float]) -> dict[str, float]:
    bench = HostBench("A")
    bench.marks_wanted = objects
    async with nj.open_runtime(PostgresEngine(dsn, lease_ttl=lease_ttl), env=bench):
        await trio.sleep(0.2)  # A is up and polling
        killed = await trio.to_thread.run_sync(arm_and_kill)
        with trio.fail_after(lease_ttl * 3 + 10):
            await bench.marked.wait()
    return {"first_s": min(bench.marks) - killed, "all_s": max(bench.marks) - killed}


def failover(dsn: str, lease_ttl: float, objects: int) -> dict[str, float]:
    """Host B holds ``objects`` objects and is given a job due 0.5 s later on each, then
    SIGKILLed at once; host A (this process, already running) runs those jobs once B's
    leases expire. Measured from the kill to the first and the last of them running."""
    with _named_host(dsn, "B", lease_ttl) as b:
        ids = [f"f{i}" for i in range(objects)]
        b.ask(op="hold", objects=ids)

        def arm_and_kill() -> float:
            b.ask(op="mark", objects=ids, at=time.time() + 0.5)  # committed in PostgreSQL
            b.kill()
            return time.time()

        return trio.run(_survive, dsn, lease_ttl, objects, arm_and_kill)


# -- the report -----------------------------------------------------------------------------
FIGURES = (
    "ceiling_enqueue_batch_100_per_s", "ceiling_claim_delete_batch_100_per_s",
    "dispatch_1_object_per_s", "dispatch_100_objects_per_s",
    "dispatch_1_object_vs_ceiling", "dispatch_100_objects_vs_ceiling",
    "dispatch_1_object_host_cpu", "dispatch_1_object_server_cpu", "dispatch_1_object_other_cpu",
    "dispatch_100_objects_host_cpu", "dispatch_100_objects_server_cpu",
    "dispatch_100_objects_other_cpu",
    "hosts_1_per_s", "hosts_2_per_s", "hosts_3_per_s", "hosts_2_scaling", "hosts_3_scaling",
    "hosts_1_host_cpu", "hosts_2_host_cpu", "hosts_3_host_cpu",
    "hosts_1_server_cpu", "hosts_2_server_cpu", "hosts_3_server_cpu",
    "hosts_1_other_cpu", "hosts_2_other_cpu", "hosts_3_other_cpu",
    "push_per_call_per_s", "push_batched_per_s", "push_concurrent_per_s",
    "push_concurrent_cpu_us", "push_concurrent_trio_cpu_us",
    "push_concurrent_server_cpu_us", "push_concurrent_ships_per_round_trip",
    "call_p50_ms", "call_p99_ms",
    "activation_p50_ms", "activation_p99_ms", "failover_first_s", "failover_all_s",
)


class Settings:
    """How much each measurement does (``--quick``: a smoke test, not figures)."""

    def __init__(self, n: int, runs: int, quick: bool, lease_ttl: float,
                 calls_only: bool = False) -> None:
        self.n, self.runs, self.quick, self.lease_ttl = n, runs, quick, lease_ttl
        self.calls_only = calls_only  # only the cross-host call figures
        self.push_per_call = min(n, 50 if quick else 2000)
        self.push_callers = CONCURRENT_CALLERS
        self.push_per_caller = 2 if quick else 100
        self.call_samples = 20 if quick else 300
        self.activations = 3 if quick else 20
        self.failover_objects = 3 if quick else 10


def _one_run(
    dsn: str, dbname: str, s: Settings, progress: Progress, prefix: str
) -> dict[str, float]:
    out: dict[str, float] = {}

    def measure(label: str, fn: Callable[[], Any]) -> Any:
        _reset(dsn)
        result = fn()
        progress.step(prefix + label)
        return result

    if s.calls_only:
        call = measure("cross-host calls", lambda: call_latency(dsn, s.call_samples))
        return {"call_p50_ms": call["p50_ms"], "call_p99_ms": call["p99_ms"]}
    ceil = measure("psycopg ceiling", lambda: ceiling(dsn, s.n))
    out["ceiling_enqueue_batch_100_per_s"] = ceil["enqueue_per_s"]
    out["ceiling_claim_delete_batch_100_per_s"] = ceil["claim_delete_per_s"]
    for objects, name in ((1, "1_object"), (MANY_OBJECTS, "100_objects")):
        result = measure(f"dispatch, {objects} object(s)",
                         functools.partial(trio.run, _dispatch, dsn, dbname, objects, s.n))
        out[f"dispatch_{name}_per_s"] = result["per_s"]
        out[f"dispatch_{name}_vs_ceiling"] = result["per_s"] / ceil["claim_delete_per_s"]
        for what in ("host_cpu", "server_cpu", "other_cpu"):
            out[f"dispatch_{name}_{what}"] = result[what]
    for count in (1, 2, 3):
        result = measure(f"{count} host process(es), {SCALE_OBJECTS} objects",
                         functools.partial(scaling, dsn, dbname, count, s.n))
        out[f"hosts_{count}_per_s"] = result["per_s"]
        out[f"hosts_{count}_host_cpu"] = statistics.mean(result["host_cpu"])
        out[f"hosts_{count}_server_cpu"] = result["server_cpu"]
        out[f"hosts_{count}_other_cpu"] = result["other_cpu"]
    out["hosts_2_scaling"] = out["hosts_2_per_s"] / out["hosts_1_per_s"]
    out["hosts_3_scaling"] = out["hosts_3_per_s"] / out["hosts_1_per_s"]
    pushes = measure("pushes", lambda: trio.run(_pushes, dsn, s.push_per_call, s.n))
    out["push_per_call_per_s"] = pushes["per_call_per_s"]
    out["push_batched_per_s"] = pushes["batched_per_s"]
    many = measure(f"pushes, {s.push_callers} callers", lambda: trio.run(
        concurrent_pushes, dsn, s.push_callers, s.push_per_caller))
    out["push_concurrent_per_s"] = many["per_s"]
    out["push_concurrent_cpu_us"] = many["cpu_us"]
    out["push_concurrent_trio_cpu_us"] = many["trio_cpu_us"]
    out["push_concurrent_server_cpu_us"] = many["server_cpu_us"]
    out["push_concurrent_ships_per_round_trip"] = many["ships_per_round_trip"]
    call = measure("cross-host calls", lambda: call_latency(dsn, s.call_samples))
    out["call_p50_ms"], out["call_p99_ms"] = call["p50_ms"], call["p99_ms"]
    act = measure("activation", lambda: trio.run(_activation, dsn, s.activations))
    out["activation_p50_ms"], out["activation_p99_ms"] = act["p50_ms"], act["p99_ms"]
    fail = measure("failover", lambda: failover(dsn, s.lease_ttl, s.failover_objects))
    out["failover_first_s"], out["failover_all_s"] = fail["first_s"], fail["all_s"]
    return out


def run(dsn: str, s: Settings, progress_enabled: bool) -> dict[str, Any]:
    """Every figure, ``s.runs`` times, on a database created for the run and dropped."""
    import psycopg

    # (the measurements of _one_run)
    progress = Progress(s.runs * (1 if s.calls_only else 11), progress_enabled)
    load_start = _load()
    runs: list[dict[str, float]] = []
    with fresh_database(dsn) as db:
        dbname = urllib.parse.urlsplit(db).path.lstrip("/") if "://" in db else db.rsplit(
            "dbname=", 1)[-1]
        with psycopg.connect(db) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        for i in range(s.runs):
            runs.append(_one_run(db, dbname, s, progress, f"run {i + 1}/{s.runs}: "))
    figures = {name: summary([r[name] for r in runs]) for name in FIGURES if name in runs[0]}

    def med(name: str) -> float:
        return float(figures[name]["median"])

    targets = {"call p50 <= 2 ms": med("call_p50_ms") <= TARGET_CALL_P50_MS}
    if not s.calls_only:
        targets = {
            "dispatch_per_s >= 10,000": min(med("dispatch_1_object_per_s"),
                                            med("dispatch_100_objects_per_s"))
            >= TARGET_DISPATCH_PER_S,
            "dispatch >= 0.3x ceiling": min(med("dispatch_1_object_vs_ceiling"),
                                            med("dispatch_100_objects_vs_ceiling"))
            >= TARGET_VS_CEILING,
            **targets,
            "100 callers push >= 10,000/s": med("push_concurrent_per_s")
            >= TARGET_CONCURRENT_PUSH_PER_S,
            "failover <= lease_ttl + 1 s": med("failover_all_s") <= s.lease_ttl + 1.0,
        }
    return {
        "engine": "postgres", "server": _safe_label(dsn),
        "server_version": None if version is None else version[0],
        "n": s.n, "runs": s.runs, "quick": s.quick, "lease_ttl": s.lease_ttl,
        "scale_objects": SCALE_OBJECTS, "cores": os.cpu_count(),
        "load_average": {"start": load_start, "end": _load()},
        "python": sys.version.split()[0], "nursery_jobs": nj.__version__,
        "figures": figures, "targets": targets,
    }


def _fig(f: dict[str, Any], fmt: str) -> str:
    return f"{f['median']:{fmt}} ({f['min']:{fmt}} to {f['max']:{fmt}})"


def render(report: dict[str, Any]) -> str:
    f = report["figures"]
    lines = [
        f"nursery_jobs {report['nursery_jobs']} PostgreSQL benchmark — {report['server']}"
        f" (PostgreSQL {report['server_version']}), N = {report['n']:,}, {report['runs']}"
        f" run(s), {report['cores']} cores, Python {report['python']}; load average"
        f" {report['load_average']['start']} at the start, {report['load_average']['end']}"
        " at the end",
        "median (min to max); durability \"normal\" (synchronous_commit = off)", "",
    ]

    def row(label: str, name: str, fmt: str = ",.0f", unit: str = "") -> None:
        if name not in f:  # (not measured: --calls-only)
            return
        lines.append(f"{label:<56}{_fig(f[name], fmt)}{unit}")

    def cpu_rows(prefix: str, who: str) -> None:
        row(f"  CPU of {who} (cores)", f"{prefix}_host_cpu", ".2f")
        row("  CPU of the server's backends for it (cores)", f"{prefix}_server_cpu", ".2f")
        row("  CPU of everything else on the machine (cores)", f"{prefix}_other_cpu", ".2f")

    row("psycopg ceiling: enqueue, batches of 100", "ceiling_enqueue_batch_100_per_s", unit="/s")
    row("psycopg ceiling: claim+delete, batches of 100", "ceiling_claim_delete_batch_100_per_s",
        unit="/s")
    for name, label in (("1_object", "1 object x N"),
                        ("100_objects", f"{MANY_OBJECTS} objects x N/{MANY_OBJECTS}")):
        row(f"dispatch, one host, {label}", f"dispatch_{name}_per_s", unit="/s")
        row("  vs ceiling", f"dispatch_{name}_vs_ceiling", ".2f", "x")
        cpu_rows(f"dispatch_{name}", "host")
    for count in (1, 2, 3):
        row(f"{count} host process(es), {report['scale_objects']} objects",
            f"hosts_{count}_per_s", unit="/s")
        if count > 1:
            row("  scaling vs 1 host", f"hosts_{count}_scaling", ".2f", "x")
        cpu_rows(f"hosts_{count}", "each host")
    row("push, one push per stub call", "push_per_call_per_s", unit="/s")
    row("push, batched in one storage.transaction()", "push_batched_per_s", unit="/s")
    row(f"push, {CONCURRENT_CALLERS} callers into {CONCURRENT_CALLERS} objects (one push per"
        " call)", "push_concurrent_per_s", unit="/s")
    row("  host CPU per push (all threads)", "push_concurrent_cpu_us", ".0f", " µs")
    row("  of which the Trio thread", "push_concurrent_trio_cpu_us", ".0f", " µs")
    row("  server CPU per push (this database's backends)", "push_concurrent_server_cpu_us",
        ".0f", " µs")
    row("  ships per round trip (group commit)", "push_concurrent_ships_per_round_trip", ".1f")
    row("cross-host call p50", "call_p50_ms", ".2f", " ms")
    row("cross-host call p99", "call_p99_ms", ".2f", " ms")
    row("activation, 100 jobs + 100 KV rows, p50", "activation_p50_ms", ".2f", " ms")
    row("activation, 100 jobs + 100 KV rows, p99", "activation_p99_ms", ".2f", " ms")
    row(f"failover (lease_ttl {report['lease_ttl']:g} s): first job", "failover_first_s",
        ".2f", " s")
    row(f"failover (lease_ttl {report['lease_ttl']:g} s): all jobs", "failover_all_s", ".2f",
        " s")
    lines += ["", "targets: " + ", ".join(
        f"{name}: {'met' if ok else 'MISSED'}" for name, ok in report["targets"].items())]
    return "\n".join(lines)


def main(dsn: str | None, n: int | None, runs: int | None, quick: bool, lease_ttl: float | None,
         as_json: bool, error: Callable[[str], Any], calls_only: bool = False) -> int:
    """``nursery-jobs bench --engine postgres`` (arguments parsed by the harness)."""
    if not dsn:
        error("--engine postgres needs --dsn or NJ_POSTGRES_DSN")
        return 2
    settings = Settings(
        n=n if n is not None else (600 if quick else 20_000),
        runs=runs if runs is not None else (1 if quick else 3),
        quick=quick,
        lease_ttl=lease_ttl if lease_ttl is not None else (1.0 if quick else 2.0),
        calls_only=calls_only,
    )
    if settings.n < SCALE_OBJECTS:
        error(f"-n must be at least {SCALE_OBJECTS} with --engine postgres")
    if settings.runs < 1:
        error("--runs must be at least 1")
    if not 0 < settings.lease_ttl < math.inf:
        error(f"--lease-ttl must be a number of seconds > 0, got {settings.lease_ttl}")
    try:
        with quiet_backlog_warnings():
            report = run(dsn, settings, progress_enabled=True)
    except psycopg.Error as exc:
        error(f"PostgreSQL at {_safe_label(dsn)}: {exc}")
        return 2
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0
