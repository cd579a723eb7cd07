"""DurableObject, the context an object is built with, and the namespace registry."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import weakref
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, ClassVar, cast

import attrs

from nursery_jobs import _codec
from nursery_jobs._core._left import Left
from nursery_jobs._errors import ObjectIdError
from nursery_jobs._names import check_name

if TYPE_CHECKING:
    import trio

    from nursery_jobs._core._alarm import AlarmClaim, AlarmHandler
    from nursery_jobs._core._runtime import Stub
    from nursery_jobs._core._storage import Storage
    from nursery_jobs._core._turns import TurnGate
    from nursery_jobs._events import EventBus
    from nursery_jobs._policy import Backoff

# namespace -> class, filled as DurableObject subclasses are defined, so an alarm can
# re-activate an evicted object without the application naming its class first.
_REGISTRY: dict[str, type[DurableObject]] = {}


@attrs.frozen(kw_only=True)
class AlarmInfo:
    """Passed to ``DurableObject.alarm``: how many times this alarm has been retried."""

    retry_count: int
    is_retry: bool


_codec.register_record(AlarmInfo, "AlarmInfo")


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
            cls.namespace = f"{module_of(cls)}.{cls.__qualname__}"
        # Every row of its objects holds it (a module named from undecodable bytes can
        # put a lone surrogate in the default, too).
        check_name(cls.namespace, f"{cls.__qualname__}.namespace",
                   functools.partial(ObjectIdError, namespace=cls.namespace))
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

    __slots__ = ("_claim", "_stubs", "_turns", "env", "events", "id", "namespace", "nursery",
                 "storage")

    def __init__(
        self,
        *,
        id: str,
        namespace: str,
        storage: Storage,
        nursery: trio.Nursery,
        env: Any,
        events: EventBus,
        stubs: Callable[[type[DurableObject], str], Stub],
        claim: Callable[[str, AlarmHandler, Backoff], AlarmClaim],
        turns: TurnGate,
    ) -> None:
        self.id = id
        self.namespace = namespace
        self.storage = storage
        self.nursery = nursery
        self.env = env
        self.events = events
        self._stubs = stubs
        self._claim = claim
        self._turns = turns

    def release(self) -> None:
        """The object left memory: let go of its host and nursery (``ObjectHost.close``,
        ``_left``)."""
        label = f"{self.namespace}/{self.id}"
        self._claim = Left(label, "alarm")
        self.nursery = cast("trio.Nursery", Left(label, "nursery"))

    def turn(self) -> AbstractAsyncContextManager[None]:
        """``async with ctx.turn():`` hold the object's turn for the block, to touch its
        storage from a task that holds none (a background task, tracked work, an
        ``@nj.interleave`` method). Inside a turn the task already holds, it just runs.
        Checkpoints."""
        import trio

        from nursery_jobs._core._turns import interleave_gate

        holder = f"ctx.turn() of task {trio.lowlevel.current_task().name}"
        ship = interleave_gate.get()
        if ship is None:
            return self._turns.turn("write", holder)
        # (An @interleave call's: what it writes is durable before it returns.)
        return self._turns.gated_turn(holder, ship)

    def get(self, cls: type[DurableObject], object_id: str) -> Stub:
        """Return a stub for another object of the same runtime."""
        return self._stubs(cls, object_id)

    def claim_alarm(self, owner: str, handler: AlarmHandler, policy: Backoff) -> AlarmClaim:
        """Hand the object's alarm to one owner (the Lifecycle): ``handler`` runs when it
        is due, a failed run is retried by ``policy``, and ``storage.set_alarm`` is
        refused from now on. Once per activation.

        Raises:
            AlarmOwnedError: the alarm is already claimed.
        """
        return self._claim(owner, handler, policy)


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
    """Where ``cls`` is imported from ("module:qualname"), as recorded with its objects.
    Worked out once per class (every activation asks; for a class of a script, the
    script's real path and its packages are looked up on disk: ~40 µs, measured)."""
    path = _CLASS_PATHS.get(cls)
    if path is None:
        path = _CLASS_PATHS[cls] = f"{module_of(cls)}:{cls.__qualname__}"
    return path


# class -> class_path(class): what ``__main__`` is importable as does not change while
# the process runs.
_CLASS_PATHS: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()


def module_of(cls: type) -> str:
    """The module ``cls`` is importable as: a script run as ``__main__`` counts as the
    module its file would be imported as (``python app.py`` and ``from app import X``
    must name the same objects: data must not vanish because a script was started
    another way). A file inside a package (directories with an ``__init__.py``) is that
    package's module: ``python app/main.py`` is ``app.main``, as ``python -m app.main``
    is; a package's ``__main__.py`` is ``app.__main__``, as ``import app.__main__``
    names it (and so its class path imports)."""
    module = cls.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        name: str = spec.name  # python -m app, python -m app.main, python -m app (app.__main__)
        return name
    file = getattr(main, "__file__", None)
    if not isinstance(file, str):
        return module  # an interactive session: no file to be imported from
    folder, base = os.path.split(os.path.realpath(file))
    stem, ext = os.path.splitext(base)
    if ext != ".py" or not stem.isidentifier():
        return module
    parts = [stem]
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        folder, package = os.path.split(folder)
        if not package.isidentifier():
            break
        parts.insert(0, package)
    return ".".join(parts)
