"""The ``nursery-jobs`` console script: inspect a stopped data directory (a file per
object, or ``shared:<directory>``) or a PostgreSQL database, re-queue its dead letters,
pause or resume its objects, serve its dashboard, run the dispatch benchmark.

None of these starts a runtime: no alarm of any object runs inside the CLI. Against a
data directory a runtime holds, every face says so and points to the live dashboard
(``open_runtime(..., http=...)``); on PostgreSQL, ``requeue`` refuses an object a live
host holds. An address is shown as given, its password as ``***``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from nursery_jobs._core._location import shared_path
from nursery_jobs._errors import (
    DataDirectoryError,
    HttpBindError,
    JobOwnershipError,
    ObjectInUseError,
    RuntimeLockedError,
    StorageError,
    UnknownObjectError,
)
from nursery_jobs._ops._inspect import DataSource, SourceAccess, is_postgres_address
from nursery_jobs._ops._inspect_json import printable, report_json
from nursery_jobs._ops._inspect_shared import SharedSource
from nursery_jobs._ops._offline import NoDeadLetter, pause_offline, requeue_offline
from nursery_jobs._ops._readonly import refuse_if_running
from nursery_jobs._ops._sources import OfflineSource

# Exit codes: 1 nothing to do (no such dead letter), 2 bad input, 3 in use.
_IN_USE = 3

# The passwords the location given on the command line carries: never printed, even
# where a driver's message quotes them.
_secrets: list[str] = []


def _masked(text: str) -> str:
    for secret in _secrets:
        text = text.replace(secret, "***")
    return text


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _fail(message: str, code: int) -> int:
    print(f"nursery-jobs: {printable(_masked(message))}", file=sys.stderr)
    return code


def _label(location: str) -> str:
    """A location as the user gave it (an address's password as ``***``)."""
    from nursery_jobs._ops._inspect_pg import address_label

    return printable(address_label(location))


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "none"
    delta = t - now
    if abs(delta) > 10 * 365 * 86400:
        return f"{t:.3f}"  # no calendar date means anything this far out
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
    return f"{stamp}Z ({'in ' if delta > 0 else ''}{abs(delta):.1f} s{'' if delta > 0 else ' ago'})"


def _open_stopped(data: str) -> OfflineSource | SharedSource | int:
    """The data directory of a stopped runtime (``shared:<directory>``: of the shared
    layout), or the exit code that says why not."""
    shared = shared_path(data)
    path = Path(data if shared is None else shared)
    try:
        refuse_if_running(path)
        return OfflineSource(path) if shared is None else SharedSource(path)
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
    except (DataDirectoryError, StorageError) as exc:
        return _fail(str(exc), 2)
    with source:
        now = time.time()
        report = report_json(source, now, limit=-1)
        for entry in report["objects"]:
            entry["lease"] = lease_json(source.lease(entry["namespace"], entry["id"]))
        report["hosts"] = hosts_json(source)
    return _print_report(report, source.label, now, as_json)


def inspect(data: str, as_json: bool) -> int:
    """Objects, their alarms, queued jobs and dead letters. Reads only."""
    if is_postgres_address(data):
        return _inspect_postgres(data, as_json)
    source = _open_stopped(data)
    if isinstance(source, int):
        return source
    now = time.time()
    try:
        report = report_json(source, now, limit=-1)
    except ObjectInUseError as exc:
        return _fail(str(exc), _IN_USE)
    except sqlite3.DatabaseError as exc:
        if isinstance(source, SharedSource):
            return _fail(f"cannot read {source.label}: its {source.database.name} is damaged"
                         f" ({exc})", 2)
        return _fail(f"cannot read {data}: its catalog is damaged ({exc}); a runtime"
                     " opening the directory rebuilds it", 2)
    finally:
        if isinstance(source, SharedSource):
            source.close()
    return _print_report(report, source.label if isinstance(source, SharedSource) else data,
                         now, as_json)


def _print_report(report: dict[str, Any], data: str, now: float, as_json: bool) -> int:
    if as_json:
        # ASCII only: an id's control or bidi characters come out as \u escapes.
        print(json.dumps(report, indent=2, ensure_ascii=True))
        return 0
    p = printable
    print(f"{report['total']} object(s) in {_label(data)}")
    for entry in report["objects"]:
        counts = entry["counts"]
        state = entry["state"] if entry["problem"] is None else (
            f"{entry['state']}: {entry['problem']}")
        print(f"  {p(entry['namespace'])}/{p(entry['id'])} [{p(state)}]:"
              f" alarm {_when(entry['alarm'], now)}, {counts['jobs']} job(s),"
              f" {counts['due']} due, {counts['dead_letters']} dead letter(s)"
              + (f", {entry['breaker_strikes']} breaker strike(s)"
                 if entry["breaker_strikes"] else "") + _paused_text(entry.get("paused")))
        lease = entry.get("lease")
        if lease is not None and lease["owner"] is not None:
            print(f"    lease {p(lease['owner'])} epoch {lease['epoch']}"
                  f" until {_when(lease['lease_until'], now)}"
                  + ("" if lease["live"] else " (expired)"))
        for job in entry["jobs"]:
            flags = "".join(f", {name}" for name in ("running", "exclusive", "singleflight")
                            if job[name])
            priority = "" if job["priority"] is None else f", priority {job['priority']}"
            if job.get("timeout") is not None:
                flags += f", timeout {job['timeout']:g} s"
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


def _paused_text(paused: list[str | None] | None) -> str:
    """", paused" (the whole object) or ", paused: queue, host" (those owners)."""
    if not paused:
        return ""
    if None in paused:
        return ", paused"
    return ", paused: " + ", ".join(printable(str(owner)) for owner in paused)


def requeue(data: str, namespace: str, object_id: str, job_id: str, owner: str) -> int:
    """Move a dead letter back into its object's queue, due now. A data directory's
    files are edited directly (the next runtime on it runs the job); on PostgreSQL the
    object's rows, if no live host holds it (a host claims it at once). No runtime, no
    alarm, no user code."""
    label = f"{namespace}/{object_id}"
    postgres = is_postgres_address(data)
    shared = shared_path(data)
    try:
        if postgres:
            from nursery_jobs._ops._offline import requeue_postgres

            done = requeue_postgres(data, namespace, object_id, job_id, owner=owner,
                                    now=time.time())
        elif shared is not None:
            from nursery_jobs._ops._offline_shared import requeue_shared

            data = f"shared:{shared}"
            done = requeue_shared(shared, namespace, object_id, job_id, owner=owner,
                                  now=time.time())
        else:
            done = requeue_offline(data, namespace, object_id, job_id, owner=owner,
                                   now=time.time())
    except RuntimeLockedError as exc:
        return _fail(str(exc), _IN_USE)
    except ObjectInUseError as exc:
        return _fail(str(exc), _IN_USE)
    except (DataDirectoryError, UnknownObjectError, JobOwnershipError) as exc:
        return _fail(str(exc), 2)
    except StorageError as exc:  # (a damaged file, an unreachable server: nothing written)
        return _fail(str(exc), 2)
    if isinstance(done, NoDeadLetter):
        return _fail(_no_dead_letter(done), 1)
    when = ("a running host claims it within a second" if postgres
            else "it runs when a runtime next opens this data directory")
    print(f"re-queued {printable(owner)}/{printable(job_id)} of {printable(label)} in"
          f" {_label(data)}: due now; {when}")
    return 0


def pause(data: str, namespace: str, object_id: str, owner: str | None, paused: bool) -> int:
    """Pause or resume the jobs of an object (of ``owner``; None: all of them) in a
    stopped data directory, or on PostgreSQL if no live host holds it. No runtime, no
    alarm, no user code."""
    label = f"{namespace}/{object_id}"
    postgres = is_postgres_address(data)
    if owner is not None and not owner:
        return _fail("--owner must be a non-empty owner id ('host' or a capability id)", 2)
    shared = shared_path(data)
    try:
        if postgres:
            from nursery_jobs._ops._offline import pause_postgres

            done = pause_postgres(data, namespace, object_id, owner=owner, paused=paused,
                                  now=time.time())
        elif shared is not None:
            from nursery_jobs._ops._offline_shared import pause_shared

            data = f"shared:{shared}"
            done = pause_shared(shared, namespace, object_id, owner=owner, paused=paused,
                                now=time.time())
        else:
            done = pause_offline(data, namespace, object_id, owner=owner, paused=paused,
                                 now=time.time())
    except (RuntimeLockedError, ObjectInUseError) as exc:
        return _fail(str(exc), _IN_USE)
    except (DataDirectoryError, UnknownObjectError, StorageError) as exc:
        return _fail(str(exc), 2)
    whose = "every job" if owner is None else f"the jobs of {printable(owner)}"
    state = "paused" if paused else "resumed"
    already = "" if done.changed else " (it already was)"
    print(f"{state} {whose} of {printable(label)} in {_label(data)}{already}")
    return 0


def _no_dead_letter(missing: NoDeadLetter) -> str:
    """Says so, and where another owner holds a dead letter of that id, the flag that
    finds it (a Queue's letters are owned by "queue", a Scheduler's by its id)."""
    text = (f"no dead letter {missing.owner}/{missing.id} in"
            f" {missing.namespace}/{missing.object_id}")
    if not missing.others:
        return text
    found = ", ".join(f"{other}/{missing.id}" for other in missing.others)
    flags = " or ".join(f"--owner {shlex.quote(other)}" for other in missing.others)
    return f"{text}, but there is {found}: add {flags}"


def _web_extra() -> str | None:
    """Why the dashboard cannot be served here, or None."""
    try:
        importlib.import_module("hypercorn.config")
        importlib.import_module("hypercorn.trio")
    except ImportError:
        return "serving the dashboard needs the web extra: pip install 'nursery_jobs[web]'"
    return None


def serve(data: str, host: str, port: int) -> int:
    """Serve the dashboard of a stopped data directory, or of a PostgreSQL database,
    read-only, until Ctrl-C."""
    if not 0 <= port <= 65535:
        return _fail(f"--port {port} is not a TCP port (0 to 65535); nothing was served", 2)
    missing = _web_extra()
    if missing is not None:
        return _fail(missing, 2)
    access: SourceAccess | DataSource
    if is_postgres_address(data):
        from nursery_jobs._ops._inspect_pg import PgDatabase

        try:
            access = database = PgDatabase(data)
        except (DataDirectoryError, StorageError) as exc:
            return _fail(str(exc), 2)
        close = database.close
    else:
        source = _open_stopped(data)
        if isinstance(source, int):
            return source
        # (The source itself, not an ``Inline`` of it: ``serve_offline`` reads a data
        # directory's objects in slices, so one page of many objects never holds the
        # loop that answers the others.)
        access, close = source, (lambda: None)
        if isinstance(source, SharedSource):
            close, data = source.close, source.label
    import trio

    from nursery_jobs._ops._web import serve_offline

    async def main() -> HttpBindError | None:
        async with trio.open_nursery() as nursery:
            try:
                url = await nursery.start(serve_offline, access, (host, port))
            except HttpBindError as exc:  # (raised before it served anything)
                return exc
            print(f"serving {_label(data)} (read-only) at {url}  (Ctrl-C to stop)",
                  flush=True)
        return None

    try:
        unbound = trio.run(main)
    except KeyboardInterrupt:
        return 0
    finally:
        close()
    if unbound is not None:
        return _fail(f"{unbound}; nothing was served", 2)
    return 0


_LOCATION = "a data directory, shared:<directory> (the shared layout) or a postgresql:// address"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nursery-jobs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="list objects, alarms, jobs and dead letters")
    p_inspect.add_argument("data", help=_LOCATION)
    p_inspect.add_argument("--json", action="store_true")
    p_requeue = sub.add_parser("requeue", help="put a dead letter back in its queue")
    p_requeue.add_argument("data", help=_LOCATION)
    p_requeue.add_argument("namespace")
    p_requeue.add_argument("object_id")
    p_requeue.add_argument("job_id")
    p_requeue.add_argument("--owner", default="host", help="the job's owner (default: host)")
    for name, help in (("pause", "pause an object's jobs (they stay due and do not run)"),
                       ("resume", "resume an object's paused jobs (what is due runs)")):
        p_pause = sub.add_parser(name, help=help)
        p_pause.add_argument("data", help=_LOCATION)
        p_pause.add_argument("namespace")
        p_pause.add_argument("object_id")
        p_pause.add_argument("--owner", default=None,
                             help="only this owner's jobs ('host' or a capability id;"
                             " default: every job of the object)")
    p_serve = sub.add_parser("serve", help="serve the dashboard of a stopped data directory"
                             " (either layout) or a PostgreSQL database, read-only")
    p_serve.add_argument("data", help=_LOCATION)
    p_serve.add_argument("--host", default="127.0.0.1")
    p_serve.add_argument("--port", type=int, default=8321)
    sub.add_parser("bench", help="run the dispatch benchmark (see: nursery-jobs bench -h)",
                   add_help=False)
    args, rest = parser.parse_known_args(argv)
    from nursery_jobs._ops._inspect_pg import secrets_of

    _secrets[:] = secrets_of(getattr(args, "data", None) or "")
    if args.command == "bench":
        from nursery_jobs.bench import main as bench_main

        return bench_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if shared_path(str(getattr(args, "data", ""))) == "":
        return _fail(f"{args.data!r} names no directory: give shared:<path>, e.g."
                     " shared:./data; nothing was read or written", 2)
    if args.command == "inspect":
        try:
            return inspect(args.data, args.json)
        except BrokenPipeError:
            # `nursery-jobs inspect DATA | head`: the reader has gone; stop quietly.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    if args.command == "serve":
        return serve(args.data, args.host, args.port)
    if args.command in ("pause", "resume", "requeue"):
        # A name given as bytes that are not UTF-8 arrives as lone surrogates, which no
        # store holds: say which argument, rather than a UnicodeEncodeError traceback.
        for name in ("namespace", "object_id", "job_id", "owner"):
            value = getattr(args, name, None)
            if isinstance(value, str) and not _is_text(value):
                return _fail(f"{name.replace('_', ' ')} {printable(value)} is not UTF-8"
                             " text; nothing was written", 2)
    if args.command in ("pause", "resume"):
        return pause(args.data, args.namespace, args.object_id, args.owner,
                     args.command == "pause")
    return requeue(args.data, args.namespace, args.object_id, args.job_id, args.owner)


if __name__ == "__main__":
    sys.exit(main())
