"""One peer of the dispatch benchmark, measured in its own interpreter.

Run: ``python -m nursery_jobs.bench._peers PEER --n N --dir DIR --durability normal|full``
with PEER one of huey, persistqueue, dbos, apscheduler. Prints one JSON object on stdout
(everything else, including the peer's own logging, goes to stderr):

- ``enqueue_per_s``: N no-op jobs enqueued one call per job, each durable on return by
  the library's own definition (``durability_note`` says what that is);
- ``drain_per_s``: N / the seconds from starting the library's worker to the N-th no-op
  job having run (a shared counter, an Event when it reaches N);
- ``timer_lateness_ms``: ``{"p50", "p99", "samples"}`` of (actual run time - due time)
  for a job scheduled 100 ms ahead, one at a time; ``null`` when the peer has no timers;
- ``settings``: the SQLite journal_mode and synchronous in effect, read with PRAGMA from
  the library's own connection where it can be reached (``settings_source`` says how);
- ``peer``, ``version``, ``n``, ``durability`` and ``*_note`` caveats.

A peer that cannot run here prints ``{"peer": ..., "error": "<one line>"}`` and exits 0.
The peer libraries are imported inside their runner, so this module imports without them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

PEERS = ("huey", "persistqueue", "dbos", "apscheduler")
DISTRIBUTIONS = {"huey": "huey", "persistqueue": "persist-queue", "dbos": "dbos",
                 "apscheduler": "APScheduler"}
TIMER_SAMPLES = 20
TIMER_DELAY_S = 0.1
# Idle polling interval given to the peers that poll (huey's worker, DBOS's queue
# thread), so an idle poller never sleeps long between looks at the queue.
POLL_S = 0.01
DRAIN_TIMEOUT_S = 300.0
TIMER_TIMEOUT_S = 10.0
# Fixed seed for the random pause before each timer sample (see Stamps.pause).
TIMER_SEED = 6
# The peers' own fixed timer ticks: huey's scheduler runs at most once a second
# (scheduler_interval >= 1); DBOS promotes DELAYED workflows from a background thread
# every 1.0 s (_BACKGROUND_JOBS_INTERVAL_SEC, not configurable).
HUEY_SCHEDULER_TICK_S = 1.0
DBOS_BACKGROUND_TICK_S = 1.0
SYNCHRONOUS_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}

log = logging.getLogger("nursery_jobs.bench_peers")


class PeerUnavailable(Exception):
    """The peer cannot run here (not installed, or refuses the setup)."""


class Countdown:
    """A thread-safe counter of finished jobs; ``done`` is set at the target."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def hit(self) -> None:
        with self._lock:
            self.count += 1
            if self.count >= self.target:
                self.done.set()

    def wait(self, what: str) -> None:
        if not self.done.wait(DRAIN_TIMEOUT_S):
            raise RuntimeError(f"{what}: only {self.count}/{self.target} jobs ran "
                               f"within {DRAIN_TIMEOUT_S:.0f} s")


class Stamps:
    """Run times (``time.time()``) recorded by the timer job, one sample at a time."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.ran = threading.Event()
        self._rng = random.Random(TIMER_SEED)

    def pause(self, tick_s: float) -> None:
        """Sleep a random part of the peer's own timer tick before the next sample.

        A timer that fires on a fixed tick, scheduled right after the previous sample ran
        (just after a tick), would otherwise always land at the same phase and report the
        same worst-case lateness; the pause spreads the samples over the tick, as timers
        set at arbitrary moments would be.
        """
        if tick_s > 0:
            time.sleep(self._rng.uniform(0.0, tick_s))

    def record(self) -> None:
        self.values.append(time.time())
        self.ran.set()

    def take(self) -> float:
        if not self.ran.wait(TIMER_TIMEOUT_S):
            raise RuntimeError(f"a 100 ms timer did not fire within {TIMER_TIMEOUT_S:.0f} s")
        self.ran.clear()
        return self.values[-1]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _lateness(seconds: list[float]) -> dict[str, Any]:
    ms = [s * 1000.0 for s in seconds]
    return {"p50": round(_pct(ms, 0.50), 3), "p99": round(_pct(ms, 0.99), 3),
            "min": round(min(ms), 3), "max": round(max(ms), 3), "samples": len(ms)}


def _sqlite_settings(row: Callable[[str], Any]) -> dict[str, Any]:
    """journal_mode and synchronous through ``row(pragma) -> first column``."""
    journal = str(row("PRAGMA journal_mode")).lower()
    sync = int(row("PRAGMA synchronous"))
    return {"journal_mode": journal, "synchronous": SYNCHRONOUS_NAMES.get(sync, str(sync))}


def _file_settings(path: Path) -> dict[str, Any]:
    """Settings seen from a fresh connection of our own (journal_mode is a property of
    the file once it is WAL; synchronous is then SQLite's compile-time default)."""
    conn = sqlite3.connect(path)
    try:
        return _sqlite_settings(lambda sql: conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


def _rate(n: int, seconds: float) -> float | None:
    return round(n / seconds, 1) if seconds > 0 else None


# -- huey -------------------------------------------------------------------------------
def run_huey(n: int, directory: Path, durability: str) -> dict[str, Any]:
    try:
        from huey import SqliteHuey
    except ImportError as exc:
        raise PeerUnavailable(f"huey not importable: {exc}") from exc

    # SqliteHuey's only sync knob is fsync: True -> synchronous=FULL, False -> OFF,
    # unset (the default) -> no PRAGMA, i.e. SQLite's default. It has no NORMAL.
    fsync = True if durability == "full" else None
    huey = SqliteHuey("nj-bench", filename=str(directory / "huey.db"), fsync=fsync)
    jobs = Countdown(n)
    stamps = Stamps()

    def run_noop() -> None:
        jobs.hit()

    def run_stamp() -> None:
        stamps.record()

    # The same as decorating with @huey.task() (huey is untyped, so no decorator syntax).
    noop: Any = huey.task()(run_noop)
    stamp: Any = huey.task()(run_stamp)

    t0 = time.perf_counter()
    for _ in range(n):
        noop()
    enqueue_s = time.perf_counter() - t0
    settings = _sqlite_settings(lambda sql: huey.storage.conn.execute(sql).fetchone()[0])

    # The real consumer, one worker thread plus huey's scheduler thread, as
    # huey_consumer.py -w 1 -n -d 0.01 -m 0.01 would run it.
    consumer = huey.create_consumer(workers=1, periodic=False, initial_delay=POLL_S,
                                    backoff=1.15, max_delay=POLL_S)
    t0 = time.perf_counter()
    consumer.start()
    try:
        jobs.wait("huey drain")
        drain_s = time.perf_counter() - t0
        lateness = []
        for _ in range(TIMER_SAMPLES):
            stamps.pause(HUEY_SCHEDULER_TICK_S)
            due = time.time() + TIMER_DELAY_S
            stamp.schedule(delay=TIMER_DELAY_S)
            lateness.append(stamps.take() - due)
    finally:
        consumer.stop(graceful=True)
    huey.storage.close()
    return {
        "enqueue_per_s": _rate(n, enqueue_s),
        "drain_per_s": _rate(n, drain_s),
        "timer_lateness_ms": _lateness(lateness),
        "settings": {**settings, "fsync": fsync},
        "settings_source": "PRAGMA on huey.storage.conn (huey's own connection)",
        "durability_note": (
            "task() returns after huey's INSERT has committed (autocommit); with journal_mode"
            f"={settings['journal_mode']} and synchronous={settings['synchronous']} the"
            " commit is on disk before the call returns"),
        "settings_note": (
            "SqliteHuey has no synchronous=NORMAL: fsync=True sets FULL, fsync=False sets OFF,"
            " and the default (used for durability=normal) sets none, leaving SQLite's default"
            f" ({settings['synchronous']} here); so durability=normal runs with an fsync per"
            " commit, stricter than nursery_jobs' normal (WAL, synchronous=NORMAL)"),
        "drain_note": (
            "huey's own consumer (create_consumer + start/stop), 1 worker thread, periodic off,"
            f" worker idle poll {POLL_S * 1000:.0f} ms (initial_delay=max_delay={POLL_S}; huey"
            " only sleeps when the queue is empty); each job is dequeued in its own exclusive"
            " transaction (SELECT + DELETE, committed) plus revoke-flag reads; results=True,"
            " but a None result is not stored"),
        "timer_note": (
            "stamp.schedule(delay=0.1): the worker moves the task to huey's schedule table and"
            " huey's scheduler thread re-enqueues due tasks once per tick; the tick cannot be"
            " under 1 s (scheduler_interval >= 1), so lateness spans ~0-1 s plus the"
            f" {POLL_S * 1000:.0f} ms worker poll; each sample starts after a random 0-1 s pause"
            " so samples spread over the tick instead of phase-locking to its worst case"),
    }


# -- persist-queue ------------------------------------------------------------------------
def run_persistqueue(n: int, directory: Path, durability: str) -> dict[str, Any]:
    try:
        from persistqueue import SQLiteAckQueue
    except ImportError as exc:
        raise PeerUnavailable(f"persist-queue not importable: {exc}") from exc

    path = directory / "persistqueue"
    queue = SQLiteAckQueue(str(path), auto_commit=True, multithreading=False)
    jobs = Countdown(n)

    def noop(item: Any) -> None:
        jobs.hit()

    t0 = time.perf_counter()
    for i in range(n):
        queue.put(i)
    enqueue_s = time.perf_counter() - t0

    # The consumer is the documented loop: item = q.get(); process it; q.ack(item).
    t0 = time.perf_counter()
    while not jobs.done.is_set():
        item = queue.get(timeout=DRAIN_TIMEOUT_S)
        noop(item)
        queue.ack(item)
    drain_s = time.perf_counter() - t0

    settings, source = _persistqueue_settings(queue, path / "data.db")
    queue.close()
    return {
        "enqueue_per_s": _rate(n, enqueue_s),
        "drain_per_s": _rate(n, drain_s),
        "timer_lateness_ms": None,
        "settings": settings,
        "settings_source": source,
        "durability_note": (
            "put() returns after its INSERT has committed (auto_commit=True); with"
            f" journal_mode={settings['journal_mode']} and synchronous="
            f"{settings['synchronous']} the commit is on disk before put() returns"),
        "settings_note": (
            "persist-queue has no sync setting (it sets journal_mode=WAL only), so"
            " durability=normal and full run the same configuration, with an fsync per commit:"
            " stricter than nursery_jobs' normal (WAL, synchronous=NORMAL)"),
        "drain_note": (
            "single-threaded get()/ack() loop; each job costs two commits (mark unacked on get,"
            " mark acked on ack); acked rows stay in the table (no delete) until"
            " clear_acked_data() is called, which this loop does not do"),
        "timer_note": "persist-queue has no timers or delayed delivery",
    }


def _persistqueue_settings(queue: Any, db_file: Path) -> tuple[dict[str, Any], str]:
    """Read the PRAGMAs on persist-queue's own connection (a private attribute, read only)."""
    conn = getattr(queue, "_getter", None)
    if isinstance(conn, sqlite3.Connection):
        return (_sqlite_settings(lambda sql: conn.execute(sql).fetchone()[0]),
                "PRAGMA on the queue's own sqlite3 connection")
    return (_file_settings(db_file),
            "our own connection to data.db (persist-queue sets journal_mode=WAL only)")


# -- DBOS -------------------------------------------------------------------------------------
def run_dbos(n: int, directory: Path, durability: str) -> dict[str, Any]:
    try:
        from dbos import DBOS, SetEnqueueOptions
    except ImportError as exc:
        raise PeerUnavailable(f"dbos not importable: {exc}") from exc

    queue_name = "nj_bench"
    db_path = directory / "dbos.sqlite"
    config: Any = {"name": "nj-bench-peers", "system_database_url": f"sqlite:///{db_path}"}
    jobs = Countdown(n)
    stamps = Stamps()
    sleeper_stamps = Stamps()

    def register() -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
        @DBOS.workflow()
        def noop_workflow() -> None:
            jobs.hit()

        @DBOS.workflow()
        def stamp_workflow() -> None:
            stamps.record()

        @DBOS.workflow()
        def sleeper_workflow() -> None:
            DBOS.sleep(TIMER_DELAY_S)
            sleeper_stamps.record()

        return noop_workflow, stamp_workflow, sleeper_workflow

    # Phase 1, the enqueuer: a DBOS process that listens to no queue, so nothing is
    # dequeued while we enqueue (the docs' queue-worker split: one service enqueues, the
    # worker service dequeues).
    DBOS(config=config)
    noop_workflow, stamp_workflow, sleeper_workflow = register()
    DBOS.listen_queues([])
    DBOS.launch()
    try:
        DBOS.register_queue(queue_name, polling_interval_sec=POLL_S)
        t0 = time.perf_counter()
        for _ in range(n):
            DBOS.enqueue_workflow(queue_name, noop_workflow)
        enqueue_s = time.perf_counter() - t0
    finally:
        DBOS.destroy()

    # Phase 2, the worker: a DBOS process listening to every queue. Drain time runs from
    # launch (which starts the queue threads) to the N-th workflow having run.
    DBOS(config=config)
    t0 = time.perf_counter()
    DBOS.launch()
    launch_s = time.perf_counter() - t0
    try:
        jobs.wait("dbos drain")
        drain_s = time.perf_counter() - t0
        settings, source = _dbos_settings(db_path)

        # Timers, primary: an enqueue delayed by 0.1 s (a durable DELAYED row, promoted to
        # ENQUEUED by DBOS's background thread once due, then dequeued by the queue thread).
        lateness = []
        for _ in range(TIMER_SAMPLES):
            stamps.pause(DBOS_BACKGROUND_TICK_S)
            due = time.time() + TIMER_DELAY_S
            with SetEnqueueOptions(delay_seconds=TIMER_DELAY_S):
                DBOS.enqueue_workflow(queue_name, stamp_workflow)
            lateness.append(stamps.take() - due)

        # Timers, secondary: a started workflow that sleeps durably for 0.1 s.
        sleep_lateness = []
        for _ in range(TIMER_SAMPLES):
            started = time.time()
            handle = DBOS.start_workflow(sleeper_workflow)
            ran = sleeper_stamps.take()
            handle.get_result()
            sleep_lateness.append(ran - (started + TIMER_DELAY_S))
    finally:
        DBOS.destroy()

    return {
        "enqueue_per_s": _rate(n, enqueue_s),
        "drain_per_s": _rate(n, drain_s),
        "timer_lateness_ms": _lateness(lateness),
        "timer_lateness_ms_durable_sleep": _lateness(sleep_lateness),
        "launch_s": round(launch_s, 3),
        "settings": settings,
        "settings_source": source,
        "durability_note": (
            "DBOS.enqueue_workflow returns after the workflow's ENQUEUED row has committed"
            " (docs: 'after it returns your function is guaranteed to eventually execute even"
            f" if your app is interrupted'); with journal_mode={settings['journal_mode']} and"
            f" synchronous={settings['synchronous']} the commit is on disk"),
        "settings_note": (
            "DBOS sets no journal_mode or synchronous on SQLite (only busy_timeout, foreign_keys"
            " and IMMEDIATE transactions; a custom system_database_engine would bypass that"
            " setup), so durability=normal and full run the same configuration, SQLite's"
            " defaults: a rollback journal with fsyncs per commit, stricter than nursery_jobs'"
            " normal (WAL, synchronous=NORMAL)"),
        "drain_note": (
            f"DBOS.register_queue(polling_interval_sec={POLL_S}; default 1.0) with no concurrency"
            " limit (the default; a worker_concurrency limit only drained slower in our trials),"
            " so a poll claims every queued workflow and each runs on its own executor"
            " thread (hundreds of live threads at peak); each workflow's status is written"
            " PENDING then SUCCESS; enqueued by a DBOS process listening to no queue, drained by"
            " a fresh one, timed from DBOS.launch() of the worker (which starts the queue"
            " threads; launch_s is how long launch() itself took)"),
        "timer_note": (
            "timer_lateness_ms: DBOS.enqueue_workflow inside SetEnqueueOptions(delay_seconds=0.1),"
            " a durable DELAYED row; DBOS's background thread promotes due rows to ENQUEUED every"
            " 1.0 s (fixed), then a queue poll dequeues it, so lateness spans ~0-1 s plus one"
            f" {POLL_S * 1000:.0f} ms poll; each sample starts after a random 0-1 s pause so"
            " samples spread over that tick; timer_lateness_ms_durable_sleep: a workflow started"
            " with DBOS.start_workflow that calls DBOS.sleep(0.1) (the wake-up time is recorded"
            " durably, the wait itself is a time.sleep in a live thread), measured from the"
            " start_workflow call"),
    }


def _dbos_settings(db_path: Path) -> tuple[dict[str, Any], str]:
    """Read the PRAGMAs through DBOS's own engine (a private attribute, read only)."""
    try:
        from dbos._dbos import _get_dbos_instance

        engine = _get_dbos_instance()._sys_db.engine
        with engine.connect() as conn:
            settings = _sqlite_settings(lambda sql: conn.exec_driver_sql(sql).scalar())
        return settings, "PRAGMA on a connection from DBOS's own system-database engine"
    except Exception as exc:  # private attributes moved: fall back to the file
        log.warning("could not reach DBOS's engine (%s); reading the file instead", exc)
        return _file_settings(db_path), "our own connection to dbos.sqlite (DBOS sets none)"


# -- APScheduler 4 -------------------------------------------------------------------------
class _ApsState:
    """What APScheduler's jobs touch. Its tasks must be importable module-level callables
    (it stores a reference to them), so the jobs reach their state through here."""

    current: _ApsState | None = None

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.done = asyncio.Event()
        self.stamped = asyncio.Event()
        self.stamps: list[float] = []


async def _aps_noop() -> None:
    state = _ApsState.current
    assert state is not None
    state.count += 1
    if state.count >= state.target:
        state.done.set()


async def _aps_stamp() -> None:
    state = _ApsState.current
    assert state is not None
    state.stamps.append(time.time())
    state.stamped.set()


def run_apscheduler(n: int, directory: Path, durability: str) -> dict[str, Any]:
    try:
        from apscheduler import AsyncScheduler
        from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
        from apscheduler.triggers.date import DateTrigger
        from sqlalchemy.ext.asyncio import create_async_engine
    except ImportError as exc:
        raise PeerUnavailable(f"apscheduler not importable: {exc}") from exc

    url = f"sqlite+aiosqlite:///{directory / 'aps.db'}"

    async def main() -> dict[str, Any]:
        # The same engine SQLAlchemyDataStore would make from the URL; made here only so
        # we can read its PRAGMAs (and dispose of it) ourselves.
        engine = create_async_engine(url)
        state = _ApsState(n)
        _ApsState.current = state
        try:
            async with AsyncScheduler(SQLAlchemyDataStore(engine)) as scheduler:
                t0 = time.perf_counter()
                for _ in range(n):
                    await scheduler.add_job(_aps_noop)
                enqueue_s = time.perf_counter() - t0

                t0 = time.perf_counter()
                await scheduler.start_in_background()
                await asyncio.wait_for(state.done.wait(), DRAIN_TIMEOUT_S)
                drain_s = time.perf_counter() - t0

                lateness = []
                for _ in range(TIMER_SAMPLES):
                    due = datetime.now(UTC) + timedelta(seconds=TIMER_DELAY_S)
                    await scheduler.add_schedule(_aps_stamp, DateTrigger(due))
                    await asyncio.wait_for(state.stamped.wait(), TIMER_TIMEOUT_S)
                    state.stamped.clear()
                    lateness.append(state.stamps[-1] - due.timestamp())
                await scheduler.stop()
                await scheduler.wait_until_stopped()
            async with engine.connect() as conn:
                journal = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
                sync = int((await conn.exec_driver_sql("PRAGMA synchronous")).scalar() or 0)
                settings = {"journal_mode": str(journal).lower(),
                            "synchronous": SYNCHRONOUS_NAMES.get(sync, str(sync))}
        finally:
            await engine.dispose()
        return {"enqueue_s": enqueue_s, "drain_s": drain_s, "lateness": lateness,
                "settings": settings}

    out = asyncio.run(main())
    settings = out["settings"]
    return {
        "enqueue_per_s": _rate(n, out["enqueue_s"]),
        "drain_per_s": _rate(n, out["drain_s"]),
        "timer_lateness_ms": _lateness(out["lateness"]),
        "settings": settings,
        "settings_source": "PRAGMA on a connection from the data store's own engine",
        "durability_note": (
            "await scheduler.add_job() returns after the data store's transaction inserting"
            f" the job has committed; with journal_mode={settings['journal_mode']} and"
            f" synchronous={settings['synchronous']} the commit is on disk"),
        "settings_note": (
            "SQLAlchemyDataStore sets no journal_mode or synchronous, so durability=normal and"
            " full run the same configuration, SQLite's defaults: a rollback journal with fsyncs"
            " per commit, stricter than nursery_jobs' normal (WAL, synchronous=NORMAL)"),
        "drain_note": (
            "AsyncScheduler (role both) started with start_in_background() under asyncio;"
            " default task settings, so max_running_jobs=1 per task: the no-op jobs run one at"
            " a time, each acquired and released in its own transactions, and each acquire reads"
            " and deserializes up to 100 pending jobs to take one; result_expiration_time=0, so"
            " no result rows are written"),
        "timer_note": (
            "add_schedule(stamp, DateTrigger(now + 0.1 s)); the schedule loop wakes on the"
            " ScheduleAdded event and sleeps until the fire time, then adds a job"),
    }


RUNNERS: dict[str, Callable[[int, Path, str], dict[str, Any]]] = {
    "huey": run_huey,
    "persistqueue": run_persistqueue,
    "dbos": run_dbos,
    "apscheduler": run_apscheduler,
}


def _version(peer: str) -> str | None:
    try:
        return metadata.version(DISTRIBUTIONS[peer])
    except metadata.PackageNotFoundError:
        return None


def measure(peer: str, n: int, directory: Path, durability: str) -> dict[str, Any]:
    """Run one peer and return its result, or ``{"peer", "error"}`` if it cannot run."""
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        result = RUNNERS[peer](n, directory, durability)
    except PeerUnavailable as exc:
        log.warning("peer %s unavailable: %s", peer, exc)
        error = str(exc)
    except Exception as exc:
        log.exception("peer %s failed", peer)
        cause: BaseException = exc
        while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
            cause = cause.exceptions[0]
        first_line = (str(cause).strip().splitlines() or [""])[0]
        error = f"{type(cause).__name__}: {first_line}"
    else:
        return {"peer": peer, "version": _version(peer), "n": n, "durability": durability,
                **result, "wall_s": round(time.perf_counter() - t0, 2)}
    return {"peer": peer, "version": _version(peer), "n": n, "durability": durability,
            "error": " ".join(error.split())[:300]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nursery_jobs.bench._peers",
        description="Measure one peer job library: durable enqueue, drain, 100 ms timer.")
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--n", type=int, default=2000, help="no-op jobs to enqueue and drain")
    parser.add_argument("--dir", type=Path, required=True, help="directory for the databases")
    parser.add_argument("--durability", choices=("normal", "full"), default="normal")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    # Peer libraries may log or print to stdout; point fd 1 at stderr for the run and keep
    # the real stdout for the one JSON line.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        result = measure(args.peer, args.n, args.dir, args.durability)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
