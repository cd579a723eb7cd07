"""nursery_jobs: durable objects with one alarm and a durable job queue each, for Trio."""

__version__ = "0.1.0"

import types as _types

import attrs as _attrs

from ._agent import Agent as Agent
from ._agent import TaskInfo as TaskInfo
from ._agent import TaskRecord as TaskRecord
from ._capability import Capability as Capability
from ._clock import jitter as jitter
from ._clock import now as now
from ._errors import AlarmOwnedError as AlarmOwnedError
from ._errors import CapabilityError as CapabilityError
from ._errors import CodecError as CodecError
from ._errors import EngineError as EngineError
from ._errors import JobError as JobError
from ._errors import JobOwnershipError as JobOwnershipError
from ._errors import NurseryJobsError as NurseryJobsError
from ._errors import ObjectIdError as ObjectIdError
from ._errors import ObjectResetError as ObjectResetError
from ._errors import RpcError as RpcError
from ._errors import RuntimeClosedError as RuntimeClosedError
from ._errors import RuntimeLockedError as RuntimeLockedError
from ._errors import StorageError as StorageError
from ._errors import StorageKeyError as StorageKeyError
from ._errors import TimeArgumentError as TimeArgumentError
from ._errors import UnknownCallbackError as UnknownCallbackError
from ._events import Event as Event
from ._events import EventBus as EventBus
from ._jobs import YIELD as YIELD
from ._jobs import DeadLetter as DeadLetter
from ._jobs import Job as Job
from ._jobs import JobContext as JobContext
from ._jobs import JobOutcome as JobOutcome
from ._jobs import Reschedule as Reschedule
from ._jobs import RetryOptions as RetryOptions
from ._lifecycle import Lifecycle as Lifecycle
from ._object import AlarmInfo as AlarmInfo
from ._object import DurableObject as DurableObject
from ._object import ObjectContext as ObjectContext
from ._queue import Queue as Queue
from ._queue import QueueDeadLetter as QueueDeadLetter
from ._queue import QueueItem as QueueItem
from ._runtime import Runtime as Runtime
from ._runtime import RuntimeStatistics as RuntimeStatistics
from ._runtime import Stub as Stub
from ._runtime import open_runtime as open_runtime
from ._scheduler import Schedule as Schedule
from ._scheduler import Scheduler as Scheduler
from ._storage import Storage as Storage
from ._strikes import MemoryLimitContext as MemoryLimitContext
from ._views import CapabilityLifecycle as CapabilityLifecycle
from ._views import Jobs as Jobs

__all__ = [
    "Agent",
    "AlarmInfo",
    "AlarmOwnedError",
    "Capability",
    "CapabilityError",
    "CapabilityLifecycle",
    "CodecError",
    "DeadLetter",
    "DurableObject",
    "EngineError",
    "Event",
    "EventBus",
    "Job",
    "JobContext",
    "JobError",
    "JobOutcome",
    "JobOwnershipError",
    "Jobs",
    "Lifecycle",
    "MemoryLimitContext",
    "NurseryJobsError",
    "ObjectContext",
    "ObjectIdError",
    "ObjectResetError",
    "Queue",
    "QueueDeadLetter",
    "QueueItem",
    "Reschedule",
    "RetryOptions",
    "RpcError",
    "Runtime",
    "RuntimeClosedError",
    "RuntimeLockedError",
    "RuntimeStatistics",
    "Schedule",
    "Scheduler",
    "Storage",
    "StorageError",
    "StorageKeyError",
    "Stub",
    "TaskInfo",
    "TaskRecord",
    "TimeArgumentError",
    "UnknownCallbackError",
    "YIELD",
    "jitter",
    "now",
    "open_runtime",
]


def _fixup_module_metadata() -> None:
    """Show public names as ``nursery_jobs.X``, where users import them from (tracebacks,
    reprs, docs), not as the private module that defines them."""
    for name in __all__:
        value = globals()[name]
        if _attrs.has(value):
            # Resolve string annotations while the defining module is still named:
            # the codec reads field types, and they must not be looked up here.
            _attrs.resolve_types(value)
        if getattr(value, "__module__", "").startswith("nursery_jobs._") and isinstance(
            value, type | _types.FunctionType
        ):
            value.__module__ = __name__


_fixup_module_metadata()
del _fixup_module_metadata
