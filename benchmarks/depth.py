"""Depth must not cost (issue 26): push and dispatch rates of the first N jobs of a queue
N deep beside queues 200k and 1,000,000 deep (the rows of ``nursery-jobs bench --depth``,
alone). Each depth fills a fresh object (1M: ~15 s and ~600 MB of disk).

Run: python benchmarks/depth.py [-n 20000] [--depths 200000,1000000] [--dir DIR]
[--prioritized] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from nursery_jobs.bench._depth import DEPTHS, depth_rows, render_depth


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20_000, help="jobs measured at each depth")
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)),
                        help="queue depths beside N (comma-separated)")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    parser.add_argument("--prioritized", action="store_true",
                        help="queue one job of priority 1 (an hour out) first")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    depths = tuple(int(d) for d in args.depths.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="nj-depth-", dir=args.dir))
    try:
        rows = depth_rows(tmp, args.n, depths, prioritized=args.prioritized)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(rows, indent=2) if args.json else "\n".join(render_depth(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
