"""An operator face given an object that does not exist — the dashboard's actions
(requeue, discard) and pages (``/object``, ``/api/object``), the CLI's requeue, pause
and resume — says there is no such object (a 404; exit 2) and writes nothing: no
catalog row, no object file, no PostgreSQL row. Operator faces open an object only if
it exists (the engines' ``open_object(..., create=False)``); a hostile id (a path, an
empty or a huge one, one with a NUL) is a typed 4xx, never a 500 or a new object."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import trio
import trio.testing
from conftest import engine
from test_dashboard import fetch

import nursery_jobs as nj
from nursery_jobs import cli
from nursery_jobs._errors import UnknownObjectError
from nursery_jobs._ops._sources import RuntimeSource
from nursery_jobs.testing import run_until_idle

ONCE = nj.RetryOptions(max_attempts=1)
LOOPBACK = ("127.0.0.1", 0)


class Mailer(nj.DurableObject):
    namespace = "tests.test_operator_unknown_objects.Mailer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def letters(self) -> list[str]:
        return [d.job.id for d in self.lifecycle.dead_letters()]

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        raise ConnectionError("smtp down")


NS = Mailer.namespace
# (namespace, object id, the status the dashboard answers), for actions and pages alike.
HOSTILE = [
    (NS, "ghost", 404),
    (NS, "../../../etc/passwd", 404),  # (a valid id: files are named by a hash of it)
    (NS, "x" * 5000, 400),
    (NS, "a\x00b", 400),
    (NS, "", 400),
    ("../../x", "ghost", 404),
    ("", "ghost", 400),
    ("a\x00b", "ghost", 400),
]


@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


def stored(rt: nj.Runtime) -> Any:
    """What the runtime's engine stores of every object: their keys (and the object
    files, the namespaces recorded)."""
    from pg_support import sql

    dsn = getattr(rt.engine, "dsn", None)
    if dsn is not None:
        return (sql(dsn, "SELECT namespace, object_id, epoch FROM nj_objects ORDER BY 1, 2"),
                sql(dsn, "SELECT DISTINCT namespace, object_id FROM nj_rows ORDER BY 1, 2"),
                sql(dsn, "SELECT namespace FROM nj_namespaces ORDER BY 1"))
    keys = sorted(rt.engine.catalog.conn.execute(  # type: ignore[attr-defined]
        "SELECT namespace, object_id FROM nj_objects").fetchall())
    if rt.path is None:
        return keys, sorted(rt.engine._objects)  # type: ignore[attr-defined]
    objects = Path(rt.path) / "objects"  # (the shared layout has none)
    return keys, sorted(p.name for p in objects.iterdir()) if objects.is_dir() else []


async def _dashboard(rt: nj.Runtime) -> tuple[str, str, dict[str, str]]:
    """The dashboard's address, its form token (its page of "known"'s dead letter) and
    the headers of a POST."""
    from pg_support import eventually

    await rt.get(Mailer, "known").push("fail", id="bounce", retry=ONCE)
    await run_until_idle(rt)
    url = rt.http_url or ""
    token: list[str] = []

    async def found() -> bool:  # (PostgreSQL: once the dead letter shipped)
        _, _, page = await fetch(url, "/dead-letters")
        token[:] = re.findall(r'name="token" value="([^"]+)"', page)[:1]
        return bool(token)

    await eventually(found)
    return url, token[0], {"Content-Type": "application/x-www-form-urlencoded",
                           "Origin": url.rstrip("/")}


@pytest.mark.parametrize("action", ["requeue", "discard"])
async def test_an_action_on_a_missing_object_is_a_404_and_creates_nothing(action: str) -> None:
    """It activated the object, creating it (an empty database, a catalog or PostgreSQL
    row), and answered 303 "no dead letter host/bounce"."""
    with trio.fail_after(60):
        async with nj.open_runtime(engine.location, http=LOOPBACK, http_writes=True) as rt:
            url, token, headers = await _dashboard(rt)
            before = stored(rt)
            form = {"ns": NS, "id": "ghost", "owner": "host", "job": "bounce", "token": token}
            status, _, text = await fetch(url, f"/actions/{action}", method="POST",
                                          body=urlencode(form).encode(), headers=headers)
            assert status == 404, text
            assert f"no object 'ghost' in namespace {NS!r}" in text, text
            assert stored(rt) == before
            assert (NS, "ghost") not in rt.active_objects()
            assert await rt.get(Mailer, "known").letters() == ["bounce"]


async def test_hostile_ids_get_a_typed_4xx_from_actions_and_pages_and_write_nothing() -> None:
    """A path, a huge id, a NUL, an empty name: each a 400 (bad id) or 404 (no such
    object), from an action and from the object's pages alike. They were a 500 (a huge
    id, a NUL: an ObjectIdError traceback; a NUL on PostgreSQL's pages a 503), or a
    new object (a path)."""
    with trio.fail_after(120):
        async with nj.open_runtime(engine.location, http=LOOPBACK, http_writes=True) as rt:
            url, token, headers = await _dashboard(rt)
            before = stored(rt)
            for namespace, object_id, expected in HOSTILE:
                case = (namespace[:20], object_id[:20])
                form = {"ns": namespace, "id": object_id, "owner": "host", "job": "bounce",
                        "token": token}
                for action in ("requeue", "discard"):
                    status, _, text = await fetch(url, f"/actions/{action}", method="POST",
                                                  body=urlencode(form).encode(),
                                                  headers=headers)
                    assert status == expected, (case, action, text)
                for page in ("/object", "/api/object"):
                    query = urlencode({"ns": namespace, "id": object_id})
                    status, _, text = await fetch(url, f"{page}?{query}")
                    assert status == expected, (case, page, text)
                assert stored(rt) == before, case
            assert rt.active_objects() == [(NS, "known")]


async def test_a_call_that_waits_on_a_refused_action_creates_the_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An application call arrives while an action's activation of the missing object
    is opening it (and refuses to create it): the call waits for that activation, then
    creates the object as calls do — it is not handed the action's 'no object'."""
    with trio.fail_after(60):
        async with nj.open_runtime(engine.location) as rt:
            opened = rt.engine.open_object
            entered, gate = trio.Event(), trio.Event()

            async def open_object(*args: Any, **kwargs: Any) -> Any:
                if kwargs.get("create", True) is False:
                    entered.set()
                    await gate.wait()
                return await opened(*args, **kwargs)

            monkeypatch.setattr(rt.engine, "open_object", open_object)
            found: list[list[str]] = []

            async def act() -> None:
                with pytest.raises(UnknownObjectError, match="no object 'ghost'"):
                    await RuntimeSource(rt).discard(NS, "ghost", "host", "bounce")

            async def call() -> None:
                found.append(await rt.get(Mailer, "ghost").letters())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(act)
                await entered.wait()
                nursery.start_soon(call)
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
            assert found == [[]]
            assert (NS, "ghost") in rt.active_objects()


# -- the CLI -----------------------------------------------------------------------------
def _files(data: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p.relative_to(data)): (p.stat().st_size, p.stat().st_mtime_ns,
                                       hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(data.rglob("*")) if p.is_file()}


def _directory(location: Any) -> Path:
    """A data directory's path (``shared:<directory>`` too)."""
    return Path(str(location).removeprefix("shared:"))


def _postgres(dsn: str) -> Any:
    from pg_support import sql

    return [sql(dsn, f"SELECT * FROM {table} ORDER BY 1, 2")
            for table in ("nj_objects", "nj_rows")] + [
        sql(dsn, "SELECT * FROM nj_namespaces ORDER BY 1")]


async def test_the_cli_on_a_missing_or_hostile_object_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """``requeue``, ``pause`` and ``resume`` of an object that does not exist, in a
    stopped data directory and on PostgreSQL: exit 2 naming it, nothing written (not
    a byte of the directory's files, not a row)."""
    engine.skip_on("memory", "the CLI reads a data directory or a PostgreSQL database")
    location = engine.durable(tmp_path)
    async with nj.open_runtime(location) as rt:
        await rt.get(Mailer, "known").push("fail", id="bounce", retry=ONCE)
        await run_until_idle(rt)
    dsn = getattr(rt.engine, "dsn", None)

    def snapshot() -> Any:
        return _postgres(dsn) if dsn is not None else _files(_directory(location))

    before = snapshot()
    for namespace, object_id, _ in HOSTILE:
        if "\x00" in namespace + object_id:
            continue  # (an argument cannot hold one)
        for args in (["requeue", str(location), namespace, object_id, "bounce"],
                     ["pause", str(location), namespace, object_id],
                     ["resume", str(location), namespace, object_id]):
            code = cli.main(args)
            _, err = capsys.readouterr()
            assert code == 2 and "no object" in err, (args[0], namespace[:20],
                                                       object_id[:20], err)
        assert snapshot() == before, (namespace[:20], object_id[:20])


# -- the engine seam -------------------------------------------------------------------
async def test_no_engine_opens_an_object_that_does_not_exist(tmp_path: Path) -> None:
    """``open_object(..., create=False)`` on every engine (the shared layout too): a
    typed 'no object', nothing stored; an object that exists opens."""
    locations = [engine.location]
    if engine.name == "files":
        locations.append(f"shared:{tmp_path / 'shared'}")
    for location in locations:
        async with nj.open_runtime(location) as rt:
            await rt.get(Mailer, "known").push("fail", id="bounce", retry=ONCE)
            await run_until_idle(rt)
            class_path = f"{Mailer.__module__}:{Mailer.__qualname__}"
            keys = rt.active_objects()
            with pytest.raises(UnknownObjectError, match="no object 'ghost'") as caught:
                await RuntimeSource(rt).requeue(NS, "ghost", "host", "bounce")
            assert (caught.value.namespace, caught.value.object_id) == (NS, "ghost")
            assert rt.active_objects() == keys
            before = stored(rt)
            with pytest.raises(UnknownObjectError):
                await rt.engine.open_object(NS, "ghost2", class_path, create=False)
            assert stored(rt) == before
            assert await RuntimeSource(rt).discard(NS, "known", "host", "bounce") is True


async def test_serve_answers_a_missing_or_hostile_object_with_a_4xx_and_reads_only(
    tmp_path: Path,
) -> None:
    """``nursery-jobs serve``'s pages (a stopped data directory, a PostgreSQL
    database) of an object that does not exist, or a hostile id: 404 or 400, and not a
    byte or a row written (a NUL was a 503 on PostgreSQL: its driver refused it)."""
    from nursery_jobs._ops._inspect_pg import PgDatabase
    from nursery_jobs._ops._inspect_shared import SharedSource
    from nursery_jobs._ops._sources import OfflineSource
    from nursery_jobs._ops._web import serve_offline

    engine.skip_on("memory", "serve reads a data directory or a PostgreSQL database")
    location = engine.durable(tmp_path)
    async with nj.open_runtime(location) as rt:
        await rt.get(Mailer, "known").push("fail", id="bounce", retry=ONCE)
        await run_until_idle(rt)
    dsn = getattr(rt.engine, "dsn", None)

    def snapshot() -> Any:
        return _postgres(dsn) if dsn is not None else _files(_directory(location))

    before = snapshot()
    access: Any = (PgDatabase(dsn) if dsn is not None else SharedSource(_directory(location))
                   if engine.name == "shared" else OfflineSource(location))
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                url = await nursery.start(serve_offline, access, LOOPBACK)
                for namespace, object_id, expected in HOSTILE:
                    for page in ("/object", "/api/object"):
                        query = urlencode({"ns": namespace, "id": object_id})
                        status, _, text = await fetch(url, f"{page}?{query}")
                        assert status == expected, (namespace[:20], object_id[:20], text)
                status, _, _ = await fetch(url, "/object?" + urlencode({"ns": NS,
                                                                        "id": "known"}))
                assert status == 200
                nursery.cancel_scope.cancel(reason="the test is done")
    finally:
        if dsn is not None or engine.name == "shared":
            access.close()
    assert snapshot() == before
