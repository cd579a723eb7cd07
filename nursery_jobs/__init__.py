"""nursery_jobs: durable objects with one alarm and a durable job queue each, for Trio."""

__version__ = "0.1.0"

from ._agent import Agent as Agent
from ._agent import TaskInfo as TaskInfo
from ._agent import TaskRecord as TaskRecord
from ._breaker import MemoryLimitContext as MemoryLimitContext
from ._capability import Capability as Capability
from ._clock import jitter as jitter
from ._clock import now as now
from ._errors import AlarmOwnedError as AlarmOwnedError
from ._errors import CapabilityError as CapabilityError
from ._errors import CodecError as CodecError
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
from ._jobs import Jobs as Jobs
from ._jobs import Reschedule as Reschedule
from ._jobs import RetryOptions as RetryOptions
from ._lifecycle import CapabilityLifecycle as CapabilityLifecycle
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
