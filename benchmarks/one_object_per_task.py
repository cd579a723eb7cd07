"""One durable object per task (issue 26): create and cold-fire objects/s through the
runtime per layout, beside each layout's floor, and memory per resident and per dormant
object. The same rows as ``nursery-jobs bench --objects``; see
``nursery_jobs/bench/_objects.py``.

Run: python benchmarks/one_object_per_task.py [--sizes 1000,10000] [--layouts files,shared]
     [--repeats 1] [--dir /work/nj-layout-bench] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nursery_jobs.bench._objects import object_rows, render_objects
from nursery_jobs.bench._progress import Progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--layouts", default="files,shared")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=Path("/work/nj-layout-bench"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    layouts = tuple(args.layouts.split(","))
    rows = object_rows(args.dir, sizes, args.repeats,
                       Progress(len(sizes) * len(layouts), True), layouts)
    print(json.dumps(rows, indent=1) if args.json else "\n".join(render_objects(rows)))


if __name__ == "__main__":
    main()
