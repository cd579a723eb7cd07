"""Calls across hosts: a stub call for an object another live host leases travels as a
row of ``nj_calls`` plus a notification on the owner's channel; the owner runs it as a
local stub call and answers the same way. Arguments and results go through the payload
codec, in the envelope every engine's stub call copies through (``_call_codec.encode_call``,
``encode_result``); an exception raised by the call travels as data — its class's name,
its args and attributes through the same codec — and is rebuilt by the caller from a
class it has loaded (a ``RemoteError`` naming it where it cannot be): never pickled,
since anyone who may NOTIFY on a host's channel can forge an answer (``_call_errors``).

Three round trips carry a call (issue 26): the caller's insert + notify; the owner's take,
run by its listening thread on its own connection in the moment it hears of the call (no
hop to a worker thread); the owner's answer + notify, whose notification carries the
answer itself when it fits (under ``NOTE_MAX`` bytes). The answer is written to the row
all the same, so a caller that misses the notification finds it there (its check every
``CHECK_INTERVAL``); the caller deletes the rows of answers it read from notifications
in batches (``tidy``, ``TIDY_DELAY`` after the first), off the path of its calls. A big
answer is only in the row, and the caller collects it (a fourth round trip).

Only the host a call is sent to takes it, and each take writes its own id in the rows it
takes (``take_id``). A take that fails may still have landed (the connection dropped
after the commit), or land later (the server ran it on): the call is then ``running``
and nobody runs it, so the caller would wait for as long as that host lives. The host
remembers the take, and its polls run the calls they find running under that take's
id, once; a call no longer pending under another id, answered or gone, the take can no
longer land on (``CallRouter.take_failed``). Which take holds a call is read from its
row, never inferred from what a poll saw: a poll's view of a call as pending may be
stale by the time it is read (a take landed meanwhile); a poll that took that view for
"no take landed" forgot the failed take, and nobody ran the call.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import trio

from nursery_jobs._call_codec import decode_call, encode_call, encode_result
from nursery_jobs._codec import decode_payload
from nursery_jobs._engines.postgres._call_errors import dump_error, load_error
from nursery_jobs._engines.postgres._schema import key_digest
from nursery_jobs._errors import (
    NurseryJobsError,
    ObjectLeasedElsewhere,
    ObjectMoved,
    RpcError,
    StorageError,
    describe_error,
)

if TYPE_CHECKING:
    from nursery_jobs._core._object import DurableObject
    from nursery_jobs._engines.base import EngineSite
    from nursery_jobs._engines.postgres._ops import Conn

logger = logging.getLogger("nursery_jobs")

# How often a waiting caller checks that the host it called still holds the object.
CHECK_INTERVAL: Final = 1.0
_DONE: Final = ("ok", "error", "moved")
# An answer that cannot be written is tried again: 0.1 s doubling, capped at 5 s, ~5 min.
ANSWER_ATTEMPTS: Final = 70
ANSWER_RETRY_BASE: Final = 0.1
ANSWER_RETRY_CAP: Final = 5.0


def _transport_error(label: str, target: str, exc: Exception, *, sent: bool) -> Exception:
    """A failure of PostgreSQL while forwarding a call, as a typed error: before the
    call was sent, nothing ran (``StorageError``); after, it may have (``RpcError``)."""
    if isinstance(exc, NurseryJobsError):
        return exc
    if not sent:
        return StorageError(f"{label}: cannot forward the call to host {target}: PostgreSQL"
                            f" refused it ({describe_error(exc)}); nothing ran")
    return RpcError(f"{label}: lost touch with PostgreSQL while host {target} had the call;"
                    f" it may or may not have run ({describe_error(exc)})")
POLL: Final = -1  # (on the incoming channel) look for calls whose notification was missed
# A notification's payload must be under 8,000 bytes: an answer note longer than this
# (a big result) says only which row holds the answer.
NOTE_MAX: Final = 7_900
# The rows of answers read from notifications are deleted in one statement this long after
# the first of them (off the path of any call: that statement cost a call ~0.5 ms when it
# rode in the next call's insert).
TIDY_DELAY: Final = 0.5
# Answers that arrived with no caller waiting (early, or for an abandoned wait) kept at most.
EARLY_MAX: Final = 1_000
ABANDONED_MAX: Final = 10_000

Answer = tuple[str, str | None]  # (state, result text)

Db = Callable[..., Awaitable[Any]]


def channel(host_id: str) -> str:
    """The notification channel of a host (calls to it, answers to its calls)."""
    return "nj_h_" + hashlib.sha256(host_id.encode()).hexdigest()[:24]


class TakenCall(NamedTuple):
    """A call row this host took (``pending`` -> ``running``): it runs it, once."""

    call_id: int
    caller: str
    namespace: str
    object_id: str
    class_path: str
    name: str
    payload: str


def answer_note(call_id: int, state: str, result: str | None) -> str:
    """The notification that answers call ``call_id``: ``a<id> <state> -`` (no result) or
    ``a<id> <state> =<result>`` where it fits in a notification, else ``r<id>`` (the answer
    is in the row)."""
    note = f"a{call_id} {state} " + ("-" if result is None else "=" + result)
    if len(note) * 4 < NOTE_MAX or len(note.encode()) < NOTE_MAX:
        return note
    return f"r{call_id}"


def _read_answer(note: str) -> tuple[int, Answer | None] | None:
    """``(call_id, answer)`` from an answer notification (``answer`` None: it is in the
    row), or None where ``note`` is none."""
    kind = note[:1]
    if kind == "r":
        return (int(note[1:]), None) if note[1:].isdigit() else None
    if kind != "a":
        return None
    head, _, rest = note.partition(" ")
    state, _, tail = rest.partition(" ")
    if not head[1:].isdigit() or state not in _DONE or tail[:1] not in ("-", "="):
        return None
    return int(head[1:]), (state, None if tail == "-" else tail[1:])


def announced_call(note: str) -> int | None:
    """The id of the call a notification on a host's channel announces (``c<id>``)."""
    return int(note[1:]) if note[:1] == "c" and note[1:].isdigit() else None


# -- statements (worker threads) -------------------------------------------------------
def _send(conn: Conn, me: str, target: str, namespace: str, object_id: str,
          class_path: str, name: str, payload: str | None) -> int:
    (call_id, _) = conn.execute(
        "WITH c AS (INSERT INTO nj_calls (target, caller, namespace, object_id, class_path,"
        " name, payload) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id)"
        " SELECT id, pg_notify(%s, 'c' || id) FROM c",
        (target, me, namespace, object_id, class_path, name, payload, channel(target)),
    ).fetchone()
    return int(call_id)


def _forget(conn: Conn, spent: list[int]) -> None:
    conn.execute("DELETE FROM nj_calls WHERE id = ANY(%s::bigint[])", (spent,))


def _check(conn: Conn, call_id: int, namespace: str, object_id: str,
           target: str) -> tuple[str | None, bool]:
    row = conn.execute("SELECT state FROM nj_calls WHERE id = %s", (call_id,)).fetchone()
    (alive,) = conn.execute(
        "SELECT count(*) FROM nj_objects WHERE okey = %s"
        " AND owner = %s AND lease_until >= now()", (key_digest(namespace, object_id), target),
    ).fetchone()
    return (None if row is None else str(row[0])), bool(alive)


def _withdraw(conn: Conn, call_id: int) -> bool:
    return conn.execute(
        "DELETE FROM nj_calls WHERE id = %s AND state = 'pending' RETURNING 1", (call_id,)
    ).fetchone() is not None


def _collect(conn: Conn, call_id: int) -> tuple[str, str | None] | None:
    row = conn.execute(
        "DELETE FROM nj_calls WHERE id = %s AND state = ANY(%s) RETURNING state, result",
        (call_id, list(_DONE)),
    ).fetchone()
    return None if row is None else (str(row[0]), row[1])


def take(conn: Conn, me: str, call_ids: list[int], take_id: int) -> list[TakenCall]:
    """Take the calls ``call_ids`` to host ``me`` that are still pending, as take
    ``take_id`` (``CallRouter.new_take``; one statement: the listening thread runs it on
    its own connection). Blocks."""
    return [TakenCall(int(row[0]), *row[1:]) for row in conn.execute(
        "UPDATE nj_calls SET state = 'running', take_id = %s WHERE id = ANY(%s::bigint[])"
        " AND target = %s AND state = 'pending'"
        " RETURNING id, caller, namespace, object_id, class_path, name, payload",
        (take_id, call_ids, me),
    )]


def _unsettled(conn: Conn, me: str,
               call_ids: list[int]) -> list[tuple[str, int | None, TakenCall]]:
    """``(state, take_id, call)`` of the calls ``call_ids`` to host ``me`` that are
    pending or running (failed takes of this host may have taken them, or may still:
    ``CallRouter.take_failed``). Blocks."""
    return [(str(row[0]), row[1], TakenCall(int(row[2]), *row[3:])) for row in conn.execute(
        "SELECT state, take_id, id, caller, namespace, object_id, class_path, name,"
        " payload FROM nj_calls WHERE id = ANY(%s::bigint[]) AND target = %s"
        " AND state IN ('pending', 'running')",
        (call_ids, me),
    )]


def _answer(conn: Conn, call_id: int, caller: str, state: str, result: str | None) -> None:
    conn.execute(
        "WITH a AS (UPDATE nj_calls SET state = %s, result = %s WHERE id = %s RETURNING id)"
        " SELECT pg_notify(%s, %s) FROM a",
        (state, result, call_id, channel(caller), answer_note(call_id, state, result)),
    )


def _pending(conn: Conn, me: str) -> list[int]:
    return [int(r[0]) for r in conn.execute(
        "SELECT id FROM nj_calls WHERE target = %s AND state = 'pending'", (me,)
    )]


class CallRouter:
    """The calls one host forwards and the calls it serves."""

    def __init__(self, me: str, db: Db, holds: Callable[[str, str], bool]) -> None:
        self._me = me
        self._db = db
        self._holds = holds  # (namespace, object_id): does this host hold the lease?
        self._waiting: dict[int, trio.Event] = {}
        # Answers heard (None: it is in the row) and not yet read by their caller; also
        # those that arrived before their caller was waiting (a fast owner answers while
        # the caller's insert is still returning from its thread). Oldest first.
        self._answers: dict[int, Answer | None] = {}
        # Calls whose caller stopped waiting while they ran: their answers are spent.
        self._abandoned: set[int] = set()
        # Takes of this host that failed (take id -> the calls it was for): whether they
        # landed is unknown, and one may land for as long as its call is pending. A call
        # one landed on is running under its id and nobody runs it: polls look
        # (``poll``) and run those, once.
        self._unsure: dict[int, list[int]] = {}
        # Take ids (the listening thread draws them too: next() of a count is atomic).
        self._takes = itertools.count(1)
        # Rows of answers read from notifications, to delete (``tidy``).
        self._spent: list[int] = []
        self._spent_wake = trio.Event()
        # Read by the listening thread: while calls are served, it takes them itself.
        self.serving = False
        self.incoming_send, self._incoming = trio.open_memory_channel[int | TakenCall](
            1_000_000)

    def heard(self, note: str) -> None:
        """A notification on this host's channel other than a call: an answer."""
        read = _read_answer(note)
        if read is None:
            return
        call_id, answer = read
        if call_id in self._abandoned:
            self._abandoned.discard(call_id)
            self._spend(call_id)
            return
        if call_id not in self._waiting:
            while len(self._answers) >= EARLY_MAX:  # (a lost one is read from its row)
                del self._answers[next(iter(self._answers))]
        self._answers[call_id] = answer
        event = self._waiting.get(call_id)
        if event is not None:
            event.set()

    def taken(self, calls: list[TakenCall]) -> None:
        """Calls the listening thread took: run them."""
        for call in calls:
            self.incoming_send.send_nowait(call)

    def new_take(self) -> int:
        """The id of a take about to be sent (``take``). Thread-safe."""
        return next(self._takes)

    def take_failed(self, take_id: int, call_ids: list[int]) -> None:
        """Take ``take_id`` of ``call_ids`` failed: it may have landed, or land yet (see
        ``_unsure``). The caller asks for a poll (the listening thread polls when it has
        reconnected)."""
        self._unsure[take_id] = call_ids

    def _spend(self, call_id: int) -> None:
        self._spent.append(call_id)
        self._spent_wake.set()

    async def tidy(self) -> None:
        """Delete the rows of answers read from notifications, in one statement
        ``TIDY_DELAY`` after the first of them. Runs until cancelled."""
        while True:
            await self._spent_wake.wait()
            await trio.sleep(TIDY_DELAY)
            self._spent_wake = trio.Event()
            spent, self._spent = self._spent, []
            if not spent:
                continue
            try:
                await self._db(_forget, spent)
            except Exception as exc:  # (the sweep deletes them in time)
                logger.debug("cannot delete %d answered call rows: %s", len(spent), exc)

    async def forward(
        self, target: str, cls: type[DurableObject], object_id: str, name: str,
        args: tuple[Any, ...], kwargs: dict[str, Any], again: Callable[..., Awaitable[Any]],
        class_path: str, chain: tuple[str, ...] = (), place: bool = False,
        trace: str | None = None,
    ) -> Any:
        """Run ``name(*args, **kwargs)`` on the object at host ``target`` and return its
        result (or raise its exception). ``again`` is the stub call, for when the object
        moved before the call ran. ``place``: the target takes the object if nobody
        holds it (a ``client_only`` caller, which holds none). Checkpoints.

        Raises:
            RpcError: the host holding the object stopped answering after it took the
                call (it may or may not have run).
        """
        namespace = cls.namespace
        label = f"{namespace}/{object_id}.{name}()"
        # The call chain travels with the call: a call back into a turn it holds there
        # re-enters it (A -> B -> A across hosts never deadlocks).
        # So does the caller's span context (``trace``, with tracing on): the call's span
        # there is a child of the caller's.
        payload = encode_call(args, kwargs, chain, label, place=place, trace=trace)
        try:
            call_id = await self._db(_send, self._me, target, namespace, object_id,
                                     class_path, name, payload)
        except Exception as exc:
            raise _transport_error(label, target, exc, sent=False) from exc
        event = trio.Event()
        self._waiting[call_id] = event
        if call_id in self._answers:
            event.set()
        retry = False
        try:
            while not event.is_set():
                with trio.move_on_after(CHECK_INTERVAL):
                    await event.wait()
                if event.is_set():
                    break
                try:
                    state, alive = await self._db(_check, call_id, namespace, object_id,
                                                  target)
                except Exception as exc:
                    raise _transport_error(label, target, exc, sent=True) from exc
                if state in _DONE:
                    break
                if state is None:
                    raise RpcError(f"{label}: the call to host {target} was lost")
                if not alive:
                    if state == "pending" and await self._db(_withdraw, call_id):
                        retry = True  # never started: call wherever the object is now
                        break
                    raise RpcError(
                        f"{label}: host {target} took the call, then lost the object's"
                        " lease; the call may or may not have run"
                    )
        except BaseException:
            # Cancelled (or failed): withdraw the call if it has not started; one
            # already running runs on (cancelling the caller cancels the wait only).
            await self._abandon(call_id)
            raise
        finally:
            self._waiting.pop(call_id, None)
        if retry:
            self._answers.pop(call_id, None)
            return await again(name, *args, **kwargs)
        answer = self._answers.pop(call_id, None)
        if answer is not None:
            self._spend(call_id)
        else:
            try:
                answer = await self._db(_collect, call_id)
            except Exception as exc:
                raise _transport_error(label, target, exc, sent=True) from exc
            if answer is None:
                raise RpcError(f"{label}: the answer of host {target} was lost")
        state, result = answer
        if state == "ok":
            return decode_payload(result)
        if state == "moved":
            return await again(name, *args, **kwargs)
        raise load_error(result, label)

    async def _abandon(self, call_id: int) -> None:
        """The caller stopped waiting: withdraw the call if it has not started, or
        mark its answer spent (now, or when it comes)."""
        withdrawn = None
        with trio.move_on_after(2, shield=True):
            try:
                withdrawn = await self._db(_withdraw, call_id)
            except Exception:
                logger.debug("could not withdraw call %s", call_id, exc_info=True)
        if withdrawn is False:  # running or answered: the sweep would wait 10 minutes
            if call_id in self._answers:
                del self._answers[call_id]
                self._spend(call_id)
            elif len(self._abandoned) < ABANDONED_MAX:
                self._abandoned.add(call_id)

    async def serve(self, site: EngineSite, classes: dict[str, str]) -> None:
        """Run the calls forwarded to this host, each in a task of its own."""
        self.serving = True
        try:
            async with trio.open_nursery() as nursery:
                async for item in self._incoming:
                    if isinstance(item, TakenCall):
                        nursery.start_soon(self._run, site, classes, item)
                    elif item == POLL:
                        nursery.start_soon(self._poll_logged)
                    else:
                        nursery.start_soon(self._take_and_run, site, classes, item)
        finally:
            self.serving = False

    async def _poll_logged(self) -> None:
        try:
            await self.poll()
        except Exception as exc:
            logger.warning("cannot look for forwarded calls: %s", exc)
            if self._unsure:  # (calls may be waiting for this host alone)
                await trio.sleep(CHECK_INTERVAL)
                self.incoming_send.send_nowait(POLL)

    async def poll(self) -> None:
        """Pick up calls whose notification was missed (a reconnecting listener), and
        run those a failed take of this host took after all (``_unsure``)."""
        for call_id in await self._db(_pending, self._me):
            self.incoming_send.send_nowait(call_id)  # (taken by a take of its own)
        if not self._unsure:
            return
        # Taken out before the query, so that a poll running meanwhile cannot run
        # them too; put back if it fails.
        unsure, self._unsure = self._unsure, {}
        try:
            rows = await self._db(_unsettled, self._me,
                                  sorted({i for ids in unsure.values() for i in ids}))
        except BaseException:
            self._unsure.update(unsure)
            raise
        found = {call.call_id: (state, holder, call) for state, holder, call in rows}
        for take_id, call_ids in unsure.items():
            waiting = []
            for call_id in call_ids:
                state, holder, call = found.get(call_id, ("", None, None))
                if state == "running" and holder == take_id:
                    self.incoming_send.send_nowait(call)  # it landed: run it, once
                elif state == "pending":
                    waiting.append(call_id)  # it may land yet
                # (else answered, gone or another take's: it can no longer land)
            if waiting:
                self._unsure[take_id] = waiting

    async def _take_and_run(self, site: EngineSite, classes: dict[str, str],
                            call_id: int) -> None:
        take_id = self.new_take()
        try:
            calls = await self._db(take, self._me, [call_id], take_id)
        except Exception:
            logger.warning("cannot take forwarded call %s; looking again in %.0f s",
                           call_id, CHECK_INTERVAL, exc_info=True)
            self.take_failed(take_id, [call_id])
            await trio.sleep(CHECK_INTERVAL)
            self.incoming_send.send_nowait(POLL)
            return
        for call in calls:  # (none: withdrawn, or taken already)
            await self._run(site, classes, call)

    async def _run(self, site: EngineSite, classes: dict[str, str], call: TakenCall) -> None:
        call_id, caller, namespace, object_id, class_path, name, payload = call
        classes.setdefault(namespace, class_path)
        label = f"{namespace}/{object_id}.{name}()"
        state, result = "ok", None
        try:
            args, kwargs, chain, place, trace = decode_call(payload)
        except Exception as exc:
            state, result, place, trace = "error", dump_error(exc, label), True, None
        if not place and not self._holds(namespace, object_id):
            # Released since the caller looked (or the caller's hint of where it lives
            # is stale): the caller activates it, as it does any object nobody holds,
            # rather than this host taking it back. (A client_only caller holds none:
            # it places the call, and this host takes the object.)
            state = "moved"
        elif state == "ok":
            try:
                value = await site.run_call(namespace, object_id, name, args, kwargs, chain,
                                            trace)
                result = encode_result(value, label)
            except (ObjectLeasedElsewhere, ObjectMoved):
                # (ObjectMoved: this host's lease lapsed before the method ran; nothing
                # of it ran here.) The caller routes the call again.
                state = "moved"
            except Exception as exc:
                state, result = "error", dump_error(exc, label)
        # The caller waits for this answer while this host holds the object: it is
        # written again until it lands (the result is in memory), not dropped.
        for attempt in range(ANSWER_ATTEMPTS):
            try:
                await self._db(_answer, call_id, caller, state, result)
                return
            except Exception:
                logger.warning("cannot answer forwarded call %s (%s); trying again",
                               call_id, label, exc_info=attempt == 0)
            await trio.sleep(min(ANSWER_RETRY_CAP, ANSWER_RETRY_BASE * 2**attempt))
        logger.error("gave up answering forwarded call %s (%s)", call_id, label)
