"""Safety promises under hostile input (DESIGN 2, 5, 7, 10): a typed error naming what is
wrong and nothing written; payloads of every kind the codec takes shown by the operator
faces; a tampered row read back as a typed error of its job, never a stall; a running
job recorded whatever its (valid) ids.

Findings are strict xfails whose reason says what is wrong."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import trio
from test_dashboard import LOOPBACK, fetch

import nursery_jobs as nj
from nursery_jobs._codec import decode_payload
from nursery_jobs._engines.files._catalog import object_file_name

BAD_TEXT = "\ud800"  # a lone surrogate: no engine can store it (DESIGN 2)


class Host(nj.DurableObject):
    namespace = "review.safety.Host"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def on_job(self, ctx: nj.JobContext) -> None:
        RAN.append(ctx.job.id)

    async def push(self, job_id: str, payload: Any = None, delay: float = 1.0) -> None:
        await self.lifecycle.jobs.push("f", id=job_id, payload=payload, delay=delay)

    async def job_ids(self) -> list[str]:
        return [job.id for job in self.lifecycle.jobs.list()]

    async def ping(self) -> str:
        return "pong"

    async def letters(self) -> list[tuple[str, str, str]]:
        return [(d.job.id, d.reason, d.error) for d in self.lifecycle.dead_letters()]

    async def requeue(self, job_id: str) -> str:
        try:
            await self.lifecycle.requeue(job_id)
        except nj.NurseryJobsError as exc:
            return type(exc).__name__
        return "requeued"

    async def attempt(self, case: str) -> tuple[str, bool, bool, int, bool]:
        """Run one hostile call: (error type, is NurseryJobsError, is ValueError or
        TypeError, jobs stored after, whether the alarm moved)."""
        before = self.ctx.storage.get_alarm()
        try:
            result = CASES[case](self)
            if hasattr(result, "__await__"):
                await result
        except Exception as exc:
            kind = type(exc).__name__
            typed = isinstance(exc, nj.NurseryJobsError)
            argument = isinstance(exc, (ValueError, TypeError))
        else:
            kind, typed, argument = "no error", False, False
        moved = self.ctx.storage.get_alarm() != before
        return (kind, typed, argument,
                len(self.lifecycle.jobs.list()) + len(self.ctx.storage.list()), moved)


RAN: list[str] = []


class NoOffset(dt.tzinfo):
    """A tzinfo whose utcoffset is not implemented (the base class's)."""


class TooFar(dt.tzinfo):
    def utcoffset(self, when: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(hours=30)


NO_OFFSET = NoOffset()  # type: ignore[abstract]
TOO_FAR = TooFar()  # type: ignore[abstract]

CASES: dict[str, Any] = {
    "fn a lone surrogate": lambda h: h.lifecycle.jobs.push(BAD_TEXT),
    "payload datetime, tzinfo without utcoffset": lambda h: h.lifecycle.jobs.push(
        "f", payload=dt.datetime(2030, 1, 1, tzinfo=NO_OFFSET)),
    "payload datetime, tzinfo 30 h off": lambda h: h.lifecycle.jobs.push(
        "f", payload={"when": dt.datetime(2030, 1, 1, tzinfo=TOO_FAR)}),
    "storage value datetime, tzinfo without utcoffset": lambda h: h.ctx.storage.put(
        "k", [dt.datetime(2030, 1, 1, tzinfo=NO_OFFSET)]),
    "storage list prefix an int": lambda h: h.ctx.storage.list(5),
}


@pytest.fixture(params=["memory", "files"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "data"


@pytest.mark.parametrize("case", [
    "fn a lone surrogate",
    "payload datetime, tzinfo without utcoffset",
    "payload datetime, tzinfo 30 h off",
    "storage value datetime, tzinfo without utcoffset",
    "storage list prefix an int",
])
async def test_a_hostile_argument_is_a_typed_error_that_moves_nothing(
    location: Path | None, case: str
) -> None:
    with trio.fail_after(20):
        async with nj.open_runtime(location) as rt:
            kind, typed, argument, stored, moved = await rt.get(Host, "h").attempt(case)
    assert (kind, typed, argument) == (kind, True, True), f"{case}: {kind}"
    assert stored == 0 and not moved, f"{case}: wrote something"


# -- names that become stored text: namespaces, capability ids, callback names ----------------


def _declare(namespace: object) -> type[nj.DurableObject]:
    async def ping(self: nj.DurableObject) -> int:
        self.ctx.storage.put("k", 1)
        return 1

    return type("Named", (nj.DurableObject,), {"namespace": namespace, "ping": ping})


@pytest.mark.parametrize("namespace", ["a" + BAD_TEXT, "a\x00b", 5],
                         ids=["lone surrogate", "NUL", "an int"])
async def test_a_namespace_no_engine_can_store_is_refused_with_a_typed_error(
    location: Path | None, namespace: object
) -> None:
    with pytest.raises(nj.NurseryJobsError):
        cls = _declare(namespace)
        async with nj.open_runtime(location) as rt:
            await rt.get(cls, "o").ping()


class Queued(nj.DurableObject):
    namespace = "review.safety.Queued"
    callback = "a"
    queue_id = "queue"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.queue = nj.Queue({self.callback: lambda payload, item: None}, id=self.queue_id)
        self.lifecycle = nj.Lifecycle.install(self).use(self.queue)

    async def push(self) -> tuple[str, bool, int, bool]:
        before = self.ctx.storage.get_alarm()
        try:
            await self.queue.push(self.callback)
        except Exception as exc:
            kind, typed = type(exc).__name__, isinstance(exc, nj.NurseryJobsError)
        else:
            kind, typed = "no error", False
        return kind, typed, len(self.queue.list()), self.ctx.storage.get_alarm() != before


async def test_a_queue_callback_name_no_engine_can_store_is_refused(
    location: Path | None
) -> None:
    cls = type("BadCallback", (Queued,), {"namespace": "review.safety.BadCallback",
                                          "callback": BAD_TEXT})
    async with nj.open_runtime(location) as rt:
        try:
            kind, typed, stored, moved = await rt.get(cls, "q").push()
        except nj.CapabilityError:
            return  # refused at Queue(...): the fix
    assert typed, kind
    assert stored == 0 and not moved


async def test_a_capability_id_no_engine_can_store_is_refused(location: Path | None) -> None:
    cls = type("BadOwner", (Queued,), {"namespace": "review.safety.BadOwner",
                                       "queue_id": "queue" + BAD_TEXT})
    async with nj.open_runtime(location) as rt:
        with pytest.raises(nj.CapabilityError):
            await rt.get(cls, "q").push()


# -- what the operator faces show --------------------------------------------------------------


async def test_the_dashboard_shows_a_job_whose_payload_is_a_huge_int(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path / "data", http=LOOPBACK) as rt:
        await rt.get(Host, "big").push("j", payload={"n": [10**5000]}, delay=1000)
        assert await rt.get(Host, "big").job_ids() == ["j"]  # stored and read back
        url = rt.http_url or ""
        one = urlencode({"ns": Host.namespace, "id": "big"})
        for path in (f"/object?{one}", f"/api/object?{one}",
                     f"/api/objects?{urlencode({'ns': Host.namespace})}", "/"):
            status, _, _ = await fetch(url, path)
            assert status == 200, path


# -- rows tampered in the database -------------------------------------------------------------


async def _tampered(data: Path, statement: str) -> None:
    """Two jobs due in 1 s on ``review.safety.Host/t`` ('poisoned' and 'healthy'), then
    ``statement`` run on the object's file with the runtime closed."""
    RAN.clear()
    async with nj.open_runtime(data) as rt:
        await rt.get(Host, "t").push("poisoned", payload={"a": 1})
        await rt.get(Host, "t").push("healthy", payload={"b": 2})
    conn = sqlite3.connect(data / "objects" / object_file_name(Host.namespace, "t"))
    with conn:
        conn.execute(statement)
    conn.close()


FORGED_TAG = """UPDATE nj_jobs SET payload = '{"$t":"nope","v":1}' WHERE id = 'poisoned'"""


async def test_a_forged_payload_is_never_more_than_a_codec_error(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Holds: a record tag naming an unregistered class, a pickle-looking blob and
    malformed tags decode to CodecError, never to an object built from the text."""
    for text in ('{"$t":"record","n":"os.system","v":{}}',
                 '{"$t":"record","n":"builtins.eval","v":{"source":"1"}}',
                 "\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01.",
                 '{"$t":"pattern","v":"a","flags":true}',
                 '{"$t":"datetime","v":"2030-01-01T00:00:00","z":"../../../etc/passwd"}',
                 '{"$t":"set","v":[[1]]}'):
        with pytest.raises(nj.CodecError):
            decode_payload(text)
    await _tampered(tmp_path / "data", FORGED_TAG)
    async with nj.open_runtime(tmp_path / "data") as rt:
        with pytest.raises(nj.CodecError):
            await rt.get(Host, "t").job_ids()
        assert await rt.get(Host, "t").ping() == "pong"  # the object itself still serves


async def test_a_job_row_that_does_not_decode_blocks_only_itself(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _tampered(tmp_path / "data", FORGED_TAG)
    async with nj.open_runtime(tmp_path / "data") as rt:
        with rt.events.subscribe() as events:
            await trio.sleep(120)
            assert "healthy" in RAN
            damaged = [e for e in _drain(events) if e.type == "job:damaged"]
        assert [(e.object_id, e.data["id"]) for e in damaged] == [("t", "poisoned")]
        letters = await rt.get(Host, "t").letters()
        assert [(id, reason) for id, reason, _ in letters] == [("poisoned", "damaged")]
        assert "unknown tag" in letters[0][2]
        assert await rt.get(Host, "t").requeue("poisoned") == "JobError"  # payload lost
        assert await rt.get(Host, "t").job_ids() == []


def _drain(events: trio.MemoryReceiveChannel[nj.Event]) -> list[nj.Event]:
    got = []
    while True:
        try:
            got.append(events.receive_nowait())
        except trio.WouldBlock:
            return got


async def test_a_stored_payload_that_does_not_decode_names_its_job(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _tampered(tmp_path / "data", FORGED_TAG)
    async with nj.open_runtime(tmp_path / "data") as rt:
        with pytest.raises(nj.CodecError, match="poisoned"):
            await rt.get(Host, "t").job_ids()


async def test_the_dashboard_home_survives_one_object_with_a_damaged_job_row(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await _tampered(tmp_path / "data",
                    "UPDATE nj_jobs SET time = 'soon' WHERE id = 'poisoned'")
    with trio.fail_after(20):
        async with nj.open_runtime(tmp_path / "data", http=LOOPBACK) as rt:
            await rt.get(Host, "other").push("fine", delay=1000)
            await trio.sleep(5)  # the damaged object's alarm is due, and its run reads the row
            status, _, page = await fetch(rt.http_url or "", "/")
            assert status == 200
            assert "other" in page


# -- the running job is recorded whatever its ids ---------------------------------------------

WORKER = textwrap.dedent("""
    import os, signal, sys
    import trio
    import nursery_jobs as nj

    class Host(nj.DurableObject):
        namespace = "review.safety.Host"
        def __init__(self, ctx):
            super().__init__(ctx)
            self.lifecycle = nj.Lifecycle.install(self)
        async def push(self, job_id):
            await self.lifecycle.jobs.push("f", id=job_id)
        async def on_job(self, ctx):
            os.kill(os.getpid(), signal.SIGKILL)

    async def main(data, object_id, job_id):
        async with nj.open_runtime(data, stop_on=()) as rt:
            await rt.get(Host, object_id).push(job_id)
            await trio.sleep(60)

    trio.run(main, sys.argv[1], sys.argv[2].encode().decode("unicode_escape"),
             sys.argv[3].encode().decode("unicode_escape"))
""")
EMOJI_1024 = "\\U0001f600" * 1024  # 1024 characters, 4096 bytes of UTF-8


@pytest.mark.crash
@pytest.mark.parametrize("layout", ["files", "shared"])
@pytest.mark.parametrize(("object_id", "job_id"), [
    ("o", "j"),
    (EMOJI_1024, "j"),
    ("o", EMOJI_1024),
], ids=["short ids", "long object id", "long job id"])
async def test_a_job_that_kills_its_process_gets_a_crash_strike_whatever_its_ids(
    tmp_path: Path, object_id: str, job_id: str, layout: str
) -> None:
    """An id too long for a flight slot is recorded as its digest, resolved on reading."""
    data = f"shared:{tmp_path / 'data'}" if layout == "shared" else str(tmp_path / "data")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(Path(nj.__file__).parents[1])}
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, str(script), str(data), object_id, job_id], env=env,
            capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    real_object_id = object_id.encode().decode("unicode_escape")
    RAN.clear()
    with trio.fail_after(30):
        async with nj.open_runtime(data) as rt:
            with rt.events.subscribe() as events:
                await rt.get(Host, real_object_id).ping()  # recovery runs at activation
                struck = False
                with trio.move_on_after(3):
                    async for event in events:
                        if event.type == "job:crash_strike":
                            struck = True
                            break
    assert struck, "no job:crash_strike"
    assert RAN == []  # delayed by the strike, not run again at once


async def test_inspect_names_a_job_whose_time_is_no_number(tmp_path: Path) -> None:
    """Read offline (the object not active: nothing set the row aside yet), the object
    is shown damaged naming the job, not a traceback."""
    await _tampered(tmp_path / "data", "UPDATE nj_jobs SET time = 'soon' WHERE id = 'poisoned'")
    env = {**os.environ, "PYTHONPATH": str(Path(nj.__file__).parents[1])}
    done = await trio.run_process(
        [sys.executable, "-m", "nursery_jobs.cli", "inspect", str(tmp_path / "data")],
        env=env, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "damaged: job 'poisoned'" in done.stdout.decode()
