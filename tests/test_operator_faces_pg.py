"""Every operator face on a PostgreSQL engine, as on a data directory (DESIGN section 10):
a host's dashboard, ``/api`` and ``/metrics``; ``nursery-jobs requeue`` and ``serve`` on a
``postgresql://`` address (no runtime, no alarm in the CLI; a requeue never writes behind
a live host's back); addresses shown whole, passwords never."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
import trio
from pg_support import eventually, sql
from prometheus_client.parser import text_string_to_metric_families
from test_dashboard import fetch, samples

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj  # noqa: E402
from nursery_jobs import cli  # noqa: E402
from nursery_jobs._engines.postgres import _ops as pg_ops  # noqa: E402
from nursery_jobs._engines.postgres._copy import Change  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = ("127.0.0.1", 0)
ONCE = nj.RetryOptions(max_attempts=1)
SECRET = "s3cret-pw"
FORM = "application/x-www-form-urlencoded"


class Mailer(nj.DurableObject):
    """Host jobs and a Queue; ``env["fail"]`` (default True) makes "fail" jobs and
    every delivery raise."""

    namespace = "tests.test_operator_faces_pg.Mailer"

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
        self.ctx.storage.put(f"ran:{ctx.job.id}", ctx.attempt)
        if ctx.job.fn == "fail" and self._failing():
            raise ConnectionError("smtp down")
        return None

    async def _deliver(self, payload: Any, item: nj.QueueItem) -> None:
        self.ctx.storage.put(f"ran:{item.id}", item.attempt)
        if self._failing():
            raise ConnectionError("no courier")

    async def ran(self) -> dict[str, Any]:
        return self.ctx.storage.list("ran:")

    async def letters(self) -> list[tuple[str, str]]:
        return sorted((d.job.owner, d.job.id) for d in self.lifecycle.dead_letters())


def with_password(dsn: str, password: str) -> str:
    parts = urlsplit(dsn)
    user, _, host = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{user.partition(':')[0]}:{password}@{host}").geturl()


async def fill(mailer: Any) -> None:
    """A dead letter of the host ("bounce"), one of the Queue ("parcel"), a job due in
    an hour ("later")."""
    await mailer.push("fail", id="bounce", retry=ONCE)
    await mailer.push("send", id="later", delay=3600)
    await mailer.enqueue("parcel")

    async def both_dead() -> bool:
        return len(await mailer.letters()) == 2

    await eventually(both_dead)


async def build(dsn: str) -> None:
    with trio.fail_after(30):
        async with nj.open_runtime(dsn) as rt:
            await fill(rt.get(Mailer, "news"))


def tables(dsn: str) -> list[Any]:
    return [sql(dsn, f"SELECT * FROM {t} ORDER BY 1, 2") for t in (
        "nj_hosts", "nj_objects", "nj_rows", "nj_crashes", "nj_calls")]


def no_unknown_family(text: str) -> None:
    families = list(text_string_to_metric_families(text))
    assert families
    assert [f.name for f in families if f.type == "unknown"] == []


# -- a host's own dashboard ------------------------------------------------------------------
async def test_a_host_serves_the_dashboard_api_and_metrics_of_the_whole_database(
    pg_dsn: str,
) -> None:
    dsn = with_password(pg_dsn, SECRET)  # (the test server trusts; the password is unused)
    with trio.fail_after(60):
        async with nj.open_runtime(dsn) as other, nj.open_runtime(dsn, http=LOOPBACK) as rt:
            url = rt.http_url or ""
            await fill(rt.get(Mailer, "news"))
            # An object another host holds is listed too: PostgreSQL is the one truth.
            await other.get(Mailer, "elsewhere").push("send", id="soon", delay=3600)

            status, headers, page = await fetch(url, "/")
            assert status == 200, page
            assert headers["content-type"].startswith("text/html")
            assert ">news</a>" in page and ">elsewhere</a>" in page
            assert "ConnectionError: smtp down" in page  # the dead letters section
            assert "ConnectionError: no courier" in page
            assert SECRET not in page

            one = urlencode({"ns": Mailer.namespace, "id": "news"})
            status, _, page = await fetch(url, f"/object?{one}")
            assert status == 200, page
            for text in ("later", "bounce", "parcel", "smtp down"):
                assert text in page, text

            status, _, text = await fetch(url, "/api/objects")
            assert status == 200, text
            api = json.loads(text)
            assert api["live"] and api["total"] == 2 and SECRET not in text
            assert api["source"].startswith("postgresql://")
            entries = {e["id"]: e for e in api["objects"]}
            news = entries["news"]
            assert [j["id"] for j in news["jobs"]] == ["later"]
            assert sorted((d["owner"], d["id"]) for d in news["dead_letters"]) == [
                ("host", "bounce"), ("queue", "parcel")]
            assert news["counts"] == {"jobs": 1, "due": 0, "running": 0, "dead_letters": 2}
            assert news["state"] == entries["elsewhere"]["state"] == "active"
            assert [j["id"] for j in entries["elsewhere"]["jobs"]] == ["soon"]
            status, _, text = await fetch(url, f"/api/object?{one}")
            assert status == 200 and json.loads(text) == news

            status, _, text = await fetch(url, "/api/summary")
            assert status == 200, text
            assert json.loads(text)["objects"] == 2

            status, headers, text = await fetch(url, "/metrics")
            assert status == 200, text
            assert headers["content-type"].startswith("text/plain; version=0.0.4")
            no_unknown_family(text)
            m = samples(text)
            assert m[("nursery_jobs_objects", (("namespace", Mailer.namespace),))] == 2
            assert m[("nursery_jobs_alarms", ())] == 2
            host = (("namespace", Mailer.namespace), ("owner", "host"))
            assert m[("nursery_jobs_jobs_dispatched_total", host)] == 1
            assert m[("nursery_jobs_jobs_dead_lettered_total", host)] == 1


async def test_a_host_dashboard_requeues_what_it_holds_and_refuses_what_it_does_not(
    pg_dsn: str,
) -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn, env={"fail": True}) as other, nj.open_runtime(
            pg_dsn, http=LOOPBACK, http_writes=True, env={"fail": True},
        ) as rt:
            url = rt.http_url or ""
            news = rt.get(Mailer, "news")
            await fill(news)
            await fill(other.get(Mailer, "elsewhere"))
            _, _, page = await fetch(url, "/object?" + urlencode(
                {"ns": Mailer.namespace, "id": "news"}))
            found = re.search(r'name="token" value="([^"]+)"', page)
            assert found is not None
            form = {"ns": Mailer.namespace, "id": "news", "owner": "host", "job": "bounce",
                    "token": found.group(1)}
            headers = {"Content-Type": FORM, "Origin": url.rstrip("/")}

            rt.env["fail"] = False  # the cause is fixed
            status, answer, text = await fetch(url, "/actions/requeue", method="POST",
                                               body=urlencode(form).encode(), headers=headers)
            assert status == 303, text
            assert answer["location"].startswith("/object?")

            async def ran_again() -> bool:
                return (await news.ran()).get("ran:bounce") == 1

            await eventually(ran_again)
            assert await news.letters() == [("queue", "parcel")]

            # "elsewhere" is the other host's: this one does not write behind its back.
            status, _, text = await fetch(
                url, "/actions/requeue", method="POST",
                body=urlencode({**form, "id": "elsewhere"}).encode(), headers=headers)
            assert status == 409, text
            assert "held by host" in text
            assert await other.get(Mailer, "elsewhere").letters() == [
                ("host", "bounce"), ("queue", "parcel")]


# -- the console script ------------------------------------------------------------------
async def test_requeue_moves_a_dead_letter_back_and_the_next_host_runs_it(
    pg_dsn: str, capsys: pytest.CaptureFixture[str],
) -> None:
    await build(pg_dsn)
    [(epoch_before,)] = sql(pg_dsn, "SELECT epoch FROM nj_objects")
    dsn = with_password(pg_dsn, SECRET)
    masked = with_password(pg_dsn, "***")

    # The letter is the Queue's: the error says so, and how to ask for it.
    code = await trio.to_thread.run_sync(cli.main, ["requeue", dsn, Mailer.namespace, "news",
                                                    "parcel"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert "--owner queue" in err and "queue/parcel" in err, err

    code = await trio.to_thread.run_sync(cli.main, ["requeue", dsn, Mailer.namespace, "news",
                                                    "bounce"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert f"re-queued host/bounce of {Mailer.namespace}/news in {masked}" in out
    assert SECRET not in out

    # In PostgreSQL: the job row is back, due now, with fresh attempts; the letter is
    # gone; the alarm is due; the lease epoch moved on (a holder of the old one is
    # fenced); no host row, no lease: nothing ran in the CLI.
    [(owner, epoch, alarm)] = sql(pg_dsn, "SELECT owner, epoch, alarm_time FROM nj_objects")
    assert owner is None and epoch == epoch_before + 1
    assert alarm is not None and alarm <= time.time()  # due now
    rows = {(t, k) for t, k in sql(pg_dsn, "SELECT tbl, key FROM nj_rows")}
    assert ("nj_jobs", "bounce") in rows and ("nj_jobs", "later") in rows
    assert not any(t == "nj_dead_letters" and '"bounce"' in k for t, k in rows)
    assert sql(pg_dsn, "SELECT count(*) FROM nj_hosts") == [(0,)]

    code = await trio.to_thread.run_sync(cli.main, ["requeue", dsn, Mailer.namespace, "news",
                                                    "bounce"])
    _, err = capsys.readouterr()
    assert code == 1 and "no dead letter host/bounce" in err
    code = await trio.to_thread.run_sync(cli.main, ["requeue", dsn, Mailer.namespace,
                                                    "nobody", "bounce"])
    _, err = capsys.readouterr()
    assert code == 2 and "no object" in err and SECRET not in err

    code = await trio.to_thread.run_sync(cli.main, ["requeue", dsn, Mailer.namespace, "news",
                                                    "parcel", "--owner", "queue"])
    assert code == 0, capsys.readouterr().err

    with trio.fail_after(30):
        async with nj.open_runtime(pg_dsn, env={"fail": False}) as rt:
            news = rt.get(Mailer, "news")

            async def both_ran() -> bool:
                ran = await news.ran()
                return ran.get("ran:bounce") == 1 and ran.get("ran:parcel") == 1

            await eventually(both_ran)  # attempt 1 again: fresh attempts
            assert await news.letters() == []


async def test_requeue_refuses_an_object_a_live_host_holds_and_fences_a_lapsed_one(
    pg_dsn: str, capsys: pytest.CaptureFixture[str],
) -> None:
    await build(pg_dsn)
    args = ["requeue", pg_dsn, Mailer.namespace, "news", "bounce"]
    with trio.fail_after(30):
        async with nj.open_runtime(pg_dsn) as rt:
            await rt.get(Mailer, "news").ran()  # this host holds it now
            before = tables(pg_dsn)
            code = await trio.to_thread.run_sync(cli.main, args)
            out, err = capsys.readouterr()
            assert code == 3 and out == ""
            assert "held by host" in err and "nothing was written" in err, err
            assert tables(pg_dsn) == before

    # A host that stopped renewing (a zombie: paused, partitioned) while a job ran.
    flight = json.dumps([[Mailer.namespace, "news", "later", 1.0]])
    sql(pg_dsn, "INSERT INTO nj_hosts (host_id, flight) VALUES ('zombie:1:ab', %s)", (flight,))
    sql(pg_dsn, "UPDATE nj_objects SET owner = 'zombie:1:ab', epoch = 41,"
                " lease_until = now() - interval '1 second'")
    code = await trio.to_thread.run_sync(cli.main, args)
    assert code == 0, capsys.readouterr().err
    assert sql(pg_dsn, "SELECT owner, epoch FROM nj_objects") == [(None, 42)]
    # Its running job becomes a crash token, as a host taking the object over records it.
    assert sql(pg_dsn, "SELECT token FROM nj_crashes") == [("later",)]
    # And the zombie, waking, finds its writes refused by the fence.
    change = Change(namespace=Mailer.namespace, object_id="news", epoch=41, keys=[],
                    upserts=[("nj_kv", "k", '["k", "1"]')], deletes=[], alarm=None,
                    clear_crashes=False)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert pg_ops.ship(conn, "zombie:1:ab", 10.0, change) == pg_ops.FENCED
    assert sql(pg_dsn, "SELECT count(*) FROM nj_rows WHERE tbl = 'nj_kv'") == [(0,)]


async def test_serve_shows_a_postgres_database_read_only(pg_dsn: str) -> None:
    await build(pg_dsn)
    before = tables(pg_dsn)
    dsn = with_password(pg_dsn, SECRET)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    async with trio.open_nursery() as nursery:
        process = await nursery.start(partial(
            trio.run_process,
            [sys.executable, "-m", "nursery_jobs.cli", "serve", dsn, "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, check=False))
        try:
            line = b""
            with trio.fail_after(20):
                while not line.endswith(b"\n"):
                    chunk = await process.stdout.receive_some(1)
                    assert chunk, (line, await process.stderr.receive_some(65536))
                    line += chunk
            text = line.decode()
            assert SECRET not in text
            assert with_password(pg_dsn, "***") in text  # whole, the password masked
            found = re.search(r"http://\S+", text)
            assert found is not None, text
            url = found.group(0)

            status, _, body = await fetch(url, "/api/objects")
            assert status == 200, body
            api = json.loads(body)
            assert not api["live"] and SECRET not in body
            (entry,) = api["objects"]
            assert entry["state"] == "evicted"
            assert sorted(d["id"] for d in entry["dead_letters"]) == ["bounce", "parcel"]
            status, _, page = await fetch(url, "/")
            assert status == 200 and ">news</a>" in page and "smtp down" in page
            status, _, page = await fetch(url, "/object?" + urlencode(
                {"ns": Mailer.namespace, "id": "news"}))
            assert status == 200 and "later" in page and "<form" not in page
            status, _, body = await fetch(url, "/metrics")
            assert status == 200, body
            no_unknown_family(body)
            assert samples(body)[("nursery_jobs_objects",
                                  (("namespace", Mailer.namespace),))] == 1
            status, _, _ = await fetch(url, "/actions/requeue", method="POST", body=b"a=b",
                                       headers={"Content-Type": FORM})
            assert status == 403

            # Each page is a fresh snapshot: a change made since is shown.
            sql(pg_dsn, "DELETE FROM nj_rows WHERE tbl = 'nj_dead_letters'")
            api = json.loads((await fetch(url, "/api/objects"))[2])
            assert api["objects"][0]["dead_letters"] == []
        finally:
            process.terminate()
    stderr = await process.stderr.receive_some(65536)
    assert SECRET.encode() not in stderr
    assert tables(pg_dsn)[:2] == before[:2]  # no host row, no lease: nothing ran


def test_the_cli_shows_addresses_whole_and_never_a_password(
    pg_dsn: str, capsys: pytest.CaptureFixture[str],
) -> None:
    dsn = with_password(pg_dsn, SECRET)
    masked = with_password(pg_dsn, "***")
    assert cli.main(["serve", dsn, "--port", "0"]) == 2  # an empty database: not ours
    _, err = capsys.readouterr()
    assert f"{masked} is not a nursery_jobs database" in err
    trio.run(build, pg_dsn)
    assert cli.main(["inspect", dsn]) == 0
    out, _ = capsys.readouterr()
    assert f"1 object(s) in {masked}" in out and SECRET not in out
    assert cli.main(["inspect", dsn, "--json"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out)["source"] == masked and SECRET not in out
    unreachable = with_password("postgresql://postgres@127.0.0.1:1/none", SECRET)
    odd = f"postgresql://postgres:{SECRET}%zz@127.0.0.1:5432/x"  # libpq quotes the token
    for args in (["requeue", dsn, Mailer.namespace, "nobody", "bounce"],
                 ["requeue", unreachable, Mailer.namespace, "news", "bounce"],
                 ["inspect", unreachable], ["inspect", odd], ["requeue", odd, "a", "b", "c"],
                 ["serve", unreachable, "--port", "0"]):
        code = cli.main(args)
        out, err = capsys.readouterr()
        assert code == 2, (args, out, err)
        assert SECRET not in out + err, (args, err)
        assert "postgresql:/" + "p" not in err, (args, err)  # never a slash short
