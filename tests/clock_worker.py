"""A process whose wall clock is stepped while a runtime waits for an absolute time.

Run by ``tests/test_clock.py``: ``python clock_worker.py STEP_AT STEP DUE_IN``. The wall
clock is the system clock until ``STEP_AT`` seconds (monotonic) after the process
started, then ``STEP`` seconds ahead of it — an NTP step, or a resume after a suspend as
the wall clock sees it. The worker sets an alarm ``DUE_IN`` seconds out by the wall clock,
waits for it, and prints one JSON line: seconds from the start to the alarm run, the
wall clock and ``nj.now()`` at the run, the alarm's time, and the ``clock:adjusted``
drifts.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import trio

import nursery_jobs as nj
from nursery_jobs import _clock

START = time.monotonic()


class Target(nj.DurableObject):
    namespace = "tests.clock_worker.Target"

    async def arm(self, time: float) -> None:
        self.ctx.storage.set_alarm(time)

    async def alarm(self, info: nj.AlarmInfo) -> None:
        env: dict[str, Any] = self.ctx.env
        env["ran"] = {"after": time.monotonic() - START, "wall": env["wall"](),
                      "now": nj.now()}
        env["done"].set()


async def main(step_at: float, step: float, due_in: float) -> dict[str, Any]:
    def wall() -> float:
        ahead = step if time.monotonic() - START >= step_at else 0.0
        return time.time() + ahead

    _clock.set_wall_clock(wall)
    env: dict[str, Any] = {"done": trio.Event(), "wall": wall}
    drifts: list[float] = []
    async with nj.open_runtime(env=env) as rt:
        rt.events.add_listener(
            lambda event: drifts.append(event.data["drift"])
            if event.type == "clock:adjusted" else None
        )
        due = wall() + due_in
        await rt.get(Target, "t").arm(due)
        with trio.fail_after(due_in + 10):
            await env["done"].wait()
    return {**env["ran"], "due": due, "drifts": drifts}


if __name__ == "__main__":
    step_at, step, due_in = (float(arg) for arg in sys.argv[1:4])
    print(json.dumps(trio.run(main, step_at, step, due_in)))
