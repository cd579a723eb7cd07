"""Dashboard pages never hold the runtime's loop for long (issue 22, point 7): pages
that read every object read them in slices with a checkpoint between, and at most
``PAGE_BUILDS`` pages are built at once (more loads queue)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs import _clock
from nursery_jobs._ops import _slices, _sources, _web
from nursery_jobs._ops._slices import Sliced
from nursery_jobs._ops._sources import RuntimeSource

OBJECTS = 120
FAIL_ONCE = nj.RetryOptions(max_attempts=1)


class Shop(nj.DurableObject):
    namespace = "tests.test_dashboard_slices.Shop"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "fail":
            raise ConnectionError(f"declined {ctx.job.payload}")
        return None


def _scope(path: str, query: str = "") -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path,
            "query_string": query.encode(), "headers": [(b"host", b"127.0.0.1:1")]}


async def _nothing() -> dict[str, Any]:
    raise AssertionError("a GET reads no body")


@pytest.fixture(params=["files", "memory"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return tmp_path / "data" if request.param == "files" else None


async def _fill(rt: nj.Runtime) -> None:
    """``OBJECTS`` objects, each with a job due in an hour, every tenth with a dead
    letter; then most evicted (files), the last ten active."""
    for i in range(OBJECTS):
        shop = rt.get(Shop, f"shop-{i:03d}")
        await shop.push("renew", delay=3600)
        if i % 10 == 0:
            await shop.push("fail", payload=i, retry=FAIL_ONCE)
    await trio.sleep(5)  # (the failures ran; idle objects evicted)
    for i in range(OBJECTS - 10, OBJECTS):
        await rt.get(Shop, f"shop-{i:03d}").push("renew", id="again", delay=3600)


@pytest.mark.parametrize("path, query", [("/", ""), ("/", "only=dead&sort=due"),
                                         ("/metrics", ""), ("/dead-letters", ""),
                                         ("/api/dead-letters", "q=declined")])
async def test_a_page_over_every_object_lets_the_runtime_run_while_it_reads(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    location: Path | None, path: str, query: str,
) -> None:
    monkeypatch.setattr(_slices, "SLICE_SECONDS", 0.0)  # a checkpoint after each object
    async with nj.open_runtime(location, idle_timeout=1) as rt:
        await _fill(rt)
        app = _web.Dashboard(Sliced(RuntimeSource(rt)), clock=_clock.now)
        quiet = await app.handle(_scope(path, query), _nothing)
        assert quiet.status == 200
        reads: list[str] = []
        ran_between = 0
        building = True
        pushed_while_building = False

        async def meanwhile() -> None:
            # Another task: it runs between the page's reads, not only before and after.
            nonlocal ran_between
            while building:
                ran_between += bool(reads)
                await trio.lowlevel.checkpoint()

        async def push_meanwhile() -> None:
            # The runtime's own work (a push that activates an evicted object) lands
            # between two reads of the page.
            nonlocal pushed_while_building
            while len(reads) < 5:
                await trio.lowlevel.checkpoint()
            await rt.get(Shop, "shop-001").push("renew", id="meanwhile", delay=3600)
            pushed_while_building = building

        original = RuntimeSource._counts

        def counted(self: RuntimeSource, row: Any, now: float, **kw: Any) -> Any:
            reads.append(row.id)
            return original(self, row, now, **kw)

        monkeypatch.setattr(RuntimeSource, "_counts", counted)
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(meanwhile)
                nursery.start_soon(push_meanwhile)
                await trio.lowlevel.checkpoint()
                response = await app.handle(_scope(path, query), _nothing)
                building = False
        assert response.status == 200
        assert pushed_while_building
        assert len(reads) == OBJECTS  # every object read once
        # The other task ran between the reads, not only before and after the page.
        assert ran_between >= OBJECTS - 1
        if path == "/metrics":  # (process metrics move: the counts read from objects)
            dead = f'nursery_jobs_dead_letters{{namespace="{Shop.namespace}"}} 12.0'
            assert dead.encode() in response.body and dead.encode() in quiet.body
        elif path != "/":  # (the home page shows which objects are active)
            assert response.body == quiet.body
        if path.endswith("dead-letters"):
            assert response.body.count(b"declined") >= OBJECTS // 10


def _counting(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], set[Any], list[int]]:
    """Records each object read (its id), the tasks reading (until their load ends) and
    the most of them at once."""
    reads: list[str] = []
    building: set[Any] = set()
    most = [0]
    original = RuntimeSource._counts

    def counted(self: RuntimeSource, row: Any, now: float, **kw: Any) -> Any:
        reads.append(row.id)
        building.add(trio.lowlevel.current_task())
        most[0] = max(most[0], len(building))
        return original(self, row, now, **kw)

    monkeypatch.setattr(RuntimeSource, "_counts", counted)
    return reads, building, most


async def test_concurrent_page_loads_queue_for_two_builders(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(_slices, "SLICE_SECONDS", 0.0)
    async with nj.open_runtime(tmp_path / "data", idle_timeout=1) as rt:
        await _fill(rt)
        app = _web.Dashboard(Sliced(RuntimeSource(rt)), clock=_clock.now)
        reads, building, most = _counting(monkeypatch)
        statuses: list[int] = []

        async def load(path: str, query: str) -> None:
            response = await app.handle(_scope(path, query), _nothing)
            building.discard(trio.lowlevel.current_task())
            statuses.append(response.status)

        # Three kinds of read of every object (with strikes and letters; letters;
        # neither): without a bound, three would read at once.
        pages = [("/", "only=strikes"), ("/", ""), ("/metrics", ""),
                 ("/object", f"ns={Shop.namespace}&id=shop-001")]
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for k in range(24):
                    nursery.start_soon(load, *pages[k % 4])
        assert statuses == [200] * 24
        assert most[0] == _web.PAGE_BUILDS == 2
        assert app.limiter.borrowed_tokens == 0
        assert len(reads) == 3 * OBJECTS  # (each kind once: its loads came together)


async def test_loads_that_wait_share_the_next_read_of_every_object(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    location: Path | None,
) -> None:
    monkeypatch.setattr(_slices, "SLICE_SECONDS", 0.0)
    async with nj.open_runtime(location, idle_timeout=1) as rt:
        await _fill(rt)
        app = _web.Dashboard(Sliced(RuntimeSource(rt)), clock=_clock.now)
        reads, _, _ = _counting(monkeypatch)
        bodies: list[bytes] = []

        async def load() -> None:
            response = await app.handle(_scope("/dead-letters"), _nothing)
            assert response.status == 200
            bodies.append(response.body)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(load)
        assert len(reads) == OBJECTS  # one read of every object, for all 20
        assert len(bodies) == 20 and len(set(bodies)) == 1
        # A load made after that read ended reads again, and sees what changed since.
        await rt.get(Shop, "shop-005").push("fail", payload="late", retry=FAIL_ONCE)
        await trio.sleep(1)
        response = await app.handle(_scope("/dead-letters"), _nothing)
        assert len(reads) == 2 * OBJECTS
        assert b"declined late" in response.body and b"declined late" not in bodies[0]


async def test_the_stopped_directory_is_read_in_slices_too(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """``nursery-jobs serve``: the same pages, the same slices (offline source)."""
    async with nj.open_runtime(tmp_path / "data", idle_timeout=1) as rt:
        await _fill(rt)
    monkeypatch.setattr(_slices, "SLICE_SECONDS", 0.0)
    source = _sources.OfflineSource(tmp_path / "data")
    app = _web.Dashboard(Sliced(source), clock=_clock.now)
    ticks = 0
    building = True

    async def meanwhile() -> None:
        nonlocal ticks
        while building:
            ticks += 1
            await trio.lowlevel.checkpoint()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(meanwhile)
            response = await app.handle(_scope("/", "only=dead"), _nothing)
            building = False
    assert response.status == 200
    assert response.body.count(b'href="/object?ns=') >= OBJECTS // 10
    assert ticks >= OBJECTS


async def test_the_objects_api_reads_its_page_object_by_object_in_slices(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    location: Path | None,
) -> None:
    monkeypatch.setattr(_slices, "SLICE_SECONDS", 0.0)
    async with nj.open_runtime(location, idle_timeout=1) as rt:
        await _fill(rt)
        app = _web.Dashboard(Sliced(RuntimeSource(rt)), clock=_clock.now)
        quiet = await app.handle(_scope("/api/objects", "limit=500&jobs=5"), _nothing)
        details: list[str] = []
        original = RuntimeSource.detail

        def counted(self: RuntimeSource, namespace: str, object_id: str, *a: Any,
                    **kw: Any) -> Any:
            details.append(object_id)
            return original(self, namespace, object_id, *a, **kw)

        monkeypatch.setattr(RuntimeSource, "detail", counted)
        ran_between = 0
        building = True

        async def meanwhile() -> None:
            nonlocal ran_between
            while building:
                ran_between += bool(details)
                await trio.lowlevel.checkpoint()

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(meanwhile)
                response = await app.handle(_scope("/api/objects", "limit=500&jobs=5"),
                                            _nothing)
                building = False
        assert response.status == 200 and response.body == quiet.body
        assert len(details) == OBJECTS
        assert ran_between >= OBJECTS - 1
