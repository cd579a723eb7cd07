"""nursery_jobs: durable objects with one alarm and a durable job queue each, for Trio."""

__version__ = "0.1.0"

import types as _types

import attrs as _attrs

from nursery_jobs._capabilities._agent import Agent as Agent
from nursery_jobs._capabilities._agent import TaskInfo as TaskInfo
from nursery_jobs._capabilities._agent import TaskRecord as TaskRecord
from nursery_jobs._capabilities._queue import Queue as Queue
from nursery_jobs._capabilities._queue import QueueDeadLetter as QueueDeadLetter
from nursery_jobs._capabilities._queue import QueueItem as QueueItem
from nursery_jobs._capabilities._scheduler import Schedule as Schedule
from nursery_jobs._capabilities._scheduler import Scheduler as Scheduler
from nursery_jobs._clock import jitter as jitter
from nursery_jobs._clock import now as now
from nursery_jobs._core._object import AlarmInfo as AlarmInfo
from nursery_jobs._core._object import DurableObject as DurableObject
from nursery_jobs._core._object import ObjectContext as ObjectContext
from nursery_jobs._core._runtime import Runtime as Runtime
from nursery_jobs._core._runtime import RuntimeStatistics as RuntimeStatistics
from nursery_jobs._core._runtime import Stub as Stub
from nursery_jobs._core._runtime import install_http_face as _install_http_face
from nursery_jobs._core._runtime import open_runtime as open_runtime
from nursery_jobs._core._storage import Storage as Storage
from nursery_jobs._core._tracing import install_tracing as _install_tracing
from nursery_jobs._core._turns import interleave as interleave
from nursery_jobs._core._turns import read_only as read_only
from nursery_jobs._errors import AlarmOwnedError as AlarmOwnedError
from nursery_jobs._errors import CapabilityError as CapabilityError
from nursery_jobs._errors import CodecError as CodecError
from nursery_jobs._errors import EngineError as EngineError
from nursery_jobs._errors import HttpBindError as HttpBindError
from nursery_jobs._errors import JobError as JobError
from nursery_jobs._errors import JobOwnershipError as JobOwnershipError
from nursery_jobs._errors import JobTimeoutError as JobTimeoutError
from nursery_jobs._errors import LimitError as LimitError
from nursery_jobs._errors import NurseryJobsError as NurseryJobsError
from nursery_jobs._errors import ObjectFencedError as ObjectFencedError
from nursery_jobs._errors import ObjectIdError as ObjectIdError
from nursery_jobs._errors import ObjectResetError as ObjectResetError
from nursery_jobs._errors import RpcError as RpcError
from nursery_jobs._errors import RuntimeArgumentError as RuntimeArgumentError
from nursery_jobs._errors import RuntimeClosedError as RuntimeClosedError
from nursery_jobs._errors import RuntimeLockedError as RuntimeLockedError
from nursery_jobs._errors import StorageError as StorageError
from nursery_jobs._errors import StorageKeyError as StorageKeyError
from nursery_jobs._errors import TimeArgumentError as TimeArgumentError
from nursery_jobs._errors import TurnError as TurnError
from nursery_jobs._errors import UnknownCallbackError as UnknownCallbackError
from nursery_jobs._events import Event as Event
from nursery_jobs._events import EventBus as EventBus
from nursery_jobs._jobs._capability import Capability as Capability
from nursery_jobs._jobs._lifecycle import Lifecycle as Lifecycle
from nursery_jobs._jobs._records import YIELD as YIELD
from nursery_jobs._jobs._records import DeadLetter as DeadLetter
from nursery_jobs._jobs._records import Job as Job
from nursery_jobs._jobs._records import JobContext as JobContext
from nursery_jobs._jobs._records import JobOutcome as JobOutcome
from nursery_jobs._jobs._records import Reschedule as Reschedule
from nursery_jobs._jobs._strikes import MemoryLimitContext as MemoryLimitContext
from nursery_jobs._jobs._views import CapabilityLifecycle as CapabilityLifecycle
from nursery_jobs._jobs._views import Jobs as Jobs
from nursery_jobs._ops._tracing import open_tracing as _open_tracing
from nursery_jobs._ops._web import start_http as _start_http
from nursery_jobs._policy import Limit as Limit
from nursery_jobs._policy import RetryOptions as RetryOptions

# The operator faces plug into the runtime from above (the runtime never imports them).
_install_http_face(_start_http)
_install_tracing(_open_tracing)

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
    "HttpBindError",
    "Job",
    "JobContext",
    "JobError",
    "JobOutcome",
    "JobOwnershipError",
    "JobTimeoutError",
    "Jobs",
    "Lifecycle",
    "Limit",
    "LimitError",
    "MemoryLimitContext",
    "NurseryJobsError",
    "ObjectContext",
    "ObjectFencedError",
    "ObjectIdError",
    "ObjectResetError",
    "Queue",
    "QueueDeadLetter",
    "QueueItem",
    "Reschedule",
    "RetryOptions",
    "RpcError",
    "Runtime",
    "RuntimeArgumentError",
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
    "TurnError",
    "UnknownCallbackError",
    "YIELD",
    "interleave",
    "jitter",
    "now",
    "open_runtime",
    "read_only",
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
