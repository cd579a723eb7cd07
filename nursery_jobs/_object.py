"""DurableObject, the context an object is built with, and the namespace registry."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

if TYPE_CHECKING:
    import trio

    from ._events import EventBus
    from ._flight import FlightSlot
    from ._runtime import Runtime, Stub
    from ._storage import Storage

# namespace -> class, filled as DurableObject subclasses are defined, so an alarm can
# re-activate an evicted object without the application naming its class first.
_REGISTRY: dict[str, type[DurableObject]] = {}


@attrs.frozen(kw_only=True)
class AlarmInfo:
    """Passed to ``DurableObject.alarm``: how many times this alarm has been retried."""

    retry_count: int
    is_retry: bool


class DurableObject:
    """Base class of durable objects. Subclass it and add async methods.

    Set ``namespace = "name"`` on a class to choose its namespace; the default is
    ``module.QualName``. Instances live while the object is active and are dropped
    on eviction: keep what matters in ``self.ctx.storage``.
    """

    namespace: ClassVar[str] = "nursery_jobs.DurableObject"
    # Hooks the runtime calls that a stub must not (names with "_" are refused anyway).
    _rpc_hidden: ClassVar[frozenset[str]] = frozenset({"on_start", "alarm"})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        explicit = cls.__dict__.get("namespace")
        if explicit is None:
            cls.namespace = f"{cls.__module__}.{cls.__qualname__}"
        elif not isinstance(explicit, str) or not explicit:
            raise TypeError(f"{cls.__qualname__}.namespace must be a non-empty str")
        _REGISTRY[cls.namespace] = cls

    def __init__(self, ctx: ObjectContext) -> None:
        self.ctx = ctx

    async def on_start(self) -> None:
        """Runs on every activation, before any call or alarm."""

    async def alarm(self, info: AlarmInfo) -> None:
        """Runs when the alarm set with ``storage.set_alarm`` is due."""


class ObjectContext:
    """What an object knows about itself: ``id``, ``namespace``, ``storage``,
    ``nursery`` (the object's own), ``env`` and ``events``."""

    __slots__ = (
        "_alarm_handler",
        "_alarm_retry_delay",
        "_flight",
        "_host",
        "env",
        "events",
        "id",
        "namespace",
        "nursery",
        "runtime",
        "storage",
    )

    def __init__(
        self,
        *,
        id: str,
        namespace: str,
        storage: Storage,
        nursery: trio.Nursery,
        env: Any,
        runtime: Runtime,
        host: Any,
    ) -> None:
        self.id = id
        self.namespace = namespace
        self.storage = storage
        self.nursery = nursery
        self.env = env
        self.runtime = runtime
        self.events: EventBus = runtime.events
        self._host = host
        # What a due alarm runs; the Lifecycle replaces it with its alarm run.
        self._alarm_handler: Callable[[AlarmInfo], Awaitable[None]] | None = None
        # Delay before retrying a failed alarm run, or None to give up.
        self._alarm_retry_delay: Callable[[int], float | None] = durable_object_retry_delay
        # The flight-record slot of the alarm run in progress (None outside one).
        self._flight: FlightSlot | None = None

    def _take_crash_tokens(self) -> list[tuple[str, float]]:
        """What the work recorder (``_flight``) held for this object when a process on
        this path died: the tokens of work that was running."""
        return self.runtime.catalog.crashes(self.namespace, self.id)

    def _crashes_recovered(self) -> None:
        """The object has accounted for its crash tokens; forget them."""
        self.runtime.catalog.clear_crashes(self.namespace, self.id)

    def get(self, cls: type[DurableObject], object_id: str) -> Stub:
        """Return a stub for another object of the same runtime."""
        return self.runtime.get(cls, object_id)


def durable_object_retry_delay(retry_count: int) -> float | None:
    """Durable Objects' alarm retry: 2 s doubling, up to 6 retries, then give up."""
    if retry_count >= 6:
        return None
    return 2.0 * 2.0**retry_count


def resolve_namespace(namespace: str, class_path: str | None) -> type[DurableObject] | None:
    """Find the class of a namespace: the registry, else import its recorded path."""
    cls = _REGISTRY.get(namespace)
    if cls is not None or not class_path:
        return cls
    module, _, qualname = class_path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return _REGISTRY.get(namespace)
    return obj if isinstance(obj, type) and issubclass(obj, DurableObject) else None


def class_path(cls: type[DurableObject]) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
