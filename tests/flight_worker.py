"""The worker process of tests/test_faults_flight.py: open a runtime on DATA, then leave.

Run: ``python tests/flight_worker.py DATA``. Prints ``opened`` if the runtime opened;
anything it raises is Python's to report (exit code 1 and a traceback) — what the test
wants to see instead of death by SIGBUS.
"""

from __future__ import annotations

import sys

import trio

import nursery_jobs as nj


async def main(data: str) -> None:
    async with nj.open_runtime(data):
        print("opened", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
