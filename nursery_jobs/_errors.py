"""The error tree of nursery_jobs.

Every error the library raises derives from :class:`NurseryJobsError`. Errors that
describe a bad argument also derive from :class:`ValueError` or :class:`TypeError`;
lookup errors derive from :class:`LookupError`::

    NurseryJobsError
     ├─ ObjectIdError (ValueError)        a bad object id or namespace  .object_id .namespace
     ├─ TimeArgumentError (TypeError, ValueError)  a bad time, delay or jitter argument
     ├─ StorageKeyError (TypeError, ValueError)    a storage key that is not a non-empty str,
     │                                    at most 1024 characters
     ├─ CodecError (ValueError)           a payload that cannot be stored
     │   ├─ CallCodecError                a stub call's argument or result  .method .part
     │   └─ DamagedJobError               a stored job row does not read back (its file was
     │                                    changed outside nursery_jobs)
     │                                    .job_id .owner .object_label
     ├─ RuntimeLockedError                another runtime holds the data directory
     ├─ RuntimeClosedError                the runtime is not running
     ├─ EngineError (ValueError)          no engine serves the data location given
     │   └─ DataLayoutError               a data directory opened with the other layout
     │                                    (a file per object / shared:)  .path .layout
     ├─ TracingError (TypeError)          ``open_runtime(tracing=...)`` is no TracerProvider
     ├─ MissingExtraError (ImportError)   a feature whose extra is not installed  .extra
     ├─ StorageError                      an object's database cannot be opened
     │   ├─ StorageFaultError (also sqlite3.DatabaseError)  a fault of the file or disk:
     │   │                                .label .file .cause (full, locked, corrupt ...)
     │   ├─ DataDirectoryAccessError (also DataDirectoryError)  the data directory cannot
     │   │                                be written: read-only, permission denied  .path .cause
     │   └─ TurnError                     storage touched by a task that holds no turn of the
     │                                    object, or a write in a read-only turn  .object_label
     ├─ ObjectFencedError                 another host took the object over; the write was refused
     ├─ RpcError (TypeError)              a stub call to a private name or a non-method
     │   └─ RemoteError                   (PostgreSQL) a method raised, on another host, an
     │                                    exception that cannot be rebuilt here
     │                                    .method .type_name .message
     ├─ ObjectResetError                  the object was evicted or reset during a call
     ├─ AlarmOwnedError                   set_alarm on an object whose Lifecycle owns the alarm
     │                                    .namespace .object_id .owner
     ├─ JobError (ValueError)             a bad job argument  .job_id (None: not about one job)
     │   └─ JobOwnershipError             a job id held by another owner  .owner .holder
     ├─ CapabilityError (ValueError)      a duplicate capability id, or use() after start
     │                                    (or a pause of an owner that is not installed)
     ├─ LifecycleArgumentError (TypeError, ValueError)  a bad Lifecycle.install() option,
     │                                    or use() of something that is no Capability
     ├─ LimitError (TypeError, ValueError) a bad nj.Limit, or a bad open_runtime(limits=)
     ├─ RuntimeArgumentError (TypeError, ValueError)  a bad open_runtime option, rt.get()
     │                                    class, or rt.events listener
     ├─ UnknownCallbackError (ValueError, LookupError)
     ├─ DataDirectoryError                (operator faces) a path that is no data directory
     ├─ UnknownObjectError (LookupError)  (operator faces) no such object  .namespace .object_id
     ├─ ObjectInUseError                  (operator faces) another process holds the object
     │   └─ ObjectHeldError               a live PostgreSQL host leases it  .owner
     ├─ HttpError                         (the dashboard) a refused request, with its .status
     └─ HttpBindError (OSError)           the dashboard cannot listen on its address
                                          (in use, unresolvable)  .host .port .cause

Two signals travel between an engine and the runtime and never reach a caller:
``ObjectLeasedElsewhere`` (the object is another live host's before anything ran here:
forward the call there) and ``ObjectMoved`` (this host may have lost an object it held:
drop it and route the call again). A user sees ``ObjectFencedError`` only: this host's
own write for the object was refused because another host took it.

User exceptions are formatted (for dead letters, events and log lines) by
:func:`describe_error` and :func:`safe_repr`, which never raise: an exception whose
``__str__`` or ``__repr__`` raises must stay the failure of the job that raised it, not
become a failure of the runtime (issue 10 #2).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Literal

import trio

if TYPE_CHECKING:
    from nursery_jobs._core._object import DurableObject

# Why a database cannot be used (``StorageFaultError.cause``).
Cause = Literal["full", "readonly", "denied", "locked", "corrupt", "io", "cantopen",
                "missing"]

# The longest error text kept in a dead letter, an event or a log line.
ERROR_TEXT_LIMIT: Final = 2000


class NurseryJobsError(Exception):
    """Root of every error raised by nursery_jobs."""


class ObjectIdError(NurseryJobsError, ValueError):
    """An object id (or a class's namespace) is not a non-empty string of at most 1024
    characters that every engine can store. ``object_id`` is the id refused, as given
    (None: a namespace was refused, and ``namespace`` is it)."""

    def __init__(self, *args: object, namespace: object = None,
                 object_id: object = None) -> None:
        super().__init__(*args)
        self.namespace = namespace
        self.object_id = object_id


class TimeArgumentError(NurseryJobsError, TypeError, ValueError):
    """A time, delay or jitter argument is not a finite number of seconds (or an aware
    datetime where a time is taken)."""


class StorageKeyError(NurseryJobsError, TypeError, ValueError):
    """A storage key is not a non-empty str of at most 1024 characters that every
    engine can store (no NUL, no lone surrogate)."""


class CodecError(NurseryJobsError, ValueError):
    """A payload holds a value the codec cannot store, or is too large."""


class CallCodecError(CodecError):
    """A stub call's argument or result cannot go through the payload codec (every
    engine copies them through it). ``method`` names the call (``ns/id.name()``),
    ``part`` what was refused: ``args[0]``, ``kwargs['by']``, ``result``, or
    ``arguments`` (their size together)."""

    def __init__(self, message: str, method: str = "", part: str = "") -> None:
        super().__init__(message)
        self.method = method
        self.part = part

    def __reduce__(self) -> tuple[Any, ...]:  # (what it is built from again: by a pickle,
        return (type(self), (str(self), self.method, self.part))  # and between hosts)


class DamagedJobError(CodecError):
    """A job row of an object's database does not read back as a job (a payload that
    does not decode, a time that is no number: the file was changed outside
    nursery_jobs). ``job_id``, ``owner`` and ``object_label`` (``ns/id``) name it."""

    def __init__(self, message: str, job_id: str = "", owner: str = "",
                 object_label: str = "") -> None:
        super().__init__(message)
        self.job_id = job_id
        self.owner = owner
        self.object_label = object_label

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.job_id, self.owner, self.object_label))


class RuntimeLockedError(NurseryJobsError):
    """Another runtime, in this process or another, holds the data directory."""


class RuntimeClosedError(NurseryJobsError):
    """The runtime has not started or has already shut down."""


class EngineError(NurseryJobsError, ValueError):
    """``open_runtime`` was given a location no engine serves (an unknown ``scheme://``)."""


class DataLayoutError(EngineError):
    """A data directory was opened with a layout it was not created with: a file per
    object (a path) or one shared database (``shared:<path>``). Nothing was written.
    ``path`` is the directory, ``layout`` the layout it holds (``"files"`` or
    ``"shared"``)."""

    def __init__(self, message: str, *, path: str, layout: str) -> None:
        super().__init__(message)
        self.path = path
        self.layout = layout


class TracingError(NurseryJobsError, TypeError):
    """``open_runtime(tracing=...)`` was given something that is not an OpenTelemetry
    ``TracerProvider`` (an object with a ``get_tracer`` method)."""


class MissingExtraError(NurseryJobsError, ImportError):
    """A feature needs an extra that is not installed; the message is one line naming the
    ``pip install`` that brings it. ``extra`` is the extra's name (``"otel"``)."""

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs the {extra} extra: pip install 'nursery_jobs[{extra}]'")
        self.extra = extra


class StorageError(NurseryJobsError):
    """An object's database cannot be opened (too many open files, disk full...)."""


class StorageFaultError(StorageError, sqlite3.DatabaseError):
    """A database cannot be read or written for a reason of its file or disk: full,
    read-only, not this process's to write, locked by another process, damaged or
    failing. ``label`` names the object (or the catalog), ``file`` the file, ``cause``
    one of ``full``, ``readonly``, ``denied``, ``locked``, ``corrupt``, ``io``,
    ``cantopen``, ``missing``."""

    def __init__(self, message: str, *, label: str, file: str, cause: Cause) -> None:
        super().__init__(message)
        self.label = label
        self.file = file
        self.cause = cause


class TurnError(StorageError):
    """Storage was touched by a task that holds no turn of the object (or written in a
    read-only turn): nothing was read or written. ``object_label`` names the object
    (``namespace/id``); the message names the fix (``async with self.ctx.turn():``)."""

    def __init__(self, message: str, *, object_label: str) -> None:
        super().__init__(message)
        self.object_label = object_label

    def __reduce__(self) -> tuple[Any, ...]:  # (a pickle of it: keyword-only state)
        return (_turn_error, (str(self), self.object_label))


def _turn_error(message: str, object_label: str) -> TurnError:
    return TurnError(message, object_label=object_label)


class ObjectFencedError(NurseryJobsError):
    """Another host took the object over (its lease and epoch), or this host's lease or
    base is not known to hold: this host's write was refused and the object dropped
    here. ``reason`` says which, in words (None: another host took it over)."""

    def __init__(self, *args: object, reason: str | None = None) -> None:
        super().__init__(*args)
        self.reason = reason


class RpcError(NurseryJobsError, TypeError):
    """A stub call named a private attribute or something that is not a method."""


class RemoteError(RpcError):
    """A stub call's method raised, on the host that holds the object, an exception that
    cannot be rebuilt here as itself (its class is not loaded in this process, or its
    parts cannot be carried as data). ``method`` names the call (``ns/id.name()``),
    ``type_name`` the class raised (``module.QualName``; a builtin's bare name),
    ``message`` its text (cut to ``ERROR_TEXT_LIMIT``)."""

    def __init__(self, text: str, method: str = "", type_name: str = "",
                 message: str = "") -> None:
        super().__init__(text)
        self.method = method
        self.type_name = type_name
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # (what it is built from again: by a pickle,
        return (type(self), (str(self), self.method, self.type_name,  # and between hosts)
                             self.message))


class ObjectResetError(NurseryJobsError):
    """The object was evicted, reset or shut down while a call was running."""


class AlarmOwnedError(NurseryJobsError):
    """``storage.set_alarm`` was called on an object whose Lifecycle owns the alarm (or
    the alarm was claimed twice). ``namespace`` and ``object_id`` name the object,
    ``owner`` what owns its alarm (``"Lifecycle"``)."""

    def __init__(self, *args: object, namespace: str | None = None,
                 object_id: str | None = None, owner: str | None = None) -> None:
        super().__init__(*args)
        self.namespace = namespace
        self.object_id = object_id
        self.owner = owner


class JobError(NurseryJobsError, ValueError):
    """A job argument is invalid. ``job_id`` is the job's id (as given) where the error
    is about one job, else None."""

    def __init__(self, *args: object, job_id: object = None) -> None:
        super().__init__(*args)
        self.job_id = job_id


class JobOwnershipError(JobError):
    """A job id is held by another owner (the host or another capability). ``job_id``
    is the id, ``owner`` who asked (``"host"`` or a capability id), ``holder`` who holds
    it (None where it is ``owner`` itself: a requeue of a letter whose id is queued
    again)."""

    def __init__(self, *args: object, job_id: object = None, owner: str | None = None,
                 holder: str | None = None) -> None:
        super().__init__(*args, job_id=job_id)
        self.owner = owner
        self.holder = holder


class JobTimeoutError(NurseryJobsError):
    """A job's run was still going after its ``timeout`` seconds: it was cancelled, and
    the attempt failed with this error (retried by the job's ``RetryOptions``,
    dead-lettered after the last, seen by a capability's ``on_job_error``).
    ``job_id`` names the job, ``timeout`` its timeout in seconds."""

    def __init__(self, message: str, *, job_id: str, timeout: float) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        return (_job_timeout_error, (str(self), self.job_id, self.timeout))


def _job_timeout_error(message: str, job_id: str, timeout: float) -> JobTimeoutError:
    return JobTimeoutError(message, job_id=job_id, timeout=timeout)


class CapabilityError(NurseryJobsError, ValueError):
    """A capability id is used twice on one object, or added after start."""


class LifecycleArgumentError(NurseryJobsError, TypeError, ValueError):
    """An argument of ``Lifecycle.install()`` (its host, an option) or of
    ``Lifecycle.use()`` is invalid (the message names which). Both a ``TypeError`` and a
    ``ValueError``: the wrong type and a value out of range are one mistake to a caller,
    and code that caught either before keeps catching it."""


class LimitError(NurseryJobsError, TypeError, ValueError):
    """An ``nj.Limit`` argument, or an ``open_runtime(limits=...)`` key or value, is
    invalid (the message names which)."""


class RuntimeArgumentError(NurseryJobsError, TypeError, ValueError):
    """An argument of the runtime's own API is invalid (the message names which): an
    ``open_runtime`` option (``idle_timeout``, ``max_active``, ``durability``,
    ``stop_on``, ``http``, ``lease_ttl``...), the class given to ``rt.get``, or a
    listener given to ``rt.events`` (not callable; not one to remove)."""


class UnknownCallbackError(NurseryJobsError, ValueError, LookupError):
    """A Queue, Scheduler or Agent callback name is not registered."""


class DataDirectoryError(NurseryJobsError):
    """A path is not a nursery_jobs data directory (no catalog)."""


class DataDirectoryAccessError(DataDirectoryError, StorageError):
    """The data directory (its lock file, its ``objects`` directory) cannot be written
    when a runtime opens it. ``path`` names what was refused, ``cause`` says why:
    ``readonly`` (a read-only filesystem), ``denied`` (permission denied), else the
    operating system's name for the error (``ENOSPC``...)."""

    def __init__(self, message: str, *, path: str, cause: str) -> None:
        super().__init__(message)
        self.path = path
        self.cause = cause


class UnknownObjectError(NurseryJobsError, LookupError):
    """(Operator faces) No such object: none of that namespace and id is stored, or
    its namespace has no class here. ``.namespace`` and ``.object_id`` name the object
    where one was looked for."""

    def __init__(self, message: str, *, namespace: str | None = None,
                 object_id: str | None = None) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.object_id = object_id

    @classmethod
    def absent(cls, namespace: str, object_id: str, where: str) -> UnknownObjectError:
        """No object ``object_id`` is stored in ``namespace`` at ``where`` (a data
        directory, an address: the engine's label)."""
        return cls(f"no object {_shown(object_id)} in namespace {_shown(namespace)} of"
                   f" {where}", namespace=namespace, object_id=object_id)


def _shown(name: str) -> str:
    """A name as a message quotes it (a huge one cut short, saying how long it is)."""
    if len(name) <= 100:
        return repr(name)
    return f"{name[:60]!r}... ({len(name)} characters)"


class ObjectInUseError(NurseryJobsError):
    """Another process holds an object's database."""


class ObjectHeldError(ObjectInUseError):
    """A live host leases the object (PostgreSQL): a write from outside it would go
    behind its back, so nothing was written."""

    def __init__(self, namespace: str, object_id: str, owner: str, seconds_left: float) -> None:
        super().__init__(
            f"{namespace}/{object_id} is held by host {owner} (its lease runs"
            f" {max(seconds_left, 0.0):.1f} s more, and it renews while the object is"
            " active): nothing was written. Requeue it on that host (its dashboard, with"
            " open_runtime(..., http=..., http_writes=True)), or here once the host has"
            " let it go (idle_timeout after its last call or alarm)"
        )
        self.namespace = namespace
        self.object_id = object_id
        self.owner = owner


class HttpError(NurseryJobsError):
    """A request the dashboard refuses (bad parameter, forbidden write)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpBindError(NurseryJobsError, OSError):
    """The dashboard cannot listen on its address (``open_runtime(http=...)``,
    ``nursery-jobs serve``): in use, not resolvable, not permitted. ``.host``,
    ``.port``, and ``.cause`` the socket's own error (its ``errno`` is this one's)."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        reason = cause.strerror or str(cause) or type(cause).__name__
        super().__init__(f"cannot serve the dashboard on {where}: {reason}")
        self.errno = cause.errno
        self.host = host
        self.port = port
        self.cause = cause


class ObjectLeasedElsewhere(NurseryJobsError):
    """``open_object`` found the object leased by another live host (engines with
    several hosts): the stub call goes there instead, through ``forward``."""

    def __init__(
        self, label: str, owner: str,
        forward: Callable[..., Awaitable[Any]],
    ) -> None:
        super().__init__(f"{label} is held by host {owner}")
        self.owner = owner
        # forward(cls, object_id, name, args, kwargs, again, chain, trace) -> the result;
        # ``again`` is the stub call, for an object that moved before the call ran;
        # ``chain`` the caller's call chain (turn ids).
        self.forward = forward

    async def forward_call(
        self, cls: type[DurableObject], object_id: str, name: str, args: tuple[Any, ...],
        kwargs: dict[str, Any], again: Callable[..., Awaitable[Any]], chain: tuple[str, ...],
        trace: str | None = None,
    ) -> Any:
        # (trace: the caller's span context, W3C trace context as JSON; None untraced.)
        return await self.forward(cls, object_id, name, args, kwargs, again, chain, trace)


class ObjectMoved(NurseryJobsError):
    """A call found, before its method ran, that this host may have lost the object
    (engines with several hosts): the object was dropped here, and the stub routes the
    call again. Never reaches a caller."""


def describe_error(error: BaseException, limit: int = ERROR_TEXT_LIMIT) -> str:
    """``"Type: message"`` for ``error`` (``"Type"`` if the message is empty), never
    raising: a ``__str__`` that raises, recurses without end or returns a non-str gives
    ``"Type (str() failed: Error)"``; a text longer than ``limit`` is cut."""
    name = _type_name(error)
    try:
        message = str(error)
        if not isinstance(message, str):
            raise TypeError(f"__str__ returned {_type_name(message)}")
    except Exception as exc:
        return f"{name} (str() failed: {_type_name(exc)})"
    return _cut(f"{name}: {message}" if message else name, limit)


def safe_repr(obj: object, limit: int = ERROR_TEXT_LIMIT) -> str:
    """``repr(obj)``, never raising: a ``__repr__`` that raises, recurses without end or
    returns a non-str gives ``"<Type object (repr() failed: Error)>"``; a text longer
    than ``limit`` is cut."""
    try:
        text = repr(obj)
        if not isinstance(text, str):
            raise TypeError(f"__repr__ returned {_type_name(text)}")
    except Exception as exc:
        return f"<{_type_name(obj)} object (repr() failed: {_type_name(exc)})>"
    return _cut(text, limit)


def lone_interrupt(
    group: BaseExceptionGroup[BaseException],
) -> KeyboardInterrupt | SystemExit | None:
    """The KeyboardInterrupt or SystemExit of ``group`` if, at any depth, it holds
    nothing else but ``trio.Cancelled`` (the unwinding it causes); else None.

    Under load a Ctrl-C lands in whatever runtime task holds the Trio thread (a job),
    and reaches ``open_runtime`` wrapped in the nursery's group: the application must
    see it as the plain KeyboardInterrupt it sees on an idle runtime (issue 10 #9). A
    job's ``SystemExit(3)`` likewise, so that the process exits with status 3 (issue 22
    #3).
    """
    found: KeyboardInterrupt | SystemExit | None = None
    for exc in _leaves(group):
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            found = found or exc
        elif not isinstance(exc, trio.Cancelled):
            return None
    return found


def sole_leaf(error: BaseException) -> BaseException:
    """The one exception ``error`` stands for: the only leaf of a group that holds one
    (at any depth: a nursery's group around a task's exception), else ``error``. For
    naming it in an event; the log record keeps the group's traceback."""
    if isinstance(error, BaseExceptionGroup):
        leaves = list(_leaves(error))
        if len(leaves) == 1:
            return leaves[0]
    return error


def memory_error_of(error: BaseException) -> MemoryError | None:
    """The ``MemoryError`` that ``error`` is, or holds at any depth of a group (a task
    of a job's own nursery ran out of memory), else None: out of memory anywhere in a
    job or its tracked work resets the object (DESIGN 3), however it arrives."""
    if isinstance(error, MemoryError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for leaf in _leaves(error):
            if isinstance(leaf, MemoryError):
                return leaf
    return None


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


# Where Trio's SIGINT handler (and its delivery at a checkpoint) raise KeyboardInterrupt.
_TRIO_DIR: Final = os.path.dirname(trio.__file__) + os.sep


def from_signal(error: BaseException) -> bool:
    """Whether ``error`` is a KeyboardInterrupt that a real SIGINT raised, wherever it
    landed (Trio's handler raises it in the frame that runs: a CPU-bound job's), as
    opposed to one that code raised itself. A signal is never the failure of the job
    it interrupts (issue 22 #3). Does not checkpoint."""
    if not isinstance(error, KeyboardInterrupt):
        return False
    tb, last = error.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and last.tb_frame.f_code.co_filename.startswith(_TRIO_DIR)


def _type_name(obj: object) -> str:
    try:
        name = type(obj).__qualname__
    except Exception:  # a metaclass with a hostile __qualname__
        return "object"
    return name if isinstance(name, str) else "object"


def _cut(text: str, limit: int) -> str:
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text)} chars)"
    if not text.isascii():
        # Lone surrogates (an error message built from undecodable bytes, say) as
        # \udXXX escapes: no UTF-8 store or log handler takes them, and a dead letter
        # whose write raised made its job's alarm fail for ever.
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
