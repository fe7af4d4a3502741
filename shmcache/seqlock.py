"""The write side of the seqlocks that gets and views without the lock validate what they read against (the
compiled section's seq_open, stripe_open and seq_close in _core_lock.c are its twins; docs/design.md, "Reads without
the lock").

Each stripe of the index (a run of its slots, ``stripe_of``) has a sequence word, odd from the first write of a hold
to a slot of the run or to an entry one of them points at (or a pin query of such an entry) until the hold ends with
nothing half-done (``dirty`` 0); header word ``seq`` is odd likewise around what writes across the stripes (a
resize, a clear, a repair, an expiry sweep). A reader reads ``seq`` and the words of the stripes its probe crosses,
then what it needs, then the words again: any change, or an odd word, voids what it read. Before layout version 11
there are no stripes: every write opens ``seq``. Under lru nobody reads without the lock and the words stay 0:
callers skip these under it (``seqlocked``).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import threading

from .layout.dtypes import H_DIRTY, H_SEQ, S_OPEN, STRIPE_BITS, STRIPE_MIN_SHIFT, STRIPE_WORDS

_INT64_MAX = 2**63 - 1
_WORD_BITS = 2**64 - 1  # a signed word's bits as an unsigned number (the open mask's bit 63 is its sign)
# Whether stores are seen by other processors in program order (a total store order): x86-64's, where a store then
# a later store need no fence between them, and the fence before a load is the locked instruction of a lock's
# compare-and-swap. Elsewhere (aarch64) both take a full barrier of the kernel's (below).
TSO = platform.machine() in ("x86_64", "AMD64", "i686", "i386")
# The lock-free reads (_core_unlocked.c UNLOCKED_READS) are built where this module can order its writers' stores:
# x86-64 (its store order) and aarch64 (membarrier, whose syscall number is known here).
_NR_MEMBARRIER = {"x86_64": 324, "aarch64": 283}.get(platform.machine())
_MEMBARRIER_CMD_GLOBAL = 1
_MEMBARRIER_CMD_PRIVATE_EXPEDITED = 8
_MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED = 16
_libc = ctypes.CDLL(None, use_errno=True)
# A full barrier from Python on x86-64: the compare-and-swap of a lock's acquire is a locked instruction (mfence's
# effect), taken or not.
_BARRIER = threading.Lock()


def _lock_fence() -> None:
    if _BARRIER.acquire(False):
        _BARRIER.release()


def membarrier_fence() -> bool:
    """A full memory barrier of the calling thread, from Python: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which
    the kernel brackets with a full barrier on entry and on exit (and sends to this process's other threads that are
    running, a few microseconds). Registered on first use in each process (a fork's child registers again). False
    where the system has no membarrier (a kernel before 4.14, another machine)."""
    if _NR_MEMBARRIER is None:
        return False
    if _libc.syscall(_NR_MEMBARRIER, _MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0:
        return True
    if ctypes.get_errno() != errno.EPERM:  # EPERM: not registered yet
        return False
    _libc.syscall(_NR_MEMBARRIER, _MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0)
    return _libc.syscall(_NR_MEMBARRIER, _MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0


def barrier_everywhere() -> bool:
    """membarrier(MEMBARRIER_CMD_GLOBAL): every thread running on the machine passes a full memory barrier before it
    returns (the costly side of an asymmetric fence, a few ms: readers.quiesce). False where the system refuses
    it."""
    if _NR_MEMBARRIER is None:
        return False
    return _libc.syscall(_NR_MEMBARRIER, _MEMBARRIER_CMD_GLOBAL, 0) == 0


def _full_fence() -> None:
    if not membarrier_fence():
        # No membarrier (where the compiled section reads without the lock, it has one: _core_unlocked.c builds
        # those reads for x86-64 and aarch64 alone, and a kernel without membarrier is older than any that
        # supports aarch64 servers): the lock's instruction, which orders what this machine's lock orders.
        _lock_fence()


_fence = _lock_fence if TSO else _full_fence


def open_seq(h) -> None:
    """Make header word ``seq`` odd before a hold's first write or pin query, and fence: readers without the lock
    validate what they read against it. Callers skip it under lru. (twin: _core_lock.c seq_open)"""
    s = h[H_SEQ]
    if not s & 1:
        h[H_SEQ] = s + 1 if s < _INT64_MAX else -_INT64_MAX - 1  # wraps as the C's unsigned step does
        _fence()


def stripe_of(s: int, mask: int) -> int:
    """The stripe of index slot ``s`` in an index of ``mask + 1`` slots: the slots cut into at most ``STRIPES`` runs
    of a power of two, 2**STRIPE_MIN_SHIFT slots at least (the last run shorter where the slots are not a power of
    two: version 17). (twin: _core.h stripe_of)"""
    return s >> max(STRIPE_MIN_SHIFT, mask.bit_length() - STRIPE_BITS)


def open_stripe(h, stripes, s: int, mask: int) -> None:
    """Make the word of index slot ``s``'s stripe odd before the hold's first write to the slot or to the entry it
    points at (or its pin query), and fence, as ``open_seq`` does for ``seq``; its bit in the open mask is set
    first, so that the hold's end (or the next one's, if this holder dies) evens it. Without stripes (``stripes``
    None: a segment before version 11), or for a slot out of range (damage), ``seq`` is opened instead. Callers skip
    it under lru. (twin: _core_lock.c stripe_open)"""
    if stripes is None or not 0 <= s <= mask:
        open_seq(h)
        return
    k = stripe_of(s, mask)
    m = stripes[S_OPEN] & _WORD_BITS
    if not m >> k & 1:
        m |= 1 << k
        stripes[S_OPEN] = m - (1 << 64) if m >> 63 else m  # (bit 63 is the signed word's sign)
    w = STRIPE_WORDS * (1 + k)
    v = stripes[w]
    if not v & 1:
        stripes[w] = v + 1 if v < _INT64_MAX else -_INT64_MAX - 1
        _fence()


def close_seq(h, stripes=None) -> None:
    """The hold ends: ``seq`` and every stripe the open mask names even again, and the mask cleared, unless an
    update was cut short (``dirty`` set: the repair's hold ends them). On x86-64 stores are seen in program order, so
    no fence is needed before these; elsewhere a full one orders the hold's stores before them (the C's release
    stores). (twin: _core_lock.c seq_close)"""
    if h[H_DIRTY]:
        return
    s = h[H_SEQ]
    m = 0 if stripes is None else stripes[S_OPEN]
    if not (s & 1 or m):
        return
    if not TSO:
        _fence()
    if s & 1:
        h[H_SEQ] = s + 1 if s < _INT64_MAX else -_INT64_MAX - 1
    if m:
        m &= _WORD_BITS
        while m:
            k = (m & -m).bit_length() - 1
            m &= m - 1
            w = STRIPE_WORDS * (1 + k)
            v = stripes[w]
            if v & 1:
                stripes[w] = v + 1 if v < _INT64_MAX else -_INT64_MAX - 1
        stripes[S_OPEN] = 0
