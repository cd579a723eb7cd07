"""The dashboard's object list: filters by state (running, failing, paused, with dead
letters, with strikes), columns sorted on request with ids in natural order, and header
cards that link to their filter, on every engine."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
from conftest import engine
from test_dashboard import fetch

import nursery_jobs as nj
from nursery_jobs._jobs._table import PAUSED_ALL as PAUSED_KEY
from nursery_jobs._ops._listing import natural_key
from nursery_jobs._ops._queries import STRIKES_KEY
from nursery_jobs.testing import run_until_idle

LOOPBACK = ("127.0.0.1", 0)
HELD = trio.Event()


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


class User(nj.DurableObject):
    namespace = "tests.test_object_list.User"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def mark(self, key: str) -> None:
        """What pause (another branch) and the breaker write: a row in nj_meta."""
        self.lifecycle.store.set_meta(key, 1)

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "fail":
            raise ConnectionError("down")
        if ctx.job.fn == "hold":
            await HELD.wait()
        return None


def listed(page: str) -> list[str]:
    """The object ids of the page's object table, in order."""
    table = page.split("<h2>Objects", 1)[1].split("</section>", 1)[0]
    return re.findall(r'href="/object\?ns=[^"]*?id=([^"&]+)"', table)


def test_ids_sort_naturally() -> None:
    ids = ["user-10", "user-2", "user-1", "user-0", "b", "user-02x", "a10", "a9"]
    assert sorted(ids, key=natural_key) == [
        "a9", "a10", "b", "user-0", "user-1", "user-2", "user-02x", "user-10"]


async def test_filters_sorts_and_cards() -> None:
    global HELD
    HELD = trio.Event()
    async with nj.open_runtime(engine.location, http=LOOPBACK) as rt:
        url = rt.http_url or ""
        for n in range(13):
            await rt.get(User, f"user-{n}").push("later", id="later", delay=3600)
        await rt.get(User, "user-3").push("fail", id="f", retry=nj.RetryOptions(max_attempts=1))
        await rt.get(User, "user-10").push("fail", id="f", retry=nj.RetryOptions(
            max_attempts=5, base_delay=3600.0, jitter=False))
        await rt.get(User, "user-11").mark(PAUSED_KEY)
        await rt.get(User, "user-12").mark(STRIKES_KEY)
        await run_until_idle(rt)
        await rt.get(User, "user-2").push("hold", id="h")

        async def page(query: str) -> str:
            status, _, text = await fetch(url, "/?" + query)
            assert status == 200, text
            return text

        with trio.fail_after(10):  # (PostgreSQL: commits and flights ship within 50 ms)
            while True:
                if listed(await page("only=running")) == ["user-2"] and listed(
                        await page("only=paused")) == ["user-11"]:
                    break
                await trio.sleep(0.05)
        assert listed(await page("only=failing")) == ["user-10"]
        assert listed(await page("only=dead")) == ["user-3"]
        assert listed(await page("only=strikes")) == ["user-12"]

        everything = listed(await page(""))
        assert everything == [f"user-{n}" for n in range(13)]  # natural order
        assert listed(await page("sort=id&desc=1"))[:3] == ["user-12", "user-11", "user-10"]
        assert listed(await page("sort=dead&desc=1"))[0] == "user-3"
        assert listed(await page("sort=attempts&desc=1"))[0] == "user-10"
        assert listed(await page("limit=5&page=3")) == ["user-10", "user-11", "user-12"]

        home = await page("")
        for label, link in (("running jobs", "/?only=running"), ("failing jobs", "/?only=failing"),
                            ("dead letters", "/dead-letters"), ("paused objects", "/?only=paused"),
                            ("alarms due now", "/?only=due")):
            card = re.search(rf'<a class="card" href="{re.escape(link)}"><div class="n">'
                             rf'([\d,]+)</div><div class="l">{label}</div></a>', home)
            assert card is not None, label
        assert re.search(r'href="/\?only=running"><div class="n">1</div>', home)
        assert re.search(r'href="/dead-letters"><div class="n">1</div>', home)
        assert 'href="/?sort=dead&amp;desc=1"' not in home  # (ascending first)
        assert 'href="/?sort=dead"' in home

        for query, name in (("only=sleepy", "only"), ("sort=colour", "sort")):
            status, _, text = await fetch(url, "/?" + query)
            assert status == 400 and text.startswith(f"{name} must be one of")
        HELD.set()
        await run_until_idle(rt)
