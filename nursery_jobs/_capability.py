"""The capability plugin contract: a class with an ``id`` and job hooks."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ._jobs import JobContext, JobOutcome
    from ._lifecycle import CapabilityLifecycle
    from ._object import DurableObject


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

