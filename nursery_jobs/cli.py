"""The ``nursery-jobs`` console script: inspect a data directory, re-queue dead
letters, run the dispatch benchmark."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any


def _connect(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise SystemExit(f"nursery-jobs: {path} does not exist")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _catalog(data: Path) -> sqlite3.Connection:
    return _connect(data / "catalog.sqlite3")


def inspect(data: Path, as_json: bool) -> int:
    """Objects, their alarms, queued jobs and dead letters."""
    catalog = _catalog(data)
    objects = catalog.execute(
        "SELECT o.namespace, o.object_id, o.file, a.time, a.retry FROM nj_objects o"
        " LEFT JOIN nj_alarms a USING (namespace, object_id) ORDER BY o.namespace, o.object_id"
    ).fetchall()
    report: list[dict[str, Any]] = []
    for namespace, object_id, file, alarm, retry in objects:
        entry: dict[str, Any] = {"namespace": namespace, "id": object_id, "alarm": alarm,
                                 "alarm_retry": retry, "jobs": 0, "dead_letters": []}
        db_path = data / "objects" / file
        if db_path.exists():
            db = _connect(db_path)
            try:
                tables = {r[0] for r in db.execute(
                    "SELECT name FROM sqlite_master WHERE type='table'")}
            except sqlite3.OperationalError:
                # A running runtime holds its active objects' databases exclusively.
                entry["jobs"] = "in use by a running runtime"
                tables = set()
            if "nj_jobs" in tables:
                entry["jobs"] = db.execute("SELECT COUNT(*) FROM nj_jobs").fetchone()[0]
                entry["dead_letters"] = [
                    {"owner": owner, "id": job_id, "error": error, "attempts": attempts,
                     "reason": reason, "time": when}
                    for owner, job_id, error, attempts, reason, when in db.execute(
                        "SELECT owner, id, error, attempts, reason, time FROM nj_dead_letters"
                        " ORDER BY time")
                ]
            db.close()
        report.append(entry)
    if as_json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 0
    print(f"{len(report)} object(s) in {data}")
    for entry in report:
        alarm = "no alarm" if entry["alarm"] is None else f"alarm at {entry['alarm']:.3f}"
        print(f"  {entry['namespace']}/{entry['id']}: {alarm}, {entry['jobs']} job(s),"
              f" {len(entry['dead_letters'])} dead letter(s)")
        for letter in entry["dead_letters"]:
            print(f"    dead: {letter['owner']}/{letter['id']} after {letter['attempts']}"
                  f" attempt(s) ({letter['reason']}): {letter['error']}")
    return 0


def requeue(data: Path, namespace: str, object_id: str, job_id: str, owner: str) -> int:
    """Move a dead letter back into its object's queue (due now) with a runtime."""
    import trio

    from ._lifecycle import Lifecycle
    from ._object import resolve_namespace
    from ._runtime import open_runtime

    catalog = _catalog(data)
    row = catalog.execute(
        "SELECT class_path FROM nj_objects WHERE namespace = ? AND object_id = ?",
        (namespace, object_id),
    ).fetchone()
    catalog.close()
    if row is None:
        print(f"nursery-jobs: no object {namespace}/{object_id} in {data}", file=sys.stderr)
        return 2
    cls = resolve_namespace(namespace, row[0])
    if cls is None:
        print(f"nursery-jobs: cannot import the class of {namespace} ({row[0]}); run from the"
              " application's directory or set PYTHONPATH", file=sys.stderr)
        return 2

    async def main() -> Any:
        async with open_runtime(data) as rt:
            host = await rt._activate(cls, namespace, object_id)
            lifecycle = getattr(host.instance, "lifecycle", None)
            if not isinstance(lifecycle, Lifecycle):
                raise SystemExit(f"nursery-jobs: {namespace}/{object_id} has no Lifecycle")
            return await lifecycle.requeue(job_id, owner=owner)

    job = trio.run(main)
    if job is None:
        print(f"nursery-jobs: no dead letter {owner}/{job_id} in {namespace}/{object_id}",
              file=sys.stderr)
        return 1
    print(f"re-queued {owner}/{job_id} of {namespace}/{object_id}: due now")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nursery-jobs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="list objects, alarms, jobs and dead letters")
    p_inspect.add_argument("data", type=Path)
    p_inspect.add_argument("--json", action="store_true")
    p_requeue = sub.add_parser("requeue", help="put a dead letter back in its queue")
    p_requeue.add_argument("data", type=Path)
    p_requeue.add_argument("namespace")
    p_requeue.add_argument("object_id")
    p_requeue.add_argument("job_id")
    p_requeue.add_argument("--owner", default="host", help="the job's owner (default: host)")
    sub.add_parser("bench", help="run the dispatch benchmark (see: nursery-jobs bench -h)",
                   add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from ._bench import main as bench_main

        return bench_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "inspect":
        return inspect(args.data, args.json)
    return requeue(args.data, args.namespace, args.object_id, args.job_id, args.owner)


if __name__ == "__main__":
    sys.exit(main())

