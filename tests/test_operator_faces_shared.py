"""Every operator face on the shared layout (``shared:<directory>``), as on a data
directory of the files layout and on PostgreSQL (DESIGN section 10): ``nursery-jobs
inspect`` (text and ``--json``), ``requeue``, ``pause``, ``resume`` and ``serve`` on a
stopped directory (nothing created, no alarm run in the CLI; a requeue lowers the
object's alarm in the same transaction as it moves the job back), a refusal of a
running one, a running runtime's dashboard (active objects read from their working
copies, the others from ``nj_rows``), and a damaged row as its own object's fault."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import trio
from conftest import EPOCH
from pg_support import eventually
from test_dashboard import fetch, samples

import nursery_jobs as nj
from nursery_jobs import cli
from nursery_jobs._engines.postgres._schema import TABLES_BY_NAME
from nursery_jobs._ops._inspect_shared import SharedSource
from nursery_jobs._ops._offline_shared import pause_shared, requeue_shared
from nursery_jobs._ops._web import serve_offline
from nursery_jobs.testing import run_until_idle

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = ("127.0.0.1", 0)
ONCE = nj.RetryOptions(max_attempts=1)
FORM = "application/x-www-form-urlencoded"
TIME_FIELD = TABLES_BY_NAME["nj_jobs"].columns.index("time")


class Mailer(nj.DurableObject):
    """Host jobs and a Queue; ``env["fail"]`` (default True) makes "fail" jobs and every
    delivery raise. Each run records (attempt, when)."""

    namespace = "tests.test_operator_faces_shared.Mailer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.queue = nj.Queue({"deliver": self._deliver}, retry=ONCE)
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    def _failing(self) -> bool:
        return bool((self.ctx.env or {}).get("fail", True))

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def enqueue(self, item_id: str) -> None:
        await self.queue.push("deliver", "ada", id=item_id)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        self.ctx.storage.put(f"ran:{ctx.job.id}", [ctx.attempt, nj.now()])
        if ctx.job.fn == "fail" and self._failing():
            raise ConnectionError("smtp down\nFORGED LINE")
        return None

    async def _deliver(self, payload: Any, item: nj.QueueItem) -> None:
        self.ctx.storage.put(f"ran:{item.id}", [item.attempt, nj.now()])
        if self._failing():
            raise ConnectionError("no courier")

    async def ran(self) -> dict[str, Any]:
        return self.ctx.storage.list("ran:")

    async def letters(self) -> list[tuple[str, str]]:
        return sorted((d.job.owner, d.job.id) for d in self.lifecycle.dead_letters())


async def build(data: Path, ids: tuple[str, ...] = ("news",)) -> None:
    """Objects each with a dead letter of the host ("bounce", payload ``{'to':
    'ada'}``), one of the Queue ("parcel") and a job due in an hour ("later")."""
    async with nj.open_runtime(f"shared:{data}") as rt:
        for object_id in ids:
            mailer = rt.get(Mailer, object_id)
            await mailer.push("fail", id="bounce", retry=ONCE, payload={"to": "ada"})
            await mailer.push("send", id="later", delay=3600)
            await mailer.enqueue("parcel")
        with trio.fail_after(30):
            await run_until_idle(rt)


def files(data: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(data)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(data.rglob("*")) if p.is_file()}


def run_cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def stored(data: Path, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """What a query finds in the shared database of a stopped directory (read as
    immutable: a read-only connection to a WAL database would leave a -wal and -shm)."""
    assert not (data / "shared.sqlite3-wal").exists()
    conn = sqlite3.connect(f"file:{data / 'shared.sqlite3'}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def edit(data: Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Change the shared database behind nursery_jobs' back (a damaged row)."""
    conn = sqlite3.connect(data / "shared.sqlite3", isolation_level=None)
    try:
        assert conn.execute(sql, params).rowcount == 1
    finally:
        conn.close()


# -- inspect ---------------------------------------------------------------------------------
async def test_inspect_lists_objects_with_their_jobs_dead_letters_and_alarms(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    await build(data, ids=("news", "x\nFORGED 0 object(s)\x1b[31m"))
    before = files(data)
    code, out, err = run_cli("inspect", f"shared:{data}", "--json", capsys=capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["total"] == 2 and not report["live"]
    assert report["source"] == f"shared:{data}"
    entries = {entry["id"]: entry for entry in report["objects"]}
    entry = entries["news"]
    assert (entry["namespace"], entry["state"], entry["problem"]) == (
        Mailer.namespace, "evicted", None)
    assert entry["alarm"] == EPOCH + 3600
    assert [(j["id"], j["fn"], j["time"], j["attempts"]) for j in entry["jobs"]] == [
        ("later", "send", EPOCH + 3600, 0)]
    letters = {(d["owner"], d["id"]): d for d in entry["dead_letters"]}
    assert sorted(letters) == [("host", "bounce"), ("queue", "parcel")]
    assert letters[("host", "bounce")]["error"] == "ConnectionError: smtp down\nFORGED LINE"
    assert letters[("host", "bounce")]["payload"] == "{'to': 'ada'}"
    assert entry["counts"] == {"jobs": 1, "due": 0, "running": 0, "dead_letters": 2}

    code, out, _ = run_cli("inspect", f"shared://{data}", capsys=capsys)
    assert code == 0
    assert out.startswith(f"2 object(s) in shared:{data}\n")
    assert "/news [evicted]: alarm " in out and "1 job(s), 0 due, 2 dead letter(s)" in out
    assert "job host/later send: due " in out
    assert "dead host/bounce fail after 1 attempt(s)" in out
    for line in out.splitlines():
        assert not line.startswith("FORGED"), out  # control characters escaped
    assert "smtp down\\nFORGED LINE" in out and "\x1b" not in out
    assert files(data) == before  # nothing created, nothing touched


def test_a_face_given_the_other_layout_or_nothing_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli("inspect", f"shared:{tmp_path / 'nothing'}", capsys=capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "no shared.sqlite3" in err, err
    assert not (tmp_path / "nothing").exists()

    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(partial(_files_layout, tmp_path / "files"), clock=clock)
    trio.run(build, tmp_path / "shared", clock=clock)
    before = files(tmp_path)
    for args, hint in (
        (["inspect", f"shared:{tmp_path / 'files'}"], "without 'shared:'"),
        (["requeue", f"shared:{tmp_path / 'files'}", Mailer.namespace, "news", "bounce"],
         "without 'shared:'"),
        (["inspect", str(tmp_path / "shared")], f"give it as shared:{tmp_path / 'shared'}"),
        (["pause", str(tmp_path / "shared"), Mailer.namespace, "news"], "give it as shared:"),
        (["serve", str(tmp_path / "shared"), "--port", "0"], "give it as shared:"),
    ):
        code, out, err = run_cli(*args, capsys=capsys)
        assert (code, out) == (2, ""), (args, err)
        assert err.count("\n") == 1 and hint in err, (args, err)
    assert files(tmp_path) == before  # nothing written


async def _files_layout(data: Path) -> None:
    async with nj.open_runtime(data) as rt:
        await rt.get(Mailer, "news").push("send", id="later", delay=3600)


CRASHER = """
import os, signal, sys, trio
import nursery_jobs as nj
sys.path.insert(0, {tests!r})
from test_operator_faces_shared import Mailer, ONCE

async def main():
    async with nj.open_runtime({location!r}) as rt:
        m = rt.get(Mailer, "crashed")
        await m.push("fail", id="bounce", retry=ONCE)
        await m.push("send", id="later", delay=3600)
        while not await m.letters():
            await trio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)

trio.run(main)
"""


@pytest.mark.crash
def test_inspect_reads_a_killed_runtimes_directory_without_leaving_files(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-c", CRASHER.format(tests=str(ROOT / "tests"),
                                              location=f"shared:{data}")],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (data / "shared.sqlite3-wal").exists(), "the kill leaves the WAL"
    before = files(data)
    found = subprocess.run(
        [sys.executable, "-m", "nursery_jobs.cli", "inspect", f"shared:{data}", "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert found.returncode == 0, found.stderr
    (entry,) = json.loads(found.stdout)["objects"]
    assert [j["id"] for j in entry["jobs"]] == ["later"]
    assert [d["id"] for d in entry["dead_letters"]] == ["bounce"]
    assert files(data) == before


async def test_every_face_refuses_a_running_shared_directory(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    await build(data)
    async with nj.open_runtime(f"shared:{data}") as rt:
        await rt.get(Mailer, "news").ran()
        before = files(data)
        location = f"shared:{data}"
        for args in (["inspect", location], ["inspect", location, "--json"],
                     ["requeue", location, Mailer.namespace, "news", "bounce"],
                     ["pause", location, Mailer.namespace, "news"],
                     ["resume", location, Mailer.namespace, "news"],
                     ["serve", location, "--port", "0"]):
            code, out, err = run_cli(*args, capsys=capsys)
            assert (code, out) == (3, ""), (args, err)
            assert "in use by a running runtime" in err, (args, err)
            assert "http://127.0.0.1:8321/" in err  # points to the live dashboard
            assert err.count("\n") == 1, err
        assert files(data) == before


# -- requeue, pause, resume ------------------------------------------------------------------
async def test_requeue_moves_a_dead_letter_back_and_the_next_start_runs_it_at_once(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    await build(data, ids=("news", "other"))
    await trio.sleep(100 - trio.current_time())
    assert stored(data, "SELECT time FROM nj_alarms WHERE object_id = 'news'") == [
        (EPOCH + 3600,)]

    # The Queue's letter: the error says whose it is, and how to ask for it.
    code, out, err = run_cli("requeue", f"shared:{data}", Mailer.namespace, "news", "parcel",
                             capsys=capsys)
    assert (code, out) == (1, "")
    assert "no dead letter host/parcel" in err and "queue/parcel" in err
    assert "--owner queue" in err and err.count("\n") == 1

    done = requeue_shared(data, Mailer.namespace, "news", "bounce", owner="host",
                          now=EPOCH + 100)
    assert (done.owner, done.id, done.time) == ("host", "bounce", EPOCH + 100)
    # The job is back (fresh attempts), the letter gone, the alarm lowered to the
    # requeue's now: one transaction.
    assert stored(data, "SELECT time, retry FROM nj_alarms WHERE object_id = 'news'") == [
        (EPOCH + 100, 0)]
    keys = stored(data, "SELECT tbl, key FROM nj_rows WHERE object_id = 'news'")
    assert ("nj_jobs", "bounce") in keys and ("nj_jobs", "later") in keys
    assert not [k for t, k in keys if t == "nj_dead_letters" and '"bounce"' in k]
    assert not [k for t, k in keys if t == "nj_attempts" and '"bounce"' in k]
    assert not (data / "shared.sqlite3-wal").exists()  # checkpointed and closed

    code, _, err = run_cli("requeue", f"shared:{data}", Mailer.namespace, "news", "bounce",
                           capsys=capsys)
    assert (code, err.strip()) == (1, "nursery-jobs: no dead letter host/bounce in"
                                      f" {Mailer.namespace}/news")
    code, _, err = run_cli("requeue", f"shared:{data}", Mailer.namespace, "nobody", "bounce",
                           capsys=capsys)
    assert code == 2 and "no object" in err
    code, out, err = run_cli("requeue", f"shared:{data}", Mailer.namespace, "news", "parcel",
                             "--owner", "queue", capsys=capsys)
    assert code == 0, err
    assert out.startswith(f"re-queued queue/parcel of {Mailer.namespace}/news in"
                          f" shared:{data}: due now;")

    async with nj.open_runtime(f"shared:{data}", env={"fail": False}) as rt:
        await trio.sleep(1)
        ran = await rt.get(Mailer, "news").ran()
        assert ran["ran:bounce"] == [1, EPOCH + 100]  # at the next start, attempt 1 again
        assert ran["ran:parcel"][0] == 1
        assert await rt.get(Mailer, "news").letters() == []
        assert "ran:later" not in ran
        assert await rt.get(Mailer, "other").letters() == [("host", "bounce"),
                                                           ("queue", "parcel")]


async def test_a_requeue_never_leaves_the_job_behind_a_later_alarm(
    tmp_path: Path, autojump_clock: Any,
) -> None:
    """An object whose alarm the index lost (or set late): the requeued job must
    still run at the next start."""
    data = tmp_path / "data"
    await build(data)
    edit(data, "DELETE FROM nj_alarms WHERE object_id = 'news'")
    requeue_shared(data, Mailer.namespace, "news", "bounce", owner="host",
                   now=EPOCH + trio.current_time())
    start = trio.current_time()
    async with nj.open_runtime(f"shared:{data}", env={"fail": False}) as rt:
        await trio.sleep(1)
        assert (await rt.get(Mailer, "news").ran())["ran:bounce"] == [1, EPOCH + start]


async def test_pause_and_resume_edit_a_stopped_shared_directory(
    tmp_path: Path, autojump_clock: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    location = f"shared:{data}"
    await build(data)
    async with nj.open_runtime(location) as rt:
        await rt.get(Mailer, "news").push("send", id="soon", delay=5)

    code, out, err = run_cli("pause", location, Mailer.namespace, "news", capsys=capsys)
    assert code == 0, err
    assert out.strip() == f"paused every job of {Mailer.namespace}/news in {location}"
    code, out, _ = run_cli("pause", location, Mailer.namespace, "news", capsys=capsys)
    assert code == 0 and out.strip().endswith("(it already was)")
    code, out, _ = run_cli("pause", location, Mailer.namespace, "news", "--owner", "queue",
                           capsys=capsys)
    assert code == 0 and "paused the jobs of queue" in out
    code, out, _ = run_cli("inspect", location, "--json", capsys=capsys)
    assert json.loads(out)["objects"][0]["paused"] == [None, "queue"]
    code, out, _ = run_cli("inspect", location, capsys=capsys)
    assert ", paused\n" in out

    async with nj.open_runtime(location) as rt:
        await trio.sleep(10)
        assert "ran:soon" not in await rt.get(Mailer, "news").ran()  # paused for good

    code, out, _ = run_cli("resume", location, Mailer.namespace, "news", "--owner", "queue",
                           capsys=capsys)
    assert code == 0 and out.startswith("resumed the jobs of queue")
    code, out, _ = run_cli("inspect", location, "--json", capsys=capsys)
    assert json.loads(out)["objects"][0]["paused"] == [None]
    code, _, err = run_cli("resume", location, Mailer.namespace, "nobody", capsys=capsys)
    assert code == 2 and "no object" in err

    now = EPOCH + trio.current_time()
    done = pause_shared(data, Mailer.namespace, "news", owner=None, paused=False, now=now)
    assert done.changed and not done.paused
    # The resumes lowered its alarm (the CLI's to the real now, in the virtual past).
    [(alarm,)] = stored(data, "SELECT time FROM nj_alarms WHERE object_id = 'news'")
    assert alarm <= now
    async with nj.open_runtime(location) as rt:
        await trio.sleep(1)
        ran = await rt.get(Mailer, "news").ran()
        assert ran["ran:soon"] == [1, now]  # the resume woke it, at once


# -- serve and the dashboard -----------------------------------------------------------------
async def test_serve_shows_a_stopped_shared_directory_read_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    await build(data, ids=("news", "other"))
    before = files(data)
    with SharedSource(data) as source:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_offline, source, LOOPBACK)
            status, _, body = await fetch(url, "/api/objects")
            assert status == 200, body
            api = json.loads(body)
            assert not api["live"] and api["total"] == 2
            entry = api["objects"][0]
            assert entry["state"] == "evicted" and entry["id"] == "news"
            assert sorted(d["id"] for d in entry["dead_letters"]) == ["bounce", "parcel"]
            assert [j["id"] for j in entry["jobs"]] == ["later"]
            status, _, page = await fetch(url, "/")
            assert status == 200 and ">news</a>" in page and "smtp down" in page
            status, _, page = await fetch(url, "/object?" + urlencode(
                {"ns": Mailer.namespace, "id": "news"}))
            assert status == 200 and "later" in page and "<form" not in page
            status, _, page = await fetch(url, "/dead-letters?q=courier")
            assert status == 200 and page.count("no courier") >= 2
            status, _, body = await fetch(url, "/metrics")
            assert status == 200, body
            m = samples(body)
            ns = (("namespace", Mailer.namespace),)
            assert m[("nursery_jobs_objects", ns)] == 2
            assert m[("nursery_jobs_dead_letters", ns)] == 4
            assert m[("nursery_jobs_alarms", ())] == 2
            status, _, _ = await fetch(url, "/actions/requeue", method="POST", body=b"a=b",
                                       headers={"Content-Type": FORM})
            assert status == 403
            nursery.cancel_scope.cancel(reason="the test is done")
    assert files(data) == before


async def test_nursery_jobs_serve_serves_a_shared_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    await build(data)
    before = files(data)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    async with trio.open_nursery() as nursery:
        process = await nursery.start(partial(
            trio.run_process,
            [sys.executable, "-m", "nursery_jobs.cli", "serve", f"shared:{data}", "--port",
             "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, check=False))
        try:
            line = b""
            with trio.fail_after(20):
                while not line.endswith(b"\n"):
                    chunk = await process.stdout.receive_some(1)
                    assert chunk, (line, await process.stderr.receive_some(65536))
                    line += chunk
            text = line.decode()
            assert f"serving shared:{data} (read-only)" in text
            found = re.search(r"http://\S+", text)
            assert found is not None, text
            status, _, body = await fetch(found.group(0), "/api/objects")
            assert status == 200, body
            (entry,) = json.loads(body)["objects"]
            assert sorted(d["id"] for d in entry["dead_letters"]) == ["bounce", "parcel"]
        finally:
            process.terminate()
    assert files(data) == before


async def test_a_running_shared_runtime_dashboard_counts_objects_out_of_memory(
    tmp_path: Path,
) -> None:
    """The pages read an active object's working copy and every other object's stored
    rows: the gauges counted objects out of memory as zero."""
    data = tmp_path / "data"
    location = f"shared:{data}"
    await build(data, ids=("s-0", "s-1", "s-2"))
    ns = (("namespace", Mailer.namespace),)
    with trio.fail_after(60):
        async with nj.open_runtime(location, http=LOOPBACK, max_active=1) as rt:
            url = rt.http_url or ""

            async def gauges() -> dict[Any, float]:
                status, _, body = await fetch(url, "/metrics")
                assert status == 200, body
                return samples(body)

            m = await gauges()  # (nothing in memory: every count from storage)
            assert m[("nursery_jobs_dead_letters", ns)] == 6
            assert m[("nursery_jobs_objects", ns)] == 3
            assert m[("nursery_jobs_active_objects", ns)] == 0
            status, _, body = await fetch(url, "/api/objects")
            api = json.loads(body)
            assert api["live"] and api["total"] == 3
            for entry in api["objects"]:
                assert entry["state"] == "evicted", entry
                assert [j["id"] for j in entry["jobs"]] == ["later"]
                assert len(entry["dead_letters"]) == 2

            # An active object is read from its working copy.
            s0 = rt.get(Mailer, "s-0")
            await s0.push("fail", id="again", retry=ONCE)
            await run_until_idle(rt)
            assert rt.is_active(Mailer.namespace, "s-0")
            m = await gauges()
            assert m[("nursery_jobs_dead_letters", ns)] == 7
            status, _, body = await fetch(url, "/api/object?" + urlencode(
                {"ns": Mailer.namespace, "id": "s-0"}))
            entry = json.loads(body)
            assert entry["state"] == "active" and len(entry["dead_letters"]) == 3

            # Then it leaves memory (max_active=1): read from what it shipped; and an
            # object counted while out of memory, changed since, is read again.
            s1 = rt.get(Mailer, "s-1")
            await s1.push("fail", id="again", retry=ONCE)
            await s1.push("send", id="soon", delay=3000)
            await run_until_idle(rt)
            await rt.get(Mailer, "s-2").ran()
            await eventually(lambda: not (rt.is_active(Mailer.namespace, "s-0")
                                          or rt.is_active(Mailer.namespace, "s-1")))
            m = await gauges()
            assert m[("nursery_jobs_dead_letters", ns)] == 8
            status, _, body = await fetch(url, "/api/objects")
            entries = {e["id"]: e for e in json.loads(body)["objects"]}
            assert entries["s-1"]["state"] == "evicted"
            assert [j["id"] for j in entries["s-1"]["jobs"]] == ["soon", "later"]
            assert entries["s-1"]["alarm"] == pytest.approx(nj.now() + 3000, abs=60)
            status, _, page = await fetch(url, "/")
            assert status == 200 and ">s-1</a>" in page


# -- a damaged row ---------------------------------------------------------------------------
DAMAGE = {
    "not JSON": "UPDATE nj_rows SET data = 'not json' WHERE tbl = 'nj_jobs' AND key = ?",
    "time is text": f"UPDATE nj_rows SET data = json_set(data, '$[{TIME_FIELD}]', 'soon')"
                    " WHERE tbl = 'nj_jobs' AND key = ?",
    "too short": "UPDATE nj_rows SET data = '[1]' WHERE tbl = 'nj_jobs' AND key = ?",
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
async def test_a_damaged_row_shows_its_object_damaged_and_every_other_listed(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    location = f"shared:{data}"
    async with nj.open_runtime(location) as rt:
        await rt.get(Mailer, "t").push("send", id="poisoned", delay=3600)
        await rt.get(Mailer, "t").push("send", id="healthy", delay=3600)
        await rt.get(Mailer, "other").push("fail", id="fine", retry=ONCE)
        await run_until_idle(rt)
    edit(data, DAMAGE[how], ("poisoned",))

    def assert_set_aside(entries: dict[str, dict[str, Any]]) -> None:
        assert entries["t"]["state"] == "damaged", entries["t"]
        assert "job 'poisoned'" in entries["t"]["problem"]
        assert entries["other"]["problem"] is None
        assert [d["id"] for d in entries["other"]["dead_letters"]] == ["fine"]
        assert entries["other"]["counts"]["dead_letters"] == 1

    code, out, err = run_cli("inspect", location, "--json", capsys=capsys)
    assert code == 0, err
    assert_set_aside({e["id"]: e for e in json.loads(out)["objects"]})
    code, out, _ = run_cli("inspect", location, capsys=capsys)
    assert code == 0 and "/t [damaged: job 'poisoned'" in out

    ns = (("namespace", Mailer.namespace),)
    with SharedSource(data) as source:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_offline, source, LOOPBACK)
            status, _, body = await fetch(url, "/api/objects")
            assert status == 200, body
            assert_set_aside({e["id"]: e for e in json.loads(body)["objects"]})
            for page in ("/", "/dead-letters", "/?only=strikes"):
                status, _, text = await fetch(url, page)
                assert status == 200, (page, text)
            status, _, body = await fetch(url, "/metrics")
            assert status == 200 and samples(body)[("nursery_jobs_dead_letters", ns)] == 1
            nursery.cancel_scope.cancel(reason="the test is done")

    with trio.fail_after(30):
        async with nj.open_runtime(location, http=LOOPBACK) as rt:
            url = rt.http_url or ""
            status, _, body = await fetch(url, "/api/objects")
            assert status == 200, body
            assert_set_aside({e["id"]: e for e in json.loads(body)["objects"]})
            status, _, body = await fetch(url, "/metrics")
            assert status == 200 and samples(body)[("nursery_jobs_dead_letters", ns)] == 1
