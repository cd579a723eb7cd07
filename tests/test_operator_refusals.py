"""The operator surfaces (dashboard, inspect, CLI) at their edges: hostile or unlucky
input gives a typed 4xx / exit code, never a 500 or a traceback; the loopback-only Host
check holds on every loopback bind; a dashboard read never drops the runtime's lock on
a file. Each test pins a bug a review found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs import cli
from nursery_jobs.testing import run_until_idle


class Outbox(nj.DurableObject):
    namespace = "tests.test_operator_edges.Outbox"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "fail":
            raise ConnectionError("smtp down")
        return None


ONCE = nj.RetryOptions(max_attempts=1)
ROOT = Path(__file__).resolve().parent.parent


def list_files(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.glob(pattern))


async def fetch(url: str, path: str, *,
                headers: dict[str, str] | None = None) -> tuple[int, str]:
    """A plain HTTP/1.0 GET over a Trio socket (as tests/test_dashboard.py does)."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    all_headers = {"Host": f"{parts.netloc}", **(headers or {})}
    head = "".join(f"{k}: {v}\r\n" for k, v in all_headers.items())
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.0\r\n{head}\r\n".encode())
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    raw_head, _, payload = data.partition(b"\r\n\r\n")
    return int(raw_head.split()[1]), payload.decode("utf-8", "replace")


async def build(data: Path) -> None:
    """One object with a dead letter ("bounce") and a job due in an hour ("later")."""
    async with nj.open_runtime(data) as rt:
        outbox = rt.get(Outbox, "news")
        await outbox.push("fail", id="bounce", retry=ONCE)
        await outbox.push("send", id="later", delay=3600)
        await run_until_idle(rt)


def files(data: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(data)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(data.rglob("*")) if p.is_file()}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    _, err = capsys.readouterr()
    return code, err


@pytest.fixture
def holder() -> Iterator[Any]:
    """Another process holding a SQLite database (BEGIN EXCLUSIVE), as a sqlite3 shell,
    a backup tool or another program would."""
    procs: list[subprocess.Popen[bytes]] = []

    def hold(path: Path) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c",
             "import sqlite3, sys, time\n"
             f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
             "c.execute('BEGIN EXCLUSIVE')\n"
             "print('held', flush=True)\n"
             "time.sleep(60)\n"],
            stdout=subprocess.PIPE)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


# -- the dashboard ------------------------------------------------------------------------
async def test_ipv6_loopback_bind_still_refuses_foreign_host_names() -> None:
    """Bound to ::1 the dashboard is as loopback-only as on 127.0.0.1: a DNS-rebound
    name (Host: evil.example) must get 421, as tests/test_dashboard.py checks for IPv4.
    _is_loopback_bind('::1') is False (it parses a bare IPv6 address as 'host:port'), so
    the Host check is off and a rebinding page reads everything (and, with
    http_writes=True, the form token, defeating the CSRF defence)."""
    async with nj.open_runtime(None, http=("::1", 0)) as rt:
        assert rt.http_url is not None and "[::1]" in rt.http_url
        status, _ = await fetch(rt.http_url, "/api/summary", headers={"Host": "[::1]:1"})
        assert status == 200
        status, body = await fetch(rt.http_url, "/api/summary",
                                   headers={"Host": "evil.example"})
        assert status == 421, (status, body[:200])


async def test_huge_numbers_in_query_parameters_are_a_400_not_a_500() -> None:
    """A page or jobs number past SQLite's 64-bit range is bad input (400), like a
    non-integer one is; it gives 500 'internal error' (OverflowError from sqlite3)."""
    huge = "9" * 30
    async with nj.open_runtime(None, http=("127.0.0.1", 0)) as rt:
        await rt.get(Outbox, "news").push("send", id="later", delay=3600)
        one = urlencode({"ns": Outbox.namespace, "id": "news"})
        got = {}
        for path in (f"/?page={huge}", f"/api/objects?page={huge}",
                     f"/api/objects?jobs={huge}", f"/api/objects?letters={huge}",
                     f"/api/object?{one}&jobs={huge}"):
            got[path] = (await fetch(rt.http_url or "", path))[0]
        assert got == dict.fromkeys(got, 400)


async def test_api_job_and_letter_limits_are_bounded() -> None:
    """/api caps its page of objects (MAX_PAGE_SIZE) but not jobs= / letters=: a
    negative value is passed to SQLite as LIMIT -1 (no limit), so one request renders
    every job of an object (a million jobs: one giant JSON built on the Trio thread).
    A negative limit should be a 400, or be clamped like limit= is."""
    async with nj.open_runtime(None, http=("127.0.0.1", 0)) as rt:
        outbox = rt.get(Outbox, "news")
        for n in range(1200):
            await outbox.push("send", id=f"j{n}", delay=3600)
        one = urlencode({"ns": Outbox.namespace, "id": "news"})
        for path in (f"/api/object?{one}&jobs=-1", "/api/objects?jobs=-1"):
            status, body = await fetch(rt.http_url or "", path)
            if status == 200:
                entry = json.loads(body)
                jobs = entry["jobs"] if "jobs" in entry else entry["objects"][0]["jobs"]
                assert len(jobs) <= 1000, (path, len(jobs))
            else:
                assert status == 400, (path, status)


async def test_serve_answers_a_catalog_in_use_with_a_typed_status(
    tmp_path: Path, holder: Any,
) -> None:
    """`nursery-jobs serve` of a directory whose catalog another process then takes
    (a runtime started on it, a sqlite3 shell): every page is a 500 'internal error'
    with an ObjectInUseError traceback in the log, instead of a typed 409/503 that
    says the directory is in use."""
    from nursery_jobs._ops._sources import OfflineSource
    from nursery_jobs._ops._web import serve_offline

    data = tmp_path / "data"
    await build(data)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_offline, OfflineSource(data), ("127.0.0.1", 0))
        assert (await fetch(url, "/api/summary"))[0] == 200
        holder(data / "catalog.sqlite3")
        status, body = await fetch(url, "/api/summary")
        nursery.cancel_scope.cancel()
    assert status in (409, 503), (status, body)


# -- the console script -------------------------------------------------------------------
def test_inspect_and_serve_of_a_file_path_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path that is a file, not a directory, is 'not a nursery_jobs data directory'
    (exit 2), as a missing path is; refuse_if_running's os.open(path/'runtime.lock')
    raises NotADirectoryError (only FileNotFoundError is caught): a traceback."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello")
    for command in ("inspect", "serve"):
        code, err = run_cli(capsys, command, str(a_file))
        assert code == 2 and "not a nursery_jobs data directory" in err, command


async def test_inspect_of_a_damaged_catalog_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged catalog.sqlite3 (the runtime rebuilds it at open) makes `inspect`
    crash with sqlite3.DatabaseError instead of saying the catalog is damaged."""
    data = tmp_path / "data"
    await build(data)
    (data / "catalog.sqlite3").write_bytes(b"not a database" * 100)
    code, err = run_cli(capsys, "inspect", str(data))
    assert code == 2 and "catalog" in err


async def test_requeue_of_a_damaged_object_file_exits_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`requeue` on an object whose database file is damaged crashes with
    sqlite3.DatabaseError ('file is not a database') instead of a typed message and
    exit code (the dashboard and inspect show it as 'damaged')."""
    data = tmp_path / "data"
    await build(data)
    [file] = (data / "objects").glob("*.sqlite3")
    file.write_bytes(b"not a database" * 100)
    before = files(data)
    code, err = run_cli(capsys, "requeue", str(data), Outbox.namespace, "news", "bounce")
    assert code == 2 and "damaged" in err
    assert files(data) == before


async def test_requeue_with_the_catalog_held_by_another_process_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], holder: Any
) -> None:
    """The object file held by another process is exit 3 ('in use'); the catalog held
    by another process crashes with sqlite3.OperationalError ('database is locked'):
    the catalog's queries in requeue_offline are outside the 'locked' translation."""
    data = tmp_path / "data"
    await build(data)
    holder(data / "catalog.sqlite3")
    code, err = run_cli(capsys, "requeue", str(data), Outbox.namespace, "news", "bounce")
    assert code == 3 and "in use" in err


async def test_inspect_with_the_catalog_held_by_another_process_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], holder: Any
) -> None:
    """open_readonly raises ObjectInUseError for the catalog; cli.inspect does not catch
    it (only RuntimeLockedError / DataDirectoryError): a traceback instead of exit 3."""
    data = tmp_path / "data"
    await build(data)
    holder(data / "catalog.sqlite3")
    code, err = run_cli(capsys, "inspect", str(data))
    assert code == 3 and "in use" in err


# -- a live read of an object that is dozing -----------------------------------------------
HELD_BY_OTHER = """
import sys
from pathlib import Path
from nursery_jobs._ops._readonly import _held_by_another_process
print(_held_by_another_process(Path(sys.argv[1])))
"""


async def test_a_dashboard_read_of_a_dozing_object_keeps_its_file_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a dozing object's close checkpoints in its worker thread (an fsync: 0.5 s
    seen on a loaded disk, says _sqlite_object.sleep), the object is already 'dormant',
    so RuntimeSource._object_db reads its file by path; the -wal is still there, so
    open_readonly shutil.copyfile()s the database file — and closing that descriptor
    drops every POSIX lock this process holds on the file, including the runtime
    connection's exclusive lock (the very hazard _held_by_another_process's docstring
    warns of). Another process can then open and write the object's file while the
    runtime's connection is still checkpointing into it."""
    from nursery_jobs._engines.files import _object as _sqlite_object

    release = trio.Event()
    closing = trio.Event()

    async def slow_close(fn: Any, *args: Any) -> None:
        closing.set()
        await release.wait()  # the checkpoint's fsync takes a while
        await trio.to_thread.run_sync(fn, *args)

    monkeypatch.setattr(_sqlite_object, "_off_thread", slow_close)
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    async def locked(path: Path) -> bool:
        done = await trio.run_process([sys.executable, "-c", HELD_BY_OTHER, str(path)],
                                      capture_stdout=True, env=env)
        return done.stdout.strip() == b"True"

    async with nj.open_runtime(data, http=("127.0.0.1", 0), dormant_after=0.05,
                               idle_timeout=60) as rt:
        await rt.get(Outbox, "news").push("send", id="later", delay=3600)
        with trio.fail_after(5):
            await closing.wait()
        [file] = list_files(data / "objects", "*.sqlite3")
        assert list_files(data / "objects", f"{file.name}-wal")
        assert await locked(file)  # the runtime's connection holds it
        one = urlencode({"ns": Outbox.namespace, "id": "news"})
        status, _ = await fetch(rt.http_url or "", f"/object?{one}")
        assert status == 200
        still_locked = await locked(file)
        release.set()
    assert still_locked, "the dashboard's read released the runtime's lock on the file"
