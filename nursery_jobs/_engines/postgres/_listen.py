"""The PostgreSQL engine's listening connection: a thread of its own that hears
``nj_alarm`` (due alarms: the claim loop looks at once) and this host's call channel
(``_calls.channel``), and takes the calls announced there on its own connection."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

import psycopg
import trio

from nursery_jobs._engines.postgres._calls import POLL, CallRouter, announced_call, channel, take
from nursery_jobs._engines.postgres._statements import (
    LOCK_TIMEOUT_SHARE,
    STATEMENT_TIMEOUT_SHARE,
)

logger = logging.getLogger("nursery_jobs")


class Listener:
    """The listening thread (``start``, ``join``): it reconnects, until ``stopping``
    is set, whenever its connection fails."""

    def __init__(self, dsn: str, commit: str, lease_ttl: float, host_id: str, label: str,
                 calls: CallRouter, wake_claims: Callable[[], None],
                 stopping: threading.Event) -> None:
        self._dsn = dsn
        self._commit = commit
        self._lease_ttl = lease_ttl
        self._host_id = host_id
        self._label = label
        self._calls = calls
        self._wake_claims = wake_claims
        self._stopping = stopping
        self._thread: threading.Thread | None = None

    def start(self, token: trio.lowlevel.TrioToken) -> None:
        self._thread = threading.Thread(
            target=self._listen, args=(token,), name="nursery_jobs-listen", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float) -> None:
        """(once ``stopping`` is set)"""
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

    def _listen(self, token: trio.lowlevel.TrioToken) -> None:
        mine = channel(self._host_id)
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    # It takes calls: committed as the pool's statements are (with the
                    # server's synchronous_commit on, each take waited ~3 ms for a WAL
                    # flush), and bounded as they are (a take stuck on a lock would hold
                    # up every notification; it fails, and this reconnects and polls).
                    conn.execute(f"SET synchronous_commit = {self._commit}")
                    for setting, share in (("lock_timeout", LOCK_TIMEOUT_SHARE),
                                           ("statement_timeout", STATEMENT_TIMEOUT_SHARE)):
                        ms = max(1, math.ceil(self._lease_ttl * share * 1000))
                        conn.execute(f"SET {setting} = {ms}")
                    conn.execute("LISTEN nj_alarm")
                    conn.execute(f'LISTEN "{mine}"')
                    token.run_sync_soon(self._notified, "", "listening")
                    while not self._stopping.is_set():
                        calls = []
                        for note in conn.notifies(timeout=0.2, stop_after=1):
                            call_id = announced_call(note.payload) if note.channel == mine \
                                else None
                            if call_id is not None and self._calls.serving:
                                calls.append(call_id)
                            else:
                                token.run_sync_soon(self._notified, note.channel,
                                                    note.payload)
                        if calls:
                            # Taken here, on this connection, as soon as heard: a hop
                            # to a worker thread and the pool would cost more than the
                            # statement (issue 26).
                            take_id = self._calls.new_take()
                            try:
                                taken = take(conn, self._host_id, calls, take_id)
                            except psycopg.Error:
                                # It may have landed; the poll after reconnecting
                                # looks (``CallRouter.take_failed``).
                                token.run_sync_soon(self._calls.take_failed, take_id,
                                                    calls)
                                raise
                            token.run_sync_soon(self._calls.taken, taken)
            except trio.RunFinishedError:
                return
            except psycopg.Error as exc:
                if self._stopping.is_set():
                    return
                logger.warning("listening on %s failed (%s); reconnecting", self._label, exc)
                self._stopping.wait(1.0)

    def _notified(self, chan: str, payload: str) -> None:
        if chan == "nj_alarm" or payload == "listening":
            self._wake_claims()
            if payload == "listening":  # (re)connected: calls sent meanwhile wait
                self._calls.incoming_send.send_nowait(POLL)
            return
        call_id = announced_call(payload)
        if call_id is not None:
            self._calls.incoming_send.send_nowait(call_id)
        else:
            self._calls.heard(payload)
