"""The working copies' change capture (PostgreSQL engine and shared layout): each
write records its row's key in ``nj_changed`` once, whatever conflict clause the
writing statement carries, and the first key since the last ship calls
``nj_captured`` once."""

from __future__ import annotations

import sqlite3

import pytest

from nursery_jobs._engines.postgres._copy import load_copy
from nursery_jobs._engines.shared._object import Capture, new_copy


def _copies() -> list[tuple[str, sqlite3.Connection, list[int]]]:
    calls_pg: list[int] = []
    pg = load_copy("t/pg", [], captured=lambda: calls_pg.append(1))
    calls_shared: list[int] = []
    shared = new_copy()
    shared.capture = Capture(lambda state: None)
    shared.create_function("nj_captured", 0, lambda: calls_shared.append(1))
    return [("pg", pg, calls_pg), ("shared", shared, calls_shared)]


@pytest.mark.parametrize("clause", ["", "OR ROLLBACK", "OR ABORT", "OR FAIL", "OR IGNORE",
                                    "OR REPLACE"])
def test_a_key_written_twice_is_captured_once_under_any_conflict_clause(clause: str) -> None:
    for name, conn, calls in _copies():
        conn.execute("BEGIN")
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('k', '1')")
        conn.execute(f"UPDATE {clause} nj_kv SET value = '2' WHERE key = 'k'")
        conn.execute(f"UPDATE {clause} nj_kv SET value = '3' WHERE key = 'k'")
        conn.execute(f"INSERT {clause} INTO nj_kv (key, value) VALUES ('j', '1')")
        conn.execute("COMMIT")
        assert sorted(conn.execute("SELECT tbl, key FROM nj_changed").fetchall()) == [
            ("nj_kv", "j"), ("nj_kv", "k")], name
        assert conn.execute("SELECT value FROM nj_kv WHERE key = 'k'").fetchone() == ("3",)
        assert len(calls) == 1, name  # the first key only
        conn.close()


def test_a_rolled_back_write_leaves_no_key() -> None:
    for name, conn, _ in _copies():
        conn.execute("BEGIN")
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('k', '1')")
        conn.execute("ROLLBACK")
        assert conn.execute("SELECT count(*) FROM nj_changed").fetchone() == (0,), name
        conn.close()
