"""The capability plugin contract: a class with an ``id`` and job hooks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from nursery_jobs._errors import CapabilityError
from nursery_jobs._names import check_name

if TYPE_CHECKING:
    from nursery_jobs._core._object import DurableObject
    from nursery_jobs._jobs._records import JobContext, JobOutcome
    from nursery_jobs._jobs._views import CapabilityLifecycle


class Capability:
    """Base class of capabilities: set ``id`` and override the hooks you need.

    Once installed with ``lifecycle.use(cap)``, ``self.lifecycle`` is a view scoped to
    this capability (its own ``jobs``, ``track_alarm_work``, ``emit``) and
    ``self.host`` is the object it serves.
    """

    id: ClassVar[str] = ""
    lifecycle: CapabilityLifecycle
    host: DurableObject

    def _capability_id(self) -> str:
        cap_id = self.__dict__.get("id") or type(self).id
        return cap_id if isinstance(cap_id, str) else ""

    async def on_start(self) -> None:
        """Runs once per activation, when the Lifecycle starts."""

    async def on_job(self, ctx: JobContext) -> JobOutcome:
        """Runs a due job of this capability."""
        raise NotImplementedError(f"capability {self._capability_id()!r} has no on_job")

    # Optional hooks, called when a subclass defines them:
    #   async def on_job_error(self, ctx: JobContext, error: Exception) -> JobOutcome
    #       after the last attempt; its return works like an outcome (None: dead letter)
    #   async def on_memory_limit(self, ctx: MemoryLimitContext) -> None

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} id={self._capability_id()!r}>"


class CallbackCapability(Capability):
    """What Queue and Scheduler share: named callbacks, default retry options, an
    ``on_error`` hook, an id, and the job context of the callback now running."""

    kind: ClassVar[str] = "capability"

    def __init__(
        self,
        callbacks: Mapping[str, Callable[..., Any]],
        *,
        retry: Any,
        on_error: Callable[..., Any] | None,
        id: str,
    ) -> None:
        from nursery_jobs._policy import DEFAULT_RETRY, RetryOptions

        kind = self.kind
        if not isinstance(callbacks, Mapping):
            raise CapabilityError(
                f"{kind} callbacks must be a mapping of name -> callable, got {callbacks!r}"
            )
        for name, fn in callbacks.items():
            check_name(name, f"{kind} callback name", CapabilityError)  # a job's fn
            if not callable(fn):
                raise CapabilityError(f"{kind} callback {name!r} must be a callable")
        if retry is not None and not isinstance(retry, RetryOptions):
            raise CapabilityError(f"{kind} retry must be RetryOptions, got {retry!r}")
        if on_error is not None and not callable(on_error):
            raise CapabilityError(f"{kind} on_error must be callable, got {on_error!r}")
        check_name(id, f"{kind} id", CapabilityError)  # every job of it holds it
        self.id = id  # type: ignore[misc]
        self.callbacks = callbacks
        self.retry: RetryOptions = retry or DEFAULT_RETRY
        self.on_error = on_error
        # The job context of the callback (or on_error) now running, if any.
        self.running: JobContext | None = None
