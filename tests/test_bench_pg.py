"""``nursery-jobs bench --engine postgres --quick``: a smoke test of the benchmark (it
runs end to end and reports every figure), never a timed test: no figure is compared
with a target here."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pg_support import server_dsn

psycopg = pytest.importorskip("psycopg")

from nursery_jobs.bench import main  # noqa: E402 (after importorskip)
from nursery_jobs.bench._pg import FIGURES  # noqa: E402


def _bench_databases(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'nj_bench_%'"
        ).fetchall()
    return {name for (name,) in rows}


def test_quick_postgres_bench_reports_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    dsn = server_dsn()
    before = _bench_databases(dsn)
    assert main(["--engine", "postgres", "--dsn", dsn, "--quick", "-n", "300",
                 "--runs", "1", "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert report["engine"] == "postgres"
    assert set(report["load_average"]) == {"start", "end"}
    assert (report["n"], report["runs"], report["quick"]) == (300, 1, True)
    assert sorted(report["figures"]) == sorted(FIGURES)
    for name, figure in report["figures"].items():
        assert len(figure["runs"]) == 1, name
        value = figure["runs"][0]
        # CPU figures may be 0 (no ship, or less than a clock tick of the server's CPU,
        # fell inside a tiny run); rates and times may not.
        cpu = name.endswith("_cpu") or name.endswith("_server_cpu_us")
        assert math.isfinite(value) and (value >= 0 if cpu else value > 0), (name, value)
        assert figure["median"] == figure["min"] == figure["max"] == value, name
    assert set(report["targets"]) == {
        "dispatch_per_s >= 10,000", "dispatch >= 0.3x ceiling", "call p50 <= 2 ms",
        "100 callers push >= 10,000/s", "failover <= lease_ttl + 1 s",
    }
    # The benchmark's database is gone.
    assert _bench_databases(dsn) <= before


def test_postgres_bench_measures_only_the_calls_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dsn = server_dsn()
    assert main(["--engine", "postgres", "--dsn", dsn, "--quick", "--calls-only",
                 "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "cross-host call p50" in out and "cross-host call p99" in out
    assert "dispatch" not in out and "failover" not in out
    assert "targets: call p50 <= 2 ms: " in out


def test_postgres_bench_needs_a_server_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NJ_POSTGRES_DSN", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["--engine", "postgres", "--quick"])
    assert exc.value.code == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--dsn", "notadsn"], 'PostgreSQL at postgresql://?: missing "="'),
    (["--dsn", "postgresql://u:secret@127.0.0.1:1/x?connect_timeout=1"],
     "PostgreSQL at postgresql://u@127.0.0.1:1/x: connection failed"),
    (["--dsn", "postgresql://x/y", "--lease-ttl", "nan"], "--lease-ttl must be a number"),
    (["--dsn", "postgresql://x/y", "--runs", "0"], "--runs must be at least 1"),
])
def test_postgres_bench_refuses_bad_options_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--engine", "postgres", "--quick", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "secret" not in err
