"""The dashboard's socket: bound here, before hypercorn starts, so that an address it
cannot listen on (in use, unresolvable, not permitted) is one ``HttpBindError`` naming
it, raised before any nursery opens, and the socket is closed (hypercorn's own bind
left it open and its error four nursery groups deep)."""

from __future__ import annotations

import logging
import socket
from functools import partial
from typing import Any

import trio

from nursery_jobs._errors import HttpBindError


async def serve_app(
    app: Any, address: tuple[str, int], *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` on ``address`` until cancelled; ``task_status`` gets its
    URL once it listens. Raises ``HttpBindError`` (nothing served) when the address
    cannot be listened on."""
    try:
        from hypercorn.config import Config, Sockets
        from hypercorn.trio.run import worker_serve
        from hypercorn.utils import wrap_app
    except ImportError as exc:
        raise ImportError(
            "serving the dashboard needs the web extra: pip install 'nursery_jobs[web]'"
        ) from exc
    config = Config()
    config.accesslog = None
    config.errorlog = logging.getLogger("nursery_jobs.http")
    sock = await listen(*address, backlog=config.backlog)
    try:
        async with trio.open_nursery() as nursery:
            # (hypercorn.trio.serve is this call with sockets it binds itself.)
            binds = await nursery.start(partial(
                worker_serve, wrap_app(app, config.wsgi_max_body_size, "asgi"), config,
                sockets=Sockets([], [sock], [])))
            task_status.started(binds[0] + "/")
    finally:
        sock.close()


async def listen(host: str, port: int, *, backlog: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (IPv6 where ``host`` has a
    colon, as hypercorn chose; ``""``: every interface). Raises ``HttpBindError`` naming
    the address, the socket closed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        # (The name resolved in a thread, as Trio does: never in the Trio thread.)
        found = await trio.socket.getaddrinfo(
            host or None, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except OSError as exc:
        raise HttpBindError(host, port, exc) from exc
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(found[0][4])
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise HttpBindError(host, port, exc) from exc
    except BaseException:
        sock.close()
        raise
    return sock
