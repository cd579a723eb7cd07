"""The worker process of tests/test_faults_storage.py's read-only tests: what a runtime
says about a data directory it may not write. Run by the test under a read-only mount
(a private mount namespace) or as an unprivileged user.

Run: ``python tests/readonly_worker.py DATA STEP``, STEP one of ``open`` (open a
runtime) or ``objects`` (open it, then call a new object and an existing one). Prints one
JSON line per step: ``{"step", "type", "cause", "message"}`` (type None: it worked).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

import nursery_jobs as nj


class Note(nj.DurableObject):
    namespace = "tests.readonly_worker.Note"

    async def put(self, value: int) -> None:
        self.ctx.storage.put("k", value)


def report(step: str, error: BaseException | None) -> None:
    out: dict[str, Any] = {"step": step, "type": None, "cause": None, "message": None}
    if error is not None:
        out.update(type=type(error).__name__, cause=getattr(error, "cause", None),
                   message=str(error), path=str(getattr(error, "path", "")),
                   mro=[cls.__name__ for cls in type(error).__mro__])
    print(json.dumps(out), flush=True)


async def main(data: str, step: str) -> None:
    try:
        async with nj.open_runtime(data) as rt:
            report("open", None)
            if step == "objects":
                for object_id in ("new", "old"):
                    try:
                        await rt.get(Note, object_id).put(2)
                        report(object_id, None)
                    except Exception as exc:
                        report(object_id, exc)
    except Exception as exc:
        report("open", exc)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:3])
