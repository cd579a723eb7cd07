"""Storage faults are contained (issue 10, points 3-6): a catalog that is lost or
damaged is rebuilt from the object files; a damaged or missing object file is a typed
``StorageError`` naming the object and the file, quarantined, never recreated empty; a
file locked by another process fails fast and is retried with backoff; a full or
read-only disk is typed and backed off without a storm. Real files in ``tmp_path``.

Blocking calls are deliberate here: a foreign process, a mount or a damaged file is set
up while no task may run (under ``autojump_clock`` a task waiting on a subprocess would
let virtual time jump), and loops poll virtual time for an outcome.
"""
# ruff: noqa: ASYNC110, ASYNC221, ASYNC230, ASYNC240

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from conftest import EPOCH
from fault_seam import FaultPlan, faulty_engine, held_by_another_process

import nursery_jobs as nj
from nursery_jobs._engines.files._catalog import object_file_name
from nursery_jobs._errors import DataDirectoryAccessError, DataDirectoryError, StorageFaultError
from nursery_jobs._policy import LOCKED_RETRY

RAN: list[tuple[str, str, float]] = []


class Worker(nj.DurableObject):
    """A Lifecycle object whose jobs record when they ran."""

    namespace = "tests.faults.Worker"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self, completion_group=1)

    async def push(self, job_id: str, delay: float = 0.0) -> None:
        await self.lifecycle.jobs.push("work", delay=delay, id=job_id)

    async def put(self, key: str, value: Any) -> None:
        self.ctx.storage.put(key, value)

    async def read(self, key: str) -> Any:
        return self.ctx.storage.get(key)

    async def pragma(self, name: str) -> Any:
        return self.ctx.storage.execute(f"PRAGMA {name}").fetchone()[0]

    async def on_job(self, ctx: nj.JobContext) -> None:
        RAN.append((self.ctx.id, ctx.job.id, nj.now()))
        self.ctx.storage.put(f"done:{ctx.job.id}", nj.now())


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    RAN.clear()


def object_file(data: Path, object_id: str, cls: type[nj.DurableObject] = Worker) -> Path:
    return data / "objects" / object_file_name(cls.namespace, object_id)


async def events_of(rt: Any, kinds: set[str], into: list[nj.Event]) -> None:
    rt.events.add_listener(lambda e: into.append(e) if e.type in kinds else None)


# -- (3) the catalog: empty, deleted or damaged -------------------------------------------


def _damage_catalog(data: Path, how: str) -> None:
    catalog = data / "catalog.sqlite3"
    if how == "deleted":
        for suffix in ("", "-wal", "-shm"):
            (data / f"catalog.sqlite3{suffix}").unlink(missing_ok=True)
    elif how == "emptied":
        for suffix in ("-wal", "-shm"):
            (data / f"catalog.sqlite3{suffix}").unlink(missing_ok=True)
        catalog.write_bytes(b"")
    else:  # garbage over the header and the first pages
        size = catalog.stat().st_size
        with open(catalog, "r+b") as f:
            f.write(os.urandom(min(size, 8192)))
        for suffix in ("-wal", "-shm"):
            (data / f"catalog.sqlite3{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["deleted", "emptied", "damaged"])
async def test_a_lost_catalog_is_rebuilt_and_due_jobs_still_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, how: str
) -> None:
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").push("j1", delay=100)
        await rt.get(Worker, "b").push("j2", delay=50)
        await rt.get(Worker, "idle").put("k", 1)  # an object without jobs
    _damage_catalog(tmp_path, how)
    seen: list[nj.Event] = []
    async with nj.open_runtime(tmp_path) as rt:
        await events_of(rt, {"catalog:rebuilt"}, seen)
        with trio.fail_after(200):
            while len(RAN) < 2:
                await trio.sleep(1)
        assert RAN == [("b", "j2", EPOCH + 50), ("a", "j1", EPOCH + 100)]
        assert await rt.get(Worker, "idle").read("k") == 1
    (event,) = seen
    assert event.data["objects"] == 3 and event.data["alarms"] == 2
    if how == "damaged":
        assert event.data["reason"].startswith("damaged")
        assert Path(event.data["moved_to"]).exists()
        assert Path(event.data["moved_to"]).name.startswith("catalog.sqlite3.damaged-")


@pytest.mark.parametrize("page", [2, 5])
async def test_a_catalog_damaged_past_its_first_page_is_rebuilt(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, page: int
) -> None:
    """Issue 22 #6: a catalog whose first page is intact but a later one is not raised
    a raw ``sqlite3.DatabaseError`` from ``PRAGMA quick_check`` at every open. Rebuilt
    as a lost catalog is: objects and alarms back from the object files."""
    ids = [f"{i:02d}-" + "x" * 1000 for i in range(30)]  # ~30 KB of registry: many pages
    async with nj.open_runtime(tmp_path) as rt:
        for n, object_id in enumerate(ids):
            await rt.get(Worker, object_id).push(f"j{n}", delay=100 + n)
    catalog = tmp_path / "catalog.sqlite3"
    page_size = 4096
    assert catalog.stat().st_size >= 8 * page_size
    with open(catalog, "r+b") as f:  # zeros over one b-tree page's header
        f.seek((page - 1) * page_size)
        f.write(bytes(64))
    seen: list[nj.Event] = []
    async with nj.open_runtime(tmp_path) as rt:
        await events_of(rt, {"catalog:rebuilt"}, seen)
        with trio.fail_after(200):
            while len(RAN) < len(ids):
                await trio.sleep(1)
    assert RAN == [(object_id, f"j{n}", EPOCH + 100 + n) for n, object_id in enumerate(ids)]
    (event,) = seen
    assert event.data["reason"].startswith("damaged")
    assert (event.data["objects"], event.data["alarms"]) == (len(ids), len(ids))
    assert Path(event.data["moved_to"]).name.startswith("catalog.sqlite3.damaged-")


async def test_an_intact_catalog_is_not_rebuilt(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").push("j1", delay=100)
    seen: list[nj.Event] = []
    async with nj.open_runtime(tmp_path) as rt:
        await events_of(rt, {"catalog:rebuilt"}, seen)
        await trio.lowlevel.checkpoint()
    assert seen == []


async def test_a_catalog_damaged_while_running_never_kills_the_timer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    plan = FaultPlan(message="database disk image is malformed", enabled=False,
                     when=lambda label, sql, n: label == "the catalog" and "nj_alarms" in sql)
    seen: list[nj.Event] = []
    async with nj.open_runtime(faulty_engine(tmp_path, plan)) as rt:
        await events_of(rt, {"catalog:error"}, seen)
        await rt.get(Worker, "a").push("j1", delay=10)
        plan.enabled = True
        await trio.sleep(60)  # the timer keeps trying, with backoff, and lives
        plan.enabled = False
        with trio.fail_after(600):
            while not RAN:
                await trio.sleep(1)
    assert RAN[0][:2] == ("a", "j1")
    delays = [e.data["delay"] for e in seen]
    assert delays[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]  # one record per backoff step
    assert all(e.data["cause"] == "corrupt" for e in seen)


# -- (4) a damaged or missing object database ------------------------------------------


async def test_a_damaged_object_database_is_a_typed_error_and_quarantined(
    tmp_path: Path,
) -> None:
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").put("k", "precious")
        await rt.get(Worker, "other").put("k", "fine")
    path = object_file(tmp_path, "a")
    good = tmp_path / "good.sqlite3"
    shutil.copy(path, good)
    with open(path, "r+b") as f:
        f.write(b"this is not a database at all" * 10)
    seen: list[nj.Event] = []
    async with nj.open_runtime(tmp_path) as rt:
        await events_of(rt, {"object:quarantined"}, seen)
        with pytest.raises(nj.StorageError) as info:
            await rt.get(Worker, "a").read("k")
        assert "tests.faults.Worker/a" in str(info.value) and path.name in str(info.value)
        (event,) = seen
        moved = tmp_path / "objects" / "quarantine" / path.name
        assert event.object_id == "a" and event.data["moved_to"] == str(moved)
        assert moved.exists() and not path.exists()
        # Never a blank new object: still an error, that says where the file went.
        with pytest.raises(nj.StorageError, match="quarantine"):
            await rt.get(Worker, "a").read("k")
        assert not path.exists()
        assert await rt.get(Worker, "other").read("k") == "fine"
        # An operator restores the file: the object is back, with its data.
        shutil.copy(good, path)
        assert await rt.get(Worker, "a").read("k") == "precious"


async def test_a_quarantined_objects_alarm_is_kept_and_comes_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").push("j1", delay=10)
    path = object_file(tmp_path, "a")
    good = tmp_path / "good.sqlite3"
    shutil.copy(path, good)
    path.write_bytes(b"garbage" * 1000)
    retries: list[nj.Event] = []
    async with nj.open_runtime(tmp_path) as rt:
        await events_of(rt, {"alarm:retry"}, retries)
        await trio.sleep(3600)  # an hour of retries: never dropped
        assert RAN == []
        alarm = rt.engine.get_alarm(Worker.namespace, "a")
        assert alarm is not None and alarm[1] == len(retries) >= 8
        assert [e.data["delay"] for e in retries[:4]] == [2.0, 4.0, 8.0, 16.0]
        shutil.copy(good, path)
        with trio.fail_after(301):
            while not RAN:
                await trio.sleep(1)
    assert RAN[0][:2] == ("a", "j1")


async def test_damage_found_while_the_object_runs_answers_with_storage_error(
    tmp_path: Path,
) -> None:
    plan = FaultPlan(message="database disk image is malformed", enabled=False,
                     when=lambda label, sql, n: label.endswith("/a") and "nj_kv" in sql)
    seen: list[nj.Event] = []
    async with nj.open_runtime(faulty_engine(tmp_path, plan), idle_timeout=5) as rt:
        await events_of(rt, {"object:quarantined"}, seen)
        await rt.get(Worker, "a").put("k", 1)
        plan.enabled = True
        with pytest.raises(nj.StorageError, match="damaged"):
            await rt.get(Worker, "a").read("k")
        plan.enabled = False
        # Refused from here on (not only the statement that found it), until it leaves
        # memory and its file is moved aside.
        with pytest.raises(nj.StorageError, match="quarantine"):
            await rt.get(Worker, "a").put("k2", 2)
        assert seen == []
        await trio.sleep(6)  # evicted
        (event,) = seen
        assert event.object_id == "a"
        assert (tmp_path / "objects" / "quarantine" / object_file(tmp_path, "a").name).exists()


async def test_a_missing_object_file_is_a_fault_not_a_blank_object(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").put("k", "precious")
    path = object_file(tmp_path, "a")
    saved = tmp_path / "saved.sqlite3"
    os.replace(path, saved)
    async with nj.open_runtime(tmp_path) as rt:
        with pytest.raises(nj.StorageError, match="missing") as info:
            await rt.get(Worker, "a").read("k")
        assert path.name in str(info.value) and "tests.faults.Worker/a" in str(info.value)
        assert not path.exists()  # nothing was recreated
        os.replace(saved, path)
        assert await rt.get(Worker, "a").read("k") == "precious"


async def test_a_destroyed_object_starts_empty_again(tmp_path: Path) -> None:
    class Doomed(nj.DurableObject):
        namespace = "tests.faults.Doomed"

        async def put(self, v: int) -> None:
            self.ctx.storage.put("v", v)

        async def get(self) -> Any:
            return self.ctx.storage.get("v")

    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Doomed, "d").put(1)
        rt.engine.destroy_object(Doomed.namespace, "d")  # type: ignore[attr-defined]
    async with nj.open_runtime(tmp_path) as rt:
        assert await rt.get(Doomed, "d").get() is None


# -- (5) a foreign reader holding an object's file -----------------------------------------



async def test_a_file_held_by_another_process_fails_fast_with_the_real_cause(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").put("k", "v")
    with held_by_another_process(object_file(tmp_path, "a")) as release:
        async with nj.open_runtime(tmp_path) as rt:
            start = trio.current_time()
            with pytest.raises(nj.StorageError) as info:
                await rt.get(Worker, "a").read("k")
            # Retried in Trio sleeps (virtual time passes), never SQLite's inline wait.
            waits = [LOCKED_RETRY.delay(n) for n in range(4)]
            assert trio.current_time() - start == pytest.approx(sum(w or 0 for w in waits))
            text = str(info.value)
            assert "locked by another process" in text and "open-file limit" not in text
            assert "tests.faults.Worker/a" in text
            release()
            # Nothing of the failed open stayed behind holding the file.
            assert await rt.get(Worker, "a").read("k") == "v"
            assert await rt.get(Worker, "a").pragma("busy_timeout") == 0


async def test_an_alarm_of_a_locked_object_is_retried_until_it_is_free(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").push("j1", delay=10)
    with held_by_another_process(object_file(tmp_path, "a")) as release:
        retries: list[nj.Event] = []
        async with nj.open_runtime(tmp_path) as rt:
            await events_of(rt, {"alarm:retry"}, retries)
            await trio.sleep(20)
            assert RAN == [] and len(retries) >= 2
            assert "locked by another process" in retries[0].data["error"]
            release()
            with trio.fail_after(60):
                while not RAN:
                    await trio.sleep(1)


# -- (6) disk full, read-only -------------------------------------------------------------


async def test_disk_full_is_typed_and_backed_off_without_a_storm(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Every write of object "a" and every alarm write of the catalog fail: the disk is
    # full. Reads still work, as on a real full disk.
    def writes(label: str, sql: str, n: int) -> bool:
        head = sql.lstrip().split(None, 1)[0].upper()
        return (label.endswith("/a") or label == "the catalog") and head in (
            "INSERT", "UPDATE", "DELETE", "COMMIT", "REPLACE")  # (BEGIN writes nothing)

    plan = FaultPlan(message="database or disk is full", enabled=False, when=writes)
    async with nj.open_runtime(faulty_engine(tmp_path, plan)) as rt:
        await rt.get(Worker, "a").push("j1", delay=10)
        await rt.get(Worker, "b").push("j1", delay=10)
        plan.enabled = True
        with pytest.raises(nj.StorageError) as info:
            await rt.get(Worker, "a").put("k", "v")
        assert "tests.faults.Worker/a" in str(info.value) and "disk is full" in str(info.value)
        assert object_file(tmp_path, "a").name in str(info.value)
        caplog.clear()
        with trio.fail_after(200):
            await trio.sleep(130)
        # 2, 4, 8, 16, 32, 64 s of backoff from t=10: six runs, not thousands.
        runs = [r for r in RAN if r[0] == "a"]
        assert 4 <= len(runs) <= 7
        lines = [r for r in caplog.records if "Worker/a" in r.getMessage()]
        assert len(lines) <= 2 * len(runs) + 2
        plan.enabled = False
        with trio.fail_after(400):
            while await rt.get(Worker, "a").read("done:j1") is None:
                await trio.sleep(1)
    assert ("b", "j1", EPOCH + 10) in RAN  # the other object never noticed


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")


async def test_a_really_full_disk_is_a_typed_error_and_recovers(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt, "2m")
    try:
        data = mnt / "data"
        async with nj.open_runtime(data) as rt:
            await rt.get(Worker, "a").put("k", 1)
            filler = mnt / "filler"
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
            try:
                while os.write(fd, b"\1" * 4096):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
            with pytest.raises(nj.StorageError) as info:
                for n in range(1000):
                    await rt.get(Worker, "a").put(f"big{n}", "x" * 20_000)
            assert getattr(info.value, "cause", None) == "full"
            assert "disk is full" in str(info.value) and "Worker/a" in str(info.value)
            filler.unlink()
            await rt.get(Worker, "a").put("after", 2)
            assert await rt.get(Worker, "a").read("after") == 2
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_a_read_only_object_file_is_a_typed_error(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").put("k", 1)
    objects = tmp_path / "objects"
    bound = subprocess.run(["mount", "--bind", "-o", "ro", str(objects), str(objects)],
                           capture_output=True, text=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount read-only here: {bound.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(objects)], check=True)
        async with nj.open_runtime(tmp_path) as rt:
            with pytest.raises(nj.StorageError) as info:
                await rt.get(Worker, "a").put("k", 2)
            assert getattr(info.value, "cause", None) in ("readonly", "cantopen")
            assert "Worker/a" in str(info.value)
            assert "read-only" in str(info.value)
    finally:
        subprocess.run(["umount", str(objects)], check=False)
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "a").put("k", 3)
        assert await rt.get(Worker, "a").read("k") == 3


def _bind_read_only(path: Path) -> None:
    """Bind-mount ``path`` on itself, read-only (root; skips with the reason elsewhere).
    As root, chmod stops no write: a read-only mount is the one real refusal."""
    bound = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)],
                           capture_output=True, text=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount read-only here: {bound.stderr.strip()}")
    subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)


@pytest.mark.parametrize("state", ["fresh", "used"])
async def test_a_read_only_data_directory_is_a_typed_error_at_open(
    tmp_path: Path, state: str
) -> None:
    """Issue 22 #9: a raw ``OSError [Errno 30]`` on ``runtime.lock`` at open."""
    data = tmp_path / "data"
    data.mkdir()
    if state == "used":
        async with nj.open_runtime(data) as rt:
            await rt.get(Worker, "a").put("k", 1)
    _bind_read_only(data)
    try:
        with pytest.raises(nj.StorageError) as info:
            async with nj.open_runtime(data):
                pass
        error = info.value
        assert isinstance(error, DataDirectoryAccessError)
        assert isinstance(error, DataDirectoryError)
        assert error.cause == "readonly"
        assert str(data) in str(error) and "read-only" in str(error)
        assert error.path.startswith(str(data))
    finally:
        subprocess.run(["umount", str(data)], check=False)


async def test_a_new_object_in_a_read_only_directory_is_a_typed_error(tmp_path: Path) -> None:
    """Issue 22 #9: a raw ``sqlite3.OperationalError`` for an object whose file cannot
    be created; an existing one's error names the real cause."""
    async with nj.open_runtime(tmp_path) as rt:
        await rt.get(Worker, "old").put("k", 1)
    objects = tmp_path / "objects"
    _bind_read_only(objects)
    try:
        async with nj.open_runtime(tmp_path) as rt:
            for object_id in ("new", "old"):
                with pytest.raises(nj.StorageError) as info:
                    await rt.get(Worker, object_id).put("k", 2)
                error = info.value
                assert isinstance(error, StorageFaultError), repr(error)
                assert error.cause == "readonly", str(error)
                assert f"Worker/{object_id}" in str(error) and "read-only" in str(error)
                assert error.file == str(object_file(tmp_path, object_id))
    finally:
        subprocess.run(["umount", str(objects)], check=False)


READONLY_WORKER = Path(__file__).with_name("readonly_worker.py")


def _as_unprivileged(data: Path, step: str) -> list[dict[str, Any]]:
    """Run the read-only worker on ``data`` as a user who may not write it: ``nobody``
    when the tests run as root (setpriv), else this user."""
    cmd = [sys.executable, str(READONLY_WORKER), str(data), step]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: no user to be refused as")
        cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_permission_denied_is_named_as_such(tmp_path: Path) -> None:
    """Issue 22 #9: an existing object's database this process may not write was
    "disk I/O error"; the data directory's lock file a raw ``PermissionError``."""
    # A directory the unprivileged user can reach (pytest's tmp_path is root's alone).
    top = Path(tempfile.mkdtemp(prefix="nj-denied-"))
    try:
        top.chmod(0o755)
        data = top / "data"
        seeded = subprocess.run(
            [sys.executable, str(READONLY_WORKER), str(data), "objects"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
        assert seeded.returncode == 0, seeded.stderr
        if os.geteuid() == 0:
            # The runtime's own files become the user's; the objects stay root's.
            for path in (data, data / "runtime.lock", data / "flight.rec",
                         *data.glob("catalog.sqlite3*")):
                os.chown(path, 65534, 65534)
        (data / "objects").chmod(0o555)
        for file in (data / "objects").glob("*.sqlite3"):
            file.chmod(0o444)
        by_step = {r["step"]: r for r in _as_unprivileged(data, "objects")}
        assert by_step["open"]["type"] is None
        assert by_step["new"]["cause"] == "denied", by_step["new"]
        assert by_step["old"]["cause"] == "denied", by_step["old"]
        for step in ("new", "old"):
            assert "permission denied" in by_step[step]["message"]
            assert "StorageFaultError" in by_step[step]["mro"]
        (data / "runtime.lock").chmod(0o444)
        if os.geteuid() == 0:
            os.chown(data / "runtime.lock", 0, 0)
        (result,) = _as_unprivileged(data, "open")
        assert result["type"] == "DataDirectoryAccessError", result
        assert result["cause"] == "denied"
        assert result["path"] == str(data / "runtime.lock")
        assert "permission denied" in result["message"]
    finally:
        shutil.rmtree(top, ignore_errors=True)


# -- (11) memory at scale ------------------------------------------------------------------


def _soft_heap_limit() -> int:
    conn = sqlite3.connect(":memory:")
    try:
        return int(conn.execute("PRAGMA soft_heap_limit").fetchone()[0])
    finally:
        conn.close()


async def test_page_caches_are_bounded_per_object_and_in_all(tmp_path: Path) -> None:
    from nursery_jobs._engines.files._engine import OBJECT_CACHE_KIB, PAGE_CACHE_BUDGET

    before = _soft_heap_limit()
    async with nj.open_runtime(tmp_path) as rt:
        assert await rt.get(Worker, "a").pragma("cache_size") == -OBJECT_CACHE_KIB <= -1
        assert OBJECT_CACHE_KIB <= 1024
        assert 0 < _soft_heap_limit() <= PAGE_CACHE_BUDGET
    assert _soft_heap_limit() == before
