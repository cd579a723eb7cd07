"""The ``nursery-jobs`` console script: inspect a stopped data directory, re-queue its
dead letters, serve its dashboard, run the dispatch benchmark.

None of these starts a runtime: no alarm of any object runs inside the CLI. Against a
data directory a runtime holds, ``inspect`` and ``requeue`` say so and point to the
live dashboard (``open_runtime(..., http=...)``).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from nursery_jobs._errors import (
    DataDirectoryError,
    JobOwnershipError,
    ObjectInUseError,
    RuntimeLockedError,
    StorageError,
    UnknownObjectError,
)
from nursery_jobs._ops._inspect import OfflineSource, refuse_if_running
from nursery_jobs._ops._inspect_json import printable, report_json
from nursery_jobs._ops._offline import requeue_offline

# Exit codes: 1 nothing to do (no such dead letter), 2 bad input, 3 in use.
_IN_USE = 3


def _fail(message: str, code: int) -> int:
    print(f"nursery-jobs: {printable(message)}", file=sys.stderr)
    return code


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "none"
    delta = t - now
    if abs(delta) > 10 * 365 * 86400:
        return f"{t:.3f}"  # no calendar date means anything this far out
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
    return f"{stamp}Z ({'in ' if delta > 0 else ''}{abs(delta):.1f} s{'' if delta > 0 else ' ago'})"


def _open_stopped(data: Path) -> OfflineSource | int:
    """The data directory of a stopped runtime, or the exit code that says why not."""
    try:
        refuse_if_running(data)
        return OfflineSource(data)
    except RuntimeLockedError as exc:
        return _fail(str(exc), _IN_USE)
    except DataDirectoryError as exc:
        return _fail(str(exc), 2)


def _inspect_postgres(dsn: str, as_json: bool) -> int:
    """``inspect`` of a PostgreSQL engine's database: one read-only snapshot, with the
    leases and hosts beside the objects. Works while hosts run (it writes nothing)."""
    from nursery_jobs._ops._inspect_pg import PgSource, hosts_json, lease_json

    try:
        source = PgSource(dsn)
    except DataDirectoryError as exc:
        return _fail(str(exc), 2)
    except StorageError as exc:
        return _fail(str(exc), 2)
    with source:
        now = time.time()
        report = report_json(source, now, limit=-1)
        for entry in report["objects"]:
            entry["lease"] = lease_json(source.leases.get((entry["namespace"], entry["id"])))
        report["hosts"] = hosts_json(source)
    return _print_report(report, source.label, now, as_json)


def inspect(data: str, as_json: bool) -> int:
    """Objects, their alarms, queued jobs and dead letters. Reads only."""
    from nursery_jobs._ops._inspect_pg import is_postgres_address

    if is_postgres_address(data):
        return _inspect_postgres(data, as_json)
    source = _open_stopped(Path(data))
    if isinstance(source, int):
        return source
    now = time.time()
    try:
        report = report_json(source, now, limit=-1)
    except ObjectInUseError as exc:
        return _fail(str(exc), _IN_USE)
    except sqlite3.DatabaseError as exc:
        return _fail(f"cannot read {data}: its catalog is damaged ({exc}); a runtime"
                     " opening the directory rebuilds it", 2)
    return _print_report(report, data, now, as_json)


def _print_report(report: dict[str, Any], data: str, now: float, as_json: bool) -> int:
    if as_json:
        # ASCII only: an id's control or bidi characters come out as \u escapes.
        print(json.dumps(report, indent=2, ensure_ascii=True))
        return 0
    p = printable
    print(f"{report['total']} object(s) in {p(str(data))}")
    for entry in report["objects"]:
        counts = entry["counts"]
        state = entry["state"] if entry["problem"] is None else (
            f"{entry['state']}: {entry['problem']}")
        print(f"  {p(entry['namespace'])}/{p(entry['id'])} [{p(state)}]:"
              f" alarm {_when(entry['alarm'], now)}, {counts['jobs']} job(s),"
              f" {counts['due']} due, {counts['dead_letters']} dead letter(s)"
              + (f", {entry['breaker_strikes']} breaker strike(s)"
                 if entry["breaker_strikes"] else ""))
        lease = entry.get("lease")
        if lease is not None and lease["owner"] is not None:
            print(f"    lease {p(lease['owner'])} epoch {lease['epoch']}"
                  f" until {_when(lease['lease_until'], now)}"
                  + ("" if lease["live"] else " (expired)"))
        for job in entry["jobs"]:
            flags = "".join(f", {name}" for name in ("running", "exclusive", "singleflight")
                            if job[name])
            priority = "" if job["priority"] is None else f", priority {job['priority']}"
            print(f"    job {p(job['owner'])}/{p(job['id'])} {p(job['fn'])}:"
                  f" due {_when(job['time'], now)}, attempt {job['attempts']}"
                  f" of {job['max_attempts']}{priority}{flags}")
        for letter in entry["dead_letters"]:
            print(f"    dead {p(letter['owner'])}/{p(letter['id'])} {p(letter['fn'])}"
                  f" after {letter['attempts']} attempt(s) ({p(letter['reason'])}):"
                  f" {p(letter['error'])}")
    for host in report.get("hosts", []):
        print(f"  host {p(host['host_id'])}: heartbeat {_when(host['heartbeat'], now)},"
              f" {host['leases']} live lease(s)")
    return 0


def requeue(data: Path, namespace: str, object_id: str, job_id: str, owner: str) -> int:
    """Move a dead letter back into its object's queue, due now; the next runtime on
    ``data`` runs it. Edits the files directly: no runtime, no alarm, no user code."""
    label = f"{namespace}/{object_id}"
    try:
        done = requeue_offline(data, namespace, object_id, job_id, owner=owner, now=time.time())
    except RuntimeLockedError as exc:
        return _fail(str(exc), _IN_USE)
    except ObjectInUseError as exc:
        return _fail(str(exc), _IN_USE)
    except (DataDirectoryError, UnknownObjectError, JobOwnershipError) as exc:
        return _fail(str(exc), 2)
    except StorageError as exc:  # (a damaged file: nothing was written)
        return _fail(str(exc), 2)
    if done is None:
        return _fail(f"no dead letter {owner}/{job_id} in {label}", 1)
    print(f"re-queued {printable(owner)}/{printable(job_id)} of {printable(label)}: due now;"
          " it runs when a runtime next opens this data directory")
    return 0


def serve(data: Path, host: str, port: int) -> int:
    """Serve the dashboard of a stopped data directory, read-only, until Ctrl-C."""
    source = _open_stopped(data)
    if isinstance(source, int):
        return source
    import trio

    from nursery_jobs._ops._web import serve_offline

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_offline, source, (host, port))
            print(f"serving {printable(str(data))} (read-only) at {url}  (Ctrl-C to stop)",
                  flush=True)

    try:
        trio.run(main)
    except KeyboardInterrupt:
        return 0
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nursery-jobs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="list objects, alarms, jobs and dead letters")
    p_inspect.add_argument("data", help="a data directory or a postgresql:// address")
    p_inspect.add_argument("--json", action="store_true")
    p_requeue = sub.add_parser("requeue", help="put a dead letter back in its queue")
    p_requeue.add_argument("data", type=Path)
    p_requeue.add_argument("namespace")
    p_requeue.add_argument("object_id")
    p_requeue.add_argument("job_id")
    p_requeue.add_argument("--owner", default="host", help="the job's owner (default: host)")
    p_serve = sub.add_parser("serve", help="serve the dashboard of a stopped data directory")
    p_serve.add_argument("data", type=Path)
    p_serve.add_argument("--host", default="127.0.0.1")
    p_serve.add_argument("--port", type=int, default=8321)
    sub.add_parser("bench", help="run the dispatch benchmark (see: nursery-jobs bench -h)",
                   add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from nursery_jobs.bench import main as bench_main

        return bench_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "inspect":
        try:
            return inspect(args.data, args.json)
        except BrokenPipeError:
            # `nursery-jobs inspect DATA | head`: the reader has gone; stop quietly.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    if args.command == "serve":
        return serve(args.data, args.host, args.port)
    return requeue(args.data, args.namespace, args.object_id, args.job_id, args.owner)


if __name__ == "__main__":
    sys.exit(main())
