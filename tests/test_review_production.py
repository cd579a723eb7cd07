"""Review of what a deploy relies on (DESIGN sections 2, 3, 9 and 10): stopping by
signal, namespaces that survive another way of starting the script, the PostgreSQL
engine's hand-over at a graceful stop, and the operator faces' answers to hostile
arguments. Real subprocesses where a real signal or a real ``python`` start matters.

A test marked ``xfail(strict=True)`` is a finding of the review: the promise it names
does not hold yet."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import trio

import nursery_jobs as nj

ROOT = Path(__file__).parents[1]

# A host of one object with one job "long": it prints ``start <attempt>``, sleeps
# ENV seconds (``done`` after), and when cancelled prints ``cleaning`` and cleans up in
# a bounded shielded scope (STYLE habit 7: what a job that closes a connection does).
# ``python worker.py LOCATION push|wait SECONDS CLEANUP``; lines: up, start N,
# cleaning, done, exited.
WORKER = textwrap.dedent('''
    import sys

    import trio

    import nursery_jobs as nj

    DONE = trio.Event()


    class Long(nj.DurableObject):
        namespace = "review.Long"

        def __init__(self, ctx):
            super().__init__(ctx)
            self.lifecycle = nj.Lifecycle.install(self)

        async def push(self):
            await self.lifecycle.jobs.push("long", id="long")

        async def on_job(self, ctx):
            print(f"start {ctx.attempt}", flush=True)
            seconds, cleanup = self.ctx.env
            try:
                await trio.sleep(seconds)
            except trio.Cancelled:
                print("cleaning", flush=True)
                with trio.move_on_after(cleanup, shield=True):
                    await trio.sleep(cleanup)
                raise
            print("done", flush=True)
            DONE.set()


    async def main(location, mode, seconds, cleanup):
        env = (float(seconds), float(cleanup))
        async with nj.open_runtime(location, env=env, lease_ttl=LEASE_TTL) as rt:
            if mode == "push":
                await rt.get(Long, "l").push()
            print("up", flush=True)
            with trio.move_on_after(float(seconds) + 30):
                await DONE.wait()
        print("exited", flush=True)


    LEASE_TTL = None if not sys.argv[1].startswith("postgresql") else 30.0

    if __name__ == "__main__":
        trio.run(main, *sys.argv[1:5])
''')


def _env(cwd: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")])}


class Proc:
    """A worker process whose stdout lines a thread reads: wait for one with a deadline."""

    def __init__(self, cwd: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=cwd, env=_env(cwd),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        stdout = self.proc.stdout
        assert stdout is not None
        self.reader = threading.Thread(target=self._read, args=(stdout,), daemon=True)
        self.reader.start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self.lines.put(line.strip())

    def expect(self, line: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                got = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise AssertionError(f"no {line!r} within {timeout} s") from None
            if got == line:
                return

    def finish(self, timeout: float) -> tuple[int, str]:
        """Exit status and stderr."""
        assert self.proc.stderr is not None
        err = self.proc.stderr.read() if self.proc.wait(timeout=timeout) is not None else ""
        return self.proc.returncode, err

    def kill(self) -> None:
        """Kill it if it still runs; close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "worker.py").write_text(WORKER)
    yield tmp_path


# -- Stopping (DESIGN section 2; section 3, "a graceful shutdown is no failure") ---------

@pytest.mark.crash
def test_a_second_sigterm_while_jobs_wind_down_is_still_a_graceful_stop(
    worker: Path,
) -> None:
    """A supervisor that repeats SIGTERM (or a user who presses twice): the runtime is
    still open while its jobs wind down, so the signal is still a graceful stop: exit 0,
    and the job runs again at once on the next start, as attempt 1."""
    data = str(worker / "data")
    first = Proc(worker, "worker.py", data, "push", "60", "2")
    try:
        first.expect("up", 30)
        first.expect("start 1", 30)
        first.proc.send_signal(signal.SIGTERM)
        first.expect("cleaning", 10)
        first.proc.send_signal(signal.SIGTERM)
        code, err = first.finish(30)
    finally:
        first.kill()
    assert code == 0, err
    second = Proc(worker, "worker.py", data, "wait", "0.1", "0")
    try:
        second.expect("start 1", 10)  # at once: a crash strike would wait 30 s
        second.expect("done", 10)
        code, err = second.finish(30)
    finally:
        second.kill()
    assert code == 0 and "strike" not in err.lower(), err


# -- PostgreSQL: a graceful stop hands the object over at once (DESIGN sections 2, 9) ---

@pytest.mark.crash
def test_sigterm_of_a_postgres_host_hands_its_running_job_to_another_host_at_once(
    worker: Path, pg_dsn: str,
) -> None:
    """A rolling deploy on PostgreSQL: host A runs a 60 s job, host B is up, A gets
    SIGTERM. A exits 0 having released its lease, so B runs the job at once (not after
    lease_ttl, 30 s here, nor after a crash strike's 30 s), as the same attempt."""
    a = Proc(worker, "worker.py", pg_dsn, "push", "60", "0")
    b: Proc | None = None
    try:
        a.expect("up", 30)
        a.expect("start 1", 30)
        b = Proc(worker, "worker.py", pg_dsn, "wait", "0.1", "0")
        b.expect("up", 30)
        a.proc.send_signal(signal.SIGTERM)
        code, err = a.finish(30)
        assert code == 0, err
        b.expect("start 1", 10)
        b.expect("done", 10)
        code, err = b.finish(30)
        assert code == 0 and "strike" not in err.lower(), err
    finally:
        a.kill()
        if b is not None:
            b.kill()


# -- Namespaces survive another way of starting the script (DESIGN section 2) ----------

APP = textwrap.dedent('''
    import sys

    import trio

    import nursery_jobs as nj


    class Notes(nj.DurableObject):
        async def put(self, value):
            self.ctx.storage.put("v", value)

        async def get(self):
            return self.ctx.storage.get("v")


    async def main(data, op):
        async with nj.open_runtime(data) as rt:
            notes = rt.get(Notes, "n")
            if op == "put":
                await notes.put("hello")
            else:
                print(await notes.get())
        print(Notes.namespace)


    if __name__ == "__main__":
        trio.run(main, sys.argv[1], sys.argv[2])
''')


def _python(cwd: Path, *args: str) -> list[str]:
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=_env(cwd),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.crash
def test_a_script_in_a_package_names_the_same_objects_run_by_path_or_with_dash_m(
    tmp_path: Path,
) -> None:
    """Developed as ``python app/main.py``, deployed as ``python -m app.main`` (a
    Dockerfile's usual CMD): the file is the package module ``app.main`` either way, and
    its data must not vanish."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "main.py").write_text(APP)
    data = str(tmp_path / "data")
    by_dash_m = _python(tmp_path, "-m", "app.main", data, "put")
    imported = _python(tmp_path, "-c",
                       f"import trio, app.main as m; trio.run(m.main, {data!r}, 'get')")
    assert by_dash_m == ["app.main.Notes"] and imported == ["hello", "app.main.Notes"]
    assert _python(tmp_path, "app/main.py", data, "get") == ["hello", "app.main.Notes"]


# -- The operator faces' answers to hostile arguments (DESIGN section 10) ---------------

class Box(nj.DurableObject):
    namespace = "review.Box"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self) -> None:
        await self.lifecycle.jobs.push("later", id="later", delay=3600)

    async def on_job(self, ctx: nj.JobContext) -> None:
        pass


@pytest.fixture
def stopped(tmp_path: Path) -> Path:
    """A stopped data directory with one object and one job."""
    data = tmp_path / "data"

    async def fill() -> None:
        async with nj.open_runtime(data) as rt:
            await rt.get(Box, "b").push()

    trio.run(fill)
    return data


def _snapshot(data: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(data)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(data.rglob("*")) if p.is_file()}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nursery_jobs.cli", *args], cwd=ROOT,
                          env=_env(ROOT), capture_output=True, text=True, timeout=30)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.crash
@pytest.mark.parametrize("where", ["port in use", "port 70000", "unresolvable host"])
def test_serve_of_an_address_it_cannot_bind_says_so_in_one_line_and_exits_2(
    stopped: Path, busy_port: int, where: str,
) -> None:
    address = {"port in use": ["--port", str(busy_port)],
               "port 70000": ["--port", "70000"],
               "unresolvable host": ["--host", "no-such-host.invalid", "--port", "0"]}[where]
    before = _snapshot(stopped)
    done = _cli("serve", str(stopped), *address)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("nursery-jobs: "), done.stderr
    assert _snapshot(stopped) == before


# -- Tracing: a chain of work is one trace (DESIGN section 2, tracing=) ---------------

class Relay(nj.DurableObject):
    """Job "first" calls another object through ``ctx.get``; that call pushes job
    "second" there."""

    namespace = "review.Relay"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str) -> None:
        await self.lifecycle.jobs.push(fn, id=fn)

    async def on_job(self, ctx: nj.JobContext) -> None:
        if ctx.job.fn == "first":
            await self.ctx.get(Relay, "next").push("second")


async def test_a_call_from_a_job_is_a_span_of_the_job_and_its_push_links_the_next_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Job "first" of r1 calls r2 (``ctx.get``), which pushes job "second": the call is
    a span in the first run's trace, and the second run links to that call."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nursery_jobs.testing import run_until_idle

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        async with nj.open_runtime(tracing=provider) as rt:
            await rt.get(Relay, "r1").push("first")
            await run_until_idle(rt)
    finally:
        provider.shutdown()
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    (first,) = [s for s in spans if s.name == "job first"]
    (second,) = [s for s in spans if s.name == "job second"]
    inner = [s for s in spans if s.name == "review.Relay.push" and s.attributes
             and s.attributes.get("nursery_jobs.object") == "next"]
    assert len(inner) == 1, names
    (call,) = inner
    assert call.context is not None and first.context is not None
    assert call.context.trace_id == first.context.trace_id
    assert call.parent is not None and call.parent.span_id == first.context.span_id
    assert [link.context.span_id for link in second.links] == [call.context.span_id]


# -- A stop while a call waits for its turn (DESIGN sections 2 and 3) ------------------

HOLD = trio.Event()
STARTED = trio.Event()


class Held(nj.DurableObject):
    """Job "hold" keeps the object's turn until ``HOLD`` is set."""

    namespace = "review.Held"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self) -> None:
        await self.lifecycle.jobs.push("hold", id="hold")

    async def write(self) -> None:
        self.ctx.storage.put("written", True)

    async def state(self) -> dict[str, object]:
        return {"written": self.ctx.storage.get("written"),
                "runs": self.ctx.storage.get("runs", [])}

    async def on_job(self, ctx: nj.JobContext) -> None:
        self.ctx.storage.put("runs", [*self.ctx.storage.get("runs", []), ctx.attempt])
        STARTED.set()
        if not HOLD.is_set():
            await HOLD.wait()


def _sigterm_soon() -> None:
    time.sleep(0.2)  # (the call is waiting by then)
    os.kill(os.getpid(), signal.SIGTERM)


async def test_sigterm_while_a_call_waits_for_a_turn_stops_the_block_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """A call waits for the turn a running job holds; SIGTERM: the block exits normally,
    the waiting call never runs, and the next start runs the job at once, as attempt 1
    (its cancelled run was no failure)."""
    data = tmp_path / "data"
    after_call = False
    with trio.fail_after(20):
        async with nj.open_runtime(data) as rt:
            held = rt.get(Held, "h")
            await held.push()
            await STARTED.wait()  # (a real clock: a real signal)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, _sigterm_soon)
                await held.write()
                after_call = True
    assert not after_call
    HOLD.set()
    with trio.fail_after(20):
        async with nj.open_runtime(data, stop_on=()) as rt:
            state = await rt.get(Held, "h").state()
            with trio.fail_after(5):  # at once: no strike's 30 s delay
                while not state["runs"]:
                    await trio.sleep(0.05)
                    state = await rt.get(Held, "h").state()
    # The cancelled run's writes were rolled back with it; attempt 1 was not spent.
    assert state == {"written": None, "runs": [1]}


OPEN_ON = textwrap.dedent('''
    import sys

    import trio

    import nursery_jobs as nj


    async def main(port):
        async with nj.open_runtime(None, http=("127.0.0.1", port)):
            pass

    try:
        trio.run(main, int(sys.argv[1]))
    except BaseException as exc:
        print(type(exc).__name__, isinstance(exc, (OSError, nj.NurseryJobsError)))
        print(exc)
''')


@pytest.mark.crash
def test_open_runtime_on_an_http_address_in_use_raises_one_error_naming_it(
    busy_port: int, tmp_path: Path,
) -> None:
    """Two replicas on one port, or a restart while the old process still binds it: the
    deploy's log should say which address is taken, not a tree of nursery groups. (In a
    subprocess: hypercorn leaves the socket it could not bind unclosed.)"""
    (tmp_path / "open_on.py").write_text(OPEN_ON)
    kind, typed, *message = _python(tmp_path, "open_on.py", str(busy_port))
    assert kind != "ExceptionGroup" and typed == "True", (kind, message)
    assert str(busy_port) in " ".join(message), message
