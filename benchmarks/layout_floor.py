"""The floor of "one object per task" (issue 26), plain sqlite3 per layout: see
``nursery_jobs/bench/_objects_floor.py`` (``--help`` for the options)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nursery_jobs.bench._objects_floor import main

if __name__ == "__main__":
    main()
