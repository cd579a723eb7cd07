"""The SQLite dispatch benchmark runs end to end and reports every figure (a smoke test:
no timing is asserted)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest

from nursery_jobs.bench import main
from nursery_jobs.bench._harness import render, run


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    return []


def test_the_benchmark_reports_every_figure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="nursery_jobs"):
        report = run(300, tmp_path, with_peers=False, progress_enabled=False)
    # Its deep queues are on purpose: no backlog warning a run (100 lines of them at
    # 100 objects) buries the table on stderr.
    assert [r.getMessage() for r in caplog.records if "due jobs" in r.getMessage()] == []
    assert set(report["ceiling"]) == {"normal", "full"}
    assert set(report["floor"]) == {"push_per_call_per_s", "push_batched_per_s", "drain_per_s",
                                    "kv_drain_per_s"}
    assert all(rate > 0 for rate in report["floor"].values())
    ours = report["ours"]
    for key in ("dispatch_1x_normal_per_s", "dispatch_100x_normal_per_s",
                "dispatch_1x_full_per_s", "dispatch_100x_full_per_s",
                "dispatch_1x_kv_normal_per_s"):
        assert ours[key] > 0, key
    for durability in ("normal", "full"):
        assert ours[f"pushes_{durability}"]["push_per_call_per_s"] > 0
        assert ours[f"pushes_{durability}"]["push_batched_per_s"] > 0
    assert all(math.isfinite(x) and x >= 0 for x in _numbers(report))
    text = render(report)
    assert "floor, our SQL: dispatch, a KV write a job" in text
    assert "dispatch, 100 objects" in text
    assert list(tmp_path.iterdir()) == []  # the benchmark's files are gone


@pytest.mark.parametrize(("option", "error"), [
    (["--runs", "0"], "--runs must be at least 1"),
    (["--quick"], "--quick applies to --engine postgres only"),
    (["--lease-ttl", "3"], "--lease-ttl applies to --engine postgres only"),
    (["--objects", "--object-sizes", "10,x"], "--object-sizes: a comma-separated list"),
    (["--objects", "--object-sizes", "0"], "--object-sizes: every count must be at least 1"),
    (["--objects", "--runs", "0"], "--runs must be at least 1"),
    (["--dir", "/nonexistent/nj-bench"], "--dir /nonexistent/nj-bench: no such directory"),
])
def test_options_that_do_not_apply_are_refused(
    option: list[str], error: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--no-peers", *option])
    assert exc.value.code == 2
    assert error in capsys.readouterr().err


def test_the_hot_path_is_measured_run_after_run_beside_its_floor(tmp_path: Path) -> None:
    from nursery_jobs.bench._hot import FIGURES, hot_path_runs
    from nursery_jobs.bench._progress import Progress

    runs = hot_path_runs(tmp_path, 300, 2, Progress(2, False))
    assert len(runs) == 2
    for measured in runs:
        assert set(measured) == {key for _label, key, _floor, _target in FIGURES}
        for figure in measured.values():
            assert figure["ours"] > 0 and figure["floor"] > 0 and figure["cpu_us"] > 0
    assert list(tmp_path.iterdir()) == []  # each run's files are gone


def test_the_hot_path_table_gives_each_ratio_median_and_range_against_its_target() -> None:
    from nursery_jobs.bench._hot import FIGURES, render_hot

    def run_of(ratio: float) -> dict[str, dict[str, float]]:
        return {key: {"ours": 1000.0 * ratio, "floor": 1000.0, "cpu_us": 10.0}
                for _label, key, _floor, _target in FIGURES}

    lines = render_hot([run_of(0.9), run_of(0.5), run_of(0.7)])
    by_label = {label: next(line for line in lines if line.startswith(label))
                for label, _key, _floor, _target in FIGURES}
    push = by_label["push, one durable push per call"]
    assert "0.70 (0.50-0.90)" in push and "≥0.80 missed" in push
    assert "700/s" in push and "1,000/s" in push
    assert by_label["dispatch, 1 object x N"].endswith("≥0.60 met")
    assert by_label["dispatch, 100 objects x N/100"].endswith("≥0.55 met")


def test_the_floors_do_the_work_they_time(tmp_path: Path) -> None:
    """Every job the floors push is dispatched: the queue ends empty, and the KV floor's
    last write is the last job's payload."""
    import sqlite3

    from nursery_jobs.bench._floor import floors

    floors(tmp_path, 300, "normal")
    for name, jobs in (("floor-push-normal", 300), ("floor-push1-normal", 300),
                       ("floor-drain-normal-0", 0), ("floor-drain-normal-1", 0)):
        conn = sqlite3.connect(tmp_path / f"{name}.sqlite3")
        assert conn.execute("SELECT COUNT(*) FROM nj_jobs").fetchone() == (jobs,), name
        conn.close()
    conn = sqlite3.connect(tmp_path / "floor-drain-normal-1.sqlite3")
    assert conn.execute("SELECT value FROM nj_kv WHERE key = 'count'").fetchone() == ("299",)
    conn.close()


def test_missing_peers_are_named_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from nursery_jobs.bench import _harness

    monkeypatch.setattr(_harness, "peers_available", lambda: ["huey"])
    note = _harness.peers_note()
    assert note is not None
    assert "persistqueue" in note and "dbos" in note and "apscheduler" in note
    assert "huey" not in note
    assert "pip install 'nursery_jobs[bench]'" in note and "\n" not in note
    monkeypatch.setattr(_harness, "peers_available", lambda: list(_harness.PEERS))
    assert _harness.peers_note() is None
    monkeypatch.setattr(_harness, "peers_available", list)
    assert "no peer installed" in (_harness.peers_note() or "")


@pytest.mark.soak  # (~15 s of filling queues: by hand with -m soak)
def test_the_depth_rows_measure_each_depth_beside_the_first(tmp_path: Path) -> None:
    """``--depth``: the first N jobs of a queue N deep and of a deeper one, pushed and
    dispatched (a dispatch row ends only when N jobs have run), side by side."""
    report = run(300, tmp_path, with_peers=False, progress_enabled=False, depths=(900,))
    rows = report["depth"]
    assert [row["depth"] for row in rows] == [300, 900]
    for row in rows:
        for key in ("dispatch_per_s", "push_batched_per_s", "push_per_call_per_s",
                    "dispatch_cpu_us", "push_batched_cpu_us", "push_per_call_cpu_us"):
            assert math.isfinite(row[key]) and row[key] > 0, key
    text = render(report)
    assert "the first 300 jobs of a deep queue" in text
    assert "900" in text
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--depth", "--objects"])
def test_sqlite_rows_are_refused_for_postgres(
    option: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--engine", "postgres", option])
    assert exc.value.code == 2
    assert "--depth and --objects apply to the sqlite engine only" in capsys.readouterr().err


def test_the_objects_rows_create_fire_and_weigh_each_layout(tmp_path: Path) -> None:
    """``--objects``: per layout, objects created with a job and fired cold (a fire phase
    ends only when every object's job has run), beside that layout's floor, and memory per
    resident and dormant object."""
    from nursery_jobs.bench._objects import object_rows, render_objects
    from nursery_jobs.bench._progress import Progress

    rows = object_rows(tmp_path, (30,), 1, Progress(2, False))
    assert [(row["layout"], row["objects"]) for row in rows] == [("files", 30), ("shared", 30)]
    for row in rows:
        for phase in ("create", "fire"):
            assert row[phase]["per_s"] > 0 and row[phase]["cpu_s_per_1k"] > 0
            assert row["floor"][phase]["per_s"] > 0
        assert row["resident"] == 30  # every object created is still in memory
        assert row["fire"]["activations"] == 1.0  # each object once
        assert math.isfinite(row["rss_per_resident"]) and math.isfinite(row["rss_per_dormant"])
    text = "\n".join(render_objects(rows))
    assert "files" in text and "shared" in text and "B/dormant" in text
    assert list(tmp_path.iterdir()) == []


def test_the_depth_rows_with_a_prioritized_job_queued(tmp_path: Path) -> None:
    from nursery_jobs.bench._depth import depth_rows

    rows = depth_rows(tmp_path, 200, (400,), prioritized=True)
    assert [row["depth"] for row in rows] == [200, 400]
    assert all(row["dispatch_per_s"] > 0 for row in rows)
