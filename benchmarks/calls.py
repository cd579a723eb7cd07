"""Stub calls per second in one process: the cost of copying a call's arguments and
result through the payload codec (DESIGN section 2).

Run: python benchmarks/calls.py [-n 20000] [--runs 5] [--engine memory|files]

Three methods of one object: ``ping(int) -> int`` (the scalar fast path), ``echo(dict)``
taking and returning a 20-key dict, and ``nothing()``. Reports the best of ``--runs``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

import trio

import nursery_jobs as nj


class Bench(nj.DurableObject):
    namespace = "bench.calls"

    async def ping(self, n: int) -> int:
        return n + 1

    async def echo(self, value: dict[str, Any]) -> dict[str, Any]:
        return value

    async def nothing(self) -> None:
        return None


DICT20 = {f"key{i}": (i if i % 3 else f"value {i}") for i in range(20)}


async def _rate(stub: nj.Stub, name: str, args: tuple[Any, ...], n: int) -> float:
    call = stub.call
    start = time.perf_counter()
    for _ in range(n):
        await call(name, *args)
    return n / (time.perf_counter() - start)


async def run(n: int, runs: int, location: Any) -> dict[str, float]:
    best: dict[str, float] = {}
    async with nj.open_runtime(location, stop_on=()) as rt:
        stub = rt.get(Bench, "b")
        await stub.nothing()
        for _ in range(runs):
            for label, name, args in (("nothing()", "nothing", ()),
                                      ("ping(int) -> int", "ping", (1,)),
                                      ("echo(20-key dict)", "echo", (DICT20,))):
                rate = await _rate(stub, name, args, n)
                best[label] = max(best.get(label, 0.0), rate)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine", choices=("memory", "files"), default="memory")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        location = None if options.engine == "memory" else tmp
        best = trio.run(run, options.n, options.runs, location)
    for label, rate in best.items():
        print(f"{label:20} {rate:10,.0f} calls/s  {1e6 / rate:6.1f} µs/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
