"""Retry and backoff policies: the records every floor uses to decide when to try again.

``Backoff`` is one named delay policy (an alarm's retries, strikes, a locked file);
``RetryOptions`` is a job's retry policy, as users give it to ``push``.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Final

import attrs

from nursery_jobs._clock import is_finite as is_finite
from nursery_jobs._errors import JobError, LimitError


@attrs.frozen(kw_only=True)
class Backoff:
    """A retry delay: ``base * 2**n`` (or ``base * (n + 1)`` when ``linear``) before
    retry ``n + 1``, at most ``cap``; ``None`` (give up) after ``max_retries``."""

    base: float
    cap: float = math.inf
    max_retries: int | None = None
    linear: bool = False

    def delay(self, retry: int) -> float | None:
        """The wait before retry ``retry + 1`` (``retry`` failures so far), or None."""
        if self.max_retries is not None and retry >= self.max_retries:
            return None
        if self.base == 0 or self.cap <= self.base:
            return min(self.cap, self.base)  # every delay (no delay is below the base)
        if self._reaches_cap(retry):
            return self.cap
        grown = self.base * (retry + 1) if self.linear else math.ldexp(self.base, retry)
        return min(self.cap, grown)

    def _reaches_cap(self, retry: int) -> bool:
        """Whether the delay before retry ``retry + 1`` is at least the cap: from there on
        every delay is the cap, and growing further only overflows (``2.0 ** 1024`` is an
        OverflowError). Decided in log2, where an int of any size compares exactly with
        a float, so no retry count reaches the arithmetic that could overflow; an
        infinite cap is reached where floats end."""
        room = math.log2(min(self.cap, sys.float_info.max)) - math.log2(self.base)
        return (math.log2(retry + 1) if self.linear else retry) >= room


# A plain object's alarm, as Durable Objects retry it: 2 s doubling, 6 retries.
DURABLE_OBJECT_RETRY: Final = Backoff(base=2.0, max_retries=6)
# A Lifecycle's alarm run: 2 s doubling, capped at 5 minutes, for as long as jobs remain.
LIFECYCLE_RETRY: Final = Backoff(base=2.0, cap=300.0)
# An alarm whose object cannot be opened or whose class is unknown: never dropped.
ACTIVATION_RETRY: Final = Backoff(base=2.0, cap=300.0)
# Memory-limit and crash strikes: 30 s per strike, capped at 5 minutes.
STRIKE_DELAY: Final = Backoff(base=30.0, cap=300.0, linear=True)
# An object file locked by another process (opening it, or opening a dormant one's
# again): tried again this often, in Trio sleeps, before the open fails; the alarm or
# the caller then retries with its own backoff.
LOCKED_RETRY: Final = Backoff(base=0.05, max_retries=4)


# Attempts a job may have (stored as a SQLite integer, which would overflow past 2**63).
MAX_ATTEMPTS: Final = 2**31 - 1


def _check_retry(instance: RetryOptions, attribute: Any, value: Any) -> None:
    if attribute.name == "max_attempts":
        if isinstance(value, bool) or not isinstance(value, int) or not (
            1 <= value <= MAX_ATTEMPTS
        ):
            raise JobError(
                f"RetryOptions.max_attempts must be an int in [1, {MAX_ATTEMPTS}], got {value!r}"
            )
    elif (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not is_finite(value)
        or value < 0
    ):
        raise JobError(f"RetryOptions.{attribute.name} must be a finite number >= 0, got {value!r}")


def _check_jitter(instance: RetryOptions, attribute: Any, value: Any) -> None:
    if not isinstance(value, bool):
        raise JobError(f"RetryOptions.jitter must be a bool, got {value!r}")


def error_name(error_type: type[BaseException]) -> str:
    """How an exception type is named in ``give_up_on`` (and stored): ``module.QualName``."""
    return f"{error_type.__module__}.{error_type.__qualname__}"


def _is_qualified_name(text: str) -> bool:
    """Whether ``text`` could be ``error_name`` of a class: dotted identifiers (a class
    made in a function has ``<locals>`` among them). A string that names no class (a
    NUL, a space, an empty part) was stored and matched nothing, silently."""
    parts = text.split(".")
    return len(parts) > 1 and all(
        part.isidentifier() or (part == "<locals>" and 0 < i < len(parts) - 1)
        for i, part in enumerate(parts)
    )


def _give_up_on(value: Any) -> tuple[str, ...]:
    """``give_up_on`` as stored: exception types (or their ``module.QualName``) as names,
    sorted and without repeats, so options compare equal after a round trip."""
    if isinstance(value, (type, str)):
        value = (value,)
    if not isinstance(value, (tuple, list, frozenset, set)):
        raise JobError(
            "RetryOptions.give_up_on must be a tuple of exception types, got"
            f" {type(value).__name__}"
        )
    names = set()
    for item in value:
        if isinstance(item, type) and issubclass(item, BaseException):
            names.add(error_name(item))
        elif isinstance(item, str) and len(item) <= 512 and _is_qualified_name(item):
            names.add(item)
        else:
            raise JobError(
                "RetryOptions.give_up_on must hold exception types (or 'module.QualName'"
                f" strings), got {item!r}"
            )
    return tuple(sorted(names))


@attrs.frozen(kw_only=True)
class RetryOptions:
    """How often a failing job is retried: ``max_attempts`` counts the first run; the
    wait before attempt n+1 is uniform in [0, min(max_delay, base_delay * 2**(n-1)))."""

    max_attempts: int = attrs.field(default=3, validator=_check_retry)
    base_delay: float = attrs.field(default=0.1, validator=_check_retry)
    max_delay: float = attrs.field(default=3.0, validator=_check_retry)
    jitter: bool = attrs.field(default=True, validator=_check_jitter)
    """With ``jitter=False`` the wait is exactly the bound (the Agent's 1, 2, 4 ... s)."""
    give_up_on: tuple[str, ...] = attrs.field(default=(), converter=_give_up_on)
    """Errors that end the job at once, remaining attempts skipped (Temporal's
    non-retryable errors): exception types, kept by name (``module.QualName``, so they
    survive in the job row); an error whose class, or a base class, is named matches."""

    def gives_up_on(self, error: BaseException) -> bool:
        """Whether ``error`` skips the remaining attempts. An exception group (what a
        job's own nursery raises) does when every error in it does."""
        names = self.give_up_on
        if not names:
            return False
        if isinstance(error, BaseExceptionGroup):
            rest = error.split(lambda leaf: self._named(leaf))[1]  # (a function, not a method)
            return rest is None
        return self._named(error)

    def _named(self, error: BaseException) -> bool:
        # (A group itself is never named: ``split`` then looks at what it holds.)
        if isinstance(error, BaseExceptionGroup):
            return False
        names = self.give_up_on
        return any(error_name(cls) in names for cls in type(error).__mro__)

    def backoff_bound(self, attempt: int) -> float:
        """Upper bound of the wait after failed attempt ``attempt`` (1-based)."""
        bound = Backoff(base=self.base_delay, cap=self.max_delay).delay(attempt - 1)
        assert bound is not None
        return bound


DEFAULT_RETRY: Final = RetryOptions()


def _check_concurrency(instance: Limit, attribute: Any, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LimitError(f"Limit: concurrency must be None or an int >= 1, got {value!r}")


def _rate(value: object) -> tuple[int, float] | None:
    """``rate`` as ``(k, per_seconds)``: k an int >= 1, per_seconds a finite number > 0."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        k, per = value
        if (not isinstance(k, bool) and isinstance(k, int) and k >= 1
                and not isinstance(per, bool) and isinstance(per, (int, float))
                and is_finite(per) and per > 0):
            return (k, float(per))
    raise LimitError(
        "Limit: rate must be None or (k, per_seconds) with k an int >= 1 and per_seconds a"
        f" finite number > 0, got {value!r}"
    )


@attrs.frozen(kw_only=True)
class Limit:
    """How a namespace's jobs may run in one runtime (``open_runtime(limits=...)``):
    at most ``concurrency`` at once, and at most ``k`` starts in any ``per_seconds``
    window (``rate=(k, per_seconds)``). A job held by a limit stays due, in order, and
    uses up no attempt. On PostgreSQL a limit is per host.

    Raises:
        LimitError: a bad argument, or neither given.
    """

    concurrency: int | None = attrs.field(default=None, validator=_check_concurrency)
    rate: tuple[int, float] | None = attrs.field(default=None, converter=_rate)

    def __attrs_post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise LimitError("Limit needs concurrency=N or rate=(k, per_seconds), got neither")
