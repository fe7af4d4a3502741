"""The fleet-wide half of ``TieredCache.get_or_compute``: one host computes a key while the others wait for its
result in Redis.

The computing host holds a Redis lock (``SET NX PX`` with a random owner token), renewed by a thread every third of
the lease while the host lives; it is released (only if still its own) when the function returns or raises. A
waiting host polls Redis for the value, backing off to ``WAIT_MAX_S``; when the lock is free and there is still no
value, it takes the lock itself: the computer died (its lease ran out) or raised. The host's own single-flight
(``flight.py``) is taken first, so one process per host takes part.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from ..errors import ComputeTimeout, RemoteError
from ..mapping import MISSING
from .layout import C_COMPUTATIONS, C_LOCK_TAKEOVERS, C_LOCK_WAITS, C_REFRESH_FAILURES, C_REFRESHES
from .steps import CALL, SLEEP, run

WAIT_FIRST_S, WAIT_MAX_S = 0.002, 0.05


class Lease:
    """A host's compute lock for the duration of a ``with``: renewed every third of the lease from a thread, and
    released at the end (only if still ours), so a waiting host takes over at once. The thread releases it as it
    ends; ``blocking`` (the synchronous API): the exit waits for that; else (the asyncio API: an event loop must not
    block, nor a cancellation wait) it returns at once.

    Cut short anywhere (an interrupt at ``__exit__``'s first bytecode, or between ``__enter__`` and the block), the
    lease still ends: the thread holds no reference to this object, and as this object goes its finalizer stops the
    thread, which releases the lock. A thread left renewing would hold the key's lock for ever, and every other
    host would wait for a value that never comes."""

    def __init__(self, remote, kb: bytes, token: bytes, lease_ms: int, blocking: bool = True) -> None:
        self._blocking = blocking
        self._done = done = threading.Event()
        self._thread = threading.Thread(target=_renew, args=(remote, kb, token, lease_ms, done),
                                        name="shmcache-lease", daemon=True)
        weakref.finalize(self, done.set)

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._blocking:
            self._thread.join(5)  # (a Redis slower than that: the thread releases the lock when it answers)


def _renew(remote, kb: bytes, token: bytes, lease_ms: int, done: threading.Event) -> None:
    try:
        while not done.wait(lease_ms / 3000):
            try:
                if not run(remote.renew(kb, token, lease_ms), remote):
                    return  # lost (expired while Redis was away): another host may compute too, harmlessly
            except RemoteError:
                pass
    finally:
        _unlock(remote, kb, token)


class RedisDown(Exception):
    """Redis failed while this host looked for the value or for the lock: ``error`` is the RemoteError. Apart from
    a RemoteError ``fn`` raises itself, which is ``fn``'s to pass on."""

    def __init__(self, error: RemoteError) -> None:
        super().__init__(str(error))
        self.error = error


def _ask(steps):
    try:
        return (yield from steps)
    except RemoteError as exc:
        raise RedisDown(exc) from exc


def compute(remote, fetch, put_computed, row, lease_ms: int, key, kb: bytes, fn, deadline: float | None,
            ttl: float, blocking: bool = True):
    """Steps (``steps.py``) whose result is the value of ``key`` from Redis, or computed by this host under the
    fleet's lock and written through. A TieredCache's parts: ``remote`` (a ``remote.Remote``), ``fetch(kb,
    count_miss)`` (steps: Redis's value copied locally, or MISSING), ``put_computed(key, value, ttl)`` (steps: the
    write-through), ``row`` (its stats row) and ``lease_ms`` (the lock's lease); ``blocking``: see ``Lease``. Raises
    RedisDown when Redis fails before ``fn`` runs, ComputeTimeout past ``deadline``."""
    token = os.urandom(16)
    pause, waited = WAIT_FIRST_S, False
    while True:
        value = yield from _ask(fetch(kb, not waited))
        if value is not MISSING:
            return value
        if (yield from _ask(remote.try_lock(kb, token, lease_ms))):
            # The computer may have stored its value and released the lock between the read above and this lock:
            # one more read, now that no other host can be computing.
            value = yield from _ask(fetch(kb, False))
            if value is not MISSING:
                yield from _unlocking(remote, kb, token)
                return value
            break
        if not waited:
            waited = True
            row[C_LOCK_WAITS] += 1
        if deadline is not None and time.monotonic() >= deadline:
            raise ComputeTimeout("another host has been computing this key for too long", what="get_or_compute",
                                 hint="raise timeout=, or look at the computing host")
        yield SLEEP, (pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 2, WAIT_MAX_S)
    if waited:
        row[C_LOCK_TAKEOVERS] += 1
    row[C_COMPUTATIONS] += 1
    with Lease(remote, kb, token, lease_ms, blocking):
        value = yield CALL, fn
        yield from put_computed(key, value, ttl)
    return value


def refresh(remote, fetch, put_computed, row, lease_ms: int, key, kb: bytes, fn, ttl: float, stale_ms: int,
            blocking: bool = True):
    """Steps of a background refresh of ``key``'s stale value (``TieredCache.get_or_compute``'s ``stale_ttl``), with
    this host's claim held: Redis's value first, for another host may have refreshed it (then copied here, and
    nothing computed); else the fleet's compute lock, taken without waiting (a host that holds it is refreshing:
    this one leaves it the work, and its callers serve the stale value meanwhile), Redis looked at once more, then
    ``fn`` under the lease and its write-through (``blocking``: see ``Lease``). Whether this host computed. Raises
    what ``fn`` raises (counted in ``refresh_failures``) and RemoteError."""
    left: list[int] = []
    value = yield from fetch(kb, False, left)
    if value is not MISSING and not _stale(left, stale_ms):
        return False
    token = os.urandom(16)
    if not (yield from remote.try_lock(kb, token, lease_ms)):
        return False
    left.clear()
    try:
        value = yield from fetch(kb, False, left)
    except BaseException:
        yield from _unlocking(remote, kb, token)
        raise
    if value is not MISSING and not _stale(left, stale_ms):
        yield from _unlocking(remote, kb, token)
        return False
    row[C_REFRESHES] += 1
    row[C_COMPUTATIONS] += 1
    with Lease(remote, kb, token, lease_ms, blocking):
        try:
            value = yield CALL, fn
        except Exception:
            row[C_REFRESH_FAILURES] += 1
            raise
        yield from put_computed(key, value, ttl)
    return True


def _stale(left: list[int], stale_ms: int) -> bool:
    """Whether a value Redis gave with ``left`` ([its ms to live, -1 for none]) is within its stale window."""
    return bool(left) and 0 <= left[0] <= stale_ms


def _unlocking(remote, kb: bytes, token: bytes):
    try:
        yield from remote.unlock(kb, token)
    except RemoteError:
        pass  # it expires by itself


def _unlock(remote, kb: bytes, token: bytes) -> None:
    run(_unlocking(remote, kb, token), remote)
