"""The exception hierarchy. Built-in exceptions (KeyError, TypeError, ValueError, FileNotFoundError,
FileExistsError) are raised as they are wherever Python users expect them; these cover the rest."""

from __future__ import annotations

import errno
import shlex


def remove_hint(name: str) -> str:
    """How to remove the existing cache ``name`` to create it anew, and what that loses: the end of the hint of every
    error about an existing cache."""
    return (f"remove it with `shmcache rm {shlex.quote(name)}` and create it again: every entry it holds is lost, "
            "for every process, and processes that have it open keep the old one until they close it")


class ShmCacheError(Exception):
    """Root of shmcache's own errors; ``what`` names the failed operation and ``hint`` says what to do."""

    def __init__(self, message: str, *, what: str = "", hint: str = "") -> None:
        self.what = what
        self.hint = hint
        super().__init__(f"{message} ({hint})" if hint else message)


class LayoutError(ShmCacheError):
    """The shared-memory object is not a shmcache segment, is truncated, or its geometry is impossible."""


class LayoutVersionError(LayoutError):
    """The segment is a shmcache segment of another layout version or feature set."""


class CorruptionError(ShmCacheError):
    """Shared data failed a bound or an invariant and could not be repaired."""


class LockTimeout(ShmCacheError, TimeoutError):
    """The cache lock was not obtained within the timeout (its holder is alive but stuck or stopped)."""


class AttachTimeout(ShmCacheError, TimeoutError):
    """Another process was still creating the cache's segment after ``attach_timeout`` seconds (it holds the
    segment file's ``flock`` while it initialises). Not a ``LockTimeout``: the cache lock is not involved, and
    the segment may never become usable if its creator is stopped."""


class ComputeTimeout(ShmCacheError, TimeoutError):
    """``get_or_compute`` waited its whole ``timeout`` for another process computing the same key."""


class TooLargeError(ShmCacheError, ValueError):
    """An entry can never fit the cache's limits; nothing was evicted. ``size``: the entry's bytes (encoded key and
    value, as ``max_retained_bytes`` counts them); ``limit``: the limit it exceeds, named by ``limit_name``
    (``"max_retained_bytes"``, or ``"capacity_bytes"`` for one beyond what the cache could ever be set to)."""

    def __init__(self, message: str, *, what: str = "", hint: str = "", size: int = 0, limit: int = 0,
                 limit_name: str = "") -> None:
        super().__init__(message, what=what, hint=hint)
        self.size = size
        self.limit = limit
        self.limit_name = limit_name


class OwnershipError(ShmCacheError, PermissionError):
    """The file at a cache's name was refused before a byte of it was read or written: it is owned by neither this
    process's effective uid nor an owner the caller trusts (``trust_owner=``), or its mode grants more than the
    ``mode=`` asked for, or it is not a regular file (a symlink is never followed). ``reason`` says which, briefly."""

    def __init__(self, message: str, *, what: str = "", hint: str = "", reason: str = "") -> None:
        super().__init__(message, what=what, hint=hint)
        self.reason = reason


class KindsFullError(ShmCacheError, ValueError):
    """The cache has all 255 kinds it can hold and the name asked for is not one of them. A ``ValueError`` like
    ``TooLargeError``: a request this cache can never satisfy (kinds last as long as the cache), refused before
    anything changed; not an ``OverflowError``, which Python keeps for arithmetic results too large to represent."""


class ReentrantCallError(ShmCacheError, RuntimeError):
    """A cache call was made from inside another on the same thread that holds what it needs, so waiting would
    never end: the cache lock (a signal handler, or a ``__del__`` run by the garbage collector, in the middle of a
    call), or the claim of a key (``get_or_compute``'s ``fn`` asking for its own key). The inner call is refused
    and changed nothing."""


class SerializerMismatch(ShmCacheError, ValueError):
    """A handle asked for one value serializer and the cache's segment records the other (``serializer=`` of
    ``SharedCache``: fixed at creation, like the capacity). A default handle never opens a pickle cache, whose
    values it could not read, and a pickle handle never opens a default one, whose writers did not opt into code
    running in its readers. ``asked`` and ``found`` name the two."""

    def __init__(self, message: str, *, what: str = "", hint: str = "", asked: str = "", found: str = "") -> None:
        super().__init__(message, what=what, hint=hint)
        self.asked = asked
        self.found = found


class SnapshotError(ShmCacheError):
    """A snapshot file (``SharedCache.snapshot``) cannot be restored: its header is damaged, truncated, or not a
    shmcache snapshot's. A damaged record is not this error: ``restore`` skips it and counts it."""


class SnapshotVersionError(SnapshotError):
    """A snapshot file of a newer major format version than this package reads: says both versions."""


class SnapshotMismatch(SnapshotError, ValueError):
    """A snapshot was taken of a cache whose values another serializer encoded (``serializer=``): its values would
    not read back, so none is restored. ``snapshot`` and ``cache`` name the two serializers."""

    def __init__(self, message: str, *, what: str = "", hint: str = "", snapshot: str = "", cache: str = "") -> None:
        super().__init__(message, what=what, hint=hint)
        self.snapshot = snapshot
        self.cache = cache


class ClosedError(ShmCacheError, ValueError):
    """The cache handle was used after ``close()``."""


class PinnedError(ShmCacheError):
    """Open views pin what the operation needed: a store found no room, the entries it could still evict (or the
    old values held aside for views), or the pieces of free arena between pinned blocks, being too few or too
    small. A store refused for room keeps the evictions it made, and the key's old value is gone if the new one was
    of another size. On a segment made by a release before layout version 12, also a put, delete or pop of a key
    whose entry a view pins (it then changed nothing); from version 12 that entry is held aside for the view."""


class NoSpaceError(ShmCacheError, OSError):
    """A store needed more of the cache's arena backed by memory, and /dev/shm had no more to give (ENOSPC: the
    host's or container's shared memory is full). Nothing was stored (as with PinnedError, the evictions made and an
    old value of another size are gone); every structure is consistent, and reads, deletes and stores that fit in
    what is already backed go on."""

    def __init__(self, message: str, *, what: str = "", hint: str = "") -> None:
        super().__init__(message, what=what, hint=hint)
        self.errno = errno.ENOSPC
        self.strerror = str(self)


class RemoteError(ShmCacheError, ConnectionError):
    """A ``TieredCache`` call needed Redis and Redis failed, timed out, or failed recently (raised only with
    ``strict=True``; otherwise the failure is counted and logged and the call is served by the local cache)."""


class CapacityWarning(UserWarning):
    """The cache's limits keep it from holding what it is asked to (a ``UserWarning``: shown by default, once per
    place, where a ``ResourceWarning`` would be hidden outside development mode). Each is said once per process
    and per what it concerns; filter the category to silence them all."""


class TooLargeWarning(CapacityWarning):
    """A value ``get_or_compute`` computed (through ``memoize`` or ``CachedDataset`` too) can never be kept, so
    every call computes it again. Said once per process for each family of keys (a memoized function, a dataset,
    a kind, or the function that calls ``get_or_compute``), with the value's size and the limit; ``stats()
    .too_large`` counts every refusal."""


class SnapshotWarning(UserWarning):
    """``SharedCache(restore_from=...)`` created the cache and could not restore the file (its header is damaged or
    foreign, its serializer is the other one, or it could not be read): the cache starts empty. ``restore()``
    called directly raises the error instead."""


class CompiledSectionMissing(RuntimeWarning):
    """``import shmcache`` found no compiled section (``shmcache._core``): every call runs the pure-Python path.
    Silenced by choosing that path (SHMCACHE_PURE_PYTHON=1), or filtered as any warning is."""
