"""The error tree of nursery_jobs.

Every error the library raises derives from :class:`NurseryJobsError`. Errors that
describe a bad argument also derive from :class:`ValueError` or :class:`TypeError`;
lookup errors derive from :class:`LookupError`::

    NurseryJobsError
     ├─ ObjectIdError (ValueError)        a bad object id
     ├─ TimeArgumentError (TypeError, ValueError)  a bad time, delay or jitter argument
     ├─ StorageKeyError (TypeError, ValueError)    a storage key that is not a non-empty str
     ├─ CodecError (ValueError)           a payload that cannot be stored
     ├─ RuntimeLockedError                another runtime holds the data directory
     ├─ RuntimeClosedError                the runtime is not running
     ├─ EngineError (ValueError)          no engine serves the data location given
     ├─ StorageError                      an object's database cannot be opened
     ├─ ObjectFencedError                 another host took the object over; the write was refused
     ├─ RpcError (TypeError)              a stub call to a private name or a non-method
     ├─ ObjectResetError                  the object was evicted or reset during a call
     ├─ AlarmOwnedError                   set_alarm on an object whose Lifecycle owns the alarm
     ├─ JobError (ValueError)             a bad job argument
     │   └─ JobOwnershipError             a job id held by another owner
     ├─ CapabilityError (ValueError)      a duplicate capability id, or use() after start
     └─ UnknownCallbackError (ValueError, LookupError)
"""

from __future__ import annotations


class NurseryJobsError(Exception):
    """Root of every error raised by nursery_jobs."""


class ObjectIdError(NurseryJobsError, ValueError):
    """An object id is not a non-empty string of at most 1024 characters."""


class TimeArgumentError(NurseryJobsError, TypeError, ValueError):
    """A time, delay or jitter argument is not a finite number of seconds (or an aware
    datetime where a time is taken)."""


class StorageKeyError(NurseryJobsError, TypeError, ValueError):
    """A storage key is not a non-empty str."""


class CodecError(NurseryJobsError, ValueError):
    """A payload holds a value the codec cannot store, or is too large."""


class RuntimeLockedError(NurseryJobsError):
    """Another runtime, in this process or another, holds the data directory."""


class RuntimeClosedError(NurseryJobsError):
    """The runtime has not started or has already shut down."""


class EngineError(NurseryJobsError, ValueError):
    """``open_runtime`` was given a location no engine serves (an unknown ``scheme://``)."""


class StorageError(NurseryJobsError):
    """An object's database cannot be opened (too many open files, disk full...)."""


class ObjectFencedError(NurseryJobsError):
    """Another host took the object over (its lease and epoch): this host's write was
    refused and the object dropped here."""


class RpcError(NurseryJobsError, TypeError):
    """A stub call named a private attribute or something that is not a method."""


class ObjectResetError(NurseryJobsError):
    """The object was evicted, reset or shut down while a call was running."""


class AlarmOwnedError(NurseryJobsError):
    """``storage.set_alarm`` was called on an object whose Lifecycle owns the alarm."""


class JobError(NurseryJobsError, ValueError):
    """A job argument is invalid."""


class JobOwnershipError(JobError):
    """A job id is held by another owner (the host or another capability)."""


class CapabilityError(NurseryJobsError, ValueError):
    """A capability id is used twice on one object, or added after start."""


class UnknownCallbackError(NurseryJobsError, ValueError, LookupError):
    """A Queue, Scheduler or Agent callback name is not registered."""
