"""The cross-process cache lock: a robust, process-shared, error-checking pthread mutex living in the segment header.

One lock guards everything in the segment: the header counters, the index, the entry table with its LRU list, and the
arena. Only ``guard.Guard`` takes it, and the compiled section (``_core_lock.c``); ``store``, ``table``,
``index``, ``lru``, ``arena``, ``stats``, ``verify`` and the ``*_locked`` functions assume it is held. Segment creation,
and the re-initialisation of a broken mutex (below), are serialised separately, by ``flock`` on the segment's file (see
``segment.py``). The order of this lock against every other lock of the package is in ``docs/design.md``.

Why a robust mutex (the mechanism LMDB relies on): when its holder dies -- SIGKILL, OOM killer, segfault, at any
instruction -- the kernel marks the mutex owner-dead as the process exits, and the next locker gets ``EOWNERDEAD`` at
once. No timeout, no PID check, so PID reuse cannot fool it. The new owner calls ``pthread_mutex_consistent`` at
once (``guard.Guard.wait``), then, before reading anything, repairs what the dead holder left half-done, which
the segment's ``dirty`` word records (``Guard.admit`` -> ``Guard.repair``). If it dies before marking the mutex
consistent, the next locker is told again; if it dies during the repair, ``dirty`` is still set for the next locker;
if it unlocks without marking it, the mutex is unrecoverable and is re-initialised under ``flock``
(``reinit_unrecoverable``). A waiter first retries a bounded number of times, yielding the CPU (``_SPIN_TRIES``),
then blocks in a futex, in slices so that Python can deliver signals such as Ctrl-C to a waiter.

Damaged bytes. The mutex's bytes are shared memory like any other, so garbage there must neither abort the process
(glibc asserts in its priority-inheritance code when the kind word has PTHREAD_MUTEX_PRIO_INHERIT set and the owner
is gone) nor block every call forever (an owner thread id that no thread has: the kernel's robust list releases only
the locks of threads that die holding them). The waiting path -- never the fast path, where a successful trylock
costs nothing more -- checks the mutex before every blocking call (``damage``): a kind word other than what
``init_mutex`` writes is damage at once, and an owner that provably does not hold it is damage once the lock timeout
has passed. The thread id in the futex word is "provably not a holder" only when no thread has it (``kill(tid, 0)``
says ESRCH), when its process does not map the segment at all (its ``/proc/<tid>/maps``), or, where that file is not
ours to read (another user's process), when the process's user and group ids (``/proc/<tid>/status``, which anyone
may read and no process can fake) could never have opened the segment: not its owner's, not root's, and no group or
other bit of its mode lets them in; and only when no handle of another PID namespace has the segment open
(``ofd.other_pid_namespaces``), since a thread id is only meaningful in its own namespace. A damaged mutex is
re-initialised under ``flock`` on the segment, after the damage is seen again under it, and the segment is marked
dirty so the next holder verifies and repairs it (``cache.py``).

Patience. A holder on a long walk (a repair or a verify of a large segment: seconds for a million entries) moves
the header's progress word as it goes; a waiter whose timeout passes while the word moved waits another timeout (up
to ``_PATIENCE`` of them), so a legitimate recovery fails no healthy waiter, while a holder that stops moving it
(stuck, stopped, or a stray dirty word) is waited for one timeout. Every ``LockTimeout`` states the time waited.

Limits. A garbage thread id naming a live thread that maps the segment (a live process of the cache, after thread-id
reuse), or a live thread of a process that could have opened it (root's, or a user's the mode lets in), cannot be
told from a stuck holder: every call then fails with ``LockTimeout`` until that thread exits. Where /proc is missing
or hides the owner's process, no owner is judged gone. A process that opened the segment and then dropped every id
that could open it (a root process turned ``nobody``) would be judged gone while holding the lock. A kind word
damaged while a live thread holds the mutex through it cannot be undone safely in general (glibc's unlock writes
through the mutex's list pointers); a re-initialisation after a kind damage waits up to the lock timeout for the
futex word to clear (unless it names an owner provably gone), and a thread that took the damaged lock by trylock in
the instant before the re-initialisation shares the critical section with the next locker once -- the dirty word
and the values' checksums make that a repair, never a wrong value read.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import threading
import time

from . import ofd
from .errors import CorruptionError, LockTimeout, ReentrantCallError

_libc = ctypes.CDLL(None, use_errno=True)
_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1
_PTHREAD_MUTEX_ERRORCHECK = 2
_CLOCK_MONOTONIC = 1
_SLICE_NS = 100_000_000  # wait at most this long per futex call, then let Python run signal handlers
_ASYNC_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM, signal.SIGUSR1,
                  signal.SIGUSR2}
_SPIN_TRIES = 50  # trylock + sched_yield rounds before a contended waiter blocks in the kernel (~25-50 us)
_PATIENCE = 1000  # a waiter gives a holder whose long walk makes progress (a repair) at most this many more timeouts
FUTEX_TID_MASK = 0x3FFFFFFF  # the futex word of a robust mutex: holder's thread id, plus the WAITERS/OWNER_DIED bits
FUTEX_OWNER_DIED = 0x40000000  # set by the kernel when the holder died with the mutex on its robust list
# glibc's struct __pthread_mutex_s (x86_64 and aarch64): __lock (the futex word) at 0, __count 4, __owner 8,
# __nusers 12, __kind 16, spins/elision 20, the robust list pointers 24..40. Only __lock and __kind are trusted by
# glibc before it takes the mutex; __count, __owner and __nusers are rewritten by every lock.
_KIND_OFF = 16
_DAMAGE_POLL_S = 0.001  # how often a waiter on a mutex of a damaged kind looks whether its futex word has cleared


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

# The hot path's pair, from a CDLL instance of their own so that no argtypes are set: ctypes then converts nothing,
# and the address goes in as a prebuilt c_void_p (a ``SegmentLock.handle``). Measured about 0.1 us cheaper per
# lock + unlock pair than the same calls with argtypes and an int address. Neither call ever blocks.
_hot = ctypes.CDLL(None)
hot_trylock = _hot.pthread_mutex_trylock
hot_unlock = _hot.pthread_mutex_unlock
hot_unlock.restype = None  # the hot path ignores unlock's result (EPERM for a private handle is the point)


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


def init_mutex(address: int) -> None:
    """Initialise a robust, process-shared, error-checking mutex at ``address`` (creation, or re-initialisation of
    an unrecoverable one under ``flock``)."""
    attr = ctypes.create_string_buffer(64)  # pthread_mutexattr_t is 4 bytes on glibc; 64 is ample
    try:
        for rc in (
            _mutexattr_init(attr),
            _mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED),
            _mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST),
            _mutexattr_settype(attr, _PTHREAD_MUTEX_ERRORCHECK),
            _mutex_init(address, attr),
        ):
            if rc:
                raise OSError(rc, f"initialising the cache mutex failed: {errno.errorcode.get(rc, rc)}")
    finally:
        _mutexattr_destroy(attr)


def _mutex_kind() -> int:
    """The kind word ``init_mutex`` writes (read back from a private mutex: glibc's flag values are not an ABI)."""
    buf = ctypes.create_string_buffer(64)
    init_mutex(ctypes.addressof(buf))
    return ctypes.c_int.from_buffer(buf, _KIND_OFF).value


MUTEX_KIND = _mutex_kind()
KIND_OFF = _KIND_OFF  # byte offset of the kind word in the mutex; 8-aligned, so a 64-bit word starts there


def _mutex_kind_word() -> int:
    """The 64-bit word at ``KIND_OFF`` of a mutex ``init_mutex`` made (the kind, and the spin and elision counts that
    an error-checking mutex never changes): what the hot path compares before every trylock."""
    buf = ctypes.create_string_buffer(64)
    init_mutex(ctypes.addressof(buf))
    return ctypes.c_int64.from_buffer(buf, _KIND_OFF).value


MUTEX_KIND_WORD = _mutex_kind_word()

# ------------------------------------------------------------------------ holds taken through a foreign kind's path
# glibc reads the kind word again after the check of it, and takes the path of whatever kind it finds: a word damaged
# in between sends the call down another kind's path (docs/operations.md, "a kind word damaged between the lock's
# check and glibc's own read of it"). Only a robust kind's path queues the mutex on the holder's robust list, at its
# head (the kernel's struct robust_list_head, which glibc registers for every thread): that tells a right hold from
# a foreign one, where the futex word cannot (the priority-inheritance path writes the holder's id too). A foreign
# hold is given back by hand at once; an unlock checks that the word names its holder, and that glibc took the mutex
# off the list. (twin: _core_lock.c, the part of the same name)
_SYSCALLS = {"x86_64": (274, 202), "aarch64": (100, 98)}.get(os.uname().machine)  # get_robust_list, futex
_FUTEX_WAKE = 1
_INT_MAX = 2**31 - 1
FUTEX_WAITERS = 0x80000000  # the futex word's bit for "a thread sleeps on it": an unlock then wakes one
ENTRY_MASK = ~1  # a robust-list entry's bit 0 marks a priority-inheritance mutex
_OWNER_OFF = 8  # __owner, which every kind's lock path writes (the holder's thread id) and every unlock clears
# glibc's list is doubly linked on 64-bit targets: each __prev word 8 bytes before its entry
_PREV_OFF = -8 if ctypes.sizeof(ctypes.c_void_p) == 8 else 0
MENDS = [0, 0]  # in this process's Python path: foreign holds given back, unlocks taken off the list by hand


def _robust_head() -> int:
    """The calling thread's robust-list head, asked of the kernel (0: it will not say, or an unknown machine)."""
    if _SYSCALLS is None:
        return 0
    head, size = ctypes.c_void_p(), ctypes.c_size_t()
    if _libc.syscall(ctypes.c_long(_SYSCALLS[0]), ctypes.c_long(0), ctypes.byref(head), ctypes.byref(size)) \
            or size.value != 3 * ctypes.sizeof(ctypes.c_void_p):
        return 0
    return head.value or 0


class _Me:
    """The calling thread's robust-list head (``head``, 0 where there is none to look at), its first entry as a word
    to read and write (``first``, a one-item memoryview; None then), and the thread's id (``tid``, read again in a
    forked child, whose head is at the same address: glibc registers the same struct pthread's head again). Plain
    slots behind one thread-local lookup: the Python path reads them on every lock and unlock."""

    __slots__ = ("head", "first", "tid")

    def __init__(self) -> None:
        self.head = _robust_head()
        self.first = memoryview((ctypes.c_uint64 * 1).from_address(self.head)).cast("B").cast("Q") \
            if self.head else None
        self.tid = threading.get_native_id()


class _Robust(threading.local):
    """``robust.me``: the calling thread's ``_Me``, made on its first use in each thread."""

    def __init__(self) -> None:
        self.me = _Me()


robust = _Robust()
# The head's futex_offset: from an entry to its mutex's futex word (a constant of glibc's, the same in every thread).
FUTEX_OFFSET = ctypes.c_long.from_address(robust.me.head + ctypes.sizeof(ctypes.c_void_p)).value \
    if robust.me.head else 0


def _forked() -> None:
    robust.me.tid = threading.get_native_id()


os.register_at_fork(after_in_child=_forked)


def _maps_file(tid: int, file: os.stat_result) -> bool | None:
    """Whether thread ``tid`` exists and its process maps the segment ``file`` (its fstat) from /dev/shm; None:
    cannot tell (/proc missing, or the process hidden). A process whose maps this one may not read (another
    user's) is judged by its credentials instead (``_could_open``)."""
    if tid <= 0:
        return False  # Why: kill(0) or kill(-n) would name process groups, not a thread
    try:
        os.kill(tid, 0)  # a thread id too, on Linux; unaffected by /proc's hidepid
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{tid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return _could_open(tid, file)
    needle = b" %d " % file.st_ino
    return any(needle in line and b" /dev/shm/" in line for line in maps.splitlines())


def _could_open(tid: int, file: os.stat_result) -> bool | None:
    """Whether thread ``tid``'s process could ever have opened ``file``, by facts it cannot fake: its user and group
    ids (``/proc/<tid>/status``, readable for every process) against the file's owner, group and mode. A process of
    no uid that is the owner's or root's, with no group or other bit that lets it in, cannot have mapped the
    segment, so cannot hold its lock: its thread id in the futex word is damage. None: cannot tell."""
    try:
        with open(f"/proc/{tid}/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        uids = {int(x) for x in fields[b"Uid"].split()}  # real, effective, saved, file system
        gids = {int(x) for x in fields[b"Gid"].split()} | {int(x) for x in fields.get(b"Groups", b"").split()}
    except (OSError, KeyError, ValueError):
        return None
    if 0 in uids or file.st_uid in uids or file.st_mode & 0o006:
        return True
    return bool(file.st_mode & 0o060) and file.st_gid in gids


class Reentered(ReentrantCallError):
    """This thread already holds the lock: a cache call was made from inside another (a signal handler, a __del__
    run by the garbage collector in the middle of a call)."""

    def __init__(self) -> None:
        super().__init__("this thread already holds the cache lock: the cache was called from inside a cache call "
                         "(a signal handler or a __del__)", what="lock",
                         hint="do not call the cache from a signal handler or a __del__; set a flag there and act "
                              "on it after the call returns")


class Unrecoverable(Exception):
    """The mutex is unrecoverable: a holder was interrupted between taking it from a dead owner and marking it
    consistent. ``SegmentLock.reinit_unrecoverable`` makes it usable again."""


class Damaged(Exception):
    """The mutex's bytes are provably damaged (``SegmentLock.damage``). ``SegmentLock.reinit_damaged`` makes it usable
    again; ``fallback`` is the error to raise if, looked at again under ``flock``, there is nothing to repair and the
    futex word is still ``word`` (an owner that could not be judged after all: another PID namespace)."""

    def __init__(self, reason: str, fallback: Exception | None = None, word: int = 0) -> None:
        super().__init__(reason)
        self.fallback = fallback
        self.word = word  # the futex word judged


class SegmentLock:
    """Handle on the mutex at ``address`` (inside a mapping the caller keeps alive). ``acquire_slow`` returns True
    when the previous holder died; the caller marks the mutex consistent at once, then repairs what the holder left
    half-done (the ``dirty`` word says whether there is anything)."""

    def __init__(self, address: int, timeout: float, file: os.stat_result) -> None:
        self.address = address
        self.timeout = timeout
        self.file = file  # the segment file's fstat: a holder's process maps it, and could open it
        # A private mutex that no thread ever holds: a call that must not release the real lock (it did not take
        # it) releases this one instead, which the error-checking mutex refuses (EPERM) without effect.
        self._private = ctypes.create_string_buffer(64)
        init_mutex(ctypes.addressof(self._private))
        # The handles the callers pass to ``hot_trylock``/``hot_unlock`` (and compare by identity): one for the
        # lock, one for the private mutex.
        self.handle = ctypes.c_void_p(address)
        self.private_handle = ctypes.c_void_p(ctypes.addressof(self._private))
        self.futex = ctypes.c_uint.from_address(address)  # the futex word, read and written in place
        self.owner = ctypes.c_int.from_address(address + _OWNER_OFF)
        self.entry = address - FUTEX_OFFSET  # the robust-list entry of this mutex, as glibc queues it

    def listed(self) -> bool:
        """Whether this mutex heads the calling thread's robust list: glibc's robust path took it for this thread.
        Where there is no list to look at, whether the futex word names this thread."""
        first = robust.me.first
        return self.owned() if first is None else first[0] & ENTRY_MASK == self.entry

    def checked(self, rc: int) -> int:
        """A lock call's result, checked: 0 only for a hold that glibc queued; a foreign one is given back, and
        the caller waits on (EBUSY) as for a busy lock, meeting the damaged kind, if it is still there, next."""
        first = robust.me.first
        if rc or first is None or first[0] & ENTRY_MASK == self.entry:
            return rc
        return self.give_back_foreign()

    def give_back_foreign(self) -> int:
        """Give back a hold that glibc took through a foreign kind's path: nobody else is inside (every kind's path
        takes the word from 0 with a compare-and-swap or an exchange), and nothing was written under it. The owner
        field is cleared as an unlock clears it, the word set to 0, and every sleeper woken: one that read a plain
        kind sleeps on 2, one that read the robust kind on the word with FUTEX_WAITERS. Returns EBUSY."""
        MENDS[0] += 1
        self.owner.value = 0
        self.futex.value = 0
        if _SYSCALLS is not None:
            _libc.syscall(ctypes.c_long(_SYSCALLS[1]), ctypes.c_void_p(self.address), ctypes.c_long(_FUTEX_WAKE),
                          ctypes.c_long(_INT_MAX), None, None, ctypes.c_long(0))
        return errno.EBUSY

    def foreign_hold(self) -> bool:
        """Whether the calling thread holds the mutex through a foreign kind's path (not listed): the word names
        it (the priority-inheritance path), or is a plain lock's 1 or 2 with the owner field naming it. For an
        interrupt that came between a lock call's return and ``checked``."""
        me = robust.me
        if me.first is None or self.listed():
            return False
        tid = self.futex.value & FUTEX_TID_MASK
        return tid == me.tid or (tid in (1, 2) and self.owner.value == me.tid)

    def settle_release(self, prev: int) -> None:
        """After an unlock that left this mutex at the head of the calling thread's robust list: glibc refused it
        (EPERM: a waiter that read a plain kind wrote 2 over the word again, so the holder's id goes back; EINVAL:
        glibc read the kind word a second time and found a kind it has no case for) and the unlock is tried again,
        or glibc read a foreign kind and released without taking the mutex off the list: the list is put
        back as it was before the lock (``prev``), since an entry left there points into the segment and the next
        robust lock of this thread writes through it, after an unmap too. (twin: _core_lock.c release)"""
        me = robust.me
        for _ in range(1000):
            if me.first is None or me.first[0] & ENTRY_MASK != self.entry:
                return
            if self.owner.value == me.tid:  # still held (every unlock clears the owner field): refused
                self.futex.value = me.tid | FUTEX_WAITERS
                _mutex_unlock(self.address)
                continue
            if _PREV_OFF:  # released, still listed
                MENDS[1] += 1
                me.first[0] = prev
                ctypes.c_void_p.from_address((prev & ENTRY_MASK) + _PREV_OFF).value = me.head
            return

    def acquire_slow(self, rc: int, progress=None, waited: float = 0.0, extended: int = 0, holder: int = 0) -> bool:
        """Wait for the lock after a failed trylock that returned ``rc``. ``progress()`` reads the header's progress
        word, which a holder on a long walk (a repair, a verify: time in proportion to the segment's size) moves as
        it goes: while it moves, the wait is extended by another timeout (up to ``_PATIENCE``), rather than failing
        every waiter during a legitimate recovery; a holder that stops moving it (stuck, stopped, or a stray word)
        is waited for one timeout, as any other. ``waited``: the seconds the compiled section has already waited for
        this call (with the same patience: ``extended`` timeouts added), so the wait is judged at once (the holder
        dead or moved) instead of starting again; the timeout's message counts them. ``holder``: the thread that
        wait was for (0: unknown): one that took the lock since is waited for afresh, once."""
        # Why: the lock is held for a few microseconds, and putting a waiter to sleep in the kernel (and waking it)
        # costs tens of microseconds on a VM. Retry briefly first, yielding the CPU so that a holder preempted on
        # this core can finish; only then block. The spin is bounded, so a waiter never burns a core.
        for _ in range(0 if waited else _SPIN_TRIES):
            if rc != errno.EBUSY:
                break
            os.sched_yield()
            rc = self.try_checked()
        start = time.monotonic_ns() - int(waited * 1e9)
        deadline = time.monotonic_ns() + (0 if waited else int(self.timeout * 1e9))
        extensions = extended
        seen = progress() if progress is not None else None
        waited_for, moved = holder or self.word() & FUTEX_TID_MASK, False  # the holder this wait is for
        judged, may_hold = None, True  # with a damaged kind: the futex word judged, whether it may name a holder
        ts = _Timespec()
        while True:
            if rc == 0:
                return False
            if rc == errno.EOWNERDEAD:
                return True
            if rc == errno.EDEADLK:
                raise Reentered()
            if rc == errno.ENOTRECOVERABLE:
                raise Unrecoverable()
            now = time.monotonic_ns()
            # Invariant: glibc never blocks on a mutex of another kind than init_mutex's (it may assert in there).
            if self.kind_damaged():
                word = self.word()
                if word != judged:  # judged once per futex word: no reading of /proc at every poll
                    judged, may_hold = word, not self.owner_gone()
                if word and may_hold and now < deadline:  # a holder may be inside through the damaged kind: wait
                    time.sleep(_DAMAGE_POLL_S)
                    rc = self.try_checked()
                    continue
                raise Damaged("kind")
            if rc not in (errno.EBUSY, errno.ETIMEDOUT):
                raise CorruptionError(
                    f"locking the cache failed with {errno.errorcode.get(rc, rc)}: the lock's bytes are damaged",
                    what="lock",
                    hint="remove the cache with `shmcache rm NAME` (or SharedCache.unlink) and recreate it",
                )
            if now >= deadline:
                # Why one more try: a re-initialisation by another waiter wakes no one sleeping on the old word.
                rc = self.try_checked()
                if rc != errno.EBUSY:
                    continue
                word = self.word()
                if self.owner_gone():
                    raise Damaged("owner", self._timeout(start, extensions), word)
                holder = self.word() & FUTEX_TID_MASK  # Why again: another waiter may have just re-initialised it
                if holder != waited_for and not moved:
                    # The holder waited for is gone (released or repaired away) and another has it now: the wait
                    # starts again for that one, once, so that a waiter is not failed by a damage repaired meanwhile.
                    moved, waited_for = True, holder
                    deadline = now + int(self.timeout * 1e9)
                elif progress is not None and extensions < _PATIENCE and progress() != seen:
                    extensions += 1
                    seen = progress()
                    deadline = now + int(self.timeout * 1e9)
                else:
                    raise self._timeout(start, extensions)
            rc = self.checked(_timedlock(self.address, min(deadline, now + _SLICE_NS), ts))

    def _timeout(self, start_ns: int, extensions: int) -> LockTimeout:
        waited = (time.monotonic_ns() - start_ns) / 1e9
        return LockTimeout(
            f"could not lock the cache in {waited:.3g} s of waiting (lock_timeout={self.timeout:g} s, extended "
            f"{extensions} times while its holder's work made progress): thread {self.holder_tid()} holds it",
            what="lock",
            hint="its holder is alive but stuck or stopped; raise lock_timeout= or inspect that process",
        )

    def reinit_unrecoverable(self, fd: int) -> None:
        """Re-initialise the mutex if it is still unrecoverable, excluding every other process that tries the same
        through ``flock`` on the segment (``fd``), reopened so that a forked parent and child do not share the lock."""
        lfd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX)
            rc = self.try_checked()
            if rc == errno.ENOTRECOVERABLE:
                init_mutex(self.address)
            elif rc == errno.EOWNERDEAD:
                _mutex_consistent(self.address)
                _mutex_unlock(self.address)
            elif rc == 0:
                _mutex_unlock(self.address)
        finally:
            os.close(lfd)  # releases the flock

    def reinit_damaged(self, fd: int, mark_dirty) -> bool:
        """Re-initialise the mutex if, under ``flock`` on the segment (``fd``), it is still provably damaged
        (``damage``), calling ``mark_dirty()`` first so that the next holder repairs what the damage may have let
        through. False: nothing to repair (another process did it, or the owner turned out to be alive)."""
        lfd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX)
            if self.damage(fd) is None:
                return False
            # Ordering: dirty first, so a locker of the fresh mutex repairs even if this process dies right here.
            mark_dirty()
            init_mutex(self.address)
            return True
        finally:
            os.close(lfd)  # releases the flock

    def damage(self, fd: int) -> str | None:
        """What provably damages the mutex now: ``"kind"`` (not the kind word init_mutex writes), ``"owner"`` (the
        futex word names no thread that could hold it: see the module docstring), or None. A wrong kind with a holder
        inside is damage too: the caller has waited the lock timeout for it to leave."""
        if self.kind_damaged():
            return "kind"
        if self.owner_gone() and not ofd.other_pid_namespaces(fd):
            return "owner"
        return None

    def kind_damaged(self) -> bool:
        return ctypes.c_int.from_address(self.address + _KIND_OFF).value != MUTEX_KIND

    def try_checked(self) -> int:
        """``pthread_mutex_trylock``, unless the kind word is not ``init_mutex``'s: then EBUSY, and the waiting path
        judges the damage. Why: glibc asserts inside trylock itself on some kinds (a priority-inheritance kind
        without the robust flag, with the owner-died bit set, aborts the process)."""
        return errno.EBUSY if self.kind_damaged() else self.checked(_mutex_trylock(self.address))

    def word(self) -> int:
        """The futex word: holder's thread id and the WAITERS / OWNER_DIED bits; 0 when free."""
        return ctypes.c_uint.from_address(self.address).value

    def owner_gone(self) -> bool:
        """Whether the futex word says the mutex is held by a thread that provably cannot be holding it (no such
        thread, or its process does not map this segment); the robust list's OWNER_DIED is not this case."""
        word = self.word()
        if not word or word & FUTEX_OWNER_DIED:
            return False
        tid = word & FUTEX_TID_MASK
        owner = self.owner.value
        if tid in (1, 2) and owner > 0:
            # A plain lock's values (a hold through a foreign kind's path, its holder killed before it could give
            # it back: not on any robust list, so the kernel never releases it). Every kind's lock writes its
            # holder's id into the owner field: that thread is the one to judge, whatever thread 1 or 2 is (a PID
            # namespace's init holding the lock through the robust path has both words the same).
            tid = owner
        if tid and _maps_file(tid, self.file) is not False:
            return False
        # Ordering: the kernel sets OWNER_DIED on a dying holder's mutexes before its thread id is freed, so a word
        # unchanged after its thread was found gone was never a live holder's.
        return self.word() == word and self.owner.value == owner

    def mark_consistent(self) -> None:
        """Tell the mutex that the state left by a dead holder has been repaired."""
        _mutex_consistent(self.address)

    def holder_tid(self) -> int:
        """Thread id of the holder, 0 when free. The robust-futex ABI keeps it in the mutex's first word."""
        return ctypes.c_int.from_address(self.address).value & FUTEX_TID_MASK if self.address else 0

    def owned(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self.holder_tid() == threading.get_native_id()



@contextlib.contextmanager
def signals_deferred():
    """Hold back asynchronous signals (Ctrl-C, SIGTERM...) while a repair runs. A signal whose Python handler is
    already pending may still be raised inside; the ``dirty`` word covers that case (see cache.py)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
