"""Turns: one task changes an object at a time (DESIGN section 2, "Turns").

Each object has one ``TurnGate``. A stub call, an alarm run and startup each hold a
*turn* from start to end, across their awaits; others wait in arrival order. A turn
belongs to the task that entered it and to the tasks it starts while it holds it, in
nurseries that are not the runtime's (a context variable carries the turn to them, and
is checked for naming the current holding); a task that outlives its turn holds
nothing. Storage asks the
gate (``check``) before every read and write, so a task without a turn gets
``TurnError`` and touches nothing.

``@read_only`` methods hold *read* turns, which run side by side between writing turns;
``@interleave`` methods hold none. A call that comes back to an object along its own call
chain (the object calling itself, A -> B -> A, also across hosts: the chain travels with
a forwarded call) runs inside the turn the chain holds.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import math
import os
import secrets
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, TypeVar

import trio

from nursery_jobs._errors import TurnError

logger = logging.getLogger("nursery_jobs")

Kind = Literal["write", "read"]
Task = trio.lowlevel.Task
F = TypeVar("F", bound=Callable[..., Any])

# What a method's decorator asks for: a read turn, or no turn at all.
TURN_ATTRIBUTE: Final = "__nursery_jobs_turn__"

# Holding ids are unique across hosts (they travel with forwarded calls).
_PREFIX: Final = f"{os.getpid():x}.{secrets.token_hex(4)}"
_SERIAL = itertools.count(1)

# The current task's call chain: (its links, the holder that set it). A link is a
# ``Holder`` of this process or the id of one elsewhere (a forwarded call's chain). The
# variable travels to tasks started while it is set, and only there: a task started
# before a turn was entered does not carry it. A task carrying it holds the links' turns
# only if it descends from the holder that set it through nurseries that are not the
# runtime's (``hosting``): a task started in the object's nursery (``ctx.nursery``)
# inherits the variable, not the chain.
_chain: contextvars.ContextVar[tuple[tuple[Holder | str, ...], Holder] | None] = (
    contextvars.ContextVar("nursery_jobs_call_chain", default=None)
)

# While an ``@interleave`` call runs (and in tasks it starts meanwhile): the output gate
# its ``ctx.turn()`` blocks end with (``ObjectHost.call``). Shipped after the block, the
# commits would wait for whatever holds the object next (an alarm run's open group)
# while the caller was already told of them.
interleave_gate: contextvars.ContextVar[Callable[[], Awaitable[None]] | None] = (
    contextvars.ContextVar("nursery_jobs_interleave_gate", default=None)
)

# The runtime's nurseries (its own, each object's ``ctx.nursery``): the tasks in them
# run the rest of the program, whoever started them.
_HOSTING: set[trio.Nursery] = set()


@asynccontextmanager
async def open_host_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery of the runtime's: no task in it holds a turn through the task that
    started it."""
    async with trio.open_nursery() as nursery:
        _HOSTING.add(nursery)
        try:
            yield nursery
        finally:
            _HOSTING.discard(nursery)


def read_only(fn: F) -> F:
    """Mark an object's method read-only: its calls share the object with one another,
    between writing turns; a write inside raises ``TurnError``."""
    setattr(fn, TURN_ATTRIBUTE, "read")
    return fn


def interleave(fn: F) -> F:
    """Mark an object's method as holding no turn: it may await anything (a long poll,
    an event a job sets) and enters ``ctx.turn()`` to touch storage."""
    setattr(fn, TURN_ATTRIBUTE, "none")
    return fn


# Where a call or alarm run stands in line: the kind of its turn, and who holds it.
Place = tuple[Kind, str]


def call_place(cls: type, name: str) -> Place | None:
    """The place in line a call of method ``name`` of ``cls`` takes (None: it holds no
    turn, ``@interleave``)."""
    kind = method_turn(getattr(cls, name, None))
    return None if kind is None else (kind, f"call {name}()")


def method_turn(fn: Any) -> Kind | None:
    """The turn a call of ``fn`` takes: "write" (the default), "read" or None."""
    kind = getattr(fn, TURN_ATTRIBUTE, "write")
    if kind == "read":
        return "read"
    return None if kind == "none" else "write"


def _links() -> tuple[Holder | str, ...]:
    """The links of the current task's call chain (none: it carries none, or not
    through the holder that set it). Does not checkpoint."""
    value = _chain.get()
    if value is None:
        return ()
    links, owner = value
    return links if owner.covers(trio.lowlevel.current_task()) else ()


def in_chain() -> bool:
    """Whether the current task runs in a call chain (it holds a turn, or serves a call
    made from one). Does not checkpoint."""
    return bool(_links())


def call_chain() -> tuple[str, ...]:
    """The holding ids of the current task's call chain, to send with a forwarded call.
    Does not checkpoint."""
    return tuple(link if isinstance(link, str) else link.ident() for link in _links())


def adopt_chain(ids: tuple[str, ...]) -> contextvars.Token[Any]:
    """A forwarded call arrived with the chain ``ids``: the current task carries it."""
    return _chain.set((ids, Holder(trio.lowlevel.current_task())))


def forget_chain(token: contextvars.Token[Any]) -> None:
    _chain.reset(token)


class Holder:
    """One task's hold of one turn: one admission of it, or one job of an alarm run
    (``renew``), whichever is shorter. The turn is the task's and that of the tasks
    started while it holds it, at any depth, in nurseries that are not the runtime's
    (the call chain's context variable carries it to them). Its ``id``, made when a
    forwarded call first carries it, names it in call chains elsewhere."""

    __slots__ = ("id", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.id: str | None = None

    def ident(self) -> str:
        if self.id is None:
            self.id = f"{_PREFIX}.{next(_SERIAL)}"
        return self.id

    def covers(self, task: Task) -> bool:
        """Whether ``task`` is this holder's, or descends from it through nurseries
        not the runtime's. Does not checkpoint."""
        holder = self.task
        while task is not holder:
            nursery = task.parent_nursery
            if nursery is None or nursery in _HOSTING:
                return False
            task = nursery.parent_task
        return True


class Turn:
    """One held turn: who entered it, for what, since when."""

    __slots__ = ("holder", "kind", "runs_startup", "since", "tasks", "warned")

    def __init__(self, kind: Kind, holder: str, task: Task | None) -> None:
        self.kind = kind
        self.holder = holder
        # A read turn admitted as a writing one, the object's startup pending: it runs
        # the startup at its place in line, then is a read turn (``TurnBlock.end_startup``).
        self.runs_startup = False
        self.since = trio.current_time()
        self.warned = False  # object:turn_slow emitted (for this admission: ``_admit``)
        # The task that entered it (first) and tasks re-entering it by call chain; none
        # for a place in line no task has taken yet (``reserve``).
        self.tasks: list[Holder] = [] if task is None else [Holder(task)]


class _Waiter:
    __slots__ = ("admitted", "event", "turn")

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.event = trio.Event()
        self.admitted = False


class Ticket:
    """A place in an object's line for a turn taken later (``TurnGate.reserve``)."""

    __slots__ = ("claimed", "gate", "kind", "turn", "waiter")

    def __init__(self, gate: TurnGate, turn: Turn, waiter: _Waiter | None) -> None:
        self.gate = gate
        self.kind = turn.kind  # (asked for: ``turn`` may be admitted as a writing one)
        self.turn = turn
        self.waiter = waiter  # (None: admitted at once)
        self.claimed = False  # taken by a task, or dropped


class TurnGate:
    """The turns of one object: one writing turn, or any number of read turns, at a
    time; the rest wait in arrival order."""

    __slots__ = ("__weakref__", "_emit", "_label", "_readers", "_slow", "_waiters",
                 "startup_pending", "watched", "writer", "writer_task")

    def __init__(
        self, label: str, *, slow: SlowTurns | None = None,
        emit: Callable[[float, str], None] = lambda seconds, holder: None,
    ) -> None:
        self._label = label
        self._slow = slow
        self._emit = emit  # object:turn_slow {seconds, holder}
        self.writer: Turn | None = None
        # The task that entered the writing turn (the one check that storage's hot path
        # makes: a job's writes come from the alarm run's own task).
        self.writer_task: Task | None = None
        self._readers: list[Turn] = []
        self._waiters: deque[_Waiter] = deque()
        self.watched = False  # (SlowTurns has a look at this gate due)
        # Whether the object's startup (the Lifecycle's) is still to run, by the first
        # turn admitted: no read turn is admitted as one meanwhile (``_admit``).
        self.startup_pending = False

    @property
    def waiting(self) -> bool:
        """Whether a call (or another turn) waits for this object. Does not checkpoint."""
        return bool(self._waiters)

    # -- the check storage makes ----------------------------------------------------------
    def check(self, *, write: bool) -> None:
        """Raise ``TurnError`` unless the current task holds a turn here (a writing one,
        for a write). Does not checkpoint."""
        task = trio.lowlevel.current_task()
        if task is self.writer_task:
            return
        turn = self._holding(task)
        if write and turn.kind == "read":
            raise TurnError(
                f"{self._label}: a write inside a read-only turn ({turn.holder}); nothing"
                " was written. Drop @nj.read_only from the method, or write elsewhere",
                object_label=self._label,
            )

    def held_kind(self) -> Kind:
        """The kind of turn the current task holds here (``TurnError``: none). Does not
        checkpoint."""
        task = trio.lowlevel.current_task()
        return "write" if task is self.writer_task else self._holding(task).kind

    def _holding(self, task: Task) -> Turn:
        turn = self._held_by(task)
        if turn is None:
            raise TurnError(
                f"{self._label}: storage was touched by a task that holds no turn of the"
                " object (a background task, tracked work, an @nj.interleave method, or a"
                " task that outlived the call that started it); nothing was read or"
                " written. Enter one with `async with self.ctx.turn():`",
                object_label=self._label,
            )
        return turn

    def _held_by(self, task: Task) -> Turn | None:
        """The turn ``task`` holds: one whose holder is a link of its call chain (it
        is that holder's task or descends from it, and started while it held it)."""
        value = _chain.get()
        if value is None:
            return None
        links, owner = value
        if not owner.covers(task):
            return None
        for turn in [self.writer] if self.writer is not None else self._readers:
            assert turn is not None
            for holder in turn.tasks:
                if holder in links:
                    return turn
        return None

    def holds(self) -> bool:
        """Whether the current task holds a turn here. Does not checkpoint."""
        task = trio.lowlevel.current_task()
        return task is self.writer_task or self._held_by(task) is not None

    # -- entering and leaving ---------------------------------------------------------------
    def turn(
        self, kind: Kind = "write", holder: str = "ctx.turn()", *, ticket: Ticket | None = None,
    ) -> TurnBlock:
        """Hold a turn of the object for the block (or run inside the turn the caller's
        call chain already holds). With ``ticket`` (``reserve``): the turn is the one
        that place in line stands for, taken by the current task. Checkpoints on the
        way in."""
        return TurnBlock(self, kind, holder, ticket)

    @asynccontextmanager
    async def gated_turn(self, holder: str, ship: Callable[[], Awaitable[None]]
                         ) -> AsyncIterator[None]:
        """``turn("write", holder)``, whose commits ``await ship()`` makes durable before
        it ends (also when the block raised: they stand). Checkpoints."""
        async with self.turn("write", holder):
            try:
                yield
            except Exception:
                await ship()
                raise
            await ship()

    async def hand_over(self, holder: str) -> None:
        """Between two jobs of an alarm run: let the calls that wait have the object, then
        take it back (last in line): a new holding of the turn (``renew``). Checkpoints.

        Cancelled while it waits, it still waits for the object, shielded, a bounded
        while (the calls ahead are cancelled with it), so that the run's cleanup holds
        the turn; ``holds()`` tells whether it got it back.
        """
        turn = self.writer
        assert turn is not None and self.writer_task is trio.lowlevel.current_task()
        self._leave(turn)
        try:
            await self._enter(turn)
        except trio.Cancelled:
            with trio.move_on_after(_CLEANUP_WAIT, shield=True):
                await self._enter(turn)
            raise
        finally:
            self._renewed(turn)

    def renew(self) -> None:
        """Between two jobs of an alarm run: what the last job made holds nothing from
        here on. A call it forwarded that comes back later (its caller gave up on it,
        the call went on elsewhere) is no part of the next job's chain: it waits for
        the turn, rather than run inside the next job and roll back with it. (Only a
        holding that a forwarded call carried is replaced: a job whose calls stayed on
        this host left nothing behind that names it.) Does not checkpoint."""
        turn = self.writer
        assert turn is not None and self.writer_task is trio.lowlevel.current_task()
        if turn.tasks[0].id is not None or len(turn.tasks) > 1:
            self._renewed(turn)

    def _renewed(self, turn: Turn) -> None:
        """A new holding of ``turn`` for its own task, in the current task's chain in
        place of the old one; the guests of the old one hold nothing."""
        old, new = turn.tasks[0], Holder(turn.tasks[0].task)
        turn.tasks = [new]
        value = _chain.get()
        if value is not None and old in value[0]:
            links = tuple(new if link is old else link for link in value[0])
            _chain.set((links, new if value[1] is old else value[1]))

    async def step_out(self, wait: Callable[[], Awaitable[object]]) -> None:
        """Leave the writing turn while ``await wait()`` waits for something outside the
        object (another object's job on probation), then take it back, last in line,
        a new holding — as ``hand_over``, but the object is free for the whole
        wait: calls, a pause or a ``jobs.cancel`` of the waiting job are not held behind
        another object's run. Checkpoints.

        Whatever ends the wait (a cancellation), it still waits for the object,
        shielded, a bounded while, so that the run's cleanup holds the turn;
        ``holds()`` tells whether it got it back.
        """
        turn = self.writer
        assert turn is not None and self.writer_task is trio.lowlevel.current_task()
        self._leave(turn)
        try:
            await wait()
            await self._enter(turn)
        except BaseException:
            if not self._admitted(turn):
                with trio.move_on_after(_CLEANUP_WAIT, shield=True):
                    await self._enter(turn)
            raise
        finally:
            self._renewed(turn)

    def _admitted(self, turn: Turn) -> bool:
        return turn is self.writer or turn in self._readers

    async def _enter(self, turn: Turn) -> None:
        """Wait in line for ``turn`` to be admitted. Checkpoints."""
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._wait(turn, self._queue(turn))

    def _queue(self, turn: Turn) -> _Waiter | None:
        """Admit ``turn`` if the object is free and nobody waits, else put it in line."""
        if not self._waiters and self._free_for(turn.kind):
            self._admit(turn)
            return None
        waiter = _Waiter(turn)
        self._waiters.append(waiter)
        return waiter

    async def _wait(self, turn: Turn, waiter: _Waiter | None) -> None:
        """Wait for ``turn``, queued as ``waiter`` (None: admitted at once) to be
        admitted; cancelled, it leaves the line. Checkpoints."""
        if waiter is None:
            try:
                await trio.lowlevel.cancel_shielded_checkpoint()
            except BaseException:
                self._leave(turn)
                raise
            return
        try:
            await waiter.event.wait()
        except BaseException:
            self._drop_waiter(waiter)
            raise

    def _drop_waiter(self, waiter: _Waiter) -> None:
        if waiter.admitted:
            self._leave(waiter.turn)  # admitted as it was cancelled: pass it on
        else:
            self._waiters.remove(waiter)
            self._admit_waiters()  # (readers behind a cancelled writer may go now)

    # -- places in line for turns taken later --------------------------------------------
    def reserve(self, kind: Kind, holder: str) -> Ticket:
        """A place in line, now, for a turn that a task takes later with
        ``turn(ticket=)`` (perhaps another task: the object's startup, the alarm run a
        delivery starts): a call that arrives while the object starts waits for its
        startup in arrival order, not outside the line. Admitted before it is taken, it
        holds the object for the task that takes it. Whoever reserves makes sure that
        it is taken or dropped (``drop``). Does not checkpoint."""
        turn = Turn(kind, holder, None)
        return Ticket(self, turn, self._queue(turn))

    def drop(self, ticket: Ticket) -> None:
        """Give up ``ticket``'s place (or its turn, if admitted), unless a task took
        it. Idempotent. Does not checkpoint."""
        if ticket.claimed:
            return
        ticket.claimed = True
        if ticket.waiter is None:
            self._leave(ticket.turn)
        else:
            self._drop_waiter(ticket.waiter)

    def _free_for(self, kind: Kind) -> bool:
        if self.writer is not None:
            return False
        return (kind == "read" and not self.startup_pending) or not self._readers

    def _admit(self, turn: Turn) -> None:
        # Each admission is a new holding (an alarm run's turn taken back after a
        # hand-over too): its time and its slow-turn warning start afresh.
        turn.since = trio.current_time()
        turn.warned = False
        if turn.kind == "read" and self.startup_pending:
            # The startup writes, and runs before any call: a read call whose turn
            # comes first runs it, alone, at its own place in line (giving the place up
            # for a writing turn would let what came after it run first).
            turn.kind = "write"
            turn.runs_startup = True
        if turn.kind == "write":
            self.writer = turn
            self.writer_task = turn.tasks[0].task if turn.tasks else None
        else:
            self._readers.append(turn)
        if self._slow is not None:
            self._slow.watch(self, turn.since)

    def _leave(self, turn: Turn) -> None:
        if turn is self.writer:
            self.writer = self.writer_task = None
        elif turn in self._readers:
            self._readers.remove(turn)
        else:
            return
        self._admit_waiters()

    def warn_slow(self, warning: float, now: float) -> float | None:
        """Emit ``object:turn_slow`` once for each turn held ``warning`` seconds by
        ``now``; return when a turn held now would reach it (None: none is held)."""
        held = [self.writer] if self.writer is not None else list(self._readers)
        later: float | None = None
        for turn in held:
            assert turn is not None
            if turn.warned:
                continue
            if turn.since + warning <= now:
                turn.warned = True
                self._emit(warning, turn.holder)
            elif later is None or turn.since < later:
                later = turn.since
        return later

    def _admit_waiters(self) -> None:
        """Hand the object to the waiters at the head of the line: one writer, or every
        reader up to the next writer."""
        waiters = self._waiters
        while waiters and self._free_for(waiters[0].turn.kind):
            waiter = waiters.popleft()
            self._admit(waiter.turn)
            waiter.admitted = True
            waiter.event.set()
            if waiter.turn.kind == "write":
                return

    def _by_chain(self, links: tuple[Holder | str, ...]) -> Turn | None:
        """The held turn a holder of which is a link of the current task's call chain
        (``links``: a call that came back to this object, possibly through other
        hosts), if any."""
        if not links:
            return None
        for turn in [self.writer] if self.writer is not None else self._readers:
            assert turn is not None
            for holder in turn.tasks:
                if holder in links or (holder.id is not None and holder.id in links):
                    return turn
        return None


class SlowTurns:
    """The runtime's watch for turns held past ``turn_warning``: one task and one heap
    entry per object at most (no task per turn, and no turn kept alive by the watch
    after it ends: a busy object's calls come and go by the ten thousand). The heap holds
    gates weakly: an object that left memory (a memory reset must free it) is not kept
    alive for ``turn_warning`` seconds by its watch."""

    def __init__(self, warning: float) -> None:
        self.warning = warning
        self._heap: list[tuple[float, int, weakref.ref[TurnGate]]] = []
        self._serial = itertools.count()
        self._scope: trio.CancelScope | None = None

    def watch(self, gate: TurnGate, since: float) -> None:
        """A turn of ``gate`` began at ``since``: look at the gate then + warning, unless
        a look at it is due already. Does not checkpoint."""
        if math.isinf(self.warning) or gate.watched:
            return
        gate.watched = True
        due = since + self.warning
        heapq.heappush(self._heap, (due, next(self._serial), weakref.ref(gate)))
        scope = self._scope
        if scope is not None and due < scope.deadline:
            scope.deadline = due

    async def run(self) -> None:
        heap = self._heap
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self._scope:
                await trio.sleep_forever()
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, _, ref = heapq.heappop(heap)
                gate = ref()
                if gate is None:
                    continue  # its object left memory
                gate.watched = False
                next_look = gate.warn_slow(self.warning, now)
                if next_look is not None:
                    self.watch(gate, next_look)


# How long an alarm run cancelled during a hand-over waits to get the object back for
# its cleanup.
_CLEANUP_WAIT: Final = 5.0


class TurnBlock:
    """The block of ``TurnGate.turn``. A class, not an ``@asynccontextmanager``: every
    call and alarm run passes through it, and a generator-based one cost ~1.5 µs of a
    ~30 µs push per call (its generator, its wrapper and the ``athrow``/``anext`` at
    the end), measured."""

    __slots__ = ("_gate", "_guest", "_holder", "_kind", "_reentered", "_ticket", "_token",
                 "_turn")

    def __init__(self, gate: TurnGate, kind: Kind, holder: str, ticket: Ticket | None) -> None:
        self._gate = gate
        self._kind = kind
        self._holder = holder
        self._ticket = ticket
        # What ``__aexit__`` undoes: the chain's token, and the turn taken or the
        # guest added to a turn re-entered (none of them: a re-entry by the holder).
        self._token: contextvars.Token[Any] | None = None
        self._turn: Turn | None = None
        self._guest: Holder | None = None
        self._reentered: Turn | None = None

    async def __aenter__(self) -> None:
        gate = self._gate
        task = trio.lowlevel.current_task()
        ticket = self._ticket
        if ticket is not None:
            if (ticket.claimed or ticket.kind != self._kind
                    or gate._held_by(task) is not None or gate._by_chain(_links())):
                gate.drop(ticket)  # (it runs inside a turn its chain holds)
            else:
                ticket.claimed = True
                turn = ticket.turn
                await gate._wait(turn, ticket.waiter)
                turn.tasks = [Holder(task)]
                if turn is gate.writer:
                    gate.writer_task = task
                first = turn.tasks[0]
                self._token = _chain.set(((*_links(), first), first))
                self._turn = turn
                return
        if gate._held_by(task) is not None:
            # Re-entry by the turn's own task or a descendant (an object calling itself).
            await trio.lowlevel.checkpoint()
            return
        links = _links()
        reentered = gate._by_chain(links)
        if reentered is not None:
            await trio.lowlevel.checkpoint()
            guest = Holder(task)
            reentered.tasks.append(guest)
            self._token = _chain.set(((*links, guest), guest))
            self._guest, self._reentered = guest, reentered
            return
        turn = Turn(self._kind, self._holder, task)
        await gate._enter(turn)
        first = turn.tasks[0]
        self._token = _chain.set(((*links, first), first))
        self._turn = turn

    @property
    def runs_startup(self) -> bool:
        """Whether the turn this block took is a read turn admitted as a writing one, to
        run the object's startup first (``TurnGate.startup_pending``). Does not
        checkpoint."""
        return self._turn is not None and self._turn.runs_startup

    def end_startup(self) -> None:
        """The startup ran (``runs_startup``): the turn becomes the read turn it was
        asked as, in place; the read turns next in line join it, a writing one still
        waits. Does not checkpoint."""
        gate, turn = self._gate, self._turn
        assert turn is not None and turn.runs_startup and turn is gate.writer
        turn.kind, turn.runs_startup = "read", False
        gate.writer = gate.writer_task = None
        gate._readers.append(turn)
        gate._admit_waiters()

    async def __aexit__(self, *exc_info: object) -> None:
        token = self._token
        if token is None:
            return  # (a re-entry by the holder, or a ticket given up: nothing taken)
        _chain.reset(token)
        if self._turn is not None:
            self._gate._leave(self._turn)
        else:
            guest, reentered = self._guest, self._reentered
            assert guest is not None and reentered is not None
            if guest in reentered.tasks:  # (not renewed meanwhile)
                reentered.tasks.remove(guest)
