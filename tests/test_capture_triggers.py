"""The working copies' change capture (PostgreSQL engine and shared layout): each
write hands its row's key to the copy's ``Captured`` (a set), whatever conflict clause
the writing statement carries, and the first key since the last take calls the copy's
first-capture callback once."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from nursery_jobs._engines.postgres._copy import capture, dump_row, load_copy, take_captured
from nursery_jobs._engines.shared._object import new_copy


def _copies() -> list[tuple[str, sqlite3.Connection, list[int]]]:
    calls_pg: list[int] = []
    pg = load_copy("t/pg", [], captured=lambda: calls_pg.append(1))
    calls_shared: list[int] = []
    shared = new_copy()
    capture(shared, lambda: calls_shared.append(1))
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
        assert sorted(conn.captured.keys) == [("nj_kv", "j"), ("nj_kv", "k")], name
        assert conn.execute("SELECT value FROM nj_kv WHERE key = 'k'").fetchone() == ("3",)
        assert len(calls) == 1, name  # the first key only
        conn.close()


def test_a_rolled_back_write_ships_the_state_it_left() -> None:
    """A rolled-back write's key stays captured, and ships what the copy holds: the
    row as it was, or its absence (the same state as shipping nothing)."""
    for name, conn, _ in _copies():
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('old', '1')")
        _take(conn)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('k', '1')")
        conn.execute("UPDATE nj_kv SET value = '2' WHERE key = 'old'")
        conn.execute("ROLLBACK")
        keys, upserts, deletes = _take(conn)
        assert sorted(keys) == [("nj_kv", "k"), ("nj_kv", "old")], name
        assert upserts == [("nj_kv", "old", '["old", "1"]')], name
        assert deletes == [("nj_kv", "k")], name
        conn.close()


def _take(conn: sqlite3.Connection) -> tuple[list[Any], list[Any], list[Any]]:
    """What a ship takes of a copy: the captured keys, and the rows behind them."""
    return take_captured(conn, conn.captured)


def test_the_captured_rows_are_taken_with_their_keys_once() -> None:
    """One key of a table, several (composite keys too), and deleted rows: each comes
    out once, as it is now, and the keys are gone after."""
    for name, conn, _ in _copies():
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('gone', '0')")
        _take(conn)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('k', '1')")
        conn.execute("DELETE FROM nj_kv WHERE key = 'gone'")
        for attempt in (1, 2):
            conn.execute("INSERT INTO nj_attempts (owner, id, attempt, started, seconds,"
                         " error) VALUES ('host', 'j', ?, 1.0, 0.5, 'e')", (attempt,))
        conn.execute("COMMIT")
        keys, upserts, deletes = _take(conn)
        assert sorted(keys) == [("nj_attempts", '["host","j",1]'),
                                ("nj_attempts", '["host","j",2]'),
                                ("nj_kv", "gone"), ("nj_kv", "k")], name
        assert sorted(upserts) == [
            ("nj_attempts", '["host","j",1]', '["host", "j", 1, 1.0, 0.5, "e"]'),
            ("nj_attempts", '["host","j",2]', '["host", "j", 2, 1.0, 0.5, "e"]'),
            ("nj_kv", "k", '["k", "1"]')], name
        assert deletes == [("nj_kv", "gone")], name
        assert _take(conn) == ([], [], []), name
        conn.close()


def test_a_failed_read_of_the_captured_rows_leaves_the_keys_captured() -> None:
    for name, conn, _ in _copies():
        conn.execute("INSERT INTO nj_kv (key, value) VALUES ('k', '1')")
        conn.captured.keys.add(("nj_unknown", "x"))
        with pytest.raises(KeyError):
            _take(conn)
        assert sorted(conn.captured.keys) == [("nj_kv", "k"), ("nj_unknown", "x")], name
        conn.close()


def test_a_row_is_dumped_as_json_dumps_dumps_it() -> None:
    """The rows a ship carries are dumped by an encoder made once (``dump_row``): the
    same text as ``json.dumps``, and the same refusal of what JSON cannot hold."""
    rows = [(1, "k", None, 1.5, 1764871234.1234567, -0.0, 10**20, 'q"u\\o\u00e9\n'),
            (), (float("nan"), float("inf"))]
    for row in rows:
        assert dump_row(row) == json.dumps(row)
    with pytest.raises(TypeError):
        dump_row((b"blob",))
