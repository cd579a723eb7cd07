"""Dispatch throughput against the plain-sqlite3 ceiling and the peers, in one run.

Run: python benchmarks/dispatch.py [-n 20000] [--dir DIR] [--no-peers] [--json]
(the same as `nursery-jobs bench`; peers need `pip install -e '.[bench]'`).
PostgreSQL: python benchmarks/dispatch.py --engine postgres [--dsn DSN] [-n N] [--runs R]
[--quick] [--json] (DSN defaults to $NJ_POSTGRES_DSN; a database is created there and dropped).
"""

from __future__ import annotations

import sys

from nursery_jobs.bench import main

if __name__ == "__main__":
    sys.exit(main())
