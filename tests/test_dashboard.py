"""The HTTP face of a runtime, for real: a runtime serving on a loopback port, jobs
driven through it, and /metrics, /api and the dashboard fetched over TCP (and once in
a headless Chromium)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

import nursery_jobs as nj
from nursery_jobs.testing import run_until_idle

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = ("127.0.0.1", 0)


class Mailer(nj.DurableObject):
    namespace = "tests.test_dashboard.Mailer"

    def __init__(self, ctx: nj.ObjectContext) -> None:
        super().__init__(ctx)
        self.lifecycle = nj.Lifecycle.install(self)

    async def push(self, fn: str, **kwargs: Any) -> str:
        return (await self.lifecycle.jobs.push(fn, **kwargs)).id

    async def on_job(self, ctx: nj.JobContext) -> nj.JobOutcome:
        if ctx.job.fn == "fail" and (self.ctx.env or {}).get("fail", True):
            raise ConnectionError(f"smtp down for {ctx.job.payload}")
        self.ctx.storage.put(f"sent:{ctx.job.id}", ctx.attempt)
        return None

    async def report(self) -> dict[str, Any]:
        """What the object itself says about its queue."""
        return {
            "jobs": [(j.id, j.time) for j in self.lifecycle.jobs.list()],
            "dead": [(d.job.id, d.error, d.attempts) for d in self.lifecycle.dead_letters()],
            "sent": self.ctx.storage.list("sent:"),
        }


FAST = nj.RetryOptions(max_attempts=3, base_delay=0.01, max_delay=0.01, jitter=False)


async def fetch(url: str, path: str, *, method: str = "GET", body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """A plain HTTP/1.0 request over a Trio socket."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    all_headers = {"Host": f"{parts.hostname}:{parts.port}", **(headers or {})}
    if body:
        all_headers["Content-Length"] = str(len(body))
    head = "".join(f"{k}: {v}\r\n" for k, v in all_headers.items())
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        async with stream:
            await stream.send_all(f"{method} {path} HTTP/1.0\r\n{head}\r\n".encode() + body)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    raw_head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *lines = raw_head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    response_headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return status, response_headers, payload.decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, parsed by prometheus-client."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


HOST = (("namespace", Mailer.namespace), ("owner", "host"))


async def test_metrics_and_api_follow_the_work(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path / "data", http=LOOPBACK) as rt:
        assert rt.http_url is not None and rt.http_url.startswith("http://127.0.0.1:")
        status, headers, text = await fetch(rt.http_url, "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        before = samples(text)
        assert ("nursery_jobs_jobs_dispatched_total", HOST) not in before

        mailer = rt.get(Mailer, "news")
        for n in range(5):
            await mailer.push("send", payload=n)
        await mailer.push("fail", id="bounce", retry=FAST, payload="ada")
        await mailer.push("send", id="later", delay=3600)
        await run_until_idle(rt)
        await trio.sleep(0.05)  # the retries (10 ms each)
        await run_until_idle(rt)

        m = samples((await fetch(rt.http_url, "/metrics"))[2])
        assert m[("nursery_jobs_jobs_dispatched_total", HOST)] == 5 + 3
        assert m[("nursery_jobs_jobs_failed_total", HOST)] == 3
        assert m[("nursery_jobs_jobs_retried_total", HOST)] == 2
        assert m[("nursery_jobs_jobs_dead_lettered_total", HOST)] == 1
        by_ns = (("namespace", Mailer.namespace),)
        assert m[("nursery_jobs_dispatch_duration_seconds_count", by_ns)] == 8
        assert m[("nursery_jobs_alarm_lateness_seconds_count", by_ns)] >= 1
        assert m[("nursery_jobs_objects", (("namespace", Mailer.namespace),))] == 1
        assert m[("nursery_jobs_active_objects", (("namespace", Mailer.namespace),))] == 1
        assert m[("nursery_jobs_due_jobs", (("namespace", Mailer.namespace),))] == 0
        assert m[("nursery_jobs_alarms", ())] == 1

        # More work moves the counters by exactly that much.
        await mailer.push("send")
        await run_until_idle(rt)
        m2 = samples((await fetch(rt.http_url, "/metrics"))[2])
        assert m2[("nursery_jobs_jobs_dispatched_total", HOST)] == 9
        assert m2[("nursery_jobs_jobs_failed_total", HOST)] == 3

        # /api says what the object says.
        report = await mailer.report()
        status, headers, text = await fetch(rt.http_url, "/api/objects")
        assert status == 200 and headers["content-type"] == "application/json"
        api = json.loads(text)
        assert api["live"] and api["total"] == 1
        (entry,) = api["objects"]
        assert entry["state"] == "active"
        assert [(j["id"], j["time"]) for j in entry["jobs"]] == report["jobs"]
        assert [(d["id"], d["error"], d["attempts"]) for d in entry["dead_letters"]] == (
            report["dead"])
        assert report["dead"] == [("bounce", "ConnectionError: smtp down for ada", 3)]
        assert entry["counts"] == {"jobs": 1, "due": 0, "running": 0, "dead_letters": 1}
        one = json.loads((await fetch(
            rt.http_url, "/api/object?" + urlencode({"ns": Mailer.namespace, "id": "news"})))[2])
        assert one == entry
        summary = json.loads((await fetch(rt.http_url, "/api/summary"))[2])
        assert summary["totals"]["dispatched"] == 9 and summary["active"] == 1
        events = json.loads((await fetch(rt.http_url, "/api/events"))[2])
        assert "job:dead_letter" in [e["type"] for e in events]


async def test_an_evicted_object_is_read_from_its_file(tmp_path: Path) -> None:
    async with nj.open_runtime(tmp_path / "data", http=LOOPBACK, idle_timeout=0.05) as rt:
        mailer = rt.get(Mailer, "quiet")
        await mailer.push("send", id="later", delay=3600)
        await trio.sleep(0.3)
        assert rt.statistics().active_objects == 0
        api = json.loads((await fetch(rt.http_url or "", "/api/objects"))[2])
        (entry,) = api["objects"]
        assert entry["state"] == "evicted"
        assert [j["id"] for j in entry["jobs"]] == ["later"]
        assert rt.statistics().active_objects == 0  # reading did not activate it
        assert not list((tmp_path / "data" / "objects").glob("*-shm"))


async def test_the_dashboard_lists_objects_and_escapes_ids(tmp_path: Path) -> None:
    evil = '<script>alert("x")</script>\n'
    async with nj.open_runtime(tmp_path / "data", http=LOOPBACK) as rt:
        for object_id in (evil, "plain"):
            await rt.get(Mailer, object_id).push("fail", id="bounce", retry=FAST)
        await run_until_idle(rt)
        await trio.sleep(0.05)
        await run_until_idle(rt)
        status, headers, page = await fetch(rt.http_url or "", "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in headers["content-security-policy"]
        assert "<script" not in page
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;\\n" in page
        assert page.count('class="err">ConnectionError: smtp down for None<') == 2
        assert 'http-equiv="refresh"' in page
        query = urlencode({"ns": Mailer.namespace, "id": "plain"})
        status, _, page = await fetch(rt.http_url or "", f"/object?{query}")
        assert status == 200 and "bounce" in page and "<form" not in page  # read-only
        # Pagination: one object per page.
        _, _, page = await fetch(rt.http_url or "", "/?limit=1&page=2")
        objects = page.split("<h2>Objects</h2>")[1].split("</section>")[0]
        assert "page 2 of 2" in objects and ">plain</a>" in objects
        assert "&lt;script" not in objects


async def test_requests_for_other_host_names_are_refused(tmp_path: Path) -> None:
    async with nj.open_runtime(None, http=LOOPBACK) as rt:
        status, _, _ = await fetch(rt.http_url or "", "/", headers={"Host": "evil.example"})
        assert status == 421
        status, _, _ = await fetch(rt.http_url or "", "/", headers={"Host": "localhost:1"})
        assert status == 200


async def test_writes_need_the_flag_the_token_and_the_origin(tmp_path: Path) -> None:
    for writes in (False, True):
        async with nj.open_runtime(tmp_path / f"data{writes}", http=LOOPBACK,
                                   http_writes=writes, env={"fail": True}) as rt:
            url = rt.http_url or ""
            await rt.get(Mailer, "news").push("fail", id="bounce", retry=FAST)
            with trio.fail_after(10):  # (real time: three attempts 10 ms apart, under load)
                while not (await rt.get(Mailer, "news").report())["dead"]:
                    await run_until_idle(rt)
                    await trio.sleep(0.01)
            query = urlencode({"ns": Mailer.namespace, "id": "news"})
            _, _, page = await fetch(url, f"/object?{query}")
            found = re.search(r'name="token" value="([^"]+)"', page)
            if not writes:
                assert found is None
                form = urlencode({"ns": Mailer.namespace, "id": "news", "owner": "host",
                                  "job": "bounce", "token": "x"}).encode()
                status, _, text = await fetch(url, "/actions/requeue", method="POST", body=form,
                                              headers={"Content-Type": FORM})
                assert status == 403 and "read-only" in text
                continue
            assert found is not None
            token = found.group(1)
            good = {"ns": Mailer.namespace, "id": "news", "owner": "host", "job": "bounce",
                    "token": token}
            origin = url.rstrip("/")
            for fields, headers, reason in [
                ({**good, "token": "forged"}, {"Origin": origin}, "token"),
                ({k: v for k, v in good.items() if k != "token"}, {"Origin": origin}, "token"),
                (good, {"Origin": "http://evil.example"}, "cross-origin"),
                (good, {"Origin": origin, "Sec-Fetch-Site": "cross-site"}, "cross-site"),
            ]:
                status, _, text = await fetch(url, "/actions/requeue", method="POST",
                                              body=urlencode(fields).encode(),
                                              headers={"Content-Type": FORM, **headers})
                assert status == 403 and reason in text, (fields, headers, text)
            assert [d[0] for d in (await rt.get(Mailer, "news").report())["dead"]] == ["bounce"]

            rt.env["fail"] = False  # the cause is fixed: requeue it from the dashboard
            status, headers, _ = await fetch(url, "/actions/requeue", method="POST",
                                             body=urlencode(good).encode(),
                                             headers={"Content-Type": FORM, "Origin": origin})
            assert status == 303 and headers["location"].startswith("/object?")
            await run_until_idle(rt)
            report = await rt.get(Mailer, "news").report()
            assert report["dead"] == [] and "sent:bounce" in report["sent"]

            await rt.get(Mailer, "other").push("fail", id="gone", retry=nj.RetryOptions(
                max_attempts=1))
            rt.env["fail"] = True
            await run_until_idle(rt)
            assert len((await rt.get(Mailer, "other").report())["dead"]) == 1
            status, _, _ = await fetch(url, "/actions/discard", method="POST",
                                       body=urlencode({**good, "id": "other",
                                                       "job": "gone"}).encode(),
                                       headers={"Content-Type": FORM, "Origin": origin})
            assert status == 303
            assert (await rt.get(Mailer, "other").report())["dead"] == []


FORM = "application/x-www-form-urlencoded"


async def test_serve_shows_a_stopped_directory_read_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with nj.open_runtime(data) as rt:
        await rt.get(Mailer, "news").push("fail", id="bounce", retry=nj.RetryOptions(
            max_attempts=1))
        await rt.get(Mailer, "news").push("send", id="later", delay=3600)
        await run_until_idle(rt)
    before = sorted(p.name for p in data.rglob("*"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    async with trio.open_nursery() as nursery:
        process = await nursery.start(partial(
            trio.run_process,
            [sys.executable, "-m", "nursery_jobs.cli", "serve", str(data), "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, check=False))
        try:
            line = b""
            with trio.fail_after(20):
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive_some(1)
            url = re.search(r"http://\S+", line.decode())
            assert url is not None, line
            api = json.loads((await fetch(url.group(0), "/api/objects"))[2])
            (entry,) = api["objects"]
            assert not api["live"] and entry["state"] == "evicted"
            assert [d["id"] for d in entry["dead_letters"]] == ["bounce"]
            status, _, page = await fetch(url.group(0), "/")
            assert status == 200 and "smtp down" in page
            status, _, _ = await fetch(url.group(0), "/actions/requeue", method="POST",
                                          body=b"a=b", headers={"Content-Type": FORM})
            assert status == 403
        finally:
            process.terminate()
    assert sorted(p.name for p in data.rglob("*")) == before

    async with nj.open_runtime(data):
        done = await trio.run_process(
            [sys.executable, "-m", "nursery_jobs.cli", "serve", str(data), "--port", "0"],
            capture_stdout=True, capture_stderr=True, env=env, check=False)
        assert done.returncode == 3 and b"in use by a running runtime" in done.stderr


def _chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--no-first-run"]


async def test_the_dashboard_renders_in_a_real_browser(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on the CI machine: .ci/run installs it")
        pytest.skip("no chromium found (apt-get install -y chromium)")
    async with nj.open_runtime(tmp_path / "data", http=LOOPBACK) as rt:
        mailer = rt.get(Mailer, "browser-check")
        await mailer.push("fail", id="bounce", retry=FAST, payload="grace")
        await mailer.push("send", id="later", delay=3600)
        await run_until_idle(rt)
        await trio.sleep(0.05)
        await run_until_idle(rt)
        with trio.fail_after(60):
            done = await trio.run_process(
                [browser, *BROWSER_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                 "--dump-dom", rt.http_url or ""],
                capture_stdout=True, capture_stderr=True, check=False)
        dom = done.stdout.decode()
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert "<table" in dom and "Objects" in dom
        assert "browser-check" in dom
        assert "ConnectionError: smtp down for grace" in dom  # the dead letter, rendered
        assert "<svg" in dom  # the charts


async def test_http_without_the_web_extra_names_it_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if hypercorn were not installed (a module an earlier test imported included).
    for name in {"hypercorn"} | {m for m in sys.modules if m.startswith("hypercorn.")}:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError) as raised:
        async with nj.open_runtime(tmp_path / "data", http=LOOPBACK):
            raise AssertionError("the block must not run without the dashboard")
    assert str(raised.value) == (
        "serving the dashboard needs the web extra: pip install 'nursery_jobs[web]'")


async def test_http_on_an_address_in_use_is_one_error_naming_it_and_leaks_no_socket(
    tmp_path: Path,
) -> None:
    """Two replicas on one port: ``HttpBindError`` (an OSError, errno EADDRINUSE) with
    the address, not a tree of nursery groups; the block never runs, and the socket
    that could not bind is closed (no ResourceWarning when it is collected)."""
    import errno
    import gc
    import socket
    import warnings

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(nj.HttpBindError) as raised:
                async with nj.open_runtime(tmp_path / "data", http=("127.0.0.1", port)):
                    raise AssertionError("the block must not run without its dashboard")
            error = raised.value
            del raised
            gc.collect()
    assert str(error) == (f"cannot serve the dashboard on 127.0.0.1:{port}:"
                          f" {os.strerror(errno.EADDRINUSE)}")
    assert (error.host, error.port, error.errno) == ("127.0.0.1", port, errno.EADDRINUSE)
    assert isinstance(error, OSError)
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], caught
