"""An object's storage: KV through the codec, transactions and savepoints, raw SQL,
the sqlite-utils database, and durability settings."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from held_calls import ByRef, inside, run_held

import nursery_jobs as nj


class Box(nj.DurableObject):
    """Runs a test's function against its storage, inside a stub call."""

    namespace = "tests.test_storage.Box"

    async def run(self, ref: ByRef) -> ByRef:
        return await run_held(self.ctx.storage, ref)  # (fn(storage): see ``inside``)


class Boom(Exception):
    pass


def object_db_path(data: Path) -> Path:
    (path,) = (data / "objects").glob("*.sqlite3")
    return path


async def test_kv_get_put_delete() -> None:
    def body(s: nj.Storage) -> None:
        assert s.get("missing") is None
        assert s.get("missing", "fallback") == "fallback"
        s.put("a", 1)
        s.put("b", {"nested": [1, 2, {"x": None}]})
        assert s.get("a") == 1
        assert s.get("b") == {"nested": [1, 2, {"x": None}]}
        s.put("a", "replaced")
        assert s.get("a") == "replaced"
        s.put("none", None)
        assert s.get("none", "fallback") is None  # stored None is not "missing"
        assert s.delete("a") is True
        assert s.delete("a") is False
        assert s.get("a", "gone") == "gone"
        with pytest.raises(TypeError):
            s.put(1, "x")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            s.put("", "x")

    async with nj.open_runtime() as rt:
        await inside(rt.get(Box, "b"), body)


async def test_kv_list_with_prefix() -> None:
    keys = ["a", "ab", "abc", "b", "a%", "a_", "A", "ä", "user:1", "user:2", "user:10", "users"]

    def body(s: nj.Storage) -> None:
        for n, key in enumerate(keys):
            s.put(key, n)
        everything = s.list()
        assert list(everything) == sorted(keys)
        assert everything == {key: n for n, key in enumerate(keys)}
        assert s.list("a") == {"a": 0, "ab": 1, "abc": 2, "a%": 4, "a_": 5}
        assert s.list("ab") == {"ab": 1, "abc": 2}
        assert s.list("a%") == {"a%": 4}  # no LIKE wildcards
        assert s.list("a_") == {"a_": 5}
        assert s.list("user:") == {"user:1": 8, "user:10": 10, "user:2": 9}
        assert s.list("ä") == {"ä": 7}
        assert s.list("zzz") == {}

    async with nj.open_runtime() as rt:
        await inside(rt.get(Box, "b"), body)


async def test_values_go_through_the_codec(tmp_path: Path) -> None:
    when = dt.datetime(2027, 3, 4, 5, 6, 7, 890, tzinfo=dt.timezone(dt.timedelta(hours=-3)))
    values = {
        "when": when,
        "tags": {"x", "y", 3},
        "pair": (1, "two"),
        "frozen": frozenset({1, 2}),
        "blob": b"\x00\xff",
        "big": 2**100,
    }

    def write(s: nj.Storage) -> None:
        for key, value in values.items():
            s.put(key, value)

    def read(s: nj.Storage) -> dict[str, Any]:
        raw = dict(s.execute("SELECT key, value FROM nj_kv").fetchall())
        assert all(isinstance(text, str) for text in raw.values())  # stored as text
        return {key: s.get(key) for key in values}

    async with nj.open_runtime(tmp_path) as rt:
        await inside(rt.get(Box, "b"), write)
    # Read back in a fresh runtime, so the values come from disk.
    async with nj.open_runtime(tmp_path) as rt:
        got = await inside(rt.get(Box, "b"), read)
    assert got == values
    for key, value in values.items():
        assert type(got[key]) is type(value), key
    assert got["when"].utcoffset() == dt.timedelta(hours=-3)


async def test_unencodable_values_are_refused_before_writing() -> None:
    def body(s: nj.Storage) -> None:
        s.put("k", "before")
        with pytest.raises(nj.CodecError):
            s.put("k", lambda: None)
        with pytest.raises(nj.CodecError):
            s.put("k", object())
        assert s.get("k") == "before"

    async with nj.open_runtime() as rt:
        await inside(rt.get(Box, "b"), body)


async def test_transaction_commits_together(tmp_path: Path) -> None:
    # The runtime holds each object database exclusively, so no outside reader can
    # look in mid-transaction; the open transaction is checked from inside, and what
    # it committed from outside once the runtime has closed.
    seen: list[bool] = []

    def body(s: nj.Storage) -> None:
        s.execute("CREATE TABLE t (x INTEGER)")
        with s.transaction() as tx:
            assert tx is s
            s.put("a", 1)
            s.put("b", 2)
            s.execute("INSERT INTO t VALUES (?)", [1])
            s.db["t"].insert({"x": 2})
            seen.append(s.conn.in_transaction)  # one open transaction holds all four
            assert s.get("a") == 1  # ... visible from inside
        seen.append(s.conn.in_transaction)

    async with nj.open_runtime(tmp_path) as rt:
        await inside(rt.get(Box, "b"), body)
    assert seen == [True, False]
    reader = sqlite3.connect(object_db_path(tmp_path))
    try:
        kv = reader.execute("SELECT COUNT(*) FROM nj_kv").fetchone()[0]
        t = reader.execute("SELECT COUNT(*) FROM t").fetchone()[0]
    finally:
        reader.close()
    assert kv + t == 4


async def test_raising_transaction_rolls_everything_back(tmp_path: Path) -> None:
    def body(s: nj.Storage) -> None:
        s.execute("CREATE TABLE t (x INTEGER)")
        s.put("keep", "old")
        with pytest.raises(Boom):
            with s.transaction():
                s.put("new", 1)
                s.put("keep", "overwritten")
                assert s.delete("keep") is True
                s.execute("INSERT INTO t VALUES (1)")
                s.execute("CREATE TABLE u (y)")
                s.db["t"].insert({"x": 2})
                raise Boom
        assert not s.conn.in_transaction

    def read(s: nj.Storage) -> tuple[Any, ...]:
        return (
            s.list(),
            s.execute("SELECT COUNT(*) FROM t").fetchone()[0],
            s.db["u"].exists(),
        )

    async with nj.open_runtime(tmp_path) as rt:
        box = rt.get(Box, "b")
        await inside(box, body)
        assert await inside(box, read) == ({"keep": "old"}, 0, False)
    async with nj.open_runtime(tmp_path) as rt:
        assert await inside(rt.get(Box, "b"), read) == ({"keep": "old"}, 0, False)


async def test_nested_transaction_rolls_back_the_inner_only() -> None:
    def body(s: nj.Storage) -> None:
        s.execute("CREATE TABLE t (x INTEGER)")
        with s.transaction():
            s.put("outer-1", 1)
            s.execute("INSERT INTO t VALUES (1)")
            with pytest.raises(Boom):
                with s.transaction():
                    s.put("inner", 2)
                    s.execute("INSERT INTO t VALUES (2)")
                    with s.transaction():  # two levels deep
                        s.put("innermost", 3)
                    raise Boom
            assert s.get("inner") is None
            assert s.conn.in_transaction  # the outer one is still open
            s.put("outer-2", 4)
            with s.transaction():
                s.put("inner-ok", 5)
        assert not s.conn.in_transaction

    def read(s: nj.Storage) -> tuple[Any, ...]:
        rows = [r[0] for r in s.execute("SELECT x FROM t ORDER BY x")]
        return s.list(), rows

    async with nj.open_runtime() as rt:
        box = rt.get(Box, "b")
        await inside(box, body)
        assert await inside(box, read) == ({"inner-ok": 5, "outer-1": 1, "outer-2": 4}, [1])


async def test_outer_rollback_discards_committed_inner_savepoints() -> None:
    def body(s: nj.Storage) -> None:
        with pytest.raises(Boom):
            with s.transaction():
                s.put("a", 1)
                with s.transaction():
                    s.put("b", 2)
                raise Boom
        return s.list()

    async with nj.open_runtime() as rt:
        assert await inside(rt.get(Box, "b"), body) == {}


async def test_execute_raw_sql_and_sqlite_utils_db() -> None:
    def body(s: nj.Storage) -> Any:
        assert isinstance(s.db, sqlite_utils.Database)
        s.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, expires_at REAL)")
        s.execute("INSERT INTO sessions VALUES (?, ?)", ["a", 10.0])
        s.execute("INSERT INTO sessions VALUES (:id, :t)", {"id": "b", "t": 20.0})
        s.db["sessions"].insert({"id": "c", "expires_at": 30.0})
        s.db["people"].insert({"name": "Ada", "age": 36}, pk="name")
        cursor = s.execute("DELETE FROM sessions WHERE expires_at < ?", [25.0])
        assert cursor.rowcount == 2
        assert "people" in s.db.table_names()
        assert "nj_kv" in s.db.table_names()
        return (
            [row["id"] for row in s.db["sessions"].rows],
            s.db["people"].get("Ada")["age"],
        )

    async with nj.open_runtime() as rt:
        box = rt.get(Box, "b")
        assert await inside(box, body) == (["c"], 36)
        # Raw SQL errors reach the caller as sqlite3 errors.
        with pytest.raises(sqlite3.OperationalError):
            await inside(box, lambda s: s.execute("SELECT * FROM no_such_table"))


@pytest.mark.parametrize(("durability", "synchronous"), [("normal", 1), ("full", 2)])
async def test_durability(tmp_path: Path, durability: str, synchronous: int) -> None:
    def body(s: nj.Storage) -> tuple[Any, ...]:
        s.put("k", durability)
        return (
            s.execute("PRAGMA synchronous").fetchone()[0],
            s.execute("PRAGMA journal_mode").fetchone()[0],
        )

    async with nj.open_runtime(tmp_path, durability=durability) as rt:  # type: ignore[arg-type]
        assert await inside(rt.get(Box, "b"), body) == (synchronous, "wal")
    async with nj.open_runtime(tmp_path, durability=durability) as rt:  # type: ignore[arg-type]
        assert await inside(rt.get(Box, "b"), lambda s: s.get("k")) == durability


async def test_bad_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        async with nj.open_runtime(tmp_path, durability="paranoid"):  # type: ignore[arg-type]
            pass
