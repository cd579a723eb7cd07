"""What a data directory can recover by itself: the catalog, rebuilt from the object
files, and the quarantine of damaged object files.

Each object database records its identity (``nj_object``: namespace, object id, class
path), written when the files engine opens it, so that the catalog — an index — can be
rebuilt from the files: the registry from their identities, the alarm index from each
object's earliest job. (A plain object's alarm, set with ``storage.set_alarm``, lives in
the catalog alone and is not recovered; a Lifecycle object's alarm is its jobs'.)
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Final

import attrs

from nursery_jobs._engines.files._catalog import Catalog, object_file_name

logger = logging.getLogger("nursery_jobs")

QUARANTINE: Final = "quarantine"
# A destroyed object's file is renamed to this first, so that a death half-way never
# leaves a file the catalog does not know (it would be adopted back) or a registry row
# whose file is gone (it would be a missing-file fault).
DESTROYED_SUFFIX: Final = ".destroyed"
_IDENTITY_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS nj_object (namespace TEXT NOT NULL, object_id TEXT NOT NULL,"
    " class_path TEXT NOT NULL)"
)


def stamp_identity(
    conn: sqlite3.Connection, namespace: str, object_id: str, class_path: str
) -> None:
    """Record the object's identity in its own database (once; again if the class path
    changed). One read when it is there already."""
    try:
        row = conn.execute("SELECT namespace, object_id, class_path FROM nj_object").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        row = None
    if row == (namespace, object_id, class_path):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_IDENTITY_TABLE)
        conn.execute("DELETE FROM nj_object")
        conn.execute("INSERT INTO nj_object VALUES (?, ?, ?)", (namespace, object_id, class_path))
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@attrs.frozen(kw_only=True)
class FileFacts:
    """What the catalog needs of one object file."""

    namespace: str
    object_id: str
    class_path: str
    alarm: float | None  # the earliest job's time


def read_facts(path: Path) -> FileFacts | str:
    """The identity and earliest job of the object database at ``path``, or why they
    cannot be read."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    except sqlite3.Error as exc:
        return f"cannot open it: {exc}"
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "nj_object" not in tables:
            return "it holds no identity (written before identities were recorded; it is" \
                   " adopted when its object is next called)"
        row = conn.execute("SELECT namespace, object_id, class_path FROM nj_object").fetchone()
        if row is None:
            return "its identity table is empty"
        alarm = None
        if "nj_jobs" in tables:
            alarm = conn.execute("SELECT MIN(time) FROM nj_jobs").fetchone()[0]
        return FileFacts(namespace=str(row[0]), object_id=str(row[1]), class_path=str(row[2]),
                         alarm=None if alarm is None else float(alarm))
    except sqlite3.Error as exc:
        return f"cannot read it: {exc}"
    finally:
        conn.close()


@attrs.frozen(kw_only=True)
class Adoption:
    """What ``adopt_files`` did."""

    objects: int
    alarms: int
    skipped: dict[str, str]  # file -> why it was not adopted


def adopt_files(catalog: Catalog, objects_dir: Path, now: float) -> Adoption:
    """Register every object file in ``objects_dir`` the catalog does not know, with
    the alarm of its earliest job. Files whose identity cannot be read are left alone."""
    known = catalog.files()
    objects = alarms = 0
    skipped: dict[str, str] = {}
    with os.scandir(objects_dir) as entries:
        names = sorted(e.name for e in entries if e.name.endswith(".sqlite3") and e.is_file())
    for name in names:
        if name in known:
            continue
        facts = read_facts(objects_dir / name)
        if isinstance(facts, str):
            skipped[name] = facts
            continue
        if object_file_name(facts.namespace, facts.object_id) != name:
            skipped[name] = (f"it names {facts.namespace}/{facts.object_id}, whose file is"
                             f" {object_file_name(facts.namespace, facts.object_id)}")
            continue
        catalog.adopt(facts.namespace, facts.object_id, facts.class_path, now, facts.alarm)
        objects += 1
        alarms += facts.alarm is not None
    for name, why in skipped.items():
        logger.warning("object file %s was not adopted into the catalog: %s",
                       objects_dir / name, why)
    return Adoption(objects=objects, alarms=alarms, skipped=skipped)


def finish_destroys(catalog: Catalog, objects_dir: Path) -> None:
    """Complete the destroys a dead process left half-done (see ``DESTROYED_SUFFIX``)."""
    with os.scandir(objects_dir) as entries:
        names = [e.name for e in entries if e.name.endswith(DESTROYED_SUFFIX)]
    for name in names:
        catalog.forget_file(name.removesuffix(DESTROYED_SUFFIX))
        os.unlink(objects_dir / name)


def move_aside(path: Path, target: Path) -> Path:
    """Move ``path`` and its ``-wal``/``-shm`` files to ``target`` (made unique with a
    counter if taken); return where the database went."""
    target.parent.mkdir(parents=True, exist_ok=True)
    final, n = target, 0
    while final.exists():
        n += 1
        final = target.with_name(f"{target.name}.{n}")
    for suffix in ("-wal", "-shm"):
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, f"{final}{suffix}")
    os.replace(path, final)
    return final


def quarantine_path(objects_dir: Path, file: str) -> Path:
    return objects_dir / QUARANTINE / file
