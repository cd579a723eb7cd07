"""The dispatch benchmark (``nursery-jobs bench``): the plain-sqlite3 ceiling, nursery_jobs
and its peers (each in a process of its own), measured in one run on one disk; with
``--engine postgres``, the PostgreSQL engine against a plain-psycopg ceiling (``_pg``)."""

from ._harness import main as main

__all__ = ["main"]
