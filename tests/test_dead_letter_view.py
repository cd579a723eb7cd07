"""/dead-letters and /api/dead-letters: every object's dead letters in one view, newest
first, searched by object id, job id, function or error text, paginated; requeue and
discard of every letter that matches (only with writes), on every engine."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

import pytest
import trio
from conftest import engine
from test_dashboard import fetch

import nursery_jobs as nj
from nursery_jobs.testing import run_until_idle

LOOPBACK = ("127.0.0.1", 0)
ONCE = nj.RetryOptions(max_attempts=1)
FORM = "application/x-www-form-urlencoded"


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


class Account(nj.DurableObject):
    namespace = "tests.test_dead_letter_view.Account"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if (self.ctx.env or {}).get("fail", True) and ctx.job.fn != "later":
            raise RuntimeError(str(ctx.job.payload))
        self.ctx.storage.put(f"ran:{ctx.job.id}", True)
        return None

    async def dead(self) -> list[str]:
        return [d.job.id for d in self.lifecycle.dead_letters()]


async def api(url: str, **query: Any) -> dict[str, Any]:
    status, _, text = await fetch(url, "/api/dead-letters?" + urlencode(query))
    assert status == 200, text
    found: dict[str, Any] = json.loads(text)
    return found


async def settled(url: str, total: int) -> None:
    """Until the view shows ``total`` letters (PostgreSQL: an object's commits reach the
    database within the engine's ship interval)."""
    with trio.fail_after(10):
        while True:
            if (await api(url))["total"] == total:
                return
            await trio.sleep(0.02)


async def fill(rt: nj.Runtime) -> None:
    """120 accounts, each with a job for later; 5 dead letters of a timeout on user-2,
    -10, -20, -30, -40 and one of an exceeded quota on user-110 (the newest)."""
    for n in range(120):
        await rt.get(Account, f"user-{n}").push("later", id="later", delay=3600)
    for n in (2, 10, 20, 30, 40):
        await rt.get(Account, f"user-{n}").push("charge", id=f"c{n}", retry=ONCE,
                                                 payload="upstream timeout")
        await run_until_idle(rt)
        await trio.sleep(0.01)  # (distinct times: newest first is an order)
    await rt.get(Account, "user-110").push("refund", id="r1", retry=ONCE,
                                           payload="quota exceeded for account 110")
    await run_until_idle(rt)


async def test_the_view_finds_one_letter_among_every_objects(tmp_path: Any) -> None:
    async with nj.open_runtime(engine.location, http=LOOPBACK) as rt:
        url = rt.http_url or ""
        await fill(rt)
        await settled(url, 6)

        everything = await api(url)
        assert [(x["object_id"], x["id"]) for x in everything["letters"]] == [
            ("user-110", "r1"), ("user-40", "c40"), ("user-30", "c30"), ("user-20", "c20"),
            ("user-10", "c10"), ("user-2", "c2")]
        (one,) = (await api(url, q="QUOTA"))["letters"]
        assert (one["namespace"], one["object_id"], one["owner"], one["id"], one["fn"]) == (
            Account.namespace, "user-110", "host", "r1", "refund")
        assert one["error"] == "RuntimeError: quota exceeded for account 110"
        assert one["attempts"] == 1
        assert [x["id"] for x in (await api(url, q="user-2"))["letters"]] == ["c20", "c2"]
        assert [x["id"] for x in (await api(url, q="c10"))["letters"]] == ["c10"]
        assert (await api(url, q="charge"))["total"] == 5
        assert (await api(url, q="nowhere"))["letters"] == []
        second = await api(url, q="timeout", limit=2, page=2)
        assert second["total"] == 5 and [x["id"] for x in second["letters"]] == ["c20", "c10"]

        status, _, page = await fetch(url, "/dead-letters?" + urlencode({"q": "quota"}))
        assert status == 200
        assert "user-110" in page and "quota exceeded for account 110" in page
        assert "user-40" not in page and "token" not in page  # (read-only: no forms)
        _, _, home = await fetch(url, "/")
        assert "user-110" in home and 'href="/dead-letters"' in home


async def test_requeue_and_discard_of_every_match(tmp_path: Any) -> None:
    async with nj.open_runtime(engine.location, http=LOOPBACK, http_writes=True,
                               env={"fail": True}) as rt:
        url = rt.http_url or ""
        origin = url.rstrip("/")
        await fill(rt)
        await settled(url, 6)
        _, _, page = await fetch(url, "/dead-letters?q=timeout")
        token = re.search(r'name="token" value="([^"]+)"', page)
        assert token is not None and "Requeue all 5 matching" in page

        form = urlencode({"q": "timeout", "token": "forged"}).encode()
        status, _, text = await fetch(url, "/actions/requeue-matching", method="POST",
                                      body=form, headers={"Content-Type": FORM,
                                                          "Origin": origin})
        assert status == 403 and "token" in text
        assert (await api(url))["total"] == 6  # nothing was written

        rt.env["fail"] = False  # the upstream is back: requeue every timeout
        form = urlencode({"q": "timeout", "token": token.group(1)}).encode()
        status, headers, _ = await fetch(url, "/actions/requeue-matching", method="POST",
                                         body=form, headers={"Content-Type": FORM,
                                                             "Origin": origin})
        assert status == 303
        assert headers["location"].startswith("/dead-letters?")
        assert "5+dead+letter" in headers["location"]
        await run_until_idle(rt)
        for n in (2, 10, 20, 30, 40):
            assert await rt.get(Account, f"user-{n}").dead() == []
        await settled(url, 1)
        assert await rt.get(Account, "user-110").dead() == ["r1"]

        form = urlencode({"q": "", "token": token.group(1)}).encode()
        status, _, _ = await fetch(url, "/actions/discard-matching", method="POST", body=form,
                                   headers={"Content-Type": FORM, "Origin": origin})
        assert status == 303
        assert await rt.get(Account, "user-110").dead() == []
        await settled(url, 0)


async def test_hostile_text_is_shown_escaped_and_bad_arguments_refused() -> None:
    async with nj.open_runtime(engine.location, http=LOOPBACK) as rt:
        url = rt.http_url or ""
        await rt.get(Account, "evil<b>").push("charge", id="x\x1b[31m", retry=ONCE,
                                             payload="<script>alert(1)</script>\n\\'")
        await run_until_idle(rt)
        await settled(url, 1)
        status, _, page = await fetch(url, "/dead-letters?" + urlencode({"q": "<script>"}))
        assert status == 200
        assert "<script>" not in page and "evil<b>" not in page and "\x1b" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;\\n\\\\&#x27;" in page
        assert "evil&lt;b&gt;" in page and "x\\x1b[31m" in page
        for query in ("page=x", "limit=abc"):
            status, _, text = await fetch(url, f"/api/dead-letters?{query}")
            assert status == 400 and "must be an integer" in text
