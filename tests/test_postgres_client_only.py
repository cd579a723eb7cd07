"""``open_runtime(client_only=True)`` (DESIGN section 2 and 9): a runtime that holds no
object and claims no alarm, forwarding every call to a host; hosts claim the alarms of
namespaces they can resolve to a class only. Calls across hosts copy through the same
codec as local calls. Real time (PostgreSQL I/O runs in threads), short waits."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from pg_support import eventually

psycopg = pytest.importorskip("psycopg")  # the postgres extra; CI installs it (dev)

import nursery_jobs as nj
from nursery_jobs._engines.postgres import _alarms as pg_alarms
from nursery_jobs._errors import CallCodecError


class Tally(nj.DurableObject):
    namespace = "tests.pg_client.Tally"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)
        self.state: dict[str, Any] = {"items": [1]}

    async def increment(self, by: int = 1) -> int:
        value = int(self.ctx.storage.get("n", 0)) + by
        self.ctx.storage.put("n", value)
        return value

    async def host_of(self) -> Any:
        return self.ctx.env

    async def get_state(self) -> dict[str, Any]:
        return self.state

    async def push(self, job_id: str, delay: float) -> nj.Job:
        return await self.lifecycle.jobs.push("tick", id=job_id, delay=delay,
                                              retry=nj.RetryOptions(max_attempts=2))

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ctx.storage.put("ran", [*self.ctx.storage.get("ran", []), ctx.job.id])

    async def ran(self) -> list[str]:
        return list(self.ctx.storage.get("ran", []))

    async def unencodable(self) -> Any:
        return {"fn": print}


def _rows(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.mark.parametrize("location", [None, "data"])
async def test_client_only_is_refused_for_memory_and_data_directories(
    location: str | None, tmp_path: Any
) -> None:
    where = None if location is None else str(tmp_path / location)
    with pytest.raises(nj.EngineError, match="client_only") as info:
        async with nj.open_runtime(where, client_only=True):
            pass  # pragma: no cover
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "data").exists()  # nothing written
    with pytest.raises(TypeError, match="client_only"):
        async with nj.open_runtime(None, client_only="yes"):  # type: ignore[arg-type]
            pass  # pragma: no cover


async def test_a_client_only_runtimes_calls_are_served_by_a_host(pg_dsn: str) -> None:
    with trio.fail_after(30):
        async with nj.open_runtime(pg_dsn, env="host", stop_on=()) as host, \
                nj.open_runtime(pg_dsn, env="client", client_only=True, stop_on=()) as client:
            stub = client.get(Tally, "t")
            assert await stub.increment(2) == 2  # nobody held it: the host took it
            assert await stub.host_of() == "host"
            assert await host.get(Tally, "t").increment() == 3
            assert client.active_objects() == [] and client.statistics().active_objects == 0
            assert host.active_objects() == [("tests.pg_client.Tally", "t")]
            (owner,) = _rows(pg_dsn, "SELECT owner FROM nj_objects WHERE object_id = 't'")[0]
            assert owner == host.engine.host_id
            # The client is no host: no host row, so nobody sends it calls.
            hosts = [r[0] for r in _rows(pg_dsn, "SELECT host_id FROM nj_hosts")]
            assert hosts == [host.engine.host_id]
            # Across hosts too, arguments and results are copies through the codec.
            got = await stub.get_state()
            got["items"].append(2)
            assert await stub.get_state() == {"items": [1]}
            job = await stub.push("j", 3600)
            assert isinstance(job, nj.Job) and job.retry == nj.RetryOptions(max_attempts=2)
            with pytest.raises(nj.CodecError) as refused:
                await stub.increment(lambda: 1)  # refused at the client: nothing sent
            assert isinstance(refused.value, CallCodecError)
            assert refused.value.part == "args[0]"
            with pytest.raises(nj.CodecError) as refused:
                await stub.unencodable()  # refused at the host, raised at the client
            assert isinstance(refused.value, CallCodecError)
            assert refused.value.part == "result"


async def test_a_client_only_runtime_without_a_host_raises_rpc_error(pg_dsn: str) -> None:
    with trio.fail_after(30):
        async with nj.open_runtime(pg_dsn, client_only=True, stop_on=()) as client:
            with pytest.raises(nj.RpcError, match="no host is running"):
                await client.get(Tally, "t").increment()
    assert _rows(pg_dsn, "SELECT * FROM nj_objects") == []


async def test_a_client_only_runtime_never_claims_alarms(pg_dsn: str) -> None:
    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn, env="first", stop_on=()) as first:
            await first.get(Tally, "t").push("due", 0.3)
        # The host is gone (its lease released); the job is due in 0.3 s.
        async with nj.open_runtime(pg_dsn, client_only=True, stop_on=()):
            await trio.sleep(2.5)  # past the alarm and two claim polls
            rows = _rows(pg_dsn, "SELECT owner, alarm_time FROM nj_objects")
            assert [owner for owner, _ in rows] == [None]
        async with nj.open_runtime(pg_dsn, env="second", stop_on=()) as second:
            stub = second.get(Tally, "t")

            async def ran() -> bool:
                return await stub.ran() == ["due"]

            await eventually(ran)


async def test_a_host_never_claims_alarms_of_a_namespace_it_cannot_resolve(
    pg_dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_alarms, "POLL_INTERVAL", 0.2)
    with trio.fail_after(60):
        async with nj.open_runtime(pg_dsn, stop_on=()) as first:
            await first.get(Tally, "t").push("due", 0.5)
        # Objects of a namespace no process here defines, with due alarms.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO nj_namespaces VALUES ('tests.pg_client.Ghost',"
                         " 'tests_nowhere_to_be_found:Ghost')")
            for object_id in ("g1", "g2", "g3"):
                conn.execute(
                    "INSERT INTO nj_objects (namespace, object_id, class_path, created_at,"
                    " alarm_time) VALUES ('tests.pg_client.Ghost', %s,"
                    " 'tests_nowhere_to_be_found:Ghost', 0, 1)", (object_id,))
        caplog.set_level(logging.INFO, logger="nursery_jobs")
        async with nj.open_runtime(pg_dsn, stop_on=()) as host:
            stub = host.get(Tally, "t")

            async def ran() -> bool:
                return await stub.ran() == ["due"]

            await eventually(ran)  # the alarm of a namespace it serves is claimed
            await trio.sleep(1.5)  # several claim polls more
            ghosts = _rows(pg_dsn, "SELECT owner, epoch, alarm_time, alarm_retry FROM"
                           " nj_objects WHERE namespace = 'tests.pg_client.Ghost'")
            assert ghosts == [(None, 0, 1.0, 0)] * 3  # never taken, alarm untouched
            assert host.active_objects() == [("tests.pg_client.Tally", "t")]
    about_ghosts = [r.getMessage() for r in caplog.records if "Ghost" in r.getMessage()]
    assert len(about_ghosts) == 1, about_ghosts
    assert "no class is registered" in about_ghosts[0]
    assert not any("retrying in" in r.getMessage() for r in caplog.records)
