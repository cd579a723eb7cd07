"""OpenTelemetry tracing (``open_runtime(tracing=provider)``, the ``otel`` extra): the
``_core._tracing.Tracing`` the runtime and the alarm run use.

Spans: a stub call (CLIENT, a child of the caller's span), a forwarded call served on
another host (SERVER, a child of the caller's span carried in the call's envelope), and a
job run (CONSUMER, a new trace with a Link to the span that pushed the job). Attributes:
``nursery_jobs.namespace``, ``.object``, ``.method`` (calls), ``.job.id``, ``.job.fn``,
``.job.owner``, ``.attempt`` (runs). Contexts are stored and carried as W3C trace context
(``traceparent``/``tracestate``) in a JSON object, whatever global propagator the
application set: the row outlives the process that wrote it.

``opentelemetry`` is imported when a runtime asks for tracing, never at import of
``nursery_jobs``: it is an optional dependency.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

import trio

from nursery_jobs._errors import MissingExtraError, TracingError, describe_error, safe_repr

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Tracer

NAMESPACE: Final = "nursery_jobs.namespace"
OBJECT: Final = "nursery_jobs.object"
METHOD: Final = "nursery_jobs.method"
JOB_ID: Final = "nursery_jobs.job.id"
JOB_FN: Final = "nursery_jobs.job.fn"
JOB_OWNER: Final = "nursery_jobs.job.owner"
ATTEMPT: Final = "nursery_jobs.attempt"
# The longest stored context read back (a traceparent is 55 characters; tracestate is
# bounded by W3C at 32 members): anything longer is not ours, and is not parsed.
_MAX_STORED: Final = 8192


def open_tracing(provider: object) -> OtelTracing:
    """The ``Tracing`` of ``open_runtime(tracing=provider)``.

    Raises:
        TracingError: ``provider`` has no callable ``get_tracer`` (checked first: it
            needs nothing installed).
        MissingExtraError: ``opentelemetry-api`` is not installed.
    """
    get_tracer = getattr(provider, "get_tracer", None)
    if not callable(get_tracer):
        raise TracingError(
            f"tracing must be an OpenTelemetry TracerProvider (with get_tracer), got"
            f" {safe_repr(provider, 80)}"
        )
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        raise MissingExtraError("open_runtime(tracing=...)", "otel") from None
    tracer = get_tracer("nursery_jobs")
    if not callable(getattr(tracer, "start_as_current_span", None)):
        raise TracingError(
            f"tracing must be an OpenTelemetry TracerProvider: {type(provider).__name__}"
            f".get_tracer() returned {type(tracer).__name__}, not a Tracer"
        )
    return OtelTracing(tracer)


class OtelTracing:
    """The ``Tracing`` seam on an OpenTelemetry tracer."""

    __slots__ = ("_link", "_propagator", "_root_context", "_trace", "_tracer")

    def __init__(self, tracer: Tracer) -> None:
        # (Imported here, not at the top: OpenTelemetry is optional; open_tracing
        # checked that it is installed.)
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = tracer
        self._trace = trace
        self._root_context = Context
        self._link = trace.Link
        self._propagator = TraceContextTextMapPropagator()

    @contextmanager
    def call_span(self, namespace: str, object_id: str, method: str) -> Iterator[object]:
        with self._span(f"{namespace}.{method}", self._trace.SpanKind.CLIENT, None, (),
                        {NAMESPACE: namespace, OBJECT: object_id, METHOD: method}) as span:
            yield span

    @contextmanager
    def served_call_span(
        self, namespace: str, object_id: str, method: str, caller: str | None
    ) -> Iterator[object]:
        parent = self._extract(caller)
        with self._span(f"{namespace}.{method}", self._trace.SpanKind.SERVER,
                        self._root_context() if parent is None else parent, (),
                        {NAMESPACE: namespace, OBJECT: object_id, METHOD: method}) as span:
            yield span

    def push_context(self) -> str | None:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)  # (nothing without a valid current span)
        return json.dumps(carrier, separators=(",", ":")) if carrier else None

    @contextmanager
    def run_span(
        self, namespace: str, object_id: str, job_id: str, fn: str, owner: str,
        attempt: int, stored: str | None,
    ) -> Iterator[object]:
        links: list[Link] = []
        pushed = self._extract(stored)
        if pushed is not None:
            links.append(self._link(self._trace.get_current_span(pushed).get_span_context()))
        # A root of its own (Context()): the run is caused by the push it links to, not
        # by whatever span was current when the runtime was opened.
        with self._span(f"job {fn}", self._trace.SpanKind.CONSUMER, self._root_context(), links,
                        {NAMESPACE: namespace, OBJECT: object_id, JOB_ID: job_id,
                         JOB_FN: fn, JOB_OWNER: owner, ATTEMPT: attempt}) as span:
            yield span

    @contextmanager
    def _span(
        self, name: str, kind: SpanKind, context: Context | None, links: Sequence[Link],
        attributes: dict[str, str | int],
    ) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name, context=context, kind=kind, links=links, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                self._failed(span, exc)
                raise

    def _failed(self, span: Span, error: BaseException) -> None:
        """An exception left the span's block: an error, unless it is a cancellation (a
        shutdown, a reset: no failure of the call or the job)."""
        if isinstance(error, trio.Cancelled) or (
                isinstance(error, BaseExceptionGroup) and error.split(trio.Cancelled)[1] is None):
            span.set_attribute("nursery_jobs.cancelled", True)
            return
        span.record_exception(error)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, describe_error(error)))

    def _extract(self, stored: str | None) -> Context | None:
        """The span context stored by a push or carried by a call; None if there is none,
        or it is not a valid W3C trace context (a bad row never fails a job)."""
        if not stored or len(stored) > _MAX_STORED:
            return None
        try:
            carrier = json.loads(stored)
        except ValueError:
            return None
        if not isinstance(carrier, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in carrier.items()):
            return None
        context: Context = self._propagator.extract(carrier)
        if not self._trace.get_current_span(context).get_span_context().is_valid:
            return None
        return context
