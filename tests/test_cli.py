"""The console script works on a stopped data directory without running anything:
``inspect`` reads without leaving files or waiting on locks, ``requeue`` edits the
files under the runtime's own lock, and both refuse a running runtime."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import EPOCH

import nursery_jobs as nj
from nursery_jobs import cli

ROOT = Path(__file__).resolve().parent.parent


class Mailer(nj.DurableObject):
    namespace = "tests.test_cli.Mailer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.ctx.storage.put(f"ran:{ctx.job.id}", ctx.attempt)
        if ctx.job.fn == "fail" and (self.ctx.env or {}).get("fail", True):
            raise ConnectionError("smtp down\nFORGED LINE")
        return None

    async def ran(self) -> dict[str, Any]:
        return self.ctx.storage.list("ran:")


ONCE = nj.RetryOptions(max_attempts=1)


async def build(data: Path, ids: tuple[str, ...] = ("news",)) -> None:
    """Objects with a dead letter ("bounce") and a job due in an hour ("later")."""
    async with nj.open_runtime(data) as rt:
        for object_id in ids:
            mailer = rt.get(Mailer, object_id)
            await mailer.push("fail", id="bounce", retry=ONCE, payload={"to": "ada"})
            await mailer.push("send", id="later", delay=3600)
        await trio.sleep(1)


def files(data: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(data)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(data.rglob("*")) if p.is_file()
    }


def run_cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


async def test_inspect_json_lists_jobs_and_dead_letters(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    await build(data)
    before = files(data)
    code, out, _ = run_cli("inspect", str(data), "--json", capsys=capsys)
    assert code == 0
    report = json.loads(out)
    assert report["total"] == 1 and not report["live"]
    (entry,) = report["objects"]
    assert (entry["namespace"], entry["id"], entry["state"]) == (Mailer.namespace, "news",
                                                                  "evicted")
    assert entry["alarm"] == EPOCH + 3600
    assert [(j["id"], j["fn"], j["time"], j["attempts"]) for j in entry["jobs"]] == [
        ("later", "send", EPOCH + 3600, 0)
    ]
    (letter,) = entry["dead_letters"]
    assert letter["id"] == "bounce" and letter["attempts"] == 1
    assert letter["error"] == "ConnectionError: smtp down\nFORGED LINE"
    assert letter["payload"] == "{'to': 'ada'}"
    assert files(data) == before  # nothing created, nothing touched


async def test_inspect_shows_a_jobs_timeout(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    async with nj.open_runtime(data) as rt:
        mailer = rt.get(Mailer, "news")
        await mailer.push("send", id="bounded", delay=3600, timeout=2.5)
        await mailer.push("send", id="unbounded", delay=3600)
    code, out, _ = run_cli("inspect", str(data), "--json", capsys=capsys)
    assert code == 0
    (entry,) = json.loads(out)["objects"]
    assert [(j["id"], j["timeout"]) for j in entry["jobs"]] == [
        ("bounded", 2.5), ("unbounded", None)
    ]
    code, out, _ = run_cli("inspect", str(data), capsys=capsys)
    [bounded] = [line for line in out.splitlines() if "/bounded " in line]
    assert bounded.endswith(", timeout 2.5 s")
    [unbounded] = [line for line in out.splitlines() if "unbounded" in line]
    assert "timeout" not in unbounded


async def test_inspect_escapes_control_characters(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    evil = "x\nFORGED 0 object(s)\x1b[31m\u202e"
    await build(data, ids=(evil,))
    code, out, _ = run_cli("inspect", str(data), capsys=capsys)
    assert code == 0
    assert "FORGED" in out
    for line in out.splitlines():
        assert not line.startswith("FORGED"), out
    assert "\x1b" not in out and "\u202e" not in out
    assert "x\\nFORGED 0 object(s)\\x1b[31m\\u202e" in out
    assert "smtp down\\nFORGED LINE" in out  # error texts too
    code, out, _ = run_cli("inspect", str(data), "--json", capsys=capsys)
    assert out.isascii() and "\x1b" not in out
    assert json.loads(out)["objects"][0]["id"] == evil


async def test_inspect_and_requeue_refuse_a_running_runtime(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    await build(data)
    async with nj.open_runtime(data) as rt:
        await rt.get(Mailer, "news").ran()  # its database is now held exclusively
        before = files(data)
        for args in (["inspect", str(data)], ["requeue", str(data), Mailer.namespace,
                                               "news", "bounce"]):
            code, out, err = run_cli(*args, capsys=capsys)
            assert code == 3
            assert out == ""
            assert "in use by a running runtime" in err
            assert "http://127.0.0.1:8321/" in err  # points to the live dashboard
        assert files(data) == before


def test_inspect_fails_fast_on_an_object_another_process_holds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    trio.run(build, data, ("held",), clock=trio.testing.MockClock(autojump_threshold=0))
    (db,) = (data / "objects").glob("*.sqlite3")
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sqlite3, sys
            c = sqlite3.connect({str(db)!r}, isolation_level=None)
            c.execute("PRAGMA locking_mode=EXCLUSIVE")
            c.execute("BEGIN EXCLUSIVE"); c.execute("INSERT INTO nj_kv VALUES ('k', '1')")
            print("held", flush=True); sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            # SQLite's busy timeout would wait 5 s: the bound makes a wait fail the test.
            done = subprocess.run(
                [sys.executable, "-m", "nursery_jobs.cli", "inspect", str(data), "--json"],
                capture_output=True, text=True, timeout=4, cwd=tmp_path,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        finally:
            holder.kill()
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(done.stdout)["objects"]
    assert entry["state"] == "in use"
    assert "in use by another process" in entry["problem"]


CRASHER = """
import os, signal, sys, trio
import nursery_jobs as nj
sys.path.insert(0, {tests!r})
from test_cli import Mailer, ONCE

async def main():
    async with nj.open_runtime({data!r}) as rt:
        m = rt.get(Mailer, "crashed")
        await m.push("fail", id="bounce", retry=ONCE)
        await m.push("send", id="later", delay=3600)
        await trio.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

trio.run(main)
"""


@pytest.mark.crash
def test_inspect_reads_a_crashed_directory_without_leaving_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-c", CRASHER.format(tests=str(ROOT / "tests"), data=str(data))],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert list((data / "objects").glob("*-wal")), "the object's WAL is left by the kill"
    before = files(data)
    code = subprocess.run(
        [sys.executable, "-m", "nursery_jobs.cli", "inspect", str(data), "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert code.returncode == 0, code.stderr
    (entry,) = json.loads(code.stdout)["objects"]
    assert [j["id"] for j in entry["jobs"]] == ["later"]
    assert [d["id"] for d in entry["dead_letters"]] == ["bounce"]
    assert files(data) == before


async def test_requeue_edits_the_files_and_the_next_runtime_runs_it(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    await build(data, ids=("news", "other"))
    # "other" holds a job due now: the CLI must not run it (no alarm runs in the CLI).
    async with nj.open_runtime(data) as rt:
        await rt.get(Mailer, "other").push("send", id="due-soon", delay=5)
    await trio.sleep(10)

    code, out, err = run_cli("requeue", str(data), Mailer.namespace, "news", "bounce",
                             capsys=capsys)
    assert code == 0, err
    assert "re-queued host/bounce" in out
    assert not any(p.name.endswith(("-wal", "-shm")) for p in data.rglob("*"))
    catalog = sqlite3.connect(data / "catalog.sqlite3")
    alarms = dict(catalog.execute("SELECT object_id, time FROM nj_alarms").fetchall())
    catalog.close()
    assert alarms["news"] < EPOCH + 10  # lowered to the requeue's (real) now
    code, out, _ = run_cli("inspect", str(data), "--json", capsys=capsys)
    objects = {o["id"]: o for o in json.loads(out)["objects"]}
    assert objects["news"]["dead_letters"] == []
    assert {j["id"]: j["attempts"] for j in objects["news"]["jobs"]} == {"bounce": 0,
                                                                         "later": 0}
    assert "due-soon" in {j["id"] for j in objects["other"]["jobs"]}  # did not run

    code, _, err = run_cli("requeue", str(data), Mailer.namespace, "news", "bounce",
                           capsys=capsys)
    assert (code, err.strip()) == (1, "nursery-jobs: no dead letter host/bounce in"
                                      f" {Mailer.namespace}/news")
    code, _, err = run_cli("requeue", str(data), Mailer.namespace, "nobody", "bounce",
                           capsys=capsys)
    assert code == 2 and "no object" in err

    async with nj.open_runtime(data, env={"fail": False}) as rt:
        await trio.sleep(1)
        ran = await rt.get(Mailer, "news").ran()
        assert ran["ran:bounce"] == 1  # attempt 1 again: fresh attempts
        assert "ran:due-soon" in await rt.get(Mailer, "other").ran()


def test_inspect_of_a_path_that_is_not_a_data_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli("inspect", str(tmp_path / "nothing"), capsys=capsys)
    assert code == 2 and "not a nursery_jobs data directory" in err
    assert not (tmp_path / "nothing").exists()


async def test_inspect_lists_a_quarantined_object_as_quarantined(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    await build(data)
    [file] = [p for p in (data / "objects").glob("*.sqlite3")]
    (data / "objects" / "quarantine").mkdir()
    file.rename(data / "objects" / "quarantine" / file.name)  # as the runtime does
    code, out, _ = run_cli("inspect", str(data), "--json", capsys=capsys)
    assert code == 0
    (entry,) = json.loads(out)["objects"]
    assert entry["state"] == "quarantined"
    assert entry["alarm"] == EPOCH + 3600  # kept for when the file is restored


class Parcels(nj.DurableObject):
    """A Queue whose deliveries fail: its dead letters are owned by "queue"."""

    namespace = "tests.test_cli.Parcels"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.queue = nj.Queue({"deliver": self.deliver}, retry=ONCE)
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def deliver(self, payload: Any, item: nj.QueueItem) -> None:
        raise ConnectionError("no courier")

    async def enqueue(self, item_id: str) -> None:
        await self.queue.push("deliver", None, id=item_id)


async def test_requeue_of_another_owners_letter_suggests_that_owner(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    async with nj.open_runtime(data) as rt:
        await rt.get(Parcels, "p").enqueue("parcel")
        await trio.sleep(1)
    code, out, err = run_cli("requeue", str(data), Parcels.namespace, "p", "parcel",
                             capsys=capsys)
    assert (code, out) == (1, "")
    assert "no dead letter host/parcel" in err and "queue/parcel" in err
    assert "--owner queue" in err
    code, out, err = run_cli("requeue", str(data), Parcels.namespace, "p", "parcel",
                             "--owner", "queue", capsys=capsys)
    assert code == 0, err
    assert "re-queued queue/parcel" in out


def test_serve_without_the_web_extra_says_which_extra_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As if it were not installed (a module an earlier test imported included).
    for name in {"hypercorn", "hypercorn.config", "hypercorn.trio"} | {
            m for m in sys.modules if m.startswith("hypercorn.")}:
        monkeypatch.setitem(sys.modules, name, None)
    trio.run(build, tmp_path / "data", clock=trio.testing.MockClock(autojump_threshold=0))
    code, out, err = run_cli("serve", str(tmp_path / "data"), "--port", "0", capsys=capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1, err
    assert "pip install 'nursery_jobs[web]'" in err


@pytest.mark.parametrize("layout", ["", "shared:"])
def test_serve_reads_a_stopped_directory_in_slices(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A page of many objects is read in slices of the loop (``Sliced``), so that it never
    holds the loop that answers every other request (the CLI once handed the dashboard
    an ``Inline`` source: every page one piece)."""
    pytest.importorskip("hypercorn")
    from nursery_jobs._ops import _web
    from nursery_jobs._ops._slices import Sliced

    data = f"{layout}{tmp_path / 'data'}"
    trio.run(build, data, clock=trio.testing.MockClock(autojump_threshold=0))
    served: list[Any] = []

    async def serve_app(app: Any, address: Any, *,
                        task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        served.append(app)
        task_status.started("http://127.0.0.1:1")

    monkeypatch.setattr(_web, "serve_app", serve_app)
    code, _, err = run_cli("serve", data, "--port", "0", capsys=capsys)
    assert code == 0, err
    assert [type(app.access) for app in served] == [Sliced]


@pytest.mark.parametrize(("given", "shown"), [
    ("postgresql://app:pw@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
    ("postgres:///jobs?host=/run/pg", "postgres:///jobs?host=/run/pg"),  # both slashes
    ("postgresql://app:p/w@db/jobs?sslmode=require&password=x",
     "postgresql://app:***@db/jobs?sslmode=require&password=***"),
    ("postgresql://app:p@w@db/jobs", "postgresql://app:***@db/jobs"),
    ("host=db password='p w' user=app", "host=db password=*** user=app"),
    ("./data", "./data"),
])
def test_addresses_are_shown_whole_with_the_password_masked(given: str, shown: str) -> None:
    from nursery_jobs._ops._inspect_pg import address_label, secrets_of

    assert address_label(given) == shown
    for secret in secrets_of(given):
        assert secret not in shown


def _without(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """As if ``package`` were not installed (a module an earlier test imported included)."""
    for name in {package} | {m for m in sys.modules if m.startswith(f"{package}.")}:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("command", [
    ("inspect",), ("inspect", "--json"), ("requeue", "ns", "obj", "job"),
    ("serve", "--port", "0"),
])
def test_postgres_faces_without_the_driver_name_the_extra_in_one_line(
    command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _without(monkeypatch, "psycopg")
    address = "postgresql://app:secret@127.0.0.1:1/jobs"
    code, out, err = run_cli(command[0], address, *command[1:], capsys=capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1, err
    assert "pip install 'nursery_jobs[postgres]'" in err
    assert "secret" not in err


def test_the_postgres_bench_without_the_driver_names_the_extra_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    _without(monkeypatch, "psycopg")
    monkeypatch.delitem(sys.modules, "nursery_jobs.bench._pg", raising=False)
    code, out, err = run_cli("bench", "--engine", "postgres", "--dsn",
                             "postgresql://app:secret@127.0.0.1:1/jobs", "--quick",
                             capsys=capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1, err
    assert "pip install 'nursery_jobs[postgres]'" in err
    assert "secret" not in err


async def test_pause_and_resume_edit_a_stopped_data_directory(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    await build(data)
    async with nj.open_runtime(data) as rt:
        await rt.get(Mailer, "news").push("send", id="soon", delay=5)

    code, out, err = run_cli("pause", str(data), Mailer.namespace, "news", capsys=capsys)
    assert code == 0, err
    assert out.strip() == f"paused every job of {Mailer.namespace}/news in {data}"
    code, out, _ = run_cli("pause", str(data), Mailer.namespace, "news", "--owner", "queue",
                           capsys=capsys)
    assert code == 0 and "paused the jobs of queue" in out
    code, out, _ = run_cli("inspect", str(data), "--json", capsys=capsys)
    assert json.loads(out)["objects"][0]["paused"] == [None, "queue"]
    code, out, _ = run_cli("inspect", str(data), capsys=capsys)
    assert ", paused\n" in out

    async with nj.open_runtime(data) as rt:
        await trio.sleep(10)
        assert "ran:soon" not in await rt.get(Mailer, "news").ran()  # paused for good

    code, out, _ = run_cli("resume", str(data), Mailer.namespace, "news", "--owner", "queue",
                           capsys=capsys)
    assert code == 0 and out.startswith("resumed the jobs of queue")
    code, out, _ = run_cli("inspect", str(data), "--json", capsys=capsys)
    assert json.loads(out)["objects"][0]["paused"] == [None]
    code, out, _ = run_cli("pause", str(data), Mailer.namespace, "news", "--owner", "host",
                           capsys=capsys)
    code, out, _ = run_cli("inspect", str(data), capsys=capsys)
    assert ", paused\n" in out
    code, out, _ = run_cli("resume", str(data), Mailer.namespace, "news", capsys=capsys)
    assert code == 0 and out.startswith("resumed every job")  # every pause of the object
    code, out, _ = run_cli("inspect", str(data), "--json", capsys=capsys)
    assert json.loads(out)["objects"][0]["paused"] == []
    code, _, err = run_cli("resume", str(data), Mailer.namespace, "nobody", capsys=capsys)
    assert code == 2 and "no object" in err

    async with nj.open_runtime(data) as rt:
        await trio.sleep(1)
        assert "ran:soon" in await rt.get(Mailer, "news").ran()  # the resume woke it


@pytest.mark.parametrize(("command", "at"), [
    ("pause", "owner"), ("pause", "object_id"), ("resume", "namespace"),
    ("requeue", "job_id"), ("requeue", "object_id"),
])
async def test_names_that_are_not_utf8_are_refused_naming_the_argument(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str], command: str,
    at: str,
) -> None:
    """Bytes that are not UTF-8 on the command line arrive as lone surrogates: the edit
    died with a UnicodeEncodeError traceback (exit 1)."""
    data = tmp_path / "data"
    await build(data)
    before = files(data)
    bad = "x\udcff"
    args = {"namespace": Mailer.namespace, "object_id": "news", "job_id": "bounce",
            "owner": "host"}
    args[at] = bad
    argv = [command, str(data), args["namespace"], args["object_id"]]
    if command == "requeue":
        argv.append(args["job_id"])
    argv += ["--owner", args["owner"]]
    code, out, err = run_cli(*argv, capsys=capsys)
    assert (code, out) == (2, "")
    assert at.replace("_", " ") in err and "not UTF-8" in err and "nothing was written" in err
    assert err.count("\n") == 1, err
    assert files(data) == before
