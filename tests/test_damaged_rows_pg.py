"""A job row changed outside nursery_jobs in a PostgreSQL database is one object's
fault, as in a data directory (DESIGN.md §10, STYLE 20): ``inspect``, the dashboard,
``/api`` and ``/metrics`` show that object as damaged, naming the job, and list and
count every other object as before; a payload that does not decode is shown as the
SQLite readers show it."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_support import eventually, fresh_database, sql
from test_dashboard import fetch

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj  # noqa: E402
from nursery_jobs import cli  # noqa: E402
from nursery_jobs._engines.files._catalog import object_file_name  # noqa: E402
from nursery_jobs._engines.postgres._schema import TABLES_BY_NAME  # noqa: E402
from nursery_jobs._ops._inspect import ObjectCounts  # noqa: E402
from nursery_jobs._ops._inspect_json import report_json  # noqa: E402
from nursery_jobs._ops._inspect_pg import PgDatabase, PgSource  # noqa: E402
from nursery_jobs._ops._sources import OfflineSource  # noqa: E402
from nursery_jobs._ops._web import serve_offline  # noqa: E402

LOOPBACK = ("127.0.0.1", 0)
JOB_COLUMNS = TABLES_BY_NAME["nj_jobs"].columns


class Host(nj.DurableObject):
    namespace = "tests.test_damaged_rows_pg.Host"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, job_id: str, payload: Any = None) -> None:
        await self.lifecycle.jobs.push(job_id, id=job_id, delay=3600, payload=payload)

    async def bounce(self) -> None:
        await self.lifecycle.jobs.push("bounce", id="bounce",
                                       retry=nj.RetryOptions(max_attempts=1))

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "bounce":
            raise ConnectionError("no courier")
        return None


async def build(location: str, jobs: dict[str, list[str]]) -> None:
    """Each object of ``jobs`` with its jobs (fn = id), due in an hour."""
    async with nj.open_runtime(location) as rt:
        for object_id, ids in jobs.items():
            for job_id in ids:
                await rt.get(Host, object_id).push(job_id, payload={"n": 1})


TWO = {"t": ["poisoned", "healthy"], "other": ["fine"]}


def set_field(dsn: str, job_id: str, column: str, value: str) -> None:
    """Set one field (``value``: JSON) of the stored row of job ``job_id``."""
    found = sql(dsn, "UPDATE nj_rows SET data = jsonb_set(data::jsonb, %s, %s::jsonb)::text"
                     " WHERE tbl = 'nj_jobs' AND key = %s RETURNING key",
                ([str(JOB_COLUMNS.index(column))], value, job_id))
    assert found == [(job_id,)]


def set_row(dsn: str, job_id: str, text: str) -> None:
    assert sql(dsn, "UPDATE nj_rows SET data = %s WHERE tbl = 'nj_jobs' AND key = %s"
                    " RETURNING key", (text, job_id)) == [(job_id,)]


# (how the row of job 'poisoned' is damaged) -> the change. In a field the counts over
# every object read (in SQL), or the row as a whole:
READ_BY_COUNTS: dict[str, Any] = {
    "not JSON": lambda dsn: set_row(dsn, "poisoned", "not json"),
    "time is text": lambda dsn: set_field(dsn, "poisoned", "time", '"soon"'),
    "time is null": lambda dsn: set_field(dsn, "poisoned", "time", "null"),
    "time out of range": lambda dsn: set_field(dsn, "poisoned", "time", "1e400"),
    "attempts is text": lambda dsn: set_field(dsn, "poisoned", "attempts", '"x"'),
    "attempts is a list": lambda dsn: set_field(dsn, "poisoned", "attempts", "[1]"),
    "crash strikes is text": lambda dsn: set_field(dsn, "poisoned", "crash_strikes", '"x"'),
}
# ... or only where one object's rows are read whole (its page, inspect):
DAMAGE: dict[str, Any] = {
    **READ_BY_COUNTS,
    "no JSON array": lambda dsn: set_row(dsn, "poisoned", '{"id": "poisoned"}'),
    "too short": lambda dsn: set_row(dsn, "poisoned", "[1]"),
    "created_at is text": lambda dsn: set_field(dsn, "poisoned", "created_at", '"then"'),
    "priority out of range": lambda dsn: set_field(dsn, "poisoned", "priority", "1e30"),
}


@asynccontextmanager
async def damaged(how: str) -> AsyncIterator[str]:
    """A database with objects 't' (jobs 'poisoned', 'healthy') and 'other' ('fine'),
    the row of 'poisoned' damaged ``how``."""
    with fresh_database() as dsn:
        await build(dsn, TWO)
        DAMAGE[how](dsn)
        yield dsn


def assert_set_aside(entries: dict[str, dict[str, Any]]) -> None:
    """'t' is shown damaged, naming the job; 'other' as it was."""
    assert entries["t"]["state"] == "damaged", entries["t"]
    assert "job 'poisoned'" in entries["t"]["problem"]
    assert entries["other"]["state"] == "evicted" and entries["other"]["problem"] is None
    assert [j["id"] for j in entries["other"]["jobs"]] == ["fine"]
    assert entries["other"]["counts"]["jobs"] == 1


@pytest.mark.parametrize("how", sorted(DAMAGE))
async def test_inspect_shows_the_object_damaged_and_the_others_whole(
    how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with damaged(how) as dsn:
        assert cli.main(["inspect", dsn, "--json"]) == 0, capsys.readouterr().err
        report = json.loads(capsys.readouterr().out)
        assert report["total"] == 2
        assert_set_aside({e["id"]: e for e in report["objects"]})
        assert cli.main(["inspect", dsn]) == 0, capsys.readouterr().err
        text = capsys.readouterr().out
        assert "Host/t [damaged: " in text and "job 'poisoned'" in text
        assert "job host/fine fine" in text


def counts_of(counts: dict[tuple[str, str], ObjectCounts]) -> dict[str, ObjectCounts]:
    return {object_id: c for (namespace, object_id), c in counts.items()
            if namespace == Host.namespace}


def assert_counted(counts: dict[str, ObjectCounts], *, damage_read: bool = True) -> None:
    """'other' counted; 't' damaged, naming the job (``damage_read``: the damage is in
    what the counts read; else 't' is counted from what they read)."""
    other = counts["other"]
    assert (other.state, other.jobs, other.due_jobs) == (None, 1, 0), other
    assert other.next_due is not None
    if damage_read:
        assert counts["t"].state == "damaged", counts["t"]
        assert "job 'poisoned'" in (counts["t"].problem or "")
    else:
        assert counts["t"].state is None and counts["t"].jobs == 2, counts["t"]


@pytest.mark.parametrize("how", sorted(DAMAGE))
async def test_the_dashboard_counts_every_other_object(how: str) -> None:
    """The counts over every object (the dashboard's cards, its object list, /metrics)
    are read in SQL: the damaged row fails only its object's."""
    read = how in READ_BY_COUNTS
    async with damaged(how) as dsn:
        now = time.time()
        with PgSource(dsn) as source:  # (inspect's snapshot: a transaction it began)
            assert_counted(counts_of(source.object_counts(now)), damage_read=read)
            assert source.job_totals(now).due_jobs == {Host.namespace: 0}
        database = PgDatabase(dsn)  # (serve's: a snapshot per request)
        try:
            assert_counted(counts_of(await database.read(
                lambda source: source.object_counts(now))), damage_read=read)
            async with trio.open_nursery() as nursery:
                url = await nursery.start(serve_offline, database, LOOPBACK)
                status, _, page = await fetch(url, "/")
                assert status == 200, page
                assert ">other</a>" in page and (">damaged<" in page) == read, page
                for path in ("/?sort=jobs&desc=1", "/?only=failing", "/dead-letters"):
                    status, _, page = await fetch(url, path)
                    assert status == 200, (path, page)
                status, _, body = await fetch(url, "/api/objects")
                assert status == 200, body
                assert_set_aside({e["id"]: e for e in json.loads(body)["objects"]})
                status, _, body = await fetch(url, "/metrics")
                assert status == 200, body
                nursery.cancel_scope.cancel()
        finally:
            database.close()


async def test_a_host_dashboard_shows_the_damaged_object() -> None:
    async with damaged("not JSON") as dsn:
        async with nj.open_runtime(dsn, http=LOOPBACK) as rt:
            status, _, page = await fetch(rt.http_url or "", "/")
            assert status == 200, page
            assert ">other</a>" in page and "damaged" in page


async def test_only_the_objects_with_damaged_rows_are_set_aside() -> None:
    objects = {f"o{i}": [f"j{i}"] for i in range(9)}
    with fresh_database() as dsn:
        await build(dsn, objects)
        set_row(dsn, "j2", "not json")
        set_field(dsn, "j5", "attempts", '"x"')
        set_field(dsn, "j6", "time", '"soon"')
        database = PgDatabase(dsn)
        try:
            counts = counts_of(await database.read(
                lambda source: source.object_counts(time.time())))
        finally:
            database.close()
        assert sorted(k for k, c in counts.items() if c.state == "damaged") == [
            "o2", "o5", "o6"]
        for object_id in ("o2", "o5", "o6"):
            job_id = "j" + object_id[1:]
            assert f"job '{job_id}'" in (counts[object_id].problem or ""), counts[object_id]
        assert all(c.jobs == 1 and c.next_due is not None
                   for k, c in counts.items() if k not in ("o2", "o5", "o6"))


@pytest.mark.parametrize("how", ["dead letter", "breaker strikes"])
async def test_a_damaged_row_of_another_table_is_named_too(
    how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with fresh_database() as dsn:
        await build(dsn, TWO)
        if how == "dead letter":
            async with nj.open_runtime(dsn) as rt:
                await rt.get(Host, "t").bounce()
                await eventually(lambda: sql(
                    dsn, "SELECT 1 FROM nj_rows WHERE tbl = 'nj_dead_letters'"))
            attempts = TABLES_BY_NAME["nj_dead_letters"].columns.index("attempts")
            sql(dsn, "UPDATE nj_rows SET data = jsonb_set(data::jsonb, %s, '\"x\"')::text"
                     " WHERE tbl = 'nj_dead_letters'", ([str(attempts)],))
            named = "nj_dead_letters row ['host', 'bounce']: its stored attempts 'x'"
        else:
            sql(dsn, "INSERT INTO nj_rows SELECT namespace, object_id, 'nj_meta',"
                     " 'memory_limit_strikes', '[\"memory_limit_strikes\", \"x\"]'"
                     " FROM nj_objects WHERE object_id = 't'")
            named = "nj_meta row 'memory_limit_strikes': its stored value 'x'"
        assert cli.main(["inspect", dsn, "--json"]) == 0, capsys.readouterr().err
        entries = {e["id"]: e for e in json.loads(capsys.readouterr().out)["objects"]}
        assert entries["t"]["state"] == "damaged" and named in entries["t"]["problem"]
        assert [j["id"] for j in entries["other"]["jobs"]] == ["fine"]
        with PgSource(dsn) as source:
            counts = counts_of(source.object_counts(time.time()))
        assert counts["other"].jobs == 1
        if how == "breaker strikes":  # (the counts read the strikes: in SQL)
            assert counts["t"].state == "damaged" and named in (counts["t"].problem or "")


async def test_a_payload_that_does_not_decode_is_shown_as_a_data_directory_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = '{"$t":"nope","v":1}'
    with fresh_database() as dsn:
        await build(dsn, TWO)
        set_field(dsn, "poisoned", "payload", json.dumps(forged))
        assert cli.main(["inspect", dsn, "--json"]) == 0
        entries = {e["id"]: e for e in json.loads(capsys.readouterr().out)["objects"]}
    data = tmp_path / "data"
    await build(str(data), TWO)
    tamper(data, "UPDATE nj_jobs SET payload = ? WHERE id = 'poisoned'", (forged,))
    offline = OfflineSource(data)
    files = {e["id"]: e for e in report_json(offline, time.time(), limit=-1)["objects"]}
    for entry in (entries["t"], files["t"]):
        assert entry["state"] == "evicted"
        jobs = {j["id"]: j["payload"] for j in entry["jobs"]}
        assert jobs == {"poisoned": "'<undecodable payload>'", "healthy": "{'n': 1}"}


def tamper(data: Path, statement: str, params: tuple[Any, ...] = ()) -> None:
    conn = sqlite3.connect(data / "objects" / object_file_name(Host.namespace, "t"))
    with conn:
        conn.execute(statement, params)
    conn.close()


async def test_a_time_that_is_no_number_reads_as_in_a_data_directory(tmp_path: Path) -> None:
    """The same damage, the same report: the object damaged, its problem naming the job
    and the field, every other object whole."""
    now = time.time()
    async with damaged("time is text") as dsn:
        with PgSource(dsn) as source:
            postgres = {e["id"]: e for e in report_json(source, now, limit=-1)["objects"]}
            postgres_counts = counts_of(source.object_counts(now))
    data = tmp_path / "data"
    await build(str(data), TWO)
    tamper(data, "UPDATE nj_jobs SET time = 'soon' WHERE id = 'poisoned'")
    offline = OfflineSource(data)
    files = {e["id"]: e for e in report_json(offline, now, limit=-1)["objects"]}
    files_counts = counts_of(offline.object_counts(now))

    def seen(entry: dict[str, Any]) -> tuple[Any, ...]:
        return (entry["state"], entry["problem"] and entry["problem"].split(" (")[0],
                [j["id"] for j in entry["jobs"]], entry["counts"])

    assert seen(postgres["t"]) == seen(files["t"])
    assert seen(files["t"])[1] == "job 'poisoned': its stored time 'soon' is no number"
    assert seen(postgres["other"]) == seen(files["other"])
    assert (postgres_counts["t"].state, postgres_counts["t"].problem.split(" (")[0]) == (
        files_counts["t"].state, (files_counts["t"].problem or "").split(" (")[0])
