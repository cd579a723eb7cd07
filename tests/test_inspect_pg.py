"""``nursery-jobs inspect postgresql://...``: objects, due jobs, dead letters and leases
from a PostgreSQL engine's tables, read-only (one read-only snapshot; nothing created),
text and --json; hostile rows and addresses are refused or shown with typed errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from pg_support import fresh_database, sql

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj  # noqa: E402
from nursery_jobs import cli  # noqa: E402


class Mailer(nj.DurableObject):
    namespace = "tests.test_inspect_pg.Mailer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "fail":
            raise ConnectionError("smtp down\nFORGED LINE")
        return None


def snapshot(dsn: str) -> list[Any]:
    return [sql(dsn, f"SELECT * FROM {t} ORDER BY 1, 2") for t in (
        "nj_hosts", "nj_objects", "nj_rows", "nj_crashes", "nj_calls")]


async def build(dsn: str) -> None:
    async with nj.open_runtime(dsn) as rt:
        mailer = rt.get(Mailer, "news\x1b[2J")
        await mailer.push("fail", id="bounce", retry=nj.RetryOptions(max_attempts=1))
        await mailer.push("send", id="later", delay=3600)
        await trio.sleep(1)


def test_inspect_lists_objects_jobs_dead_letters_and_leases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with fresh_database() as dsn:
        trio.run(build, dsn)
        # A lease as a running host leaves it (inspect writes nothing, so any host may run).
        sql(dsn, "INSERT INTO nj_hosts (host_id) VALUES ('box:42:ab')")
        sql(dsn, "UPDATE nj_objects SET owner = 'box:42:ab', epoch = 7,"
                 " lease_until = now() + interval '1 hour'")
        before = snapshot(dsn)
        assert cli.main(["inspect", dsn, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        [entry] = report["objects"]
        assert (entry["namespace"], entry["id"]) == (Mailer.namespace, "news\x1b[2J")
        assert entry["state"] == "active"
        assert [(j["id"], j["fn"]) for j in entry["jobs"]] == [("later", "send")]
        assert entry["alarm"] == entry["jobs"][0]["time"]
        [letter] = entry["dead_letters"]
        assert (letter["id"], letter["fn"], letter["attempts"]) == ("bounce", "fail", 1)
        assert "smtp down" in letter["error"]
        lease = entry["lease"]
        assert (lease["owner"], lease["epoch"], lease["live"]) == ("box:42:ab", 7, True)
        assert [(h["host_id"], h["leases"]) for h in report["hosts"]] == [("box:42:ab", 1)]
        assert report["source"].startswith("postgresql://") and "password" not in report[
            "source"]

        assert cli.main(["inspect", dsn]) == 0
        text = capsys.readouterr().out
        assert "news\\x1b[2J" in text and "\x1b" not in text  # no terminal escapes
        assert "FORGED LINE" in text and "\nFORGED LINE" not in text
        assert "lease box:42:ab epoch 7" in text
        assert "host box:42:ab" in text
        assert snapshot(dsn) == before  # read-only


def test_inspect_refuses_what_is_not_a_database_it_knows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with fresh_database() as dsn:
        # An empty database: not ours; nothing is created in it.
        assert cli.main(["inspect", dsn]) == 2
        assert "not a nursery_jobs database" in capsys.readouterr().err
        assert sql(dsn, "SELECT to_regclass('nj_schema')") == [(None,)]
        trio.run(build, dsn)
        sql(dsn, "UPDATE nj_schema SET version = version + 1")
        assert cli.main(["inspect", dsn, "--json"]) == 2
        assert "newer than this nursery_jobs knows" in capsys.readouterr().err
        sql(dsn, "UPDATE nj_schema SET version = version - 1")
        # Hand-edited rows: that object is shown damaged, the report goes on.
        sql(dsn, "INSERT INTO nj_rows SELECT namespace, object_id, 'evil_table', 'k', '[1]'"
                 " FROM nj_objects")
        assert cli.main(["inspect", dsn, "--json"]) == 0
        [entry] = json.loads(capsys.readouterr().out)["objects"]
        assert entry["state"] == "damaged" and "evil_table" in entry["problem"]
    # A server that is not there: a typed error and exit 2, no traceback.
    assert cli.main(["inspect", "postgresql://nobody@127.0.0.1:1/none"]) == 2
    assert "cannot connect to PostgreSQL" in capsys.readouterr().err
