"""How fast the dashboard answers with 10,000 objects (issue: first page < 200 ms).

Builds (once) a data directory of N objects, each with a Lifecycle, a job due in an
hour and every 50th with a dead letter, then times over HTTP on loopback:
  - ``nursery-jobs serve`` style (a stopped directory, read-only),
  - a live runtime with ``http=`` (objects evicted: their rows are read from files),
  - a live runtime with the first page's objects active,
for ``/`` (first page), ``/?page=100``, ``/api/objects``, ``/metrics``.

And (``--load``) dispatch throughput of a live runtime of 3,000 objects while 20 clients
(another process) load pages in a loop, against the same without: jobs/s, the longest
loop stall seen (a task of the runtime's loop measures how late it wakes; the runtime's
``runtime:stalled`` events are counted), the share of the loop's time pages took, and
the pages' latency (issue 22 #7); first, the loop's lag with pages alone. ``--http-only``:
every page answers "ok" at once (what HTTP and the clients cost by themselves).

And (``--scrape``) dispatch throughput of a live runtime with its dashboard fetched every
second (``/metrics`` and ``/``, by another process) against the same without.

Run: PYTHONPATH=. python benchmarks/dashboard.py [--objects 10000] [--data DIR]
     PYTHONPATH=. python benchmarks/dashboard.py --load [--objects 3000] [--jobs 60000]
         [--runs 3] [--clients 20] [--http-only]
     PYTHONPATH=. python benchmarks/dashboard.py --scrape [--jobs 300000] [--runs 3]
     PYTHONPATH=. python benchmarks/dashboard.py --screenshot docs/
(the home page, an object page and the dead letters: docs/dashboard*.png)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

import nursery_jobs as nj
from nursery_jobs._ops import _web
from nursery_jobs._ops._sources import OfflineSource

PATHS = ["/", "/?page=100", "/api/objects", "/metrics"]


class Account(nj.DurableObject):
    namespace = "bench.Account"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def setup(self, i: int) -> None:
        await self.lifecycle.jobs.push("renew", id="renew", delay=3600 + i, payload={"n": i})
        if i % 50 == 0:
            await self.lifecycle.jobs.push("charge", id=f"charge-{i}", payload=i,
                                           retry=nj.RetryOptions(max_attempts=1))

    async def ready(self) -> None:
        """Activate the object (its due jobs then run from its alarm)."""

    async def push_now(self, k: int) -> None:
        await self.lifecycle.jobs.push("deliver", payload=k)

    async def push_charge(self, k: int) -> None:
        await self.lifecycle.jobs.push("charge", id=f"charge-{k}", payload=k,
                                       retry=nj.RetryOptions(max_attempts=3, base_delay=0.4))

    async def push_retrying(self, k: int) -> None:
        await self.lifecycle.jobs.push("charge", id=f"charge-{k}", payload=k,
                                       retry=nj.RetryOptions(max_attempts=5, base_delay=600,
                                                             max_delay=600))

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        await trio.sleep(random.random() * 0.004)
        if ctx.job.fn == "charge":
            raise ConnectionError(f"card declined: gateway timeout after 30 s (account"
                                  f" {ctx.job.payload})")
        return None


class Mailer(Account):
    namespace = "bench.Mailer"


async def build(data: Path, n: int) -> None:
    if (data / "catalog.sqlite3").exists():
        return
    started = time.perf_counter()
    async with nj.open_runtime(data, max_active=512) as rt:
        for i in range(n):
            cls = Account if i % 4 else Mailer
            await rt.get(cls, f"{cls.__name__.lower()}-{i:05d}").setup(i)
            if i % 1000 == 999:
                print(f"  built {i + 1:,} objects ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr)
        await trio.sleep(0.5)


async def fetch(url: str, path: str) -> tuple[int, bytes]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(1 << 16):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def measure(url: str, rounds: int) -> dict[str, tuple[float, float, int]]:
    out = {}
    for path in PATHS:
        times = []
        size = 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            status, body = await fetch(url, path)
            times.append(time.perf_counter() - t0)
            assert status == 200, (path, status, body[:200])
            size = len(body)
        out[path] = (statistics.median(times) * 1000, max(times) * 1000, size)
    return out


def report(label: str, results: dict[str, tuple[float, float, int]]) -> None:
    print(f"\n{label}")
    print(f"  {'path':<16}{'median ms':>10}{'max ms':>9}{'bytes':>9}")
    for path, (median, worst, size) in results.items():
        print(f"  {path:<16}{median:>10.1f}{worst:>9.1f}{size:>9,}")


async def bench(data: Path, n: int, rounds: int) -> None:
    await build(data, n)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(_web.serve_offline, OfflineSource(data), ("127.0.0.1", 0))
        report(f"stopped directory (nursery-jobs serve), {n:,} objects",
               await measure(url, rounds))
        nursery.cancel_scope.cancel()
    async with nj.open_runtime(data, http=("127.0.0.1", 0)) as rt:
        assert rt.http_url is not None
        report(f"live runtime, {n:,} objects, none active", await measure(rt.http_url, rounds))
        for i in range(0, 200):
            cls = Account if i % 4 else Mailer
            await rt.get(cls, f"{cls.__name__.lower()}-{i:05d}").ready()
        report(f"live runtime, {n:,} objects, the first 200 active",
               await measure(rt.http_url, rounds))


async def screenshot(out: Path) -> None:
    """A dashboard with some history, rendered by headless Chromium into ``out``
    (a directory): the home page, an object page with a failed job's attempts, and the
    dead letters of every object."""
    _web.SAMPLE_INTERVAL = 0.25  # a one-minute chart window fills in seconds
    await trio.Path(out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "shop-data"
        await build(data, 120)
        async with nj.open_runtime(data, http=("127.0.0.1", 0), http_writes=True) as rt:
            assert rt.http_url is not None
            ids = [f"{('mailer' if i % 4 == 0 else 'account')}-{i:05d}" for i in range(120)]

            async def load(seconds: float) -> None:
                end = trio.current_time() + seconds
                k = 0
                while trio.current_time() < end:
                    i = random.randrange(120)
                    stub = rt.get(Mailer if i % 4 == 0 else Account, ids[i])
                    await stub.push_now(k)
                    if k % 450 == 225:  # a few failing charges on the first page's objects
                        first = random.choice([1, 2, 3, 5, 6, 7, 9, 10])
                        await rt.get(Account, ids[first]).push_charge(k)
                    k += 1
                    rate = 60 + 140 * (0.5 + 0.5 * ((trio.current_time() % 12) / 12))
                    await trio.sleep(random.expovariate(rate))

            await load(40)
            await trio.sleep(2.5)  # the last retries end
            # One charge still retrying (its first attempt failed), on account-00001.
            await rt.get(Account, ids[1]).push_retrying(9001)
            await trio.sleep(0.5)
            pages = {
                "dashboard.png": ("?limit=10&window=60", 1600),
                "dashboard-object.png": (
                    f"object?ns={Account.namespace}&id={ids[1]}", 1400),
                "dashboard-dead-letters.png": ("dead-letters?q=declined", 1100),
            }
            for name, (path, height) in pages.items():
                await trio.run_process(
                    ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                     "--disable-background-networking", "--no-first-run",
                     "--hide-scrollbars", f"--user-data-dir={tmp}/profile",
                     f"--window-size=1400,{height}", f"--screenshot={out / name}",
                     rt.http_url + path],
                    capture_stdout=True, capture_stderr=True)
                print(f"wrote {out / name}")


SCRAPER = """
import sys, time, urllib.request
url = sys.argv[1]
while True:
    t0 = time.monotonic()
    for path in ("metrics", ""):
        urllib.request.urlopen(url + path).read()
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
"""


async def dispatch_rate(data: Path, jobs: int, objects: int, scraped: bool) -> float:
    """Jobs/s draining ``jobs`` no-op jobs over ``objects`` objects; ``scraped``: while
    another process fetches /metrics and / every second."""
    from nursery_jobs.bench._harness import BenchObject, _Bench

    bench = _Bench()
    per_object = jobs // objects
    bench.target = per_object * objects
    async with nj.open_runtime(data, env=bench, http=("127.0.0.1", 0)) as rt:
        assert rt.http_url is not None
        for i in range(objects):
            await rt.get(BenchObject, f"o{i}").fill(per_object)
        await trio.sleep(0.05)  # every object's alarm run is parked on its gate job
        async with trio.open_nursery() as nursery:
            if scraped:
                nursery.start_soon(partial(
                    trio.run_process, [sys.executable, "-c", SCRAPER, rt.http_url],
                    check=False))
                await trio.sleep(1.5)  # (the scraper's first round has run)
            t0 = time.perf_counter()
            bench.go.set()
            await bench.done.wait()
            rate = bench.target / (time.perf_counter() - t0)
            nursery.cancel_scope.cancel()
    return rate


async def scrape_bench(jobs: int, objects: int, runs: int) -> None:
    rates: dict[bool, list[float]] = {False: [], True: []}
    for run in range(runs):
        for scraped in (False, True) if run % 2 == 0 else (True, False):  # (interleaved)
            with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
                rate = await dispatch_rate(Path(tmp) / "data", jobs, objects, scraped)
            rates[scraped].append(rate)
            print(f"  run {run + 1}: {'scraped' if scraped else 'quiet  '} {rate:,.0f} jobs/s",
                  file=sys.stderr)
    quiet, scraped = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"\ndispatch of {jobs:,} jobs over {objects} objects, median of {runs} runs:")
    print(f"  without the dashboard:            {quiet:>10,.0f} jobs/s")
    print(f"  /metrics and / fetched every 1 s: {scraped:>10,.0f} jobs/s"
          f"  ({(scraped / quiet - 1) * 100:+.1f} %)")


LOADER = """
import json, sys, threading, time, urllib.request
url, clients, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
paths = ["", "metrics", "?only=dead", "dead-letters"]
times, errors = [], []
end = time.monotonic() + seconds  # (bounded: stops by itself, or when stdin closes)
closed = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
def client(k):
    i = k
    while time.monotonic() < end and not closed.is_set():
        t0 = time.monotonic()
        try:
            urllib.request.urlopen(url + paths[i % len(paths)], timeout=60).read()
            times.append(time.monotonic() - t0)
        except Exception as exc:
            errors.append(repr(exc))
        i += 1
threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"times": times, "errors": errors[:5], "failed": len(errors)}))
"""


async def _lag_watch(out: list[float], stop: trio.Event) -> None:
    """How late this loop wakes from a 2 ms sleep, the worst seen (a stall's length);
    ``out[1]``: the most CPU time the loop's thread spent between two wake-ups (the
    machine's other processes excluded)."""
    while not stop.is_set():
        t0, c0 = time.perf_counter(), time.thread_time()
        await trio.sleep(0.002)
        out[0] = max(out[0], time.perf_counter() - t0 - 0.002)
        out[1] = max(out[1], time.thread_time() - c0)


PAGE_WORK = [0.0]  # seconds of the loop spent reading and rendering pages


def _count_page_work() -> None:
    """Adds up the loop's time spent on pages: reads of every object (their slices'
    work), the object API's steps, rendering and the live counters."""
    from nursery_jobs._ops import _slices

    def timed(fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                PAGE_WORK[0] += time.perf_counter() - t0
        return wrapper

    _web.Dashboard._render = timed(_web.Dashboard._render)  # type: ignore[method-assign]
    _web.Dashboard._live = timed(_web.Dashboard._live)  # type: ignore[method-assign]
    prefetch = _slices._FileSource.prefetch

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = await prefetch(self, *args, **kwargs)
        PAGE_WORK[0] += found.work
        return found

    _slices._FileSource.prefetch = counted  # type: ignore[method-assign]


async def loaded_rate(base: Path, jobs: int, busy: int, clients: int,
                      loaded: bool) -> dict[str, object]:
    """Drain ``jobs`` no-op jobs over ``busy`` objects of a runtime whose data
    directory (a copy of ``base``) holds ``--objects`` more; ``loaded``: while
    ``clients`` clients load pages in a loop."""
    import json
    import shutil
    import subprocess

    from nursery_jobs.bench._harness import BenchObject, _Bench

    bench = _Bench()
    per_object = jobs // busy
    bench.target = per_object * busy
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(base, data)
        async with nj.open_runtime(data, env=bench, http=("127.0.0.1", 0)) as rt:
            assert rt.http_url is not None
            stalls: list[float] = []
            rt.events.add_listener(
                lambda e: stalls.append(e.data["seconds"]) if e.type == "runtime:stalled"
                else None)
            for i in range(busy):
                await rt.get(BenchObject, f"o{i}").fill(per_object)
            await trio.sleep(0.05)  # every busy object's alarm run is parked on its gate
            lag = [0.0, 0.0]
            stop = trio.Event()
            result: dict[str, object] = {}
            proc = None
            if loaded:
                proc = await trio.lowlevel.open_process(
                    [sys.executable, "-c", LOADER, rt.http_url, str(clients), "600"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                await trio.sleep(2.0)  # (every client's first page is under way)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_lag_watch, lag, stop)
                t0 = time.perf_counter()
                work0 = PAGE_WORK[0]
                bench.go.set()
                await bench.done.wait()
                took = time.perf_counter() - t0
                rate = bench.target / took
                share = (PAGE_WORK[0] - work0) / took
                stop.set()
            if proc is not None:
                assert proc.stdin is not None and proc.stdout is not None
                await proc.stdin.aclose()  # the clients stop after their current page
                out = b""
                async for chunk in proc.stdout:
                    out += chunk
                await proc.wait()
                result.update(json.loads(out or b"{}"))
    return {"rate": rate, "lag": lag[0], "cpu_lag": lag[1], "stalls": stalls,
            "share": share, **result}


async def pages_only(base: Path, clients: int, seconds: float) -> dict[str, Any]:
    """The loop's worst lag while ``clients`` load pages and nothing else runs: the
    longest piece of a page's work on the loop (reads, rendering, HTTP)."""
    import json
    import shutil
    import subprocess

    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(base, data)
        async with nj.open_runtime(data, http=("127.0.0.1", 0)) as rt:
            assert rt.http_url is not None
            for i in range(0, 3000, 30):  # a hundred objects active (read on the loop)
                cls = Account if i % 4 else Mailer
                await rt.get(cls, f"{cls.__name__.lower()}-{i:05d}").ready()
            lags: list[float] = []
            stop = trio.Event()

            cpu: list[float] = []

            async def watch() -> None:
                while not stop.is_set():
                    t0, c0 = time.perf_counter(), time.thread_time()
                    await trio.sleep(0.002)
                    lags.append(time.perf_counter() - t0 - 0.002)
                    cpu.append(time.thread_time() - c0)

            proc = await trio.lowlevel.open_process(
                [sys.executable, "-c", LOADER, rt.http_url, str(clients), "600"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            async with trio.open_nursery() as nursery:
                await trio.sleep(1.0)
                nursery.start_soon(watch)
                await trio.sleep(seconds)
                stop.set()
            assert proc.stdin is not None and proc.stdout is not None
            await proc.stdin.aclose()
            out = b""
            async for chunk in proc.stdout:
                out += chunk
            await proc.wait()
    lags.sort()
    cpu.sort()
    return {"lags": lags, "cpu": cpu, **json.loads(out or b"{}")}


async def load_bench(objects: int, jobs: int, clients: int, runs: int) -> None:
    busy = 100
    _count_page_work()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        base = Path(tmp) / "base"
        await build(base, objects)
        print(f"  built {objects:,} objects", file=sys.stderr)
        alone = await pages_only(base, clients, 10.0)
        lags, times = alone["lags"], sorted(alone.get("times", []))
        print(f"\n{clients} clients loading pages of {objects:,} objects (100 active),"
              f" nothing else running, 10 s:")
        print(f"  loop lag (a 2 ms sleep's lateness): median {statistics.median(lags) * 1000:.2f}"
              f" ms, p99 {lags[int(len(lags) * 0.99)] * 1000:.2f} ms, worst"
              f" {lags[-1] * 1000:.2f} ms")
        cpu = alone["cpu"]
        print(f"  loop CPU between two wake-ups: median {statistics.median(cpu) * 1000:.2f}"
              f" ms, p99 {cpu[int(len(cpu) * 0.99)] * 1000:.2f} ms, worst"
              f" {cpu[-1] * 1000:.2f} ms")
        if times:
            print(f"  pages loaded: {len(times):,}, latency median"
                  f" {statistics.median(times) * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms")
        found: dict[bool, list[dict[str, object]]] = {False: [], True: []}
        for run in range(runs):
            for loaded in (False, True) if run % 2 == 0 else (True, False):
                out = await loaded_rate(base, jobs, busy, clients, loaded)
                found[loaded].append(out)
                print(f"  run {run + 1}: {'loaded' if loaded else 'quiet '}"
                      f" {out['rate']:,.0f} jobs/s, worst loop lag"
                      f" {float(out['lag']) * 1000:.1f} ms (CPU"
                      f" {float(out['cpu_lag']) * 1000:.1f} ms), pages took"
                      f" {float(out['share']) * 100:.1f} % of the loop", file=sys.stderr)
    quiet = statistics.median(float(o["rate"]) for o in found[False])  # type: ignore[arg-type]
    busy_rate = statistics.median(float(o["rate"]) for o in found[True])  # type: ignore[arg-type]
    times = sorted(t for o in found[True] for t in o.get("times", []))  # type: ignore[attr-defined]
    print(f"\ndispatch of {jobs:,} jobs over {busy} busy objects among {objects:,},"
          f" median of {runs} run(s):")
    print(f"  without the dashboard:             {quiet:>8,.0f} jobs/s, worst loop lag"
          f" {max(float(o['lag']) for o in found[False]) * 1000:.1f} ms (CPU"
          f" {max(float(o['cpu_lag']) for o in found[False]) * 1000:.1f} ms)")
    print(f"  {clients} clients loading pages:        {busy_rate:>8,.0f} jobs/s"
          f"  ({(busy_rate / quiet - 1) * 100:+.1f} %), worst loop lag"
          f" {max(float(o['lag']) for o in found[True]) * 1000:.1f} ms (CPU"
          f" {max(float(o['cpu_lag']) for o in found[True]) * 1000:.1f} ms)")
    shares = [float(o["share"]) for o in found[True]]  # type: ignore[arg-type]
    print(f"  the loop's time spent reading and rendering pages during dispatch:"
          f" {statistics.median(shares) * 100:.1f} % (median; max {max(shares) * 100:.1f} %)")
    for loaded in (False, True):
        stalls = [s for o in found[loaded] for s in o["stalls"]]  # type: ignore[attr-defined]
        print(f"  runtime:stalled events {'while loaded' if loaded else 'quiet'}: {len(stalls)}"
              + (f" (longest {max(stalls):.3f} s)" if stalls else ""))
    if times:
        print(f"  pages loaded: {len(times):,}, latency median"
              f" {statistics.median(times) * 1000:.0f} ms, p95"
              f" {times[int(len(times) * 0.95)] * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms;"
              f" failed {sum(int(o.get('failed', 0)) for o in found[True])}")  # type: ignore[call-overload]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--data", type=Path, default=None,
                        help="reuse (or build) the data directory here")
    parser.add_argument("--screenshot", type=Path, default=None)
    parser.add_argument("--scrape", action="store_true",
                        help="dispatch with the dashboard scraped every second vs without")
    parser.add_argument("--load", action="store_true",
                        help="dispatch while clients load pages in a loop vs without")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--http-only", action="store_true",
                        help="with --load: every page answers 'ok' at once (what HTTP and"
                             " the clients cost, without any page)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs drained (default 300,000; 60,000 with --load)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.load:
        if args.http_only:
            async def ok(self: Any, scope: Any, receive: Any) -> _web.Response:
                return _web.Response(200, "ok\n", "text/plain")
            _web.Dashboard.handle = ok  # type: ignore[method-assign]
        objects = 3000 if "--objects" not in (argv or sys.argv) else args.objects
        trio.run(load_bench, objects, args.jobs or 60_000, args.clients, args.runs)
        return
    if args.scrape:
        trio.run(scrape_bench, args.jobs or 300_000, min(args.objects, 100), args.runs)
        return
    if args.screenshot is not None:
        trio.run(screenshot, args.screenshot.resolve())
        return
    if args.data is not None:
        trio.run(bench, args.data, args.objects, args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(bench, Path(tmp) / "data", args.objects, args.rounds)


if __name__ == "__main__":
    main()

