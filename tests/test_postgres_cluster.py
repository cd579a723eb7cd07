"""Many hosts on one PostgreSQL database, as real processes (DESIGN.md section 9).

Host processes (``tests/pg_cluster_worker.py``) share a database; this module SIGKILLs
and restarts them at random, pauses one (SIGSTOP) for longer than its lease and resumes
it, and reads the story from their append-only log and from the database:

- every job runs, and its write to its own object's storage lands exactly once: each
  object's counter ends at exactly the number of jobs pushed to it (DESIGN §3,
  "Exactly-once local effects"), with no job and no dead letter left;
- more than one host did the work;
- the paused host, once resumed, finds its writes refused (``object:fenced``) and starts
  no job of an object it lost — no job start under a lease epoch older than the one the
  object had when the host resumed;
- calls between the hosts throughout: no two calls to an object return the same count
  (what a call returned is durable, the output gate, on a host being fenced too);
- a stub call reaches the object on the host that holds it; once that host is killed,
  a call is served elsewhere when the lease expires.

Real time throughout (PostgreSQL I/O runs in threads). A job running when its host dies
gets a crash strike and waits 30 s (DESIGN §3), so the short variant lasts ~45 s; its
kills all land before any struck job is due again, so no job is struck twice.

The in-process tests at the end pin, one at a time and deterministically, the lease
bugs the cluster found or suggested: a stalled host starting jobs of an object it lost,
leases renewed on virtual time, an orphaned lease renewed for ever, row locks held by a
host stopped inside a transaction, a fence at the end of an alarm run taken for a crash.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import attrs
import pytest
import trio
import trio.testing

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

from pg_cluster_worker import Worker
from pg_support import eventually, fresh_database, sql

import nursery_jobs as nj
from nursery_jobs._engines.postgres._engine import PostgresEngine

WORKER = Path(__file__).with_name("pg_cluster_worker.py")
SLOTS = ("h0", "h1", "h2")
PAUSED = "h2"  # the host that is SIGSTOPped (never killed: its resume is what we watch)
LEASE_TTL = 2.0

pytestmark = pytest.mark.crash


@attrs.frozen
class Line:
    kind: str
    slot: str
    pid: int
    fields: tuple[str, ...]  # what follows the pid, less the time
    offset: int  # where the line starts in the log


async def asql(dsn: str, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
    return await trio.to_thread.run_sync(sql, dsn, query, params)


@attrs.define
class Cluster:
    """The host processes of one test, their config and their common log."""

    dir: Path
    config: dict[str, Any]
    procs: dict[str, trio.Process] = attrs.Factory(dict)
    # (slot, pid, return code) of every process that ended.
    ended: list[tuple[str, int, int]] = attrs.Factory(list)
    runs: int = 0

    @classmethod
    def create(cls, tmp_path: Path, dsn: str, **config: Any) -> Cluster:
        config = {"dsn": dsn, "log": str(tmp_path / "hosts.log"), "lease_ttl": LEASE_TTL,
                  "sleep": [0.005, 0.03], "workload": {}, "shares": {}, "lead": 0.5,
                  "spread": 0.0, **config}
        (tmp_path / "config.json").write_text(json.dumps(config))
        Path(config["log"]).touch()
        return cls(tmp_path, config)

    @property
    def log(self) -> Path:
        return Path(self.config["log"])

    async def start(self, slot: str) -> trio.Process:
        self.runs += 1
        with self.stderr_file(f"{slot}-{self.runs}.err") as stderr:
            proc = await trio.lowlevel.open_process(
                [sys.executable, str(WORKER), str(self.dir / "config.json"), slot],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            )
        self.procs[slot] = proc
        return proc

    def stderr_file(self, name: str) -> BinaryIO:
        return (self.dir / name).open("wb")

    def lines(self) -> list[Line]:
        out, offset = [], 0
        for raw in self.log.read_bytes().splitlines(keepends=True):
            parts = raw.decode().split()
            if raw.endswith(b"\n") and len(parts) >= 4:
                out.append(Line(parts[0], parts[1], int(parts[2]), tuple(parts[3:-1]),
                                offset))
            offset += len(raw)
        return out

    async def wait_up(self, slot: str, seconds: float = 60.0) -> str:
        """Wait for the host in ``slot`` to log ``up``; return its engine host id."""
        proc = self.procs[slot]
        with trio.fail_after(seconds):
            while True:
                for line in self.lines():
                    if line.kind == "up" and line.pid == proc.pid:
                        return line.fields[0]
                if proc.poll() is not None:
                    raise AssertionError(f"host {slot} exited ({proc.returncode})"
                                         f" before it was up{self.stderr()}")
                await trio.sleep(0.02)

    async def kill(self, slot: str) -> None:
        proc = self.procs.pop(slot)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        self.ended.append((slot, proc.pid, await proc.wait()))

    async def stop_all(self) -> None:
        """SIGTERM every host (a graceful shutdown) and wait for them to exit."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(30):
            for slot, proc in list(self.procs.items()):
                self.ended.append((slot, proc.pid, await proc.wait()))
                del self.procs[slot]
        for slot in list(self.procs):
            await self.kill(slot)

    def stderr(self) -> str:
        texts = [f"\n--- {p.name}\n{p.read_text()[-3000:]}"
                 for p in sorted(self.dir.glob("*.err")) if p.read_text().strip()]
        return "".join(texts)


async def objects(dsn: str) -> dict[str, tuple[str | None, int]]:
    return {oid: (owner, int(epoch)) for oid, owner, epoch in await asql(
        dsn, "SELECT object_id, owner, epoch FROM nj_objects")}


async def remaining(dsn: str) -> tuple[int, int]:
    """(job rows left, objects whose workload is pushed), as shipped to PostgreSQL."""
    ((jobs, pushed),) = await asql(
        dsn, "SELECT count(*) FILTER (WHERE tbl = 'nj_jobs'),"
        " count(*) FILTER (WHERE tbl = 'nj_kv' AND key = 'pushed') FROM nj_rows")
    return int(jobs), int(pushed)


@attrs.frozen
class Plan:
    objects: int
    jobs: int  # jobs of the first object; object i gets jobs + i % 10
    spread: float  # seconds over which each object's jobs fall due
    kills: int
    pause_at: float  # seconds after every host is up
    bound: float  # the whole test, seconds


SHORT = Plan(objects=30, jobs=30, spread=8.0, kills=4, pause_at=2.5, bound=120.0)
LONG = Plan(objects=60, jobs=60, spread=20.0, kills=14, pause_at=8.0, bound=300.0)


async def run_cluster(tmp_path: Path, plan: Plan) -> None:
    seed = random.randrange(2**32)
    print(f"cluster seed {seed}")  # shown on failure
    rng = random.Random(seed)
    workload = {f"o{i:02d}": plan.jobs + i % 10 for i in range(plan.objects)}
    shares = {slot: [o for i, o in enumerate(workload) if i % len(SLOTS) == n]
              for n, slot in enumerate(SLOTS)}
    t_begin = trio.current_time()
    with fresh_database() as dsn, trio.fail_after(plan.bound):
        cluster = Cluster.create(
            tmp_path, dsn, workload=workload, shares=shares, spread=plan.spread,
            idle_timeout=30.0, calls=True,
        )
        try:
            for slot in SLOTS:
                await cluster.start(slot)
            host_ids = {slot: await cluster.wait_up(slot) for slot in SLOTS}
            up = trio.current_time()
            paused = cluster.procs[PAUSED]
            pause: dict[str, Any] = {}

            async def kills() -> None:
                for _ in range(plan.kills):
                    await trio.sleep(rng.uniform(0.8, 2.0))
                    slot = rng.choice([s for s in SLOTS if s != PAUSED])
                    await cluster.kill(slot)
                    await trio.sleep(rng.uniform(0.1, 0.8))
                    await cluster.start(slot)

            async def pause_one() -> None:
                await trio.sleep_until(up + plan.pause_at)
                paused.send_signal(signal.SIGSTOP)
                pause["at_stop"] = await objects(dsn)
                await trio.sleep(2.5 * LEASE_TTL)
                pause["at_cont"] = await objects(dsn)
                # Nothing of the paused host's is in the log past here but what it
                # writes after it resumes (a stopped process writes nothing).
                pause["offset"] = cluster.log.stat().st_size
                paused.send_signal(signal.SIGCONT)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(kills)
                nursery.start_soon(pause_one)
            for slot in SLOTS:
                await cluster.wait_up(slot)
            while True:  # (polled, not too often: each poll is a new connection)
                if await remaining(dsn) == (0, plan.objects):
                    break
                await trio.sleep(0.25)
            await cluster.stop_all()
            lines = cluster.lines()
            # Read every object back through the API, on a host of our own.
            async with nj.open_runtime(PostgresEngine(dsn, lease_ttl=LEASE_TTL)) as rt:
                reports = {oid: await rt.get(Worker, oid).report() for oid in workload}
        finally:
            await cluster.stop_all()
    print(f"cluster: {sum(workload.values())} jobs, {plan.kills} kills,"
          f" {trio.current_time() - t_begin:.1f} s")
    check(cluster, workload, reports, lines, host_ids[PAUSED], paused.pid, pause)


def check(
    cluster: Cluster, workload: dict[str, int], reports: dict[str, dict[str, Any]],
    lines: list[Line], paused_host: str, paused_pid: int, pause: dict[str, Any],
) -> None:
    where = cluster.stderr()
    # Every job ran; each object's counter counts each of its jobs exactly once.
    for oid, n in workload.items():
        report = dict(reports[oid])
        report.pop("calls")
        assert report == {"pushed": n, "count": n, "jobs": [], "dead": []}, (oid, where)
    done = {line.fields[1] for line in lines if line.kind == "done"}
    assert done == {f"{oid}-{k:04d}" for oid, n in workload.items() for k in range(n)}
    # Graceful exits (SIGTERM) of the hosts left at the end; SIGKILL for the others.
    assert {code for _, _, code in cluster.ended} <= {0, -signal.SIGKILL}, cluster.ended
    assert sum(code == -signal.SIGKILL for _, _, code in cluster.ended) >= 1
    # More than one host did the work.
    per_slot = Counter(line.slot for line in lines if line.kind == "done")
    print(f"jobs done per host slot: {dict(per_slot)}")
    assert len(per_slot) >= 2, per_slot
    # The paused host lost objects while it was stopped ...
    at_stop, at_cont = pause["at_stop"], pause["at_cont"]
    lost = {oid for oid, (owner, epoch) in at_stop.items()
            if owner == paused_host and at_cont[oid] != (owner, epoch)}
    print(f"the paused host held {sum(o == paused_host for o, _ in at_stop.values())}"
          f" objects and lost {len(lost)}")
    assert lost, (at_stop, at_cont)
    # ... and, resumed, had its writes refused ...
    after = [line for line in lines if line.pid == paused_pid
             and line.offset >= pause["offset"]]
    fenced = {line.fields[1] for line in after
              if line.kind == "event" and line.fields[0] == "object:fenced"}
    assert fenced, after
    # ... and started no job under a lease it had lost.
    stale = [line for line in after if line.kind == "start"
             and int(line.fields[2]) < at_cont[line.fields[0]][1]]
    assert stale == [], stale
    # Calls from every host to objects wherever they live: what a call returned is
    # durable (the output gate, also on a host being fenced), so no two calls to an
    # object returned the same count, and the final count is at least each of them.
    returned: dict[str, list[int]] = defaultdict(list)
    crossed = 0
    for line in lines:
        if line.kind == "call":
            oid, value, served = line.fields
            returned[oid].append(int(value))
            crossed += served != line.slot
    errors = Counter(line.fields[1] for line in lines if line.kind == "callerr")
    print(f"calls: {sum(map(len, returned.values()))} returned ({crossed} served by another"
          f" host), errors {dict(errors)}")
    assert crossed > 0
    for oid, values in returned.items():
        assert len(values) == len(set(values)), (oid, sorted(values))
        assert max(values) <= reports[oid]["calls"], (oid, max(values), reports[oid])
    # Every start names the lease it ran under; no two hosts ran an object under one.
    runners: dict[tuple[str, str], set[int]] = defaultdict(set)
    for line in lines:
        if line.kind == "start":
            runners[(line.fields[0], line.fields[2])].add(line.pid)
    assert all(len(pids) == 1 for pids in runners.values()), runners


async def test_hosts_share_jobs_through_kills_and_a_pause(tmp_path: Path) -> None:
    await run_cluster(tmp_path, SHORT)


@pytest.mark.soak
async def test_hosts_share_jobs_through_kills_and_a_pause_long(tmp_path: Path) -> None:
    await run_cluster(tmp_path, LONG)


async def test_calls_reach_the_holding_host_and_move_when_it_dies(tmp_path: Path) -> None:
    with fresh_database() as dsn, trio.fail_after(90):
        cluster = Cluster.create(tmp_path, dsn, hold={"h0": ["x"], "h1": ["y"]})
        try:
            await cluster.start("h0")
            await cluster.start("h1")
            h0 = await cluster.wait_up("h0")
            h1 = await cluster.wait_up("h1")
            assert await objects(dsn) == {"x": (h0, 1), "y": (h1, 1)}
            async with nj.open_runtime(PostgresEngine(dsn, lease_ttl=LEASE_TTL)) as rt:
                x, y = rt.get(Worker, "x"), rt.get(Worker, "y")
                # From this process to the hosts that hold the objects, and back.
                assert await x.whoami() == "h0"
                assert await x.add_count(5) == 5
                assert await y.whoami() == "h1"
                with pytest.raises(KeyError, match="from h0"):
                    await x.fail("from h0")
                # From one host process to another: y (on h1) calls x (on h0).
                assert await y.relay("x") == ("h1", "h0", 5)
                assert await x.add_count(2) == 7
                # h0 dies holding x: h1's call waits out the lease, then h1 takes x
                # over and serves it, with the state h0 shipped.
                await cluster.kill("h0")
                assert (await objects(dsn))["x"] == (h0, 1)
                assert await y.relay("x") == ("h1", "h1", 7)
                assert await objects(dsn) == {"x": (h1, 2), "y": (h1, 1)}
                assert await x.add_count(1) == 8
                assert await x.whoami() == "h1"
        finally:
            await cluster.stop_all()
    assert [code for _, _, code in cluster.ended] == [-signal.SIGKILL, 0], cluster.stderr()


class Stalling(nj.DurableObject):
    """Records the jobs it starts; ``stall`` blocks the Trio thread (a paused host)."""

    namespace = "tests.pg_cluster.Stalling"
    started: ClassVar[list[str]] = []

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, delay: float) -> None:
        await self.lifecycle.jobs.push("work", id="j", delay=delay)

    async def stall(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 — the point: nothing of this host runs

    async def on_job(self, ctx: nj.JobContext) -> None:
        Stalling.started.append(ctx.job.id)


async def test_a_host_stalled_past_its_lease_starts_no_job_of_the_object(
    tmp_path: Path,
) -> None:
    """The zombie, in one process: while the host's Trio thread is blocked for longer
    than ``lease_ttl``, another host takes the object over; when the thread runs again
    the object's job is due, and the host must not start it (its lease is not known to
    be held), but drop the object (``object:fenced``)."""
    ttl = 1.0
    Stalling.started = []
    with fresh_database() as dsn, trio.fail_after(30):
        engine = PostgresEngine(dsn, lease_ttl=ttl)
        async with nj.open_runtime(engine) as rt:
            events: list[str] = []
            fenced = trio.Event()

            def listen(event: nj.Event) -> None:
                events.append(event.type)
                if event.type == "object:fenced":
                    fenced.set()

            rt.events.add_listener(listen)
            stub = rt.get(Stalling, "s")
            await stub.push(delay=ttl)

            def take_over() -> None:
                time.sleep(ttl / 2)
                sql(dsn, "UPDATE nj_objects SET owner = 'other-host', epoch = epoch + 1,"
                    " lease_until = now() + interval '1 minute'")

            thief = threading.Thread(target=take_over)
            thief.start()
            await stub.stall(2 * ttl)  # the job falls due while the thread is blocked
            thief.join()
            with trio.move_on_after(3 * ttl):
                await fenced.wait()
            await trio.sleep(0.2)
        assert Stalling.started == []
        assert "object:fenced" in events
        assert sql(dsn, "SELECT owner, epoch FROM nj_objects") == [("other-host", 2)]


async def test_under_a_mock_clock_leases_are_renewed_on_real_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    """A lease ends on the server's clock, so the trust in it is real time: the engine
    must renew it in real time even where Trio's clock is virtual and stands still (a
    busy test, here: a task that never blocks), or a job falling due afterwards would
    be refused as if the host had been paused."""
    ttl = 1.0
    Stalling.started = []
    with fresh_database() as dsn:
        async with nj.open_runtime(PostgresEngine(dsn, lease_ttl=ttl)) as rt:
            events: list[str] = []
            rt.events.add_listener(lambda event: events.append(event.type))
            stub = rt.get(Stalling, "s")
            await stub.push(delay=0.1)  # due before the renewal's virtual deadline
            begun = time.monotonic()
            while time.monotonic() - begun < 2 * ttl:  # virtual time stands still
                await trio.lowlevel.checkpoint()
            await trio.sleep(1.0)  # the job falls due
            await eventually(lambda: Stalling.started or "object:fenced" in events)
        assert (Stalling.started, events.count("object:fenced")) == (["j"], 0)


async def test_a_lease_whose_release_failed_expires_and_its_alarm_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An evicted object's release may fail (the server was unreachable for a moment):
    the lease must then expire by itself — not be renewed for ever with the host's
    others, which would keep every host, this one included, from running its alarm."""
    from nursery_jobs._engines.postgres import _ops as _pg_ops

    ttl = 1.0
    Stalling.started = []
    release = _pg_ops.release
    failed: list[object] = []

    def release_fails_once(conn: Any, me: str, leases: Any) -> None:
        if not failed:
            failed.append(leases)
            raise psycopg.OperationalError("the server went away (test)")
        release(conn, me, leases)

    monkeypatch.setattr(_pg_ops, "release", release_fails_once)
    with fresh_database() as dsn, trio.fail_after(30):
        async with nj.open_runtime(PostgresEngine(dsn, lease_ttl=ttl), idle_timeout=0.2) as rt:
            await rt.get(Stalling, "s").push(delay=1.0)
            # Evicted when idle; its release fails; the job falls due a little later.
            await eventually(lambda: failed and not rt.active_objects(), 10)
            await eventually(lambda: Stalling.started, 15)
        assert Stalling.started == ["j"]


async def test_a_host_paused_inside_a_transaction_holds_no_row_past_its_lease() -> None:
    """A host stopped (SIGSTOP, a partition) between a transaction's statements keeps
    its row locks while its connection lives — after a renewal's UPDATE, the rows of
    every object it holds — and another host taking one of them over would wait for it,
    however long. The server ends such a transaction once it has been idle for
    ``lease_ttl``."""
    ttl = 0.5
    with fresh_database() as dsn, trio.fail_after(30):
        a = PostgresEngine(dsn, lease_ttl=ttl)  # a host that never renews: it stopped
        a.open(nj.now())
        try:
            await a.open_object(Worker.namespace, "x", "pg_cluster_worker:Worker")
            pool: Any = a._statements.pool

            def stopped_inside_a_transaction() -> None:
                with pool.connection() as conn, contextlib.suppress(psycopg.Error):
                    conn.execute("BEGIN")
                    conn.execute("SELECT 1 FROM nj_objects FOR UPDATE")
                    time.sleep(6 * ttl)  # (idle in the transaction, the rows locked)
                    conn.execute("COMMIT")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, stopped_inside_a_transaction)
                await trio.sleep(0.2)
                async with nj.open_runtime(PostgresEngine(dsn, lease_ttl=ttl), env="B") as b:
                    with trio.fail_after(4 * ttl):
                        assert await b.get(Worker, "x").add_count(1) == 1
        finally:
            a.close()


class Waiting(nj.DurableObject):
    """A job that runs until the test lets it finish."""

    namespace = "tests.pg_cluster.Waiting"
    running: ClassVar[trio.Event]
    finish: ClassVar[trio.Event]

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self) -> None:
        await self.lifecycle.jobs.push("work", id="j", delay=0.2)

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ctx.storage.put("ran", True)
        Waiting.running.set()
        await Waiting.finish.wait()


async def test_an_alarm_run_whose_writes_are_refused_is_fenced_not_crashed() -> None:
    """Another host takes the object over while its job runs here: the run's writes
    are refused when it ends, and that is one incident — ``object:fenced`` — not also a
    crash of the object (``object:error``, an ERROR with a traceback)."""
    Waiting.running, Waiting.finish = trio.Event(), trio.Event()
    with fresh_database() as dsn, trio.fail_after(30):
        async with nj.open_runtime(PostgresEngine(dsn, lease_ttl=30.0)) as rt:
            events: list[str] = []
            fenced = trio.Event()

            def listen(event: nj.Event) -> None:
                events.append(event.type)
                if event.type == "object:fenced":
                    fenced.set()

            rt.events.add_listener(listen)
            await rt.get(Waiting, "w").push()
            await Waiting.running.wait()
            await asql(dsn, "UPDATE nj_objects SET owner = 'other-host', epoch = epoch + 1")
            Waiting.finish.set()
            await fenced.wait()
            await eventually(lambda: not rt.active_objects())
        assert [e for e in events if e.startswith("object:")] == ["object:fenced"]
        assert await asql(dsn, "SELECT count(*) FROM nj_rows WHERE tbl = 'nj_kv'") == [(0,)]


class Counting(nj.DurableObject):
    """Counts calls in its storage; ``bodies`` records each run of ``bump``'s body."""

    namespace = "tests.pg_cluster.Counting"
    bodies: ClassVar[list[int]] = []

    async def bump(self) -> int:
        n = self.ctx.storage.get("n", 0) + 1
        Counting.bodies.append(n)
        self.ctx.storage.put("n", n)
        return n

    async def stall(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 — the point: nothing of this host runs


async def test_a_call_on_a_host_stalled_past_its_lease_never_runs_on_the_stale_copy() -> None:
    """The zombie, for calls: after the host's thread was blocked past ``lease_ttl`` and
    another host took the object, a call must not run its method on this host's stale
    copy (its effects would happen twice over); it is routed again and served once, on
    the object as it stands (here: once the other host's short lease has run out)."""
    ttl = 1.0
    Counting.bodies = []
    with fresh_database() as dsn, trio.fail_after(30):
        async with nj.open_runtime(dsn, lease_ttl=ttl) as rt:
            events: list[str] = []
            rt.events.add_listener(lambda event: events.append(event.type))
            stub = rt.get(Counting, "c")
            assert await stub.bump() == 1

            def take_over() -> None:
                time.sleep(ttl / 2)
                sql(dsn, "UPDATE nj_objects SET owner = 'other-host', epoch = epoch + 1,"
                    " lease_until = now() + interval '1 second'")

            thief = threading.Thread(target=take_over)
            thief.start()
            await stub.stall(2 * ttl)
            thief.join()
            assert await stub.bump() == 2
        assert Counting.bodies == [1, 2]  # the second body ran once, on the fresh copy
        assert "object:fenced" in events
        ((epoch,),) = sql(dsn, "SELECT epoch FROM nj_objects")
        assert epoch == 3  # taken back after the other host's lease (epoch 2)
