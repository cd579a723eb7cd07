"""OpenTelemetry tracing (DESIGN.md §2, ``tracing=``): a span per stub call and per job
run with the object's attributes; a push stores the pushing span's context in the job
row, and the job's run span links to it (across PostgreSQL hosts too); a forwarded
call's span is a child of the caller's. Off by default: nothing is stored then.

The spans go to an ``InMemorySpanExporter`` through a ``SimpleSpanProcessor``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_support import eventually, sql

pytest.importorskip("opentelemetry.sdk")  # the otel extra; CI installs it (dev)

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import nursery_jobs as nj
from nursery_jobs._errors import MissingExtraError, TracingError
from nursery_jobs.testing import run_until_idle


class Traced:
    """A provider and the spans it finished."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self, name_prefix: str = "") -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(name_prefix)]

    def one(self, name_prefix: str) -> ReadableSpan:
        found = self.spans(name_prefix)
        assert len(found) == 1, [s.name for s in self.exporter.get_finished_spans()]
        return found[0]


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.provider.shutdown()


class Mailer(nj.DurableObject):
    namespace = "tests.tracing.Mailer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def send(self, job_id: str, fn: str = "mail", delay: float = 0.0) -> None:
        await self.lifecycle.jobs.push(fn, id=job_id, delay=delay,
                                       retry=nj.RetryOptions(max_attempts=2, jitter=False))

    async def traces(self) -> dict[str, Any]:
        rows = self.ctx.storage.execute("SELECT id, trace FROM nj_jobs").fetchall()
        return {job_id: text for job_id, text in rows}

    async def requeue(self, job_id: str) -> None:
        await self.lifecycle.requeue(job_id)

    async def set_trace(self, job_id: str, text: str) -> None:
        self.ctx.storage.execute("UPDATE nj_jobs SET trace = ? WHERE id = ?", [text, job_id])

    async def done(self) -> list[str]:
        return list(self.ctx.storage.get("done", []))

    async def on_job(self, ctx: nj.JobContext) -> None:
        if ctx.job.fn == "forever":
            await trio.sleep_forever()
        if ctx.job.fn == "broken":
            raise RuntimeError(f"attempt {ctx.attempt} broke")
        self.ctx.storage.put("done", [*self.ctx.storage.get("done", []), ctx.job.id])


def _context(span: ReadableSpan) -> trace.SpanContext:
    assert span.context is not None
    return span.context


# -- one runtime --------------------------------------------------------------------------
async def test_a_jobs_run_span_links_to_the_span_that_pushed_it(
    traced: Traced, autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(tracing=traced.provider) as rt:
        with traced.tracer.start_as_current_span("request") as request:
            await rt.get(Mailer, "m1").send("welcome", delay=5)
        await trio.sleep(5)
        await run_until_idle(rt)
        assert await rt.get(Mailer, "m1").done() == ["welcome"]
    call = [s for s in traced.spans() if s.attributes and
            s.attributes.get("nursery_jobs.method") == "send"]
    assert len(call) == 1
    run = traced.one("job mail")
    assert run.kind is SpanKind.CONSUMER
    assert dict(run.attributes or {}) == {
        "nursery_jobs.namespace": "tests.tracing.Mailer",
        "nursery_jobs.object": "m1",
        "nursery_jobs.job.id": "welcome",
        "nursery_jobs.job.fn": "mail",
        "nursery_jobs.job.owner": "host",
        "nursery_jobs.attempt": 1,
    }
    # The push ran inside the stub call's span, itself a child of "request": the run's
    # link names the call's span, in the request's trace.
    assert len(run.links) == 1
    linked = run.links[0].context
    assert linked.trace_id == request.get_span_context().trace_id
    assert linked.span_id == _context(call[0]).span_id
    assert run.status.status_code is StatusCode.UNSET


async def test_a_stub_call_makes_a_client_span_with_the_object(traced: Traced) -> None:
    async with nj.open_runtime(tracing=traced.provider) as rt:
        with traced.tracer.start_as_current_span("request") as request:
            await rt.get(Mailer, "m2").done()
    span = traced.one("tests.tracing.Mailer.done")
    assert span.kind is SpanKind.CLIENT
    assert dict(span.attributes or {}) == {
        "nursery_jobs.namespace": "tests.tracing.Mailer",
        "nursery_jobs.object": "m2",
        "nursery_jobs.method": "done",
    }
    assert span.parent is not None
    assert span.parent.span_id == request.get_span_context().span_id


async def test_a_failing_stub_call_span_records_the_error(traced: Traced) -> None:
    async with nj.open_runtime(tracing=traced.provider) as rt:
        with pytest.raises(nj.RpcError):
            await rt.get(Mailer, "m2")._private()
    span = traced.one("tests.tracing.Mailer._private")
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


async def test_a_failing_jobs_span_has_error_status_per_attempt(
    traced: Traced, autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(tracing=traced.provider) as rt:
        await rt.get(Mailer, "m3").send("bad", fn="broken")
        with trio.fail_after(100):
            await run_until_idle(rt)
            while len(traced.spans("job broken")) < 2:
                await trio.sleep(1)
                await run_until_idle(rt)
    runs = traced.spans("job broken")
    assert [r.attributes["nursery_jobs.attempt"] for r in runs if r.attributes] == [1, 2]
    for run in runs:
        assert run.status.status_code is StatusCode.ERROR
        attempt = (run.attributes or {})["nursery_jobs.attempt"]
        assert run.status.description == f"RuntimeError: attempt {attempt} broke"
        (event,) = run.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.type"] == "RuntimeError"
        # Every attempt links to the push, which was made in the stub call's span.
        assert len(run.links) == 1


async def test_a_push_stores_the_span_context_as_w3c_trace_context(traced: Traced) -> None:
    async with nj.open_runtime(tracing=traced.provider) as rt:
        m = rt.get(Mailer, "m4")
        await m.send("later", delay=3600)
        stored = (await m.traces())["later"]
    call = traced.one("tests.tracing.Mailer.send")
    ctx = _context(call)
    assert json.loads(stored) == {
        "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}",
    }


async def test_a_requeued_job_links_to_the_span_that_requeued_it(
    traced: Traced, autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(tracing=traced.provider) as rt:
        m = rt.get(Mailer, "m7")
        await m.send("bad", fn="broken")
        await trio.sleep(10)
        await run_until_idle(rt)
        assert "bad" not in await m.traces()  # a dead letter now
        with traced.tracer.start_as_current_span("operator") as operator:
            await m.requeue("bad")
        stored = json.loads((await m.traces())["bad"])
    assert stored["traceparent"].split("-")[1] == f"{operator.get_span_context().trace_id:032x}"


async def test_a_stored_trace_that_is_not_trace_context_leaves_the_run_unlinked(
    traced: Traced, autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(tracing=traced.provider) as rt:
        m = rt.get(Mailer, "m8")
        for job_id, text in [("a", "not json"), ("b", "[1, 2]"), ("c", '{"traceparent": 7}'),
                             ("d", '{"traceparent": "00-zz-zz-01"}'), ("e", "x" * 10_000)]:
            await m.send(job_id, delay=1)
            await m.set_trace(job_id, text)
        await trio.sleep(1)
        await run_until_idle(rt)
        assert sorted(await m.done()) == ["a", "b", "c", "d", "e"]
    runs = traced.spans("job mail")
    assert len(runs) == 5
    assert all(len(run.links) == 0 for run in runs)


async def test_a_run_cut_off_by_shutdown_is_marked_cancelled_not_failed(
    traced: Traced, autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(tracing=traced.provider, stop_on=()) as rt:
        await rt.get(Mailer, "m9").send("long", fn="forever")
        await trio.sleep(5)  # running, then the block ends: a graceful shutdown
    run = traced.one("job forever")
    assert run.status.status_code is StatusCode.UNSET
    assert (run.attributes or {})["nursery_jobs.cancelled"] is True
    assert len(run.events) == 0


@pytest.mark.parametrize("where", ["memory", "files"])
async def test_tracing_off_stores_no_trace_and_makes_no_span(
    traced: Traced, tmp_path: Path, where: str,
) -> None:
    location = None if where == "memory" else tmp_path / "data"
    with traced.tracer.start_as_current_span("request"):
        async with nj.open_runtime(location) as rt:
            m = rt.get(Mailer, "m5")
            await m.send("later", delay=3600)
            assert await m.traces() == {"later": None}
    assert [s.name for s in traced.spans()] == ["request"]


async def test_a_replaced_job_keeps_the_newest_pushs_context(traced: Traced) -> None:
    async with nj.open_runtime(tracing=traced.provider) as rt:
        m = rt.get(Mailer, "m6")
        with traced.tracer.start_as_current_span("first"):
            await m.send("same", delay=3600)
        with traced.tracer.start_as_current_span("second") as second:
            await m.send("same", delay=3600)
        stored = json.loads((await m.traces())["same"])
    assert stored["traceparent"].split("-")[1] == f"{second.get_span_context().trace_id:032x}"


class NotAProvider:
    get_tracer = "not callable"


@pytest.mark.parametrize("bad", [True, "otel", 1, object(), NotAProvider()])
async def test_bad_tracing_values_are_refused_before_anything_is_written(
    tmp_path: Path, bad: Any,
) -> None:
    location = tmp_path / "data"
    with pytest.raises(TracingError, match=r"^tracing must be an OpenTelemetry TracerProvider"):
        async with nj.open_runtime(location, tracing=bad):
            pass  # pragma: no cover
    assert issubclass(TracingError, TypeError) and issubclass(TracingError, nj.NurseryJobsError)
    assert not location.exists()


async def test_tracing_without_the_otel_extra_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, traced: Traced,
) -> None:
    for name in list(sys.modules):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails: not installed
    location = tmp_path / "data"
    with pytest.raises(MissingExtraError) as caught:
        async with nj.open_runtime(location, tracing=traced.provider):
            pass  # pragma: no cover
    message = str(caught.value)
    assert "\n" not in message
    assert "pip install 'nursery_jobs[otel]'" in message
    assert caught.value.extra == "otel"
    assert isinstance(caught.value, ImportError)
    assert not location.exists()


# -- PostgreSQL: two hosts ------------------------------------------------------------------
async def test_a_job_pushed_on_one_host_and_run_on_another_links_to_the_push(
    pg_dsn: str,
) -> None:
    pytest.importorskip("psycopg")
    from nursery_jobs._engines.postgres._engine import PostgresEngine

    a, b = Traced(), Traced()
    async with nj.open_runtime(PostgresEngine(pg_dsn), tracing=a.provider) as rt_a:
        with a.tracer.start_as_current_span("request on A") as request:
            await rt_a.get(Mailer, "pg1").send("cross", delay=1.0)
    # A stopped (its lease released, the row with its trace shipped); B claims the alarm.
    from nursery_jobs._engines.postgres._schema import TABLES_BY_NAME

    ((data,),) = sql(pg_dsn, "SELECT data FROM nj_rows WHERE tbl = 'nj_jobs' AND key = 'cross'")
    stored = json.loads(data)[TABLES_BY_NAME["nj_jobs"].columns.index("trace")]
    assert json.loads(stored)["traceparent"].split("-")[1] == (
        f"{request.get_span_context().trace_id:032x}")
    async with nj.open_runtime(PostgresEngine(pg_dsn), tracing=b.provider) as rt_b:
        async def ran() -> bool:
            return bool(b.spans("job mail"))

        await eventually(ran, 15)
        assert await rt_b.get(Mailer, "pg1").done() == ["cross"]
    run = b.one("job mail")
    assert run.attributes and run.attributes["nursery_jobs.object"] == "pg1"
    (link,) = run.links
    send = a.one("tests.tracing.Mailer.send")
    assert link.context.trace_id == request.get_span_context().trace_id
    assert link.context.span_id == _context(send).span_id
    a.provider.shutdown()
    b.provider.shutdown()


async def test_a_forwarded_calls_span_is_a_child_of_the_callers(pg_dsn: str) -> None:
    pytest.importorskip("psycopg")
    from nursery_jobs._engines.postgres._engine import PostgresEngine

    a, b = Traced(), Traced()
    async with nj.open_runtime(PostgresEngine(pg_dsn), tracing=a.provider) as rt_a, \
            nj.open_runtime(PostgresEngine(pg_dsn), tracing=b.provider) as rt_b:
        await rt_a.get(Mailer, "pg2").done()  # A holds it
        a.exporter.clear()
        with b.tracer.start_as_current_span("request on B") as request, trio.fail_after(10):
            await rt_b.get(Mailer, "pg2").done()
    client = b.one("tests.tracing.Mailer.done")
    assert client.kind is SpanKind.CLIENT
    served = a.one("tests.tracing.Mailer.done")
    assert served.kind is SpanKind.SERVER
    assert dict(served.attributes or {}) == {
        "nursery_jobs.namespace": "tests.tracing.Mailer",
        "nursery_jobs.object": "pg2",
        "nursery_jobs.method": "done",
    }
    assert served.parent is not None
    assert _context(served).trace_id == request.get_span_context().trace_id
    assert served.parent.span_id == _context(client).span_id
    a.provider.shutdown()
    b.provider.shutdown()
