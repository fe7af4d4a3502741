"""Single-flight for ``get_or_compute``: at most one caller on the host computes a given key at a time.

The claim on a key is a Linux open-file-description lock (``F_OFD_SETLK``) on one byte of the segment's own file, at
an offset taken from the key's fingerprint. Why that mechanism:

- The kernel drops the lock when the claiming process dies (SIGKILL, OOM...), so a waiter takes over at once, with
  no lease to expire and no PID to check.
- The lock is held by an open file description, not by a process, so each claim opens its own: threads of one
  process exclude each other like processes do, and closing another descriptor of the file cannot drop it (the
  trap of classic POSIX record locks).
- One byte per key: claims on different keys never wait for each other (two keys share a byte only if their 62-bit
  fingerprint prefixes collide, which merely serialises them). Nothing is created on disk, so nothing is left
  behind, and the claim is never the cache lock, which stays free for every other call while a function runs.

A claim is released by closing its descriptor. Interrupts and fork (the two ways a descriptor outlives its claim):

- An exception may be raised at any bytecode (Ctrl-C, a signal handler's). The ``Claim`` object exists before
  anything is taken, so the caller's ``finally`` always finds what to release; its description is an
  ``io.FileIO``, which owns the descriptor from the open on, closes it at most once (never a number the application
  reused meanwhile), and closes it in C when dropped: a release cut short still ends the claim when the object goes.
  The record of the claims held (``_held``) holds them weakly, so a key is never left marked as held.
- A forked child gets copies of every descriptor, and an OFD lock lasts until the last copy of its description is
  closed. Every claim description of the process is in one registry (``_HELD``) that the child empties at once,
  closing its copies; so a child never holds its parent's claims. Fork takes the registry's lock first, so the
  registry never misses a descriptor opened by another thread at that moment.
- A waiter also looks at the cache itself every ``_RECHECK_S``: a value stored while it waited ends its wait, even if
  the claim is still held by some stray process.
"""

from __future__ import annotations

import contextvars
import io
import os
import threading
from collections.abc import Mapping
from types import MappingProxyType
import time
import weakref
from collections.abc import Callable

from . import ofd
from .errors import ComputeTimeout, ReentrantCallError

_POLL_FIRST_S = 0.0005  # a waiter polls its claim, doubling the pause up to _POLL_MAX_S
_POLL_MAX_S = 0.005
_RECHECK_S = 0.05  # ...and asks whether the value was stored meanwhile at this interval (a locked lookup)


# The claims held, sync and async, in one record: (segment inode, byte) -> weak reference to the Claim. A context
# variable, so that it is the thread's for a synchronous call and the task's for an asyncio one (the tasks of a loop
# share its thread, and must wait for each other, not be refused), and so that every nesting of calls on one thread
# sees it: a synchronous call made by a task's code runs in the task's context, a loop run inside a computation
# (asyncio.run) and a call sent to a worker (asyncio.to_thread) start from a copy of the caller's. Each change sets
# a new dict, never one changed in place, so a context copied meanwhile keeps what it was given. Weak, and checked
# with ``Claim.held``: an entry left by a release cut short, by a release made in another context (a coroutine
# closed by the garbage collector), or by a fork (the child closes its copies) refuses nothing.
_held: contextvars.ContextVar[Mapping] = contextvars.ContextVar("shmcache_claims", default=MappingProxyType({}))
_HELD: dict = {}  # id -> weak reference to the FileIO of every claim of this process (weak: a claim dropped
# without release closes its file as it goes; a plain dict of bare references costs a fraction of a WeakSet)
_REGISTRY = threading.RLock()  # guards _HELD against fork, held only for an open (reentrant: a signal handler may
# itself call get_or_compute)
# How long an open or a fork waits for the registry before it goes on without it. A registry is held for a few
# microseconds, unless an exception from a signal handler left it held: one can land between a lock's acquire
# and the block that releases it (CPython runs handlers as a call returns; on 3.14 also at a with block's start:
# memo.Tally says how), and then every other thread's claims and forks would wait for ever. Going on without it
# costs only the registry's guarantee, for that one fork: a child that forked meanwhile may keep a copy of the
# claim's description until it exits or execs.
# A registry not had within it is replaced by a new one, so that a registry left held costs one such wait, not one
# for every claim after it (each open is made under the cache lock: every process would wait on it meanwhile).
_REGISTRY_WAIT_S = 1.0
_FORKING: dict[int, threading.RLock | None] = {}  # thread id -> the registry its fork took (the hooks run there)


def _take_registry():
    """The registry, taken; None if it was not had within _REGISTRY_WAIT_S (then a new one replaces it: its holder
    releases the one it took, if it ever does)."""
    global _REGISTRY
    registry = _REGISTRY
    if registry.acquire(timeout=_REGISTRY_WAIT_S):
        return registry
    if _REGISTRY is registry:
        _REGISTRY = threading.RLock()
    return None


def _before_fork() -> None:
    _FORKING[threading.get_ident()] = _take_registry()


def _after_fork_in_parent() -> None:
    registry = _FORKING.pop(threading.get_ident(), None)
    if registry is not None:
        registry.release()


def _after_fork_in_child() -> None:
    """The only thread left: close the child's copies of every claim descriptor, so the parent's claims end with
    the parent's own release, and forget them (the claims' later release in this process closes nothing)."""
    global _REGISTRY
    for ref in list(_HELD.values()):
        file = ref()
        if file is not None:
            file.close()
    _HELD.clear()
    _FORKING.clear()
    _REGISTRY = threading.RLock()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def open_description(segment_fd: int) -> io.FileIO:
    """A description of its own of the segment open as ``segment_fd``, for one claim, registered for the fork hooks.
    Called under the handle's lock (``Guard.run``, which refuses a closed handle; close() closes the descriptor only
    after marking the handle closed under that lock), so ``segment_fd`` is still the handle's, never a number the
    application reused for a file of its own after another thread closed the handle.

    Why a FileIO: it owns its descriptor from the open on, closes it at most once (close is idempotent), and closes
    it in C if dropped, so neither a leak nor a double close can follow an exception anywhere; no signal needs to be
    held back (pthread_sigmask costs ~8 us a bracket here, more than the rest of a claim). Ordering: open and
    registry under the registry's lock, which fork takes first: a child never inherits a claim's description the
    registry misses."""
    registry = _take_registry()
    try:
        file = io.FileIO(f"/proc/self/fd/{segment_fd}", "r+")  # close-on-exec, as Python opens all
        _HELD[id(file)] = weakref.ref(file)
    finally:
        if registry is not None:
            registry.release()
    return file


class Wait:
    """The schedule of a wait for a claimed key, one for ``Claim.take`` and ``aio.take`` (which sleep between its
    polls, blocking or awaited): pauses doubling from _POLL_FIRST_S to _POLL_MAX_S, a look for the stored value
    every _RECHECK_S, and the timeout (None: none)."""

    def __init__(self, timeout: float | None) -> None:
        now = time.monotonic()
        self.timeout = timeout
        self.deadline = None if timeout is None else now + timeout
        self.recheck = now + _RECHECK_S
        self.pause = _POLL_FIRST_S

    def recheck_due(self) -> bool:
        """Whether it is time to look for the stored value again (the next look is then _RECHECK_S away)."""
        now = time.monotonic()
        if now < self.recheck:
            return False
        self.recheck = now + _RECHECK_S
        return True

    def next_pause(self) -> float:
        """The seconds to sleep before the next poll.

        :raises ComputeTimeout: once the timeout is up.
        """
        pause = self.pause
        self.pause = min(pause * 2, _POLL_MAX_S)
        if self.deadline is None:
            return pause
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ComputeTimeout(
                f"another caller has been computing this key for over {self.timeout:g} s", what="get_or_compute",
                hint="raise timeout=, or look at the process computing it (it is alive: a dead one frees the key at "
                     "once)")
        return min(pause, left)


class Claim:
    """A claim on one key's byte: made empty before anything is taken (``take``), so that a ``finally`` always has
    it to ``release``; ``release()`` (or the end of a ``with`` block) gives it up, and is idempotent."""

    # Class-level defaults, so that release (and __del__) work on an object whose __init__ was cut short.
    _file: io.FileIO | None = None  # the claim's own description, once opened
    _tag = None  # (segment inode, byte) of the key, once known
    _ref = None  # weak reference to self, as recorded in ``_held``, once the byte is locked

    @property
    def held(self) -> bool:
        """Whether this object holds the key's byte (locked through an open description)."""
        return self._ref is not None and self._file is not None and not self._file.closed

    def take(self, describe: Callable[[], io.FileIO], fp: int, timeout: float | None, stored=None) -> bool:
        """Claim the key of fingerprint ``fp`` on a segment, through a description of its file that ``describe()``
        opens (``open_description``, called where the handle cannot be closed meanwhile); returns whether another
        caller held it first (so this one waited). Waits without limit when ``timeout`` is None. Returns without
        the claim (``held`` False) when ``stored()``, asked every ``_RECHECK_S`` while waiting, says the value is
        there.

        :raises ComputeTimeout: if the key stays claimed for ``timeout`` seconds.
        :raises ReentrantCallError: (a RuntimeError) if this thread (or the task running it) already holds the
            claim (``fn`` asked for its own key, with either API).
        """
        # A description of our own for this claim (the segment's descriptor is shared with whatever else this
        # process does with it, and is inherited by forked children).
        if self._file is None:
            self._file = describe()  # Crash window: dropped before the store, the FileIO closes as it goes
        self.refuse_nested(fp)
        waited = False
        wait = Wait(timeout)
        while not self.lock_nowait(fp):
            waited = True
            if stored is not None and wait.recheck_due() and stored():
                return True
            time.sleep(wait.next_pause())
        return waited

    def try_take(self, describe: Callable[[], io.FileIO], fp: int) -> bool:
        """Claim the key of fingerprint ``fp`` without waiting (a refresh of a stale value: the caller that does not
        get the claim leaves the work to its holder); whether it is held now.

        :raises ReentrantCallError: as ``take``.
        """
        if self._file is None:
            self._file = describe()
        self.refuse_nested(fp)
        return self.lock_nowait(fp)

    # The asynchronous claim (aio.py take) is made of the same steps, its description opened off the loop and its
    # waits awaited.

    @property
    def opened(self) -> bool:
        return self._file is not None

    def adopt(self, file: io.FileIO) -> None:
        """Take ``file`` (``open_description``'s) as this claim's description."""
        self._file = file

    def refuse_nested(self, fp: int) -> None:
        """Raise ReentrantCallError if the caller (this thread, or the task running it) holds the claim on the key
        of fingerprint ``fp`` already: it would wait for itself. Whichever API took it and asks again."""
        assert self._file is not None
        # Our own descriptor: never one reused meanwhile. Bytes below ofd.LIVE_BYTE (2**62), which marks open handles.
        self._tag = tag = (os.fstat(self._file.fileno()).st_ino, fp >> 1)
        other = _held.get().get(tag)
        other = other and other()
        if other is not None and other.held:
            raise ReentrantCallError("get_or_compute was called for a key inside the computation of that same key",
                                     what="get_or_compute",
                                     hint="fn must not ask for its own key (with get_or_compute or aget_or_compute): "
                                          "it would wait for itself")

    def lock_nowait(self, fp: int) -> bool:
        """Lock the key's byte without waiting and record the claim as the caller's; whether it was locked."""
        # Crash window: cut short between the lock and the record, the lock is still dropped by release (closing the
        # description drops it, whatever is recorded).
        file = self._file
        assert file is not None  # (refuse_nested ran first)
        if not ofd.lock(file.fileno(), fp >> 1, ofd.WRITE, wait=False):
            return False
        self._ref = ref = weakref.ref(self)
        _held.set({**_held.get(), self._tag: ref})
        return True

    def _forget_key(self) -> None:
        ref, self._ref = self._ref, None
        record = _held.get()
        # Only in the record it was written to: a release run in another context (a coroutine closed by the garbage
        # collector) finds another record, and leaves it alone; the entry left behind refuses nothing (``held``).
        if ref is not None and record.get(self._tag) is ref:
            _held.set({tag: r for tag, r in record.items() if tag != self._tag})

    def release(self) -> None:
        file = self._file
        if file is not None:
            # Ordering: closed before it leaves the registry, so a fork between the two finds it (closing again is a
            # no-op), and the child never keeps a copy.
            file.close()  # closing the description releases its lock
            _HELD.pop(id(file), None)
        self._forget_key()

    def __del__(self) -> None:
        # The caller's finally was itself cut short: the garbage collector finishes the release (and if this is cut
        # short too, the FileIO closes its descriptor as it goes).
        if self._file is not None and not self._file.closed:
            self.release()

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
