"""The dashboard's write actions (requeue, discard a dead letter) run as a write call of
the object does: the object stays resident and awake from activation to the end of the
action, and what the action wrote is durable (shipped, where commits ship) when it
returns — the answer "requeued" is never ahead of the storage."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote_plus, urlencode

import pytest
import trio
from test_dashboard import fetch

import nursery_jobs as nj
from nursery_jobs._ops._sources import RuntimeSource
from nursery_jobs.testing import run_until_idle

ONCE = nj.RetryOptions(max_attempts=1)
LOOPBACK = ("127.0.0.1", 0)
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


class Mailer(nj.DurableObject):
    namespace = "tests.test_dashboard_actions.Mailer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def letters(self) -> list[str]:
        return [d.job.id for d in self.lifecycle.dead_letters()]

    held: ClassVar[trio.Event | None] = None
    release: ClassVar[trio.Event | None] = None

    async def hold(self) -> None:
        """Hold the object's turn until ``Mailer.release`` is set."""
        assert Mailer.held is not None and Mailer.release is not None
        Mailer.held.set()
        await Mailer.release.wait()

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "fail" and (self.ctx.env or {}).get("fail", True):
            raise ConnectionError("smtp down")
        return None


async def _dead_letter(rt: nj.Runtime, object_id: str) -> None:
    await rt.get(Mailer, object_id).push("fail", id="bounce", retry=ONCE)
    await run_until_idle(rt)
    assert await rt.get(Mailer, object_id).letters() == ["bounce"]


@pytest.mark.parametrize("action", ["requeue", "discard"])
async def test_actions_side_by_side_each_keep_their_object_resident(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, action: str,
) -> None:
    # Ten actions at once with room for one resident object: each activation evicts
    # the least recently used idle object. An action that let go of its object between
    # activating it and entering its turn found it evicted (a StorageError naming it).
    async with nj.open_runtime(tmp_path / "data", max_active=1, env={"fail": True}) as rt:
        ids = [f"news-{i}" for i in range(10)]
        for object_id in ids:
            await _dead_letter(rt, object_id)
        rt.env["fail"] = False
        source = RuntimeSource(rt)
        done: dict[str, bool] = {}

        async def act(object_id: str) -> None:
            done[object_id] = await getattr(source, action)(
                Mailer.namespace, object_id, "host", "bounce")

        async with trio.open_nursery() as nursery:
            for object_id in ids:
                nursery.start_soon(act, object_id)
        assert done == dict.fromkeys(ids, True)
        await run_until_idle(rt)
        for object_id in ids:
            assert await rt.get(Mailer, object_id).letters() == []


async def test_a_requeue_is_shipped_when_it_returns(pg_dsn: str) -> None:
    """PostgreSQL: the dead letter is gone from the database when the action returns
    (an action that only committed in the working copy left it to the ship loop)."""
    from pg_support import eventually, sql

    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn, env={"fail": True}) as rt:
            await rt.get(Mailer, "news").push("fail", id="bounce", retry=ONCE)

            async def letters_shipped() -> int:
                rows = sql(pg_dsn, "SELECT count(*) FROM nj_rows WHERE object_id = 'news'"
                                   " AND tbl = 'nj_dead_letters'")
                return int(rows[0][0])

            async def shipped() -> bool:
                return await letters_shipped() == 1

            await eventually(shipped)
            rt.env["fail"] = False
            source = RuntimeSource(rt)
            assert await source.discard(Mailer.namespace, "news", "host", "bounce") is True
            # (No await in between: the ship loop cannot have run.)
            assert await letters_shipped() == 0


async def _dashboard(rt: nj.Runtime) -> tuple[str, dict[str, str], dict[str, str]]:
    """The dashboard's address, a discard form of news's "bounce", its headers."""
    url = rt.http_url or ""
    _, _, page = await fetch(url, "/object?" + urlencode({"ns": Mailer.namespace,
                                                          "id": "news"}))
    found = re.search(r'name="token" value="([^"]+)"', page)
    assert found is not None
    form = {"ns": Mailer.namespace, "id": "news", "owner": "host", "job": "bounce",
            "token": found.group(1)}
    return url, form, {**FORM, "Origin": url.rstrip("/")}


async def _shipped_letters(pg_dsn: str, count: int) -> None:
    from pg_support import eventually, sql

    def shipped() -> bool:
        return sql(pg_dsn, "SELECT count(*) FROM nj_rows WHERE tbl = 'nj_dead_letters'") == [
            (count,)]

    await eventually(shipped)


def _take_over(pg_dsn: str, rt: nj.Runtime, object_id: str) -> None:
    """This host's lease on the object lapsed (paused past it: no longer trusted) and
    another live host took it; this host's renewal has not told yet."""
    from pg_support import sql

    rt.engine._leases.trusted[(Mailer.namespace, object_id)] = 0.0  # type: ignore[attr-defined]
    sql(pg_dsn, "UPDATE nj_objects SET owner = 'elsewhere:1:ab', epoch = epoch + 1,"
                " lease_until = now() + interval '1 minute' WHERE object_id = %s",
        (object_id,))


async def test_an_action_on_a_copy_whose_lease_was_taken_over_is_refused(
    pg_dsn: str,
) -> None:
    """PostgreSQL: the dashboard's action on an object another host took over while this
    host's copy was still resident answers 409, as for an object held elsewhere from the
    start, and writes nothing (it was a 500 "internal error", an ObjectFencedError
    traceback in the log); a batch action counts it as left and goes on with the rest
    (it stopped at it, with a 500)."""
    from pg_support import sql

    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn, http=LOOPBACK, http_writes=True,
                                   env={"fail": True}) as rt:
            for object_id in ("news", "other"):
                await rt.get(Mailer, object_id).push("fail", id="bounce", retry=ONCE)
            await _shipped_letters(pg_dsn, 2)
            rt.env["fail"] = False
            url, form, headers = await _dashboard(rt)

            _take_over(pg_dsn, rt, "news")
            status, _, text = await fetch(url, "/actions/discard", method="POST",
                                          body=urlencode(form).encode(), headers=headers)
            assert status == 409, text
            assert "another host" in text or "elsewhere:1:ab" in text, text
            assert sql(pg_dsn, "SELECT object_id FROM nj_rows WHERE tbl = 'nj_dead_letters'"
                               " ORDER BY 1") == [("news",), ("other",)]

            # news is resident again (this host took it back: "elsewhere" let it go), and
            # taken over again; a discard of every letter leaves it and discards "other".
            sql(pg_dsn, "UPDATE nj_objects SET owner = NULL, lease_until = NULL"
                        " WHERE object_id = 'news'")
            assert await rt.get(Mailer, "news").letters() == ["bounce"]
            _take_over(pg_dsn, rt, "news")
            status, answer, text = await fetch(
                url, "/actions/discard-matching", method="POST",
                body=urlencode({"token": form["token"], "q": ""}).encode(), headers=headers)
            assert status == 303, text
            assert "1 dead letter(s) discarded; 1 left" in unquote_plus(answer["location"])
            assert sql(pg_dsn, "SELECT object_id FROM nj_rows WHERE tbl = 'nj_dead_letters'"
                               " ORDER BY 1") == [("news",)]


async def test_an_action_whose_object_is_reset_while_it_waits_says_so(pg_dsn: str) -> None:
    """PostgreSQL: an action waits for the object's turn (a call holds it); meanwhile the
    renewal finds that another host took the object over, and it is dropped here. The
    action answers 503 with what happened, not a 500 "internal error" (an
    ObjectResetError traceback in the log); nothing is written."""
    from pg_support import eventually, sql

    Mailer.held, Mailer.release = trio.Event(), trio.Event()
    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn, http=LOOPBACK, http_writes=True, lease_ttl=1.0,
                                   env={"fail": True}) as rt:
            await rt.get(Mailer, "news").push("fail", id="bounce", retry=ONCE)
            await _shipped_letters(pg_dsn, 1)
            rt.env["fail"] = False
            url, form, headers = await _dashboard(rt)
            answers: list[tuple[int, str]] = []

            async def hold() -> None:
                with pytest.raises(nj.ObjectResetError):
                    await rt.get(Mailer, "news").hold()

            async def discard() -> None:
                status, _, text = await fetch(url, "/actions/discard", method="POST",
                                              body=urlencode(form).encode(), headers=headers)
                answers.append((status, text))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold)
                await Mailer.held.wait()
                nursery.start_soon(discard)
                host = rt._hosts[(Mailer.namespace, "news")]  # type: ignore[attr-defined]
                await eventually(lambda: host.turns.waiting)  # (it waits for the turn)
                sql(pg_dsn, "UPDATE nj_objects SET owner = 'elsewhere:1:ab',"
                            " epoch = epoch + 1, lease_until = now() + interval '1 minute'")
            ((status, text),) = answers
            assert status == 503, text
            assert "reset" in text and "news" in text, text
            assert sql(pg_dsn, "SELECT count(*) FROM nj_rows"
                               " WHERE tbl = 'nj_dead_letters'") == [(1,)]


class Moved(nj.DurableObject):
    """Its objects were stored under ``namespace``; then the namespace was pinned anew
    (the test does it): they are still served, by the class their recorded path names."""

    namespace = "tests.test_dashboard_actions.Moved.v1"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        raise ConnectionError("smtp down")


async def test_an_action_acts_on_the_object_of_the_namespace_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A namespace whose recorded class now names another namespace: the action acts on
    the object of the namespace the dashboard names (as its alarms and calls run
    there), not on a new object of the class's namespace (it created v2/news and
    answered "no dead letter")."""
    from nursery_jobs._core import _object

    old = Moved.namespace
    async with nj.open_runtime(tmp_path / "data") as rt:
        await rt.get(Moved, "news").push("fail", id="bounce", retry=ONCE)
        await run_until_idle(rt)
        monkeypatch.setattr(Moved, "namespace", "tests.test_dashboard_actions.Moved.v2")
        monkeypatch.delitem(_object._REGISTRY, old)
        source = RuntimeSource(rt)
        assert await source.discard(old, "news", "host", "bounce") is True
        assert (old, "news") in rt.active_objects()
        assert (Moved.namespace, "news") not in rt.active_objects()


async def test_an_action_is_not_admitted_on_a_copy_whose_lease_lapsed(pg_dsn: str) -> None:
    """PostgreSQL: as a call, an action starts on a copy only while its lease is known to
    hold (``Leases.admit``). Another host took the object while this host's lease had
    lapsed: the action never runs on the stale copy; the object is dropped here and
    routed again, and the operator is told which host holds it (it ran on the stale
    copy, and only the fence of its ship refused it: "another host took it over")."""
    from pg_support import sql

    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn, http=LOOPBACK, http_writes=True, lease_ttl=30.0,
                                   env={"fail": True}) as rt:
            await rt.get(Mailer, "news").push("fail", id="bounce", retry=ONCE)
            await _shipped_letters(pg_dsn, 1)
            url, form, headers = await _dashboard(rt)
            _take_over(pg_dsn, rt, "news")
            status, _, text = await fetch(url, "/actions/discard", method="POST",
                                          body=urlencode(form).encode(), headers=headers)
            assert status == 409, text
            assert "held by host elsewhere:1:ab" in text, text
            assert sql(pg_dsn, "SELECT count(*) FROM nj_rows"
                               " WHERE tbl = 'nj_dead_letters'") == [(1,)]


async def test_an_action_while_the_runtime_shuts_down_answers_503(tmp_path: Path) -> None:
    """An action that arrives as the runtime closes (the dashboard still serving) is
    refused with a 503 saying so, not a 500 "internal error"; nothing is written."""
    async with nj.open_runtime(tmp_path / "data", http=LOOPBACK, http_writes=True,
                               env={"fail": True}) as rt:
        await _dead_letter(rt, "news")
        url, form, headers = await _dashboard(rt)
        rt._closing = True  # type: ignore[attr-defined]  (as close() sets it first)
        try:
            for path, body in (("/actions/discard", form),
                               ("/actions/discard-matching", {"token": form["token"]})):
                status, _, text = await fetch(url, path, method="POST",
                                              body=urlencode(body).encode(), headers=headers)
                assert status == 503 and "shutting down" in text, (path, status, text)
        finally:
            rt._closing = False  # type: ignore[attr-defined]
        assert await rt.get(Mailer, "news").letters() == ["bounce"]
