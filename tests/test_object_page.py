"""An object's dashboard page as an investigation starts there: each job's state in words
(running for how long and which attempt, due in / due ago), schedules in words instead of
their stored envelope (in /api and ``inspect --json`` too), a failed job's recent attempts
with their errors, and event data escaped once, on every engine."""

from __future__ import annotations

import json
import re
import sys
from typing import Any
from urllib.parse import urlencode

import pytest
import trio
from conftest import engine
from test_dashboard import fetch

import nursery_jobs as nj
from nursery_jobs.testing import run_until_idle

LOOPBACK = ("127.0.0.1", 0)
SLOW = nj.RetryOptions(max_attempts=4, base_delay=3600.0, max_delay=3600.0, jitter=False)
HELD: dict[str, trio.Event] = {}


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


class Shop(nj.DurableObject):
    namespace = "tests.test_object_page.Shop"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.scheduler = nj.Scheduler({"tick": self._tick})
        self.lifecycle = nj.Lifecycle.install(self).use(self.scheduler)

    async def _tick(self, payload: Any, schedule: Any) -> None:
        pass

    async def plan(self) -> None:
        await self.scheduler.every(10, "tick", {"shop": 1}, id="heartbeat")
        await self.scheduler.schedule("0 9 * * *", "tick", id="morning", tz="Europe/Berlin")

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "charge":
            raise ConnectionError(f"gateway said 'no' (\"{ctx.job.payload}\")")
        if ctx.job.fn == "hold":
            await HELD[ctx.job.id].wait()
        return None


async def test_the_page_says_what_each_job_is_doing() -> None:
    async with nj.open_runtime(engine.location, http=LOOPBACK) as rt:
        url = rt.http_url or ""
        shop = rt.get(Shop, "shop-1")
        await shop.plan()
        await shop.push("charge", id="card", retry=SLOW, payload="r2")
        await run_until_idle(rt)
        HELD["long"] = trio.Event()
        # Past its hung_timeout: the slow-dispatch warning does not hide how long it runs.
        await shop.push("hold", id="long", hung_timeout=1.0)
        await trio.sleep(1.2)  # running for a second

        query = urlencode({"ns": Shop.namespace, "id": "shop-1"})

        async def page() -> str:
            status, _, text = await fetch(url, f"/object?{query}")
            assert status == 200
            return text

        with trio.fail_after(10):  # (PostgreSQL: the flight list ships every ≤ 20 ms)
            while True:
                text = await page()
                if "attempt 1 of 3" in text:
                    break
                await trio.sleep(0.05)
        assert re.search(r"running 1\.\d s</span> <span class=\"muted\">attempt 1 of 3", text)
        assert "every 10 s, next " in text
        assert "cron 0 9 * * * Europe/Berlin, next " in text
        assert "&#x27;k&#x27;" not in text and "interval&#x27;" not in text  # no envelope
        # The failed job: due again in an hour, its attempt with the error.
        assert "due in 1 h" in text and "retry: attempt 2 of 4" in text
        assert "#1</td>" in text
        assert "ConnectionError: gateway said &#x27;no&#x27; (&quot;r2&quot;)" in text

        _, _, body = await fetch(url, f"/api/object?{query}")
        entry = json.loads(body)
        by_id = {job["id"]: job for job in entry["jobs"]}
        assert by_id["heartbeat"]["schedule"].startswith("every 10 s, next ")
        assert by_id["heartbeat"]["payload"] == "{'shop': 1}"
        assert by_id["morning"]["schedule"].startswith("cron 0 9 * * * Europe/Berlin, next ")
        assert by_id["card"]["schedule"] is None
        (failure,) = by_id["card"]["failures"]
        assert failure["attempt"] == 1
        assert failure["error"] == "ConnectionError: gateway said 'no' (\"r2\")"
        assert entry["paused"] == []  # (the paused owners: none)

        if engine.name != "postgres":  # (a host's recent events: its own recorder)
            _, _, home = await fetch(url, "/")
            assert "\\\\" not in home  # a repr's backslashes, not escaped again
            assert "delay=3600," in home
        HELD["long"].set()
        await run_until_idle(rt)


async def test_inspect_json_says_schedules_in_words(tmp_path: Any) -> None:
    engine.skip_on("memory", "inspect reads a stored location")
    location = engine.durable(tmp_path)
    async with nj.open_runtime(location) as rt:
        await rt.get(Shop, "shop-1").plan()
    proc = await trio.run_process(
        [sys.executable, "-m", "nursery_jobs.cli", "inspect", str(location), "--json"],
        capture_stdout=True,
        capture_stderr=True, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (obj,) = report["objects"]
    words = sorted(job["schedule"].split(", next")[0] for job in obj["jobs"])
    assert words == ["cron 0 9 * * * Europe/Berlin", "every 10 s"]
