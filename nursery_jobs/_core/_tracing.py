"""The tracing seam: what the runtime and the job floor ask of ``open_runtime(tracing=...)``.

The OpenTelemetry implementation lives in the operator floor (``_ops/_tracing.py``),
which these floors must not import: ``nursery_jobs/__init__.py`` plugs it in with
``install_tracing``, as it plugs in the HTTP face. With ``tracing=None`` (the default)
there is no ``Tracing`` at all: each stub call, push and job run pays one ``is None``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Tracing(Protocol):
    """Spans for stub calls and job runs, and the span context a push stores.

    A stored or carried context is W3C trace context (``traceparent``, ``tracestate``)
    as a JSON object: the ``trace`` column of ``nj_jobs``, the envelope of a forwarded
    call. The context managers record an exception leaving their block on the span.
    """

    def call_span(
        self, namespace: str, object_id: str, method: str
    ) -> AbstractContextManager[object]:
        """A stub call (``Stub.call``), a child of the caller's current span."""
        ...

    def served_call_span(
        self, namespace: str, object_id: str, method: str, caller: str | None
    ) -> AbstractContextManager[object]:
        """A call forwarded from another host, served here: a child of ``caller`` (the
        context the caller's host carried in the call's envelope)."""
        ...

    def push_context(self) -> str | None:
        """The current span's context, to store with a pushed job (None: no span)."""
        ...

    def run_span(
        self, namespace: str, object_id: str, job_id: str, fn: str, owner: str,
        attempt: int, stored: str | None,
    ) -> AbstractContextManager[object]:
        """One run of a job: a new trace linked to ``stored`` (the push's context)."""
        ...


# Builds a ``Tracing`` from what ``open_runtime(tracing=...)`` was given; raises a typed
# error naming ``tracing`` for a value it cannot use.
TracingFactory = Callable[[object], Tracing]


def _not_installed(provider: object) -> Tracing:
    raise RuntimeError("no tracing is installed (import nursery_jobs, not its core alone)")


_factory: TracingFactory = _not_installed


def install_tracing(factory: TracingFactory) -> None:
    """Make ``open_runtime(tracing=provider)`` trace through ``factory(provider)``."""
    global _factory
    _factory = factory


def tracing_for(provider: object) -> Tracing | None:
    """The ``Tracing`` of ``open_runtime(tracing=provider)``; None for None.

    Raises:
        TracingError: ``provider`` is not a TracerProvider.
        MissingExtraError: OpenTelemetry is not installed (the ``otel`` extra).
    """
    return None if provider is None else _factory(provider)


def traced_run(
    tracing: Tracing, namespace: str, object_id: str, job_id: str, fn: str, owner: str,
    stored: str | None, on_job: Callable[[Any], Awaitable[Any]],
) -> Callable[[Any], Awaitable[Any]]:
    """``on_job`` run in a job-run span (``Tracing.run_span``) linked to ``stored``, the
    context its push stored. The alarm run wraps a job's handler in it with tracing on
    (the attempt is the ``JobContext``'s)."""

    async def run(ctx: Any) -> Any:
        with tracing.run_span(namespace, object_id, job_id, fn, owner, ctx.attempt, stored):
            return await on_job(ctx)

    return run
