"""What the framework cache backends (``contrib.django``, ``contrib.flask``) share: this process's SharedCache handles,
the SharedCache keywords a backend passes through, and storing with memcached's rule for values too large.

Invariant: a process uses the handle it opened. A handle is opened on first use and shared by every backend instance
of the same name and options in the process (Django makes one per thread and alias, Flask one per app); a forked
child sees another pid and opens its own. Handles are opened with ``serializer="pickle"``: frameworks cache arbitrary
objects (model instances, sessions, responses, memoized results).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from shmcache import SharedCache, TooLargeError

# SharedCache's keywords a backend's settings may give: the geometry and mode (fixed by whichever process creates
# the cache; an attacher that gives them must match) and the per-handle timeouts and trust.
OPTIONS = frozenset(("capacity_bytes", "max_entries", "mode", "lock_timeout", "attach_timeout", "trust_owner",
                     "group", "policy"))
# Why 1 ns, not a delete: a framework's "already expired" timeout (Django's 0 or below, cachelib's below 0) stores
# the value already expired, so ``add`` still answers whether the key was absent, atomically, the value is still
# pickled (a PickleError is raised as for any set), and the old value is gone. No read can come within 1 ns of the
# store: the entry is expired for every reader.
EXPIRED = 1e-9

# This process's handles, by (name, options): (the pid that opened it, the handle). The pid is checked at every use,
# so a child forked by any means opens its own; the fork hook also forgets the parent's at once.
_handles: dict[tuple, tuple[int, SharedCache]] = {}
_opening = threading.Lock()
# How long an open waits for another's before it goes on alone (two handles on one cache then, one of them
# dropped): never for ever, as it would for a lock an exception from a signal handler left held (flight.py's
# _REGISTRY_WAIT_S says how that happens on CPython 3.14).
_OPENING_WAIT_S = 5.0


def unknown_options(options: Mapping[str, Any]) -> list[str]:
    """The names in ``options`` that are not among OPTIONS, sorted (for the backend's configuration error)."""
    return sorted(set(options) - OPTIONS)


class ProcessHandle:
    """The handle of this process on the cache ``name`` opened with ``options`` (and ``serializer``: the framework
    caches' pickle by default), opened on first ``get()`` and again in a forked child."""

    __slots__ = ("name", "options", "key")

    def __init__(self, name: str, options: Mapping[str, Any], serializer: str = "pickle") -> None:
        self.name = name
        self.options = {"serializer": serializer, **options}
        self.key = (name, repr(sorted(self.options.items())))

    def get(self) -> SharedCache:
        entry = _handles.get(self.key)
        if entry is None or entry[0] != os.getpid():
            return self._open()
        return entry[1]

    def _open(self) -> SharedCache:
        pid = os.getpid()
        held = _opening.acquire(timeout=_OPENING_WAIT_S)
        try:
            entry = _handles.get(self.key)
            if entry is None or entry[0] != pid:
                entry = _handles[self.key] = pid, SharedCache(self.name, **self.options)
        finally:
            if held:
                _opening.release()
        return entry[1]


def close_handles() -> None:
    """Close this process's handles; every backend opens its cache again on next use. For tests, and for a process
    that wants its mappings gone before it exits."""
    entries = list(_handles.values())
    _handles.clear()  # (no lock: a handle opened meanwhile stays open, for its caller)
    for pid, handle in entries:
        if pid == os.getpid():
            handle.close()


def _forked_child() -> None:
    global _opening
    # The parent's handles stay valid here, but each process uses its own (see the Invariant); the lock may have
    # been held by a thread of the parent that does not exist here.
    _handles.clear()
    _opening = threading.Lock()


os.register_at_fork(after_in_child=_forked_child)


def put(cache: SharedCache, key: Any, value: Any, ttl: float) -> bool:
    """Store ``value``; whether it was. One too large for the cache is not stored and the key's old value goes (what
    memcached does with its item size limit: a reader never gets the value the writer meant to replace)."""
    try:
        cache.put(key, value, ttl)
        return True
    except TooLargeError:
        cache.delete(key)
        return False


def put_many(cache: SharedCache, pairs: list[tuple[Any, Any]], ttl: float) -> list[int]:
    """Store every (key, value) pair under one hold of the lock, as ``put`` does each; the positions of the pairs
    not stored (too large: their old values went)."""
    if not pairs:
        return []
    try:
        cache.put_many(pairs, ttl)
        return []
    except TooLargeError:  # refused whole before anything was stored: one at a time, to store the others
        return [i for i, (key, value) in enumerate(pairs) if not put(cache, key, value, ttl)]
