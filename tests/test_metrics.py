"""/metrics as Prometheus reads it, on every engine: prometheus_client's own parser finds
every family typed (no ``unknown``), gauges count every object's dead letters, due and
running jobs (not only the active objects'), histograms carry the namespace, and the
process and build families are there."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from conftest import engine
from prometheus_client.parser import text_string_to_metric_families
from test_dashboard import fetch

import nursery_jobs as nj
from nursery_jobs.testing import run_until_idle


# Every test of this suite runs on every engine (see conftest.ENGINES).
@pytest.fixture(autouse=True)
def _on_every_engine(on_every_engine: str) -> str:
    return on_every_engine


LOOPBACK = ("127.0.0.1", 0)
ONCE = nj.RetryOptions(max_attempts=1)


class Sender(nj.DurableObject):
    namespace = "tests.test_metrics.Sender"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "fail":
            raise ConnectionError(f"refused {ctx.job.id}")
        if ctx.job.fn == "hold":
            await HELD[ctx.job.id].wait()
        return None


HELD: dict[str, trio.Event] = {}


def families(text: str) -> dict[str, Any]:
    found = {f.name: f for f in text_string_to_metric_families(text)}
    untyped = sorted(name for name, f in found.items() if f.type in ("unknown", "untyped"))
    assert not untyped, f"families without a type: {untyped}"
    return found


def value(family: Any, **labels: str) -> float:
    name = family.name + ("_total" if family.type == "counter" else "")
    (sample,) = [s for s in family.samples
                 if s.name == name and all(s.labels.get(k) == v
                                                  for k, v in labels.items())]
    return float(sample.value)


async def scrape(url: str) -> dict[str, Any]:
    status, headers, text = await fetch(url, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    return families(text)


async def test_every_family_is_typed_and_the_gauges_count_every_object() -> None:
    ns = Sender.namespace
    async with nj.open_runtime(engine.location, http=LOOPBACK) as rt:
        assert rt.http_url is not None
        empty = await scrape(rt.http_url)
        assert "process_cpu_seconds" in empty and "process_resident_memory_bytes" in empty
        assert value(empty["nursery_jobs_build_info"], version=nj.__version__) == 1

        for n in range(4):
            sender = rt.get(Sender, f"s-{n}")
            for k in range(n):  # s-1: 1 dead letter, s-2: 2, s-3: 3
                await sender.push("fail", id=f"f{k}", retry=ONCE)
            await sender.push("send", id="later", delay=3600)
        await run_until_idle(rt)
        HELD["h"] = trio.Event()
        await rt.get(Sender, "s-0").push("hold", id="h")

        async def counted() -> dict[str, Any]:
            found = await scrape(rt.http_url or "")
            if value(found["nursery_jobs_running_jobs"], namespace=ns) < 1:
                return {}
            if value(found["nursery_jobs_dead_letters"], namespace=ns) < 6:
                return {}  # (PostgreSQL: an object's commits reach the database in 50 ms)
            return found

        with trio.fail_after(10):
            while True:
                m = await counted()
                if m:
                    break
                await trio.sleep(0.02)
        assert value(m["nursery_jobs_dead_letters"], namespace=ns) == 6
        assert value(m["nursery_jobs_running_jobs"], namespace=ns) == 1
        assert value(m["nursery_jobs_due_jobs"], namespace=ns) == 0
        assert value(m["nursery_jobs_paused_objects"], namespace=ns) == 0
        assert value(m["nursery_jobs_objects"], namespace=ns) == 4
        assert value(m["nursery_jobs_jobs_failed"], namespace=ns, owner="host") == 6
        assert value(m["nursery_jobs_jobs_retried"], namespace=ns, owner="host") == 0
        duration = m["nursery_jobs_dispatch_duration_seconds"]
        (count,) = [s for s in duration.samples if s.name.endswith("_count")]
        assert count.labels == {"namespace": ns} and count.value == 6
        assert m["nursery_jobs_jobs_dispatched"].type == "counter"
        assert m["nursery_jobs_alarm_lateness_seconds"].type == "histogram"
        HELD["h"].set()
        await run_until_idle(rt)


async def test_the_gauges_count_objects_that_are_not_in_memory(tmp_path: Any) -> None:
    engine.skip_on("memory", "a memory runtime's objects are gone once it closes")
    location = engine.durable(tmp_path)
    async with nj.open_runtime(location) as rt:
        for n in range(3):
            await rt.get(Sender, f"s-{n}").push("fail", id="f", retry=ONCE)
        await rt.get(Sender, "s-0").push("send", id="due-later", delay=60)
        await run_until_idle(rt)
    # A fresh runtime: no object is active, every count comes from storage.
    async with nj.open_runtime(location, http=LOOPBACK) as rt:
        assert rt.http_url is not None
        m = await scrape(rt.http_url)
        assert value(m["nursery_jobs_dead_letters"], namespace=Sender.namespace) == 3
        assert value(m["nursery_jobs_due_jobs"], namespace=Sender.namespace) == 0
        assert value(m["nursery_jobs_active_objects"], namespace=Sender.namespace) == 0


async def test_serve_exposes_metrics_of_a_stopped_directory(tmp_path: Any) -> None:
    engine.skip_on("memory", "serve reads a data directory")
    engine.skip_on("postgres", "the PostgreSQL source is the one a host's dashboard reads")
    from nursery_jobs._ops._sources import OfflineSource
    from nursery_jobs._ops._web import serve_offline

    async with nj.open_runtime(tmp_path / "data") as rt:
        await rt.get(Sender, "s").push("fail", id="f", retry=ONCE)
        await run_until_idle(rt)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_offline, OfflineSource(tmp_path / "data"), LOOPBACK)
        m = await scrape(url)
        assert value(m["nursery_jobs_dead_letters"], namespace=Sender.namespace) == 1
        assert "nursery_jobs_jobs_dispatched" not in m  # (no runtime: no counters)
        nursery.cancel_scope.cancel()
