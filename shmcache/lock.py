"""The cross-process cache lock: a robust, process-shared, error-checking pthread mutex living in the segment header.

One lock guards everything in the segment: the header counters, the index, the entry table with its LRU list, and
the arena. Only ``cache.SharedCache`` takes it (its private methods that need it end in ``_locked``); ``index``,
``lru``, ``arena``, ``stats`` and ``verify`` assume it is held. Segment creation is serialised separately, by
``flock`` on the segment's own file descriptor (see ``segment.py``).

Why a robust mutex (the mechanism LMDB relies on): when its holder dies -- SIGKILL, OOM killer, segfault, at any
instruction -- the kernel marks the mutex owner-dead as the process exits, and the next locker gets ``EOWNERDEAD`` at
once. No timeout, no PID check, so PID reuse cannot fool it. The new owner repairs the shared structures and then
calls ``pthread_mutex_consistent``; if it dies before that, the next locker is told again. Waiting blocks in a futex
(no spinning), in slices so that Python can deliver signals such as Ctrl-C to a waiter.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import signal
import time

from .errors import CorruptionError, LockTimeout

_libc = ctypes.CDLL(None, use_errno=True)
_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1
_PTHREAD_MUTEX_ERRORCHECK = 2
_CLOCK_MONOTONIC = 1
_SLICE_NS = 100_000_000  # wait at most this long per futex call, then let Python run signal handlers
_ASYNC_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM, signal.SIGUSR1,
                  signal.SIGUSR2}
_GLIBC_OWNER_OFF = 8  # offset of __owner (holder's TID) in glibc's pthread_mutex_t on x86_64 and aarch64


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _fn(name: str, *argtypes):
    f = getattr(_libc, name)
    f.argtypes = list(argtypes)
    f.restype = ctypes.c_int
    return f


_vp = ctypes.c_void_p
_mutexattr_init = _fn("pthread_mutexattr_init", _vp)
_mutexattr_setpshared = _fn("pthread_mutexattr_setpshared", _vp, ctypes.c_int)
_mutexattr_setrobust = _fn("pthread_mutexattr_setrobust", _vp, ctypes.c_int)
_mutexattr_settype = _fn("pthread_mutexattr_settype", _vp, ctypes.c_int)
_mutexattr_destroy = _fn("pthread_mutexattr_destroy", _vp)
_mutex_init = _fn("pthread_mutex_init", _vp, _vp)
_mutex_trylock = _fn("pthread_mutex_trylock", _vp)
_mutex_unlock = _fn("pthread_mutex_unlock", _vp)
_mutex_consistent = _fn("pthread_mutex_consistent", _vp)
_realtime_lock = _fn("pthread_mutex_timedlock", _vp, ctypes.POINTER(_Timespec))


def _realtime_timedlock(address: int, until_ns: int, ts: _Timespec) -> int:
    """Lock with a monotonic deadline through the wall-clock API, converted per slice so a clock step costs at most
    one slice (for C libraries older than glibc 2.30)."""
    ts.tv_sec, ts.tv_nsec = divmod(time.time_ns() + until_ns - time.monotonic_ns(), 1_000_000_000)
    return _realtime_lock(address, ts)


if hasattr(_libc, "pthread_mutex_clocklock"):  # glibc >= 2.30: deadlines on the monotonic clock itself
    _clocklock = _fn("pthread_mutex_clocklock", _vp, ctypes.c_int, ctypes.POINTER(_Timespec))

    def _timedlock(address: int, until_ns: int, ts: _Timespec) -> int:
        ts.tv_sec, ts.tv_nsec = divmod(until_ns, 1_000_000_000)
        return _clocklock(address, _CLOCK_MONOTONIC, ts)

else:
    _timedlock = _realtime_timedlock


def init_mutex(buf, offset: int) -> None:
    """Initialise a robust process-shared mutex at ``offset`` of the writable buffer ``buf`` (creation only)."""
    holder = (ctypes.c_char * 64).from_buffer(buf, offset)
    attr = ctypes.create_string_buffer(64)  # pthread_mutexattr_t is 4 bytes on glibc; 64 is ample
    try:
        for rc in (
            _mutexattr_init(attr),
            _mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED),
            _mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST),
            _mutexattr_settype(attr, _PTHREAD_MUTEX_ERRORCHECK),
            _mutex_init(ctypes.addressof(holder), attr),
        ):
            if rc:
                raise OSError(rc, f"initialising the cache mutex failed: {errno.errorcode.get(rc, rc)}")
    finally:
        _mutexattr_destroy(attr)
        del holder


class SegmentLock:
    """Handle on the mutex at ``offset`` of a mapped segment. ``acquire`` returns True when the previous holder died
    and the caller must repair the segment, then call ``mark_consistent`` before ``release``."""

    def __init__(self, buf, offset: int, timeout: float) -> None:
        self._holder = (ctypes.c_char * 64).from_buffer(buf, offset)
        self.address = ctypes.addressof(self._holder)
        self.timeout = timeout
        # Bound once: the hot path calls these with a plain int address and no attribute lookups.
        self.trylock = _mutex_trylock
        self.unlock = _mutex_unlock

    def acquire(self) -> bool:
        rc = _mutex_trylock(self.address)
        if rc == 0:
            return False
        return self.acquire_slow(rc)

    def acquire_slow(self, rc: int) -> bool:
        """Wait for the lock after a failed trylock that returned ``rc``."""
        deadline = time.monotonic_ns() + int(self.timeout * 1e9)
        ts = _Timespec()
        while True:
            if rc == 0:
                return False
            if rc == errno.EOWNERDEAD:
                return True
            if rc == errno.EDEADLK:
                raise RuntimeError(
                    "this thread already holds the cache lock: the cache was re-entered, e.g. from a signal handler "
                    "or a __del__ running inside a cache call; do not call the cache from there"
                )
            if rc == errno.ENOTRECOVERABLE:
                raise CorruptionError(
                    "the cache lock is unrecoverable: a process died while repairing the cache",
                    what="lock", hint="remove the cache with `shmcache rm NAME` (or SharedCache.unlink) and recreate it",
                )
            if rc not in (errno.EBUSY, errno.ETIMEDOUT):
                raise CorruptionError(
                    f"locking the cache failed with {errno.errorcode.get(rc, rc)}: the lock's bytes are damaged",
                    what="lock", hint="remove the cache with `shmcache rm NAME` (or SharedCache.unlink) and recreate it",
                )
            now = time.monotonic_ns()
            if now >= deadline:
                raise LockTimeout(
                    f"could not lock the cache within {self.timeout:g} s: process {self.holder_tid()} holds it",
                    what="lock",
                    hint="its holder is alive but stuck or stopped; raise lock_timeout= or inspect that process",
                )
            rc = _timedlock(self.address, min(deadline, now + _SLICE_NS), ts)

    def release(self) -> None:
        _mutex_unlock(self.address)

    def mark_consistent(self) -> None:
        """Tell the mutex that the state left by a dead holder has been repaired."""
        _mutex_consistent(self.address)

    def holder_tid(self) -> int:
        """Thread id recorded by glibc as the holder (0 when free); informational only."""
        return ctypes.c_int.from_address(self.address + _GLIBC_OWNER_OFF).value & 0x3FFFFFFF

    def close(self) -> None:
        """Drop the buffer export so the mapping can be closed."""
        self.address = 0
        self._holder = None


@contextlib.contextmanager
def signals_deferred():
    """Hold back asynchronous signals (Ctrl-C, SIGTERM...) for the duration of a repair that must not be cut short."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
