"""Who holds an object's database in a transaction, and when it commits.

Three kinds of transaction share one connection:

- the *group* (``BEGIN``), opened by the alarm run before a job: the jobs' writes and
  their outcomes commit together, every ``completion_group`` jobs, when the run ends,
  and at the *output gate* (before a stub call returns to its caller);
- the running job's savepoint (``nj_job``): a job that fails is rolled back, so its
  re-run finds the storage as it was (exactly-once local effects);
- a user block (``storage.transaction()``): a real transaction, or a savepoint inside
  the group. While it is open, only the task that opened it may write.

A write from another task while a job's savepoint is open (a call that runs while the
job, having written, awaits) joins that savepoint: the job's writes must stay undoable,
or a failure would keep them and its re-run make them again. If the job then fails,
the other task's writes are undone with its own, and that task is told: a stub call
waits at its output gate for the job, then raises ``StorageError`` (``kept``).
"""

from __future__ import annotations

import sqlite3
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import trio

from nursery_jobs._errors import StorageError

_JOB = "nj_job"


class atomic:  # (lower case: used as a function, ``with atomic(conn):``)
    """``BEGIN`` ... ``COMMIT``, or ``ROLLBACK`` if the block raises (on a connection
    with no transaction open).

    A class, not a ``@contextmanager``: every push passes through it, and a generator
    context manager costs ~1 µs more per use (measured: 1.17 against 0.17 µs).
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        conn = self._conn
        if kind is None:
            conn.execute("COMMIT")
        elif conn.in_transaction:
            conn.execute("ROLLBACK")


class StagedWrites(Protocol):
    """Writes of the group held back until its next read, user savepoint or commit (the
    deletes of finished jobs, ``JobTable``): they belong to the group. Run while a job's
    savepoint is open, they are undone with it if it rolls back, and staged again."""

    def settle(self) -> None:
        """Run the staged writes now (in the group)."""

    def drop_staged(self) -> None:
        """Forget them: the group was rolled back."""

    def enter_savepoint(self) -> None:
        """The running job's savepoint opened."""

    def leave_savepoint(self, *, undone: bool) -> None:
        """It ended: released, or rolled back (``undone``)."""


class BlockWatcher(Protocol):
    """What must be undone in memory when a ``storage.transaction()`` rolls back (the
    job store's: whether the running job was superseded, its queue mutations to make
    again if it fails)."""

    def mark(self) -> object:
        """Note the state as a block begins."""

    def undo(self, mark: object) -> None:
        """The block rolled back: what it did in memory goes too."""


class ObjectTransactions:
    """The transaction state of one object's database."""

    __slots__ = (
        "_job_done",
        "_job_joined",
        "_job_lost",
        "_joined",
        "_lost_tasks",
        "_telling",
        "_undone",
        "_user_done",
        "_user_savepoints",
        "blocks",
        "conn",
        "group",
        "job_dirty",
        "job_generation",
        "job_savepoint",
        "job_task",
        "label",
        "staged",
        "user_task",
    )

    def __init__(self, conn: sqlite3.Connection, label: str) -> None:
        self.conn = conn
        self.label = label
        self.group = False  # the alarm run's group transaction is open
        self.job_task: trio.lowlevel.Task | None = None
        self.job_savepoint = False
        # Bumped whenever a job savepoint opens: what a rollback undoes is what was
        # written under the savepoint of the generation it rolls back.
        self.job_generation = 0
        # The running job has written (through storage or the job API) since it began.
        self.job_dirty = False
        self._job_done: trio.Event | None = None
        self.user_task: trio.lowlevel.Task | None = None
        self._user_done: trio.Event | None = None
        self._user_savepoints = 0
        self.staged: StagedWrites | None = None
        self.blocks: BlockWatcher | None = None
        self._job_lost = False  # the running job's savepoint went with a lost group
        # Tasks other than the running job that wrote into the open group, and those
        # whose writes a lost group took with it (their call must not report success).
        self._joined: dict[trio.lowlevel.Task, None] = {}
        # (Weak: a task that never reaches an output gate is not kept alive by it.)
        self._lost_tasks: weakref.WeakSet[trio.lowlevel.Task] = weakref.WeakSet()
        # Other tasks that wrote under the running job's savepoint (undone if it fails),
        # and those whose writes were undone so, until they are told.
        self._job_joined: dict[trio.lowlevel.Task, None] = {}
        self._undone: weakref.WeakSet[trio.lowlevel.Task] = weakref.WeakSet()
        self._telling = False  # whether _undone may hold a task (a cheap test per write)

    # -- writes -------------------------------------------------------------------------
    def check_write(self, *, replayed: bool = False) -> None:
        """Before a write: refuse one from outside an open user block; for the running
        job's own write, make sure its savepoint is open; a write from another task
        joins the job's savepoint, if open (see the module's docstring), and its task is
        told if the job fails — unless the write is ``replayed`` (made again then, by
        the job store). Does not checkpoint."""
        if self.group and not self.conn.in_transaction:
            self._lost()  # (a fault rolled the group back: this write is not part of it)
        if self._telling:
            self._tell_undone()
        if self.user_task is None and self.job_task is None:
            if self.group:
                self._joined[trio.lowlevel.current_task()] = None
            return
        task = trio.lowlevel.current_task()
        if self.user_task is not None and self.user_task is not task:
            raise StorageError(
                f"{self.label}: a storage.transaction() of another task is open (it awaited"
                " inside the block); this write would be committed or rolled back with"
                " it. Write after that block ends, or do not await inside it"
            )
        if task is self.job_task:
            self.job_dirty = True
            if not self.job_savepoint:
                self._open_job_savepoint()
            return
        if self.job_savepoint and not replayed:
            self._job_joined[task] = None
        if self.group:
            self._joined[task] = None

    def _tell_undone(self) -> None:
        """A task whose writes a failing job's rollback undid, and which was not told at
        an output gate (tracked work, a background task; a call still running), is told
        at its next write."""
        task = trio.lowlevel.current_task()
        told = task in self._undone
        self._undone.discard(task)
        self._telling = bool(self._undone)  # (tasks that ended have left it)
        if told:
            self._lost_tasks.discard(task)
            raise StorageError(
                f"{self.label}: writes this task made beside a running job were undone when"
                " that job failed (they had joined its transaction); nothing of them was"
                " kept, and this write was not made"
            )

    def open_group(self) -> None:
        """``BEGIN`` the group. What is still staged belongs to a group that was rolled
        back (a group settles before it commits): it goes."""
        if self.staged is not None:
            self.staged.drop_staged()
        self.conn.execute("BEGIN")
        self.group = True

    def _settle(self) -> None:
        if self.staged is not None:
            self.staged.settle()

    def _open_job_savepoint(self) -> None:
        if not self.conn.in_transaction:
            self.open_group()
        self.conn.execute(f"SAVEPOINT {_JOB}")
        self.job_savepoint = True
        self.job_generation += 1
        if self.staged is not None:
            self.staged.enter_savepoint()

    def _release_job_savepoint(self, *, undo: bool = False) -> None:
        """End the running job's savepoint: keep what it wrote (in the group), or undo
        it first (``undo``)."""
        self.job_savepoint = False
        if undo:
            self.conn.execute(f"ROLLBACK TO {_JOB}")
        self.conn.execute(f"RELEASE {_JOB}")
        if self.staged is not None:
            self.staged.leave_savepoint(undone=undo)
        if undo:
            # Told at their output gate, or at their next write.
            self._lost_tasks.update(self._job_joined)
            self._undone.update(self._job_joined)
            self._telling = bool(self._job_joined) or self._telling
        self._job_joined.clear()

    def foreign_user_block(self) -> bool:
        """Whether a user block of another task is open now."""
        return self.user_task is not None and self.user_task is not trio.lowlevel.current_task()

    async def wait_for_user_block(self) -> None:
        """Wait until no user block of another task is open. Checkpoints."""
        while self.foreign_user_block():
            assert self._user_done is not None
            await self._user_done.wait()
        await trio.lowlevel.checkpoint()

    # -- the group and the job ------------------------------------------------------------
    def begin_job(self) -> None:
        """Open the group (if needed) for a job of the current task. Its savepoint opens
        at its first write through storage or the job API (``check_write``): a job that
        writes nothing costs no savepoint. (Writes through ``storage.db`` do not pass
        ``check_write``: they commit with the group, but a failing job does not undo
        them unless it has written through ``storage`` first.)"""
        if not self.conn.in_transaction:
            self.open_group()
        self.job_dirty = False
        self._job_lost = False
        self.job_task = trio.lowlevel.current_task()
        self._job_done = None

    def end_job(self, *, keep: bool) -> None:
        """Keep (release) or undo (roll back) what the job wrote."""
        if self.job_savepoint and not self._lost():
            self._release_job_savepoint(undo=not keep)
        lost, self._job_lost = self._job_lost, False
        if lost:
            # A failed statement rolled everything back: the job's writes are gone, so
            # its outcome must not be recorded — it runs again.
            self.job_task = None
            if keep:
                raise StorageError(
                    f"{self.label}: the job's transaction was rolled back by a failed"
                    " write; the job runs again"
                )
        self.job_task = None
        self.job_dirty = False
        if self._job_done is not None:
            self._job_done.set()
            self._job_done = None

    def _lost(self) -> bool:
        """Whether the group was rolled back underneath us (a statement failed and the
        connection rolled back): forget it, and the job's savepoint with it."""
        if self.group and not self.conn.in_transaction:
            if self.job_savepoint:
                self._job_lost = True  # (told at the job's end: its writes are gone)
            self.group = self.job_savepoint = False
            self._forget_group()
            return True
        return False

    def _forget_group(self) -> None:
        """The group was rolled back: its staged writes go, and the tasks that wrote into
        it are told at their output gate (``kept``)."""
        if self.staged is not None:
            self.staged.drop_staged()
        self._lost_tasks.update(self._joined)
        self._joined.clear()
        self._job_joined.clear()

    def kept(self) -> bool:
        """Whether the current task's writes since its last output gate still stand
        (False: a lost group took them). Forgets the answer. Does not checkpoint."""
        task = trio.lowlevel.current_task()
        self._joined.pop(task, None)
        if task in self._lost_tasks:
            self._lost_tasks.discard(task)
            self._undone.discard(task)
            return False
        return True

    def abort_group(self) -> None:
        """Roll the group back: what it holds (completed jobs' writes and outcomes, the
        running job's writes) could not all be recorded, so none of it is, and those
        jobs run again on storage as it was — still exactly once."""
        self.group = self.job_savepoint = False
        self._forget_group()
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def commit_group(self) -> None:
        """Commit the group now, unless a user block is open (its writes must not commit
        half-way) or a running job has written (half a job must not commit: a failure
        after would keep its writes, and its re-run would make them again; its end, or
        an output gate that waits for it, commits). A running job's savepoint ends with
        the commit; the job's next write opens a new one. Does not checkpoint."""
        if (not self.group or self.user_task is not None
                or (self.job_task is not None and self.job_dirty) or self._lost()):
            return
        try:
            if self.job_savepoint:
                self._release_job_savepoint()
            self._settle()
            self.conn.execute("COMMIT")
        except BaseException:
            # The group is lost (the disk refused it): its jobs run again, and their
            # writes went with it — still exactly once.
            self.abort_group()
            raise
        else:
            self._joined.clear()
        finally:
            self.group = self.job_savepoint = False

    async def output_gate(self) -> None:
        """Before a call returns to its caller: what it was told has happened is
        committed. Checkpoints only when it must wait.

        A running job that has written and awaits is waited for: committing now would
        commit half a job, and a death before its outcome would then run it again on
        top of its own writes. (A call the job itself makes commits with the job.)
        """
        while self.group:
            task = trio.lowlevel.current_task()
            if task is self.job_task:
                return  # the job's own call: its writes commit with the job's outcome
            if self.foreign_user_block():
                await self.wait_for_user_block()
                continue
            if self.job_task is not None and self.job_dirty:
                if self._job_done is None:
                    self._job_done = trio.Event()
                await self._job_done.wait()
                continue
            self.commit_group()
            return

    # -- user blocks ----------------------------------------------------------------------
    @contextmanager
    def user_block(self) -> Iterator[None]:
        """``storage.transaction()``: all or nothing; a savepoint when a transaction (the
        group, or an enclosing block of the same task) is already open."""
        task = trio.lowlevel.current_task()
        if self.user_task is not None and self.user_task is not task:
            raise StorageError(
                f"{self.label}: a storage.transaction() of another task is open; blocks of"
                " two tasks cannot interleave"
            )
        self.check_write()
        outer = self.user_task is None
        if outer:
            self.user_task = task
            self._user_done = trio.Event()
        conn = self.conn
        mark = None if self.blocks is None else self.blocks.mark()
        try:
            if not conn.in_transaction:
                with atomic(conn):
                    yield
                return
            self._settle()
            self._user_savepoints += 1
            name = f"nj_user_{self._user_savepoints}"
            conn.execute(f"SAVEPOINT {name}")
            try:
                yield
            except BaseException:
                if conn.in_transaction:
                    conn.execute(f"ROLLBACK TO {name}")
                    conn.execute(f"RELEASE {name}")
                raise
            else:
                conn.execute(f"RELEASE {name}")
            finally:
                self._user_savepoints -= 1
        except BaseException:
            if self.blocks is not None:
                self.blocks.undo(mark)  # its writes were rolled back
            raise
        finally:
            if outer:
                self.user_task = None
                assert self._user_done is not None
                self._user_done.set()
                self._user_done = None
