"""The hot path against its floor, run after run (``nursery-jobs bench --runs N``).

Issue 26 asks for each hot-path figure "in the same run, three runs, median and range": on a
shared machine the floor (our SQL in plain sqlite3, ``_floor``) and nursery_jobs swing by
tens of percent from one minute to the next, so one ratio of two runs taken minutes apart
says little. Each run here measures the floors and then nursery_jobs (durability normal) on
the same disk, back to back, and the report gives, for every figure, the median and range
of the per-run ratio next to its target.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Final

import trio

from ._floor import floors
from ._harness import _dispatch, _pushes
from ._progress import Progress

# (label, key, the floor's key, issue 26's target ratio)
FIGURES: Final = (
    ("push, one durable push per call", "push_per_call", "push_per_call_per_s", 0.8),
    ("push, batched in a transaction", "push_batched", "push_batched_per_s", 0.65),
    ("dispatch, 1 object x N", "dispatch_1x", "drain_per_s", 0.6),
    ("dispatch, 100 objects x N/100", "dispatch_100x", "drain_per_s", 0.55),
    ("dispatch, 1 object, a KV write a job", "dispatch_kv", "kv_drain_per_s", 0.6),
)

Run = dict[str, dict[str, float]]  # figure key -> {"ours", "floor", "cpu_us"}


def hot_path_runs(directory: Path, n: int, runs: int, progress: Progress) -> list[Run]:
    """``runs`` runs, each the floors then nursery_jobs's pushes and dispatches (N jobs,
    durability normal), in a directory of its own under ``directory``."""
    out: list[Run] = []
    for i in range(runs):
        where = directory / f"hot-{i}"
        where.mkdir()
        try:
            floor = floors(where, n, "normal")
            pushes = trio.run(_pushes, where / "pushes", n, "normal")
            ours = {
                "push_per_call": (pushes["push_per_call_per_s"], pushes["push_per_call_cpu_us"]),
                "push_batched": (pushes["push_batched_per_s"], pushes["push_batched_cpu_us"]),
            }
            for key, objects, fn in (("dispatch_1x", 1, "noop"), ("dispatch_100x", 100, "noop"),
                                     ("dispatch_kv", 1, "kv")):
                ours[key] = trio.run(_dispatch, where / key, objects, n, "normal", fn)
        finally:
            shutil.rmtree(where, ignore_errors=True)
        out.append({key: {"ours": ours[key][0], "cpu_us": ours[key][1],
                          "floor": floor[floor_key]}
                    for _label, key, floor_key, _target in FIGURES})
        progress.step(f"the hot path against its floor, run {i + 1} of {runs}")
    return out


def render_hot(runs: list[Run]) -> list[str]:
    """The table: per figure, our rate and the floor's (medians), the ratio's median and
    range over the runs, and the target."""
    head = (f"{'what':<40}{'ours':>11}{'floor':>11}{'ratio: median (range)':>24}"
            f"{'cpu/op':>9}{'target':>9}")
    lines = [head, "-" * len(head)]
    for label, key, _floor_key, target in FIGURES:
        ratios = sorted(run[key]["ours"] / run[key]["floor"] for run in runs)
        median = statistics.median(ratios)
        ours = statistics.median(run[key]["ours"] for run in runs)
        floor = statistics.median(run[key]["floor"] for run in runs)
        cpu = statistics.median(run[key]["cpu_us"] for run in runs)
        spread = f"{median:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
        verdict = "met" if median >= target else "missed"
        lines.append(f"{label:<40}{ours:>9,.0f}/s{floor:>9,.0f}/s{spread:>24}"
                     f"{cpu:>7.1f}µs{f'≥{target:.2f}':>7} {verdict}")
    return lines
