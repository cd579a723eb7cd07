"""A reminders Agent: one-off reminders (``schedule``), a recurring inbox check
(``every``) and a weekday-morning digest (a cron schedule). Everything is durable: the
runtime is closed and reopened half-way, and the schedules set up in ``on_start`` on
every activation are still one of each (idempotent by content, so they never pile up).

Run: python examples/reminders_agent.py [data-dir]   (about 3 s: the inbox check runs
every ``REMINDERS_CHECK_EVERY`` seconds, 0.5 here; say 300 in production)
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from typing import Any

import trio

import nursery_jobs as nj

CHECK_EVERY = float(os.environ.get("REMINDERS_CHECK_EVERY", "0.5"))
DIGEST_CRON = "0 8 * * 1-5"  # weekdays at 08:00 UTC
START = 0.0


def stamp() -> str:
    return f"[{nj.now() - START:4.2f}s]"


class Reminders(nj.Agent):
    async def on_start(self) -> None:
        # Every activation asks again; the same content finds the same schedule.
        await self.every(CHECK_EVERY, "check_inbox")
        await self.schedule(DIGEST_CRON, "morning_digest")

    async def remind_me(self, text: str, in_seconds: float) -> str:
        return await self.schedule(in_seconds, "remind", {"text": text})

    # -- tasks: a due task calls the method of its name -------------------------------
    async def remind(self, payload: dict[str, Any]) -> None:
        print(f"{stamp()} reminder: {payload['text']}")

    async def check_inbox(self, payload: None) -> None:
        checks = self.ctx.storage.get("inbox_checks", 0) + 1
        self.ctx.storage.put("inbox_checks", checks)
        print(f"{stamp()} inbox check #{checks}")

    async def morning_digest(self, payload: None) -> None:
        print(f"{stamp()} good morning: {self.ctx.storage.get('inbox_checks', 0)} inbox checks")

    async def agenda(self) -> list[str]:
        lines = []
        for task in self.list_schedules():
            due = dt.datetime.fromtimestamp(task.due, dt.UTC)
            when = (f"every {task.every:g} s" if task.every else
                    f"at {due:%a %Y-%m-%d %H:%M} UTC" if task.name == "morning_digest" else
                    f"in {task.due - nj.now():.1f} s")
            lines.append(f"{task.name:<15} {when}")
        return lines


async def show_agenda(agent: nj.Stub, title: str) -> None:
    agenda = await agent.agenda()
    print(f"{title}: {len(agenda)}")
    for line in agenda:
        print("   ", line)


async def main(path: str) -> None:
    global START
    async with nj.open_runtime(path) as rt:
        START = nj.now()
        agent = rt.get(Reminders, "ada")
        await agent.remind_me("stretch your legs", 0.8)
        await agent.remind_me("drink some water", 1.3)
        await show_agenda(agent, "schedules")
        await trio.sleep(1.6)
    print(f"{stamp()} runtime closed for a second (two inbox checks fall due meanwhile)")
    await trio.sleep(1.0)
    async with nj.open_runtime(path) as rt:
        agent = rt.get(Reminders, "ada")
        # The missed inbox checks run once, at reopen, and then every period from there.
        await show_agenda(agent, "schedules after restart")
        await trio.sleep(0.6)


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./data")
