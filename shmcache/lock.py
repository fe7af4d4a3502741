"""The cross-process cache lock: a futex word in the segment header that holds its holder's thread id, and no
state that any C library trusts.

One lock guards everything in the segment: the header counters, the index, the entry table with its LRU list, and the
arena. Only ``guard.Guard`` takes it, and the compiled section (``_core_lock.c``, the twin of this module);
``store``, ``table``, ``index``, ``lru``, ``arena``, ``stats``, ``verify`` and the ``*_locked`` functions assume it
is held. The order of this lock against every other lock of the package is in ``docs/design.md``.

The words (the first 8 bytes of the header's lock line; the rest of the line is never read):

- ``word`` (32 bits, the futex): 0 when free; else the holder's thread id (bits 0-29) and ``WAITERS`` (bit 31: a
  thread sleeps on the word, so the unlock wakes one). The encoding is the kernel's priority-inheritance futex ABI
  (futex(2), FUTEX_TRYLOCK_PI), because that is the one atomic compare-and-swap Python can reach without a compiled
  helper: the Python path takes the word through the kernel (``FUTEX_TRYLOCK_PI``: 0 -> its thread id), the compiled
  path with a compare-and-swap of its own; both give it back with an atomic store of 0 (``FUTEX_WAKE_OP``'s SET
  here, a compare-and-swap or an exchange in C). Nobody ever blocks inside the kernel's PI code, so no kernel state
  outlives a call.
- ``holder`` (32 bits): the holder's holder slot + 1 (0: none yet), stored right after the word is taken and
  cleared right before it is given back. Slot ``s`` is an exclusive OFD lock on byte ``HOLDER_BASE + s`` of the
  segment's file, claimed by every handle for its life (``HolderSlot``): the kernel drops it when the process dies,
  whatever its PID namespace, so a waiter that finds the slot unlocked knows the holder's process is gone.
- ``wakes`` (32 bits): what sleepers sleep on (``FUTEX_WAIT`` on the count they read before their last try), so that
  no sleeper is ever queued on the futex word itself, where the kernel's PI try would refuse to take a free word. An
  unlock that took ``WAITERS`` out of the word adds 1 to it and wakes one sleeper. Any value is valid.

Nothing in these words is ever followed as a pointer or handed to a C library; the kernel is only asked to compare
and swap, to sleep while the word holds a value, and to wake. A stray write into them can make two threads believe
they hold the lock, or make waiters wait for a holder that is not there; it cannot make anything write outside the
segment. What each case leads to is in docs/operations.md ("The lock's words").

Owner death. Waiters look at a holder when they first see it, then once a sleep slice (``_SLICE_S``), and judge
it (``holder_state``): a holder slot named and not locked by anyone is a dead process (the kernel released it at
exit); a slot that is locked is a live one (its thread too, unless this namespace sees no such thread); no slot
(the holder died between taking the word and naming its slot, or the slot word is damaged) is judged a slice later
by the thread id (``_maps_file``), where no handle of another PID namespace has the segment open, and is gone in
any case once the word has not changed for a lock timeout. A holder judged gone is taken over under ``flock`` on
the segment file, after the same judgement again there: the taker sets ``dirty`` first (so the next holder repairs
whatever the dead one left half-done) and stores its own id in the word (``take_over``). A thread that finds its
own id in the word but holds nothing (a stray write; thread ids of another namespace) judges it the same way.

Reentrancy. Whether this thread holds the lock is known privately (``holds``, a per-thread set of segment
identities, added to before the word is tried), never from the word: a call made from inside a call (a signal
handler, a ``__del__``) raises ``Reentered`` at once, and a word that names this thread while it holds nothing is
damage, not reentrancy.

Patience. A holder on a long walk (a repair or a verify of a large segment: seconds for a million entries) moves
the header's progress word as it goes; a waiter whose timeout passes while the word moved waits another timeout (up
to ``_PATIENCE`` of them), so a legitimate recovery fails no healthy waiter, while a live holder that stops moving
it (stuck, stopped) is waited for one timeout: ``LockTimeout``, which states the time waited.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import io
import os
import signal
import threading
import time
import weakref

from . import ofd
from .errors import LockTimeout, ReentrantCallError
from .layout.dtypes import H_LOCK_OFF, H_PROGRESS, MAX_COUNTER

_libc = ctypes.CDLL(None, use_errno=True)
_ASYNC_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM, signal.SIGUSR1,
                  signal.SIGUSR2}
_SPIN_TRIES = 20  # trylock + sched_yield rounds before a contended waiter sleeps on the word
_SLICE_S = 0.005  # a waiter sleeps at most this long before it looks at the holder again (and runs signal handlers)
_PATIENCE = 1000  # a waiter gives a holder whose long walk makes progress (a repair) at most this many more timeouts
PROGRESS_MASK = MAX_COUNTER - 1  # the progress word wraps below MAX_COUNTER (a power of two)
TICK_EVERY = 4095  # steps of a cheap walk under the lock between moves of the progress word, less one (a mask)
FUTEX_TID_MASK = 0x3FFFFFFF  # the word's holder thread id
FUTEX_WORD = H_LOCK_OFF // 8  # the lock page's 8-byte word holding the futex word (low 32 bits: the holder's tid)
FUTEX_WAITERS = 0x80000000  # the word's bit for "a thread sleeps on it": the unlock then wakes one
HOLDER_OFF = 4  # the holder-slot word, after the futex word
WAKES_OFF = 8  # the wake count: sleepers wait on it, an unlock that found WAITERS adds 1 and wakes one
# Holder slots: byte HOLDER_BASE + s of the segment file, exclusively locked by the handle that claimed slot s; above
# the reader slots (READER_BASE + r, r < 2**20) and below the PID-namespace bytes (ofd.NS_BASE = 2**62 + 2**41).
HOLDER_BASE = 2**62 + 2**40 + 2**21
HOLDER_SLOTS = 2**20
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine, 202)
# Whether a plain store of 0 gives the word back with release order: stores are seen in program order (x86-64's
# total store order), so none of the hold's is seen after it.
PLAIN_RELEASE = os.uname().machine in ("x86_64", "AMD64")
_FUTEX_WAIT, _FUTEX_WAKE, _FUTEX_WAKE_OP, _FUTEX_TRYLOCK_PI = 0, 1, 5, 8
# FUTEX_WAKE_OP's operation on the second word (here the same word): SET 0, and OR 1 << 31 (FUTEX_OP_OPARG_SHIFT).
_OP_SET_0 = 0
_OP_OR_WAITERS = ((2 | 8) << 28 | 31 << 12) - 2**32  # as the signed int the call takes
_OP_ADD_1 = 1 << 28 | 1 << 12
_INT_MAX = 2**31 - 1

_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                     ctypes.c_int]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]



def progressed(h) -> None:
    """Move the header's progress word (``h``: the header's words): a holder on a long walk under the lock tells
    its waiters it is getting somewhere, and they wait on (``Lock.acquire_slow``)."""
    h[H_PROGRESS] = (h[H_PROGRESS] + 1) & PROGRESS_MASK

def futex_trylock(address: int) -> int:
    """``FUTEX_TRYLOCK_PI``: the kernel stores this thread's id into the word at ``address`` if it holds no thread
    id; 0 when it did, else the errno (EAGAIN: held; EDEADLK: it names this thread; ESRCH: it names no thread of this
    namespace)."""
    if _syscall(_SYS_FUTEX, address, _FUTEX_TRYLOCK_PI, 0, None, None, 0) == 0:
        return 0
    return ctypes.get_errno()


def futex_clear(address: int) -> None:
    """Store 0 into the word at ``address`` with one atomic operation of the kernel's (``FUTEX_WAKE_OP``, waking
    nobody): ordered after every store before it, on any machine."""
    _syscall(_SYS_FUTEX, address, _FUTEX_WAKE_OP, 0, None, address, _OP_SET_0)


def futex_mark_waiting(address: int) -> None:
    """Set ``WAITERS`` in the word at ``address`` atomically (``FUTEX_WAKE_OP``, waking nobody): the holder's unlock
    then wakes a sleeper."""
    _syscall(_SYS_FUTEX, address, _FUTEX_WAKE_OP, 0, None, address, _OP_OR_WAITERS)


def futex_bump(address: int, wake: int) -> None:
    """Add 1 to the wake count at ``address`` atomically and wake ``wake`` of its sleepers (``FUTEX_WAKE_OP``)."""
    _syscall(_SYS_FUTEX, address, _FUTEX_WAKE_OP, wake, None, address, _OP_ADD_1)


def futex_wait(address: int, value: int, seconds: float) -> None:
    """Sleep while the word at ``address`` is ``value``, at most ``seconds`` (or until a wake)."""
    ts = _Timespec(int(seconds), int((seconds % 1) * 1e9))
    _syscall(_SYS_FUTEX, address, _FUTEX_WAIT, value - 2**32 if value >= 2**31 else value, ctypes.addressof(ts),
             None, 0)

class _Me(threading.local):
    """The calling thread's id (``tid``, read again in a forked child) and the identities of the segments whose lock
    it holds or is about to try (``holds``): the private record reentrancy is judged by."""

    def __init__(self) -> None:
        self.tid = threading.get_native_id()
        self.holds: set = set()


me = _Me()


def _forked() -> None:
    me.tid = threading.get_native_id()
    me.holds = set()  # Why: a fork is never made under the lock; what the parent thread was trying is its own
    for slot in list(_SLOTS):
        slot.after_fork_in_child()


_SLOTS: weakref.WeakSet = weakref.WeakSet()  # every HolderSlot of this process, for the fork hook
os.register_at_fork(after_in_child=_forked)


class HolderSlot:
    """A handle's holder slot: an exclusive OFD lock on byte ``HOLDER_BASE + number - 1`` of the segment file, taken
    through a description of its own and held for the handle's life (the description is an ``io.FileIO``: closed,
    and the lock dropped, when the handle goes, closed or collected). ``number`` is what a holder stores in the
    lock's holder word (0: no slot could be claimed; the thread id is judged instead). A forked child closes its
    copy of the parent's description (the parent's lock stays) and claims a slot of its own (the compiled section's
    holds in the child name none: ``_core_lock.c``)."""

    def __init__(self, seg_fd: int) -> None:
        self.seg_fd = seg_fd
        self.number = 0
        self.file: io.FileIO | None = None
        self._claim()
        _SLOTS.add(self)

    def _claim(self) -> None:
        try:
            fd = os.open(f"/proc/self/fd/{self.seg_fd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return
        f = io.FileIO(fd, "r+", closefd=True)
        start = os.getpid() % HOLDER_SLOTS  # spread: one try in the usual case
        for i in range(4096):
            s = (start + i) % HOLDER_SLOTS
            try:
                if ofd.lock(fd, HOLDER_BASE + s, ofd.WRITE, wait=False):
                    self.file, self.number = f, s + 1
                    return
            except OSError:
                break
        f.close()

    def after_fork_in_child(self) -> None:
        if self.file is not None:
            self.file.close()  # the child's copy only: the parent's lock stays with the parent's descriptor
            self.file, self.number = None, 0
            self._claim()

    def close(self) -> None:
        _SLOTS.discard(self)
        if self.file is not None:
            self.file.close()
        self.file, self.number = None, 0


def _thread_gone(tid: int) -> bool:
    """Whether no thread of this PID namespace has the id ``tid``."""
    try:
        os.kill(tid, 0)  # a thread id too, on Linux
    except ProcessLookupError:
        return True
    except OSError:
        pass
    return False


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


TAKEOVERS = [0]  # holders judged gone and taken over by this process (``SegmentLock.take_over``)
ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"  # what ``holder_state`` says of the holder a word names


class SegmentLock:
    """The lock's words at ``address`` (inside a mapping the caller keeps alive: the futex word, then the holder
    word), for the segment open as ``fd`` (``file``: its fstat). ``ident`` names the segment in this thread's
    private record of holds (``me.holds``). ``acquire_slow`` returns True when it took the lock over from a holder
    judged gone: the caller repairs (the dirty word is set)."""

    def __init__(self, address: int, timeout: float, fd: int, file: os.stat_result) -> None:
        self.address = address
        self.timeout = timeout
        self.fd = fd
        self.file = file  # a holder's process maps it, and could open it
        self.ident = (file.st_dev, file.st_ino)
        self.futex = ctypes.c_uint32.from_address(address)  # the futex word, read and written in place
        self.holder = ctypes.c_uint32.from_address(address + HOLDER_OFF)
        self.wakes_address = address + WAKES_OFF
        self.wakes = ctypes.c_uint32.from_address(self.wakes_address)
        self.slot = HolderSlot(fd)
        # futex_clear and futex_bump(.., 1) of these words as C callables: a call of one runs no bytecode (guard.py)
        self.clear_call = functools.partial(_syscall, _SYS_FUTEX, address, _FUTEX_WAKE_OP, 0, None, address,
                                            _OP_SET_0)
        self.bump_call = functools.partial(_syscall, _SYS_FUTEX, self.wakes_address, _FUTEX_WAKE_OP, 1, None,
                                           self.wakes_address, _OP_ADD_1)

    def word(self) -> int:
        """The futex word: the holder's thread id and the WAITERS bit; 0 when free."""
        return self.futex.value

    def holder_tid(self) -> int:
        """Thread id the word names (0: free); a holder's, unless the word is damaged."""
        return self.futex.value & FUTEX_TID_MASK

    def owned(self) -> bool:
        """Whether the word names the calling thread (which, if it is not inside a call, means a damaged word)."""
        return self.futex.value & FUTEX_TID_MASK == me.tid

    def holder_state(self, word: int, first: bool = False, waited_out: bool = False) -> str:
        """What the holder that ``word`` names is: ALIVE (or cannot be told apart from alive), GONE (its process
        died, or no handle could have written it), UNKNOWN (no slot named, and its thread id may be another PID
        namespace's). A GONE is said only if the word is still ``word`` after the look. ``first``: the holder is seen
        for the first time, when no slot named is a holder between taking the word and naming its slot (or between
        clearing it and the word): ALIVE then; it is judged a slice later. ``waited_out``: the word has not changed
        for a whole lock timeout, when no slot named is no holder's (every handle that has a slot names it
        microseconds after it takes the word): GONE, whatever thread the word names."""
        tid = word & FUTEX_TID_MASK
        if not tid:
            return ALIVE  # no holder: the next try takes it
        s = self.holder.value
        if s:
            if s <= HOLDER_SLOTS and ofd.held_elsewhere(self.fd, HOLDER_BASE + s - 1):
                # Its process lives; its thread too, unless this namespace sees it gone (a thread that ended holding
                # the lock while its process goes on).
                if ofd.other_pid_namespaces(self.fd) or not _thread_gone(tid):
                    return ALIVE
        elif first:
            return ALIVE
        elif waited_out:
            pass
        elif ofd.other_pid_namespaces(self.fd):
            return UNKNOWN
        elif _maps_file(tid, self.file) is not False:
            return ALIVE
        # Ordering: the slot (or the thread) was found gone after the word was read; a word unchanged since was
        # that holder's, and the holder word names a holder before the futex word changes hands.
        return GONE if self.futex.value == word else ALIVE

    def take_over(self, word: int, mark_dirty, waited_out: bool = False) -> bool:
        """Take the lock from the holder ``word`` names, judged gone (or a word naming this thread, which holds
        nothing): under ``flock`` on the segment file (every taker is serialised, and judges again there), the
        dirty word set first (``mark_dirty``: the next holder, this one, repairs), then this thread's id stored in
        the word and every sleeper woken to look again. False: the word changed meanwhile, or its holder is alive
        after all."""
        lfd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX)
            if self.futex.value != word:
                return False
            if word & FUTEX_TID_MASK != me.tid and self.holder_state(word, waited_out=waited_out) == ALIVE:
                return False
            # Ordering: dirty first, so that whoever holds the lock next repairs, even if this process dies here.
            mark_dirty()
            self.holder.value = 0
            self.futex.value = me.tid  # nobody else writes a word that names a holder: only takers, serialised here
            futex_bump(self.wakes_address, _INT_MAX)  # every sleeper looks again
            TAKEOVERS[0] += 1
            return True
        finally:
            os.close(lfd)  # releases the flock

    def acquire_slow(self, rc: int, progress=None, waited: float = 0.0, extended: int = 0, holder: int = 0,
                     mark_dirty=None) -> bool:
        """Wait for the lock after a failed try that returned ``rc`` (the caller has recorded the try in
        ``me.holds``). True: it was taken over from a holder judged gone (``mark_dirty`` was called). ``progress()``
        reads the header's progress word, which a holder on a long walk moves: while it moves, the wait is extended
        by another timeout (up to ``_PATIENCE``). ``waited``: the seconds the compiled section has already waited for
        this call (``extended`` timeouts added), so the wait is judged at once; ``holder``: the thread that wait was
        for (0: unknown): one that took the lock since is waited for afresh, once."""
        addr = self.address
        for _ in range(0 if waited else _SPIN_TRIES):
            if rc != errno.EAGAIN:
                break
            os.sched_yield()
            rc = futex_trylock(addr)
        now = time.monotonic()
        start = now - waited
        deadline = now + (0 if waited else self.timeout)
        extensions = extended
        seen = progress() if progress is not None else None
        waited_for, moved = holder or self.holder_tid(), False
        # Whose word this wait is, and since when: from the same instant as the deadline, so that a word unchanged
        # until the deadline has been seen for the whole timeout.
        last, since = self.futex.value, now - (self.timeout if waited else 0.0)
        judged, judged_at = -1, now
        slept = False
        while True:
            if rc == 0:
                if slept:  # the kernel's try takes WAITERS out of the word: put it back for the other sleepers
                    futex_mark_waiting(addr)
                return False
            now = time.monotonic()
            w = self.futex.value
            if w != last:
                last, since = w, now
            tid = w & FUTEX_TID_MASK
            if rc == errno.EDEADLK or (tid and tid == me.tid):
                # This thread holds nothing here (Guard.run looked at me.holds): a stray write named it, or a thread
                # of another PID namespace has its number.
                state = UNKNOWN if ofd.other_pid_namespaces(self.fd) else GONE
            elif w != judged or now - judged_at >= _SLICE_S:  # each holder at once, then once a slice
                first = w != judged
                judged, judged_at = w, now
                state = self.holder_state(w, first)
            else:
                state = ALIVE
            if (state == GONE or (state == UNKNOWN and now - since >= self.timeout)) and mark_dirty is not None:
                if self.take_over(w, mark_dirty, waited_out=now - since >= self.timeout):
                    return True
                rc = futex_trylock(addr)
                continue
            if now >= deadline:
                rc = futex_trylock(addr)
                if rc == 0:
                    continue
                tid = self.holder_tid()
                if tid != waited_for and not moved:
                    # The holder waited for left and another has it now: the wait starts again for that one, once.
                    moved, waited_for = True, tid
                    deadline = now + self.timeout
                elif progress is not None and extensions < _PATIENCE and progress() != seen:
                    extensions += 1
                    seen = progress()
                    deadline = now + self.timeout
                elif mark_dirty is not None and self.holder_state(w, waited_out=now - since >= self.timeout) == GONE \
                        and self.take_over(w, mark_dirty, waited_out=now - since >= self.timeout):
                    return True  # judged once more, in full, before the wait is given up
                else:
                    raise self._timeout(start, extensions)
            # Ordering: the wake count is read before WAITERS is set and the lock tried again, so an unlock after
            # that try changes it, and the sleep below returns at once.
            count = self.wakes.value
            if tid and not w & FUTEX_WAITERS:
                futex_mark_waiting(addr)
            rc = futex_trylock(addr)
            if rc:
                futex_wait(self.wakes_address, count, max(0.0, min(_SLICE_S, deadline - now)))
                slept = True
                rc = futex_trylock(addr)

    def _timeout(self, start: float, extensions: int) -> LockTimeout:
        waited = time.monotonic() - start
        return LockTimeout(
            f"could not lock the cache in {waited:.3g} s of waiting (lock_timeout={self.timeout:g} s, extended "
            f"{extensions} times while its holder's work made progress): thread {self.holder_tid()} holds it",
            what="lock",
            hint="its holder is alive but stuck or stopped; raise lock_timeout= or inspect that process",
        )

    def release(self) -> bool:
        """Give the lock back (the calling thread holds it): the holder word cleared, then the futex word, and one
        sleeper woken if the word said there were any. False, and nothing released, when the word does not name
        this thread: a stray write changed it during the hold (the caller has the segment repaired). (twin:
        _core_lock.c release)"""
        w = self.futex.value
        if w & FUTEX_TID_MASK != me.tid:
            return False
        self.holder.value = 0
        if PLAIN_RELEASE:
            self.futex.value = 0
        else:
            futex_clear(self.address)
        # A sleeper that set WAITERS after the read above sleeps one slice at most.
        if w & FUTEX_WAITERS:
            futex_bump(self.wakes_address, 1)
        return True

    def close(self) -> None:
        self.slot.close()


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
