"""The engine seam: which engine a location opens, unknown addresses, the object
database schema version and its migration from release 0.1."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs._engines._schema import SCHEMA_VERSION
from nursery_jobs._engines.files._catalog import object_file_name

V0_1 = Path(__file__).parent / "data" / "v0_1"  # written by release 0.1 (commit 855ebe7)


@pytest.mark.parametrize(
    "address", ["s3://bucket/jobs", "redis://127.0.0.1:6379/0", "file://./data", "x-y+z://h"]
)
async def test_an_address_no_engine_serves_is_refused_and_creates_nothing(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(nj.EngineError, match="no engine") as caught:
        async with nj.open_runtime(address):
            pytest.fail("opened")  # pragma: no cover
    assert isinstance(caught.value, ValueError)
    assert address.split("://")[0] in str(caught.value)
    assert os.listdir(tmp_path) == []


async def test_a_plain_relative_path_is_still_a_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with nj.open_runtime("data/with:colon") as rt:
        # Made absolute at open: a later chdir does not move the data directory.
        assert rt.path.is_absolute()
        assert rt.path.resolve() == (tmp_path / "data" / "with:colon").resolve()
    assert (tmp_path / "data" / "with:colon" / "catalog.sqlite3").exists()


async def test_a_non_engine_object_is_refused() -> None:
    with pytest.raises(nj.EngineError, match="path, None or an Engine"):
        async with nj.open_runtime(42):  # type: ignore[arg-type]
            pass  # pragma: no cover


# -- the schema version ------------------------------------------------------------------


class Shop(nj.DurableObject):
    """The object of the 0.1 data directory: a Queue and one host job."""

    namespace = "tests.migration.Shop"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.shipped: list[Any] = ctx.env
        self.queue = nj.Queue({"ship": self.ship})
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def ship(self, payload: Any, item: nj.QueueItem) -> None:
        self.shipped.append((item.id, payload, item.priority))

    async def items(self) -> list[nj.QueueItem]:
        return self.queue.list()

    async def host_jobs(self) -> list[nj.Job]:
        return self.lifecycle.jobs.list()

    async def greeting(self) -> Any:
        return self.ctx.storage.get("greeting")


def _copy_v0_1(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(V0_1, data)
    return data


def _object_file(data: Path) -> Path:
    return data / "objects" / object_file_name(Shop.namespace, "s1")


async def test_a_database_written_by_release_0_1_is_migrated_in_place(tmp_path: Path) -> None:
    data = _copy_v0_1(tmp_path)
    raw = sqlite3.connect(_object_file(data))
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 0
    encoded = dict(raw.execute("SELECT id, time FROM nj_jobs").fetchall())
    raw.close()
    assert encoded["urgent"] < -1e11  # 0.1 folded priority into the time

    shipped: list[Any] = []
    with trio.fail_after(30):
        async with nj.open_runtime(data, env=shipped) as rt:
            shop = rt.get(Shop, "s1")
            items = {item.id: item for item in await shop.items()}
            # Real due times (when each was queued) and the priority as a column. (The
            # due alarm may have taken its turn first: what it shipped counts too.)
            priorities = {i: item.priority for i, item in items.items()}
            assert {**{i: p for i, _, p in shipped}, **priorities} == {
                "urgent": 7, "normal": 0, "low": -5}
            for item in items.values():
                assert 1.79e9 < item.created_at <= nj.now()
            assert [j.id for j in await shop.host_jobs()] == ["host-later"]
            assert await shop.greeting() == "hello"
            alarm = rt.engine.get_alarm(Shop.namespace, "s1")
            assert alarm is not None and alarm[0] > 1.79e9  # a real time, not -1e12
            await trio.sleep(1)  # the migrated items are due: the alarm runs them
    assert shipped == [("urgent", {"n": 3}, 7), ("normal", {"n": 2}, 0), ("low", {"n": 1}, -5)]
    raw = sqlite3.connect(_object_file(data))
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        # What is left (the host job, unless its time has come and, with no on_job, it
        # was dropped) holds a real due time.
        assert raw.execute("SELECT COUNT(*) FROM nj_jobs WHERE time < 1.79e9").fetchone() == (0,)
    finally:
        raw.close()


async def test_a_database_of_a_newer_schema_is_refused_and_not_written(tmp_path: Path) -> None:
    data = _copy_v0_1(tmp_path)
    file = _object_file(data)
    raw = sqlite3.connect(file)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    before = hashlib.sha256(file.read_bytes()).hexdigest()
    mtime = os.stat(file).st_mtime_ns
    async with nj.open_runtime(data, env=[]) as rt:
        with pytest.raises(nj.StorageError, match="newer than this") as caught:
            await rt.get(Shop, "s1").greeting()
        assert "tests.migration.Shop/s1" in str(caught.value)
    assert hashlib.sha256(file.read_bytes()).hexdigest() == before
    assert os.stat(file).st_mtime_ns == mtime


async def test_every_new_object_database_carries_the_schema_version(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path, env=[]) as rt:
        assert await rt.get(Shop, "fresh").items() == []
    raw = sqlite3.connect(tmp_path / "objects" / object_file_name(Shop.namespace, "fresh"))
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        raw.close()


async def test_a_database_of_schema_2_gains_the_columns_of_3_and_keeps_its_jobs(
    tmp_path: Path,
) -> None:
    async with nj.open_runtime(tmp_path, env=[]) as rt:
        shop = rt.get(Shop, "v2")
        await shop.items()
        await rt.get(Shop, "v2").call("items")
    file = tmp_path / "objects" / object_file_name(Shop.namespace, "v2")
    raw = sqlite3.connect(file)
    raw.execute(
        "INSERT INTO nj_jobs (id, owner, fn, time, payload, max_attempts, base_delay,"
        " max_delay, jitter, singleflight, hung_timeout, exclusive, recovery_loop, created_at)"
        " VALUES ('host-later', 'host', 'later', 4e9, NULL, 3, 0.1, 3.0, 1, 0, 30.0, 0, 0, 1.8e9)"
    )
    for column in ("timeout", "give_up_on", "trace"):
        raw.execute(f"ALTER TABLE nj_jobs DROP COLUMN {column}")
    raw.execute("DROP TABLE nj_attempts")
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    async with nj.open_runtime(tmp_path, env=[]) as rt:
        [job] = await rt.get(Shop, "v2").host_jobs()
        assert (job.id, job.timeout, job.retry.give_up_on) == ("host-later", None, ())
    raw = sqlite3.connect(file)
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        columns = {row[1] for row in raw.execute("PRAGMA table_info(nj_jobs)")}
        assert {"timeout", "give_up_on", "trace"} <= columns
        assert raw.execute("SELECT COUNT(*) FROM nj_attempts").fetchone() == (0,)
    finally:
        raw.close()
